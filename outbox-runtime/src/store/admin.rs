//! The operations' SQL: status counts, dead-letter queries, the guarded state changes of
//! [`crate::admin`], the audit log, the retention purge's bounded deletes, named leases, and the
//! schema introspection `doctor` runs.
//!
//! Every state change here is guarded by the status it expects (`… AND status = 'DEAD'`): a row
//! that moved on in the meantime is not touched.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, IsolationLevel,
    QueryResult, SqliteTransactionMode, Statement, TransactionOptions, TransactionTrait, Value,
};

use super::{Dialect, INBOX_TABLE, OUTBOX_TABLE, claim::Sql};
use crate::admin::{AdminAction, DeadLetter, DeadLetterDetail, DeadLetterFilter, Source, Target};

/// The audit table.
pub(crate) const ACTION_TABLE: &str = "outbox_admin_action";
/// The lease table.
pub(crate) const LEASE_TABLE: &str = "outbox_lease";

/// Begin a short admin transaction: read committed (no gap locks on MySQL), immediate on SQLite
/// (writers serialize, so what a guard read is what the update sees).
pub(crate) async fn begin(db: &DatabaseConnection) -> Result<DatabaseTransaction, DbErr> {
    let options = match db.get_database_backend() {
        DbBackend::Sqlite => TransactionOptions {
            sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
            ..TransactionOptions::default()
        },
        _ => TransactionOptions {
            isolation_level: Some(IsolationLevel::ReadCommitted),
            ..TransactionOptions::default()
        },
    };
    db.begin_with_options(options).await
}

/// An integer column, whatever width the backend gives it (`INTEGER` is `i32` on PostgreSQL and
/// MySQL, `i64` on SQLite; `COUNT(*)` is `i64` everywhere).
pub(crate) fn get_i64(row: &QueryResult, column: &str) -> Result<i64, DbErr> {
    match row.try_get::<i64>("", column) {
        Ok(v) => Ok(v),
        Err(first) => match row.try_get::<i32>("", column) {
            Ok(v) => Ok(i64::from(v)),
            Err(_) => Err(first),
        },
    }
}

fn get_opt_i64(row: &QueryResult, column: &str) -> Result<Option<i64>, DbErr> {
    match row.try_get::<Option<i64>>("", column) {
        Ok(v) => Ok(v),
        Err(first) => match row.try_get::<Option<i32>>("", column) {
            Ok(v) => Ok(v.map(i64::from)),
            Err(_) => Err(first),
        },
    }
}

fn table_of(source: Source) -> &'static str {
    match source {
        Source::Outbox => OUTBOX_TABLE,
        Source::Inbox => INBOX_TABLE,
    }
}

/// Rows per status (per consumer for the inbox) with the oldest arrival time of each group.
#[derive(Debug, Clone)]
pub(crate) struct CountRow {
    pub(crate) consumer: Option<String>,
    pub(crate) status: String,
    pub(crate) count: i64,
    pub(crate) oldest: Option<DateTime<Utc>>,
}

/// `outbox_event` rows per status, with the oldest `created_at` of each.
pub(crate) async fn outbox_counts(db: &DatabaseConnection) -> Result<Vec<CountRow>, DbErr> {
    let dialect = Dialect::of(db);
    let sql = format!(
        "SELECT status, COUNT(*) AS n, MIN(created_at) AS oldest FROM {OUTBOX_TABLE} GROUP BY status"
    );
    let rows = db
        .query_all_raw(Statement::from_string(dialect.backend(), sql))
        .await?;
    rows.iter()
        .map(|row| {
            Ok(CountRow {
                consumer: None,
                status: row.try_get("", "status")?,
                count: get_i64(row, "n")?,
                oldest: dialect.get_opt_timestamp(row, "oldest")?,
            })
        })
        .collect()
}

/// `inbox_event` rows per consumer and status, with the oldest `received_at` of each.
pub(crate) async fn inbox_counts(db: &DatabaseConnection) -> Result<Vec<CountRow>, DbErr> {
    let dialect = Dialect::of(db);
    let sql = format!(
        "SELECT consumer, status, COUNT(*) AS n, MIN(received_at) AS oldest FROM {INBOX_TABLE} \
         GROUP BY consumer, status ORDER BY consumer"
    );
    let rows = db
        .query_all_raw(Statement::from_string(dialect.backend(), sql))
        .await?;
    rows.iter()
        .map(|row| {
            Ok(CountRow {
                consumer: Some(row.try_get("", "consumer")?),
                status: row.try_get("", "status")?,
                count: get_i64(row, "n")?,
                oldest: dialect.get_opt_timestamp(row, "oldest")?,
            })
        })
        .collect()
}

/// Rows in PROCESSING whose lease expired before `now`: per consumer for the inbox (`None` for
/// the outbox), with the earliest expiry.
pub(crate) async fn stuck(
    db: &DatabaseConnection,
    source: Source,
    now: DateTime<Utc>,
) -> Result<Vec<(Option<String>, i64, Option<DateTime<Utc>>)>, DbErr> {
    let dialect = Dialect::of(db);
    let mut sql = Sql::new(dialect);
    let (select, group) = match source {
        Source::Outbox => ("", ""),
        Source::Inbox => ("consumer, ", " GROUP BY consumer"),
    };
    sql.push(&format!(
        "SELECT {select}COUNT(*) AS n, MIN(locked_until) AS since FROM {} \
         WHERE status = 'PROCESSING' AND locked_until < ",
        table_of(source)
    ))
    .bind(dialect.timestamp(now))
    .push(group);
    let mut out = Vec::new();
    for row in db.query_all_raw(sql.build()).await? {
        let n = get_i64(&row, "n")?;
        if n == 0 {
            continue;
        }
        let consumer = match source {
            Source::Outbox => None,
            Source::Inbox => Some(row.try_get("", "consumer")?),
        };
        out.push((consumer, n, dialect.get_opt_timestamp(&row, "since")?));
    }
    Ok(out)
}

/// `' AND …'` for each criterion of a dead-letter filter that applies to `source`.
fn push_filter(sql: &mut Sql, source: Source, filter: &DeadLetterFilter) {
    if let (Source::Inbox, Some(consumer)) = (source, &filter.consumer) {
        sql.push(" AND consumer = ").bind(consumer.clone().into());
    }
    if let Some(event_type) = &filter.event_type {
        sql.push(" AND event_type = ")
            .bind(event_type.clone().into());
    }
    if let Some(aggregate_id) = &filter.aggregate_id {
        sql.push(" AND aggregate_id = ")
            .bind(aggregate_id.clone().into());
    }
    if let Some(text) = &filter.error_contains {
        sql.push(" AND LOWER(last_error) LIKE ")
            .bind(like_pattern(text).into())
            .push(" ESCAPE '!'");
    }
}

/// `%text%`, lower-cased, with LIKE's wildcards in `text` escaped by `!`.
fn like_pattern(text: &str) -> String {
    let mut pattern = String::with_capacity(text.len() + 2);
    pattern.push('%');
    for c in text.to_lowercase().chars() {
        if matches!(c, '!' | '%' | '_') {
            pattern.push('!');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

/// The newest `limit` DEAD rows of one table matching `filter`, newest first.
pub(crate) async fn dead_letters(
    db: &DatabaseConnection,
    source: Source,
    filter: &DeadLetterFilter,
    limit: u64,
) -> Result<Vec<DeadLetter>, DbErr> {
    let dialect = Dialect::of(db);
    let mut sql = Sql::new(dialect);
    match source {
        Source::Outbox => sql.push(&format!(
            "SELECT id, event_id, event_type, aggregate_type, aggregate_id, attempts, last_error, \
             created_at AS arrived_at FROM {OUTBOX_TABLE} WHERE status = 'DEAD'"
        )),
        Source::Inbox => sql.push(&format!(
            "SELECT id, consumer, message_id, event_type, aggregate_type, aggregate_id, attempts, \
             last_error, received_at AS arrived_at FROM {INBOX_TABLE} WHERE status = 'DEAD'"
        )),
    };
    push_filter(&mut sql, source, filter);
    sql.push(&format!(
        " ORDER BY arrived_at DESC, id DESC LIMIT {}",
        limit.max(1)
    ));
    let rows = db.query_all_raw(sql.build()).await?;
    rows.iter()
        .map(|row| {
            let id: i64 = row.try_get("", "id")?;
            let (consumer, message_id) = match source {
                Source::Outbox => (None, dialect.get_uuid(row, "event_id")?.to_string()),
                Source::Inbox => (
                    Some(row.try_get("", "consumer")?),
                    row.try_get("", "message_id")?,
                ),
            };
            Ok(DeadLetter {
                target: Target { source, id },
                consumer,
                message_id,
                event_type: row.try_get("", "event_type")?,
                aggregate_type: row.try_get("", "aggregate_type")?,
                aggregate_id: row.try_get("", "aggregate_id")?,
                attempts: get_i64(row, "attempts")?,
                last_error: row.try_get("", "last_error")?,
                arrived_at: dialect.get_timestamp(row, "arrived_at")?,
            })
        })
        .collect()
}

/// Every column of one outbox row, or `None`.
pub(crate) async fn outbox_detail(
    db: &DatabaseConnection,
    id: i64,
) -> Result<Option<DeadLetterDetail>, DbErr> {
    let dialect = Dialect::of(db);
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "SELECT id, event_id, source, event_type, schema_version, aggregate_type, aggregate_id, \
         aggregate_version, dedup_key, payload, headers, status, attempts, next_attempt_at, \
         locked_by, locked_until, created_at, sent_at, last_error FROM {OUTBOX_TABLE} WHERE id = "
    ))
    .bind(id.into());
    let Some(row) = db.query_one_raw(sql.build()).await? else {
        return Ok(None);
    };
    let payload = dialect.get_json_text(&row, "payload")?;
    let headers = dialect.get_json_text(&row, "headers")?;
    let event = super::relay::ClaimedEvent {
        id,
        event_id: dialect.get_uuid(&row, "event_id")?,
        source: row.try_get("", "source")?,
        event_type: row.try_get("", "event_type")?,
        schema_version: u32::try_from(get_i64(&row, "schema_version")?).unwrap_or(0),
        aggregate_type: row.try_get("", "aggregate_type")?,
        aggregate_id: row.try_get("", "aggregate_id")?,
        aggregate_version: get_opt_i64(&row, "aggregate_version")?,
        payload: payload.clone(),
        headers: headers.clone(),
        created_at: dialect.get_timestamp(&row, "created_at")?,
        attempts: 0,
        reclaimed: false,
    };
    let (envelope, envelope_error) = match event.envelope() {
        Ok(envelope) => (
            serde_json::from_slice(&envelope.to_json()).ok(),
            None::<String>,
        ),
        Err(e) => (None, Some(e)),
    };
    Ok(Some(DeadLetterDetail {
        summary: DeadLetter {
            target: Target {
                source: Source::Outbox,
                id,
            },
            consumer: None,
            message_id: event.event_id.to_string(),
            event_type: Some(event.event_type.clone()),
            aggregate_type: Some(event.aggregate_type.clone()),
            aggregate_id: Some(event.aggregate_id.clone()),
            attempts: get_i64(&row, "attempts")?,
            last_error: row.try_get("", "last_error")?,
            arrived_at: event.created_at,
        },
        status: row.try_get("", "status")?,
        source: Some(event.source.clone()),
        schema_version: Some(i64::from(event.schema_version)),
        aggregate_version: event.aggregate_version,
        dedup_key: row.try_get("", "dedup_key")?,
        headers: serde_json::from_str(&headers).ok(),
        payload,
        envelope,
        envelope_error,
        next_attempt_at: dialect.get_opt_timestamp(&row, "next_attempt_at")?,
        locked_by: row.try_get("", "locked_by")?,
        locked_until: dialect.get_opt_timestamp(&row, "locked_until")?,
        sent_at: dialect.get_opt_timestamp(&row, "sent_at")?,
        processed_at: None,
    }))
}

/// Every column of one inbox row, or `None`. The payload is shown as UTF-8, lossily.
pub(crate) async fn inbox_detail(
    db: &DatabaseConnection,
    id: i64,
) -> Result<Option<DeadLetterDetail>, DbErr> {
    let dialect = Dialect::of(db);
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "SELECT id, consumer, message_id, event_type, source, aggregate_type, aggregate_id, \
         aggregate_version, schema_version, payload, status, attempts, next_attempt_at, locked_by, \
         locked_until, received_at, processed_at, last_error FROM {INBOX_TABLE} WHERE id = "
    ))
    .bind(id.into());
    let Some(row) = db.query_one_raw(sql.build()).await? else {
        return Ok(None);
    };
    let bytes: Vec<u8> = row.try_get("", "payload")?;
    let payload = String::from_utf8_lossy(&bytes).into_owned();
    let envelope = serde_json::from_slice::<serde_json::Value>(&bytes).ok();
    Ok(Some(DeadLetterDetail {
        summary: DeadLetter {
            target: Target {
                source: Source::Inbox,
                id,
            },
            consumer: Some(row.try_get("", "consumer")?),
            message_id: row.try_get("", "message_id")?,
            event_type: row.try_get("", "event_type")?,
            aggregate_type: row.try_get("", "aggregate_type")?,
            aggregate_id: row.try_get("", "aggregate_id")?,
            attempts: get_i64(&row, "attempts")?,
            last_error: row.try_get("", "last_error")?,
            arrived_at: dialect.get_timestamp(&row, "received_at")?,
        },
        status: row.try_get("", "status")?,
        source: row.try_get("", "source")?,
        schema_version: get_opt_i64(&row, "schema_version")?,
        aggregate_version: get_opt_i64(&row, "aggregate_version")?,
        dedup_key: None,
        headers: None,
        payload,
        envelope,
        envelope_error: None,
        next_attempt_at: dialect.get_opt_timestamp(&row, "next_attempt_at")?,
        locked_by: row.try_get("", "locked_by")?,
        locked_until: dialect.get_opt_timestamp(&row, "locked_until")?,
        sent_at: None,
        processed_at: dialect.get_opt_timestamp(&row, "processed_at")?,
    }))
}

/// The current status of each of `ids` that exists, locked for the rest of the transaction on
/// PostgreSQL and MySQL (SQLite's immediate transaction already excludes other writers).
pub(crate) async fn lock_statuses(
    txn: &DatabaseTransaction,
    source: Source,
    ids: &[i64],
) -> Result<HashMap<i64, String>, DbErr> {
    let dialect = Dialect::of(txn);
    let mut found = HashMap::with_capacity(ids.len());
    for chunk in ids.chunks(500) {
        let mut sql = Sql::new(dialect);
        sql.push(&format!(
            "SELECT id, status FROM {} WHERE id IN ",
            table_of(source)
        ))
        .bind_list(chunk.iter().map(|id| Value::from(*id)));
        if dialect.backend() != DbBackend::Sqlite {
            sql.push(" FOR UPDATE");
        }
        for row in txn.query_all_raw(sql.build()).await? {
            found.insert(row.try_get("", "id")?, row.try_get("", "status")?);
        }
    }
    Ok(found)
}

/// What a guarded state change selects: some ids, or every row matching a filter.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rows<'a> {
    Ids(&'a [i64]),
    Filter(&'a DeadLetterFilter),
}

/// Run `UPDATE <table> SET <set> WHERE status = '<from>' AND <rows>`, in chunks of ids.
async fn guarded_update(
    conn: &DatabaseTransaction,
    source: Source,
    set: &dyn Fn(&mut Sql),
    from: &str,
    rows: Rows<'_>,
) -> Result<u64, DbErr> {
    let dialect = Dialect::of(conn);
    let statement = |ids: Option<&[i64]>, filter: Option<&DeadLetterFilter>| {
        let mut sql = Sql::new(dialect);
        sql.push(&format!("UPDATE {} SET ", table_of(source)));
        set(&mut sql);
        sql.push(&format!(" WHERE status = '{from}'"));
        if let Some(ids) = ids {
            sql.push(" AND id IN ")
                .bind_list(ids.iter().map(|id| Value::from(*id)));
        }
        if let Some(filter) = filter {
            push_filter(&mut sql, source, filter);
        }
        sql.build()
    };
    let mut affected = 0;
    match rows {
        Rows::Ids(ids) => {
            for chunk in ids.chunks(500) {
                affected += conn
                    .execute_raw(statement(Some(chunk), None))
                    .await?
                    .rows_affected();
            }
        }
        Rows::Filter(filter) => {
            affected += conn
                .execute_raw(statement(None, Some(filter)))
                .await?
                .rows_affected();
        }
    }
    Ok(affected)
}

/// Outbox DEAD → PENDING: a fresh attempt budget, no lease; `last_error` stays until it is sent.
pub(crate) async fn replay_outbox(txn: &DatabaseTransaction, rows: Rows<'_>) -> Result<u64, DbErr> {
    guarded_update(
        txn,
        Source::Outbox,
        &|sql: &mut Sql| {
            sql.push(
                "status = 'PENDING', attempts = 0, next_attempt_at = NULL, locked_by = NULL, \
                 locked_until = NULL, claim_token = NULL",
            );
        },
        "DEAD",
        rows,
    )
    .await
}

/// Inbox DEAD → RETRY due `now`: a fresh attempt budget; `last_error` stays until it is done.
pub(crate) async fn replay_inbox(
    txn: &DatabaseTransaction,
    rows: Rows<'_>,
    now: DateTime<Utc>,
) -> Result<u64, DbErr> {
    let due = Dialect::of(txn).timestamp(now);
    guarded_update(
        txn,
        Source::Inbox,
        &|sql: &mut Sql| {
            sql.push("status = 'RETRY', attempts = 0, next_attempt_at = ")
                .bind(due.clone())
                .push(", locked_by = NULL, locked_until = NULL, claim_token = NULL");
        },
        "DEAD",
        rows,
    )
    .await
}

/// Inbox DEAD → IGNORED, finished at `now` (so retention purges it after the dedup window).
pub(crate) async fn ignore_inbox(
    txn: &DatabaseTransaction,
    ids: &[i64],
    now: DateTime<Utc>,
) -> Result<u64, DbErr> {
    let at = Dialect::of(txn).timestamp(now);
    guarded_update(
        txn,
        Source::Inbox,
        &|sql: &mut Sql| {
            sql.push("status = 'IGNORED', processed_at = ")
                .bind(at.clone())
                .push(", locked_until = NULL, claim_token = NULL");
        },
        "DEAD",
        Rows::Ids(ids),
    )
    .await
}

/// Outbox SENT → PENDING, as if never sent.
pub(crate) async fn resend_outbox(txn: &DatabaseTransaction, ids: &[i64]) -> Result<u64, DbErr> {
    guarded_update(
        txn,
        Source::Outbox,
        &|sql: &mut Sql| {
            sql.push(
                "status = 'PENDING', sent_at = NULL, attempts = 0, next_attempt_at = NULL, \
                 locked_by = NULL, locked_until = NULL, claim_token = NULL, last_error = NULL",
            );
        },
        "SENT",
        Rows::Ids(ids),
    )
    .await
}

/// `(id, status)` of the outbox rows with these event ids, locked like [`lock_statuses`].
pub(crate) async fn lock_by_event_ids(
    txn: &DatabaseTransaction,
    event_ids: &[uuid::Uuid],
) -> Result<HashMap<uuid::Uuid, (i64, String)>, DbErr> {
    let dialect = Dialect::of(txn);
    let mut found = HashMap::with_capacity(event_ids.len());
    for chunk in event_ids.chunks(500) {
        let mut sql = Sql::new(dialect);
        sql.push(&format!(
            "SELECT id, event_id, status FROM {OUTBOX_TABLE} WHERE event_id IN "
        ))
        .bind_list(chunk.iter().map(|id| dialect.uuid(*id)));
        if dialect.backend() != DbBackend::Sqlite {
            sql.push(" FOR UPDATE");
        }
        for row in txn.query_all_raw(sql.build()).await? {
            found.insert(
                dialect.get_uuid(&row, "event_id")?,
                (row.try_get("", "id")?, row.try_get("", "status")?),
            );
        }
    }
    Ok(found)
}

/// Append one row to the audit log; returns its id.
pub(crate) async fn record_action<C: ConnectionTrait>(
    conn: &C,
    action: &str,
    target: &str,
    rows_affected: u64,
    actor: Option<&str>,
    reason: Option<&str>,
    at: DateTime<Utc>,
) -> Result<i64, DbErr> {
    let dialect = Dialect::of(conn);
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "INSERT INTO {ACTION_TABLE} (action, target, rows_affected, actor, reason, at) VALUES ("
    ))
    .bind(action.to_owned().into())
    .push(", ")
    .bind(target.to_owned().into())
    .push(", ")
    .bind(i64::try_from(rows_affected).unwrap_or(i64::MAX).into())
    .push(", ")
    .bind(actor.map(|a| truncate(a, 255)).into())
    .push(", ")
    .bind(reason.map(str::to_owned).into())
    .push(", ")
    .bind(dialect.timestamp(at))
    .push(")");
    if dialect.backend() == DbBackend::Postgres {
        sql.push(" RETURNING id");
        let row = conn
            .query_one_raw(sql.build())
            .await?
            .ok_or_else(|| DbErr::RecordNotInserted)?;
        return row.try_get("", "id");
    }
    let result = conn.execute_raw(sql.build()).await?;
    Ok(i64::try_from(result.last_insert_id()).unwrap_or(0))
}

fn truncate(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((i, _)) => s[..i].to_owned(),
        None => s.to_owned(),
    }
}

/// The newest `limit` audit rows, newest first.
pub(crate) async fn audit_log(
    db: &DatabaseConnection,
    limit: u64,
) -> Result<Vec<AdminAction>, DbErr> {
    let dialect = Dialect::of(db);
    let sql = format!(
        "SELECT id, action, target, rows_affected, actor, reason, at FROM {ACTION_TABLE} \
         ORDER BY id DESC LIMIT {}",
        limit.max(1)
    );
    let rows = db
        .query_all_raw(Statement::from_string(dialect.backend(), sql))
        .await?;
    rows.iter()
        .map(|row| {
            Ok(AdminAction {
                id: row.try_get("", "id")?,
                action: row.try_get("", "action")?,
                target: row.try_get("", "target")?,
                rows_affected: get_i64(row, "rows_affected")?,
                actor: row.try_get("", "actor")?,
                reason: row.try_get("", "reason")?,
                at: dialect.get_timestamp(row, "at")?,
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Retention

/// Delete at most `limit` SENT outbox rows sent before `cutoff`, in one short transaction.
///
/// PostgreSQL and SQLite: `DELETE … WHERE id IN (SELECT id … LIMIT n)`, the subquery served by
/// the partial index on `sent_at` (on PostgreSQL with `SKIP LOCKED`, so the purge never waits on
/// a row someone else holds). MySQL does not allow `LIMIT` in an `IN` subquery, and a derived
/// table can turn the outer delete into a scan, so it runs `DELETE … ORDER BY sent_at, id LIMIT n`
/// on its `(status, sent_at)` index instead.
pub(crate) async fn purge_sent(
    db: &DatabaseConnection,
    cutoff: DateTime<Utc>,
    limit: usize,
) -> Result<u64, DbErr> {
    purge_batch(db, OUTBOX_TABLE, &["SENT"], "sent_at", cutoff, limit).await
}

/// Delete at most `limit` DONE or IGNORED inbox rows processed before `cutoff`, in one short
/// transaction (see [`purge_sent`]).
pub(crate) async fn purge_finished(
    db: &DatabaseConnection,
    cutoff: DateTime<Utc>,
    limit: usize,
) -> Result<u64, DbErr> {
    purge_batch(
        db,
        INBOX_TABLE,
        &["DONE", "IGNORED"],
        "processed_at",
        cutoff,
        limit,
    )
    .await
}

async fn purge_batch(
    db: &DatabaseConnection,
    table: &str,
    statuses: &[&str],
    column: &str,
    cutoff: DateTime<Utc>,
    limit: usize,
) -> Result<u64, DbErr> {
    let dialect = Dialect::of(db);
    let limit = limit.max(1);
    let txn = begin(db).await?;
    let mut deleted = 0;
    match dialect.backend() {
        DbBackend::MySql => {
            // One range of the (status, <column>) index per status, in index order.
            for status in statuses {
                let mut sql = Sql::new(dialect);
                sql.push(&format!(
                    "DELETE FROM {table} WHERE status = '{status}' AND {column} < "
                ))
                .bind(dialect.timestamp(cutoff))
                .push(&format!(
                    " ORDER BY {column}, id LIMIT {}",
                    limit - deleted as usize
                ));
                deleted += txn.execute_raw(sql.build()).await?.rows_affected();
                if deleted as usize >= limit {
                    break;
                }
            }
        }
        backend => {
            // The status predicate matches the partial index's exactly, so the planner uses it.
            let in_list = statuses
                .iter()
                .map(|s| format!("'{s}'"))
                .collect::<Vec<_>>()
                .join(", ");
            let predicate = if statuses.len() == 1 {
                format!("status = {in_list}")
            } else {
                format!("status IN ({in_list})")
            };
            let skip_locked = if backend == DbBackend::Postgres {
                " FOR UPDATE SKIP LOCKED"
            } else {
                ""
            };
            let mut sql = Sql::new(dialect);
            sql.push(&format!(
                "DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE {predicate} AND {column} < "
            ))
            .bind(dialect.timestamp(cutoff))
            .push(&format!(" LIMIT {limit}{skip_locked})"));
            deleted = txn.execute_raw(sql.build()).await?.rows_affected();
        }
    }
    txn.commit().await?;
    Ok(deleted)
}

/// Take or renew the lease `name` for `holder` until `until`: succeeds when nobody holds it, its
/// holder's lease expired before `now`, or `holder` already holds it.
pub(crate) async fn acquire_lease(
    db: &DatabaseConnection,
    name: &str,
    holder: &str,
    now: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<bool, DbErr> {
    let dialect = Dialect::of(db);
    let backend = dialect.backend();
    let holder = truncate(holder, 255);
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "UPDATE {LEASE_TABLE} SET acquired_at = CASE WHEN holder = "
    ))
    .bind(holder.clone().into())
    .push(" THEN acquired_at ELSE ")
    .bind(dialect.timestamp(now))
    .push(" END, holder = ")
    .bind(holder.clone().into())
    .push(", locked_until = ")
    .bind(dialect.timestamp(until))
    .push(" WHERE name = ")
    .bind(name.to_owned().into())
    .push(" AND (holder = ")
    .bind(holder.clone().into())
    .push(" OR locked_until < ")
    .bind(dialect.timestamp(now))
    .push(")");
    if db.execute_raw(sql.build()).await?.rows_affected() == 1 {
        return Ok(true);
    }
    // No row yet (or held by someone else: then the insert conflicts and does nothing).
    let mut sql = Sql::new(dialect);
    sql.push(if backend == DbBackend::MySql {
        "INSERT IGNORE INTO "
    } else {
        "INSERT INTO "
    })
    .push(&format!(
        "{LEASE_TABLE} (name, holder, acquired_at, locked_until) VALUES ("
    ))
    .bind(name.to_owned().into())
    .push(", ")
    .bind(holder.into())
    .push(", ")
    .bind(dialect.timestamp(now))
    .push(", ")
    .bind(dialect.timestamp(until))
    .push(")");
    if backend != DbBackend::MySql {
        sql.push(" ON CONFLICT (name) DO NOTHING");
    }
    Ok(db.execute_raw(sql.build()).await?.rows_affected() == 1)
}

/// Give the lease `name` up if `holder` holds it (it expires at `now`).
pub(crate) async fn release_lease(
    db: &DatabaseConnection,
    name: &str,
    holder: &str,
    now: DateTime<Utc>,
) -> Result<bool, DbErr> {
    let dialect = Dialect::of(db);
    let mut sql = Sql::new(dialect);
    sql.push(&format!("UPDATE {LEASE_TABLE} SET locked_until = "))
        .bind(dialect.timestamp(now))
        .push(" WHERE name = ")
        .bind(name.to_owned().into())
        .push(" AND holder = ")
        .bind(truncate(holder, 255).into());
    Ok(db.execute_raw(sql.build()).await?.rows_affected() == 1)
}

/// Who holds the lease `name`, until when.
pub(crate) async fn lease_holder(
    db: &DatabaseConnection,
    name: &str,
) -> Result<Option<(String, DateTime<Utc>)>, DbErr> {
    let dialect = Dialect::of(db);
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "SELECT holder, locked_until FROM {LEASE_TABLE} WHERE name = "
    ))
    .bind(name.to_owned().into());
    match db.query_one_raw(sql.build()).await? {
        None => Ok(None),
        Some(row) => Ok(Some((
            row.try_get("", "holder")?,
            dialect.get_timestamp(&row, "locked_until")?,
        ))),
    }
}

// ---------------------------------------------------------------------------------------------
// Schema introspection, for `doctor`

/// `(table, column)` of every column of the current schema's tables.
pub(crate) async fn columns(db: &DatabaseConnection) -> Result<Vec<(String, String)>, DbErr> {
    let backend = db.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => {
            "SELECT CAST(table_name AS TEXT) AS t, CAST(column_name AS TEXT) AS c \
             FROM information_schema.columns WHERE table_schema = current_schema()"
        }
        DbBackend::MySql => {
            "SELECT table_name AS t, column_name AS c FROM information_schema.columns \
             WHERE table_schema = DATABASE()"
        }
        _ => {
            "SELECT m.name AS t, p.name AS c FROM sqlite_master m \
             JOIN pragma_table_info(m.name) p WHERE m.type = 'table'"
        }
    };
    pairs(db, sql).await
}

/// `(table, index)` of every index of the current schema's tables.
pub(crate) async fn indexes(db: &DatabaseConnection) -> Result<Vec<(String, String)>, DbErr> {
    let backend = db.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => {
            "SELECT CAST(tablename AS TEXT) AS t, CAST(indexname AS TEXT) AS c \
             FROM pg_indexes WHERE schemaname = current_schema()"
        }
        DbBackend::MySql => {
            "SELECT DISTINCT table_name AS t, index_name AS c FROM information_schema.statistics \
             WHERE table_schema = DATABASE()"
        }
        _ => "SELECT tbl_name AS t, name AS c FROM sqlite_master WHERE type = 'index'",
    };
    pairs(db, sql).await
}

async fn pairs(db: &DatabaseConnection, sql: &str) -> Result<Vec<(String, String)>, DbErr> {
    let rows = db
        .query_all_raw(Statement::from_string(
            db.get_database_backend(),
            sql.to_owned(),
        ))
        .await?;
    rows.iter()
        .map(|row| Ok((row.try_get("", "t")?, row.try_get("", "c")?)))
        .collect()
}

/// The migration names recorded in a migration table (`outbox_migrations`, `seaql_migrations`).
pub(crate) async fn applied_migrations(
    db: &DatabaseConnection,
    table: &str,
) -> Result<Vec<String>, DbErr> {
    let sql = format!("SELECT version FROM {table} ORDER BY version");
    let rows = db
        .query_all_raw(Statement::from_string(db.get_database_backend(), sql))
        .await?;
    rows.iter().map(|row| row.try_get("", "version")).collect()
}

/// Each consumer that has inbox rows, with how many are unfinished (PENDING, PROCESSING, RETRY).
pub(crate) async fn consumers_seen(db: &DatabaseConnection) -> Result<Vec<(String, i64)>, DbErr> {
    let sql = format!(
        "SELECT consumer, COUNT(CASE WHEN status IN ('PENDING', 'PROCESSING', 'RETRY') THEN 1 END) AS n \
         FROM {INBOX_TABLE} GROUP BY consumer ORDER BY consumer"
    );
    let rows = db
        .query_all_raw(Statement::from_string(db.get_database_backend(), sql))
        .await?;
    rows.iter()
        .map(|row| Ok((row.try_get("", "consumer")?, get_i64(row, "n")?)))
        .collect()
}
