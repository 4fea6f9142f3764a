//! The relay's loop: one loop fed by sources (the claims it makes, the rows commits hand the
//! fast path, the WAL reader's batches), each round through the one publish and settle
//! (`publish_step`); wake-ups, the broker's outages, the heartbeat, health.

use std::pin::Pin;

use super::*;
use fast::{FastSource, Handoff};
#[cfg(feature = "postgres-wal")]
use wal::WalSource;

/// What runs beside the loop: started with it, joined when it stops.
#[derive(Default)]
struct Beside {
    /// Records the broker's state in `outbox_relay` (`spawn_heartbeat`).
    heartbeat: Option<tokio::task::JoinHandle<()>>,
    /// Hears other processes' commit notifications.
    listener: Option<tokio::task::JoinHandle<()>>,
}

/// A round of the fast path or the WAL, in flight beside the claims.
type SideRound<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// The sources beside the claims, each with at most one round in flight: a source's rounds
/// go in order (a WAL batch is confirmed before the next is read; the fast path takes
/// hand-overs up in commit order).
struct Sources<'a> {
    relay: &'a Relay,
    /// The broker; `None` for the database-local sink, which has no other source.
    transport: Option<&'a dyn Transport>,
    shutdown: &'a CancellationToken,
    /// The rows commits hand over (`relay/fast.rs`).
    fast: Option<FastSource>,
    fast_round: Option<SideRound<'a>>,
    /// The batches the WAL reader hands over (`relay/wal/`).
    #[cfg(feature = "postgres-wal")]
    wal: Option<WalSource>,
    wal_round: Option<SideRound<'a>>,
}

impl<'a> Sources<'a> {
    /// Wait for one thing a source does, and do it: take a hand-over or a WAL batch up as a
    /// round, or let a round finish. Pending while every source is idle.
    async fn step(&mut self) {
        let Sources {
            relay,
            transport,
            shutdown,
            fast,
            fast_round,
            #[cfg(feature = "postgres-wal")]
            wal,
            wal_round,
        } = self;
        let Some(transport) = *transport else {
            return std::future::pending().await;
        };
        #[cfg(feature = "postgres-wal")]
        let wal_idle = wal_round.is_none();
        #[cfg(feature = "postgres-wal")]
        let next_batch = async {
            match wal.as_mut() {
                Some(wal) if wal_idle => wal.next().await,
                _ => std::future::pending().await,
            }
        };
        #[cfg(not(feature = "postgres-wal"))]
        let next_batch = std::future::pending::<Option<std::convert::Infallible>>();
        tokio::select! {
            handoff = next_handoff(fast, fast_round.is_none()) => match (handoff, fast.as_mut()) {
                (Some(first), Some(source)) => {
                    *fast_round = Some(Box::pin(relay.take_up(source, transport, first, shutdown)));
                }
                _ => *fast = None,
            },
            () = finish(fast_round) => *fast_round = None,
            batch = next_batch => {
                #[cfg(feature = "postgres-wal")]
                match batch {
                    Some(batch) => *wal_round = Some(Box::pin(relay.wal_round(transport, batch, shutdown))),
                    None => *wal = None,
                }
                #[cfg(not(feature = "postgres-wal"))]
                let _ = batch;
            },
            () = finish(wal_round) => *wal_round = None,
        }
    }

    /// Stopping: the rounds in flight finish; the fast path leaves the outbox handle and what
    /// commits handed it is taken up (and handed back, the relay stopping); the WAL reader
    /// finishes its batch and confirms it, then stops.
    async fn stop(&mut self) {
        if let Some(round) = self.fast_round.take() {
            round.await;
        }
        if let (Some(source), Some(transport)) = (self.fast.as_mut(), self.transport) {
            source.close();
            while let Some(first) = source.next().await {
                self.relay
                    .take_up(source, transport, first, self.shutdown)
                    .await;
            }
        }
        self.fast = None;
        if let Some(round) = self.wal_round.take() {
            round.await;
        }
        #[cfg(feature = "postgres-wal")]
        if let (Some(mut source), Some(transport)) = (self.wal.take(), self.transport) {
            while let Some(batch) = source.next().await {
                self.relay.wal_round(transport, batch, self.shutdown).await;
            }
            source.join().await;
        }
    }
}

/// The fast path's next hand-over, when it may take one up; `None` when it has no more.
async fn next_handoff(fast: &mut Option<FastSource>, idle: bool) -> Option<Handoff> {
    match fast.as_mut() {
        Some(source) if idle => source.next().await,
        _ => std::future::pending().await,
    }
}

/// The round in flight, finished; pending without one.
async fn finish(round: &mut Option<SideRound<'_>>) {
    match round.as_mut() {
        Some(round) => round.await,
        None => std::future::pending().await,
    }
}

/// The loop's state between rounds.
struct ClaimLoop<'a> {
    health: &'a LoopHealth,
    /// The broker failed the last publishes and none has been confirmed since.
    publishing_failed: bool,
    /// The last claim, being published and settled while the next one is claimed.
    in_flight: Option<InFlight<'a>>,
    /// Claim at once instead of waiting for a wake-up: at start, after a full claim (a backlog
    /// remains), after an error, and after a claim that ran beside a round in flight (it could
    /// not take the events queued behind that round's aggregates).
    look_now: bool,
    /// The last claim found events: look again after `linger`.
    lingering: bool,
    /// Claims in a row that found nothing since the last wake-up: the poll backs off.
    empty_claims: u32,
    /// The longest idle sleep ([`RelayConfig::idle_poll_interval`], resolved).
    idle_max: Duration,
    /// When the loop claims next without a wake-up: set when it starts waiting, kept while the
    /// other sources' rounds come and go (otherwise a busy fast path would put the poll off for
    /// as long as commits keep coming, and due retries and other processes' events with it).
    poll_at: Option<tokio::time::Instant>,
    /// The other sources, whose rounds go on whatever the loop waits for.
    sources: Sources<'a>,
}

/// Why the loop stopped waiting.
enum Woken {
    Shutdown,
    /// A commit, a notification, or the poll interval: claim.
    Look,
    /// A round finished (and was accounted for), or another source's round started or
    /// finished: wait on.
    Other,
}

impl Relay {
    /// The relay's loop until `shutdown`: claims, the fast path's hand-overs or the WAL's
    /// batches, the heartbeat beside it; each claim round's outcome goes to `health`.
    pub(crate) async fn run_with_health(
        &self,
        shutdown: CancellationToken,
        health: &LoopHealth,
    ) -> Result<(), RelayError> {
        let mut beside = self.start_beside(&shutdown).await?;
        if self.config.wait_for_standbys > 0
            && let Err(e) = self.timeline.learn(&self.db).await
        {
            tracing::warn!(relay = %self.config.relay_id, error = %e, "could not ask the primary for its timeline; the first batch waits for it");
        }
        // Beside the WAL stream, commits are the stream's: the claim loop only polls.
        // A relay that only runs the fast path (`fast_path_only`) neither wakes nor listens.
        let mut wake: Option<WakeReceiver> = match self.wal_mode() || !self.claims {
            true => None,
            false => self.outbox.as_ref().map(Outbox::subscribe),
        };
        let hint = self.heard.clone();
        if !self.wal_mode() && self.claims {
            beside.listener = self.spawn_listener(&shutdown).await;
        }
        // Backing off is safe where other processes' commits wake the loop.
        let idle_max = match self.config.idle_poll_interval {
            Some(max) => max,
            None if beside.listener.is_some() => self.config.poll_interval.saturating_mul(5),
            None => self.config.poll_interval,
        };
        tracing::info!(relay = %self.config.relay_id, transport = self.sink.name(), "outbox relay started");
        let mut claims = ClaimLoop {
            health,
            publishing_failed: false,
            in_flight: None,
            look_now: true,
            lingering: false,
            empty_claims: 0,
            idle_max,
            poll_at: None,
            sources: self.start_sources(&shutdown),
        };
        while !shutdown.is_cancelled() {
            if self.broker.is_down() {
                self.ride_out_outage(&mut claims, &shutdown).await;
                continue;
            }
            // Without claims, only the sources' rounds and the broker's outages move the loop.
            claims.look_now &= self.claims;
            if !claims.look_now {
                match self
                    .wait_for_work(&mut claims, &mut wake, &hint.notify, &shutdown)
                    .await
                {
                    Woken::Shutdown => break,
                    Woken::Other => continue,
                    Woken::Look => {}
                }
            }
            self.claim_next(&mut claims, &shutdown).await;
        }
        self.stop_beside(claims, beside).await;
        tracing::info!(relay = %self.config.relay_id, "outbox relay stopped");
        Ok(())
    }

    /// Set the transport up and start the heartbeat beside the loop. A database-local relay
    /// runs none.
    async fn start_beside(&self, shutdown: &CancellationToken) -> Result<Beside, RelayError> {
        let mut beside = Beside::default();
        let Sink::Broker(transport) = &self.sink else {
            return Ok(beside);
        };
        transport.setup().await?;
        crate::metrics::broker_available(transport.name(), true);
        self.broker.seen();
        if self.claims {
            beside.heartbeat = Some(self.spawn_heartbeat(transport.clone(), shutdown));
        }
        Ok(beside)
    }

    /// The sources beside the claims: the WAL reader, or else the fast path. A database-local
    /// relay has neither.
    fn start_sources<'a>(&'a self, shutdown: &'a CancellationToken) -> Sources<'a> {
        let transport = match &self.sink {
            Sink::Broker(transport) => Some(transport.as_ref()),
            Sink::Local(_) => None,
        };
        #[cfg(feature = "postgres-wal")]
        let wal = transport.and_then(|_| self.start_wal(shutdown));
        #[cfg(feature = "postgres-wal")]
        let streams = wal.is_some();
        #[cfg(not(feature = "postgres-wal"))]
        let streams = false;
        Sources {
            relay: self,
            transport,
            shutdown,
            fast: transport
                .filter(|_| !streams)
                .and_then(|_| self.start_fast_path()),
            fast_round: None,
            #[cfg(feature = "postgres-wal")]
            wal,
            wal_round: None,
        }
    }

    /// `work`, while the other sources' rounds go on.
    async fn beside_sources<T>(sources: &mut Sources<'_>, work: impl Future<Output = T>) -> T {
        let mut work = std::pin::pin!(work);
        loop {
            tokio::select! {
                out = &mut work => return out,
                () = sources.step() => {}
            }
        }
    }

    /// The breaker is open: let the round in flight hand its events back, then claim nothing
    /// until the broker answers again.
    async fn ride_out_outage<'a>(
        &'a self,
        claims: &mut ClaimLoop<'a>,
        shutdown: &'a CancellationToken,
    ) {
        if let Some(round) = claims.in_flight.take() {
            let round = Self::beside_sources(&mut claims.sources, round).await;
            self.account(round, claims.health, &mut claims.publishing_failed);
        }
        let back = Self::beside_sources(
            &mut claims.sources,
            self.wait_for_broker(shutdown, claims.health),
        )
        .await;
        if back {
            claims.publishing_failed = false;
        }
        claims.look_now = true;
        claims.lingering = false;
    }

    /// Wait for a reason to claim: a commit in this process, another's notification, the poll
    /// interval (or `linger` after a claim that found events), or the round in flight ending;
    /// meanwhile the other sources' rounds go on.
    async fn wait_for_work<'a>(
        &'a self,
        claims: &mut ClaimLoop<'a>,
        wake: &mut Option<WakeReceiver>,
        hint: &Notify,
        shutdown: &'a CancellationToken,
    ) -> Woken {
        let poll_at = match claims.poll_at {
            Some(at) => at,
            None => {
                let sleep = match self.config.linger {
                    Some(linger) if claims.lingering => linger,
                    _ => self.idle_sleep(claims.idle_max, claims.empty_claims).await,
                };
                *claims.poll_at.insert(tokio::time::Instant::now() + sleep)
            }
        };
        let ClaimLoop {
            in_flight, sources, ..
        } = claims;
        let finished = tokio::select! {
            _ = shutdown.cancelled() => return Woken::Shutdown,
            _ = async {
                match wake.as_mut() {
                    Some(w) => w.woken().await,
                    None => std::future::pending().await,
                }
            } => {
                claims.empty_claims = 0;
                None
            }
            _ = hint.notified() => {
                claims.empty_claims = 0;
                None
            }
            _ = async {
                if self.claims {
                    tokio::time::sleep_until(poll_at).await
                } else {
                    std::future::pending().await
                }
            } => None,
            round = async {
                match in_flight.as_mut() {
                    Some(round) => round.await,
                    None => std::future::pending().await,
                }
            } => Some(round),
            () = sources.step() => return Woken::Other,
        };
        let Some(round) = finished else {
            claims.poll_at = None;
            return Woken::Look;
        };
        // Finishing a round is no reason to look again: wait on.
        claims.in_flight = None;
        if !self.account(round, claims.health, &mut claims.publishing_failed) {
            Self::beside_sources(&mut claims.sources, self.pause(shutdown)).await;
            claims.look_now = true;
        }
        Woken::Other
    }

    /// The sleep before the next claim while idle ([`idle_sleep`](crate::util::backoff::idle_sleep)); when it would be
    /// longer than the poll interval, it ends by the earliest delayed event's due time (one
    /// statement; unknown on error, as without delayed events).
    async fn idle_sleep(&self, idle_max: Duration, empty_claims: u32) -> Duration {
        let poll = self.config.poll_interval;
        let backed_off = crate::util::backoff::idle_sleep(poll, idle_max, empty_claims, None);
        if backed_off <= poll {
            return backed_off;
        }
        let next_due = store::scheduled::next_due_in(&self.db)
            .await
            .unwrap_or_default();
        crate::util::backoff::idle_sleep(poll, idle_max, empty_claims, next_due)
    }

    /// Claim the next batch, beside the round in flight (whose publish and settle go on
    /// meanwhile); account for both, and leave the new claim publishing in flight.
    async fn claim_next<'a>(&'a self, claims: &mut ClaimLoop<'a>, shutdown: &'a CancellationToken) {
        // The next poll counts from this claim.
        claims.poll_at = None;
        let overlapped = claims.in_flight.is_some();
        let (claimed, previous) = match claims.in_flight.take() {
            Some(previous) => {
                let both = async { tokio::join!(self.claim_step(), previous) };
                let (claimed, previous) = Self::beside_sources(&mut claims.sources, both).await;
                (claimed, Some(previous))
            }
            None => (
                Self::beside_sources(&mut claims.sources, self.claim_step()).await,
                None,
            ),
        };
        let mut failed = previous.is_some_and(|round| {
            !self.account(round, claims.health, &mut claims.publishing_failed)
        });
        claims.look_now = overlapped;
        claims.lingering = false;
        match claimed {
            Ok(Claimed::Done(round)) => {
                claims.look_now |=
                    round.report.claimed + round.report.dead >= self.config.batch_size;
                claims.lingering = round.report.claimed > 0;
                claims.empty_claims = match round.report.claimed + round.report.dead {
                    0 => claims.empty_claims.saturating_add(1),
                    _ => 0,
                };
                failed |= !self.account(Ok(round), claims.health, &mut claims.publishing_failed);
            }
            Ok(Claimed::Publish {
                transport,
                claim,
                report,
                claimed,
            }) => {
                claims.look_now |= report.claimed + report.dead >= self.config.batch_size;
                claims.lingering = true;
                claims.empty_claims = 0;
                claims.in_flight = Some(Box::pin(self.publish_step(
                    transport,
                    claim,
                    report,
                    claimed,
                    shutdown,
                    Source::Claim,
                )));
            }
            Err(e) => failed |= !self.account(Err(e), claims.health, &mut claims.publishing_failed),
        }
        if failed {
            Self::beside_sources(&mut claims.sources, self.pause(shutdown)).await;
            claims.look_now = true;
        }
    }

    /// Shutting down: the round in flight hands back what it has not published, the fast path
    /// what it was given, the WAL reader finishes its batch and confirms it; then the listener
    /// and the heartbeat stop, and the relay's row in `outbox_relay` goes.
    async fn stop_beside(&self, mut claims: ClaimLoop<'_>, beside: Beside) {
        if let Some(round) = claims.in_flight.take() {
            let round = Self::beside_sources(&mut claims.sources, round).await;
            self.account(round, claims.health, &mut claims.publishing_failed);
        }
        claims.sources.stop().await;
        if let Some(listener) = beside.listener {
            listener.abort();
            let _ = listener.await;
        }
        if let Some(heartbeat) = beside.heartbeat {
            let _ = heartbeat.await;
            watch::forget(&self.db, &self.config.relay_id).await;
        }
    }

    /// Report a round's outcome to the loop's health; `false` when it failed on the database,
    /// and the loop should pause before the next claim.
    pub(super) fn account(
        &self,
        round: Result<Round, RelayError>,
        health: &LoopHealth,
        publishing_failed: &mut bool,
    ) -> bool {
        match round {
            Ok(Round {
                outage: Some(reason),
                ..
            }) => {
                // The claim was handed back; the loop waits for the broker (`wait_for_broker`).
                *publishing_failed = true;
                health.failure(&format!("broker unavailable: {reason}"));
                true
            }
            Ok(Round {
                report,
                publish_error,
                outage: None,
            }) => {
                match publish_error {
                    Some(e) => {
                        *publishing_failed = true;
                        health.failure(&format!("no publish confirmed: {e}"));
                    }
                    // Rounds with nothing due while failed events wait for their retry leave
                    // the relay unhealthy; a confirmed publish makes it healthy.
                    None if !*publishing_failed || report.sent > 0 => {
                        *publishing_failed = false;
                        health.success();
                    }
                    None => {}
                }
                true
            }
            Err(e) => {
                health.failure(&e.to_string());
                crate::metrics::relay_error();
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(relay = %self.config.relay_id, error = %e, "outbox relay round failed; retrying");
                false
            }
        }
    }

    /// The broker is unavailable: claim nothing, and ask its health with the `probe` backoff
    /// until it answers (`true`) or the relay shuts down (`false`). Then the retries an outage
    /// pushed back (their last failure said the broker was unavailable) become due at once.
    pub(super) async fn wait_for_broker(
        &self,
        shutdown: &CancellationToken,
        health: &LoopHealth,
    ) -> bool {
        let Sink::Broker(transport) = &self.sink else {
            self.broker.reset();
            return true;
        };
        let since = Instant::now();
        self.broker.outage_began();
        self.stats.broker_down.store(true, Ordering::Relaxed);
        self.record_broker(transport.name()).await;
        crate::metrics::broker_available(transport.name(), false);
        tracing::warn!(
            relay = %self.config.relay_id, transport = transport.name(),
            "outbox relay stopped claiming: the broker is unavailable; probing it"
        );
        let mut probes = 0;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(self.config.probe.delay(probes)) => {}
            }
            match transport.health().await {
                Ok(()) => break,
                Err(e) => {
                    probes = probes.saturating_add(1);
                    health.failure(&format!("broker unavailable: {e}"));
                }
            }
        }
        self.broker.close(self.config.recovery_trial);
        self.stats.broker_down.store(false, Ordering::Relaxed);
        crate::metrics::broker_available(transport.name(), true);
        health.success();
        let made_due = match store::relay::retries_due_now(
            &self.db,
            &FailureClass::OUTAGE,
            &PublishError::LEGACY_UNAVAILABLE_PATTERNS,
        )
        .await
        {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(relay = %self.config.relay_id, error = %e, "could not make the retries an outage pushed back due");
                0
            }
        };
        tracing::info!(
            relay = %self.config.relay_id, transport = transport.name(),
            down_for = ?since.elapsed(), made_due,
            "the broker answers again: the outbox relay resumes"
        );
        self.record_broker(transport.name()).await;
        true
    }

    /// Record the broker's state in the relay's row of `outbox_relay` now (the heartbeat does
    /// so periodically).
    pub(super) async fn record_broker(&self, transport: &'static str) {
        self.broker
            .record(
                &self.db,
                &self.config.relay_id,
                transport,
                self.config.heartbeat,
            )
            .await;
    }

    /// The heartbeat beside the loop (see [`RelayConfig::heartbeat`]).
    pub(super) fn spawn_heartbeat(
        &self,
        transport: Arc<dyn Transport>,
        shutdown: &CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let (watch, db, relay_id, every, shutdown) = (
            self.broker.clone(),
            self.db.clone(),
            self.config.relay_id.clone(),
            self.config.heartbeat,
            shutdown.clone(),
        );
        tokio::spawn(async move {
            watch::heartbeat(&watch, &db, &relay_id, transport.as_ref(), every, &shutdown).await;
        })
    }

    /// Wait `error_delay` after a failed round, or until shutdown.
    pub(super) async fn pause(&self, shutdown: &CancellationToken) {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = tokio::time::sleep(self.config.error_delay) => {}
        }
    }

    /// Start [`run`](Self::run) on the tokio runtime; the handle stops and joins it.
    pub fn spawn(self) -> RelayHandle {
        let shutdown = CancellationToken::new();
        let stats = self.stats.clone();
        let token = shutdown.clone();
        let relay = self.clone();
        let task = tokio::spawn(async move { self.run(token).await });
        RelayHandle {
            shutdown,
            task,
            stats,
            relay,
        }
    }

    /// The listener of other processes' commit notifications, where the dialect has them.
    pub(super) async fn spawn_listener(
        &self,
        shutdown: &CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        if !self.config.listen {
            return None;
        }
        let channel = self.outbox.as_ref()?.notify_channel()?.to_owned();
        store::notify::spawn_listener(
            &self.db,
            channel,
            self.heard.clone(),
            shutdown.clone(),
            self.config.relay_id.clone(),
        )
        .await
    }

    /// One round, claim then publish and settle.
    pub(super) async fn round(&self, shutdown: &CancellationToken) -> Result<Round, RelayError> {
        match self.claim_step().await? {
            Claimed::Done(round) => Ok(round),
            Claimed::Publish {
                transport,
                claim,
                report,
                claimed,
            } => {
                self.publish_step(transport, claim, report, claimed, shutdown, Source::Claim)
                    .await
            }
        }
    }
}
