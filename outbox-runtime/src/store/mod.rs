//! The SQL the SDK runs, per backend.
//!
//! Every statement that touches `outbox_event` or `inbox_event` lives under this module: shared
//! shapes here, backend differences in [`postgres`], [`mysql`] and [`sqlite`].

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, QueryResult, Statement, Value};
use uuid::Uuid;

use crate::transaction::{PendingEvent, SkippedEvent};

pub(crate) mod admin;
pub(crate) mod claim;
pub mod inbox;
pub mod mysql;
pub mod postgres;
pub mod relay;
pub mod sqlite;

/// The outbox table.
pub const OUTBOX_TABLE: &str = "outbox_event";
/// The inbox table.
pub const INBOX_TABLE: &str = "inbox_event";

/// Status values of `outbox_event.status`.
pub mod outbox_status {
    /// Committed, not yet claimed.
    pub const PENDING: &str = "PENDING";
    /// Claimed by a relay under a lease.
    pub const PROCESSING: &str = "PROCESSING";
    /// Confirmed by the broker.
    pub const SENT: &str = "SENT";
    /// A publish failed; due again at `next_attempt_at`.
    pub const RETRY: &str = "RETRY";
    /// Gave up after `max_attempts`; waits for an operator.
    pub const DEAD: &str = "DEAD";
}

/// Columns bound per row by the commit-time INSERT, in order.
const INSERT_COLUMNS: [&str; 11] = [
    "event_id",
    "source",
    "event_type",
    "schema_version",
    "aggregate_type",
    "aggregate_id",
    "aggregate_version",
    "dedup_key",
    "payload",
    "headers",
    "created_at",
];

/// Whether an error is worth retrying the same transaction for: a deadlock, a serialization
/// failure, a lock wait timeout or a busy SQLite database.
pub fn is_transient(err: &DbErr) -> bool {
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    if let DbErr::Exec(sea_orm::RuntimeErr::SqlxError(e))
    | DbErr::Query(sea_orm::RuntimeErr::SqlxError(e))
    | DbErr::Conn(sea_orm::RuntimeErr::SqlxError(e)) = err
        && let Some(db) = e.as_database_error()
    {
        let code = db.code();
        let message = db.message();
        return matches!(code.as_deref(), Some("40001" | "40P01" | "5" | "6" | "517"))
            || message.contains("Deadlock found")
            || message.contains("Lock wait timeout")
            || message.contains("database is locked");
    }
    let text = err.to_string();
    text.contains("Deadlock found")
        || text.contains("deadlock detected")
        || text.contains("database is locked")
}

/// Whether an error says the database could not be reached or dropped the connection (the
/// server restarted, an administrator terminated the session, the pool could not connect):
/// trying again later can succeed without anything else changing.
pub fn is_connection_error(err: &DbErr) -> bool {
    if matches!(err, DbErr::ConnectionAcquire(_)) {
        return true;
    }
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    if let DbErr::Exec(sea_orm::RuntimeErr::SqlxError(e))
    | DbErr::Query(sea_orm::RuntimeErr::SqlxError(e))
    | DbErr::Conn(sea_orm::RuntimeErr::SqlxError(e)) = err
    {
        use sea_orm::sqlx::Error;
        return match &**e {
            Error::Io(_)
            | Error::Tls(_)
            | Error::Protocol(_)
            | Error::PoolTimedOut
            | Error::PoolClosed
            | Error::WorkerCrashed => true,
            Error::Database(db) => {
                let code = db.code();
                let code = code.as_deref().unwrap_or_default();
                // PostgreSQL: class 08 (connection exception), 57P01-57P03 (terminated by an
                // administrator, crash shutdown, cannot connect now). MySQL: 2006/2013 (server
                // gone away, lost connection), 1053 (server shutdown in progress).
                code.starts_with("08")
                    || matches!(code, "57P01" | "57P02" | "57P03" | "2006" | "2013" | "1053")
            }
            _ => false,
        };
    }
    matches!(err, DbErr::Conn(_))
}

/// What the commit-time INSERT did.
#[derive(Debug, Default)]
pub(crate) struct InsertOutcome {
    pub(crate) written: usize,
    pub(crate) skipped: Vec<SkippedEvent>,
}

/// Backend differences in one place: placeholders, value encodings, conflict handling.
#[derive(Debug, Clone, Copy)]
pub struct Dialect {
    backend: DbBackend,
}

impl Dialect {
    /// The dialect of a connection.
    pub fn of<C: ConnectionTrait + ?Sized>(conn: &C) -> Self {
        Dialect {
            backend: conn.get_database_backend(),
        }
    }

    /// The backend.
    pub fn backend(&self) -> DbBackend {
        self.backend
    }

    /// The `n`-th (1-based) bind placeholder.
    pub fn placeholder(&self, n: usize) -> String {
        match self.backend {
            DbBackend::Postgres => postgres::placeholder(n),
            _ => "?".to_owned(),
        }
    }

    /// A placeholder for a JSON text parameter.
    fn json_placeholder(&self, n: usize) -> String {
        match self.backend {
            DbBackend::Postgres => postgres::json_placeholder(n),
            _ => "?".to_owned(),
        }
    }

    /// A UUID column value: native on PostgreSQL, `CHAR(36)` text elsewhere.
    pub fn uuid(&self, id: Uuid) -> Value {
        match self.backend {
            DbBackend::Postgres => id.into(),
            _ => id.hyphenated().to_string().into(),
        }
    }

    /// A timestamp column value: native on PostgreSQL and MySQL, fixed-width RFC 3339 text on
    /// SQLite (so text comparison orders correctly).
    pub fn timestamp(&self, t: DateTime<Utc>) -> Value {
        match self.backend {
            DbBackend::Sqlite => sqlite::timestamp_text(&t).into(),
            _ => t.into(),
        }
    }

    /// Read a UUID column.
    pub fn get_uuid(&self, row: &QueryResult, column: &str) -> Result<Uuid, DbErr> {
        match self.backend {
            DbBackend::Postgres => row.try_get::<Uuid>("", column),
            _ => {
                let text: String = row.try_get("", column)?;
                Uuid::parse_str(&text)
                    .map_err(|e| DbErr::Type(format!("column {column} is not a UUID: {e}")))
            }
        }
    }

    /// Read an optional UUID column.
    pub fn get_opt_uuid(&self, row: &QueryResult, column: &str) -> Result<Option<Uuid>, DbErr> {
        match self.backend {
            DbBackend::Postgres => row.try_get::<Option<Uuid>>("", column),
            _ => match row.try_get::<Option<String>>("", column)? {
                None => Ok(None),
                Some(text) => Uuid::parse_str(&text)
                    .map(Some)
                    .map_err(|e| DbErr::Type(format!("column {column} is not a UUID: {e}"))),
            },
        }
    }

    /// Read a timestamp column.
    pub fn get_timestamp(&self, row: &QueryResult, column: &str) -> Result<DateTime<Utc>, DbErr> {
        match self.backend {
            DbBackend::Sqlite => {
                let text: String = row.try_get("", column)?;
                sqlite::parse_timestamp(&text, column)
            }
            _ => row.try_get::<DateTime<Utc>>("", column),
        }
    }

    /// Read an optional timestamp column.
    pub fn get_opt_timestamp(
        &self,
        row: &QueryResult,
        column: &str,
    ) -> Result<Option<DateTime<Utc>>, DbErr> {
        match self.backend {
            DbBackend::Sqlite => match row.try_get::<Option<String>>("", column)? {
                None => Ok(None),
                Some(text) => sqlite::parse_timestamp(&text, column).map(Some),
            },
            _ => row.try_get::<Option<DateTime<Utc>>>("", column),
        }
    }

    /// Read a JSON column as text.
    pub fn get_json_text(&self, row: &QueryResult, column: &str) -> Result<String, DbErr> {
        match self.backend {
            DbBackend::Postgres => row
                .try_get::<serde_json::Value>("", column)
                .map(|v| v.to_string()),
            _ => row.try_get::<String>("", column),
        }
    }

    /// Tail of the commit-time INSERT: skip a row whose `(event_type, dedup_key)` exists. Without
    /// a deduplication key in the statement nothing can conflict there, and PostgreSQL and SQLite
    /// are spared the conflict check's speculative insertion (`None`); MySQL's clause covers every
    /// unique key, so it stays.
    fn insert_conflict_clause(&self, any_dedup_key: bool) -> Option<&'static str> {
        match self.backend {
            DbBackend::MySql => Some(mysql::INSERT_ON_CONFLICT),
            _ if !any_dedup_key => None,
            DbBackend::Postgres => Some(postgres::INSERT_ON_CONFLICT),
            _ => Some(sqlite::INSERT_ON_CONFLICT),
        }
    }

    fn statement(&self, sql: String, values: Vec<Value>) -> Statement {
        Statement::from_sql_and_values(self.backend, sql, values)
    }
}

/// Write buffered events with multi-row INSERTs of at most `batch_rows` rows.
///
/// A second event with the same `(event_type, dedup_key)` as one in the table or earlier in the
/// batch is skipped without aborting the transaction, and reported.
pub(crate) async fn insert_events<C: ConnectionTrait>(
    conn: &C,
    events: &[PendingEvent],
    batch_rows: usize,
) -> Result<InsertOutcome, DbErr> {
    let dialect = Dialect::of(conn);
    let mut outcome = InsertOutcome::default();

    // Duplicates inside this transaction's own buffer never reach the database.
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    let mut to_write: Vec<&PendingEvent> = Vec::with_capacity(events.len());
    for event in events {
        if let Some(key) = &event.dedup_key
            && !seen.insert((&event.event_type, key))
        {
            outcome.skipped.push(event.skipped());
            continue;
        }
        to_write.push(event);
    }

    for chunk in to_write.chunks(batch_rows.max(1)) {
        let mut sql = String::with_capacity(128 + chunk.len() * 80);
        sql.push_str("INSERT INTO ");
        sql.push_str(OUTBOX_TABLE);
        sql.push_str(" (");
        sql.push_str(&INSERT_COLUMNS.join(", "));
        sql.push_str(") VALUES ");
        let mut values = Vec::with_capacity(chunk.len() * INSERT_COLUMNS.len());
        let mut n = 0;
        for (i, event) in chunk.iter().enumerate() {
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push('(');
            for col in 0..INSERT_COLUMNS.len() {
                n += 1;
                if col > 0 {
                    sql.push_str(", ");
                }
                if col == 8 || col == 9 {
                    sql.push_str(&dialect.json_placeholder(n));
                } else {
                    sql.push_str(&dialect.placeholder(n));
                }
            }
            sql.push(')');
            values.push(dialect.uuid(event.event_id));
            values.push(event.source.clone().into());
            values.push(event.event_type.to_string().into());
            values.push(i64::from(event.schema_version).into());
            values.push(event.aggregate_type.to_string().into());
            values.push(event.aggregate_id.clone().into());
            values.push(event.aggregate_version.into());
            values.push(event.dedup_key.clone().into());
            values.push(event.payload.clone().into());
            values.push(event.headers.clone().into());
            values.push(dialect.timestamp(event.created_at));
        }
        if let Some(clause) =
            dialect.insert_conflict_clause(chunk.iter().any(|e| e.dedup_key.is_some()))
        {
            sql.push(' ');
            sql.push_str(clause);
        }
        conn.execute_raw(dialect.statement(sql, values)).await?;
    }

    // Which events with a dedup key were skipped because the table already had their key?
    let keyed: Vec<&PendingEvent> = to_write
        .iter()
        .copied()
        .filter(|e| e.dedup_key.is_some())
        .collect();
    if !keyed.is_empty() {
        let mut present: HashSet<Uuid> = HashSet::with_capacity(keyed.len());
        for chunk in keyed.chunks(batch_rows.max(1)) {
            let placeholders: Vec<String> =
                (1..=chunk.len()).map(|n| dialect.placeholder(n)).collect();
            let sql = format!(
                "SELECT event_id FROM {OUTBOX_TABLE} WHERE event_id IN ({})",
                placeholders.join(", ")
            );
            let values = chunk.iter().map(|e| dialect.uuid(e.event_id)).collect();
            for row in conn.query_all_raw(dialect.statement(sql, values)).await? {
                present.insert(dialect.get_uuid(&row, "event_id")?);
            }
        }
        for event in keyed {
            if !present.contains(&event.event_id) {
                outcome.skipped.push(event.skipped());
            }
        }
    }
    outcome.written = events.len() - outcome.skipped.len();
    Ok(outcome)
}
