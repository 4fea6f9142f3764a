//! One consumer at run time: its handlers and settings, shared by the stages that move its
//! messages, each in a file of its own:
//!
//! - [`dispatch`](super::dispatch): subscribe to the broker and spread deliveries over lanes
//!   keyed by aggregate;
//! - [`deliver`](super::deliver): record and handle one delivery inline, or store it for the
//!   worker; duplicates and conflicts;
//! - [`batch`](super::batch): record and handle the deliveries that arrived together in a lane in
//!   one transaction;
//! - [`worker`](super::worker): claim stored, retried and locally delivered messages and handle
//!   them;
//! - [`settle`](super::settle): the one path all of them share: run the handler, commit, or record
//!   the failure where the message lives.
//!
//! **Order.** With ordering on, a message waits behind an unfinished message of its aggregate
//! (stored PENDING behind it), and deliveries of one aggregate run one after another while
//! different aggregates run in parallel (keyed concurrency). Order holds within one runtime
//! instance; instances sharing a consumer name on a broker can each get messages of one aggregate,
//! so handlers that must not apply stale events should also check the aggregate version.

use std::{
    collections::HashMap,
    fmt,
    sync::{Arc, atomic::AtomicU32},
    time::Duration,
};

use sea_orm::DatabaseConnection;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{
    HandlerMode, HandlerRegistration, InboxConfig,
    linked::{ByEventType, by_event_type},
    stats::{ConsumerStats, Counter},
};
use crate::{
    envelope::Envelope, outbox::Outbox, store::Failure, store::inbox::NewInboxRow,
    transport::Delivery, util::backoff::Backoff,
};

/// A consumer's handlers and settings, shared by its dispatcher and worker.
pub(crate) struct Consumer {
    pub(crate) name: &'static str,
    /// The name of its database in a set of databases (`fleet`); empty for a runtime over one.
    pub(crate) database: String,
    /// The `messaging.system` its messages come through (the transport's name).
    pub(crate) system: &'static str,
    /// Whether an operator paused it (see `pause.rs`).
    pub(crate) pauses: Arc<crate::pause::Pauses>,
    /// Handlers of this SDK's events, by event type and schema version.
    handlers: ByEventType,
    /// Handlers of external messages, by source and message type.
    external: HashMap<(&'static str, &'static str), &'static HandlerRegistration>,
    pub(crate) event_types: Vec<String>,
    pub(super) ordering: bool,
    pub(super) mode: HandlerMode,
    pub(crate) config: InboxConfig,
    pub(super) db: DatabaseConnection,
    /// The server's timeline, for [`InboxConfig::wait_for_standbys`](super::InboxConfig::wait_for_standbys).
    pub(super) timeline: crate::store::standby::Timeline,
    pub(crate) outbox: Outbox,
    pub(crate) wake: Arc<Notify>,
    pub(crate) stats: Arc<ConsumerStats>,
    pub(super) worker_id: String,
    /// Batches still to run with savepoints from the start (see `batch`).
    pub(super) careful: AtomicU32,
    /// Where the worker's claims start (see `store/floor.rs`).
    pub(super) floor: std::sync::Mutex<crate::store::floor::Floor>,
    /// Whether handled messages rotate on its database, once seen (see `store/inbox_done.rs`).
    pub(super) rotation: crate::store::inbox_done::RotationSeen,
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("name", &self.name)
            .field("event_types", &self.event_types)
            .field("ordering", &self.ordering)
            .field("mode", &self.mode)
            .finish()
    }
}

/// A broker delivery and its decoded envelope (or why it could not be decoded).
pub(crate) type Decoded = (Delivery, Result<Envelope, String>);

impl Consumer {
    /// Wait while an operator has this consumer paused (reading `outbox_pause` as due); false
    /// once shutdown is asked for.
    pub(crate) async fn wait_while_paused(&self, shutdown: &CancellationToken) -> bool {
        loop {
            self.pauses.refresh_if_due(&self.db).await;
            if !self.pauses.consumer_paused(self.name) {
                return !shutdown.is_cancelled();
            }
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(PAUSED_CHECK) => {}
            }
        }
    }
}

/// How often a paused consumer looks whether it was resumed (the table itself is read every
/// [`PAUSE_REFRESH`](crate::pause::PAUSE_REFRESH)).
const PAUSED_CHECK: std::time::Duration = std::time::Duration::from_millis(250);

impl Consumer {
    pub(crate) fn new(
        name: &'static str,
        registrations: &[&'static HandlerRegistration],
        config: InboxConfig,
        db: DatabaseConnection,
        outbox: Outbox,
        wake: Arc<Notify>,
        worker_id: String,
    ) -> Self {
        let (external, own): (Vec<&'static HandlerRegistration>, Vec<_>) =
            registrations.iter().partition(|r| r.source.is_some());
        let handlers = by_event_type(&own);
        let external: HashMap<_, _> = external
            .iter()
            .filter_map(|r| Some(((r.source?, r.event_type), *r)))
            .collect();
        let mut event_types: Vec<String> = own.iter().map(|r| r.event_type.to_owned()).collect();
        event_types.sort();
        event_types.dedup();
        let ordering = registrations
            .iter()
            .find_map(|r| r.ordering)
            .unwrap_or(config.ordering);
        let mode = if own.iter().any(|r| r.mode == HandlerMode::Stored) {
            HandlerMode::Stored
        } else {
            HandlerMode::Inline
        };
        Consumer {
            name,
            database: String::new(),
            system: "database-local",
            pauses: Default::default(),
            handlers,
            external,
            event_types,
            ordering,
            mode,
            config,
            db,
            timeline: Default::default(),
            outbox,
            wake,
            stats: Arc::default(),
            worker_id,
            careful: AtomicU32::new(0),
            floor: Default::default(),
            rotation: Default::default(),
        }
    }

    pub(super) fn count(&self, counter: Counter) {
        self.stats.count(self.name, &self.database, counter);
    }

    /// The handler registered for the envelope's type and schema version, or else for the
    /// lowest later version the upcasters take it to, if any.
    pub(super) fn registration(&self, envelope: &Envelope) -> Option<&'static HandlerRegistration> {
        let version = envelope.schema_version.unwrap_or(1);
        let event_type = envelope.event_type.as_str();
        let handled = self.handlers.get(event_type)?;
        let target =
            crate::upcast::Upcasters::linked().handled_version(event_type, version, handled)?;
        handled.get(&target).copied()
    }

    /// The handler for the envelope, or why there is none (the message's DEAD reason).
    pub(super) fn handler(
        &self,
        envelope: &Envelope,
    ) -> Result<&'static HandlerRegistration, String> {
        let version = envelope.schema_version.unwrap_or(1);
        if let Some(reg) = self.registration(envelope) {
            return Ok(reg);
        }
        let versions: Vec<u32> = self
            .handlers
            .get(envelope.event_type.as_str())
            .map(|handled| handled.keys().copied().collect())
            .unwrap_or_default();
        if versions.is_empty() {
            Err(format!(
                "consumer `{}` has no handler for event type `{}`",
                self.name, envelope.event_type
            ))
        } else {
            let upcast = if crate::upcast::Upcasters::linked().has_any(&envelope.event_type) {
                format!("; no chain of upcasters leads from version {version} to one of them")
            } else {
                String::new()
            };
            Err(format!(
                "consumer `{}` has no handler for `{}` schema version {version} (it handles versions \
                 {versions:?}){upcast}",
                self.name, envelope.event_type
            ))
        }
    }

    /// The handler of external messages of `source` and `message_type`, or why there is none.
    pub(super) fn external_handler(
        &self,
        source: &str,
        message_type: &str,
    ) -> Result<&'static HandlerRegistration, String> {
        if let Some(reg) = self.external.get(&(source, message_type)) {
            return Ok(reg);
        }
        let types: Vec<&str> = self
            .external
            .keys()
            .filter(|(s, _)| *s == source)
            .map(|(_, t)| *t)
            .collect();
        if types.is_empty() {
            Err(format!(
                "consumer `{}` has no handler for external messages from `{source}`",
                self.name
            ))
        } else {
            Err(format!(
                "consumer `{}` has no handler for `{message_type}` from `{source}` (it handles \
                 {types:?})",
                self.name
            ))
        }
    }

    /// Whether any handler of this consumer takes this SDK's events (from a transport).
    pub(crate) fn takes_events(&self) -> bool {
        !self.handlers.is_empty()
    }

    pub(super) fn max_attempts(&self, reg: Option<&HandlerRegistration>) -> u32 {
        reg.and_then(|r| r.max_attempts)
            .unwrap_or(self.config.max_attempts)
            .max(1)
    }

    fn backoff(&self, reg: &HandlerRegistration) -> Backoff {
        let mut backoff = self.config.backoff;
        if let Some(ms) = reg.backoff_base_ms {
            backoff.base = Duration::from_millis(ms);
        }
        if let Some(ms) = reg.backoff_cap_ms {
            backoff.cap = Duration::from_millis(ms);
        }
        backoff
    }

    /// Where a failed attempt goes: RETRY at its due time, or DEAD.
    pub(super) fn failure(
        &self,
        reg: Option<&HandlerRegistration>,
        error: &super::HandlerError,
        attempts: u32,
    ) -> Failure {
        Failure::after(
            attempts,
            self.max_attempts(reg),
            error.is_permanent(),
            || {
                error.retry_after().unwrap_or_else(|| {
                    reg.map_or(self.config.backoff, |r| self.backoff(r))
                        .delay(attempts.saturating_sub(1))
                })
            },
            error.to_string(),
        )
    }

    /// The message's aggregate, when ordering keeps its messages in order.
    pub(super) fn ordered_aggregate(&self, envelope: &Envelope) -> Option<(String, String)> {
        match (&envelope.aggregate_type, &envelope.subject) {
            (Some(t), Some(id)) if self.ordering => Some((t.clone(), id.clone())),
            _ => None,
        }
    }
}

/// The inbox row of a decoded message.
pub(super) fn inbox_row<'a>(
    consumer: &'a str,
    envelope: &'a Envelope,
    body: &'a [u8],
) -> NewInboxRow<'a> {
    NewInboxRow {
        consumer,
        message_id: &envelope.id,
        event_type: Some(&envelope.event_type),
        source: Some(&envelope.source),
        aggregate_type: envelope.aggregate_type.as_deref(),
        aggregate_id: envelope.subject.as_deref(),
        aggregate_version: envelope.aggregate_version,
        schema_version: envelope.schema_version,
        payload: body,
        ..NewInboxRow::default()
    }
}
