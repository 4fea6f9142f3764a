//! P4 inbox throughput: a backlog on JetStream handled by one consumer (its handler inserts an
//! effect row), against raw PostgreSQL commits of that effect row at the same concurrency.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use outbox::inbox::InboxConfig;
use outbox::prelude::*;
use outbox::relay::{Relay, RelayConfig};
use outbox::sea_orm::TransactionTrait;

use crate::report::{Measure, Spec, Target, m, spec};
use crate::support::{
    BoxError, Ctx, OrderPlaced, closed_loop, insert_effect, pre_enqueue, wait_drained,
};

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
    pre_enqueue(&ctx.db, n, 1_000, "PENDING").await?;
    let relay = Relay::new(ctx.db.clone(), transport.clone())
        .with_config(RelayConfig {
            listen: false,
            ..RelayConfig::default()
        })
        .spawn();
    wait_drained(&ctx.db, Instant::now(), Duration::from_secs(300)).await?;
    relay.shutdown().await?;

    let runtime = Runtime::builder(ctx.db.clone())
        .source("bench-p4")
        .transport_arc(transport.clone())
        .without_relay()
        .inbox_config(InboxConfig {
            concurrency: CONCURRENCY,
            ..InboxConfig::default()
        })
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
    Ok(vec![
        m("p4.raw_commits", raw.per_sec(), "tx/s"),
        m("p4.sdk.handled", n as f64 / elapsed.as_secs_f64(), "ev/s"),
    ])
}

pub(crate) fn specs() -> Vec<Spec> {
    vec![
        spec("P4", "raw effect commits, 8 clients", "p4.raw_commits"),
        spec("P4", "SDK inbox handled, concurrency 8", "p4.sdk.handled")
            .against("raw effect commits, 8 clients", "p4.raw_commits")
            .target(Target::RatioAtLeast(1.5)),
    ]
}
