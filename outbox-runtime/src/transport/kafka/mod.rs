//! Kafka transport (feature `kafka`, on librdkafka through `rdkafka`).
//!
//! # Topology
//!
//! By default every event of an aggregate type goes to one topic, `{namespace}.{aggregate type}`
//! (e.g. `outbox.order`), keyed by the aggregate id and partitioned with murmur2 as Java clients
//! partition: all events of one aggregate, whatever their type, land on one partition and keep
//! their order. [`KafkaRouting`] also offers a topic per event type and a single topic.
//! [`setup`](Transport::setup) creates the topics of every event type linked into the binary
//! (`#[derive(DomainEvent)]`) with [`KafkaConfig::partitions`] partitions and the configured
//! replication factor, leaves existing ones as they are (and warns when one has fewer
//! partitions than configured); a publish or subscription to a topic not yet created creates it
//! first.
//!
//! # Wire format
//!
//! Each message is a CloudEvents 1.0 event in the Kafka protocol binding's structured mode: the
//! value is the CloudEvents JSON, byte for byte, the header `content-type` is
//! `application/cloudevents+json`, and the key is the aggregate id (the binding's partitioning
//! key). Headers also carry the event id (`outbox-event-id`), its type (`outbox-event-type`, which
//! consumers filter on without parsing), the W3C trace context (`traceparent`, `tracestate`) and
//! the user headers given at enqueue.
//!
//! # Publishing
//!
//! One idempotent producer per transport (`enable.idempotence`, hence `acks=all` and retries
//! that neither reorder nor duplicate). [`publish`](Transport::publish) queues the batch and
//! reports a message `Ok` only from its delivery report, once the partition and offset are known:
//! `send` returning means nothing. A report that does not come within
//! [`KafkaConfig::publish_timeout`] (`message.timeout.ms`) is a
//! [`PublishError::Timeout`]; a broker that cannot be reached, or a full producer queue, a
//! [`PublishError::Connection`] (the relay then counts no attempt and waits for the broker); a
//! message over [`KafkaConfig::max_message_bytes`] is refused before it is sent, as
//! [`PublishError::Permanent`] naming its size and the limit. When the idempotent producer hits
//! a fatal error (its producer id fenced, a sequence gap after a broker lost data), librdkafka
//! cannot use it again: the transport replaces it with a new one, and the messages it failed are
//! reported as [`PublishError::Connection`] (no attempt counted; they are published again by the
//! new producer). Dropping the transport flushes what is queued.
//!
//! # Consuming
//!
//! A subscription is a member of the consumer group `{namespace}.{consumer}`, reading the
//! topics of the event types it handles and skipping the other types those topics carry.
//! Offsets are never committed automatically (`enable.auto.commit=false`): a message counts as
//! consumed only when it is settled, i.e. once the inbox has recorded it (handled, stored for a
//! retry, or DEAD), and the committed offset of a partition only moves past a message once
//! every message before it is settled too, although keyed lanes handle a partition's messages in
//! parallel. A consumer that stops, crashes or loses a partition resumes (or lets the new owner
//! resume) from the committed offset; messages after it are delivered again and the inbox
//! recognises them.
//!
//! Rebalances: when partitions are revoked, the subscription commits the settled run of each at
//! once and forgets the rest (their acks no longer commit anything); assigned partitions start at
//! their committed offset (a group's first read of a topic starts at the earliest message).
//!
//! Kafka has no per-message negative acknowledgement, and handler failures never need one: the
//! inbox stores the message for its own retries (RETRY, then DEAD) and acks it, so the offset
//! moves on and a failing message never blocks its partition. [`nack`](crate::transport::Delivery::nack)
//! (the inbox could not record the message, e.g. its database is down) rewinds the partition to
//! the message after `delay`: it and every later message of the partition are delivered again.
//! A delivery that is never settled holds its partition's commits back until the partition is
//! reassigned or the consumer restarts (then it is delivered again); there is no
//! `ack_wait` timer as on other brokers.
//!
//! ```no_run
//! # async fn demo() -> Result<(), outbox_runtime::transport::TransportError> {
//! use outbox_runtime::transport::{Transport, kafka::KafkaTransport};
//!
//! let transport = KafkaTransport::builder("127.0.0.1:9092")
//!     .namespace("shop")
//!     .partitions(12)
//!     .replication_factor(3)
//!     .connect()
//!     .await?;
//! transport.setup().await?;
//! # Ok(())
//! # }
//! ```

use std::{
    collections::{BTreeSet, HashSet},
    fmt,
    sync::{Arc, Mutex},
    time::Duration,
};

use rdkafka::{
    ClientConfig,
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
    error::RDKafkaErrorCode,
    producer::{FutureProducer, Producer},
};

use super::{SubscribeOptions, Subscription, Transport, TransportError};
use crate::transport::{OutgoingMessage, PublishError};

/// The `rdkafka` crate version this transport is built on.
pub use ::rdkafka;

const TRANSPORT: &str = "kafka";

/// The header naming the event id.
pub const EVENT_ID_HEADER: &str = "outbox-event-id";
/// The header naming the event type (what consumers filter on).
pub const EVENT_TYPE_HEADER: &str = "outbox-event-type";

mod config;
mod offsets;
mod publish;
mod subscription;

pub use config::{
    DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_PARTITIONS, DEFAULT_PUBLISH_TIMEOUT,
    DEFAULT_REQUEST_TIMEOUT, DEFAULT_SESSION_TIMEOUT, KafkaConfig, KafkaRouting,
    KafkaTransportBuilder,
};

/// The Kafka transport. Cheap to clone: clones share the producer.
#[derive(Clone)]
pub struct KafkaTransport {
    inner: Arc<Inner>,
}

struct Inner {
    bootstrap_servers: String,
    config: KafkaConfig,
    /// Replaced when it hits a fatal error (see [`KafkaTransport::producer`]).
    producer: std::sync::RwLock<FutureProducer>,
    admin: AdminClient<DefaultClientContext>,
    /// Topics known to exist (created or seen), so a publish asks only once per topic.
    topics: Mutex<HashSet<String>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Delivery reports were awaited by every publish; this only bounds what a cancelled
        // publish left queued.
        let producer = self.producer.read().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = producer.flush(Duration::from_secs(5)) {
            tracing::warn!(error = %e, "kafka transport: flushing the producer on shutdown failed");
        }
    }
}

impl fmt::Debug for KafkaTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaTransport")
            .field("bootstrap_servers", &self.inner.bootstrap_servers)
            .field("namespace", &self.inner.config.namespace)
            .field("routing", &self.inner.config.routing)
            .finish_non_exhaustive()
    }
}

impl KafkaTransport {
    /// Connect to the brokers `bootstrap_servers` (`host:port[,host:port…]`) with the default
    /// settings.
    pub async fn connect(bootstrap_servers: &str) -> Result<Self, TransportError> {
        Self::builder(bootstrap_servers).connect().await
    }

    /// Configure a transport for the brokers `bootstrap_servers`.
    pub fn builder(bootstrap_servers: impl Into<String>) -> KafkaTransportBuilder {
        KafkaTransportBuilder {
            bootstrap_servers: bootstrap_servers.into(),
            config: KafkaConfig::default(),
        }
    }

    async fn new(bootstrap_servers: String, config: KafkaConfig) -> Result<Self, TransportError> {
        config::validate_config(&config)?;
        let producer = new_producer(&bootstrap_servers, &config)?;
        let admin: AdminClient<DefaultClientContext> = client_config(&bootstrap_servers, &config)
            .create()
            .map_err(|e| {
                TransportError::new(TRANSPORT, format!("cannot create the admin client: {e}"))
            })?;
        let transport = KafkaTransport {
            inner: Arc::new(Inner {
                bootstrap_servers,
                config,
                producer: std::sync::RwLock::new(producer),
                admin,
                topics: Mutex::default(),
            }),
        };
        transport.health().await.map_err(|e| {
            TransportError::new(
                TRANSPORT,
                format!(
                    "cannot reach the Kafka brokers at {}: {}",
                    transport.inner.bootstrap_servers, e.message
                ),
            )
        })?;
        Ok(transport)
    }

    /// The producer in use (a clone shares it).
    pub(super) fn producer(&self) -> FutureProducer {
        self.inner
            .producer
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replace `failed` (the producer in use) after a fatal error. Its queue is flushed into
    /// failures, which the caller reports as connection errors.
    pub(super) fn replace_producer(&self, failed: &FutureProducer, reason: &str) {
        let mut current = self
            .inner
            .producer
            .write()
            .unwrap_or_else(|p| p.into_inner());
        if current.client().native_ptr() != failed.client().native_ptr() {
            return; // another publish replaced it already
        }
        match new_producer(&self.inner.bootstrap_servers, &self.inner.config) {
            Ok(producer) => {
                tracing::warn!(
                    error = reason,
                    "kafka producer hit a fatal error; replaced by a new one (what it failed is \
                     published again, without counting attempts)"
                );
                *current = producer;
            }
            Err(e) => tracing::error!(error = %e, "kafka producer could not be replaced"),
        }
    }

    /// The settings in use.
    pub fn config(&self) -> &KafkaConfig {
        &self.inner.config
    }

    /// The namespace topics are named under.
    pub fn namespace(&self) -> &str {
        &self.inner.config.namespace
    }

    /// The topic an event type of an aggregate type is published to.
    pub fn topic_for(&self, event_type: &str, aggregate_type: &str) -> String {
        self.inner.config.topic_for(event_type, aggregate_type)
    }

    /// The routing name of an event type, reported as
    /// [`Delivery::subject`](crate::transport::Delivery::subject): `{namespace}.{event_type}`.
    pub fn subject(&self, event_type: &str) -> String {
        super::routing_name(&self.inner.config.namespace, event_type)
    }

    /// The consumer group of a consumer: `{namespace}.{consumer}`.
    pub fn group_id(&self, consumer: &str) -> String {
        format!("{}.{consumer}", self.inner.config.namespace)
    }

    /// Topics of every event type linked into the binary, under the routing.
    fn known_topics(&self) -> BTreeSet<String> {
        crate::registry::events()
            .into_iter()
            .map(|e| self.topic_for(e.event_type, e.aggregate_type))
            .collect()
    }

    /// Create these topics where they do not exist (with the configured partitions and
    /// replication factor); existing ones are left as they are. Topics already created or seen
    /// by this transport are not asked for again.
    pub async fn ensure_topics(&self, topics: &[String]) -> Result<(), TransportError> {
        let missing: Vec<&String> = {
            let known = self.inner.topics.lock().unwrap_or_else(|p| p.into_inner());
            topics.iter().filter(|t| !known.contains(*t)).collect()
        };
        if missing.is_empty() {
            return Ok(());
        }
        let config = &self.inner.config;
        let replication = config.replication_factor.unwrap_or(-1);
        let new: Vec<NewTopic<'_>> = missing
            .iter()
            .map(|t| NewTopic::new(t, config.partitions, TopicReplication::Fixed(replication)))
            .collect();
        let options = AdminOptions::new()
            .request_timeout(Some(config.request_timeout))
            .operation_timeout(Some(config.request_timeout));
        let results = self
            .inner
            .admin
            .create_topics(new.iter(), &options)
            .await
            .map_err(|e| TransportError::new(TRANSPORT, format!("cannot create topics: {e}")))?;
        let mut created = Vec::new();
        for result in results {
            match result {
                Ok(topic) => created.push(topic),
                Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => created.push(topic),
                Err((topic, code)) => {
                    return Err(TransportError::new(
                        TRANSPORT,
                        format!("cannot create topic `{topic}`: {code}"),
                    ));
                }
            }
        }
        self.inner
            .topics
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(created);
        Ok(())
    }

    /// The cluster's metadata, of one topic or of every topic, asked for with the producer's
    /// client (a blocking call, off the async threads).
    async fn metadata(
        &self,
        topic: Option<String>,
    ) -> Result<rdkafka::metadata::Metadata, TransportError> {
        let producer = self.producer();
        let timeout = self.inner.config.request_timeout;
        tokio::task::spawn_blocking(move || {
            producer.client().fetch_metadata(topic.as_deref(), timeout)
        })
        .await
        .map_err(|e| TransportError::new(TRANSPORT, e.to_string()))?
        .map_err(|e| TransportError::new(TRANSPORT, format!("no metadata: {e}")))
    }
}

/// The idempotent producer.
fn new_producer(
    bootstrap_servers: &str,
    config: &KafkaConfig,
) -> Result<FutureProducer, TransportError> {
    client_config(bootstrap_servers, config)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "1")
        .set(
            "message.timeout.ms",
            millis(config.publish_timeout).to_string(),
        )
        .set("message.max.bytes", config.max_message_bytes.to_string())
        .create()
        .map_err(|e| TransportError::new(TRANSPORT, format!("cannot create the producer: {e}")))
}

/// The settings shared by every client of the transport.
pub(super) fn client_config(bootstrap_servers: &str, config: &KafkaConfig) -> ClientConfig {
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", bootstrap_servers)
        .set("socket.keepalive.enable", "true")
        // A request the broker leaves unanswered (a silent connection) fails after this long and
        // the connection is replaced.
        .set(
            "socket.timeout.ms",
            millis(config.request_timeout).to_string(),
        )
        // A connection attempt into a silent network is given up after as long, and tried
        // afresh, instead of waiting on the kernel's SYN retries after the network is back.
        .set(
            "socket.connection.setup.timeout.ms",
            millis(config.request_timeout).max(1000).to_string(),
        )
        .set("reconnect.backoff.ms", "100")
        .set("reconnect.backoff.max.ms", "2000");
    for (name, value) in &config.client_properties {
        client.set(name, value);
    }
    client
}

fn millis(d: Duration) -> u128 {
    d.as_millis().max(1)
}

#[async_trait::async_trait]
impl Transport for KafkaTransport {
    fn name(&self) -> &'static str {
        TRANSPORT
    }

    fn routing(&self) -> Option<crate::transport::Routing> {
        Some(crate::transport::Routing::Kafka {
            namespace: self.inner.config.namespace.clone(),
            topics: self.inner.config.topics(),
        })
    }

    async fn setup(&self) -> Result<(), TransportError> {
        let topics: Vec<String> = match &self.inner.config.routing {
            KafkaRouting::Topic(topic) => vec![topic.clone()],
            _ => self.known_topics().into_iter().collect(),
        };
        if topics.is_empty() {
            return Ok(());
        }
        // Forget what was seen: setup checks the broker, not the transport's memory.
        self.inner
            .topics
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.ensure_topics(&topics).await?;
        let configured = usize::try_from(self.inner.config.partitions).unwrap_or(0);
        for topic in self.metadata(None).await?.topics() {
            let partitions = topic.partitions().len();
            if topics.iter().any(|t| t == topic.name()) && partitions < configured {
                let topic = topic.name();
                tracing::warn!(
                    topic,
                    partitions,
                    configured,
                    "kafka topic has fewer partitions than configured; left as it is (adding \
                     partitions moves keys to other partitions and breaks per-aggregate order)"
                );
            }
        }
        Ok(())
    }

    async fn publish(&self, messages: &[OutgoingMessage]) -> Vec<Result<(), PublishError>> {
        self.publish_all(messages).await
    }

    async fn subscribe(
        &self,
        consumer: &str,
        event_types: &[String],
        options: &SubscribeOptions,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        super::check_consumer_name(TRANSPORT, consumer)?;
        let types = super::distinct_event_types(TRANSPORT, consumer, event_types)?;
        let mut topics = BTreeSet::new();
        let mut unknown = Vec::new();
        for event_type in &types {
            match self.topic_of_type(event_type) {
                Some(topic) => {
                    topics.insert(topic);
                }
                None => unknown.push(*event_type),
            }
        }
        let mut topics: Vec<String> = topics.into_iter().collect();
        self.ensure_topics(&topics).await?;
        if !unknown.is_empty() {
            // Their aggregate types (hence topics) are unknown here: read every topic of the
            // namespace, as they appear, and keep these types.
            tracing::info!(
                consumer, event_types = ?unknown,
                "kafka: no `#[derive(DomainEvent)]` for these event types is linked in, so their \
                 aggregate types are unknown: subscribing to every topic of the namespace"
            );
            topics.push(self.namespace_pattern());
        }
        let subscription = subscription::KafkaSubscription::start(
            self,
            consumer,
            &topics,
            types.iter().map(|t| (*t).to_owned()).collect(),
            options,
        )?;
        Ok(Box::new(subscription))
    }

    async fn health(&self) -> Result<(), TransportError> {
        // One topic this transport made sure of keeps the answer small on a large cluster;
        // before there is one, the whole cluster's.
        let topic = self
            .inner
            .topics
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .next()
            .cloned();
        if self.metadata(topic).await?.brokers().is_empty() {
            return Err(TransportError::new(
                TRANSPORT,
                "the cluster lists no broker",
            ));
        }
        Ok(())
    }
}

impl KafkaTransport {
    /// The topic a consumer reads for `event_type`; `None` when it routes by aggregate type
    /// and the event type's aggregate type is not known in this binary.
    fn topic_of_type(&self, event_type: &str) -> Option<String> {
        let config = &self.inner.config;
        match &config.routing {
            KafkaRouting::AggregateType => crate::registry::events()
                .into_iter()
                .find(|e| e.event_type == event_type)
                .map(|e| config.topic_for(event_type, e.aggregate_type)),
            _ => Some(config.topic_for(event_type, "")),
        }
    }

    /// A librdkafka topic pattern matching every topic of the namespace.
    fn namespace_pattern(&self) -> String {
        let mut pattern = String::from("^");
        for c in self.inner.config.namespace.chars() {
            if !c.is_ascii_alphanumeric() {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push_str("\\..+");
        pattern
    }
}
