//! What the test kit (`crate::testing`) reads and moves: the events and messages recorded since
//! a mark, what is still moving, and due times brought forward. Test-sized reads: no statement
//! here runs on a production path.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{
    AccessMode, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr,
    IsolationLevel, QueryResult, TransactionTrait,
};

use super::{
    DbTime, Dialect, INBOX_TABLE, OUTBOX_TABLE, get_i64, get_opt_i64,
    inbox_done::DONE_TABLE,
    scheduled::SCHEDULED_TABLE,
    sent::SENT_TABLE,
    sql::Sql,
    status::{InboxStatus, OutboxStatus},
};

/// A read transaction that sees one moment of `db`: reads that span tables or states (an
/// event moving from `outbox_event` to `outbox_sent`, a handler's inbox row and the events it
/// commits) see each row once and every cascade's next step, never a row between statements.
/// REPEATABLE READ on PostgreSQL and MySQL/MariaDB; on SQLite a deferred transaction reads one
/// snapshot already (in WAL mode; a rollback journal holds writers off while it reads).
pub async fn snapshot(db: &DatabaseConnection) -> Result<DatabaseTransaction, DbErr> {
    match db.get_database_backend() {
        DbBackend::Sqlite => db.begin().await,
        _ => {
            db.begin_with_config(
                Some(IsolationLevel::RepeatableRead),
                Some(AccessMode::ReadOnly),
            )
            .await
        }
    }
}

/// The highest ids of the SDK's tables at one moment: rows above them came later.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KitMark {
    /// `outbox_event` and `outbox_sent` (one sequence).
    pub outbox: i64,
    /// `outbox_scheduled`.
    pub scheduled: i64,
    /// `inbox_event` and `inbox_done` (one sequence).
    pub inbox: i64,
}

/// Whether `inbox_done` exists on this database (PostgreSQL from `outbox_0014`).
async fn has_done_table<C: ConnectionTrait>(conn: &C) -> Result<bool, DbErr> {
    Ok(Dialect::of(conn).rotates_inbox() && super::inbox_done::rotating(conn).await?.is_some())
}

async fn max_id<C: ConnectionTrait>(conn: &C, table: &str) -> Result<i64, DbErr> {
    let dialect = Dialect::of(conn);
    let sql = format!("SELECT COALESCE(MAX(id), 0) AS m FROM {table}");
    match conn.query_one_raw(dialect.raw(sql)).await? {
        Some(row) => get_i64(&row, "m"),
        None => Ok(0),
    }
}

/// The mark of this moment.
pub async fn mark<C: ConnectionTrait>(conn: &C) -> Result<KitMark, DbErr> {
    let mut inbox = max_id(conn, INBOX_TABLE).await?;
    if has_done_table(conn).await? {
        inbox = inbox.max(max_id(conn, DONE_TABLE).await?);
    }
    Ok(KitMark {
        outbox: max_id(conn, OUTBOX_TABLE)
            .await?
            .max(max_id(conn, SENT_TABLE).await?),
        scheduled: max_id(conn, SCHEDULED_TABLE).await?,
        inbox,
    })
}

/// An event row, wherever it is (unsent, sent or still scheduled).
#[derive(Debug, Clone)]
pub struct KitEventRow {
    /// Its id in `outbox_event`/`outbox_sent`, or in `outbox_scheduled` while scheduled.
    pub id: i64,
    /// The event's id.
    pub event_id: uuid::Uuid,
    /// Its type.
    pub event_type: String,
    /// Its schema version.
    pub schema_version: i64,
    /// Its aggregate's type.
    pub aggregate_type: String,
    /// Its aggregate's id.
    pub aggregate_id: String,
    /// Its aggregate's version, when it has one.
    pub aggregate_version: Option<i64>,
    /// Its producer-side dedup key.
    pub dedup_key: Option<String>,
    /// The payload, JSON text.
    pub payload: String,
    /// The headers, JSON text.
    pub headers: String,
    /// `PENDING`, `PROCESSING`, `RETRY`, `DEAD`, `SENT`, or `SCHEDULED`.
    pub status: String,
    /// Publish attempts so far.
    pub attempts: i64,
    /// The last publish error.
    pub last_error: Option<String>,
    /// When it is due: a retry's `next_attempt_at`, a scheduled event's `due_at`.
    pub due_at: Option<DateTime<Utc>>,
}

const EVENT_COLUMNS: &str = "id, event_id, event_type, schema_version, aggregate_type, \
     aggregate_id, aggregate_version, dedup_key, payload, headers";

fn event_row(
    dialect: Dialect,
    row: &QueryResult,
    status: Option<&str>,
) -> Result<KitEventRow, DbErr> {
    let status = match status {
        Some(s) => s.to_owned(),
        None => row.try_get("", "status")?,
    };
    let unsent = status != OutboxStatus::Sent.as_str() && status != "SCHEDULED";
    Ok(KitEventRow {
        id: get_i64(row, "id")?,
        event_id: dialect.get_uuid(row, "event_id")?,
        event_type: row.try_get("", "event_type")?,
        schema_version: get_i64(row, "schema_version")?,
        aggregate_type: row.try_get("", "aggregate_type")?,
        aggregate_id: row.try_get("", "aggregate_id")?,
        aggregate_version: get_opt_i64(row, "aggregate_version")?,
        dedup_key: row.try_get("", "dedup_key")?,
        payload: dialect.get_json_text(row, "payload")?,
        headers: dialect.get_json_text(row, "headers")?,
        attempts: if status == "SCHEDULED" {
            0
        } else {
            get_i64(row, "attempts")?
        },
        last_error: if unsent {
            row.try_get("", "last_error")?
        } else {
            None
        },
        due_at: match status.as_str() {
            "SCHEDULED" => dialect.get_opt_timestamp(row, "due_at")?,
            s if s == OutboxStatus::Retry.as_str() => {
                dialect.get_opt_timestamp(row, "next_attempt_at")?
            }
            _ => None,
        },
        status,
    })
}

/// Every event above `since`, in id order: unsent, sent, then still scheduled; read from one
/// [`snapshot`].
pub async fn events_since(
    db: &DatabaseConnection,
    since: &KitMark,
) -> Result<Vec<KitEventRow>, DbErr> {
    let txn = snapshot(db).await?;
    let events = events_since_in(&txn, since).await?;
    txn.commit().await?;
    Ok(events)
}

/// [`events_since`], read through `conn` (a snapshot the caller holds).
pub async fn events_since_in<C: ConnectionTrait>(
    conn: &C,
    since: &KitMark,
) -> Result<Vec<KitEventRow>, DbErr> {
    let dialect = Dialect::of(conn);
    let mut events = Vec::new();
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "SELECT {EVENT_COLUMNS}, status, attempts, last_error, next_attempt_at \
         FROM {OUTBOX_TABLE} WHERE id > "
    ))
    .bind(since.outbox.into());
    for row in conn.query_all_raw(sql.build()).await? {
        events.push(event_row(dialect, &row, None)?);
    }
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "SELECT {EVENT_COLUMNS}, attempts FROM {SENT_TABLE} WHERE id > "
    ))
    .bind(since.outbox.into());
    for row in conn.query_all_raw(sql.build()).await? {
        events.push(event_row(dialect, &row, Some(OutboxStatus::Sent.as_str()))?);
    }
    events.sort_by_key(|e| e.id);
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "SELECT {EVENT_COLUMNS}, due_at FROM {SCHEDULED_TABLE} WHERE id > "
    ))
    .bind(since.scheduled.into())
    .push(" ORDER BY id");
    for row in conn.query_all_raw(sql.build()).await? {
        events.push(event_row(dialect, &row, Some("SCHEDULED"))?);
    }
    Ok(events)
}

/// An inbox row, wherever it is (`inbox_event`, or `inbox_done` once handled on a rotating
/// inbox).
#[derive(Debug, Clone)]
pub struct KitMessageRow {
    /// Its id (one sequence for both tables).
    pub id: i64,
    /// The consumer it is for.
    pub consumer: String,
    /// The message's id (an SDK event's id, or the sender's).
    pub message_id: String,
    /// Its type.
    pub event_type: String,
    /// Who sent it.
    pub source: String,
    /// Its aggregate's id, when it has one.
    pub aggregate_id: Option<String>,
    /// `PENDING`, `PROCESSING`, `DONE`, `RETRY`, `DEAD` or `IGNORED`.
    pub status: String,
    /// Handler attempts so far.
    pub attempts: i64,
    /// The last handler error.
    pub last_error: Option<String>,
    /// When a retry is due.
    pub due_at: Option<DateTime<Utc>>,
    /// The message as received.
    pub payload: Vec<u8>,
}

const MESSAGE_COLUMNS: &str =
    "id, consumer, message_id, event_type, source, aggregate_id, attempts, payload";

fn message_row(dialect: Dialect, row: &QueryResult, done: bool) -> Result<KitMessageRow, DbErr> {
    let status: String = if done {
        InboxStatus::Done.as_str().to_owned()
    } else {
        row.try_get("", "status")?
    };
    Ok(KitMessageRow {
        id: get_i64(row, "id")?,
        consumer: row.try_get("", "consumer")?,
        message_id: row.try_get("", "message_id")?,
        // An undecodable delivery is kept without a type or a source.
        event_type: row
            .try_get::<Option<String>>("", "event_type")?
            .unwrap_or_default(),
        source: row
            .try_get::<Option<String>>("", "source")?
            .unwrap_or_default(),
        aggregate_id: row.try_get("", "aggregate_id")?,
        attempts: get_i64(row, "attempts")?,
        last_error: if done {
            None
        } else {
            row.try_get("", "last_error")?
        },
        due_at: if status == InboxStatus::Retry.as_str() {
            dialect.get_opt_timestamp(row, "next_attempt_at")?
        } else {
            None
        },
        payload: row.try_get("", "payload")?,
        status,
    })
}

/// Every inbox row above `since`, in id order, only `consumer`'s when given; read from one
/// [`snapshot`] (a row moving from `inbox_event` to `inbox_done` is seen once).
pub async fn messages_since(
    db: &DatabaseConnection,
    since: &KitMark,
    consumer: Option<&str>,
) -> Result<Vec<KitMessageRow>, DbErr> {
    let txn = snapshot(db).await?;
    let messages = messages_since_in(&txn, since, consumer).await?;
    txn.commit().await?;
    Ok(messages)
}

/// [`messages_since`], read through `conn` (a snapshot the caller holds).
pub async fn messages_since_in<C: ConnectionTrait>(
    conn: &C,
    since: &KitMark,
    consumer: Option<&str>,
) -> Result<Vec<KitMessageRow>, DbErr> {
    let dialect = Dialect::of(conn);
    let mut messages = Vec::new();
    let tables: &[(&str, bool)] = if has_done_table(conn).await? {
        &[(INBOX_TABLE, false), (DONE_TABLE, true)]
    } else {
        &[(INBOX_TABLE, false)]
    };
    for (table, done) in tables {
        let mut sql = Sql::new(dialect);
        sql.push(&format!("SELECT {MESSAGE_COLUMNS}"));
        if !done {
            sql.push(", status, last_error, next_attempt_at");
        }
        sql.push(&format!(" FROM {table} WHERE id > "))
            .bind(since.inbox.into());
        if let Some(consumer) = consumer {
            sql.push(" AND consumer = ")
                .bind(consumer.to_owned().into());
        }
        for row in conn.query_all_raw(sql.build()).await? {
            messages.push(message_row(dialect, &row, *done)?);
        }
    }
    messages.sort_by_key(|m| m.id);
    Ok(messages)
}

/// What is still moving: events not yet sent (pending, claimed, or a retry that is due),
/// scheduled events that are due, and inbox rows not yet settled (pending, claimed, or a retry
/// that is due). Rows of any age: a test's database holds its own rows.
#[derive(Debug, Clone, Default)]
pub struct KitMoving {
    /// Unsent events to be published now.
    pub events: Vec<KitEventRow>,
    /// Inbox rows to be handled now.
    pub messages: Vec<KitMessageRow>,
}

/// The rows still moving (see [`KitMoving`]).
pub async fn moving<C: ConnectionTrait>(conn: &C) -> Result<KitMoving, DbErr> {
    let dialect = Dialect::of(conn);
    let mut moving = KitMoving::default();
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "SELECT {EVENT_COLUMNS}, status, attempts, last_error, next_attempt_at \
         FROM {OUTBOX_TABLE} WHERE {} OR ({} AND next_attempt_at <= ",
        OutboxStatus::in_list("", &[OutboxStatus::Pending, OutboxStatus::Processing]),
        OutboxStatus::in_list("", &[OutboxStatus::Retry]),
    ))
    .time(DbTime::NOW)
    .push(") ORDER BY id");
    for row in conn.query_all_raw(sql.build()).await? {
        moving.events.push(event_row(dialect, &row, None)?);
    }
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "SELECT {EVENT_COLUMNS}, due_at FROM {SCHEDULED_TABLE} WHERE due_at <= "
    ))
    .time(DbTime::NOW)
    .push(" ORDER BY id");
    for row in conn.query_all_raw(sql.build()).await? {
        moving
            .events
            .push(event_row(dialect, &row, Some("SCHEDULED"))?);
    }
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "SELECT {MESSAGE_COLUMNS}, status, last_error, next_attempt_at FROM {INBOX_TABLE} \
         WHERE {} OR ({} AND next_attempt_at <= ",
        InboxStatus::in_list("", &[InboxStatus::Pending, InboxStatus::Processing]),
        InboxStatus::in_list("", &[InboxStatus::Retry]),
    ))
    .time(DbTime::NOW)
    .push(") ORDER BY id");
    for row in conn.query_all_raw(sql.build()).await? {
        moving.messages.push(message_row(dialect, &row, false)?);
    }
    Ok(moving)
}

/// How many retries and delayed events [`bring_forward`] or [`shift_due`] made due.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KitBroughtForward {
    /// Outbox retries (`outbox_event`, `RETRY`).
    pub event_retries: u64,
    /// Delayed events (`outbox_scheduled`).
    pub scheduled: u64,
    /// Handler retries (`inbox_event`, `RETRY`).
    pub message_retries: u64,
}

/// The due times the kit moves: `(table, column, status that must hold)`.
fn due_columns() -> [(&'static str, &'static str, Option<String>); 3] {
    [
        (
            OUTBOX_TABLE,
            "next_attempt_at",
            Some(OutboxStatus::in_list("", &[OutboxStatus::Retry])),
        ),
        (SCHEDULED_TABLE, "due_at", None),
        (
            INBOX_TABLE,
            "next_attempt_at",
            Some(InboxStatus::in_list("", &[InboxStatus::Retry])),
        ),
    ]
}

/// `{column} > now`, after the status the row must hold.
fn push_not_yet_due(sql: &mut Sql, column: &str, status: &Option<String>) {
    if let Some(status) = status {
        sql.push(status).push(" AND ");
    }
    sql.push(&format!("{column} > ")).time(DbTime::NOW);
}

/// Make due now, by the database's clock, every retry and delayed event not yet due: their due
/// times are set to the database's current time, which stays the one clock the relay and the
/// workers read.
pub async fn bring_forward<C: ConnectionTrait>(conn: &C) -> Result<KitBroughtForward, DbErr> {
    let dialect = Dialect::of(conn);
    let mut moved = [0u64; 3];
    for (i, (table, column, status)) in due_columns().into_iter().enumerate() {
        let mut sql = Sql::new(dialect);
        sql.push(&format!("UPDATE {table} SET {column} = "))
            .time(DbTime::NOW)
            .push(" WHERE ");
        push_not_yet_due(&mut sql, column, &status);
        moved[i] = conn.execute_raw(sql.build()).await?.rows_affected();
    }
    Ok(KitBroughtForward {
        event_retries: moved[0],
        scheduled: moved[1],
        message_retries: moved[2],
    })
}

/// What `by` of waiting does to due times: every retry and delayed event not yet due has its
/// due time moved `by` earlier (never before the database's current time); those it reaches
/// are due now, and the count says how many. Calls add up.
pub async fn shift_due<C: ConnectionTrait>(
    conn: &C,
    by: Duration,
) -> Result<KitBroughtForward, DbErr> {
    let dialect = Dialect::of(conn);
    let now = super::sql::database_now(conn).await?;
    let by = chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX);
    let mut due = [0u64; 3];
    for (i, (table, column, status)) in due_columns().into_iter().enumerate() {
        let mut sql = Sql::new(dialect);
        sql.push(&format!("SELECT id, {column} AS due FROM {table} WHERE "));
        push_not_yet_due(&mut sql, column, &status);
        for row in conn.query_all_raw(sql.build()).await? {
            let id = get_i64(&row, "id")?;
            let old = dialect.get_timestamp(&row, "due")?;
            let new = old.checked_sub_signed(by).unwrap_or(now);
            let mut sql = Sql::new(dialect);
            sql.push(&format!("UPDATE {table} SET {column} = "));
            if new <= now {
                sql.time(DbTime::NOW);
                due[i] += 1;
            } else {
                sql.bind(dialect.timestamp(new));
            }
            sql.push(" WHERE id = ").bind(id.into());
            conn.execute_raw(sql.build()).await?;
        }
    }
    Ok(KitBroughtForward {
        event_retries: due[0],
        scheduled: due[1],
        message_retries: due[2],
    })
}

/// `consumer`'s row for `message_id`, wherever it is.
pub async fn message<C: ConnectionTrait>(
    conn: &C,
    consumer: &str,
    message_id: &str,
) -> Result<Option<KitMessageRow>, DbErr> {
    let dialect = Dialect::of(conn);
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "SELECT {MESSAGE_COLUMNS}, status, last_error, next_attempt_at FROM {INBOX_TABLE} \
         WHERE consumer = "
    ))
    .bind(consumer.to_owned().into())
    .push(" AND message_id = ")
    .bind(message_id.to_owned().into());
    if let Some(row) = conn.query_one_raw(sql.build()).await? {
        return message_row(dialect, &row, false).map(Some);
    }
    if !has_done_table(conn).await? {
        return Ok(None);
    }
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "SELECT {MESSAGE_COLUMNS} FROM {DONE_TABLE} WHERE consumer = "
    ))
    .bind(consumer.to_owned().into())
    .push(" AND message_id = ")
    .bind(message_id.to_owned().into());
    match conn.query_one_raw(sql.build()).await? {
        Some(row) => message_row(dialect, &row, true).map(Some),
        None => Ok(None),
    }
}

/// Make `consumer`'s retry of `message_id` due now, by the database's clock.
pub async fn message_due_now<C: ConnectionTrait>(
    conn: &C,
    consumer: &str,
    message_id: &str,
) -> Result<u64, DbErr> {
    let mut sql = Sql::new(Dialect::of(conn));
    sql.push(&format!("UPDATE {INBOX_TABLE} SET next_attempt_at = "))
        .time(DbTime::NOW)
        .push(&format!(
            " WHERE {} AND consumer = ",
            InboxStatus::in_list("", &[InboxStatus::Retry])
        ))
        .bind(consumer.to_owned().into())
        .push(" AND message_id = ")
        .bind(message_id.to_owned().into());
    Ok(conn.execute_raw(sql.build()).await?.rows_affected())
}
