//! The Kafka transport against a real Kafka-protocol broker (127.0.0.1:9092, or
//! `OUTBOX_KAFKA`; `.ci/run` starts one): its fixture for the shared suite, and what only Kafka
//! has (keys and partitions, offsets committed only past settled messages, topics per aggregate
//! type, the size limit).
//!
//! Each test works in its own namespace (`t_<test>_<random>`).

use std::{collections::BTreeMap, time::Duration};

use outbox::transport::{
    OutgoingMessage, SubscribeOptions, Subscription, Transport,
    kafka::{
        KafkaTransport,
        rdkafka::{
            ClientConfig, Message, Offset, TopicPartitionList,
            consumer::{BaseConsumer, Consumer},
            message::Headers,
        },
    },
};

use super::{Connecting, Fixture, Stored, connect_error};
use crate::common::{connect_or_skip, fresh_namespace};

/// The broker the tests use.
pub(crate) fn bootstrap() -> String {
    std::env::var("OUTBOX_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

/// A transport on a fresh namespace. Its topics are left on the broker: deleting topics while
/// other clients refresh their metadata makes tansu (the broker CI runs) answer with topics
/// without a name, which librdkafka 2.12 does not survive.
pub(crate) struct TestTransport(pub(crate) KafkaTransport);

impl std::ops::Deref for TestTransport {
    type Target = KafkaTransport;

    fn deref(&self) -> &KafkaTransport {
        &self.0
    }
}

/// Every topic whose name starts with `prefix`.
fn topics_with_prefix(prefix: &str) -> Vec<String> {
    let Ok(consumer) = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create::<BaseConsumer>()
    else {
        return Vec::new();
    };
    consumer
        .fetch_metadata(None, Duration::from_secs(5))
        .map(|m| {
            m.topics()
                .iter()
                .map(|t| t.name().to_owned())
                .filter(|t| t.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// A transport on a fresh namespace, or `None` (after a loud message) when the broker is not
/// reachable. Its topics have one partition (so the suite's "in order" holds across aggregates)
/// and its consumers a short session, for quick rebalances.
#[allow(dead_code)] // for the Kafka-only tests
pub(crate) async fn transport(test: &str) -> Option<TestTransport> {
    transport_with(test, 1).await
}

async fn transport_with(test: &str, partitions: i32) -> Option<TestTransport> {
    let connect = KafkaTransport::builder(bootstrap())
        .namespace(fresh_namespace(test))
        .partitions(partitions)
        .session_timeout(Duration::from_secs(6))
        .request_timeout(Duration::from_secs(5))
        .connect();
    connect_or_skip("Kafka", &bootstrap(), test, connect)
        .await
        .map(TestTransport)
}

/// One message as read back: topic, partition, offset, value, key and headers.
pub(crate) type Read = (
    String,
    i32,
    i64,
    Vec<u8>,
    Option<Vec<u8>>,
    BTreeMap<String, String>,
);

/// Every message of the topics named `prefix…`, from the beginning, ordered by topic, partition
/// and offset. Reads until nothing arrives for two seconds (the broker's high watermarks are not
/// relied on: tansu's `ListOffsets` does not report them).
pub(crate) fn read_all(prefix: &str) -> Vec<Read> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", "outbox-tests-reader")
        .set("enable.auto.commit", "false")
        .create()
        .expect("reader");
    let mut list = TopicPartitionList::new();
    for topic in topics_with_prefix(prefix) {
        let metadata = consumer
            .fetch_metadata(Some(&topic), Duration::from_secs(5))
            .expect("metadata");
        for partition in metadata.topics()[0].partitions() {
            list.add_partition_offset(&topic, partition.id(), Offset::Beginning)
                .expect("partition");
        }
    }
    if list.count() == 0 {
        return Vec::new();
    }
    consumer.assign(&list).expect("assign");
    let mut all = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let Some(message) = consumer.poll(Duration::from_secs(2)) else {
            break;
        };
        let message = message.expect("read");
        let headers = message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        (
                            h.key.to_owned(),
                            String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        all.push((
            message.topic().to_owned(),
            message.partition(),
            message.offset(),
            message.payload().unwrap_or_default().to_vec(),
            message.key().map(<[u8]>::to_vec),
            headers,
        ));
    }
    all.sort_by(|a, b| (&a.0, a.1, a.2).cmp(&(&b.0, b.1, b.2)));
    all
}

/// A Kafka transport on topics of the test's own.
pub(crate) struct Kafka(TestTransport);

#[async_trait::async_trait]
impl Fixture for Kafka {
    const NAME: &'static str = "kafka";
    const CLOSED_PORT_URL: &'static str = "127.0.0.1:1";
    const REDELIVERIES_COUNTED_BY_THE_BROKER: bool = false;
    const GROUP_SETTLE: Duration = Duration::from_secs(10);
    const ORDERED_ACROSS_KEYS: bool = false;

    async fn open(test: &str) -> Option<Self> {
        // Kafka shares a group's messages by partition: the group test needs several (its
        // messages have different keys); the others check one total order, so one.
        let partitions = if test.ends_with("_groups") { 4 } else { 1 };
        transport_with(test, partitions).await.map(Kafka)
    }

    fn transport(&self) -> &dyn Transport {
        &self.0.0
    }

    fn namespace(&self) -> &str {
        self.0.0.namespace()
    }

    fn connect(url: &str, timeout: Duration) -> Connecting {
        let builder = KafkaTransport::builder(url).request_timeout(timeout);
        Box::pin(connect_error(builder.connect()))
    }

    /// The suite's messages are of aggregate type `order`, whose event types are not declared
    /// with `#[derive(DomainEvent)]` here: their topic is made before anything subscribes, as
    /// `setup` makes the topics of declared events.
    async fn declare(&self, _consumer: &str, _event_types: &[&str]) {
        let topic = self.0.topic_for("", "order");
        self.0.ensure_topics(&[topic]).await.expect("topic");
    }

    async fn subscribe(
        &self,
        consumer: &str,
        event_types: &[&str],
        options: &SubscribeOptions,
    ) -> Box<dyn Subscription> {
        self.declare(consumer, event_types).await;
        self.0
            .subscribe(consumer, &super::types(event_types), options)
            .await
            .expect("subscribe")
    }

    async fn stored(&self) -> Vec<Stored> {
        let prefix = format!("{}.", self.namespace());
        tokio::task::spawn_blocking(move || read_all(&prefix))
            .await
            .expect("reader")
            .into_iter()
            .map(|(topic, partition, offset, body, key, headers)| Stored {
                message_id: headers.get("outbox-event-id").cloned().unwrap_or_default(),
                event_type: headers
                    .get("outbox-event-type")
                    .cloned()
                    .unwrap_or_default(),
                content_type: headers.get("content-type").cloned(),
                body,
                fields: [
                    ("topic".to_owned(), topic),
                    ("partition".to_owned(), partition.to_string()),
                    ("offset".to_owned(), offset.to_string()),
                    (
                        "key".to_owned(),
                        String::from_utf8_lossy(&key.unwrap_or_default()).into_owned(),
                    ),
                ]
                .into(),
            })
            .collect()
    }

    fn check_stored(&self, i: usize, stored: &Stored, sent: &OutgoingMessage) {
        assert_eq!(stored.field("key"), sent.aggregate_id, "key of message {i}");
        assert_eq!(
            stored.field("topic"),
            format!("{}.{}", self.namespace(), sent.aggregate_type),
            "topic of message {i}"
        );
    }

    fn check_connect_error(text: &str) {
        assert!(text.contains("cannot reach the Kafka brokers"), "{text}");
    }
}
