//! P6 peer: sqlxmq 0.6, a PostgreSQL job queue, on the same database. 16 clients commit an order
//! with a job (as P1 commits an order with its event); a runner drains them; both at once; and
//! the latency from the spawning transaction's start to the job's start at a modest rate.
//!
//! sqlxmq's schema is applied at run time from the migrations shipped in its crate (found under
//! `$CARGO_HOME/registry/src/*/sqlxmq-0.6.0/migrations`), not copied here. The job, like the
//! SDK's inbox handler, decodes its payload and inserts one effect row; it is completed with
//! `CurrentJob::complete_with_transaction`, so the effect row and the job's deletion commit
//! together: each job completes exactly once, checked by counting the effect rows.

use std::{
    path::PathBuf,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};
use sqlx_for_sqlxmq::{self as sqlx, PgPool, postgres::PgPoolOptions};
use sqlxmq::{CurrentJob, JobBuilder, JobRunnerHandle, JobRunnerOptions};

use crate::report::{Measure, Spec, Target, m, spec};
use crate::support::{BoxError, Ctx, OrderPlaced, closed_loop, next_ids, quantile};

/// The crate whose migrations are applied; the version the bench links.
const SQLXMQ: &str = "sqlxmq-0.6.0";
const JOB_NAME: &str = "bench.order_placed";
/// Clients spawning jobs, each one job per transaction.
const SPAWNERS: usize = 16;
/// The runner's concurrency: it polls for more jobs when fewer than the first are running, up
/// to the second.
const CONCURRENCY: (usize, usize) = (8, 16);
const CUSTOMERS: i64 = 1_000;
/// One job every 5 ms for the latency figure.
const LATENCY_EVERY: Duration = Duration::from_millis(5);
const DRAIN_LIMIT: Duration = Duration::from_secs(600);
/// 16 spawners, 16 running jobs with their keep-alives, the runner's poll and its listener.
const POOL_SIZE: u32 = 40;

/// The job's JSON payload: the bench event, and when the spawning transaction started.
#[derive(Debug, Serialize, Deserialize)]
struct JobPayload {
    /// Microseconds since the UNIX epoch.
    spawned_us: u64,
    event: OrderPlaced,
}

/// What the jobs of one runner did.
#[derive(Debug, Default)]
struct Jobs {
    /// Jobs committed with their effect row.
    completed: AtomicU64,
    /// Attempts that failed (sqlxmq retries them after its back-off).
    failed: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// Transaction start → job start, in microseconds.
    latencies_us: Mutex<Vec<u64>>,
}

impl Jobs {
    fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }

    fn failures(&self) -> String {
        let failed = self.failed.load(Ordering::Relaxed);
        let last = self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match last {
            Some(error) => format!("{failed} failed attempt(s), the last: {error}"),
            None => "no failed attempt".into(),
        }
    }
}

pub(crate) async fn run(ctx: &Ctx) -> Result<Vec<Measure>, BoxError> {
    let pool = PgPoolOptions::new()
        .max_connections(POOL_SIZE)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&ctx.url)
        .await
        .map_err(|e| format!("sqlx pool for sqlxmq on {}: {e}", ctx.url))?;
    let result = measure(ctx, &pool).await;
    let cleaned = reset(&pool).await;
    pool.close().await;
    let out = result?;
    cleaned?;
    Ok(out)
}

async fn measure(ctx: &Ctx, pool: &PgPool) -> Result<Vec<Measure>, BoxError> {
    install_schema(pool).await?;
    let n = ctx.sizes.p6_jobs;
    let mut out = Vec::new();

    // Spawn `n` jobs with no runner running, then drain them.
    reset(pool).await?;
    let elapsed = spawn_jobs(pool, n).await?;
    out.push(m(
        "p6.sqlxmq.spawn",
        n as f64 / elapsed.as_secs_f64(),
        "jobs/s",
    ));
    let queued = pending(pool).await?;
    if queued != n as i64 {
        return Err(format!("spawned {n} jobs but {queued} are queued").into());
    }
    let jobs = Arc::new(Jobs::default());
    let t = Instant::now();
    let mut runner = start_runner(pool, jobs.clone()).await?;
    let drained = wait_completed(&jobs, n, t, DRAIN_LIMIT).await;
    stop_runner(&mut runner).await;
    let elapsed = drained?;
    check(pool, &jobs, n).await?;
    out.push(m(
        "p6.sqlxmq.drain",
        n as f64 / elapsed.as_secs_f64(),
        "jobs/s",
    ));

    // 16 clients spawn while a runner runs: jobs in and out in the window.
    reset(pool).await?;
    let jobs = Arc::new(Jobs::default());
    let mut runner = start_runner(pool, jobs.clone()).await?;
    let spawner = pool.clone();
    let load = closed_loop(SPAWNERS, ctx.sizes.p2_window, move |id| {
        let pool = spawner.clone();
        async move { spawn_job(&pool, id).await }
    })
    .await;
    let completed_in_window = jobs.completed();
    let load = match load {
        Ok(load) => load,
        Err(e) => {
            stop_runner(&mut runner).await;
            return Err(e);
        }
    };
    let drained = wait_completed(&jobs, load.ops, Instant::now(), DRAIN_LIMIT).await;
    stop_runner(&mut runner).await;
    drained?;
    check(pool, &jobs, load.ops).await?;
    out.push(m("p6.sqlxmq.both_in", load.per_sec(), "jobs/s"));
    out.push(m(
        "p6.sqlxmq.both",
        completed_in_window as f64 / load.elapsed.as_secs_f64(),
        "jobs/s",
    ));

    // Latency at a modest rate: one job every 5 ms, each spawned in its own task.
    reset(pool).await?;
    let window = if ctx.smoke {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(2)
    };
    let count = (window.as_millis() / LATENCY_EVERY.as_millis()) as u64;
    let jobs = Arc::new(Jobs::default());
    let mut runner = start_runner(pool, jobs.clone()).await?;
    let spawned = spawn_at_rate(pool, count).await;
    let drained = match spawned {
        Ok(()) => wait_completed(&jobs, count, Instant::now(), DRAIN_LIMIT).await,
        Err(e) => Err(e),
    };
    stop_runner(&mut runner).await;
    drained?;
    check(pool, &jobs, count).await?;
    let mut latencies = std::mem::take(
        &mut *jobs
            .latencies_us
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    latencies.sort_unstable();
    out.push(m(
        "p6.sqlxmq.latency_p50_ms",
        quantile(&latencies, 0.50) as f64 / 1000.0,
        "ms",
    ));
    out.push(m(
        "p6.sqlxmq.latency_p99_ms",
        quantile(&latencies, 0.99) as f64 / 1000.0,
        "ms",
    ));
    Ok(out)
}

/// sqlxmq's migrations folder in the cargo registry.
fn migrations_dir() -> Result<PathBuf, BoxError> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set: cannot find sqlxmq's migrations")?;
    let src = cargo_home.join("registry").join("src");
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(&src)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.path().join(SQLXMQ).join("migrations"))
        .filter(|dir| dir.is_dir())
        .collect();
    candidates.sort();
    candidates.into_iter().next().ok_or_else(|| {
        format!(
            "sqlxmq's schema not found: no directory {} (run `cargo fetch`, or set CARGO_HOME)",
            src.join("*").join(SQLXMQ).join("migrations").display()
        )
        .into()
    })
}

/// Apply sqlxmq's `*.up.sql` migrations in file-name order, in one transaction, unless its
/// tables exist; and create the jobs' effect table.
async fn install_schema(pool: &PgPool) -> Result<(), BoxError> {
    let installed: bool = sqlx::query_scalar("SELECT to_regclass('mq_msgs') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !installed {
        let dir = migrations_dir()?;
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| format!("reading {}: {e}", dir.display()))?
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| {
                path.file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.ends_with(".up.sql"))
            })
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(format!("no *.up.sql migration in {}", dir.display()).into());
        }
        let mut tx = pool.begin().await?;
        for file in &files {
            let sql = std::fs::read_to_string(file)
                .map_err(|e| format!("reading {}: {e}", file.display()))?;
            sqlx::raw_sql(&sql)
                .execute(&mut *tx)
                .await
                .map_err(|e| format!("applying {}: {e}", file.display()))?;
        }
        tx.commit().await?;
        println!(
            "p6: applied {} sqlxmq migrations from {}",
            files.len(),
            dir.display()
        );
    }
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS bench_job_effect (order_id BIGINT PRIMARY KEY, \
         total_cents BIGINT NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Remove every job (sqlxmq's `clear_all`), the orders and the effect rows.
async fn reset(pool: &PgPool) -> Result<(), BoxError> {
    sqlxmq::clear_all(pool).await?;
    sqlx::raw_sql("TRUNCATE bench_order, bench_job_effect")
        .execute(pool)
        .await?;
    // Apart: VACUUM cannot run in the implicit transaction of a multi-statement string.
    sqlx::raw_sql("VACUUM ANALYZE mq_msgs, mq_payloads")
        .execute(pool)
        .await?;
    Ok(())
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// One business transaction: insert an order and spawn its job, then commit.
async fn spawn_job(pool: &PgPool, id: i64) -> Result<(), BoxError> {
    let spawned_us = now_us();
    let event = OrderPlaced::sample(id, CUSTOMERS);
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO bench_order (id, customer, total_cents) VALUES ($1, $2, $3)")
        .bind(event.order_id)
        .bind(&event.customer)
        .bind(event.total_cents)
        .execute(&mut *tx)
        .await?;
    JobBuilder::new(JOB_NAME)
        .set_json(&JobPayload { spawned_us, event })?
        .spawn(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// `SPAWNERS` clients spawn `n` jobs between them; how long it took.
async fn spawn_jobs(pool: &PgPool, n: u64) -> Result<Duration, BoxError> {
    let taken = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let mut tasks = Vec::with_capacity(SPAWNERS);
    for _ in 0..SPAWNERS {
        let pool = pool.clone();
        let taken = taken.clone();
        tasks.push(tokio::spawn(async move {
            while taken.fetch_add(1, Ordering::Relaxed) < n {
                spawn_job(&pool, next_ids(1)).await?;
            }
            Ok::<_, BoxError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(t.elapsed())
}

/// Spawn `count` jobs, one every `LATENCY_EVERY`, each in its own task.
async fn spawn_at_rate(pool: &PgPool, count: u64) -> Result<(), BoxError> {
    let mut tick = tokio::time::interval(LATENCY_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tasks = Vec::with_capacity(count as usize);
    for _ in 0..count {
        tick.tick().await;
        let pool = pool.clone();
        tasks.push(tokio::spawn(
            async move { spawn_job(&pool, next_ids(1)).await },
        ));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// A runner with `CONCURRENCY` whose job is `run_job`.
async fn start_runner(pool: &PgPool, jobs: Arc<Jobs>) -> Result<JobRunnerHandle, BoxError> {
    let runner = JobRunnerOptions::new(pool, move |job| {
        tokio::spawn(run_job(job, jobs.clone()));
    })
    .set_concurrency(CONCURRENCY.0, CONCURRENCY.1)
    .run()
    .await?;
    Ok(runner)
}

/// Stop the runner's polling, then give running jobs a moment to finish.
async fn stop_runner(runner: &mut JobRunnerHandle) {
    runner.stop().await;
    runner.wait_jobs_finish(Duration::from_secs(10)).await;
}

async fn run_job(mut job: CurrentJob, jobs: Arc<Jobs>) {
    let started_us = now_us();
    match complete(&mut job, &jobs, started_us).await {
        Ok(()) => {
            jobs.completed.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => {
            jobs.failed.fetch_add(1, Ordering::Relaxed);
            *jobs
                .last_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(format!("job {}: {e}", job.id()));
        }
    }
}

/// The job: decode the payload, insert the effect row, and delete the job in that transaction.
async fn complete(job: &mut CurrentJob, jobs: &Jobs, started_us: u64) -> Result<(), BoxError> {
    let payload: JobPayload = job.json()?.ok_or("a job without payload")?;
    jobs.latencies_us
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(started_us.saturating_sub(payload.spawned_us));
    let mut tx = job.pool().begin().await?;
    sqlx::query("INSERT INTO bench_job_effect (order_id, total_cents) VALUES ($1, $2)")
        .bind(payload.event.order_id)
        .bind(payload.event.total_cents)
        .execute(&mut *tx)
        .await?;
    job.complete_with_transaction(tx).await?;
    Ok(())
}

/// Wait until `n` jobs completed; the time since `since`, or an error after `limit` or when
/// none completed for `STALLED` (a failing job is retried 4 times, over about 15 s).
async fn wait_completed(
    jobs: &Jobs,
    n: u64,
    since: Instant,
    limit: Duration,
) -> Result<Duration, BoxError> {
    const STALLED: Duration = Duration::from_secs(30);
    let mut last = (jobs.completed(), Instant::now());
    loop {
        let completed = jobs.completed();
        if completed >= n {
            return Ok(since.elapsed());
        }
        if completed != last.0 {
            last = (completed, Instant::now());
        }
        if since.elapsed() > limit || last.1.elapsed() > STALLED {
            return Err(format!(
                "sqlxmq completed {completed} of {n} jobs in {:.1?}, none in the last {:.1?} ({})",
                since.elapsed(),
                last.1.elapsed(),
                jobs.failures()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Jobs still queued (the nil row is sqlxmq's own).
async fn pending(pool: &PgPool) -> Result<i64, BoxError> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM mq_msgs WHERE id <> uuid_nil()")
            .fetch_one(pool)
            .await?,
    )
}

/// Every spawned job completed exactly once: one effect row each (the primary key rules out a
/// second), and none left in the queue.
async fn check(pool: &PgPool, jobs: &Jobs, spawned: u64) -> Result<(), BoxError> {
    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM bench_job_effect")
        .fetch_one(pool)
        .await?;
    let left = pending(pool).await?;
    if effects != spawned as i64 || left != 0 {
        return Err(format!(
            "sqlxmq: {spawned} jobs spawned, {effects} effect rows, {left} jobs still queued; {}",
            jobs.failures()
        )
        .into());
    }
    if jobs.failed.load(Ordering::Relaxed) > 0 {
        println!("p6: every job completed once, after {}", jobs.failures());
    }
    Ok(())
}

pub(crate) fn specs() -> Vec<Spec> {
    vec![
        spec(
            "P6",
            "sqlxmq spawn: order + job, 16 clients",
            "p6.sqlxmq.spawn",
        ),
        spec("P6", "sqlxmq drain, concurrency 8-16", "p6.sqlxmq.drain"),
        spec(
            "P6",
            "sqlxmq completed while 16 clients spawn",
            "p6.sqlxmq.both",
        )
        .against("sqlxmq spawned in that window", "p6.sqlxmq.both_in"),
        spec(
            "P6",
            "sqlxmq tx start → job start, p50",
            "p6.sqlxmq.latency_p50_ms",
        ),
        spec(
            "P6",
            "sqlxmq tx start → job start, p99",
            "p6.sqlxmq.latency_p99_ms",
        ),
        spec(
            "P6",
            "SDK 1 event, 16 clients (vs sqlxmq spawn)",
            "p1.c16.sdk1.tps",
        )
        .against("sqlxmq spawn: order + job, 16 clients", "p6.sqlxmq.spawn"),
        spec(
            "P6",
            "SDK inbox handled (vs sqlxmq completed)",
            "p4.sdk.handled",
        )
        .against("sqlxmq drain", "p6.sqlxmq.drain")
        .target(Target::RatioAtLeast(5.0)),
    ]
}
