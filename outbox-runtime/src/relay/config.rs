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
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            relay_id: crate::util::instance_id(),
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

impl RelayConfig {
    /// Stored in `locked_by`. Default `host-pid-random`.
    pub fn relay_id(mut self, relay_id: impl Into<String>) -> Self {
        self.relay_id = relay_id.into();
        self
    }

    /// Events claimed per round. Default 500.
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// How long a claim is owned before another relay may take it over. Default 30 s: longer
    /// than a round's publishing can take.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sleep between rounds when idle and not woken. Default 1 s.
    pub fn poll_interval(mut self, poll_interval: Duration) -> Self {
        self.poll_interval = poll_interval;
        self
    }

    /// After a claim that found events (but not a full batch), look again after this long
    /// instead of waiting for a wake-up: while events flow, their latency does not depend on
    /// how wake-ups are coalesced. Lingering stops at the first claim that finds nothing, so it
    /// costs at most one empty claim per claim that found events. `None`: wait for a wake-up or
    /// the poll. Default 1 ms.
    pub fn linger(mut self, linger: impl Into<Option<Duration>>) -> Self {
        self.linger = linger.into();
        self
    }

    /// Failed attempts (including expired leases) before an event is DEAD. Default 12.
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// Retry delays.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Per-aggregate order (see the module docs). Default on.
    pub fn ordering(mut self, ordering: bool) -> Self {
        self.ordering = ordering;
        self
    }

    /// On PostgreSQL, `LISTEN` on the outbox handle's notify channel. Default on.
    pub fn listen(mut self, listen: bool) -> Self {
        self.listen = listen;
        self
    }

    /// Delay after a database or broker error before the next round. Default 1 s.
    pub fn error_delay(mut self, error_delay: Duration) -> Self {
        self.error_delay = error_delay;
        self
    }

    /// How often the relay asks an unavailable broker whether it is back (its health check),
    /// while it claims nothing. Default 100 ms doubling to 2 s, plus up to 20%: the relay
    /// resumes within about 2 s of the broker's return.
    pub fn probe(mut self, probe: Backoff) -> Self {
        self.probe = probe;
        self
    }

    /// After an outage, how long the broker is on trial once its health check answers again
    /// (the breaker is half-open): until it confirms a publish, a publish that gets no
    /// confirmation in time is still the broker's, and the relay waits for it again without
    /// counting an attempt. A broker that has just restarted or thawed often answers a ping
    /// seconds before it confirms publishes. The trial is not renewed by the outages it
    /// finds: once it is over, a message that is never confirmed counts attempts and ends
    /// DEAD as before. Default 30 s.
    pub fn recovery_trial(mut self, recovery_trial: Duration) -> Self {
        self.recovery_trial = recovery_trial;
        self
    }

    /// How often a running relay records what it sees of its broker in `outbox_relay` (for
    /// `outbox status`: breaker state, when the broker was last seen, events held back), and,
    /// when it published nothing since the last time, asks the broker's health check. Its row
    /// counts as current for three of these. Default 10 s.
    pub fn heartbeat(mut self, heartbeat: Duration) -> Self {
        self.heartbeat = heartbeat;
        self
    }

    /// Publish right after commit (see the module docs): while this relay runs with an
    /// [`Outbox`] handle ([`Relay::with_outbox`], as in a runtime) and a broker, commits through
    /// the handle write their events already claimed by it and it publishes them at once; the
    /// claim loop only picks up what the fast path did not finish. Default on.
    pub fn fast_path(mut self, fast_path: bool) -> Self {
        self.fast_path = fast_path;
        self
    }

    /// How long the rows a commit hands to the fast path stay leased to it: if the process dies
    /// after the commit, another relay publishes them once this has passed. Longer than a
    /// publish can take (the transports' confirmation timeouts are 10 s). Default 15 s.
    pub fn fast_path_lease(mut self, fast_path_lease: Duration) -> Self {
        self.fast_path_lease = fast_path_lease;
        self
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
