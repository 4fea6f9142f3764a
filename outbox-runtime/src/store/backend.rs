//! What differs between the backends: the [`Backend`] trait lists every difference the SDK's
//! SQL depends on (value encodings, conflict handling, row locks, transaction settings, and the
//! statements whose shape each backend's planner needs). Its default methods are the common
//! behaviour; `postgres.rs`, `mysql.rs` and `sqlite.rs` implement it, overriding what their
//! backend does differently. `dialect.rs` picks a connection's.

use chrono::{DateTime, Utc};
use sea_orm::{
    DbBackend, DbErr, IsolationLevel, QueryResult, Statement, TransactionOptions, Value,
};
use uuid::Uuid;

/// One backend's SQL: the defaults are what PostgreSQL, MySQL/MariaDB and SQLite share, or what
/// most of them do. Sealed: the SDK's three backends are its only implementations.
pub trait Backend: sealed::Sealed + Send + Sync + 'static {
    /// SeaORM's name of the backend, for building statements.
    fn db_backend(&self) -> DbBackend;

    /// The `n`-th (1-based) bind placeholder.
    fn placeholder(&self, _n: usize) -> String {
        "?".to_owned()
    }

    /// A placeholder for a JSON text parameter written into a JSON column.
    fn json_placeholder(&self, n: usize) -> String {
        self.placeholder(n)
    }

    /// A UUID column value: `CHAR(36)` text unless the backend has a UUID type.
    fn uuid(&self, id: Uuid) -> Value {
        id.hyphenated().to_string().into()
    }

    /// Read an optional UUID column.
    fn get_opt_uuid(&self, row: &QueryResult, column: &str) -> Result<Option<Uuid>, DbErr> {
        match row.try_get::<Option<String>>("", column)? {
            None => Ok(None),
            Some(text) => Uuid::parse_str(&text)
                .map(Some)
                .map_err(|e| DbErr::Type(format!("column {column} is not a UUID: {e}"))),
        }
    }

    /// The database's current time as a value of the type timestamps are stored in, shifted by
    /// `offset` microseconds (an SQL expression: a placeholder or a literal) when given. Every
    /// instant the SDK writes or compares is this expression (see `clock`).
    fn time_expression(&self, offset: Option<&str>) -> String;

    /// A timestamp column value.
    fn timestamp(&self, t: DateTime<Utc>) -> Value {
        t.into()
    }

    /// A NULL of the type timestamps are bound as.
    fn null_timestamp(&self) -> Value {
        Option::<DateTime<Utc>>::None.into()
    }

    /// Read an optional timestamp column.
    fn get_opt_timestamp(
        &self,
        row: &QueryResult,
        column: &str,
    ) -> Result<Option<DateTime<Utc>>, DbErr> {
        row.try_get::<Option<DateTime<Utc>>>("", column)
    }

    /// Read a JSON column as text.
    fn get_json_text(&self, row: &QueryResult, column: &str) -> Result<String, DbErr> {
        row.try_get::<String>("", column)
    }

    /// Read an `INTEGER` column (32 bits unless the backend has one integer type).
    fn get_int(&self, row: &QueryResult, column: &str) -> Result<i64, DbErr> {
        row.try_get::<i32>("", column).map(i64::from)
    }

    /// Tail of the commit-time outbox INSERT that skips a row whose `(event_type, dedup_key)`
    /// exists; `None` when the statement needs none (no event carries a deduplication key).
    fn outbox_insert_conflict(&self, any_dedup_key: bool) -> Option<&'static str> {
        any_dedup_key.then_some("ON CONFLICT (event_type, dedup_key) DO NOTHING")
    }

    /// [`Backend::outbox_insert_conflict`] for an `INSERT INTO outbox_event … SELECT` from
    /// another table with the same columns.
    fn outbox_insert_select_conflict(&self) -> &'static str {
        "ON CONFLICT (event_type, dedup_key) DO NOTHING"
    }

    /// An INSERT that skips rows conflicting on the unique key `key` (its columns,
    /// comma-separated): the statement's head and, where the backend needs one, its tail.
    fn insert_skipping(&self, key: &str) -> (&'static str, Option<String>) {
        (
            "INSERT INTO ",
            Some(format!(" ON CONFLICT ({key}) DO NOTHING")),
        )
    }

    /// An INSERT that skips a row conflicting on any unique key: the statement's head and,
    /// where the backend needs one, its tail.
    fn insert_skipping_any(&self) -> (&'static str, Option<&'static str>) {
        ("INSERT INTO ", Some(" ON CONFLICT DO NOTHING"))
    }

    /// Whether a subquery of an `INSERT` on its own table is a locking read that, at REPEATABLE
    /// READ, takes gap locks (the fast path's check then deadlocks concurrent producers).
    fn insert_check_locks_gaps(&self) -> bool {
        false
    }

    /// Whether an INSERT can return the rows it inserted (`RETURNING`).
    fn insert_returning(&self) -> bool {
        true
    }

    /// The row-lock clause of a `SELECT` whose rows the transaction then changes; empty where
    /// the transaction itself excludes other writers.
    fn lock_rows(&self, skip_locked: bool) -> &'static str {
        if skip_locked {
            " FOR UPDATE SKIP LOCKED"
        } else {
            " FOR UPDATE"
        }
    }

    /// Options of a short claim or write-back transaction: read committed (no gap locks).
    fn work_transaction(&self) -> TransactionOptions {
        read_committed()
    }

    /// Statement run first in a claim or write-back transaction, if any.
    fn work_session(&self) -> Option<&'static str> {
        None
    }

    /// Options of a short admin transaction: read committed.
    fn admin_transaction(&self) -> TransactionOptions {
        read_committed()
    }

    /// Options of a producer's transaction that asked for its writers to serialize from the
    /// start (`OutboxBuilder::sqlite_immediate`); the default where that needs nothing.
    fn immediate_transaction(&self) -> TransactionOptions {
        TransactionOptions::default()
    }

    /// "This outbox row is not SENT", in the form the backend's indexes serve.
    fn unsent(&self, prefix: &str) -> String {
        format!("{prefix}status <> {}", super::OutboxStatus::Sent.literal())
    }

    /// The number of the period of `seconds` (an SQL expression) the database's clock is in:
    /// whole seconds since the epoch divided by it (see `rotation.rs`).
    fn bucket_expression(&self, seconds: &str) -> String;

    /// The conflict clause of an `INSERT` into `outbox_key`: a key already held for the same
    /// period stays as it is; a row left from a period before the previous one (a slot that
    /// retention has not emptied yet) is overwritten as if absent.
    fn key_upsert(&self) -> &'static str {
        "ON CONFLICT (slot, event_type, dedup_key) DO UPDATE SET bucket = excluded.bucket, \
         event_id = excluded.event_id WHERE outbox_key.bucket < excluded.bucket - 1"
    }

    /// Whether a list of rows can be joined as `(VALUES …) AS p (columns)`, which the planner
    /// reads as a list of known length (probes of an index per row).
    fn joins_values(&self) -> bool {
        false
    }

    /// Whether handled inbox messages may live in `inbox_done`, with their keys in `inbox_key`
    /// (migration `outbox_0014` creates them on PostgreSQL only; `outbox_rotation`'s rows switch
    /// them on).
    fn rotates_inbox(&self) -> bool {
        false
    }

    /// Whether a sent event moves to `outbox_sent` in one statement (`DELETE … RETURNING`
    /// feeding an `INSERT`) rather than a copy and a delete.
    fn moves_in_one_statement(&self) -> bool {
        false
    }

    /// A query returning, as `slot`, each of `slots` of the rotating `table` that holds rows.
    fn slots_with_rows(&self, table: &str, slots: &[i32]) -> String {
        let list = slots
            .iter()
            .map(i32::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        format!("SELECT DISTINCT slot FROM {table} WHERE slot IN ({list})")
    }

    /// The statements that empty slot `slot` of the rotating `table`.
    fn empty_slot(&self, table: &str, slot: i32) -> Vec<String> {
        vec![format!("DELETE FROM {table} WHERE slot = {slot}")]
    }

    /// Whether other processes can be woken by a notification sent after a commit
    /// (`LISTEN`/`NOTIFY`).
    fn notifications(&self) -> bool {
        false
    }

    /// Whether a statement can read its snapshot's oldest running and first unassigned
    /// transaction ids: the claim then keeps a floor (see `floor.rs`).
    fn snapshots(&self) -> bool {
        false
    }

    /// `snap_xmin, snap_xmax` of the statement's snapshot, as integers (where
    /// [`Backend::snapshots`]).
    fn snapshot_columns(&self) -> &'static str {
        "0 AS snap_xmin, 0 AS snap_xmax"
    }

    /// An expression for an id above every id `table` has handed out (where
    /// [`Backend::snapshots`]): what a floor's sample takes when no unfinished row is left.
    fn next_id(&self, table: &str) -> String {
        format!("(SELECT MAX(m.id) + 1 FROM {table} m)")
    }

    /// Whether a JSON column rejects the NUL character (`\u0000`) in a string.
    fn json_rejects_nul(&self) -> bool {
        false
    }

    /// Whether `COMMIT` of a transaction aborted by a failed statement rolls back without an
    /// error, so a caller must look for the abort before committing.
    fn commit_hides_abort(&self) -> bool {
        false
    }

    /// `(table, column)` of every column of the current schema's tables, as columns `t`, `c`.
    fn columns_query(&self) -> &'static str;

    /// `(table, index)` of every index of the current schema's tables, as columns `t`, `c`.
    fn indexes_query(&self) -> &'static str;

    /// The indexes the SDK's migrations create on `table` on this backend.
    fn expected_indexes(&self, table: &str) -> &'static [&'static str];

    /// How the backend's planner reads a work queue, which shapes the claim's statements
    /// (`claim.rs`).
    fn queue_scan(&self) -> QueueScan;

    /// A condition that, evaluated for a row a statement outside any transaction writes, turns
    /// off the wait for the WAL flush of the statement's own transaction (for writes whose loss
    /// in a crash only repeats work: a claim's usual write-back, a wake-up); `None` where the
    /// backend cannot, and such a write-back runs in a transaction of its own.
    fn lazy_commit_condition(&self) -> Option<&'static str> {
        None
    }

    /// Whether an ordered inbox batch is recorded by one statement that also finds which
    /// messages wait behind their aggregate (`inbox::record_ordered_statement`).
    fn records_ordered_batch_in_one_statement(&self) -> bool {
        false
    }

    /// Whether retention deletes one status at a time (one index range per status) rather
    /// than all of a purge's statuses in one statement.
    fn purge_by_status(&self) -> bool {
        false
    }

    /// `DELETE` at most `limit` rows of `purge.table` in `statuses` whose `purge.column` is
    /// before the cutoff. By default the rows are picked by a subquery served by the partial
    /// index, locked with `SKIP LOCKED` where the backend locks rows, so a purge never waits on a
    /// row someone else holds.
    fn purge_statement(
        &self,
        purge: &super::retention::Purge,
        statuses: &[&'static str],
        limit: usize,
    ) -> Statement {
        super::retention::purge_by_subquery(purge, statuses, limit, self.lock_rows(true))
    }
}

/// How a backend's planner reads a work queue (`outbox_event`, `inbox_event`) fast: the claim
/// (`claim.rs`) writes its statements in the shape this names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueScan {
    /// A partial index of the open rows, read as one id range: the heads query computes
    /// the claim window's bound itself, and the heads beyond the window are found by a loose
    /// index scan over the aggregate index (a recursive CTE), each step a `next` seek.
    PartialIndex {
        /// How the loose index scan steps from one aggregate to the next.
        next: NextAggregate,
    },
    /// No partial indexes: one `(status, id)` range per status. The window's bound is asked
    /// for first, and the heads beyond the window are each status's first row per aggregate,
    /// found by a `GROUP BY` the planner runs as a loose index scan.
    StatusRanges,
}

/// A step of the loose index scan over `(aggregate_type, aggregate_id, id)`: from aggregate
/// `(a.t, a.i)` to the next one in key order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextAggregate {
    /// One seek past the row value `(a.t, a.i)`, in a lateral subquery.
    RowValue,
    /// Two seeks, for a planner that sorts NULLs first and, with the `aggregate_id IS NOT NULL`
    /// that skipping them needs, no longer seeks on the row value: the next id of the same
    /// type, else the first aggregate of a later type.
    SameTypeThenLater,
}

pub(super) mod sealed {
    /// Implemented by the SDK's backends only.
    pub trait Sealed {}
}

fn read_committed() -> TransactionOptions {
    TransactionOptions {
        isolation_level: Some(IsolationLevel::ReadCommitted),
        ..TransactionOptions::default()
    }
}
