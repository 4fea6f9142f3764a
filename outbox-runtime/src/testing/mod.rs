//! The test kit (feature `testing`): for the tests of a service that uses this SDK.
//!
//! - [`enqueued`]: what a transaction enqueued, before its commit; [`events`] since a [`Mark`]:
//!   what was committed, sent, or is still waiting.
//! - [`TestConsumer`]: run a consumer's handlers directly with a typed event, an envelope, a
//!   foreign body or a webhook's message, through the real inbox (dedup, the version guard,
//!   upcasters, retries with their backoff skipped, DEAD after `max_attempts`), and see what the
//!   handler enqueued in turn.
//! - [`Session`]: commit, then wait until the relay, the consumers and their cascades are quiet,
//!   with a timeout that lists what is still moving; read what was published and handled.
//! - [`HandlerFaults`] fail handlers on request; the in-memory transport
//!   ([`MemoryTransport`]) drops, delays, duplicates and refuses publishes and stops the broker.
//! - [`make_due`] and [`advance`]: retries and delayed events due on request, without sleeping.
//!   The database's clock stays the one source of time: the kit moves the rows' due times to
//!   the database's current time, it never fakes a clock, so the relay and the workers decide
//!   exactly as they do in production.
//! - [`relay_config`] and [`inbox_config`]: a runtime that polls every few milliseconds, so a
//!   test never waits for an interval meant for production.
//!
//! A database per test (SQLite in memory, or a fresh PostgreSQL schema) is `outbox::testing::TestDb`
//! in the `outbox` crate, which holds the migrations.

mod consumer;
mod events;
mod faults;
mod session;

use std::time::Duration;

pub use consumer::{MessageState, Outcome, TestConsumer};
pub use events::{CapturedEvent, EventState, Events, Mark, enqueued, events};
pub use faults::HandlerFaults;
pub use session::{Message, Quiet, Session};

pub use crate::transport::memory::MemoryTransport;

use crate::{inbox::InboxConfig, relay::RelayConfig, util::backoff::Backoff};

/// What the kit could not do.
#[derive(Debug, thiserror::Error)]
pub enum KitError {
    /// The database refused a statement.
    #[error("database error: {0}")]
    Db(#[from] sea_orm::DbErr),
    /// The kit was asked for something that cannot be (an unknown consumer, a message it did
    /// not deliver, …).
    #[error("{0}")]
    Setup(String),
    /// A session did not become quiet in time: what was still moving.
    #[error("{0}")]
    NotQuiet(String),
}

/// How many due times [`make_due`] or [`advance`] moved.
pub use crate::store::kit::KitBroughtForward as BroughtForward;

/// Make every retry (of a publish or of a handler) and every delayed event due now, by the
/// database's clock. A running runtime picks them up at its next poll ([`relay_config`],
/// [`inbox_config`]: every few milliseconds).
pub async fn make_due(db: &sea_orm::DatabaseConnection) -> Result<BroughtForward, KitError> {
    Ok(crate::store::kit::bring_forward(db).await?)
}

/// What `by` of waiting does, without waiting: every retry and delayed event not yet due has
/// its due time moved `by` earlier, by the database's clock; those it reaches are due now (the
/// count says how many). Calls add up: `advance(23 h)` then `advance(1 h)` is a day.
pub async fn advance(
    db: &sea_orm::DatabaseConnection,
    by: Duration,
) -> Result<BroughtForward, KitError> {
    Ok(crate::store::kit::shift_due(db, by).await?)
}

/// A relay configuration for tests: polls every 10 ms, retries a failed publish after 10 ms
/// (doubling to 100 ms).
pub fn relay_config() -> RelayConfig {
    RelayConfig::default()
        .poll_interval(Duration::from_millis(10))
        .backoff(Backoff {
            base: Duration::from_millis(10),
            cap: Duration::from_millis(100),
            jitter: 0.0,
        })
}

/// An inbox configuration for tests: the worker polls every 10 ms and retries a failed handler
/// after 10 ms (doubling to 100 ms; a handler's own `backoff` still wins, see
/// [`Session::skip_backoff`]).
pub fn inbox_config() -> InboxConfig {
    InboxConfig::default()
        .poll_interval(Duration::from_millis(10))
        .backoff(Backoff {
            base: Duration::from_millis(10),
            cap: Duration::from_millis(100),
            jitter: 0.0,
        })
}
