//! Runtime of the outbox SDK.
//!
//! Use it through the `outbox` crate, which re-exports everything here together with the macros and
//! the migrations. Module map:
//!
//! - [`event`]: the [`DomainEvent`] trait and the compile-time event catalogue;
//! - [`envelope`]: the CloudEvents 1.0 JSON envelope every event travels in;
//! - [`trace`]: the W3C trace context captured at enqueue;
//! - [`outbox`](mod@outbox): the [`Outbox`] handle that begins transactions and wakes the relay;
//! - [`transaction`]: [`OutboxTransaction`], which writes buffered events right before `COMMIT`;
//! - `store` (internal; feature `test-util` exposes it to the SDK's own tests): the SQL the SDK
//!   runs, with what differs per backend (PostgreSQL, MySQL/MariaDB, SQLite) in its dialect;
//! - [`registry`]: start-up checks over everything the macros registered;
//! - [`relay`]: moves committed events to a [`transport`]; [`inbox`]: handles each delivered
//!   message effectively once; [`runtime`]: starts both from `main`;
//! - [`admin`], [`retention`], [`metrics`], [`telemetry`], [`health`]: operations.
//!
//! `docs/ARCHITECTURE.md` in the repository shows the layers and one event's path through them.
//! - `failpoints` (feature `failpoints`): named places where fault-injection tests crash the SDK.

/// A failpoint: `failpoint!(NAME)` honours `panic`, `sleep`, `pause`, …; `failpoint!(NAME, expr)`
/// also returns `expr` from the enclosing function when the point is armed with `return`, and
/// `failpoint!(error NAME)` returns `Err` of the injected database error (converted with `into`).
/// Without the `failpoints` feature it expands to nothing.
macro_rules! failpoint {
    (error $name:expr) => {
        failpoint!($name, Err($crate::failpoints::injected($name).into()))
    };
    ($name:expr) => {
        #[cfg(feature = "failpoints")]
        fail::fail_point!($name);
    };
    ($name:expr, $ret:expr) => {
        #[cfg(feature = "failpoints")]
        fail::fail_point!($name, |_| $ret);
    };
}

pub mod admin;
pub mod catalogue;
#[cfg(feature = "console")]
pub mod console;
pub mod envelope;
pub mod error;
pub mod event;
#[cfg(feature = "failpoints")]
pub mod failpoints;
pub mod fleet;
pub mod health;
pub mod inbox;
pub mod metrics;
pub(crate) mod operations;
pub mod outbox;
pub mod pause;
pub mod registry;
pub mod relay;
pub mod retention;
pub mod runtime;
/// The SQL layer. Internal: exposed with the `test-util` feature only, for the SDK's own tests
/// and benchmarks, and not covered by semver.
#[cfg(feature = "test-util")]
pub mod store;
#[cfg(not(feature = "test-util"))]
#[allow(unreachable_pub)]
pub(crate) mod store;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
pub mod trace;
pub mod transaction;
pub mod transport;
pub mod upcast;
pub(crate) mod util;
#[cfg(feature = "webhook")]
pub mod webhook;

pub use envelope::{Envelope, EnvelopeError};
pub use error::{EnqueueError, OutboxError, TransactionError};
pub use event::{DomainEvent, EventId, EventRegistration};
pub use inbox::{
    Event, EventMeta, HandlerContext, HandlerError, HandlerMode, HandlerRegistration,
    InboxTransaction,
};
pub use outbox::{Outbox, OutboxBuilder, WakeReceiver};
pub use runtime::{Runtime, RuntimeBuilder, RuntimeError};
pub use tokio_util::sync::CancellationToken;
pub use trace::{TraceContext, TraceContextError};
pub use transaction::{CommitReport, Headers, OutboxTransaction, SkippedEvent};

/// Items the macros' generated code uses. Not public API: no stability guarantees.
#[doc(hidden)]
pub mod __private01 {
    pub use crate::catalogue::{SchemaProbe, ViaJsonSchema, WithoutSchema};
    pub use crate::envelope::Envelope;
    pub use crate::event::{AggregateVersionValue, DedupKeyValue, DomainEvent, EventRegistration};
    pub use crate::inbox::{
        Event, HandlerError, HandlerFuture, HandlerMode, HandlerRegistration, InboxTransaction,
    };
    pub use crate::upcast::UpcasterRegistration;
    pub use inventory;
    #[cfg(feature = "catalogue")]
    pub use schemars;
    pub use sea_orm;
    pub use serde;
    pub use serde_json;
    pub use std::format;
    pub use std::pin::Pin;
    pub use std::{
        boxed::Box,
        option::Option::{self, None, Some},
        result::Result::{self, Err, Ok},
        string::{String, ToString},
    };
}
