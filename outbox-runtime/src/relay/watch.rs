//! The relay's view of its broker: the circuit breaker's state, when the broker was last seen,
//! and the heartbeat that records both in `outbox_relay` for `outbox status`.

use std::{
    collections::HashSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use sea_orm::DatabaseConnection;
use tokio_util::sync::CancellationToken;

use super::RelayStats;
use crate::{
    store::broker_state::{self, BrokerReport},
    transport::Transport,
};

/// Shared by the relay's loop, its rounds and its heartbeat.
#[derive(Debug, Default)]
pub(super) struct BrokerWatch {
    /// The relay's counters: outages are counted there.
    stats: Arc<RelayStats>,
    /// The broker is unavailable (the breaker is open): publish nothing, hand claims back.
    down: Arc<AtomicBool>,
    state: Mutex<State>,
    /// The last write to `outbox_relay` failed (warned once until one succeeds).
    write_failed: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    last_seen: Option<Instant>,
    unavailable_since: Option<Instant>,
    /// The events handed back without an attempt during the current outage (an event claimed
    /// again before the breaker opened is counted once).
    held_back: HashSet<i64>,
    last_error: Option<String>,
    /// The broker came back from an outage and has confirmed no publish since: until then,
    /// timeouts are the broker's (see `RelayConfig::recovery_trial`).
    trial_until: Option<Instant>,
    /// The breaker is open because the broker on trial did not confirm: its return does not
    /// start a new trial, even when the current one ran out meanwhile.
    opened_by_trial: bool,
}

impl BrokerWatch {
    /// A watch counting outages in `stats`.
    pub(super) fn new(stats: Arc<RelayStats>) -> Self {
        BrokerWatch {
            stats,
            ..BrokerWatch::default()
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The breaker's state, shared with the fast path (commits leave events to the relay while
    /// it is open).
    pub(super) fn down_flag(&self) -> Arc<AtomicBool> {
        self.down.clone()
    }

    /// The breaker is open.
    pub(super) fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    /// The broker confirmed a publish or answered its health check.
    pub(super) fn seen(&self) {
        self.state().last_seen = Some(Instant::now());
    }

    /// The broker confirmed a publish: seen, and off trial.
    pub(super) fn confirmed(&self) {
        let mut state = self.state();
        state.last_seen = Some(Instant::now());
        state.trial_until = None;
    }

    /// The broker answers its health check after an outage but has not confirmed a publish
    /// since, and the trial has not run out.
    pub(super) fn on_trial(&self) -> bool {
        self.state()
            .trial_until
            .is_some_and(|until| Instant::now() < until)
    }

    /// The broker is unavailable: open the breaker (the relay's loop then waits for it).
    /// `on_trial`: because the broker on trial did not confirm (see [`Self::close`]).
    pub(super) fn open(&self, reason: &str, on_trial: bool) {
        let mut state = self.state();
        state.last_error = Some(reason.to_owned());
        state.opened_by_trial |= on_trial;
        if !self.down.swap(true, Ordering::Relaxed) {
            state.unavailable_since.get_or_insert_with(Instant::now);
        }
    }

    /// The loop took the outage on: count it.
    pub(super) fn outage_began(&self) {
        self.stats.outages.fetch_add(1, Ordering::Relaxed);
        self.state()
            .unavailable_since
            .get_or_insert_with(Instant::now);
    }

    /// These events were handed back without an attempt because of the outage.
    pub(super) fn held_back(&self, ids: &[i64]) {
        self.state().held_back.extend(ids);
    }

    /// The broker answers again: close the breaker, and put the broker on trial for `trial`,
    /// unless the trial found this outage (a trial is never renewed by its own findings, so
    /// one message the broker never confirms cannot keep it on trial forever).
    pub(super) fn close(&self, trial: Duration) {
        let mut state = self.state();
        let now = Instant::now();
        if !std::mem::take(&mut state.opened_by_trial) {
            state.trial_until = Some(now + trial);
        }
        state.last_seen = Some(now);
        state.unavailable_since = None;
        state.held_back = HashSet::new();
        self.down.store(false, Ordering::Relaxed);
    }

    /// Forget an open breaker without a probe (single rounds always try the broker).
    pub(super) fn reset(&self) {
        self.down.store(false, Ordering::Relaxed);
        self.state().unavailable_since = None;
    }

    /// How long ago the broker was last seen.
    pub(super) fn seen_ago(&self) -> Option<Duration> {
        self.state().last_seen.map(|t| t.elapsed())
    }

    fn report<'a>(
        &self,
        relay_id: &'a str,
        transport: &'static str,
        expires_in: Duration,
    ) -> BrokerReport<'a> {
        let state = self.state();
        BrokerReport {
            relay_id,
            transport,
            available: !self.is_down(),
            seen_ago: state.last_seen.map(|t| t.elapsed()),
            unavailable_for: state.unavailable_since.map(|t| t.elapsed()),
            outages: self.stats.outages.load(Ordering::Relaxed),
            held_back: state.held_back.len() as u64,
            last_error: state.last_error.clone(),
            expires_in,
        }
    }

    /// Write the current state to the relay's row in `outbox_relay`. A failure is logged (once
    /// until a write succeeds) and otherwise ignored: publishing does not depend on it.
    pub(super) async fn record(
        &self,
        db: &DatabaseConnection,
        relay_id: &str,
        transport: &'static str,
        heartbeat: Duration,
    ) {
        crate::metrics::broker_seen(transport, self.seen_ago());
        let report = self.report(relay_id, transport, expires_after(heartbeat));
        match broker_state::record(db, &report).await {
            Ok(()) => {
                if self.write_failed.swap(false, Ordering::Relaxed) {
                    tracing::info!(relay = %relay_id, "recording the broker's state works again");
                }
            }
            Err(e) => {
                if !self.write_failed.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        relay = %relay_id, error = %e,
                        "could not record the broker's state in outbox_relay (is migration \
                         outbox_0005 applied?); publishing goes on"
                    );
                }
            }
        }
    }
}

/// A row stays current for three heartbeats.
fn expires_after(heartbeat: Duration) -> Duration {
    heartbeat.saturating_mul(3)
}

/// Rows of relays that stopped without removing theirs are removed a day after they expired.
const FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);

/// Record the relay's state every `heartbeat` until `shutdown`. An idle relay (nothing confirmed
/// since the last heartbeat) asks the broker's health check, so an outage shows while nothing is
/// published too; a failed check opens the breaker.
pub(super) async fn heartbeat(
    watch: &BrokerWatch,
    db: &DatabaseConnection,
    relay_id: &str,
    transport: &dyn Transport,
    heartbeat: Duration,
    shutdown: &CancellationToken,
) {
    if let Err(e) = broker_state::forget_expired(db, FORGET_AFTER).await {
        tracing::debug!(relay = %relay_id, error = %e, "could not remove expired relay rows");
    }
    loop {
        watch
            .record(db, relay_id, transport.name(), heartbeat)
            .await;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(heartbeat) => {}
        }
        if !watch.is_down() && watch.seen_ago().is_none_or(|ago| ago >= heartbeat) {
            match transport.health().await {
                Ok(()) => watch.seen(),
                Err(e) => watch.open(&format!("health check failed: {e}"), false),
            }
        }
    }
}

/// Remove the relay's row as it stops.
pub(super) async fn forget(db: &DatabaseConnection, relay_id: &str) {
    if let Err(e) = broker_state::forget(db, relay_id).await {
        tracing::debug!(relay = %relay_id, error = %e, "could not remove the relay's row");
    }
}
