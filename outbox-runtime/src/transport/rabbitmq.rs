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
//!   consumer queue exists or the event ends `DEAD`;
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
//! fail at once until a backoff (200 ms doubling to 5 s) has passed, so a broker outage does not
//! turn into a reconnect storm. A subscription whose connection was lost yields one error, then
//! ends: subscribe again (the SDK's inbox does) to consume on the new connection. A broker that
//! goes away closes the TCP connection and is noticed at once; a silent network loss is noticed
//! by missed heartbeats (the broker proposes 60 s; ask for less with `?heartbeat=10` in the URI).
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

use std::{
    collections::{HashMap, HashSet},
    fmt,
    str::FromStr,
    sync::{Arc, RwLock},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ConnectionStatus,
    Consumer, ErrorKind, ExchangeKind, PublisherConfirm,
    message::BasicReturnMessage,
    options::{
        BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions,
        BasicQosOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
        QueueDeclareOptions,
    },
    protocol::{AMQPErrorKind, AMQPSoftError, constants::REPLY_SUCCESS},
    types::{AMQPValue, FieldTable, LongString, ShortString},
    uri::AMQPUri,
};
use tokio::{sync::Mutex, time::Instant};

use super::{
    DEFAULT_NAMESPACE, Delivery, OutgoingMessage, PublishError, SubscribeOptions, Subscription,
    Transport, TransportError, routing_name,
};

/// The `lapin` version this transport is built on, re-exported so the versions of
/// [`RabbitMqTransport::connection`]'s connection and your own code cannot drift apart.
pub use lapin;

const TRANSPORT: &str = "rabbitmq";

/// The `content_type` of every published message: a CloudEvents 1.0 JSON envelope
/// (structured mode).
pub const CONTENT_TYPE: &str = "application/cloudevents+json";

/// Default time to wait for a publisher confirm.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Default time to wait for the TCP connection and the AMQP handshake.
pub const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// Default largest message published: RabbitMQ's default `max_message_size` (128 MiB).
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 128 * 1024 * 1024;

/// Default connection name, shown by `rabbitmqctl list_connections client_properties` and in the
/// management UI.
pub const DEFAULT_CONNECTION_NAME: &str = "outbox";

/// Lower bound of the timeout of topology operations (declares, binds, channel opens); the
/// publish timeout raises it when longer.
const API_TIMEOUT: Duration = Duration::from_secs(10);

/// How long closing a publish channel after a confirm timeout may take.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Reconnect backoff after a failed attempt: doubles from the base up to the cap.
const RECONNECT_BACKOFF_BASE: Duration = Duration::from_millis(200);
const RECONNECT_BACKOFF_CAP: Duration = Duration::from_secs(5);

/// AMQP short strings (exchange and queue names, routing keys) hold at most 255 bytes.
const MAX_NAME_BYTES: usize = 255;

/// The kind of queue consumer groups get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum QueueType {
    /// A durable classic queue. Redeliveries are only flagged, so
    /// [`Delivery::delivery_count`] is 1 or 2.
    #[default]
    Classic,
    /// A quorum queue (`x-queue-type: quorum`, replicated on clusters). The broker counts
    /// deliveries, so [`Delivery::delivery_count`] is exact. RabbitMQ 4 gives quorum queues a
    /// default delivery limit (20), after which a message is dropped or dead-lettered.
    Quorum,
}

impl QueueType {
    fn arguments(self) -> FieldTable {
        let mut arguments = FieldTable::default();
        if self == QueueType::Quorum {
            arguments.insert(
                "x-queue-type".into(),
                AMQPValue::LongString("quorum".into()),
            );
        }
        arguments
    }
}

/// Settings of a [`RabbitMqTransport`].
///
/// ```
/// use std::time::Duration;
/// use outbox_runtime::transport::rabbitmq::RabbitMqConfig;
///
/// let config = RabbitMqConfig::default()
///     .namespace("shop")
///     .publish_timeout(Duration::from_secs(5));
/// assert_eq!(config.resolved_exchange(), "shop");
/// assert_eq!(config.exchange("events").resolved_exchange(), "events");
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RabbitMqConfig {
    /// Names the exchange (unless [`exchange`](Self::exchange) is set) and prefixes consumer
    /// queues (`{namespace}.{consumer}`). Default [`DEFAULT_NAMESPACE`] (`outbox`).
    pub namespace: String,
    /// The topic exchange events are published to; `None` uses the namespace.
    pub exchange: Option<String>,
    /// How long a publish waits for its confirm before it is reported as
    /// [`PublishError::Timeout`]. Default [`DEFAULT_PUBLISH_TIMEOUT`] (10 s).
    pub publish_timeout: Duration,
    /// How long connecting may take. Default [`DEFAULT_CONNECTION_TIMEOUT`] (5 s).
    pub connection_timeout: Duration,
    /// Unacked deliveries per subscription; `None` uses [`SubscribeOptions::max_in_flight`].
    pub prefetch: Option<u16>,
    /// The kind of consumer queues declared. Default [`QueueType::Classic`]. An existing queue
    /// keeps its kind: the broker refuses to redeclare it as another one.
    pub queue_type: QueueType,
    /// Messages larger than this fail with [`PublishError::Permanent`] without being sent.
    /// Keep it at or below the broker's `max_message_size`: RabbitMQ answers a larger message by
    /// closing the channel, which fails the whole batch. Default [`DEFAULT_MAX_MESSAGE_SIZE`].
    pub max_message_size: usize,
    /// The connection name the broker shows. Default [`DEFAULT_CONNECTION_NAME`].
    pub connection_name: String,
}

impl Default for RabbitMqConfig {
    fn default() -> Self {
        RabbitMqConfig {
            namespace: DEFAULT_NAMESPACE.to_owned(),
            exchange: None,
            publish_timeout: DEFAULT_PUBLISH_TIMEOUT,
            connection_timeout: DEFAULT_CONNECTION_TIMEOUT,
            prefetch: None,
            queue_type: QueueType::Classic,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            connection_name: DEFAULT_CONNECTION_NAME.to_owned(),
        }
    }
}

impl RabbitMqConfig {
    /// Use `namespace` for the exchange and the consumer queues.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Publish to the exchange `name` instead of the one named after the namespace.
    pub fn exchange(mut self, name: impl Into<String>) -> Self {
        self.exchange = Some(name.into());
        self
    }

    /// Set how long a publish waits for its confirm.
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// Set the connection timeout.
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Let each subscription hold at most `prefetch` unacked deliveries (at least 1), whatever
    /// [`SubscribeOptions::max_in_flight`] says.
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = Some(prefetch);
        self
    }

    /// Set the kind of consumer queues.
    pub fn queue_type(mut self, queue_type: QueueType) -> Self {
        self.queue_type = queue_type;
        self
    }

    /// Set the largest message published.
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self
    }

    /// Set the connection name the broker shows.
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = name.into();
        self
    }

    /// The exchange in use: [`exchange`](Self::exchange) when set, otherwise the namespace.
    pub fn resolved_exchange(&self) -> &str {
        self.exchange.as_deref().unwrap_or(&self.namespace)
    }

    /// The prefetch a subscription with `options` gets: [`prefetch`](Self::prefetch) when set,
    /// otherwise `max_in_flight`, within 1 ..= 65,535.
    pub fn effective_prefetch(&self, options: &SubscribeOptions) -> u16 {
        match self.prefetch {
            Some(prefetch) => prefetch.max(1),
            None => u16::try_from(options.max_in_flight.max(1)).unwrap_or(u16::MAX),
        }
    }
}

/// The durable queue of the consumer group `consumer` under `namespace`:
/// `{namespace}.{consumer}`, with every character other than ASCII letters, digits, `_`, `-`,
/// `.` and `:` replaced by `_`. Two group names that differ only in such characters share a queue.
///
/// ```
/// use outbox_runtime::transport::rabbitmq::queue_name;
///
/// assert_eq!(queue_name("outbox", "inventory"), "outbox.inventory");
/// assert_eq!(queue_name("shop", "billing v2/eu"), "shop.billing_v2_eu");
/// ```
pub fn queue_name(namespace: &str, consumer: &str) -> String {
    let sanitize = |c: char| {
        if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':') {
            c
        } else {
            '_'
        }
    };
    namespace
        .chars()
        .map(sanitize)
        .chain(std::iter::once('.'))
        .chain(consumer.chars().map(sanitize))
        .collect()
}

/// Builds a [`RabbitMqTransport`]. Created by [`RabbitMqTransport::builder`].
#[derive(Clone)]
pub struct RabbitMqTransportBuilder {
    uri: String,
    config: RabbitMqConfig,
}

impl fmt::Debug for RabbitMqTransportBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitMqTransportBuilder")
            .field(
                "uri",
                &AMQPUri::from_str(&self.uri)
                    .map_or_else(|_| "<invalid>".to_owned(), |u| redact(&u)),
            )
            .field("config", &self.config)
            .finish()
    }
}

impl RabbitMqTransportBuilder {
    delegate_setters! {
        /// Use `namespace` for the exchange and the consumer queues. Default `outbox`.
        namespace: impl Into<String>;
        /// Publish to the exchange `name`. Default: the namespace.
        exchange: impl Into<String>;
        /// Set how long a publish waits for its confirm. Default 10 s.
        publish_timeout: Duration;
        /// Fail a connection attempt after `timeout`. Default 5 s.
        connection_timeout: Duration;
        /// Hold at most `prefetch` unacked deliveries per subscription. Default:
        /// `SubscribeOptions::max_in_flight`.
        prefetch: u16;
        /// Declare consumer queues of this kind. Default classic.
        queue_type: QueueType;
        /// Refuse messages larger than `bytes` without sending them. Default 128 MiB.
        max_message_size: usize;
        /// Name the connection. Default `outbox`.
        connection_name: impl Into<String>;
    }

    /// Replace every setting at once.
    pub fn config(mut self, config: RabbitMqConfig) -> Self {
        self.config = config;
        self
    }

    /// Connect to the broker.
    ///
    /// The first connection is tried once, within the connection timeout: a broker that is down
    /// is an error, not a hang. Later connection losses are repaired lazily (see the
    /// [module docs](self)).
    pub async fn connect(self) -> Result<RabbitMqTransport, TransportError> {
        validate_config(&self.config)?;
        let uri = AMQPUri::from_str(&self.uri)
            .map_err(|err| TransportError::new(TRANSPORT, format!("invalid AMQP URI: {err}")))?;
        let display_uri = redact(&uri);
        let connection = open_connection(&uri, &self.config).await.map_err(|err| {
            TransportError::new(
                TRANSPORT,
                format!("cannot connect to RabbitMQ at {display_uri}: {err}"),
            )
        })?;
        let status = connection.status().clone();
        let exchange = self.config.resolved_exchange().to_owned();
        Ok(RabbitMqTransport {
            inner: Arc::new(Inner {
                uri,
                display_uri,
                exchange,
                config: self.config,
                connection: Mutex::new(ConnectionSlot {
                    current: Some(Arc::new(connection)),
                    failures: 0,
                    retry_at: None,
                    last_error: String::new(),
                }),
                status: RwLock::new(status),
                publisher: Mutex::new(None),
            }),
        })
    }
}

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
    /// The status of the current connection, readable without awaiting (never held across an
    /// `.await`).
    status: RwLock<ConnectionStatus>,
    /// The confirm-mode channel every `publish` call uses, one call at a time.
    publisher: Mutex<Option<PublishChannel>>,
}

struct ConnectionSlot {
    current: Option<Arc<Connection>>,
    /// Failed reconnect attempts in a row.
    failures: u32,
    /// No new attempt before this instant.
    retry_at: Option<Instant>,
    last_error: String,
}

struct PublishChannel {
    channel: Channel,
    /// Set while a batch runs on the channel; still set afterwards means that batch was cancelled
    /// midway and the channel holds confirms nobody awaits.
    in_use: bool,
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

    /// The connection, reopened first if it was lost (subject to the reconnect backoff).
    pub async fn connection(&self) -> Result<Arc<Connection>, TransportError> {
        let mut slot = self.inner.connection.lock().await;
        if let Some(connection) = &slot.current
            && connection.status().connected()
        {
            return Ok(connection.clone());
        }
        let now = Instant::now();
        if let Some(retry_at) = slot.retry_at
            && now < retry_at
        {
            return Err(TransportError::new(
                TRANSPORT,
                format!(
                    "not connected to RabbitMQ at {}: the last attempt failed ({}); next attempt \
                     in {:?}",
                    self.inner.display_uri,
                    slot.last_error,
                    retry_at - now
                ),
            ));
        }
        let lost = slot.current.take().is_some();
        if lost {
            tracing::warn!(uri = %self.inner.display_uri, "connection to RabbitMQ lost; reconnecting");
        }
        match open_connection(&self.inner.uri, &self.inner.config).await {
            Ok(connection) => {
                if slot.failures > 0 || lost {
                    tracing::info!(uri = %self.inner.display_uri, "reconnected to RabbitMQ");
                }
                if let Ok(mut status) = self.inner.status.write() {
                    *status = connection.status().clone();
                }
                let connection = Arc::new(connection);
                *slot = ConnectionSlot {
                    current: Some(connection.clone()),
                    failures: 0,
                    retry_at: None,
                    last_error: String::new(),
                };
                Ok(connection)
            }
            Err(err) => {
                slot.failures = slot.failures.saturating_add(1);
                let backoff = RECONNECT_BACKOFF_BASE
                    .saturating_mul(1 << slot.failures.saturating_sub(1).min(16))
                    .min(RECONNECT_BACKOFF_CAP);
                slot.retry_at = Some(Instant::now() + backoff);
                slot.last_error = err.clone();
                tracing::warn!(
                    uri = %self.inner.display_uri,
                    error = %err,
                    failures = slot.failures,
                    ?backoff,
                    "cannot connect to RabbitMQ"
                );
                Err(TransportError::new(
                    TRANSPORT,
                    format!(
                        "cannot connect to RabbitMQ at {}: {err}",
                        self.inner.display_uri
                    ),
                ))
            }
        }
    }

    /// A new channel on the [`connection`](Self::connection), e.g. to inspect queues
    /// (`queue_declare` with `passive`). It closes when its last clone is dropped.
    pub async fn channel(&self) -> Result<Channel, TransportError> {
        let connection = self.connection().await?;
        match self.open_channel(&connection).await {
            Err(_) if !connection.status().connected() => {
                // The connection closed under us (the broker may close it at any time, e.g.
                // after a protocol error): reconnect once.
                drop(connection);
                let connection = self.connection().await?;
                self.open_channel(&connection).await
            }
            result => result,
        }
    }

    /// Declare the exchange, the durable queue of the consumer group `consumer` and its bindings
    /// for `event_types`, without consuming; returns the queue's name. Idempotent.
    ///
    /// From then on the queue keeps every event of those types for the group, even before its
    /// first [`subscribe`](Transport::subscribe): run it when provisioning, before producers
    /// publish. Bindings are only ever added; remove one that is no longer wanted with
    /// `rabbitmqadmin delete binding` or the management UI (a subscription acks and skips
    /// deliveries of types it did not ask for).
    pub async fn declare_consumer_queue(
        &self,
        consumer: &str,
        event_types: &[String],
    ) -> Result<String, TransportError> {
        let (queue, keys) = self.consumer_topology(consumer, event_types)?;
        let channel = self.channel().await?;
        let result = self.declare_topology(&channel, &queue, &keys).await;
        close_quietly(channel).await;
        result.map(|()| queue.to_string())
    }

    fn api_timeout(&self) -> Duration {
        API_TIMEOUT.max(self.inner.config.publish_timeout)
    }

    /// Runs one topology operation within the API timeout.
    async fn api<T>(
        &self,
        what: impl FnOnce() -> String,
        operation: impl Future<Output = lapin::Result<T>>,
    ) -> Result<T, ApiError> {
        let timeout = self.api_timeout();
        match tokio::time::timeout(timeout, operation).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(ApiError::Broker(what(), err)),
            Err(_elapsed) => Err(ApiError::Timeout(what(), timeout)),
        }
    }

    async fn open_channel(&self, connection: &Connection) -> Result<Channel, TransportError> {
        self.api(|| "open a channel".to_owned(), connection.create_channel())
            .await
            .map_err(|err| err.into_transport_error(&self.inner.display_uri))
    }

    /// Declares the exchange: durable, topic.
    async fn declare_exchange(&self, channel: &Channel) -> Result<(), TransportError> {
        let exchange = &self.inner.exchange;
        let options = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        self.api(
            || format!("declare exchange `{exchange}`"),
            channel.exchange_declare(
                short(exchange),
                ExchangeKind::Topic,
                options,
                FieldTable::default(),
            ),
        )
        .await
        .map_err(|err| match err.soft_error() {
            Some(AMQPSoftError::PRECONDITIONFAILED) => TransportError::new(
                TRANSPORT,
                format!(
                    "exchange `{exchange}` exists, but not as a durable topic exchange ({err}): \
                     delete it or configure another exchange or namespace"
                ),
            ),
            _ => err.into_transport_error(&self.inner.display_uri),
        })
    }

    /// The queue and the binding keys of a consumer group, checked.
    fn consumer_topology<'a>(
        &self,
        consumer: &str,
        event_types: &'a [String],
    ) -> Result<(ShortString, Vec<&'a str>), TransportError> {
        if consumer.is_empty() {
            return Err(TransportError::new(
                TRANSPORT,
                "the consumer name must not be empty",
            ));
        }
        let name = self.queue_name(consumer);
        let queue = ShortString::try_new(name.as_str()).map_err(|_| {
            TransportError::new(
                TRANSPORT,
                format!(
                    "consumer `{consumer}`: queue name `{name}` is {} bytes long; AMQP allows {MAX_NAME_BYTES}",
                    name.len()
                ),
            )
        })?;
        let mut keys: Vec<&str> = Vec::with_capacity(event_types.len());
        for event_type in event_types {
            if let Err(reason) = check_binding_key(event_type) {
                return Err(TransportError::new(
                    TRANSPORT,
                    format!("consumer `{consumer}`: {reason}"),
                ));
            }
            if !keys.contains(&event_type.as_str()) {
                keys.push(event_type.as_str());
            }
        }
        if keys.is_empty() {
            return Err(TransportError::new(
                TRANSPORT,
                format!("consumer `{consumer}` subscribes to no event type"),
            ));
        }
        Ok((queue, keys))
    }

    /// Declares the exchange, the queue and its bindings on `channel`.
    async fn declare_topology(
        &self,
        channel: &Channel,
        queue: &ShortString,
        keys: &[&str],
    ) -> Result<(), TransportError> {
        self.declare_exchange(channel).await?;
        let queue_type = self.inner.config.queue_type;
        let options = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        self.api(
            || format!("declare queue `{queue}`"),
            channel.queue_declare(queue.clone(), options, queue_type.arguments()),
        )
        .await
        .map_err(|err| match err.soft_error() {
            Some(AMQPSoftError::PRECONDITIONFAILED) => TransportError::new(
                TRANSPORT,
                format!(
                    "queue `{queue}` exists with other settings than a durable {queue_type:?} \
                     queue ({err}): configure the queue type it has, or delete it \
                     (`rabbitmqctl delete_queue {queue}`; its messages are lost) or use another \
                     consumer name"
                ),
            ),
            Some(AMQPSoftError::RESOURCELOCKED) => TransportError::new(
                TRANSPORT,
                format!("queue `{queue}` is exclusive to another connection ({err})"),
            ),
            _ => err.into_transport_error(&self.inner.display_uri),
        })?;
        let exchange = short(&self.inner.exchange);
        for key in keys {
            self.api(
                || format!("bind queue `{queue}` to exchange `{exchange}` with key `{key}`"),
                channel.queue_bind(
                    queue.clone(),
                    exchange.clone(),
                    short(key),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                ),
            )
            .await
            .map_err(|err| err.into_transport_error(&self.inner.display_uri))?;
        }
        Ok(())
    }

    /// The publish channel: the current one when it is usable, otherwise a new one in confirm
    /// mode (reconnecting first when needed), once the exchange is known to exist.
    async fn publish_channel(
        &self,
        slot: &mut Option<PublishChannel>,
    ) -> Result<Channel, PublishError> {
        if let Some(current) = slot.as_ref() {
            if !current.in_use && current.channel.status().connected() {
                return Ok(current.channel.clone());
            }
            if current.in_use {
                tracing::debug!("a publish was cancelled midway; replacing its channel");
            }
            *slot = None;
        }
        let uri = &self.inner.display_uri;
        let channel = self
            .channel()
            .await
            .map_err(|err| PublishError::Connection(err.message))?;
        // Check the exchange before publishing to it. A publish to a missing exchange makes the
        // broker close the channel, and lapin may still write publish frames queued for it after
        // its `close-ok`, which the broker answers by closing the whole connection.
        let exchange = &self.inner.exchange;
        let passive = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        self.api(
            || format!("check exchange `{exchange}`"),
            channel.exchange_declare(
                short(exchange),
                ExchangeKind::Topic,
                passive,
                FieldTable::default(),
            ),
        )
        .await
        .map_err(|err| match err.soft_error() {
            Some(AMQPSoftError::NOTFOUND) => PublishError::Rejected(format!(
                "exchange `{exchange}` does not exist (has `setup()` run?): {err}"
            )),
            Some(_) => PublishError::Rejected(format!("{err} (RabbitMQ at {uri})")),
            None => PublishError::Connection(format!("{err} (RabbitMQ at {uri})")),
        })?;
        self.api(
            || "enable publisher confirms".to_owned(),
            channel.confirm_select(ConfirmSelectOptions::default()),
        )
        .await
        .map_err(|err| PublishError::Connection(format!("{err} (RabbitMQ at {uri})")))?;
        *slot = Some(PublishChannel {
            channel: channel.clone(),
            in_use: false,
        });
        Ok(channel)
    }

    /// The routing key of a message, or why it cannot be sent at all.
    fn check_message(&self, message: &OutgoingMessage) -> Result<ShortString, PublishError> {
        let max = self.inner.config.max_message_size;
        if message.body.len() > max {
            return Err(PublishError::Permanent(format!(
                "event `{}` is {} bytes, more than the maximum message size of {max} bytes \
                 (`max_message_size`, which should match the broker's)",
                message.event_id,
                message.body.len()
            )));
        }
        if message.event_type.is_empty() {
            return Err(PublishError::Permanent(format!(
                "event `{}` has an empty event type, which cannot be a routing key",
                message.event_id
            )));
        }
        ShortString::try_new(message.event_type.as_str()).map_err(|_| {
            PublishError::Permanent(format!(
                "event type `{}` is {} bytes long; AMQP routing keys hold at most {MAX_NAME_BYTES}",
                message.event_type,
                message.event_type.len()
            ))
        })
    }

    fn properties(message: &OutgoingMessage, routing_key: &ShortString) -> BasicProperties {
        let event_id = message.event_id.to_string();
        let mut headers = FieldTable::default();
        headers.insert("ce-specversion".into(), long("1.0"));
        headers.insert("ce-id".into(), long(&event_id));
        headers.insert("ce-type".into(), long(&message.event_type));
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        BasicProperties::default()
            .with_content_type(CONTENT_TYPE.into())
            .with_delivery_mode(2)
            .with_message_id(event_id.into())
            .with_type(routing_key.clone())
            .with_timestamp(now)
            .with_app_id("outbox".into())
            .with_headers(headers)
    }

    fn publish_error(&self, err: &lapin::Error) -> PublishError {
        let exchange = &self.inner.exchange;
        match err.kind() {
            ErrorKind::ProtocolError(amqp) => match amqp.kind() {
                AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) => PublishError::Rejected(format!(
                    "exchange `{exchange}` does not exist (has `setup()` run?): {amqp}"
                )),
                AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) => PublishError::Rejected(
                    format!("the broker refused publishing to exchange `{exchange}`: {amqp}"),
                ),
                AMQPErrorKind::Soft(_) => {
                    PublishError::Rejected(format!("the broker closed the publish channel: {amqp}"))
                }
                AMQPErrorKind::Hard(_) => PublishError::Connection(format!(
                    "RabbitMQ at {} closed the connection: {amqp}",
                    self.inner.display_uri
                )),
            },
            _ => PublishError::Connection(format!(
                "publishing to RabbitMQ at {}: {err}",
                self.inner.display_uri
            )),
        }
    }

    /// Publishes `messages` on `channel` and awaits their confirms. See [`Transport::publish`].
    async fn publish_batch(&self, channel: &Channel, messages: &[OutgoingMessage]) -> Batch {
        let timeout = self.inner.config.publish_timeout;
        let exchange = short(&self.inner.exchange);
        let mandatory = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        let mut results: Vec<Option<Result<(), PublishError>>> = vec![None; messages.len()];
        let mut retire = false;

        // 1. Send everything; the confirms are awaited afterwards.
        let mut awaiting: Vec<(usize, PublisherConfirm, Instant)> =
            Vec::with_capacity(messages.len());
        let mut send_failure: Option<PublishError> = None;
        let mut unsent: Vec<usize> = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            if send_failure.is_some() {
                unsent.push(index);
                continue;
            }
            let routing_key = match self.check_message(message) {
                Ok(key) => key,
                Err(err) => {
                    results[index] = Some(Err(err));
                    continue;
                }
            };
            let properties = Self::properties(message, &routing_key);
            let deadline = Instant::now() + timeout;
            let send = channel.basic_publish(
                exchange.clone(),
                routing_key,
                mandatory,
                &message.body,
                properties,
            );
            match tokio::time::timeout_at(deadline, send).await {
                Ok(Ok(confirm)) => awaiting.push((index, confirm, deadline)),
                Ok(Err(err)) => {
                    retire = true;
                    send_failure = Some(self.publish_error(&err));
                    unsent.push(index);
                }
                Err(_elapsed) => {
                    retire = true;
                    send_failure = Some(PublishError::Timeout(timeout));
                    unsent.push(index);
                }
            }
        }

        // 2. Await every confirm, each until its own deadline.
        let mut returned: Vec<BasicReturnMessage> = Vec::new();
        let mut confirmed: Vec<(usize, bool)> = Vec::with_capacity(awaiting.len());
        let mut timed_out: Vec<PublisherConfirm> = Vec::new();
        let mut channel_failure: Option<PublishError> = None;
        for (index, mut confirm, deadline) in awaiting {
            match tokio::time::timeout_at(deadline, &mut confirm).await {
                Ok(Ok(Confirmation::Ack(message))) => {
                    returned.extend(message);
                    confirmed.push((index, true));
                }
                Ok(Ok(Confirmation::Nack(message))) => {
                    returned.extend(message);
                    confirmed.push((index, false));
                }
                Ok(Ok(Confirmation::NotRequested)) => {
                    retire = true;
                    results[index] = Some(Err(PublishError::Rejected(
                        "internal error: the publish channel is not in confirm mode".to_owned(),
                    )));
                }
                Ok(Err(err)) => {
                    retire = true;
                    let err = self.publish_error(&err);
                    channel_failure.get_or_insert_with(|| err.clone());
                    results[index] = Some(Err(err));
                }
                Err(_elapsed) => {
                    retire = true;
                    results[index] = Some(Err(PublishError::Timeout(timeout)));
                    timed_out.push(confirm);
                }
            }
        }

        // 3. After a timeout, close the channel so every confirm still pending resolves (acked,
        //    nacked or failed): a late one may carry the return of another message.
        let mut returns_complete = true;
        if !timed_out.is_empty() {
            let close = channel.close(REPLY_SUCCESS, "outbox: publisher confirm timeout".into());
            if tokio::time::timeout(CLOSE_TIMEOUT, close).await.is_err() {
                tracing::warn!(exchange = %self.inner.exchange, "closing a stalled publish channel timed out");
            }
            for confirm in timed_out {
                match confirm.now_or_never() {
                    Some(Ok(confirmation)) => returned.extend(confirmation.take_message()),
                    Some(Err(_)) => {}
                    None => returns_complete = false,
                }
            }
        }

        // 4. Match returns to messages by event id and routing key.
        let mut returns: HashMap<(String, String), String> = HashMap::new();
        for message in returned {
            let id = message
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.to_string())
                .unwrap_or_default();
            let key = message.delivery.routing_key.to_string();
            let reason = format!("{} {}", message.reply_code, message.reply_text);
            returns.insert((id, key), reason);
        }
        let mut matched = 0;
        for (index, acked) in confirmed {
            let message = &messages[index];
            let key = (message.event_id.to_string(), message.event_type.clone());
            results[index] = Some(if let Some(reason) = returns.get(&key) {
                matched += 1;
                Err(PublishError::Rejected(format!(
                    "unroutable: no queue is bound for routing key `{}` on exchange `{}` (the \
                     broker returned the message: {reason}); declare the consumers' queues \
                     before publishing",
                    message.event_type, self.inner.exchange
                )))
            } else if !acked {
                Err(PublishError::Rejected(format!(
                    "the broker refused to store the message (basic.nack), e.g. a queue bound \
                     for `{}` is full and rejects publishes",
                    message.event_type
                )))
            } else if !returns_complete {
                // A confirm that never resolved may hold this message's return: unknown.
                Err(PublishError::Timeout(timeout))
            } else {
                Ok(())
            });
        }
        if matched < returns.len() {
            tracing::warn!(
                exchange = %self.inner.exchange,
                unmatched = returns.len() - matched,
                "the broker returned messages that are not part of the batch"
            );
        }
        if let Some(failure) = channel_failure.or(send_failure) {
            for index in unsent {
                results[index] = Some(Err(failure.clone()));
            }
        }
        let results = results
            .into_iter()
            .map(|result| {
                result.unwrap_or_else(|| {
                    Err(PublishError::Rejected(
                        "internal error: no publish result".to_owned(),
                    ))
                })
            })
            .collect();
        Batch { results, retire }
    }
}

/// The outcome of one batch.
struct Batch {
    results: Vec<Result<(), PublishError>>,
    /// The channel must not be used again.
    retire: bool,
}

#[async_trait::async_trait]
impl Transport for RabbitMqTransport {
    fn name(&self) -> &'static str {
        TRANSPORT
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
        if messages.is_empty() {
            return Vec::new();
        }
        let mut slot = self.inner.publisher.lock().await;
        let channel = match self.publish_channel(&mut slot).await {
            Ok(channel) => channel,
            Err(err) => return vec![Err(err); messages.len()],
        };
        if let Some(current) = slot.as_mut() {
            current.in_use = true;
        }
        let batch = self.publish_batch(&channel, messages).await;
        match slot.as_mut() {
            Some(current) if !batch.retire => current.in_use = false,
            _ => *slot = None,
        }
        batch.results
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
        let (queue, keys) = self.consumer_topology(consumer, event_types)?;
        let channel = self.channel().await?;
        self.declare_topology(&channel, &queue, &keys).await?;
        let prefetch = self.inner.config.effective_prefetch(options);
        self.api(
            || format!("set the prefetch of a consumer of `{queue}`"),
            channel.basic_qos(prefetch, BasicQosOptions::default()),
        )
        .await
        .map_err(|err| err.into_transport_error(&self.inner.display_uri))?;
        let tag_consumer: String = consumer.chars().take(100).collect();
        let tag = format!("outbox:{tag_consumer}:{}", uuid::Uuid::new_v4().simple());
        let consumer_stream = self
            .api(
                || format!("consume queue `{queue}`"),
                channel.basic_consume(
                    queue.clone(),
                    ShortString::try_new(tag).unwrap_or_default(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                ),
            )
            .await
            .map_err(|err| err.into_transport_error(&self.inner.display_uri))?;
        tracing::debug!(
            queue = %queue,
            exchange = %self.inner.exchange,
            event_types = ?keys,
            prefetch,
            "subscribed"
        );
        Ok(Box::new(RabbitMqSubscription {
            queue: queue.to_string(),
            namespace: self.inner.config.namespace.clone(),
            event_types: keys.iter().map(|key| (*key).to_owned()).collect(),
            consumer: consumer_stream,
            _channel: channel,
            finished: false,
        }))
    }

    /// The connection is open (reopened if it was lost), the broker does not block publishers,
    /// and it answers a passive declare of the exchange (which fails when `setup()` has not run).
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
        close_quietly(channel).await;
        result.map_err(|err| match err.soft_error() {
            Some(AMQPSoftError::NOTFOUND) => TransportError::new(
                TRANSPORT,
                format!("exchange `{exchange}` does not exist (has `setup()` run?): {err}"),
            ),
            _ => err.into_transport_error(&self.inner.display_uri),
        })
    }
}

/// A failed topology operation.
enum ApiError {
    Broker(String, lapin::Error),
    Timeout(String, Duration),
}

impl ApiError {
    fn soft_error(&self) -> Option<AMQPSoftError> {
        match self {
            ApiError::Broker(_, err) => match err.kind() {
                ErrorKind::ProtocolError(amqp) => match amqp.kind() {
                    AMQPErrorKind::Soft(soft) => Some(soft.clone()),
                    AMQPErrorKind::Hard(_) => None,
                },
                _ => None,
            },
            ApiError::Timeout(..) => None,
        }
    }

    fn into_transport_error(self, uri: &str) -> TransportError {
        TransportError::new(TRANSPORT, format!("{self} (RabbitMQ at {uri})"))
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiError::Broker(what, err) => write!(f, "cannot {what}: {err}"),
            ApiError::Timeout(what, timeout) => {
                write!(f, "cannot {what}: no answer within {timeout:?}")
            }
        }
    }
}

async fn open_connection(uri: &AMQPUri, config: &RabbitMqConfig) -> Result<Connection, String> {
    let properties = ConnectionProperties::default()
        .with_connection_name(config.connection_name.as_str().into());
    let connect = Connection::connect_uri(uri.clone(), properties);
    match tokio::time::timeout(config.connection_timeout, connect).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_elapsed) => Err(format!("no answer within {:?}", config.connection_timeout)),
    }
}

/// Closes a short-lived channel; failures do not matter (it closes when dropped anyway).
async fn close_quietly(channel: Channel) {
    if channel.status().connected() {
        let _ =
            tokio::time::timeout(CLOSE_TIMEOUT, channel.close(REPLY_SUCCESS, "OK".into())).await;
    }
}

/// `scheme://user@host:port (vhost `…`)`: the URI without its password.
fn redact(uri: &AMQPUri) -> String {
    format!(
        "{}://{}@{}:{} (vhost `{}`)",
        uri.scheme,
        uri.authority.userinfo.username,
        uri.authority.host,
        uri.authority.port,
        uri.vhost
    )
}

/// An AMQP short string from a name already checked to fit.
fn short(name: &str) -> ShortString {
    ShortString::try_new(name).unwrap_or_default()
}

fn long(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// Whether `event_type` can be a binding key that matches exactly that routing key.
fn check_binding_key(event_type: &str) -> Result<(), String> {
    if event_type.is_empty() {
        return Err("an empty event type cannot be a binding key".to_owned());
    }
    if event_type.len() > MAX_NAME_BYTES {
        return Err(format!(
            "event type `{event_type}` is {} bytes long; AMQP binding keys hold at most \
             {MAX_NAME_BYTES}",
            event_type.len()
        ));
    }
    if event_type.split('.').any(|word| word == "*" || word == "#") {
        return Err(format!(
            "event type `{event_type}` contains a `*` or `#` word, which a topic exchange reads \
             as a wildcard"
        ));
    }
    Ok(())
}

fn validate_config(config: &RabbitMqConfig) -> Result<(), TransportError> {
    if config.namespace.is_empty() {
        return Err(TransportError::new(
            TRANSPORT,
            "the namespace must not be empty",
        ));
    }
    let exchange = config.resolved_exchange();
    if exchange.is_empty() || exchange.len() > MAX_NAME_BYTES {
        return Err(TransportError::new(
            TRANSPORT,
            format!(
                "exchange name `{exchange}` must be 1 to {MAX_NAME_BYTES} bytes long (it is {})",
                exchange.len()
            ),
        ));
    }
    if exchange.starts_with("amq.") {
        return Err(TransportError::new(
            TRANSPORT,
            format!(
                "exchange name `{exchange}` is reserved: names starting with `amq.` belong to the broker"
            ),
        ));
    }
    Ok(())
}

/// The broker's count of earlier deliveries (`x-delivery-count`, quorum queues) plus one;
/// otherwise 2 when the message is flagged redelivered, 1 when not.
fn delivery_count(delivery: &lapin::message::Delivery) -> u32 {
    let counted = delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get("x-delivery-count"))
        .and_then(amqp_u32);
    match counted {
        Some(earlier) => earlier.saturating_add(1),
        None if delivery.redelivered => 2,
        None => 1,
    }
}

fn amqp_u32(value: &AMQPValue) -> Option<u32> {
    match value {
        AMQPValue::ShortShortUInt(n) => Some(u32::from(*n)),
        AMQPValue::ShortUInt(n) => Some(u32::from(*n)),
        AMQPValue::LongUInt(n) => Some(*n),
        AMQPValue::ShortShortInt(n) => u32::try_from(*n).ok(),
        AMQPValue::ShortInt(n) => u32::try_from(*n).ok(),
        AMQPValue::LongInt(n) => u32::try_from(*n).ok(),
        AMQPValue::LongLongInt(n) => u32::try_from(*n).ok(),
        _ => None,
    }
}

/// The deliveries of one consumer on its own channel; dropping it closes the channel, and the
/// broker requeues whatever was not acked.
struct RabbitMqSubscription {
    queue: String,
    namespace: String,
    /// Routing keys handed out; others are acked and skipped.
    event_types: HashSet<String>,
    consumer: Consumer,
    _channel: Channel,
    finished: bool,
}

impl fmt::Debug for RabbitMqSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitMqSubscription")
            .field("queue", &self.queue)
            .field("consumer_tag", &self.consumer.tag())
            .field("event_types", &self.event_types)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl Subscription for RabbitMqSubscription {
    async fn next(&mut self) -> Option<Result<Delivery, TransportError>> {
        loop {
            if self.finished {
                return None;
            }
            let delivery = match self.consumer.next().await {
                Some(Ok(delivery)) => delivery,
                Some(Err(err)) => {
                    self.finished = true;
                    return Some(Err(TransportError::new(
                        TRANSPORT,
                        format!(
                            "consuming queue `{}` failed: {err}; unacked deliveries return to \
                             the queue, subscribe again",
                            self.queue
                        ),
                    )));
                }
                None => {
                    // Cancelled: the channel closed or the queue was deleted.
                    self.finished = true;
                    return None;
                }
            };
            if delivery.acker.poisoned() {
                // Received before its channel closed: it cannot be acked, and the broker
                // redelivers it.
                continue;
            }
            if !self.event_types.contains(delivery.routing_key.as_str()) {
                // A binding of an earlier subscription of this group: settle and skip it.
                if let Err(err) = delivery.acker.ack(BasicAckOptions::default()).await {
                    tracing::warn!(
                        queue = %self.queue,
                        routing_key = %delivery.routing_key,
                        error = %err,
                        "could not ack a skipped delivery; it will be redelivered and skipped again"
                    );
                }
                continue;
            }
            let delivery_count = delivery_count(&delivery);
            let lapin::message::Delivery {
                routing_key,
                properties,
                data,
                acker,
                ..
            } = delivery;
            let message_id = properties.message_id().as_ref().map(|id| id.to_string());
            return Some(Ok(Delivery::new(
                Bytes::from(data),
                routing_name(&self.namespace, routing_key.as_str()),
                message_id,
                delivery_count,
                Box::new(RabbitMqAcker {
                    acker,
                    queue: self.queue.clone(),
                }),
            )));
        }
    }
}

/// Settles one delivery. `basic.ack` and `basic.nack` have no reply in AMQP 0-9-1: the calls
/// return once the frame is handed to the connection.
struct RabbitMqAcker {
    acker: lapin::Acker,
    queue: String,
}

impl RabbitMqAcker {
    fn settled(&self, what: &str, result: lapin::Result<bool>) -> Result<(), TransportError> {
        match result {
            Ok(true) => Ok(()),
            Ok(false) => Err(TransportError::new(
                TRANSPORT,
                format!(
                    "cannot {what} a delivery from queue `{}`: it was already settled, or its \
                     channel closed (then the broker redelivers it)",
                    self.queue
                ),
            )),
            Err(err) => Err(TransportError::new(
                TRANSPORT,
                format!(
                    "{what} of a delivery from queue `{}` failed: {err}",
                    self.queue
                ),
            )),
        }
    }
}

const REQUEUE: BasicNackOptions = BasicNackOptions {
    multiple: false,
    requeue: true,
};

#[async_trait::async_trait]
impl super::Acker for RabbitMqAcker {
    async fn ack(&self) -> Result<(), TransportError> {
        let result = self.acker.ack(BasicAckOptions::default()).await;
        self.settled("ack", result)
    }

    /// Requeues the message at once, or after `delay` from a timer task (the call then returns
    /// at once; the delivery keeps its prefetch slot until the nack is sent).
    async fn nack(&self, delay: Option<Duration>) -> Result<(), TransportError> {
        let Some(delay) = delay.filter(|delay| !delay.is_zero()) else {
            let result = self.acker.nack(REQUEUE).await;
            return self.settled("nack", result);
        };
        if !self.acker.usable() {
            return self.settled("nack", Ok(false));
        }
        let acker = self.acker.clone();
        let queue = self.queue.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            match acker.nack(REQUEUE).await {
                Ok(true) => {}
                Ok(false) => tracing::debug!(
                    queue = %queue,
                    "delayed nack skipped: the channel closed, so the broker redelivers anyway"
                ),
                Err(err) => tracing::warn!(queue = %queue, error = %err, "delayed nack failed"),
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_are_sanitized() {
        assert_eq!(queue_name("outbox", "inventory"), "outbox.inventory");
        assert_eq!(
            queue_name("shop.eu", "billing v2/*"),
            "shop.eu.billing_v2__"
        );
        assert_eq!(queue_name("ns", "ünï"), "ns._n_");
    }

    #[test]
    fn the_exchange_defaults_to_the_namespace() {
        assert_eq!(RabbitMqConfig::default().resolved_exchange(), "outbox");
        let config = RabbitMqConfig::default().namespace("shop");
        assert_eq!(config.resolved_exchange(), "shop");
        assert_eq!(config.exchange("events").resolved_exchange(), "events");
    }

    #[test]
    fn configs_are_checked() {
        assert!(validate_config(&RabbitMqConfig::default()).is_ok());
        assert!(validate_config(&RabbitMqConfig::default().namespace("")).is_err());
        assert!(validate_config(&RabbitMqConfig::default().exchange("amq.topic")).is_err());
        assert!(validate_config(&RabbitMqConfig::default().exchange("x".repeat(256))).is_err());
    }

    #[test]
    fn binding_keys_cannot_be_wildcards() {
        assert!(check_binding_key("order.placed").is_ok());
        assert!(check_binding_key("order.pl*ced").is_ok());
        assert!(check_binding_key("order.*").is_err());
        assert!(check_binding_key("#").is_err());
        assert!(check_binding_key("").is_err());
        assert!(check_binding_key(&"x".repeat(256)).is_err());
    }

    #[test]
    fn prefetch_follows_max_in_flight_unless_configured() {
        let options = |max_in_flight| SubscribeOptions {
            max_in_flight,
            ..SubscribeOptions::default()
        };
        let config = RabbitMqConfig::default();
        assert_eq!(config.effective_prefetch(&options(256)), 256);
        assert_eq!(config.effective_prefetch(&options(0)), 1);
        assert_eq!(config.effective_prefetch(&options(1 << 20)), u16::MAX);
        assert_eq!(config.prefetch(8).effective_prefetch(&options(256)), 8);
    }

    #[test]
    fn uris_are_shown_without_the_password() {
        let uri = AMQPUri::from_str("amqp://app:s3cret@broker:5673/prod").expect("uri");
        let shown = redact(&uri);
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("app@broker:5673"), "{shown}");
    }

    #[test]
    fn delivery_counts_come_from_the_header_or_the_flag() {
        let mut delivery =
            lapin::message::Delivery::mock(1, "x".into(), "order.placed".into(), false, vec![]);
        assert_eq!(delivery_count(&delivery), 1);
        delivery.redelivered = true;
        assert_eq!(delivery_count(&delivery), 2);
        let mut headers = FieldTable::default();
        headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(4));
        delivery.properties = BasicProperties::default().with_headers(headers);
        assert_eq!(delivery_count(&delivery), 5);
    }
}
