//! Where a transport publishes each event type, as the event catalogue's AsyncAPI document
//! describes it ([`AsyncApi`](crate::catalogue::AsyncApi)).

use super::routing_name;

/// How a transport routes events: where each event type is published.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Routing {
    /// NATS JetStream: the subject `{namespace}.{event type}`, stored in the namespace's
    /// stream.
    Nats {
        /// The namespace.
        namespace: String,
    },
    /// RabbitMQ: the topic exchange, with the event type as routing key.
    RabbitMq {
        /// The exchange.
        exchange: String,
    },
    /// Redis Streams: one stream for every event type.
    Redis {
        /// The stream's key.
        stream_key: String,
    },
    /// Kafka: topics by aggregate type, by event type, or one topic; keyed by aggregate id.
    Kafka {
        /// The namespace.
        namespace: String,
        /// How event types map to topics.
        topics: KafkaTopics,
    },
}

/// How the Kafka transport maps events to topics (see `KafkaRouting`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KafkaTopics {
    /// `{namespace}.{aggregate type}`.
    AggregateType,
    /// `{namespace}.{event type}`.
    EventType,
    /// One topic.
    Topic(String),
}

impl KafkaTopics {
    /// The topic of an event type of an aggregate type, under `namespace`.
    pub fn topic(&self, namespace: &str, event_type: &str, aggregate_type: &str) -> String {
        match self {
            KafkaTopics::AggregateType => routing_name(namespace, aggregate_type),
            KafkaTopics::EventType => routing_name(namespace, event_type),
            KafkaTopics::Topic(topic) => topic.clone(),
        }
    }
}

impl Routing {
    /// The AsyncAPI protocol name.
    pub fn protocol(&self) -> &'static str {
        match self {
            Routing::Nats { .. } => "nats",
            Routing::RabbitMq { .. } => "amqp",
            Routing::Redis { .. } => "redis",
            Routing::Kafka { .. } => "kafka",
        }
    }

    /// Where an event type of an aggregate type is published.
    pub fn address(&self, event_type: &str, aggregate_type: &str) -> String {
        match self {
            Routing::Nats { namespace, .. } => routing_name(namespace, event_type),
            Routing::RabbitMq { .. } => event_type.to_owned(),
            Routing::Redis { stream_key } => stream_key.clone(),
            Routing::Kafka { namespace, topics } => {
                topics.topic(namespace, event_type, aggregate_type)
            }
        }
    }
}

/// Where a transport routed by `routing` publishes an event of `event_type` of
/// `aggregate_type`: its address, or the event type where no broker routes it (in memory,
/// database-local). What a destination's pause and the `send` spans name.
pub(crate) fn destination(
    routing: Option<&Routing>,
    event_type: &str,
    aggregate_type: &str,
) -> String {
    match routing {
        Some(routing) => routing.address(event_type, aggregate_type),
        None => event_type.to_owned(),
    }
}
