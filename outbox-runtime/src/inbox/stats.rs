//! A consumer's counters: [`ConsumerStats`] and its snapshot.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one consumer since start.
#[derive(Debug, Default)]
pub struct ConsumerStats {
    handled: AtomicU64,
    duplicates: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
    stored: AtomicU64,
    stale: AtomicU64,
    conflicts: AtomicU64,
    unrecorded: AtomicU64,
    batch_reruns: AtomicU64,
}

/// A snapshot of a consumer's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumerStatsSnapshot {
    /// Messages whose handler committed.
    pub handled: u64,
    /// Deliveries suppressed as duplicates of a recorded message.
    pub duplicates: u64,
    /// Handler failures scheduled for retry.
    pub retried: u64,
    /// Messages that went DEAD.
    pub dead: u64,
    /// Messages stored for the worker (stored mode, or waiting behind their aggregate).
    pub stored: u64,
    /// Worker writes fenced off because another worker took the message over.
    pub stale: u64,
    /// Deliveries whose message id was already recorded with a different payload: kept as DEAD
    /// rows under a derived id (`{message_id}#conflict-{digest}`) for an operator.
    pub conflicts: u64,
    /// Attempts to record a delivery that failed on the database (a lost connection, a
    /// deadlock); the delivery was tried again in its lane, so later messages of its aggregate
    /// kept waiting behind it.
    pub unrecorded: u64,
    /// Batches whose run without savepoints met a failing handler, rolled back and ran again
    /// with a savepoint per handler (see [`InboxConfig::commit_batch`](super::InboxConfig::commit_batch)).
    pub batch_reruns: u64,
}

impl ConsumerStats {
    /// Read every counter.
    pub fn snapshot(&self) -> ConsumerStatsSnapshot {
        ConsumerStatsSnapshot {
            handled: self.handled.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            dead: self.dead.load(Ordering::Relaxed),
            stored: self.stored.load(Ordering::Relaxed),
            stale: self.stale.load(Ordering::Relaxed),
            conflicts: self.conflicts.load(Ordering::Relaxed),
            unrecorded: self.unrecorded.load(Ordering::Relaxed),
            batch_reruns: self.batch_reruns.load(Ordering::Relaxed),
        }
    }
}

/// What happened to a message, for the counters and the `inbox_messages_total` metric.
#[derive(Debug, Clone, Copy)]
#[allow(non_camel_case_types)] // named after the counters they bump
pub(super) enum Counter {
    handled,
    duplicates,
    retried,
    dead,
    stored,
    stale,
    conflicts,
    unrecorded,
}

impl ConsumerStats {
    /// Count one message of `consumer`, in the counters and the metric.
    pub(super) fn count(&self, consumer: &'static str, database: &str, counter: Counter) {
        let (field, outcome) = match counter {
            Counter::handled => (&self.handled, "handled"),
            Counter::duplicates => (&self.duplicates, "duplicate"),
            Counter::retried => (&self.retried, "retried"),
            Counter::dead => (&self.dead, "dead"),
            Counter::stored => (&self.stored, "stored"),
            Counter::stale => (&self.stale, "stale"),
            Counter::conflicts => (&self.conflicts, "conflict"),
            Counter::unrecorded => (&self.unrecorded, "unrecorded"),
        };
        field.fetch_add(1, Ordering::Relaxed);
        crate::metrics::inbox(consumer, database, outcome);
    }

    /// Count a batch that ran again with savepoints.
    pub(super) fn batch_rerun(&self) {
        self.batch_reruns.fetch_add(1, Ordering::Relaxed);
    }
}
