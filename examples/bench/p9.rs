//! P9 sustained load with a held xmin horizon: a steady producer (the whole SDK pipeline: fast
//! path, JetStream, one consumer, the janitor on short retention windows) for a long steady
//! phase, then a REPEATABLE READ transaction that holds the horizon (a report query left open),
//! then its release. Every sample interval: the SDK's tables (bytes with indexes, live and dead
//! rows), the backlog and its age, the producers' commit p50/p99, commit → handled p50/p99,
//! insert → SENT p99 (the relay's share), the relay's claim time p50/p99 (the SDK's
//! `outbox_relay_claim_duration_seconds`, caught by a `metrics` recorder) and events handled per
//! second.
//!
//! Run it on a cluster with stock settings (autovacuum on), such as the one `scripts/pg-logical`
//! starts: `DATABASE_URL=postgres://postgres@127.0.0.1:5433/outbox_bench scripts/bench --only p9
//! --runs 1`. Not part of the default set (it takes 45 minutes); `--smoke` runs it in seconds.
//! `BENCH_P9_MINUTES=steady,hold,release` (default `30,10,5`) and `BENCH_P9_RATE` (orders per
//! second, default 200) change the shape. Samples go to `target/bench/p9.csv`.

use std::{
    collections::HashMap,
    fmt::Write as _,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use outbox::prelude::*;
use outbox::relay::{Backoff, RelayConfig};
use outbox::retention::RetentionPolicy;
use outbox::sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait};
use outbox::store::health::TableHealth;
use tokio::sync::Semaphore;

use crate::report::{Measure, Spec, Target, m, spec};
use crate::support::{BoxError, Ctx, OrderPlaced, next_ids, place_order, quantile};

const CUSTOMERS: i64 = 1_000;
/// Commits in flight at most: an order that finds this many waiting is not placed (a shop's
/// connection pool and request timeout do the same), and counted.
const IN_FLIGHT: usize = 64;
/// SENT events are kept this long, handled messages this long (the shop of the issue).
const SENT_AFTER: Duration = Duration::from_secs(60);
const DONE_AFTER: Duration = Duration::from_secs(240);

/// The consumer: P3's (its handler records each order's effect and notes when it committed).
const CONSUMER: &str = crate::p3::CONSUMER;
static HANDLED: &Mutex<Vec<(i64, Instant)>> = &crate::p3::HANDLED;

/// The three phases and how often to sample.
struct Shape {
    steady: Duration,
    hold: Duration,
    release: Duration,
    every: Duration,
    rate: u64,
}

impl Shape {
    fn of(ctx: &Ctx) -> Result<Shape, BoxError> {
        let rate = match std::env::var("BENCH_P9_RATE") {
            Ok(rate) => rate
                .trim()
                .parse()
                .map_err(|e| format!("BENCH_P9_RATE: {e}"))?,
            Err(_) if ctx.smoke => 50,
            Err(_) => 200,
        };
        if ctx.smoke {
            return Ok(Shape {
                steady: Duration::from_secs(6),
                hold: Duration::from_secs(4),
                release: Duration::from_secs(4),
                every: Duration::from_secs(2),
                rate,
            });
        }
        let minutes: Vec<u64> = std::env::var("BENCH_P9_MINUTES")
            .unwrap_or_else(|_| "30,10,5".into())
            .split(',')
            .map(|n| n.trim().parse())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("BENCH_P9_MINUTES: {e}"))?;
        let [steady, hold, release] = minutes[..] else {
            return Err("BENCH_P9_MINUTES is steady,hold,release in minutes".into());
        };
        Ok(Shape {
            steady: Duration::from_secs(steady * 60),
            hold: Duration::from_secs(hold * 60),
            release: Duration::from_secs(release * 60),
            every: Duration::from_secs(10),
            rate,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Steady,
    Hold,
    Release,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Steady => "steady",
            Phase::Hold => "hold",
            Phase::Release => "release",
        }
    }
}

/// One sample interval.
#[derive(Debug, Clone)]
struct Sample {
    at: Duration,
    phase: Phase,
    bytes: i64,
    outbox_bytes: i64,
    dead_rows: i64,
    live_rows: i64,
    backlog: i64,
    backlog_age_s: f64,
    sent_p99_ms: f64,
    handled_per_s: f64,
    refused: u64,
    /// This interval's commit latencies, sorted, in microseconds.
    commits: Vec<u64>,
    /// This interval's commit → handled latencies, sorted, in microseconds.
    handled: Vec<u64>,
    /// How long each of the relay's claims took in this interval, sorted, in microseconds.
    claims: Vec<u64>,
}

impl Sample {
    /// Quantile `q` of this interval's commit latencies, in milliseconds.
    fn commit_ms(&self, q: f64) -> f64 {
        quantile(&self.commits, q) as f64 / 1000.0
    }

    /// Quantile `q` of this interval's commit → handled latencies, in milliseconds.
    fn handled_ms(&self, q: f64) -> f64 {
        quantile(&self.handled, q) as f64 / 1000.0
    }

    /// Quantile `q` of this interval's claim times, in milliseconds.
    fn claim_ms(&self, q: f64) -> f64 {
        quantile(&self.claims, q) as f64 / 1000.0
    }
}

/// How long each claim of the relay took, in microseconds, since the sampler last took them:
/// what the SDK records as `outbox_relay_claim_duration_seconds`.
static CLAIMS: Mutex<Vec<u64>> = Mutex::new(Vec::new());

/// A `metrics` recorder that keeps the relay's claim times in [`CLAIMS`] and drops the rest.
struct ClaimTimes;

impl metrics::HistogramFn for ClaimTimes {
    fn record(&self, seconds: f64) {
        CLAIMS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((seconds * 1e6) as u64);
    }
}

impl metrics::Recorder for ClaimTimes {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        if key.name() == outbox::metrics::RELAY_CLAIM_DURATION {
            metrics::Histogram::from_arc(Arc::new(ClaimTimes))
        } else {
            metrics::Histogram::noop()
        }
    }
}

/// What the producers share with the sampler.
#[derive(Default)]
struct Produced {
    /// Commit latencies of the current interval, in microseconds.
    commits: Mutex<Vec<u64>>,
    /// When each order's commit returned, until it is handled.
    committed: Mutex<HashMap<i64, Instant>>,
    /// Orders not placed because `IN_FLIGHT` commits were waiting.
    refused: AtomicU64,
}

/// The length of `outbox_sent`'s slots in this run, in seconds.
const SENT_SLOT_SECONDS: i64 = 5;
/// The length of `inbox_done`'s slots: a 240 s window is kept as 24 to 25 slots.
const DONE_SLOT_SECONDS: i64 = 10;
/// The length of `inbox_key`'s periods: the dedup window is the retention's (a key is known
/// for 240 to 480 s; the bench's redelivery windows are 60 s).
const KEY_PERIOD_SECONDS: i64 = 240;

pub(crate) async fn run(ctx: &Ctx) -> Result<Vec<Measure>, BoxError> {
    let shape = Shape::of(ctx)?;
    // The process's one recorder: installed by the first run, kept by the next ones.
    let _ = metrics::set_global_recorder(ClaimTimes);
    ctx.reset().await?;
    // Sent events rotate through slots of 5 s: a 60 s window is kept as 12 to 13 slots.
    outbox::store::rotation::set_slot_length(&ctx.db, "outbox_sent", SENT_SLOT_SECONDS).await?;
    // Handled messages likewise (`inbox_done`, keys in `inbox_key`).
    outbox::store::rotation::set_slot_length(&ctx.db, "inbox_done", DONE_SLOT_SECONDS).await?;
    outbox::store::rotation::set_slot_length(&ctx.db, "inbox_key", KEY_PERIOD_SECONDS).await?;
    HANDLED.lock().unwrap_or_else(|p| p.into_inner()).clear();
    let transport = Arc::new(ctx.transport("bench_p9").await?);
    let relay = RelayConfig::default().max_attempts(3).backoff(
        Backoff::default()
            .base(Duration::from_secs(1))
            .cap(Duration::from_secs(5)),
    );
    let runtime = Runtime::builder(ctx.db.clone())
        .source("bench-p9")
        .transport(transport.clone())
        .relay_config(relay)
        .consumers([CONSUMER])
        .expect_consumers([CONSUMER])
        .retention(
            Some(
                RetentionPolicy::default()
                    .sent_after(SENT_AFTER)
                    .done_after(DONE_AFTER)
                    .pause(Duration::from_millis(10)),
            ),
            Duration::from_secs(10),
        )
        .redelivery_windows(Duration::from_secs(60), Duration::ZERO)
        .start()
        .await?;
    let produced = Arc::new(Produced::default());
    let stop = outbox::CancellationToken::new();
    let producer = tokio::spawn(produce(
        ctx.db.clone(),
        runtime.outbox().clone(),
        shape.rate,
        produced.clone(),
        stop.clone(),
    ));

    let result = phases(ctx, &shape, &produced).await;
    stop.cancel();
    let placed = producer.await?;
    let samples = result?;
    // Everything placed is handled before the runtime stops.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !produced
        .committed
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .is_empty()
        && Instant::now() < deadline
    {
        drain_handled(&produced);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let report = runtime.shutdown().await;
    ctx.drop_stream(&transport).await;
    let stats = report.consumer(CONSUMER);
    let waiting = produced
        .committed
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .len();
    if waiting > 0 || stats.dead > 0 {
        return Err(
            format!("P9: {waiting} of {placed} orders never handled, consumer {stats:?}").into(),
        );
    }
    write_csv(&samples)?;
    Ok(measures(&shape, &samples, placed))
}

/// Offer `rate` orders a second until `stop`; how many were placed.
async fn produce(
    db: DatabaseConnection,
    outbox: Outbox,
    rate: u64,
    produced: Arc<Produced>,
    stop: outbox::CancellationToken,
) -> u64 {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(1) as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let placed = Arc::new(AtomicU64::new(0));
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            produced.refused.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let (db, outbox, produced, placed) =
            (db.clone(), outbox.clone(), produced.clone(), placed.clone());
        tokio::spawn(async move {
            let order = OrderPlaced::sample(next_ids(1), CUSTOMERS);
            let started = Instant::now();
            if let Ok(done) = place_order(&db, &outbox, &order).await {
                produced
                    .commits
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((done - started).as_micros() as u64);
                produced
                    .committed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(order.order_id, done);
                placed.fetch_add(1, Ordering::Relaxed);
            }
            drop(permit);
        });
    }
    // Let the commits in flight finish.
    let _ = slots.acquire_many(IN_FLIGHT as u32).await;
    placed.load(Ordering::Relaxed)
}

/// Commit → handled latencies, in microseconds, of the orders handled since the last call.
fn drain_handled(produced: &Produced) -> Vec<u64> {
    let handled = std::mem::take(&mut *HANDLED.lock().unwrap_or_else(|p| p.into_inner()));
    let mut committed = produced.committed.lock().unwrap_or_else(|p| p.into_inner());
    let mut latencies: Vec<u64> = handled
        .into_iter()
        .filter_map(|(order, at)| {
            committed
                .remove(&order)
                .map(|c| at.saturating_duration_since(c).as_micros() as u64)
        })
        .collect();
    latencies.sort_unstable();
    latencies
}

/// Run the phases, holding the horizon during the second, and sample each interval.
async fn phases(ctx: &Ctx, shape: &Shape, produced: &Produced) -> Result<Vec<Sample>, BoxError> {
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut holder = None;
    let plan = [
        (Phase::Steady, shape.steady),
        (Phase::Hold, shape.hold),
        (Phase::Release, shape.release),
    ];
    for (phase, length) in plan {
        let end = Instant::now() + length;
        if phase == Phase::Hold {
            // A report query left open: its snapshot holds the horizon until it ends.
            let tx = ctx
                .db
                .begin_with_config(Some(outbox::sea_orm::IsolationLevel::RepeatableRead), None);
            let tx = tx.await?;
            tx.execute_unprepared("SELECT count(*) FROM bench_order")
                .await?;
            holder = Some(tx);
        }
        if phase == Phase::Release
            && let Some(tx) = holder.take()
        {
            tx.commit().await?;
        }
        while Instant::now() < end {
            tokio::time::sleep(shape.every.min(end - Instant::now())).await;
            let sample = sample(ctx, shape, produced, phase, started.elapsed()).await?;
            println!(
                "  P9 {:>6.0} s {:<7} tables {:>6.1} MB (outbox {:>5.1}) dead {:>7} live {:>7} \
                 backlog {:>5} ({:>4.1} s) commit p50 {:>6.1} p99 {:>6.1} ms, handled p50 {:>6.1} \
                 p99 {:>7.1} ms, sent p99 {:>6.1} ms, claim p99 {:>6.1} ms, {:>5.0}/s, refused {}",
                sample.at.as_secs_f64(),
                phase.name(),
                sample.bytes as f64 / 1e6,
                sample.outbox_bytes as f64 / 1e6,
                sample.dead_rows,
                sample.live_rows,
                sample.backlog,
                sample.backlog_age_s,
                sample.commit_ms(0.5),
                sample.commit_ms(0.99),
                sample.handled_ms(0.5),
                sample.handled_ms(0.99),
                sample.sent_p99_ms,
                sample.claim_ms(0.99),
                sample.handled_per_s,
                sample.refused
            );
            samples.push(sample);
        }
    }
    Ok(samples)
}

async fn sample(
    ctx: &Ctx,
    shape: &Shape,
    produced: &Produced,
    phase: Phase,
    at: Duration,
) -> Result<Sample, BoxError> {
    let mut commits =
        std::mem::take(&mut *produced.commits.lock().unwrap_or_else(|p| p.into_inner()));
    commits.sort_unstable();
    let handled = drain_handled(produced);
    let mut claims = std::mem::take(&mut *CLAIMS.lock().unwrap_or_else(|p| p.into_inner()));
    claims.sort_unstable();
    let tables = outbox::store::health::tables(&ctx.db).await?;
    let sum =
        |f: fn(&outbox::store::health::TableHealth) -> i64| -> i64 { tables.iter().map(f).sum() };
    let row = ctx
        .db
        .query_one_raw(outbox::sea_orm::Statement::from_string(
            outbox::sea_orm::DbBackend::Postgres,
            "SELECT (SELECT count(*) FROM outbox_event WHERE status IN ('PENDING', \
             'PROCESSING', 'RETRY')) AS backlog, (SELECT COALESCE(EXTRACT(EPOCH FROM now() - \
             min(created_at)), 0)::float8 FROM outbox_event WHERE status IN ('PENDING', \
             'PROCESSING', 'RETRY')) AS backlog_age, (SELECT COALESCE(percentile_cont(0.99) \
             WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM sent_at - created_at)), 0)::float8 * 1000 \
             FROM outbox_sent WHERE sent_at > now() - interval '10 seconds') \
             AS sent_p99",
        ))
        .await?
        .ok_or("P9: no backlog row")?;
    Ok(Sample {
        at,
        phase,
        bytes: tables.iter().map(TableHealth::bytes).sum(),
        outbox_bytes: tables
            .iter()
            .filter(|t| t.table == "outbox_event")
            .map(TableHealth::bytes)
            .sum(),
        dead_rows: sum(|t| t.dead_rows.unwrap_or(0)),
        live_rows: sum(|t| t.live_rows.unwrap_or(0)),
        backlog: row.try_get("", "backlog")?,
        backlog_age_s: row.try_get("", "backlog_age")?,
        sent_p99_ms: row.try_get("", "sent_p99")?,
        handled_per_s: handled.len() as f64 / shape.every.as_secs_f64(),
        refused: produced.refused.swap(0, Ordering::Relaxed),
        commits,
        handled,
        claims,
    })
}

/// The samples of `phase` from `from` (a fraction of them) on: the phase's settled part.
fn part(samples: &[Sample], phase: Phase, from: f64) -> Vec<&Sample> {
    let of_phase: Vec<&Sample> = samples.iter().filter(|s| s.phase == phase).collect();
    let start = ((of_phase.len() as f64) * from).floor() as usize;
    of_phase[start.min(of_phase.len())..].to_vec()
}

/// Every commit latency and commit → handled latency of `part`, sorted.
fn latencies(part: &[&Sample]) -> (Vec<u64>, Vec<u64>) {
    let mut commits: Vec<u64> = part
        .iter()
        .flat_map(|s| s.commits.iter().copied())
        .collect();
    let mut handled: Vec<u64> = part
        .iter()
        .flat_map(|s| s.handled.iter().copied())
        .collect();
    commits.sort_unstable();
    handled.sort_unstable();
    (commits, handled)
}

/// The median of `f` over `part`.
fn median_of(part: &[&Sample], f: impl Fn(&Sample) -> f64) -> f64 {
    quantile_of(part, 0.5, f)
}

/// Quantile `q` of a figure over the intervals of a part.
fn quantile_of(part: &[&Sample], q: f64, f: impl Fn(&Sample) -> f64) -> f64 {
    let mut values: Vec<f64> = part.iter().map(|s| f(s)).collect();
    values.sort_by(f64::total_cmp);
    let at = ((values.len() as f64 * q) as usize).min(values.len().saturating_sub(1));
    values.get(at).copied().unwrap_or(f64::NAN)
}

fn measures(shape: &Shape, samples: &[Sample], placed: u64) -> Vec<Measure> {
    let mut out = vec![m("p9.placed", placed as f64, "orders")];
    // Before the hold: the last third of the steady phase (the retention windows have filled).
    let before = part(samples, Phase::Steady, 2.0 / 3.0);
    // Latencies over every commit (and every handled order) of the part: a spike of a minute
    // counts with its weight, not as one sample among many.
    for (name, phase, from) in [
        ("before", Phase::Steady, 2.0 / 3.0),
        ("hold", Phase::Hold, 0.0),
        ("after", Phase::Release, 0.5),
    ] {
        let settled = part(samples, phase, from);
        let (commits, handled) = latencies(&settled);
        let mut claims: Vec<u64> = settled
            .iter()
            .flat_map(|s| s.claims.iter().copied())
            .collect();
        claims.sort_unstable();
        out.push(m(
            format!("p9.{name}.rate"),
            handled.len() as f64 / (settled.len().max(1) as f64 * shape.every.as_secs_f64()),
            "ev/s",
        ));
        for (what, sorted) in [
            ("commit", &commits),
            ("handled", &handled),
            ("claim", &claims),
        ] {
            for (q, label) in [(0.5, "p50"), (0.99, "p99")] {
                out.push(m(
                    format!("p9.{name}.{what}_{label}"),
                    quantile(sorted, q) as f64 / 1000.0,
                    "ms",
                ));
            }
        }
        let worst = samples
            .iter()
            .filter(|s| s.phase == phase)
            .map(|s| s.commit_ms(0.99))
            .fold(0.0, f64::max);
        out.push(m(
            format!("p9.{name}.commit_p99_worst_interval"),
            worst,
            "ms",
        ));
        out.push(m(
            format!("p9.{name}.sent_p99"),
            median_of(&settled, |s| s.sent_p99_ms),
            "ms",
        ));
    }
    // Bytes: once the windows have filled (a third into the steady phase, or the first sample
    // after DONE_AFTER), at the end of the steady phase, the peak and the end.
    let steady: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.phase == Phase::Steady)
        .collect();
    let filled_at = DONE_AFTER.max(shape.steady / 3);
    let filled = steady
        .iter()
        .find(|s| s.at >= filled_at)
        .or(steady.last())
        .map_or(0.0, |s| s.bytes as f64);
    let steady_end = steady.last().map_or(0.0, |s| s.bytes as f64);
    let peak = samples.iter().map(|s| s.bytes).max().unwrap_or(0) as f64;
    let end = samples.last().map_or(0.0, |s| s.bytes as f64);
    out.push(m("p9.bytes.filled", filled / 1e6, "MB"));
    out.push(m("p9.bytes.steady_end", steady_end / 1e6, "MB"));
    out.push(m("p9.bytes.peak", peak / 1e6, "MB"));
    out.push(m("p9.bytes.end", end / 1e6, "MB"));
    let dead_peak = samples.iter().map(|s| s.dead_rows).max().unwrap_or(0);
    out.push(m("p9.dead_rows.peak", dead_peak as f64, "rows"));
    let backlog_before = steady.last().map_or(0, |s| s.backlog);
    let backlog_hold = samples
        .iter()
        .filter(|s| s.phase == Phase::Hold)
        .map(|s| s.backlog)
        .max()
        .unwrap_or(0);
    out.push(m("p9.backlog.before", backlog_before as f64, "events"));
    out.push(m("p9.backlog.hold_max", backlog_hold as f64, "events"));
    let refused: u64 = samples.iter().map(|s| s.refused).sum();
    out.push(m("p9.refused", refused as f64, "orders"));
    // Back to normal: the first release sample from which the intervals' commit p99 look as
    // they did before the hold: none above the worst interval before, and at most one in ten
    // (rounded up) above what nine intervals in ten had before (an interval's p99 is its 20th
    // slowest commit or so: autovacuum's passes alone move it by 2x, and one in ten intervals
    // was above that figure before the hold by its definition).
    let normal = quantile_of(&before, 0.9, |s| s.commit_ms(0.99));
    let worst_before = before.iter().map(|s| s.commit_ms(0.99)).fold(0.0, f64::max);
    let release: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.phase == Phase::Release)
        .collect();
    let hold_end = samples
        .iter()
        .filter(|s| s.phase == Phase::Hold)
        .map(|s| s.at)
        .max()
        .unwrap_or_default();
    let recovered = (0..release.len())
        .find(|&i| {
            let rest = &release[i..];
            let above = rest.iter().filter(|s| s.commit_ms(0.99) > normal).count();
            rest.iter().all(|s| s.commit_ms(0.99) <= worst_before)
                && above <= rest.len().div_ceil(10)
        })
        .map(|i| release[i].at.saturating_sub(hold_end).as_secs_f64());
    out.push(m("p9.recovery", recovered.unwrap_or(f64::INFINITY), "s"));
    out
}

fn write_csv(samples: &[Sample]) -> Result<(), BoxError> {
    let mut csv = String::from(
        "seconds,phase,bytes,outbox_bytes,dead_rows,live_rows,backlog,backlog_age_s,\
         commit_p50_ms,commit_p99_ms,handled_p50_ms,handled_p99_ms,sent_p99_ms,claim_p50_ms,\
         claim_p99_ms,claims,handled_per_s,refused\n",
    );
    for s in samples {
        let _ = writeln!(
            csv,
            "{:.0},{},{},{},{},{},{},{:.1},{:.2},{:.2},{:.2},{:.2},{:.2},{:.2},{:.2},{},{:.1},{}",
            s.at.as_secs_f64(),
            s.phase.name(),
            s.bytes,
            s.outbox_bytes,
            s.dead_rows,
            s.live_rows,
            s.backlog,
            s.backlog_age_s,
            s.commit_ms(0.5),
            s.commit_ms(0.99),
            s.handled_ms(0.5),
            s.handled_ms(0.99),
            s.sent_p99_ms,
            s.claim_ms(0.5),
            s.claim_ms(0.99),
            s.claims.len(),
            s.handled_per_s,
            s.refused
        );
    }
    std::fs::create_dir_all("target/bench")?;
    std::fs::write("target/bench/p9.csv", csv)?;
    Ok(())
}

pub(crate) fn specs() -> Vec<Spec> {
    vec![
        spec("P9", "orders placed", "p9.placed"),
        spec(
            "P9",
            "SDK tables at the end of the steady phase",
            "p9.bytes.steady_end",
        )
        .against("once the retention windows filled", "p9.bytes.filled")
        .target(Target::RatioAtMost(1.1)),
        spec("P9", "SDK tables at their peak", "p9.bytes.peak")
            .against("once the retention windows filled", "p9.bytes.filled"),
        spec("P9", "SDK tables at the end", "p9.bytes.end")
            .against("once the retention windows filled", "p9.bytes.filled"),
        spec("P9", "dead row versions at their peak", "p9.dead_rows.peak"),
        spec("P9", "commit p99, horizon held", "p9.hold.commit_p99")
            .against("commit p99 before", "p9.before.commit_p99")
            .target(Target::RatioAtMost(2.0)),
        spec("P9", "commit p50, horizon held", "p9.hold.commit_p50")
            .against("commit p50 before", "p9.before.commit_p50"),
        spec(
            "P9",
            "commit p99 of the worst interval, horizon held",
            "p9.hold.commit_p99_worst_interval",
        )
        .against(
            "of the worst interval before",
            "p9.before.commit_p99_worst_interval",
        ),
        spec(
            "P9",
            "commit → handled p99, horizon held",
            "p9.hold.handled_p99",
        )
        .against("commit → handled p99 before", "p9.before.handled_p99")
        .target(Target::RatioAtMost(2.0)),
        spec("P9", "insert → SENT p99, horizon held", "p9.hold.sent_p99")
            .against("insert → SENT p99 before", "p9.before.sent_p99"),
        spec("P9", "relay claim p99, horizon held", "p9.hold.claim_p99")
            .against("relay claim p99 before", "p9.before.claim_p99"),
        spec("P9", "handled per second, horizon held", "p9.hold.rate")
            .against("handled per second before", "p9.before.rate")
            .target(Target::RatioAtLeast(0.8)),
        spec("P9", "backlog at most, horizon held", "p9.backlog.hold_max")
            .against("backlog before", "p9.backlog.before"),
        spec("P9", "orders refused (64 commits waiting)", "p9.refused"),
        spec(
            "P9",
            "back to the commit p99 before, after release",
            "p9.recovery",
        )
        .target(Target::AtMost(60.0)),
        spec("P9", "commit p99 after release", "p9.after.commit_p99")
            .against("commit p99 before", "p9.before.commit_p99"),
    ]
}
