//! The commit-time INSERT of a transaction's buffered events into `outbox_event`, and the
//! events it carries and skips.

use std::{
    borrow::Cow,
    collections::{HashMap, HashSet},
    time::Duration,
};

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbErr, QueryResult};
use uuid::Uuid;

use super::{
    DbTime, Dialect, OUTBOX_TABLE, OutboxStatus,
    relay::ClaimedEvent,
    sql::{Arg, Sql},
};
use crate::event::EventId;
pub(crate) use crate::event::SkippedEvent;

/// An event serialized at `enqueue`, waiting for commit.
#[derive(Debug, Clone)]
pub(crate) struct PendingEvent {
    pub(crate) event_id: EventId,
    pub(crate) source: String,
    pub(crate) event_type: Cow<'static, str>,
    pub(crate) schema_version: u32,
    pub(crate) aggregate_type: Cow<'static, str>,
    pub(crate) aggregate_id: String,
    pub(crate) aggregate_version: Option<i64>,
    pub(crate) dedup_key: Option<String>,
    pub(crate) payload: String,
    pub(crate) headers: String,
}

impl PendingEvent {
    /// The event as the fast path publishes it, from the row its INSERT wrote: with the payload
    /// and headers as the database returns them, byte for byte what the claim loop would read
    /// (a JSON column may reorder keys), so that every copy of a message is the same.
    pub(crate) fn into_claimed(self, row: OwnedRow) -> ClaimedEvent {
        ClaimedEvent {
            id: row.id,
            event_id: self.event_id,
            source: self.source,
            event_type: self.event_type.into_owned(),
            schema_version: self.schema_version,
            aggregate_type: self.aggregate_type.into_owned(),
            aggregate_id: self.aggregate_id,
            aggregate_version: self.aggregate_version,
            payload: row.payload,
            headers: row.headers,
            created_at: row.created_at,
            attempts: 0,
            reclaimed: false,
        }
    }

    pub(crate) fn skipped(&self) -> SkippedEvent {
        SkippedEvent {
            event_id: self.event_id,
            event_type: self.event_type.to_string(),
            dedup_key: self.dedup_key.clone().unwrap_or_default(),
        }
    }
}

/// The values of [`INSERT_COLUMNS`] for `event`, bound, comma-separated.
pub(super) fn push_event_values(sql: &mut Sql, event: &PendingEvent) {
    let dialect = sql.dialect();
    sql.bind(dialect.uuid(event.event_id))
        .push(", ")
        .bind(event.source.clone().into())
        .push(", ")
        .bind(event.event_type.to_string().into())
        .push(", ")
        .bind(i64::from(event.schema_version).into())
        .push(", ")
        .bind(event.aggregate_type.to_string().into())
        .push(", ")
        .bind(event.aggregate_id.clone().into())
        .push(", ")
        .bind(event.aggregate_version.into())
        .push(", ")
        .bind(event.dedup_key.clone().into())
        .push(", ")
        .bind_json(event.payload.clone())
        .push(", ")
        .bind_json(event.headers.clone());
}

/// Columns bound per row by the commit-time INSERT, in order (and by the INSERT of delayed
/// events, which stores the same).
pub(crate) const INSERT_COLUMNS: [&str; 10] = [
    "event_id",
    "source",
    "event_type",
    "schema_version",
    "aggregate_type",
    "aggregate_id",
    "aggregate_version",
    "dedup_key",
    "payload",
    "headers",
];

/// The fast path's claim on the rows a commit writes: each row is written PROCESSING, leased to
/// `owner` under `token`, unless an earlier event of its aggregate is still unsent (then it is
/// written PENDING for the relay, which keeps the aggregate's order). The decision is part of the
/// INSERT statement.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FastClaim<'a> {
    /// Stored in `locked_by`.
    pub(crate) owner: &'a str,
    /// The fencing token the fast path settles with.
    pub(crate) token: Uuid,
    /// The lease: after it, the relay takes the rows over.
    pub(crate) lease: Duration,
    /// Per-aggregate order: leave an event behind an unsent one of its aggregate to the claim
    /// loop. Without it every event is claimed.
    pub(crate) ordering: bool,
    /// The relay's claim floor (see `floor.rs`): the check for an unsent earlier event of the
    /// aggregate looks from it up, and for DEAD ones in their own index.
    pub(crate) floor: Option<super::floor::Bound>,
}

/// A row the commit-time INSERT wrote PROCESSING for the fast path.
#[derive(Debug, Clone)]
pub(crate) struct OwnedRow {
    /// Index of its event in the buffer given to [`insert_events`].
    pub(crate) index: usize,
    /// Row id.
    pub(crate) id: i64,
    /// `created_at`, by the database's clock.
    pub(crate) created_at: DateTime<Utc>,
    /// The payload as stored.
    pub(crate) payload: String,
    /// The headers as stored.
    pub(crate) headers: String,
}

/// What the commit-time INSERT did.
#[derive(Debug, Default)]
pub(crate) struct InsertOutcome {
    pub(crate) written: usize,
    pub(crate) skipped: Vec<SkippedEvent>,
    /// Rows written PROCESSING for the fast path, in id order.
    pub(crate) owned: Vec<OwnedRow>,
}

impl InsertOutcome {
    /// Rows written PENDING: the relay has work.
    pub(crate) fn pending(&self) -> usize {
        self.written - self.owned.len()
    }
}

/// The rows an INSERT wrote, by event id.
type Written = HashMap<Uuid, WrittenRow>;

/// A row as the INSERT returned it (or as read back).
struct WrittenRow {
    id: i64,
    /// Written PROCESSING: the fast path owns it.
    owned: bool,
    created_at: DateTime<Utc>,
    /// With the fast path: the payload and headers as stored.
    stored: Option<(String, String)>,
}

/// With the fast path, the earlier events of an aggregate in the same buffer that an event's
/// "earlier unsent event" check leaves out (they are written by the same statement or
/// transaction, and owned together with it); beyond this many, the event is written PENDING.
const MAX_SAME_AGGREGATE: usize = 8;

/// Write buffered events with multi-row INSERTs of at most `batch_rows` rows.
///
/// A second event with the same `(event_type, dedup_key)` as one in the table or earlier in the
/// batch is skipped without aborting the transaction, and reported.
pub(crate) async fn insert_events<C: ConnectionTrait>(
    conn: &C,
    events: &[PendingEvent],
    batch_rows: usize,
    fast: Option<FastClaim<'_>>,
) -> Result<InsertOutcome, DbErr> {
    let dialect = Dialect::of(conn);
    let (mut to_write, mut skipped) = first_of_each_key(events, |event| event);
    // Keys whose events left the table (sent) are kept apart, for the rotation's period.
    let keyed: Vec<&PendingEvent> = to_write
        .iter()
        .map(|(_, event)| *event)
        .filter(|event| event.dedup_key.is_some())
        .collect();
    let taken = super::keys::take(conn, &keyed).await?;
    if !taken.is_empty() {
        to_write.retain(|(_, event)| {
            let keep = !taken.contains(&event.event_id);
            if !keep {
                skipped.push(event.skipped());
            }
            keep
        });
    }
    let mut outcome = InsertOutcome {
        skipped,
        ..InsertOutcome::default()
    };

    // With the fast path, each event's earlier events of the same aggregate in this buffer.
    let mut earlier: HashMap<(&str, &str), Vec<Uuid>> = HashMap::new();
    // Rows as returned (PostgreSQL, SQLite) or read back (MySQL), by event id: wanted for the
    // fast path, and where it saves the query for skipped keys.
    let any_keyed = to_write.iter().any(|(_, e)| e.dedup_key.is_some());
    let mut returned: Option<Written> =
        (fast.is_some() || (any_keyed && dialect.insert_returning())).then(HashMap::new);
    let rows = match fast {
        // Bound parameters per row stay within every backend's limit.
        Some(_) => batch_rows.clamp(1, 500),
        None => batch_rows.max(1),
    };
    for chunk in to_write.chunks(rows) {
        let mut sql = insert_statement(dialect, chunk, fast, &mut earlier);
        match returned.as_mut() {
            Some(returned) if dialect.insert_returning() => {
                sql.push(" RETURNING ")
                    .push(&returned_columns(fast.is_some()));
                for row in conn.query_all_raw(sql.build()).await? {
                    read_returned(&dialect, &row, returned, fast.is_some())?;
                }
            }
            _ => {
                conn.execute_raw(sql.build()).await?;
            }
        }
    }

    // MySQL returns no rows from an INSERT: the fast path reads its rows back by event id.
    if let Some(returned) = returned.as_mut()
        && !dialect.insert_returning()
    {
        read_back(conn, &to_write, batch_rows, returned).await?;
    }

    match returned {
        Some(returned) => sort_written(&to_write, returned, &mut outcome),
        None => {
            // Which events with a dedup key were skipped because the table already had their
            // key?
            let keyed: Vec<&PendingEvent> = to_write
                .iter()
                .map(|(_, e)| *e)
                .filter(|e| e.dedup_key.is_some())
                .collect();
            outcome
                .skipped
                .extend(skipped_by_key(conn, OUTBOX_TABLE, keyed, batch_rows).await?);
        }
    }
    outcome.written = events.len() - outcome.skipped.len();
    Ok(outcome)
}

/// The multi-row INSERT of `chunk`, up to its conflict clause: each row written by the
/// database's clock and, with the fast path, already claimed by it (`earlier` collects each
/// aggregate's events of the buffer as they are written).
fn insert_statement<'e>(
    dialect: Dialect,
    chunk: &[(usize, &'e PendingEvent)],
    fast: Option<FastClaim<'_>>,
    earlier: &mut HashMap<(&'e str, &'e str), Vec<Uuid>>,
) -> Sql {
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "INSERT INTO {OUTBOX_TABLE} ({}, created_at",
        INSERT_COLUMNS.join(", ")
    ));
    if fast.is_some() {
        sql.push(", status, locked_by, locked_until, claim_token");
    }
    sql.push(") VALUES ");
    for (i, (_, event)) in chunk.iter().enumerate() {
        if i > 0 {
            sql.push(", ");
        }
        sql.push("(");
        push_event_values(&mut sql, event);
        // Written by the database's clock, like every instant the SDK stores.
        sql.push(", ").time(DbTime::NOW);
        if let Some(fast) = fast {
            let key = (event.aggregate_type.as_ref(), event.aggregate_id.as_str());
            let before = earlier.entry(key).or_default();
            push_fast_claim_values(&mut sql, event, fast, before);
            before.push(event.event_id);
        }
        sql.push(")");
    }
    if let Some(clause) =
        dialect.outbox_insert_conflict(chunk.iter().any(|(_, e)| e.dedup_key.is_some()))
    {
        sql.push(" ").push(clause);
    }
    sql
}

/// `, status, locked_by, locked_until, claim_token` of a row the fast path writes: its claim,
/// or PENDING unleased when it must wait behind `earlier` events of its aggregate.
fn push_fast_claim_values(
    sql: &mut Sql,
    event: &PendingEvent,
    fast: FastClaim<'_>,
    earlier: &[Uuid],
) {
    let check = fast.ordering.then_some(earlier);
    // status, locked_by, locked_until: the fast path's claim, or PENDING unleased.
    let (pending, processing) = (
        OutboxStatus::Pending.literal(),
        OutboxStatus::Processing.literal(),
    );
    let owner = Arg::Value(fast.owner.to_owned().into());
    let until = Arg::Time(DbTime::after(fast.lease));
    sql.push(", ");
    push_fast_claim(
        sql,
        event,
        check,
        fast.floor,
        Claimed::Literal(processing),
        pending,
    );
    sql.push(", ");
    push_fast_claim(sql, event, check, fast.floor, Claimed::Arg(owner), "NULL");
    sql.push(", ");
    push_fast_claim(sql, event, check, fast.floor, Claimed::Arg(until), "NULL");
    let token = sql.dialect().uuid(fast.token);
    sql.push(", ").bind(token);
}

/// Read the written rows back by event id (where an INSERT returns none).
async fn read_back<C: ConnectionTrait>(
    conn: &C,
    to_write: &[(usize, &PendingEvent)],
    batch_rows: usize,
    returned: &mut Written,
) -> Result<(), DbErr> {
    let dialect = Dialect::of(conn);
    for chunk in to_write.chunks(batch_rows.clamp(1, 1000)) {
        let mut sql = Sql::new(dialect);
        sql.push(&format!(
            "SELECT {} FROM {OUTBOX_TABLE} WHERE event_id IN ",
            returned_columns(true)
        ))
        .bind_list(chunk.iter().map(|(_, e)| dialect.uuid(e.event_id)));
        for row in conn.query_all_raw(sql.build()).await? {
            read_returned(&dialect, &row, returned, true)?;
        }
    }
    Ok(())
}

/// Sort the events written from those skipped, by the rows the INSERT returned (or that were
/// read back); the rows the fast path owns go into `outcome.owned`, in id order.
fn sort_written(
    to_write: &[(usize, &PendingEvent)],
    mut returned: Written,
    outcome: &mut InsertOutcome,
) {
    for (index, event) in to_write {
        match returned.remove(&event.event_id) {
            // Read back on MySQL: a row of another transaction's event with the same
            // id cannot exist (ids are v7 UUIDs made here), so present means written.
            Some(row) => {
                // Stored payloads are read with the fast path only.
                if let (true, Some((payload, headers))) = (row.owned, row.stored) {
                    outcome.owned.push(OwnedRow {
                        index: *index,
                        id: row.id,
                        created_at: row.created_at,
                        payload,
                        headers,
                    });
                }
            }
            None => outcome.skipped.push(event.skipped()),
        }
    }
    outcome.owned.sort_by_key(|r| r.id);
}

/// Of a buffer's `items` (each holding the event `event` gives), those to write, with their
/// index, and the events skipped because an earlier one of the buffer has their
/// `(event_type, dedup_key)`: duplicates inside one buffer never reach the database.
pub(super) fn first_of_each_key<'a, T>(
    items: &'a [T],
    event: impl Fn(&'a T) -> &'a PendingEvent,
) -> (Vec<(usize, &'a T)>, Vec<SkippedEvent>) {
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    let mut to_write = Vec::with_capacity(items.len());
    let mut skipped = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let pending = event(item);
        match &pending.dedup_key {
            Some(key) if !seen.insert((&pending.event_type, key)) => {
                skipped.push(pending.skipped());
            }
            _ => to_write.push((index, item)),
        }
    }
    (to_write, skipped)
}

/// Of `keyed` events just inserted into `table` with `ON CONFLICT` skipping taken dedup keys,
/// those that are not there: skipped because their key was taken.
pub(super) async fn skipped_by_key<C: ConnectionTrait>(
    conn: &C,
    table: &str,
    keyed: Vec<&PendingEvent>,
    chunk_rows: usize,
) -> Result<Vec<SkippedEvent>, DbErr> {
    let dialect = Dialect::of(conn);
    let mut present: HashSet<Uuid> = HashSet::with_capacity(keyed.len());
    for chunk in keyed.chunks(chunk_rows.max(1)) {
        let mut sql = Sql::new(dialect);
        sql.push(&format!("SELECT event_id FROM {table} WHERE event_id IN "))
            .bind_list(chunk.iter().map(|e| dialect.uuid(e.event_id)));
        for row in conn.query_all_raw(sql.build()).await? {
            present.insert(dialect.get_uuid(&row, "event_id")?);
        }
    }
    Ok(keyed
        .into_iter()
        .filter(|event| !present.contains(&event.event_id))
        .map(PendingEvent::skipped)
        .collect())
}

/// What the fast path writes into a column of a row it claims.
enum Claimed<'a> {
    Literal(&'a str),
    Arg(Arg),
}

/// `CASE WHEN EXISTS (an unsent event of this aggregate, other than its earlier events in this
/// buffer) THEN <unclaimed> ELSE <claimed> END`: the fast path takes an event only when nothing
/// committed before it in its aggregate is still on its way.
///
/// On PostgreSQL the subquery sees the statement's snapshot (with READ COMMITTED, everything
/// committed before the INSERT began: transactions that change an aggregate serialize on its
/// row, so an earlier one has committed); MySQL reads the current rows, as an INSERT's
/// subquery on its own table does; SQLite has one writer.
/// Without ordering (`earlier` is `None`), the event is claimed.
fn push_fast_claim(
    sql: &mut Sql,
    event: &PendingEvent,
    earlier: Option<&[Uuid]>,
    floor: Option<super::floor::Bound>,
    claimed: Claimed<'_>,
    unclaimed: &str,
) {
    let dialect = sql.dialect();
    let Some(earlier) = earlier else {
        push_claimed(sql, claimed);
        return;
    };
    if earlier.len() >= MAX_SAME_AGGREGATE {
        sql.push(unclaimed);
        return;
    }
    sql.push(&format!(
        "CASE WHEN EXISTS (SELECT 1 FROM {OUTBOX_TABLE} e WHERE e.aggregate_type = "
    ))
    .bind(event.aggregate_type.to_string().into())
    .push(" AND e.aggregate_id = ")
    .bind(event.aggregate_id.clone().into())
    .push(" AND ")
    .push(&dialect.unsent("e."));
    if let Some(bound) = floor {
        // The floor as a row comparison on the aggregate index's columns: an index condition
        // of that index only. Written `e.id >= <floor>`, it also fits the primary key, and
        // under a held horizon (the table's statistics counting a few live rows among many
        // dead versions) the planner took a scan of the primary key from the floor, reading
        // every dead version above it, for each probe of each row.
        sql.push(" AND (e.aggregate_type, e.aggregate_id, e.id) >= (")
            .bind(event.aggregate_type.to_string().into())
            .push(", ")
            .bind(event.aggregate_id.clone().into())
            .push(", ");
        super::floor::push_low(sql, bound);
        sql.push(")");
    }
    if !earlier.is_empty() {
        sql.push(" AND e.event_id NOT IN ")
            .bind_list(earlier.iter().map(|id| dialect.uuid(*id)));
    }
    sql.push(")");
    if floor.is_some() {
        // DEAD events stay below the floor.
        sql.push(&format!(
            " OR EXISTS (SELECT 1 FROM {OUTBOX_TABLE} d WHERE d.aggregate_type = "
        ))
        .bind(event.aggregate_type.to_string().into())
        .push(" AND d.aggregate_id = ")
        .bind(event.aggregate_id.clone().into())
        .push(&format!(
            " AND d.status = {})",
            super::status::OutboxStatus::Dead.literal()
        ));
    }
    sql.push(&format!(" THEN {unclaimed} ELSE "));
    push_claimed(sql, claimed);
    sql.push(" END");
}

fn push_claimed(sql: &mut Sql, claimed: Claimed<'_>) {
    match claimed {
        Claimed::Literal(text) => sql.push(text),
        Claimed::Arg(arg) => sql.arg(arg),
    };
}

/// The columns the INSERT returns (or MySQL reads back); with the fast path, the stored
/// payload and headers too.
fn returned_columns(stored: bool) -> String {
    let mut columns = "id, event_id, status, created_at".to_owned();
    if stored {
        columns.push_str(", payload, headers");
    }
    columns
}

fn read_returned(
    dialect: &Dialect,
    row: &QueryResult,
    returned: &mut Written,
    stored: bool,
) -> Result<(), DbErr> {
    let status = OutboxStatus::parse(&row.try_get::<String>("", "status")?);
    let stored = if stored {
        Some((
            dialect.get_json_text(row, "payload")?,
            dialect.get_json_text(row, "headers")?,
        ))
    } else {
        None
    };
    returned.insert(
        dialect.get_uuid(row, "event_id")?,
        WrittenRow {
            id: row.try_get("", "id")?,
            owned: status == Some(OutboxStatus::Processing),
            created_at: dialect.get_timestamp(row, "created_at")?,
            stored,
        },
    );
    Ok(())
}
