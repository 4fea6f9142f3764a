//! A tracked session: commit something, then wait until the relay, the consumers and every
//! cascade they trigger are quiet, and read what was published and handled.
//!
//! **Quiet**, read from one snapshot of the database: no event is PENDING or PROCESSING, no retry of
//! a publish is due, no delayed event is due, no inbox row is PENDING or PROCESSING, no handler
//! retry is due, and every event sent since the session started has reached the inbox of every
//! tracked consumer that handles its type (an event sent but not yet recorded is in flight on
//! the broker). Each of these changes in the same commit as the next one begins (a handler's
//! cascade commits with its inbox row; a relay moves an event to `outbox_sent` in the
//! transaction of its mark), so there is no moment between two steps where nothing shows.
//! Retries and delayed events that are not yet due are not moving: [`Session::skip_backoff`]
//! makes them due as soon as they appear, or `testing::make_due` does once.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::{self, Write as _},
    time::{Duration, Instant},
};

use sea_orm::{DatabaseConnection, DatabaseTransaction};
use serde::de::DeserializeOwned;

use super::{
    KitError,
    consumer::MessageState,
    events::{EventState, Events},
};
use crate::{
    envelope::Envelope,
    event::DomainEvent,
    runtime::Runtime,
    store::{
        self,
        kit::{KitMark, KitMessageRow},
    },
};

/// A message in a consumer's inbox, as a session reads it.
#[derive(Debug, Clone)]
pub struct Message {
    /// The consumer.
    pub consumer: String,
    /// The message's id (an SDK event's id, or the sender's).
    pub message_id: String,
    /// Its type (empty for an undecodable message).
    pub event_type: String,
    /// Who sent it (empty for an undecodable message).
    pub source: String,
    /// Its aggregate's id, when it has one.
    pub aggregate_id: Option<String>,
    /// Where it is.
    pub state: MessageState,
    /// Handler attempts so far.
    pub attempts: u32,
    /// The handler's last error.
    pub last_error: Option<String>,
    /// The message as received: a CloudEvents document for an SDK event, the body for others.
    pub payload: Vec<u8>,
}

impl Message {
    fn from_row(row: KitMessageRow) -> Message {
        Message {
            state: MessageState::parse(&row.status, row.due_at),
            consumer: row.consumer,
            message_id: row.message_id,
            event_type: row.event_type,
            source: row.source,
            aggregate_id: row.aggregate_id,
            attempts: u32::try_from(row.attempts).unwrap_or(u32::MAX),
            last_error: row.last_error,
            payload: row.payload,
        }
    }

    /// The payload as an `E`: an SDK event's `data`, or another system's JSON body.
    pub fn decode<E: DeserializeOwned>(&self) -> Result<E, String> {
        match Envelope::from_json(&self.payload) {
            Ok(envelope) => envelope.data_as::<E>().map_err(|e| e.to_string()),
            Err(_) => serde_json::from_slice(&self.payload).map_err(|e| e.to_string()),
        }
    }
}

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} ({:?}, {} attempt(s))",
            self.consumer, self.event_type, self.message_id, self.state, self.attempts
        )?;
        if let Some(error) = &self.last_error {
            write!(f, ": {error}")?;
        }
        Ok(())
    }
}

/// What a session saw once quiet.
#[derive(Debug, Clone)]
pub struct Quiet {
    /// The events committed since the session started (sent, dead, or scheduled for later).
    pub events: Events,
    /// The inbox rows recorded since the session started, every consumer's.
    pub messages: Vec<Message>,
    /// How long it took to become quiet.
    pub waited: Duration,
}

impl Quiet {
    /// `consumer`'s messages.
    pub fn messages_of(&self, consumer: &str) -> Vec<&Message> {
        self.messages
            .iter()
            .filter(|m| m.consumer == consumer)
            .collect()
    }

    /// The `E`s `consumer` handled (DONE), decoded, in the order they were recorded.
    pub fn handled<E: DomainEvent + DeserializeOwned>(&self, consumer: &str) -> Vec<E> {
        self.messages
            .iter()
            .filter(|m| {
                m.consumer == consumer
                    && m.event_type == E::EVENT_TYPE
                    && m.state == MessageState::Done
            })
            .map(|m| {
                m.decode::<E>().unwrap_or_else(|error| {
                    panic!(
                        "message {} does not decode as {}: {error}",
                        m.message_id,
                        std::any::type_name::<E>()
                    )
                })
            })
            .collect()
    }

    /// The messages that ended DEAD.
    pub fn dead(&self) -> Vec<&Message> {
        self.messages
            .iter()
            .filter(|m| m.state == MessageState::Dead)
            .collect()
    }
}

/// Watches a database from a moment on: see the module's documentation for what quiet means.
///
/// ```no_run
/// # async fn f(db: sea_orm::DatabaseConnection, runtime: outbox_runtime::runtime::Runtime)
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use outbox_runtime::testing::Session;
/// let session = Session::start(&db).await?.runtime(&runtime).skip_backoff(true);
/// // … commit an order …
/// let quiet = session.quiet(Duration::from_secs(10)).await?;
/// assert!(quiet.dead().is_empty());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Session {
    db: DatabaseConnection,
    mark: KitMark,
    /// Consumers waited for, with the event types they take.
    consumers: BTreeMap<String, BTreeSet<String>>,
    skip_backoff: bool,
    poll: Duration,
    started: Instant,
}

impl Session {
    /// A session on `db` from now on, tracking no consumer yet.
    pub async fn start(db: &DatabaseConnection) -> Result<Session, KitError> {
        Ok(Session {
            db: db.clone(),
            mark: store::kit::mark(db).await?,
            consumers: BTreeMap::new(),
            skip_backoff: false,
            poll: Duration::from_millis(10),
            started: Instant::now(),
        })
    }

    /// Wait for sent events to reach these consumers too (their handlers linked into this
    /// binary say which event types they take): consumers run by another runtime or process.
    pub fn consumers<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let handlers = crate::runtime::handlers().unwrap_or_default();
        for name in names {
            let name = name.as_ref();
            let types = handlers
                .get(name)
                .into_iter()
                .flatten()
                .filter(|r| r.source.is_none())
                .map(|r| r.event_type.to_owned())
                .collect();
            self.consumers.insert(name.to_owned(), types);
        }
        self
    }

    /// Track the consumers `runtime` runs.
    pub fn runtime(self, runtime: &Runtime) -> Self {
        self.consumers(runtime.consumers())
    }

    /// While waiting, make every retry and delayed event due as soon as it appears (by the
    /// database's clock: their due times are set to its current time): a test does not wait
    /// out a backoff. Off by default.
    pub fn skip_backoff(mut self, on: bool) -> Self {
        self.skip_backoff = on;
        self
    }

    /// Wait until quiet, at most `timeout`; past it, an error that lists what is still moving.
    pub async fn quiet(&self, timeout: Duration) -> Result<Quiet, KitError> {
        let started = Instant::now();
        loop {
            if self.skip_backoff {
                store::kit::bring_forward(&self.db).await?;
            }
            // Every look reads one snapshot: read statement by statement, a handler's cascade
            // committed between two of them (its inbox row settled, its events not yet seen)
            // would look quiet.
            let txn = store::kit::snapshot(&self.db).await?;
            let events = Events::from_rows(store::kit::events_since_in(&txn, &self.mark).await?);
            let moving = self.moving(&txn, &events).await?;
            if moving.is_empty() {
                let messages = store::kit::messages_since_in(&txn, &self.mark, None).await?;
                txn.commit().await?;
                return Ok(Quiet {
                    events,
                    messages: messages.into_iter().map(Message::from_row).collect(),
                    waited: started.elapsed(),
                });
            }
            txn.commit().await?;
            if started.elapsed() >= timeout {
                return Err(KitError::NotQuiet(format!(
                    "not quiet after {timeout:?} ({:?} since the session started); still moving:\n{moving}",
                    self.started.elapsed()
                )));
            }
            tokio::time::sleep(self.poll).await;
        }
    }

    /// The events committed since the session started.
    pub async fn events(&self) -> Result<Events, KitError> {
        Ok(Events::from_rows(
            store::kit::events_since(&self.db, &self.mark).await?,
        ))
    }

    /// The inbox rows recorded since the session started.
    pub async fn messages(&self) -> Result<Vec<Message>, KitError> {
        Ok(store::kit::messages_since(&self.db, &self.mark, None)
            .await?
            .into_iter()
            .map(Message::from_row)
            .collect())
    }

    /// What is still moving, read through `txn` (one snapshot), in which `events` are the
    /// events since the session started.
    async fn moving(&self, txn: &DatabaseTransaction, events: &Events) -> Result<Moving, KitError> {
        let now = store::kit::moving(txn).await?;
        let mut moving = Moving {
            events: Events::from_rows(now.events),
            messages: now.messages.into_iter().map(Message::from_row).collect(),
            in_flight: Vec::new(),
        };
        if self.consumers.is_empty() {
            return Ok(moving);
        }
        let sent = events.in_state(&EventState::Sent);
        if sent.is_empty() {
            return Ok(moving);
        }
        let recorded: BTreeSet<(String, String)> =
            store::kit::messages_since_in(txn, &self.mark, None)
                .await?
                .into_iter()
                .map(|m| (m.consumer, m.message_id))
                .collect();
        for event in &sent {
            let id = event.event_id.to_string();
            for (consumer, types) in &self.consumers {
                if types.contains(&event.event_type)
                    && !recorded.contains(&(consumer.clone(), id.clone()))
                {
                    moving.in_flight.push(format!(
                        "{} {}/{} {id}: sent, not yet in {consumer}'s inbox",
                        event.event_type, event.aggregate_type, event.aggregate_id
                    ));
                }
            }
        }
        Ok(moving)
    }
}

/// What is still moving, for the error a session returns when it is not quiet in time.
struct Moving {
    events: Events,
    messages: Vec<Message>,
    in_flight: Vec<String>,
}

impl Moving {
    fn is_empty(&self) -> bool {
        self.events.is_empty() && self.messages.is_empty() && self.in_flight.is_empty()
    }
}

/// Lines listed per kind before the rest is counted.
const LISTED: usize = 20;

impl fmt::Display for Moving {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        let mut list = |title: &str, lines: Vec<String>| {
            if lines.is_empty() {
                return;
            }
            let _ = writeln!(out, "- {} {title}:", lines.len());
            for line in lines.iter().take(LISTED) {
                let _ = writeln!(out, "    {line}");
            }
            if lines.len() > LISTED {
                let _ = writeln!(out, "    … and {} more", lines.len() - LISTED);
            }
        };
        list(
            "event(s) to publish (pending, claimed, a due retry or a due delayed event)",
            self.events.iter().map(ToString::to_string).collect(),
        );
        list("event(s) in flight", self.in_flight.clone());
        list(
            "inbox message(s) to handle (pending, claimed or a due retry)",
            self.messages.iter().map(ToString::to_string).collect(),
        );
        f.write_str(out.trim_end())
    }
}
