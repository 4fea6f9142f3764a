//! `outbox_pause`: the consumers and destinations an operator paused (migration
//! `outbox_0015`). Every statement is bound; the admin functions run in the transaction that
//! writes their audit row.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr};

use super::{DbTime, Dialect, sql::Sql};
use crate::util::text::truncate;

/// The table.
pub const PAUSE_TABLE: &str = "outbox_pause";

/// One row of `outbox_pause`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PauseRow {
    /// `consumer` or `destination`.
    pub kind: String,
    /// The consumer's or the destination's name.
    pub name: String,
    /// When it was paused, by the database's clock.
    pub paused_at: DateTime<Utc>,
    /// Who paused it.
    pub paused_by: Option<String>,
    /// Why.
    pub reason: Option<String>,
}

/// Every pause, by kind and name.
pub async fn list<C: ConnectionTrait>(conn: &C) -> Result<Vec<PauseRow>, DbErr> {
    let dialect = Dialect::of(conn);
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "SELECT kind, name, paused_at, paused_by, reason FROM {PAUSE_TABLE} ORDER BY kind, name"
    ));
    let rows = conn.query_all_raw(sql.build()).await?;
    rows.iter()
        .map(|row| {
            Ok(PauseRow {
                kind: row.try_get("", "kind")?,
                name: row.try_get("", "name")?,
                paused_at: dialect.get_timestamp(row, "paused_at")?,
                paused_by: row.try_get("", "paused_by")?,
                reason: row.try_get("", "reason")?,
            })
        })
        .collect()
}

/// Whether `kind` `name` is paused, read in `txn` (locked where the dialect can, so that two
/// operators pausing at once do not both insert).
pub async fn find(
    txn: &DatabaseTransaction,
    kind: &str,
    name: &str,
) -> Result<Option<PauseRow>, DbErr> {
    let dialect = Dialect::of(txn);
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "SELECT kind, name, paused_at, paused_by, reason FROM {PAUSE_TABLE} WHERE kind = "
    ))
    .bind(kind.to_owned().into())
    .push(" AND name = ")
    .bind(name.to_owned().into())
    .push(dialect.lock_rows(false));
    let Some(row) = txn.query_one_raw(sql.build()).await? else {
        return Ok(None);
    };
    Ok(Some(PauseRow {
        kind: row.try_get("", "kind")?,
        name: row.try_get("", "name")?,
        paused_at: dialect.get_timestamp(&row, "paused_at")?,
        paused_by: row.try_get("", "paused_by")?,
        reason: row.try_get("", "reason")?,
    }))
}

/// Record the pause of `kind` `name` (the caller checked it is not paused yet).
pub async fn insert(
    txn: &DatabaseTransaction,
    kind: &str,
    name: &str,
    by: Option<&str>,
    reason: Option<&str>,
) -> Result<(), DbErr> {
    let mut sql = Sql::new(Dialect::of(txn));
    sql.push(&format!(
        "INSERT INTO {PAUSE_TABLE} (kind, name, paused_at, paused_by, reason) VALUES ("
    ))
    .bind(kind.to_owned().into())
    .push(", ")
    .bind(name.to_owned().into())
    .push(", ")
    .time(DbTime::NOW)
    .push(", ")
    .bind(by.map(|b| truncate(b, 255)).into())
    .push(", ")
    .bind(reason.map(str::to_owned).into())
    .push(")");
    txn.execute_raw(sql.build()).await?;
    Ok(())
}

/// Remove the pause of `kind` `name`; whether there was one.
pub async fn delete(txn: &DatabaseTransaction, kind: &str, name: &str) -> Result<bool, DbErr> {
    let mut sql = Sql::new(Dialect::of(txn));
    sql.push(&format!("DELETE FROM {PAUSE_TABLE} WHERE kind = "))
        .bind(kind.to_owned().into())
        .push(" AND name = ")
        .bind(name.to_owned().into());
    Ok(txn.execute_raw(sql.build()).await?.rows_affected() > 0)
}
