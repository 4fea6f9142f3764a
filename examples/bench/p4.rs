//! P4 inbox throughput: a backlog on JetStream handled by one consumer (its handler inserts an
//! effect row), against raw PostgreSQL commits of that effect row at the same concurrency.

use std::{
    collections::HashSet,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use futures::StreamExt;
use outbox::inbox::InboxConfig;
use outbox::prelude::*;
use outbox::sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, Statement, TransactionTrait,
};
use outbox::transport::nats::{NatsTransport, async_nats};

use crate::report::{Measure, Spec, Target, m, spec};
use crate::support::{BoxError, Ctx, OrderPlaced, closed_loop, insert_effect};

const CONSUMER: &str = "bench-p4";
/// Messages handled at once by the consumer, and clients of the raw baseline.
const CONCURRENCY: usize = 8;

#[outbox::inbox_handler(consumer = "bench-p4")]
async fn record_effect(
    tx: &InboxTransaction,
    event: Event<OrderPlaced>,
) -> Result<(), HandlerError> {
    insert_effect(tx, CONSUMER, event.order_id, event.total_cents).await?;
    Ok(())
}

pub(crate) async fn run(ctx: &Ctx) -> Result<Vec<Measure>, BoxError> {
    let n = ctx.sizes.p4_messages;

    // The baseline: the effect row committed by hand, one per transaction.
    ctx.reset().await?;
    let db = ctx.db.clone();
    let raw = closed_loop(CONCURRENCY, ctx.sizes.p2_window, move |id| {
        let db = db.clone();
        async move {
            let tx = db.begin().await?;
            insert_effect(&tx, CONSUMER, id, 4_599).await?;
            tx.commit().await?;
            Ok(())
        }
    })
    .await?;

    // The backlog: `n` events relayed to the stream, then handled by a consumer started after.
    ctx.reset().await?;
    let transport = Arc::new(ctx.transport("bench_p4").await?);
    crate::support::relay_backlog(&ctx.db, transport.clone(), n).await?;

    // The hand-written batched inbox on the same stream (its own JetStream consumer each),
    // recording a bare message id, then the row the SDK records.
    let raw_batched = raw_batched_inbox(ctx, &transport, n, Rows::Bare).await?;
    ctx.db.execute_unprepared("TRUNCATE bench_effect").await?;
    let raw_batched_rows = raw_batched_inbox(ctx, &transport, n, Rows::Sdk).await?;
    ctx.db
        .execute_unprepared("TRUNCATE inbox_event, inbox_done, inbox_key, bench_effect")
        .await?;

    let runtime = Runtime::builder(ctx.db.clone())
        .source("bench-p4")
        .transport(transport.clone())
        .without_relay()
        .inbox_config(InboxConfig::default().concurrency(CONCURRENCY))
        .consumers([CONSUMER])
        .expect_consumers([CONSUMER])
        .start()
        .await?;
    let t = Instant::now();
    let deadline = t + Duration::from_secs(300);
    loop {
        let handled = runtime.consumer_stats(CONSUMER).map_or(0, |s| s.handled);
        if handled >= n {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("{handled} of {n} messages handled after 300 s").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = t.elapsed();
    let report = runtime.shutdown().await;
    ctx.drop_stream(&transport).await;
    let stats = report.consumer(CONSUMER);
    let effects =
        crate::support::scalar_i64(&ctx.db, "SELECT count(*) FROM bench_effect").await? as u64;
    if effects != n || stats.handled != n || stats.dead > 0 {
        return Err(format!("P4: {effects} effect rows of {n}; consumer {stats:?}").into());
    }
    #[allow(unused_mut)]
    let mut out = vec![
        m("p4.raw_commits", raw.per_sec(), "tx/s"),
        m("p4.raw_batched", raw_batched, "ev/s"),
        m("p4.raw_batched_rows", raw_batched_rows, "ev/s"),
        m("p4.sdk.handled", n as f64 / elapsed.as_secs_f64(), "ev/s"),
    ];
    #[cfg(feature = "kafka")]
    out.push(m(
        "p4.kafka.sdk.handled",
        crate::kafka::p4(ctx, CONSUMER, CONCURRENCY).await?,
        "ev/s",
    ));
    Ok(out)
}

/// Messages a hand-written batch takes at most, as the SDK's `commit_batch`.
const RAW_BATCH: usize = 32;

/// What the hand-written inbox records per message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rows {
    /// The message id and payload in a table of its own (one index).
    Bare,
    /// The row the SDK records in `inbox_event` for a handled message (same columns, same
    /// indexes), under another consumer name.
    Sdk,
}

/// The hand-written batched inbox: `CONCURRENCY` workers each take the messages that have
/// arrived for them (up to [`RAW_BATCH`]) and, in one transaction, record them with one
/// multi-row insert that returns the new ones, insert each new message's effect, commit, then
/// ack them. No ordering, retries, savepoints or dead letters: what batching alone reaches on
/// this machine. Handled events/s over the `n` messages on the stream.
async fn raw_batched_inbox(
    ctx: &Ctx,
    transport: &NatsTransport,
    n: u64,
    rows: Rows,
) -> Result<f64, BoxError> {
    ctx.db
        .execute_unprepared(
            "CREATE TABLE IF NOT EXISTS bench_raw_inbox (message_id TEXT PRIMARY KEY, \
             payload BYTEA NOT NULL, received_at TIMESTAMPTZ NOT NULL DEFAULT now()); \
             TRUNCATE bench_raw_inbox",
        )
        .await?;
    let jetstream = async_nats::jetstream::new(ctx.nats.clone());
    let stream = jetstream.get_stream(transport.stream_name()).await?;
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some(format!("bench-p4-raw-{rows:?}").to_lowercase()),
            ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
            max_ack_pending: 256,
            ..Default::default()
        })
        .await?;
    let handled = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let mut messages = consumer
        .stream()
        .max_messages_per_batch(256)
        .messages()
        .await?;
    let mut lanes = Vec::with_capacity(CONCURRENCY);
    let mut workers = Vec::with_capacity(CONCURRENCY);
    for _ in 0..CONCURRENCY {
        let (tx, mut rx) = tokio::sync::mpsc::channel(RAW_BATCH);
        lanes.push(tx);
        let db = ctx.db.clone();
        let client = ctx.nats.clone();
        let handled = handled.clone();
        workers.push(tokio::spawn(async move {
            let mut batch = Vec::with_capacity(RAW_BATCH);
            while rx.recv_many(&mut batch, RAW_BATCH).await > 0 {
                raw_batch(&db, &batch, rows).await?;
                let acks = batch
                    .iter()
                    .map(|m: &async_nats::jetstream::Message| m.ack());
                for acked in futures::future::join_all(acks).await {
                    acked?;
                }
                client.flush().await?;
                handled.fetch_add(batch.len() as u64, Ordering::Relaxed);
                batch.clear();
            }
            Ok::<(), BoxError>(())
        }));
    }
    for i in 0..n {
        let message = messages.next().await.ok_or("the stream ended early")??;
        // Round robin: no per-aggregate lanes, nothing waits behind anything.
        lanes[i as usize % CONCURRENCY].send(message).await?;
    }
    drop(lanes);
    for worker in workers {
        worker.await??;
    }
    let elapsed = t.elapsed();
    let done = handled.load(Ordering::Relaxed);
    let effects =
        crate::support::scalar_i64(&ctx.db, "SELECT count(*) FROM bench_effect").await? as u64;
    if done != n || effects != n {
        return Err(format!("hand-written inbox: {done} of {n} handled, {effects} effects").into());
    }
    Ok(n as f64 / elapsed.as_secs_f64())
}

/// One batch of the hand-written inbox in one transaction.
async fn raw_batch(
    db: &DatabaseConnection,
    batch: &[async_nats::jetstream::Message],
    rows: Rows,
) -> Result<(), BoxError> {
    let mut decoded = Vec::with_capacity(batch.len());
    for message in batch {
        let envelope = Envelope::from_json(&message.payload)?;
        let event: OrderPlaced = envelope.data_as()?;
        decoded.push((envelope, event, &message.payload));
    }
    let mut sql = String::from(match rows {
        Rows::Bare => "INSERT INTO bench_raw_inbox (message_id, payload) VALUES ",
        Rows::Sdk => {
            "INSERT INTO inbox_event (consumer, message_id, event_type, source, aggregate_type, \
             aggregate_id, aggregate_version, schema_version, payload, status, attempts, \
             received_at, processed_at) VALUES "
        }
    });
    let mut values: Vec<outbox::sea_orm::Value> = Vec::with_capacity(decoded.len() * 9);
    for (i, (envelope, _, payload)) in decoded.iter().enumerate() {
        if i > 0 {
            sql.push_str(", ");
        }
        match rows {
            Rows::Bare => {
                sql.push_str(&format!("(${}, ${})", values.len() + 1, values.len() + 2));
                values.push(envelope.id.clone().into());
                values.push(payload.to_vec().into());
            }
            Rows::Sdk => {
                let at = values.len();
                sql.push_str(&format!(
                    "(${}, ${}, ${}, ${}, ${}, ${}, ${}, ${}, ${}, 'DONE', 0, now(), now())",
                    at + 1,
                    at + 2,
                    at + 3,
                    at + 4,
                    at + 5,
                    at + 6,
                    at + 7,
                    at + 8,
                    at + 9
                ));
                values.extend([
                    "bench-p4-raw".into(),
                    envelope.id.clone().into(),
                    envelope.event_type.clone().into(),
                    envelope.source.clone().into(),
                    envelope.aggregate_type.clone().into(),
                    envelope.subject.clone().into(),
                    envelope.aggregate_version.into(),
                    envelope.schema_version.map(i64::from).into(),
                    payload.to_vec().into(),
                ]);
            }
        }
    }
    sql.push_str(" ON CONFLICT DO NOTHING RETURNING message_id");
    let tx = db.begin().await?;
    let fresh: HashSet<String> = tx
        .query_all_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            sql,
            values,
        ))
        .await?
        .iter()
        .map(|row| row.try_get::<String>("", "message_id"))
        .collect::<Result<_, _>>()?;
    for (envelope, event, _) in &decoded {
        if fresh.contains(&envelope.id) {
            insert_effect(&tx, CONSUMER, event.order_id, event.total_cents).await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

pub(crate) fn specs() -> Vec<Spec> {
    #[allow(unused_mut)]
    let mut specs = vec![
        spec("P4", "raw effect commits, 8 clients", "p4.raw_commits"),
        spec(
            "P4",
            "hand-written batched inbox, 8 workers",
            "p4.raw_batched",
        )
        .against("raw effect commits, 8 clients", "p4.raw_commits"),
        spec(
            "P4",
            "hand-written batched inbox, SDK's rows",
            "p4.raw_batched_rows",
        )
        .against("raw effect commits, 8 clients", "p4.raw_commits"),
        spec("P4", "SDK inbox handled, concurrency 8", "p4.sdk.handled")
            .against("raw effect commits, 8 clients", "p4.raw_commits")
            .target(Target::RatioAtLeast(1.5)),
        spec(
            "P4",
            "SDK inbox handled (vs hand-written, SDK's rows)",
            "p4.sdk.handled",
        )
        .against(
            "hand-written batched inbox, SDK's rows",
            "p4.raw_batched_rows",
        ),
        spec(
            "P4",
            "SDK inbox handled (vs hand-written batched inbox)",
            "p4.sdk.handled",
        )
        .against("hand-written batched inbox, 8 workers", "p4.raw_batched"),
    ];
    #[cfg(feature = "kafka")]
    specs.extend(crate::kafka::p4_specs());
    specs
}
