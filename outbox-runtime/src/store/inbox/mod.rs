//! The inbox's SQL: record a delivery once per `(consumer, origin, message_id)` (and an external
//! message once per business key); the statement that does it where handled messages rotate
//! (`rotating.rs`); the worker's claims and fenced write-backs (`worker.rs`).

mod rotating;
mod worker;

#[cfg(feature = "test-util")]
pub use worker::mark_done;
pub(crate) use worker::mark_done_seen;
pub use worker::{ClaimedMessage, claim_from, mark_failed, next_retry_in, release, sample_floor};
#[cfg(feature = "test-util")]
pub use worker::{InboxClaim, claim};

use sea_orm::{ConnectionTrait, DbErr, Value};

use super::{
    AGGREGATE_VERSION_TABLE, DbTime, Dialect, INBOX_TABLE,
    failures::{self, Failed},
    inbox_done::{self, RotationSeen},
    sql::{Arg, Sql},
    status::{Failure, InboxStatus},
};
use crate::operations::Source;
use crate::util::text::truncate;

pub use super::schema::{MAX_KEY_CHARS, MAX_MESSAGE_ID_CHARS};

/// The physical key of an inbox row: what a redelivery is recognised by.
pub const MESSAGE_KEY: &str = "consumer, origin, message_id";

const COLUMNS: &str = "id, consumer, message_id, origin, event_type, source, biz_key, headers, \
     aggregate_type, aggregate_id, payload, status, attempts, locked_until";

/// A delivery to record.
#[derive(Debug, Clone, Default)]
pub struct NewInboxRow<'a> {
    /// Consumer name.
    pub consumer: &'a str,
    /// Message id (the CloudEvents `id`, or a digest of an undecodable body).
    pub message_id: &'a str,
    /// Who assigned `message_id`: empty for messages of this SDK's producers, the sender's
    /// source for an external message.
    pub origin: &'a str,
    /// The business key of an external message, unique per consumer and event type.
    pub biz_key: Option<&'a str>,
    /// Headers kept with an external message, as a JSON object.
    pub headers: Option<&'a str>,
    /// Event type, when known.
    pub event_type: Option<&'a str>,
    /// CloudEvents source, when known.
    pub source: Option<&'a str>,
    /// Aggregate type, when known.
    pub aggregate_type: Option<&'a str>,
    /// Aggregate id, when known.
    pub aggregate_id: Option<&'a str>,
    /// Aggregate version, when known.
    pub aggregate_version: Option<i64>,
    /// Schema version, when known.
    pub schema_version: Option<u32>,
    /// The message as received.
    pub payload: &'a [u8],
}

/// The state a delivery is recorded in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InboxState {
    /// Handled in the same transaction.
    Done,
    /// To be handled by the worker.
    Pending,
    /// The handler failed: RETRY at a due time, or DEAD.
    Failed(Failure),
}

/// The columns a state sets.
struct StateColumns<'a> {
    status: InboxStatus,
    attempts: u32,
    next_attempt_at: Option<DbTime>,
    error: Option<&'a str>,
    processed_at: Option<DbTime>,
}

fn state_columns(state: &InboxState) -> StateColumns<'_> {
    match state {
        InboxState::Done => StateColumns {
            status: InboxStatus::Done,
            attempts: 1,
            next_attempt_at: None,
            error: None,
            processed_at: Some(DbTime::NOW),
        },
        InboxState::Pending => StateColumns {
            status: InboxStatus::Pending,
            attempts: 0,
            next_attempt_at: None,
            error: None,
            processed_at: None,
        },
        InboxState::Failed(failure) => StateColumns {
            status: failure.inbox_status(),
            attempts: failure.attempts(),
            next_attempt_at: failure.due(),
            error: Some(failure.error()),
            processed_at: None,
        },
    }
}

/// The columns that say what a row's message is.
const ROW_COLUMNS: &str = "consumer, message_id, origin, biz_key, headers, event_type, source, \
                           aggregate_type, aggregate_id, aggregate_version, schema_version, payload";

/// A row's values for [`ROW_COLUMNS`].
fn row_values(row: &NewInboxRow<'_>) -> [Value; 12] {
    [
        row.consumer.to_owned().into(),
        truncate(row.message_id, MAX_MESSAGE_ID_CHARS).into(),
        truncate(row.origin, MAX_KEY_CHARS).into(),
        row.biz_key.map(|s| truncate(s, MAX_KEY_CHARS)).into(),
        row.headers.map(str::to_owned).into(),
        row.event_type.map(|s| truncate(s, MAX_KEY_CHARS)).into(),
        row.source.map(|s| truncate(s, MAX_KEY_CHARS)).into(),
        row.aggregate_type.map(|s| truncate(s, 128)).into(),
        row.aggregate_id.map(|s| truncate(s, 255)).into(),
        row.aggregate_version.into(),
        row.schema_version.map(i64::from).into(),
        row.payload.to_vec().into(),
    ]
}

/// Which conflicts an `INSERT` of inbox rows skips.
#[derive(Clone, Copy)]
enum Skip {
    /// A row whose `(consumer, origin, message_id)` is recorded.
    MessageKey,
    /// A row that meets any unique key (an external message: its business key too).
    AnyKey,
}

/// `INSERT` of `rows` that skips the rows `skip` names, optionally `RETURNING` the message ids
/// it inserted (where the dialect can).
fn insert_statement(
    dialect: Dialect,
    rows: &[(&NewInboxRow<'_>, &InboxState)],
    skip: Skip,
    returning: bool,
) -> sea_orm::Statement {
    let (insert, on_conflict) = match skip {
        Skip::MessageKey => dialect.insert_skipping(MESSAGE_KEY),
        Skip::AnyKey => {
            let (insert, tail) = dialect.insert_skipping_any();
            (insert, tail.map(str::to_owned))
        }
    };
    let mut sql = Sql::new(dialect);
    sql.push(insert).push(INBOX_TABLE).push(&format!(
        " ({ROW_COLUMNS}, status, attempts, next_attempt_at, last_error, received_at, \
         processed_at) VALUES "
    ));
    for (n, (row, state)) in rows.iter().enumerate() {
        let state = state_columns(state);
        let values = row_values(row).into_iter().map(Arg::from).chain([
            Value::from(state.status.as_str().to_owned()).into(),
            Value::from(i64::from(state.attempts)).into(),
            Arg::time_or_null(dialect, state.next_attempt_at),
            Value::from(state.error.map(|e| truncate(e, 4000))).into(),
            DbTime::NOW.into(),
            Arg::time_or_null(dialect, state.processed_at),
        ]);
        if n > 0 {
            sql.push(", ");
        }
        sql.bind_list(values);
    }
    if let Some(on_conflict) = on_conflict {
        sql.push(&on_conflict);
    }
    if returning {
        sql.push(" RETURNING message_id");
    }
    sql.build()
}

/// Record a delivery unless `(consumer, origin, message_id)` is already there. Returns whether it was
/// inserted (`false`: a duplicate).
pub async fn insert<C: ConnectionTrait>(
    conn: &C,
    row: &NewInboxRow<'_>,
    state: &InboxState,
) -> Result<bool, DbErr> {
    let seen = RotationSeen::default();
    let inserted =
        match rotating::record(conn, &seen, &[(row, state)], Skip::MessageKey, false).await? {
            Some(recorded) => recorded.first().is_some_and(Option::is_some),
            None => {
                let statement =
                    insert_statement(Dialect::of(conn), &[(row, state)], Skip::MessageKey, false);
                conn.execute_raw(statement).await?.rows_affected() == 1
            }
        };
    if inserted && matches!(state, InboxState::Failed(_)) {
        failures::append(conn, Source::Inbox, message(row)).await?;
    }
    Ok(inserted)
}

/// The history selector of one message.
fn message<'a>(row: &NewInboxRow<'a>) -> Failed<'a> {
    Failed::Message {
        consumer: row.consumer,
        origin: row.origin,
        message_id: row.message_id,
    }
}

/// Rows one multi-row insert takes at most (18 parameters each).
const INSERT_CHUNK: usize = 64;

/// Record several deliveries: for each row, whether it was inserted (`false`: a duplicate); of
/// two rows with the same message id, only the first. One statement per 64 rows where the
/// dialect's INSERT can say which rows it inserted, one per row elsewhere.
pub async fn insert_many<C: ConnectionTrait>(
    conn: &C,
    rows: &[(NewInboxRow<'_>, InboxState)],
) -> Result<Vec<bool>, DbErr> {
    let dialect = Dialect::of(conn);
    let pairs: Vec<(&NewInboxRow<'_>, &InboxState)> =
        rows.iter().map(|(row, state)| (row, state)).collect();
    let seen = RotationSeen::default();
    if let Some(recorded) = rotating::record(conn, &seen, &pairs, Skip::MessageKey, false).await? {
        for ((row, state), recorded) in rows.iter().zip(&recorded) {
            if recorded.is_some() && matches!(state, InboxState::Failed(_)) {
                failures::append(conn, Source::Inbox, message(row)).await?;
            }
        }
        return Ok(recorded.iter().map(Option::is_some).collect());
    }
    let mut inserted = Vec::with_capacity(rows.len());
    if !dialect.insert_returning() {
        for (row, state) in rows {
            inserted.push(insert(conn, row, state).await?);
        }
        return Ok(inserted);
    }
    for chunk in rows.chunks(INSERT_CHUNK) {
        let pairs: Vec<(&NewInboxRow<'_>, &InboxState)> =
            chunk.iter().map(|(row, state)| (row, state)).collect();
        let mut returned: std::collections::HashSet<String> = std::collections::HashSet::new();
        for row in conn
            .query_all_raw(insert_statement(dialect, &pairs, Skip::MessageKey, true))
            .await?
        {
            returned.insert(row.try_get("", "message_id")?);
        }
        for (row, state) in chunk {
            // `remove`: a second row with the same id in the batch was the one skipped.
            let new = returned.remove(&truncate(row.message_id, MAX_MESSAGE_ID_CHARS));
            if new && matches!(state, InboxState::Failed(_)) {
                failures::append(conn, Source::Inbox, message(row)).await?;
            }
            inserted.push(new);
        }
    }
    Ok(inserted)
}

/// How [`record_batch`] recorded one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// As DONE: its handler runs now, in the batch's transaction.
    Done,
    /// As PENDING, behind an unfinished message of its aggregate recorded before the batch.
    Pending,
    /// Not at all: `(consumer, message_id)` was recorded before (or earlier in the batch).
    Duplicate,
}

/// Record a batch of deliveries for one consumer: each row as DONE, or as PENDING when `ordered`
/// and an unfinished message of its aggregate was recorded before the batch. The statement
/// runs before the batch's handlers, in their transaction; a handler that fails then
/// [`restate`]s its row. Returns how each row was recorded, in order.
///
/// Where the dialect can, this is one statement that looks the aggregates up and inserts,
/// skipping duplicates, and returns what it inserted with the status it chose; elsewhere the
/// aggregates' query, then [`insert_many`].
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
pub async fn record_batch<C: ConnectionTrait>(
    conn: &C,
    rows: &[NewInboxRow<'_>],
    ordered: bool,
) -> Result<Vec<Recorded>, DbErr> {
    record_batch_seen(conn, rows, ordered, &RotationSeen::default()).await
}

/// [`record_batch`] by a consumer that keeps what it saw of the inbox's rotation in `seen`
/// (once seen on, no query asks again).
pub(crate) async fn record_batch_seen<C: ConnectionTrait>(
    conn: &C,
    rows: &[NewInboxRow<'_>],
    ordered: bool,
    seen: &RotationSeen,
) -> Result<Vec<Recorded>, DbErr> {
    let dialect = Dialect::of(conn);
    fn aggregate_of<'a>(row: &NewInboxRow<'a>) -> Option<(&'a str, &'a str)> {
        Some((row.aggregate_type?, row.aggregate_id?))
    }
    let any_aggregate = ordered && rows.iter().any(|row| aggregate_of(row).is_some());
    let pairs: Vec<(&NewInboxRow<'_>, &InboxState)> =
        rows.iter().map(|row| (row, &InboxState::Done)).collect();
    if let Some(recorded) =
        rotating::record(conn, seen, &pairs, Skip::MessageKey, any_aggregate).await?
    {
        return Ok(recorded
            .into_iter()
            .map(|status| match status {
                None => Recorded::Duplicate,
                Some(InboxStatus::Pending) => Recorded::Pending,
                Some(_) => Recorded::Done,
            })
            .collect());
    }
    if dialect.records_ordered_batch_in_one_statement() && any_aggregate {
        let mut recorded = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(INSERT_CHUNK) {
            let mut returned = std::collections::HashMap::new();
            for row in conn
                .query_all_raw(record_ordered_statement(dialect, chunk))
                .await?
            {
                let message_id: String = row.try_get("", "message_id")?;
                let status: String = row.try_get("", "status")?;
                returned.insert(message_id, status == InboxStatus::Pending.as_str());
            }
            for row in chunk {
                // `remove`: a second row with the same id in the batch was the one skipped.
                recorded.push(
                    match returned.remove(&truncate(row.message_id, MAX_MESSAGE_ID_CHARS)) {
                        None => Recorded::Duplicate,
                        Some(true) => Recorded::Pending,
                        Some(false) => Recorded::Done,
                    },
                );
            }
        }
        return Ok(recorded);
    }
    let blocked = if any_aggregate {
        let consumer = rows.first().map_or("", |row| row.consumer);
        let aggregates: Vec<(&str, &str)> = rows.iter().filter_map(aggregate_of).collect();
        unfinished_aggregates(conn, consumer, &aggregates).await?
    } else {
        Default::default()
    };
    let states: Vec<(NewInboxRow<'_>, InboxState)> = rows
        .iter()
        .map(|row| {
            // `blocked` is empty unless `ordered`.
            let waits = aggregate_of(row)
                .is_some_and(|(t, id)| blocked.contains(&(t.to_owned(), id.to_owned())));
            let state = if waits {
                InboxState::Pending
            } else {
                InboxState::Done
            };
            (row.clone(), state)
        })
        .collect();
    let inserted = insert_many(conn, &states).await?;
    Ok(states
        .iter()
        .zip(inserted)
        .map(|((_, state), inserted)| match (inserted, state) {
            (false, _) => Recorded::Duplicate,
            (true, InboxState::Pending) => Recorded::Pending,
            (true, _) => Recorded::Done,
        })
        .collect())
}

/// The rows inserted as DONE, or as PENDING behind an unfinished message of their
/// aggregate recorded before this statement (its snapshot does not see its own rows), in the
/// order given, `RETURNING message_id, status`.
fn record_ordered_statement(dialect: Dialect, rows: &[NewInboxRow<'_>]) -> sea_orm::Statement {
    let consumer = rows.first().map_or("", |row| row.consumer);
    let mut sql = Sql::new(dialect);
    sql.push("WITH blocked AS (");
    push_unfinished_aggregates(
        &mut sql,
        consumer,
        rows.iter().filter_map(|row| {
            Some((
                truncate(row.aggregate_type?, 128),
                truncate(row.aggregate_id?, 255),
            ))
        }),
    );
    sql.push(&format!(
        ") INSERT INTO {INBOX_TABLE} ({ROW_COLUMNS}, status, attempts, received_at, \
         processed_at) SELECT {selected}, \
         CASE WHEN b.aggregate_id IS NULL THEN {done} ELSE {pending} END, \
         CASE WHEN b.aggregate_id IS NULL THEN 1 ELSE 0 END, v.received_at, \
         CASE WHEN b.aggregate_id IS NULL THEN v.received_at END FROM (VALUES ",
        selected = ROW_COLUMNS
            .split(", ")
            .map(|column| format!("v.{column}"))
            .collect::<Vec<_>>()
            .join(", "),
        done = InboxStatus::Done.literal(),
        pending = InboxStatus::Pending.literal(),
    ));
    for (n, row) in rows.iter().enumerate() {
        if n > 0 {
            sql.push(", ");
        }
        sql.bind_list(
            row_values(row)
                .into_iter()
                .map(Arg::from)
                .chain([DbTime::NOW.into(), Value::from(n as i64).into()]),
        );
    }
    sql.push(&format!(
        ") AS v ({ROW_COLUMNS}, received_at, n) \
         LEFT JOIN blocked b ON b.aggregate_type = v.aggregate_type \
         AND b.aggregate_id = v.aggregate_id ORDER BY v.n \
         ON CONFLICT ({MESSAGE_KEY}) DO NOTHING RETURNING message_id, status"
    ));
    sql.build()
}

/// Record an external message as PENDING unless one of its unique keys is taken: its
/// `(consumer, origin, message_id)`, its `(consumer, event_type, biz_key)`, or (before
/// migration `outbox_0007`) the old `(consumer, message_id)`. Returns whether it was inserted;
/// when not, [`recorded`] and [`recorded_business_fact`] tell which key it met.
pub async fn insert_external<C: ConnectionTrait>(
    conn: &C,
    row: &NewInboxRow<'_>,
) -> Result<bool, DbErr> {
    let seen = RotationSeen::default();
    let pending = [(row, &InboxState::Pending)];
    if let Some(recorded) = rotating::record(conn, &seen, &pending, Skip::AnyKey, false).await? {
        return Ok(recorded.first().is_some_and(Option::is_some));
    }
    let statement = insert_statement(
        Dialect::of(conn),
        &[(row, &InboxState::Pending)],
        Skip::AnyKey,
        false,
    );
    Ok(conn.execute_raw(statement).await?.rows_affected() == 1)
}

/// The tables a recorded message may be in: `inbox_event`, and `inbox_done` where handled
/// messages may have moved (see `inbox_done.rs`).
async fn recorded_tables<C: ConnectionTrait>(conn: &C) -> Result<&'static [&'static str], DbErr> {
    Ok(if inbox_done::rotating(conn).await?.is_some() {
        &[INBOX_TABLE, inbox_done::DONE_TABLE]
    } else {
        &[INBOX_TABLE]
    })
}

/// `columns` of the first row of `consumer` whose two key columns hold the values given, in
/// every table that may record it ([`recorded_tables`]).
async fn first_recorded<C: ConnectionTrait>(
    conn: &C,
    columns: &str,
    consumer: &str,
    keys: [(&str, String); 2],
) -> Result<Option<sea_orm::QueryResult>, DbErr> {
    let mut sql = Sql::new(Dialect::of(conn));
    for (i, table) in recorded_tables(conn).await?.iter().enumerate() {
        if i > 0 {
            sql.push(" UNION ALL ");
        }
        sql.push(&format!("SELECT {columns} FROM {table} WHERE consumer = "))
            .bind(consumer.to_owned().into());
        for (column, value) in &keys {
            sql.push(&format!(" AND {column} = "))
                .bind(value.clone().into());
        }
    }
    conn.query_one_raw(sql.build()).await
}

/// The message recorded first for a business fact: its origin and message id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusinessFact {
    /// Who assigned its message id.
    pub origin: String,
    /// Its message id.
    pub message_id: String,
    /// Its status.
    pub status: String,
}

/// The message recorded for `(consumer, event_type, biz_key)`, if any.
pub async fn recorded_business_fact<C: ConnectionTrait>(
    conn: &C,
    consumer: &str,
    event_type: &str,
    biz_key: &str,
) -> Result<Option<BusinessFact>, DbErr> {
    let found = first_recorded(
        conn,
        "origin, message_id, status",
        consumer,
        [
            ("event_type", truncate(event_type, MAX_KEY_CHARS)),
            ("biz_key", truncate(biz_key, MAX_KEY_CHARS)),
        ],
    )
    .await?;
    found
        .map(|row| {
            Ok(BusinessFact {
                origin: row.try_get("", "origin")?,
                message_id: row.try_get("", "message_id")?,
                status: row.try_get("", "status")?,
            })
        })
        .transpose()
}

/// Put a message recorded in this transaction (by [`insert`] or [`insert_many`]) into `state`:
/// a batch recorded it as DONE before its handler failed or before an earlier message of its
/// aggregate did.
pub async fn restate<C: ConnectionTrait>(
    conn: &C,
    consumer: &str,
    message_id: &str,
    state: &InboxState,
) -> Result<(), DbErr> {
    let dialect = Dialect::of(conn);
    let state = state_columns(state);
    let message_id_kept = truncate(message_id, MAX_MESSAGE_ID_CHARS);
    let moved = inbox_done::may_hold_done(conn)
        && inbox_done::move_back(conn, consumer, &message_id_kept, |sql| {
            sql.bind(state.status.as_str().to_owned().into())
                .push(", ")
                .bind(i64::from(state.attempts).into())
                .push(", ")
                .arg(Arg::time_or_null(dialect, state.next_attempt_at))
                .push(", ")
                .bind(state.error.map(|e| truncate(e, 4000)).into())
                .push(", ")
                .arg(Arg::time_or_null(dialect, state.processed_at));
        })
        .await?;
    let mut sql = Sql::new(dialect);
    sql.push(&format!("UPDATE {INBOX_TABLE} SET status = "))
        .bind(state.status.as_str().to_owned().into())
        .push(", attempts = ")
        .bind(i64::from(state.attempts).into())
        .push(", next_attempt_at = ")
        .arg(Arg::time_or_null(dialect, state.next_attempt_at))
        .push(", last_error = ")
        .bind(state.error.map(|e| truncate(e, 4000)).into())
        .push(", processed_at = ")
        .arg(Arg::time_or_null(dialect, state.processed_at))
        .push(" WHERE consumer = ")
        .bind(consumer.to_owned().into())
        .push(" AND origin = '' AND message_id = ")
        .bind(message_id_kept.into());
    if !moved {
        conn.execute_raw(sql.build()).await?;
    }
    if state.error.is_some() {
        let failed = Failed::Message {
            consumer,
            origin: "",
            message_id,
        };
        failures::append(conn, Source::Inbox, failed).await?;
    }
    Ok(())
}

/// What is recorded for a `(consumer, message_id)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedMessage {
    /// Its status.
    pub status: String,
    /// The message as first received.
    pub payload: Vec<u8>,
}

/// What is recorded for `(consumer, origin, message_id)`, if anything: what a delivery that
/// [`insert`] reported as a duplicate is compared with.
pub async fn recorded<C: ConnectionTrait>(
    conn: &C,
    consumer: &str,
    origin: &str,
    message_id: &str,
) -> Result<Option<RecordedMessage>, DbErr> {
    let found = first_recorded(
        conn,
        "status, payload",
        consumer,
        [
            ("origin", truncate(origin, MAX_KEY_CHARS)),
            ("message_id", truncate(message_id, MAX_MESSAGE_ID_CHARS)),
        ],
    )
    .await?;
    found
        .map(|row| {
            Ok(RecordedMessage {
                status: row.try_get("", "status")?,
                payload: row.try_get("", "payload")?,
            })
        })
        .transpose()
}

/// Of `aggregates` (type, id), those with an unfinished message of `consumer`: one query for a
/// batch of deliveries instead of a query per delivery.
pub async fn unfinished_aggregates<C: ConnectionTrait>(
    conn: &C,
    consumer: &str,
    aggregates: &[(&str, &str)],
) -> Result<std::collections::HashSet<(String, String)>, DbErr> {
    let mut found = std::collections::HashSet::new();
    if aggregates.is_empty() {
        return Ok(found);
    }
    let mut sql = Sql::new(Dialect::of(conn));
    push_unfinished_aggregates(
        &mut sql,
        consumer,
        aggregates
            .iter()
            .map(|&(t, id)| (t.to_owned(), id.to_owned())),
    );
    for row in conn.query_all_raw(sql.build()).await? {
        found.insert((
            row.try_get("", "aggregate_type")?,
            row.try_get("", "aggregate_id")?,
        ));
    }
    Ok(found)
}

/// `SELECT DISTINCT aggregate_type, aggregate_id` of `consumer`'s unfinished messages of
/// `aggregates` (type, id; none selects nothing).
fn push_unfinished_aggregates(
    sql: &mut Sql,
    consumer: &str,
    aggregates: impl Iterator<Item = (String, String)>,
) {
    let unfinished = unfinished(&sql.dialect, "");
    sql.push(&format!(
        "SELECT DISTINCT aggregate_type, aggregate_id FROM {INBOX_TABLE} WHERE consumer = "
    ))
    .bind(consumer.to_owned().into())
    .push(" AND ")
    .push(&unfinished)
    .push(" AND (");
    let mut any = false;
    for (aggregate_type, aggregate_id) in aggregates {
        if any {
            sql.push(" OR ");
        }
        any = true;
        sql.push("(aggregate_type = ")
            .bind(aggregate_type.into())
            .push(" AND aggregate_id = ")
            .bind(aggregate_id.into())
            .push(")");
    }
    sql.push(if any { ")" } else { "1 = 0)" });
}

/// "This message holds its aggregate back": the partial indexes' predicate.
fn unfinished(_dialect: &Dialect, prefix: &str) -> String {
    InboxStatus::in_list(prefix, &InboxStatus::UNFINISHED)
}

/// The aggregate-version guard: record `version` as the newest this consumer accepted for the
/// aggregate, unless it already accepted this version or a newer one. Returns whether the event
/// is new (`false`: stale or repeated, drop it). Runs in the handler's transaction, so a handler
/// that fails later rolls the record back with everything else.
pub async fn accept_version<C: ConnectionTrait>(
    conn: &C,
    consumer: &str,
    aggregate_type: &str,
    aggregate_id: &str,
    version: i64,
) -> Result<bool, DbErr> {
    let dialect = Dialect::of(conn);
    let advance = || {
        let mut sql = Sql::new(dialect);
        sql.push(&format!("UPDATE {AGGREGATE_VERSION_TABLE} SET version = "))
            .bind(version.into())
            .push(" WHERE consumer = ")
            .bind(consumer.to_owned().into())
            .push(" AND aggregate_type = ")
            .bind(aggregate_type.to_owned().into())
            .push(" AND aggregate_id = ")
            .bind(aggregate_id.to_owned().into())
            .push(" AND version < ")
            .bind(version.into());
        sql.build()
    };
    if conn.execute_raw(advance()).await?.rows_affected() == 1 {
        return Ok(true);
    }
    let (insert, on_conflict) = dialect.insert_skipping("consumer, aggregate_type, aggregate_id");
    let mut sql = Sql::new(dialect);
    sql.push(insert)
        .push(&format!(
            "{AGGREGATE_VERSION_TABLE} (consumer, aggregate_type, aggregate_id, version) VALUES ("
        ))
        .bind(consumer.to_owned().into())
        .push(", ")
        .bind(aggregate_type.to_owned().into())
        .push(", ")
        .bind(aggregate_id.to_owned().into())
        .push(", ")
        .bind(version.into())
        .push(")");
    if let Some(on_conflict) = on_conflict {
        sql.push(&on_conflict);
    }
    if conn.execute_raw(sql.build()).await?.rows_affected() == 1 {
        return Ok(true);
    }
    // Another transaction recorded this aggregate meanwhile: compare against what it wrote.
    Ok(conn.execute_raw(advance()).await?.rows_affected() == 1)
}
