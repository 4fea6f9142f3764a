//! [`InboxConfig`]: the settings of the inbox side of a runtime.

use std::time::Duration;

use crate::{transport::SubscribeOptions, util::backoff::Backoff};

/// Settings of the inbox side of a runtime, per consumer unless a handler overrides them.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct InboxConfig {
    pub(crate) concurrency: usize,
    pub(crate) batch_size: usize,
    pub(crate) lease: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) idle_poll_interval: Option<Duration>,
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
    pub(crate) ordering: bool,
    pub(crate) subscribe: SubscribeOptions,
    pub(crate) resubscribe: Backoff,
    pub(crate) commit_batch: usize,
    pub(crate) wait_for_standbys: u32,
    /// Failures injected into handlers' attempts (the test kit's).
    #[cfg(feature = "testing")]
    pub(crate) faults: Option<crate::testing::HandlerFaults>,
}

impl Default for InboxConfig {
    fn default() -> Self {
        InboxConfig {
            concurrency: 8,
            batch_size: 100,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            idle_poll_interval: None,
            max_attempts: 10,
            backoff: Backoff::default(),
            ordering: true,
            subscribe: SubscribeOptions::default(),
            resubscribe: Backoff {
                base: Duration::from_millis(100),
                cap: Duration::from_secs(2),
                jitter: 0.2,
            },
            commit_batch: 32,
            wait_for_standbys: 0,
            #[cfg(feature = "testing")]
            faults: None,
        }
    }
}

crate::util::setters! {
    InboxConfig {
        /// Messages handled in parallel per consumer (different aggregates). Default 8.
        concurrency: usize,

        /// Messages the worker claims per round. Default 100.
        batch_size: usize,

        /// How long a worker owns a claimed message. Default 30 s: longer than a handler runs.
        lease: Duration,

        /// Worker sleep when idle and not woken. Default 1 s.
        poll_interval: Duration,

        /// While the worker's claims find nothing, its sleep doubles from `poll_interval` up to
        /// this, and never runs past the earliest retry's due time; a message stored or a retry
        /// written in this process, or a claim that finds work, brings it back to
        /// `poll_interval`. While idle, what other instances store and leases that expire are
        /// seen within it. `None` (the default): five poll intervals (5 s).
        idle_poll_interval: impl Into<Option<Duration>>,

        /// Handler attempts before DEAD (a handler's `max_attempts` overrides it). Default 10.
        max_attempts: u32,

        /// Retry delays (a handler's `backoff`/`backoff_cap` override them). Default 1 s · 2ⁿ,
        /// capped at 300 s, plus up to 20% jitter.
        backoff: Backoff,

        /// Per-aggregate order (a handler's `ordering` overrides it). Default on.
        ordering: bool,

        /// Broker subscription settings.
        subscribe: SubscribeOptions,

        /// How soon a consumer whose subscription failed or ended (the broker went away) subscribes
        /// again; nothing is marked failed meanwhile. Default 100 ms doubling to 2 s, plus up to
        /// 20%: a consumer is back within about 2 s of the broker's return.
        resubscribe: Backoff,

        /// Deliveries waiting in one lane that are recorded and handled in one transaction,
        /// each handler isolated as in a savepoint of its own (a failing handler rolls back only
        /// its own work and its message is stored for retry in the same commit; handlers before
        /// it in the batch may run a second time, in the transaction that commits). Default 32;
        /// 1 commits each delivery on its own. A batch never waits for more deliveries: it takes
        /// what has arrived.
        commit_batch: usize,

        /// PostgreSQL with streaming standbys: ack a delivery only once this many standbys have
        /// flushed the log past the commit that recorded it (`pg_stat_replication.flush_lsn`);
        /// one they do not hold within 5 s, or whose primary stops answering, is nacked, and
        /// the broker's redelivery finds it recorded (a duplicate) or records it again on the
        /// new primary. Without it, a failover to an asynchronous standby can take back a
        /// handled message the broker has already forgotten. The role must see the standbys'
        /// positions (`pg_monitor`). Default 0: ack at once.
        wait_for_standbys: u32,
    }
}

#[cfg(feature = "testing")]
impl InboxConfig {
    /// Inject `faults` into the attempts of the handlers run with this configuration (feature
    /// `testing`; see [`HandlerFaults`](crate::testing::HandlerFaults)).
    pub fn faults(mut self, faults: &crate::testing::HandlerFaults) -> Self {
        self.faults = Some(faults.clone());
        self
    }
}
