//! The Kafka transport against a real Kafka-protocol broker (127.0.0.1:9092, or
//! `OUTBOX_KAFKA`; `.ci/run` starts one): its fixture for the shared suite, and what only Kafka
//! has (keys and partitions, offsets committed only past settled messages, topics per aggregate
//! type, the size limit).
//!
//! Each test works in its own namespace (`t_<test>_<random>`).

use std::time::Duration;

use outbox::transport::{
    OutgoingMessage, SubscribeOptions, Subscription, Transport, kafka::KafkaTransport,
};

use super::{Connecting, Fixture, Stored, connect_error};
use crate::common::kafka::Read;
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

/// Every message of the topics named `prefix…` on the tests' broker (see
/// [`common::kafka::read_all`](crate::common::kafka::read_all)).
pub(crate) fn read_all(prefix: &str) -> Vec<Read> {
    crate::common::kafka::read_all(&bootstrap(), prefix)
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

// ---------------------------------------------------------------------------------------------
// What only Kafka has.
// ---------------------------------------------------------------------------------------------

/// Kafka's murmur2 (as the Java client computes it, seed 0x9747b28c), written here from the
/// algorithm so the transport's partitioner is checked against it, not against itself.
fn java_murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    let mut h: u32 = 0x9747_b28c ^ (data.len() as u32);
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition a Java producer picks for `key` among `partitions`.
fn java_partition(key: &[u8], partitions: i32) -> i32 {
    (java_murmur2(key) & 0x7fff_ffff) % partitions
}

#[test]
fn the_reference_murmur2_matches_kafkas_published_values() {
    // Values the Java client's own tests pin (`Utils.murmur2`).
    assert_eq!(java_murmur2(b"21"), -973_932_308);
    assert_eq!(java_murmur2(b"foobar"), -790_332_482);
    assert_eq!(java_murmur2(b"a-little-bit-long-string"), -985_981_536);
    assert_eq!(java_murmur2(b"a-little-bit-longer-string"), -1_486_304_829);
    assert_eq!(
        java_murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"),
        -58_897_971
    );
    assert_eq!(java_murmur2(b"abc"), 479_470_107);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_of_an_aggregate_lands_on_the_partition_java_clients_pick() {
    let Some(t) = transport_with("kafka_keys", 6).await else {
        return;
    };
    // Events of 40 aggregates, of two types: one topic (per aggregate type), key = aggregate id.
    let mut messages = Vec::new();
    for round in 0..3 {
        for n in 0..40 {
            let event_type = if round % 2 == 0 {
                "order.placed"
            } else {
                "order.shipped"
            };
            let mut m = super::message(event_type, n);
            m.aggregate_id = format!("order-{n}");
            messages.push(m);
        }
    }
    super::publish_ok(&t.0, &messages).await;
    let prefix = format!("{}.", t.namespace());
    let stored = tokio::task::spawn_blocking(move || read_all(&prefix))
        .await
        .unwrap();
    assert_eq!(stored.len(), messages.len());
    let topic = format!("{}.order", t.namespace());
    let mut partitions_used = std::collections::BTreeSet::new();
    for (stored_topic, partition, _, _, key, _) in &stored {
        let key = key.clone().expect("a key");
        assert_eq!(stored_topic, &topic, "one topic for the aggregate type");
        assert_eq!(
            *partition,
            java_partition(&key, 6),
            "key {} is on the partition a Java client picks",
            String::from_utf8_lossy(&key)
        );
        partitions_used.insert(*partition);
    }
    assert!(partitions_used.len() > 1, "keys spread over partitions");
    // Within each aggregate, the three events are in publish order.
    for n in 0..40 {
        let key = format!("order-{n}");
        let ids: Vec<&str> = stored
            .iter()
            .filter(|s| s.4.as_deref() == Some(key.as_bytes()))
            .map(|s| s.5["outbox-event-id"].as_str())
            .collect();
        let sent: Vec<String> = messages
            .iter()
            .filter(|m| m.aggregate_id == key)
            .map(|m| m.event_id.to_string())
            .collect();
        assert_eq!(ids, sent, "events of {key} in order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_carry_the_content_type_ids_trace_context_and_user_headers() {
    let Some(t) = transport("kafka_headers").await else {
        return;
    };
    let mut message = super::message("order.placed", 1);
    message.headers = vec![
        (
            "traceparent".to_owned(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
        ),
        ("tenant".to_owned(), "acme".to_owned()),
    ];
    super::publish_ok(&t.0, std::slice::from_ref(&message)).await;
    let prefix = format!("{}.", t.namespace());
    let stored = tokio::task::spawn_blocking(move || read_all(&prefix))
        .await
        .unwrap();
    let (_, _, _, body, key, headers) = &stored[0];
    assert_eq!(
        body.as_slice(),
        message.body.as_ref(),
        "the value is the body, byte for byte"
    );
    assert_eq!(key.as_deref(), Some(message.aggregate_id.as_bytes()));
    assert_eq!(headers["content-type"], "application/cloudevents+json");
    assert_eq!(headers["outbox-event-id"], message.event_id.to_string());
    assert_eq!(headers["outbox-event-type"], "order.placed");
    assert_eq!(
        headers["traceparent"],
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    );
    assert_eq!(headers["tenant"], "acme");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_size_limit_is_refused_for_good_naming_size_and_limit() {
    let Some(small) = connect_or_skip(
        "Kafka",
        &bootstrap(),
        "kafka_size",
        KafkaTransport::builder(bootstrap())
            .namespace(fresh_namespace("kafka_size"))
            .partitions(1)
            .max_message_bytes(10_000)
            .connect(),
    )
    .await
    else {
        return;
    };
    let mut big = super::message("order.placed", 1);
    big.body = vec![b'x'; 20_000].into();
    let fits = super::message("order.placed", 2);
    let results = small.publish(&[big, fits]).await;
    super::assert_permanent(&results[0], &["over the limit of 10000 bytes"]);
    match &results[0] {
        Err(outbox::transport::PublishError::Permanent(reason)) => {
            assert!(reason.contains("max_message_bytes"), "{reason}");
            assert!(reason.contains(" bytes as a Kafka record"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        results[1].is_ok(),
        "the next message goes on: {:?}",
        results[1]
    );
}

/// A slow message at the head of a partition holds the committed offset back while later ones
/// are settled: a new member of the group gets everything from the slow one on again (the inbox
/// would recognise the settled ones), and nothing once all are settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_are_committed_only_past_messages_settled_with_all_before_them() {
    let Some(t) = transport("kafka_commits").await else {
        return;
    };
    let fixture = Kafka(t);
    let messages = super::batch("order.placed", 4);
    super::publish_ok(fixture.transport(), &messages).await;
    let options = super::options(Duration::from_secs(30), 16);
    let mut first = fixture
        .subscribe("commits", &["order.placed"], &options)
        .await;
    let mut deliveries = Vec::new();
    for sent in &messages {
        deliveries.push(super::next_of(&mut first, sent, 1, "first delivery").await);
    }
    let mut deliveries = deliveries.into_iter();
    let slow = deliveries.next().unwrap();
    for later in deliveries {
        later.ack().await.expect("ack");
    }
    // Give the committer its chance: nothing may be committed past the slow one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(slow);
    drop(first);
    let mut second = fixture
        .subscribe("commits", &["order.placed"], &options)
        .await;
    for sent in &messages {
        let again = super::next_of(&mut second, sent, 1, "from the slow one on").await;
        again.ack().await.expect("ack");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(second);
    let mut third = fixture
        .subscribe("commits", &["order.placed"], &options)
        .await;
    super::assert_nothing_within(
        &mut third,
        Duration::from_secs(10),
        "everything settled was committed",
    )
    .await;
}

/// `send` only queues: a publish counts a message confirmed only by its delivery report. With
/// the broker frozen (its connection open and silent), nothing is reported `Ok`: every message
/// times out, and the transport confirms again once the broker answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_confirmed_without_a_delivery_report() {
    use crate::common::own_server::{Broker, OwnServer};
    let Some(server) = OwnServer::start(Broker::Kafka, "kafka_reports").await else {
        return;
    };
    let timeout = Duration::from_secs(1);
    let transport = KafkaTransport::builder(server.url())
        .namespace("reports")
        .partitions(1)
        .publish_timeout(timeout)
        .request_timeout(timeout)
        .connect()
        .await
        .expect("connect");
    super::publish_ok(&transport, &super::batch("order.placed", 5)).await;

    server.freeze();
    let started = std::time::Instant::now();
    let results = transport.publish(&super::batch("order.placed", 5)).await;
    let took = started.elapsed();
    server.thaw();
    assert_eq!(results.len(), 5);
    for result in &results {
        assert!(
            matches!(
                result,
                Err(outbox::transport::PublishError::Timeout(_)
                    | outbox::transport::PublishError::Connection(_))
            ),
            "unconfirmed while the broker was frozen: {result:?}"
        );
    }
    assert!(took >= timeout, "waited for the reports: {took:?}");
    assert!(transport.health().await.is_ok());
    // Confirmed again once the broker answers (by a new producer if the old one was fenced).
    let again = super::batch("order.placed", 5);
    let confirmed = crate::common::eventually(Duration::from_secs(20), || {
        let transport = transport.clone();
        let again = again.clone();
        async move { transport.publish(&again).await.iter().all(Result::is_ok) }
    })
    .await;
    assert!(confirmed, "publishes are confirmed again after the thaw");
}

/// Where the Python packages of the CloudEvents interoperability test are (`.ci/run` installs
/// `cloudevents` and `confluent-kafka` there): `OUTBOX_PYTHONPATH`, default
/// `~/.cache/outbox/python`.
fn python_packages() -> std::path::PathBuf {
    std::env::var_os("OUTBOX_PYTHONPATH").map_or_else(
        || {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/outbox/python")
        },
        std::path::PathBuf::from,
    )
}

/// A consumer written with the official CloudEvents SDK's Kafka binding (Python,
/// `scripts/cloudevents_kafka_reader.py`: confluent-kafka reads the records, the SDK's
/// `from_kafka_event` decodes them, nothing of ours) reads what the relay publishes: id, type,
/// source, subject, data, the extension attributes (aggregate type, trace context, a user header)
/// and the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_cloudevents_sdk_reads_what_the_relay_publishes() {
    use crate::common::carts::LineAdded;
    use crate::common::{Backend, test_db};
    use outbox::prelude::*;
    use outbox::relay::Relay;

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let Some(t) = test_db(Backend::SqliteMemory, "kafka_cloudevents").await else {
        return;
    };
    let Some(kafka) = transport("kafka_cloudevents").await else {
        return;
    };
    let packages = python_packages();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/cloudevents_kafka_reader.py"
    );
    let probe = std::process::Command::new("python3")
        .env("PYTHONPATH", &packages)
        .args([
            "-c",
            "import cloudevents.core.bindings.kafka, confluent_kafka",
        ])
        .output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        let why = format!(
            "the CloudEvents SDK and confluent-kafka are not installed in {} (see .ci/run)",
            packages.display()
        );
        assert!(!crate::common::services_required(), "{why}");
        eprintln!("\n*** SKIPPED kafka_cloudevents: {why} ***\n");
        return;
    }

    let outbox = Outbox::new("shop");
    let tx = outbox.begin(&t.db).await.unwrap();
    let trace = TraceContext::new(TRACEPARENT, None).unwrap();
    let mut ids = Vec::new();
    for seq in 0..3 {
        let mut headers = std::collections::BTreeMap::new();
        headers.insert("tenant".to_owned(), "acme".to_owned());
        let line = LineAdded {
            cart: "cart-7".into(),
            seq,
        };
        ids.push(
            trace
                .clone()
                .scope(async { tx.enqueue_with_headers(&line, headers) })
                .await
                .unwrap(),
        );
    }
    let _ = tx.commit().await.unwrap();
    let report = Relay::new(t.db.clone(), std::sync::Arc::new(kafka.0.clone()))
        .drain(10)
        .await
        .unwrap();
    assert_eq!(report.sent, 3);

    let topic = kafka.topic_for("line.added", "cart");
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .env("PYTHONPATH", &packages)
            .args([script, &bootstrap(), &topic, "3"])
            .output()
            .expect("run the CloudEvents SDK reader")
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "the SDK reader failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let events: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(events.len(), 3, "{events:#?}");
    for (seq, (event, id)) in events.iter().zip(&ids).enumerate() {
        let a = &event["attributes"];
        assert_eq!(a["id"], id.to_string());
        assert_eq!(a["specversion"], "1.0");
        assert_eq!(a["source"], "shop");
        assert_eq!(a["type"], "line.added");
        assert_eq!(a["subject"], "cart-7");
        assert_eq!(a["aggregatetype"], "cart");
        assert_eq!(a["traceparent"], TRACEPARENT);
        assert_eq!(a["tenant"], "acme");
        assert_eq!(
            event["data"],
            serde_json::json!({"cart": "cart-7", "seq": seq})
        );
        assert_eq!(event["key"], "cart-7");
    }
}
