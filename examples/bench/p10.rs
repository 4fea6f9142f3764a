//! P10 cost per event: how many statements PostgreSQL runs and how much CPU the server and the
//! bench process spend per event, for the hand-written pipeline (commit the order, publish it,
//! pull it, commit the effect) and each road of the SDK (the fast path, the WAL relay, the claim
//! loop woken by `NOTIFY`), at P3's loads.
//!
//! The statements come from `pg_stat_statements` (top-level statements of the bench database,
//! `BEGIN` and `COMMIT` included: each is a round trip), the CPU from `/proc`: the bench
//! process's own, and the PostgreSQL server's (its postmaster and every process it started,
//! those that ended included). Both are read right before the orders are offered and right after
//! the last one was handled, so starting and stopping the runtime is not counted; what runs in
//! the background meanwhile (the janitor, the samplers) is. It needs a server that loads
//! `pg_stat_statements` (the cluster `scripts/pg-logical` starts does) on this machine:
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5433/outbox_bench scripts/bench --only p10`.
//! Each statement's count per event is written to `target/bench/p10-statements.txt`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Instant;

use outbox::sea_orm::{ConnectionTrait, DbBackend, Statement};

use crate::p3::Mode;
use crate::report::{Measure, Spec, Target, m, spec};
use crate::support::{BoxError, Ctx};

/// The modes measured, with the key of their figures.
const MODES: [(Mode, &str); 4] = [
    (Mode::Raw, "raw"),
    (Mode::Fast, "fast"),
    (Mode::Wal, "wal"),
    (Mode::Wake, "claim"),
];

/// Linux's clock ticks per second in `/proc/<pid>/stat` (`USER_HZ`, 100 on every architecture
/// the bench runs on).
const TICKS_PER_SECOND: f64 = 100.0;

/// Statement counts and CPU times at one moment.
struct Snapshot {
    /// Calls of each top-level statement, by its query id, with its text and the milliseconds
    /// the server spent planning and running it.
    statements: HashMap<i64, (i64, String, f64)>,
    /// CPU seconds of the bench process.
    bench_cpu: f64,
    /// CPU seconds of the PostgreSQL server, when it runs on this machine.
    server_cpu: Option<f64>,
    /// The same by kind of process (see [`process_kind`]).
    server_kinds: HashMap<&'static str, f64>,
    at: Instant,
}

/// What one measured window cost.
pub(crate) struct Cost {
    /// Whether statements were counted.
    pub(crate) counted: bool,
    /// Each statement that ran, with how often and the milliseconds the server spent on it,
    /// most frequent first.
    pub(crate) statements: Vec<(String, i64, f64)>,
    pub(crate) bench_cpu: f64,
    pub(crate) server_cpu: Option<f64>,
    /// The server's CPU seconds by kind of process, most first.
    pub(crate) server_kinds: Vec<(&'static str, f64)>,
    pub(crate) seconds: f64,
}

/// Reads a [`Snapshot`] when the offered load starts and the [`Cost`] when it is handled; off
/// (doing nothing) in P3.
pub(crate) struct Meter {
    on: bool,
    /// Whether the server counts statements (`pg_stat_statements` loaded); the smoke run goes
    /// on without.
    counts: bool,
    postmaster: Option<u32>,
    before: Option<Snapshot>,
    pub(crate) cost: Option<Cost>,
}

impl Meter {
    pub(crate) fn off() -> Self {
        Meter {
            on: false,
            counts: false,
            postmaster: None,
            before: None,
            cost: None,
        }
    }

    pub(crate) async fn on(ctx: &Ctx) -> Result<Self, BoxError> {
        // The extension's view errors unless the server loads the library at start.
        let counted = match ctx
            .db
            .execute_unprepared("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .await
        {
            Ok(_) => ctx
                .db
                .execute_unprepared("SELECT count(*) FROM pg_stat_statements")
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        };
        let counts = match counted {
            Ok(()) => true,
            Err(_) if ctx.smoke => false,
            Err(e) => {
                return Err(format!(
                    "P10 counts statements with pg_stat_statements, which this server does not \
                     load ({e}); run it on the cluster scripts/pg-logical starts"
                )
                .into());
            }
        };
        let backend =
            crate::support::scalar_i64(&ctx.db, "SELECT pg_backend_pid()::bigint").await? as u32;
        Ok(Meter {
            on: true,
            counts,
            postmaster: proc_stat(backend).map(|s| s.ppid),
            before: None,
            cost: None,
        })
    }

    /// The offered load starts now.
    pub(crate) async fn start(&mut self, ctx: &Ctx) -> Result<(), BoxError> {
        if self.on {
            self.before = Some(self.snapshot(ctx).await?);
        }
        Ok(())
    }

    /// Everything offered was handled.
    pub(crate) async fn stop(&mut self, ctx: &Ctx) -> Result<(), BoxError> {
        let Some(before) = self.before.take() else {
            return Ok(());
        };
        let after = self.snapshot(ctx).await?;
        let mut statements: Vec<(String, i64, f64)> = after
            .statements
            .iter()
            .filter_map(|(id, (calls, query, ms))| {
                let (earlier, earlier_ms) = before
                    .statements
                    .get(id)
                    .map_or((0, 0.0), |(c, _, ms)| (*c, *ms));
                (calls > &earlier).then(|| (query.clone(), calls - earlier, ms - earlier_ms))
            })
            .collect();
        statements.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let mut server_kinds: Vec<(&'static str, f64)> = after
            .server_kinds
            .iter()
            .map(|(kind, secs)| (*kind, secs - before.server_kinds.get(kind).unwrap_or(&0.0)))
            .collect();
        server_kinds.sort_by(|a, b| b.1.total_cmp(&a.1));
        self.cost = Some(Cost {
            counted: self.counts,
            statements,
            bench_cpu: after.bench_cpu - before.bench_cpu,
            server_cpu: after.server_cpu.zip(before.server_cpu).map(|(a, b)| a - b),
            server_kinds,
            seconds: after.at.duration_since(before.at).as_secs_f64(),
        });
        Ok(())
    }

    async fn snapshot(&self, ctx: &Ctx) -> Result<Snapshot, BoxError> {
        let mut statements = HashMap::new();
        let rows = if !self.counts {
            Vec::new()
        } else {
            ctx.db
                .query_all_raw(Statement::from_string(
                    DbBackend::Postgres,
                    "SELECT queryid, SUM(calls)::bigint AS calls, MIN(query) AS query, \
                 SUM(total_exec_time + total_plan_time)::float8 AS ms FROM pg_stat_statements WHERE toplevel AND dbid = (SELECT oid FROM pg_database \
                 WHERE datname = current_database()) AND query NOT LIKE '%pg_stat_statements%' \
                 GROUP BY queryid",
                ))
                .await?
        };
        for row in rows {
            let id: i64 = row.try_get("", "queryid")?;
            let calls: i64 = row.try_get("", "calls")?;
            let query: String = row.try_get("", "query")?;
            let ms: f64 = row.try_get("", "ms")?;
            statements.insert(id, (calls, query, ms));
        }
        let kinds = self.postmaster.and_then(server_cpu);
        Ok(Snapshot {
            statements,
            bench_cpu: proc_stat(std::process::id()).map_or(f64::NAN, |s| s.cpu),
            server_cpu: kinds.as_ref().map(|k| k.values().sum()),
            server_kinds: kinds.unwrap_or_default(),
            at: Instant::now(),
        })
    }
}

/// What `/proc/<pid>/stat` says of a process.
struct ProcStat {
    ppid: u32,
    /// Its own CPU seconds (user and system).
    cpu: f64,
    /// CPU seconds of its children that ended.
    children_cpu: f64,
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: the fields follow its last one.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| -> Option<f64> { fields.get(i)?.parse::<f64>().ok() };
    // Fields 4 (ppid) and 14–17 (utime, stime, cutime, cstime) of proc(5), counted from the
    // state (field 3) here.
    Some(ProcStat {
        ppid: fields.get(1)?.parse().ok()?,
        cpu: (ticks(11)? + ticks(12)?) / TICKS_PER_SECOND,
        children_cpu: (ticks(13)? + ticks(14)?) / TICKS_PER_SECOND,
    })
}

/// CPU seconds of a PostgreSQL server by kind of process: its postmaster, each process it
/// started, and those of them that ended.
fn server_cpu(postmaster: u32) -> Option<HashMap<&'static str, f64>> {
    let main = proc_stat(postmaster)?;
    let mut kinds = HashMap::from([
        ("postmaster", main.cpu),
        (
            "processes that ended (autovacuum workers, closed connections)",
            main.children_cpu,
        ),
    ]);
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(stat) = proc_stat(pid).filter(|s| s.ppid == postmaster) {
            let title = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            *kinds.entry(process_kind(&title)).or_default() += stat.cpu;
        }
    }
    Some(kinds)
}

/// What a server process does, from its title (`postgres: 15/main: autovacuum worker …`).
fn process_kind(title: &str) -> &'static str {
    const KINDS: [(&str, &str); 7] = [
        ("autovacuum", "autovacuum"),
        ("walwriter", "WAL writer"),
        ("walsender", "WAL senders (the WAL relay's stream)"),
        ("checkpointer", "checkpointer and background writer"),
        ("background writer", "checkpointer and background writer"),
        ("logical replication", "other background processes"),
        ("stats", "other background processes"),
    ];
    KINDS
        .iter()
        .find(|(needle, _)| title.contains(needle))
        .map_or("connections (statements)", |(_, kind)| kind)
}

pub(crate) async fn run(ctx: &Ctx) -> Result<Vec<Measure>, BoxError> {
    let wal = crate::support::wal_available(ctx).await?;
    let rates = crate::support::env_list("BENCH_P10_RATES", &ctx.sizes.p3_rates[..2])?;
    let mut out = Vec::new();
    let mut listing = String::new();
    for rate in rates {
        for (mode, key) in MODES {
            if mode == Mode::Wal && !wal {
                continue;
            }
            let mut meter = Meter::on(ctx).await?;
            let (latencies, _) = crate::p3::measure(ctx, mode, rate, &mut meter).await?;
            let cost = meter.cost.ok_or("P10: the meter read nothing")?;
            // One event per order; `latencies` holds the orders after the warm-up, the meter
            // counted them all: the effect rows say how many.
            let events =
                crate::support::scalar_i64(&ctx.db, "SELECT count(*) FROM bench_effect").await?;
            let events = events.max(latencies.len() as i64).max(1) as f64;
            let calls: i64 = cost.statements.iter().map(|(_, n, _)| n).sum();
            let figure = format!("p10.{key}.r{rate}");
            if cost.counted {
                out.push(m(
                    format!("{figure}.statements"),
                    calls as f64 / events,
                    "per event",
                ));
            }
            out.push(m(
                format!("{figure}.bench_cpu"),
                cost.bench_cpu / events * 1000.0,
                "s / 1k ev",
            ));
            let server = cost.server_cpu.unwrap_or(f64::NAN);
            out.push(m(
                format!("{figure}.server_cpu"),
                server / events * 1000.0,
                "s / 1k ev",
            ));
            out.push(m(
                format!("{figure}.cpu"),
                (server + cost.bench_cpu) / events * 1000.0,
                "s / 1k ev",
            ));
            let _ = writeln!(
                listing,
                "== {key} at {rate}/s: {events:.0} events in {:.1} s, {} statements per event, \
                 CPU per 1,000 events: server {:.3} s, bench {:.3} s",
                cost.seconds,
                if cost.counted {
                    format!("{:.2}", calls as f64 / events)
                } else {
                    "uncounted".to_owned()
                },
                server / events * 1000.0,
                cost.bench_cpu / events * 1000.0,
            );
            for (kind, secs) in &cost.server_kinds {
                let _ = writeln!(
                    listing,
                    "   server CPU per 1,000 events: {:>7.3} s  {kind}",
                    secs / events * 1000.0
                );
            }
            let _ = writeln!(
                listing,
                "   per event  calls  server ms per event (planning and running)  statement"
            );
            for (query, n, ms) in &cost.statements {
                let text: String = query.split_whitespace().collect::<Vec<_>>().join(" ");
                let short: String = text.chars().take(160).collect();
                let _ = writeln!(
                    listing,
                    "{:>8.3}  {:>8}  {:>8.3}  {short}",
                    *n as f64 / events,
                    n,
                    ms / events
                );
            }
            listing.push('\n');
        }
    }
    print!("{listing}");
    std::fs::create_dir_all("target/bench")?;
    std::fs::write("target/bench/p10-statements.txt", listing)?;
    Ok(out)
}

pub(crate) fn specs(ctx: &Ctx) -> Vec<Spec> {
    let mut specs = Vec::new();
    for rate in &ctx.sizes.p3_rates[..2] {
        let base = format!("p10.raw.r{rate}");
        specs.push(spec(
            "P10",
            format!("hand-written, {rate}/s: statements per event"),
            format!("{base}.statements"),
        ));
        specs.push(spec(
            "P10",
            format!("hand-written, {rate}/s: CPU per 1,000 events"),
            format!("{base}.cpu"),
        ));
        for (key, what) in [
            ("fast", "fast path"),
            ("wal", "WAL relay"),
            ("claim", "claim loop"),
        ] {
            let figure = format!("p10.{key}.r{rate}");
            // The targets: 1.3x the hand-written pipeline's statements and CPU per event, for
            // the fast path.
            let target = |s: Spec| {
                if key == "fast" {
                    s.target(Target::RatioAtMost(1.3))
                } else {
                    s
                }
            };
            specs.push(target(
                spec(
                    "P10",
                    format!("{what}, {rate}/s: statements per event"),
                    format!("{figure}.statements"),
                )
                .against("hand-written", format!("{base}.statements")),
            ));
            specs.push(target(
                spec(
                    "P10",
                    format!("{what}, {rate}/s: CPU per 1,000 events"),
                    format!("{figure}.cpu"),
                )
                .against("hand-written", format!("{base}.cpu")),
            ));
            specs.push(
                spec(
                    "P10",
                    format!("{what}, {rate}/s: server CPU per 1,000 events"),
                    format!("{figure}.server_cpu"),
                )
                .against("hand-written", format!("{base}.server_cpu")),
            );
        }
    }
    specs
}
