//! One road for every claimed batch: claim, publish, settle, whichever source found the
//! events (the claim loop, the fast path's hand-overs, a WAL batch).

use super::*;

impl Relay {
    /// Move due delayed events into the outbox, at most once a poll interval (a claim does not
    /// wait for it). A database without `outbox_scheduled` (migration `outbox_0009` not applied
    /// yet) has none. An error is the caller's to report: it does not stop the claim.
    pub(super) async fn promote_due(&self) -> Result<(), RelayError> {
        {
            let mut at = self.promoted_at.lock().unwrap_or_else(|p| p.into_inner());
            if at.is_some_and(|at| at.elapsed() < self.config.poll_interval) {
                return Ok(());
            }
            *at = Some(Instant::now());
        }
        loop {
            let promoted = match with_transient_retries(|| {
                store::scheduled::promote(&self.db, self.config.batch_size)
            })
            .await
            {
                Ok(promoted) => promoted,
                Err(e) if store::errors::is_missing_table(&e) => {
                    tracing::debug!(error = %e, "no outbox_scheduled table: no delayed events");
                    return Ok(());
                }
                Err(e) => return Err(e.into()),
            };
            for skipped in &promoted.skipped {
                tracing::warn!(
                    event_id = %skipped.event_id, event_type = %skipped.event_type,
                    dedup_key = %skipped.dedup_key,
                    "delayed event dropped when due: the outbox already holds its dedup key"
                );
            }
            if promoted.moved > 0 {
                // Later events of an aggregate the fast path publishes may be among them.
                self.heard.bump();
                tracing::debug!(
                    moved = promoted.moved,
                    "due delayed events moved into the outbox"
                );
                crate::metrics::events_written(promoted.moved);
            }
            if promoted.moved + promoted.skipped.len() < self.config.batch_size.max(1) {
                return Ok(());
            }
        }
    }

    /// Claim a batch; for the database-local sink, the whole round.
    pub(super) async fn claim_step(&self) -> Result<Claimed<'_>, RelayError> {
        self.pauses.refresh_if_due(&self.db).await;
        let held = self.held_types();
        // Delayed events that cannot be moved must not stop the outbox: warn, and claim.
        if let Err(e) = self.promote_due().await {
            tracing::warn!(
                relay = %self.config.relay_id, error = %e,
                "could not move due delayed events into the outbox; trying again next poll"
            );
        }
        let params = ClaimParams {
            owner: &self.config.relay_id,
            batch_size: self.config.batch_size,
            lease: self.config.lease,
            ordering: self.config.ordering,
            max_attempts: self.config.max_attempts,
        };
        if let Sink::Local(delivery) = &self.sink {
            let moved =
                with_transient_retries(|| delivery.deliver(&self.db, &params, &held)).await?;
            crate::metrics::relay_round(
                "database-local",
                self.database.as_deref(),
                moved.events,
                0,
                moved.dead,
                0,
            );
            let report = RoundReport {
                claimed: moved.events,
                sent: moved.events,
                dead: moved.dead,
                duplicates: moved.duplicates,
                ..RoundReport::default()
            };
            self.stats.add(&report);
            return Ok(Claimed::Done(report.into()));
        }
        let Sink::Broker(transport) = &self.sink else {
            unreachable!("local sink handled above");
        };
        // A deadlock or busy database only delays a claim: try again at once, a few times.
        let pending_age = self.pending_age();
        // Where the claim's scans start (see `store/floor.rs`).
        let floor = store::floor::refresh(&self.floor, |from| {
            store::relay::sample_floor(&self.db, from)
        })
        .await;
        let started = Instant::now();
        // Before the claim reads anything: a promotion after this is seen by the standby wait.
        let before = self.timeline.seen();
        let mut claim = with_transient_retries(|| {
            store::relay::claim_held(&self.db, &params, pending_age, floor, &held)
        })
        .instrument(tracing::debug_span!("outbox.claim", relay = %self.config.relay_id))
        .await?;
        crate::metrics::claim_duration(transport.name(), started.elapsed());
        claim.before = before;
        let report = RoundReport {
            claimed: claim.events.len(),
            dead: claim.dead.len() + claim.unreadable,
            ..RoundReport::default()
        };
        for event in &claim.dead {
            tracing::error!(
                event_id = %event.event_id, event_type = %event.event_type,
                aggregate_id = %event.aggregate_id, attempts = event.attempts,
                "outbox event is DEAD: its lease expired too many times"
            );
        }
        if claim.events.is_empty() {
            self.stats.add(&report);
            return Ok(Claimed::Done(report.into()));
        }
        Ok(Claimed::Publish {
            transport: transport.as_ref(),
            claim,
            report,
            claimed: Instant::now(),
        })
    }

    /// Publish a claimed batch (the relay's, or the rows a commit handed to the fast path) and
    /// write the outcome back.
    pub(super) async fn publish_step(
        &self,
        transport: &dyn Transport,
        claim: Claim,
        mut report: RoundReport,
        claimed: Instant,
        shutdown: &CancellationToken,
        source: Source,
    ) -> Result<Round, RelayError> {
        #[cfg(feature = "failpoints")]
        if let Some(name) = source.failpoint_before_publish() {
            failpoint!(error name);
        }
        let Published {
            settlement,
            transient_error,
            outage,
        } = self.publish(transport, &claim, shutdown, source).await;
        failpoint!(error source.failpoint_after_publish());
        if !settlement.sent.is_empty() {
            self.broker.confirmed();
        }
        if outage.is_some() {
            self.broker.held_back(&settlement.released);
            crate::metrics::held_back(
                transport.name(),
                self.database.as_deref(),
                settlement.released.len(),
            );
        }
        let fence = source.fence(claim.token);
        let settled = self.settle(fence, &settlement).await?;

        report.sent = settlement.sent.len();
        report.retried = settlement
            .failed
            .iter()
            .filter(|f| !f.failure.is_dead())
            .count();
        report.dead += settlement
            .failed
            .iter()
            .filter(|f| f.failure.is_dead())
            .count();
        report.released = settlement.released.len();
        let expected =
            (settlement.sent.len() + settlement.failed.len() + settlement.released.len()) as u64;
        let written = settled.sent + settled.failed + settled.released;
        report.stale = expected.saturating_sub(written) as usize;
        // Each event's age at the claim by the database's clock (which wrote `created_at`),
        // plus the time since by this process's monotonic clock.
        let since_claim = claimed.elapsed();
        let sent: std::collections::HashSet<i64> = settlement.sent.iter().copied().collect();
        if let Some(claimed_at) = claim.claimed_at {
            for event in claim.events.iter().filter(|e| sent.contains(&e.id)) {
                let waited = (claimed_at - event.created_at).to_std().unwrap_or_default();
                crate::metrics::publish_lag(
                    transport.name(),
                    self.database.as_deref(),
                    waited + since_claim,
                );
            }
        }
        crate::metrics::relay_round(
            transport.name(),
            self.database.as_deref(),
            report.sent,
            settlement.failed.len(),
            report.dead,
            report.stale,
        );
        if report.stale > 0 {
            tracing::warn!(
                relay = %self.config.relay_id, stale = report.stale,
                "outbox relay lost {} claimed events to another relay (lease expired); its writes were fenced off",
                report.stale
            );
        }
        self.stats.add(&report);
        Ok(Round {
            report,
            // The broker is away or refusing: the relay is not doing its job.
            publish_error: transient_error.filter(|_| settlement.sent.is_empty()),
            outage,
        })
    }

    /// Write the outcome back. Published events that are not marked SENT are published again
    /// once the lease expires, so keep trying (deadlocks, a dropped connection) for up to half
    /// the lease before giving up.
    pub(super) async fn settle(
        &self,
        fence: store::relay::Fence,
        settlement: &Settlement,
    ) -> Result<store::relay::Settled, RelayError> {
        let give_up = tokio::time::Instant::now() + self.config.lease / 2;
        let mut delay = Duration::from_millis(10);
        loop {
            match store::relay::settle(&self.db, fence, settlement).await {
                Ok(settled) => return Ok(settled),
                Err(e) if tokio::time::Instant::now() + delay < give_up => {
                    if !store::is_transient(&e) {
                        tracing::warn!(relay = %self.config.relay_id, error = %e, "settling a claim failed; retrying");
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Publish a claim wave by wave and settle each event by the decisions in `decide`. Also
    /// returns the first error of a failed publish that a retry may cure (not a permanent
    /// rejection), and whether the broker is unavailable.
    ///
    /// A lost or refused connection says the broker is unavailable; no confirmation in time
    /// says so when the broker's health check fails too. Then no event is at fault: those events
    /// and everything not yet published are handed back without counting an attempt, and the
    /// relay stops claiming until the broker answers again (see `wait_for_broker`). Only
    /// failures of the message itself (a rejection, or a timeout while the broker answers)
    /// count toward `max_attempts` and DEAD.
    pub(super) async fn publish(
        &self,
        transport: &dyn Transport,
        claim: &Claim,
        shutdown: &CancellationToken,
        source: Source,
    ) -> Published {
        let policy = decide::Policy {
            max_attempts: self.config.max_attempts,
            backoff: self.config.backoff,
        };
        let mut published = Published {
            settlement: Settlement::default(),
            transient_error: None,
            outage: None,
        };
        let settlement = &mut published.settlement;
        if let Some(why) = store::standby::not_held(
            &self.db,
            self.config.wait_for_standbys,
            &self.timeline,
            claim.before,
        )
        .await
        {
            // Nothing is announced that a failover could take back: handed back, no attempt
            // spent, published once the standbys hold it.
            decide::release(settlement, claim.events.iter());
            published.transient_error = Some(why);
            return published;
        }
        let mut waves = decide::Waves::new(&claim.events, self.config.ordering);
        let routing = transport.routing();
        if self.pauses.any_destination() {
            // The fast path's and the WAL's batches were never claimed by destination; a claim
            // may predate the pause: what goes to a paused destination waits, no attempt spent.
            let held = waves.hold(
                |e| {
                    self.pauses.destination_paused(&destination(
                        routing.as_ref(),
                        &e.event_type,
                        &e.aggregate_type,
                    ))
                },
                settlement,
            );
            if !held.is_empty() {
                let mut seen = self.held_seen.lock().unwrap_or_else(|p| p.into_inner());
                for event in &held {
                    seen.insert((event.event_type.clone(), event.aggregate_type.clone()));
                }
                tracing::debug!(
                    relay = %self.config.relay_id, events = settlement.released.len(),
                    "events for a paused destination handed back unpublished"
                );
            }
        }
        loop {
            let wave = waves.next_wave();
            if wave.is_empty() {
                break;
            }
            if shutdown.is_cancelled() || self.broker.is_down() {
                if !shutdown.is_cancelled() {
                    published.outage = Some("the broker is unavailable".to_owned());
                }
                decide::release(settlement, wave.into_iter());
                waves.release_rest(settlement);
                break;
            }
            let outcomes = publish_wave(
                transport,
                routing.as_ref(),
                wave,
                source,
                self.database.as_deref(),
            )
            .await;
            let outage = match decide::suspicion(&outcomes) {
                decide::Suspicion::None => None,
                decide::Suspicion::Lost(reason) => Some(decide::Outage {
                    reason,
                    on_trial: false,
                }),
                decide::Suspicion::TimedOut => decide::after_timeout(
                    transport.health().await,
                    self.broker.on_trial(),
                    transport.name(),
                ),
            };
            if let Some(down) = &outage {
                tracing::warn!(
                    relay = %self.config.relay_id, transport = transport.name(),
                    error = %down.reason,
                    "the broker is unavailable: handing the claim back without counting attempts"
                );
                self.broker.open(&down.reason, down.on_trial);
            }
            let first_failed = settlement.failed.len();
            let decided =
                decide::settle_wave(outcomes, outage.is_some(), &policy, &mut waves, settlement);
            for (event, failed) in decided
                .failed
                .iter()
                .zip(&settlement.failed[first_failed..])
            {
                log_failure(event, &failed.failure);
            }
            if published.transient_error.is_none() {
                published.transient_error = decided.transient_error;
            }
            if let Some(down) = outage {
                published.outage = Some(down.reason);
                waves.release_rest(settlement);
                break;
            }
        }
        published
    }
}

/// Publish one wave: each event's outcome, in the wave's order for those whose message could be
/// made, then those whose row can never be published (a permanent failure with the reason).
async fn publish_wave<'a>(
    transport: &dyn Transport,
    routing: Option<&Routing>,
    wave: Vec<&'a ClaimedEvent>,
    source: Source,
    database: Option<&str>,
) -> Vec<decide::Outcome<'a>> {
    let mut published: Vec<&ClaimedEvent> = Vec::with_capacity(wave.len());
    let mut messages: Vec<OutgoingMessage> = Vec::with_capacity(wave.len());
    let mut failed_early = Vec::new();
    for event in wave {
        match outgoing(event, database) {
            Ok(message) => {
                published.push(event);
                messages.push(message);
            }
            Err(reason) => failed_early.push((event, Err(PublishError::Permanent(reason)))),
        }
    }
    let mut results = Vec::new();
    if !messages.is_empty() {
        let system = transport.name();
        let destinations: Vec<String> = messages
            .iter()
            .map(|m| destination(routing, &m.event_type, &m.aggregate_type))
            .collect();
        // One producer span per message, each in the trace of the request that enqueued it.
        let spans: Vec<tracing::Span> = messages
            .iter()
            .zip(&destinations)
            .map(|(message, destination)| {
                let header = |name: &str| {
                    message
                        .headers
                        .iter()
                        .find(|(k, _)| k == name)
                        .map(|(_, v)| v.as_str())
                };
                telemetry::send_span(&telemetry::Send {
                    road: source.road(),
                    system,
                    destination,
                    message_id: &message.event_id,
                    event_type: &message.event_type,
                    aggregate_type: &message.aggregate_type,
                    aggregate_id: &message.aggregate_id,
                    body_size: message.body.len(),
                    traceparent: header("traceparent"),
                    tracestate: header("tracestate"),
                })
            })
            .collect();
        let span = tracing::debug_span!(
            "outbox.publish",
            transport = system,
            messages = messages.len()
        );
        let started = Instant::now();
        results = transport.publish(&messages).instrument(span).await;
        let errors = (0..messages.len()).map(|i| match results.get(i) {
            Some(Ok(())) => None,
            Some(Err(e)) => Some(e.error_type()),
            None => Some("rejected"),
        });
        let errors: Vec<Option<&'static str>> = errors.collect();
        for (span, error) in spans.iter().zip(&errors) {
            if let Some(error) = error {
                telemetry::failed(span, error);
            }
        }
        telemetry::sent(
            system,
            destinations.into_iter().zip(errors),
            started.elapsed(),
        );
    }
    let mut results = results.into_iter();
    let mut outcomes: Vec<_> = published
        .into_iter()
        .map(|event| {
            let result = results.next().unwrap_or_else(|| {
                Err(PublishError::Rejected(
                    "transport returned fewer results than messages".into(),
                ))
            });
            (event, result)
        })
        .collect();
    outcomes.extend(failed_early);
    outcomes
}

/// Log a failed publish's fate: DEAD at error level, a retry at warn.
fn log_failure(event: &ClaimedEvent, failure: &Failure) {
    match failure {
        Failure::Dead { attempts, error } => tracing::error!(
            event_id = %event.event_id, event_type = %event.event_type,
            aggregate_id = %event.aggregate_id, attempts, error = %error,
            "outbox event is DEAD"
        ),
        Failure::Retry {
            attempts,
            delay,
            error,
        } => tracing::warn!(
            event_id = %event.event_id, event_type = %event.event_type,
            aggregate_id = %event.aggregate_id, attempts, error = %error,
            retry_in = ?delay, "outbox publish failed; will retry"
        ),
    }
}

/// Where a batch to publish came from: the claim loop's claim, the rows a commit wrote claimed
/// by the fast path, or the PENDING rows the WAL stream read from the log (unclaimed). Every
/// source feeds the same [`publish_step`](Relay::publish_step), one publish and one settle; a
/// source decides only how the write-back is fenced and where a crash can be injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    Claim,
    FastPath,
    #[cfg_attr(not(feature = "postgres-wal"), allow(dead_code))]
    Wal,
}

impl Source {
    /// The `outbox.road` its spans carry.
    fn road(self) -> telemetry::Road {
        match self {
            Source::Claim => telemetry::Road::ClaimLoop,
            Source::FastPath => telemetry::Road::FastPath,
            Source::Wal => telemetry::Road::Wal,
        }
    }

    /// Which rows the write-back may change: those under the batch's claim `token`, or, for
    /// the WAL's rows that no relay claimed, those still PENDING.
    fn fence(self, token: uuid::Uuid) -> store::relay::Fence {
        match self {
            Source::Claim | Source::FastPath => store::relay::Fence::Claim(token),
            Source::Wal => store::relay::Fence::Pending,
        }
    }

    /// Where a batch of this source can "crash" after it was claimed, before it is published.
    #[cfg(feature = "failpoints")]
    fn failpoint_before_publish(self) -> Option<&'static str> {
        match self {
            Source::Claim => Some(crate::failpoints::RELAY_AFTER_CLAIM),
            Source::FastPath => Some(crate::failpoints::FAST_PATH_AFTER_COMMIT),
            Source::Wal => None,
        }
    }

    /// Where a batch of this source can "crash" once the broker confirmed it, before it is
    /// settled.
    #[cfg(feature = "failpoints")]
    fn failpoint_after_publish(self) -> &'static str {
        match self {
            Source::Claim => crate::failpoints::RELAY_AFTER_PUBLISH,
            Source::FastPath => crate::failpoints::FAST_PATH_AFTER_PUBLISH,
            Source::Wal => crate::failpoints::WAL_AFTER_PUBLISH,
        }
    }
}

/// What publishing a claim decided.
pub(super) struct Published {
    pub(super) settlement: Settlement,
    /// The first failure a retry may cure.
    pub(super) transient_error: Option<String>,
    /// Why the broker is unavailable, when it is: the claim was handed back.
    pub(super) outage: Option<String>,
}

/// A claimed batch being published and settled.
pub(super) type InFlight<'a> =
    std::pin::Pin<Box<dyn Future<Output = Result<Round, RelayError>> + Send + 'a>>;

/// What a claim led to.
pub(super) enum Claimed<'a> {
    /// The round is over: nothing claimed, or the database-local sink moved the batch.
    Done(Round),
    /// Events to publish.
    Publish {
        transport: &'a dyn Transport,
        claim: Claim,
        report: RoundReport,
        /// When the claim came back, by this process's monotonic clock.
        claimed: Instant,
    },
}

/// What a round did, and why nothing was confirmed when a publish failed.
pub(super) struct Round {
    pub(super) report: RoundReport,
    /// Set when no publish of the round was confirmed and one failed for a reason a retry may
    /// cure.
    pub(super) publish_error: Option<String>,
    /// Set when the broker is unavailable: the relay waits for it before claiming again.
    pub(super) outage: Option<String>,
}

impl From<RoundReport> for Round {
    fn from(report: RoundReport) -> Self {
        Round {
            report,
            publish_error: None,
            outage: None,
        }
    }
}

/// Run a short transaction again, a few times, when it fails on a deadlock or a busy database.
pub(super) async fn with_transient_retries<T, F, Fut>(mut f: F) -> Result<T, DbErr>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, DbErr>>,
{
    let mut tries = 0;
    loop {
        match f().await {
            Err(e) if store::is_transient(&e) && tries < 3 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(5 * tries)).await;
            }
            other => return other,
        }
    }
}

/// The message of a claimed event, ready to publish. An error means the row itself is broken
/// (it can never be published): the event goes DEAD with the reason. `database`: the name of
/// the relay's database in a set of databases, carried in the envelope's `tenant` extension.
pub(super) fn outgoing(
    event: &ClaimedEvent,
    database: Option<&str>,
) -> Result<OutgoingMessage, String> {
    let mut envelope = event.envelope()?;
    if let Some(database) = database {
        envelope.extensions.insert(
            crate::envelope::DATABASE_EXTENSION.to_owned(),
            database.to_owned().into(),
        );
    }
    Ok(OutgoingMessage {
        event_id: event.event_id,
        event_type: event.event_type.clone(),
        aggregate_type: event.aggregate_type.clone(),
        aggregate_id: event.aggregate_id.clone(),
        body: Bytes::from(envelope.to_json()),
        headers: envelope.transport_headers(),
    })
}
