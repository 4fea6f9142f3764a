//! One conformance suite for every transport: the same end-to-end guarantees checked through the
//! runtime (relay, dispatcher, worker) on PostgreSQL, for the in-memory, database-local, NATS,
//! RabbitMQ and Redis transports. A new transport is a file in `transport/` plus one line in
//! `transports!` below.
//!
//! What each transport must show: every committed event is handled once (confirmed publish,
//! subscribe and ack); a failed handling is redelivered until it succeeds; events of one
//! aggregate are handled in order; setting up twice changes nothing; small, large and unicode
//! payloads arrive byte-exact. Every broker transport must also redeliver a nacked message and one
//! whose subscriber went away without acking (and not an acked one), and survive its broker being
//! killed and restarted mid-stream (a broker process of the test's own) without losing anything.

use std::{
    any::Any,
    collections::HashMap,
    sync::{Arc, LazyLock, Mutex},
    time::Duration,
};

use crate::common::own_server::{Broker, OwnServer};
use crate::common::*;
use outbox::inbox::InboxConfig;
use outbox::prelude::*;
use outbox::runtime::Runtime;
use outbox::transport::{Transport, memory::MemoryTransport};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "conformance.noted", aggregate = "note")]
struct Noted {
    #[event(aggregate_id)]
    key: String,
    seq: u32,
    text: String,
}

/// The text an event carries, derived from its position so the handler can check it arrived
/// byte-exact: empty, large (400 KB) or unicode.
fn text_for(seq: u32) -> String {
    match seq % 4 {
        0 => String::new(),
        1 => "x".repeat(400 * 1024),
        2 => "žluťoučký kůň 🐎 日本語 \"quoted\" \\ </script> \u{7f}".to_owned(),
        _ => format!("plain {seq}"),
    }
}

static FAILURES: LazyLock<Mutex<HashMap<String, u32>>> = LazyLock::new(Mutex::default);

#[inbox_handler(consumer = "conformance", backoff = "20ms", backoff_cap = "100ms")]
async fn note(tx: &InboxTransaction, event: Event<Noted>) -> Result<(), HandlerError> {
    {
        let mut failures = FAILURES.lock().unwrap();
        if let Some(n) = failures.get_mut(&event.key)
            && *n > 0
        {
            *n -= 1;
            return Err(HandlerError::retry("injected failure"));
        }
    }
    let exact = event.text == text_for(event.seq);
    // A payload that did not arrive byte-exact is recorded as -1.
    insert_effect(
        tx,
        event.id(),
        &event.key,
        if exact { i64::from(event.seq) } else { -1 },
    )
    .await
}

/// A transport under test, or `None` for the database-local transport, plus whatever must live
/// as long as the test (e.g. a stream to delete afterwards).
struct Setup {
    transport: Option<Arc<dyn Transport>>,
    _guard: Box<dyn Any + Send>,
}

/// A broker the test can take away and bring back.
#[async_trait::async_trait]
trait Outage: Send + Sync {
    async fn stop(&self);
    async fn resume(&self);
}

#[async_trait::async_trait]
impl Outage for MemoryTransport {
    async fn stop(&self) {
        self.set_unavailable(true);
    }

    async fn resume(&self) {
        self.set_unavailable(false);
    }
}

#[async_trait::async_trait]
impl Outage for OwnServer {
    async fn stop(&self) {
        OwnServer::stop(self);
    }

    async fn resume(&self) {
        OwnServer::resume(self).await.unwrap();
    }
}

/// A broker of the test's own that an outage freezes (SIGSTOP) and thaws, instead of killing.
#[cfg(feature = "kafka")]
struct Frozen(Arc<OwnServer>);

#[cfg(feature = "kafka")]
#[async_trait::async_trait]
impl Outage for Frozen {
    async fn stop(&self) {
        self.0.freeze();
    }

    async fn resume(&self) {
        // A frozen broker fails publishes by timeout, not by a refused connection: it stays
        // frozen long enough for the last publishes of the outage to time out and the relay's
        // health check to fail, before it answers again.
        tokio::time::sleep(Duration::from_secs(6)).await;
        self.0.thaw();
    }
}

/// A broker process of the test's own and a transport connected to it by `connect`.
async fn own_broker<F, Fut>(
    broker: Broker,
    test: &str,
    connect: F,
) -> Option<(Setup, Arc<dyn Outage>)>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Arc<dyn Transport>>,
{
    let server = Arc::new(OwnServer::start(broker, test).await?);
    let transport = connect(server.url()).await;
    Some((
        Setup {
            transport: Some(transport),
            _guard: Box::new(server.clone()),
        },
        server,
    ))
}

/// A transport on a broker of the test's own that it can stop, or `None` where the kind has
/// no broker to stop (database-local) or the service is missing.
async fn restartable(kind: Kind, test: &str) -> Option<(Setup, Arc<dyn Outage>)> {
    match kind {
        Kind::Memory => {
            let memory = MemoryTransport::new();
            Some((
                Setup {
                    transport: Some(Arc::new(memory.clone())),
                    _guard: Box::new(()),
                },
                Arc::new(memory),
            ))
        }
        Kind::Local => unreachable!("the database-local transport has no broker to stop"),
        #[cfg(feature = "rabbitmq")]
        Kind::RabbitMq => {
            own_broker(Broker::RabbitMq, test, |url| async move {
                let t = outbox::transport::rabbitmq::RabbitMqTransport::builder(url)
                    .namespace("outage")
                    // A node that has just booted, on a loaded machine, may take seconds to
                    // confirm: a timeout while it answers would rightly count an attempt.
                    .publish_timeout(Duration::from_secs(5))
                    .connect()
                    .await;
                Arc::new(t.unwrap()) as Arc<dyn Transport>
            })
            .await
        }
        #[cfg(feature = "redis")]
        Kind::Redis => {
            own_broker(Broker::Redis, test, |url| async move {
                let t = outbox::transport::redis::RedisTransport::builder(url)
                    .namespace("outage")
                    .publish_timeout(Duration::from_secs(2))
                    .claim_idle(Duration::from_secs(2))
                    .connect()
                    .await;
                Arc::new(t.unwrap()) as Arc<dyn Transport>
            })
            .await
        }
        #[cfg(feature = "kafka")]
        Kind::Kafka => {
            // tansu keeps its log in memory, so a killed broker comes back empty: the outage
            // here is a frozen broker (SIGSTOP), whose connections stay open and silent.
            let (setup, server) = own_broker(Broker::Kafka, test, |url| async move {
                let t = outbox::transport::kafka::KafkaTransport::builder(url)
                    .namespace("outage")
                    .partitions(3)
                    // Well within the freeze (see `Frozen`): the publish times out and the health
                    // check fails while the broker is still frozen; after the thaw, a slow
                    // machine is not mistaken for a failing message.
                    .publish_timeout(Duration::from_secs(2))
                    .request_timeout(Duration::from_secs(1))
                    .session_timeout(Duration::from_secs(3))
                    .connect()
                    .await;
                Arc::new(t.unwrap()) as Arc<dyn Transport>
            })
            .await?;
            let _ = server;
            let frozen = setup
                ._guard
                .downcast_ref::<Arc<OwnServer>>()
                .expect("the broker")
                .clone();
            Some((setup, Arc::new(Frozen(frozen)) as Arc<dyn Outage>))
        }
        #[cfg(feature = "nats")]
        Kind::Nats => {
            own_broker(Broker::Nats, test, |url| async move {
                let t = outbox::transport::nats::NatsTransport::builder(url)
                    .namespace("outage")
                    .publish_timeout(Duration::from_secs(2))
                    .connect()
                    .await;
                Arc::new(t.unwrap()) as Arc<dyn Transport>
            })
            .await
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Memory,
    Local,
    #[cfg(feature = "nats")]
    Nats,
    #[cfg(feature = "redis")]
    Redis,
    #[cfg(feature = "rabbitmq")]
    RabbitMq,
    #[cfg(feature = "kafka")]
    Kafka,
}

impl Kind {
    /// Whether a message redelivered to another subscription says so in its delivery count
    /// (Kafka keeps no count: a new group member sees a first delivery).
    fn counts_redeliveries(self) -> bool {
        #[cfg(feature = "kafka")]
        if matches!(self, Kind::Kafka) {
            return false;
        }
        true
    }
}

async fn transport(kind: Kind, test: &str) -> Option<Setup> {
    match kind {
        Kind::Memory => Some(Setup {
            transport: Some(Arc::new(MemoryTransport::new())),
            _guard: Box::new(()),
        }),
        Kind::Local => Some(Setup {
            transport: None,
            _guard: Box::new(()),
        }),
        #[cfg(feature = "nats")]
        Kind::Nats => {
            let nats = crate::common::nats::transport(test).await?;
            Some(Setup {
                transport: Some(Arc::new(nats.0.clone())),
                _guard: Box::new(nats),
            })
        }
        #[cfg(feature = "rabbitmq")]
        Kind::RabbitMq => rabbitmq(test).await,
        #[cfg(feature = "kafka")]
        Kind::Kafka => {
            let connect = outbox::transport::kafka::KafkaTransport::builder(
                crate::transport::kafka::bootstrap(),
            )
            .namespace(crate::common::fresh_namespace(test))
            .partitions(3)
            .session_timeout(Duration::from_secs(3))
            .connect();
            let kafka = crate::common::connect_or_skip(
                "Kafka",
                &crate::transport::kafka::bootstrap(),
                test,
                connect,
            )
            .await?;
            Some(Setup {
                transport: Some(Arc::new(kafka)),
                _guard: Box::new(()),
            })
        }
        #[cfg(feature = "redis")]
        Kind::Redis => {
            // A namespace of its own on the shared server; its stream is left to expire with
            // the test database's name reused next run.
            let namespace = format!(
                "conf_{}_{}",
                test,
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            );
            let redis =
                match outbox::transport::redis::RedisTransport::builder("redis://127.0.0.1:6379/")
                    .namespace(namespace)
                    .claim_idle(Duration::from_secs(2))
                    .connect()
                    .await
                {
                    Ok(r) => r,
                    Err(e) if !services_required() => {
                        eprintln!("\n*** SKIPPED {test}: Redis is not reachable ({e}) ***\n");
                        return None;
                    }
                    Err(e) => panic!("Redis is required (OUTBOX_REQUIRE_SERVICES=1): {e}"),
                };
            Some(Setup {
                transport: Some(Arc::new(redis.clone())),
                _guard: Box::new(RedisCleanup(redis)),
            })
        }
    }
}

#[cfg(feature = "rabbitmq")]
async fn rabbitmq(test: &str) -> Option<Setup> {
    let rabbit = crate::common::rabbitmq::transport(test).await?;
    // Consumer queues are declared by the scenarios (the runtime's dispatcher, or a direct
    // subscription); remove them with the rest.
    for consumer in ["conformance", "redelivery"] {
        rabbit.track_queue(&rabbit.queue_name(consumer));
    }
    Some(Setup {
        transport: Some(Arc::new(rabbit.transport.clone())),
        _guard: Box::new(rabbit),
    })
}

/// Deletes a test's Redis stream when the test ends.
#[cfg(feature = "redis")]
struct RedisCleanup(outbox::transport::redis::RedisTransport);

#[cfg(feature = "redis")]
impl Drop for RedisCleanup {
    fn drop(&mut self) {
        let key = self.0.stream_key().to_owned();
        if let Ok(client) = outbox::transport::redis::redis::Client::open("redis://127.0.0.1:6379/")
            && let Ok(mut conn) = client.get_connection()
        {
            let _: Result<i64, _> = outbox::transport::redis::redis::cmd("DEL")
                .arg(&key)
                .query(&mut conn);
        }
    }
}

/// How the scenario's relay publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Through its fast path, with the claim loop as the safety net (the default).
    FastPath,
    /// Only through the claim loop.
    ClaimLoop,
    /// From the WAL, on the PostgreSQL cluster with `wal_level = logical`.
    #[cfg_attr(not(feature = "postgres-wal"), allow(dead_code))]
    Wal,
}

tokio::task_local! {
    /// The scenario's relay mode (default: the fast path).
    static MODE: Mode;
}

fn mode() -> Mode {
    MODE.try_with(|m| *m).unwrap_or(Mode::FastPath)
}

/// The WAL relay's slot of a scenario (slots are the cluster's: one per test).
fn slot_of(t: &TestDb) -> String {
    format!("outbox_{}", t.name)
}

async fn runtime(t: &TestDb, setup: &Setup) -> Runtime {
    let mut builder = Runtime::builder(t.db.clone())
        .source("conformance")
        .consumers(["conformance"])
        .relay_config(quick_relay().fast_path(mode() == Mode::FastPath))
        .inbox_config(InboxConfig::default().poll_interval(Duration::from_millis(50)));
    #[cfg(feature = "postgres-wal")]
    if mode() == Mode::Wal {
        // A grace far beyond the scenario: every event the stream does not publish would stay.
        builder = builder.wal(
            outbox::relay::WalConfig::new(t.url.clone())
                .slot(slot_of(t))
                .table_grace(Duration::from_secs(600)),
        );
    }
    if let Some(transport) = &setup.transport {
        builder = builder.transport(transport.clone());
    }
    builder.start().await.unwrap()
}

async fn produce(t: &TestDb, outbox: &Outbox, prefix: &str, keys: u32, per_key: u32) -> usize {
    let mut n = 0;
    for seq in 0..per_key {
        let tx = outbox.begin(&t.db).await.unwrap();
        for k in 0..keys {
            tx.enqueue(&Noted {
                key: format!("{prefix}-{k}"),
                seq,
                text: text_for(seq),
            })
            .unwrap();
            n += 1;
        }
        let _ = tx.commit().await.unwrap();
    }
    n
}

async fn wait_for_effects(t: &TestDb, n: usize) {
    let ok = eventually(Duration::from_secs(120), || async {
        effects(&t.db).await.len() >= n
    })
    .await;
    assert!(
        ok,
        "only {} of {n} events handled",
        effects(&t.db).await.len()
    );
    // Anything delivered twice would show up now.
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// Every event handled exactly once, byte-exact, and in order per key.
async fn assert_handled_once_in_order(t: &TestDb, total: usize, per_key: u32) {
    let effects = effects(&t.db).await;
    assert_eq!(effects.len(), total, "each event handled exactly once");
    let ids: std::collections::HashSet<&str> =
        effects.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids.len(), total);
    assert!(
        effects.iter().all(|e| e.seq >= 0),
        "a payload arrived altered"
    );
    let mut per_key_seqs: HashMap<&str, Vec<i64>> = HashMap::new();
    for e in &effects {
        per_key_seqs.entry(e.cart.as_str()).or_default().push(e.seq);
    }
    for (key, seqs) in per_key_seqs {
        assert_eq!(
            seqs,
            (0..i64::from(per_key)).collect::<Vec<_>>(),
            "{key} out of order"
        );
    }
    assert_eq!(
        status_counts(&t.db).await.get("SENT"),
        Some(&(total as i64))
    );
}

async fn delivers_every_event_once_in_order(kind: Kind, t: TestDb) {
    let Some(setup) = transport(kind, &t.name).await else {
        return;
    };
    let runtime = runtime(&t, &setup).await;
    let outbox = runtime.outbox().clone();
    // With a broker, the relay's fast path takes the commits unless it is switched off.
    let fast = setup.transport.is_some() && mode() == Mode::FastPath;
    if fast {
        let running = eventually(Duration::from_secs(10), || async {
            outbox.fast_path_running()
        })
        .await;
        assert!(running, "the relay's fast path takes the commits");
    } else if mode() == Mode::Wal {
        // Streaming, not only the slot there: a slot being created is active before its
        // consistent point, and commits before that point are left to the claim loop.
        let streaming = eventually(Duration::from_secs(20), || async {
            runtime.relay_stats().map(|s| s.wal) == Some(outbox::relay::WalReader::Streaming)
                && outbox::store::wal::slot(&t.db, &slot_of(&t))
                    .await
                    .unwrap()
                    .is_some_and(|s| s.active)
        })
        .await;
        assert!(streaming, "the relay streams from its slot");
        assert!(
            !outbox.fast_path_running(),
            "no fast path beside the WAL stream"
        );
    } else {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!outbox.fast_path_running(), "no fast path");
    }
    let total = produce(&t, &outbox, "once", 10, 12).await;
    wait_for_effects(&t, total).await;
    let health = runtime.health();
    let names: Vec<&str> = health.loops.iter().map(|l| l.name.as_str()).collect();
    for expected in ["relay", "worker:conformance", "janitor", "metrics"] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    if setup.transport.is_some() {
        assert!(names.contains(&"dispatch:conformance"), "{names:?}");
    }
    assert!(health.is_healthy(), "{health:#?}");
    assert!(
        health
            .loops
            .iter()
            .all(|l| l.alive && l.last_success.is_some()),
        "{health:#?}"
    );
    let report = runtime.shutdown().await;
    assert_handled_once_in_order(&t, total, 12).await;
    assert_eq!(report.consumer("conformance").handled, total as u64);
    if mode() == Mode::Wal {
        let rows = outbox_rows(&t.db).await;
        assert!(
            rows.iter()
                .all(|r| r.claim_token.is_none() && r.attempts == 0),
            "every event went by the stream, none claimed: {:?}",
            rows.iter().find(|r| r.claim_token.is_some())
        );
        outbox::store::wal::drop_slot(&t.db, &slot_of(&t), true)
            .await
            .unwrap();
    }
}

async fn failed_handling_is_redelivered(kind: Kind, t: TestDb) {
    let Some(setup) = transport(kind, &t.name).await else {
        return;
    };
    for k in 0..3 {
        FAILURES
            .lock()
            .unwrap()
            .insert(format!("{}-retry-{k}", t.name), 2);
    }
    let runtime = runtime(&t, &setup).await;
    let outbox = runtime.outbox().clone();
    let total = produce(&t, &outbox, &format!("{}-retry", t.name), 5, 4).await;
    wait_for_effects(&t, total).await;
    let report = runtime.shutdown().await;
    assert_handled_once_in_order(&t, total, 4).await;
    assert_eq!(
        report.consumer("conformance").retried,
        6,
        "3 keys × 2 injected failures"
    );
}

async fn setting_up_twice_changes_nothing(kind: Kind, t: TestDb) {
    let Some(setup) = transport(kind, &t.name).await else {
        return;
    };
    // First life: set up, handle a batch, stop.
    let first = runtime(&t, &setup).await;
    let outbox = first.outbox().clone();
    let mut total = produce(&t, &outbox, "twice-a", 4, 4).await;
    wait_for_effects(&t, total).await;
    first.shutdown().await;
    if let Some(transport) = &setup.transport {
        transport.setup().await.unwrap();
        transport.setup().await.unwrap();
        transport.health().await.unwrap();
    }
    // Second life on the same topology: everything still flows, nothing is handled twice.
    let second = runtime(&t, &setup).await;
    let outbox = second.outbox().clone();
    total += produce(&t, &outbox, "twice-b", 4, 4).await;
    wait_for_effects(&t, total).await;
    second.shutdown().await;
    assert_handled_once_in_order(&t, total, 4).await;
}

async fn survives_a_broker_outage(kind: Kind, t: TestDb) {
    let Some((setup, outage)) = restartable(kind, &t.name).await else {
        return;
    };
    let runtime = runtime(&t, &setup).await;
    let outbox = runtime.outbox().clone();
    let mut total = produce(&t, &outbox, "outage", 5, 4).await;
    wait_for_effects(&t, total).await;

    outage.stop().await;
    // Commits go on while the broker is away; the relay keeps them and waits for the broker.
    for seq in 4..8 {
        let tx = outbox.begin(&t.db).await.unwrap();
        for k in 0..5 {
            tx.enqueue(&Noted {
                key: format!("outage-{k}"),
                seq,
                text: text_for(seq),
            })
            .unwrap();
            total += 1;
        }
        let _ = tx.commit().await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    outage.resume().await;

    wait_for_effects(&t, total).await;
    let report = runtime.shutdown().await;
    assert_handled_once_in_order(&t, total, 8).await;
    // Noticed as the broker's outage, not as failures of the events: no attempt spent. The
    // message names the errors the attempts were spent on.
    let charged: Vec<String> = outbox_rows(&t.db)
        .await
        .into_iter()
        .filter(|r| r.attempts > 0 || r.last_error.is_some())
        .map(|r| format!("{} attempts {}: {:?}", r.event_id, r.attempts, r.last_error))
        .chain(outbox_failures(&t.db).await)
        .collect();
    assert!(
        report
            .relay
            .is_some_and(|r| r.outages > 0 && r.retried == 0 && r.dead == 0),
        "the outage was noticed as the broker's: {report:?}; rows charged: {charged:?}"
    );
    let attempts = scalar_i64(
        &t.db,
        "SELECT CAST(COALESCE(SUM(attempts), 0) AS BIGINT) FROM outbox_event",
    )
    .await;
    assert_eq!(attempts, 0, "the outage spent attempts on the events");
}

async fn next(sub: &mut Box<dyn outbox::transport::Subscription>) -> outbox::transport::Delivery {
    tokio::time::timeout(Duration::from_secs(20), sub.next())
        .await
        .expect("a delivery within 20 s")
        .expect("subscription open")
        .expect("no transport error")
}

/// At the transport level: a nacked delivery and one never acked (its subscriber went away) are
/// delivered again; an acked one is not.
async fn broker_redelivers_on_nack_and_missing_ack(kind: Kind, test: &str) {
    use outbox::transport::{OutgoingMessage, SubscribeOptions};
    let Some(setup) = transport(kind, test).await else {
        return;
    };
    let transport = setup.transport.clone().expect("a broker transport");
    transport.setup().await.unwrap();
    let options = SubscribeOptions::default()
        .ack_wait(Duration::from_secs(1))
        .max_in_flight(10);
    let types = ["conformance.noted".to_owned()];
    let mut first = transport
        .subscribe("redelivery", &types, &options)
        .await
        .unwrap();
    let messages: Vec<OutgoingMessage> = (0..3)
        .map(|n| {
            let id = uuid::Uuid::now_v7();
            OutgoingMessage {
                event_id: id,
                event_type: "conformance.noted".into(),
                aggregate_type: "note".into(),
                aggregate_id: format!("k{n}"),
                body: bytes::Bytes::from(format!("{{\"id\":\"{id}\",\"n\":{n}}}")),
                headers: Vec::new(),
            }
        })
        .collect();
    assert!(
        transport.publish(&messages).await.iter().all(Result::is_ok),
        "confirmed publish"
    );
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(next(&mut first).await);
    }
    let by_n = |d: &outbox::transport::Delivery| String::from_utf8_lossy(&d.body).to_string();
    got.sort_by_key(by_n);
    let mut got = got.into_iter();
    let nacked = got.next().unwrap();
    let unacked = got.next().unwrap();
    let acked = got.next().unwrap();
    assert_eq!(acked.body, messages[2].body, "bodies arrive byte-exact");
    acked.ack().await.unwrap();
    nacked.nack(None).await.unwrap();
    drop(unacked);
    drop(first); // the subscriber goes away without acking
    let mut second = transport
        .subscribe("redelivery", &types, &options)
        .await
        .unwrap();
    let mut again = Vec::new();
    for _ in 0..2 {
        let d = next(&mut second).await;
        if kind.counts_redeliveries() {
            assert!(d.delivery_count >= 2, "a redelivery says so: {d:?}");
        }
        again.push(d.body.clone());
        d.ack().await.unwrap();
    }
    again.sort();
    let mut expected = vec![messages[0].body.clone(), messages[1].body.clone()];
    expected.sort();
    assert_eq!(
        again, expected,
        "the nacked and the unacked message came back, the acked did not"
    );
    let extra = tokio::time::timeout(Duration::from_secs(3), second.next()).await;
    assert!(extra.is_err(), "nothing else is delivered: {extra:?}");
}

/// `brokers! { name => Kind, … }`: transport-level scenarios for every broker transport.
macro_rules! brokers {
    ($($(#[$attr:meta])* $name:ident => $kind:expr;)+) => {$(
        $(#[$attr])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            broker_redelivers_on_nack_and_missing_ack($kind, concat!("conf_redeliver_", stringify!($name))).await;
        }
    )+};
}

brokers! {
    memory_redelivery => Kind::Memory;
    #[cfg(feature = "nats")]
    nats_redelivery => Kind::Nats;
    #[cfg(feature = "redis")]
    redis_redelivery => Kind::Redis;
    #[cfg(feature = "rabbitmq")]
    rabbitmq_redelivery => Kind::RabbitMq;
    #[cfg(feature = "kafka")]
    kafka_redelivery => Kind::Kafka;
}

/// `transports! { name => Kind, … }` instantiates every scenario for every transport.
macro_rules! transports {
    ($($(#[$attr:meta])* $name:ident => $kind:expr;)+) => {$(
        $(#[$attr])*
        mod $name {
            use super::*;

            async fn run<F, Fut>(test: &str, scenario: F)
            where
                F: FnOnce(Kind, TestDb) -> Fut,
                Fut: std::future::Future<Output = ()>,
            {
                let name = format!("conf_{}_{}", stringify!($name), test);
                if let Some(t) = test_db(Backend::Postgres, &name).await {
                    scenario($kind, t).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn delivers_once_in_order() {
                run("once", delivers_every_event_once_in_order).await;
            }

            /// The same with the fast path off: every event goes through the claim loop.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn delivers_once_in_order_claim_loop() {
                MODE.scope(
                    Mode::ClaimLoop,
                    run("once_loop", delivers_every_event_once_in_order),
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redelivers_failed_handling() {
                run("retry", failed_handling_is_redelivered).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn setup_is_idempotent() {
                run("twice", setting_up_twice_changes_nothing).await;
            }
        }
    )+};
}

transports! {
    memory => Kind::Memory;
    database_local => Kind::Local;
    #[cfg(feature = "nats")]
    nats => Kind::Nats;
    #[cfg(feature = "redis")]
    redis => Kind::Redis;
    #[cfg(feature = "rabbitmq")]
    rabbitmq => Kind::RabbitMq;
    #[cfg(feature = "kafka")]
    kafka => Kind::Kafka;
}

/// `delivers_once_in_order` with the WAL relay, for every transport with a broker.
#[cfg(feature = "postgres-wal")]
macro_rules! wal_transports {
    ($($(#[$attr:meta])* $name:ident => $kind:expr;)+) => {$(
        $(#[$attr])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let name = format!("conf_wal_{}", stringify!($name));
            if let Some(t) = logical_test_db(&name).await {
                MODE.scope(Mode::Wal, delivers_every_event_once_in_order($kind, t))
                    .await;
            }
        }
    )+};
}

#[cfg(feature = "postgres-wal")]
wal_transports! {
    memory_wal => Kind::Memory;
    #[cfg(feature = "nats")]
    nats_wal => Kind::Nats;
    #[cfg(feature = "redis")]
    redis_wal => Kind::Redis;
    #[cfg(feature = "rabbitmq")]
    rabbitmq_wal => Kind::RabbitMq;
    #[cfg(feature = "kafka")]
    kafka_wal => Kind::Kafka;
}

/// The outage scenario, for every transport with a broker the test can stop.
macro_rules! outages {
    ($($(#[$attr:meta])* $name:ident => $kind:expr;)+) => {$(
        $(#[$attr])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let name = format!("conf_outage_{}", stringify!($name));
            if let Some(t) = test_db(Backend::Postgres, &name).await {
                survives_a_broker_outage($kind, t).await;
            }
        }
    )+};
}

outages! {
    memory_outage => Kind::Memory;
    #[cfg(feature = "nats")]
    nats_outage => Kind::Nats;
    #[cfg(feature = "redis")]
    redis_outage => Kind::Redis;
    #[cfg(feature = "rabbitmq")]
    rabbitmq_outage => Kind::RabbitMq;
    #[cfg(feature = "kafka")]
    kafka_outage => Kind::Kafka;
}
