//! The outbox benchmark: every figure is measured beside its baseline (the physical limit, or a
//! peer) in the same run, and reported as a ratio, because shared machines are noisy.
//!
//! ```sh
//! scripts/bench                           # the full run (3 runs) and its charts
//! scripts/bench --only p1,p3 --runs 5
//! scripts/bench --smoke                   # seconds, checks only
//! cargo run --release --example bench --features postgres,nats,postgres-wal,test-util -- --runs 3
//! ```
//!
//! Scenarios (see `docs/BENCHMARKS.md`):
//! - P1 producer overhead: an order insert alone, written by hand with its outbox rows, and
//!   through `OutboxTransaction` (1 and 10 events, wake-up on and off), at 1 and 16 clients.
//! - P2 relay throughput PostgreSQL → JetStream with 1, 2 and 4 relays, against a raw claim+mark
//!   loop, raw pipelined publishing and a hand-written relay; and what a running relay (the SDK's
//!   or the hand-written one) costs 16 producing clients.
//! - P3 end-to-end latency, commit → handler committed, at 200/s, 1k/s and 5k/s, wake-ups on and
//!   polling only, against a hand-written pipeline (commit, publish, consume, commit), and the
//!   relay's share against a hand-written relay.
//! - P4 inbox throughput against raw commits of the same effect row at the same concurrency.
//! - With the `kafka` feature, P2 and P4 also measure Kafka: the SDK relay against raw
//!   pipelined rdkafka publishing and a hand-written claim-publish-mark relay on Kafka, and the
//!   inbox working off a backlog on Kafka (`KAFKA_BOOTSTRAP`, default `127.0.0.1:9092`).
//! - P5 claim latency and relay throughput with 10k and 10M SENT rows in the table, and the
//!   runtime's memory with a 1M-event backlog.
//! - P6 peer: sqlxmq spawning and completing trivial jobs on the same database.
//! - P7 webhooks accepted per second (HTTP 200s, 16 concurrent senders) through the SDK's
//!   webhook endpoint, against a bare axum handler inserting one row per request.
//! - P8 delayed events: the relay's look for due delayed events and its claim, with none and with
//!   1M waiting, and how fast due ones move into the outbox.
//! - P9 sustained load with a held xmin horizon: 30 minutes steady, 10 with a transaction holding
//!   the horizon, 5 after its release; the tables' bytes and dead rows, the backlog, commit and
//!   commit → handled latencies every 10 s. Only with `--only p9` (and in `--smoke`).
//! - P10 cost per event: statements (`pg_stat_statements`) and CPU seconds per 1,000 events of
//!   the server and the bench process, for the hand-written pipeline and the SDK's fast path,
//!   WAL relay and claim loop, at 200/s and 1k/s. Only with `--only p10` (it needs a server that
//!   loads `pg_stat_statements`; `--smoke` runs it without the counts).
//! - P11 idle cost: statements per second (and the server's CPU) that 1 and 3 idle instances
//!   send to one database, with the list of them. Only with `--only p11` (`pg_stat_statements`
//!   too; `BENCH_P11_SECONDS`, default 60, is the window).
//! - P12 fleet throughput: events committed and handled per second, commit → effect latency,
//!   CPU and connections, with `outbox::fleet` over 1, 2, 4 and 8 fresh databases on the bench's
//!   server, one and two instances, the same 8 closed-loop producers spread over the databases.
//!   Only with `--only p12` (it creates and drops `outbox_bench_p12_*`; `BENCH_P12_DATABASES`,
//!   `BENCH_P12_INSTANCES`, `BENCH_P12_SECONDS` (20), `BENCH_P12_POOL` and `BENCH_P12_LANES`
//!   narrow it down).
//! - P13 the standby wait: commit → published latency (p50, p99) and throughput of the relay's
//!   fast path and claim loop, and the inbox's handling latency and backlog throughput, with
//!   `wait_for_standbys(0)` and `(1)`, on a primary with an asynchronous streaming standby that
//!   `scripts/pg-failover up async` starts (as root; skipped when it cannot). Only with
//!   `--only p13` (`BENCH_P13_RATE`, default 1000, and `BENCH_P13_SECONDS`, default 10).
//!
//! `BENCH_P3_MODES` (`raw,wake,poll,relay,consumer,rawrelay`) and `BENCH_P3_RATES` (`200,1000,5000`)
//! narrow P3 down to some modes and offered loads. `BENCH_INBOX_ROTATION=off` switches the
//! inbox's rotation off in the bench database (handled messages stay in `inbox_event`), to
//! measure what it costs.
//!
//! `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/outbox_bench`, created if
//! missing) and `NATS_URL` (default `nats://127.0.0.1:4222`). The table is printed and written
//! as JSON to `target/bench/report.json` (`--out`).

#[cfg(feature = "kafka")]
mod kafka;
mod p1;
mod p10;
mod p11;
mod p12;
mod p13;
mod p13_cluster;
mod p2;
mod p3;
mod p4;
mod p5;
mod p6;
mod p7;
mod p8;
mod p9;
mod report;
mod support;

use std::time::Instant;

use report::Measures;
use support::{BoxError, Ctx};

const SCENARIOS: [&str; 13] = [
    "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9", "p10", "p11", "p12", "p13",
];
/// What runs without `--only`: every scenario but P9, which takes 45 minutes, P10 and P11,
/// which need `pg_stat_statements`, P12, which creates databases, and P13, which starts a primary
/// and a standby of its own (the smoke run takes them all, in seconds).
const DEFAULT: [&str; 8] = ["p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8"];

#[derive(Debug)]
struct Args {
    smoke: bool,
    runs: usize,
    only: Vec<String>,
    out: String,
}

fn parse_args() -> Result<Args, BoxError> {
    let mut args = Args {
        smoke: false,
        runs: 3,
        only: Vec::new(),
        out: "target/bench/report.json".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--smoke" => args.smoke = true,
            "--runs" => {
                args.runs = it.next().ok_or("--runs needs a number")?.parse()?;
                if args.runs == 0 {
                    return Err("--runs must be at least 1".into());
                }
            }
            "--only" => {
                let list = it.next().ok_or("--only needs a list such as p1,p3")?;
                args.only = list.split(',').map(|s| s.trim().to_lowercase()).collect();
                if let Some(bad) = args.only.iter().find(|s| !SCENARIOS.contains(&s.as_str())) {
                    return Err(format!("unknown scenario `{bad}`: one of {SCENARIOS:?}").into());
                }
            }
            "--out" => args.out = it.next().ok_or("--out needs a path")?,
            "-h" | "--help" => {
                println!(
                    "usage: bench [--smoke] [--runs N] [--only p1,p2,...] [--out report.json]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}` (try --help)").into()),
        }
    }
    if args.only.is_empty() {
        let set: &[&str] = if args.smoke { &SCENARIOS } else { &DEFAULT };
        args.only = set.iter().map(|s| (*s).to_owned()).collect();
    }
    if args.smoke {
        args.runs = 1;
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = parse_args()?;
    let ctx = Ctx::connect(args.smoke).await?;
    println!(
        "outbox bench: {} run(s) of {} on {} ({} mode)",
        args.runs,
        args.only.join(","),
        ctx.machine.summary(),
        if args.smoke { "smoke" } else { "full" }
    );
    let started = Instant::now();
    let mut measures = Measures::default();
    for run in 1..=args.runs {
        for scenario in &args.only {
            let t = Instant::now();
            println!("run {run}/{}: {scenario} ...", args.runs);
            let got = match scenario.as_str() {
                "p1" => p1::run(&ctx).await,
                "p2" => p2::run(&ctx).await,
                "p3" => p3::run(&ctx).await,
                "p4" => p4::run(&ctx).await,
                // The large tables are built once, then measured `runs` times.
                "p5" if run == 1 => p5::run(&ctx, args.runs).await,
                "p5" => continue,
                "p6" => p6::run(&ctx).await,
                "p7" => p7::run(&ctx).await,
                "p8" => p8::run(&ctx).await,
                // Long enough once: its phases are its repetitions.
                "p9" if run == 1 => p9::run(&ctx).await,
                "p9" => continue,
                "p10" => p10::run(&ctx).await,
                "p11" => p11::run(&ctx).await,
                "p12" => p12::run(&ctx).await,
                "p13" => p13::run(&ctx).await,
                _ => unreachable!("checked when parsing"),
            };
            let got = got.map_err(|e| format!("{scenario} failed: {e}"))?;
            println!(
                "run {run}/{}: {scenario} done in {:.1} s",
                args.runs,
                t.elapsed().as_secs_f64()
            );
            measures.extend(got);
        }
    }
    let report = report::build(&ctx, &args.only, &measures, args.runs, started.elapsed());
    report.print();
    report.write(&args.out)?;
    println!("report written to {}", args.out);
    if args.smoke {
        // The smoke run proves the bench still works end to end; figures from a debug build on
        // a shared machine say nothing about targets.
        println!("smoke run complete: every scenario ran and its checks passed");
    }
    Ok(())
}
