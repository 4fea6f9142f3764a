//! Recording where handled messages rotate (PostgreSQL, see `inbox_done.rs`): one statement
//! takes the keys and writes each new row into `inbox_done` or `inbox_event`.

use sea_orm::{ConnectionTrait, DbErr, Value};

use super::{
    INSERT_CHUNK, InboxState, MAX_KEY_CHARS, MAX_MESSAGE_ID_CHARS, MESSAGE_KEY, NewInboxRow,
    ROW_COLUMNS, Skip, push_unfinished_aggregates, row_values, state_columns,
};
use crate::store::{
    DbTime, Dialect, INBOX_TABLE,
    inbox_done::{self, RotationSeen},
    sql::{Arg, Sql},
    status::InboxStatus,
};
use crate::util::text::truncate;

/// Where the inbox rotates (see `inbox_done.rs`): one statement that takes the keys of `rows`
/// for the current period (read from `outbox_rotation` in the statement itself) and inserts
/// each row whose keys were new, a handled one into `inbox_done`, any other into `inbox_event`;
/// with `ordered` (the consumer), a row meant to be DONE is recorded PENDING when an unfinished
/// message of its aggregate was recorded before the statement. Rows must not share a message
/// key. `RETURNING message_id, status` of the rows inserted, and one row of NULLs, with nothing
/// written, when the rotation is off after all.
fn statement(
    dialect: Dialect,
    rows: &[(&NewInboxRow<'_>, &InboxState)],
    skip: Skip,
    ordered: Option<&str>,
) -> sea_orm::Statement {
    let mut keys = Vec::with_capacity(rows.len());
    for (row, _) in rows {
        keys.push((
            row.consumer.to_owned(),
            inbox_done::message_scope(&truncate(row.origin, MAX_KEY_CHARS)),
            truncate(row.message_id, MAX_MESSAGE_ID_CHARS),
        ));
        if let (Skip::AnyKey, Some(biz_key)) = (skip, row.biz_key) {
            keys.push((
                row.consumer.to_owned(),
                inbox_done::business_scope(&truncate(row.event_type.unwrap_or(""), MAX_KEY_CHARS)),
                truncate(biz_key, MAX_KEY_CHARS),
            ));
        }
    }
    let mut sql = Sql::new(dialect);
    sql.push("WITH ");
    if let Some(consumer) = ordered {
        sql.push("blocked AS (");
        push_unfinished_aggregates(
            &mut sql,
            consumer,
            rows.iter().filter_map(|(row, _)| {
                Some((
                    truncate(row.aggregate_type?, 128),
                    truncate(row.aggregate_id?, 255),
                ))
            }),
        );
        sql.push("), ");
    }
    inbox_done::push_key_ctes(&mut sql, &keys, matches!(skip, Skip::AnyKey));
    sql.push(&format!(
        ", v ({ROW_COLUMNS}, status, attempts, next_attempt_at, last_error, n) AS (VALUES "
    ));
    for (n, (row, state)) in rows.iter().enumerate() {
        let state = state_columns(state);
        if n > 0 {
            sql.push(", ");
        }
        sql.bind_list(row_values(row).into_iter().map(Arg::from).chain([
            Value::from(state.status.as_str().to_owned()).into(),
            Value::from(i64::from(state.attempts)).into(),
            Arg::time_or_null(dialect, state.next_attempt_at),
            Value::from(state.error.map(|e| truncate(e, 4000))).into(),
            Value::from(n as i64).into(),
        ]));
    }
    let done = InboxStatus::Done.literal();
    let (final_status, join) = if ordered.is_some() {
        (
            format!(
                "CASE WHEN b.aggregate_id IS NULL THEN v.status ELSE {} END",
                InboxStatus::Pending.literal()
            ),
            " LEFT JOIN blocked b ON b.aggregate_type = v.aggregate_type \
             AND b.aggregate_id = v.aggregate_id",
        )
    } else {
        ("v.status".to_owned(), "")
    };
    // Ids in arrival order across both tables (they share `inbox_event`'s sequence), taken once
    // per new row in the order given.
    sql.push(&format!(
        "), f AS (SELECT o.*, nextval(pg_get_serial_sequence('{INBOX_TABLE}', 'id')) AS new_id \
         FROM (SELECT v.*, {final_status} AS final_status FROM v{join} WHERE {}",
        inbox_done::fresh("v", "'m:' || v.origin", "v.message_id")
    ));
    if matches!(skip, Skip::AnyKey) {
        sql.push(&format!(
            " AND (v.biz_key IS NULL OR {})",
            inbox_done::fresh("v", "'b:' || COALESCE(v.event_type, '')", "v.biz_key")
        ));
    }
    // A message recorded before the rotation was switched on is in `inbox_event`, without keys.
    sql.push(&format!(
        " AND NOT EXISTS (SELECT 1 FROM {INBOX_TABLE} x WHERE x.consumer = v.consumer \
         AND x.origin = v.origin AND x.message_id = v.message_id) ORDER BY v.n) o"
    ));
    let selected = ROW_COLUMNS
        .split(", ")
        .map(|column| format!("f.{column}"))
        .collect::<Vec<_>>()
        .join(", ");
    sql.push("), d AS (")
        .push(&inbox_done::insert_head(
            dialect,
            &format!("id, {ROW_COLUMNS}, status, attempts, received_at, processed_at"),
        ))
        .push(&format!("f.new_id, {selected}, f.final_status, f.attempts, "))
        .time(DbTime::NOW)
        .push(", ")
        .time(DbTime::NOW)
        .push(&format!(
            " FROM f WHERE f.final_status = {done} ORDER BY f.n RETURNING message_id, status), \
             e AS (INSERT INTO {INBOX_TABLE} (id, {ROW_COLUMNS}, status, attempts, \
             next_attempt_at, last_error, received_at) SELECT f.new_id, {selected}, f.final_status, \
             CASE WHEN f.final_status = f.status THEN f.attempts ELSE 0 END, \
             CAST(f.next_attempt_at AS TIMESTAMPTZ), f.last_error, "
        ))
        .time(DbTime::NOW)
        .push(&format!(" FROM f WHERE f.final_status <> {done} ORDER BY f.n"));
    let on_conflict = match skip {
        Skip::MessageKey => dialect.insert_skipping(MESSAGE_KEY).1,
        Skip::AnyKey => dialect.insert_skipping_any().1.map(str::to_owned),
    };
    if let Some(on_conflict) = on_conflict {
        sql.push(&on_conflict);
    }
    sql.push(
        " RETURNING message_id, status) SELECT message_id, status FROM d \
         UNION ALL SELECT message_id, status FROM e \
         UNION ALL SELECT NULL, NULL WHERE NOT EXISTS (SELECT 1 FROM kp)",
    );
    sql.build()
}

/// [`statement`] run over `rows` in chunks: for each row, the status it was recorded
/// with, or `None` (a duplicate; of two rows with the same message key, the second). `None`
/// as a whole, with nothing recorded, where the inbox does not rotate: record the old way.
pub(super) async fn record<C: ConnectionTrait>(
    conn: &C,
    seen: &RotationSeen,
    rows: &[(&NewInboxRow<'_>, &InboxState)],
    skip: Skip,
    ordered: Option<&str>,
) -> Result<Option<Vec<Option<InboxStatus>>>, DbErr> {
    if !seen.rotates(conn).await? {
        return Ok(None);
    }
    let dialect = Dialect::of(conn);
    let mut recorded = Vec::with_capacity(rows.len());
    for chunk in rows.chunks(INSERT_CHUNK) {
        let key = |row: &NewInboxRow<'_>| {
            (
                truncate(row.origin, MAX_KEY_CHARS),
                truncate(row.message_id, MAX_MESSAGE_ID_CHARS),
            )
        };
        let mut distinct = std::collections::HashSet::new();
        let unique: Vec<(&NewInboxRow<'_>, &InboxState)> = chunk
            .iter()
            .copied()
            .filter(|(row, _)| distinct.insert(key(row)))
            .collect();
        let mut returned = std::collections::HashMap::new();
        for row in conn
            .query_all_raw(statement(dialect, &unique, skip, ordered))
            .await?
        {
            let Some(message_id) = row.try_get::<Option<String>>("", "message_id")? else {
                // The rotation's row is gone: nothing of this chunk was written.
                seen.forget();
                if recorded.is_empty() {
                    return Ok(None);
                }
                return Err(DbErr::Custom(
                    "the inbox's rotation was switched off while a batch was recorded".to_owned(),
                ));
            };
            let status: String = row.try_get("", "status")?;
            returned.insert(message_id, InboxStatus::parse(&status));
        }
        for (row, _) in chunk {
            // `remove`: a second row with the same id in the chunk was the one skipped.
            recorded.push(
                returned
                    .remove(&truncate(row.message_id, MAX_MESSAGE_ID_CHARS))
                    .flatten(),
            );
        }
    }
    Ok(Some(recorded))
}
