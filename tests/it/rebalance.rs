//! Kafka consumer groups rebalancing under load, through the runtime on PostgreSQL: while a
//! producer commits without pause, a second instance of the consumer joins the group (its
//! partitions are taken from the first mid-stream), then leaves (they come back). Every committed
//! event must be handled exactly once and in order per aggregate, and nothing may stay
//! unfinished: what a revoked partition had in flight is delivered again to its new owner, and
//! the inbox recognises what was already recorded.

use std::time::Duration;

use crate::common::carts::{LineAdded, record_line};
use crate::common::workload::{
    CARTS, Producer, SETTLE, assert_everything_handled_once, count_effects, inbox_config,
    relay_config, wait_for_effects, wait_subscribed,
};
use crate::common::*;
use outbox::prelude::*;
use outbox::runtime::Runtime;
use outbox::transport::kafka::KafkaTransport;

const CONSUMER: &str = "rebalance-kafka";

#[inbox_handler(consumer = "rebalance-kafka", backoff = "50ms", backoff_cap = "1s")]
async fn rebalance_kafka(
    tx: &InboxTransaction,
    event: Event<LineAdded>,
) -> Result<(), HandlerError> {
    record_line(tx, &event).await
}

async fn kafka(namespace: &str) -> Option<KafkaTransport> {
    kafka_for("rebalance", namespace).await
}

/// A Kafka transport on `namespace` with 4 partitions and a 3 s session (a departed member's
/// partitions move within seconds), for `test`; `None` when the broker is not reachable.
pub(crate) async fn kafka_for(test: &str, namespace: &str) -> Option<KafkaTransport> {
    let bootstrap = crate::transport::kafka::bootstrap();
    let connect = KafkaTransport::builder(bootstrap.clone())
        .namespace(namespace)
        .partitions(4)
        .session_timeout(Duration::from_secs(3))
        .connect();
    connect_or_skip("Kafka", &bootstrap, test, connect).await
}

/// A consumer-only runtime: a second instance of the consumer, on a pool of its own.
async fn second_instance(t: &TestDb, namespace: &str) -> Runtime {
    Runtime::builder(t.connect_again().await)
        .source("rebalance")
        .consumers([CONSUMER])
        .transport(kafka(namespace).await.expect("Kafka"))
        .without_relay()
        .inbox_config(inbox_config())
        .start()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_joins_and_leaves_under_load() {
    let Some(t) = test_db(Backend::Postgres, "rebalance_kafka").await else {
        return;
    };
    let namespace = fresh_namespace("rebalance");
    let Some(transport) = kafka(&namespace).await else {
        return;
    };
    let first = Runtime::builder(t.db.clone())
        .source("rebalance")
        .consumers([CONSUMER])
        .transport(transport)
        .relay_config(relay_config())
        .inbox_config(inbox_config())
        .start()
        .await
        .unwrap();
    wait_subscribed(&first, CONSUMER).await;
    let producer = Producer::spawn(t.db.clone(), first.outbox().clone());
    wait_for_effects(&t, 4 * CARTS as usize, Duration::from_secs(30)).await;

    // A second instance joins: the group's partitions are split between the two.
    let second = second_instance(&t, &namespace).await;
    wait_subscribed(&second, CONSUMER).await;
    let joined = eventually(Duration::from_secs(30), || async {
        second
            .consumer_stats(CONSUMER)
            .is_some_and(|s| s.handled > 0)
    })
    .await;
    assert!(joined, "the second instance got a share of the partitions");
    let before_leaving = count_effects(&t.db).await;
    // It leaves again: its partitions go back to the first.
    let second_report = second.shutdown().await;
    wait_for_effects(
        &t,
        before_leaving + 8 * CARTS as usize,
        Duration::from_secs(30),
    )
    .await;

    let lines = producer.stop().await;
    let committed: usize = lines.values().map(Vec::len).sum();
    wait_for_effects(&t, committed, Duration::from_secs(60)).await;
    tokio::time::sleep(SETTLE).await;
    let first_report = first.shutdown().await;

    let out_of_order = assert_everything_handled_once(&t, CONSUMER, &lines).await;
    assert!(
        out_of_order.is_empty(),
        "effects of one cart out of order: {out_of_order:?}"
    );
    let first_stats = first_report.consumer(CONSUMER);
    let second_stats = second_report.consumer(CONSUMER);
    assert!(second_stats.handled > 0, "{second_report:?}");
    assert_eq!(
        first_stats.handled + second_stats.handled,
        committed as u64,
        "each event handled by one instance, once: {first_report:?} {second_report:?}"
    );
    assert_eq!(first_stats.dead + second_stats.dead, 0);
    eprintln!(
        "rebalance_kafka: {committed} events; handled {} by the first instance and {} by the \
         second; {} deliveries recognised as duplicates after the rebalances",
        first_stats.handled,
        second_stats.handled,
        first_stats.duplicates + second_stats.duplicates
    );
}
