//! What a relay reports: one round's counts and the running totals.

use super::*;

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
    pub(super) errors: AtomicU64,
    pub(super) outages: AtomicU64,
    /// The relay stopped claiming because the broker is unavailable, and waits for it.
    pub(super) broker_down: std::sync::atomic::AtomicBool,
    /// The WAL reader's state, as [`WalReader`] numbers it.
    pub(super) wal: std::sync::atomic::AtomicU8,
}

/// What a WAL relay's reader is doing (see `Relay::with_wal`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WalReader {
    /// No WAL mode: the relay polls the table (or the fast path publishes).
    #[default]
    Off,
    /// Preparing the slot, or waiting for the broker before streaming.
    Starting,
    /// Streaming from the replication slot.
    Streaming,
    /// The stream ended (a connection lost, another relay holds the slot) and is being
    /// opened again; the claim loop publishes what waits longer than the table grace.
    Reconnecting,
    /// The slot cannot be streamed from (dropped, invalidated, `wal_level` not `logical`): the
    /// relay polls the table until it is restarted. Nothing is lost.
    Polling,
}

impl WalReader {
    fn from_u8(n: u8) -> WalReader {
        match n {
            1 => WalReader::Starting,
            2 => WalReader::Streaming,
            3 => WalReader::Reconnecting,
            4 => WalReader::Polling,
            _ => WalReader::Off,
        }
    }
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
    /// The broker is unavailable now: the relay claims nothing and probes it (the breaker is
    /// open); events wait in the outbox.
    pub broker_unavailable: bool,
    /// What the WAL reader is doing.
    pub wal: WalReader,
}

impl RelayStats {
    pub(super) fn add(&self, report: &RoundReport) {
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
            broker_unavailable: self.broker_down.load(Ordering::Relaxed),
            wal: WalReader::from_u8(self.wal.load(Ordering::Relaxed)),
        }
    }

    #[cfg_attr(not(feature = "postgres-wal"), allow(dead_code))]
    pub(super) fn set_wal(&self, state: WalReader) {
        self.wal.store(state as u8, Ordering::Relaxed);
    }
}
