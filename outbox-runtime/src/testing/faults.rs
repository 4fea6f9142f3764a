//! Handler failures on request: a consumer's handler of an event type fails its next N attempts,
//! before running or after running (its effects rolled back with the attempt), retryably or for
//! good. Set on an [`InboxConfig`](crate::inbox::InboxConfig) with `faults`, so they act in a
//! runtime's consumers and in a [`TestConsumer`](super::TestConsumer) alike.

use std::{
    fmt,
    sync::{Arc, Mutex},
};

use crate::inbox::HandlerError;

/// Failures to inject into handlers' attempts; clones share the same rules.
///
/// ```
/// use outbox_runtime::testing::HandlerFaults;
/// let faults = HandlerFaults::new();
/// faults.fail("notification", "order.placed", 2); // two retryable failures, then the handler runs
/// faults.fail_after_running("inventory", "*", 1); // runs once, and that attempt rolls back
/// assert_eq!(faults.injected(), 0);
/// ```
#[derive(Clone, Default)]
pub struct HandlerFaults {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    rules: Vec<Rule>,
    injected: u64,
}

struct Rule {
    consumer: String,
    event_type: String,
    remaining: u32,
    permanent: bool,
    after_running: bool,
}

/// One injected failure: what the attempt returns, and whether the handler runs first.
#[derive(Debug)]
pub(crate) struct Injected {
    pub(crate) error: HandlerError,
    pub(crate) after_running: bool,
}

impl fmt::Debug for HandlerFaults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        f.debug_struct("HandlerFaults")
            .field("rules", &inner.rules.len())
            .field("injected", &inner.injected)
            .finish()
    }
}

impl HandlerFaults {
    /// No failures yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add(&self, consumer: &str, event_type: &str, times: u32, permanent: bool, after: bool) {
        self.lock().rules.push(Rule {
            consumer: consumer.to_owned(),
            event_type: event_type.to_owned(),
            remaining: times,
            permanent,
            after_running: after,
        });
    }

    /// The next `times` attempts of `consumer`'s handler of `event_type` (`"*"`: any type) fail
    /// with a retryable error, without running the handler: the message goes to RETRY (or DEAD
    /// at the handler's `max_attempts`) exactly as when the handler returns that error.
    pub fn fail(&self, consumer: &str, event_type: &str, times: u32) {
        self.add(consumer, event_type, times, false, false);
    }

    /// The next `times` attempts run the handler, then fail with a retryable error: whatever
    /// the handler wrote and enqueued rolls back with the attempt.
    pub fn fail_after_running(&self, consumer: &str, event_type: &str, times: u32) {
        self.add(consumer, event_type, times, false, true);
    }

    /// The next attempt fails for good (a permanent error): the message goes DEAD at once.
    pub fn fail_permanently(&self, consumer: &str, event_type: &str) {
        self.add(consumer, event_type, 1, true, false);
    }

    /// How many failures were injected so far.
    pub fn injected(&self) -> u64 {
        self.lock().injected
    }

    /// Drop every rule not yet used up.
    pub fn clear(&self) {
        self.lock().rules.clear();
    }

    /// The failure for this attempt, if a rule matches (and is used once).
    pub(crate) fn take(&self, consumer: &str, event_type: &str) -> Option<Injected> {
        let mut inner = self.lock();
        let rule = inner.rules.iter_mut().find(|r| {
            r.remaining > 0
                && r.consumer == consumer
                && (r.event_type == "*" || r.event_type == event_type)
        })?;
        rule.remaining -= 1;
        let (permanent, after_running) = (rule.permanent, rule.after_running);
        inner.rules.retain(|r| r.remaining > 0);
        inner.injected += 1;
        let message = format!("failure injected by outbox::testing into {consumer}/{event_type}");
        Some(Injected {
            error: if permanent {
                HandlerError::permanent(message)
            } else {
                HandlerError::retry(message)
            },
            after_running,
        })
    }
}
