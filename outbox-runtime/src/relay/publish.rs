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
            let moved = with_transient_retries(|| delivery.deliver(&self.db, &params)).await?;
            crate::metrics::relay_round("database-local", moved.events, 0, moved.dead, 0);
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
        let claim =
            with_transient_retries(|| store::relay::claim_aged(&self.db, &params, pending_age))
                .instrument(tracing::debug_span!("outbox.claim", relay = %self.config.relay_id))
                .await?;
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
        by: Publisher,
    ) -> Result<Round, RelayError> {
        match by {
            Publisher::Relay => {
                failpoint!(error crate::failpoints::RELAY_AFTER_CLAIM);
            }
            Publisher::FastPath => {
                failpoint!(error crate::failpoints::FAST_PATH_AFTER_COMMIT);
            }
            Publisher::Wal => {}
        }
        let Published {
            settlement,
            transient_error,
            outage,
        } = self.publish(transport, &claim, shutdown).await;
        match by {
            Publisher::Relay => {
                failpoint!(error crate::failpoints::RELAY_AFTER_PUBLISH);
            }
            Publisher::FastPath => {
                failpoint!(error crate::failpoints::FAST_PATH_AFTER_PUBLISH);
            }
            Publisher::Wal => {
                failpoint!(error crate::failpoints::WAL_AFTER_PUBLISH);
            }
        }
        if !settlement.sent.is_empty() {
            self.broker.confirmed();
        }
        if outage.is_some() {
            self.broker.held_back(&settlement.released);
            crate::metrics::held_back(transport.name(), settlement.released.len());
        }
        let fence = match by {
            Publisher::Wal => store::relay::Fence::Pending,
            Publisher::Relay | Publisher::FastPath => store::relay::Fence::Claim(claim.token),
        };
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
                crate::metrics::publish_lag(transport.name(), waited + since_claim);
            }
        }
        crate::metrics::relay_round(
            transport.name(),
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

    /// Publish a claim wave by wave and decide each event's fate. Also returns the first error
    /// of a failed publish that a retry may cure (not a permanent rejection), and whether the
    /// broker is unavailable.
    ///
    /// A lost or refused connection says the broker is unavailable; no confirmation in time
    /// says so when the broker's health check fails too. Then no event is at fault: those events
    /// and everything not yet published are handed back without counting an attempt, and the
    /// relay stops claiming until the broker answers again (see `wait_for_broker`). Only failures of the message itself (a rejection, or a timeout
    /// while the broker answers) count toward `max_attempts` and DEAD.
    pub(super) async fn publish(
        &self,
        transport: &dyn Transport,
        claim: &Claim,
        shutdown: &CancellationToken,
    ) -> Published {
        let mut settlement = Settlement::default();
        let mut transient_error = None;
        let mut outage = None;
        let mut queues: Vec<VecDeque<&ClaimedEvent>> = if self.config.ordering {
            let mut index: HashMap<(&str, &str), usize> = HashMap::new();
            let mut queues: Vec<VecDeque<&ClaimedEvent>> = Vec::new();
            for event in &claim.events {
                let key = (event.aggregate_type.as_str(), event.aggregate_id.as_str());
                let slot = *index.entry(key).or_insert_with(|| {
                    queues.push(VecDeque::new());
                    queues.len() - 1
                });
                queues[slot].push_back(event);
            }
            queues
        } else {
            vec![claim.events.iter().collect()]
        };

        loop {
            // One wave: the next event of every aggregate still going (without ordering: all).
            let wave: Vec<&ClaimedEvent> = if self.config.ordering {
                queues.iter_mut().filter_map(VecDeque::pop_front).collect()
            } else {
                queues.iter_mut().flat_map(|q| q.drain(..)).collect()
            };
            if wave.is_empty() {
                break;
            }
            if shutdown.is_cancelled() || self.broker.is_down() {
                if outage.is_none() && !shutdown.is_cancelled() {
                    outage = Some("the broker is unavailable".to_owned());
                }
                release(&mut settlement, wave.into_iter());
                for queue in &mut queues {
                    release(&mut settlement, queue.drain(..));
                }
                break;
            }
            // The events being published and their messages, index for index.
            let mut published: Vec<&ClaimedEvent> = Vec::with_capacity(wave.len());
            let mut outgoing: Vec<OutgoingMessage> = Vec::with_capacity(wave.len());
            let mut failed_early = Vec::new();
            for event in &wave {
                match self::outgoing(event) {
                    Ok(message) => {
                        published.push(*event);
                        outgoing.push(message);
                    }
                    Err(reason) => failed_early.push((*event, reason)),
                }
            }
            let results = if outgoing.is_empty() {
                Vec::new()
            } else {
                for message in &outgoing {
                    tracing::trace!(
                        event_id = %message.event_id, event_type = %message.event_type,
                        aggregate_id = %message.aggregate_id, "publishing"
                    );
                }
                let span = tracing::debug_span!(
                    "outbox.publish",
                    transport = transport.name(),
                    messages = outgoing.len()
                );
                transport.publish(&outgoing).instrument(span).await
            };
            let mut outcomes: Vec<(&ClaimedEvent, Result<(), PublishError>)> = published
                .iter()
                .enumerate()
                .map(|(i, event)| {
                    let result = results.get(i).cloned().unwrap_or_else(|| {
                        Err(PublishError::Rejected(
                            "transport returned fewer results than messages".into(),
                        ))
                    });
                    (*event, result)
                })
                .collect();
            outcomes.extend(
                failed_early
                    .into_iter()
                    .map(|(e, reason)| (e, Err(PublishError::Permanent(reason)))),
            );
            // A lost connection is the broker's outage; no confirmation in time is when the
            // broker does not answer its health check either, or when it is on trial after an
            // outage and has confirmed nothing since (`recovery_trial`).
            let lost = outcomes.iter().find_map(|(_, r)| match r {
                Err(error @ PublishError::Connection(_)) => Some(error.to_string()),
                _ => None,
            });
            let mut on_trial = false;
            let unavailable = match lost {
                Some(lost) => Some(lost),
                None if outcomes
                    .iter()
                    .any(|(_, r)| matches!(r, Err(PublishError::Timeout(_)))) =>
                {
                    match transport.health().await {
                        Err(e) => Some(e.to_string()),
                        Ok(()) if self.broker.on_trial() => {
                            on_trial = true;
                            Some(format!(
                                "no confirmation from the broker within the publish timeout \
                                 since it came back ({} on trial)",
                                transport.name()
                            ))
                        }
                        Ok(()) => None,
                    }
                }
                None => None,
            };
            if let Some(down) = &unavailable {
                tracing::warn!(
                    relay = %self.config.relay_id, transport = transport.name(), error = %down,
                    "the broker is unavailable: handing the claim back without counting attempts"
                );
                outage = Some(down.clone());
                self.broker.open(down, on_trial);
            }
            for (event, result) in outcomes {
                match result {
                    Ok(()) => settlement.sent.push(event.id),
                    Err(error) if unavailable.is_some() && error.may_be_unavailable() => {
                        // Not this event's fault: handed back below, with the rest of the claim.
                        release(&mut settlement, std::iter::once(event));
                    }
                    Err(error) => {
                        if !error.is_permanent() && transient_error.is_none() {
                            transient_error = Some(error.to_string());
                        }
                        let attempts = event.attempts + 1;
                        let dead = error.is_permanent() || attempts >= self.config.max_attempts;
                        let delay = self.config.backoff.delay(event.attempts);
                        if dead {
                            tracing::error!(
                                event_id = %event.event_id, event_type = %event.event_type,
                                aggregate_id = %event.aggregate_id, attempts, error = %error,
                                "outbox event is DEAD"
                            );
                        } else {
                            tracing::warn!(
                                event_id = %event.event_id, event_type = %event.event_type,
                                aggregate_id = %event.aggregate_id, attempts, error = %error,
                                retry_in = ?delay, "outbox publish failed; will retry"
                            );
                        }
                        let failure = if dead {
                            Failure::Dead {
                                attempts,
                                error: error.to_string(),
                            }
                        } else {
                            Failure::Retry {
                                attempts,
                                delay,
                                error: error.to_string(),
                            }
                        };
                        settlement.failed.push(FailedEvent {
                            id: event.id,
                            failure,
                            class: failure_class(&error),
                        });
                        // The rest of this aggregate waits behind the failed event.
                        if self.config.ordering
                            && let Some(queue) = queues.iter_mut().find(|q| {
                                q.front().is_some_and(|next| {
                                    next.aggregate_type == event.aggregate_type
                                        && next.aggregate_id == event.aggregate_id
                                })
                            })
                        {
                            release(&mut settlement, queue.drain(..));
                        }
                    }
                }
            }
            if unavailable.is_some() {
                for queue in &mut queues {
                    release(&mut settlement, queue.drain(..));
                }
                break;
            }
        }
        Published {
            settlement,
            transient_error,
            outage,
        }
    }
}

/// Who publishes a claim: the relay, the fast path (the rows a commit wrote claimed), or the
/// WAL stream (PENDING rows it read from the log, unclaimed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Publisher {
    Relay,
    FastPath,
    #[cfg_attr(not(feature = "postgres-wal"), allow(dead_code))]
    Wal,
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

pub(super) fn release<'a>(
    settlement: &mut Settlement,
    events: impl Iterator<Item = &'a ClaimedEvent>,
) {
    for event in events {
        settlement.released.push(event.id);
        if event.reclaimed {
            settlement.released_reclaimed.push(event.id);
        }
    }
}

/// The message of a claimed event, ready to publish. An error means the row itself is broken
/// (it can never be published): the event goes DEAD with the reason.
pub(super) fn outgoing(event: &ClaimedEvent) -> Result<OutgoingMessage, String> {
    let envelope = event.envelope()?;
    Ok(OutgoingMessage {
        event_id: event.event_id,
        event_type: event.event_type.clone(),
        aggregate_type: event.aggregate_type.clone(),
        aggregate_id: event.aggregate_id.clone(),
        body: Bytes::from(envelope.to_json()),
        headers: envelope.transport_headers(),
    })
}

/// The class a failed publish is stored under.
pub(super) fn failure_class(error: &PublishError) -> FailureClass {
    match error {
        PublishError::Timeout(_) => FailureClass::Timeout,
        PublishError::Connection(_) => FailureClass::Connection,
        PublishError::Rejected(_) => FailureClass::Rejected,
        PublishError::Permanent(_) => FailureClass::Permanent,
    }
}
