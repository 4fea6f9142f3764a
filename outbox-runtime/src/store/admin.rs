//! The operations' SQL: status counts, dead-letter queries, the guarded state changes of
//! [`crate::admin`] and the audit log.
//!
//! Every state change here is guarded by the status it expects (`… AND status = 'DEAD'`): a row
//! that moved on in the meantime is not touched.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, Value};

use super::{
    ACTION_TABLE, DbTime, Dialect, INBOX_TABLE, OUTBOX_TABLE, get_i64, get_opt_i64,
    sent::{KEPT_COLUMNS, SENT_TABLE},
    sql::Sql,
    status::{InboxStatus, OutboxStatus, WorkStatus},
};
use crate::{
    operations::{
        AdminAction, DeadLetter, DeadLetterDetail, DeadLetterFilter, SentFilter, Source, Target,
    },
    util::text::truncate,
};

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
    let rows = db.query_all_raw(dialect.raw(sql)).await?;
    let mut counts = rows
        .iter()
        .map(|row| {
            Ok(CountRow {
                consumer: None,
                status: row.try_get("", "status")?,
                count: get_i64(row, "n")?,
                oldest: dialect.get_opt_timestamp(row, "oldest")?,
            })
        })
        .collect::<Result<Vec<_>, DbErr>>()?;
    // Sent events are in `outbox_sent` (an earlier release left its own in `outbox_event`).
    let sent = db
        .query_one_raw(dialect.raw(format!(
            "SELECT COUNT(*) AS n, MIN(created_at) AS oldest FROM {SENT_TABLE}"
        )))
        .await?;
    if let Some(row) = sent {
        let count = get_i64(&row, "n")?;
        let oldest = dialect.get_opt_timestamp(&row, "oldest")?;
        let sent = OutboxStatus::Sent.as_str();
        match counts.iter_mut().find(|c| c.status == sent) {
            Some(row) => {
                row.count += count;
                row.oldest = match (row.oldest, oldest) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            None if count > 0 => counts.push(CountRow {
                consumer: None,
                status: sent.to_owned(),
                count,
                oldest,
            }),
            None => {}
        }
    }
    Ok(counts)
}

/// `inbox_event` rows per consumer and status, with the oldest `received_at` of each.
pub(crate) async fn inbox_counts(db: &DatabaseConnection) -> Result<Vec<CountRow>, DbErr> {
    let dialect = Dialect::of(db);
    let rows = if super::inbox_done::may_hold_done(db) {
        format!(
            "(SELECT consumer, status, received_at FROM {INBOX_TABLE} UNION ALL \
             SELECT consumer, status, received_at FROM {}) x",
            super::inbox_done::DONE_TABLE
        )
    } else {
        INBOX_TABLE.to_owned()
    };
    let sql = format!(
        "SELECT consumer, status, COUNT(*) AS n, MIN(received_at) AS oldest FROM {rows} \
         GROUP BY consumer, status ORDER BY consumer"
    );
    let rows = db.query_all_raw(dialect.raw(sql)).await?;
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

/// Rows in PROCESSING whose lease expired: of one consumer, or of the outbox.
#[derive(Debug, Clone)]
pub(crate) struct Stuck {
    /// The consumer (`None` for the outbox).
    pub(crate) consumer: Option<String>,
    /// How many rows.
    pub(crate) count: i64,
    /// The earliest expiry.
    pub(crate) since: Option<DateTime<Utc>>,
}

/// Rows in PROCESSING whose lease expired, by the database's clock: per consumer for the inbox,
/// with the earliest expiry.
pub(crate) async fn stuck(db: &DatabaseConnection, source: Source) -> Result<Vec<Stuck>, DbErr> {
    let dialect = Dialect::of(db);
    let mut sql = Sql::new(dialect);
    let (select, group) = match source {
        Source::Outbox => ("", ""),
        Source::Inbox => ("consumer, ", " GROUP BY consumer"),
    };
    sql.push(&format!(
        "SELECT {select}COUNT(*) AS n, MIN(locked_until) AS since FROM {} \
         WHERE status = {} AND locked_until < ",
        table_of(source),
        WorkStatus::Processing.literal()
    ))
    .time(DbTime::NOW)
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
        out.push(Stuck {
            consumer,
            count: n,
            since: dialect.get_opt_timestamp(&row, "since")?,
        });
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
             created_at AS arrived_at FROM {OUTBOX_TABLE} WHERE status = {}",
            OutboxStatus::Dead.literal()
        )),
        Source::Inbox => sql.push(&format!(
            "SELECT id, consumer, message_id, event_type, aggregate_type, aggregate_id, attempts, \
             last_error, received_at AS arrived_at FROM {INBOX_TABLE} WHERE status = {}",
            InboxStatus::Dead.literal()
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
    let (row, moved) = match db.query_one_raw(sql.build()).await? {
        Some(row) => (row, false),
        None => {
            // Sent: moved to `outbox_sent`, with what it kept.
            let mut sql = Sql::new(dialect);
            sql.push(&format!(
                "SELECT {KEPT_COLUMNS}, sent_at FROM {SENT_TABLE} WHERE id = "
            ))
            .bind(id.into());
            match db.query_one_raw(sql.build()).await? {
                Some(row) => (row, true),
                None => return Ok(None),
            }
        }
    };
    // What a row in `outbox_sent` no longer has.
    let unless_moved = |column: &str| -> Result<Option<String>, DbErr> {
        if moved {
            Ok(None)
        } else {
            row.try_get("", column)
        }
    };
    let time_unless_moved = |column: &str| {
        if moved {
            Ok(None)
        } else {
            dialect.get_opt_timestamp(&row, column)
        }
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
            last_error: unless_moved("last_error")?,
            arrived_at: event.created_at,
        },
        status: match moved {
            true => OutboxStatus::Sent.as_str().to_owned(),
            false => row.try_get("", "status")?,
        },
        source: Some(event.source.clone()),
        schema_version: Some(i64::from(event.schema_version)),
        aggregate_version: event.aggregate_version,
        dedup_key: row.try_get("", "dedup_key")?,
        headers: serde_json::from_str(&headers).ok(),
        payload,
        envelope,
        envelope_error,
        next_attempt_at: time_unless_moved("next_attempt_at")?,
        locked_by: row.try_get("", "locked_by")?,
        locked_until: time_unless_moved("locked_until")?,
        sent_at: dialect.get_opt_timestamp(&row, "sent_at")?,
        processed_at: None,
        failures: super::failures::history(db, Source::Outbox, id).await?,
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
         aggregate_version, schema_version, payload, headers, status, attempts, next_attempt_at, \
         locked_by, locked_until, received_at, processed_at, last_error FROM {INBOX_TABLE} \
         WHERE id = "
    ))
    .bind(id.into());
    if super::inbox_done::may_hold_done(db) {
        // A handled message that moved to `inbox_done`: no due time, lease or error any more.
        sql.push(&format!(
            " UNION ALL SELECT id, consumer, message_id, event_type, source, aggregate_type, \
             aggregate_id, aggregate_version, schema_version, payload, headers, status, attempts, \
             CAST(NULL AS TIMESTAMPTZ), locked_by, CAST(NULL AS TIMESTAMPTZ), received_at, \
             processed_at, CAST(NULL AS TEXT) FROM {} WHERE id = ",
            super::inbox_done::DONE_TABLE
        ))
        .bind(id.into());
    }
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
        // The headers a receiver kept (a webhook's, a foreign message's), a JSON object.
        headers: row
            .try_get::<Option<String>>("", "headers")?
            .and_then(|text| serde_json::from_str(&text).ok()),
        payload,
        envelope,
        envelope_error: None,
        next_attempt_at: dialect.get_opt_timestamp(&row, "next_attempt_at")?,
        locked_by: row.try_get("", "locked_by")?,
        locked_until: dialect.get_opt_timestamp(&row, "locked_until")?,
        sent_at: None,
        processed_at: dialect.get_opt_timestamp(&row, "processed_at")?,
        failures: super::failures::history(db, Source::Inbox, id).await?,
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
        sql.push(dialect.lock_rows(false));
        for row in txn.query_all_raw(sql.build()).await? {
            found.insert(row.try_get("", "id")?, row.try_get("", "status")?);
        }
    }
    // Rows that moved out of the work queue: sent events to `outbox_sent` (always SENT),
    // handled messages to `inbox_done` (DONE or IGNORED, as stored).
    let moved = match source {
        Source::Outbox => Some((
            SENT_TABLE,
            format!("'{}' AS status", OutboxStatus::Sent.as_str()),
        )),
        Source::Inbox if super::inbox_done::may_hold_done(txn) => {
            Some((super::inbox_done::DONE_TABLE, "status".to_owned()))
        }
        Source::Inbox => None,
    };
    if let Some((table, status)) = moved {
        let missing: Vec<i64> = ids
            .iter()
            .copied()
            .filter(|id| !found.contains_key(id))
            .collect();
        for chunk in missing.chunks(500) {
            let mut sql = Sql::new(dialect);
            sql.push(&format!("SELECT id, {status} FROM {table} WHERE id IN "))
                .bind_list(chunk.iter().map(|id| Value::from(*id)));
            for row in txn.query_all_raw(sql.build()).await? {
                found.insert(row.try_get("", "id")?, row.try_get("", "status")?);
            }
        }
    }
    Ok(found)
}

/// What a guarded state change selects: some ids, every dead letter matching a filter, or
/// every sent event matching one.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rows<'a> {
    Ids(&'a [i64]),
    Filter(&'a DeadLetterFilter),
    Sent(&'a SentFilter),
}

/// `' AND …'` for each criterion of a sent-events filter (outbox).
fn push_sent_filter(sql: &mut Sql, filter: &SentFilter) {
    let dialect = sql.dialect();
    for (column, value) in [
        ("event_type", &filter.event_type),
        ("aggregate_type", &filter.aggregate_type),
        ("aggregate_id", &filter.aggregate_id),
    ] {
        if let Some(value) = value {
            sql.push(&format!(" AND {column} = "))
                .bind(value.clone().into());
        }
    }
    if let Some(at) = filter.sent_after {
        sql.push(" AND sent_at >= ").bind(dialect.timestamp(at));
    }
    if let Some(at) = filter.sent_before {
        sql.push(" AND sent_at < ").bind(dialect.timestamp(at));
    }
}

/// After a change that made `affected` finished rows unfinished again: bump the rescan
/// generation, so that claimers look below their floors (see `floor.rs`).
async fn made_unfinished(txn: &DatabaseTransaction, affected: u64) -> Result<u64, DbErr> {
    if affected > 0 {
        super::floor::rescan(txn).await?;
    }
    Ok(affected)
}

/// Run `UPDATE <table> SET <set> WHERE status = <from> AND <rows>`, in chunks of ids (`from` is
/// a status's SQL literal).
async fn guarded_update(
    conn: &DatabaseTransaction,
    source: Source,
    set: &(dyn Fn(&mut Sql) + Sync),
    from: &'static str,
    rows: Rows<'_>,
) -> Result<u64, DbErr> {
    let dialect = Dialect::of(conn);
    let statement = |rows: Rows<'_>| {
        let mut sql = Sql::new(dialect);
        sql.push(&format!("UPDATE {} SET ", table_of(source)));
        set(&mut sql);
        sql.push(" WHERE status = ").push(from);
        match rows {
            Rows::Ids(ids) => {
                sql.push(" AND id IN ")
                    .bind_list(ids.iter().map(|id| Value::from(*id)));
            }
            Rows::Filter(filter) => push_filter(&mut sql, source, filter),
            Rows::Sent(filter) => push_sent_filter(&mut sql, filter),
        }
        sql.build()
    };
    let mut affected = 0;
    match rows {
        Rows::Ids(ids) => {
            for chunk in ids.chunks(500) {
                affected += conn
                    .execute_raw(statement(Rows::Ids(chunk)))
                    .await?
                    .rows_affected();
            }
        }
        rows => affected += conn.execute_raw(statement(rows)).await?.rows_affected(),
    }
    Ok(affected)
}

/// Outbox DEAD → PENDING: a fresh attempt budget, no lease; `last_error` stays until it is sent.
pub(crate) async fn replay_outbox(txn: &DatabaseTransaction, rows: Rows<'_>) -> Result<u64, DbErr> {
    let affected = guarded_update(
        txn,
        Source::Outbox,
        &|sql: &mut Sql| {
            sql.push(&format!(
                "status = {}, attempts = 0, next_attempt_at = NULL, locked_by = NULL, \
                 locked_until = NULL, claim_token = NULL",
                OutboxStatus::Pending.literal()
            ));
        },
        OutboxStatus::Dead.literal(),
        rows,
    )
    .await?;
    made_unfinished(txn, affected).await
}

/// Inbox DEAD → RETRY due now: a fresh attempt budget; `last_error` stays until it is done.
pub(crate) async fn replay_inbox(txn: &DatabaseTransaction, rows: Rows<'_>) -> Result<u64, DbErr> {
    let affected = guarded_update(
        txn,
        Source::Inbox,
        &|sql: &mut Sql| {
            sql.push(&format!(
                "status = {}, attempts = 0, next_attempt_at = ",
                InboxStatus::Retry.literal()
            ))
            .time(DbTime::NOW)
            .push(", locked_by = NULL, locked_until = NULL, claim_token = NULL");
        },
        InboxStatus::Dead.literal(),
        rows,
    )
    .await?;
    made_unfinished(txn, affected).await
}

/// Inbox DEAD → IGNORED, finished now (so retention purges it after the dedup window).
pub(crate) async fn ignore_inbox(txn: &DatabaseTransaction, rows: Rows<'_>) -> Result<u64, DbErr> {
    guarded_update(
        txn,
        Source::Inbox,
        &|sql: &mut Sql| {
            sql.push(&format!(
                "status = {}, processed_at = ",
                InboxStatus::Ignored.literal()
            ))
            .time(DbTime::NOW)
            .push(", locked_until = NULL, claim_token = NULL");
        },
        InboxStatus::Dead.literal(),
        rows,
    )
    .await
}

/// Outbox SENT → PENDING, as if never sent: rows an earlier release marked SENT in place are
/// updated, rows in `outbox_sent` move back into `outbox_event` under their own id (one whose
/// dedup key a newer unsent event holds stays where it is).
pub(crate) async fn resend_outbox(txn: &DatabaseTransaction, rows: Rows<'_>) -> Result<u64, DbErr> {
    let mut affected = guarded_update(
        txn,
        Source::Outbox,
        &|sql: &mut Sql| {
            sql.push(&format!(
                "status = {}, sent_at = NULL, attempts = 0, next_attempt_at = NULL, \
                 locked_by = NULL, locked_until = NULL, claim_token = NULL, failure_class = NULL, \
                 last_error = NULL",
                OutboxStatus::Pending.literal()
            ));
        },
        OutboxStatus::Sent.literal(),
        rows,
    )
    .await?;
    match rows {
        Rows::Ids(ids) => {
            for chunk in ids.chunks(500) {
                affected += move_back(txn, Rows::Ids(chunk)).await?;
            }
        }
        rows => affected += move_back(txn, rows).await?,
    }
    made_unfinished(txn, affected).await
}

/// The `outbox_sent` rows `rows` selects, back into `outbox_event` as PENDING; returns how many
/// moved.
async fn move_back(txn: &DatabaseTransaction, rows: Rows<'_>) -> Result<u64, DbErr> {
    let dialect = Dialect::of(txn);
    let push_rows = |sql: &mut Sql| match rows {
        Rows::Ids(ids) => {
            sql.push(" AND id IN ")
                .bind_list(ids.iter().map(|id| Value::from(*id)));
        }
        Rows::Sent(filter) => push_sent_filter(sql, filter),
        Rows::Filter(_) => {
            sql.push(" AND 1 = 0");
        }
    };
    let columns = super::outbox::INSERT_COLUMNS.join(", ");
    let mut copy = Sql::new(dialect);
    copy.push(&format!(
        "INSERT INTO {OUTBOX_TABLE} (id, {columns}, status, attempts, created_at) \
         SELECT id, {columns}, {}, 0, created_at FROM {SENT_TABLE} WHERE 1 = 1",
        OutboxStatus::Pending.literal()
    ));
    push_rows(&mut copy);
    copy.push(" ").push(dialect.outbox_insert_select_conflict());
    let moved = txn.execute_raw(copy.build()).await?.rows_affected();
    if moved > 0 {
        let mut delete = Sql::new(dialect);
        delete.push(&format!("DELETE FROM {SENT_TABLE} WHERE 1 = 1"));
        push_rows(&mut delete);
        delete.push(&format!(
            " AND id IN (SELECT e.id FROM {OUTBOX_TABLE} e WHERE e.status = {})",
            OutboxStatus::Pending.literal()
        ));
        txn.execute_raw(delete.build()).await?;
    }
    Ok(moved)
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
        sql.push(dialect.lock_rows(false));
        for row in txn.query_all_raw(sql.build()).await? {
            found.insert(
                dialect.get_uuid(&row, "event_id")?,
                (row.try_get("", "id")?, row.try_get("", "status")?),
            );
        }
    }
    // Sent events that moved to `outbox_sent`.
    let missing: Vec<uuid::Uuid> = event_ids
        .iter()
        .filter(|id| !found.contains_key(id))
        .copied()
        .collect();
    for chunk in missing.chunks(500) {
        let mut sql = Sql::new(dialect);
        sql.push(&format!(
            "SELECT id, event_id FROM {SENT_TABLE} WHERE event_id IN "
        ))
        .bind_list(chunk.iter().map(|id| dialect.uuid(*id)));
        for row in txn.query_all_raw(sql.build()).await? {
            found.insert(
                dialect.get_uuid(&row, "event_id")?,
                (
                    row.try_get("", "id")?,
                    OutboxStatus::Sent.as_str().to_owned(),
                ),
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
    .time(DbTime::NOW)
    .push(")");
    if dialect.insert_returning() {
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
    let rows = db.query_all_raw(dialect.raw(sql)).await?;
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
