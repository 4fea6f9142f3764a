//! Shared pieces of the bench: the database and broker, the event, load loops and statistics.

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use outbox::prelude::*;
use outbox::sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement, Value,
};
use outbox::transport::nats::{NatsTransport, async_nats};
use serde::{Deserialize, Serialize};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Sizes of the full run and of the seconds-long smoke run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    /// How long each P1 variant runs.
    pub(crate) p1_window: Duration,
    /// Events pre-enqueued for P2.
    pub(crate) p2_events: u64,
    /// How long producers run alone and beside a relay (P2).
    pub(crate) p2_window: Duration,
    /// How long each P3 load runs, after a warm-up.
    pub(crate) p3_window: Duration,
    /// Offered loads of P3, events per second.
    pub(crate) p3_rates: [u64; 3],
    /// Messages handled in P4.
    pub(crate) p4_messages: u64,
    /// SENT rows in the small and large P5 tables.
    pub(crate) p5_sent: [u64; 2],
    /// Pending events drained per P5 measurement.
    pub(crate) p5_events: u64,
    /// Backlog for the memory figure.
    pub(crate) p5_backlog: u64,
    /// Jobs in P6.
    pub(crate) p6_jobs: u64,
    /// Delayed events waiting in P8.
    pub(crate) p8_scheduled: u64,
}

impl Sizes {
    fn full() -> Self {
        Sizes {
            p1_window: Duration::from_secs(4),
            p2_events: 200_000,
            p2_window: Duration::from_secs(5),
            p3_window: Duration::from_secs(10),
            p3_rates: [200, 1_000, 5_000],
            p4_messages: 50_000,
            p5_sent: [10_000, 10_000_000],
            p5_events: 50_000,
            p5_backlog: 1_000_000,
            p6_jobs: 20_000,
            p8_scheduled: 1_000_000,
        }
    }

    fn smoke() -> Self {
        Sizes {
            p1_window: Duration::from_millis(300),
            p2_events: 2_000,
            p2_window: Duration::from_millis(500),
            p3_window: Duration::from_secs(1),
            p3_rates: [50, 100, 300],
            p4_messages: 1_000,
            p5_sent: [1_000, 20_000],
            p5_events: 1_000,
            p5_backlog: 5_000,
            p6_jobs: 300,
            p8_scheduled: 20_000,
        }
    }
}

/// What the report says about the machine.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Machine {
    pub(crate) cpus: usize,
    pub(crate) memory_gib: f64,
    pub(crate) postgres: String,
    pub(crate) nats: String,
    pub(crate) kernel: String,
    pub(crate) build: &'static str,
}

impl Machine {
    pub(crate) fn summary(&self) -> String {
        format!(
            "{} CPUs, {:.0} GiB, {}, NATS {}, {} build",
            self.cpus, self.memory_gib, self.postgres, self.nats, self.build
        )
    }
}

/// The database, the broker and the sizes of this run.
pub(crate) struct Ctx {
    pub(crate) url: String,
    pub(crate) db: DatabaseConnection,
    pub(crate) nats_url: String,
    pub(crate) nats: async_nats::Client,
    pub(crate) sizes: Sizes,
    pub(crate) smoke: bool,
    pub(crate) machine: Machine,
}

impl Ctx {
    pub(crate) async fn connect(smoke: bool) -> Result<Ctx, BoxError> {
        let url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/outbox_bench".into());
        let nats_url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
        create_database(&url).await?;
        let db = pool(&url, 48).await?;
        if db.get_database_backend() != DbBackend::Postgres {
            return Err("the bench runs on PostgreSQL: DATABASE_URL must be postgres://".into());
        }
        outbox::migrate(&db).await?;
        // A bench database whose inbox held rows when `outbox_0014` ran: handled messages go to
        // `inbox_done` here too (no consumer of an earlier release reads it), unless
        // `BENCH_INBOX_ROTATION=off` asks to measure the inbox without its rotation.
        if std::env::var("BENCH_INBOX_ROTATION").as_deref() == Ok("off") {
            db.execute_raw(Statement::from_string(
                DbBackend::Postgres,
                "DELETE FROM outbox_rotation WHERE table_name IN ('inbox_done', 'inbox_key')",
            ))
            .await?;
        } else {
            outbox::admin::rotate_inbox(&db).await?;
        }
        db.execute_unprepared(
            "CREATE TABLE IF NOT EXISTS bench_order (id BIGINT PRIMARY KEY, customer TEXT NOT NULL, \
             total_cents BIGINT NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now());
             CREATE TABLE IF NOT EXISTS bench_effect (order_id BIGINT PRIMARY KEY, \
             consumer TEXT NOT NULL, total_cents BIGINT NOT NULL, \
             created_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        )
        .await?;
        let nats = async_nats::connect(&nats_url)
            .await
            .map_err(|e| format!("NATS at {nats_url}: {e}"))?;
        let postgres = scalar_text(&db, "SELECT split_part(version(), ' on ', 1)").await?;
        let machine = Machine {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_gib: meminfo_kib("MemTotal").unwrap_or(0) as f64 / 1024.0 / 1024.0,
            postgres,
            nats: nats.server_info().version.clone(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_owned())
                .unwrap_or_default(),
            build: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
        };
        Ok(Ctx {
            url,
            db,
            nats_url,
            nats,
            sizes: if smoke { Sizes::smoke() } else { Sizes::full() },
            smoke,
            machine,
        })
    }

    /// Empty the outbox, the inbox and the bench's tables.
    pub(crate) async fn reset(&self) -> Result<(), BoxError> {
        self.db.execute_unprepared(TRUNCATE_ALL).await?;
        self.db
            .execute_unprepared("VACUUM ANALYZE outbox_event")
            .await?;
        Ok(())
    }

    /// A NATS transport on its own namespace, with a fresh stream.
    pub(crate) async fn transport(&self, namespace: &str) -> Result<NatsTransport, BoxError> {
        let transport = NatsTransport::builder(&self.nats_url)
            .namespace(namespace)
            .connect()
            .await?;
        let jetstream = async_nats::jetstream::new(self.nats.clone());
        let _ = jetstream.delete_stream(transport.stream_name()).await;
        outbox::transport::Transport::setup(&transport).await?;
        Ok(transport)
    }

    /// Delete a transport's stream (its messages take disk space).
    pub(crate) async fn drop_stream(&self, transport: &NatsTransport) {
        let jetstream = async_nats::jetstream::new(self.nats.clone());
        let _ = jetstream.delete_stream(transport.stream_name()).await;
    }
}

async fn create_database(url: &str) -> Result<(), BoxError> {
    let Some((server, name)) = url.rsplit_once('/') else {
        return Err(format!("DATABASE_URL `{url}` names no database").into());
    };
    let name = name.split('?').next().unwrap_or(name);
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("database name `{name}` must be a plain identifier").into());
    }
    let admin = Database::connect(format!("{server}/postgres")).await?;
    let exists = admin
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT 1 AS one FROM pg_database WHERE datname = $1",
            [name.into()],
        ))
        .await?
        .is_some();
    if !exists {
        database_ddl(&admin, "CREATE DATABASE %I", name).await?;
    }
    admin.close().await?;
    Ok(())
}

/// Run `template` (DDL with one `%I`) for the database `name`: an identifier cannot be a bound
/// parameter, so the server quotes the bound name into the statement (`format(…, %I)`) and the
/// statement it returns is run.
pub(crate) async fn database_ddl(
    admin: &DatabaseConnection,
    template: &str,
    name: &str,
) -> Result<(), BoxError> {
    let row = admin
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT format($1, $2)",
            [template.into(), name.into()],
        ))
        .await?
        .ok_or("format() returned no row")?;
    let statement: String = row.try_get_by_index(0)?;
    admin.execute_unprepared(&statement).await?;
    Ok(())
}

pub(crate) async fn pool(url: &str, max: u32) -> Result<DatabaseConnection, BoxError> {
    let mut options = ConnectOptions::new(url.to_owned());
    options
        .max_connections(max)
        .min_connections(1)
        .sqlx_logging(false)
        .acquire_timeout(Duration::from_secs(30));
    Ok(Database::connect(options).await?)
}

pub(crate) async fn scalar_text(db: &impl ConnectionTrait, sql: &str) -> Result<String, BoxError> {
    let row = db
        .query_one_raw(Statement::from_string(DbBackend::Postgres, sql.to_owned()))
        .await?
        .ok_or("no row")?;
    Ok(row.try_get_by_index::<String>(0)?)
}

pub(crate) async fn scalar_i64(db: &impl ConnectionTrait, sql: &str) -> Result<i64, BoxError> {
    scalar_i64_bound(db, sql, []).await
}

/// The first column of the one row `sql` returns, with `values` bound to its `$n` placeholders.
pub(crate) async fn scalar_i64_bound(
    db: &impl ConnectionTrait,
    sql: &str,
    values: impl IntoIterator<Item = Value>,
) -> Result<i64, BoxError> {
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            sql,
            values,
        ))
        .await?
        .ok_or("no row")?;
    Ok(row.try_get_by_index::<i64>(0)?)
}

/// Run `sql` with `values` bound to its `$n` placeholders.
pub(crate) async fn execute_bound(
    db: &impl ConnectionTrait,
    sql: &str,
    values: impl IntoIterator<Item = Value>,
) -> Result<u64, BoxError> {
    let result = db
        .execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            sql,
            values,
        ))
        .await?;
    Ok(result.rows_affected())
}

/// Outbox rows not yet SENT (served by the partial index).
pub(crate) async fn unsent(db: &DatabaseConnection) -> Result<i64, BoxError> {
    scalar_i64(
        db,
        "SELECT count(*) FROM outbox_event WHERE status <> 'SENT'",
    )
    .await
}

/// Wait until no outbox row is unsent; the time it took, or an error after `limit`.
pub(crate) async fn wait_drained(
    db: &DatabaseConnection,
    since: Instant,
    limit: Duration,
) -> Result<Duration, BoxError> {
    loop {
        let left = unsent(db).await?;
        if left == 0 {
            return Ok(since.elapsed());
        }
        if since.elapsed() > limit {
            return Err(format!("{left} events still unsent after {limit:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) fn meminfo_kib(key: &str) -> Option<u64> {
    proc_field("/proc/meminfo", key)
}

/// This process's resident set, in KiB.
pub(crate) fn rss_kib() -> u64 {
    proc_field("/proc/self/status", "VmRSS").unwrap_or(0)
}

fn proc_field(path: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// The event of every scenario: an order of about 320 bytes of JSON.
#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "bench.order_placed", aggregate = "order", version = 1)]
pub(crate) struct OrderPlaced {
    #[event(aggregate_id)]
    pub(crate) customer: String,
    pub(crate) order_id: i64,
    pub(crate) total_cents: i64,
    pub(crate) currency: String,
    pub(crate) lines: Vec<Line>,
    pub(crate) note: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Line {
    pub(crate) sku: String,
    pub(crate) quantity: u32,
    pub(crate) price_cents: i64,
}

impl OrderPlaced {
    pub(crate) fn sample(order_id: i64, customers: i64) -> Self {
        OrderPlaced {
            customer: format!("customer-{}", order_id.rem_euclid(customers.max(1))),
            order_id,
            total_cents: 4_599 + order_id % 1_000,
            currency: "EUR".into(),
            lines: vec![
                Line {
                    sku: "KETTLE-1.7L-STEEL".into(),
                    quantity: 1,
                    price_cents: 3_499,
                },
                Line {
                    sku: "FILTER-PACK-12".into(),
                    quantity: 2,
                    price_cents: 550,
                },
            ],
            note: "leave at the door; ring twice; fragile items inside".into(),
        }
    }
}

/// The business row of every scenario: the order itself.
pub(crate) async fn insert_order(
    conn: &impl ConnectionTrait,
    event: &OrderPlaced,
) -> Result<(), BoxError> {
    conn.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "INSERT INTO bench_order (id, customer, total_cents) VALUES ($1, $2, $3)",
        [
            event.order_id.into(),
            event.customer.clone().into(),
            event.total_cents.into(),
        ],
    ))
    .await?;
    Ok(())
}

/// A consumer's effect of an order: one row, whose primary key makes a second effect fail.
pub(crate) async fn insert_effect(
    conn: &impl ConnectionTrait,
    consumer: &str,
    order_id: i64,
    total_cents: i64,
) -> Result<(), outbox::sea_orm::DbErr> {
    conn.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "INSERT INTO bench_effect (order_id, consumer, total_cents) VALUES ($1, $2, $3)",
        [order_id.into(), consumer.into(), total_cents.into()],
    ))
    .await?;
    Ok(())
}

/// Once the handler's transaction commits, note in `handled` when order `order_id` was.
pub(crate) fn note_handled(
    tx: &outbox::prelude::InboxTransaction,
    handled: &'static std::sync::Mutex<Vec<(i64, Instant)>>,
    order_id: i64,
) {
    tx.after_commit(move || {
        let now = Instant::now();
        handled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((order_id, now));
    });
}

/// An order and its event, committed through `OutboxTransaction`; when the commit returned.
pub(crate) async fn place_order(
    db: &DatabaseConnection,
    outbox: &Outbox,
    event: &OrderPlaced,
) -> Result<Instant, BoxError> {
    let tx = outbox.begin(db).await?;
    insert_order(&tx, event).await?;
    tx.enqueue(event)?;
    let _ = tx.commit().await?;
    Ok(Instant::now())
}

/// Order ids unique across scenarios and runs of one process.
pub(crate) fn next_ids(n: u64) -> i64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(n, Ordering::Relaxed) as i64
}

/// What a closed-loop load of `clients` did in its window.
#[derive(Debug, Clone)]
pub(crate) struct LoadResult {
    pub(crate) ops: u64,
    pub(crate) elapsed: Duration,
    /// Per-operation latencies, sorted, in microseconds.
    pub(crate) latencies_us: Vec<u64>,
}

impl LoadResult {
    pub(crate) fn per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }
}

/// Run `op` in a loop on `clients` tasks for `window`; each call gets a fresh order id.
pub(crate) async fn closed_loop<F, Fut>(
    clients: usize,
    window: Duration,
    op: F,
) -> Result<LoadResult, BoxError>
where
    F: Fn(i64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send,
{
    let op = Arc::new(op);
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let op = op.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(4096);
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                op(next_ids(1)).await?;
                latencies.push(t.elapsed().as_micros() as u64);
            }
            Ok::<_, BoxError>(latencies)
        }));
    }
    tokio::time::sleep(window).await;
    stop.store(true, Ordering::Relaxed);
    let mut latencies_us = Vec::new();
    for task in tasks {
        latencies_us.extend(task.await??);
    }
    let elapsed = start.elapsed();
    latencies_us.sort_unstable();
    Ok(LoadResult {
        ops: latencies_us.len() as u64,
        elapsed,
        latencies_us,
    })
}

/// The `q` quantile (0..=1) of sorted values.
pub(crate) fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Insert `n` PENDING events straight into the outbox, spread over `aggregates` aggregates in
/// round-robin, each with a payload of the bench event's shape (set-based, for large backlogs).
pub(crate) async fn pre_enqueue(
    db: &DatabaseConnection,
    n: u64,
    aggregates: u64,
    status: &str,
) -> Result<(), BoxError> {
    let chunk = 500_000u64;
    let mut done = 0u64;
    while done < n {
        let upto = (done + chunk).min(n);
        execute_bound(
            db,
            "INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, \
             aggregate_id, payload, headers, status, sent_at, created_at) \
             SELECT gen_random_uuid(), 'bench', 'bench.order_placed', 1, 'order', \
             'customer-' || (g % $1), \
             jsonb_build_object('customer', 'customer-' || (g % $1), 'order_id', g, \
               'total_cents', 4599 + g % 1000, 'currency', 'EUR', 'lines', \
               '[{\"sku\":\"KETTLE-1.7L-STEEL\",\"quantity\":1,\"price_cents\":3499},{\"sku\":\"FILTER-PACK-12\",\"quantity\":2,\"price_cents\":550}]'::jsonb, \
               'note', 'leave at the door; ring twice; fragile items inside'), \
             '{}'::jsonb, $2, CASE WHEN $2 = 'SENT' THEN now() END, now() \
             FROM generate_series($3::bigint, $4::bigint) g",
            [
                (aggregates as i64).into(),
                status.to_owned().into(),
                ((done + 1) as i64).into(),
                (upto as i64).into(),
            ],
        )
        .await?;
        done = upto;
    }
    db.execute_unprepared("ANALYZE outbox_event").await?;
    Ok(())
}

/// `n` events over 1,000 aggregates enqueued and relayed by one relay (no wake-ups) until none
/// is left unsent: the backlog a P4 consumer then works off.
pub(crate) async fn relay_backlog(
    db: &DatabaseConnection,
    transport: Arc<dyn outbox::transport::Transport>,
    n: u64,
) -> Result<(), BoxError> {
    pre_enqueue(db, n, 1_000, "PENDING").await?;
    let relay = outbox::relay::Relay::new(db.clone(), transport)
        .with_config(outbox::relay::RelayConfig::default().listen(false))
        .spawn();
    wait_drained(db, Instant::now(), Duration::from_secs(300)).await?;
    relay.shutdown().await?;
    Ok(())
}

/// The WAL relay's slot in the bench.
#[cfg_attr(not(feature = "postgres-wal"), allow(dead_code))]
pub(crate) const WAL_SLOT: &str = "outbox_bench";

/// Whether the WAL relay can run here: built with `postgres-wal`, and the server runs with
/// `wal_level = logical` (`DATABASE_URL=postgres://postgres@127.0.0.1:5433/outbox_bench`, the
/// cluster `scripts/pg-logical` starts).
pub(crate) async fn wal_available(ctx: &Ctx) -> Result<bool, BoxError> {
    if !cfg!(feature = "postgres-wal") {
        return Ok(false);
    }
    let level = outbox::store::wal::wal_level(&ctx.db).await?;
    if level != "logical" {
        println!("bench: no WAL relay figures: the server runs with wal_level = {level}");
    }
    Ok(level == "logical")
}

/// The WAL relay's settings: a grace far beyond a run, so the stream publishes everything.
#[cfg(feature = "postgres-wal")]
pub(crate) fn wal_config(ctx: &Ctx) -> outbox::relay::WalConfig {
    outbox::relay::WalConfig::new(ctx.url.clone())
        .slot(WAL_SLOT)
        .table_grace(Duration::from_secs(3_600))
}

/// Wait until a WAL relay streams from the bench's slot.
#[cfg(feature = "postgres-wal")]
pub(crate) async fn wait_streaming(ctx: &Ctx) -> Result<(), BoxError> {
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        if outbox::store::wal::slot(&ctx.db, WAL_SLOT)
            .await?
            .is_some_and(|s| s.active)
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err("the WAL relay did not start streaming".into())
}

/// Drop the bench's slot (it would hold the server's WAL).
#[cfg(feature = "postgres-wal")]
pub(crate) async fn drop_wal_slot(ctx: &Ctx) -> Result<(), BoxError> {
    outbox::store::wal::drop_slot(&ctx.db, WAL_SLOT, true).await?;
    Ok(())
}

/// Run `relay` until it has sent `n` events or `limit` has passed, watching its own counters
/// (polling the table would load the database being measured); stop it, and return how long it
/// ran and its final counters.
pub(crate) async fn relay_until(
    relay: outbox::relay::Relay,
    n: u64,
    limit: Duration,
) -> Result<(Duration, outbox::relay::RelayStatsSnapshot), BoxError> {
    let t = Instant::now();
    let relay = relay.spawn();
    while relay.stats().sent < n && t.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = t.elapsed();
    Ok((elapsed, relay.shutdown().await?))
}

/// The numbers listed (comma-separated) in the environment variable `name`, or `default` when it
/// is not set: the rates a run narrows a scenario down to.
pub(crate) fn env_list(name: &str, default: &[u64]) -> Result<Vec<u64>, BoxError> {
    match std::env::var(name) {
        Ok(list) => Ok(list
            .split(',')
            .map(|r| r.trim().parse())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{name}: {e}"))?),
        Err(_) => Ok(default.to_vec()),
    }
}

/// The bench's business tables (PostgreSQL): an order per event, an effect per handling.
pub(crate) const BENCH_TABLES: &str = "CREATE TABLE bench_order (id BIGINT PRIMARY KEY, \
     customer TEXT NOT NULL, total_cents BIGINT NOT NULL, \
     created_at TIMESTAMPTZ NOT NULL DEFAULT now());
     CREATE TABLE bench_effect (order_id BIGINT PRIMARY KEY, consumer TEXT NOT NULL, \
     total_cents BIGINT NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())";

/// Empties the outbox, the inbox and the bench's tables.
pub(crate) const TRUNCATE_ALL: &str = "TRUNCATE outbox_event, outbox_sent, outbox_key, \
     inbox_event, inbox_done, inbox_key, inbox_aggregate_version, bench_order, bench_effect";
