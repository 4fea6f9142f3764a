//! Waiting until streaming standbys hold a commit (PostgreSQL): the primary knows how far each
//! standby has flushed the write-ahead log (`pg_stat_replication.flush_lsn`), and what a
//! standby has flushed survives its promotion. A row this session can read was committed at a
//! position no later than the log's current end, so once enough standbys have flushed past the
//! position read after it, a failover cannot take it back.
//!
//! The role that reads `pg_stat_replication` must see its positions: a superuser, or a member of
//! `pg_monitor` (`pg_read_all_stats`); for others they read NULL and no standby ever counts.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement};

/// The first pause between two looks at the standbys; doubled up to [`LOOK_CAP`].
const LOOK_FIRST: Duration = Duration::from_millis(2);
const LOOK_CAP: Duration = Duration::from_millis(50);

/// What [`wait_for_standbys`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// `standbys` standbys have flushed past the position.
    Held,
    /// Fewer had by the deadline.
    NotYet {
        /// The position waited for (`pg_lsn` text).
        position: String,
        /// How many standbys had flushed past it.
        standbys: i64,
    },
}

/// Wait until `standbys` standbys have flushed the log past its current end (read now), for at
/// most `timeout`. An error (the primary gone, a failover under way) is the caller's to treat as
/// "not held".
pub async fn wait_for_standbys(
    db: &DatabaseConnection,
    standbys: u32,
    timeout: Duration,
) -> Result<Held, DbErr> {
    if db.get_database_backend() != DbBackend::Postgres {
        return Err(DbErr::Custom(
            "waiting for standbys needs PostgreSQL's streaming replication".into(),
        ));
    }
    let wanted = i64::from(standbys);
    let first = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT pg_current_wal_lsn()::text AS position, (SELECT COUNT(*) FROM \
             pg_stat_replication WHERE flush_lsn >= pg_current_wal_lsn() AND pid NOT IN \
             (SELECT active_pid FROM pg_replication_slots WHERE slot_type = 'logical' \
             AND active_pid IS NOT NULL)) AS standbys",
        ))
        .await?
        .ok_or_else(|| DbErr::Custom("no answer about the standbys".into()))?;
    let position: String = first.try_get("", "position")?;
    let mut held: i64 = first.try_get("", "standbys")?;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = LOOK_FIRST;
    while held < wanted {
        if tokio::time::Instant::now() + pause > deadline {
            return Ok(Held::NotYet {
                position,
                standbys: held,
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LOOK_CAP);
        held = flushed_past(db, &position).await?;
    }
    Ok(Held::Held)
}

/// How many standbys have flushed past `position`. A logical replication connection (a WAL
/// relay's, a CDC tool's) is listed beside the standbys but holds nothing a promotion keeps: it
/// is left out.
async fn flushed_past(db: &DatabaseConnection, position: &str) -> Result<i64, DbErr> {
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT COUNT(*) AS standbys FROM pg_stat_replication WHERE flush_lsn >= $1::pg_lsn \
             AND pid NOT IN (SELECT active_pid FROM pg_replication_slots WHERE slot_type = \
             'logical' AND active_pid IS NOT NULL)",
            [position.into()],
        ))
        .await?
        .ok_or_else(|| DbErr::Custom("no answer about the standbys".into()))?;
    row.try_get("", "standbys")
}
