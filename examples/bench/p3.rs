//! P3 end-to-end latency, commit → handler committed, at three offered loads, with wake-ups on
//! (the cross-process `NOTIFY` path) and with polling only, against a hand-written pipeline
//! (commit an order, publish it to JetStream, consume it, commit the effect).

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use futures::StreamExt;
use outbox::prelude::*;
use outbox::relay::RelayConfig;
use outbox::sea_orm::{DatabaseConnection, TransactionTrait};
use outbox::transport::nats::async_nats::{self, jetstream::consumer::pull};

use crate::report::{Measure, Spec, Target, m, spec};
use crate::support::{
    BoxError, Ctx, OrderPlaced, insert_effect, insert_order, next_ids, place_order, quantile,
};

pub(crate) const CONSUMER: &str = "bench-p3";
const CUSTOMERS: i64 = 1_000;
/// SENT rows in the table when each measure starts.
const HISTORY: u64 = 20_000;
/// Poll interval of the relay when wake-ups are off.
pub(crate) const POLL: Duration = Duration::from_millis(100);
/// Quantiles kept for the chart.
pub(crate) const QUANTILES: [f64; 13] = [
    0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1.0,
];

/// When each order's handler transaction committed (filled by the handler's after-commit).
pub(crate) static HANDLED: Mutex<Vec<(i64, Instant)>> = Mutex::new(Vec::new());

#[outbox::inbox_handler(consumer = "bench-p3")]
async fn record_effect(
    tx: &InboxTransaction,
    event: Event<OrderPlaced>,
) -> Result<(), HandlerError> {
    insert_effect(tx, CONSUMER, event.order_id, event.total_cents).await?;
    crate::support::note_handled(tx, &HANDLED, event.order_id);
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The SDK, the relay woken by the producers' coalesced `NOTIFY`.
    Wake,
    /// The SDK, the relay polling every `POLL`.
    Poll,
    /// Commit, then publish by hand; consume by hand and commit the effect.
    Raw,
    /// The whole SDK pipeline with the producers committing through the runtime's own handle:
    /// the relay's fast path publishes each commit right after it.
    Fast,
    /// The SDK's producer and relay (wake-ups on), the hand-written consumer: the relay's share.
    RelayOnly,
    /// The whole SDK pipeline with the relay reading the WAL (feature `postgres-wal`, on a
    /// server with `wal_level = logical`).
    Wal,
    /// The hand-written producer publishing CloudEvents, the SDK's consumer: the inbox's share.
    ConsumerOnly,
    /// The SDK's producer, a hand-written relay polling every millisecond, the hand-written
    /// consumer: what any outbox relay costs, the baseline of `RelayOnly`.
    RawRelay,
}

impl Mode {
    fn key(self) -> &'static str {
        match self {
            Mode::Wake => "wake",
            Mode::Poll => "poll",
            Mode::Raw => "raw",
            Mode::Fast => "fast",
            Mode::Wal => "wal",
            Mode::RelayOnly => "relay",
            Mode::ConsumerOnly => "consumer",
            Mode::RawRelay => "rawrelay",
        }
    }
}

pub(crate) async fn run(ctx: &Ctx) -> Result<Vec<Measure>, BoxError> {
    let mut out = Vec::new();
    // `BENCH_P3_MODES=relay,raw` and `BENCH_P3_RATES=1000` narrow a run down while looking into
    // one figure.
    let wal = crate::support::wal_available(ctx).await?;
    let modes: Vec<Mode> = [
        Mode::Raw,
        Mode::Fast,
        Mode::Wal,
        Mode::Wake,
        Mode::Poll,
        Mode::RelayOnly,
        Mode::ConsumerOnly,
        Mode::RawRelay,
    ]
    .into_iter()
    .filter(|mode| *mode != Mode::Wal || wal)
    .filter(|mode| {
        std::env::var("BENCH_P3_MODES")
            .map_or(true, |list| list.split(',').any(|m| m.trim() == mode.key()))
    })
    .collect();
    let rates = crate::support::env_list("BENCH_P3_RATES", &ctx.sizes.p3_rates)?;
    for rate in rates {
        for &mode in &modes {
            let (latencies, stages) =
                measure(ctx, mode, rate, &mut crate::p10::Meter::off()).await?;
            let key = format!("p3.{}.r{rate}", mode.key());
            for (stage, p50, p99) in stages {
                out.push(m(format!("{key}.{stage}.p50"), p50, "ms"));
                out.push(m(format!("{key}.{stage}.p99"), p99, "ms"));
            }
            out.push(m(format!("{key}.p50"), ms(quantile(&latencies, 0.5)), "ms"));
            out.push(m(
                format!("{key}.p99"),
                ms(quantile(&latencies, 0.99)),
                "ms",
            ));
            out.push(m(
                format!("{key}.p999"),
                ms(quantile(&latencies, 0.999)),
                "ms",
            ));
            for q in QUANTILES {
                out.push(m(format!("{key}.q{q}"), ms(quantile(&latencies, q)), "ms"));
            }
        }
    }
    Ok(out)
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// The stages of the SDK's pipeline, from its own timestamps (the database's clock): the event's
/// `created_at` (its INSERT, right before the producer's COMMIT) to its `sent_at` (the relay's
/// mark, after the broker's confirmation), and to the consumer's `received_at` (its inbox row,
/// written in the handler's transaction). p50 and p99 in milliseconds, over every event of the
/// run.
async fn stages(ctx: &Ctx) -> Result<Vec<(&'static str, f64, f64)>, BoxError> {
    let row = ctx
        .db
        .query_one_raw(outbox::sea_orm::Statement::from_string(
            outbox::sea_orm::DbBackend::Postgres,
            format!(
                "SELECT {sent}, {received} FROM (SELECT event_id, created_at, sent_at \
                 FROM outbox_event UNION ALL SELECT event_id, created_at, sent_at \
                 FROM outbox_sent) o JOIN (SELECT consumer, message_id, received_at FROM \
                 inbox_event UNION ALL SELECT consumer, message_id, received_at FROM inbox_done) i \
                 ON i.consumer = '{CONSUMER}' AND i.message_id = o.event_id::text",
                sent = quantiles("o.sent_at - o.created_at", "sent"),
                received = quantiles("i.received_at - o.created_at", "received"),
            ),
        ))
        .await?
        .ok_or("no stage timestamps")?;
    let get = |column: &str| -> Result<f64, BoxError> {
        Ok(row.try_get::<Option<f64>>("", column)?.unwrap_or(f64::NAN))
    };
    Ok(vec![
        ("insert_to_sent", get("sent_p50")?, get("sent_p99")?),
        (
            "insert_to_received",
            get("received_p50")?,
            get("received_p99")?,
        ),
    ])
}

/// `percentile_cont` p50 and p99 of an interval, in milliseconds, as `{name}_p50`, `{name}_p99`.
fn quantiles(interval: &str, name: &str) -> String {
    let q = |p: f64| {
        format!(
            "percentile_cont({p}) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM {interval})) * 1000 \
             AS {name}_p{}",
            (p * 100.0) as u32
        )
    };
    format!("{}, {}", q(0.5), q(0.99))
}

/// Offer `rate` orders per second for the warm-up and the window; the sorted latencies, in
/// microseconds, of the orders committed after the warm-up, and for the whole SDK pipeline its
/// stages. `meter` reads its snapshots right before the orders are offered and right after the
/// last one was handled (P10).
pub(crate) async fn measure(
    ctx: &Ctx,
    mode: Mode,
    rate: u64,
    meter: &mut crate::p10::Meter,
) -> Result<(Vec<u64>, Vec<(&'static str, f64, f64)>), BoxError> {
    ctx.reset().await?;
    // A running service's table holds the SENT rows retention keeps, and its statistics say so;
    // an emptied table whose statistics say "empty" is not one (PostgreSQL caches plans that
    // scan it until autovacuum analyzes it, which a run of seconds does not wait for).
    crate::p5::add_sent(&ctx.db, HISTORY, HISTORY).await?;
    crate::p5::vacuum(&ctx.db).await?;
    HANDLED.lock().unwrap_or_else(|p| p.into_inner()).clear();
    let transport = Arc::new(ctx.transport("bench_p3").await?);
    let warm_up = if ctx.smoke {
        Duration::from_millis(200)
    } else {
        Duration::from_secs(1)
    };

    let committed: Vec<(i64, Instant)>;
    let handled: HashMap<i64, Instant>;
    let mut stage_times = Vec::new();
    match mode {
        Mode::ConsumerOnly => {
            let runtime = Runtime::builder(ctx.db.clone())
                .source("bench-p3")
                .transport(transport.clone())
                .without_relay()
                .consumers([CONSUMER])
                .expect_consumers([CONSUMER])
                .start()
                .await?;
            meter.start(ctx).await?;
            committed = offer_published(ctx, &transport, rate, warm_up, true).await?;
            handled = wait_seen(committed.len(), &HANDLED).await?;
            meter.stop(ctx).await?;
            runtime.shutdown().await;
        }
        Mode::RelayOnly => {
            let seen: Arc<Mutex<Vec<(i64, Instant)>>> = Arc::default();
            let consumer = raw_consumer(ctx, &transport, seen.clone()).await?;
            let runtime = Runtime::builder(ctx.db.clone())
                .source("bench-p3")
                .transport(transport.clone())
                .consumers(Vec::<String>::new())
                .start()
                .await?;
            let producer = Outbox::new("bench-p3");
            meter.start(ctx).await?;
            committed = offer_orders(ctx, &producer, rate, warm_up).await?;
            handled = wait_seen(committed.len(), &seen).await?;
            meter.stop(ctx).await?;
            consumer.abort();
            runtime.shutdown().await;
        }
        Mode::RawRelay => {
            let seen: Arc<Mutex<Vec<(i64, Instant)>>> = Arc::default();
            let consumer = raw_consumer(ctx, &transport, seen.clone()).await?;
            let stop = Arc::new(AtomicBool::new(false));
            let relay = tokio::spawn(crate::p2::raw_relay(
                ctx.db.clone(),
                async_nats::jetstream::new(ctx.nats.clone()),
                transport.subject("bench.order_placed"),
                stop.clone(),
            ));
            // No wake-up: the hand-written relay polls.
            let producer = Outbox::builder("bench-p3").notify_channel(None).build();
            meter.start(ctx).await?;
            committed = offer_orders(ctx, &producer, rate, warm_up).await?;
            handled = wait_seen(committed.len(), &seen).await?;
            meter.stop(ctx).await?;
            stop.store(true, Ordering::Relaxed);
            relay.await??;
            consumer.abort();
        }
        Mode::Fast | Mode::Wake | Mode::Poll | Mode::Wal => {
            let relay = if mode != Mode::Poll {
                RelayConfig::default()
            } else {
                RelayConfig::default()
                    .listen(false)
                    .poll_interval(POLL)
                    .linger(None)
            };
            let builder = Runtime::builder(ctx.db.clone())
                .source("bench-p3")
                .transport(transport.clone())
                .relay_config(relay)
                .consumers([CONSUMER])
                .expect_consumers([CONSUMER]);
            // The WAL relay reads the commits from the server, whatever handle they went by.
            #[cfg(feature = "postgres-wal")]
            let builder = match mode {
                Mode::Wal => builder.wal(crate::support::wal_config(ctx)),
                _ => builder,
            };
            #[cfg(not(feature = "postgres-wal"))]
            if mode == Mode::Wal {
                return Err("the WAL relay needs the postgres-wal feature".into());
            }
            let runtime = builder.start().await?;
            #[cfg(feature = "postgres-wal")]
            if mode == Mode::Wal {
                crate::support::wait_streaming(ctx).await?;
            }
            // With the fast path, the producers commit through the runtime's handle. Otherwise
            // they are another process as far as the relay can tell: their own handle, reaching
            // it by the cross-process wake-up only (or not at all).
            let producer = match mode {
                Mode::Fast => runtime.outbox().clone(),
                Mode::Wake | Mode::Wal => Outbox::new("bench-p3"),
                _ => Outbox::builder("bench-p3").notify_channel(None).build(),
            };
            meter.start(ctx).await?;
            committed = offer_orders(ctx, &producer, rate, warm_up).await?;
            handled = wait_seen(committed.len(), &HANDLED).await?;
            meter.stop(ctx).await?;
            let report = runtime.shutdown().await;
            let stats = report.consumer(CONSUMER);
            if stats.dead > 0 || stats.handled as usize != committed.len() {
                return Err(format!("the consumer ended with {stats:?}").into());
            }
            stage_times = stages(ctx).await?;
            #[cfg(feature = "postgres-wal")]
            if mode == Mode::Wal {
                crate::support::drop_wal_slot(ctx).await?;
            }
        }
        Mode::Raw => {
            let seen: Arc<Mutex<Vec<(i64, Instant)>>> = Arc::default();
            let consumer = raw_consumer(ctx, &transport, seen.clone()).await?;
            meter.start(ctx).await?;
            committed = offer_published(ctx, &transport, rate, warm_up, false).await?;
            handled = wait_seen(committed.len(), &seen).await?;
            meter.stop(ctx).await?;
            consumer.abort();
        }
    }
    ctx.drop_stream(&transport).await;

    let effects =
        crate::support::scalar_i64(&ctx.db, "SELECT count(*) FROM bench_effect").await? as usize;
    if effects != committed.len() || handled.len() != committed.len() {
        return Err(format!(
            "P3 {}: {} orders committed, {} handled, {effects} effect rows",
            mode.key(),
            committed.len(),
            handled.len()
        )
        .into());
    }
    let first = committed.first().map_or(Instant::now(), |(_, t)| *t);
    let mut latencies: Vec<u64> = committed
        .iter()
        .filter(|(_, at)| at.duration_since(first) >= warm_up)
        .map(|(id, at)| handled[id].saturating_duration_since(*at).as_micros() as u64)
        .collect();
    latencies.sort_unstable();
    Ok((latencies, stage_times))
}

/// The hand-written producer: commit the order, then publish it and wait for JetStream's ack,
/// as a bare event or (`envelope`) as a CloudEvents envelope with a message id that the SDK's
/// consumer takes; when the commit returned.
async fn commit_then_publish(
    db: &DatabaseConnection,
    jetstream: &async_nats::jetstream::Context,
    subject: String,
    id: i64,
    envelope: bool,
) -> Result<Instant, BoxError> {
    let event = OrderPlaced::sample(id, CUSTOMERS);
    let tx = db.begin().await?;
    insert_order(&tx, &event).await?;
    tx.commit().await?;
    let committed = Instant::now();
    if envelope {
        let event_id = uuid::Uuid::now_v7().to_string();
        let body = serde_json::to_vec(&serde_json::json!({
            "specversion": "1.0", "id": event_id, "type": "bench.order_placed",
            "source": "bench-p3", "subject": event.customer, "aggregatetype": "order",
            "datacontenttype": "application/json", "data": event,
        }))?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", event_id.as_str());
        jetstream
            .publish_with_headers(subject, headers, body.into())
            .await?
            .await?;
    } else {
        jetstream
            .publish(subject, serde_json::to_vec(&event)?.into())
            .await?
            .await?;
    }
    Ok(committed)
}

/// Orders placed through the SDK's `producer` at `rate` per second (see [`offer`]).
async fn offer_orders(
    ctx: &Ctx,
    producer: &Outbox,
    rate: u64,
    warm_up: Duration,
) -> Result<Vec<(i64, Instant)>, BoxError> {
    let db = ctx.db.clone();
    let producer = producer.clone();
    offer(rate, warm_up + ctx.sizes.p3_window, move |id| {
        let db = db.clone();
        let producer = producer.clone();
        async move { place_order(&db, &producer, &OrderPlaced::sample(id, CUSTOMERS)).await }
    })
    .await
}

/// Orders committed then published by hand ([`commit_then_publish`]) at `rate` per second.
async fn offer_published(
    ctx: &Ctx,
    transport: &outbox::transport::nats::NatsTransport,
    rate: u64,
    warm_up: Duration,
    envelope: bool,
) -> Result<Vec<(i64, Instant)>, BoxError> {
    let db = ctx.db.clone();
    let jetstream = async_nats::jetstream::new(ctx.nats.clone());
    let subject = transport.subject("bench.order_placed");
    offer(rate, warm_up + ctx.sizes.p3_window, move |id| {
        let db = db.clone();
        let jetstream = jetstream.clone();
        let subject = subject.clone();
        async move { commit_then_publish(&db, &jetstream, subject, id, envelope).await }
    })
    .await
}

/// [`wait_handled`] for what a consumer recorded in `seen` (the hand-written consumer's list,
/// or [`HANDLED`] for the SDK's).
async fn wait_seen(
    n: usize,
    seen: &Mutex<Vec<(i64, Instant)>>,
) -> Result<HashMap<i64, Instant>, BoxError> {
    wait_handled(n, || seen.lock().unwrap_or_else(|p| p.into_inner()).clone()).await
}

/// Open-loop load: start `op` at `rate` per second for `window`, each in its own task (at most
/// 64 at once); the orders committed and when each commit returned (what `op` returns).
pub(crate) async fn offer<F, Fut>(
    rate: u64,
    window: Duration,
    op: F,
) -> Result<Vec<(i64, Instant)>, BoxError>
where
    F: Fn(i64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Instant, BoxError>> + Send + 'static,
{
    let op = Arc::new(op);
    let limit = Arc::new(tokio::sync::Semaphore::new(64));
    let start = Instant::now();
    let mut issued = 0u64;
    let mut tasks = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while start.elapsed() < window {
        tick.tick().await;
        let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
        while issued < due {
            issued += 1;
            let permit = limit.clone().acquire_owned().await?;
            let op = op.clone();
            let id = next_ids(1);
            tasks.push(tokio::spawn(async move {
                let result = op(id).await;
                drop(permit);
                result.map(|committed| (id, committed))
            }));
        }
    }
    let mut committed = Vec::with_capacity(tasks.len());
    for task in tasks {
        committed.push(task.await??);
    }
    committed.sort_by_key(|(_, at)| *at);
    Ok(committed)
}

/// Wait until `expected` orders were handled; when each was.
async fn wait_handled(
    expected: usize,
    snapshot: impl Fn() -> Vec<(i64, Instant)>,
) -> Result<HashMap<i64, Instant>, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let seen = snapshot();
        if seen.len() >= expected {
            let mut handled = HashMap::with_capacity(seen.len());
            for (id, at) in seen {
                if handled.insert(id, at).is_some() {
                    return Err(format!("order {id} was handled twice").into());
                }
            }
            return Ok(handled);
        }
        if Instant::now() > deadline {
            return Err(format!("{} of {expected} orders handled after 120 s", seen.len()).into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The hand-written consumer: pull from the stream, commit the effect, ack; 8 at a time.
async fn raw_consumer(
    ctx: &Ctx,
    transport: &outbox::transport::nats::NatsTransport,
    seen: Arc<Mutex<Vec<(i64, Instant)>>>,
) -> Result<tokio::task::JoinHandle<()>, BoxError> {
    let jetstream = async_nats::jetstream::new(ctx.nats.clone());
    let stream = jetstream.get_stream(transport.stream_name()).await?;
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("bench-p3-raw".into()),
            ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    let db: DatabaseConnection = ctx.db.clone();
    Ok(tokio::spawn(async move {
        let limit = Arc::new(tokio::sync::Semaphore::new(8));
        while let Some(Ok(message)) = messages.next().await {
            let Ok(permit) = limit.clone().acquire_owned().await else {
                return;
            };
            let db = db.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                // A bare event (hand-written producer) or a CloudEvents envelope (the SDK's).
                let event = match serde_json::from_slice::<OrderPlaced>(&message.payload) {
                    Ok(event) => event,
                    Err(_) => match Envelope::from_json(&message.payload)
                        .ok()
                        .and_then(|e| e.data_as::<OrderPlaced>().ok())
                    {
                        Some(event) => event,
                        None => return,
                    },
                };
                let done = async {
                    let tx = db.begin().await?;
                    insert_effect(&tx, CONSUMER, event.order_id, event.total_cents).await?;
                    tx.commit().await
                }
                .await;
                if done.is_ok() {
                    seen.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((event.order_id, Instant::now()));
                    let _ = message.ack().await;
                }
                drop(permit);
            });
        }
    }))
}

pub(crate) fn specs(ctx: &Ctx) -> Vec<Spec> {
    let [lowest, low, high] = ctx.sizes.p3_rates;
    let mut specs = Vec::new();
    for rate in [lowest, low, high] {
        // Targets, as ratios to the hand-written pipeline. The fast path's: p50 ≤ 2×, p99 ≤ 3×
        // at 200 and 1,000 events/s.
        for (mode, what) in [
            ("fast", "fast path"),
            ("wal", "WAL relay"),
            ("wake", "wake-ups"),
        ] {
            for (q, label) in [("p50", "p50"), ("p99", "p99"), ("p999", "p99.9")] {
                let target = match (mode, q) {
                    ("fast" | "wal", "p50") if rate != high => Some(2.0),
                    ("fast" | "wal", "p99") if rate != high => Some(3.0),
                    ("wake", "p50") if rate == low => Some(3.0),
                    ("wake", "p99") if rate == low => Some(15.0),
                    ("wake", "p99") if rate == high => Some(30.0),
                    _ => None,
                };
                let mut row = spec(
                    "P3",
                    format!("commit → handled {label}, {rate}/s, {what}"),
                    format!("p3.{mode}.r{rate}.{q}"),
                )
                .against(
                    format!("hand-written pipeline {label}"),
                    format!("p3.raw.r{rate}.{q}"),
                );
                // The fast path's and the WAL relay's targets are ratios to the hand-written
                // pipeline; the wake-ups' are the ratios as they were set before.
                if let Some(t) = target {
                    row = row.target(match mode {
                        "fast" | "wal" => Target::RatioAtMost(t),
                        _ => Target::AtMost(t),
                    });
                }
                specs.push(row);
            }
        }
        for (q, label) in [("p50", "p50"), ("p99", "p99")] {
            specs.push(
                spec(
                    "P3",
                    format!("… SDK relay, hand-written consumer {label}, {rate}/s"),
                    format!("p3.relay.r{rate}.{q}"),
                )
                .against(
                    format!("hand-written pipeline {label}"),
                    format!("p3.raw.r{rate}.{q}"),
                ),
            );
            specs.push(
                spec(
                    "P3",
                    format!("… SDK relay (vs hand-written relay) {label}, {rate}/s"),
                    format!("p3.relay.r{rate}.{q}"),
                )
                .against(
                    format!("hand-written relay polling 1 ms {label}"),
                    format!("p3.rawrelay.r{rate}.{q}"),
                ),
            );
            specs.push(
                spec(
                    "P3",
                    format!("… hand-written producer, SDK consumer {label}, {rate}/s"),
                    format!("p3.consumer.r{rate}.{q}"),
                )
                .against(
                    format!("hand-written pipeline {label}"),
                    format!("p3.raw.r{rate}.{q}"),
                ),
            );
            specs.push(
                spec(
                    "P3",
                    format!(
                        "commit → handled {label}, {rate}/s, polling {}ms",
                        POLL.as_millis()
                    ),
                    format!("p3.poll.r{rate}.{q}"),
                )
                .against(format!("wake-ups {label}"), format!("p3.wake.r{rate}.{q}")),
            );
        }
        for (stage, what) in [
            ("insert_to_sent", "event INSERT → SENT mark"),
            ("insert_to_received", "event INSERT → consumer's inbox row"),
        ] {
            for q in ["p50", "p99"] {
                specs.push(spec(
                    "P3",
                    format!("… stage {what} {q}, {rate}/s, fast path"),
                    format!("p3.fast.r{rate}.{stage}.{q}"),
                ));
                specs.push(spec(
                    "P3",
                    format!("… stage {what} {q}, {rate}/s, wake-ups"),
                    format!("p3.wake.r{rate}.{stage}.{q}"),
                ));
                specs.push(spec(
                    "P3",
                    format!("… stage {what} {q}, {rate}/s, WAL relay"),
                    format!("p3.wal.r{rate}.{stage}.{q}"),
                ));
            }
        }
    }
    specs
}
