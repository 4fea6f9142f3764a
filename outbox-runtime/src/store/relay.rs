//! The relay's SQL: claim a batch under a lease, then mark it sent, retried, dead or released.
//!
//! Every write after the claim is fenced by the batch's `claim_token`: a relay whose lease
//! expired and whose rows were reclaimed by another relay updates zero rows.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, QueryResult, Value};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::envelope::{Envelope, JSON_CONTENT_TYPE};

use super::{
    Dialect, OUTBOX_TABLE,
    claim::{Queue, Sql, begin, hand_back, select_claimable},
    outbox_status as status,
};

/// Columns the relay reads for each claimed event.
const CLAIM_COLUMNS: &str = "id, event_id, source, event_type, schema_version, aggregate_type, \
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
}

/// How to claim.
#[derive(Debug, Clone, Copy)]
pub struct ClaimParams<'a> {
    /// Who claims (stored in `locked_by`).
    pub relay_id: &'a str,
    /// At most this many rows.
    pub batch_size: usize,
    /// The lease ends at this instant.
    pub locked_until: DateTime<Utc>,
    /// The current time.
    pub now: DateTime<Utc>,
    /// Keep per-aggregate order: claim an event only when every earlier event of its aggregate
    /// is SENT or claimed in this same batch.
    pub ordering: bool,
    /// Reclaiming an expired lease that brings attempts to this many marks the event DEAD.
    pub max_attempts: u32,
}

fn decode(
    dialect: &Dialect,
    row: &QueryResult,
) -> Result<(ClaimedEvent, String, Option<DateTime<Utc>>), DbErr> {
    let schema_version: i64 = match dialect.backend() {
        DbBackend::Postgres | DbBackend::MySql => {
            i64::from(row.try_get::<i32>("", "schema_version")?)
        }
        _ => row.try_get("", "schema_version")?,
    };
    let attempts: i64 = match dialect.backend() {
        DbBackend::Postgres | DbBackend::MySql => i64::from(row.try_get::<i32>("", "attempts")?),
        _ => row.try_get("", "attempts")?,
    };
    let status: String = row.try_get("", "status")?;
    let locked_until = dialect.get_opt_timestamp(row, "locked_until")?;
    Ok((
        ClaimedEvent {
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
        locked_until,
    ))
}

/// Claim a batch: PENDING rows, RETRY rows that are due, and PROCESSING rows whose lease expired.
///
/// With ordering, the claim takes the first unsent event of each aggregate whose predecessors
/// are all SENT ("heads", locked with `SKIP LOCKED` so relays never wait on each other), then
/// the events that follow each head while they are claimable, so one relay owns an aggregate's
/// run and publishes it in order.
pub async fn claim(db: &DatabaseConnection, params: &ClaimParams<'_>) -> Result<Claim, DbErr> {
    let txn = begin(db).await?;
    let dialect = Dialect::of(&txn);
    let queue = Queue {
        table: OUTBOX_TABLE,
        columns: CLAIM_COLUMNS,
        scope: None,
        unfinished: unsent_predicate,
    };
    let mut rows = Vec::new();
    let mut dead_aggregates = std::collections::HashSet::new();
    let mut unreadable = 0;
    for candidate in
        select_claimable(&txn, &queue, params.now, params.batch_size, params.ordering).await?
    {
        let aggregate = aggregate_of(&candidate.row);
        if params.ordering && dead_aggregates.contains(&aggregate) {
            continue; // behind an unreadable event of its aggregate
        }
        match decode(&dialect, &candidate.row) {
            Ok(row) => rows.push(row),
            Err(e) => {
                mark_unreadable(&txn, &dialect, candidate.id, &e).await?;
                dead_aggregates.insert(aggregate);
                unreadable += 1;
            }
        }
    }

    if rows.is_empty() {
        txn.commit().await?;
        return Ok(Claim {
            token: Uuid::nil(),
            events: Vec::new(),
            dead: Vec::new(),
            unreadable,
        });
    }

    // 3. Reclaimed leases count an attempt; one reclaim too many makes the event DEAD, and (with
    //    ordering) keeps the rest of its aggregate back.
    let mut events = Vec::with_capacity(rows.len());
    let mut dead = Vec::new();
    let mut blocked: std::collections::HashSet<(String, String)> = Default::default();
    // Expired claims behind an event this claim makes DEAD: handed back (see `hand_back`).
    let mut stranded = Vec::new();
    for (mut event, status, _) in rows {
        let key = (event.aggregate_type.clone(), event.aggregate_id.clone());
        if params.ordering && blocked.contains(&key) {
            if status == status::PROCESSING {
                stranded.push(event.id);
            }
            continue;
        }
        if status == status::PROCESSING {
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

    let token = Uuid::new_v4();
    if !events.is_empty() {
        let mut sql = Sql::new(dialect);
        // `attempts` first: MySQL evaluates assignments left to right.
        sql.push(&format!(
            "UPDATE {OUTBOX_TABLE} SET attempts = CASE WHEN status = 'PROCESSING' THEN attempts + 1 ELSE attempts END, \
             status = 'PROCESSING', locked_by = "
        ))
        .bind(params.relay_id.to_owned().into())
        .push(", locked_until = ")
        .bind(dialect.timestamp(params.locked_until))
        .push(", claim_token = ")
        .bind(dialect.uuid(token))
        .push(" WHERE id IN ")
        .bind_list(events.iter().map(|e| Value::from(e.id)));
        txn.execute_raw(sql.build()).await?;
    }
    for event in &dead {
        let mut sql = Sql::new(dialect);
        sql.push(&format!(
            "UPDATE {OUTBOX_TABLE} SET attempts = attempts + 1, status = 'DEAD', locked_by = NULL, locked_until = NULL, last_error = "
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
        .push(" AND status = 'PROCESSING'");
        txn.execute_raw(sql.build()).await?;
    }
    hand_back(&txn, OUTBOX_TABLE, stranded).await?;
    txn.commit().await?;
    Ok(Claim {
        token,
        events,
        dead,
        unreadable,
    })
}

/// "This row is not SENT", in the form each backend's indexes serve: the partial index predicate
/// on PostgreSQL and SQLite, status ranges of `(aggregate_type, aggregate_id, status, id)` on
/// MySQL, which has no partial indexes.
fn unsent_predicate(backend: DbBackend, prefix: &str) -> String {
    match backend {
        DbBackend::MySql => {
            format!("{prefix}status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')")
        }
        _ => format!("{prefix}status <> 'SENT'"),
    }
}

/// A failed publish to record.
#[derive(Debug, Clone)]
pub struct Failure {
    /// Row id.
    pub id: i64,
    /// The new attempt count.
    pub attempts: u32,
    /// RETRY or DEAD.
    pub dead: bool,
    /// When to try again (RETRY).
    pub next_attempt_at: DateTime<Utc>,
    /// Why it failed.
    pub error: String,
}

/// What to write back after publishing a claim.
#[derive(Debug, Clone, Default)]
pub struct Settlement {
    /// Confirmed by the broker.
    pub sent: Vec<i64>,
    /// Failed.
    pub failed: Vec<Failure>,
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

/// Write back a claim's outcome in one short transaction, fenced by its token.
pub async fn settle(
    db: &DatabaseConnection,
    token: Uuid,
    settlement: &Settlement,
    now: DateTime<Utc>,
) -> Result<Settled, DbErr> {
    if db.get_database_backend() == DbBackend::Postgres
        && settlement.failed.is_empty()
        && settlement.released.is_empty()
        && settlement.sent.len() <= SETTLE_CHUNK
    {
        return settle_sent_postgres(db, token, &settlement.sent, now).await;
    }
    let txn = begin(db).await?;
    let dialect = Dialect::of(&txn);
    let mut settled = Settled::default();

    for chunk in settlement.sent.chunks(SETTLE_CHUNK) {
        let mut sql = Sql::new(dialect);
        sql.push(&format!(
            "UPDATE {OUTBOX_TABLE} SET status = 'SENT', sent_at = "
        ))
        .bind(dialect.timestamp(now))
        .push(", locked_until = NULL, last_error = NULL WHERE status = 'PROCESSING' AND claim_token = ")
        .bind(dialect.uuid(token))
        .push(" AND id IN ")
        .bind_list(chunk.iter().map(|id| Value::from(*id)));
        settled.sent += txn.execute_raw(sql.build()).await?.rows_affected();
    }

    for failure in &settlement.failed {
        let mut sql = Sql::new(dialect);
        sql.push(&format!("UPDATE {OUTBOX_TABLE} SET status = "))
            .bind(
                if failure.dead {
                    status::DEAD
                } else {
                    status::RETRY
                }
                .to_owned()
                .into(),
            )
            .push(", attempts = ")
            .bind(i64::from(failure.attempts).into())
            .push(", next_attempt_at = ")
            .bind(dialect.timestamp(failure.next_attempt_at))
            .push(", last_error = ")
            .bind(truncate(&failure.error, 4000).into())
            .push(", locked_until = NULL WHERE status = 'PROCESSING' AND claim_token = ")
            .bind(dialect.uuid(token))
            .push(" AND id = ")
            .bind(failure.id.into());
        settled.failed += txn.execute_raw(sql.build()).await?.rows_affected();
    }

    let reclaimed: std::collections::HashSet<i64> =
        settlement.released_reclaimed.iter().copied().collect();
    let (given_back, plain): (Vec<i64>, Vec<i64>) = settlement
        .released
        .iter()
        .copied()
        .partition(|id| reclaimed.contains(id));
    for (ids, refund) in [(plain, 0i64), (given_back, 1i64)] {
        for chunk in ids.chunks(SETTLE_CHUNK) {
            let mut sql = Sql::new(dialect);
            sql.push(&format!(
                "UPDATE {OUTBOX_TABLE} SET attempts = attempts - {refund}, status = 'PENDING', \
                 locked_by = NULL, locked_until = NULL WHERE status = 'PROCESSING' AND claim_token = "
            ))
            .bind(dialect.uuid(token))
            .push(" AND id IN ")
            .bind_list(chunk.iter().map(|id| Value::from(*id)));
            settled.released += txn.execute_raw(sql.build()).await?.rows_affected();
        }
    }
    txn.commit().await?;
    Ok(settled)
}

/// Ids one settling statement names at most.
const SETTLE_CHUNK: usize = 1000;

/// The usual outcome on PostgreSQL, every event confirmed: one round trip. The statements go
/// as one simple query, which PostgreSQL runs as one implicit transaction (rolled back whole on
/// error), so `SET LOCAL` applies to its commit. Its values are ids, a UUID and a timestamp
/// this process made, written as literals.
async fn settle_sent_postgres(
    db: &DatabaseConnection,
    token: Uuid,
    sent: &[i64],
    now: DateTime<Utc>,
) -> Result<Settled, DbErr> {
    if sent.is_empty() {
        return Ok(Settled::default());
    }
    let mut sql = format!(
        "SET LOCAL synchronous_commit = off; UPDATE {OUTBOX_TABLE} SET status = 'SENT', \
         sent_at = '{}', locked_until = NULL, last_error = NULL \
         WHERE status = 'PROCESSING' AND claim_token = '{}' AND id IN (",
        now.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        token.hyphenated()
    );
    for (i, id) in sent.iter().enumerate() {
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str(&id.to_string());
    }
    sql.push(')');
    let result = db.execute_unprepared(&sql).await?;
    Ok(Settled {
        sent: result.rows_affected(),
        ..Settled::default()
    })
}

fn truncate(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((i, _)) => s[..i].to_owned(),
        None => s.to_owned(),
    }
}

/// The aggregate of a claimed row, as far as it can be read.
fn aggregate_of(row: &QueryResult) -> (Option<String>, Option<String>) {
    (
        row.try_get("", "aggregate_type").ok(),
        row.try_get("", "aggregate_id").ok(),
    )
}

/// A row that cannot be read (e.g. an `event_id` that is not a UUID, written by hand) can never
/// be published: DEAD with the reason, so that it does not stop every claim.
async fn mark_unreadable<C: ConnectionTrait>(
    conn: &C,
    dialect: &Dialect,
    id: i64,
    error: &DbErr,
) -> Result<(), DbErr> {
    let mut sql = Sql::new(*dialect);
    sql.push(&format!(
        "UPDATE {OUTBOX_TABLE} SET status = 'DEAD', attempts = attempts + 1, last_error = "
    ))
    .bind(format!("outbox row cannot be read: {error}").into())
    .push(" WHERE id = ")
    .bind(id.into());
    conn.execute_raw(sql.build()).await?;
    Ok(())
}

/// What [`move_to_inbox`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moved {
    /// Outbox events marked SENT.
    pub events: usize,
    /// Inbox rows inserted (one per subscribed consumer; duplicates skipped).
    pub inbox_rows: usize,
    /// Events that could not be turned into an envelope, marked DEAD.
    pub dead: usize,
    /// Inbox rows not inserted because the consumer already had the message (a resend).
    pub duplicates: usize,
}

/// The database-local transport: in one transaction, claim a batch, insert each event as a
/// PENDING inbox row of every consumer `routes` names for its type, and mark it SENT. No broker,
/// exactly once: the inbox rows and the SENT mark commit together.
pub async fn move_to_inbox(
    db: &DatabaseConnection,
    params: &ClaimParams<'_>,
    routes: &(dyn Fn(&str) -> Vec<&'static str> + Send + Sync),
) -> Result<Moved, DbErr> {
    let txn = begin(db).await?;
    let dialect = Dialect::of(&txn);
    let queue = Queue {
        table: OUTBOX_TABLE,
        columns: CLAIM_COLUMNS,
        scope: None,
        unfinished: unsent_predicate,
    };
    let mut moved = Moved::default();
    let mut sent = Vec::new();
    let mut dead_aggregates = std::collections::HashSet::new();
    for candidate in
        select_claimable(&txn, &queue, params.now, params.batch_size, params.ordering).await?
    {
        let aggregate = aggregate_of(&candidate.row);
        if params.ordering && dead_aggregates.contains(&aggregate) {
            continue; // behind a DEAD event of its aggregate: stays PENDING
        }
        // A row that cannot be read, turned into an envelope or delivered to anyone is DEAD.
        let ready = match decode(&dialect, &candidate.row) {
            Err(e) => Err(format!("outbox row cannot be read: {e}")),
            Ok((event, _, _)) => match event.envelope() {
                Err(reason) => Err(reason),
                Ok(_) if routes(&event.event_type).is_empty() => Err(format!(
                    "no consumer of this runtime handles event type `{}` (database-local \
                     transport): nothing would ever receive it",
                    event.event_type
                )),
                Ok(envelope) => Ok((event, envelope)),
            },
        };
        let (event, envelope) = match ready {
            Ok(pair) => pair,
            Err(reason) => {
                let mut sql = Sql::new(dialect);
                sql.push(&format!(
                    "UPDATE {OUTBOX_TABLE} SET status = 'DEAD', attempts = attempts + 1, last_error = "
                ))
                .bind(reason.into())
                .push(" WHERE id = ")
                .bind(candidate.id.into());
                txn.execute_raw(sql.build()).await?;
                moved.dead += 1;
                dead_aggregates.insert(aggregate);
                continue;
            }
        };
        let body = envelope.to_json();
        let message_id = event.event_id.to_string();
        for consumer in routes(&event.event_type) {
            let row = super::inbox::NewInboxRow {
                consumer,
                message_id: &message_id,
                event_type: Some(&event.event_type),
                source: Some(&event.source),
                aggregate_type: Some(&event.aggregate_type),
                aggregate_id: Some(&event.aggregate_id),
                aggregate_version: event.aggregate_version,
                schema_version: Some(event.schema_version),
                payload: &body,
            };
            if super::inbox::insert(&txn, &row, &super::inbox::InitialState::Pending, params.now)
                .await?
            {
                moved.inbox_rows += 1;
            } else {
                moved.duplicates += 1;
            }
        }
        sent.push(event.id);
    }
    for chunk in sent.chunks(1000) {
        let mut sql = Sql::new(dialect);
        sql.push(&format!(
            "UPDATE {OUTBOX_TABLE} SET status = 'SENT', sent_at = "
        ))
        .bind(dialect.timestamp(params.now))
        .push(", locked_by = ")
        .bind(params.relay_id.to_owned().into())
        .push(", locked_until = NULL, last_error = NULL WHERE id IN ")
        .bind_list(chunk.iter().map(|id| Value::from(*id)));
        txn.execute_raw(sql.build()).await?;
    }
    moved.events = sent.len();
    txn.commit().await?;
    Ok(moved)
}
