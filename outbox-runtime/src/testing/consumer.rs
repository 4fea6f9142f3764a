//! A consumer's handlers run directly, without a broker or a runtime: a delivery goes through the
//! same code as a broker's (recorded in the inbox, deduplicated, the aggregate-version guard,
//! upcasters, the handler in the recording's transaction), and retries run through the same
//! worker, their backoff skipped on request.

use std::{
    fmt,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use sea_orm::DatabaseConnection;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{HandlerFaults, KitError, events::Events};
use crate::{
    envelope::Envelope,
    event::DomainEvent,
    inbox::{
        ConsumerStatsSnapshot, ExternalInbox, InboxConfig, IncomingMessage, Receipt,
        consumer::Consumer,
    },
    outbox::Outbox,
    store::{
        self,
        kit::{KitMark, KitMessageRow},
        relay::ClaimedEvent,
    },
    transport::{Acker, Delivery, TransportError},
};

/// Where a message is in its consumer's inbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageState {
    /// Recorded, waiting for the worker (stored mode, or behind an unfinished message of its
    /// aggregate).
    Pending,
    /// Claimed by a worker.
    Processing,
    /// Handled: the handler's effects committed with the record.
    Done,
    /// The handler failed; due again at this time (by the database's clock).
    Retry(Option<chrono::DateTime<chrono::Utc>>),
    /// Cannot be handled (a permanent error, `max_attempts` reached, undecodable, no handler);
    /// waits for an operator.
    Dead,
    /// Set aside by an operator.
    Ignored,
}

impl MessageState {
    pub(super) fn parse(status: &str, due: Option<chrono::DateTime<chrono::Utc>>) -> MessageState {
        match status {
            "PENDING" => MessageState::Pending,
            "PROCESSING" => MessageState::Processing,
            "DONE" => MessageState::Done,
            "RETRY" => MessageState::Retry(due),
            "IGNORED" => MessageState::Ignored,
            _ => MessageState::Dead,
        }
    }

    /// Whether nothing more happens to it without an operator: DONE, DEAD or IGNORED.
    pub fn is_settled(&self) -> bool {
        matches!(
            self,
            MessageState::Done | MessageState::Dead | MessageState::Ignored
        )
    }
}

/// What one delivery (or retry) did.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The consumer.
    pub consumer: String,
    /// The message's id in the inbox (an SDK event's id; the sender's id for other messages).
    pub message_id: String,
    /// Where the message is now; `None` when nothing was recorded under its id (a duplicate by
    /// business key, a conflicting copy kept under another id).
    pub state: Option<MessageState>,
    /// Handler attempts recorded so far.
    pub attempts: u32,
    /// The handler's last error, as kept for an operator.
    pub last_error: Option<String>,
    /// The delivery was recognised as one already recorded, and nothing ran.
    pub duplicate: bool,
    /// What the consumer's counters counted for this delivery (handled, duplicates, retried,
    /// dead, stored, stale, conflicts).
    pub counted: ConsumerStatsSnapshot,
    /// The delivery was acknowledged to the (simulated) broker; `false`: it was nacked, to be
    /// delivered again.
    pub acked: bool,
    /// What the handler enqueued, committed with its attempt (nothing when it failed).
    pub enqueued: Events,
}

impl Outcome {
    /// Whether the message is handled (DONE).
    pub fn is_done(&self) -> bool {
        self.state == Some(MessageState::Done)
    }

    /// Whether the message is DEAD.
    pub fn is_dead(&self) -> bool {
        self.state == Some(MessageState::Dead)
    }

    /// Whether the message waits for a retry.
    pub fn is_retry(&self) -> bool {
        matches!(self.state, Some(MessageState::Retry(_)))
    }
}

/// Records whether the simulated broker's delivery was acked.
#[derive(Default)]
struct KitAcker {
    settled: Arc<Mutex<Option<bool>>>,
}

#[async_trait::async_trait]
impl Acker for KitAcker {
    async fn ack(&self) -> Result<(), TransportError> {
        *self.settled.lock().unwrap_or_else(|e| e.into_inner()) = Some(true);
        Ok(())
    }

    async fn nack(&self, _delay: Option<Duration>) -> Result<(), TransportError> {
        *self.settled.lock().unwrap_or_else(|e| e.into_inner()) = Some(false);
        Ok(())
    }
}

/// One consumer's handlers (those `#[inbox_handler(consumer = "…")]` linked into the test
/// binary), run directly against a database.
///
/// ```no_run
/// # use outbox_runtime::testing::TestConsumer;
/// # #[derive(serde::Serialize, serde::Deserialize)] struct OrderPlaced { order_id: i64 }
/// # impl outbox_runtime::DomainEvent for OrderPlaced {
/// #     const EVENT_TYPE: &'static str = "order.placed"; const AGGREGATE_TYPE: &'static str = "order";
/// #     const SCHEMA_VERSION: u32 = 1; fn aggregate_id(&self) -> String { self.order_id.to_string() } }
/// # async fn f(db: sea_orm::DatabaseConnection) -> Result<(), Box<dyn std::error::Error>> {
/// let inventory = TestConsumer::new("inventory", &db)?;
/// let first = inventory.deliver(&OrderPlaced { order_id: 42 }).await?;
/// assert!(first.is_done());
/// let again = inventory.redeliver(&first).await?; // the broker delivers it a second time
/// assert!(again.duplicate);
/// # Ok(()) }
/// ```
pub struct TestConsumer {
    consumer: Consumer,
    db: DatabaseConnection,
    source: String,
    /// The bodies delivered, by message id, for `redeliver`.
    delivered: Mutex<Vec<(String, Bytes)>>,
    shutdown: CancellationToken,
}

impl fmt::Debug for TestConsumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestConsumer")
            .field("consumer", &self.consumer.name)
            .field("source", &self.source)
            .finish()
    }
}

/// How many rounds [`TestConsumer::settle`] runs at most.
const SETTLE_ROUNDS: u32 = 1_000;

impl TestConsumer {
    /// The handlers of `consumer` linked into this binary, on `db`, with the default
    /// [`InboxConfig`]; events it builds from typed values come from source `testing`.
    pub fn new(consumer: &str, db: &DatabaseConnection) -> Result<TestConsumer, KitError> {
        TestConsumer::with_config(consumer, db, InboxConfig::default())
    }

    /// [`new`](Self::new) with `config` (its `max_attempts`, `ordering`, `faults`, …).
    pub fn with_config(
        consumer: &str,
        db: &DatabaseConnection,
        config: InboxConfig,
    ) -> Result<TestConsumer, KitError> {
        let handlers = crate::runtime::handlers().map_err(|e| KitError::Setup(e.to_string()))?;
        let Some((name, regs)) = handlers.iter().find(|(name, _)| **name == consumer) else {
            return Err(KitError::Setup(format!(
                "no #[inbox_handler(consumer = \"{consumer}\")] is linked into this binary; \
                 consumers found: {}",
                handlers.keys().copied().collect::<Vec<_>>().join(", ")
            )));
        };
        Ok(TestConsumer {
            consumer: Consumer::new(
                name,
                regs,
                config,
                db.clone(),
                Outbox::new("testing"),
                Arc::new(Notify::new()),
                format!("testing/{name}"),
            ),
            db: db.clone(),
            source: "testing".to_owned(),
            delivered: Mutex::default(),
            shutdown: CancellationToken::new(),
        })
    }

    /// The events the handlers enqueue are produced through `outbox` (its source names them).
    pub fn outbox(mut self, outbox: &Outbox) -> Self {
        self.consumer.outbox = outbox.clone();
        self
    }

    /// Events built by [`deliver`](Self::deliver) come from `source` (the producing service's
    /// name); default `testing`.
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = source.into();
        self
    }

    /// Inject `faults` into this consumer's attempts.
    pub fn faults(mut self, faults: &HandlerFaults) -> Self {
        self.consumer.config.faults = Some(faults.clone());
        self
    }

    /// The envelope a producer's relay would publish for `event`: a new event id, the
    /// aggregate and schema version from its type, no headers.
    pub fn envelope<E: DomainEvent>(&self, event: &E) -> Result<Envelope, KitError> {
        let payload = serde_json::to_string(event)
            .map_err(|e| KitError::Setup(format!("{} does not serialize: {e}", E::EVENT_TYPE)))?;
        ClaimedEvent {
            id: 0,
            event_id: uuid::Uuid::now_v7(),
            source: self.source.clone(),
            event_type: E::EVENT_TYPE.to_owned(),
            schema_version: E::SCHEMA_VERSION,
            aggregate_type: E::AGGREGATE_TYPE.to_owned(),
            aggregate_id: event.aggregate_id(),
            aggregate_version: event.aggregate_version(),
            payload,
            headers: "{}".to_owned(),
            created_at: chrono::Utc::now(),
            attempts: 0,
            reclaimed: false,
        }
        .envelope()
        .map_err(KitError::Setup)
    }

    /// Deliver `event` once, as a broker would: recorded, handled in the same transaction (or
    /// stored for the worker, then worked once), acked.
    pub async fn deliver<E: DomainEvent>(&self, event: &E) -> Result<Outcome, KitError> {
        let envelope = self.envelope(event)?;
        self.deliver_envelope(&envelope).await
    }

    /// Deliver `envelope` once (an event of another version, with headers, …).
    pub async fn deliver_envelope(&self, envelope: &Envelope) -> Result<Outcome, KitError> {
        self.deliver_bytes(&envelope.to_json()).await
    }

    /// Deliver a message body as it came off the wire: a CloudEvents JSON document, or
    /// anything else (an undecodable message is recorded DEAD with its bytes).
    pub async fn deliver_bytes(&self, body: &[u8]) -> Result<Outcome, KitError> {
        self.deliver_body(Bytes::copy_from_slice(body), 1).await
    }

    /// Deliver the same bytes as `earlier` again (a broker's redelivery): recognised by the
    /// inbox, nothing runs a second time.
    pub async fn redeliver(&self, earlier: &Outcome) -> Result<Outcome, KitError> {
        let body = self
            .delivered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .rev()
            .find(|(id, _)| *id == earlier.message_id)
            .map(|(_, body)| body.clone())
            .ok_or_else(|| {
                KitError::Setup(format!(
                    "message {} was not delivered through this TestConsumer",
                    earlier.message_id
                ))
            })?;
        self.deliver_body(body, 2).await
    }

    async fn deliver_body(&self, body: Bytes, count: u32) -> Result<Outcome, KitError> {
        let decoded = Envelope::from_json(&body).map_err(|e| e.to_string());
        let message_id = match &decoded {
            Ok(envelope) => envelope.id.clone(),
            Err(_) => format!("undecodable-{}", uuid::Uuid::now_v7()),
        };
        self.delivered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((message_id.clone(), body.clone()));
        let acker = KitAcker::default();
        let settled = acker.settled.clone();
        let delivery = Delivery::new(
            body,
            format!("testing.{}", self.consumer.name),
            Some(message_id.clone()),
            count,
            Box::new(acker),
        );
        let (mark, before) = self.before().await?;
        self.consumer
            .deliver(delivery, decoded, &self.shutdown)
            .await;
        // A message stored for the worker (stored mode) is worked once, as a runtime would at once.
        self.work().await?;
        let acked = settled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or(false);
        self.outcome(&message_id, &mark, before, acked).await
    }

    /// Record `message` in this consumer's external inbox (a webhook's body, another system's
    /// message) as the webhook endpoint does, then work it once.
    pub async fn receive(&self, message: &IncomingMessage) -> Result<(Receipt, Outcome), KitError> {
        if message.consumer != self.consumer.name {
            return Err(KitError::Setup(format!(
                "the message is for consumer `{}`, not `{}`",
                message.consumer, self.consumer.name
            )));
        }
        let (mark, before) = self.before().await?;
        let receipt = ExternalInbox::new(self.db.clone())
            .receive(message)
            .await
            .map_err(|e| KitError::Setup(e.to_string()))?;
        self.work().await?;
        let outcome = self
            .outcome(&message.message_id, &mark, before, true)
            .await?;
        Ok((receipt, outcome))
    }

    /// Make `earlier`'s message due now (its backoff skipped, by the database's clock) and run
    /// the worker once: the next attempt.
    pub async fn retry(&self, earlier: &Outcome) -> Result<Outcome, KitError> {
        let (mark, before) = self.before().await?;
        store::kit::message_due_now(&self.db, self.consumer.name, &earlier.message_id).await?;
        self.work().await?;
        self.outcome(&earlier.message_id, &mark, before, earlier.acked)
            .await
    }

    /// Retry `earlier`'s message, its backoff skipped, until it is DONE, DEAD or IGNORED; the
    /// outcome counts every attempt's counters and everything enqueued on the way.
    pub async fn settle(&self, earlier: &Outcome) -> Result<Outcome, KitError> {
        let mut outcome = earlier.clone();
        let mut rounds = 0;
        while !outcome.state.as_ref().is_none_or(MessageState::is_settled) {
            rounds += 1;
            if rounds > SETTLE_ROUNDS {
                return Err(KitError::Setup(format!(
                    "message {} did not settle in {SETTLE_ROUNDS} attempts: {:?}",
                    earlier.message_id, outcome.state
                )));
            }
            let next = self.retry(&outcome).await?;
            outcome = Outcome {
                counted: add(&outcome.counted, &next.counted),
                enqueued: outcome.enqueued.merged(&next.enqueued),
                ..next
            };
        }
        Ok(outcome)
    }

    /// The counters of this consumer since it was made.
    pub fn stats(&self) -> ConsumerStatsSnapshot {
        self.consumer.stats.snapshot()
    }

    async fn before(&self) -> Result<(KitMark, ConsumerStatsSnapshot), KitError> {
        Ok((store::kit::mark(&self.db).await?, self.stats()))
    }

    /// One worker round, plus more while it claims full batches.
    async fn work(&self) -> Result<(), KitError> {
        while self.consumer.work_once(&self.shutdown).await? >= self.consumer.config.batch_size {}
        Ok(())
    }

    async fn outcome(
        &self,
        message_id: &str,
        mark: &KitMark,
        before: ConsumerStatsSnapshot,
        acked: bool,
    ) -> Result<Outcome, KitError> {
        let row: Option<KitMessageRow> =
            store::kit::message(&self.db, self.consumer.name, message_id).await?;
        let counted = sub(&self.stats(), &before);
        let enqueued = Events::from_rows(store::kit::events_since(&self.db, mark).await?);
        Ok(Outcome {
            consumer: self.consumer.name.to_owned(),
            message_id: message_id.to_owned(),
            state: row
                .as_ref()
                .map(|r| MessageState::parse(&r.status, r.due_at)),
            attempts: row
                .as_ref()
                .map_or(0, |r| u32::try_from(r.attempts).unwrap_or(u32::MAX)),
            last_error: row.and_then(|r| r.last_error),
            duplicate: counted.duplicates > 0,
            counted,
            acked,
            enqueued,
        })
    }
}

fn sub(a: &ConsumerStatsSnapshot, b: &ConsumerStatsSnapshot) -> ConsumerStatsSnapshot {
    ConsumerStatsSnapshot {
        handled: a.handled.saturating_sub(b.handled),
        duplicates: a.duplicates.saturating_sub(b.duplicates),
        retried: a.retried.saturating_sub(b.retried),
        dead: a.dead.saturating_sub(b.dead),
        stored: a.stored.saturating_sub(b.stored),
        stale: a.stale.saturating_sub(b.stale),
        conflicts: a.conflicts.saturating_sub(b.conflicts),
        unrecorded: a.unrecorded.saturating_sub(b.unrecorded),
        batch_reruns: a.batch_reruns.saturating_sub(b.batch_reruns),
    }
}

fn add(a: &ConsumerStatsSnapshot, b: &ConsumerStatsSnapshot) -> ConsumerStatsSnapshot {
    ConsumerStatsSnapshot {
        handled: a.handled + b.handled,
        duplicates: a.duplicates + b.duplicates,
        retried: a.retried + b.retried,
        dead: a.dead + b.dead,
        stored: a.stored + b.stored,
        stale: a.stale + b.stale,
        conflicts: a.conflicts + b.conflicts,
        unrecorded: a.unrecorded + b.unrecorded,
        batch_reruns: a.batch_reruns + b.batch_reruns,
    }
}
