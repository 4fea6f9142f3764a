//! Recording where handled messages rotate (PostgreSQL, see `inbox_done.rs`): one statement
//! takes the keys and writes each new row into `inbox_done` or `inbox_event`.

use sea_orm::{ConnectionTrait, DbErr};

use super::{
    INSERT_CHUNK, InboxState, MAX_KEY_CHARS, MAX_MESSAGE_ID_CHARS, MESSAGE_KEY, NewInboxRow,
    ROW_COLUMNS, Skip, state_columns,
};
use crate::store::{
    DbTime, Dialect, INBOX_TABLE,
    inbox_done::{self, RotationSeen},
    sql::Sql,
    status::InboxStatus,
};
use crate::util::text::{hex, truncate};

/// The column list `json_to_recordset` reads a batch's rows with: [`ROW_COLUMNS`] (the payload
/// as hexadecimal text), the state's columns (`next_micros`: the due time as microseconds after
/// the statement's time) and the row's place in the batch.
const JSON_COLUMNS: &str = "consumer VARCHAR, message_id VARCHAR, origin VARCHAR, \
     biz_key VARCHAR, headers TEXT, event_type VARCHAR, source VARCHAR, aggregate_type VARCHAR, \
     aggregate_id VARCHAR, aggregate_version BIGINT, schema_version INTEGER, payload TEXT, \
     status VARCHAR, attempts INTEGER, next_micros BIGINT, last_error TEXT, n INTEGER";

/// `rows` as the JSON array [`JSON_COLUMNS`] describes.
fn rows_json(rows: &[(&NewInboxRow<'_>, &InboxState)]) -> String {
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .enumerate()
        .map(|(n, (row, state))| {
            let state = state_columns(state);
            serde_json::json!({
                "consumer": row.consumer,
                "message_id": truncate(row.message_id, MAX_MESSAGE_ID_CHARS),
                "origin": truncate(row.origin, MAX_KEY_CHARS),
                "biz_key": row.biz_key.map(|s| truncate(s, MAX_KEY_CHARS)),
                "headers": row.headers,
                "event_type": row.event_type.map(|s| truncate(s, MAX_KEY_CHARS)),
                "source": row.source.map(|s| truncate(s, MAX_KEY_CHARS)),
                "aggregate_type": row.aggregate_type.map(|s| truncate(s, 128)),
                "aggregate_id": row.aggregate_id.map(|s| truncate(s, 255)),
                "aggregate_version": row.aggregate_version,
                "schema_version": row.schema_version,
                "payload": hex(row.payload),
                "status": state.status.as_str(),
                "attempts": state.attempts,
                "next_micros": state.next_attempt_at.map(DbTime::offset_micros),
                "last_error": state.error.map(|e| truncate(e, 4000)),
                "n": n,
            })
        })
        .collect();
    serde_json::Value::Array(rows).to_string()
}

/// Where the inbox rotates (see `inbox_done.rs`): one statement that takes the keys of `rows`
/// for the current period (read from `outbox_rotation` in the statement itself) and inserts
/// each row whose keys were new, a handled one into `inbox_done`, any other into `inbox_event`;
/// with `ordered`, a row meant to be DONE is recorded PENDING when an unfinished message of its
/// aggregate was recorded before the statement. Rows must not share a message key.
/// `RETURNING message_id, status` of the rows inserted, and one row of NULLs, with nothing
/// written, when the rotation is off after all.
///
/// The rows travel as one JSON parameter, so the statement's text is the same for any number
/// of rows: the server plans it once per connection and reuses the plan.
fn statement(
    dialect: Dialect,
    rows: &[(&NewInboxRow<'_>, &InboxState)],
    skip: Skip,
    ordered: bool,
) -> sea_orm::Statement {
    let mut sql = Sql::new(dialect);
    let selected = |prefix: &str| {
        ROW_COLUMNS
            .split(", ")
            .map(|column| format!("{prefix}.{column}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    sql.push(&format!(
        "WITH v AS (SELECT {columns}, decode(j.payload, 'hex') AS payload, j.status, j.attempts, \
         {due} AS next_attempt_at, j.last_error, j.n FROM json_to_recordset(CAST(",
        columns = selected("j").replace(", j.payload", ""),
        due = dialect.time_expression(Some("j.next_micros")),
    ))
    .bind(rows_json(rows).into())
    .push(&format!(" AS json)) AS j ({JSON_COLUMNS})), "));
    // The keys each row takes: its message key, and with `AnyKey` its business key.
    sql.push(
        "n AS (SELECT v.n AS i, v.consumer, 'm:' || v.origin AS scope, v.message_id AS name FROM v",
    );
    if matches!(skip, Skip::AnyKey) {
        sql.push(
            " UNION ALL SELECT v.n, v.consumer, 'b:' || COALESCE(v.event_type, ''), v.biz_key \
             FROM v WHERE v.biz_key IS NOT NULL",
        );
    }
    sql.push("), ");
    if ordered {
        // One probe of the aggregate index per row that has an aggregate.
        sql.push(&format!(
            "blocked AS (SELECT DISTINCT v.aggregate_type, v.aggregate_id FROM v \
             WHERE EXISTS (SELECT 1 FROM {INBOX_TABLE} i WHERE i.consumer = v.consumer \
             AND i.aggregate_type = v.aggregate_type AND i.aggregate_id = v.aggregate_id AND {})), ",
            InboxStatus::in_list("i.", &InboxStatus::UNFINISHED)
        ));
    }
    inbox_done::push_key_ctes(&mut sql, matches!(skip, Skip::AnyKey));
    let done = InboxStatus::Done.literal();
    let (final_status, join) = if ordered {
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
        ", f AS (SELECT o.*, nextval(pg_get_serial_sequence('{INBOX_TABLE}', 'id')) AS new_id \
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
    let selected = selected("f");
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
             f.next_attempt_at, f.last_error, "
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
    ordered: bool,
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
