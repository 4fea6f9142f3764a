//! RabbitMQ transport (feature `rabbitmq`), on [`lapin`].
//!
//! # Topology
//!
//! One durable **topic** exchange per namespace (see [`RabbitMqConfig::resolved_exchange`]; by
//! default the exchange is named after the namespace, `outbox`). An event of type
//! `order.placed` is published to it with the routing key `order.placed`. [`setup`] declares the
//! exchange, idempotently.
//!
//! Every consumer group owns one durable queue, `{namespace}.{consumer}` (see [`queue_name`]),
//! bound to the exchange with each of its event types as binding key. RabbitMQ only stores a
//! message in queues that exist when it is published: **declare consumer queues before
//! producers publish** — [`subscribe`] does it, and so does
//! [`RabbitMqTransport::declare_consumer_queue`] for provisioning without consuming.
//!
//! # Publishing
//!
//! [`publish`] sends the batch on one channel in publisher-confirm mode, then awaits every
//! confirm: a message is reported `Ok` only once the broker acknowledged it **and did not return
//! it**. Messages are persistent (`delivery_mode` 2) and `mandatory`, carry the event id as
//! `message_id`, the event type as `type`, `content_type` `application/cloudevents+json` and
//! the `ce-specversion`, `ce-id`, `ce-type` headers. Outcomes per message:
//!
//! - unroutable (no queue is bound for its routing key): the broker returns it, then acks it;
//!   reported as [`PublishError::Rejected`] ("unroutable: …"), so the relay retries it until a
//!   consumer queue exists or the event ends `DEAD`. Within
//!   [`recovery_grace`](RabbitMqConfig::recovery_grace) of the connection's opening it is
//!   reported as [`PublishError::Connection`] instead: a broker back from a crash accepts
//!   connections while it still recovers its durable queues, and a queue's bindings route again
//!   only once the queue is back, so the relay waits for the broker without spending an attempt;
//! - `basic.nack` (e.g. a bound queue is full and set to `reject-publish`):
//!   [`PublishError::Rejected`];
//! - no confirm within [`publish_timeout`](RabbitMqConfig::publish_timeout) (counted from the
//!   message's send): [`PublishError::Timeout`]. The channel is then closed, which settles the
//!   confirms still pending; should even that stall, the batch's acknowledged messages are
//!   reported as timed out too, since the return of one of them may be what never arrived;
//! - larger than [`max_message_size`](RabbitMqConfig::max_message_size), or an event type that
//!   cannot be a routing key: [`PublishError::Permanent`], without being sent;
//! - the exchange is missing (`setup()` has not run) or access is refused:
//!   [`PublishError::Rejected`]; a lost connection: [`PublishError::Connection`].
//!
//! Lapin hands a returned message to whichever confirm the broker resolves next on the channel,
//! not necessarily the returned message's own. So returns are matched to messages by their
//! `message_id` (the event id) and routing key over the whole batch, and `publish` calls are
//! serialized on a single confirm channel (a `tokio` mutex held for the whole batch): a batch's
//! returns can then only land on that batch's confirms. Each batch still pipelines: everything is
//! sent before the first confirm is awaited. A channel whose batch timed out, failed or was
//! cancelled midway is closed and replaced, so no stray confirm of an old batch can swallow the
//! return of a new one. A new publish channel first checks (passively) that the exchange exists,
//! so a missing exchange fails the batch cleanly instead of making the broker close the channel
//! under a stream of publishes.
//!
//! # Consuming
//!
//! [`subscribe`] declares the exchange, the consumer's queue and its bindings (idempotently), then
//! consumes it on a channel of its own with manual acks and `basic.qos(prefetch)`, the prefetch
//! being [`SubscribeOptions::max_in_flight`] unless [`RabbitMqConfig::prefetch`] is set.
//! Subscriptions under one consumer name share the queue (competing consumers); different names
//! each receive everything. [`Delivery::subject`] is [`routing_name`]`(namespace, event_type)`,
//! as with the other transports; [`Delivery::message_id`] is the event id.
//!
//! - `delivery_count`: classic queues only flag redeliveries, so it is 1, or 2 for any
//!   redelivery. With [`QueueType::Quorum`] it is exact (the broker's `x-delivery-count` + 1).
//! - `ack`: `basic.ack`. `nack(None)`: `basic.nack` with requeue. `nack(Some(delay))`: the same
//!   after `delay`, from a timer task; the delivery keeps its prefetch slot meanwhile. (The SDK's
//!   own retries do not depend on this: failed handlers are stored as `RETRY` in the inbox.)
//! - [`SubscribeOptions::ack_wait`] is not enforced: RabbitMQ has no per-delivery ack timer.
//!   Unacked deliveries return to the queue, marked redelivered, when their channel closes: when
//!   the subscription is dropped, the connection is lost, or the broker's `consumer_timeout`
//!   (default 30 minutes) closes the channel of a consumer that holds a delivery too long.
//!
//! # Connection loss
//!
//! The transport keeps the URI. When the connection is found closed, the next [`publish`],
//! [`subscribe`], [`setup`] or [`health`] reconnects; a failed attempt makes the following calls
//! fail at once until a backoff (200 ms doubling to 2 s) has passed, so a broker outage does not
//! turn into a reconnect storm. A subscription whose connection was lost yields one error, then
//! ends: subscribe again (the SDK's inbox does) to consume on the new connection. A broker that
//! goes away closes the TCP connection and is noticed at once. A connection that goes silent
//! without closing (a partition, a dead host) is noticed three ways, whichever comes first: no
//! heartbeat for twice [`heartbeat`](RabbitMqConfig::heartbeat) (10 s by default: the client
//! then closes it, which ends its subscriptions with an error), a publish confirm not received
//! within [`publish_timeout`](RabbitMqConfig::publish_timeout), or another operation (channel
//! open, declare, the health check) not answered within
//! [`response_timeout`](RabbitMqConfig::response_timeout). In the last two cases the connection
//! is given up at once and the next call opens a new one.
//!
//! ```no_run
//! # async fn demo() -> Result<(), outbox_runtime::transport::TransportError> {
//! use std::time::Duration;
//! use outbox_runtime::transport::{Transport, rabbitmq::RabbitMqTransport};
//!
//! let transport = RabbitMqTransport::builder("amqp://guest:guest@127.0.0.1:5672/%2f")
//!     .namespace("shop")
//!     .publish_timeout(Duration::from_secs(5))
//!     .connect()
//!     .await?;
//! transport.setup().await?;
//! assert_eq!(transport.exchange(), "shop");
//! // Events of these types are kept for `billing` from now on, even before it subscribes.
//! let queue = transport
//!     .declare_consumer_queue("billing", &["order.placed".to_owned()])
//!     .await?;
//! assert_eq!(queue, "shop.billing");
//! # Ok(())
//! # }
//! ```
//!
//! [`setup`]: Transport::setup
//! [`publish`]: Transport::publish
//! [`subscribe`]: Transport::subscribe
//! [`health`]: Transport::health
//! [`Delivery::subject`]: super::Delivery::subject
//! [`Delivery::message_id`]: super::Delivery::message_id
//! [`routing_name`]: super::routing_name

use std::{
    fmt,
    sync::{Arc, RwLock, atomic::AtomicU64},
};

use lapin::{
    ConnectionStatus, ExchangeKind, options::ExchangeDeclareOptions, protocol::AMQPSoftError,
    types::FieldTable, uri::AMQPUri,
};
use tokio::sync::Mutex;

use super::{
    OutgoingMessage, PublishError, SubscribeOptions, Subscription, Transport, TransportError,
};

/// The `lapin` version this transport is built on, re-exported so the versions of
/// [`RabbitMqTransport::connection`]'s connection and your own code cannot drift apart.
pub use lapin;

const TRANSPORT: &str = "rabbitmq";

/// AMQP short strings (exchange and queue names, routing keys) hold at most 255 bytes.
const MAX_NAME_BYTES: usize = 255;

mod ack;
mod config;
mod connection;
mod publish;
mod subscription;
mod topology;

pub use config::{
    DEFAULT_CONNECTION_NAME, DEFAULT_CONNECTION_TIMEOUT, DEFAULT_HEARTBEAT,
    DEFAULT_MAX_MESSAGE_SIZE, DEFAULT_PUBLISH_TIMEOUT, DEFAULT_RECOVERY_GRACE,
    DEFAULT_RESPONSE_TIMEOUT, QueueType, RabbitMqConfig, RabbitMqTransportBuilder,
};
pub use publish::CONTENT_TYPE;
pub use topology::queue_name;

use connection::{ApiError, ConnectionSlot, close_quietly};
use publish::PublishChannel;
use topology::short;

/// The RabbitMQ transport. Cheap to clone: clones share the connection and the publish channel.
#[derive(Clone)]
pub struct RabbitMqTransport {
    inner: Arc<Inner>,
}

struct Inner {
    uri: AMQPUri,
    /// The URI without its password, for messages.
    display_uri: String,
    exchange: String,
    config: RabbitMqConfig,
    connection: Mutex<ConnectionSlot>,
    /// The generation of the current connection ([`ConnectionSlot::generation`]), readable
    /// without awaiting: an operation that times out replaces the connection only if it is
    /// still the one of the generation the operation started on.
    generation: AtomicU64,
    /// When the current connection opened (never held across an `.await`).
    opened_at: std::sync::Mutex<tokio::time::Instant>,
    /// The status of the current connection, readable without awaiting (never held across an
    /// `.await`).
    status: RwLock<ConnectionStatus>,
    /// The confirm-mode channel every `publish` call uses, one call at a time.
    publisher: Mutex<Option<PublishChannel>>,
}

impl fmt::Debug for RabbitMqTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitMqTransport")
            .field("uri", &self.inner.display_uri)
            .field("namespace", &self.inner.config.namespace)
            .field("exchange", &self.inner.exchange)
            .field("connected", &self.is_connected())
            .finish()
    }
}

impl RabbitMqTransport {
    /// Connect to `uri` (e.g. `amqp://guest:guest@127.0.0.1:5672/%2f`) with the default
    /// settings: namespace and exchange `outbox`.
    pub async fn connect(uri: &str) -> Result<Self, TransportError> {
        Self::builder(uri).connect().await
    }

    /// Configure a transport that connects to `uri`.
    pub fn builder(uri: impl Into<String>) -> RabbitMqTransportBuilder {
        RabbitMqTransportBuilder {
            uri: uri.into(),
            config: RabbitMqConfig::default(),
        }
    }

    /// The namespace: prefix of the consumer queues, and the exchange unless one is configured.
    pub fn namespace(&self) -> &str {
        &self.inner.config.namespace
    }

    /// The topic exchange events are published to.
    pub fn exchange(&self) -> &str {
        &self.inner.exchange
    }

    /// The settings in use.
    pub fn config(&self) -> &RabbitMqConfig {
        &self.inner.config
    }

    /// The broker's URI, without the password.
    pub fn uri(&self) -> &str {
        &self.inner.display_uri
    }

    /// The queue of the consumer group `consumer`: see [`queue_name`].
    pub fn queue_name(&self, consumer: &str) -> String {
        queue_name(&self.inner.config.namespace, consumer)
    }

    /// Whether the current connection is open (no I/O; a lost connection may not be noticed
    /// until the next heartbeat).
    pub fn is_connected(&self) -> bool {
        self.inner
            .status
            .read()
            .map(|status| status.connected())
            .unwrap_or(false)
    }
}

#[async_trait::async_trait]
impl Transport for RabbitMqTransport {
    fn name(&self) -> &'static str {
        TRANSPORT
    }

    fn routing(&self) -> Option<crate::transport::Routing> {
        Some(crate::transport::Routing::RabbitMq {
            exchange: self.inner.exchange.clone(),
        })
    }

    /// Declares the exchange: durable, topic. Fails clearly when an exchange of that name exists
    /// with another type or durability.
    async fn setup(&self) -> Result<(), TransportError> {
        let channel = self.channel().await?;
        let result = self.declare_exchange(&channel).await;
        close_quietly(channel).await;
        if result.is_ok() {
            tracing::debug!(exchange = %self.inner.exchange, "declared the exchange");
        }
        result
    }

    /// Sends every message (persistent, mandatory, routing key = event type), then awaits each
    /// confirm within the publish timeout counted from its send. See the
    /// [module docs](self#publishing) for the outcome of each case.
    async fn publish(&self, messages: &[OutgoingMessage]) -> Vec<Result<(), PublishError>> {
        self.publish_all(messages).await
    }

    /// Declares the exchange, the durable queue [`queue_name`]`(namespace, consumer)` and a
    /// binding per event type (idempotently), sets the prefetch and consumes with manual acks.
    ///
    /// A delivery whose routing key is not among `event_types` (a binding left by an earlier
    /// subscription of the same group) is acked and skipped. All subscriptions under one consumer
    /// name should therefore list the same event types: one listing fewer acks away the
    /// messages another one wanted.
    async fn subscribe(
        &self,
        consumer: &str,
        event_types: &[String],
        options: &SubscribeOptions,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        self.open_subscription(consumer, event_types, options).await
    }

    /// The connection is open (reopened if it was lost), the broker does not block publishers,
    /// and it answers a passive declare of the exchange (which fails when `setup()` has not run)
    /// on a new channel, each step within the
    /// [`response_timeout`](RabbitMqConfig::response_timeout) (a reconnect within the
    /// [`connection_timeout`](RabbitMqConfig::connection_timeout)). A connection that does not
    /// answer is given up, so the next check reconnects.
    async fn health(&self) -> Result<(), TransportError> {
        let connection = self.connection().await?;
        if connection.status().blocked() {
            return Err(TransportError::new(
                TRANSPORT,
                format!(
                    "RabbitMQ at {} blocks publishers (a memory or disk alarm is raised)",
                    self.inner.display_uri
                ),
            ));
        }
        let channel = self.open_channel(&connection).await?;
        let exchange = &self.inner.exchange;
        let options = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        let result = self
            .api(
                || format!("check exchange `{exchange}`"),
                channel.exchange_declare(
                    short(exchange),
                    ExchangeKind::Topic,
                    options,
                    FieldTable::default(),
                ),
            )
            .await;
        if let Err(ApiError::Timeout(..)) = &result {
            // The connection is given up: closing the channel would wait for nothing.
            drop(channel);
        } else {
            close_quietly(channel).await;
        }
        result.map_err(|err| match err.soft_error() {
            Some(AMQPSoftError::NOTFOUND) => TransportError::new(
                TRANSPORT,
                format!("exchange `{exchange}` does not exist (has `setup()` run?): {err}"),
            ),
            _ => err.into_transport_error(&self.inner.display_uri),
        })
    }
}
