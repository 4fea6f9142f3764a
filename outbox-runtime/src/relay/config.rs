//! The relay's settings and its error.

use super::*;

/// Relay settings: `RelayConfig::default()` and a setter per setting to change, each with its
/// production default (see each).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RelayConfig {
    pub(crate) relay_id: String,
    pub(crate) batch_size: usize,
    pub(crate) lease: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) linger: Option<Duration>,
    pub(crate) idle_poll_interval: Option<Duration>,
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
    pub(crate) ordering: bool,
    pub(crate) listen: bool,
    pub(crate) error_delay: Duration,
    pub(crate) probe: Backoff,
    pub(crate) recovery_trial: Duration,
    pub(crate) heartbeat: Duration,
    pub(crate) fast_path: bool,
    pub(crate) fast_path_lease: Duration,
    pub(crate) wait_for_standbys: u32,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            relay_id: crate::util::instance_id(),
            batch_size: 500,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            linger: Some(Duration::from_millis(1)),
            idle_poll_interval: None,
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
            wait_for_standbys: 0,
        }
    }
}

crate::util::setters! {
    RelayConfig {
        /// Stored in `locked_by`. Default `host-pid-random`.
        relay_id: impl Into<String>,

        /// Events claimed per round. Default 500.
        batch_size: usize,

        /// How long a claim is owned before another relay may take it over. Default 30 s: longer
        /// than a round's publishing can take.
        lease: Duration,

        /// Sleep between rounds when idle and not woken. Default 1 s.
        poll_interval: Duration,

        /// After a claim that found events (but not a full batch), look again after this long
        /// instead of waiting for a wake-up: while events flow, their latency does not depend on
        /// how wake-ups are coalesced. Lingering stops at the first claim that finds nothing, so it
        /// costs at most one empty claim per claim that found events. `None`: wait for a wake-up or
        /// the poll. Default 1 ms.
        linger: impl Into<Option<Duration>>,

        /// While claims find nothing, the sleep between them doubles from `poll_interval` up to
        /// this; a commit, a notification or a claim that finds events brings it back to
        /// `poll_interval`, and it never runs past the due time of the earliest delayed event.
        /// While idle, failed events' retries, resumed destinations and events committed
        /// elsewhere that no wake-up announced are seen within it instead of within
        /// `poll_interval`. `None` (the default): five poll intervals (5 s) where the relay
        /// listens (PostgreSQL with `listen`: other processes' commits wake it, the poll only
        /// finds what a wake-up missed), `poll_interval` elsewhere (MySQL/MariaDB and SQLite
        /// hear only this process's commits, the poll finds the others').
        idle_poll_interval: impl Into<Option<Duration>>,

        /// Failed attempts (including expired leases) before an event is DEAD. Default 12.
        max_attempts: u32,

        /// Retry delays.
        backoff: Backoff,

        /// Per-aggregate order (see the module docs). Default on.
        ordering: bool,

        /// On PostgreSQL, `LISTEN` on the outbox handle's notify channel. Default on.
        listen: bool,

        /// Delay after a database or broker error before the next round. Default 1 s.
        error_delay: Duration,

        /// How often the relay asks an unavailable broker whether it is back (its health check),
        /// while it claims nothing. Default 100 ms doubling to 2 s, plus up to 20%: the relay
        /// resumes within about 2 s of the broker's return.
        probe: Backoff,

        /// After an outage, how long the broker is on trial once its health check answers again
        /// (the breaker is half-open): until it confirms a publish, a publish that gets no
        /// confirmation in time is still the broker's, and the relay waits for it again without
        /// counting an attempt. A broker that has just restarted or thawed often answers a ping
        /// seconds before it confirms publishes. The trial is not renewed by the outages it
        /// finds: once it is over, a message that is never confirmed counts attempts and ends
        /// DEAD as before. Default 30 s.
        recovery_trial: Duration,

        /// How often a running relay records what it sees of its broker in `outbox_relay` (for
        /// `outbox status`: breaker state, when the broker was last seen, events held back), and,
        /// when it published nothing since the last time, asks the broker's health check. Its row
        /// counts as current for three of these. Default 10 s.
        heartbeat: Duration,

        /// Publish right after commit (see the module docs): while this relay runs with an
        /// [`Outbox`] handle ([`Relay::with_outbox`], as in a runtime) and a broker, commits
        /// through the handle write their events already claimed by it and it publishes them at
        /// once; the claim loop only picks up what the fast path did not finish. Default on.
        fast_path: bool,

        /// How long the rows a commit hands to the fast path stay leased to it: if the process dies
        /// after the commit, another relay publishes them once this has passed. Longer than a
        /// publish can take (the transports' confirmation timeouts are 10 s). Default 15 s.
        fast_path_lease: Duration,

        /// PostgreSQL with streaming standbys: publish a batch only once this many standbys
        /// have flushed the log past it (`pg_stat_replication.flush_lsn`), so that no event is
        /// announced that a failover to an asynchronous standby could take back with its
        /// business rows. Applies to every road (claim loop, fast path, WAL relay); a batch the
        /// standbys do not hold within 5 s is handed back (no attempt spent) and published by a
        /// later round. The role must see the standbys' positions (`pg_monitor`). Costs a round
        /// trip or two and the standby's flush delay per batch (`docs/BENCHMARKS.md`). Default
        /// 0: publish at once.
        wait_for_standbys: u32,
    }
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
