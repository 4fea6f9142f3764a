//! SQLite: `?` placeholders, `TEXT` UUIDs, fixed-width RFC 3339 timestamps, one integer type,
//! partial indexes, and immediate transactions instead of row locks.

use chrono::{DateTime, Utc};
use sea_orm::{DbBackend, DbErr, QueryResult, SqliteTransactionMode, TransactionOptions, Value};

use super::backend::{Backend, NextAggregate, QueueScan, sealed::Sealed};

/// The SQLite dialect.
#[derive(Debug, Clone, Copy)]
pub struct Sqlite;

impl Sealed for Sqlite {}

fn immediate() -> TransactionOptions {
    TransactionOptions {
        sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
        ..TransactionOptions::default()
    }
}

/// `2026-11-30T12:00:00.000000Z`: every timestamp the SDK writes has this width, so comparing
/// the text compares the instants.
fn timestamp_text(t: &DateTime<Utc>) -> String {
    crate::envelope::format_time(t)
}

/// `strftime`'s format of the text [`timestamp_text`] writes: `%f` is seconds with milliseconds,
/// and three zeros fill the microseconds.
const TIME_FORMAT: &str = "%Y-%m-%dT%H:%M:%f000Z";

fn parse_timestamp(text: &str, column: &str) -> Result<DateTime<Utc>, DbErr> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .or_else(|_| {
            chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f").map(|t| t.and_utc())
        })
        .map_err(|e| {
            DbErr::Type(format!(
                "column {column} holds `{text}`, not a timestamp: {e}"
            ))
        })
}

impl Backend for Sqlite {
    fn db_backend(&self) -> DbBackend {
        DbBackend::Sqlite
    }

    /// The clock of the host holding the database file, as the same fixed-width text as
    /// [`Self::timestamp`] (SQLite reads it to the millisecond).
    fn time_expression(&self, offset: Option<&str>) -> String {
        match offset {
            None => format!("strftime('{TIME_FORMAT}', 'now')"),
            Some(micros) => format!(
                "strftime('{TIME_FORMAT}', 'now', printf('%+.6f seconds', {micros} / 1000000.0))"
            ),
        }
    }

    /// Fixed-width RFC 3339 text, so text comparison orders correctly.
    fn timestamp(&self, t: DateTime<Utc>) -> Value {
        timestamp_text(&t).into()
    }

    fn null_timestamp(&self) -> Value {
        Option::<String>::None.into()
    }

    fn get_opt_timestamp(
        &self,
        row: &QueryResult,
        column: &str,
    ) -> Result<Option<DateTime<Utc>>, DbErr> {
        match row.try_get::<Option<String>>("", column)? {
            None => Ok(None),
            Some(text) => parse_timestamp(&text, column).map(Some),
        }
    }

    fn get_int(&self, row: &QueryResult, column: &str) -> Result<i64, DbErr> {
        row.try_get::<i64>("", column)
    }

    /// The immediate transaction already excludes other writers.
    fn lock_rows(&self, _skip_locked: bool) -> &'static str {
        ""
    }

    /// Immediate: claims serialize.
    fn work_transaction(&self) -> TransactionOptions {
        immediate()
    }

    /// Immediate: writers serialize, so what a guard read is what the update sees.
    fn admin_transaction(&self) -> TransactionOptions {
        immediate()
    }

    /// `BEGIN IMMEDIATE`: a transaction that reads before it writes cannot fail with
    /// `SQLITE_BUSY` on its first write.
    fn immediate_transaction(&self) -> TransactionOptions {
        immediate()
    }

    fn columns_query(&self) -> &'static str {
        "SELECT m.name AS t, p.name AS c FROM sqlite_master m \
         JOIN pragma_table_info(m.name) p WHERE m.type = 'table'"
    }

    fn indexes_query(&self) -> &'static str {
        "SELECT tbl_name AS t, name AS c FROM sqlite_master WHERE type = 'index'"
    }

    /// Unique constraints are SQLite's automatic indexes, which `sqlite_master` names
    /// `sqlite_autoindex_*`: only the named indexes are checked.
    fn expected_indexes(&self, table: &str) -> &'static [&'static str] {
        match table {
            "outbox_event" => &[
                "outbox_event_dedup_key_idx",
                "outbox_event_open_idx",
                "outbox_event_aggregate_unsent_idx",
                "outbox_event_sent_at_idx",
            ],
            "inbox_event" => &super::schema::INBOX_EVENT_INDEXES_SQLITE,
            "outbox_failure" => &super::schema::FAILURE_INDEXES,
            "outbox_scheduled" => &super::schema::SCHEDULED_INDEXES,
            "outbox_sent" => &super::schema::SENT_INDEXES,
            _ => &[],
        }
    }

    /// Whole seconds since the epoch by the clock of the host holding the file.
    fn bucket_expression(&self, seconds: &str) -> String {
        format!("(CAST(strftime('%s', 'now') AS INTEGER) / {seconds})")
    }

    /// Partial indexes; sQLite sorts NULLs first: two seeks per step of the loose index scan.
    fn queue_scan(&self) -> QueueScan {
        QueueScan::PartialIndex {
            next: NextAggregate::SameTypeThenLater,
        }
    }
}
