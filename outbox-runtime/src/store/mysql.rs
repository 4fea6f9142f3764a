//! MySQL 8 / MariaDB 10.6+: `?` placeholders, `CHAR(36)` UUIDs, `DATETIME(6)` in UTC, and no
//! partial indexes: every "unsent"/"unfinished" predicate and every claim or purge statement
//! reads one `(status, …)` index range per status instead.

use sea_orm::{DbBackend, Statement};

use super::{
    backend::{Backend, QueueScan, sealed::Sealed},
    retention::Purge,
    sql::Sql,
    status::OutboxStatus,
};

/// The MySQL/MariaDB dialect.
#[derive(Debug, Clone, Copy)]
pub struct MySql;

impl Sealed for MySql {}

impl Backend for MySql {
    fn db_backend(&self) -> DbBackend {
        DbBackend::MySql
    }

    /// `UTC_TIMESTAMP(6)`: the `DATETIME(6)` columns hold UTC, whatever the session's time zone.
    fn time_expression(&self, offset: Option<&str>) -> String {
        match offset {
            None => "UTC_TIMESTAMP(6)".to_owned(),
            Some(micros) => format!("(UTC_TIMESTAMP(6) + INTERVAL {micros} MICROSECOND)"),
        }
    }

    /// A no-op update on a duplicate key: unlike `INSERT IGNORE`, it does not turn other errors
    /// (a value too long, a bad date) into silent warnings. It covers every unique key, so it
    /// stays even when no event carries a deduplication key.
    fn outbox_insert_conflict(&self, _any_dedup_key: bool) -> Option<&'static str> {
        Some("ON DUPLICATE KEY UPDATE id = id")
    }

    /// The column named with its table: the selected table has an `id` too.
    fn outbox_insert_select_conflict(&self) -> &'static str {
        "ON DUPLICATE KEY UPDATE outbox_event.id = outbox_event.id"
    }

    /// Values are validated before they get here, so `IGNORE` only skips the duplicate key.
    fn insert_skipping(&self, _key: &str) -> (&'static str, Option<String>) {
        ("INSERT IGNORE INTO ", None)
    }

    fn insert_skipping_any(&self) -> (&'static str, Option<&'static str>) {
        ("INSERT IGNORE INTO ", None)
    }

    fn insert_returning(&self) -> bool {
        false
    }

    /// InnoDB reads an `INSERT`'s subquery on its own table with shared next-key locks.
    fn insert_check_locks_gaps(&self) -> bool {
        true
    }

    /// Whole seconds since the epoch (`UNIX_TIMESTAMP()`), divided as integers.
    fn bucket_expression(&self, seconds: &str) -> String {
        format!("(UNIX_TIMESTAMP() DIV {seconds})")
    }

    /// The assignments run in order: `event_id` first, while `bucket` is still the old one.
    fn key_upsert(&self) -> &'static str {
        "ON DUPLICATE KEY UPDATE \
         event_id = IF(bucket < VALUES(bucket) - 1, VALUES(event_id), event_id), \
         bucket = IF(bucket < VALUES(bucket) - 1, VALUES(bucket), bucket)"
    }

    /// Each slot is a partition of its own, `s<slot>`: one probe of each, in one query.
    fn slots_with_rows(&self, table: &str, slots: &[i32]) -> String {
        slots
            .iter()
            .map(|slot| {
                format!(
                    "SELECT {slot} AS slot FROM DUAL WHERE EXISTS \
                     (SELECT 1 FROM {table} PARTITION (s{slot}))"
                )
            })
            .collect::<Vec<_>>()
            .join(" UNION ALL ")
    }

    fn empty_slot(&self, table: &str, slot: i32) -> Vec<String> {
        vec![format!("ALTER TABLE {table} TRUNCATE PARTITION s{slot}")]
    }

    /// Status ranges of `(aggregate_type, aggregate_id, status, id)`.
    fn unsent(&self, prefix: &str) -> String {
        OutboxStatus::in_list(prefix, &OutboxStatus::UNSENT)
    }

    fn columns_query(&self) -> &'static str {
        "SELECT table_name AS t, column_name AS c FROM information_schema.columns \
         WHERE table_schema = DATABASE()"
    }

    fn indexes_query(&self) -> &'static str {
        "SELECT DISTINCT table_name AS t, index_name AS c FROM information_schema.statistics \
         WHERE table_schema = DATABASE()"
    }

    fn expected_indexes(&self, table: &str) -> &'static [&'static str] {
        match table {
            "outbox_event" => &[
                "outbox_event_event_id_key",
                "outbox_event_dedup_key_idx",
                "outbox_event_status_idx",
                "outbox_event_aggregate_idx",
                "outbox_event_sent_at_idx",
            ],
            "inbox_event" => &super::schema::INBOX_EVENT_INDEXES,
            "outbox_failure" => &super::schema::FAILURE_INDEXES,
            "outbox_scheduled" => &super::schema::SCHEDULED_INDEXES,
            "outbox_sent" => &super::schema::SENT_INDEXES,
            _ => &[],
        }
    }

    /// No partial indexes: every claim statement reads one `(status, id)` range per status.
    fn queue_scan(&self) -> QueueScan {
        QueueScan::StatusRanges
    }

    fn purge_by_status(&self) -> bool {
        true
    }

    /// MySQL does not allow `LIMIT` in an `IN` subquery, and a derived table can turn the outer
    /// delete into a scan: `DELETE … ORDER BY <column>, id LIMIT n` on the `(status, <column>)`
    /// index instead, one status at a time.
    fn purge_statement(&self, purge: &Purge, statuses: &[&'static str], limit: usize) -> Statement {
        let mut sql = Sql::new(purge.dialect);
        sql.push(&format!(
            "DELETE FROM {} WHERE {} AND {} < ",
            purge.table,
            super::status::in_literals("", statuses),
            purge.column
        ))
        .bind(purge.cutoff.clone())
        .push(&format!(" ORDER BY {}, id LIMIT {limit}", purge.column));
        sql.build()
    }
}
