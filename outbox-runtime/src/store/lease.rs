//! Named leases (`outbox_lease`): at most one holder at a time, for work that one instance of a
//! service runs at a time (the retention janitor).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};

use super::{DbTime, Dialect, LEASE_TABLE, sql::Sql};
use crate::util::text::truncate;

/// Take or renew the lease `name` for `holder` for `lease` from now: succeeds when nobody holds
/// it, its holder's lease expired, or `holder` already holds it. "Now" and "expired" are the
/// database's clock's.
pub async fn acquire_lease(
    db: &DatabaseConnection,
    name: &str,
    holder: &str,
    lease: Duration,
) -> Result<bool, DbErr> {
    let until = DbTime::after(lease);
    let dialect = Dialect::of(db);
    let holder = truncate(holder, 255);
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "UPDATE {LEASE_TABLE} SET acquired_at = CASE WHEN holder = "
    ))
    .bind(holder.clone().into())
    .push(" THEN acquired_at ELSE ")
    .time(DbTime::NOW)
    .push(" END, holder = ")
    .bind(holder.clone().into())
    .push(", locked_until = ")
    .time(until)
    .push(" WHERE name = ")
    .bind(name.to_owned().into())
    .push(" AND (holder = ")
    .bind(holder.clone().into())
    .push(" OR locked_until < ")
    .time(DbTime::NOW)
    .push(")");
    if db.execute_raw(sql.build()).await?.rows_affected() == 1 {
        return Ok(true);
    }
    // No row yet (or held by someone else: then the insert conflicts and does nothing).
    let (insert, on_conflict) = dialect.insert_skipping("name");
    let mut sql = Sql::new(dialect);
    sql.push(insert)
        .push(&format!(
            "{LEASE_TABLE} (name, holder, acquired_at, locked_until) VALUES ("
        ))
        .bind(name.to_owned().into())
        .push(", ")
        .bind(holder.into())
        .push(", ")
        .time(DbTime::NOW)
        .push(", ")
        .time(until)
        .push(")");
    if let Some(on_conflict) = on_conflict {
        sql.push(&on_conflict);
    }
    Ok(db.execute_raw(sql.build()).await?.rows_affected() == 1)
}

/// Give the lease `name` up if `holder` holds it: it expired a second ago, by the database's
/// clock.
pub async fn release_lease(
    db: &DatabaseConnection,
    name: &str,
    holder: &str,
) -> Result<bool, DbErr> {
    let dialect = Dialect::of(db);
    let mut sql = Sql::new(dialect);
    sql.push(&format!("UPDATE {LEASE_TABLE} SET locked_until = "))
        .time(DbTime::before(Duration::from_secs(1)))
        .push(" WHERE name = ")
        .bind(name.to_owned().into())
        .push(" AND holder = ")
        .bind(truncate(holder, 255).into());
    Ok(db.execute_raw(sql.build()).await?.rows_affected() == 1)
}

/// Who holds a lease, until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseHolder {
    /// The holder.
    pub holder: String,
    /// When its lease ends.
    pub until: DateTime<Utc>,
}

/// Who holds the lease `name`, until when.
pub async fn lease_holder(
    db: &DatabaseConnection,
    name: &str,
) -> Result<Option<LeaseHolder>, DbErr> {
    let dialect = Dialect::of(db);
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "SELECT holder, locked_until FROM {LEASE_TABLE} WHERE name = "
    ))
    .bind(name.to_owned().into());
    match db.query_one_raw(sql.build()).await? {
        None => Ok(None),
        Some(row) => Ok(Some(LeaseHolder {
            holder: row.try_get("", "holder")?,
            until: dialect.get_timestamp(&row, "locked_until")?,
        })),
    }
}
