//! One consumer at run time: its handlers, the dispatch of broker deliveries, and the worker
//! that runs stored, retried and locally delivered messages.
//!
//! **Delivery (inline mode).** Decode the CloudEvent; in one transaction insert
//! `(consumer, message_id)` (a duplicate is acked and counted, nothing else runs), run the
//! handler, commit; then ack. If the handler fails, the transaction rolls back, the message is
//! stored as RETRY (or DEAD) with its payload in a new transaction, and only then is the broker
//! acked: the worker below is the one retry mechanism. A message that cannot be decoded, or that
//! no handler of this consumer takes, is stored DEAD with the raw bytes and a clear error, then
//! acked. If even storing fails, the delivery is nacked and the broker redelivers it.
//!
//! **Batches.** Deliveries that have already arrived in a lane (up to
//! [`InboxConfig::commit_batch`]) are recorded and handled in one transaction, each handler
//! isolated as if in a savepoint of its own: a failing handler rolls back only its own work, and
//! its message is stored as RETRY (or DEAD) in the same commit. The batch first runs without
//! savepoints (a round trip per message saved); when a handler fails there, the transaction rolls
//! back and the batch runs again with a savepoint per handler, the failed handler's failure
//! recorded without running it again. On PostgreSQL and SQLite one multi-row insert records the
//! whole batch before the first handler runs (and says which messages were duplicates); on MySQL
//! each message is recorded before its handler. One commit for several messages is what lets a
//! consumer handle more messages per second than the database commits transactions. The acks
//! follow the commit. If the batch cannot be recorded, each of its deliveries goes the single
//! way above, and finds what a commit that did happen recorded.
//!
//! **Duplicates and conflicts.** When `(consumer, message_id)` is already recorded, the stored
//! payload is compared with the delivered bytes: the same bytes are a duplicate (acked and
//! counted); different bytes are a conflict, kept as a DEAD row under
//! `{message_id}#conflict-{digest of the bytes}` for an operator, counted, logged and acked. A
//! redelivery of the same conflicting bytes finds that row and is a duplicate.
//!
//! **Worker.** Claims PENDING and due RETRY messages of the consumer (and PROCESSING ones whose
//! lease expired) with the same lease, fencing and per-aggregate rules as the relay; marks each
//! DONE inside the handler's transaction, fenced by its claim token, so a worker that lost its
//! claim commits nothing.
//!
//! **Order.** With ordering on, a message waits behind an unfinished message of its aggregate
//! (stored PENDING behind it), and deliveries of one aggregate run one after another while
//! different aggregates run in parallel (keyed concurrency). Order holds within one runtime
//! instance; instances sharing a consumer name on a broker can each get messages of one aggregate,
//! so handlers that must not apply stale events should also check the aggregate version.

use std::{
    collections::HashMap,
    fmt,
    hash::{Hash, Hasher},
    panic::AssertUnwindSafe,
    sync::{
        Arc,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
    time::Duration,
};

use chrono::Utc;
use futures_util::{FutureExt, StreamExt};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{HandlerContext, HandlerError, HandlerMode, HandlerRegistration, InboxTransaction};
use crate::{
    envelope::Envelope,
    outbox::Outbox,
    relay::Backoff,
    runtime::health::LoopHealth,
    store::{
        self,
        inbox::{ClaimedMessage, InitialState, NewInboxRow},
        relay::ClaimParams,
    },
    trace::TraceContext,
    transport::{Delivery, SubscribeOptions, Transport},
};

/// Settings of the inbox side of a runtime, per consumer unless a handler overrides them.
#[derive(Debug, Clone)]
pub struct InboxConfig {
    /// Messages handled in parallel per consumer (different aggregates). Default 8.
    pub concurrency: usize,
    /// Messages the worker claims per round. Default 100.
    pub batch_size: usize,
    /// How long a worker owns a claimed message. Default 30 s: longer than a handler runs.
    pub lease: Duration,
    /// Worker sleep when idle and not woken. Default 1 s.
    pub poll_interval: Duration,
    /// Handler attempts before DEAD (a handler's `max_attempts` overrides it). Default 10.
    pub max_attempts: u32,
    /// Retry delays (a handler's `backoff`/`backoff_cap` override them). Default 1 s · 2ⁿ,
    /// capped at 300 s, plus up to 20% jitter.
    pub backoff: Backoff,
    /// Per-aggregate order (a handler's `ordering` overrides it). Default on.
    pub ordering: bool,
    /// Broker subscription settings.
    pub subscribe: SubscribeOptions,
    /// Deliveries waiting in one lane that are recorded and handled in one transaction, each
    /// handler isolated as in a savepoint of its own (a failing handler rolls back only its own
    /// work and its message is stored for retry in the same commit; handlers before it in the
    /// batch may run a second time, in the transaction that commits). Default 32; 1 commits each
    /// delivery on its own. A batch never waits for more deliveries: it takes what has arrived.
    pub commit_batch: usize,
}

impl Default for InboxConfig {
    fn default() -> Self {
        InboxConfig {
            concurrency: 8,
            batch_size: 100,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            max_attempts: 10,
            backoff: Backoff::default(),
            ordering: true,
            subscribe: SubscribeOptions::default(),
            commit_batch: 32,
        }
    }
}

/// First pause before recording a delivery again after a database error; doubled up to
/// [`RECORD_RETRY_CAP`].
const RECORD_RETRY_FIRST: Duration = Duration::from_millis(50);
const RECORD_RETRY_CAP: Duration = Duration::from_secs(5);
/// Attempts to record a delivery when the error is neither a lost connection nor a deadlock.
const RECORD_ATTEMPTS_ON_OTHER_ERRORS: u32 = 3;
/// Batches that take a savepoint per handler from the start after a batch whose pass without
/// savepoints met a failing handler.
const CAREFUL_BATCHES: u32 = 8;

/// Counters of one consumer since start.
#[derive(Debug, Default)]
pub struct ConsumerStats {
    handled: AtomicU64,
    duplicates: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
    stored: AtomicU64,
    stale: AtomicU64,
    conflicts: AtomicU64,
    unrecorded: AtomicU64,
    batch_reruns: AtomicU64,
}

/// A snapshot of a consumer's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumerStatsSnapshot {
    /// Messages whose handler committed.
    pub handled: u64,
    /// Deliveries suppressed as duplicates of a recorded message.
    pub duplicates: u64,
    /// Handler failures scheduled for retry.
    pub retried: u64,
    /// Messages that went DEAD.
    pub dead: u64,
    /// Messages stored for the worker (stored mode, or waiting behind their aggregate).
    pub stored: u64,
    /// Worker writes fenced off because another worker took the message over.
    pub stale: u64,
    /// Deliveries whose message id was already recorded with a different payload: kept as DEAD
    /// rows under a derived id (`{message_id}#conflict-{digest}`) for an operator.
    pub conflicts: u64,
    /// Attempts to record a delivery that failed on the database (a lost connection, a
    /// deadlock); the delivery was tried again in its lane, so later messages of its aggregate
    /// kept waiting behind it.
    pub unrecorded: u64,
    /// Batches whose run without savepoints met a failing handler, rolled back and ran again
    /// with a savepoint per handler (see [`InboxConfig::commit_batch`]).
    pub batch_reruns: u64,
}

impl ConsumerStats {
    /// Read every counter.
    pub fn snapshot(&self) -> ConsumerStatsSnapshot {
        ConsumerStatsSnapshot {
            handled: self.handled.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            dead: self.dead.load(Ordering::Relaxed),
            stored: self.stored.load(Ordering::Relaxed),
            stale: self.stale.load(Ordering::Relaxed),
            conflicts: self.conflicts.load(Ordering::Relaxed),
            unrecorded: self.unrecorded.load(Ordering::Relaxed),
            batch_reruns: self.batch_reruns.load(Ordering::Relaxed),
        }
    }
}

/// What happened to a message, for the counters and the `inbox_messages_total` metric.
#[derive(Debug, Clone, Copy)]
#[allow(non_camel_case_types)] // named after the counters they bump
enum Counter {
    handled,
    duplicates,
    retried,
    dead,
    stored,
    stale,
    conflicts,
    unrecorded,
}

/// A consumer's handlers and settings, shared by its dispatcher and worker.
pub(crate) struct Consumer {
    pub(crate) name: &'static str,
    handlers: HashMap<(&'static str, u32), &'static HandlerRegistration>,
    pub(crate) event_types: Vec<String>,
    ordering: bool,
    mode: HandlerMode,
    config: InboxConfig,
    db: DatabaseConnection,
    outbox: Outbox,
    pub(crate) wake: Arc<Notify>,
    pub(crate) stats: Arc<ConsumerStats>,
    worker_id: String,
    /// Batches still to run with savepoints from the start ([`Self::process_batch`]).
    careful: AtomicU32,
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("name", &self.name)
            .field("event_types", &self.event_types)
            .field("ordering", &self.ordering)
            .field("mode", &self.mode)
            .finish()
    }
}

/// A broker delivery and its decoded envelope (or why it could not be decoded).
pub(crate) type Decoded = (Delivery, Result<Envelope, String>);

/// How a batch runs ([`Consumer::process_batch`]).
enum Pass {
    /// Without savepoints: stops at the first failing handler, rolls everything back and
    /// returns its index and error.
    Optimistic,
    /// A savepoint per handler; the failure the optimistic pass met (if any) is recorded without
    /// running that handler again.
    Savepoints(Option<(usize, HandlerError)>),
}

/// Outcome of handling one message.
enum Outcome {
    Done,
    Failed,
}

impl Consumer {
    fn count(&self, counter: Counter) {
        let (field, outcome) = match counter {
            Counter::handled => (&self.stats.handled, "handled"),
            Counter::duplicates => (&self.stats.duplicates, "duplicate"),
            Counter::retried => (&self.stats.retried, "retried"),
            Counter::dead => (&self.stats.dead, "dead"),
            Counter::stored => (&self.stats.stored, "stored"),
            Counter::stale => (&self.stats.stale, "stale"),
            Counter::conflicts => (&self.stats.conflicts, "conflict"),
            Counter::unrecorded => (&self.stats.unrecorded, "unrecorded"),
        };
        field.fetch_add(1, Ordering::Relaxed);
        crate::metrics::inbox(self.name, outcome);
    }

    pub(crate) fn new(
        name: &'static str,
        registrations: &[&'static HandlerRegistration],
        config: InboxConfig,
        db: DatabaseConnection,
        outbox: Outbox,
        wake: Arc<Notify>,
        worker_id: String,
    ) -> Self {
        let handlers: HashMap<_, _> = registrations
            .iter()
            .map(|r| ((r.event_type, r.schema_version), *r))
            .collect();
        let mut event_types: Vec<String> = registrations
            .iter()
            .map(|r| r.event_type.to_owned())
            .collect();
        event_types.sort();
        event_types.dedup();
        let ordering = registrations
            .iter()
            .find_map(|r| r.ordering)
            .unwrap_or(config.ordering);
        let mode = if registrations.iter().any(|r| r.mode == HandlerMode::Stored) {
            HandlerMode::Stored
        } else {
            HandlerMode::Inline
        };
        Consumer {
            name,
            handlers,
            event_types,
            ordering,
            mode,
            config,
            db,
            outbox,
            wake,
            stats: Arc::default(),
            worker_id,
            careful: AtomicU32::new(0),
        }
    }

    /// The handler registered for the envelope's type and schema version, if any.
    fn registration(&self, envelope: &Envelope) -> Option<&'static HandlerRegistration> {
        let version = envelope.schema_version.unwrap_or(1);
        self.handlers
            .get(&(envelope.event_type.as_str(), version))
            .copied()
    }

    fn handler(&self, envelope: &Envelope) -> Result<&'static HandlerRegistration, String> {
        let version = envelope.schema_version.unwrap_or(1);
        if let Some(reg) = self.registration(envelope) {
            return Ok(reg);
        }
        let versions: Vec<u32> = self
            .handlers
            .keys()
            .filter(|(t, _)| *t == envelope.event_type)
            .map(|(_, v)| *v)
            .collect();
        if versions.is_empty() {
            Err(format!(
                "consumer `{}` has no handler for event type `{}`",
                self.name, envelope.event_type
            ))
        } else {
            Err(format!(
                "consumer `{}` has no handler for `{}` schema version {version} (it handles versions {versions:?})",
                self.name, envelope.event_type
            ))
        }
    }

    fn max_attempts(&self, reg: Option<&HandlerRegistration>) -> u32 {
        reg.and_then(|r| r.max_attempts)
            .unwrap_or(self.config.max_attempts)
            .max(1)
    }

    fn backoff(&self, reg: &HandlerRegistration) -> Backoff {
        let mut backoff = self.config.backoff;
        if let Some(ms) = reg.backoff_base_ms {
            backoff.base = Duration::from_millis(ms);
        }
        if let Some(ms) = reg.backoff_cap_ms {
            backoff.cap = Duration::from_millis(ms);
        }
        backoff
    }

    /// Where a failed attempt goes: RETRY at its due time, or DEAD.
    fn failure_state(
        &self,
        reg: Option<&HandlerRegistration>,
        error: &HandlerError,
        attempts: u32,
    ) -> InitialState {
        let dead = error.is_permanent() || attempts >= self.max_attempts(reg);
        if dead {
            return InitialState::Dead {
                attempts,
                error: error.to_string(),
            };
        }
        let delay = error.retry_after().unwrap_or_else(|| {
            reg.map_or(self.config.backoff, |r| self.backoff(r))
                .delay(attempts.saturating_sub(1))
        });
        InitialState::Retry {
            attempts,
            next_attempt_at: Utc::now()
                + chrono::Duration::from_std(delay).unwrap_or_else(|_| chrono::Duration::hours(1)),
            error: error.to_string(),
        }
    }

    /// Run a handler inside `tx`, in a span carrying the event's identity and in the child of
    /// the producer's trace context (so events it enqueues continue the trace); a panic is
    /// turned into an error.
    async fn run_handler(
        &self,
        reg: &HandlerRegistration,
        itx: &InboxTransaction,
        envelope: &Envelope,
        attempt: u32,
    ) -> Result<(), HandlerError> {
        let span = tracing::info_span!(
            "outbox.handle",
            consumer = self.name,
            event_type = %envelope.event_type,
            event_id = %envelope.id,
            aggregate_id = envelope.subject.as_deref().unwrap_or(""),
            attempt,
            traceparent = envelope.traceparent.as_deref().unwrap_or(""),
        );
        let handler = AssertUnwindSafe((reg.handler)(itx, envelope, attempt)).catch_unwind();
        let parent = envelope
            .traceparent
            .as_deref()
            .and_then(|tp| TraceContext::new(tp, envelope.tracestate.clone()).ok());
        let started = std::time::Instant::now();
        let outcome = match parent {
            // With OpenTelemetry the handler's own span is the child, and `enqueue` reads it.
            #[cfg(feature = "opentelemetry")]
            Some(parent) if crate::trace::otel::installed() => {
                crate::trace::otel::set_parent(&span, &parent);
                handler.instrument(span).await
            }
            Some(parent) => parent.child().scope(handler.instrument(span)).await,
            None => handler.instrument(span).await,
        };
        crate::metrics::handler_duration(self.name, &envelope.event_type, started.elapsed());
        match outcome {
            Ok(result) => result,
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a non-string panic payload".to_owned());
                Err(HandlerError::retry(format!(
                    "handler `{}` panicked: {message}",
                    reg.function
                )))
            }
        }
    }

    /// Record a message as `state` in its own transaction. `false`: it was recorded already,
    /// and is counted as a duplicate or kept as a conflict (see [`Self::recorded_already`]).
    async fn store(
        &self,
        row: &NewInboxRow<'_>,
        state: &InitialState,
    ) -> Result<bool, sea_orm::DbErr> {
        if store::inbox::insert(&self.db, row, state, Utc::now()).await? {
            return Ok(true);
        }
        self.recorded_already(row).await?;
        Ok(false)
    }

    /// `(consumer, message_id)` of `row` is recorded already. With the same payload this is a
    /// duplicate: counted, nothing else happens. With a different one, the delivery is kept as a
    /// DEAD row under `{message_id}#conflict-{digest of the bytes}` for an operator, counted as a
    /// conflict and logged; a redelivery of the same conflicting bytes finds that row and is a
    /// duplicate.
    async fn recorded_already(&self, row: &NewInboxRow<'_>) -> Result<(), sea_orm::DbErr> {
        let first = store::inbox::recorded(&self.db, row.consumer, row.message_id).await?;
        let first_status = match first {
            // Gone meanwhile (purged): nothing to compare with.
            None => None,
            Some((_, payload)) if payload == row.payload => None,
            Some((status, _)) => Some(status),
        };
        let Some(first_status) = first_status else {
            self.count(Counter::duplicates);
            tracing::debug!(consumer = self.name, message_id = %row.message_id, "duplicate delivery suppressed");
            return Ok(());
        };
        let kept_as = conflict_id(row.message_id, row.payload);
        let error = format!(
            "message id `{}` was already delivered with a different payload (the first delivery \
             is {first_status}); this one was not handled and is kept for an operator",
            row.message_id
        );
        // Without its aggregate: the kept copy must not hold later messages of it back.
        let conflict = NewInboxRow {
            message_id: &kept_as,
            aggregate_type: None,
            aggregate_id: None,
            aggregate_version: None,
            ..row.clone()
        };
        let state = InitialState::Dead {
            attempts: 0,
            error: error.clone(),
        };
        if store::inbox::insert(&self.db, &conflict, &state, Utc::now()).await? {
            self.count(Counter::conflicts);
            tracing::error!(consumer = self.name, message_id = %row.message_id, kept_as = %kept_as, %error, "conflicting delivery stored as DEAD");
        } else {
            self.count(Counter::duplicates);
            tracing::debug!(consumer = self.name, message_id = %row.message_id, kept_as = %kept_as, "conflicting delivery seen before; suppressed");
        }
        Ok(())
    }

    /// Handle one broker delivery, then settle it with the broker.
    /// Record and handle one delivery, then ack it. When recording fails on the database, try
    /// again here, in the delivery's lane, so that later messages of its aggregate keep waiting
    /// behind it: while the database is unreachable (or the error is a deadlock) until it
    /// answers again or the runtime shuts down, otherwise a few times. Only then nack it for
    /// the broker to redeliver.
    pub(crate) async fn deliver(
        &self,
        delivery: Delivery,
        decoded: Result<Envelope, String>,
        shutdown: &CancellationToken,
    ) {
        let span = match &decoded {
            Ok(e) => tracing::debug_span!(
                "outbox.dispatch", consumer = self.name, event_id = %e.id,
                event_type = %e.event_type, aggregate_id = e.subject.as_deref().unwrap_or(""),
                delivery_count = delivery.delivery_count,
            ),
            Err(_) => tracing::debug_span!(
                "outbox.dispatch",
                consumer = self.name,
                undecodable = true,
                delivery_count = delivery.delivery_count,
            ),
        };
        let mut delay = RECORD_RETRY_FIRST;
        let mut other_errors = 0;
        let settle = loop {
            let error = match self
                .process_delivery(&delivery, &decoded)
                .instrument(span.clone())
                .await
            {
                Ok(()) => {
                    failpoint!(crate::failpoints::INBOX_AFTER_COMMIT, ());
                    break delivery.ack().await;
                }
                Err(e) => e,
            };
            #[cfg(feature = "failpoints")]
            if crate::failpoints::is_injected(&error) {
                return; // the process "died" here: neither ack nor nack
            }
            self.count(Counter::unrecorded);
            let retry_here = store::is_transient(&error) || store::is_connection_error(&error);
            if !retry_here {
                other_errors += 1;
            }
            if shutdown.is_cancelled() || other_errors >= RECORD_ATTEMPTS_ON_OTHER_ERRORS {
                tracing::warn!(consumer = self.name, error = %error, "could not record a delivery; the broker will redeliver it");
                break delivery.nack(Some(Duration::from_secs(1))).await;
            }
            tracing::warn!(
                consumer = self.name, error = %error, retry_in = ?delay,
                "could not record a delivery; trying again (later messages of its aggregate wait)"
            );
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(RECORD_RETRY_CAP);
        };
        if let Err(e) = settle {
            tracing::warn!(consumer = self.name, error = %e, "could not settle a delivery with the broker");
        }
    }

    /// Deliveries that arrived together in one lane, in order: runs of messages a handler takes
    /// inline are recorded and handled in one transaction ([`Self::deliver_batch`]); the rest
    /// one by one.
    pub(crate) async fn deliver_all(&self, arrived: Vec<Decoded>, shutdown: &CancellationToken) {
        let mut arrived = arrived.into_iter().peekable();
        while arrived.peek().is_some() {
            let mut run = Vec::new();
            while let Some(next) = arrived.next_if(|(_, decoded)| self.inline(decoded)) {
                run.push(next);
            }
            if run.len() > 1 {
                self.deliver_batch(run, shutdown).await;
            } else {
                for (delivery, decoded) in run {
                    self.deliver(delivery, decoded, shutdown).await;
                }
            }
            if let Some((delivery, decoded)) = arrived.next_if(|(_, decoded)| !self.inline(decoded))
            {
                self.deliver(delivery, decoded, shutdown).await;
            }
        }
    }

    /// The transaction a handler's first attempt at a delivered message runs in.
    fn first_attempt(&self, tx: crate::OutboxTransaction, envelope: &Envelope) -> InboxTransaction {
        InboxTransaction::new(
            tx,
            HandlerContext {
                consumer: self.name,
                message_id: envelope.id.clone(),
                attempt: 1,
            },
        )
    }

    /// Whether a handler of this consumer runs the message inline.
    fn inline(&self, decoded: &Result<Envelope, String>) -> bool {
        self.mode == HandlerMode::Inline
            && decoded
                .as_ref()
                .is_ok_and(|envelope| self.registration(envelope).is_some())
    }

    /// Record and handle several deliveries in one transaction, then ack them all. If the
    /// batch cannot be recorded, each delivery goes the single way ([`Self::deliver`]), which
    /// retries and finds what a commit that did happen recorded.
    async fn deliver_batch(&self, run: Vec<Decoded>, shutdown: &CancellationToken) {
        match self.process_batch(&run).await {
            Ok(()) => {
                failpoint!(crate::failpoints::INBOX_AFTER_COMMIT, ());
                let acks = run.into_iter().map(|(delivery, _)| delivery.ack());
                for settled in futures_util::future::join_all(acks).await {
                    if let Err(e) = settled {
                        tracing::warn!(consumer = self.name, error = %e, "could not settle a delivery with the broker");
                    }
                }
            }
            Err(error) => {
                #[cfg(feature = "failpoints")]
                if crate::failpoints::is_injected(&error) {
                    return; // the process "died" here: neither ack nor nack
                }
                tracing::debug!(consumer = self.name, error = %error, deliveries = run.len(), "could not record a batch; recording its deliveries one by one");
                for (delivery, decoded) in run {
                    self.deliver(delivery, decoded, shutdown).await;
                }
            }
        }
    }

    /// One transaction for a run of inline messages: each handler in its own savepoint, a
    /// failure stored as RETRY or DEAD in place of its rolled-back savepoint, messages behind an
    /// unfinished one of their aggregate stored PENDING. Counted once committed.
    ///
    /// A savepoint costs a round trip per message, and most batches never roll one back: the
    /// batch first runs without savepoints. If a handler fails there, the whole transaction rolls
    /// back and the batch runs again with a savepoint per handler; the failed handler is not run
    /// a second time (its failure is recorded as it was), those before it run again in the new
    /// transaction. After such a batch the next [`CAREFUL_BATCHES`] take savepoints from the
    /// start, so a run of failures (a downstream outage) costs no work twice.
    async fn process_batch(&self, run: &[Decoded]) -> Result<(), sea_orm::DbErr> {
        let mut items = Vec::with_capacity(run.len());
        for (delivery, decoded) in run {
            let Ok(envelope) = decoded else {
                return Err(sea_orm::DbErr::Custom(
                    "undecodable message in a batch".into(),
                ));
            };
            let reg = self.handler(envelope).map_err(sea_orm::DbErr::Custom)?;
            items.push((delivery, envelope, reg));
        }
        let careful = self
            .careful
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        let failed = if careful {
            None
        } else {
            match self.handle_batch(&items, Pass::Optimistic).await? {
                None => return Ok(()),
                Some(failed) => {
                    self.careful.store(CAREFUL_BATCHES, Ordering::Relaxed);
                    self.stats.batch_reruns.fetch_add(1, Ordering::Relaxed);
                    Some(failed)
                }
            }
        };
        // With savepoints the pass never stops early.
        self.handle_batch(&items, Pass::Savepoints(failed)).await?;
        Ok(())
    }

    /// One pass of [`Self::process_batch`], `None` once committed; see [`Pass`].
    async fn handle_batch(
        &self,
        items: &[(&Delivery, &Envelope, &'static HandlerRegistration)],
        pass: Pass,
    ) -> Result<Option<(usize, HandlerError)>, sea_orm::DbErr> {
        let (savepoints, mut failed_before) = match pass {
            Pass::Optimistic => (false, None),
            Pass::Savepoints(failed) => (true, failed),
        };
        enum Done {
            Handled,
            Stored,
            Failed(String, InitialState),
        }
        let mut done = Vec::with_capacity(items.len());
        let mut seen_before = Vec::new();
        let aggregate_of = |envelope: &Envelope| match (&envelope.aggregate_type, &envelope.subject)
        {
            (Some(t), Some(id)) if self.ordering => Some((t.clone(), id.clone())),
            _ => None,
        };
        let mut tx = self.outbox.begin(&self.db).await.map_err(into_db_err)?;
        // The whole batch recorded up front, in the transaction: a message behind an unfinished
        // one of its aggregate (recorded before this batch) as PENDING, the rest as DONE; on
        // MySQL, one insert per message below.
        let rows: Vec<NewInboxRow<'_>> = items
            .iter()
            .map(|(delivery, envelope, _)| inbox_row(self.name, envelope, &delivery.body))
            .collect();
        let store::inbox::RecordedBatch {
            mut blocked,
            inserted: recorded,
        } = store::inbox::record_batch(&tx, &rows, self.ordering, Utc::now()).await?;
        let recorded_pending: Vec<bool> = items
            .iter()
            .map(|(_, envelope, _)| aggregate_of(envelope).is_some_and(|a| blocked.contains(&a)))
            .collect();
        for (i, &(_, envelope, reg)) in items.iter().enumerate() {
            let row = rows[i].clone();
            let aggregate = aggregate_of(envelope);
            // Some(inserted) when recorded up front.
            let fresh = recorded.as_ref().map(|inserted| inserted[i]);
            if aggregate.as_ref().is_some_and(|a| blocked.contains(a)) {
                let stored = match fresh {
                    Some(true) => {
                        if !recorded_pending[i] {
                            // An earlier message of its aggregate failed in this batch.
                            store::inbox::restate(
                                &tx,
                                self.name,
                                &envelope.id,
                                &InitialState::Pending,
                                Utc::now(),
                            )
                            .await?;
                        }
                        true
                    }
                    Some(false) => false,
                    None => {
                        store::inbox::insert(&tx, &row, &InitialState::Pending, Utc::now()).await?
                    }
                };
                if stored {
                    done.push(Done::Stored);
                } else {
                    seen_before.push(row);
                }
                continue;
            }
            if fresh == Some(false) {
                seen_before.push(row);
                continue;
            }
            let error = match failed_before.take_if(|(at, _)| *at == i) {
                // Failed in the pass without savepoints: recorded as it failed, not run again.
                Some((_, error)) => error,
                None => {
                    // A savepoint per handler, never released: RELEASE would cost a round trip
                    // per message, and the stack stays as deep as the batch is long.
                    if savepoints {
                        tx.execute_unprepared(&format!("SAVEPOINT outbox_inbox_{i}"))
                            .await?;
                    }
                    if fresh.is_none()
                        && !store::inbox::insert(&tx, &row, &InitialState::Done, Utc::now()).await?
                    {
                        seen_before.push(row);
                        continue;
                    }
                    let mark = tx.mark();
                    let itx = self.first_attempt(tx, envelope);
                    let result = self.run_handler(reg, &itx, envelope, 1).await;
                    tx = itx.into_inner();
                    match result {
                        Ok(()) => {
                            failpoint!(error crate::failpoints::INBOX_AFTER_HANDLER);
                            done.push(Done::Handled);
                            continue;
                        }
                        Err(error) if !savepoints => {
                            // Everything goes; the batch runs again with savepoints.
                            tx.rollback().await.map_err(into_db_err)?;
                            return Ok(Some((i, error)));
                        }
                        Err(error) => {
                            // Its writes, events and after-commit callbacks go; the batch's stay.
                            tx.execute_unprepared(&format!(
                                "ROLLBACK TO SAVEPOINT outbox_inbox_{i}"
                            ))
                            .await?;
                            tx.rewind(mark);
                            error
                        }
                    }
                }
            };
            let state = self.failure_state(Some(reg), &error, 1);
            failpoint!(error crate::failpoints::INBOX_STORE_RETRY);
            let stored = if fresh.is_some() {
                // Recorded before the savepoint: still there, as DONE.
                store::inbox::restate(&tx, self.name, &envelope.id, &state, Utc::now()).await?;
                true
            } else {
                store::inbox::insert(&tx, &row, &state, Utc::now()).await?
            };
            if stored {
                done.push(Done::Failed(envelope.id.clone(), state));
            } else {
                seen_before.push(row);
            }
            if let Some(aggregate) = aggregate {
                blocked.insert(aggregate); // later messages of it wait behind this one
            }
        }
        let _ = tx.commit().await.map_err(into_db_err)?;

        let mut wake = false;
        for outcome in done {
            match outcome {
                Done::Handled => self.count(Counter::handled),
                Done::Stored => {
                    self.count(Counter::stored);
                    wake = true;
                }
                Done::Failed(message_id, state) => {
                    self.log_failure(&message_id, &state);
                    self.count_failure(&state);
                    wake = true;
                }
            }
        }
        if wake {
            self.wake.notify_one();
        }
        for row in seen_before {
            self.recorded_already(&row).await?;
        }
        Ok(None)
    }

    async fn process_delivery(
        &self,
        delivery: &Delivery,
        decoded: &Result<Envelope, String>,
    ) -> Result<(), sea_orm::DbErr> {
        let envelope = match decoded {
            Ok(envelope) => envelope,
            Err(error) => {
                // The broker's message id, when the database can hold it as it is.
                let message_id = delivery
                    .message_id
                    .clone()
                    .filter(|id| {
                        !id.is_empty()
                            && !id.contains('\0')
                            && id.chars().count() <= store::inbox::MAX_MESSAGE_ID_CHARS
                    })
                    .unwrap_or_else(|| format!("undecodable-{:016x}", digest(&delivery.body)));
                let row = NewInboxRow {
                    consumer: self.name,
                    message_id: &message_id,
                    payload: &delivery.body,
                    ..NewInboxRow::default()
                };
                let state = InitialState::Dead {
                    attempts: 0,
                    error: format!("undecodable message: {error}"),
                };
                if self.store(&row, &state).await? {
                    tracing::error!(consumer = self.name, message_id = %message_id, %error, "undecodable message stored as DEAD");
                    self.count(Counter::dead);
                }
                return Ok(());
            }
        };
        let row = inbox_row(self.name, envelope, &delivery.body);

        let reg = match self.handler(envelope) {
            Ok(reg) => reg,
            Err(error) => {
                let state = InitialState::Dead {
                    attempts: 0,
                    error: error.clone(),
                };
                if self.store(&row, &state).await? {
                    tracing::error!(consumer = self.name, message_id = %envelope.id, %error, "message stored as DEAD");
                    self.count(Counter::dead);
                }
                return Ok(());
            }
        };

        let behind = self.ordering
            && match (&envelope.aggregate_type, &envelope.subject) {
                (Some(t), Some(id)) => {
                    store::inbox::has_unfinished(&self.db, self.name, t, id).await?
                }
                _ => false,
            };
        if behind || self.mode == HandlerMode::Stored {
            if self.store(&row, &InitialState::Pending).await? {
                self.count(Counter::stored);
                self.wake.notify_one();
            }
            return Ok(());
        }

        // Inline: record and handle in one transaction.
        let tx = self.outbox.begin(&self.db).await.map_err(into_db_err)?;
        if !store::inbox::insert(&tx, &row, &InitialState::Done, Utc::now()).await? {
            tx.rollback().await.map_err(into_db_err)?;
            return self.recorded_already(&row).await;
        }
        let itx = self.first_attempt(tx, envelope);
        let result = self.run_handler(reg, &itx, envelope, 1).await;
        if result.is_ok() {
            failpoint!(error crate::failpoints::INBOX_AFTER_HANDLER);
        }
        let error = match result {
            Ok(()) => match itx.into_inner().commit().await {
                Ok(_) => {
                    self.count(Counter::handled);
                    return Ok(());
                }
                Err(e) => HandlerError::retry(format!("commit failed: {e}")),
            },
            Err(error) => {
                drop(itx); // roll back the handler's work and the inbox record
                error
            }
        };
        let state = self.failure_state(Some(reg), &error, 1);
        self.log_failure(&envelope.id, &state);
        failpoint!(error crate::failpoints::INBOX_STORE_RETRY);
        if self.store(&row, &state).await? {
            self.count_failure(&state);
            self.wake.notify_one();
        }
        Ok(())
    }

    fn log_failure(&self, message_id: &str, state: &InitialState) {
        match state {
            InitialState::Dead { attempts, error } => tracing::error!(
                consumer = self.name, message_id, attempts, error = %error, "message is DEAD"
            ),
            InitialState::Retry {
                attempts,
                next_attempt_at,
                error,
            } => tracing::warn!(
                consumer = self.name, message_id, attempts, error = %error,
                next_attempt_at = %next_attempt_at, "handler failed; will retry"
            ),
            _ => {}
        }
    }

    fn count_failure(&self, state: &InitialState) {
        match state {
            InitialState::Dead { .. } => self.count(Counter::dead),
            _ => self.count(Counter::retried),
        }
    }

    /// Pull deliveries until shutdown; run them in `concurrency` lanes keyed by aggregate.
    pub(crate) async fn run_dispatcher(
        self: Arc<Self>,
        transport: Arc<dyn Transport>,
        shutdown: CancellationToken,
        health: Arc<LoopHealth>,
    ) {
        let lanes = self.config.concurrency.max(1);
        let mut senders = Vec::with_capacity(lanes);
        let mut workers = Vec::with_capacity(lanes);
        let batch = self.config.commit_batch.max(1);
        for _ in 0..lanes {
            // Room for every delivery the broker may hand out at once: a busy lane never holds
            // the dispatcher (and the other lanes) up; memory stays bounded by `max_in_flight`.
            let (tx, mut rx) =
                mpsc::channel::<Decoded>(self.config.subscribe.max_in_flight.max(batch));
            senders.push(tx);
            let consumer = self.clone();
            let shutdown = shutdown.clone();
            workers.push(tokio::spawn(async move {
                let mut arrived = Vec::with_capacity(batch);
                while rx.recv_many(&mut arrived, batch).await > 0 {
                    consumer
                        .deliver_all(std::mem::take(&mut arrived), &shutdown)
                        .await;
                }
            }));
        }
        let mut delay = Duration::from_millis(100);
        'subscribe: while !shutdown.is_cancelled() {
            let mut subscription = match transport
                .subscribe(self.name, &self.event_types, &self.config.subscribe)
                .await
            {
                Ok(s) => s,
                Err(e) => {
                    health.failure(&e.to_string());
                    tracing::warn!(consumer = self.name, error = %e, "subscribe failed; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            delay = Duration::from_millis(100);
            health.success();
            loop {
                let next = tokio::select! {
                    _ = shutdown.cancelled() => break 'subscribe,
                    next = subscription.next() => next,
                };
                match next {
                    Some(Ok(delivery)) => {
                        health.success();
                        let decoded =
                            Envelope::from_json(&delivery.body).map_err(|e| e.to_string());
                        let key = match &decoded {
                            Ok(e) => lane_key(e),
                            Err(_) => delivery.message_id.clone().unwrap_or_default(),
                        };
                        let lane = (digest(key.as_bytes()) % lanes as u64) as usize;
                        if senders[lane].send((delivery, decoded)).await.is_err() {
                            break 'subscribe;
                        }
                    }
                    Some(Err(e)) => {
                        health.failure(&e.to_string());
                        tracing::warn!(consumer = self.name, error = %e, "subscription error; resubscribing");
                        tokio::time::sleep(delay).await;
                        continue 'subscribe;
                    }
                    None => continue 'subscribe,
                }
            }
        }
        drop(senders);
        for worker in workers {
            let _ = worker.await;
        }
    }

    /// Claim and handle stored, retried and locally delivered messages until shutdown.
    pub(crate) async fn run_worker(
        self: Arc<Self>,
        shutdown: CancellationToken,
        health: Arc<LoopHealth>,
    ) {
        while !shutdown.is_cancelled() {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.work_once(&shutdown).await {
                Ok(claimed) => {
                    health.success();
                    if claimed >= self.config.batch_size {
                        continue;
                    }
                }
                Err(e) => {
                    health.failure(&e.to_string());
                    tracing::warn!(consumer = self.name, error = %e, "inbox worker round failed; retrying");
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = &mut notified => {}
                _ = tokio::time::sleep(self.config.poll_interval) => {}
            }
        }
    }

    /// One worker round: claim, handle per aggregate in order, aggregates in parallel.
    pub(crate) async fn work_once(
        &self,
        shutdown: &CancellationToken,
    ) -> Result<usize, sea_orm::DbErr> {
        let now = Utc::now();
        let lease = chrono::Duration::from_std(self.config.lease)
            .unwrap_or_else(|_| chrono::Duration::seconds(30));
        let params = ClaimParams {
            relay_id: &self.worker_id,
            batch_size: self.config.batch_size,
            locked_until: now + lease,
            now,
            ordering: self.ordering,
            max_attempts: self.max_attempts(None),
        };
        let claim = store::inbox::claim(&self.db, self.name, &params).await?;
        for _ in 0..claim.dead {
            self.count(Counter::dead);
        }
        let claimed = claim.messages.len() + claim.dead;
        if claim.messages.is_empty() {
            return Ok(claimed);
        }
        // Group by aggregate, keeping arrival order inside each group.
        let mut groups: Vec<Vec<ClaimedMessage>> = Vec::new();
        let mut index: HashMap<(String, String), usize> = HashMap::new();
        for message in claim.messages {
            match (&message.aggregate_type, &message.aggregate_id) {
                (Some(t), Some(id)) if self.ordering => {
                    let slot = *index.entry((t.clone(), id.clone())).or_insert_with(|| {
                        groups.push(Vec::new());
                        groups.len() - 1
                    });
                    groups[slot].push(message);
                }
                _ => groups.push(vec![message]),
            }
        }
        let token = claim.token;
        let released = futures_util::stream::iter(groups)
            .map(|group| async move {
                let mut rest = group.into_iter();
                let mut released = Vec::new();
                for message in rest.by_ref() {
                    if shutdown.is_cancelled() {
                        released.push(message);
                        break;
                    }
                    match self.handle_claimed(&message, token).await {
                        Outcome::Done => {}
                        Outcome::Failed => break,
                    }
                }
                released.extend(rest);
                released
            })
            .buffer_unordered(self.config.concurrency.max(1))
            .collect::<Vec<_>>()
            .await;
        let released: Vec<ClaimedMessage> = released.into_iter().flatten().collect();
        if !released.is_empty() {
            let ids: Vec<i64> = released.iter().map(|m| m.id).collect();
            let reclaimed: Vec<i64> = released
                .iter()
                .filter(|m| m.reclaimed)
                .map(|m| m.id)
                .collect();
            store::inbox::release(&self.db, token, &ids, &reclaimed).await?;
        }
        Ok(claimed)
    }

    async fn handle_claimed(&self, message: &ClaimedMessage, token: uuid::Uuid) -> Outcome {
        let attempt = message.attempts + 1;
        let envelope = match Envelope::from_json(&message.payload) {
            Ok(e) => e,
            Err(e) => {
                self.fail_claimed(
                    message,
                    token,
                    None,
                    HandlerError::permanent(format!("undecodable message: {e}")),
                )
                .await;
                return Outcome::Failed;
            }
        };
        let reg = match self.handler(&envelope) {
            Ok(reg) => reg,
            Err(error) => {
                self.fail_claimed(message, token, None, HandlerError::permanent(error))
                    .await;
                return Outcome::Failed;
            }
        };
        let tx = match self.outbox.begin(&self.db).await {
            Ok(tx) => tx,
            Err(e) => {
                self.fail_claimed(message, token, Some(reg), HandlerError::retry(e))
                    .await;
                return Outcome::Failed;
            }
        };
        // Fence first: the row stays locked by this transaction while the handler runs.
        match store::inbox::mark_done(&tx, message.id, token, Utc::now()).await {
            Ok(true) => {}
            Ok(false) => {
                self.count(Counter::stale);
                tracing::warn!(consumer = self.name, message_id = %message.message_id, "message taken over by another worker; skipped");
                return Outcome::Failed;
            }
            Err(e) => {
                drop(tx);
                self.fail_claimed(message, token, Some(reg), HandlerError::retry(e))
                    .await;
                return Outcome::Failed;
            }
        }
        let itx = InboxTransaction::new(
            tx,
            HandlerContext {
                consumer: self.name,
                message_id: message.message_id.clone(),
                attempt,
            },
        );
        let result = self.run_handler(reg, &itx, &envelope, attempt).await;
        if result.is_ok() {
            failpoint!(crate::failpoints::INBOX_AFTER_HANDLER, Outcome::Failed);
        }
        let error = match result {
            Ok(()) => match itx.into_inner().commit().await {
                Ok(_) => {
                    self.count(Counter::handled);
                    return Outcome::Done;
                }
                Err(e) => HandlerError::retry(format!("commit failed: {e}")),
            },
            Err(error) => {
                drop(itx);
                error
            }
        };
        self.fail_claimed(message, token, Some(reg), error).await;
        Outcome::Failed
    }

    async fn fail_claimed(
        &self,
        message: &ClaimedMessage,
        token: uuid::Uuid,
        reg: Option<&HandlerRegistration>,
        error: HandlerError,
    ) {
        let attempts = message.attempts + 1;
        let state = self.failure_state(reg, &error, attempts);
        self.log_failure(&message.message_id, &state);
        failpoint!(crate::failpoints::INBOX_STORE_RETRY, ());
        let (dead, next_attempt_at, text) = match &state {
            InitialState::Retry {
                next_attempt_at,
                error,
                ..
            } => (false, *next_attempt_at, error.clone()),
            InitialState::Dead { error, .. } => (true, Utc::now(), error.clone()),
            _ => return,
        };
        match store::inbox::mark_failed(
            &self.db,
            message.id,
            token,
            attempts,
            dead,
            next_attempt_at,
            &text,
        )
        .await
        {
            Ok(true) => self.count_failure(&state),
            Ok(false) => self.count(Counter::stale),
            Err(e) => {
                tracing::warn!(consumer = self.name, error = %e, "could not record a handler failure; the lease will expire and the message be retried")
            }
        }
    }
}

/// The inbox row of a decoded message.
fn inbox_row<'a>(consumer: &'a str, envelope: &'a Envelope, body: &'a [u8]) -> NewInboxRow<'a> {
    NewInboxRow {
        consumer,
        message_id: &envelope.id,
        event_type: Some(&envelope.event_type),
        source: Some(&envelope.source),
        aggregate_type: envelope.aggregate_type.as_deref(),
        aggregate_id: envelope.subject.as_deref(),
        aggregate_version: envelope.aggregate_version,
        schema_version: envelope.schema_version,
        payload: body,
    }
}

/// Deliveries with the same key run in the same lane, one after another.
fn lane_key(envelope: &Envelope) -> String {
    match (&envelope.aggregate_type, &envelope.subject) {
        (Some(t), Some(id)) => format!("{t}/{id}"),
        _ => envelope.id.clone(),
    }
}

/// The message id a conflicting delivery is kept under: `{message_id}#conflict-{digest}`, the
/// id cut so that the digest always fits the column.
fn conflict_id(message_id: &str, body: &[u8]) -> String {
    const SUFFIX_CHARS: usize = "#conflict-".len() + 16;
    let keep = store::inbox::MAX_MESSAGE_ID_CHARS - SUFFIX_CHARS;
    let prefix = match message_id.char_indices().nth(keep) {
        Some((i, _)) => &message_id[..i],
        None => message_id,
    };
    format!("{prefix}#conflict-{:016x}", digest(body))
}

/// A stable 64-bit digest (FNV-1a) for lane routing and ids of undecodable messages.
fn digest(bytes: &[u8]) -> u64 {
    let mut hasher = Fnv(0xcbf2_9ce4_8422_2325);
    bytes.hash(&mut hasher);
    hasher.finish()
}

struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

fn into_db_err(e: crate::error::OutboxError) -> sea_orm::DbErr {
    match e {
        crate::error::OutboxError::Database(e) => e,
        other => sea_orm::DbErr::Custom(other.to_string()),
    }
}
