//! Events as a test sees them: buffered in a transaction before its commit, or stored in the
//! outbox after it (unsent, sent, or still scheduled).

use std::{collections::BTreeMap, fmt};

use chrono::{DateTime, Utc};
use sea_orm::{DatabaseConnection, DbErr};
use serde::de::DeserializeOwned;

use crate::{
    event::{DomainEvent, EventId},
    store::{
        self,
        kit::{KitEventRow, KitMark},
    },
    transaction::{OutboxTransaction, PendingEvent},
};

/// Where an event is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventState {
    /// Enqueued in a transaction that has not committed.
    Buffered,
    /// Enqueued with `enqueue_at`/`enqueue_after`, waiting until it is due; `None` before the
    /// commit when the due time is relative to it.
    Scheduled(Option<DateTime<Utc>>),
    /// Committed, not yet claimed by a relay.
    Pending,
    /// Claimed by a relay, being published.
    Processing,
    /// A publish failed; due again at this time.
    Retry(Option<DateTime<Utc>>),
    /// Confirmed by the broker (or delivered to the local consumers' inboxes).
    Sent,
    /// Given up after the relay's `max_attempts`; waits for an operator.
    Dead,
}

/// One event, with what a test asserts on: its type, aggregate, payload, headers and state.
#[derive(Debug, Clone)]
pub struct CapturedEvent {
    /// Its id (the CloudEvents `id`).
    pub event_id: EventId,
    /// Its type, e.g. `order.placed`.
    pub event_type: String,
    /// Its schema version.
    pub schema_version: u32,
    /// Its aggregate's type.
    pub aggregate_type: String,
    /// Its aggregate's id.
    pub aggregate_id: String,
    /// Its aggregate's version, when it carries one.
    pub aggregate_version: Option<i64>,
    /// Its producer-side dedup key, when it has one.
    pub dedup_key: Option<String>,
    /// Its headers: the user's (`enqueue_with_headers`) and the trace context.
    pub headers: BTreeMap<String, String>,
    /// The payload as JSON.
    pub payload: serde_json::Value,
    /// Where it is.
    pub state: EventState,
    /// Publish attempts so far.
    pub attempts: u32,
    /// The relay's last publish error.
    pub last_error: Option<String>,
}

impl CapturedEvent {
    /// Whether it is an `E`.
    pub fn is<E: DomainEvent>(&self) -> bool {
        self.event_type == E::EVENT_TYPE
    }

    /// Its payload as an `E`.
    pub fn decode<E: DeserializeOwned>(&self) -> Result<E, serde_json::Error> {
        E::deserialize(&self.payload)
    }

    fn from_parts(
        event_id: EventId,
        event_type: String,
        schema_version: u32,
        aggregate: (String, String, Option<i64>),
        dedup_key: Option<String>,
        payload: &str,
        headers: &str,
    ) -> CapturedEvent {
        let headers = serde_json::from_str::<BTreeMap<String, serde_json::Value>>(headers)
            .unwrap_or_default()
            .into_iter()
            .map(|(name, value)| match value {
                serde_json::Value::String(s) => (name, s),
                other => (name, other.to_string()),
            })
            .collect();
        CapturedEvent {
            event_id,
            event_type,
            schema_version,
            aggregate_type: aggregate.0,
            aggregate_id: aggregate.1,
            aggregate_version: aggregate.2,
            dedup_key,
            headers,
            payload: serde_json::from_str(payload).unwrap_or(serde_json::Value::Null),
            state: EventState::Buffered,
            attempts: 0,
            last_error: None,
        }
    }

    pub(super) fn from_row(row: KitEventRow) -> CapturedEvent {
        let state = match row.status.as_str() {
            "SCHEDULED" => EventState::Scheduled(row.due_at),
            "PENDING" => EventState::Pending,
            "PROCESSING" => EventState::Processing,
            "RETRY" => EventState::Retry(row.due_at),
            "SENT" => EventState::Sent,
            _ => EventState::Dead,
        };
        let mut event = CapturedEvent::from_parts(
            row.event_id,
            row.event_type,
            u32::try_from(row.schema_version).unwrap_or(0),
            (row.aggregate_type, row.aggregate_id, row.aggregate_version),
            row.dedup_key,
            &row.payload,
            &row.headers,
        );
        event.state = state;
        event.attempts = u32::try_from(row.attempts).unwrap_or(u32::MAX);
        event.last_error = row.last_error;
        event
    }
}

impl fmt::Display for CapturedEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}/{} ({:?}) {}",
            self.event_type, self.aggregate_type, self.aggregate_id, self.state, self.payload
        )
    }
}

/// Events in the order they were enqueued (buffered or committed), with typed accessors that
/// fail the test with a listing of what was there.
#[derive(Debug, Clone, Default)]
pub struct Events {
    events: Vec<CapturedEvent>,
}

impl Events {
    /// Every event.
    pub fn all(&self) -> &[CapturedEvent] {
        &self.events
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Their types, in order.
    pub fn types(&self) -> Vec<&str> {
        self.events.iter().map(|e| e.event_type.as_str()).collect()
    }

    /// Those that match `keep`.
    pub fn filter(&self, keep: impl Fn(&CapturedEvent) -> bool) -> Events {
        Events {
            events: self.events.iter().filter(|e| keep(e)).cloned().collect(),
        }
    }

    /// Those of aggregate `aggregate_id` (any aggregate type).
    pub fn for_aggregate(&self, aggregate_id: impl fmt::Display) -> Events {
        let id = aggregate_id.to_string();
        self.filter(|e| e.aggregate_id == id)
    }

    /// Those in the same kind of state as `state` (any due time for `Scheduled` and `Retry`).
    pub fn in_state(&self, state: &EventState) -> Events {
        self.filter(|e| std::mem::discriminant(&e.state) == std::mem::discriminant(state))
    }

    /// How many are `E`s.
    pub fn count<E: DomainEvent>(&self) -> usize {
        self.events.iter().filter(|e| e.is::<E>()).count()
    }

    /// The `E`s, decoded. Panics, naming the event, when one does not decode as an `E`.
    pub fn of<E: DomainEvent + DeserializeOwned>(&self) -> Vec<E> {
        self.events
            .iter()
            .filter(|e| e.is::<E>())
            .map(|e| {
                e.decode::<E>().unwrap_or_else(|error| {
                    panic!(
                        "event {} ({}) does not decode as {}: {error}",
                        e.event_id,
                        e.event_type,
                        std::any::type_name::<E>()
                    )
                })
            })
            .collect()
    }

    /// The one `E`, decoded. Panics, listing the events, unless there is exactly one.
    pub fn one<E: DomainEvent + DeserializeOwned>(&self) -> E {
        let mut found = self.of::<E>();
        if found.len() != 1 {
            panic!(
                "expected exactly one {} event, found {}; the events:\n{self}",
                E::EVENT_TYPE,
                found.len()
            );
        }
        found.remove(0)
    }

    /// Panics, listing the events, when there is an `E` among them.
    pub fn none<E: DomainEvent>(&self) {
        if self.count::<E>() > 0 {
            panic!(
                "expected no {} event, found {}; the events:\n{self}",
                E::EVENT_TYPE,
                self.count::<E>()
            );
        }
    }

    /// Iterate over them.
    pub fn iter(&self) -> std::slice::Iter<'_, CapturedEvent> {
        self.events.iter()
    }
}

impl<'a> IntoIterator for &'a Events {
    type Item = &'a CapturedEvent;
    type IntoIter = std::slice::Iter<'a, CapturedEvent>;

    fn into_iter(self) -> Self::IntoIter {
        self.events.iter()
    }
}

impl fmt::Display for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.events.is_empty() {
            return f.write_str("  (none)");
        }
        for (i, e) in self.events.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "  {e}")?;
        }
        Ok(())
    }
}

/// What `tx` has enqueued so far at its level (a savepoint's own events until it is released),
/// before the commit: events, then delayed events. Which ones a dedup key makes the commit skip
/// is known at the commit: see [`CommitReport::skipped`](crate::CommitReport::skipped).
pub fn enqueued(tx: &OutboxTransaction) -> Events {
    let buffered = |e: PendingEvent, state: EventState| {
        let mut event = CapturedEvent::from_parts(
            e.event_id,
            e.event_type.into_owned(),
            e.schema_version,
            (
                e.aggregate_type.into_owned(),
                e.aggregate_id,
                e.aggregate_version,
            ),
            e.dedup_key,
            &e.payload,
            &e.headers,
        );
        event.state = state;
        event
    };
    let (events, scheduled) = tx.buffered_events();
    let mut captured: Vec<CapturedEvent> = events
        .into_iter()
        .map(|e| buffered(e, EventState::Buffered))
        .collect();
    captured.extend(
        scheduled
            .into_iter()
            .map(|(e, at)| buffered(e, EventState::Scheduled(at))),
    );
    Events { events: captured }
}

/// A moment in a database's history: [`events`] and the session's reads take what came after
/// it. [`Mark::start`] is before everything (a test's own database).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mark(pub(crate) KitMark);

impl Mark {
    /// Before every row: everything the database holds.
    pub fn start() -> Mark {
        Mark::default()
    }

    /// Now: rows written after this call.
    pub async fn now(db: &DatabaseConnection) -> Result<Mark, DbErr> {
        store::kit::mark(db).await.map(Mark)
    }
}

/// The events committed to `db` after `since`: unsent, sent, dead and still scheduled ones, in
/// the order they were committed (scheduled ones last).
///
/// ```no_run
/// # async fn f(db: sea_orm::DatabaseConnection) -> Result<(), sea_orm::DbErr> {
/// use outbox_runtime::testing::{Mark, events};
/// let start = Mark::now(&db).await?;
/// // … the code under test commits …
/// let committed = events(&db, &start).await?;
/// assert_eq!(committed.for_aggregate(42).types(), ["order.placed"]);
/// # Ok(()) }
/// ```
pub async fn events(db: &DatabaseConnection, since: &Mark) -> Result<Events, DbErr> {
    let rows = store::kit::events_since(db, &since.0).await?;
    Ok(Events {
        events: rows.into_iter().map(CapturedEvent::from_row).collect(),
    })
}

impl Events {
    /// These events, then those of `other` not among them.
    pub(super) fn merged(&self, other: &Events) -> Events {
        let mut events = self.events.clone();
        for e in &other.events {
            if !events.iter().any(|seen| seen.event_id == e.event_id) {
                events.push(e.clone());
            }
        }
        Events { events }
    }

    pub(super) fn from_rows(rows: Vec<KitEventRow>) -> Events {
        Events {
            events: rows.into_iter().map(CapturedEvent::from_row).collect(),
        }
    }
}
