//! Transports: how envelopes reach a broker and come back to consumers.
//!
//! A [`Transport`] publishes batches and reports, per message, success only once the broker has
//! confirmed it (a publisher confirm, a JetStream ack, an `XADD` reply), never after a buffered
//! send. It also subscribes named consumers with explicit ack and nack. Implementations:
//!
//! - `memory::MemoryTransport`: in-process, with fault injection, for tests and examples;
//! - `nats::NatsTransport` (feature `nats`): NATS JetStream, a stream per namespace;
//! - `rabbitmq::RabbitMqTransport` (feature `rabbitmq`): a topic exchange per namespace, a durable
//!   queue per consumer, publisher confirms;
//! - `redis::RedisTransport` (feature `redis`): Redis Streams, one stream `{namespace}:events`,
//!   a consumer group per consumer;
//! - `kafka::KafkaTransport` (feature `kafka`): a topic per aggregate type, keyed by aggregate
//!   id, an idempotent producer, consumer groups committing offsets by hand.
//!
//! The database-local transport is not a `Transport`: the relay moves events straight into local
//! consumers' inboxes (`relay::Relay::local`).
//!
//! Routing: an event of type `order.placed` is published under `{namespace}.order.placed`, with
//! the namespace configured on the transport (default [`DEFAULT_NAMESPACE`]).

use std::{fmt, time::Duration};

use bytes::Bytes;
use uuid::Uuid;

/// Builder setters that forward to the config setter of the same name (`self.config`).
#[allow(unused_macros)] // used by the broker transports, each behind its feature
macro_rules! delegate_setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty;)*) => {$(
        $(#[$doc])*
        pub fn $name(mut self, value: $ty) -> Self {
            self.config = self.config.$name(value);
            self
        }
    )*};
}

#[cfg(feature = "kafka")]
pub mod kafka;
pub mod local;
pub mod memory;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "redis")]
pub mod redis;
mod routing;

pub(crate) use routing::destination;
pub use routing::{KafkaTopics, Routing};

/// The content type of a structured-mode CloudEvent: what every broker transport marks a message
/// with.
pub const CONTENT_TYPE: &str = "application/cloudevents+json";

/// The check every transport makes of its timeouts and intervals: none may be zero (a zero
/// timeout fails every call, a zero interval spins).
#[cfg(any(feature = "nats", feature = "rabbitmq", feature = "kafka"))]
pub(crate) fn check_nonzero(
    transport: &'static str,
    settings: &[(&str, std::time::Duration)],
) -> Result<(), TransportError> {
    match settings.iter().find(|(_, value)| value.is_zero()) {
        Some((name, _)) => Err(TransportError::new(
            transport,
            format!("`{name}` must not be zero"),
        )),
        None => Ok(()),
    }
}

/// The check every transport makes before subscribing: a consumer name.
pub(crate) fn check_consumer_name(
    transport: &'static str,
    consumer: &str,
) -> Result<(), TransportError> {
    if consumer.is_empty() {
        return Err(TransportError::new(
            transport,
            "the consumer name must not be empty",
        ));
    }
    Ok(())
}

/// The event types a subscription asked for, each once, in the order given; an error when there
/// is none.
pub(crate) fn distinct_event_types<'a>(
    transport: &'static str,
    consumer: &str,
    event_types: &'a [String],
) -> Result<Vec<&'a str>, TransportError> {
    let mut types: Vec<&str> = Vec::with_capacity(event_types.len());
    for event_type in event_types {
        if !types.contains(&event_type.as_str()) {
            types.push(event_type.as_str());
        }
    }
    if types.is_empty() {
        return Err(TransportError::new(
            transport,
            format!("consumer `{consumer}` subscribes to no event type"),
        ));
    }
    Ok(types)
}

/// The results of a publish once every message was tried: a message no step answered for is an
/// error, never a silent success.
#[allow(dead_code)] // used by the broker transports, each behind its feature
pub(crate) fn publish_results(
    results: Vec<Option<Result<(), PublishError>>>,
) -> Vec<Result<(), PublishError>> {
    results
        .into_iter()
        .map(|result| {
            result.unwrap_or_else(|| {
                Err(PublishError::Rejected(
                    "internal error: no publish result".into(),
                ))
            })
        })
        .collect()
}

/// Default namespace events are routed under.
pub const DEFAULT_NAMESPACE: &str = "outbox";

/// One envelope to publish.
#[derive(Debug, Clone)]
pub struct OutgoingMessage {
    /// The event id: the broker-side deduplication key where the broker has one.
    pub event_id: Uuid,
    /// The event type; the routing name is derived from it.
    pub event_type: String,
    /// The aggregate type.
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The CloudEvents JSON body.
    pub body: Bytes,
    /// The trace context (`traceparent`, `tracestate`) and the user headers given at enqueue, as
    /// the body carries them too: for brokers whose messages have headers beside the body
    /// (Kafka), so that tools reading headers see them without parsing the body.
    pub headers: Vec<(String, String)>,
}

/// Why one message was not confirmed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// The broker did not confirm in time; the message may or may not have been stored.
    #[error("no confirmation from the broker within {0:?}")]
    Timeout(Duration),
    /// The connection failed before the confirm arrived.
    #[error("broker connection failed: {0}")]
    Connection(String),
    /// The broker refused the message, but a retry may succeed.
    #[error("broker rejected the message: {0}")]
    Rejected(String),
    /// The broker refused the message and always will (e.g. it is over the broker's size limit):
    /// the event goes straight to DEAD.
    #[error("broker rejected the message permanently: {0}")]
    Permanent(String),
}

impl PublishError {
    /// The failure's class as OpenTelemetry's `error.type`: `timeout`, `connection`,
    /// `rejected` or `rejected_permanently`.
    pub fn error_type(&self) -> &'static str {
        match self {
            PublishError::Timeout(_) => "timeout",
            PublishError::Connection(_) => "connection",
            PublishError::Rejected(_) => "rejected",
            PublishError::Permanent(_) => "rejected_permanently",
        }
    }

    /// Whether retrying cannot help.
    pub fn is_permanent(&self) -> bool {
        matches!(self, PublishError::Permanent(_))
    }

    /// Whether the failure may say that the broker is unavailable rather than anything about
    /// this message: a lost or refused connection (or a full client queue) says so by itself;
    /// no confirmation in time says so when the broker's health check fails too. The relay
    /// then counts no attempt, and waits for the broker.
    pub fn may_be_unavailable(&self) -> bool {
        matches!(self, PublishError::Timeout(_) | PublishError::Connection(_))
    }

    /// SQL `LIKE` patterns of the messages of the failures that [may say the broker is
    /// unavailable](Self::may_be_unavailable), as a release before `outbox_0010` stored them in
    /// `last_error` without a class. Only for those rows: the relay decides by the stored class.
    /// These wordings are frozen; rewording the errors above changes nothing.
    pub(crate) const LEGACY_UNAVAILABLE_PATTERNS: [&'static str; 2] = [
        "no confirmation from the broker within %",
        "broker connection failed: %",
    ];
}

#[cfg(test)]
mod tests {
    use super::PublishError;

    #[test]
    fn the_unavailable_patterns_match_the_messages_they_name() {
        let matches = |message: &str| {
            PublishError::LEGACY_UNAVAILABLE_PATTERNS
                .iter()
                .any(|p| message.starts_with(p.trim_end_matches('%')))
        };
        for error in [
            PublishError::Timeout(std::time::Duration::from_secs(10)),
            PublishError::Connection("reset".into()),
        ] {
            assert!(error.may_be_unavailable());
            assert!(matches(&error.to_string()), "{error}");
        }
        for error in [
            PublishError::Rejected("no route".into()),
            PublishError::Permanent("too large".into()),
        ] {
            assert!(!error.may_be_unavailable());
            assert!(!matches(&error.to_string()), "{error}");
        }
    }
}

/// A transport-level failure outside a single publish.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{transport} transport: {message}")]
pub struct TransportError {
    /// Which transport.
    pub transport: &'static str,
    /// What went wrong.
    pub message: String,
}

impl TransportError {
    /// Build an error for `transport`.
    pub fn new(transport: &'static str, message: impl fmt::Display) -> Self {
        TransportError {
            transport,
            message: message.to_string(),
        }
    }
}

/// How a consumer subscribes.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SubscribeOptions {
    pub(crate) ack_wait: Duration,
    pub(crate) max_in_flight: usize,
}

impl Default for SubscribeOptions {
    fn default() -> Self {
        SubscribeOptions {
            ack_wait: Duration::from_secs(30),
            max_in_flight: 256,
        }
    }
}

crate::util::setters! {
    SubscribeOptions {
        /// Unacknowledged deliveries are redelivered after this long. Default 30 s.
        ack_wait: Duration,

        /// Deliveries handed out and not yet acked, at most. Default 256.
        max_in_flight: usize,
    }
}

/// A broker behind one interface.
#[async_trait::async_trait]
pub trait Transport: Send + Sync + fmt::Debug + 'static {
    /// Short name for logs and metrics (`memory`, `nats`, …).
    fn name(&self) -> &'static str;

    /// Where this transport publishes each event type, for the event catalogue's AsyncAPI
    /// document ([`AsyncApi`](crate::catalogue::AsyncApi)); `None` for transports without a
    /// broker (in memory, database-local).
    fn routing(&self) -> Option<Routing> {
        None
    }

    /// Create what publishing needs (streams, exchanges). Idempotent.
    async fn setup(&self) -> Result<(), TransportError>;

    /// Publish `messages` in order and report one result per message, in the same order.
    ///
    /// `Ok` means the broker confirmed that it stored the message. Implementations pipeline the
    /// batch and wait for every confirmation.
    async fn publish(&self, messages: &[OutgoingMessage]) -> Vec<Result<(), PublishError>>;

    /// Subscribe the consumer group `consumer` to `event_types`. Instances subscribing with the
    /// same consumer name share the deliveries.
    async fn subscribe(
        &self,
        consumer: &str,
        event_types: &[String],
        options: &SubscribeOptions,
    ) -> Result<Box<dyn Subscription>, TransportError>;

    /// Whether the broker answers.
    async fn health(&self) -> Result<(), TransportError>;
}

/// What a relay or a runtime takes as its transport: one by value (`NatsTransport`), or one
/// shared in an `Arc` (`Arc<NatsTransport>`, `Arc<dyn Transport>`).
pub trait IntoTransport {
    /// The transport, shared.
    fn into_transport(self) -> std::sync::Arc<dyn Transport>;
}

impl<T: Transport> IntoTransport for T {
    fn into_transport(self) -> std::sync::Arc<dyn Transport> {
        std::sync::Arc::new(self)
    }
}

impl<T: Transport> IntoTransport for std::sync::Arc<T> {
    fn into_transport(self) -> std::sync::Arc<dyn Transport> {
        self
    }
}

impl IntoTransport for std::sync::Arc<dyn Transport> {
    fn into_transport(self) -> std::sync::Arc<dyn Transport> {
        self
    }
}

/// Deliveries of one subscription.
#[async_trait::async_trait]
pub trait Subscription: Send + fmt::Debug {
    /// The next delivery; `None` once the subscription is closed.
    async fn next(&mut self) -> Option<Result<Delivery, TransportError>>;
}

/// Settles one delivery with the broker.
#[async_trait::async_trait]
pub trait Acker: Send + Sync {
    /// The message was handled (or stored for later): do not deliver it again.
    async fn ack(&self) -> Result<(), TransportError>;
    /// Deliver it again, after `delay` if given.
    async fn nack(&self, delay: Option<Duration>) -> Result<(), TransportError>;
}

/// One message delivered to a consumer. Settle it with [`ack`](Self::ack) or [`nack`](Self::nack).
pub struct Delivery {
    /// The CloudEvents JSON body, as received.
    pub body: Bytes,
    /// The routing name it was published under.
    pub subject: String,
    /// The broker's message id, when it carries one (`Nats-Msg-Id`, …).
    pub message_id: Option<String>,
    /// 1 for the first delivery, more for redeliveries.
    pub delivery_count: u32,
    acker: Box<dyn Acker>,
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("subject", &self.subject)
            .field("message_id", &self.message_id)
            .field("delivery_count", &self.delivery_count)
            .field("bytes", &self.body.len())
            .finish()
    }
}

impl Delivery {
    /// Build a delivery (for transport implementations).
    pub fn new(
        body: Bytes,
        subject: String,
        message_id: Option<String>,
        delivery_count: u32,
        acker: Box<dyn Acker>,
    ) -> Self {
        Delivery {
            body,
            subject,
            message_id,
            delivery_count,
            acker,
        }
    }

    /// Acknowledge: the broker will not deliver it again.
    pub async fn ack(self) -> Result<(), TransportError> {
        self.acker.ack().await
    }

    /// Negative-acknowledge: deliver again, after `delay` if given.
    pub async fn nack(self, delay: Option<Duration>) -> Result<(), TransportError> {
        self.acker.nack(delay).await
    }
}

/// The routing name of an event type under a namespace: `{namespace}.{event_type}`.
pub fn routing_name(namespace: &str, event_type: &str) -> String {
    format!("{namespace}.{event_type}")
}
