//! P13's servers: a PostgreSQL primary with one asynchronous streaming standby, started by
//! `scripts/pg-failover up async` and stopped by `scripts/pg-failover down`, in a directory and
//! on ports of the bench's own (so that a failover test running beside it keeps its clusters);
//! the bench database on the primary; and a sampler of the standby's flush lag as the primary
//! sees it (`pg_stat_replication.flush_lag`).

use std::process::Command;
use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};
use std::time::Duration;

use outbox::sea_orm::{ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement};

use crate::support::{BoxError, database_ddl, pool, quantile};

/// The primary's and the standby's ports: beside the failover test's (5440, 5441).
pub(crate) const PRIMARY_PORT: u16 = 5442;
pub(crate) const STANDBY_PORT: u16 = 5443;
/// Where the script keeps the two clusters.
const DIR: &str = "/var/lib/outbox-bench-p13";
/// The bench database on the primary.
const DATABASE: &str = "outbox_bench_p13";
/// The standby's `application_name` (the script's).
const STANDBY_NAME: &str = "outbox_standby";

fn script(args: &[&str]) -> Command {
    let mut command = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pg-failover"));
    command
        .args(args)
        .env("OUTBOX_FAILOVER_DIR", DIR)
        .env("OUTBOX_FAILOVER_PRIMARY_PORT", PRIMARY_PORT.to_string())
        .env("OUTBOX_FAILOVER_STANDBY_PORT", STANDBY_PORT.to_string());
    command
}

/// Fresh clusters: a primary and an asynchronous standby streaming from it. Why not, when the
/// script failed (not root, no PostgreSQL binaries, ports taken).
pub(crate) async fn up() -> Result<(), String> {
    let output = tokio::task::spawn_blocking(|| script(&["up", "async"]).output())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("scripts/pg-failover could not run: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
    Err(format!(
        "scripts/pg-failover up async ended with {}{}",
        output.status,
        last.map_or(String::new(), |l| format!(": {}", l.trim()))
    ))
}

/// Stop both clusters.
pub(crate) async fn down() {
    let stopped = tokio::task::spawn_blocking(|| script(&["down"]).output()).await;
    if !matches!(stopped, Ok(Ok(ref o)) if o.status.success()) {
        println!("p13: scripts/pg-failover down did not stop the clusters in {DIR}");
    }
}

/// The bench database on the primary: created fresh, migrated, with the bench's tables.
pub(crate) struct Primary {
    pub(crate) db: DatabaseConnection,
    admin: DatabaseConnection,
}

impl Primary {
    pub(crate) async fn open() -> Result<Primary, BoxError> {
        let server = format!("postgres://postgres@127.0.0.1:{PRIMARY_PORT}");
        let admin = Database::connect(format!("{server}/postgres")).await?;
        database_ddl(&admin, "DROP DATABASE IF EXISTS %I WITH (FORCE)", DATABASE).await?;
        database_ddl(&admin, "CREATE DATABASE %I", DATABASE).await?;
        let db = pool(&format!("{server}/{DATABASE}"), 32).await?;
        outbox::migrate(&db).await?;
        db.execute_unprepared(crate::support::BENCH_TABLES).await?;
        Ok(Primary { db, admin })
    }

    /// Whether the standby streams from the primary now.
    pub(crate) async fn streaming(&self) -> Result<bool, BoxError> {
        let row = self
            .admin
            .query_one_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT count(*) AS n FROM pg_stat_replication WHERE state = 'streaming' \
                 AND application_name = $1",
                [STANDBY_NAME.into()],
            ))
            .await?
            .ok_or("no row")?;
        Ok(row.try_get::<i64>("", "n")? == 1)
    }

    /// Empty the outbox, the inbox and the bench's tables.
    pub(crate) async fn reset(&self) -> Result<(), BoxError> {
        self.db
            .execute_unprepared(crate::support::TRUNCATE_ALL)
            .await?;
        Ok(())
    }

    pub(crate) async fn close(self) -> Result<(), BoxError> {
        self.db.close().await?;
        database_ddl(
            &self.admin,
            "DROP DATABASE IF EXISTS %I WITH (FORCE)",
            DATABASE,
        )
        .await?;
        self.admin.close().await?;
        Ok(())
    }

    /// Sample the standby's flush lag every 100 ms until [`LagSampler::stop`].
    pub(crate) fn sample_lag(&self) -> LagSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let db = self.admin.clone();
        let task = tokio::spawn(async move {
            let mut samples = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                if let Ok(Some(us)) = flush_lag_us(&db).await {
                    samples.push(us);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            samples
        });
        LagSampler { stop, task }
    }
}

/// The standby's flush lag now, in microseconds: the time between the primary's writing WAL and
/// the standby's confirming it flushed it (NULL, `None`, once the standby has caught up and
/// nothing was written since).
async fn flush_lag_us(db: &DatabaseConnection) -> Result<Option<u64>, BoxError> {
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT (EXTRACT(EPOCH FROM flush_lag) * 1000000)::bigint AS lag \
             FROM pg_stat_replication WHERE application_name = $1",
            [STANDBY_NAME.into()],
        ))
        .await?;
    Ok(match row {
        Some(row) => row.try_get::<Option<i64>>("", "lag")?.map(|v| v as u64),
        None => None,
    })
}

pub(crate) struct LagSampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<u64>>,
}

/// The flush lag samples of a window: p50 and max in milliseconds, and how many were taken.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lag {
    pub(crate) p50_ms: f64,
    pub(crate) max_ms: f64,
    pub(crate) samples: usize,
}

impl LagSampler {
    pub(crate) async fn stop(self) -> Lag {
        self.stop.store(true, Ordering::Relaxed);
        let mut samples = self.task.await.unwrap_or_default();
        samples.sort_unstable();
        Lag {
            p50_ms: quantile(&samples, 0.5) as f64 / 1000.0,
            max_ms: samples.last().copied().unwrap_or(0) as f64 / 1000.0,
            samples: samples.len(),
        }
    }
}
