//! Delayed events, `outbox_scheduled`: written at commit beside `outbox_event`, and moved into it
//! by a relay once due ([`promote`]) as new rows, as if committed then. Claims never read this
//! table, so however many events wait here, a claim costs what it did; due events are found by
//! the `(due_at, id)` index.

use std::{borrow::Cow, time::Duration};

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Value};

use super::{
    DbTime, Dialect, get_i64,
    outbox::{
        INSERT_COLUMNS, PendingEvent, SkippedEvent, first_of_each_key, insert_events,
        push_event_values, skipped_by_key,
    },
    sql::{Arg, Sql},
    tx::begin_admin,
};

/// The table of delayed events.
pub const SCHEDULED_TABLE: &str = "outbox_scheduled";

/// When a delayed event becomes due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// At this instant.
    At(DateTime<Utc>),
    /// This long after the commit, by the database's clock.
    After(Duration),
}

impl Due {
    fn arg(self, dialect: Dialect) -> Arg {
        match self {
            Due::At(at) => Arg::Value(dialect.timestamp(at)),
            Due::After(delay) => Arg::Time(DbTime::after(delay)),
        }
    }
}

/// An event buffered by `enqueue_at` / `enqueue_after`.
#[derive(Debug, Clone)]
pub(crate) struct ScheduledEvent {
    pub(crate) event: PendingEvent,
    pub(crate) due: Due,
}

/// What writing delayed events did.
#[derive(Debug, Default)]
pub(crate) struct Scheduled {
    pub(crate) written: usize,
    pub(crate) skipped: Vec<SkippedEvent>,
}

/// Rows per INSERT.
const CHUNK: usize = 200;

/// Write delayed events at commit, in the committing transaction. One with the
/// `(event_type, dedup_key)` of a delayed event already waiting (or earlier in the buffer) is
/// skipped and reported.
pub(crate) async fn insert<C: ConnectionTrait>(
    conn: &C,
    events: &[ScheduledEvent],
) -> Result<Scheduled, DbErr> {
    let dialect = Dialect::of(conn);
    let (to_write, skipped) = first_of_each_key(events, |scheduled| &scheduled.event);
    let mut outcome = Scheduled {
        skipped,
        ..Scheduled::default()
    };
    for chunk in to_write.chunks(CHUNK) {
        let mut sql = Sql::new(dialect);
        sql.push(&format!(
            "INSERT INTO {SCHEDULED_TABLE} ({}, due_at, created_at) VALUES ",
            INSERT_COLUMNS.join(", ")
        ));
        for (i, (_, ScheduledEvent { event, due })) in chunk.iter().enumerate() {
            if i > 0 {
                sql.push(", ");
            }
            sql.push("(");
            push_event_values(&mut sql, event);
            sql.push(", ")
                .arg(due.arg(dialect))
                .push(", ")
                .time(DbTime::NOW)
                .push(")");
        }
        let keyed = chunk.iter().any(|(_, s)| s.event.dedup_key.is_some());
        if let Some(clause) = dialect.outbox_insert_conflict(keyed) {
            sql.push(" ").push(clause);
        }
        conn.execute_raw(sql.build()).await?;
    }
    // Which keyed events met a key already waiting?
    let keyed: Vec<&PendingEvent> = to_write
        .iter()
        .map(|(_, s)| &s.event)
        .filter(|e| e.dedup_key.is_some())
        .collect();
    outcome
        .skipped
        .extend(skipped_by_key(conn, SCHEDULED_TABLE, keyed, 500).await?);
    outcome.written = events.len() - outcome.skipped.len();
    Ok(outcome)
}

/// What [`promote`] moved.
#[derive(Debug, Default)]
pub struct Promoted {
    /// Events now in `outbox_event`, PENDING.
    pub moved: usize,
    /// Events dropped because their `(event_type, dedup_key)` was taken: by an unsent event in
    /// `outbox_event`, or within the key rotation's period (`outbox_key`).
    pub skipped: Vec<SkippedEvent>,
}

/// Move at most `limit` due delayed events into `outbox_event`, earliest due first, in one
/// transaction: each becomes a new PENDING row, as if committed now, and leaves
/// `outbox_scheduled`. Rows another relay is moving are skipped (`SKIP LOCKED`).
pub async fn promote(db: &DatabaseConnection, limit: usize) -> Result<Promoted, DbErr> {
    let txn = begin_admin(db).await?;
    let dialect = Dialect::of(&txn);
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "SELECT id, {} FROM {SCHEDULED_TABLE} WHERE due_at <= ",
        INSERT_COLUMNS.join(", ")
    ))
    .time(DbTime::NOW)
    .push(&format!(" ORDER BY due_at, id LIMIT {}", limit.max(1)))
    .push(dialect.lock_rows(true));
    let rows = txn.query_all_raw(sql.build()).await?;
    if rows.is_empty() {
        txn.commit().await?;
        return Ok(Promoted::default());
    }
    let mut ids = Vec::with_capacity(rows.len());
    let mut events = Vec::with_capacity(rows.len());
    for row in &rows {
        ids.push(row.try_get::<i64>("", "id")?);
        events.push(PendingEvent {
            event_id: dialect.get_uuid(row, "event_id")?,
            source: row.try_get("", "source")?,
            event_type: Cow::Owned(row.try_get("", "event_type")?),
            schema_version: u32::try_from(get_i64(row, "schema_version")?).unwrap_or(0),
            aggregate_type: Cow::Owned(row.try_get("", "aggregate_type")?),
            aggregate_id: row.try_get("", "aggregate_id")?,
            aggregate_version: super::get_opt_i64(row, "aggregate_version")?,
            dedup_key: row.try_get("", "dedup_key")?,
            payload: dialect.get_json_text(row, "payload")?,
            headers: dialect.get_json_text(row, "headers")?,
        });
    }
    let outcome = insert_events(&txn, &events, 500, None).await?;
    let mut sql = Sql::new(dialect);
    sql.push(&format!("DELETE FROM {SCHEDULED_TABLE} WHERE id IN "))
        .bind_list(ids.iter().map(|id| Value::from(*id)));
    txn.execute_raw(sql.build()).await?;
    txn.commit().await?;
    Ok(Promoted {
        moved: outcome.written,
        skipped: outcome.skipped,
    })
}

/// How many delayed events wait, and when the first is due.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Waiting {
    /// Delayed events not yet due or not yet moved.
    pub count: i64,
    /// The earliest due time.
    pub next_due: Option<DateTime<Utc>>,
}

/// How long until the earliest delayed event is due, by the database's clock (zero when one is
/// due already); `None` when none waits. One statement: what an idle relay asks before it sleeps
/// longer than its poll interval, so that its sleep ends by then.
pub async fn next_due_in(db: &DatabaseConnection) -> Result<Option<Duration>, DbErr> {
    let dialect = Dialect::of(db);
    let mut sql = Sql::new(dialect);
    sql.push("SELECT MIN(due_at) AS next_due, ")
        .time(DbTime::NOW)
        .push(&format!(" AS now FROM {SCHEDULED_TABLE}"));
    let Some(row) = db.query_one_raw(sql.build()).await? else {
        return Ok(None);
    };
    let Some(due) = dialect.get_opt_timestamp(&row, "next_due")? else {
        return Ok(None);
    };
    let now = dialect.get_timestamp(&row, "now")?;
    Ok(Some((due - now).to_std().unwrap_or(Duration::ZERO)))
}

/// Count the delayed events (for `status`).
pub async fn waiting(db: &DatabaseConnection) -> Result<Waiting, DbErr> {
    let dialect = Dialect::of(db);
    let sql = format!("SELECT COUNT(*) AS n, MIN(due_at) AS next_due FROM {SCHEDULED_TABLE}");
    let Some(row) = db.query_one_raw(dialect.raw(sql)).await? else {
        return Ok(Waiting::default());
    };
    Ok(Waiting {
        count: get_i64(&row, "n")?,
        next_due: dialect.get_opt_timestamp(&row, "next_due")?,
    })
}
