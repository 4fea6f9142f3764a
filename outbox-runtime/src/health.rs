//! Liveness of the runtime's loops, ready for a `/healthz` endpoint.

use std::sync::{
    Mutex,
    atomic::{AtomicBool, Ordering},
};

use chrono::{DateTime, Utc};

/// The health of one loop, updated by the loop itself.
#[derive(Debug)]
pub(crate) struct LoopHealth {
    name: String,
    alive: AtomicBool,
    state: Mutex<State>,
}

#[derive(Debug, Default, Clone)]
struct State {
    last_success: Option<DateTime<Utc>>,
    last_error: Option<(DateTime<Utc>, String)>,
}

impl LoopHealth {
    pub(crate) fn new(name: String) -> Self {
        LoopHealth {
            name,
            alive: AtomicBool::new(true),
            state: Mutex::default(),
        }
    }

    pub(crate) fn success(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.last_success = Some(Utc::now());
    }

    pub(crate) fn failure(&self, error: &str) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.last_error = Some((Utc::now(), error.to_owned()));
    }

    pub(crate) fn stopped(&self) {
        self.alive.store(false, Ordering::Relaxed);
    }

    /// A snapshot.
    pub(crate) fn report(&self) -> LoopReport {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let healthy = self.alive.load(Ordering::Relaxed)
            && match (&state.last_success, &state.last_error) {
                (_, None) => true,
                (Some(ok), Some((failed, _))) => ok >= failed,
                (None, Some(_)) => false,
            };
        LoopReport {
            name: self.name.clone(),
            alive: self.alive.load(Ordering::Relaxed),
            healthy,
            last_success: state.last_success,
            last_error: state.last_error.map(|(at, e)| format!("{at}: {e}")),
        }
    }
}

/// One loop's health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopReport {
    /// `relay`, `dispatch:inventory`, `worker:inventory`, …
    pub name: String,
    /// The loop is running.
    pub alive: bool,
    /// Running, and its last round succeeded (or none failed yet).
    pub healthy: bool,
    /// When a round last succeeded.
    pub last_success: Option<DateTime<Utc>>,
    /// The last error and when it happened.
    pub last_error: Option<String>,
}

/// Every loop's health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// One entry per loop.
    pub loops: Vec<LoopReport>,
}

impl Health {
    /// Every loop is alive and its last round succeeded.
    pub fn is_healthy(&self) -> bool {
        self.loops.iter().all(|l| l.healthy)
    }
}
