//! P12 fleet throughput: events per second through `outbox::fleet` over 1, 2, 4 and 8 databases
//! on one server, with one fleet instance and with two (each on pools of its own).
//!
//! For each count of databases, that many fresh databases (`outbox_bench_p12_<i>`, dropped and
//! created again, migrated, with the bench's order and effect tables) on the server of
//! `DATABASE_URL`, which is also the fleet's control database. The consumer records one effect
//! per event in the database the event came from. The offered load is the same for every count:
//! [`PRODUCERS`] closed-loop producers commit an order with its event each, every commit to the
//! database (and through the instance) its order id picks, so the databases share the
//! producers evenly. After `BENCH_P12_SECONDS` (20 s; 2 s in the smoke run) the producers stop
//! and the run waits until every committed event was handled.
//!
//! Figures per count of databases and instances: events committed per second, events handled
//! per second end to end (from the first commit to the last effect committed), commit → effect
//! committed latency (p50, p99), the CPU of the bench process and of the PostgreSQL server (as
//! P10 reads it), and the connections to the set's databases (peak open, mean active, sampled
//! from `pg_stat_activity`). `BENCH_P12_DATABASES` (`1,2,4,8`) and `BENCH_P12_INSTANCES` (`1,2`)
//! narrow it down; `BENCH_P12_POOL` sets each instance's pool per database (default: 32
//! connections per instance shared out over its databases, at least 4 each) and
//! `BENCH_P12_LANES` the consumer's lanes per instance (`InboxConfig::concurrency`, default 8).
//! Only with
//! `--only p12` (it creates and drops databases):
//! `DATABASE_URL=postgres://postgres@127.0.0.1:5433/outbox_bench scripts/bench --only p12`.

use std::collections::HashMap;
use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, Ordering},
};
use std::time::{Duration, Instant};

use outbox::fleet::{Fleet, FleetDatabase};
use outbox::inbox::InboxConfig;
use outbox::prelude::*;
use outbox::relay::RelayConfig;
use outbox::runtime::Runtime;
use outbox::sea_orm::{ConnectionTrait, Database, DatabaseConnection};
use outbox::transport::nats::NatsTransport;

use crate::p10::Meter;
use crate::report::{Measure, Spec, m, spec};
use crate::support::{
    BoxError, Ctx, OrderPlaced, env_list, insert_effect, next_ids, place_order, quantile,
    scalar_i64, scalar_i64_bound,
};

const CONSUMER: &str = "bench-p12";

/// Producers committing orders, over all databases together.
const PRODUCERS: usize = 8;

/// Customers (the event's aggregate) per database.
const CUSTOMERS: i64 = 1_000;

/// The set's databases are this prefix and a number.
const PREFIX: &str = "outbox_bench_p12_";

/// Connections per instance shared out over its databases when `BENCH_P12_POOL` is not set.
const CONNECTIONS_PER_INSTANCE: u64 = 32;

/// Events the smoke run commits at most per case.
const SMOKE_EVENTS: usize = 300;

/// Every order the consumer handled, with when its effect committed.
static HANDLED: Mutex<Vec<(i64, Instant)>> = Mutex::new(Vec::new());

#[outbox::inbox_handler(consumer = "bench-p12")]
async fn record_effect(
    tx: &InboxTransaction,
    event: Event<OrderPlaced>,
) -> Result<(), HandlerError> {
    insert_effect(tx, CONSUMER, event.order_id, event.total_cents).await?;
    crate::support::note_handled(tx, &HANDLED, event.order_id);
    Ok(())
}

/// One case: this many databases, served by this many fleet instances.
#[derive(Debug, Clone, Copy)]
struct Case {
    databases: usize,
    instances: usize,
}

impl Case {
    fn key(self) -> String {
        format!("p12.n{}.i{}", self.databases, self.instances)
    }
}

fn cases(ctx: &Ctx) -> Result<Vec<Case>, BoxError> {
    let databases = env_list(
        "BENCH_P12_DATABASES",
        if ctx.smoke { &[1, 2] } else { &[1, 2, 4, 8] },
    )?;
    let instances = env_list("BENCH_P12_INSTANCES", &[1, 2])?;
    if databases.iter().chain(&instances).any(|n| *n == 0) {
        return Err("BENCH_P12_DATABASES and BENCH_P12_INSTANCES count from 1".into());
    }
    Ok(instances
        .iter()
        .flat_map(|i| {
            databases.iter().map(|n| Case {
                databases: *n as usize,
                instances: *i as usize,
            })
        })
        .collect())
}

/// What one case measured.
struct Outcome {
    committed: usize,
    window: Duration,
    /// From the first commit to the last effect committed.
    end_to_end: Duration,
    /// From the last commit to the last effect committed.
    drain: Duration,
    /// Commit → effect committed, sorted, in microseconds.
    latencies_us: Vec<u64>,
    bench_cpu: f64,
    server_cpu: Option<f64>,
    metered: f64,
    connections: Connections,
    pool: u32,
}

pub(crate) async fn run(ctx: &Ctx) -> Result<Vec<Measure>, BoxError> {
    let seconds = env_list("BENCH_P12_SECONDS", &[if ctx.smoke { 2 } else { 20 }])?;
    let window = Duration::from_secs(seconds.first().copied().unwrap_or(20));
    let cases = cases(ctx)?;
    let most = cases.iter().map(|c| c.databases).max().unwrap_or(0);
    let mut out = Vec::new();
    for case in cases {
        let outcome = run_case(ctx, case, window).await?;
        let key = case.key();
        let handled_per_s = outcome.committed as f64 / outcome.end_to_end.as_secs_f64();
        let committed_per_s = outcome.committed as f64 / outcome.window.as_secs_f64();
        let p50 = quantile(&outcome.latencies_us, 0.50) as f64 / 1000.0;
        let p99 = quantile(&outcome.latencies_us, 0.99) as f64 / 1000.0;
        let bench_cpu = outcome.bench_cpu / outcome.metered * 100.0;
        let server_cpu = outcome.server_cpu.unwrap_or(f64::NAN) / outcome.metered * 100.0;
        println!(
            "p12: {} database(s), {} instance(s), pool {} per database: {} events, committed \
             {committed_per_s:.0}/s, handled {handled_per_s:.0}/s end to end (drained {:.1} s \
             after the last commit), commit -> effect p50 {p50:.1} ms p99 {p99:.1} ms, CPU \
             bench {bench_cpu:.0}% server {server_cpu:.0}% of a core, connections peak {} \
             (mean active {:.1})",
            case.databases,
            case.instances,
            outcome.pool,
            outcome.committed,
            outcome.drain.as_secs_f64(),
            outcome.connections.peak,
            outcome.connections.mean_active(),
        );
        out.push(m(format!("{key}.committed"), committed_per_s, "ev/s"));
        out.push(m(format!("{key}.handled"), handled_per_s, "ev/s"));
        out.push(m(format!("{key}.p50_ms"), p50, "ms"));
        out.push(m(format!("{key}.p99_ms"), p99, "ms"));
        out.push(m(
            format!("{key}.drain_s"),
            outcome.drain.as_secs_f64(),
            "s",
        ));
        // CPU per event: what a core more or less buys, whatever the throughput.
        let per_event = |percent: f64| percent * 10.0 / handled_per_s;
        out.push(m(
            format!("{key}.bench_cpu_per_event"),
            per_event(bench_cpu),
            "ms/ev",
        ));
        out.push(m(
            format!("{key}.server_cpu_per_event"),
            per_event(server_cpu),
            "ms/ev",
        ));
        out.push(m(format!("{key}.bench_cpu"), bench_cpu, "% core"));
        out.push(m(format!("{key}.server_cpu"), server_cpu, "% core"));
        out.push(m(
            format!("{key}.connections_peak"),
            outcome.connections.peak as f64,
            "conns",
        ));
        out.push(m(
            format!("{key}.connections_active"),
            outcome.connections.mean_active(),
            "conns",
        ));
    }
    drop_databases(ctx, most).await?;
    Ok(out)
}

/// Fresh databases, the fleet instances over them, the load, and its outcome checked.
async fn run_case(ctx: &Ctx, case: Case, window: Duration) -> Result<Outcome, BoxError> {
    let urls = create_databases(ctx, case.databases).await?;
    let pool = match std::env::var("BENCH_P12_POOL") {
        Ok(n) => n.parse().map_err(|e| format!("BENCH_P12_POOL: {e}"))?,
        Err(_) => (CONNECTIONS_PER_INSTANCE / case.databases as u64).max(4) as u32,
    };
    // The SDK's default lanes unless `BENCH_P12_LANES` sets them.
    let inbox = match std::env::var("BENCH_P12_LANES") {
        Ok(n) => InboxConfig::default()
            .concurrency(n.parse().map_err(|e| format!("BENCH_P12_LANES: {e}"))?),
        Err(_) => InboxConfig::default(),
    };
    let namespace = format!("bench_p12_n{}_i{}", case.databases, case.instances);
    let first = Arc::new(ctx.transport(&namespace).await?);
    HANDLED.lock().unwrap_or_else(|p| p.into_inner()).clear();
    let instances = start_instances(ctx, case, &urls, pool, &inbox, &first).await?;
    settle(&instances, case).await?;

    // CPU as P10 reads it; without `pg_stat_statements` (the default cluster) the meter refuses
    // outside the smoke run, and the case goes on without CPU figures.
    let mut meter = match Meter::on(ctx).await {
        Ok(meter) => meter,
        Err(e) => {
            println!("p12: no CPU figures: {e}");
            Meter::off()
        }
    };
    let sampler = Sampler::start(ctx.db.clone());
    meter.start(ctx).await?;
    let started = Instant::now();
    let commits = produce(
        Arc::new(instances.iter().map(Instance::targets).collect()),
        case,
        window,
        ctx.smoke.then_some(SMOKE_EVENTS),
    )
    .await?;
    // Until the last commit (the smoke run's cap may end the loops before the window does).
    let window = commits
        .iter()
        .map(|(_, at)| *at)
        .max()
        .map_or(window, |last| last.duration_since(started));
    let committed = commits.len();
    let handled = wait_handled(committed).await?;
    meter.stop(ctx).await?;
    let connections = sampler.stop().await;
    let last = handled.values().max().copied().unwrap_or(started);
    let mut latencies_us: Vec<u64> = commits
        .iter()
        .filter_map(|(id, at)| handled.get(id).map(|h| h.duration_since(*at)))
        .map(|d| d.as_micros() as u64)
        .collect();
    latencies_us.sort_unstable();

    for instance in instances {
        instance.fleet.shutdown().await;
        for db in instance.pools {
            db.close().await?;
        }
    }
    check_effects(&urls, committed).await?;
    ctx.drop_stream(&first).await;
    let cost = meter.cost;
    Ok(Outcome {
        committed,
        window,
        end_to_end: last.duration_since(started),
        drain: last.saturating_duration_since(started + window),
        latencies_us,
        bench_cpu: cost.as_ref().map_or(f64::NAN, |c| c.bench_cpu),
        server_cpu: cost.as_ref().and_then(|c| c.server_cpu),
        metered: cost.as_ref().map_or(f64::NAN, |c| c.seconds),
        connections,
        pool,
    })
}

/// The fleet instances over the set, each with its own pools to every database and (but the
/// first, which uses `first`) its own broker connection.
async fn start_instances(
    ctx: &Ctx,
    case: Case,
    urls: &[String],
    pool: u32,
    inbox: &InboxConfig,
    first: &Arc<NatsTransport>,
) -> Result<Vec<Instance>, BoxError> {
    let mut instances: Vec<Instance> = Vec::new();
    for i in 0..case.instances {
        let mut pools = Vec::new();
        for url in urls {
            pools.push(crate::support::pool(url, pool).await?);
        }
        let transport: Arc<NatsTransport> = if i == 0 {
            first.clone()
        } else {
            Arc::new(
                NatsTransport::builder(&ctx.nats_url)
                    .namespace(first.namespace())
                    .connect()
                    .await?,
            )
        };
        let set = pools
            .iter()
            .enumerate()
            .map(|(d, db)| FleetDatabase::new(database_name(d), db.clone()))
            .collect::<Vec<_>>();
        let fleet = Runtime::builder(ctx.db.clone())
            .source("bench-p12")
            .transport(transport)
            .relay_config(RelayConfig::default().relay_id(format!("bench-p12-{i}")))
            .inbox_config(inbox.clone())
            .consumers([CONSUMER])
            .expect_consumers([CONSUMER])
            .databases(set)
            .group(format!("bench-p12-n{}-i{}", case.databases, case.instances))
            .start()
            .await?;
        let outboxes = (0..case.databases)
            .map(|d| {
                fleet
                    .outbox(&database_name(d))
                    .ok_or("a database of the set")
            })
            .collect::<Result<Vec<_>, _>>()?;
        instances.push(Instance {
            fleet,
            pools,
            outboxes,
        });
    }
    Ok(instances)
}

fn database_name(i: usize) -> String {
    format!("tenant-{i}")
}

/// A fleet instance, its pools (one per database) and the outbox handles it produces through.
struct Instance {
    fleet: Fleet,
    pools: Vec<DatabaseConnection>,
    outboxes: Vec<Outbox>,
}

impl Instance {
    /// Where a producer commits, per database: the pool and the outbox handle.
    fn targets(&self) -> Vec<(DatabaseConnection, Outbox)> {
        self.pools
            .iter()
            .cloned()
            .zip(self.outboxes.iter().cloned())
            .collect()
    }
}

/// Wait until every database has one owner and the instances share them evenly, so that the
/// load does not start while databases move.
async fn settle(instances: &[Instance], case: Case) -> Result<(), BoxError> {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let owned: Vec<usize> = instances.iter().map(|i| i.fleet.owned().len()).collect();
        let total: usize = owned.iter().sum();
        let (most, least) = (
            owned.iter().max().copied().unwrap_or(0),
            owned.iter().min().copied().unwrap_or(0),
        );
        if total == case.databases && most - least <= 1 {
            return Ok(());
        }
        if Instant::now() > until {
            return Err(format!("P12: the databases' owners did not settle: {owned:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// [`PRODUCERS`] closed loops for `window` (or until `cap` commits); each order goes to the
/// database and through the instance its id picks. Every commit's order id and time.
async fn produce(
    targets: Arc<Vec<Vec<(DatabaseConnection, Outbox)>>>,
    case: Case,
    window: Duration,
    cap: Option<usize>,
) -> Result<Vec<(i64, Instant)>, BoxError> {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..PRODUCERS {
        let (targets, stop, count) = (targets.clone(), stop.clone(), count.clone());
        tasks.push(tokio::spawn(async move {
            let mut commits = Vec::with_capacity(16_384);
            while !stop.load(Ordering::Relaxed) {
                if cap.is_some_and(|cap| count.fetch_add(1, Ordering::Relaxed) >= cap) {
                    break;
                }
                let id = next_ids(1);
                let database = id.rem_euclid(case.databases as i64) as usize;
                let instance = (id / case.databases as i64).rem_euclid(case.instances as i64);
                let (db, outbox) = &targets[instance as usize][database];
                let event = OrderPlaced::sample(id, CUSTOMERS * case.databases as i64);
                commits.push((id, place_order(db, outbox, &event).await?));
            }
            Ok::<_, BoxError>(commits)
        }));
    }
    let deadline = tokio::time::sleep(window);
    tokio::pin!(deadline);
    // The smoke run's cap may end the loops before the window does.
    loop {
        tokio::select! {
            _ = &mut deadline => break,
            _ = tokio::time::sleep(Duration::from_millis(50)) => {
                if tasks.iter().all(|t| t.is_finished()) {
                    break;
                }
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut commits = Vec::new();
    for task in tasks {
        commits.extend(task.await??);
    }
    Ok(commits)
}

/// Wait until `n` distinct orders were handled; when each was.
async fn wait_handled(n: usize) -> Result<HashMap<i64, Instant>, BoxError> {
    let since = Instant::now();
    let limit = Duration::from_secs(120) + Duration::from_millis(n as u64 * 2);
    loop {
        // Counting the list is cheap; its distinct orders are read only once it is long enough
        // (a redelivered message is handled, and noted, once more).
        let noted = HANDLED.lock().unwrap_or_else(|p| p.into_inner()).len();
        let mut distinct = 0;
        if noted >= n {
            let handled: HashMap<i64, Instant> = HANDLED
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .copied()
                .collect();
            if handled.len() >= n {
                return Ok(handled);
            }
            distinct = handled.len();
        }
        if since.elapsed() > limit {
            return Err(format!(
                "P12: {} of {n} events handled after {limit:?}",
                distinct.max(noted.min(n - 1))
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every database holds one effect per order it committed, and all of them add up to what the
/// producers committed.
async fn check_effects(urls: &[String], committed: usize) -> Result<(), BoxError> {
    let mut total = 0;
    for url in urls {
        let db = Database::connect(url.as_str()).await?;
        let orders = scalar_i64(&db, "SELECT count(*) FROM bench_order").await?;
        let effects = scalar_i64_bound(
            &db,
            "SELECT count(*) FROM bench_effect e JOIN bench_order o ON o.id = e.order_id \
             WHERE e.consumer = $1",
            [CONSUMER.into()],
        )
        .await?;
        db.close().await?;
        if orders != effects {
            return Err(format!("P12: {url} holds {orders} orders but {effects} effects").into());
        }
        total += effects;
    }
    if total != committed as i64 {
        return Err(format!("P12: {committed} orders committed, {total} found").into());
    }
    Ok(())
}

/// Connections to the set's databases, sampled every 250 ms.
#[derive(Debug, Default)]
struct Connections {
    peak: i64,
    active: i64,
    samples: i64,
}

impl Connections {
    fn mean_active(&self) -> f64 {
        self.active as f64 / self.samples.max(1) as f64
    }
}

struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Connections>,
}

impl Sampler {
    fn start(db: DatabaseConnection) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut seen = Connections::default();
            while !flag.load(Ordering::Relaxed) {
                if let Ok((open, active)) = connections(&db).await {
                    seen.peak = seen.peak.max(open);
                    seen.active += active;
                    seen.samples += 1;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            seen
        });
        Sampler { stop, task }
    }

    async fn stop(self) -> Connections {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

/// Open and active (running a statement) connections to the set's databases now.
async fn connections(db: &DatabaseConnection) -> Result<(i64, i64), BoxError> {
    let row = db
        .query_one_raw(outbox::sea_orm::Statement::from_sql_and_values(
            outbox::sea_orm::DbBackend::Postgres,
            "SELECT count(*) AS open, count(*) FILTER (WHERE state = 'active') AS active \
             FROM pg_stat_activity WHERE starts_with(datname, $1)",
            [PREFIX.into()],
        ))
        .await?
        .ok_or("no row")?;
    Ok((row.try_get("", "open")?, row.try_get("", "active")?))
}

/// The server part of `DATABASE_URL` and its query string.
fn server(ctx: &Ctx) -> Result<(&str, &str), BoxError> {
    let (server, name) = ctx
        .url
        .rsplit_once('/')
        .ok_or("DATABASE_URL names no database")?;
    let query = name.find('?').map_or("", |at| &name[at..]);
    Ok((server, query))
}

/// Drop and create the set's `n` databases, migrated, with the bench's tables; their URLs.
async fn create_databases(ctx: &Ctx, n: usize) -> Result<Vec<String>, BoxError> {
    let (server, query) = server(ctx)?;
    let admin = Database::connect(format!("{server}/postgres{query}")).await?;
    let mut urls = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("{PREFIX}{i}");
        crate::support::database_ddl(&admin, "DROP DATABASE IF EXISTS %I WITH (FORCE)", &name)
            .await?;
        crate::support::database_ddl(&admin, "CREATE DATABASE %I", &name).await?;
        let url = format!("{server}/{name}{query}");
        let db = Database::connect(url.as_str()).await?;
        outbox::migrate(&db).await?;
        db.execute_unprepared(crate::support::BENCH_TABLES).await?;
        db.close().await?;
        urls.push(url);
    }
    admin.close().await?;
    Ok(urls)
}

/// Drop the set's databases (the last case's are left until now).
async fn drop_databases(ctx: &Ctx, n: usize) -> Result<(), BoxError> {
    let (server, query) = server(ctx)?;
    let admin = Database::connect(format!("{server}/postgres{query}")).await?;
    for i in 0..n {
        let name = format!("{PREFIX}{i}");
        crate::support::database_ddl(&admin, "DROP DATABASE IF EXISTS %I WITH (FORCE)", &name)
            .await?;
    }
    admin.close().await?;
    Ok(())
}

pub(crate) fn specs(ctx: &Ctx) -> Vec<Spec> {
    let Ok(cases) = cases(ctx) else {
        return Vec::new();
    };
    let mut specs = Vec::new();
    for case in cases {
        let key = case.key();
        let (n, i) = (case.databases, case.instances);
        let what = format!("{n} db{}, {i} inst.", if n == 1 { "" } else { "s" });
        let one = Case {
            databases: 1,
            ..case
        }
        .key();
        specs.push(spec(
            "P12",
            format!("{what}: committed/s"),
            format!("{key}.committed"),
        ));
        specs.push(
            spec(
                "P12",
                format!("{what}: handled/s end to end"),
                format!("{key}.handled"),
            )
            .against(
                format!("1 db, {i} inst.: handled/s"),
                format!("{one}.handled"),
            ),
        );
        for (figure, suffix) in [
            ("commit -> effect p50", "p50_ms"),
            ("commit -> effect p99", "p99_ms"),
            ("last commit -> last effect", "drain_s"),
            ("bench CPU", "bench_cpu"),
            ("server CPU", "server_cpu"),
            ("bench CPU per event", "bench_cpu_per_event"),
            ("server CPU per event", "server_cpu_per_event"),
            ("connections, peak", "connections_peak"),
            ("connections, mean active", "connections_active"),
        ] {
            specs.push(spec(
                "P12",
                format!("{what}: {figure}"),
                format!("{key}.{suffix}"),
            ));
        }
    }
    specs
}
