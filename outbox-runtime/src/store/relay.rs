//! The relay's SQL: claim a batch under a lease, then mark it sent, retried, dead or released.
//!
//! Every write after the claim is fenced by the batch's `claim_token`: a relay whose lease
//! expired and whose rows were reclaimed by another relay updates zero rows.

use chrono::{DateTime, Utc};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, QueryResult, Value,
};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::envelope::{Envelope, JSON_CONTENT_TYPE};
use crate::operations::Source;

use super::{
    DbTime, Dialect, OUTBOX_TABLE,
    claim::{Candidate, ClaimParams, Queue, hand_back, select_claimable},
    failures::{self, Failed},
    sql::{Arg, Sql},
    status::{Failure, FailureClass, OutboxStatus},
    tx::begin_work,
};
use crate::util::text::truncate;

/// Columns the relay reads for each claimed event.
pub(super) const CLAIM_COLUMNS: &str = "id, event_id, source, event_type, schema_version, aggregate_type, \
     aggregate_id, aggregate_version, payload, headers, status, attempts, locked_until, created_at";

/// One event claimed by a relay.
#[derive(Debug, Clone)]
pub struct ClaimedEvent {
    /// Row id (insertion order).
    pub id: i64,
    /// Event id.
    pub event_id: Uuid,
    /// CloudEvents source.
    pub source: String,
    /// Event type.
    pub event_type: String,
    /// Schema version.
    pub schema_version: u32,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Aggregate version.
    pub aggregate_version: Option<i64>,
    /// Payload JSON text.
    pub payload: String,
    /// Headers JSON object text.
    pub headers: String,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// Failed attempts so far, counting this claim if it reclaimed an expired lease.
    pub attempts: u32,
    /// Whether this claim took over an expired lease of another relay.
    pub reclaimed: bool,
}

impl ClaimedEvent {
    /// The CloudEvents envelope of this event. An error means the row itself is broken (its
    /// payload or headers are not JSON) and it can never be published.
    pub fn envelope(&self) -> Result<Envelope, String> {
        let data = RawValue::from_string(self.payload.clone())
            .map_err(|e| format!("payload is not valid JSON: {e}"))?;
        let headers: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&self.headers)
                .map_err(|e| format!("headers are not a JSON object: {e}"))?;
        let mut envelope = Envelope {
            id: self.event_id.to_string(),
            source: self.source.clone(),
            event_type: self.event_type.clone(),
            subject: Some(self.aggregate_id.clone()),
            time: Some(self.created_at),
            data_content_type: Some(JSON_CONTENT_TYPE.to_owned()),
            data_schema: None,
            data: Some(data),
            aggregate_type: Some(self.aggregate_type.clone()),
            aggregate_version: self.aggregate_version,
            schema_version: Some(self.schema_version),
            traceparent: None,
            tracestate: None,
            extensions: Default::default(),
        };
        for (name, value) in headers {
            match name.as_str() {
                "traceparent" => envelope.traceparent = value.as_str().map(str::to_owned),
                "tracestate" => envelope.tracestate = value.as_str().map(str::to_owned),
                _ => {
                    envelope.extensions.insert(name, value);
                }
            }
        }
        Ok(envelope)
    }
}

/// A batch claimed under one lease and fencing token.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The fencing token written into every claimed row.
    pub token: Uuid,
    /// Events to publish, in id order.
    pub events: Vec<ClaimedEvent>,
    /// Events whose lease expired once too often: marked DEAD by this claim, not to publish.
    pub dead: Vec<ClaimedEvent>,
    /// Rows that could not be read (marked DEAD by this claim, with the reason).
    pub unreadable: usize,
    /// The database's time when the claim found its rows (`None` when it found none): what the
    /// events' ages are measured against.
    pub claimed_at: Option<DateTime<Utc>>,
    /// What the relay knew of the server's timeline before it read these events (for its
    /// standby wait); the claim loop sets it, the store leaves it unknown.
    pub before: super::standby::Seen,
}

/// A claimed row as read, with its status before the claim.
pub(super) struct ReadEvent {
    pub(super) event: ClaimedEvent,
    pub(super) status: Option<OutboxStatus>,
}

pub(super) fn decode(dialect: &Dialect, row: &QueryResult) -> Result<ReadEvent, DbErr> {
    let schema_version = dialect.get_int(row, "schema_version")?;
    let attempts = dialect.get_int(row, "attempts")?;
    let status = OutboxStatus::parse(&row.try_get::<String>("", "status")?);
    Ok(ReadEvent {
        event: ClaimedEvent {
            id: row.try_get("", "id")?,
            event_id: dialect.get_uuid(row, "event_id")?,
            source: row.try_get("", "source")?,
            event_type: row.try_get("", "event_type")?,
            schema_version: u32::try_from(schema_version).unwrap_or(0),
            aggregate_type: row.try_get("", "aggregate_type")?,
            aggregate_id: row.try_get("", "aggregate_id")?,
            aggregate_version: row.try_get("", "aggregate_version")?,
            payload: dialect.get_json_text(row, "payload")?,
            headers: dialect.get_json_text(row, "headers")?,
            created_at: dialect.get_timestamp(row, "created_at")?,
            attempts: u32::try_from(attempts).unwrap_or(0),
            reclaimed: false,
        },
        status,
    })
}

/// The outbox as a work queue: its unsent rows in the form the dialect's indexes serve.
pub(super) fn outbox_queue(dialect: Dialect) -> Queue<'static> {
    Queue {
        dialect,
        table: OUTBOX_TABLE,
        columns: CLAIM_COLUMNS,
        scope: None,
        predicate: |dialect, prefix| dialect.unsent(prefix),
        pending_age: None,
        floor: None,
        held: &[],
    }
}

/// Sample the outbox's floor from `from` up (see `floor.rs`): `None` where the dialect keeps
/// none.
pub async fn sample_floor(
    db: &DatabaseConnection,
    from: i64,
) -> Result<Option<super::floor::Sample>, DbErr> {
    super::floor::sample(db, &outbox_queue(Dialect::of(db)), from).await
}

/// Claim a batch: PENDING rows, RETRY rows that are due, and PROCESSING rows whose lease expired.
///
/// With ordering, the claim takes the first unsent event of each aggregate whose predecessors
/// are all SENT ("heads", locked with `SKIP LOCKED` so relays never wait on each other), then
/// the events that follow each head while they are claimable, so one relay owns an aggregate's
/// run and publishes it in order.
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
pub async fn claim(db: &DatabaseConnection, params: &ClaimParams<'_>) -> Result<Claim, DbErr> {
    claim_aged(db, params, None).await
}

/// [`claim`], leaving PENDING rows younger than `pending_age` (by the database's clock) alone:
/// the claim loop beside the WAL relay, which publishes those.
pub async fn claim_aged(
    db: &DatabaseConnection,
    params: &ClaimParams<'_>,
    pending_age: Option<std::time::Duration>,
) -> Result<Claim, DbErr> {
    claim_from(db, params, pending_age, None).await
}

/// [`claim_aged`], its scans starting at `floor` (see `floor.rs`).
pub async fn claim_from(
    db: &DatabaseConnection,
    params: &ClaimParams<'_>,
    pending_age: Option<std::time::Duration>,
    floor: Option<super::floor::Bound>,
) -> Result<Claim, DbErr> {
    claim_held(db, params, pending_age, floor, &[]).await
}

/// [`claim_from`], leaving the events of the types in `held` (their destination is paused)
/// and, with ordering, everything behind them in their aggregates.
pub async fn claim_held(
    db: &DatabaseConnection,
    params: &ClaimParams<'_>,
    pending_age: Option<std::time::Duration>,
    floor: Option<super::floor::Bound>,
    held: &[String],
) -> Result<Claim, DbErr> {
    let txn = begin_work(db).await?;
    let dialect = Dialect::of(&txn);
    let queue = Queue {
        pending_age,
        floor,
        held,
        ..outbox_queue(dialect)
    };
    let claimable = select_claimable(&txn, &queue, params.batch_size, params.ordering).await?;
    let claimed_at = claimable.now;
    let (rows, unreadable) = read_claimable(&txn, dialect, claimable.rows, params.ordering).await?;
    if rows.is_empty() {
        txn.commit().await?;
        return Ok(Claim {
            token: Uuid::nil(),
            events: Vec::new(),
            dead: Vec::new(),
            unreadable,
            claimed_at,
            before: super::standby::Seen::UNKNOWN,
        });
    }
    let Reclaims {
        events,
        dead,
        stranded,
    } = count_reclaims(rows, params);
    let token = Uuid::new_v4();
    if !events.is_empty() {
        mark_claimed(&txn, params, token, &events).await?;
    }
    for event in &dead {
        mark_lease_expired(&txn, event).await?;
    }
    let dead_ids: Vec<i64> = dead.iter().map(|event| event.id).collect();
    failures::append(&txn, Source::Outbox, Failed::Ids(&dead_ids)).await?;
    hand_back(&txn, OUTBOX_TABLE, stranded).await?;
    txn.commit().await?;
    Ok(Claim {
        token,
        events,
        dead,
        unreadable,
        claimed_at,
        before: super::standby::Seen::UNKNOWN,
    })
}

/// Read the claimable rows; a row that cannot be read is made DEAD (and, with `ordering`, the
/// rest of its aggregate stays back). Returns the events read and how many could not be.
async fn read_claimable(
    txn: &DatabaseTransaction,
    dialect: Dialect,
    candidates: Vec<Candidate>,
    ordering: bool,
) -> Result<(Vec<ReadEvent>, usize), DbErr> {
    let mut rows = Vec::new();
    let mut dead_aggregates = std::collections::HashSet::new();
    let mut unreadable = 0;
    for candidate in candidates {
        let aggregate = aggregate_of(&candidate.row);
        if ordering && dead_aggregates.contains(&aggregate) {
            continue; // behind an unreadable event of its aggregate
        }
        match decode(&dialect, &candidate.row) {
            Ok(row) => rows.push(row),
            Err(e) => {
                let reason = format!("outbox row cannot be read: {e}");
                mark_dead(txn, &dialect, candidate.id, &reason).await?;
                dead_aggregates.insert(aggregate);
                unreadable += 1;
            }
        }
    }
    Ok((rows, unreadable))
}

/// The events read, sorted by what their reclaim (if any) makes of them.
struct Reclaims {
    /// To claim.
    events: Vec<ClaimedEvent>,
    /// Reclaimed once too often: DEAD.
    dead: Vec<ClaimedEvent>,
    /// Expired claims behind an event this claim makes DEAD: handed back (see `hand_back`).
    stranded: Vec<i64>,
}

/// Reclaimed leases count an attempt; one reclaim too many makes the event DEAD, and (with
/// ordering) keeps the rest of its aggregate back.
fn count_reclaims(rows: Vec<ReadEvent>, params: &ClaimParams<'_>) -> Reclaims {
    let mut events = Vec::with_capacity(rows.len());
    let mut dead = Vec::new();
    let mut blocked: std::collections::HashSet<(String, String)> = Default::default();
    let mut stranded = Vec::new();
    for ReadEvent { mut event, status } in rows {
        let reclaim = status == Some(OutboxStatus::Processing);
        let key = (event.aggregate_type.clone(), event.aggregate_id.clone());
        if params.ordering && blocked.contains(&key) {
            if reclaim {
                stranded.push(event.id);
            }
            continue;
        }
        if reclaim {
            event.attempts += 1;
            event.reclaimed = true;
            if event.attempts >= params.max_attempts {
                if params.ordering {
                    blocked.insert(key);
                }
                dead.push(event);
                continue;
            }
        }
        events.push(event);
    }
    Reclaims {
        events,
        dead,
        stranded,
    }
}

/// Mark `events` PROCESSING under `token` for `params.owner` until the lease ends; a reclaim
/// counts an attempt.
async fn mark_claimed(
    txn: &DatabaseTransaction,
    params: &ClaimParams<'_>,
    token: Uuid,
    events: &[ClaimedEvent],
) -> Result<(), DbErr> {
    let dialect = Dialect::of(txn);
    let mut sql = Sql::new(dialect);
    // `attempts` first: MySQL evaluates assignments left to right.
    sql.push(&format!(
        "UPDATE {OUTBOX_TABLE} SET attempts = CASE WHEN status = {processing} THEN attempts + 1 \
         ELSE attempts END, status = {processing}, locked_by = ",
        processing = OutboxStatus::Processing.literal(),
    ))
    .bind(params.owner.to_owned().into())
    .push(", locked_until = ")
    .time(DbTime::after(params.lease))
    .push(", claim_token = ")
    .bind(dialect.uuid(token))
    .push(" WHERE id IN ")
    .bind_list(events.iter().map(|e| Value::from(e.id)));
    txn.execute_raw(sql.build()).await?;
    Ok(())
}

/// Mark an event whose lease expired once too often DEAD (class `LEASE_EXPIRED`).
async fn mark_lease_expired(txn: &DatabaseTransaction, event: &ClaimedEvent) -> Result<(), DbErr> {
    let mut sql = Sql::new(Dialect::of(txn));
    sql.push(&format!(
        "UPDATE {OUTBOX_TABLE} SET attempts = attempts + 1, status = {}, locked_by = NULL, \
         locked_until = NULL, failure_class = {}, last_error = ",
        OutboxStatus::Dead.literal(),
        FailureClass::LeaseExpired.literal(),
    ))
    .bind(
        format!(
            "lease expired {} times: a relay crashed or hung while publishing this event",
            event.attempts
        )
        .into(),
    )
    .push(" WHERE id = ")
    .bind(event.id.into())
    .push(&format!(
        " AND status = {}",
        OutboxStatus::Processing.literal()
    ));
    txn.execute_raw(sql.build()).await?;
    Ok(())
}

/// A failed publish to record.
#[derive(Debug, Clone)]
pub struct FailedEvent {
    /// Row id.
    pub id: i64,
    /// Where it goes: RETRY at a due time, or DEAD.
    pub failure: Failure,
    /// What kind of failure it was.
    pub class: FailureClass,
}

/// What to write back after publishing a claim.
#[derive(Debug, Clone, Default)]
pub struct Settlement {
    /// Confirmed by the broker.
    pub sent: Vec<i64>,
    /// Failed.
    pub failed: Vec<FailedEvent>,
    /// Never published (behind a failure in their aggregate, or at shutdown): back to PENDING.
    pub released: Vec<i64>,
    /// Of `released`, those whose claim counted a reclaim attempt, which is given back.
    pub released_reclaimed: Vec<i64>,
}

/// Rows actually updated per kind; fewer than asked means another relay owns them now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settled {
    /// Rows marked SENT.
    pub sent: u64,
    /// Rows marked RETRY or DEAD.
    pub failed: u64,
    /// Rows released.
    pub released: u64,
}

/// Ids one settling statement names at most.
const SETTLE_CHUNK: usize = 1000;

/// Which rows a write-back may change: the fencing rule of its publisher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// Rows PROCESSING under this claim's token (the claim loop, the fast path).
    Claim(Uuid),
    /// Rows still PENDING: the WAL relay publishes without claiming, and never overwrites a
    /// row that another relay claimed or finished meanwhile.
    Pending,
}

impl super::sent::MoveRule for Fence {
    fn push_where(&self, sql: &mut Sql) {
        Fence::push_where(*self, sql);
    }
}

impl Fence {
    /// ` WHERE <the rule>`, with the token bound. The rule is written `(…) IS TRUE`, which no
    /// planner reads as implying a partial index's predicate: the rows are found by their ids
    /// (the primary key) whatever the statistics say. `outbox_event` holds few live rows, so
    /// its partial indexes look empty to PostgreSQL's planner, and one of them, read whole,
    /// looked as cheap as the ids; while a long transaction holds the horizon, such an index
    /// holds every row sent since, and reading it whole took tens of milliseconds per mark.
    fn push_where(self, sql: &mut Sql) {
        let dialect = sql.dialect();
        match self {
            Fence::Claim(token) => {
                sql.push(&format!(
                    " WHERE (status = {} AND claim_token = ",
                    OutboxStatus::Processing.literal()
                ))
                .bind(dialect.uuid(token))
                .push(") IS TRUE");
            }
            Fence::Pending => {
                sql.push(&format!(
                    " WHERE (status = {}) IS TRUE",
                    OutboxStatus::Pending.literal()
                ));
            }
        }
    }
}

/// Write back a claim's outcome in one short transaction, fenced by its token; `sent_at` and due
/// times by the database's clock. The usual outcome, every event confirmed, goes in one round
/// trip where the dialect can send it so.
pub async fn settle(
    db: &DatabaseConnection,
    fence: Fence,
    settlement: &Settlement,
) -> Result<Settled, DbErr> {
    if let Some(settled) = settle_all_sent_at_once(db, fence, settlement).await? {
        return Ok(settled);
    }
    let txn = begin_work(db).await?;
    let sent = mark_sent(&txn, fence, &settlement.sent).await?;
    let failed = mark_failed(&txn, fence, &settlement.failed).await?;
    failures::append(&txn, Source::Outbox, Failed::Ids(&failed)).await?;
    let released = release(&txn, fence, settlement).await?;
    txn.commit().await?;
    Ok(Settled {
        sent,
        failed: failed.len() as u64,
        released,
    })
}

/// The usual outcome, every event confirmed (or nothing to write), settled without a
/// transaction: in one round trip where the dialect can send it so. `None`: settle it in a
/// transaction.
async fn settle_all_sent_at_once(
    db: &DatabaseConnection,
    fence: Fence,
    settlement: &Settlement,
) -> Result<Option<Settled>, DbErr> {
    if !settlement.failed.is_empty()
        || !settlement.released.is_empty()
        || settlement.sent.len() > SETTLE_CHUNK
    {
        return Ok(None);
    }
    if settlement.sent.is_empty() {
        return Ok(Some(Settled::default()));
    }
    let Some(statement) = super::sent::move_sent_at_once(Dialect::of(db), &fence, &settlement.sent)
    else {
        return Ok(None);
    };
    let result = db.execute_raw(statement).await?;
    Ok(Some(Settled {
        sent: result.rows_affected(),
        ..Settled::default()
    }))
}

/// Mark `ids` SENT now, under `fence`: move them to `outbox_sent`; returns the rows marked.
async fn mark_sent(txn: &DatabaseTransaction, fence: Fence, ids: &[i64]) -> Result<u64, DbErr> {
    let mut marked = 0;
    for chunk in ids.chunks(SETTLE_CHUNK) {
        marked += super::sent::move_sent(txn, &fence, chunk).await?;
    }
    Ok(marked)
}

/// Mark each failed event RETRY at its due time or DEAD, with its class and error, under
/// `fence`; returns the ids marked.
async fn mark_failed(
    txn: &DatabaseTransaction,
    fence: Fence,
    failed: &[FailedEvent],
) -> Result<Vec<i64>, DbErr> {
    let dialect = Dialect::of(txn);
    let mut marked = Vec::with_capacity(failed.len());
    for FailedEvent { id, failure, class } in failed {
        let mut sql = Sql::new(dialect);
        sql.push(&format!(
            "UPDATE {OUTBOX_TABLE} SET status = {}, attempts = ",
            failure.outbox_status().literal()
        ))
        .bind(i64::from(failure.attempts()).into())
        .push(", next_attempt_at = ")
        .arg(Arg::time_or_null(dialect, failure.due()))
        .push(&format!(
            ", failure_class = {}, last_error = ",
            class.literal()
        ))
        .bind(truncate(failure.error(), 4000).into())
        .push(", locked_until = NULL");
        fence.push_where(&mut sql);
        sql.push(" AND id = ").bind((*id).into());
        if txn.execute_raw(sql.build()).await?.rows_affected() == 1 {
            marked.push(*id);
        }
    }
    Ok(marked)
}

/// Hand the released events back PENDING under `fence`, giving back the attempt a reclaim
/// counted; returns how many were released.
async fn release(
    txn: &DatabaseTransaction,
    fence: Fence,
    settlement: &Settlement,
) -> Result<u64, DbErr> {
    // Unclaimed rows handed back are PENDING as they were: nothing to write.
    if fence == Fence::Pending {
        return Ok(settlement.released.len() as u64);
    }
    let reclaimed: std::collections::HashSet<i64> =
        settlement.released_reclaimed.iter().copied().collect();
    let (given_back, plain): (Vec<i64>, Vec<i64>) = settlement
        .released
        .iter()
        .copied()
        .partition(|id| reclaimed.contains(id));
    let mut released = 0;
    for (ids, refund) in [(plain, 0i64), (given_back, 1i64)] {
        for chunk in ids.chunks(SETTLE_CHUNK) {
            let mut sql = Sql::new(Dialect::of(txn));
            sql.push(&format!(
                "UPDATE {OUTBOX_TABLE} SET attempts = attempts - {refund}, status = {}, \
                 locked_by = NULL, locked_until = NULL",
                OutboxStatus::Pending.literal()
            ));
            fence.push_where(&mut sql);
            sql.push(" AND id IN ")
                .bind_list(chunk.iter().map(|id| Value::from(*id)));
            released += txn.execute_raw(sql.build()).await?.rows_affected();
        }
    }
    Ok(released)
}

/// The aggregate of a claimed row, as far as it can be read.
pub(super) fn aggregate_of(row: &QueryResult) -> (Option<String>, Option<String>) {
    (
        row.try_get("", "aggregate_type").ok(),
        row.try_get("", "aggregate_id").ok(),
    )
}

/// A row that can never be published (one that cannot be read, e.g. an `event_id` that is not a
/// UUID, written by hand; or one no envelope can be made of): DEAD with the reason, so that it
/// does not stop every claim.
pub(super) async fn mark_dead<C: ConnectionTrait>(
    conn: &C,
    dialect: &Dialect,
    id: i64,
    reason: &str,
) -> Result<(), DbErr> {
    let mut sql = Sql::new(*dialect);
    sql.push(&format!(
        "UPDATE {OUTBOX_TABLE} SET status = {}, attempts = attempts + 1, failure_class = {}, \
         last_error = ",
        OutboxStatus::Dead.literal(),
        FailureClass::Unreadable.literal(),
    ))
    .bind(reason.to_owned().into())
    .push(" WHERE id = ")
    .bind(id.into());
    conn.execute_raw(sql.build()).await?;
    failures::append(conn, Source::Outbox, Failed::Ids(&[id])).await
}

/// RETRY events whose last failure is of one of `classes` and that are not due yet become due
/// now; returns how many. After a broker outage: the outage, not the events, pushed their due
/// times back. A row failed by a release before `outbox_0010` has no class; it is recognised by
/// its `last_error` matching one of `legacy_patterns` (SQL `LIKE`), as that release wrote it.
pub async fn retries_due_now(
    db: &DatabaseConnection,
    classes: &[FailureClass],
    legacy_patterns: &[&str],
) -> Result<u64, DbErr> {
    if classes.is_empty() {
        return Ok(0);
    }
    let mut sql = Sql::new(Dialect::of(db));
    sql.push(&format!("UPDATE {OUTBOX_TABLE} SET next_attempt_at = "))
        .time(DbTime::NOW)
        .push(&format!(
            " WHERE status = {} AND next_attempt_at > ",
            OutboxStatus::Retry.literal()
        ))
        .time(DbTime::NOW)
        .push(&format!(
            " AND (failure_class IN ({})",
            classes
                .iter()
                .map(|c| c.literal())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    if !legacy_patterns.is_empty() {
        sql.push(" OR (failure_class IS NULL AND (");
        for (i, pattern) in legacy_patterns.iter().enumerate() {
            if i > 0 {
                sql.push(" OR ");
            }
            sql.push("last_error LIKE ")
                .bind((*pattern).to_owned().into());
        }
        sql.push("))");
    }
    sql.push(")");
    Ok(db.execute_raw(sql.build()).await?.rows_affected())
}

/// An event's place in its aggregate.
#[derive(Debug, Clone)]
pub struct Place {
    /// The event's row id.
    pub id: i64,
    /// Its aggregate's type.
    pub aggregate_type: String,
    /// Its aggregate's id.
    pub aggregate_id: String,
}

/// Whether an unsent event follows one of `places` in its aggregate. After the fast path marked
/// them SENT (and moved them out of `outbox_event`): such an event was written PENDING behind
/// them, and the relay can claim it now. Each place is one range of the aggregate index.
pub async fn followed(db: &DatabaseConnection, places: &[Place]) -> Result<bool, DbErr> {
    let dialect = Dialect::of(db);
    if dialect.joins_values() {
        return followed_by_probes(db, places).await;
    }
    for chunk in places.chunks(200) {
        let mut sql = Sql::new(dialect);
        sql.push(&format!(
            "SELECT 1 AS f FROM {OUTBOX_TABLE} e WHERE {} AND (",
            dialect.unsent("e.")
        ));
        for (i, place) in chunk.iter().enumerate() {
            if i > 0 {
                sql.push(" OR ");
            }
            sql.push("(e.aggregate_type = ")
                .bind(place.aggregate_type.clone().into())
                .push(" AND e.aggregate_id = ")
                .bind(place.aggregate_id.clone().into())
                .push(" AND e.id > ")
                .bind(place.id.into())
                .push(")");
        }
        sql.push(") LIMIT 1");
        if db.query_one_raw(sql.build()).await?.is_some() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// [`followed`] as one probe of the aggregate index per place: the places as a `VALUES` list,
/// each joined (`LATERAL`, so always a nested loop) to a look-up of its aggregate past its id.
/// The look-up's bound is a row comparison on the aggregate index's columns, which no other
/// index can serve. Under a held xmin horizon the table is full of dead versions its
/// statistics do not show: an `OR` of the places was planned as a read of a whole index, a
/// plain join as a hash join over one, and `e.id > p.id` as a scan of the primary key; each
/// read every dead version (tens of thousands of buffers per call).
async fn followed_by_probes(db: &DatabaseConnection, places: &[Place]) -> Result<bool, DbErr> {
    let dialect = Dialect::of(db);
    for chunk in places.chunks(200) {
        let mut sql = Sql::new(dialect);
        sql.push("SELECT 1 AS f FROM (VALUES ");
        for (i, place) in chunk.iter().enumerate() {
            if i > 0 {
                sql.push(", ");
            }
            sql.bind_list([
                Value::from(place.aggregate_type.clone()),
                Value::from(place.aggregate_id.clone()),
                Value::from(place.id),
            ]);
        }
        sql.push(&format!(
            ") AS p (aggregate_type, aggregate_id, id) CROSS JOIN LATERAL (SELECT 1 AS n \
             FROM {OUTBOX_TABLE} e WHERE e.aggregate_type = p.aggregate_type \
             AND e.aggregate_id = p.aggregate_id \
             AND (e.aggregate_type, e.aggregate_id, e.id) > (p.aggregate_type, p.aggregate_id, p.id) \
             AND {} LIMIT 1) AS n LIMIT 1",
            dialect.unsent("e.")
        ));
        if db.query_one_raw(sql.build()).await?.is_some() {
            return Ok(true);
        }
    }
    Ok(false)
}
