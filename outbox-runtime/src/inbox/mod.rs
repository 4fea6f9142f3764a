//! The inbox: consume each message effectively once per consumer.
//!
//! A delivery records `(consumer, message_id)` in `inbox_event` (on PostgreSQL: its key in
//! `inbox_key`, and a message handled at once straight into `inbox_done`); a duplicate is
//! acknowledged and counted, and nothing else runs. The handler runs in the same transaction as that insert,
//! so its database effects commit once per `(consumer, message id)`, through redelivery, crashes
//! and concurrent consumers. Side effects outside the database (an e-mail, an HTTP call) are not
//! covered: they can happen again if the process dies between them and the commit.
//!
//! Handlers are declared with `#[inbox_handler(consumer = "…")]` and found at start-up through
//! [`HandlerRegistration`]s.

mod batch;
mod config;
pub(crate) mod consumer;
mod deliver;
pub(crate) mod digest;
pub(crate) mod dispatch;
pub(crate) mod linked;
mod receive;
mod settle;
mod stats;
mod worker;

use std::{
    collections::BTreeMap, fmt, future::Future, ops::Deref, pin::Pin, sync::Arc, time::Duration,
};

pub use config::InboxConfig;
pub use linked::DuplicateHandler;
pub(crate) use linked::linked_handlers;
pub use receive::{
    ExternalInbox, IncomingMessage, MAX_HEADER_VALUE_BYTES, MAX_HEADERS, Receipt, ReceiveError,
};
pub use stats::{ConsumerStats, ConsumerStatsSnapshot};

use chrono::{DateTime, Utc};
use sea_orm::{AccessMode, DbErr, IsolationLevel, TransactionOptions, TransactionTrait};

use crate::{envelope::Envelope, event::DomainEvent, transaction::OutboxTransaction};

/// A delivered event, decoded: the payload plus its envelope's attributes.
///
/// Derefs to the payload, so `event.order_id` reads the payload's field.
#[derive(Debug, Clone)]
pub struct Event<E> {
    /// The payload.
    pub payload: E,
    meta: Arc<EventMeta>,
}

/// The envelope attributes of a delivered event.
#[derive(Debug, Clone, PartialEq)]
pub struct EventMeta {
    /// CloudEvents `id` (the producer's event id).
    pub id: String,
    /// CloudEvents `source`.
    pub source: String,
    /// Event type.
    pub event_type: String,
    /// Aggregate id (CloudEvents `subject`).
    pub aggregate_id: Option<String>,
    /// Aggregate type.
    pub aggregate_type: Option<String>,
    /// Aggregate version after the event.
    pub aggregate_version: Option<i64>,
    /// Schema version of the payload the handler gets (after upcasting, the handler's).
    pub schema_version: Option<u32>,
    /// Schema version of the payload as received: lower than `schema_version` when upcasters
    /// brought it up to the handler's (see [`crate::upcast`]).
    pub received_schema_version: Option<u32>,
    /// When the producer enqueued it.
    pub time: Option<DateTime<Utc>>,
    /// W3C `traceparent` of the producer.
    pub traceparent: Option<String>,
    /// W3C `tracestate` of the producer.
    pub tracestate: Option<String>,
    /// 1 for the first attempt, 2 for the first retry, …
    pub attempt: u32,
    /// The business key of an external message.
    pub business_key: Option<String>,
    /// The headers kept with an external message (names lower-cased).
    pub headers: BTreeMap<String, String>,
    /// The database (tenant or shard) the message belongs to and its handler runs in, when the
    /// runtime serves a set of databases (see [`fleet`](crate::fleet)); `None` for a runtime over
    /// one database. Read from the envelope's `tenant` extension.
    pub database: Option<String>,
}

/// Where the worker puts an external message's business key and kept headers in the envelope it
/// hands a handler: names no CloudEvents extension can have, so they never meet a producer's.
pub(crate) const BUSINESS_KEY_EXTENSION: &str = "outbox:bizkey";
pub(crate) const HEADERS_EXTENSION: &str = "outbox:headers";

impl EventMeta {
    /// The attributes of `envelope`, at attempt `attempt`.
    pub fn from_envelope(envelope: &Envelope, attempt: u32) -> Self {
        EventMeta {
            id: envelope.id.clone(),
            source: envelope.source.clone(),
            event_type: envelope.event_type.clone(),
            aggregate_id: envelope.subject.clone(),
            aggregate_type: envelope.aggregate_type.clone(),
            aggregate_version: envelope.aggregate_version,
            schema_version: envelope.schema_version,
            received_schema_version: envelope
                .extensions
                .get(crate::upcast::RECEIVED_VERSION_EXTENSION)
                .and_then(serde_json::Value::as_u64)
                .and_then(|v| u32::try_from(v).ok())
                .or(envelope.schema_version),
            time: envelope.time,
            traceparent: envelope.traceparent.clone(),
            tracestate: envelope.tracestate.clone(),
            attempt,
            business_key: envelope
                .extensions
                .get(BUSINESS_KEY_EXTENSION)
                .and_then(|v| v.as_str())
                .map(str::to_owned),
            headers: envelope
                .extensions
                .get(HEADERS_EXTENSION)
                .and_then(|v| serde_json::from_value(v.clone()).ok())
                .unwrap_or_default(),
            database: envelope
                .extensions
                .get(crate::envelope::DATABASE_EXTENSION)
                .and_then(|v| v.as_str())
                .map(str::to_owned),
        }
    }
}

impl<E> Event<E> {
    /// Build an event (for tests of handlers, and for the dispatcher).
    pub fn new(payload: E, meta: EventMeta) -> Self {
        Event {
            payload,
            meta: Arc::new(meta),
        }
    }

    /// The envelope attributes.
    pub fn meta(&self) -> &EventMeta {
        &self.meta
    }

    /// The producer's event id (the inbox `message_id`).
    pub fn id(&self) -> &str {
        &self.meta.id
    }

    /// The payload, by value.
    pub fn into_payload(self) -> E {
        self.payload
    }
}

impl<E: DomainEvent + serde::de::DeserializeOwned> Event<E> {
    /// Decode the payload of `envelope` as `E`.
    pub fn decode(envelope: &Envelope, attempt: u32) -> Result<Self, HandlerError> {
        let payload = envelope.data_as::<E>().map_err(|e| {
            HandlerError::permanent(format!(
                "payload of `{}` (schema version {}) does not match `{}`: {e}",
                envelope.event_type,
                envelope.schema_version.unwrap_or(1),
                std::any::type_name::<E>()
            ))
        })?;
        Ok(Event::new(
            payload,
            EventMeta::from_envelope(envelope, attempt),
        ))
    }
}

impl<E: serde::de::DeserializeOwned> Event<E> {
    /// Decode the payload of an external message (kept as `envelope`'s data) as `E`.
    pub fn decode_external(envelope: &Envelope, attempt: u32) -> Result<Self, HandlerError> {
        let payload = envelope.data_as::<E>().map_err(|e| {
            HandlerError::permanent(format!(
                "payload of `{}` from `{}` does not match `{}`: {e}",
                envelope.event_type,
                envelope.source,
                std::any::type_name::<E>()
            ))
        })?;
        Ok(Event::new(
            payload,
            EventMeta::from_envelope(envelope, attempt),
        ))
    }
}

impl<E> Deref for Event<E> {
    type Target = E;

    fn deref(&self) -> &E {
        &self.payload
    }
}

/// Why a handler did not finish. Any error converts into it with `?`.
///
/// A plain error is retried with backoff until the consumer's `max_attempts`;
/// [`HandlerError::permanent`] sends the message to DEAD at once.
pub struct HandlerError {
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    permanent: bool,
    retry_after: Option<Duration>,
}

impl HandlerError {
    /// A failure worth retrying.
    pub fn retry(message: impl fmt::Display) -> Self {
        HandlerError {
            message: message.to_string(),
            source: None,
            permanent: false,
            retry_after: None,
        }
    }

    /// A failure retrying cannot fix (bad data, a rule violation): DEAD at once.
    pub fn permanent(message: impl fmt::Display) -> Self {
        HandlerError {
            permanent: true,
            ..HandlerError::retry(message)
        }
    }

    /// Retry no sooner than `delay` (instead of the consumer's backoff).
    pub fn with_retry_after(mut self, delay: Duration) -> Self {
        self.retry_after = Some(delay);
        self
    }

    /// Make this failure permanent.
    pub fn into_permanent(mut self) -> Self {
        self.permanent = true;
        self
    }

    /// Whether retrying is pointless.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// The requested retry delay, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The underlying error, if any.
    pub fn source(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.source.as_deref()
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(error: E) -> Self {
        let mut message = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        HandlerError {
            message,
            source: Some(Box::new(error)),
            permanent: false,
            retry_after: None,
        }
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("message", &self.message)
            .field("permanent", &self.permanent)
            .field("retry_after", &self.retry_after)
            .finish()
    }
}

/// Who is handling what: the consumer, the message and the attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerContext {
    /// The consumer name.
    pub consumer: &'static str,
    /// The inbox message id.
    pub message_id: String,
    /// 1 for the first attempt.
    pub attempt: u32,
}

/// The transaction a handler runs in: the inbox record of the message commits with the
/// handler's writes, or neither does.
///
/// It is a SeaORM connection (every SeaORM API accepts `&tx`) and derefs to an
/// [`OutboxTransaction`], so a handler can [`enqueue`](OutboxTransaction::enqueue) follow-up
/// events that commit atomically with the consumption.
pub struct InboxTransaction {
    tx: OutboxTransaction,
    context: HandlerContext,
}

impl fmt::Debug for InboxTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboxTransaction")
            .field("context", &self.context)
            .field("tx", &self.tx)
            .finish()
    }
}

impl InboxTransaction {
    /// Wrap an outbox transaction for a handler.
    pub fn new(tx: OutboxTransaction, context: HandlerContext) -> Self {
        InboxTransaction { tx, context }
    }

    /// The consumer, message and attempt being handled.
    pub fn context(&self) -> &HandlerContext {
        &self.context
    }

    /// The underlying outbox transaction.
    pub fn into_inner(self) -> OutboxTransaction {
        self.tx
    }

    /// The aggregate-version guard, for handlers that must not apply a stale event: records the
    /// event's aggregate version as the newest this consumer has accepted for its aggregate and
    /// returns `true`, or returns `false` when this consumer already accepted that version or a
    /// newer one (return `Ok(())` to drop the event). Events without an aggregate version or
    /// aggregate id are always accepted. The record commits with the handler's writes.
    ///
    /// ```ignore
    /// if !tx.accept_version(&event).await? {
    ///     return Ok(()); // stale: a newer state of this order was applied already
    /// }
    /// ```
    pub async fn accept_version<E>(&self, event: &Event<E>) -> Result<bool, DbErr> {
        let meta = event.meta();
        let (Some(version), Some(aggregate_id)) = (meta.aggregate_version, &meta.aggregate_id)
        else {
            return Ok(true);
        };
        let aggregate_type = meta.aggregate_type.as_deref().unwrap_or("");
        crate::store::inbox::accept_version(
            self,
            self.context.consumer,
            aggregate_type,
            aggregate_id,
            version,
        )
        .await
    }
}

impl Deref for InboxTransaction {
    type Target = OutboxTransaction;

    fn deref(&self) -> &OutboxTransaction {
        &self.tx
    }
}

crate::transaction::forward_connection_trait!(InboxTransaction, tx);

/// Nested transactions inside a handler are savepoints of its transaction.
#[async_trait::async_trait]
impl TransactionTrait for InboxTransaction {
    type Transaction = OutboxTransaction;

    async fn begin(&self) -> Result<OutboxTransaction, DbErr> {
        TransactionTrait::begin(&self.tx).await
    }

    async fn begin_with_config(
        &self,
        isolation_level: Option<IsolationLevel>,
        access_mode: Option<AccessMode>,
    ) -> Result<OutboxTransaction, DbErr> {
        self.tx
            .begin_with_config(isolation_level, access_mode)
            .await
    }

    async fn begin_with_options(
        &self,
        options: TransactionOptions,
    ) -> Result<OutboxTransaction, DbErr> {
        self.tx.begin_with_options(options).await
    }

    async fn transaction<F, T, E>(&self, callback: F) -> Result<T, sea_orm::TransactionError<E>>
    where
        F: for<'c> FnOnce(
                &'c OutboxTransaction,
            ) -> Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'c>>
            + Send,
        T: Send,
        E: fmt::Display + fmt::Debug + Send,
    {
        self.tx.transaction(callback).await
    }

    async fn transaction_with_config<F, T, E>(
        &self,
        callback: F,
        isolation_level: Option<IsolationLevel>,
        access_mode: Option<AccessMode>,
    ) -> Result<T, sea_orm::TransactionError<E>>
    where
        F: for<'c> FnOnce(
                &'c OutboxTransaction,
            ) -> Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'c>>
            + Send,
        T: Send,
        E: fmt::Display + fmt::Debug + Send,
    {
        self.tx
            .transaction_with_config(callback, isolation_level, access_mode)
            .await
    }
}

/// The future a generated handler wrapper returns.
pub type HandlerFuture<'a> = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send + 'a>>;

/// A generated handler wrapper: decode the envelope's payload, call the user's function.
pub type HandlerFn = for<'a> fn(&'a InboxTransaction, &'a Envelope, u32) -> HandlerFuture<'a>;

/// When a consumer processes a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HandlerMode {
    /// On delivery, in the transaction that records it; the broker is acked after commit.
    #[default]
    Inline,
    /// Record the message and ack the broker first, handle it asynchronously (webhooks, slow
    /// handlers).
    Stored,
}

/// One handler linked into the binary, registered by `#[inbox_handler]`.
#[derive(Debug, Clone, Copy)]
pub struct HandlerRegistration {
    /// Consumer name, e.g. `inventory`: stored in the inbox; never derived from a Rust path.
    pub consumer: &'static str,
    /// The event type handled.
    pub event_type: &'static str,
    /// The schema version handled.
    pub schema_version: u32,
    /// The generated wrapper.
    pub handler: HandlerFn,
    /// Attempts before DEAD; `None` for the runtime's default.
    pub max_attempts: Option<u32>,
    /// First retry delay in milliseconds; `None` for the runtime's default.
    pub backoff_base_ms: Option<u64>,
    /// Largest retry delay in milliseconds; `None` for the runtime's default.
    pub backoff_cap_ms: Option<u64>,
    /// Per-aggregate order for this consumer; `None` for the runtime's default (on).
    pub ordering: Option<bool>,
    /// Inline or stored (always stored for external messages).
    pub mode: HandlerMode,
    /// For a handler of external messages (`#[inbox_handler(source = "…", message_type =
    /// "…")]`), the source it takes them from; `event_type` is then their message type and
    /// `schema_version` 0. `None` for a handler of this SDK's events.
    pub source: Option<&'static str>,
    /// The handler function's name.
    pub function: &'static str,
    /// Its module.
    pub module_path: &'static str,
    /// Source file.
    pub file: &'static str,
    /// Source line.
    pub line: u32,
}

impl HandlerRegistration {
    /// `path/to/file.rs:12 (crate::module::function)`, for messages.
    pub fn location(&self) -> String {
        crate::util::text::location(self.file, self.line, self.module_path, self.function)
    }
}

inventory::collect!(HandlerRegistration);
