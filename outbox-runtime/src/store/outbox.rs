//! The commit-time INSERT of a transaction's buffered events into `outbox_event`, and the
//! events it carries and skips.

use std::{borrow::Cow, collections::HashSet};

use sea_orm::{ConnectionTrait, DbErr};
use uuid::Uuid;

use super::{DbTime, Dialect, OUTBOX_TABLE};
use crate::event::EventId;

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
    pub(crate) fn skipped(&self) -> SkippedEvent {
        SkippedEvent {
            event_id: self.event_id,
            event_type: self.event_type.to_string(),
            dedup_key: self.dedup_key.clone().unwrap_or_default(),
        }
    }
}

/// An event not written because its `(event_type, dedup_key)` was already in the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedEvent {
    /// The id `enqueue` returned for it (no row has it).
    pub event_id: EventId,
    /// Its type.
    pub event_type: String,
    /// The key that was already present.
    pub dedup_key: String,
}

/// Columns bound per row by the commit-time INSERT, in order.
const INSERT_COLUMNS: [&str; 10] = [
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

/// What the commit-time INSERT did.
#[derive(Debug, Default)]
pub(crate) struct InsertOutcome {
    pub(crate) written: usize,
    pub(crate) skipped: Vec<SkippedEvent>,
}

/// Write buffered events with multi-row INSERTs of at most `batch_rows` rows.
///
/// A second event with the same `(event_type, dedup_key)` as one in the table or earlier in the
/// batch is skipped without aborting the transaction, and reported.
pub(crate) async fn insert_events<C: ConnectionTrait>(
    conn: &C,
    events: &[PendingEvent],
    batch_rows: usize,
) -> Result<InsertOutcome, DbErr> {
    let dialect = Dialect::of(conn);
    let mut outcome = InsertOutcome::default();

    // Duplicates inside this transaction's own buffer never reach the database.
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    let mut to_write: Vec<&PendingEvent> = Vec::with_capacity(events.len());
    for event in events {
        if let Some(key) = &event.dedup_key
            && !seen.insert((&event.event_type, key))
        {
            outcome.skipped.push(event.skipped());
            continue;
        }
        to_write.push(event);
    }

    for chunk in to_write.chunks(batch_rows.max(1)) {
        let mut sql = String::with_capacity(128 + chunk.len() * 80);
        sql.push_str("INSERT INTO ");
        sql.push_str(OUTBOX_TABLE);
        sql.push_str(" (");
        sql.push_str(&INSERT_COLUMNS.join(", "));
        sql.push_str(", created_at) VALUES ");
        let mut values = Vec::with_capacity(chunk.len() * INSERT_COLUMNS.len());
        let mut n = 0;
        for (i, event) in chunk.iter().enumerate() {
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push('(');
            for col in 0..INSERT_COLUMNS.len() {
                n += 1;
                if col > 0 {
                    sql.push_str(", ");
                }
                if col == 8 || col == 9 {
                    sql.push_str(&dialect.json_placeholder(n));
                } else {
                    sql.push_str(&dialect.placeholder(n));
                }
            }
            // Written by the database's clock, like every instant the SDK stores.
            sql.push_str(", ");
            sql.push_str(&dialect.time_literal(DbTime::NOW));
            sql.push(')');
            values.push(dialect.uuid(event.event_id));
            values.push(event.source.clone().into());
            values.push(event.event_type.to_string().into());
            values.push(i64::from(event.schema_version).into());
            values.push(event.aggregate_type.to_string().into());
            values.push(event.aggregate_id.clone().into());
            values.push(event.aggregate_version.into());
            values.push(event.dedup_key.clone().into());
            values.push(event.payload.clone().into());
            values.push(event.headers.clone().into());
        }
        if let Some(clause) =
            dialect.outbox_insert_conflict(chunk.iter().any(|e| e.dedup_key.is_some()))
        {
            sql.push(' ');
            sql.push_str(clause);
        }
        conn.execute_raw(dialect.statement(sql, values)).await?;
    }

    // Which events with a dedup key were skipped because the table already had their key?
    let keyed: Vec<&PendingEvent> = to_write
        .iter()
        .copied()
        .filter(|e| e.dedup_key.is_some())
        .collect();
    if !keyed.is_empty() {
        let mut present: HashSet<Uuid> = HashSet::with_capacity(keyed.len());
        for chunk in keyed.chunks(batch_rows.max(1)) {
            let placeholders: Vec<String> =
                (1..=chunk.len()).map(|n| dialect.placeholder(n)).collect();
            let sql = format!(
                "SELECT event_id FROM {OUTBOX_TABLE} WHERE event_id IN ({})",
                placeholders.join(", ")
            );
            let values = chunk.iter().map(|e| dialect.uuid(e.event_id)).collect();
            for row in conn.query_all_raw(dialect.statement(sql, values)).await? {
                present.insert(dialect.get_uuid(&row, "event_id")?);
            }
        }
        for event in keyed {
            if !present.contains(&event.event_id) {
                outcome.skipped.push(event.skipped());
            }
        }
    }
    outcome.written = events.len() - outcome.skipped.len();
    Ok(outcome)
}
