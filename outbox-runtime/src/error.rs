//! Errors at the SDK's public boundaries.
//!
//! Each message names its cause (the database's or serializer's error) itself, so an error
//! printed on its own says everything; `source()` does not repeat it.

use sea_orm::DbErr;

/// Why an event could not be enqueued. The transaction stays usable: nothing was buffered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnqueueError {
    /// The payload could not be serialized to JSON.
    #[error("event `{event_type}` could not be serialized to JSON: {error}")]
    Serialize {
        /// The event type.
        event_type: &'static str,
        /// serde_json's error.
        error: serde_json::Error,
    },
    /// The serialized payload is larger than the outbox accepts.
    #[error(
        "event `{event_type}` payload is {size} bytes, over the limit of {limit} bytes \
         (raise it with OutboxBuilder::max_payload_bytes if your broker accepts more)"
    )]
    PayloadTooLarge {
        /// The event type.
        event_type: &'static str,
        /// The payload's size in bytes.
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// A string field stored in the outbox is empty or too long.
    #[error("event `{event_type}` has an invalid {field}: {reason}")]
    InvalidField {
        /// The event type.
        event_type: &'static str,
        /// Which field (`aggregate id`, `dedup key`, `header name`, …).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// An error from an outbox operation: beginning, writing or committing a transaction.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// The database refused a statement or the connection failed.
    #[error("database error: {0}")]
    Database(DbErr),
    /// The connection's backend is not compiled in or not supported.
    #[error("unsupported database backend: {0}")]
    UnsupportedBackend(String),
}

impl From<DbErr> for OutboxError {
    fn from(error: DbErr) -> Self {
        OutboxError::Database(error)
    }
}

impl OutboxError {
    /// The database's error, as the SDK's own statements report errors.
    pub(crate) fn into_db_err(self) -> DbErr {
        match self {
            OutboxError::Database(e) => e,
            other => DbErr::Custom(other.to_string()),
        }
    }
}

/// The error of [`Outbox::transaction`](crate::Outbox::transaction): either the closure's own
/// error (the transaction was rolled back) or the outbox's.
#[derive(Debug, thiserror::Error)]
pub enum TransactionError<E> {
    /// The closure returned `Err`; rows and events were rolled back.
    #[error("transaction rolled back: {0}")]
    Callback(E),
    /// Beginning, flushing or committing failed.
    #[error(transparent)]
    Outbox(#[from] OutboxError),
}

impl<E> TransactionError<E> {
    /// The closure's error, if that is what this is.
    pub fn into_callback(self) -> Option<E> {
        match self {
            TransactionError::Callback(e) => Some(e),
            TransactionError::Outbox(_) => None,
        }
    }
}
