//! Messages from outside: webhooks and other systems' messages, recorded first and handled by the
//! consumer's worker.
//!
//! [`ExternalInbox::receive`] records an [`IncomingMessage`] as PENDING in one statement, committed
//! durably before it returns, and says what it did ([`Receipt`]); only then may the caller answer
//! the sender (HTTP 200, an
//! ack). It never runs a handler: the consumer's worker claims the row and runs the handler that
//! `#[inbox_handler(consumer = "…", source = "…", message_type = "…")]` registered for it, with
//! the same retries, DEAD and admin tooling as every other message. A crash after the commit and
//! before the answer means the sender tries again, and the unique keys recognise the copy.
//!
//! Two dedup layers, both unique constraints of `inbox_event` (on PostgreSQL also kept in
//! `inbox_key` for two to four weeks, after the message's row has moved on; see
//! `store::inbox_done`):
//!
//! - the physical redelivery key `(consumer, origin, message_id)`, where `origin` is the
//!   message's `source`: two senders that both use `evt_1` do not collide;
//! - the business key `(consumer, message_type, biz_key)`: the same business fact delivered
//!   under two message ids is recorded once (messages without a business key are never equal).
//!
//! The same message id from the same source with different bytes is a conflict: the copy is kept
//! as a DEAD row under `{message_id}#conflict-{digest}` for an operator, as for any delivery.

use std::{collections::BTreeMap, fmt, sync::Arc, time::Duration};

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};
use tokio::sync::Notify;
use tracing::Instrument;

use super::{deliver::conflict_id, digest::digest};
use crate::{
    store::{
        self, Failure, InboxStatus,
        inbox::{InboxState, MAX_KEY_CHARS, MAX_MESSAGE_ID_CHARS, NewInboxRow},
    },
    util::text::truncate,
};

/// Longest consumer name the inbox stores.
const MAX_CONSUMER_CHARS: usize = 128;
/// Most headers kept with one message.
pub const MAX_HEADERS: usize = 64;
/// Longest header value kept, in bytes.
pub const MAX_HEADER_VALUE_BYTES: usize = 4096;

/// A message from outside to record: who it is for, who sent it, and its bytes.
///
/// ```
/// # use outbox_runtime::inbox::IncomingMessage;
/// let message = IncomingMessage::new("billing", "stripe", "evt_1", "payment.succeeded", br#"{"amount":42}"#.to_vec())
///     .business_key("pi_123")
///     .ordering_key("cus_9")
///     .header("content-type", "application/json");
/// assert_eq!(message.message_id, "evt_1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncomingMessage {
    /// The consumer whose handler takes it.
    pub consumer: String,
    /// Who sent it (`stripe`, `https://shipping.example/webhooks`): the scope of `message_id`.
    pub source: String,
    /// The sender's id of the message, the same on each redelivery.
    pub message_id: String,
    /// Its type (`payment_intent.succeeded`): chooses the handler.
    pub message_type: String,
    /// The business fact it reports (`pi_123`), unique per consumer and message type: a second
    /// message id for the same fact is recognised as a duplicate.
    pub business_key: Option<String>,
    /// Messages with the same ordering key are handled one after another, in arrival order
    /// (when the consumer keeps order); `None` for no order.
    pub ordering_key: Option<String>,
    /// The body as received.
    pub payload: Vec<u8>,
    /// Headers kept with the message (names lower-cased), e.g. its content type. Never put
    /// secrets (authorization, signatures) here: operators read them.
    pub headers: BTreeMap<String, String>,
}

impl IncomingMessage {
    /// A message with no business key, no ordering key and no headers.
    pub fn new(
        consumer: impl Into<String>,
        source: impl Into<String>,
        message_id: impl Into<String>,
        message_type: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Self {
        IncomingMessage {
            consumer: consumer.into(),
            source: source.into(),
            message_id: message_id.into(),
            message_type: message_type.into(),
            business_key: None,
            ordering_key: None,
            payload: payload.into(),
            headers: BTreeMap::new(),
        }
    }

    /// Set the business key.
    pub fn business_key(mut self, key: impl Into<String>) -> Self {
        self.business_key = Some(key.into());
        self
    }

    /// Set the ordering key.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Keep a header with the message.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers
            .insert(name.into().to_ascii_lowercase(), value.into());
        self
    }

    /// Why the message cannot be recorded as it is, if it cannot.
    pub fn validate(&self) -> Result<(), ReceiveError> {
        let text = |field: &'static str, value: &str, max: usize| {
            if value.trim().is_empty() {
                return Err(ReceiveError::Invalid(format!("`{field}` is empty")));
            }
            if value.chars().count() > max {
                return Err(ReceiveError::Invalid(format!(
                    "`{field}` is {} characters long; at most {max} are kept",
                    value.chars().count()
                )));
            }
            if value.contains('\0') {
                return Err(ReceiveError::Invalid(format!(
                    "`{field}` contains a NUL character"
                )));
            }
            Ok(())
        };
        text("consumer", &self.consumer, MAX_CONSUMER_CHARS)?;
        text("source", &self.source, MAX_KEY_CHARS)?;
        text("message_id", &self.message_id, MAX_MESSAGE_ID_CHARS)?;
        text("message_type", &self.message_type, MAX_KEY_CHARS)?;
        if let Some(key) = &self.business_key {
            text("business_key", key, MAX_KEY_CHARS)?;
        }
        if let Some(key) = &self.ordering_key {
            text("ordering_key", key, MAX_KEY_CHARS)?;
        }
        if self.headers.len() > MAX_HEADERS {
            return Err(ReceiveError::Invalid(format!(
                "{} headers to keep; at most {MAX_HEADERS}",
                self.headers.len()
            )));
        }
        if let Some((name, _)) = self
            .headers
            .iter()
            .find(|(name, value)| name.len() > 128 || value.len() > MAX_HEADER_VALUE_BYTES)
        {
            return Err(ReceiveError::Invalid(format!(
                "header `{}` is too long to keep (names up to 128 bytes, values up to \
                 {MAX_HEADER_VALUE_BYTES})",
                truncate(name, 128)
            )));
        }
        Ok(())
    }

    fn headers_json(&self) -> Option<String> {
        (!self.headers.is_empty())
            .then(|| serde_json::to_string(&self.headers).expect("a map of strings serializes"))
    }

    /// The inbox row of this message.
    fn row<'a>(&'a self, headers: Option<&'a str>) -> NewInboxRow<'a> {
        NewInboxRow {
            consumer: &self.consumer,
            message_id: &self.message_id,
            origin: &self.source,
            biz_key: self.business_key.as_deref(),
            headers,
            event_type: Some(&self.message_type),
            source: Some(&self.source),
            // An empty aggregate type keeps these apart from the aggregates of domain events.
            aggregate_type: self.ordering_key.as_ref().map(|_| ""),
            aggregate_id: self.ordering_key.as_deref(),
            aggregate_version: None,
            schema_version: None,
            payload: &self.payload,
        }
    }
}

/// What [`ExternalInbox::receive`] did with a message. Every variant means the message is safe
/// in the database: the sender may be answered "received".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Receipt {
    /// Recorded as new (PENDING): the consumer's worker will handle it.
    New,
    /// Recorded before under the same source and message id, with the same bytes.
    Duplicate {
        /// The status of the first copy.
        status: String,
    },
    /// The same business fact (message type and business key) was recorded before under
    /// another message id: not recorded again.
    SameBusinessFact {
        /// The source of the first message (empty once its row has left with the retention
        /// window while its key is still kept).
        source: String,
        /// The message id of the first message (empty likewise).
        message_id: String,
        /// Its status.
        status: String,
    },
    /// Recorded before under the same source and message id with different bytes: this copy is
    /// kept as a DEAD row for an operator and not handled.
    Conflict {
        /// The message id the copy is kept under.
        kept_as: String,
    },
}

impl Receipt {
    /// Whether the message was recorded as new.
    pub fn is_new(&self) -> bool {
        matches!(self, Receipt::New)
    }

    /// `new`, `duplicate`, `same_business_fact` or `conflict`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Receipt::New => "new",
            Receipt::Duplicate { .. } => "duplicate",
            Receipt::SameBusinessFact { .. } => "same_business_fact",
            Receipt::Conflict { .. } => "conflict",
        }
    }

    /// The `outcome` label of `inbox_messages_total` for this receipt.
    fn metric_outcome(&self) -> &'static str {
        match self {
            Receipt::New => "received_new",
            Receipt::Duplicate { .. } => "received_duplicate",
            Receipt::SameBusinessFact { .. } => "received_same_business_fact",
            Receipt::Conflict { .. } => "received_conflict",
        }
    }
}

/// Why a message was not recorded. Nothing was stored; the sender should be told to try again
/// (unless the message is [`Invalid`](ReceiveError::Invalid)).
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    /// The message cannot be recorded as it is (an empty or too long key): trying again will
    /// not help.
    #[error("invalid message: {0}")]
    Invalid(String),
    /// The database could not be reached, or the transaction failed: try again later.
    #[error("the inbox could not record the message (try again later): {0}")]
    Database(#[source] DbErr),
    /// The message id is recorded for another source of this consumer, and the old key that
    /// forbids this is still in place.
    #[error(
        "message id `{message_id}` is recorded for another source of consumer `{consumer}`; the \
         old key (consumer, message_id) is still in place: apply migration \
         outbox_0007_inbox_drop_message_id_key once no process of a release before \
         outbox_0006 runs"
    )]
    OldKey {
        /// The consumer.
        consumer: String,
        /// The message id.
        message_id: String,
    },
}

impl ReceiveError {
    /// Whether the database was unreachable or busy (the message may succeed later as it is).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            ReceiveError::Database(_) | ReceiveError::OldKey { .. }
        )
    }
}

/// Records messages from outside in the inbox (see the module docs). Cheap to clone.
///
/// Made with [`ExternalInbox::new`] it records only; the consumer's worker then finds new
/// messages within its poll interval. From [`Runtime::external_inbox`] it also wakes the
/// worker of a consumer that runtime runs.
///
/// [`Runtime::external_inbox`]: crate::Runtime::external_inbox
#[derive(Clone)]
pub struct ExternalInbox {
    db: DatabaseConnection,
    wakes: Arc<BTreeMap<&'static str, Arc<Notify>>>,
}

impl fmt::Debug for ExternalInbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExternalInbox")
            .field("wakes", &self.wakes.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Attempts of a receive whose transaction met a deadlock or a busy database.
const TRANSIENT_ATTEMPTS: u32 = 5;

impl ExternalInbox {
    /// Record into the inbox of `db`.
    pub fn new(db: DatabaseConnection) -> Self {
        ExternalInbox {
            db,
            wakes: Arc::default(),
        }
    }

    pub(crate) fn with_wakes(
        db: DatabaseConnection,
        wakes: BTreeMap<&'static str, Arc<Notify>>,
    ) -> Self {
        ExternalInbox {
            db,
            wakes: Arc::new(wakes),
        }
    }

    /// The database connection messages are recorded through.
    pub fn db(&self) -> &DatabaseConnection {
        &self.db
    }

    /// Record `message`, committed before this returns: one `INSERT` that skips a taken key, on
    /// its own (an atomic statement needs no transaction around it, and its commit waits for
    /// the database's durable write, as the answer to the sender will rely on it), then, only if
    /// a key was taken, the reads that say which. A deadlock or a busy database is tried again a
    /// few times.
    pub async fn receive(&self, message: &IncomingMessage) -> Result<Receipt, ReceiveError> {
        let span = receive_span(message);
        let result = self
            .receive_with_retries(message)
            .instrument(span.clone())
            .await;
        received(&span, &message.consumer, &result);
        result
    }

    async fn receive_with_retries(
        &self,
        message: &IncomingMessage,
    ) -> Result<Receipt, ReceiveError> {
        message.validate()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match record(&self.db, message).await {
                Ok(receipt) => {
                    self.after(message, &receipt);
                    return Ok(receipt);
                }
                Err(RecordError::Db(e))
                    if store::is_transient(&e) && attempt < TRANSIENT_ATTEMPTS =>
                {
                    tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
                }
                Err(e) => return Err(e.into_receive_error(message)),
            }
        }
    }

    /// Record `message` in the caller's open transaction: it is recorded if and only if that
    /// transaction commits. Answer the sender only after the commit.
    pub async fn receive_in<C: ConnectionTrait>(
        &self,
        conn: &C,
        message: &IncomingMessage,
    ) -> Result<Receipt, ReceiveError> {
        let span = receive_span(message);
        let result = async {
            message.validate()?;
            let receipt = record(conn, message)
                .await
                .map_err(|e| e.into_receive_error(message))?;
            self.after(message, &receipt);
            Ok(receipt)
        }
        .instrument(span.clone())
        .await;
        received(&span, &message.consumer, &result);
        result
    }

    fn after(&self, message: &IncomingMessage, receipt: &Receipt) {
        crate::metrics::inbox_received(&message.consumer, receipt.metric_outcome());
        match receipt {
            Receipt::New => {
                if let Some(wake) = self.wakes.get(message.consumer.as_str()) {
                    wake.notify_one();
                }
            }
            Receipt::Conflict { kept_as } => tracing::error!(
                consumer = %message.consumer, source = %message.source,
                message_id = %message.message_id, kept_as = %kept_as,
                "external message received again with different bytes; the copy is kept as DEAD"
            ),
            _ => tracing::debug!(
                consumer = %message.consumer, source = %message.source,
                message_id = %message.message_id, receipt = receipt.as_str(),
                "external message recognised; not recorded again"
            ),
        }
    }
}

/// The consumer span of receiving an external message (see [`crate::telemetry`]).
fn receive_span(message: &IncomingMessage) -> tracing::Span {
    crate::telemetry::receive_span(&crate::telemetry::Consume {
        road: crate::telemetry::Road::Webhook,
        system: "webhook",
        consumer: &message.consumer,
        destination: &message.consumer,
        message_id: &message.message_id,
        event_type: &message.message_type,
        aggregate_id: message.ordering_key.as_deref().unwrap_or(""),
    })
}

/// Close the span of a receive with its outcome, and count the message received.
fn received(span: &tracing::Span, consumer: &str, result: &Result<Receipt, ReceiveError>) {
    match result {
        Ok(receipt) => {
            span.record("outbox.receipt", receipt.as_str());
        }
        Err(e) => crate::telemetry::failed(
            span,
            if e.is_unavailable() {
                "database"
            } else {
                "invalid"
            },
        ),
    }
    crate::telemetry::consumed("webhook", consumer, 1);
}

enum RecordError {
    Db(DbErr),
    OldKey,
}

impl From<DbErr> for RecordError {
    fn from(e: DbErr) -> Self {
        RecordError::Db(e)
    }
}

impl RecordError {
    fn into_receive_error(self, message: &IncomingMessage) -> ReceiveError {
        match self {
            RecordError::Db(e) => ReceiveError::Database(e),
            RecordError::OldKey => ReceiveError::OldKey {
                consumer: message.consumer.clone(),
                message_id: message.message_id.clone(),
            },
        }
    }
}

/// Insert the message, or find out which key it met.
async fn record<C: ConnectionTrait>(
    conn: &C,
    message: &IncomingMessage,
) -> Result<Receipt, RecordError> {
    let headers = message.headers_json();
    let row = message.row(headers.as_deref());
    if store::inbox::insert_external(conn, &row).await? {
        return Ok(Receipt::New);
    }
    let first = store::inbox::recorded(
        conn,
        &message.consumer,
        &message.source,
        &message.message_id,
    )
    .await?;
    if let Some(first) = first {
        if first.payload == message.payload {
            return Ok(Receipt::Duplicate {
                status: first.status,
            });
        }
        return keep_conflict(conn, message, &row, &first.status).await;
    }
    if let Some(key) = &message.business_key
        && let Some(fact) = store::inbox::recorded_business_fact(
            conn,
            &message.consumer,
            &message.message_type,
            key,
        )
        .await?
    {
        return Ok(Receipt::SameBusinessFact {
            source: fact.origin,
            message_id: fact.message_id,
            status: fact.status,
        });
    }
    if let Some(period) = store::inbox_done::rotating(conn).await? {
        // A key kept in `inbox_key` after its message was handled and its row left
        // `inbox_done` with its slot: the message id was seen, or else the business fact
        // (whose first message is no longer known).
        let done = InboxStatus::Done.as_str().to_owned();
        let message_key = store::inbox_done::key_live(
            conn,
            &period,
            &message.consumer,
            &store::inbox_done::message_scope(&truncate(&message.source, MAX_KEY_CHARS)),
            &truncate(&message.message_id, MAX_MESSAGE_ID_CHARS),
        )
        .await?;
        return Ok(if message_key || message.business_key.is_none() {
            Receipt::Duplicate { status: done }
        } else {
            Receipt::SameBusinessFact {
                source: String::new(),
                message_id: String::new(),
                status: done,
            }
        });
    }
    Err(RecordError::OldKey)
}

/// Keep a conflicting copy as DEAD under a derived id (see the module docs).
async fn keep_conflict<C: ConnectionTrait>(
    conn: &C,
    message: &IncomingMessage,
    row: &NewInboxRow<'_>,
    first_status: &str,
) -> Result<Receipt, RecordError> {
    let kept_as = conflict_id(&message.message_id, digest(&message.payload));
    let error = format!(
        "message `{}` from `{}` was already received with a different payload (the first copy \
         is {first_status}); this one was not handled and is kept for an operator",
        message.message_id, message.source
    );
    // Without its business and ordering keys: the copy must neither take the business key nor
    // hold later messages back.
    let copy = NewInboxRow {
        message_id: &kept_as,
        biz_key: None,
        aggregate_type: None,
        aggregate_id: None,
        ..row.clone()
    };
    let state = InboxState::Failed(Failure::Dead { attempts: 0, error });
    store::inbox::insert(conn, &copy, &state).await?;
    Ok(Receipt::Conflict { kept_as })
}
