//! P13 the standby wait: what `RelayConfig::wait_for_standbys(1)` and
//! `InboxConfig::wait_for_standbys(1)` cost on a primary with one asynchronous streaming standby,
//! against the same road with `wait_for_standbys(0)` in the same run.
//!
//! The servers come from `scripts/pg-failover up async` (in `/var/lib/outbox-bench-p13`, the
//! primary on 127.0.0.1:5442 and the standby on 5443: beside the failover test's clusters) and
//! are stopped at the end; the script needs root (`runuser -u postgres`). When it fails, P13 is
//! skipped with the reason, or fails with `OUTBOX_REQUIRE_SERVICES=1`.
//!
//! Relay, for the fast path (commits through the runtime's handle) and the claim loop (commits
//! through a handle of their own, the relay woken by `NOTIFY`), each with 0 and 1 standby:
//! - latency: orders offered at `BENCH_P13_RATE` per second (1,000; 100 in the smoke run) for
//!   `BENCH_P13_SECONDS` (10; 1) after a warm-up, commit returned → the message seen on its
//!   JetStream subject by a plain NATS subscriber (the relay publishes after the standby wait and
//!   marks after JetStream's confirmation), p50 and p99;
//! - throughput: [`PRODUCERS`] closed-loop producers for the same window, events seen on the
//!   subject per second, from the first commit to the last message seen.
//!
//! Inbox, 0 and 1 standby: CloudEvents published by hand at the same rate, JetStream's
//! confirmation → the handler's transaction committed, p50 and p99 (the standby wait comes after
//! that commit and before the ack: it holds the delivery's lane, so it shows as the lanes fill);
//! and a backlog of [`BACKLOG`] messages (300 in the smoke run) worked off, handled per second.
//!
//! Beside each, the standby's flush lag as the primary sees it (`pg_stat_replication.flush_lag`,
//! sampled every 100 ms: p50 and max). Checked: every event seen once on the subject and stored
//! once in the stream, none left unsent; every message handled once, none dead.
//! Only with `--only p13` (and in `--smoke`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use outbox::inbox::InboxConfig;
use outbox::prelude::*;
use outbox::relay::RelayConfig;
use outbox::sea_orm::DatabaseConnection;
use outbox::transport::nats::{NatsTransport, async_nats};

use crate::p13_cluster::{Lag, Primary};
use crate::report::{Measure, Spec, m, spec};
use crate::support::{BoxError, Ctx, OrderPlaced, closed_loop, env_list, place_order, quantile};

const CONSUMER: &str = "bench-p13";
const CUSTOMERS: i64 = 1_000;
/// Closed-loop producers of the throughput window.
const PRODUCERS: usize = 16;
/// Messages the inbox works off in the full run.
const BACKLOG: u64 = 20_000;
/// Backlog messages published before their acks are awaited.
const PUBLISH_CHUNK: u64 = 256;
/// The standbys waited for: the baseline and one.
const STANDBYS: [u32; 2] = [0, 1];

/// When each order's handler transaction committed.
static HANDLED: Mutex<Vec<(i64, Instant)>> = Mutex::new(Vec::new());

#[outbox::inbox_handler(consumer = "bench-p13")]
async fn record_effect(
    tx: &InboxTransaction,
    event: Event<OrderPlaced>,
) -> Result<(), HandlerError> {
    crate::support::insert_effect(tx, CONSUMER, event.order_id, event.total_cents).await?;
    crate::support::note_handled(tx, &HANDLED, event.order_id);
    Ok(())
}

/// The relay's roads measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Road {
    Fast,
    Claim,
}

impl Road {
    fn key(self) -> &'static str {
        match self {
            Road::Fast => "fast",
            Road::Claim => "claim",
        }
    }
}

/// What one configuration measured.
struct Outcome {
    /// Sorted latencies after the warm-up, in microseconds.
    latencies_us: Vec<u64>,
    throughput: f64,
    lag: Lag,
}

struct Load {
    rate: u64,
    warm_up: Duration,
    window: Duration,
}

pub(crate) async fn run(ctx: &Ctx) -> Result<Vec<Measure>, BoxError> {
    let load = Load {
        rate: env_list("BENCH_P13_RATE", &[if ctx.smoke { 100 } else { 1_000 }])?[0],
        warm_up: Duration::from_millis(if ctx.smoke { 200 } else { 1_000 }),
        window: Duration::from_secs(
            env_list("BENCH_P13_SECONDS", &[if ctx.smoke { 1 } else { 10 }])?[0],
        ),
    };
    if let Err(why) = crate::p13_cluster::up().await {
        if std::env::var("OUTBOX_REQUIRE_SERVICES").is_ok_and(|v| v == "1") {
            return Err(format!("P13 needs a primary and a standby: {why}").into());
        }
        println!("p13: skipped: no primary with a streaming standby ({why})");
        return Ok(Vec::new());
    }
    let measured = measure_all(ctx, &load).await;
    crate::p13_cluster::down().await;
    measured
}

async fn measure_all(ctx: &Ctx, load: &Load) -> Result<Vec<Measure>, BoxError> {
    let primary = Primary::open().await?;
    if !primary.streaming().await? {
        return Err("P13: the standby does not stream from the primary".into());
    }
    let mut out = Vec::new();
    let mut cases = Vec::new();
    for road in [Road::Fast, Road::Claim] {
        for standbys in STANDBYS {
            cases.push((Some(road), standbys));
        }
    }
    for standbys in STANDBYS {
        cases.push((None, standbys));
    }
    for (road, standbys) in cases {
        let (what, outcome) = match road {
            Some(road) => (
                road.key(),
                relay_case(ctx, &primary, road, standbys, load).await?,
            ),
            None => ("inbox", inbox_case(ctx, &primary, standbys, load).await?),
        };
        let key = format!("p13.{what}.s{standbys}");
        let p50 = quantile(&outcome.latencies_us, 0.50) as f64 / 1000.0;
        let p99 = quantile(&outcome.latencies_us, 0.99) as f64 / 1000.0;
        println!(
            "p13: {what}, wait_for_standbys({standbys}): p50 {p50:.2} ms, p99 {p99:.2} ms over {} \
             events at {}/s; throughput {:.0}/s; standby flush lag p50 {:.2} ms, max {:.2} ms \
             ({} samples)",
            outcome.latencies_us.len(),
            load.rate,
            outcome.throughput,
            outcome.lag.p50_ms,
            outcome.lag.max_ms,
            outcome.lag.samples,
        );
        out.push(m(format!("{key}.p50"), p50, "ms"));
        out.push(m(format!("{key}.p99"), p99, "ms"));
        out.push(m(format!("{key}.throughput"), outcome.throughput, "ev/s"));
        if outcome.lag.samples > 0 {
            out.push(m(format!("{key}.flush_lag_p50"), outcome.lag.p50_ms, "ms"));
            out.push(m(format!("{key}.flush_lag_max"), outcome.lag.max_ms, "ms"));
        }
    }
    primary.close().await?;
    Ok(out)
}

/// One relay configuration: its latency at the offered rate, then its throughput under
/// closed-loop producers, then the checks.
async fn relay_case(
    ctx: &Ctx,
    primary: &Primary,
    road: Road,
    standbys: u32,
    load: &Load,
) -> Result<Outcome, BoxError> {
    primary.reset().await?;
    let namespace = format!("bench_p13_{}_s{standbys}", road.key());
    let transport = Arc::new(ctx.transport(&namespace).await?);
    let (watcher, seen) = watch(ctx, transport.subject("bench.order_placed")).await?;
    let runtime = Runtime::builder(primary.db.clone())
        .source("bench-p13")
        .transport(transport.clone())
        .relay_config(RelayConfig::default().wait_for_standbys(standbys))
        .consumers(Vec::<String>::new())
        .start()
        .await?;
    // The fast path takes the commits of the runtime's own handle; a handle of its own reaches
    // the claim loop by the `NOTIFY` wake-up.
    let producer = match road {
        Road::Fast => runtime.outbox().clone(),
        Road::Claim => Outbox::new("bench-p13"),
    };
    let lag = primary.sample_lag();

    let db = primary.db.clone();
    let offered = producer.clone();
    let committed = crate::p3::offer(load.rate, load.warm_up + load.window, move |id| {
        let (db, producer) = (db.clone(), offered.clone());
        async move { place_order(&db, &producer, &OrderPlaced::sample(id, CUSTOMERS)).await }
    })
    .await?;
    let first_seen = wait_seen(&seen, committed.len()).await?;
    let latencies_us = latencies(&committed, &first_seen, load.warm_up)?;

    let started = Instant::now();
    let db = primary.db.clone();
    let loaded = closed_loop(PRODUCERS, load.window, move |id| {
        let (db, producer) = (db.clone(), producer.clone());
        async move {
            place_order(&db, &producer, &OrderPlaced::sample(id, CUSTOMERS)).await?;
            Ok(())
        }
    })
    .await?;
    let total = committed.len() + loaded.ops as usize;
    let all_seen = wait_seen(&seen, total).await?;
    let last = all_seen.values().max().copied().unwrap_or(started);
    let throughput = loaded.ops as f64 / last.duration_since(started).as_secs_f64();
    let lag = lag.stop().await;
    runtime.shutdown().await;
    // Anything published twice would show on the subject by now.
    tokio::time::sleep(Duration::from_millis(200)).await;
    watcher.abort();
    check_relayed(ctx, primary, &transport, &seen, total).await?;
    ctx.drop_stream(&transport).await;
    Ok(Outcome {
        latencies_us,
        throughput,
        lag,
    })
}

/// A plain NATS subscriber on `subject`: every order it saw, with when.
async fn watch(
    ctx: &Ctx,
    subject: String,
) -> Result<(tokio::task::JoinHandle<()>, Arc<Mutex<Vec<(i64, Instant)>>>), BoxError> {
    let mut subscriber = ctx.nats.subscribe(subject).await?;
    ctx.nats.flush().await?;
    let seen: Arc<Mutex<Vec<(i64, Instant)>>> = Arc::default();
    let noted = seen.clone();
    let task = tokio::spawn(async move {
        while let Some(message) = subscriber.next().await {
            let at = Instant::now();
            if let Some(event) = Envelope::from_json(&message.payload)
                .ok()
                .and_then(|e| e.data_as::<OrderPlaced>().ok())
            {
                noted
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((event.order_id, at));
            }
        }
    });
    Ok((task, seen))
}

/// Wait until `n` distinct orders were seen (or handled); when each was first.
async fn wait_seen(
    seen: &Mutex<Vec<(i64, Instant)>>,
    n: usize,
) -> Result<HashMap<i64, Instant>, BoxError> {
    let limit = Duration::from_secs(60) + Duration::from_millis(n as u64);
    let since = Instant::now();
    loop {
        let count = seen.lock().unwrap_or_else(|p| p.into_inner()).len();
        if count >= n {
            let mut first = HashMap::with_capacity(count);
            for (id, at) in seen.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                first.entry(*id).or_insert(*at);
            }
            if first.len() >= n {
                return Ok(first);
            }
        }
        if since.elapsed() > limit {
            return Err(format!("P13: {count} of {n} events arrived after {limit:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Commit (or publish) → seen (or handled) of the orders after the warm-up, sorted, in µs.
fn latencies(
    committed: &[(i64, Instant)],
    arrived: &HashMap<i64, Instant>,
    warm_up: Duration,
) -> Result<Vec<u64>, BoxError> {
    let first = committed.first().map_or(Instant::now(), |(_, t)| *t);
    let mut latencies = Vec::with_capacity(committed.len());
    for (id, at) in committed {
        if at.duration_since(first) < warm_up {
            continue;
        }
        let arrived = arrived
            .get(id)
            .ok_or(format!("P13: order {id} never arrived"))?;
        latencies.push(arrived.saturating_duration_since(*at).as_micros() as u64);
    }
    latencies.sort_unstable();
    Ok(latencies)
}

/// Every event committed was published once: seen once on the subject, stored once in the
/// stream, none left unsent in the outbox.
async fn check_relayed(
    ctx: &Ctx,
    primary: &Primary,
    transport: &NatsTransport,
    seen: &Mutex<Vec<(i64, Instant)>>,
    total: usize,
) -> Result<(), BoxError> {
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut times: HashMap<i64, usize> = HashMap::with_capacity(seen.len());
    for (id, _) in &seen {
        *times.entry(*id).or_default() += 1;
    }
    let twice = times.values().filter(|n| **n > 1).count();
    if times.len() != total || twice > 0 {
        return Err(format!(
            "P13: {total} events committed, {} seen on the subject, {twice} of them more than once",
            times.len()
        )
        .into());
    }
    let jetstream = async_nats::jetstream::new(ctx.nats.clone());
    let mut stream = jetstream.get_stream(transport.stream_name()).await?;
    let stored = stream.info().await?.state.messages;
    if stored != total as u64 {
        return Err(format!("P13: {total} events committed, {stored} in the stream").into());
    }
    let unsent = crate::support::unsent(&primary.db).await?;
    if unsent != 0 {
        return Err(format!("P13: {unsent} events left unsent").into());
    }
    Ok(())
}

/// One inbox configuration: handling latency at the offered rate, then a backlog worked off.
async fn inbox_case(
    ctx: &Ctx,
    primary: &Primary,
    standbys: u32,
    load: &Load,
) -> Result<Outcome, BoxError> {
    primary.reset().await?;
    HANDLED.lock().unwrap_or_else(|p| p.into_inner()).clear();
    let transport = Arc::new(
        ctx.transport(&format!("bench_p13_inbox_s{standbys}"))
            .await?,
    );
    let start = || {
        Runtime::builder(primary.db.clone())
            .source("bench-p13")
            .transport(transport.clone())
            .without_relay()
            .inbox_config(InboxConfig::default().wait_for_standbys(standbys))
            .consumers([CONSUMER])
            .expect_consumers([CONSUMER])
            .start()
    };
    let jetstream = async_nats::jetstream::new(ctx.nats.clone());
    let subject = transport.subject("bench.order_placed");
    let lag = primary.sample_lag();

    let runtime = start().await?;
    let (js, to) = (jetstream.clone(), subject.clone());
    let published = crate::p3::offer(load.rate, load.warm_up + load.window, move |id| {
        let (js, to) = (js.clone(), to.clone());
        async move { publish(&js, to, id).await }
    })
    .await?;
    let handled = wait_seen(&HANDLED, published.len()).await?;
    let latencies_us = latencies(&published, &handled, load.warm_up)?;
    check_consumer(&runtime.shutdown().await, published.len())?;

    let backlog = if ctx.smoke { 300 } else { BACKLOG };
    // Pipelined in chunks: the client holds back publishes while too many await their ack.
    for chunk in 0..backlog.div_ceil(PUBLISH_CHUNK) {
        let mut acks = Vec::with_capacity(PUBLISH_CHUNK as usize);
        for _ in 0..PUBLISH_CHUNK.min(backlog - chunk * PUBLISH_CHUNK) {
            let id = crate::support::next_ids(1);
            acks.push(
                jetstream
                    .publish(subject.clone(), envelope(id)?.into())
                    .await?,
            );
        }
        for ack in acks {
            ack.await?;
        }
    }
    let started = Instant::now();
    let runtime = start().await?;
    let total = published.len() + backlog as usize;
    let handled = wait_seen(&HANDLED, total).await?;
    let last = handled.values().max().copied().unwrap_or(started);
    let throughput = backlog as f64 / last.duration_since(started).as_secs_f64();
    check_consumer(&runtime.shutdown().await, backlog as usize)?;
    let lag = lag.stop().await;
    check_handled(&primary.db, total).await?;
    ctx.drop_stream(&transport).await;
    Ok(Outcome {
        latencies_us,
        throughput,
        lag,
    })
}

/// A CloudEvents envelope of order `id`, as a producer of another stack sends it.
fn envelope(id: i64) -> Result<Vec<u8>, BoxError> {
    let event = OrderPlaced::sample(id, CUSTOMERS);
    let body = serde_json::to_vec(&serde_json::json!({
        "specversion": "1.0", "id": uuid::Uuid::now_v7().to_string(),
        "type": "bench.order_placed", "source": "bench-p13", "subject": event.customer,
        "aggregatetype": "order", "datacontenttype": "application/json", "data": event,
    }))?;
    Ok(body)
}

/// Publish order `id` and wait for JetStream's confirmation; when it came.
async fn publish(
    jetstream: &async_nats::jetstream::Context,
    subject: String,
    id: i64,
) -> Result<Instant, BoxError> {
    jetstream
        .publish(subject, envelope(id)?.into())
        .await?
        .await?;
    Ok(Instant::now())
}

fn check_consumer(report: &outbox::runtime::RuntimeReport, n: usize) -> Result<(), BoxError> {
    let stats = report.consumer(CONSUMER);
    if stats.dead > 0 || stats.handled as usize != n {
        return Err(format!("P13: {n} messages, the consumer ended with {stats:?}").into());
    }
    Ok(())
}

/// Every message handled once: one note per order, one effect row each.
async fn check_handled(db: &DatabaseConnection, total: usize) -> Result<(), BoxError> {
    let notes = HANDLED.lock().unwrap_or_else(|p| p.into_inner()).len();
    let effects = crate::support::scalar_i64(db, "SELECT count(*) FROM bench_effect").await?;
    if notes != total || effects != total as i64 {
        return Err(format!(
            "P13: {total} messages published, {notes} handled, {effects} effect rows"
        )
        .into());
    }
    Ok(())
}

pub(crate) fn specs() -> Vec<Spec> {
    let mut specs = Vec::new();
    for (what, road) in [
        ("fast", "fast path"),
        ("claim", "claim loop"),
        ("inbox", "inbox"),
    ] {
        let measure = if what == "inbox" {
            "confirmed → handled"
        } else {
            "commit → published"
        };
        let base = format!("p13.{what}.s0");
        for standbys in STANDBYS {
            let key = format!("p13.{what}.s{standbys}");
            let config = format!("{road}, wait {standbys}");
            // Each figure of a wait against the same figure without one.
            let figures = [
                ("p50", format!("{measure} p50"), "p50"),
                ("p99", format!("{measure} p99"), "p99"),
                ("throughput", "events/s".to_owned(), "events/s"),
            ];
            for (q, name, label) in figures {
                let row = spec("P13", format!("{config}: {name}"), format!("{key}.{q}"));
                specs.push(if standbys == 0 {
                    row
                } else {
                    row.against(format!("{road}, wait 0 {label}"), format!("{base}.{q}"))
                });
            }
            for (q, label) in [("flush_lag_p50", "p50"), ("flush_lag_max", "max")] {
                specs.push(spec(
                    "P13",
                    format!("{config}: standby flush lag {label}"),
                    format!("{key}.{q}"),
                ));
            }
        }
    }
    specs
}
