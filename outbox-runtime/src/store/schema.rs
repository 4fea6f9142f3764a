//! Schema introspection for `doctor`: which tables, columns, indexes and migrations exist, and
//! which consumers the inbox has seen.

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};

use super::{Dialect, INBOX_TABLE, get_i64, status::InboxStatus};

/// Longest message id the table holds; a longer one is stored cut to this many characters.
pub const MAX_MESSAGE_ID_CHARS: usize = 255;

/// Longest source, message type and business key of an external message.
pub const MAX_KEY_CHARS: usize = 255;

/// A column or index of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableItem {
    /// The table.
    pub table: String,
    /// The column's or index's name.
    pub name: String,
}

/// Every column of the current schema's tables.
pub async fn columns(db: &DatabaseConnection) -> Result<Vec<TableItem>, DbErr> {
    items(db, Dialect::of(db).columns_query()).await
}

/// Every index of the current schema's tables.
pub async fn indexes(db: &DatabaseConnection) -> Result<Vec<TableItem>, DbErr> {
    items(db, Dialect::of(db).indexes_query()).await
}

async fn items(db: &DatabaseConnection, sql: &'static str) -> Result<Vec<TableItem>, DbErr> {
    let rows = db.query_all_raw(Dialect::of(db).raw(sql)).await?;
    rows.iter()
        .map(|row| {
            Ok(TableItem {
                table: row.try_get("", "t")?,
                name: row.try_get("", "c")?,
            })
        })
        .collect()
}

/// The named indexes of `inbox_event` on MySQL/MariaDB once every migration ran (`outbox_0007`
/// dropped the old `inbox_event_consumer_message_key`).
pub(crate) const INBOX_EVENT_INDEXES: [&str; 5] = [
    "inbox_event_message_key",
    "inbox_event_business_key",
    "inbox_event_unfinished_idx",
    "inbox_event_aggregate_idx",
    "inbox_event_processed_at_idx",
];

/// The named indexes of `inbox_event` on SQLite: its open rows by id (`outbox_0012`) in
/// place of the unfinished ones.
pub(crate) const INBOX_EVENT_INDEXES_SQLITE: [&str; 5] = [
    "inbox_event_message_key",
    "inbox_event_business_key",
    "inbox_event_open_idx",
    "inbox_event_aggregate_idx",
    "inbox_event_processed_at_idx",
];

/// [`INBOX_EVENT_INDEXES_SQLITE`] and, on PostgreSQL, the DEAD messages per aggregate
/// (`outbox_0011`).
pub(crate) const INBOX_EVENT_INDEXES_POSTGRES: [&str; 6] = [
    "inbox_event_message_key",
    "inbox_event_business_key",
    "inbox_event_open_idx",
    "inbox_event_aggregate_idx",
    "inbox_event_processed_at_idx",
    "inbox_event_aggregate_dead_idx",
];

/// The indexes of `outbox_failure` (`outbox_0008`), the same on every backend.
pub(crate) const FAILURE_INDEXES: [&str; 2] = ["outbox_failure_row", "outbox_failure_at"];

/// The named indexes of `outbox_scheduled` (`outbox_0009`), the same on every backend.
pub(crate) const SCHEDULED_INDEXES: [&str; 2] =
    ["outbox_scheduled_dedup_key_idx", "outbox_scheduled_due_idx"];

/// The named indexes of `outbox_sent` (`outbox_0013`), the same on every backend.
pub(crate) const SENT_INDEXES: [&str; 2] = ["outbox_sent_id_idx", "outbox_sent_event_id_idx"];

/// The indexes the SDK's migrations create on `table` on this connection's backend.
pub fn expected_indexes(db: &DatabaseConnection, table: &str) -> &'static [&'static str] {
    Dialect::of(db).expected_indexes(table)
}

/// The migration names recorded in a migration table (`outbox_migrations`, `seaql_migrations`).
pub async fn applied_migrations(
    db: &DatabaseConnection,
    table: &str,
) -> Result<Vec<String>, DbErr> {
    let sql = format!("SELECT version FROM {table} ORDER BY version");
    let rows = db.query_all_raw(Dialect::of(db).raw(sql)).await?;
    rows.iter().map(|row| row.try_get("", "version")).collect()
}

/// A consumer the inbox has rows of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerSeen {
    /// Its name.
    pub consumer: String,
    /// How many of its messages are still to handle (PENDING, PROCESSING, RETRY).
    pub open: i64,
}

/// Each consumer that has inbox rows, with how many are still to handle.
pub async fn consumers_seen(db: &DatabaseConnection) -> Result<Vec<ConsumerSeen>, DbErr> {
    let rows = if super::inbox_done::may_hold_done(db) {
        format!(
            "(SELECT consumer, status FROM {INBOX_TABLE} UNION ALL \
             SELECT consumer, status FROM {}) x",
            super::inbox_done::DONE_TABLE
        )
    } else {
        INBOX_TABLE.to_owned()
    };
    let sql = format!(
        "SELECT consumer, COUNT(CASE WHEN {} THEN 1 END) AS n \
         FROM {rows} GROUP BY consumer ORDER BY consumer",
        InboxStatus::in_list("", &InboxStatus::OPEN)
    );
    let rows = db.query_all_raw(Dialect::of(db).raw(sql)).await?;
    rows.iter()
        .map(|row| {
            Ok(ConsumerSeen {
                consumer: row.try_get("", "consumer")?,
                open: get_i64(row, "n")?,
            })
        })
        .collect()
}
