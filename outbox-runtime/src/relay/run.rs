//! The relay's loop: rounds, wake-ups, the broker's outages, the heartbeat, health.

use super::*;

impl Relay {
    pub(crate) async fn run_with_health(
        &self,
        shutdown: CancellationToken,
        health: &LoopHealth,
    ) -> Result<(), RelayError> {
        let mut heartbeat = None;
        let mut fast_path = None;
        #[allow(unused_mut)]
        let mut wal: Option<tokio::task::JoinHandle<()>> = None;
        if let Sink::Broker(transport) = &self.sink {
            transport.setup().await?;
            crate::metrics::broker_available(transport.name(), true);
            self.broker.seen();
            heartbeat = Some(self.spawn_heartbeat(transport.clone(), &shutdown));
            #[cfg(feature = "postgres-wal")]
            {
                wal = self.spawn_wal(transport.clone(), &shutdown);
            }
            if wal.is_none() {
                fast_path = self.spawn_fast_path(transport.clone(), &shutdown);
            }
        }
        // Beside the WAL stream, commits are the stream's: the claim loop only polls.
        let mut wake: Option<WakeReceiver> = match self.wal_mode() {
            true => None,
            false => self.outbox.as_ref().map(Outbox::subscribe),
        };
        let hint = Arc::new(Notify::new());
        let listener = match self.wal_mode() {
            true => None,
            false => self.spawn_listener(&hint, &shutdown),
        };
        tracing::info!(relay = %self.config.relay_id, transport = self.sink.name(), "outbox relay started");

        // The broker failed the last publishes and none has been confirmed since.
        let mut publishing_failed = false;
        // The last claim, being published and settled while the next one is claimed.
        let mut in_flight: Option<InFlight<'_>> = None;
        // Claim at once instead of waiting for a wake-up: at start, after a full claim (a
        // backlog remains), after an error, and after a claim that ran beside a round in
        // flight (it could not take the events queued behind that round's aggregates).
        let mut look_now = true;
        // The last claim found events: look again after `linger`.
        let mut lingering = false;
        while !shutdown.is_cancelled() {
            if self.broker.is_down() {
                // The claim in flight hands its events back at once (the breaker is open).
                if let Some(round) = in_flight.take() {
                    self.account(round.await, health, &mut publishing_failed);
                }
                if self.wait_for_broker(&shutdown, health).await {
                    publishing_failed = false;
                }
                look_now = true;
                lingering = false;
                continue;
            }
            if !look_now {
                let sleep = match self.config.linger {
                    Some(linger) if lingering => linger,
                    _ => self.config.poll_interval,
                };
                let finished = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = async {
                        match wake.as_mut() {
                            Some(w) => w.woken().await,
                            None => std::future::pending().await,
                        }
                    } => None,
                    _ = hint.notified() => None,
                    _ = tokio::time::sleep(sleep) => None,
                    round = async {
                        match in_flight.as_mut() {
                            Some(round) => round.await,
                            None => std::future::pending().await,
                        }
                    } => Some(round),
                };
                if let Some(round) = finished {
                    // Finishing a round is no reason to look again: wait on.
                    in_flight = None;
                    if !self.account(round, health, &mut publishing_failed) {
                        self.pause(&shutdown).await;
                        look_now = true;
                    }
                    continue;
                }
            }
            let overlapped = in_flight.is_some();
            let (claimed, previous) = match in_flight.take() {
                Some(previous) => {
                    let (claimed, previous) = tokio::join!(self.claim_step(), previous);
                    (claimed, Some(previous))
                }
                None => (self.claim_step().await, None),
            };
            let mut failed =
                previous.is_some_and(|round| !self.account(round, health, &mut publishing_failed));
            look_now = overlapped;
            lingering = false;
            match claimed {
                Ok(Claimed::Done(round)) => {
                    look_now |= round.report.claimed + round.report.dead >= self.config.batch_size;
                    lingering = round.report.claimed > 0;
                    failed |= !self.account(Ok(round), health, &mut publishing_failed);
                }
                Ok(Claimed::Publish {
                    transport,
                    claim,
                    report,
                    claimed,
                }) => {
                    look_now |= report.claimed + report.dead >= self.config.batch_size;
                    lingering = true;
                    in_flight = Some(Box::pin(self.publish_step(
                        transport,
                        claim,
                        report,
                        claimed,
                        &shutdown,
                        Publisher::Relay,
                    )));
                }
                Err(e) => failed |= !self.account(Err(e), health, &mut publishing_failed),
            }
            if failed {
                self.pause(&shutdown).await;
                look_now = true;
            }
        }
        if let Some(round) = in_flight.take() {
            // Shutting down: what was not published yet is handed back.
            self.account(round.await, health, &mut publishing_failed);
        }
        if let Some(fast_path) = fast_path {
            // It hands back what it was given and not yet published.
            let _ = fast_path.await;
        }
        if let Some(wal) = wal {
            // It finishes its batch and confirms what it published.
            let _ = wal.await;
        }
        if let Some(listener) = listener {
            listener.abort();
            let _ = listener.await;
        }
        if let Some(heartbeat) = heartbeat {
            let _ = heartbeat.await;
            watch::forget(&self.db, &self.config.relay_id).await;
        }
        tracing::info!(relay = %self.config.relay_id, "outbox relay stopped");
        Ok(())
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
    pub(super) fn spawn_listener(
        &self,
        hint: &Arc<Notify>,
        shutdown: &CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        if !self.config.listen {
            return None;
        }
        let channel = self.outbox.as_ref()?.notify_channel()?.to_owned();
        store::notify::spawn_listener(
            &self.db,
            channel,
            hint.clone(),
            shutdown.clone(),
            self.config.relay_id.clone(),
        )
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
                self.publish_step(
                    transport,
                    claim,
                    report,
                    claimed,
                    shutdown,
                    Publisher::Relay,
                )
                .await
            }
        }
    }
}
