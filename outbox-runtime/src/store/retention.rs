//! Retention's bounded deletes: at most `limit` finished rows older than a cutoff per call, each
//! in one short transaction, so a purge never holds many locks or a long transaction.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Statement, Value};

use super::{
    Dialect, INBOX_TABLE, OUTBOX_TABLE,
    sql::Sql,
    status::{InboxStatus, OutboxStatus, in_literals},
    tx::begin_admin,
};

/// One purge: which rows, by which timestamp column, before which instant.
#[derive(Debug)]
pub struct Purge {
    /// The connection's dialect.
    pub dialect: Dialect,
    /// The table.
    pub table: &'static str,
    /// The timestamp compared with the cutoff.
    pub column: &'static str,
    /// The cutoff, as the dialect binds it.
    pub cutoff: Value,
}

/// The default purge statement (see `Backend::purge_statement`): `DELETE … WHERE id IN (SELECT
/// id … LIMIT n)`, the status predicate written as the partial index's own so the planner uses
/// it.
pub(crate) fn purge_by_subquery(
    purge: &Purge,
    statuses: &[&'static str],
    limit: usize,
    lock: &str,
) -> Statement {
    let mut sql = Sql::new(purge.dialect);
    sql.push(&format!(
        "DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE {} AND {} < ",
        in_literals("", statuses),
        purge.column,
        table = purge.table,
    ))
    .bind(purge.cutoff.clone())
    .push(&format!(" LIMIT {limit}{lock})"));
    sql.build()
}

/// Delete at most `limit` SENT outbox rows sent before `cutoff`, in one short transaction.
pub async fn purge_sent(
    db: &DatabaseConnection,
    cutoff: DateTime<Utc>,
    limit: usize,
) -> Result<u64, DbErr> {
    purge_batch(
        db,
        OUTBOX_TABLE,
        &[OutboxStatus::Sent.literal()],
        "sent_at",
        cutoff,
        limit,
    )
    .await
}

/// Delete at most `limit` DONE or IGNORED inbox rows processed before `cutoff`, in one short
/// transaction.
pub async fn purge_finished(
    db: &DatabaseConnection,
    cutoff: DateTime<Utc>,
    limit: usize,
) -> Result<u64, DbErr> {
    let finished = InboxStatus::FINISHED.map(InboxStatus::literal);
    purge_batch(db, INBOX_TABLE, &finished, "processed_at", cutoff, limit).await
}

async fn purge_batch(
    db: &DatabaseConnection,
    table: &'static str,
    statuses: &[&'static str],
    column: &'static str,
    cutoff: DateTime<Utc>,
    limit: usize,
) -> Result<u64, DbErr> {
    let dialect = Dialect::of(db);
    let limit = limit.max(1);
    let purge = Purge {
        dialect,
        table,
        column,
        cutoff: dialect.timestamp(cutoff),
    };
    let txn = begin_admin(db).await?;
    let mut deleted = 0;
    if dialect.purge_by_status() {
        for status in statuses {
            let remaining = limit - deleted as usize;
            let statement =
                dialect.purge_statement(&purge, std::slice::from_ref(status), remaining);
            deleted += txn.execute_raw(statement).await?.rows_affected();
            if deleted as usize >= limit {
                break;
            }
        }
    } else {
        let statement = dialect.purge_statement(&purge, statuses, limit);
        deleted = txn.execute_raw(statement).await?.rows_affected();
    }
    txn.commit().await?;
    Ok(deleted)
}
