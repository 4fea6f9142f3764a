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
    pub(crate) max_attempts: u32,
    pub(crate) backoff: Backoff,
    pub(crate) ordering: bool,
    pub(crate) subscribe: SubscribeOptions,
    pub(crate) resubscribe: Backoff,
    pub(crate) commit_batch: usize,
}

impl Default for InboxConfig {
    fn default() -> Self {
        InboxConfig {
            concurrency: 8,
            batch_size: 100,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
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
        }
    }
}

impl InboxConfig {
    /// Messages handled in parallel per consumer (different aggregates). Default 8.
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// Messages the worker claims per round. Default 100.
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// How long a worker owns a claimed message. Default 30 s: longer than a handler runs.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Worker sleep when idle and not woken. Default 1 s.
    pub fn poll_interval(mut self, poll_interval: Duration) -> Self {
        self.poll_interval = poll_interval;
        self
    }

    /// Handler attempts before DEAD (a handler's `max_attempts` overrides it). Default 10.
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// Retry delays (a handler's `backoff`/`backoff_cap` override them). Default 1 s · 2ⁿ,
    /// capped at 300 s, plus up to 20% jitter.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Per-aggregate order (a handler's `ordering` overrides it). Default on.
    pub fn ordering(mut self, ordering: bool) -> Self {
        self.ordering = ordering;
        self
    }

    /// Broker subscription settings.
    pub fn subscribe(mut self, subscribe: SubscribeOptions) -> Self {
        self.subscribe = subscribe;
        self
    }

    /// How soon a consumer whose subscription failed or ended (the broker went away) subscribes
    /// again; nothing is marked failed meanwhile. Default 100 ms doubling to 2 s, plus up to
    /// 20%: a consumer is back within about 2 s of the broker's return.
    pub fn resubscribe(mut self, resubscribe: Backoff) -> Self {
        self.resubscribe = resubscribe;
        self
    }

    /// Deliveries waiting in one lane that are recorded and handled in one transaction, each
    /// handler isolated as in a savepoint of its own (a failing handler rolls back only its own
    /// work and its message is stored for retry in the same commit; handlers before it in the
    /// batch may run a second time, in the transaction that commits). Default 32; 1 commits each
    /// delivery on its own. A batch never waits for more deliveries: it takes what has arrived.
    pub fn commit_batch(mut self, commit_batch: usize) -> Self {
        self.commit_batch = commit_batch;
        self
    }
}
