//! How the SDK's tables and the server around them are doing: per table the live and dead rows,
//! bytes, when vacuum and analyze last ran and whether autovacuum may run; for the server, what
//! holds back the oldest row versions vacuum may remove (the *xmin horizon*: a long transaction,
//! a prepared transaction, a replication slot). Read by `outbox doctor`, `outbox status`, the
//! metrics sampler and the console.
//!
//! PostgreSQL reads `pg_stat_user_tables`, `pg_class`, `pg_stat_activity`, `pg_prepared_xacts`
//! and `pg_replication_slots`; MySQL and MariaDB read `information_schema.TABLES` (no dead rows:
//! InnoDB purges old versions itself, held back by the oldest transaction) and
//! `information_schema.INNODB_TRX`; SQLite has neither and reports nothing.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend, DbErr, QueryResult};

use super::{Dialect, sql::Sql};

/// The SDK's tables whose health is reported: the ones every event and message passes through,
/// and the error history. A partitioned table (`outbox_sent`, `outbox_key`, `inbox_done`,
/// `inbox_key`) is reported as the sum of its partitions; `inbox_done` and `inbox_key` exist on
/// PostgreSQL only.
pub const QUEUE_TABLES: [&str; 8] = [
    "outbox_event",
    "inbox_event",
    "outbox_failure",
    "outbox_scheduled",
    "outbox_sent",
    "outbox_key",
    "inbox_done",
    "inbox_key",
];

/// One table as the server's statistics show it. `None` where the backend does not say.
#[derive(Debug, Clone, PartialEq)]
pub struct TableHealth {
    /// The table's name.
    pub table: String,
    /// Rows visible now (an estimate).
    pub live_rows: Option<i64>,
    /// Row versions no transaction can see any more, not yet removed by vacuum (PostgreSQL).
    pub dead_rows: Option<i64>,
    /// The table's bytes on disk (PostgreSQL: with its TOAST; MySQL: data).
    pub table_bytes: Option<i64>,
    /// Its indexes' bytes on disk.
    pub index_bytes: Option<i64>,
    /// Allocated bytes that hold no row (MySQL `DATA_FREE`).
    pub free_bytes: Option<i64>,
    /// How long ago vacuum (manual or automatic) last ran on it; `None`: never, or not known.
    pub vacuumed_ago: Option<Duration>,
    /// How long ago it was last analyzed.
    pub analyzed_ago: Option<Duration>,
    /// `false` when the table's own settings turn autovacuum off (`autovacuum_enabled = false`).
    pub autovacuum_enabled: bool,
}

impl TableHealth {
    /// Bytes of the table and its indexes (0 where the server does not say).
    pub fn bytes(&self) -> i64 {
        self.table_bytes.unwrap_or(0) + self.index_bytes.unwrap_or(0)
    }

    /// Dead row versions as a share of all row versions (0 without any).
    pub fn dead_ratio(&self) -> f64 {
        let dead = self.dead_rows.unwrap_or(0).max(0) as f64;
        let live = self.live_rows.unwrap_or(0).max(0) as f64;
        if dead + live == 0.0 {
            0.0
        } else {
            dead / (dead + live)
        }
    }
}

/// What holds the xmin horizon back (or, on MySQL, InnoDB's purge).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HolderKind {
    /// A session's open transaction or snapshot.
    Session,
    /// A prepared (two-phase) transaction, waiting for COMMIT PREPARED or ROLLBACK PREPARED.
    Prepared,
    /// A replication slot's `xmin` (a standby with `hot_standby_feedback`) or `catalog_xmin`.
    Slot,
}

impl HolderKind {
    /// `session`, `prepared` or `slot`.
    pub fn as_str(self) -> &'static str {
        match self {
            HolderKind::Session => "session",
            HolderKind::Prepared => "prepared",
            HolderKind::Slot => "slot",
        }
    }
}

/// One of the oldest things holding the horizon.
#[derive(Debug, Clone, PartialEq)]
pub struct HorizonHolder {
    /// What it is.
    pub kind: HolderKind,
    /// The session's process id (PostgreSQL's `pid`, MySQL's thread id).
    pub pid: Option<i64>,
    /// The session's `application_name` (MySQL: `user@host`), the prepared transaction's `gid`
    /// or the slot's name.
    pub name: String,
    /// The session's state (`idle in transaction`, `active`, …; MySQL: `RUNNING`, `LOCK WAIT`),
    /// or whether the slot is `active`.
    pub state: Option<String>,
    /// How long it has held it: since the transaction (or prepared transaction) began. `None`
    /// for slots.
    pub age: Option<Duration>,
    /// Transactions begun since the oldest one it keeps visible (PostgreSQL `age(xmin)`).
    pub xid_age: Option<i64>,
}

/// What the server says of vacuum and the horizon.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ServerHealth {
    /// The server's `autovacuum` setting (PostgreSQL); `None` elsewhere.
    pub autovacuum: Option<bool>,
    /// The oldest holders of the horizon, oldest first (at most five).
    pub holders: Vec<HorizonHolder>,
}

/// The health of [`QUEUE_TABLES`] that exist, in that order; empty on SQLite.
pub async fn tables<C: ConnectionTrait>(db: &C) -> Result<Vec<TableHealth>, DbErr> {
    let dialect = Dialect::of(db);
    let mut sql = Sql::new(dialect);
    match db.get_database_backend() {
        DbBackend::Postgres => {
            // Each table's leaves: itself, or its partitions.
            sql.push(
                "SELECT c.relname::text AS table_name, SUM(s.n_live_tup)::bigint AS live_rows, \
                 SUM(s.n_dead_tup)::bigint AS dead_rows, \
                 SUM(pg_table_size(l.oid))::bigint AS table_bytes, \
                 SUM(pg_indexes_size(l.oid))::bigint AS index_bytes, NULL::bigint AS free_bytes, \
                 EXTRACT(EPOCH FROM now() - MAX(GREATEST(s.last_vacuum, s.last_autovacuum)))::float8 \
                 AS vacuumed_s, \
                 EXTRACT(EPOCH FROM now() - MAX(GREATEST(s.last_analyze, s.last_autoanalyze)))::float8 \
                 AS analyzed_s, \
                 bool_and(NOT EXISTS (SELECT 1 FROM unnest(l.reloptions) AS o(option) \
                 WHERE lower(o.option) IN ('autovacuum_enabled=false', 'autovacuum_enabled=off', \
                 'autovacuum_enabled=0', 'autovacuum_enabled=no', 'autovacuum_enabled=f', \
                 'autovacuum_enabled=n'))) AS autovacuum_enabled \
                 FROM pg_class c LEFT JOIN LATERAL pg_partition_tree(c.oid) t ON true \
                 JOIN pg_class l ON l.oid = COALESCE(t.relid, c.oid) \
                 JOIN pg_stat_user_tables s ON s.relid = l.oid \
                 WHERE COALESCE(t.isleaf, true) AND NOT c.relispartition \
                 AND c.relnamespace = to_regnamespace(current_schema()) AND c.relname IN (",
            );
        }
        DbBackend::MySql => {
            sql.push(
                "SELECT TABLE_NAME AS table_name, CAST(TABLE_ROWS AS SIGNED) AS live_rows, \
                 CAST(NULL AS SIGNED) AS dead_rows, CAST(DATA_LENGTH AS SIGNED) AS table_bytes, \
                 CAST(INDEX_LENGTH AS SIGNED) AS index_bytes, \
                 CAST(DATA_FREE AS SIGNED) AS free_bytes, CAST(NULL AS DOUBLE) AS vacuumed_s, \
                 CAST(NULL AS DOUBLE) AS analyzed_s, TRUE AS autovacuum_enabled \
                 FROM information_schema.TABLES \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN (",
            );
        }
        _ => return Ok(Vec::new()),
    }
    for (i, table) in QUEUE_TABLES.iter().enumerate() {
        if i > 0 {
            sql.push(", ");
        }
        sql.bind((*table).to_owned().into());
    }
    sql.push(")");
    if db.get_database_backend() == DbBackend::Postgres {
        sql.push(" GROUP BY c.relname");
    }
    let mut found: Vec<TableHealth> = db
        .query_all_raw(sql.build())
        .await?
        .iter()
        .map(table_of)
        .collect::<Result<_, _>>()?;
    found.sort_by_key(|t| QUEUE_TABLES.iter().position(|q| *q == t.table));
    Ok(found)
}

fn table_of(row: &QueryResult) -> Result<TableHealth, DbErr> {
    let autovacuum_enabled = match row.try_get::<bool>("", "autovacuum_enabled") {
        Ok(on) => on,
        // MySQL answers TRUE as an integer.
        Err(_) => row.try_get::<i64>("", "autovacuum_enabled")? != 0,
    };
    Ok(TableHealth {
        table: row.try_get("", "table_name")?,
        live_rows: row.try_get("", "live_rows")?,
        dead_rows: row.try_get("", "dead_rows")?,
        table_bytes: row.try_get("", "table_bytes")?,
        index_bytes: row.try_get("", "index_bytes")?,
        free_bytes: row.try_get("", "free_bytes")?,
        vacuumed_ago: seconds(row.try_get("", "vacuumed_s")?),
        analyzed_ago: seconds(row.try_get("", "analyzed_s")?),
        autovacuum_enabled,
    })
}

fn seconds(s: Option<f64>) -> Option<Duration> {
    s.and_then(|s| Duration::try_from_secs_f64(s.max(0.0)).ok())
}

/// How many ids each work queue's id sequence hands a session at once (PostgreSQL's sequence
/// cache), as `(table, cache)` for `outbox_event` and `inbox_event` where they exist; empty on
/// other backends. The migrations create them with no cache (1).
pub async fn id_caches<C: ConnectionTrait>(db: &C) -> Result<Vec<(String, i64)>, DbErr> {
    if db.get_database_backend() != DbBackend::Postgres {
        return Ok(Vec::new());
    }
    let sql = "SELECT t.name AS table_name, s.seqcache AS cache \
         FROM (VALUES ('outbox_event'), ('inbox_event')) AS t (name) \
         JOIN pg_sequence s ON s.seqrelid = to_regclass(pg_get_serial_sequence(\
         CASE WHEN to_regclass(t.name) IS NOT NULL THEN t.name END, 'id')) \
         ORDER BY t.name DESC";
    let rows = db.query_all_raw(Dialect::of(db).raw(sql)).await?;
    rows.iter()
        .map(|row| {
            Ok((
                row.try_get::<String>("", "table_name")?,
                row.try_get::<i64>("", "cache")?,
            ))
        })
        .collect()
}

/// The server's autovacuum setting and the oldest holders of the horizon that matter to this
/// database ([`autovacuum`], [`holders`]); empty on SQLite.
pub async fn server<C: ConnectionTrait>(db: &C) -> Result<ServerHealth, DbErr> {
    Ok(ServerHealth {
        autovacuum: autovacuum(db).await?,
        holders: holders(db).await?,
    })
}

/// The server's `autovacuum` setting (PostgreSQL); `None` elsewhere.
pub async fn autovacuum<C: ConnectionTrait>(db: &C) -> Result<Option<bool>, DbErr> {
    if db.get_database_backend() != DbBackend::Postgres {
        return Ok(None);
    }
    let mut sql = Sql::new(Dialect::of(db));
    sql.push("SELECT current_setting('autovacuum') = 'on' AS autovacuum");
    match db.query_one_raw(sql.build()).await? {
        Some(row) => Ok(Some(row.try_get::<bool>("", "autovacuum")?)),
        None => Ok(None),
    }
}

/// The oldest holders of the horizon that matter to this database, oldest first (at most
/// five); empty on SQLite. On MySQL, reading `INNODB_TRX` needs the `PROCESS` privilege.
pub async fn holders<C: ConnectionTrait>(db: &C) -> Result<Vec<HorizonHolder>, DbErr> {
    let mut sql = Sql::new(Dialect::of(db));
    match db.get_database_backend() {
        DbBackend::Postgres => {
            // Sessions of this database (or of none: a WAL sender's), prepared transactions of
            // this database, and slots with an xmin; the oldest first by transactions since.
            sql.push(
                "SELECT kind, pid, name, state, age_s, xid_age FROM ( \
                 SELECT 'session' AS kind, pid::bigint AS pid, \
                 COALESCE(application_name, '') AS name, state::text AS state, \
                 EXTRACT(EPOCH FROM now() - COALESCE(xact_start, query_start, backend_start))::float8 \
                 AS age_s, age(backend_xmin)::bigint AS xid_age \
                 FROM pg_stat_activity \
                 WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid() \
                 AND (datname IS NULL OR datname = current_database()) \
                 UNION ALL \
                 SELECT 'prepared', NULL::bigint, gid, NULL::text, \
                 EXTRACT(EPOCH FROM now() - prepared)::float8, age(transaction)::bigint \
                 FROM pg_prepared_xacts WHERE database = current_database() \
                 UNION ALL \
                 SELECT 'slot', NULL::bigint, slot_name::text, \
                 CASE WHEN active THEN 'active' ELSE 'inactive' END, NULL::float8, \
                 GREATEST(age(xmin), age(catalog_xmin))::bigint \
                 FROM pg_replication_slots \
                 WHERE (xmin IS NOT NULL OR catalog_xmin IS NOT NULL) \
                 AND (database IS NULL OR database = current_database()) \
                 ) AS holders ORDER BY xid_age DESC NULLS LAST LIMIT 5",
            );
        }
        DbBackend::MySql => {
            // InnoDB's purge is the server's: every open transaction holds it back.
            sql.push(
                "SELECT 'session' AS kind, CAST(t.trx_mysql_thread_id AS SIGNED) AS pid, \
                 COALESCE(CONCAT(p.USER, '@', p.HOST), '') AS name, t.trx_state AS state, \
                 CAST(TIMESTAMPDIFF(MICROSECOND, t.trx_started, NOW(6)) / 1000000 AS DOUBLE) \
                 AS age_s, CAST(NULL AS SIGNED) AS xid_age \
                 FROM information_schema.INNODB_TRX t \
                 LEFT JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id \
                 WHERE t.trx_mysql_thread_id <> CONNECTION_ID() \
                 ORDER BY t.trx_started LIMIT 5",
            );
        }
        _ => return Ok(Vec::new()),
    }
    db.query_all_raw(sql.build())
        .await?
        .iter()
        .map(holder_of)
        .collect()
}

fn holder_of(row: &QueryResult) -> Result<HorizonHolder, DbErr> {
    let kind = match row.try_get::<String>("", "kind")?.as_str() {
        "prepared" => HolderKind::Prepared,
        "slot" => HolderKind::Slot,
        _ => HolderKind::Session,
    };
    Ok(HorizonHolder {
        kind,
        pid: row.try_get("", "pid")?,
        name: row.try_get("", "name")?,
        state: row.try_get("", "state")?,
        age: seconds(row.try_get("", "age_s")?),
        xid_age: row.try_get("", "xid_age")?,
    })
}
