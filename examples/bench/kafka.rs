//! The Kafka rows of P2 and P4 (feature `kafka`; the broker at `KAFKA_BOOTSTRAP`, default
//! `127.0.0.1:9092`, which `scripts/kafka-broker start` runs):
//!
//! - P2: the SDK relay draining the pre-enqueued backlog to Kafka, every event confirmed by its
//!   delivery report, against raw pipelined rdkafka publishing and a hand-written
//!   claim-publish-mark relay on the same producer settings (idempotent, `acks=all`);
//! - P4: one consumer (concurrency 8) working off a backlog on Kafka, against the same raw
//!   effect commits as P4 on JetStream.
//!
//! Each measurement works on topics of a fresh namespace: topics are never deleted (see
//! docs/RELIABILITY.md, "Kafka, on tansu").

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use outbox::inbox::InboxConfig;
use outbox::prelude::*;
use outbox::relay::{Relay, RelayConfig};
use outbox::sea_orm::DatabaseConnection;
use outbox::transport::kafka::{
    KafkaTransport,
    rdkafka::{
        ClientConfig, Offset, TopicPartitionList,
        consumer::{BaseConsumer, Consumer},
        message::{Header, OwnedHeaders, ToBytes},
        producer::{DeliveryFuture, FutureProducer, FutureRecord},
    },
};

use crate::report::{Measure, Spec, Target, m, spec};
use crate::support::{BoxError, Ctx, pre_enqueue, wait_drained};

/// Aggregates the P2 backlog is spread over, as on JetStream.
const AGGREGATES: u64 = 10_000;
/// Rows a hand-written relay claims at once, as on JetStream.
const BATCH: usize = 500;
/// Delivery reports awaited at once by the raw publishers.
const IN_FLIGHT: usize = 512;
const EVENT_TYPE: &str = "bench.order_placed";
const AGGREGATE_TYPE: &str = "order";

fn bootstrap() -> String {
    std::env::var("KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

/// A transport on a namespace no earlier run used, its topics made.
async fn transport(name: &str) -> Result<KafkaTransport, BoxError> {
    let namespace = format!(
        "bench_{name}_{}_{}",
        std::process::id(),
        fastrand::u32(..) % 1_000_000
    );
    let transport = KafkaTransport::builder(bootstrap())
        .namespace(namespace)
        .connect()
        .await
        .map_err(|e| {
            format!(
                "Kafka at {} ({e}); start it with `scripts/kafka-broker start`, or build the \
                 bench without the `kafka` feature",
                bootstrap()
            )
        })?;
    outbox::transport::Transport::setup(&transport).await?;
    Ok(transport)
}

/// A producer with the transport's settings: idempotent, `acks=all`, Java's partitioner.
fn raw_producer() -> Result<FutureProducer, BoxError> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "1")
        .create()?)
}

/// How many messages the topics of `transport` hold, read back from the beginning until
/// nothing arrives for two seconds (tansu does not report high watermarks).
async fn stored(transport: &KafkaTransport) -> Result<u64, BoxError> {
    let topic = transport.topic_for(EVENT_TYPE, AGGREGATE_TYPE);
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap())
            .set("group.id", "outbox-bench-reader")
            .set("enable.auto.commit", "false")
            .create()?;
        let metadata = consumer.fetch_metadata(Some(&topic), Duration::from_secs(10))?;
        let mut list = TopicPartitionList::new();
        for partition in metadata.topics()[0].partitions() {
            list.add_partition_offset(&topic, partition.id(), Offset::Beginning)?;
        }
        consumer.assign(&list)?;
        let mut count = 0u64;
        while let Some(message) = consumer.poll(Duration::from_secs(2)) {
            message?;
            count += 1;
        }
        Ok::<_, BoxError>(count)
    })
    .await?
}

/// Delivery reports awaited `IN_FLIGHT` at a time, oldest first.
#[derive(Default)]
struct Reports(std::collections::VecDeque<DeliveryFuture>);

impl Reports {
    /// Send `record`, waiting for the oldest report first when `IN_FLIGHT` are pending.
    async fn send<P: ToBytes + ?Sized>(
        &mut self,
        producer: &FutureProducer,
        record: FutureRecord<'_, String, P>,
    ) -> Result<(), BoxError> {
        if self.0.len() >= IN_FLIGHT
            && let Some(report) = self.0.pop_front()
        {
            report.await?.map_err(|(e, _)| e)?;
        }
        self.0
            .push_back(producer.send_result(record).map_err(|(e, _)| e)?);
        Ok(())
    }

    /// Wait for every pending report.
    async fn finish(self) -> Result<(), BoxError> {
        for report in self.0 {
            report.await?.map_err(|(e, _)| e)?;
        }
        Ok(())
    }
}

pub(crate) async fn p2(ctx: &Ctx) -> Result<Vec<Measure>, BoxError> {
    let n = ctx.sizes.p2_events;
    let mut out = Vec::new();

    // Raw pipelined publishing: what the broker takes from one producer.
    let target = transport("p2raw").await?;
    let topic = target.topic_for(EVENT_TYPE, AGGREGATE_TYPE);
    let producer = raw_producer()?;
    let body = serde_json::to_vec(&crate::support::OrderPlaced::sample(1, 1))?;
    let t = Instant::now();
    let mut reports = Reports::default();
    for i in 0..n {
        let key = format!("customer-{}", i % AGGREGATES);
        let record = FutureRecord::to(&topic).key(&key).payload(&body);
        reports.send(&producer, record).await?;
    }
    reports.finish().await?;
    out.push(m(
        "p2.kafka.raw_publish",
        n as f64 / t.elapsed().as_secs_f64(),
        "msg/s",
    ));
    let count = stored(&target).await?;
    if count != n {
        return Err(format!("raw publish to Kafka: the topic holds {count} of {n}").into());
    }

    // The hand-written relay: claim, publish pipelined, mark.
    ctx.reset().await?;
    pre_enqueue(&ctx.db, n, AGGREGATES, "PENDING").await?;
    let target = transport("p2rawrelay").await?;
    let t = Instant::now();
    let published = raw_relay(
        &ctx.db,
        &producer,
        &target.topic_for(EVENT_TYPE, AGGREGATE_TYPE),
    )
    .await?;
    let elapsed = t.elapsed();
    let count = stored(&target).await?;
    if published != n || count != n {
        return Err(format!(
            "the hand-written Kafka relay published {published} of {n} (the topic holds {count})"
        )
        .into());
    }
    out.push(m(
        "p2.kafka.raw_relay",
        n as f64 / elapsed.as_secs_f64(),
        "ev/s",
    ));

    // The SDK relay.
    ctx.reset().await?;
    pre_enqueue(&ctx.db, n, AGGREGATES, "PENDING").await?;
    let target = Arc::new(transport("p2").await?);
    let t = Instant::now();
    let relay = Relay::new(ctx.db.clone(), target.clone())
        .with_config(RelayConfig::default().batch_size(BATCH).listen(false))
        .spawn();
    let limit = Duration::from_secs(600);
    while relay.stats().sent < n {
        if t.elapsed() > limit {
            return Err(format!(
                "the relay sent {} of {n} to Kafka in {limit:?}",
                relay.stats().sent
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = t.elapsed();
    wait_drained(&ctx.db, Instant::now(), Duration::from_secs(30)).await?;
    let published = relay.shutdown().await?.sent;
    let count = stored(&target).await?;
    if published < n || count != n {
        return Err(format!(
            "the relay published {published} of {n} to Kafka (the topic holds {count})"
        )
        .into());
    }
    out.push(m(
        "p2.kafka.relay.r1",
        n as f64 / elapsed.as_secs_f64(),
        "ev/s",
    ));
    Ok(out)
}

/// A minimal hand-written relay on Kafka: claim up to 500 unsent rows with `SKIP LOCKED`,
/// publish them keyed by aggregate (delivery reports awaited `IN_FLIGHT` at a time), and mark
/// them SENT, each step in its own transaction without waiting for the WAL flush, until none
/// is left. No ordering, no retries, no leases taken over.
async fn raw_relay(
    db: &DatabaseConnection,
    producer: &FutureProducer,
    topic: &str,
) -> Result<u64, BoxError> {
    let mut published = 0u64;
    loop {
        let rows = crate::p2::raw_claim(db).await?;
        if rows.is_empty() {
            return Ok(published);
        }
        let mut ids = Vec::with_capacity(rows.len());
        let mut reports = Reports::default();
        for row in &rows {
            ids.push(row.try_get::<i64>("", "id")?);
            let event_id = row.try_get::<uuid::Uuid>("", "event_id")?.to_string();
            let key: String = row.try_get("", "aggregate_id")?;
            let payload: String = row.try_get("", "payload")?;
            let headers = OwnedHeaders::new().insert(Header {
                key: "outbox-event-id",
                value: Some(&event_id),
            });
            let record = FutureRecord::to(topic)
                .key(&key)
                .payload(&payload)
                .headers(headers);
            reports.send(producer, record).await?;
        }
        reports.finish().await?;
        published += ids.len() as u64;
        crate::p2::raw_mark_sent(db, ids).await?;
    }
}

/// P4 from Kafka: `n` events relayed to Kafka, then handled by one consumer started after.
pub(crate) async fn p4(ctx: &Ctx, consumer: &str, concurrency: usize) -> Result<f64, BoxError> {
    let n = ctx.sizes.p4_messages;
    ctx.reset().await?;
    let target = Arc::new(transport("p4").await?);
    crate::support::relay_backlog(&ctx.db, target.clone(), n).await?;

    let runtime = Runtime::builder(ctx.db.clone())
        .source("bench-p4")
        .transport(target)
        .without_relay()
        .inbox_config(InboxConfig::default().concurrency(concurrency))
        .consumers([consumer])
        .expect_consumers([consumer])
        .start()
        .await?;
    // Timed from the first message handled: joining the consumer group takes the broker a
    // few seconds (tansu waits half a session), which says nothing about the inbox.
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut first: Option<(Instant, u64)> = None;
    loop {
        let handled = runtime.consumer_stats(consumer).map_or(0, |s| s.handled);
        if first.is_none() && handled > 0 {
            first = Some((Instant::now(), handled));
        }
        if handled >= n {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("{handled} of {n} messages from Kafka handled after 300 s").into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (since, before) = first.expect("a message was handled");
    let (elapsed, timed) = (since.elapsed(), n - before);
    let report = runtime.shutdown().await;
    let stats = report.consumer(consumer);
    let effects =
        crate::support::scalar_i64(&ctx.db, "SELECT count(*) FROM bench_effect").await? as u64;
    if effects != n || stats.handled != n || stats.dead > 0 {
        return Err(
            format!("P4 from Kafka: {effects} effect rows of {n}; consumer {stats:?}").into(),
        );
    }
    Ok(timed as f64 / elapsed.as_secs_f64())
}

pub(crate) fn p2_specs() -> Vec<Spec> {
    vec![
        spec(
            "P2",
            "raw pipelined publish → Kafka",
            "p2.kafka.raw_publish",
        ),
        spec(
            "P2",
            "hand-written relay → Kafka (claim, publish, mark)",
            "p2.kafka.raw_relay",
        ),
        spec("P2", "SDK 1 relay → Kafka", "p2.kafka.relay.r1")
            .against(
                "hand-written relay → Kafka (claim, publish, mark)",
                "p2.kafka.raw_relay",
            )
            .target(Target::RatioAtLeast(0.75)),
        spec(
            "P2",
            "SDK 1 relay → Kafka (vs publish)",
            "p2.kafka.relay.r1",
        )
        .against("raw pipelined publish → Kafka", "p2.kafka.raw_publish"),
        spec(
            "P2",
            "SDK 1 relay → Kafka (vs JetStream)",
            "p2.kafka.relay.r1",
        )
        .against("SDK 1 relay → JetStream", "p2.relay.r1"),
    ]
}

pub(crate) fn p4_specs() -> Vec<Spec> {
    vec![
        spec(
            "P4",
            "SDK inbox handled from Kafka, concurrency 8",
            "p4.kafka.sdk.handled",
        )
        .against("raw effect commits, 8 clients", "p4.raw_commits")
        .target(Target::RatioAtLeast(1.5)),
        spec(
            "P4",
            "SDK inbox handled from Kafka (vs JetStream)",
            "p4.kafka.sdk.handled",
        )
        .against("SDK inbox handled, concurrency 8", "p4.sdk.handled"),
    ]
}
