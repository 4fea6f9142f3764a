//! Bad input through every consumer path: a corpus of broken, hostile and conflicting messages,
//! published as raw bytes straight to each broker (in-memory, NATS JetStream, RabbitMQ, Redis
//! Streams), bypassing the SDK's producer, and consumed by an inline and a stored-mode consumer;
//! bad rows written straight into `outbox_event` for the database-local transport; and events over
//! a broker's size limit on the producer side.
//!
//! Every bad message must end as a row an operator can find (inbox `DEAD`, the bytes as received,
//! an error saying what is wrong), SQL-looking text must be stored and handed to handlers
//! verbatim, a message id delivered again with other bytes must be kept apart as a conflict, and
//! a good message sent afterwards must still be handled: no bad input stops a loop.
//!
//! The in-memory path and the database-local transport run on PostgreSQL, MariaDB and SQLite;
//! the broker paths on PostgreSQL.

use std::{sync::Arc, time::Duration};

use crate::common::*;
use bytes::Bytes;
use outbox::admin::{self, Actor, DeadLetterFilter, Selector};
use outbox::inbox::InboxConfig;
use outbox::prelude::*;
use outbox::relay::{Backoff, RelayConfig};
use outbox::runtime::Runtime;
use outbox::transport::{OutgoingMessage, Transport, memory::MemoryTransport};
use sea_orm::{ConnectionTrait, DbBackend, Statement, Value};
use serde::{Deserialize, Serialize};
use serde_json::json;

const INLINE: &str = "bad-inline";
const STORED: &str = "bad-stored";
const CONSUMERS: [&str; 2] = [INLINE, STORED];
const PROBE: &str = "bad.probe";
/// Cases of the corpus that are not JSON at all (an operator replays them in the test).
const NOT_JSON_CASES: u64 = 5;

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "bad.probe", aggregate = "probe")]
struct Probe {
    #[event(aggregate_id)]
    key: String,
    text: String,
}

// SQL-looking strings: each must be stored, and reach handlers, exactly as sent.
const DROP_INBOX: &str = "'; DROP TABLE inbox_event; --";
const OR_TRUE: &str = "\" OR 1=1 --";
const BACKSLASHES: &str = "\\'; DELETE FROM outbox_event WHERE '1'='1'; --\\";
const SQL_AGGREGATE: &str = "probe'); DROP TABLE inbox_event; --";
const SQL_KEY: &str = "Robert'); DROP TABLE effect;-- \\\" \\\\";
/// Payload text with a NUL, where the format allows one (JSON data; not attributes).
const SQL_TEXT: &str = "x'); DROP TABLE shop_order; --\\ \u{0} \" OR ''='";
/// The same without NUL, for PostgreSQL `jsonb`, which cannot hold `\u0000`.
const SQL_TEXT_NO_NUL: &str = "x'); DROP TABLE shop_order; --\\ \" OR ''='";

/// What a handler records: `seq` 1 when the text arrived as one of the SQL-looking texts.
async fn record(tx: &InboxTransaction, event: &Event<Probe>) -> Result<(), HandlerError> {
    let verbatim = event.text == SQL_TEXT || event.text == SQL_TEXT_NO_NUL;
    insert_effect(tx, event.id(), &event.key, i64::from(verbatim)).await
}

#[inbox_handler(
    consumer = "bad-inline",
    max_attempts = 3,
    backoff = "10ms",
    backoff_cap = "50ms"
)]
async fn inline_probe(tx: &InboxTransaction, event: Event<Probe>) -> Result<(), HandlerError> {
    record(tx, &event).await
}

#[inbox_handler(
    consumer = "bad-stored",
    mode = "stored",
    max_attempts = 3,
    backoff = "10ms",
    backoff_cap = "50ms"
)]
async fn stored_probe(tx: &InboxTransaction, event: Event<Probe>) -> Result<(), HandlerError> {
    record(tx, &event).await
}

fn inbox_config() -> InboxConfig {
    quick_inbox()
}

fn relay_config() -> RelayConfig {
    RelayConfig::default()
        .poll_interval(Duration::from_millis(50))
        .backoff(
            Backoff::default()
                .base(Duration::from_millis(20))
                .cap(Duration::from_millis(100))
                .jitter(0.1),
        )
        .max_attempts(5)
}

async fn wait_until<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    assert!(
        eventually(Duration::from_secs(90), check).await,
        "timed out waiting until {what}"
    );
}

// ---------------------------------------------------------------------------------------------
// The inbox as an operator sees it.
// ---------------------------------------------------------------------------------------------

impl InboxRow {
    fn settled(&self) -> bool {
        self.status == "DONE" || self.status == "DEAD"
    }
}

/// The one row of `consumer` holding exactly `body`.
fn row_with<'a>(rows: &'a [InboxRow], body: &[u8], what: &str) -> &'a InboxRow {
    let found: Vec<&InboxRow> = rows.iter().filter(|r| r.payload == body).collect();
    assert_eq!(
        found.len(),
        1,
        "{what}: expected one inbox row holding its bytes verbatim ({:?}), found {}: {:#?}",
        String::from_utf8_lossy(body)
            .chars()
            .take(160)
            .collect::<String>(),
        found.len(),
        rows.iter()
            .map(|r| (&r.message_id, &r.status, &r.last_error))
            .collect::<Vec<_>>()
    );
    found[0]
}

fn assert_dead_with(row: &InboxRow, expected: &[&str], what: &str) {
    assert_eq!(row.status, "DEAD", "{what}: {row:?}");
    let error = row.last_error.as_deref().unwrap_or_default();
    for part in expected {
        assert!(
            error.contains(part),
            "{what}: the error should say {part:?}, it says {error:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The corpus.
// ---------------------------------------------------------------------------------------------

/// The broker-level message id a case is published with (where the broker carries one).
#[derive(Debug, Clone, Copy)]
enum BrokerId {
    /// A fresh UUID.
    Fresh,
    /// None at all: an undecodable message is then named by a digest of its bytes.
    Absent,
    /// This text.
    Given(&'static str),
}

#[derive(Debug, Clone)]
enum Expect {
    /// Handled; the inbox row keeps the envelope attributes verbatim.
    Done {
        message_id: &'static str,
        source: &'static str,
        aggregate: Option<(&'static str, &'static str)>,
        key: &'static str,
    },
    /// DEAD, its error containing every fragment.
    Dead(Vec<String>),
}

#[derive(Debug, Clone)]
struct Case {
    name: &'static str,
    body: Vec<u8>,
    broker_id: BrokerId,
    expect: Expect,
}

fn dead(name: &'static str, body: Vec<u8>, fragments: &[&str]) -> Case {
    Case {
        name,
        body,
        broker_id: BrokerId::Fresh,
        expect: Expect::Dead(fragments.iter().map(|s| (*s).to_owned()).collect()),
    }
}

/// A valid CloudEvents envelope of a probe, changed by `edit`.
fn envelope(
    id: &str,
    edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> Vec<u8> {
    let mut value = json!({
        "specversion": "1.0", "id": id, "source": "bad-input-tests", "type": PROBE,
        "datacontenttype": "application/json", "schemaversion": 1,
        "data": {"key": id, "text": "ok"},
    });
    edit(value.as_object_mut().unwrap());
    serde_json::to_vec(&value).unwrap()
}

fn probe(id: &str) -> Vec<u8> {
    envelope(id, |_| {})
}

/// `[[[…1…]]]`, nested `depth` deep.
fn nested(depth: usize) -> String {
    format!("{}1{}", "[".repeat(depth), "]".repeat(depth))
}

fn corpus() -> Vec<Case> {
    let not_json = "message is not valid JSON";
    vec![
        Case {
            broker_id: BrokerId::Given("' OR 1=1; DROP TABLE inbox_event; --"),
            ..dead(
                "truncated JSON",
                br#"{"specversion":"1.0","id":"truncated","source":"s","type":"bad.probe","data":{"key":"trun"#.to_vec(),
                &["undecodable message", not_json, "EOF"],
            )
        },
        Case {
            broker_id: BrokerId::Absent,
            ..dead(
                "malformed JSON",
                br#"{"specversion":"1.0",,"id":"malformed"}"#.to_vec(),
                &[not_json],
            )
        },
        dead("empty body", Vec::new(), &[not_json]),
        dead(
            "JSON that is not an object",
            br#"["specversion","1.0"]"#.to_vec(),
            &["not a CloudEvents object (found an array)"],
        ),
        Case {
            // The handler's type ignores the extra field: handled, and nothing overflows.
            name: "deeply nested JSON in a field the handler ignores",
            body: format!(
                r#"{{"specversion":"1.0","id":"deep","source":"s","type":"bad.probe","data":{{"key":"deep","text":"","extra":{}}}}}"#,
                nested(100_000)
            )
            .into_bytes(),
            broker_id: BrokerId::Fresh,
            expect: Expect::Done {
                message_id: "deep",
                source: "s",
                aggregate: None,
                key: "deep",
            },
        },
        dead(
            "deeply nested JSON where the handler reads",
            format!(
                r#"{{"specversion":"1.0","id":"deep-text","source":"s","type":"bad.probe","data":{{"key":"deep","text":{}}}}}"#,
                nested(100_000)
            )
            .into_bytes(),
            &["payload of `bad.probe` (schema version 1) does not match", "expected a string"],
        ),
        dead(
            "deeply nested JSON in a header",
            format!(
                r#"{{"specversion":"1.0","id":"deep-header","source":"s","type":"bad.probe","deepheader":{},"data":{{}}}}"#,
                nested(100_000)
            )
            .into_bytes(),
            &["CloudEvents attribute `deepheader` is invalid: recursion limit exceeded"],
        ),
        dead(
            "invalid UTF-8",
            b"\xff\xfe{\"specversion\":\"1.0\"}".to_vec(),
            &[not_json, "not UTF-8"],
        ),
        dead(
            "invalid UTF-8 inside a string",
            b"{\"specversion\":\"1.0\",\"id\":\"bad-\xc3\x28\",\"source\":\"s\",\"type\":\"bad.probe\"}".to_vec(),
            &["not UTF-8"],
        ),
        dead(
            "wrong specversion",
            envelope("spec-0.3", |e| {
                e.insert("specversion".into(), "0.3".into());
            }),
            &["unsupported CloudEvents specversion `0.3`"],
        ),
        dead(
            "specversion missing",
            envelope("no-spec", |e| {
                e.remove("specversion");
            }),
            &["CloudEvents attribute `specversion` is missing"],
        ),
        dead(
            "id missing",
            envelope("no-id", |e| {
                e.remove("id");
            }),
            &["CloudEvents attribute `id` is missing"],
        ),
        dead(
            "id not a string",
            envelope("numeric-id", |e| {
                e.insert("id".into(), 42.into());
            }),
            &["CloudEvents attribute `id` is invalid: expected a string, found a number"],
        ),
        dead(
            "type missing",
            envelope("no-type", |e| {
                e.remove("type");
            }),
            &["CloudEvents attribute `type` is missing"],
        ),
        dead(
            "source missing",
            envelope("no-source", |e| {
                e.remove("source");
            }),
            &["CloudEvents attribute `source` is missing"],
        ),
        dead(
            "unknown event type",
            envelope("dup-unknown", |e| {
                e.insert("type".into(), "bad.unknown".into());
            }),
            &["has no handler for event type `bad.unknown`"],
        ),
        dead(
            "future schema version",
            envelope("future-schema", |e| {
                e.insert("schemaversion".into(), 2.into());
            }),
            &["no handler for `bad.probe` schema version 2 (it handles versions [1])"],
        ),
        dead(
            "schema version not a number",
            envelope("schema-v2", |e| {
                e.insert("schemaversion".into(), "v2".into());
            }),
            &["CloudEvents attribute `schemaversion` is invalid: expected an integer"],
        ),
        dead(
            "payload of the wrong shape",
            envelope("wrong-shape", |e| {
                e.insert("data".into(), json!({"key": 5, "text": []}));
            }),
            &["payload of `bad.probe` (schema version 1) does not match", "Probe"],
        ),
        dead(
            "binary data",
            envelope("base64", |e| {
                e.remove("data");
                e.insert("data_base64".into(), "AAEC".into());
            }),
            &["CloudEvents attribute `data_base64` is invalid: binary data is not supported"],
        ),
        dead(
            "data that is not JSON",
            envelope("xml", |e| {
                e.insert("datacontenttype".into(), "application/xml".into());
            }),
            &["CloudEvents attribute `datacontenttype` is invalid: `application/xml` is not JSON"],
        ),
        dead(
            "time that is not a time",
            envelope("bad-time", |e| {
                e.insert("time".into(), "yesterday'; --".into());
            }),
            &["CloudEvents attribute `time` is invalid: `yesterday'; --` is not RFC 3339"],
        ),
        dead(
            "lone surrogate in the id",
            br#"{"specversion":"1.0","id":"\ud800","source":"s","type":"bad.probe","data":{}}"#.to_vec(),
            &["CloudEvents attribute `id` is invalid: not a valid string", "hex escape"],
        ),
        dead(
            "NUL in the id",
            envelope("nul\u{0}id", |_| {}),
            &["CloudEvents attribute `id` is invalid: contains the NUL character"],
        ),
        dead(
            "NUL in the subject",
            envelope("nul-subject", |e| {
                e.insert("subject".into(), "a\u{0}b".into());
                e.insert("aggregatetype".into(), "probe".into());
            }),
            &["CloudEvents attribute `subject` is invalid: contains the NUL character"],
        ),
        dead(
            "NUL in the type",
            envelope("nul-type", |e| {
                e.insert("type".into(), "bad.probe\u{0}".into());
            }),
            &["CloudEvents attribute `type` is invalid: contains the NUL character"],
        ),
        dead(
            "SQL-looking event type",
            envelope("sql-type", |e| {
                e.insert("type".into(), format!("bad.probe{DROP_INBOX}").into());
            }),
            &[&format!("has no handler for event type `bad.probe{DROP_INBOX}`")],
        ),
        Case {
            name: "SQL-looking text in every attribute, header and field",
            body: envelope(DROP_INBOX, |e| {
                e.insert("source".into(), OR_TRUE.into());
                e.insert("subject".into(), BACKSLASHES.into());
                e.insert("aggregatetype".into(), SQL_AGGREGATE.into());
                e.insert("sqlheader".into(), DROP_INBOX.into());
                e.insert("traceparent".into(), OR_TRUE.into());
                e.insert("data".into(), json!({"key": SQL_KEY, "text": SQL_TEXT}));
            }),
            broker_id: BrokerId::Fresh,
            expect: Expect::Done {
                message_id: DROP_INBOX,
                source: OR_TRUE,
                aggregate: Some((SQL_AGGREGATE, BACKSLASHES)),
                key: SQL_KEY,
            },
        },
        Case {
            name: "first delivery of a message id",
            body: envelope("dup-1", |e| {
                e.insert("data".into(), json!({"key": "dup-1", "text": "first"}));
            }),
            broker_id: BrokerId::Fresh,
            expect: Expect::Done {
                message_id: "dup-1",
                source: "bad-input-tests",
                aggregate: None,
                key: "dup-1",
            },
        },
    ]
}

/// `dup-1` again with other bytes: a conflict with a handled message.
fn conflicting_handled() -> Vec<u8> {
    envelope("dup-1", |e| {
        e.insert("data".into(), json!({"key": "dup-1", "text": "second"}));
    })
}

/// `dup-unknown` again with other bytes: a conflict with a message dead on arrival.
fn conflicting_dead() -> Vec<u8> {
    envelope("dup-unknown", |e| {
        e.insert("type".into(), "bad.unknown".into());
        e.insert("data".into(), json!({"key": "other"}));
    })
}

// ---------------------------------------------------------------------------------------------
// Brokers, each with a way to publish raw bytes past the SDK.
// ---------------------------------------------------------------------------------------------

enum Broker {
    Memory(MemoryTransport),
    #[cfg(feature = "nats")]
    Nats(crate::common::nats::TestTransport),
    #[cfg(feature = "rabbitmq")]
    RabbitMq(crate::common::rabbitmq::TestTransport),
    #[cfg(feature = "redis")]
    Redis(RedisStream),
    #[cfg(feature = "kafka")]
    Kafka(crate::transport::kafka::TestTransport),
}

/// A Redis transport on a namespace of its own; its stream is deleted when the test ends.
#[cfg(feature = "redis")]
struct RedisStream(outbox::transport::redis::RedisTransport);

#[cfg(feature = "redis")]
impl Drop for RedisStream {
    fn drop(&mut self) {
        use outbox::transport::redis::redis;
        if let Ok(client) = redis::Client::open(REDIS_URL)
            && let Ok(mut conn) = client.get_connection()
        {
            let _: Result<i64, _> = redis::cmd("DEL").arg(self.0.stream_key()).query(&mut conn);
        }
    }
}

#[cfg(feature = "redis")]
const REDIS_URL: &str = "redis://127.0.0.1:6379/";

impl Broker {
    fn transport(&self) -> Arc<dyn Transport> {
        match self {
            Broker::Memory(m) => Arc::new(m.clone()),
            #[cfg(feature = "nats")]
            Broker::Nats(n) => Arc::new(n.0.clone()),
            #[cfg(feature = "rabbitmq")]
            Broker::RabbitMq(r) => Arc::new(r.transport.clone()),
            #[cfg(feature = "redis")]
            Broker::Redis(r) => Arc::new(r.0.clone()),
            #[cfg(feature = "kafka")]
            Broker::Kafka(k) => Arc::new(k.0.clone()),
        }
    }

    /// Whether the broker carries the message id we give (the in-memory transport always uses
    /// an id of its own).
    fn carries_ids(&self) -> bool {
        !matches!(self, Broker::Memory(_))
    }

    /// What must exist before raw publishes reach the consumers.
    async fn prepare(&self) {
        self.transport().setup().await.unwrap();
        #[cfg(feature = "rabbitmq")]
        if let Broker::RabbitMq(r) = self {
            for consumer in CONSUMERS {
                r.declare_queue(consumer, &[PROBE]).await;
            }
        }
    }

    /// Publish `body` as it is, with the broker's own client.
    async fn publish_raw(&self, body: &[u8], id: BrokerId) {
        let id = match id {
            BrokerId::Fresh => Some(uuid::Uuid::now_v7().to_string()),
            BrokerId::Absent => None,
            BrokerId::Given(id) => Some(id.to_owned()),
        };
        match self {
            Broker::Memory(m) => {
                let message = OutgoingMessage {
                    event_id: uuid::Uuid::now_v7(),
                    event_type: PROBE.into(),
                    aggregate_type: "probe".into(),
                    aggregate_id: "raw".into(),
                    body: Bytes::copy_from_slice(body),
                    headers: Vec::new(),
                };
                assert!(m.publish(&[message]).await[0].is_ok());
            }
            #[cfg(feature = "nats")]
            Broker::Nats(n) => {
                use outbox::transport::nats::async_nats::jetstream::message::PublishMessage;
                let mut publish = PublishMessage::build().payload(Bytes::copy_from_slice(body));
                if let Some(id) = id {
                    publish = publish.message_id(id);
                }
                let ack = n
                    .jetstream()
                    .send_publish(n.subject(PROBE), publish)
                    .await
                    .unwrap();
                ack.await.unwrap();
            }
            #[cfg(feature = "rabbitmq")]
            Broker::RabbitMq(r) => {
                use outbox::transport::rabbitmq::lapin::{
                    BasicProperties,
                    options::{BasicPublishOptions, ConfirmSelectOptions},
                };
                let channel = r.channel().await.unwrap();
                channel
                    .confirm_select(ConfirmSelectOptions::default())
                    .await
                    .unwrap();
                let mut properties = BasicProperties::default();
                if let Some(id) = id {
                    properties = properties.with_message_id(id.into());
                }
                let confirm = channel
                    .basic_publish(
                        r.exchange().into(),
                        PROBE.into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..BasicPublishOptions::default()
                        },
                        body,
                        properties,
                    )
                    .await
                    .unwrap()
                    .await
                    .unwrap();
                assert!(confirm.is_ack(), "RabbitMQ confirmed the raw publish");
                assert!(
                    confirm.take_message().is_none(),
                    "the raw publish reached a queue"
                );
            }
            #[cfg(feature = "redis")]
            Broker::Redis(r) => {
                use outbox::transport::redis::redis;
                let mut cmd = redis::cmd("XADD");
                cmd.arg(r.0.stream_key()).arg("*");
                if let Some(id) = id {
                    cmd.arg("id").arg(id);
                }
                cmd.arg("type").arg(PROBE).arg("body").arg(body);
                let mut conn = r.0.connection();
                let _: String = cmd.query_async(&mut conn).await.unwrap();
            }
            #[cfg(feature = "kafka")]
            Broker::Kafka(k) => {
                // A foreign producer: the event id header when it has one, no type header (the
                // consumer cannot filter such a message: it gets it whatever its type).
                use outbox::transport::kafka::rdkafka::{
                    ClientConfig,
                    message::{Header, OwnedHeaders},
                    producer::{FutureProducer, FutureRecord},
                };
                let producer: FutureProducer = ClientConfig::new()
                    .set("bootstrap.servers", crate::transport::kafka::bootstrap())
                    .create()
                    .unwrap();
                let topic = k.topic_for(PROBE, "probe");
                let mut headers = OwnedHeaders::new();
                if let Some(id) = &id {
                    headers = headers.insert(Header {
                        key: "outbox-event-id",
                        value: Some(id.as_bytes()),
                    });
                }
                let record = FutureRecord::to(&topic)
                    .key("raw")
                    .payload(body)
                    .headers(headers);
                producer
                    .send(record, std::time::Duration::from_secs(10))
                    .await
                    .map_err(|(e, _)| e)
                    .unwrap();
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The corpus through a broker, for both consumers.
// ---------------------------------------------------------------------------------------------

async fn corpus_through(broker: Broker, t: TestDb) {
    let runtime = Runtime::builder(t.db.clone())
        .transport(broker.transport())
        .without_relay()
        .consumers(CONSUMERS)
        .expect_consumers(CONSUMERS)
        .inbox_config(inbox_config())
        .start()
        .await
        .unwrap();
    broker.prepare().await;
    let cases = corpus();

    // 1. The corpus.
    for case in &cases {
        broker.publish_raw(&case.body, case.broker_id).await;
    }
    let settled = |n: usize| {
        let db = &t.db;
        async move {
            for consumer in CONSUMERS {
                let rows = inbox_rows(db, consumer).await;
                if rows.len() < n || !rows.iter().all(InboxRow::settled) {
                    return false;
                }
            }
            true
        }
    };
    wait_until("every case of the corpus settled", || settled(cases.len())).await;

    // 2. Message ids delivered again with other bytes: conflicts, kept apart.
    broker
        .publish_raw(&conflicting_handled(), BrokerId::Fresh)
        .await;
    broker
        .publish_raw(&conflicting_dead(), BrokerId::Fresh)
        .await;
    wait_until("both conflicts were kept", || settled(cases.len() + 2)).await;

    // 3. The same conflicting bytes and the first delivery again: duplicates, no new rows;
    //    then a good message, which must still be handled.
    broker
        .publish_raw(&conflicting_handled(), BrokerId::Fresh)
        .await;
    broker
        .publish_raw(&conflicting_dead(), BrokerId::Fresh)
        .await;
    let first = cases
        .iter()
        .find(|c| c.name == "first delivery of a message id")
        .unwrap();
    broker.publish_raw(&first.body, BrokerId::Fresh).await;
    let good = probe("good-after-the-corpus");
    broker.publish_raw(&good, BrokerId::Fresh).await;
    wait_until("the good message was handled by both consumers", || async {
        let mut done = 0;
        for consumer in CONSUMERS {
            let rows = inbox_rows(&t.db, consumer).await;
            let stats = runtime.consumer_stats(consumer).unwrap();
            if rows.iter().any(|r| r.payload == good && r.status == "DONE") && stats.duplicates >= 3
            {
                done += 1;
            }
        }
        done == CONSUMERS.len()
    })
    .await;

    // 4. An operator replays the undecodable ones: the worker finds them undecodable again.
    for consumer in CONSUMERS {
        let filter = DeadLetterFilter::default()
            .consumer(consumer)
            .error_contains("message is not valid JSON");
        let report = admin::replay(&t.db, &Selector::Filter(filter), &Actor::new("bad-input"))
            .await
            .unwrap();
        assert_eq!(report.affected(), NOT_JSON_CASES, "{consumer}: {report:?}");
    }
    let good_again = probe("good-after-the-replay");
    broker.publish_raw(&good_again, BrokerId::Fresh).await;
    wait_until("the replayed messages are DEAD again", || async {
        let mut ok = true;
        for consumer in CONSUMERS {
            let rows = inbox_rows(&t.db, consumer).await;
            let replayed = rows
                .iter()
                .filter(|r| {
                    r.last_error
                        .as_deref()
                        .is_some_and(|e| e.contains("message is not valid JSON"))
                })
                .collect::<Vec<_>>();
            ok &= replayed.len() as u64 == NOT_JSON_CASES
                && replayed
                    .iter()
                    .all(|r| r.status == "DEAD" && r.attempts == 1)
                && rows
                    .iter()
                    .any(|r| r.payload == good_again && r.status == "DONE");
        }
        ok
    })
    .await;

    let health = runtime.health();
    assert!(
        health.loops.iter().all(|l| l.alive),
        "every loop still running: {health:#?}"
    );
    let report = runtime.shutdown().await;

    // Every case, for both consumers: kept, verbatim, with a clear error.
    let dead_cases = cases
        .iter()
        .filter(|c| matches!(c.expect, Expect::Dead(_)))
        .count() as u64;
    let effects = effects(&t.db).await;
    for consumer in CONSUMERS {
        let rows = inbox_rows(&t.db, consumer).await;
        assert_eq!(
            rows.len(),
            cases.len() + 2 + 2,
            "{consumer}: one row per case, per conflict and per good message: {rows:#?}"
        );
        for case in &cases {
            let what = format!("{consumer}: {}", case.name);
            let row = row_with(&rows, &case.body, &what);
            match &case.expect {
                Expect::Dead(fragments) => {
                    let fragments: Vec<&str> = fragments.iter().map(String::as_str).collect();
                    assert_dead_with(row, &fragments, &what);
                    if broker.carries_ids() {
                        match case.broker_id {
                            BrokerId::Given(id) => assert_eq!(row.message_id, id, "{what}"),
                            BrokerId::Absent => assert!(
                                row.message_id.starts_with("undecodable-"),
                                "{what}: {row:?}"
                            ),
                            BrokerId::Fresh => {}
                        }
                    }
                }
                Expect::Done {
                    message_id,
                    source,
                    aggregate,
                    key,
                } => {
                    assert_eq!(row.status, "DONE", "{what}: {row:?}");
                    assert_eq!(row.last_error, None, "{what}");
                    assert_eq!(&row.message_id, message_id, "{what}");
                    assert_eq!(row.source.as_deref(), Some(*source), "{what}");
                    assert_eq!(row.event_type.as_deref(), Some(PROBE), "{what}");
                    assert_eq!(
                        row.aggregate_type.as_deref(),
                        aggregate.map(|a| a.0),
                        "{what}"
                    );
                    assert_eq!(
                        row.aggregate_id.as_deref(),
                        aggregate.map(|a| a.1),
                        "{what}"
                    );
                    let handled: Vec<_> = effects
                        .iter()
                        .filter(|e| e.consumer == consumer && e.event_id == *message_id)
                        .collect();
                    assert_eq!(handled.len(), 1, "{what}: handled once: {handled:?}");
                    assert_eq!(handled[0].cart, *key, "{what}: the data arrived verbatim");
                }
            }
        }
        let sql = effects
            .iter()
            .find(|e| e.consumer == consumer && e.event_id == DROP_INBOX)
            .unwrap();
        assert_eq!(sql.seq, 1, "{consumer}: the text with NUL arrived verbatim");

        // The conflicts: kept under a derived id, with the bytes and a clear error.
        let conflict = row_with(&rows, &conflicting_handled(), consumer);
        assert!(
            conflict.message_id.starts_with("dup-1#conflict-") && conflict.message_id.len() == 31,
            "{consumer}: {conflict:?}"
        );
        assert_dead_with(
            conflict,
            &[
                "message id `dup-1` was already delivered with a different payload (the first delivery is DONE)",
                "kept for an operator",
            ],
            consumer,
        );
        assert_eq!(
            conflict.aggregate_id, None,
            "a kept conflict holds no aggregate back"
        );
        let conflict = row_with(&rows, &conflicting_dead(), consumer);
        assert!(
            conflict.message_id.starts_with("dup-unknown#conflict-"),
            "{conflict:?}"
        );
        assert_dead_with(
            conflict,
            &[
                "message id `dup-unknown` was already delivered with a different payload (the first delivery is DEAD)",
            ],
            consumer,
        );
        let first_of_dup = row_with(&rows, &first.body, consumer);
        assert_eq!(
            first_of_dup.status, "DONE",
            "the first delivery stays as it was"
        );

        for good in [&good, &good_again] {
            assert_eq!(row_with(&rows, good, consumer).status, "DONE");
        }
        let stats = report.consumer(consumer);
        assert_eq!(stats.conflicts, 2, "{consumer}: {stats:?}");
        assert!(stats.duplicates >= 3, "{consumer}: {stats:?}");
        // Dead on arrival or after one attempt, then the replayed ones again.
        assert_eq!(
            stats.dead,
            dead_cases + NOT_JSON_CASES,
            "{consumer}: {stats:?}"
        );
        assert_eq!(stats.retried, 0, "nothing bad is retried: {stats:?}");
    }
    let good_effects = effects
        .iter()
        .filter(|e| e.event_id.starts_with("good-after"))
        .count();
    assert_eq!(good_effects, 4, "both good messages, both consumers");
    assert_eq!(count_orders(&t.db).await, 0);
}

async fn memory_corpus(t: TestDb) {
    corpus_through(Broker::Memory(MemoryTransport::new()), t).await;
}

// ---------------------------------------------------------------------------------------------
// The database-local transport: bad rows written straight into `outbox_event`.
// ---------------------------------------------------------------------------------------------

struct RawRow {
    event_id: Value,
    event_type: &'static str,
    schema_version: i32,
    source: &'static str,
    aggregate_type: &'static str,
    aggregate_id: &'static str,
    payload: String,
    headers: String,
}

impl RawRow {
    fn probe(aggregate_id: &'static str, payload: serde_json::Value, t: &TestDb) -> Self {
        RawRow {
            event_id: t.dialect().uuid(uuid::Uuid::now_v7()),
            event_type: PROBE,
            schema_version: 1,
            source: "bad-input-tests",
            aggregate_type: "probe",
            aggregate_id,
            payload: payload.to_string(),
            headers: "{}".into(),
        }
    }
}

async fn insert_raw(t: &TestDb, row: RawRow) {
    let d = t.dialect();
    let p = |n| d.placeholder(n);
    let json = |n| match d.backend() {
        DbBackend::Postgres => format!("CAST({} AS JSONB)", p(n)),
        _ => p(n),
    };
    let sql = format!(
        "INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, \
         aggregate_id, payload, headers, status, attempts, created_at) \
         VALUES ({}, {}, {}, {}, {}, {}, {}, {}, 'PENDING', 0, {})",
        p(1),
        p(2),
        p(3),
        p(4),
        p(5),
        p(6),
        json(7),
        json(8),
        p(9)
    );
    let values: Vec<Value> = vec![
        row.event_id,
        row.source.into(),
        row.event_type.into(),
        row.schema_version.into(),
        row.aggregate_type.into(),
        row.aggregate_id.into(),
        row.payload.into(),
        row.headers.into(),
        d.timestamp(chrono::Utc::now()),
    ];
    t.db.execute_raw(Statement::from_sql_and_values(d.backend(), sql, values))
        .await
        .unwrap();
}

async fn local_bad_rows(t: TestDb) {
    let backend = t.dialect().backend();
    // Each row on an aggregate of its own: a DEAD event holds its aggregate back.
    let mut outbox_dead: Vec<(&str, &str)> = Vec::new();
    let mut inbox_dead: Vec<(&str, &str)> = Vec::new();

    let mut row = RawRow::probe("l-headers", json!({"key": "l-headers", "text": "ok"}), &t);
    row.headers = "[\"not\", \"an object\"]".into();
    insert_raw(&t, row).await;
    outbox_dead.push(("l-headers", "headers are not a JSON object"));

    let mut row = RawRow::probe("l-unknown", json!({"key": "l-unknown", "text": "ok"}), &t);
    row.event_type = "bad.unknown";
    insert_raw(&t, row).await;
    outbox_dead.push((
        "l-unknown",
        "no consumer of this runtime handles event type `bad.unknown` (database-local transport)",
    ));
    // A good event behind it, on the same aggregate: held back, like behind any DEAD event.
    let behind = RawRow::probe("l-unknown", json!({"key": "l-unknown", "text": "ok"}), &t);
    insert_raw(&t, behind).await;

    let mut row = RawRow::probe("l-future", json!({"key": "l-future", "text": "ok"}), &t);
    row.schema_version = 9;
    insert_raw(&t, row).await;
    inbox_dead.push((
        "l-future",
        "has no handler for `bad.probe` schema version 9 (it handles versions [1])",
    ));

    let row = RawRow::probe("l-shape", json!({"key": 5, "text": ["not", "text"]}), &t);
    insert_raw(&t, row).await;
    inbox_dead.push(("l-shape", "does not match"));

    if backend == DbBackend::Sqlite {
        // Only SQLite stores JSON as plain text, so only there can a row hold broken JSON.
        let mut row = RawRow::probe("l-json", json!({}), &t);
        row.payload = r#"{"key": "l-json", "text": "#.into();
        insert_raw(&t, row).await;
        outbox_dead.push(("l-json", "payload is not valid JSON"));
    }
    if backend != DbBackend::Postgres {
        // PostgreSQL's `uuid` column refuses it; the others store text.
        let mut row = RawRow::probe("l-uuid", json!({"key": "l-uuid", "text": "ok"}), &t);
        row.event_id = "'; DROP TABLE outbox_event; --".into();
        insert_raw(&t, row).await;
        outbox_dead.push(("l-uuid", "outbox row cannot be read"));
    }

    let text = if backend == DbBackend::Postgres {
        SQL_TEXT_NO_NUL
    } else {
        SQL_TEXT
    };
    let sql_id = uuid::Uuid::now_v7();
    insert_raw(
        &t,
        RawRow {
            event_id: t.dialect().uuid(sql_id),
            event_type: PROBE,
            schema_version: 1,
            source: OR_TRUE,
            aggregate_type: SQL_AGGREGATE,
            aggregate_id: BACKSLASHES,
            payload: json!({"key": SQL_KEY, "text": text}).to_string(),
            headers: json!({"sqlheader": DROP_INBOX}).to_string(),
        },
    )
    .await;

    let runtime = Runtime::builder(t.db.clone())
        .source("bad-input-tests")
        .consumers(CONSUMERS)
        .expect_consumers(CONSUMERS)
        .relay_config(relay_config())
        .inbox_config(inbox_config())
        .start()
        .await
        .unwrap();
    // A good event committed through the SDK after the bad rows.
    let tx = runtime.outbox().begin(&t.db).await.unwrap();
    let good = tx
        .enqueue(&Probe {
            key: "l-good".into(),
            text: "ok".into(),
        })
        .unwrap();
    let _ = tx.commit().await.unwrap();

    let expected_rows = inbox_dead.len() + 2;
    wait_until(
        "the good event was handled and every row settled",
        || async {
            let mut ok = true;
            for consumer in CONSUMERS {
                let rows = inbox_rows(&t.db, consumer).await;
                ok &= rows.len() == expected_rows && rows.iter().all(InboxRow::settled);
            }
            let counts = status_counts(&t.db).await;
            ok && counts.get("DEAD").copied() == Some(outbox_dead.len() as i64)
                && counts.get("SENT").copied() == Some(expected_rows as i64)
                && counts.get("PENDING").copied() == Some(1)
        },
    )
    .await;
    let report = runtime.shutdown().await;

    let outbox_rows =
        t.db.query_all_raw(Statement::from_string(
            backend,
            "SELECT aggregate_id, status, last_error FROM outbox_event ORDER BY id".to_owned(),
        ))
        .await
        .unwrap();
    for (aggregate, error) in &outbox_dead {
        let row = outbox_rows
            .iter()
            .find(|r| r.try_get::<String>("", "aggregate_id").unwrap() == *aggregate)
            .unwrap();
        assert_eq!(
            row.try_get::<String>("", "status").unwrap(),
            "DEAD",
            "{aggregate}"
        );
        let last_error: Option<String> = row.try_get("", "last_error").unwrap();
        assert!(
            last_error.as_deref().is_some_and(|e| e.contains(error)),
            "{aggregate}: the error should say {error:?}, it says {last_error:?}"
        );
    }
    assert_eq!(report.relay.unwrap().dead as usize, outbox_dead.len());
    let held_back = outbox_rows
        .iter()
        .filter(|r| r.try_get::<String>("", "aggregate_id").unwrap() == "l-unknown")
        .map(|r| r.try_get::<String>("", "status").unwrap())
        .collect::<Vec<_>>();
    assert_eq!(
        held_back,
        ["DEAD", "PENDING"],
        "order kept behind the DEAD event"
    );

    let effects = effects(&t.db).await;
    for consumer in CONSUMERS {
        let rows = inbox_rows(&t.db, consumer).await;
        for (aggregate, error) in &inbox_dead {
            let row = rows
                .iter()
                .find(|r| r.aggregate_id.as_deref() == Some(*aggregate))
                .unwrap();
            assert_dead_with(row, &[error], &format!("{consumer}: {aggregate}"));
        }
        let sql = rows
            .iter()
            .find(|r| r.message_id == sql_id.to_string())
            .unwrap();
        assert_eq!(sql.status, "DONE", "{consumer}: {sql:?}");
        assert_eq!(sql.source.as_deref(), Some(OR_TRUE));
        assert_eq!(sql.aggregate_type.as_deref(), Some(SQL_AGGREGATE));
        assert_eq!(sql.aggregate_id.as_deref(), Some(BACKSLASHES));
        let envelope = Envelope::from_json(&sql.payload).unwrap();
        assert_eq!(envelope.extensions["sqlheader"], DROP_INBOX);
        let handled = effects
            .iter()
            .find(|e| e.consumer == consumer && e.event_id == sql_id.to_string())
            .unwrap();
        assert_eq!((handled.cart.as_str(), handled.seq), (SQL_KEY, 1));
        assert!(
            rows.iter()
                .any(|r| r.message_id == good.to_string() && r.status == "DONE"),
            "{consumer}: the good event was handled after the bad rows"
        );
        assert_eq!(report.consumer(consumer).dead as usize, inbox_dead.len());
    }
}

/// A broker relay meets a row it cannot read: DEAD with the reason, its aggregate held back,
/// every other event published.
async fn relay_marks_unreadable_rows_dead(t: TestDb) {
    if t.dialect().backend() == DbBackend::Postgres {
        // Typed columns: PostgreSQL refuses such a row in the first place.
        return;
    }
    let mut row = RawRow::probe("r-broken", json!({"key": "r-broken", "text": "ok"}), &t);
    row.event_id = "not a uuid'; --".into();
    insert_raw(&t, row).await;
    let behind = RawRow::probe("r-broken", json!({"key": "r-broken", "text": "ok"}), &t);
    insert_raw(&t, behind).await;
    let other = RawRow::probe("r-fine", json!({"key": "r-fine", "text": "ok"}), &t);
    insert_raw(&t, other).await;

    let transport = MemoryTransport::new();
    let runtime = Runtime::builder(t.db.clone())
        .transport(transport.clone())
        .consumers(Vec::<String>::new())
        .relay_config(relay_config())
        .start()
        .await
        .unwrap();
    wait_until("the readable event was published", || async {
        transport.len() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = runtime.shutdown().await;
    assert_eq!(transport.len(), 1, "only the readable event");
    let relay = report.relay.expect("the relay ran");
    assert_eq!(relay.dead, 1, "the unreadable row is counted: {relay:?}");
    let rows =
        t.db.query_all_raw(Statement::from_string(
            t.dialect().backend(),
            "SELECT aggregate_id, status, last_error FROM outbox_event ORDER BY id".to_owned(),
        ))
        .await
        .unwrap();
    let rows: Vec<OutboxRowStatus> = rows
        .iter()
        .map(|r| OutboxRowStatus {
            aggregate_id: r.try_get("", "aggregate_id").unwrap(),
            status: r.try_get("", "status").unwrap(),
            last_error: r.try_get("", "last_error").unwrap(),
        })
        .collect();
    assert_eq!(rows[0].status, "DEAD", "{rows:?}");
    let error = rows[0].last_error.as_deref().unwrap_or_default();
    assert!(
        error.contains("outbox row cannot be read") && error.contains("not a UUID"),
        "{error}"
    );
    assert_eq!(rows[1].status, "PENDING", "held back behind it: {rows:?}");
    assert_eq!(
        rows.len(),
        2,
        "the readable event left the table once sent: {rows:?}"
    );
    assert_eq!(sent_count(&t.db).await, 1, "and is in outbox_sent");
}

/// An outbox row read as raw columns (its event id may be unreadable).
#[derive(Debug)]
#[allow(dead_code)] // `aggregate_id` is read by `Debug`, in the failure messages.
struct OutboxRowStatus {
    aggregate_id: String,
    status: String,
    last_error: Option<String>,
}

backend_tests! {
    memory => memory_corpus;
    database_local => local_bad_rows;
    unreadable_rows => relay_marks_unreadable_rows_dead;
}

// ---------------------------------------------------------------------------------------------
// The brokers (on PostgreSQL).
// ---------------------------------------------------------------------------------------------

#[cfg(feature = "nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_corpus() {
    let Some(t) = test_db(Backend::Postgres, "bad_input_nats").await else {
        return;
    };
    let Some(nats) = crate::common::nats::transport("bad_input").await else {
        return;
    };
    corpus_through(Broker::Nats(nats), t).await;
}

#[cfg(feature = "rabbitmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_corpus() {
    let Some(t) = test_db(Backend::Postgres, "bad_input_rabbitmq").await else {
        return;
    };
    let Some(rabbit) = crate::common::rabbitmq::transport("bad_input").await else {
        return;
    };
    corpus_through(Broker::RabbitMq(rabbit), t).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_corpus() {
    let Some(t) = test_db(Backend::Postgres, "bad_input_redis").await else {
        return;
    };
    let namespace = format!(
        "bad_input_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    );
    let redis = match outbox::transport::redis::RedisTransport::builder(REDIS_URL)
        .namespace(namespace)
        .connect()
        .await
    {
        Ok(redis) => redis,
        Err(e) if !services_required() => {
            eprintln!("\n*** SKIPPED redis_corpus: Redis is not reachable ({e}) ***\n");
            return;
        }
        Err(e) => panic!("Redis is required (OUTBOX_REQUIRE_SERVICES=1) but unavailable: {e}"),
    };
    corpus_through(Broker::Redis(RedisStream(redis)), t).await;
}

#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_corpus() {
    let Some(t) = test_db(Backend::Postgres, "bad_input_kafka").await else {
        return;
    };
    let Some(kafka) = crate::transport::kafka::transport("bad_input").await else {
        return;
    };
    corpus_through(Broker::Kafka(kafka), t).await;
}

// ---------------------------------------------------------------------------------------------
// Producer side: an event over the broker's size limit.
// ---------------------------------------------------------------------------------------------

/// Commit one event of `text_len` bytes of text on aggregate `big`, then five small events on
/// aggregates of their own; the big one must end DEAD after one attempt with `error`, the small
/// ones must be published and handled.
async fn oversized_event_is_dead_at_once(
    t: TestDb,
    transport: Arc<dyn Transport>,
    outbox: Outbox,
    text_len: usize,
    error: &[String],
) {
    let runtime = Runtime::builder(t.db.clone())
        .outbox(&outbox)
        .transport(transport)
        .consumers([INLINE])
        .relay_config(relay_config())
        .inbox_config(inbox_config())
        .start()
        .await
        .unwrap();
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.enqueue(&Probe {
        key: "big".into(),
        text: "x".repeat(text_len),
    })
    .unwrap();
    for i in 0..5 {
        tx.enqueue(&Probe {
            key: format!("small-{i}"),
            text: "ok".into(),
        })
        .unwrap();
    }
    let _ = tx.commit().await.unwrap();
    wait_until("the small events were handled", || async {
        effects(&t.db).await.len() == 5
    })
    .await;
    // Later commits keep flowing.
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.enqueue(&Probe {
        key: "after-the-big-one".into(),
        text: "ok".into(),
    })
    .unwrap();
    let _ = tx.commit().await.unwrap();
    wait_until("the later event was handled", || async {
        effects(&t.db).await.len() == 6
    })
    .await;
    // Long enough for a retry loop to show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let report = runtime.shutdown().await;
    let rows = outbox_rows(&t.db).await;
    let big = rows.iter().find(|r| r.aggregate_id == "big").unwrap();
    assert_eq!(big.status, "DEAD", "{:?}", big.last_error);
    assert_eq!(big.attempts, 1, "DEAD at once, not after retries");
    let last_error = big.last_error.as_deref().unwrap();
    for part in error {
        assert!(
            last_error.contains(part.as_str()),
            "the error should say {part:?}, it says {last_error:?}"
        );
    }
    assert_eq!(
        rows.iter().filter(|r| r.status == "SENT").count(),
        6,
        "every other event was published"
    );
    let relay = report.relay.unwrap();
    assert_eq!((relay.dead, relay.retried), (1, 0), "{relay:?}");
}

#[cfg(feature = "nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_rejects_an_event_over_max_payload() {
    let Some(t) = test_db(Backend::Postgres, "bad_input_nats_oversize").await else {
        return;
    };
    let Some(nats) = crate::common::nats::transport("bad_oversize").await else {
        return;
    };
    let max_payload = nats.client().server_info().max_payload;
    // The outbox takes payloads up to NATS' limit; the envelope and headers around one push the
    // message over it.
    let outbox = Outbox::builder("bad-input-tests")
        .max_payload_bytes(max_payload)
        .build();
    let tx = outbox.begin(&t.db).await.unwrap();
    let err = tx
        .enqueue(&Probe {
            key: "too-big".into(),
            text: "x".repeat(max_payload),
        })
        .unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("over the limit of {max_payload} bytes")),
        "{err}"
    );
    drop(tx);
    let text_len = max_payload - 64;
    oversized_event_is_dead_at_once(
        t,
        Arc::new(nats.0.clone()),
        outbox,
        text_len,
        &[
            "broker rejected the message permanently".into(),
            "larger than the server's max_payload".into(),
            format!("Payload size limit of {max_payload} exceeded by message size of"),
            "CloudEvents envelope and headers included".into(),
        ],
    )
    .await;
}

/// Through the runtime: the Kafka transport refuses a record over `max_message_bytes` before it
/// sends it, and the event is DEAD at once, naming its size and the limit; the rest flows.
#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_refuses_an_event_over_max_message_bytes() {
    let Some(t) = test_db(Backend::Postgres, "bad_input_kafka_oversize").await else {
        return;
    };
    let limit = 64 * 1024;
    let connect =
        outbox::transport::kafka::KafkaTransport::builder(crate::transport::kafka::bootstrap())
            .namespace(crate::common::fresh_namespace("bad_oversize"))
            .max_message_bytes(limit)
            .session_timeout(Duration::from_secs(6))
            .connect();
    let Some(kafka) = crate::common::connect_or_skip(
        "Kafka",
        &crate::transport::kafka::bootstrap(),
        "bad_oversize",
        connect,
    )
    .await
    else {
        return;
    };
    oversized_event_is_dead_at_once(
        t,
        Arc::new(kafka),
        Outbox::new("bad-input-tests"),
        100 * 1024,
        &[
            "broker rejected the message permanently".into(),
            format!("over the limit of {limit} bytes"),
            "as a Kafka record".into(),
        ],
    )
    .await;
}

#[cfg(feature = "rabbitmq")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_rejects_an_event_over_max_message_size() {
    let Some(t) = test_db(Backend::Postgres, "bad_input_rabbitmq_oversize").await else {
        return;
    };
    let limit = 64 * 1024;
    let Some(rabbit) =
        crate::common::rabbitmq::transport_with("bad_oversize", |b| b.max_message_size(limit))
            .await
    else {
        return;
    };
    // The queue exists before the relay publishes: an unroutable message is a failure.
    rabbit.declare_queue(INLINE, &[PROBE]).await;
    oversized_event_is_dead_at_once(
        t,
        Arc::new(rabbit.transport.clone()),
        Outbox::new("bad-input-tests"),
        100 * 1024,
        &[
            "broker rejected the message permanently".into(),
            format!("more than the maximum message size of {limit} bytes"),
        ],
    )
    .await;
}
