//! The error history, `outbox_failure`: one row per failed attempt of an outbox event or an
//! inbox message, appended in the transaction that records the failure, so the history and the
//! row's `last_error` never disagree. Read for an operator (`admin::dead_letter`); purged by retention
//! ([`purge`]) once a row is finished and its history older than the window.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Value};

use super::{
    DbTime, Dialect, INBOX_TABLE, OUTBOX_TABLE, get_i64,
    schema::{MAX_KEY_CHARS, MAX_MESSAGE_ID_CHARS},
    sql::Sql,
    status::WorkStatus,
    tx::begin_admin,
};
use crate::operations::{FailureRecord, Source};
use crate::util::text::truncate;

/// The error history table.
pub const FAILURE_TABLE: &str = "outbox_failure";

/// Entries a row's error history returns at most (`admin::dead_letter`): the newest ones.
pub const HISTORY_LIMIT: u64 = 100;

fn queue(source: Source) -> (&'static str, &'static str) {
    match source {
        Source::Outbox => ("'outbox'", OUTBOX_TABLE),
        Source::Inbox => ("'inbox'", INBOX_TABLE),
    }
}

/// The rows whose failure just written is to be appended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Failed<'a> {
    /// Rows by id.
    Ids(&'a [i64]),
    /// One inbox message by its key (`origin` empty for the SDK's own messages).
    Message {
        consumer: &'a str,
        origin: &'a str,
        message_id: &'a str,
    },
}

/// Append each row's failure as it now stands (attempts, RETRY or DEAD, `last_error`) to the
/// history, by the database's clock. Run it in the transaction that wrote the failure, after
/// the write; rows in another state are not appended.
pub(crate) async fn append<C: ConnectionTrait>(
    conn: &C,
    source: Source,
    failed: Failed<'_>,
) -> Result<(), DbErr> {
    let (literal, table) = queue(source);
    // The statement up to the rows it selects.
    let head = || {
        let mut sql = Sql::new(Dialect::of(conn));
        sql.push(&format!(
            "INSERT INTO {FAILURE_TABLE} (queue, row_id, attempt, status, error, failed_at) \
             SELECT {literal}, id, attempts, status, last_error, "
        ))
        .time(DbTime::NOW)
        .push(&format!(
            " FROM {table} WHERE last_error IS NOT NULL AND {}",
            WorkStatus::in_list("", &[WorkStatus::Retry, WorkStatus::Dead])
        ));
        sql
    };
    match failed {
        Failed::Ids(ids) => {
            for chunk in ids.chunks(500) {
                let mut sql = head();
                sql.push(" AND id IN ")
                    .bind_list(chunk.iter().map(|id| Value::from(*id)));
                conn.execute_raw(sql.build()).await?;
            }
        }
        Failed::Message {
            consumer,
            origin,
            message_id,
        } => {
            let mut sql = head();
            sql.push(" AND consumer = ")
                .bind(consumer.to_owned().into())
                .push(" AND origin = ")
                .bind(truncate(origin, MAX_KEY_CHARS).into())
                .push(" AND message_id = ")
                .bind(truncate(message_id, MAX_MESSAGE_ID_CHARS).into());
            conn.execute_raw(sql.build()).await?;
        }
    }
    Ok(())
}

/// A row's newest [`HISTORY_LIMIT`] failures, oldest first.
pub(crate) async fn history(
    db: &DatabaseConnection,
    source: Source,
    row_id: i64,
) -> Result<Vec<FailureRecord>, DbErr> {
    let (literal, _) = queue(source);
    let dialect = Dialect::of(db);
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "SELECT id, attempt, status, error, failed_at FROM {FAILURE_TABLE} WHERE queue = \
         {literal} AND row_id = "
    ))
    .bind(row_id.into())
    .push(&format!(" ORDER BY id DESC LIMIT {HISTORY_LIMIT}"));
    let mut records = db
        .query_all_raw(sql.build())
        .await?
        .iter()
        .map(|row| {
            Ok(FailureRecord {
                attempt: get_i64(row, "attempt")?,
                status: row.try_get("", "status")?,
                error: row.try_get("", "error")?,
                at: dialect.get_timestamp(row, "failed_at")?,
            })
        })
        .collect::<Result<Vec<_>, DbErr>>()?;
    records.reverse();
    Ok(records)
}

/// Delete at most `limit` history rows of `source` older than `cutoff` whose row is gone or
/// finished (SENT; DONE or IGNORED), in one short transaction. A row still unfinished or DEAD
/// keeps its whole history.
pub async fn purge(
    db: &DatabaseConnection,
    source: Source,
    cutoff: DateTime<Utc>,
    limit: usize,
) -> Result<u64, DbErr> {
    let (literal, table) = queue(source);
    let dialect = Dialect::of(db);
    let mut sql = Sql::new(dialect);
    // The ids go through a derived table: MySQL refuses a LIMIT in an IN subquery, and a
    // subquery on the table a DELETE changes.
    sql.push(&format!(
        "DELETE FROM {FAILURE_TABLE} WHERE id IN (SELECT id FROM (SELECT f.id FROM \
         {FAILURE_TABLE} f WHERE f.queue = {literal} AND f.failed_at < "
    ))
    .bind(dialect.timestamp(cutoff))
    .push(&format!(
        " AND NOT EXISTS (SELECT 1 FROM {table} t WHERE t.id = f.row_id AND {}) \
         ORDER BY f.id LIMIT {}) doomed)",
        WorkStatus::in_list("t.", &WorkStatus::ALL),
        limit.max(1)
    ));
    let txn = begin_admin(db).await?;
    let deleted = txn.execute_raw(sql.build()).await?.rows_affected();
    txn.commit().await?;
    Ok(deleted)
}
