//! Backlog counts for the metrics: only unsent and unfinished rows, which the partial indexes
//! keep small however many rows are SENT or DONE.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};

use super::{
    Dialect, INBOX_TABLE, OUTBOX_TABLE, get_i64,
    status::{InboxStatus, OutboxStatus},
};

/// Unsent outbox rows of one status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxBacklog {
    /// The status.
    pub status: OutboxStatus,
    /// How many rows.
    pub count: i64,
    /// The oldest `created_at` among them.
    pub oldest: Option<DateTime<Utc>>,
}

/// Unfinished inbox rows of one consumer and status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxBacklog {
    /// The consumer.
    pub consumer: String,
    /// The status.
    pub status: InboxStatus,
    /// How many rows.
    pub count: i64,
}

/// Unsent outbox rows per status.
pub async fn outbox_backlog(db: &DatabaseConnection) -> Result<Vec<OutboxBacklog>, DbErr> {
    let dialect = Dialect::of(db);
    let sql = format!(
        "SELECT status, COUNT(*) AS n, MIN(created_at) AS oldest FROM {OUTBOX_TABLE} \
         WHERE {} GROUP BY status",
        dialect.unsent("")
    );
    let mut backlog = Vec::new();
    for row in db.query_all_raw(dialect.raw(sql)).await? {
        let Some(status) = OutboxStatus::parse(&row.try_get::<String>("", "status")?) else {
            continue;
        };
        backlog.push(OutboxBacklog {
            status,
            count: get_i64(&row, "n")?,
            oldest: dialect.get_opt_timestamp(&row, "oldest")?,
        });
    }
    Ok(backlog)
}

/// Unfinished inbox rows per consumer and status (a status the SDK does not write counts as
/// DEAD: it waits for an operator).
pub async fn inbox_backlog(db: &DatabaseConnection) -> Result<Vec<InboxBacklog>, DbErr> {
    let dialect = Dialect::of(db);
    let sql = format!(
        "SELECT consumer, status, COUNT(*) AS n FROM {INBOX_TABLE} WHERE {} \
         GROUP BY consumer, status",
        InboxStatus::in_list("", &InboxStatus::UNFINISHED)
    );
    let mut backlog = Vec::new();
    for row in db.query_all_raw(dialect.raw(sql)).await? {
        backlog.push(InboxBacklog {
            consumer: row.try_get("", "consumer")?,
            status: InboxStatus::parse(&row.try_get::<String>("", "status")?)
                .unwrap_or(InboxStatus::Dead),
            count: get_i64(&row, "n")?,
        });
    }
    Ok(backlog)
}
