//! Settings of the RabbitMQ transport: [`RabbitMqConfig`] with its defaults and checks, the
//! kind of consumer queues ([`QueueType`]), and [`RabbitMqTransportBuilder`], which connects.

use std::{
    fmt,
    str::FromStr,
    sync::{Arc, RwLock, atomic::AtomicU64},
    time::Duration,
};

use lapin::{
    types::{AMQPValue, FieldTable},
    uri::AMQPUri,
};
use tokio::sync::Mutex;

use super::{
    Inner, MAX_NAME_BYTES, RabbitMqTransport, TRANSPORT,
    connection::{ConnectionSlot, open_connection, redact},
};
use crate::transport::{DEFAULT_NAMESPACE, SubscribeOptions, TransportError};

/// Default time to wait for a publisher confirm.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Default time to wait for the TCP connection and the AMQP handshake.
pub const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// Default AMQP heartbeat timeout asked of the broker.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);

/// Default time a broker operation other than a publish waits for its answer.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest AMQP heartbeat timeout (a 16-bit number of seconds).
const MAX_HEARTBEAT: Duration = Duration::from_secs(u16::MAX as u64);

/// Default time after a connection opens during which a message returned unroutable is taken
/// for a broker still restoring its bindings (see [`RabbitMqConfig::recovery_grace`]).
pub const DEFAULT_RECOVERY_GRACE: Duration = Duration::from_secs(10);

/// Default largest message published: RabbitMQ's default `max_message_size` (128 MiB).
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 128 * 1024 * 1024;

/// Default connection name, shown by `rabbitmqctl list_connections client_properties` and in the
/// management UI.
pub const DEFAULT_CONNECTION_NAME: &str = "outbox";

/// The kind of queue consumer groups get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum QueueType {
    /// A durable classic queue. Redeliveries are only flagged, so
    /// [`Delivery::delivery_count`](crate::transport::Delivery::delivery_count) is 1 or 2.
    #[default]
    Classic,
    /// A quorum queue (`x-queue-type: quorum`, replicated on clusters). The broker counts
    /// deliveries, so [`Delivery::delivery_count`](crate::transport::Delivery::delivery_count) is
    /// exact. RabbitMQ 4 gives quorum queues a default delivery limit (20), after which a message
    /// is dropped or dead-lettered.
    Quorum,
}

impl QueueType {
    pub(super) fn arguments(self) -> FieldTable {
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
    pub(crate) namespace: String,
    /// The topic exchange events are published to; `None` uses the namespace.
    pub(crate) exchange: Option<String>,
    /// How long a publish waits for its confirm before it is reported as
    /// [`PublishError::Timeout`](crate::transport::PublishError::Timeout). A connection that
    /// leaves a confirm unanswered that long is taken for dead and replaced at the next call.
    /// Default [`DEFAULT_PUBLISH_TIMEOUT`] (10 s).
    pub(crate) publish_timeout: Duration,
    /// How long connecting may take. Default [`DEFAULT_CONNECTION_TIMEOUT`] (5 s).
    pub(crate) connection_timeout: Duration,
    /// The AMQP heartbeat timeout asked of the broker, in whole seconds (rounded up; at most
    /// 65,535 s). Both sides send heartbeats when otherwise idle, and a connection from which
    /// nothing arrived for twice this long, as one that went silent without closing (a
    /// partition, a dead host), is closed by the client: its subscriptions end with an error and
    /// the next call reconnects. The broker may ask for less (the lower of both is used). A
    /// `heartbeat` query parameter in the URI takes precedence. Default [`DEFAULT_HEARTBEAT`]
    /// (10 s).
    pub(crate) heartbeat: Duration,
    /// How long a broker operation other than a publish waits for its answer: opening a
    /// channel, declares, bindings, `basic.qos`, `basic.consume`, the health check's passive
    /// declare. A connection that leaves one unanswered that long is taken for dead and
    /// replaced at the next call. Default [`DEFAULT_RESPONSE_TIMEOUT`] (10 s).
    pub(crate) response_timeout: Duration,
    /// Unacked deliveries per subscription; `None` uses [`SubscribeOptions::max_in_flight`].
    pub(crate) prefetch: Option<u16>,
    /// The kind of consumer queues declared. Default [`QueueType::Classic`]. An existing queue
    /// keeps its kind: the broker refuses to redeclare it as another one.
    pub(crate) queue_type: QueueType,
    /// Messages larger than this fail with
    /// [`PublishError::Permanent`](crate::transport::PublishError::Permanent) without being sent.
    /// Keep it at or below the broker's `max_message_size`: RabbitMQ answers a larger message by
    /// closing the channel, which fails the whole batch. Default [`DEFAULT_MAX_MESSAGE_SIZE`].
    pub(crate) max_message_size: usize,
    /// The connection name the broker shows. Default [`DEFAULT_CONNECTION_NAME`].
    pub(crate) connection_name: String,
    /// How long after a connection opens a message the broker returns as unroutable is reported
    /// as [`PublishError::Connection`](crate::transport::PublishError::Connection) (the broker
    /// is not ready: the relay spends no attempt and waits) rather than
    /// [`PublishError::Rejected`](crate::transport::PublishError::Rejected). A broker that
    /// restarts after a crash accepts connections while it still recovers its durable queues,
    /// and restores a queue's bindings only once that queue is back: until then a publish to it
    /// comes back unroutable. Zero turns this off. Default [`DEFAULT_RECOVERY_GRACE`] (10 s).
    pub(crate) recovery_grace: Duration,
}

impl Default for RabbitMqConfig {
    fn default() -> Self {
        RabbitMqConfig {
            namespace: DEFAULT_NAMESPACE.to_owned(),
            exchange: None,
            publish_timeout: DEFAULT_PUBLISH_TIMEOUT,
            connection_timeout: DEFAULT_CONNECTION_TIMEOUT,
            heartbeat: DEFAULT_HEARTBEAT,
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            prefetch: None,
            queue_type: QueueType::Classic,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            connection_name: DEFAULT_CONNECTION_NAME.to_owned(),
            recovery_grace: DEFAULT_RECOVERY_GRACE,
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

    /// Set the AMQP heartbeat timeout asked of the broker (whole seconds, rounded up).
    pub fn heartbeat(mut self, timeout: Duration) -> Self {
        self.heartbeat = timeout;
        self
    }

    /// Set how long a broker operation other than a publish waits for its answer.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
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

    /// Set how long after a connection opens an unroutable return says the broker is not
    /// ready rather than that no queue is bound (zero: never).
    pub fn recovery_grace(mut self, grace: Duration) -> Self {
        self.recovery_grace = grace;
        self
    }

    /// The exchange in use: [`exchange`](Self::exchange) when set, otherwise the namespace.
    pub fn resolved_exchange(&self) -> &str {
        self.exchange.as_deref().unwrap_or(&self.namespace)
    }

    /// The heartbeat timeout in whole seconds, as AMQP negotiates it: [`heartbeat`](Self::heartbeat)
    /// rounded up, within 1 ..= 65,535.
    pub fn heartbeat_seconds(&self) -> u16 {
        let seconds = self.heartbeat.as_secs() + u64::from(self.heartbeat.subsec_nanos() > 0);
        u16::try_from(seconds.max(1)).unwrap_or(u16::MAX)
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

/// Builds a [`RabbitMqTransport`]. Created by [`RabbitMqTransport::builder`].
#[derive(Clone)]
pub struct RabbitMqTransportBuilder {
    pub(super) uri: String,
    pub(super) config: RabbitMqConfig,
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
        /// Ask the broker for this AMQP heartbeat timeout (whole seconds, rounded up): a
        /// connection silent for twice as long is closed and replaced. Default 10 s.
        heartbeat: Duration;
        /// Wait this long for the answer to an operation other than a publish (channel open,
        /// declares, binds, consume, health check) before the connection is replaced. Default
        /// 10 s.
        response_timeout: Duration;
        /// Hold at most `prefetch` unacked deliveries per subscription. Default:
        /// `SubscribeOptions::max_in_flight`.
        prefetch: u16;
        /// Declare consumer queues of this kind. Default classic.
        queue_type: QueueType;
        /// Refuse messages larger than `bytes` without sending them. Default 128 MiB.
        max_message_size: usize;
        /// Name the connection. Default `outbox`.
        connection_name: impl Into<String>;
        /// For this long after a connection opens, a message returned unroutable is taken for
        /// a broker still restoring its bindings after a restart: reported as a connection
        /// failure (no attempt spent), not a rejection. Zero turns it off. Default 10 s.
        recovery_grace: Duration;
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
    /// [module docs](super)).
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
                    generation: 1,
                    failures: 0,
                    retry_at: None,
                    last_error: String::new(),
                }),
                generation: AtomicU64::new(1),
                opened_at: std::sync::Mutex::new(tokio::time::Instant::now()),
                status: RwLock::new(status),
                publisher: Mutex::new(None),
            }),
        })
    }
}

pub(super) fn validate_config(config: &RabbitMqConfig) -> Result<(), TransportError> {
    if config.namespace.is_empty() {
        return Err(TransportError::new(
            TRANSPORT,
            "the namespace must not be empty",
        ));
    }
    crate::transport::check_nonzero(
        TRANSPORT,
        &[
            ("publish_timeout", config.publish_timeout),
            ("connection_timeout", config.connection_timeout),
            ("heartbeat", config.heartbeat),
            ("response_timeout", config.response_timeout),
        ],
    )?;
    if config.heartbeat > MAX_HEARTBEAT {
        return Err(TransportError::new(
            TRANSPORT,
            format!(
                "`heartbeat` must be at most {MAX_HEARTBEAT:?} (AMQP counts it in 16-bit \
                 seconds), got {:?}",
                config.heartbeat
            ),
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

#[cfg(test)]
mod tests {
    use super::*;

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
        for zero in [
            RabbitMqConfig::default().publish_timeout(Duration::ZERO),
            RabbitMqConfig::default().connection_timeout(Duration::ZERO),
            RabbitMqConfig::default().heartbeat(Duration::ZERO),
            RabbitMqConfig::default().response_timeout(Duration::ZERO),
        ] {
            assert!(validate_config(&zero).is_err(), "{zero:?}");
        }
        assert!(
            validate_config(&RabbitMqConfig::default().heartbeat(Duration::from_secs(65_536)))
                .is_err()
        );
    }

    #[test]
    fn heartbeats_are_whole_seconds() {
        let seconds = |d| RabbitMqConfig::default().heartbeat(d).heartbeat_seconds();
        assert_eq!(RabbitMqConfig::default().heartbeat_seconds(), 10);
        assert_eq!(seconds(Duration::from_millis(1)), 1);
        assert_eq!(seconds(Duration::from_millis(1_500)), 2);
        assert_eq!(seconds(Duration::from_secs(65_535)), u16::MAX);
    }

    #[test]
    fn prefetch_follows_max_in_flight_unless_configured() {
        let options = |max_in_flight| SubscribeOptions::default().max_in_flight(max_in_flight);
        let config = RabbitMqConfig::default();
        assert_eq!(config.effective_prefetch(&options(256)), 256);
        assert_eq!(config.effective_prefetch(&options(0)), 1);
        assert_eq!(config.effective_prefetch(&options(1 << 20)), u16::MAX);
        assert_eq!(config.prefetch(8).effective_prefetch(&options(256)), 8);
    }
}
