//! PostgreSQL: `$n` placeholders, native `uuid`/`timestamptz`/`jsonb`, partial indexes,
//! `LISTEN`/`NOTIFY`, and statements that save round trips (the claim transaction's settings in
//! one statement, an all-confirmed write-back as one simple query, an ordered inbox batch recorded
//! by one statement).

use sea_orm::{DbBackend, DbErr, QueryResult, Value};
use uuid::Uuid;

use super::backend::{Backend, NextAggregate, QueueScan, sealed::Sealed};

/// A condition that is always true and turns `synchronous_commit` off for the rest of the
/// transaction it runs in: a statement's own `SET LOCAL`, without a statement of its own.
pub(crate) const LAZY_COMMIT: &str = "set_config('synchronous_commit', 'off', true) IS NOT NULL";

/// The PostgreSQL dialect.
#[derive(Debug, Clone, Copy)]
pub struct Postgres;

impl Sealed for Postgres {}

impl Backend for Postgres {
    fn db_backend(&self) -> DbBackend {
        DbBackend::Postgres
    }

    fn placeholder(&self, n: usize) -> String {
        format!("${n}")
    }

    /// The statement's start (`statement_timestamp()`): one instant for the whole statement,
    /// not the transaction's start, which a long transaction would leave behind.
    fn time_expression(&self, offset: Option<&str>) -> String {
        match offset {
            None => "statement_timestamp()".to_owned(),
            Some(micros) => {
                format!("(statement_timestamp() + {micros} * INTERVAL '1 microsecond')")
            }
        }
    }

    /// JSON travels as text and is cast once, server-side.
    fn json_placeholder(&self, n: usize) -> String {
        format!("CAST(${n} AS jsonb)")
    }

    fn uuid(&self, id: Uuid) -> Value {
        id.into()
    }

    fn get_opt_uuid(&self, row: &QueryResult, column: &str) -> Result<Option<Uuid>, DbErr> {
        row.try_get::<Option<Uuid>>("", column)
    }

    fn get_json_text(&self, row: &QueryResult, column: &str) -> Result<String, DbErr> {
        row.try_get::<serde_json::Value>("", column)
            .map(|v| v.to_string())
    }

    /// Isolation and `synchronous_commit` in one round trip (see [`Self::work_session`]).
    fn work_transaction(&self) -> sea_orm::TransactionOptions {
        sea_orm::TransactionOptions::default()
    }

    /// Read committed, and without waiting for the WAL flush: a lost claim or mark only causes
    /// a republish that broker deduplication and the inbox absorb.
    fn work_session(&self) -> Option<&'static str> {
        Some("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = off")
    }

    fn notifications(&self) -> bool {
        true
    }

    fn snapshots(&self) -> bool {
        true
    }

    fn snapshot_columns(&self) -> &'static str {
        "pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS snap_xmin, \
         pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS snap_xmax"
    }

    /// The id sequence's last value, not `MAX(id)`: rows that left the queue keep their entries
    /// in the primary key until vacuum removes them, and while a snapshot holds the horizon a
    /// backward scan for the highest visible id walks every one of them (all of the table's rows,
    /// when every finished row has moved on). Ids come from a sequence without a cache (the
    /// migrations' `BIGSERIAL`), so every id up to its last value has been drawn by a
    /// transaction already running: the floor's seal waits for those.
    fn next_id(&self, table: &str) -> String {
        format!(
            "(SELECT pg_sequence_last_value(pg_get_serial_sequence('{table}', 'id')::regclass) + 1)"
        )
    }

    fn json_rejects_nul(&self) -> bool {
        true
    }

    fn commit_hides_abort(&self) -> bool {
        true
    }

    fn columns_query(&self) -> &'static str {
        "SELECT CAST(table_name AS TEXT) AS t, CAST(column_name AS TEXT) AS c \
         FROM information_schema.columns WHERE table_schema = current_schema()"
    }

    fn indexes_query(&self) -> &'static str {
        "SELECT CAST(tablename AS TEXT) AS t, CAST(indexname AS TEXT) AS c \
         FROM pg_indexes WHERE schemaname = current_schema()"
    }

    fn expected_indexes(&self, table: &str) -> &'static [&'static str] {
        match table {
            "outbox_event" => &[
                "outbox_event_event_id_key",
                "outbox_event_dedup_key_idx",
                "outbox_event_open_idx",
                "outbox_event_aggregate_unsent_idx",
                "outbox_event_sent_at_idx",
                "outbox_event_aggregate_dead_idx",
            ],
            "inbox_event" => &super::schema::INBOX_EVENT_INDEXES_POSTGRES,
            "outbox_failure" => &super::schema::FAILURE_INDEXES,
            "outbox_scheduled" => &super::schema::SCHEDULED_INDEXES,
            "outbox_sent" => &super::schema::SENT_INDEXES,
            "inbox_done" => &[
                "inbox_done_id_idx",
                "inbox_done_message_idx",
                "inbox_done_business_idx",
            ],
            _ => &[],
        }
    }

    /// Partial indexes; a lateral subquery seeking the aggregate index past `(a.t, a.i)`.
    fn queue_scan(&self) -> QueueScan {
        QueueScan::PartialIndex {
            next: NextAggregate::RowValue,
        }
    }

    /// `set_config(…)` of `synchronous_commit = off` for the statement's own transaction.
    fn lazy_commit_condition(&self) -> Option<&'static str> {
        Some(LAZY_COMMIT)
    }

    fn records_ordered_batch_in_one_statement(&self) -> bool {
        true
    }

    /// Whole seconds of the statement's start since the epoch.
    fn bucket_expression(&self, seconds: &str) -> String {
        format!("(CAST(floor(extract(epoch FROM statement_timestamp())) AS BIGINT) / {seconds})")
    }

    fn rotates_inbox(&self) -> bool {
        true
    }

    fn joins_values(&self) -> bool {
        true
    }

    fn moves_in_one_statement(&self) -> bool {
        true
    }

    /// Each slot is a partition of its own, `<table>_s<slot>`: one probe of each, in one query.
    fn slots_with_rows(&self, table: &str, slots: &[i32]) -> String {
        slots
            .iter()
            .map(|slot| {
                format!("SELECT {slot} AS slot WHERE EXISTS (SELECT 1 FROM {table}_s{slot})")
            })
            .collect::<Vec<_>>()
            .join(" UNION ALL ")
    }

    /// `TRUNCATE` of the slot's partition, waiting at most two seconds for its lock (a long
    /// reader of the table; the next pass tries again).
    fn empty_slot(&self, table: &str, slot: i32) -> Vec<String> {
        vec![
            "SET LOCAL lock_timeout = '2s'".to_owned(),
            format!("TRUNCATE {table}_s{slot}"),
        ]
    }
}
