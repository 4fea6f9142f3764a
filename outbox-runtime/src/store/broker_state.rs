//! `outbox_relay`: what each running relay last saw of its broker (see
//! [`crate::admin::status`]). Every instant is written by the database's clock: the relay binds
//! only how long ago something happened, by its own monotonic clock.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Value};

use super::{DbTime, Dialect, RELAY_TABLE, get_i64, sql::Arg, sql::Sql};
use crate::util::text::truncate;

/// What a relay reports about its broker.
#[derive(Debug, Clone)]
pub struct BrokerReport<'a> {
    /// The relay's id.
    pub relay_id: &'a str,
    /// Its transport's name.
    pub transport: &'static str,
    /// The broker answers (the breaker is closed).
    pub available: bool,
    /// How long ago the broker last confirmed a publish or answered a health check.
    pub seen_ago: Option<Duration>,
    /// While unavailable: for how long.
    pub unavailable_for: Option<Duration>,
    /// Outages since the relay started.
    pub outages: u64,
    /// Events handed back without an attempt during the current outage.
    pub held_back: u64,
    /// Why the broker is unavailable, or the last reason it was.
    pub last_error: Option<String>,
    /// How long the row stays current without another report.
    pub expires_in: Duration,
}

/// `broker_state` while the broker answers.
pub const AVAILABLE: &str = "available";
/// `broker_state` while the relay's breaker is open.
pub const UNAVAILABLE: &str = "unavailable";

/// Record `report` as the relay's row: an update of the row, or an insert when it has none.
pub async fn record(db: &DatabaseConnection, report: &BrokerReport<'_>) -> Result<(), DbErr> {
    let dialect = Dialect::of(db);
    let relay_id = truncate(report.relay_id, 255);
    let state = if report.available {
        AVAILABLE
    } else {
        UNAVAILABLE
    };
    let seen = Arg::time_or_null(dialect, report.seen_ago.map(DbTime::before));
    let since = Arg::time_or_null(dialect, report.unavailable_for.map(DbTime::before));
    let outages = i64::try_from(report.outages).unwrap_or(i64::MAX);
    let held_back = i64::try_from(report.held_back).unwrap_or(i64::MAX);
    let error: Value = report
        .last_error
        .as_deref()
        .map(|e| truncate(e, 2000))
        .into();
    let expires = DbTime::after(report.expires_in);

    let mut sql = Sql::new(dialect);
    sql.push(&format!("UPDATE {RELAY_TABLE} SET transport = "))
        .bind(report.transport.into())
        .push(", broker_state = ")
        .bind(state.into())
        .push(", broker_seen_at = ")
        .arg(seen.clone())
        .push(", unavailable_since = ")
        .arg(since.clone())
        .push(", outages = ")
        .bind(outages.into())
        .push(", held_back = ")
        .bind(held_back.into())
        .push(", last_error = ")
        .bind(error.clone())
        .push(", heartbeat_at = ")
        .time(DbTime::NOW)
        .push(", expires_at = ")
        .time(expires)
        .push(" WHERE relay_id = ")
        .bind(relay_id.clone().into());
    if db.execute_raw(sql.build()).await?.rows_affected() == 1 {
        return Ok(());
    }
    // No row yet (or, on MySQL, a row the update left as it was: the insert then does nothing).
    let (insert, on_conflict) = dialect.insert_skipping("relay_id");
    let mut sql = Sql::new(dialect);
    sql.push(insert)
        .push(&format!(
            "{RELAY_TABLE} (relay_id, transport, broker_state, broker_seen_at, \
             unavailable_since, outages, held_back, last_error, started_at, heartbeat_at, \
             expires_at) VALUES "
        ))
        .bind_list([
            Arg::from(Value::from(relay_id)),
            Value::from(report.transport).into(),
            Value::from(state).into(),
            seen,
            since,
            Value::from(outages).into(),
            Value::from(held_back).into(),
            error.into(),
            DbTime::NOW.into(),
            DbTime::NOW.into(),
            expires.into(),
        ]);
    if let Some(on_conflict) = on_conflict {
        sql.push(&on_conflict);
    }
    db.execute_raw(sql.build()).await?;
    Ok(())
}

/// Remove the relay's row (it stopped).
pub async fn forget(db: &DatabaseConnection, relay_id: &str) -> Result<u64, DbErr> {
    let mut sql = Sql::new(Dialect::of(db));
    sql.push(&format!("DELETE FROM {RELAY_TABLE} WHERE relay_id = "))
        .bind(truncate(relay_id, 255).into());
    Ok(db.execute_raw(sql.build()).await?.rows_affected())
}

/// Remove the rows of relays that stopped without saying so more than `ago` ago.
pub async fn forget_expired(db: &DatabaseConnection, ago: Duration) -> Result<u64, DbErr> {
    let mut sql = Sql::new(Dialect::of(db));
    sql.push(&format!("DELETE FROM {RELAY_TABLE} WHERE expires_at < "))
        .time(DbTime::before(ago));
    Ok(db.execute_raw(sql.build()).await?.rows_affected())
}

/// One row of `outbox_relay`.
#[derive(Debug, Clone)]
pub struct RelayRow {
    /// The relay's id.
    pub relay_id: String,
    /// Its transport.
    pub transport: String,
    /// `available` or `unavailable`.
    pub broker_state: String,
    /// When the broker last confirmed a publish or answered a health check.
    pub broker_seen_at: Option<DateTime<Utc>>,
    /// When the current outage began.
    pub unavailable_since: Option<DateTime<Utc>>,
    /// Outages since the relay started.
    pub outages: i64,
    /// Events handed back without an attempt during the current outage.
    pub held_back: i64,
    /// Why the broker is (or last was) unavailable.
    pub last_error: Option<String>,
    /// When the relay started.
    pub started_at: DateTime<Utc>,
    /// Its last report.
    pub heartbeat_at: DateTime<Utc>,
    /// When the row stops being current without another report.
    pub expires_at: DateTime<Utc>,
}

/// Every relay's row, by relay id.
pub async fn relays(db: &DatabaseConnection) -> Result<Vec<RelayRow>, DbErr> {
    let dialect = Dialect::of(db);
    let sql = format!(
        "SELECT relay_id, transport, broker_state, broker_seen_at, unavailable_since, outages, \
         held_back, last_error, started_at, heartbeat_at, expires_at FROM {RELAY_TABLE} \
         ORDER BY relay_id"
    );
    let rows = db.query_all_raw(dialect.raw(sql)).await?;
    rows.iter()
        .map(|row| {
            Ok(RelayRow {
                relay_id: row.try_get("", "relay_id")?,
                transport: row.try_get("", "transport")?,
                broker_state: row.try_get("", "broker_state")?,
                broker_seen_at: dialect.get_opt_timestamp(row, "broker_seen_at")?,
                unavailable_since: dialect.get_opt_timestamp(row, "unavailable_since")?,
                outages: get_i64(row, "outages")?,
                held_back: get_i64(row, "held_back")?,
                last_error: row.try_get("", "last_error")?,
                started_at: dialect.get_timestamp(row, "started_at")?,
                heartbeat_at: dialect.get_timestamp(row, "heartbeat_at")?,
                expires_at: dialect.get_timestamp(row, "expires_at")?,
            })
        })
        .collect()
}
