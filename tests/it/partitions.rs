//! Silent partitions, end to end through the runtime (relay, dispatcher, worker) on PostgreSQL,
//! while a producer commits events without pause.
//!
//! The broker (NATS, Redis, RabbitMQ) runs in a network namespace of the test's own
//! ([`Partitionable`]), cut off from the host for 15 s, longer than the transport's publish
//! timeout and its ping, heartbeat and response timeouts (all set small here). Packets are
//! dropped without a reset or any error: every open connection goes silent, nobody sees it
//! close, and TCP's retransmissions back off to seconds apart. The
//! transports must notice within their timeouts, replace their connections, and recover once the
//! link is back: every committed event handled exactly once and in order per aggregate, nothing
//! DEAD and no attempt spent (a partition is the broker's outage, not the messages' fault), the
//! backlog drained within seconds of the heal (the figure is printed), and the runtime shuts
//! down within a bounded time (nothing waits forever on a dead socket).
//!
//! Needs root (`ip netns`); skipped loudly otherwise, a failure with `OUTBOX_REQUIRE_SERVICES=1`.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use crate::common::carts::{LineAdded, record_line};
use crate::common::netns::Partitionable;
use crate::common::own_server::Broker;
use crate::common::workload::{
    CARTS, Producer, SETTLE, assert_everything_handled_once, count_effects, inbox_config,
    loops_summary, relay_config, wait_for_effects, wait_subscribed,
};
use crate::common::*;
use outbox::prelude::*;
use outbox::runtime::Runtime;
use outbox::transport::Transport;

/// How long the broker stays cut off: longer than every timeout below.
const PARTITION: Duration = Duration::from_secs(15);
/// The transports' timeouts: publish, connection, ping / heartbeat / response.
const TIMEOUT: Duration = Duration::from_secs(1);
/// How soon after the heal the events committed until then must be handled.
const CATCH_UP: Duration = Duration::from_secs(10);
/// The same on Kafka: the consumer's group session expired during the partition, and on tansu
/// (the broker CI runs) the group's rejoin alone takes about 6 s of the 8 s measured.
const KAFKA_CATCH_UP: Duration = Duration::from_secs(15);

#[inbox_handler(consumer = "partition-nats", backoff = "50ms", backoff_cap = "1s")]
async fn partition_nats(
    tx: &InboxTransaction,
    event: Event<LineAdded>,
) -> Result<(), HandlerError> {
    record_line(tx, &event).await
}

#[inbox_handler(consumer = "partition-rabbitmq", backoff = "50ms", backoff_cap = "1s")]
async fn partition_rabbitmq(
    tx: &InboxTransaction,
    event: Event<LineAdded>,
) -> Result<(), HandlerError> {
    record_line(tx, &event).await
}

#[cfg(feature = "kafka")]
#[inbox_handler(consumer = "partition-kafka", backoff = "50ms", backoff_cap = "1s")]
async fn partition_kafka(
    tx: &InboxTransaction,
    event: Event<LineAdded>,
) -> Result<(), HandlerError> {
    record_line(tx, &event).await
}

#[inbox_handler(consumer = "partition-redis", backoff = "50ms", backoff_cap = "1s")]
async fn partition_redis(
    tx: &InboxTransaction,
    event: Event<LineAdded>,
) -> Result<(), HandlerError> {
    record_line(tx, &event).await
}

async fn connect(broker: Broker, url: String) -> Arc<dyn Transport> {
    match broker {
        #[cfg(not(feature = "kafka"))]
        Broker::Kafka => unreachable!("Kafka tests need the `kafka` feature"),
        #[cfg(feature = "kafka")]
        Broker::Kafka => Arc::new(
            outbox::transport::kafka::KafkaTransport::builder(url)
                .namespace("partitions")
                .partitions(3)
                .publish_timeout(TIMEOUT)
                .request_timeout(TIMEOUT)
                .session_timeout(Duration::from_secs(2))
                .connect()
                .await
                .unwrap(),
        ),
        Broker::Nats => Arc::new(
            outbox::transport::nats::NatsTransport::builder(url)
                .namespace("partitions")
                .publish_timeout(TIMEOUT)
                .connection_timeout(TIMEOUT)
                .ping_interval(TIMEOUT)
                .request_timeout(TIMEOUT)
                .pull_heartbeat(TIMEOUT)
                .connect()
                .await
                .unwrap(),
        ),
        Broker::Redis => Arc::new(
            outbox::transport::redis::RedisTransport::builder(url)
                .namespace("partitions")
                .publish_timeout(TIMEOUT)
                .connection_timeout(TIMEOUT)
                .response_timeout(TIMEOUT)
                .block(Duration::from_millis(500))
                .claim_idle(Duration::from_secs(2))
                .connect()
                .await
                .unwrap(),
        ),
        Broker::RabbitMq => Arc::new(
            outbox::transport::rabbitmq::RabbitMqTransport::builder(url)
                .namespace("partitions")
                .publish_timeout(TIMEOUT)
                .connection_timeout(TIMEOUT)
                .heartbeat(TIMEOUT)
                .response_timeout(TIMEOUT)
                .connect()
                .await
                .unwrap(),
        ),
    }
}

async fn survives_a_silent_partition(broker: Broker, consumer: &'static str, test: &str) {
    let started = Instant::now();
    let Some(t) = test_db(Backend::Postgres, test).await else {
        return;
    };
    let Some(network) = Partitionable::with_broker(broker, test).await else {
        return;
    };
    let transport = connect(broker, network.server().url()).await;
    let runtime = Runtime::builder(t.db.clone())
        .source("partitions")
        .consumers([consumer])
        .transport(transport)
        .relay_config(relay_config())
        .inbox_config(inbox_config())
        .start()
        .await
        .unwrap();
    wait_subscribed(&runtime, consumer).await;
    let producer = Producer::spawn(t.db.clone(), runtime.outbox().clone());
    // Events flow end to end before the partition.
    wait_for_effects(&t, 4 * CARTS as usize, Duration::from_secs(30)).await;

    let committed_before = producer.committed();
    let handled_before = count_effects(&t.db).await;
    let partitioned_at = Instant::now();
    network.partition();
    tokio::time::sleep(PARTITION).await;
    let committed_while_down = producer.committed() - committed_before;
    let handled_while_down = count_effects(&t.db).await - handled_before;
    let health_while_down = runtime.health();
    network.heal();
    let healed_at = Instant::now();
    let backlog = producer.committed();

    // Commits go on while the runtime catches up with what was committed until the heal, then
    // stop.
    let caught_up_after_heal = wait_for_effects(&t, backlog, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lines = producer.stop().await;
    let committed: usize = lines.values().map(Vec::len).sum();
    wait_for_effects(&t, committed, Duration::from_secs(60)).await;
    let drain_after_heal = healed_at.elapsed();
    // Anything handled twice would show up now.
    tokio::time::sleep(SETTLE).await;

    let shutting_down = Instant::now();
    let report = tokio::time::timeout(Duration::from_secs(30), runtime.shutdown())
        .await
        .unwrap_or_else(|_| panic!("{test}: the runtime did not shut down within 30 s"));
    let shutdown_took = shutting_down.elapsed();

    // Exactly once, in order per cart; nothing DEAD, nothing left, no attempt spent.
    let out_of_order = assert_everything_handled_once(&t, consumer, &lines).await;
    assert!(
        out_of_order.is_empty(),
        "{test}: effects of a cart out of order: {out_of_order:?}"
    );
    let outbox = outbox_rows(&t.db).await;
    let attempts: i64 = outbox.iter().map(|r| r.attempts).sum();
    assert_eq!(attempts, 0, "{test}: the partition spent attempts");
    assert!(
        committed_while_down >= 50,
        "commits went on during the partition: {committed_while_down}"
    );
    // Connections left silent by the partition were noticed and replaced: the backlog does not
    // wait for TCP's retransmissions, backed off to several seconds by then, to revive them.
    let catch_up = if broker == Broker::Kafka {
        KAFKA_CATCH_UP
    } else {
        CATCH_UP
    };
    assert!(
        caught_up_after_heal <= catch_up,
        "{test}: the events committed until the heal were handled {caught_up_after_heal:.1?} \
         after it"
    );
    assert!(
        drain_after_heal <= Duration::from_secs(30),
        "{test}: the backlog drained {drain_after_heal:.1?} after the heal"
    );
    let relay = report.relay.expect("the relay ran");
    assert_eq!(relay.dead, 0, "{report:?}");
    assert_eq!(relay.sent, committed as u64, "{report:?}");
    let inbox = report.consumer(consumer);
    assert_eq!(inbox.dead, 0, "{report:?}");
    assert_eq!(inbox.handled, committed as u64, "{report:?}");

    eprintln!(
        "{test}: partitioned for {PARTITION:?} (after {:.1?}); {committed} events committed \
         ({committed_while_down} while down, {handled_while_down} handled while down); caught up \
         with them {caught_up_after_heal:.1?} after the heal, drained {drain_after_heal:.1?} \
         after it; shutdown took {shutdown_took:.1?}; {attempts} \
         attempts; relay {relay:?}; inbox {inbox:?}; loops while down: {}; total {:.1?}",
        partitioned_at - started,
        loops_summary(&health_while_down),
        started.elapsed(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_survives_a_silent_partition() {
    survives_a_silent_partition(Broker::Nats, "partition-nats", "partitions_nats").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_survives_a_silent_partition() {
    survives_a_silent_partition(
        Broker::RabbitMq,
        "partition-rabbitmq",
        "partitions_rabbitmq",
    )
    .await;
}

#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_survives_a_silent_partition() {
    survives_a_silent_partition(Broker::Kafka, "partition-kafka", "partitions_kafka").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_survives_a_silent_partition() {
    survives_a_silent_partition(Broker::Redis, "partition-redis", "partitions_redis").await;
}
