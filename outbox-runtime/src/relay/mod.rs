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
    collections::{HashMap, VecDeque},
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
        self, Failure,
        claim::ClaimParams,
        relay::{Claim, ClaimedEvent, FailedEvent, Settlement},
    },
    transport::{OutgoingMessage, PublishError, Transport, TransportError, local::LocalDelivery},
};

pub use crate::util::backoff::Backoff;

mod fast;
#[cfg(feature = "postgres-wal")]
mod wal;
mod watch;

#[cfg(feature = "postgres-wal")]
pub use wal::WalConfig;

use watch::BrokerWatch;

/// Relay settings. Every field has a production default (see each).
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Stored in `locked_by`. Default `host-pid-random`.
    pub relay_id: String,
    /// Events claimed per round. Default 500.
    pub batch_size: usize,
    /// How long a claim is owned before another relay may take it over. Default 30 s: longer
    /// than a round's publishing can take.
    pub lease: Duration,
    /// Sleep between rounds when idle and not woken. Default 1 s.
    pub poll_interval: Duration,
    /// After a claim that found events (but not a full batch), look again after this long
    /// instead of waiting for a wake-up: while events flow, their latency does not depend on
    /// how wake-ups are coalesced. Lingering stops at the first claim that finds nothing, so it
    /// costs at most one empty claim per claim that found events. `None`: wait for a wake-up or
    /// the poll. Default 1 ms.
    pub linger: Option<Duration>,
    /// Failed attempts (including expired leases) before an event is DEAD. Default 12.
    pub max_attempts: u32,
    /// Retry delays.
    pub backoff: Backoff,
    /// Per-aggregate order (see the module docs). Default on.
    pub ordering: bool,
    /// On PostgreSQL, `LISTEN` on the outbox handle's notify channel. Default on.
    pub listen: bool,
    /// Delay after a database or broker error before the next round. Default 1 s.
    pub error_delay: Duration,
    /// How often the relay asks an unavailable broker whether it is back (its health check),
    /// while it claims nothing. Default 100 ms doubling to 2 s, plus up to 20%: the relay
    /// resumes within about 2 s of the broker's return.
    pub probe: Backoff,
    /// After an outage, how long the broker is on trial once its health check answers again
    /// (the breaker is half-open): until it confirms a publish, a publish that gets no
    /// confirmation in time is still the broker's, and the relay waits for it again without
    /// counting an attempt. A broker that has just restarted or thawed often answers a ping
    /// seconds before it confirms publishes. The trial is not renewed by the outages it
    /// finds: once it is over, a message that is never confirmed counts attempts and ends
    /// DEAD as before. Default 30 s.
    pub recovery_trial: Duration,
    /// How often a running relay records what it sees of its broker in `outbox_relay` (for
    /// `outbox status`: breaker state, when the broker was last seen, events held back), and,
    /// when it published nothing since the last time, asks the broker's health check. Its row
    /// counts as current for three of these. Default 10 s.
    pub heartbeat: Duration,
    /// Publish right after commit (see the module docs): while this relay runs with an
    /// [`Outbox`] handle ([`Relay::with_outbox`], as in a runtime) and a broker, commits through
    /// the handle write their events already claimed by it and it publishes them at once; the
    /// claim loop only picks up what the fast path did not finish. Default on.
    pub fast_path: bool,
    /// How long the rows a commit hands to the fast path stay leased to it: if the process dies
    /// after the commit, another relay publishes them once this has passed. Longer than a
    /// publish can take (the transports' confirmation timeouts are 10 s). Default 15 s.
    pub fast_path_lease: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            relay_id: default_relay_id(),
            batch_size: 500,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            linger: Some(Duration::from_millis(1)),
            max_attempts: 12,
            backoff: Backoff::default(),
            ordering: true,
            listen: true,
            error_delay: Duration::from_secs(1),
            probe: Backoff {
                base: Duration::from_millis(100),
                cap: Duration::from_secs(2),
                jitter: 0.2,
            },
            recovery_trial: Duration::from_secs(30),
            heartbeat: Duration::from_secs(10),
            fast_path: true,
            fast_path_lease: Duration::from_secs(15),
        }
    }
}

fn default_relay_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "relay".to_owned());
    format!("{host}-{}-{:04x}", std::process::id(), fastrand::u16(..))
}

/// An error that ends a relay round.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// Claiming or settling failed.
    #[error("relay database error: {0}")]
    Database(DbErr),
    /// The transport could not be set up.
    #[error(transparent)]
    Transport(#[from] TransportError),
}

impl From<DbErr> for RelayError {
    fn from(error: DbErr) -> Self {
        RelayError::Database(error)
    }
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundReport {
    /// Events claimed (published or not).
    pub claimed: usize,
    /// Confirmed by the broker and marked SENT.
    pub sent: usize,
    /// Failed and marked RETRY.
    pub retried: usize,
    /// Marked DEAD (failed for the last time, rejected permanently, or lease expired too often).
    pub dead: usize,
    /// Handed back unpublished.
    pub released: usize,
    /// Writes that touched no row because another relay had taken the claim over.
    pub stale: usize,
    /// Database-local transport: deliveries a consumer's inbox already had (suppressed).
    pub duplicates: usize,
}

/// Counters since the relay started.
#[derive(Debug, Default)]
pub struct RelayStats {
    rounds: AtomicU64,
    claimed: AtomicU64,
    sent: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
    released: AtomicU64,
    stale: AtomicU64,
    duplicates: AtomicU64,
    errors: AtomicU64,
    outages: AtomicU64,
}

/// A snapshot of [`RelayStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayStatsSnapshot {
    /// Rounds run.
    pub rounds: u64,
    /// Events claimed.
    pub claimed: u64,
    /// Events marked SENT.
    pub sent: u64,
    /// Events marked RETRY.
    pub retried: u64,
    /// Events marked DEAD.
    pub dead: u64,
    /// Events released unpublished.
    pub released: u64,
    /// Fenced writes that touched nothing (another relay took over).
    pub stale: u64,
    /// Database-local transport: deliveries suppressed as duplicates by the inbox.
    pub duplicates: u64,
    /// Rounds that ended in an error.
    pub errors: u64,
    /// Broker outages: times the relay stopped claiming because the broker was unavailable.
    pub outages: u64,
}

impl RelayStats {
    fn add(&self, report: &RoundReport) {
        self.rounds.fetch_add(1, Ordering::Relaxed);
        self.claimed
            .fetch_add(report.claimed as u64, Ordering::Relaxed);
        self.sent.fetch_add(report.sent as u64, Ordering::Relaxed);
        self.retried
            .fetch_add(report.retried as u64, Ordering::Relaxed);
        self.dead.fetch_add(report.dead as u64, Ordering::Relaxed);
        self.released
            .fetch_add(report.released as u64, Ordering::Relaxed);
        self.stale.fetch_add(report.stale as u64, Ordering::Relaxed);
        self.duplicates
            .fetch_add(report.duplicates as u64, Ordering::Relaxed);
    }

    /// Read every counter.
    pub fn snapshot(&self) -> RelayStatsSnapshot {
        RelayStatsSnapshot {
            rounds: self.rounds.load(Ordering::Relaxed),
            claimed: self.claimed.load(Ordering::Relaxed),
            sent: self.sent.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            dead: self.dead.load(Ordering::Relaxed),
            released: self.released.load(Ordering::Relaxed),
            stale: self.stale.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            outages: self.outages.load(Ordering::Relaxed),
        }
    }
}

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
    /// A relay over `db` publishing to `transport`, with default settings.
    pub fn new(db: DatabaseConnection, transport: Arc<dyn Transport>) -> Self {
        let stats = Arc::<RelayStats>::default();
        Relay {
            db,
            sink: Sink::Broker(transport),
            config: RelayConfig::default(),
            outbox: None,
            stats: stats.clone(),
            broker: Arc::new(BrokerWatch::new(stats)),
            #[cfg(feature = "postgres-wal")]
            wal: None,
            promoted_at: Default::default(),
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
        }
    }

    /// Replace the settings.
    pub fn with_config(mut self, config: RelayConfig) -> Self {
        self.config = config;
        self
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

    pub(crate) async fn run_with_health(
        &self,
        shutdown: CancellationToken,
        health: &LoopHealth,
    ) -> Result<(), RelayError> {
        let mut heartbeat = None;
        let mut fast_path = None;
        #[allow(unused_mut)]
        let mut wal: Option<tokio::task::JoinHandle<()>> = None;
        if let Sink::Broker(transport) = &self.sink {
            transport.setup().await?;
            crate::metrics::broker_available(transport.name(), true);
            self.broker.seen();
            heartbeat = Some(self.spawn_heartbeat(transport.clone(), &shutdown));
            #[cfg(feature = "postgres-wal")]
            {
                wal = self.spawn_wal(transport.clone(), &shutdown);
            }
            if wal.is_none() {
                fast_path = self.spawn_fast_path(transport.clone(), &shutdown);
            }
        }
        // Beside the WAL stream, commits are the stream's: the claim loop only polls.
        let mut wake: Option<WakeReceiver> = match self.wal_mode() {
            true => None,
            false => self.outbox.as_ref().map(Outbox::subscribe),
        };
        let hint = Arc::new(Notify::new());
        let listener = match self.wal_mode() {
            true => None,
            false => self.spawn_listener(&hint, &shutdown),
        };
        tracing::info!(relay = %self.config.relay_id, transport = self.sink.name(), "outbox relay started");

        // The broker failed the last publishes and none has been confirmed since.
        let mut publishing_failed = false;
        // The last claim, being published and settled while the next one is claimed.
        let mut in_flight: Option<InFlight<'_>> = None;
        // Claim at once instead of waiting for a wake-up: at start, after a full claim (a
        // backlog remains), after an error, and after a claim that ran beside a round in
        // flight (it could not take the events queued behind that round's aggregates).
        let mut look_now = true;
        // The last claim found events: look again after `linger`.
        let mut lingering = false;
        while !shutdown.is_cancelled() {
            if self.broker.is_down() {
                // The claim in flight hands its events back at once (the breaker is open).
                if let Some(round) = in_flight.take() {
                    self.account(round.await, health, &mut publishing_failed);
                }
                if self.wait_for_broker(&shutdown, health).await {
                    publishing_failed = false;
                }
                look_now = true;
                lingering = false;
                continue;
            }
            if !look_now {
                let sleep = match self.config.linger {
                    Some(linger) if lingering => linger,
                    _ => self.config.poll_interval,
                };
                let finished = tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = async {
                        match wake.as_mut() {
                            Some(w) => w.woken().await,
                            None => std::future::pending().await,
                        }
                    } => None,
                    _ = hint.notified() => None,
                    _ = tokio::time::sleep(sleep) => None,
                    round = async {
                        match in_flight.as_mut() {
                            Some(round) => round.await,
                            None => std::future::pending().await,
                        }
                    } => Some(round),
                };
                if let Some(round) = finished {
                    // Finishing a round is no reason to look again: wait on.
                    in_flight = None;
                    if !self.account(round, health, &mut publishing_failed) {
                        self.pause(&shutdown).await;
                        look_now = true;
                    }
                    continue;
                }
            }
            let overlapped = in_flight.is_some();
            let (claimed, previous) = match in_flight.take() {
                Some(previous) => {
                    let (claimed, previous) = tokio::join!(self.claim_step(), previous);
                    (claimed, Some(previous))
                }
                None => (self.claim_step().await, None),
            };
            let mut failed =
                previous.is_some_and(|round| !self.account(round, health, &mut publishing_failed));
            look_now = overlapped;
            lingering = false;
            match claimed {
                Ok(Claimed::Done(round)) => {
                    look_now |= round.report.claimed + round.report.dead >= self.config.batch_size;
                    lingering = round.report.claimed > 0;
                    failed |= !self.account(Ok(round), health, &mut publishing_failed);
                }
                Ok(Claimed::Publish {
                    transport,
                    claim,
                    report,
                    claimed,
                }) => {
                    look_now |= report.claimed + report.dead >= self.config.batch_size;
                    lingering = true;
                    in_flight = Some(Box::pin(self.publish_step(
                        transport,
                        claim,
                        report,
                        claimed,
                        &shutdown,
                        Publisher::Relay,
                    )));
                }
                Err(e) => failed |= !self.account(Err(e), health, &mut publishing_failed),
            }
            if failed {
                self.pause(&shutdown).await;
                look_now = true;
            }
        }
        if let Some(round) = in_flight.take() {
            // Shutting down: what was not published yet is handed back.
            self.account(round.await, health, &mut publishing_failed);
        }
        if let Some(fast_path) = fast_path {
            // It hands back what it was given and not yet published.
            let _ = fast_path.await;
        }
        if let Some(wal) = wal {
            // It finishes its batch and confirms what it published.
            let _ = wal.await;
        }
        if let Some(listener) = listener {
            listener.abort();
            let _ = listener.await;
        }
        if let Some(heartbeat) = heartbeat {
            let _ = heartbeat.await;
            watch::forget(&self.db, &self.config.relay_id).await;
        }
        tracing::info!(relay = %self.config.relay_id, "outbox relay stopped");
        Ok(())
    }

    /// Report a round's outcome to the loop's health; `false` when it failed on the database,
    /// and the loop should pause before the next claim.
    fn account(
        &self,
        round: Result<Round, RelayError>,
        health: &LoopHealth,
        publishing_failed: &mut bool,
    ) -> bool {
        match round {
            Ok(Round {
                outage: Some(reason),
                ..
            }) => {
                // The claim was handed back; the loop waits for the broker (`wait_for_broker`).
                *publishing_failed = true;
                health.failure(&format!("broker unavailable: {reason}"));
                true
            }
            Ok(Round {
                report,
                publish_error,
                outage: None,
            }) => {
                match publish_error {
                    Some(e) => {
                        *publishing_failed = true;
                        health.failure(&format!("no publish confirmed: {e}"));
                    }
                    // Rounds with nothing due while failed events wait for their retry leave
                    // the relay unhealthy; a confirmed publish makes it healthy.
                    None if !*publishing_failed || report.sent > 0 => {
                        *publishing_failed = false;
                        health.success();
                    }
                    None => {}
                }
                true
            }
            Err(e) => {
                health.failure(&e.to_string());
                crate::metrics::relay_error();
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(relay = %self.config.relay_id, error = %e, "outbox relay round failed; retrying");
                false
            }
        }
    }

    /// The broker is unavailable: claim nothing, and ask its health with the `probe` backoff
    /// until it answers (`true`) or the relay shuts down (`false`). Then the retries an outage
    /// pushed back (their last failure said the broker was unavailable) become due at once.
    async fn wait_for_broker(&self, shutdown: &CancellationToken, health: &LoopHealth) -> bool {
        let Sink::Broker(transport) = &self.sink else {
            self.broker.reset();
            return true;
        };
        let since = Instant::now();
        self.broker.outage_began();
        self.record_broker(transport.name()).await;
        crate::metrics::broker_available(transport.name(), false);
        tracing::warn!(
            relay = %self.config.relay_id, transport = transport.name(),
            "outbox relay stopped claiming: the broker is unavailable; probing it"
        );
        let mut probes = 0;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(self.config.probe.delay(probes)) => {}
            }
            match transport.health().await {
                Ok(()) => break,
                Err(e) => {
                    probes = probes.saturating_add(1);
                    health.failure(&format!("broker unavailable: {e}"));
                }
            }
        }
        self.broker.close(self.config.recovery_trial);
        crate::metrics::broker_available(transport.name(), true);
        health.success();
        let made_due = match store::relay::retries_due_now(
            &self.db,
            &PublishError::UNAVAILABLE_PATTERNS,
        )
        .await
        {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(relay = %self.config.relay_id, error = %e, "could not make the retries an outage pushed back due");
                0
            }
        };
        tracing::info!(
            relay = %self.config.relay_id, transport = transport.name(),
            down_for = ?since.elapsed(), made_due,
            "the broker answers again: the outbox relay resumes"
        );
        self.record_broker(transport.name()).await;
        true
    }

    /// Record the broker's state in the relay's row of `outbox_relay` now (the heartbeat does
    /// so periodically).
    async fn record_broker(&self, transport: &'static str) {
        self.broker
            .record(
                &self.db,
                &self.config.relay_id,
                transport,
                self.config.heartbeat,
            )
            .await;
    }

    /// The heartbeat beside the loop (see [`RelayConfig::heartbeat`]).
    fn spawn_heartbeat(
        &self,
        transport: Arc<dyn Transport>,
        shutdown: &CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let (watch, db, relay_id, every, shutdown) = (
            self.broker.clone(),
            self.db.clone(),
            self.config.relay_id.clone(),
            self.config.heartbeat,
            shutdown.clone(),
        );
        tokio::spawn(async move {
            watch::heartbeat(&watch, &db, &relay_id, transport.as_ref(), every, &shutdown).await;
        })
    }

    /// Wait `error_delay` after a failed round, or until shutdown.
    async fn pause(&self, shutdown: &CancellationToken) {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = tokio::time::sleep(self.config.error_delay) => {}
        }
    }

    /// Start [`run`](Self::run) on the tokio runtime; the handle stops and joins it.
    pub fn spawn(self) -> RelayHandle {
        let shutdown = CancellationToken::new();
        let stats = self.stats.clone();
        let token = shutdown.clone();
        let relay = self.clone();
        let task = tokio::spawn(async move { self.run(token).await });
        RelayHandle {
            shutdown,
            task,
            stats,
            relay,
        }
    }

    /// The listener of other processes' commit notifications, where the dialect has them.
    fn spawn_listener(
        &self,
        hint: &Arc<Notify>,
        shutdown: &CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        if !self.config.listen {
            return None;
        }
        let channel = self.outbox.as_ref()?.notify_channel()?.to_owned();
        store::notify::spawn_listener(
            &self.db,
            channel,
            hint.clone(),
            shutdown.clone(),
            self.config.relay_id.clone(),
        )
    }

    /// One round, claim then publish and settle.
    async fn round(&self, shutdown: &CancellationToken) -> Result<Round, RelayError> {
        match self.claim_step().await? {
            Claimed::Done(round) => Ok(round),
            Claimed::Publish {
                transport,
                claim,
                report,
                claimed,
            } => {
                self.publish_step(
                    transport,
                    claim,
                    report,
                    claimed,
                    shutdown,
                    Publisher::Relay,
                )
                .await
            }
        }
    }

    /// Move due delayed events into the outbox, at most once a poll interval (a claim does not
    /// wait for it). A database without `outbox_scheduled` (migration `outbox_0009` not applied
    /// yet) has none. An error is the caller's to report: it does not stop the claim.
    async fn promote_due(&self) -> Result<(), RelayError> {
        {
            let mut at = self.promoted_at.lock().unwrap_or_else(|p| p.into_inner());
            if at.is_some_and(|at| at.elapsed() < self.config.poll_interval) {
                return Ok(());
            }
            *at = Some(Instant::now());
        }
        loop {
            let promoted = match with_transient_retries(|| {
                store::scheduled::promote(&self.db, self.config.batch_size)
            })
            .await
            {
                Ok(promoted) => promoted,
                Err(e) if store::errors::is_missing_table(&e) => {
                    tracing::debug!(error = %e, "no outbox_scheduled table: no delayed events");
                    return Ok(());
                }
                Err(e) => return Err(e.into()),
            };
            for skipped in &promoted.skipped {
                tracing::warn!(
                    event_id = %skipped.event_id, event_type = %skipped.event_type,
                    dedup_key = %skipped.dedup_key,
                    "delayed event dropped when due: the outbox already holds its dedup key"
                );
            }
            if promoted.moved > 0 {
                tracing::debug!(
                    moved = promoted.moved,
                    "due delayed events moved into the outbox"
                );
                crate::metrics::events_written(promoted.moved);
            }
            if promoted.moved + promoted.skipped.len() < self.config.batch_size.max(1) {
                return Ok(());
            }
        }
    }

    /// Claim a batch; for the database-local sink, the whole round.
    async fn claim_step(&self) -> Result<Claimed<'_>, RelayError> {
        // Delayed events that cannot be moved must not stop the outbox: warn, and claim.
        if let Err(e) = self.promote_due().await {
            tracing::warn!(
                relay = %self.config.relay_id, error = %e,
                "could not move due delayed events into the outbox; trying again next poll"
            );
        }
        let params = ClaimParams {
            owner: &self.config.relay_id,
            batch_size: self.config.batch_size,
            lease: self.config.lease,
            ordering: self.config.ordering,
            max_attempts: self.config.max_attempts,
        };
        if let Sink::Local(delivery) = &self.sink {
            let moved = with_transient_retries(|| delivery.deliver(&self.db, &params)).await?;
            crate::metrics::relay_round("database-local", moved.events, 0, moved.dead, 0);
            let report = RoundReport {
                claimed: moved.events,
                sent: moved.events,
                dead: moved.dead,
                duplicates: moved.duplicates,
                ..RoundReport::default()
            };
            self.stats.add(&report);
            return Ok(Claimed::Done(report.into()));
        }
        let Sink::Broker(transport) = &self.sink else {
            unreachable!("local sink handled above");
        };
        // A deadlock or busy database only delays a claim: try again at once, a few times.
        let pending_age = self.pending_age();
        let claim =
            with_transient_retries(|| store::relay::claim_aged(&self.db, &params, pending_age))
                .instrument(tracing::debug_span!("outbox.claim", relay = %self.config.relay_id))
                .await?;
        let report = RoundReport {
            claimed: claim.events.len(),
            dead: claim.dead.len() + claim.unreadable,
            ..RoundReport::default()
        };
        for event in &claim.dead {
            tracing::error!(
                event_id = %event.event_id, event_type = %event.event_type,
                aggregate_id = %event.aggregate_id, attempts = event.attempts,
                "outbox event is DEAD: its lease expired too many times"
            );
        }
        if claim.events.is_empty() {
            self.stats.add(&report);
            return Ok(Claimed::Done(report.into()));
        }
        Ok(Claimed::Publish {
            transport: transport.as_ref(),
            claim,
            report,
            claimed: Instant::now(),
        })
    }

    /// Publish a claimed batch (the relay's, or the rows a commit handed to the fast path) and
    /// write the outcome back.
    async fn publish_step(
        &self,
        transport: &dyn Transport,
        claim: Claim,
        mut report: RoundReport,
        claimed: Instant,
        shutdown: &CancellationToken,
        by: Publisher,
    ) -> Result<Round, RelayError> {
        match by {
            Publisher::Relay => {
                failpoint!(error crate::failpoints::RELAY_AFTER_CLAIM);
            }
            Publisher::FastPath => {
                failpoint!(error crate::failpoints::FAST_PATH_AFTER_COMMIT);
            }
            Publisher::Wal => {}
        }
        let Published {
            settlement,
            transient_error,
            outage,
        } = self.publish(transport, &claim, shutdown).await;
        match by {
            Publisher::Relay => {
                failpoint!(error crate::failpoints::RELAY_AFTER_PUBLISH);
            }
            Publisher::FastPath => {
                failpoint!(error crate::failpoints::FAST_PATH_AFTER_PUBLISH);
            }
            Publisher::Wal => {
                failpoint!(error crate::failpoints::WAL_AFTER_PUBLISH);
            }
        }
        if !settlement.sent.is_empty() {
            self.broker.confirmed();
        }
        if outage.is_some() {
            self.broker.held_back(&settlement.released);
            crate::metrics::held_back(transport.name(), settlement.released.len());
        }
        let fence = match by {
            Publisher::Wal => store::relay::Fence::Pending,
            Publisher::Relay | Publisher::FastPath => store::relay::Fence::Claim(claim.token),
        };
        let settled = self.settle(fence, &settlement).await?;

        report.sent = settlement.sent.len();
        report.retried = settlement
            .failed
            .iter()
            .filter(|f| !f.failure.is_dead())
            .count();
        report.dead += settlement
            .failed
            .iter()
            .filter(|f| f.failure.is_dead())
            .count();
        report.released = settlement.released.len();
        let expected =
            (settlement.sent.len() + settlement.failed.len() + settlement.released.len()) as u64;
        let written = settled.sent + settled.failed + settled.released;
        report.stale = expected.saturating_sub(written) as usize;
        // Each event's age at the claim by the database's clock (which wrote `created_at`),
        // plus the time since by this process's monotonic clock.
        let since_claim = claimed.elapsed();
        let sent: std::collections::HashSet<i64> = settlement.sent.iter().copied().collect();
        if let Some(claimed_at) = claim.claimed_at {
            for event in claim.events.iter().filter(|e| sent.contains(&e.id)) {
                let waited = (claimed_at - event.created_at).to_std().unwrap_or_default();
                crate::metrics::publish_lag(transport.name(), waited + since_claim);
            }
        }
        crate::metrics::relay_round(
            transport.name(),
            report.sent,
            settlement.failed.len(),
            report.dead,
            report.stale,
        );
        if report.stale > 0 {
            tracing::warn!(
                relay = %self.config.relay_id, stale = report.stale,
                "outbox relay lost {} claimed events to another relay (lease expired); its writes were fenced off",
                report.stale
            );
        }
        self.stats.add(&report);
        Ok(Round {
            report,
            // The broker is away or refusing: the relay is not doing its job.
            publish_error: transient_error.filter(|_| settlement.sent.is_empty()),
            outage,
        })
    }

    /// Write the outcome back. Published events that are not marked SENT are published again
    /// once the lease expires, so keep trying (deadlocks, a dropped connection) for up to half
    /// the lease before giving up.
    async fn settle(
        &self,
        fence: store::relay::Fence,
        settlement: &Settlement,
    ) -> Result<store::relay::Settled, RelayError> {
        let give_up = tokio::time::Instant::now() + self.config.lease / 2;
        let mut delay = Duration::from_millis(10);
        loop {
            match store::relay::settle(&self.db, fence, settlement).await {
                Ok(settled) => return Ok(settled),
                Err(e) if tokio::time::Instant::now() + delay < give_up => {
                    if !store::is_transient(&e) {
                        tracing::warn!(relay = %self.config.relay_id, error = %e, "settling a claim failed; retrying");
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Publish a claim wave by wave and decide each event's fate. Also returns the first error
    /// of a failed publish that a retry may cure (not a permanent rejection), and whether the
    /// broker is unavailable.
    ///
    /// A lost or refused connection says the broker is unavailable; no confirmation in time
    /// says so when the broker's health check fails too. Then no event is at fault: those events
    /// and everything not yet published are handed back without counting an attempt, and the
    /// relay stops claiming until the broker answers again (see `wait_for_broker`). Only failures of the message itself (a rejection, or a timeout
    /// while the broker answers) count toward `max_attempts` and DEAD.
    async fn publish(
        &self,
        transport: &dyn Transport,
        claim: &Claim,
        shutdown: &CancellationToken,
    ) -> Published {
        let mut settlement = Settlement::default();
        let mut transient_error = None;
        let mut outage = None;
        let mut queues: Vec<VecDeque<&ClaimedEvent>> = if self.config.ordering {
            let mut index: HashMap<(&str, &str), usize> = HashMap::new();
            let mut queues: Vec<VecDeque<&ClaimedEvent>> = Vec::new();
            for event in &claim.events {
                let key = (event.aggregate_type.as_str(), event.aggregate_id.as_str());
                let slot = *index.entry(key).or_insert_with(|| {
                    queues.push(VecDeque::new());
                    queues.len() - 1
                });
                queues[slot].push_back(event);
            }
            queues
        } else {
            vec![claim.events.iter().collect()]
        };

        loop {
            // One wave: the next event of every aggregate still going (without ordering: all).
            let wave: Vec<&ClaimedEvent> = if self.config.ordering {
                queues.iter_mut().filter_map(VecDeque::pop_front).collect()
            } else {
                queues.iter_mut().flat_map(|q| q.drain(..)).collect()
            };
            if wave.is_empty() {
                break;
            }
            if shutdown.is_cancelled() || self.broker.is_down() {
                if outage.is_none() && !shutdown.is_cancelled() {
                    outage = Some("the broker is unavailable".to_owned());
                }
                release(&mut settlement, wave.into_iter());
                for queue in &mut queues {
                    release(&mut settlement, queue.drain(..));
                }
                break;
            }
            // The events being published and their messages, index for index.
            let mut published: Vec<&ClaimedEvent> = Vec::with_capacity(wave.len());
            let mut outgoing: Vec<OutgoingMessage> = Vec::with_capacity(wave.len());
            let mut failed_early = Vec::new();
            for event in &wave {
                match self::outgoing(event) {
                    Ok(message) => {
                        published.push(*event);
                        outgoing.push(message);
                    }
                    Err(reason) => failed_early.push((*event, reason)),
                }
            }
            let results = if outgoing.is_empty() {
                Vec::new()
            } else {
                for message in &outgoing {
                    tracing::trace!(
                        event_id = %message.event_id, event_type = %message.event_type,
                        aggregate_id = %message.aggregate_id, "publishing"
                    );
                }
                let span = tracing::debug_span!(
                    "outbox.publish",
                    transport = transport.name(),
                    messages = outgoing.len()
                );
                transport.publish(&outgoing).instrument(span).await
            };
            let mut outcomes: Vec<(&ClaimedEvent, Result<(), PublishError>)> = published
                .iter()
                .enumerate()
                .map(|(i, event)| {
                    let result = results.get(i).cloned().unwrap_or_else(|| {
                        Err(PublishError::Rejected(
                            "transport returned fewer results than messages".into(),
                        ))
                    });
                    (*event, result)
                })
                .collect();
            outcomes.extend(
                failed_early
                    .into_iter()
                    .map(|(e, reason)| (e, Err(PublishError::Permanent(reason)))),
            );
            // A lost connection is the broker's outage; no confirmation in time is when the
            // broker does not answer its health check either, or when it is on trial after an
            // outage and has confirmed nothing since (`recovery_trial`).
            let lost = outcomes.iter().find_map(|(_, r)| match r {
                Err(error @ PublishError::Connection(_)) => Some(error.to_string()),
                _ => None,
            });
            let mut on_trial = false;
            let unavailable = match lost {
                Some(lost) => Some(lost),
                None if outcomes
                    .iter()
                    .any(|(_, r)| matches!(r, Err(PublishError::Timeout(_)))) =>
                {
                    match transport.health().await {
                        Err(e) => Some(e.to_string()),
                        Ok(()) if self.broker.on_trial() => {
                            on_trial = true;
                            Some(format!(
                                "no confirmation from the broker within the publish timeout \
                                 since it came back ({} on trial)",
                                transport.name()
                            ))
                        }
                        Ok(()) => None,
                    }
                }
                None => None,
            };
            if let Some(down) = &unavailable {
                tracing::warn!(
                    relay = %self.config.relay_id, transport = transport.name(), error = %down,
                    "the broker is unavailable: handing the claim back without counting attempts"
                );
                outage = Some(down.clone());
                self.broker.open(down, on_trial);
            }
            for (event, result) in outcomes {
                match result {
                    Ok(()) => settlement.sent.push(event.id),
                    Err(error) if unavailable.is_some() && error.may_be_unavailable() => {
                        // Not this event's fault: handed back below, with the rest of the claim.
                        release(&mut settlement, std::iter::once(event));
                    }
                    Err(error) => {
                        if !error.is_permanent() && transient_error.is_none() {
                            transient_error = Some(error.to_string());
                        }
                        let attempts = event.attempts + 1;
                        let dead = error.is_permanent() || attempts >= self.config.max_attempts;
                        let delay = self.config.backoff.delay(event.attempts);
                        if dead {
                            tracing::error!(
                                event_id = %event.event_id, event_type = %event.event_type,
                                aggregate_id = %event.aggregate_id, attempts, error = %error,
                                "outbox event is DEAD"
                            );
                        } else {
                            tracing::warn!(
                                event_id = %event.event_id, event_type = %event.event_type,
                                aggregate_id = %event.aggregate_id, attempts, error = %error,
                                retry_in = ?delay, "outbox publish failed; will retry"
                            );
                        }
                        let failure = if dead {
                            Failure::Dead {
                                attempts,
                                error: error.to_string(),
                            }
                        } else {
                            Failure::Retry {
                                attempts,
                                delay,
                                error: error.to_string(),
                            }
                        };
                        settlement.failed.push(FailedEvent {
                            id: event.id,
                            failure,
                        });
                        // The rest of this aggregate waits behind the failed event.
                        if self.config.ordering
                            && let Some(queue) = queues.iter_mut().find(|q| {
                                q.front().is_some_and(|next| {
                                    next.aggregate_type == event.aggregate_type
                                        && next.aggregate_id == event.aggregate_id
                                })
                            })
                        {
                            release(&mut settlement, queue.drain(..));
                        }
                    }
                }
            }
            if unavailable.is_some() {
                for queue in &mut queues {
                    release(&mut settlement, queue.drain(..));
                }
                break;
            }
        }
        Published {
            settlement,
            transient_error,
            outage,
        }
    }
}

/// Who publishes a claim: the relay, the fast path (the rows a commit wrote claimed), or the
/// WAL stream (PENDING rows it read from the log, unclaimed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Publisher {
    Relay,
    FastPath,
    #[cfg_attr(not(feature = "postgres-wal"), allow(dead_code))]
    Wal,
}

/// What publishing a claim decided.
struct Published {
    settlement: Settlement,
    /// The first failure a retry may cure.
    transient_error: Option<String>,
    /// Why the broker is unavailable, when it is: the claim was handed back.
    outage: Option<String>,
}

/// A claimed batch being published and settled.
type InFlight<'a> = std::pin::Pin<Box<dyn Future<Output = Result<Round, RelayError>> + Send + 'a>>;

/// What a claim led to.
enum Claimed<'a> {
    /// The round is over: nothing claimed, or the database-local sink moved the batch.
    Done(Round),
    /// Events to publish.
    Publish {
        transport: &'a dyn Transport,
        claim: Claim,
        report: RoundReport,
        /// When the claim came back, by this process's monotonic clock.
        claimed: Instant,
    },
}

/// What a round did, and why nothing was confirmed when a publish failed.
struct Round {
    report: RoundReport,
    /// Set when no publish of the round was confirmed and one failed for a reason a retry may
    /// cure.
    publish_error: Option<String>,
    /// Set when the broker is unavailable: the relay waits for it before claiming again.
    outage: Option<String>,
}

impl From<RoundReport> for Round {
    fn from(report: RoundReport) -> Self {
        Round {
            report,
            publish_error: None,
            outage: None,
        }
    }
}

/// Run a short transaction again, a few times, when it fails on a deadlock or a busy database.
async fn with_transient_retries<T, F, Fut>(mut f: F) -> Result<T, DbErr>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, DbErr>>,
{
    let mut tries = 0;
    loop {
        match f().await {
            Err(e) if store::is_transient(&e) && tries < 3 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(5 * tries)).await;
            }
            other => return other,
        }
    }
}

fn release<'a>(settlement: &mut Settlement, events: impl Iterator<Item = &'a ClaimedEvent>) {
    for event in events {
        settlement.released.push(event.id);
        if event.reclaimed {
            settlement.released_reclaimed.push(event.id);
        }
    }
}

/// The message of a claimed event, ready to publish. An error means the row itself is broken
/// (it can never be published): the event goes DEAD with the reason.
fn outgoing(event: &ClaimedEvent) -> Result<OutgoingMessage, String> {
    let envelope = event.envelope()?;
    Ok(OutgoingMessage {
        event_id: event.event_id,
        event_type: event.event_type.clone(),
        aggregate_type: event.aggregate_type.clone(),
        aggregate_id: event.aggregate_id.clone(),
        body: Bytes::from(envelope.to_json()),
        headers: envelope.transport_headers(),
    })
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
