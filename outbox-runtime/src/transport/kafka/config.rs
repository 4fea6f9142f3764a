//! Settings of the Kafka transport: [`KafkaConfig`] with its defaults and checks, how events map
//! to topics ([`KafkaRouting`]), and [`KafkaTransportBuilder`].

use std::{collections::BTreeMap, time::Duration};

use super::{KafkaTransport, TRANSPORT};
use crate::transport::KafkaTopics;
use crate::transport::{DEFAULT_NAMESPACE, TransportError, check_nonzero};

/// Default partitions of a topic `setup` creates.
pub const DEFAULT_PARTITIONS: i32 = 6;

/// Default time a publish waits for its delivery reports (`message.timeout.ms`: librdkafka's
/// own retries happen within it).
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Default time a metadata request, a topic creation or a health check waits for the broker.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Default consumer session timeout: a consumer not heard from for this long leaves its group
/// and its partitions go to the others.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// Default largest message the producer sends (librdkafka's and the broker's default
/// `message.max.bytes`).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 1_000_000;

/// How events map to topics. Whatever the routing, the message key is the aggregate id and the
/// partitioner is murmur2 (as Java clients'), so the events of one aggregate that share a topic
/// share a partition and stay in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum KafkaRouting {
    /// `{namespace}.{aggregate type}`: every event of an aggregate, whatever its type, in one
    /// topic and (by key) one partition, so consumers see an aggregate's events in order across
    /// types. A consumer reads the topics of the aggregate types of the event types it handles
    /// (known from `#[derive(DomainEvent)]`) and skips other types. The default.
    #[default]
    AggregateType,
    /// `{namespace}.{event type}`: a topic per event type. Order holds per event type only: a
    /// consumer of `order.placed` and `order.shipped` may see a shipment before its placement.
    EventType,
    /// One topic for every event of the namespace.
    Topic(String),
}

/// Settings of a [`KafkaTransport`].
///
/// ```
/// use std::time::Duration;
/// use outbox_runtime::transport::kafka::{KafkaConfig, KafkaRouting};
///
/// let config = KafkaConfig::default()
///     .namespace("shop")
///     .partitions(12)
///     .replication_factor(3)
///     .publish_timeout(Duration::from_secs(5));
/// assert_eq!(config.topic_for("order.placed", "order"), "shop.order");
/// let by_type = config.routing(KafkaRouting::EventType);
/// assert_eq!(by_type.topic_for("order.placed", "order"), "shop.order.placed");
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct KafkaConfig {
    /// Topics are named under this prefix (see [`KafkaRouting`]). Default
    /// [`DEFAULT_NAMESPACE`] (`outbox`).
    pub(crate) namespace: String,
    /// How events map to topics. Default [`KafkaRouting::AggregateType`].
    pub(crate) routing: KafkaRouting,
    /// Partitions of a topic `setup` creates. Default [`DEFAULT_PARTITIONS`] (6).
    pub(crate) partitions: i32,
    /// Replication factor of a topic `setup` creates; `None` leaves it to the broker's
    /// `default.replication.factor`. Default `None`.
    pub(crate) replication_factor: Option<i32>,
    /// How long a publish waits for its delivery reports. Default 10 s.
    pub(crate) publish_timeout: Duration,
    /// How long metadata requests, topic creation and health checks wait. Default 10 s.
    pub(crate) request_timeout: Duration,
    /// Consumer session timeout. Default 10 s.
    pub(crate) session_timeout: Duration,
    /// Largest message sent; a larger one is refused before it is sent (the event goes DEAD,
    /// naming its size and this limit). Keep it at or below the topics' `max.message.bytes`.
    /// Default [`DEFAULT_MAX_MESSAGE_BYTES`].
    pub(crate) max_message_bytes: usize,
    /// Further librdkafka properties, applied to the producer, the consumers and the admin
    /// client after the transport's own (security, SASL, client ids, tuning).
    pub(crate) client_properties: BTreeMap<String, String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            namespace: DEFAULT_NAMESPACE.to_owned(),
            routing: KafkaRouting::AggregateType,
            partitions: DEFAULT_PARTITIONS,
            replication_factor: None,
            publish_timeout: DEFAULT_PUBLISH_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            client_properties: BTreeMap::new(),
        }
    }
}

impl KafkaConfig {
    /// Name topics under `namespace`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Map events to topics this way.
    pub fn routing(mut self, routing: KafkaRouting) -> Self {
        self.routing = routing;
        self
    }

    /// Create topics with this many partitions.
    pub fn partitions(mut self, partitions: i32) -> Self {
        self.partitions = partitions;
        self
    }

    /// Create topics with this replication factor (instead of the broker's default).
    pub fn replication_factor(mut self, factor: i32) -> Self {
        self.replication_factor = Some(factor);
        self
    }

    /// Set how long a publish waits for its delivery reports.
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// Set how long metadata requests, topic creation and health checks wait.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Set the consumer session timeout.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Set the largest message sent.
    pub fn max_message_bytes(mut self, bytes: usize) -> Self {
        self.max_message_bytes = bytes;
        self
    }

    /// Set a librdkafka property on every client (e.g. `security.protocol`, `sasl.mechanism`).
    /// The properties the transport's guarantees rest on (`enable.idempotence`, `acks`,
    /// `enable.auto.commit`, `enable.auto.offset.store`) cannot be overridden.
    pub fn client_property(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.client_properties.insert(name.into(), value.into());
        self
    }

    /// The topic an event is published to.
    pub fn topic_for(&self, event_type: &str, aggregate_type: &str) -> String {
        self.topics()
            .topic(&self.namespace, event_type, aggregate_type)
    }

    /// The routing, as the event catalogue describes it.
    pub(crate) fn topics(&self) -> KafkaTopics {
        match &self.routing {
            KafkaRouting::AggregateType => KafkaTopics::AggregateType,
            KafkaRouting::EventType => KafkaTopics::EventType,
            KafkaRouting::Topic(topic) => KafkaTopics::Topic(topic.clone()),
        }
    }
}

/// Properties a user may not override: the delivery and commit guarantees rest on them.
pub(super) const FIXED_PROPERTIES: [&str; 6] = [
    "enable.idempotence",
    "acks",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "bootstrap.servers",
    "group.id",
];

pub(super) fn validate_config(config: &KafkaConfig) -> Result<(), TransportError> {
    check_nonzero(
        TRANSPORT,
        &[
            ("publish_timeout", config.publish_timeout),
            ("request_timeout", config.request_timeout),
            ("session_timeout", config.session_timeout),
        ],
    )?;
    let problem = if config.namespace.is_empty() {
        Some("the namespace must not be empty".to_owned())
    } else if matches!(&config.routing, KafkaRouting::Topic(t) if t.is_empty()) {
        Some("the single topic's name must not be empty".to_owned())
    } else if config.partitions < 1 {
        Some(format!(
            "`partitions` must be at least 1, got {}",
            config.partitions
        ))
    } else if config.replication_factor.is_some_and(|f| f < 1) {
        Some("`replication_factor` must be at least 1".to_owned())
    } else if config.max_message_bytes < 1_000 {
        Some(format!(
            "`max_message_bytes` must be at least 1000, got {}",
            config.max_message_bytes
        ))
    } else if config.session_timeout < Duration::from_secs(1) {
        Some("`session_timeout` must be at least 1 s".to_owned())
    } else {
        config
            .client_properties
            .keys()
            .find(|k| FIXED_PROPERTIES.contains(&k.as_str()))
            .map(|k| {
                format!(
                    "the client property `{k}` is set by the transport and cannot be overridden"
                )
            })
    };
    match problem {
        Some(problem) => Err(TransportError::new(TRANSPORT, problem)),
        None => Ok(()),
    }
}

/// Builds a [`KafkaTransport`]. Created by [`KafkaTransport::builder`].
#[derive(Debug, Clone)]
pub struct KafkaTransportBuilder {
    pub(super) bootstrap_servers: String,
    pub(super) config: KafkaConfig,
}

impl KafkaTransportBuilder {
    delegate_setters! {
        /// Name topics under `namespace`. Default `outbox`.
        namespace: impl Into<String>;
        /// Map events to topics this way. Default a topic per aggregate type.
        routing: KafkaRouting;
        /// Partitions of the topics `setup` creates. Default 6.
        partitions: i32;
        /// Replication factor of the topics `setup` creates. Default the broker's.
        replication_factor: i32;
        /// How long a publish waits for its delivery reports. Default 10 s.
        publish_timeout: Duration;
        /// How long metadata requests, topic creation and health checks wait. Default 10 s.
        request_timeout: Duration;
        /// Consumer session timeout. Default 10 s.
        session_timeout: Duration;
        /// Largest message sent. Default 1,000,000 bytes.
        max_message_bytes: usize;
    }

    /// Set a librdkafka property on every client (see [`KafkaConfig::client_property`]).
    pub fn client_property(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.config = self.config.client_property(name, value);
        self
    }

    /// Replace every setting at once.
    pub fn config(mut self, config: KafkaConfig) -> Self {
        self.config = config;
        self
    }

    /// Create the producer and check that the broker answers.
    pub async fn connect(self) -> Result<KafkaTransport, TransportError> {
        KafkaTransport::new(self.bootstrap_servers, self.config).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_follow_the_routing() {
        let config = KafkaConfig::default();
        assert_eq!(config.topic_for("order.placed", "order"), "outbox.order");
        let config = config.namespace("shop").routing(KafkaRouting::EventType);
        assert_eq!(
            config.topic_for("order.placed", "order"),
            "shop.order.placed"
        );
        let config = config.routing(KafkaRouting::Topic("all-events".into()));
        assert_eq!(config.topic_for("order.placed", "order"), "all-events");
    }

    #[test]
    fn invalid_settings_are_refused() {
        assert!(validate_config(&KafkaConfig::default()).is_ok());
        for bad in [
            KafkaConfig::default().namespace(""),
            KafkaConfig::default().routing(KafkaRouting::Topic(String::new())),
            KafkaConfig::default().partitions(0),
            KafkaConfig::default().replication_factor(0),
            KafkaConfig::default().publish_timeout(Duration::ZERO),
            KafkaConfig::default().session_timeout(Duration::from_millis(10)),
            KafkaConfig::default().max_message_bytes(10),
            KafkaConfig::default().client_property("enable.auto.commit", "true"),
        ] {
            assert!(validate_config(&bad).is_err(), "{bad:?}");
        }
        assert!(
            validate_config(&KafkaConfig::default().client_property("security.protocol", "ssl"))
                .is_ok()
        );
    }
}
