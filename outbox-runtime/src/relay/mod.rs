//! The relay: moves committed events from `outbox_event` to a broker.
//!
//! Each round claims a batch in a short transaction ([`store::relay::claim`]), publishes it
//! outside any transaction, and writes the outcome back fenced by the batch's claim token
//! ([`store::relay::settle`]): SENT only for messages the broker confirmed, RETRY with
//! exponential backoff and jitter for failures, DEAD after `max_attempts` (or at once for a
//! permanent rejection), and back to PENDING for events it never got to.
//!
//! **Order.** With ordering on (the default), events of one aggregate are published in `id`
//! order, across any number of relays and across retries: an event is claimed only when every
//! earlier event of its aggregate is SENT or claimed in the same batch, and a claimed aggregate's
//! events go out one *wave* at a time, the next only after the broker confirmed the previous one.
//! A failing event holds back only its own aggregate: the rest of its run is released, and later
//! events wait behind it while it is in RETRY or DEAD. Other aggregates keep flowing. Ids follow
//! commit order for an aggregate as long as transactions that change it serialize on it (update
//! its row), as aggregates do.
//!
//! **Pipelining.** While one batch is published and settled, the relay already claims the next
//! one, so a backlog drains at the pace of the slower of the two, not of their sum. The claims
//! cannot overlap: the batch in flight is PROCESSING, which holds its aggregates back from the
//! next claim. After a claim that ran beside a batch in flight, the relay looks again once that
//! batch is settled, for the events queued behind it.
//!
//! **Wake-up.** A relay claims again at once after a full batch, looks again after
//! [`RelayConfig::linger`] after a claim that found events, and otherwise sleeps until the first
//! of: a commit through its [`Outbox`] handle in this process, a PostgreSQL `NOTIFY` from another
//! process, the poll interval, or shutdown.
//!
//! **Health.** In a runtime, the relay's loop reports a failure when a round fails on the
//! database, until a round succeeds, and when the broker confirmed none of a round's publishes and
//! one failed for a reason a retry may cure (broker down, no confirmation, refused), until a
//! publish is confirmed again: rounds with nothing due while failed events wait out their backoff
//! do not make it healthy. A permanent rejection (the event goes DEAD) is not a relay failure.

use std::{
    fmt,
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use sea_orm::{DatabaseConnection, DbErr};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{
    health::LoopHealth,
    outbox::{Outbox, WakeReceiver},
    store::{
        self, Failure, FailureClass,
        claim::ClaimParams,
        relay::{Claim, ClaimedEvent, Settlement},
    },
    telemetry,
    transport::{
        IntoTransport, OutgoingMessage, PublishError, Routing, Transport, TransportError,
        destination, local::LocalDelivery,
    },
};

pub use crate::util::backoff::Backoff;

mod config;
mod decide;
mod fast;
mod publish;
mod run;
mod stats;
#[cfg(feature = "postgres-wal")]
mod wal;
mod watch;

pub use config::{RelayConfig, RelayError};
use publish::{Claimed, InFlight, Round, Source};
pub use stats::{RelayStats, RelayStatsSnapshot, RoundReport, WalReader};

#[cfg(feature = "postgres-wal")]
pub use wal::WalConfig;

use watch::BrokerWatch;

/// Where a relay delivers.
#[derive(Clone)]
enum Sink {
    /// Publish to a broker.
    Broker(Arc<dyn Transport>),
    /// The database-local transport: move events into inbox rows of local consumers, then wake
    /// their workers.
    Local(LocalDelivery),
}

impl Sink {
    fn name(&self) -> &'static str {
        match self {
            Sink::Broker(transport) => transport.name(),
            Sink::Local(_) => "database-local",
        }
    }
}

/// Moves committed outbox events to a [`Transport`], or into local consumers' inboxes.
#[derive(Clone)]
pub struct Relay {
    db: DatabaseConnection,
    sink: Sink,
    config: RelayConfig,
    outbox: Option<Outbox>,
    stats: Arc<RelayStats>,
    /// The circuit breaker and what the relay last saw of the broker.
    broker: Arc<BrokerWatch>,
    /// The WAL mode (see [`Relay::with_wal`]).
    #[cfg(feature = "postgres-wal")]
    wal: Option<Arc<wal::WalMode>>,
    /// When due delayed events were last moved into the outbox (at most once a poll interval).
    promoted_at: Arc<std::sync::Mutex<Option<Instant>>>,
    /// Where the claim's scans start (see `store/floor.rs`).
    floor: Arc<std::sync::Mutex<store::floor::Floor>>,
    /// What the listener of other processes' commits heard (see `store/notify.rs`).
    heard: Arc<store::notify::Heard>,
    /// The server's timeline, for [`RelayConfig::wait_for_standbys`].
    timeline: Arc<store::standby::Timeline>,
    /// The paused destinations (see `pause.rs`), shared with the runtime's consumers.
    pauses: Arc<crate::pause::Pauses>,
    /// Event types met in a claim whose destination was paused, with their aggregate type:
    /// held back in the claims that follow while it stays paused (beside the linked types).
    held_seen: Arc<std::sync::Mutex<std::collections::BTreeSet<(String, String)>>>,
    /// The name of its database in a set of databases (`fleet`), written into each envelope.
    database: Option<String>,
    /// Whether it claims (polls the table): off for a relay that only runs the fast path for
    /// its process's commits while another instance owns the database's claims (`fleet`).
    claims: bool,
}

impl fmt::Debug for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("relay_id", &self.config.relay_id)
            .field("transport", &self.sink.name())
            .field("config", &self.config)
            .finish()
    }
}

impl Relay {
    /// A relay over `db` publishing to `transport` (by value or in an `Arc`), with default
    /// settings.
    pub fn new(db: DatabaseConnection, transport: impl IntoTransport) -> Self {
        let stats = Arc::<RelayStats>::default();
        Relay {
            db,
            sink: Sink::Broker(transport.into_transport()),
            config: RelayConfig::default(),
            outbox: None,
            stats: stats.clone(),
            broker: Arc::new(BrokerWatch::new(stats)),
            #[cfg(feature = "postgres-wal")]
            wal: None,
            promoted_at: Default::default(),
            floor: Default::default(),
            heard: Default::default(),
            timeline: Default::default(),
            pauses: Default::default(),
            held_seen: Default::default(),
            database: None,
            claims: true,
        }
    }

    /// A relay for the database-local transport: each round moves events into PENDING inbox rows
    /// of every consumer `routes` returns for the event type, and marks them SENT, in one
    /// transaction; then `delivered` is notified so the consumers' workers run.
    pub fn local(db: DatabaseConnection, delivery: LocalDelivery) -> Self {
        let stats = Arc::<RelayStats>::default();
        Relay {
            db,
            sink: Sink::Local(delivery),
            config: RelayConfig::default(),
            outbox: None,
            stats: stats.clone(),
            broker: Arc::new(BrokerWatch::new(stats)),
            #[cfg(feature = "postgres-wal")]
            wal: None,
            promoted_at: Default::default(),
            floor: Default::default(),
            heard: Default::default(),
            timeline: Default::default(),
            pauses: Default::default(),
            held_seen: Default::default(),
            database: None,
            claims: true,
        }
    }

    /// Replace the settings.
    pub fn with_config(mut self, config: RelayConfig) -> Self {
        self.config = config;
        self
    }

    /// Honour the pauses `pauses` reads (the runtime shares one between its relay and
    /// consumers; a relay on its own reads its own).
    pub(crate) fn with_pauses(mut self, pauses: Arc<crate::pause::Pauses>) -> Self {
        self.pauses = pauses;
        self
    }

    /// Name the relay's database in a set of databases: each envelope carries it (the
    /// `tenant` extension), for the consumers to record and handle it in that database.
    pub(crate) fn for_database(mut self, name: &str) -> Self {
        self.database = Some(name.to_owned());
        self
    }

    /// Run only the fast path: publish what this process's commits hand over, claim nothing
    /// (another instance owns the database's claims), listen to nothing, keep no heartbeat.
    pub(crate) fn fast_path_only(mut self) -> Self {
        self.claims = false;
        self
    }

    /// The event types whose destination is paused now: those of the linked events and those
    /// met in earlier claims. Empty while nothing is paused.
    fn held_types(&self) -> Vec<String> {
        if !self.pauses.any_destination() {
            return Vec::new();
        }
        let routing = match &self.sink {
            Sink::Broker(transport) => transport.routing(),
            Sink::Local(_) => None,
        };
        let seen = self
            .held_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let linked = inventory::iter::<crate::event::EventRegistration>
            .into_iter()
            .map(|r| (r.event_type.to_owned(), r.aggregate_type.to_owned()));
        let mut held: Vec<String> = linked
            .chain(seen)
            .filter(|(t, a)| {
                self.pauses
                    .destination_paused(&destination(routing.as_ref(), t, a))
            })
            .map(|(t, _)| t)
            .collect();
        held.sort();
        held.dedup();
        held
    }

    /// Read committed events from PostgreSQL's write-ahead log by logical replication instead
    /// of polling the table (feature `postgres-wal`; see [`WalConfig`]). The claim loop keeps
    /// running beside the stream, for what the stream leaves to the table (events behind a
    /// failed one, retries) and as the fallback when the slot is lost. The fast path is off in
    /// this mode: commits write PENDING, and the stream publishes them.
    /// A relay of the database-local transport has no WAL mode (it moves events into inboxes
    /// in one transaction with the table): there the setting is ignored, with a warning.
    #[cfg(feature = "postgres-wal")]
    pub fn with_wal(mut self, config: WalConfig) -> Self {
        match self.sink {
            Sink::Broker(_) => self.wal = Some(Arc::new(wal::WalMode::new(config))),
            Sink::Local(_) => tracing::warn!(
                relay = %self.config.relay_id,
                "the WAL mode applies to relays that publish to a broker; this relay moves events \
                 into local inboxes and polls the table"
            ),
        }
        self
    }

    /// Whether the relay streams from the WAL now: configured with [`with_wal`](Self::with_wal)
    /// and not fallen back to polling.
    pub fn streams_wal(&self) -> bool {
        #[cfg(feature = "postgres-wal")]
        if let Some(mode) = &self.wal {
            return !mode.fallen_back();
        }
        false
    }

    /// The claim loop's minimum age of PENDING rows: the WAL stream's grace while it streams.
    fn pending_age(&self) -> Option<Duration> {
        #[cfg(feature = "postgres-wal")]
        if let Some(mode) = &self.wal {
            return mode.pending_age();
        }
        None
    }

    /// Whether the relay has a WAL mode (streaming or fallen back).
    fn wal_mode(&self) -> bool {
        #[cfg(feature = "postgres-wal")]
        if self.wal.is_some() {
            return true;
        }
        false
    }

    /// Wake on commits through `outbox` (in this process) and, on PostgreSQL, on its notify
    /// channel (other processes).
    pub fn with_outbox(mut self, outbox: &Outbox) -> Self {
        self.outbox = Some(outbox.clone());
        self
    }

    /// The settings.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// Counters since start.
    pub fn stats(&self) -> RelayStatsSnapshot {
        self.stats.snapshot()
    }

    /// The claim's floor now: no unsent event that is not DEAD has a lower id (see
    /// `store/floor.rs`); `None` until one is confirmed, and on backends that keep none.
    #[cfg(feature = "test-util")]
    pub fn claim_floor(&self) -> Option<i64> {
        let floor = self.floor.lock().unwrap_or_else(|p| p.into_inner());
        floor.bound().map(|b| b.low)
    }

    /// Run one round: claim, publish, settle.
    pub async fn run_once(&self) -> Result<RoundReport, RelayError> {
        // The breaker belongs to `run`'s loop, which waits for the broker; a single round always
        // tries it (a broker found unavailable hands the claim back, as in the loop).
        self.broker.reset();
        // A single round always looks for due delayed events.
        *self.promoted_at.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.round(&CancellationToken::new())
            .await
            .map(|round| round.report)
    }

    /// Run rounds until every claimable event is handled or `max_rounds` have run; for tests and
    /// tools. Returns the summed report.
    pub async fn drain(&self, max_rounds: usize) -> Result<RoundReport, RelayError> {
        let mut total = RoundReport::default();
        for _ in 0..max_rounds {
            let r = self.run_once().await?;
            total.claimed += r.claimed;
            total.sent += r.sent;
            total.retried += r.retried;
            total.dead += r.dead;
            total.released += r.released;
            total.stale += r.stale;
            total.duplicates += r.duplicates;
            if r.claimed == 0 && r.dead == 0 {
                break;
            }
        }
        Ok(total)
    }

    /// The shared counters (for a runtime that reports them).
    pub fn stats_handle(&self) -> Arc<RelayStats> {
        self.stats.clone()
    }

    /// Run until `shutdown` is cancelled, then finish the round in flight (its publishes are
    /// awaited, events not yet published are handed back) and return.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), RelayError> {
        self.run_with_health(shutdown, &LoopHealth::new("relay".into()))
            .await
    }
}

/// A relay running on the tokio runtime.
#[derive(Debug)]
pub struct RelayHandle {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), RelayError>>,
    stats: Arc<RelayStats>,
    relay: Relay,
}

impl RelayHandle {
    /// Counters since start.
    pub fn stats(&self) -> RelayStatsSnapshot {
        self.stats.snapshot()
    }

    /// Whether the relay streams from the WAL now (see [`Relay::streams_wal`]).
    pub fn streams_wal(&self) -> bool {
        self.relay.streams_wal()
    }

    /// Stop claiming, finish the round in flight, hand unpublished events back, and wait.
    /// Returns the final counters.
    pub async fn shutdown(self) -> Result<RelayStatsSnapshot, RelayError> {
        self.shutdown.cancel();
        match self.task.await {
            Ok(result) => result.map(|()| self.stats.snapshot()),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Ok(self.stats.snapshot()),
        }
    }
}
