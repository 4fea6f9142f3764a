//! P11 idle cost: the statements runtimes send to their database while nothing happens, per
//! second, with one and with three instances (runtimes with a relay, a NATS consumer and the
//! janitor and sampler each) on one database, and which statements they are. What a service
//! with many tenant databases pays per database before it handles a single event.
//!
//! Counted with `pg_stat_statements` over a window of `BENCH_P11_SECONDS` (60 s; 2 s in the smoke
//! run) after the runtimes settled, so starting and stopping them is not counted. It needs the
//! cluster `scripts/pg-logical` starts:
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5433/outbox_bench scripts/bench --only p11`.
//! Each statement's calls per second are written to `target/bench/p11-statements.txt`.
//!
//! The same again with the instances as a fleet (`outbox::fleet`) over a set of one database,
//! which is also the control database: the owned loops run on one instance only, the others run
//! the fast path (no statement while idle) and the fleet's heartbeat (in the control database:
//! counted here, as if every tenant database were its own control database).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use outbox::fleet::FleetDatabase;
use outbox::prelude::*;
use outbox::relay::RelayConfig;
use outbox::runtime::Runtime;

use crate::p10::Meter;
use crate::report::{Measure, Spec, m, spec};
use crate::support::{BoxError, Ctx, OrderPlaced};

const CONSUMER: &str = "bench-p11";

/// The instances measured.
const INSTANCES: [usize; 2] = [1, 3];

#[outbox::inbox_handler(consumer = "bench-p11")]
async fn never_called(
    _tx: &InboxTransaction,
    _event: Event<OrderPlaced>,
) -> Result<(), HandlerError> {
    Ok(())
}

pub(crate) async fn run(ctx: &Ctx) -> Result<Vec<Measure>, BoxError> {
    let seconds = crate::support::env_list("BENCH_P11_SECONDS", &[if ctx.smoke { 2 } else { 60 }])?;
    let window = Duration::from_secs(seconds.first().copied().unwrap_or(60));
    ctx.reset().await?;
    let transport = Arc::new(ctx.transport("bench_p11").await?);
    let mut out = Vec::new();
    let mut listing = String::new();
    for (fleet, instances) in [false, true]
        .into_iter()
        .flat_map(|f| INSTANCES.map(|i| (f, i)))
    {
        let kind = if fleet { "fleet" } else { "idle" };
        let mut meter = Meter::on(ctx).await?;
        let mut runtimes = Vec::new();
        let mut fleets = Vec::new();
        for i in 0..instances {
            let builder = Runtime::builder(ctx.db.clone())
                .source("bench-p11")
                .transport(transport.clone())
                .relay_config(RelayConfig::default().relay_id(format!("bench-p11-{i}")))
                .consumers([CONSUMER])
                .expect_consumers([CONSUMER]);
            if fleet {
                let set = vec![FleetDatabase::new("tenant", ctx.db.clone())];
                fleets.push(builder.databases(set).start().await?);
            } else {
                runtimes.push(builder.start().await?);
            }
        }
        // Past start-up: subscriptions made, the first rounds of every loop run.
        tokio::time::sleep(Duration::from_secs(if ctx.smoke { 1 } else { 5 })).await;
        meter.start(ctx).await?;
        tokio::time::sleep(window).await;
        meter.stop(ctx).await?;
        for runtime in runtimes {
            runtime.shutdown().await;
        }
        for fleet in fleets {
            fleet.shutdown().await;
        }
        let cost = meter.cost.ok_or("P11: the meter read nothing")?;
        if !cost.counted {
            continue; // the smoke run on a server without pg_stat_statements
        }
        let calls: i64 = cost.statements.iter().map(|(_, n, _)| n).sum();
        let per_second = calls as f64 / cost.seconds;
        out.push(m(
            format!("p11.{kind}.i{instances}.statements"),
            per_second,
            "stmt/s",
        ));
        out.push(m(
            format!("p11.{kind}.i{instances}.server_cpu"),
            cost.server_cpu.unwrap_or(f64::NAN) / cost.seconds * 1000.0,
            "ms/s",
        ));
        let _ = writeln!(
            listing,
            "== {kind}: {instances} instance(s), idle for {:.1} s: {per_second:.2} statements/s on the \
             database, server CPU {:.2} ms/s",
            cost.seconds,
            cost.server_cpu.unwrap_or(f64::NAN) / cost.seconds * 1000.0
        );
        for (query, n, _) in &cost.statements {
            let one_line: String = query.split_whitespace().collect::<Vec<_>>().join(" ");
            let _ = writeln!(
                listing,
                "{:>8.3}/s  {}",
                *n as f64 / cost.seconds,
                one_line.chars().take(160).collect::<String>()
            );
        }
    }
    std::fs::create_dir_all("target/bench")?;
    std::fs::write("target/bench/p11-statements.txt", listing)?;
    Ok(out)
}

pub(crate) fn specs() -> Vec<Spec> {
    [("idle", "runtimes"), ("fleet", "fleet instances")]
        .into_iter()
        .flat_map(|(kind, what)| {
            INSTANCES.iter().flat_map(move |i| {
                [
                    spec(
                        "P11",
                        format!("idle, {i} {what}: statements per second on the database"),
                        format!("p11.{kind}.i{i}.statements"),
                    ),
                    spec(
                        "P11",
                        format!("idle, {i} {what}: server CPU per second"),
                        format!("p11.{kind}.i{i}.server_cpu"),
                    ),
                ]
            })
        })
        .collect()
}
