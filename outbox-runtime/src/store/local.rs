//! The database-local transport's one statement of work: in one transaction, claim a batch of
//! outbox events, insert each as a PENDING inbox row of every consumer that handles its type,
//! and mark it SENT. No broker, exactly once: the inbox rows and the SENT mark commit together.

use sea_orm::{DatabaseConnection, DatabaseTransaction, DbErr, QueryResult};

use crate::envelope::Envelope;

use super::{
    Dialect,
    claim::{ClaimParams, select_claimable},
    inbox::{InboxState, NewInboxRow},
    relay::{ClaimedEvent, aggregate_of, decode, mark_dead, outbox_queue},
    sql::Sql,
    tx::begin_work,
};

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

/// Move a batch of outbox events into the inbox rows of the consumers `routes` names for each
/// event type (see the module docs). An event that cannot be read, turned into an envelope or
/// delivered to anyone is DEAD; with ordering, the rest of its aggregate stays PENDING.
pub async fn move_to_inbox(
    db: &DatabaseConnection,
    params: &ClaimParams<'_>,
    routes: &(dyn Fn(&str) -> Vec<&'static str> + Send + Sync),
    held: &[String],
) -> Result<Moved, DbErr> {
    let txn = begin_work(db).await?;
    let dialect = Dialect::of(&txn);
    let queue = super::claim::Queue {
        held,
        ..outbox_queue(dialect)
    };
    let mut moved = Moved::default();
    let mut sent = Vec::new();
    let mut types = Vec::new();
    let mut spans = Vec::new();
    let mut took = std::time::Duration::ZERO;
    let mut dead_aggregates = std::collections::HashSet::new();
    for candidate in select_claimable(&txn, &queue, params.batch_size, params.ordering)
        .await?
        .rows
    {
        let aggregate = aggregate_of(&candidate.row);
        if params.ordering && dead_aggregates.contains(&aggregate) {
            continue; // behind a DEAD event of its aggregate: stays PENDING
        }
        let (event, envelope, consumers) = match deliverable(&dialect, &candidate.row, routes) {
            Ok(ready) => ready,
            Err(reason) => {
                mark_dead(&txn, &dialect, candidate.id, &reason).await?;
                moved.dead += 1;
                dead_aggregates.insert(aggregate);
                continue;
            }
        };
        // The producer span of this event's move, in the trace of the request that enqueued it.
        spans.push(crate::telemetry::send_span(&crate::telemetry::Send {
            road: crate::telemetry::Road::Local,
            system: "database-local",
            destination: &event.event_type,
            message_id: &event.event_id,
            event_type: &event.event_type,
            aggregate_type: &event.aggregate_type,
            aggregate_id: &event.aggregate_id,
            body_size: event.payload.len(),
            traceparent: envelope.traceparent.as_deref(),
            tracestate: envelope.tracestate.as_deref(),
        }));
        let started = std::time::Instant::now();
        insert_pending(&txn, &event, &envelope, consumers, &mut moved).await?;
        took += started.elapsed();
        sent.push(event.id);
        types.push(event.event_type);
    }
    if sent.is_empty() {
        txn.commit().await?;
        return Ok(moved);
    }
    let started = std::time::Instant::now();
    let written = match mark_sent(&txn, &sent, params.owner).await {
        Ok(()) => txn.commit().await,
        Err(e) => Err(e),
    };
    let error = written.as_ref().err().map(|_| "database");
    if let Some(error) = error {
        spans
            .iter()
            .for_each(|span| crate::telemetry::failed(span, error));
    }
    crate::telemetry::sent(
        "database-local",
        types.into_iter().map(|t| (t, error)),
        took + started.elapsed(),
    );
    written?;
    moved.events = sent.len();
    Ok(moved)
}

/// An outbox row as the local consumers receive it: the event, its envelope and the consumers
/// that handle its type; or why it can never be delivered (it goes DEAD).
fn deliverable(
    dialect: &Dialect,
    row: &QueryResult,
    routes: &(dyn Fn(&str) -> Vec<&'static str> + Send + Sync),
) -> Result<(ClaimedEvent, Envelope, Vec<&'static str>), String> {
    let read = decode(dialect, row).map_err(|e| format!("outbox row cannot be read: {e}"))?;
    let envelope = read.event.envelope()?;
    let consumers = routes(&read.event.event_type);
    if consumers.is_empty() {
        return Err(format!(
            "no consumer of this runtime handles event type `{}` (database-local transport): \
             nothing would ever receive it",
            read.event.event_type
        ));
    }
    Ok((read.event, envelope, consumers))
}

/// Insert `event` as a PENDING inbox row of each of `consumers` (a consumer that has it already
/// counts a duplicate).
async fn insert_pending(
    txn: &DatabaseTransaction,
    event: &ClaimedEvent,
    envelope: &Envelope,
    consumers: Vec<&'static str>,
    moved: &mut Moved,
) -> Result<(), DbErr> {
    let body = envelope.to_json();
    let message_id = event.event_id.to_string();
    for consumer in consumers {
        let row = NewInboxRow {
            consumer,
            message_id: &message_id,
            event_type: Some(&event.event_type),
            source: Some(&event.source),
            aggregate_type: Some(&event.aggregate_type),
            aggregate_id: Some(&event.aggregate_id),
            aggregate_version: event.aggregate_version,
            schema_version: Some(event.schema_version),
            payload: &body,
            ..NewInboxRow::default()
        };
        if super::inbox::insert(txn, &row, &InboxState::Pending).await? {
            moved.inbox_rows += 1;
        } else {
            moved.duplicates += 1;
        }
    }
    Ok(())
}

/// The rows this transaction claimed (unfinished, and locked by it), moved by `owner`.
struct Claimed<'a> {
    owner: &'a str,
}

impl super::sent::MoveRule for Claimed<'_> {
    fn push_where(&self, sql: &mut Sql) {
        let unsent = sql.dialect().unsent("");
        sql.push(" WHERE ").push(&unsent);
    }

    fn sent_by(&self) -> Option<&str> {
        Some(self.owner)
    }
}

/// Mark the moved events SENT, by `owner`: move them to `outbox_sent`.
async fn mark_sent(txn: &DatabaseTransaction, sent: &[i64], owner: &str) -> Result<(), DbErr> {
    for chunk in sent.chunks(1000) {
        super::sent::move_sent(txn, &Claimed { owner }, chunk).await?;
    }
    Ok(())
}
