//! The storage guardrails: the SDK's tables (dead row versions, bytes, vacuum) and what holds
//! vacuum back (the xmin horizon), as `outbox doctor` findings and as part of `outbox status`.
//!
//! Every SENT event and handled message leaves a dead row version behind on PostgreSQL until
//! vacuum removes it, and vacuum can remove only versions older than the oldest snapshot still
//! open anywhere in the database: one idle-in-transaction session, forgotten prepared
//! transaction or abandoned replication slot makes the queue tables grow and their claims slow
//! down, whatever the SDK does. These checks name the culprit and what to do about it.

use std::time::Duration;

use sea_orm::{DatabaseConnection, DbBackend};
use serde::Serialize;

use super::{
    AdminError, DoctorOptions, DoctorReport, HumanBytes, HumanDuration, Severity, db_error,
};
use crate::store::health::{self, HolderKind, HorizonHolder, TableHealth};

/// Below this many dead row versions a table is not flagged, whatever its ratio: a small table
/// between two autovacuum runs.
pub const MIN_DEAD_ROWS: i64 = 10_000;

/// One of the SDK's tables, as `outbox status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct TableStatus {
    /// The table.
    pub table: String,
    /// Rows visible now (the server's estimate).
    pub live_rows: Option<i64>,
    /// Dead row versions vacuum has not removed yet (PostgreSQL).
    pub dead_rows: Option<i64>,
    /// Dead row versions as a share of all row versions.
    pub dead_ratio: f64,
    /// Bytes of the table and of its indexes.
    pub bytes: Option<i64>,
    /// Bytes of its indexes alone.
    pub index_bytes: Option<i64>,
    /// Seconds since vacuum last ran on it; `None`: never, or not known.
    pub vacuumed_secs_ago: Option<u64>,
    /// `false` when the table's settings turn autovacuum off.
    pub autovacuum_enabled: bool,
}

/// The oldest holder of the xmin horizon, as `outbox status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct HorizonStatus {
    /// `session`, `prepared` or `slot`.
    pub kind: String,
    /// The session's process id.
    pub pid: Option<i64>,
    /// The session's application (MySQL: `user@host`), the prepared transaction's gid, or the
    /// slot's name.
    pub name: String,
    /// The session's state, or whether the slot is active.
    pub state: Option<String>,
    /// Seconds it has held the horizon (sessions and prepared transactions).
    pub age_secs: Option<u64>,
    /// Transactions begun since the oldest one it keeps visible (PostgreSQL).
    pub xid_age: Option<i64>,
}

/// The SDK's tables and what holds vacuum back, for `outbox status`. Empty on SQLite.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct StorageStatus {
    /// The queue tables that exist (`outbox_event`, `inbox_event`, `outbox_failure`,
    /// `outbox_scheduled`).
    pub tables: Vec<TableStatus>,
    /// The server's `autovacuum` setting (PostgreSQL).
    pub autovacuum: Option<bool>,
    /// The oldest holder of the horizon, if any.
    pub oldest_holder: Option<HorizonStatus>,
}

/// Switch the inbox's rotation on (PostgreSQL, migration `outbox_0014`): from now on handled
/// messages go to `inbox_done` and the keys redeliveries are recognised by to `inbox_key`. The
/// migration switches it on by itself where `inbox_event` was empty; elsewhere call this once
/// no consumer of a release before `outbox_0014` runs against the database (that release
/// recognises redeliveries by `inbox_event` alone). Returns whether it was off; `false` also on
/// MySQL/MariaDB and SQLite, which keep handled messages in `inbox_event`.
pub async fn rotate_inbox(db: &DatabaseConnection) -> Result<bool, AdminError> {
    crate::store::inbox_done::switch_on(db)
        .await
        .map_err(db_error("switching the inbox's rotation on"))
}

/// Read the storage's state. A server that refuses the horizon's view (MySQL without the
/// `PROCESS` privilege) reports no holder rather than failing.
pub async fn storage_status(db: &DatabaseConnection) -> Result<StorageStatus, AdminError> {
    let tables = health::tables(db)
        .await
        .map_err(db_error("reading the tables' statistics"))?;
    let server = health::server(db).await.unwrap_or_else(|e| {
        tracing::debug!(error = %e, "cannot read what holds the xmin horizon");
        health::ServerHealth::default()
    });
    Ok(StorageStatus {
        tables: tables.iter().map(table_status).collect(),
        autovacuum: server.autovacuum,
        oldest_holder: server.holders.first().map(horizon_status),
    })
}

fn table_status(t: &TableHealth) -> TableStatus {
    TableStatus {
        table: t.table.clone(),
        live_rows: t.live_rows,
        dead_rows: t.dead_rows,
        dead_ratio: t.dead_ratio(),
        bytes: (t.table_bytes.is_some() || t.index_bytes.is_some()).then(|| t.bytes()),
        index_bytes: t.index_bytes,
        vacuumed_secs_ago: t.vacuumed_ago.map(|d| d.as_secs()),
        autovacuum_enabled: t.autovacuum_enabled,
    }
}

fn horizon_status(h: &HorizonHolder) -> HorizonStatus {
    HorizonStatus {
        kind: h.kind.as_str().to_owned(),
        pid: h.pid,
        name: h.name.clone(),
        state: h.state.clone(),
        age_secs: h.age.map(|d| d.as_secs()),
        xid_age: h.xid_age,
    }
}

/// The doctor's `storage` and `horizon` findings.
pub(super) async fn check(
    db: &DatabaseConnection,
    options: &DoctorOptions,
    report: &mut DoctorReport,
) -> Result<(), AdminError> {
    let tables = health::tables(db)
        .await
        .map_err(db_error("reading the tables' statistics"))?;
    if tables.is_empty() {
        return Ok(());
    }
    let server = match health::server(db).await {
        Ok(server) => server,
        Err(e) => {
            report.push(
                Severity::Info,
                "horizon",
                format!(
                    "cannot read what holds old row versions back ({e}); on MySQL the \
                     `PROCESS` privilege shows INNODB_TRX"
                ),
            );
            health::ServerHealth::default()
        }
    };
    check_tables(&tables, server.autovacuum, options, report);
    let backend = db.get_database_backend();
    check_horizon(&server.holders, backend, options, report);
    let caches = health::id_caches(db)
        .await
        .map_err(db_error("reading the id sequences"))?;
    check_id_caches(&caches, report);
    Ok(())
}

/// A work queue's ids must be drawn in the order rows are written: the per-aggregate order and
/// the claim's floor read them so.
fn check_id_caches(caches: &[(String, i64)], report: &mut DoctorReport) {
    for (table, cache) in caches {
        if *cache > 1 {
            report.push(
                Severity::Error,
                "storage",
                format!(
                    "the ids of `{table}` come from a sequence that hands each session {cache} \
                     at once: a session then writes ids drawn long before, below rows other \
                     sessions wrote since, while the relay and the consumers read ids as the \
                     order rows were written in (per-aggregate order, the claim's floor); \
                     ALTER SEQUENCE {table}_id_seq CACHE 1 (the migrations create it so)"
                ),
            );
        }
    }
}

fn check_tables(
    tables: &[TableHealth],
    autovacuum: Option<bool>,
    options: &DoctorOptions,
    report: &mut DoctorReport,
) {
    let mut flagged = false;
    if autovacuum == Some(false) {
        flagged = true;
        report.push(
            Severity::Warning,
            "storage",
            "autovacuum is off on this server: the dead row versions every sent event and \
             handled message leaves in the SDK's tables are never removed unless you VACUUM \
             them yourself, and the tables grow without end; turn it on (`autovacuum = on` in \
             postgresql.conf, or ALTER SYSTEM SET autovacuum = on and SELECT pg_reload_conf())",
        );
    }
    for t in tables {
        let name = &t.table;
        if !t.autovacuum_enabled {
            flagged = true;
            report.push(
                Severity::Warning,
                "storage",
                format!(
                    "autovacuum is off for `{name}` (its autovacuum_enabled setting): its dead \
                     row versions are never removed by the server; ALTER TABLE {name} RESET \
                     (autovacuum_enabled)"
                ),
            );
        }
        let dead = t.dead_rows.unwrap_or(0);
        if dead >= MIN_DEAD_ROWS && t.dead_ratio() >= options.dead_ratio {
            flagged = true;
            let vacuumed = t
                .vacuumed_ago
                .map(|d| format!("last vacuumed {} ago", HumanDuration(whole_secs(d))))
                .unwrap_or_else(|| "never vacuumed".to_owned());
            report.push(
                Severity::Warning,
                "storage",
                format!(
                    "`{name}` holds {dead} dead row versions beside {} live ({:.0}% dead, \
                     flagged from {:.0}%), {vacuumed}: claims and look-ups read past them. If \
                     something holds the xmin horizon (see `horizon`), end it; otherwise vacuum \
                     does not keep up: VACUUM {name}, and lower its \
                     autovacuum_vacuum_scale_factor",
                    t.live_rows.unwrap_or(0),
                    t.dead_ratio() * 100.0,
                    options.dead_ratio * 100.0
                ),
            );
        }
    }
    if !flagged {
        let bytes: i64 = tables.iter().map(TableHealth::bytes).sum();
        let mut message = format!(
            "{} queue tables, {} with their indexes",
            tables.len(),
            HumanBytes(u64::try_from(bytes).unwrap_or(0))
        );
        // Only PostgreSQL counts dead row versions and has autovacuum.
        if autovacuum == Some(true) {
            let dead: i64 = tables.iter().map(|t| t.dead_rows.unwrap_or(0)).sum();
            message.push_str(&format!(", {dead} dead row versions; autovacuum on"));
        }
        report.push(Severity::Ok, "storage", message);
    }
}

fn check_horizon(
    holders: &[HorizonHolder],
    backend: DbBackend,
    options: &DoctorOptions,
    report: &mut DoctorReport,
) {
    let mut flagged = false;
    for h in holders {
        let name = &h.name;
        let message = match h.kind {
            HolderKind::Session if h.age.is_some_and(|a| a >= options.horizon_age) => {
                let pid = h.pid.unwrap_or_default();
                let age = HumanDuration(whole_secs(h.age.unwrap_or_default()));
                let state = h.state.as_deref().unwrap_or("unknown state");
                let who = if name.is_empty() {
                    String::new()
                } else {
                    format!(", `{name}`")
                };
                let (end_it, bound) = match backend {
                    DbBackend::MySql => (
                        format!("KILL {pid}"),
                        "max_execution_time for reports, wait_timeout for idle sessions",
                    ),
                    _ => (
                        format!("SELECT pg_terminate_backend({pid})"),
                        "idle_in_transaction_session_timeout, statement_timeout for reports",
                    ),
                };
                format!(
                    "session {pid} ({state}{who}) has held its transaction open for {age}: no \
                     row version newer than its snapshot can be removed, so the SDK's tables \
                     grow and claims slow down while it lasts. End it ({end_it}) and bound such \
                     sessions ({bound})"
                )
            }
            HolderKind::Prepared if h.age.is_some_and(|a| a >= options.horizon_age) => {
                let age = HumanDuration(whole_secs(h.age.unwrap_or_default()));
                format!(
                    "prepared transaction `{name}` has waited {age} for its coordinator: it \
                     holds old row versions and its locks until COMMIT PREPARED '{name}' or \
                     ROLLBACK PREPARED '{name}'"
                )
            }
            HolderKind::Slot if h.state.as_deref() == Some("inactive") => format!(
                "replication slot `{name}` is inactive and holds old row versions back by {} \
                 transactions: drop it if nothing will use it again \
                 (SELECT pg_drop_replication_slot('{name}'))",
                h.xid_age.unwrap_or_default()
            ),
            _ => continue,
        };
        flagged = true;
        report.push(Severity::Warning, "horizon", message);
    }
    if !flagged {
        report.push(
            Severity::Ok,
            "horizon",
            format!(
                "nothing has held old row versions back for {} or more",
                HumanDuration(options.horizon_age)
            ),
        );
    }
}

fn whole_secs(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}
