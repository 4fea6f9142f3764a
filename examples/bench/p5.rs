//! P5 scale: claim latency and relay throughput with a small (10k) and a large (10M) number of
//! SENT rows in `outbox_event`, and the memory a relay takes to drain a small and a large
//! (1M-event) backlog.
//!
//! The tables are built once (the large one takes minutes) and measured `runs` times. Each
//! measurement enqueues its PENDING events, takes a few dozen claims straight from the store
//! (timing each), settles them as sent, drains the rest with one relay, then deletes its events
//! and vacuums, so every run sees exactly the table it is named after.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use outbox::relay::{Relay, RelayConfig, RelayStatsSnapshot};
use outbox::sea_orm::{ConnectionTrait, DatabaseConnection};
use outbox::store::claim::ClaimParams;
use outbox::store::relay::{Fence, Settlement, claim, settle};
use outbox::transport::nats::NatsTransport;

use crate::report::{Measure, Spec, Target, m, spec};
use crate::support::{
    BoxError, Ctx, execute_bound, pre_enqueue, rss_kib, scalar_i64, scalar_i64_bound,
};

/// Aggregates the pending events are spread over.
const AGGREGATES: u64 = 10_000;
const BATCH: usize = 500;
/// Claims timed per measurement ("a few dozen"), fewer when the events would not leave the relay
/// at least half of them.
const CLAIMS: u64 = 30;
/// SENT rows are added in chunks of this many, with progress printed after each.
const BUILD_CHUNK: u64 = 1_000_000;
/// The small backlog of the memory figure (at most a fifth of the large one, for smoke runs).
const SMALL_BACKLOG: u64 = 10_000;
/// A full-size run drains the large backlog for at most this long.
const BACKLOG_WINDOW: Duration = Duration::from_secs(20);

pub(crate) async fn run(ctx: &Ctx, runs: usize) -> Result<Vec<Measure>, BoxError> {
    let result = measure_all(ctx, runs).await;
    // Whatever happened, the next scenario must not inherit millions of rows.
    let reset = ctx.reset().await;
    let out = result?;
    reset?;
    Ok(out)
}

async fn measure_all(ctx: &Ctx, runs: usize) -> Result<Vec<Measure>, BoxError> {
    let [small, large] = ctx.sizes.p5_sent;
    let mut out = Vec::new();

    let t = Instant::now();
    ctx.reset().await?;
    add_sent(&ctx.db, small, small).await?;
    vacuum(&ctx.db).await?;
    println!(
        "  P5: small table, {small} SENT rows, built in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    for run in 1..=runs {
        out.extend(claim_and_relay(ctx, "small", run).await?);
    }

    let t = Instant::now();
    add_sent(&ctx.db, large.saturating_sub(small), large).await?;
    let inserted = t.elapsed();
    vacuum(&ctx.db).await?;
    let built = t.elapsed();
    println!(
        "  P5: large table, {large} SENT rows, built in {:.1} s (insert {:.1} s, vacuum {:.1} s), \
         table {}",
        built.as_secs_f64(),
        inserted.as_secs_f64(),
        (built - inserted).as_secs_f64(),
        table_size(&ctx.db).await?
    );
    out.push(m("p5.build_s.large", built.as_secs_f64(), "s"));
    for run in 1..=runs {
        out.extend(claim_and_relay(ctx, "large", run).await?);
    }

    let small_backlog = SMALL_BACKLOG.min(ctx.sizes.p5_backlog / 5).max(1);
    for run in 1..=runs {
        for (key, backlog) in [
            ("small_backlog", small_backlog),
            ("large_backlog", ctx.sizes.p5_backlog),
        ] {
            out.extend(drain_backlog(ctx, key, backlog, run).await?);
        }
    }
    Ok(out)
}

/// Add `n` SENT rows in chunks of `BUILD_CHUNK`, printing progress towards `total` rows in the
/// table. Unlike `pre_enqueue`, the event ids are time-ordered (as the SDK's UUIDv7 ids are:
/// random v4 ids make the unique index take random writes, doubling the build time of the 10M
/// table) and the payload is one constant of the bench event's shape and size, since nobody reads
/// these rows.
pub(crate) async fn add_sent(db: &DatabaseConnection, n: u64, total: u64) -> Result<(), BoxError> {
    let t = Instant::now();
    let first = total - n; // SENT rows already in the table, numbered from 1
    let payload = serde_json::to_string(&crate::support::OrderPlaced::sample(1, 1))?;
    let mut done = 0;
    while done < n {
        let chunk = BUILD_CHUNK.min(n - done);
        let (from, to) = (first + done + 1, first + done + chunk);
        execute_bound(
            db,
            "INSERT INTO outbox_event (event_id, source, event_type, schema_version, \
             aggregate_type, aggregate_id, payload, headers, status, sent_at, created_at) \
             SELECT ('018f0000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, 'bench', \
             'bench.order_placed', 1, 'order', 'customer-' || (g % $1), \
             CAST($2 AS jsonb), '{}'::jsonb, 'SENT', now(), now() \
             FROM generate_series($3::bigint, $4::bigint) g",
            [
                (AGGREGATES as i64).into(),
                payload.clone().into(),
                (from as i64).into(),
                (to as i64).into(),
            ],
        )
        .await?;
        done += chunk;
        if n > BUILD_CHUNK {
            println!(
                "  P5: {to} of {total} SENT rows ({:.0} s)",
                t.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}

/// Vacuum and analyze the table, then write every dirty page out: otherwise the measurement
/// right after building the large table (gigabytes of fresh pages and WAL) runs beside the
/// checkpointer and the kernel flushing them, and measures the disk.
pub(crate) async fn vacuum(db: &DatabaseConnection) -> Result<(), BoxError> {
    db.execute_unprepared("VACUUM ANALYZE outbox_event").await?;
    // Needs superuser or pg_checkpoint (PostgreSQL 15): without either, measure anyway.
    if let Err(e) = db.execute_unprepared("CHECKPOINT").await {
        println!("  P5: no CHECKPOINT ({e}): the figures may include writing the table out");
    }
    Ok(())
}

async fn table_size(db: &DatabaseConnection) -> Result<String, BoxError> {
    crate::support::scalar_text(
        db,
        "SELECT pg_size_pretty(pg_total_relation_size('outbox_event'))",
    )
    .await
}

/// Enqueue `p5_events` PENDING events; time claims of a batch straight from the store, settling
/// each as sent; drain the rest with one relay; then delete the events again.
async fn claim_and_relay(ctx: &Ctx, table: &str, run: usize) -> Result<Vec<Measure>, BoxError> {
    let db = &ctx.db;
    let events = ctx.sizes.p5_events;
    let base = scalar_i64(db, "SELECT coalesce(max(id), 0) FROM outbox_event").await?;
    let t = Instant::now();
    pre_enqueue(db, events, AGGREGATES, "PENDING").await?;
    let enqueued = t.elapsed();

    // (a) Claim latency.
    let claims = CLAIMS.min(events / (2 * BATCH as u64)).max(1);
    let mut claim_us = Vec::with_capacity(claims as usize);
    let mut claimed = 0u64;
    for _ in 0..claims {
        let params = ClaimParams {
            owner: "bench",
            batch_size: BATCH,
            lease: std::time::Duration::from_secs(30),
            ordering: true,
            max_attempts: 12,
        };
        let t = Instant::now();
        let got = claim(db, &params).await?;
        claim_us.push(t.elapsed().as_micros() as u64);
        if got.events.len() != BATCH {
            return Err(format!(
                "P5 {table}: a claim took {} events, expected {BATCH}",
                got.events.len()
            )
            .into());
        }
        let settlement = Settlement {
            sent: got.events.iter().map(|e| e.id).collect(),
            ..Settlement::default()
        };
        let settled = settle(db, Fence::Claim(got.token), &settlement).await?;
        if settled.sent != got.events.len() as u64 {
            return Err(format!(
                "P5 {table}: settled {} of {} claimed events",
                settled.sent,
                got.events.len()
            )
            .into());
        }
        claimed += settled.sent;
    }
    claim_us.sort_unstable();
    let claim_ms = crate::support::quantile(&claim_us, 0.5) as f64 / 1000.0;

    // (b) Relay throughput on the rest.
    let rest = events - claimed;
    let transport = Arc::new(ctx.transport("bench_p5").await?);
    let (elapsed, stats) = relay_until(ctx, &transport, rest, Duration::from_secs(600)).await?;
    let stored = crate::p2::stream_len(ctx, transport.stream_name()).await;
    ctx.drop_stream(&transport).await;
    let stored = stored?;
    if stats.sent < rest {
        return Err(format!(
            "P5 {table}: the relay sent {} of {rest} in 600 s",
            stats.sent
        )
        .into());
    }
    let sent = scalar_i64_bound(
        db,
        "SELECT count(*) FROM outbox_sent WHERE id > $1",
        [base.into()],
    )
    .await? as u64;
    if sent != events || stats.sent < rest || stored != rest {
        return Err(format!(
            "P5 {table}: {sent} of {events} events SENT; the relay published {} (stream holds \
             {stored}) of {rest}",
            stats.sent
        )
        .into());
    }
    let rate = rest as f64 / elapsed.as_secs_f64();
    println!(
        "  P5 run {run}, {table} table: enqueue {events} in {:.1} s; claim p50 {claim_ms:.2} ms \
         (min {:.2}, max {:.2}, {claims} claims); relay {rest} events in {:.2} s = {rate:.0} ev/s",
        enqueued.as_secs_f64(),
        claim_us[0] as f64 / 1000.0,
        claim_us[claim_us.len() - 1] as f64 / 1000.0,
        elapsed.as_secs_f64()
    );

    // Back to the table this measurement is named after.
    let t = Instant::now();
    execute_bound(db, "DELETE FROM outbox_event WHERE id > $1", [base.into()]).await?;
    execute_bound(db, "DELETE FROM outbox_sent WHERE id > $1", [base.into()]).await?;
    vacuum(db).await?;
    println!(
        "  P5 run {run}, {table} table: events deleted and vacuumed in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    Ok(vec![
        m(format!("p5.claim_ms.{table}"), claim_ms, "ms"),
        m(format!("p5.relay.{table}"), rate, "ev/s"),
    ])
}

/// [`crate::support::relay_until`] with one relay of this scenario's settings.
async fn relay_until(
    ctx: &Ctx,
    transport: &Arc<NatsTransport>,
    n: u64,
    limit: Duration,
) -> Result<(Duration, RelayStatsSnapshot), BoxError> {
    let relay = Relay::new(ctx.db.clone(), transport.clone())
        .with_config(RelayConfig::default().batch_size(BATCH).listen(false));
    crate::support::relay_until(relay, n, limit).await
}

/// The peak of this process's resident set, sampled every 50 ms on a thread of its own.
struct PeakRss {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: JoinHandle<()>,
}

impl PeakRss {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(rss_kib()));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            let peak = peak.clone();
            move || {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(rss_kib(), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        });
        PeakRss { stop, peak, thread }
    }

    /// The peak, in KiB.
    fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        self.peak.fetch_max(rss_kib(), Ordering::Relaxed);
        self.peak.load(Ordering::Relaxed)
    }
}

/// Insert a backlog of `backlog` PENDING events, then start one relay on it and sample this
/// process's RSS until it is drained (at most `BACKLOG_WINDOW` for the large backlog of a
/// full-size run, which it does not need to finish).
async fn drain_backlog(
    ctx: &Ctx,
    key: &str,
    backlog: u64,
    run: usize,
) -> Result<Vec<Measure>, BoxError> {
    let db = &ctx.db;
    ctx.reset().await?;
    let t = Instant::now();
    pre_enqueue(db, backlog, AGGREGATES, "PENDING").await?;
    let enqueued = t.elapsed();
    // A backlog builds up over time, autovacuumed and checkpointed as it grows: without this,
    // the relay would drain beside the vacuum and the writes of a million fresh rows.
    let t = Instant::now();
    vacuum(db).await?;
    let vacuumed = t.elapsed();
    let window = if ctx.smoke || backlog <= SMALL_BACKLOG {
        Duration::from_secs(600)
    } else {
        BACKLOG_WINDOW
    };
    let transport = Arc::new(ctx.transport("bench_p5mem").await?);

    let before = rss_kib();
    let sampler = PeakRss::start();
    let relayed = relay_until(ctx, &transport, backlog, window).await;
    let peak = sampler.finish();
    let stored = crate::p2::stream_len(ctx, transport.stream_name()).await;
    ctx.drop_stream(&transport).await;
    let (elapsed, stats) = relayed?;
    let stored = stored?;
    let sent = scalar_i64(db, "SELECT count(*) FROM outbox_sent").await? as u64;
    let left = backlog - sent.min(backlog);
    if left > 0 && ctx.smoke {
        return Err(format!("P5 {key}: {left} of {backlog} events unsent after {window:?}").into());
    }
    if sent == 0 || stats.sent < sent || stored < sent {
        return Err(format!(
            "P5 {key}: {sent} events SENT, the relay published {} (stream holds {stored})",
            stats.sent
        )
        .into());
    }
    let mib = |kib: u64| kib as f64 / 1024.0;
    let delta = peak.saturating_sub(before);
    let rate = sent as f64 / elapsed.as_secs_f64();
    println!(
        "  P5 run {run}, {key}: enqueue {backlog} in {:.1} s, vacuum {:.1} s; relay sent {sent} \
         in {:.1} s ({rate:.0} ev/s, {left} left); RSS {:.1} MiB before, peak {:.1} MiB \
         (+{:.1} MiB)",
        enqueued.as_secs_f64(),
        vacuumed.as_secs_f64(),
        elapsed.as_secs_f64(),
        mib(before),
        mib(peak),
        mib(delta)
    );
    Ok(vec![
        m(format!("p5.rss_mib.{key}"), mib(peak), "MiB"),
        m(format!("p5.rss_delta_mib.{key}"), mib(delta), "MiB"),
        m(format!("p5.backlog_sent.{key}"), sent as f64, "events"),
        m(format!("p5.backlog_relay.{key}"), rate, "ev/s"),
    ])
}

pub(crate) fn specs() -> Vec<Spec> {
    vec![
        spec("P5", "claim 500, 10k SENT rows", "p5.claim_ms.small"),
        spec("P5", "claim 500, 10M SENT rows", "p5.claim_ms.large")
            .against("claim 500, 10k SENT rows", "p5.claim_ms.small")
            .target(Target::RatioAtMost(1.2)),
        spec("P5", "relay, 10k SENT rows", "p5.relay.small"),
        spec("P5", "relay, 10M SENT rows", "p5.relay.large")
            .against("relay, 10k SENT rows", "p5.relay.small")
            // Throughput at least 1/1.2 of the small table's.
            .target(Target::RatioAtLeast(0.83)),
        spec("P5", "build 10M SENT rows", "p5.build_s.large"),
        spec("P5", "RSS peak, 10k backlog", "p5.rss_mib.small_backlog"),
        spec("P5", "RSS peak, 1M backlog", "p5.rss_mib.large_backlog")
            .against("RSS peak, 10k backlog", "p5.rss_mib.small_backlog")
            // Bounded by batch sizes, not by the backlog: a 100x backlog costs at most 20%.
            .target(Target::RatioAtMost(1.2)),
        spec(
            "P5",
            "RSS growth draining 10k backlog",
            "p5.rss_delta_mib.small_backlog",
        ),
        spec(
            "P5",
            "RSS growth draining 1M backlog",
            "p5.rss_delta_mib.large_backlog",
        )
        // Growths of a fraction of a MiB: their ratio is noise (the allocator reuses what it
        // holds), so the target is on the peak above.
        .against(
            "RSS growth draining 10k backlog",
            "p5.rss_delta_mib.small_backlog",
        ),
        spec(
            "P5",
            "relay on a 1M backlog",
            "p5.backlog_relay.large_backlog",
        )
        .against("relay on a 10k backlog", "p5.backlog_relay.small_backlog"),
        spec(
            "P5",
            "sent of the 1M backlog in the window",
            "p5.backlog_sent.large_backlog",
        ),
    ]
}
