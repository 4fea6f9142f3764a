#![doc = include_str!("../README.md")]

pub use outbox_runtime::CancellationToken;
#[cfg(feature = "failpoints")]
pub use outbox_runtime::failpoints;
pub use outbox_runtime::inbox::InboxConfig;
pub use outbox_runtime::relay::{Backoff, Relay, RelayConfig, RelayError, RelayHandle};
pub use outbox_runtime::runtime::{Runtime, RuntimeBuilder, RuntimeError, RuntimeReport};
#[cfg(feature = "nats")]
pub use outbox_runtime::transport::nats::NatsTransport;
#[cfg(feature = "rabbitmq")]
pub use outbox_runtime::transport::rabbitmq::RabbitMqTransport;
#[cfg(feature = "redis")]
pub use outbox_runtime::transport::redis::RedisTransport;
pub use outbox_runtime::transport::{Transport, memory::MemoryTransport};
pub use outbox_runtime::{
    CommitReport, DomainEvent, EnqueueError, Envelope, EnvelopeError, Event, EventId, EventMeta,
    EventRegistration, HandlerContext, HandlerError, HandlerMode, HandlerRegistration, Headers,
    InboxTransaction, Outbox, OutboxBuilder, OutboxError, OutboxTransaction, SkippedEvent,
    TraceContext, TraceContextError, TransactionError, WakeReceiver, envelope, event, inbox,
    registry, relay, runtime, store, trace, transaction, transport,
};
pub use outbox_runtime::{admin, retention};

#[cfg(feature = "macros")]
pub use outbox_macros::{DomainEvent, inbox_handler};

pub use outbox_runtime::outbox::DEFAULT_NOTIFY_CHANNEL;

pub use outbox_migrations::{Migrator, migrate, migrations};

/// Everything a service needs in one `use outbox::prelude::*;`.
pub mod prelude {
    #[cfg(feature = "macros")]
    pub use crate::inbox_handler;
    pub use crate::{
        CommitReport, DomainEvent, EnqueueError, Envelope, Event, EventId, HandlerError,
        InboxTransaction, Outbox, OutboxError, OutboxTransaction, Runtime, TraceContext,
        TransactionError,
    };
    /// Brings `execute_unprepared`, `query_one_raw`, … to `&tx`.
    pub use outbox_runtime::__private::sea_orm::ConnectionTrait;
}

/// The SeaORM version this SDK is built on, re-exported so versions cannot drift apart.
pub use outbox_runtime::__private::sea_orm;

#[doc(hidden)]
pub mod __private {
    pub use outbox_runtime::__private::*;
}
