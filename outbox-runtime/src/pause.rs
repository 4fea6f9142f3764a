//! What this process honours of `outbox_pause` (see [`admin::pause`](crate::admin::pause)): the
//! paused consumers and destinations, read again at most every [`PAUSE_REFRESH`] by whichever
//! loop asks first (one small query per interval and process, whatever the number of loops).
//! A database without the table (migration `outbox_0015` not applied) has no pauses.

use std::{
    collections::BTreeSet,
    sync::{Mutex, RwLock},
    time::{Duration, Instant},
};

use sea_orm::DatabaseConnection;

/// How often a process reads `outbox_pause`: a pause or a resume is honoured by every instance
/// within this time (plus a loop's current round).
pub const PAUSE_REFRESH: Duration = Duration::from_secs(2);

/// The pauses a process honours.
#[derive(Debug)]
pub(crate) struct Pauses {
    state: RwLock<State>,
    /// When the table was last read (`None`: never).
    read_at: Mutex<Option<Instant>>,
    refresh: Duration,
}

#[derive(Debug, Default)]
struct State {
    consumers: BTreeSet<String>,
    destinations: BTreeSet<String>,
}

impl Default for Pauses {
    fn default() -> Self {
        Pauses::new(PAUSE_REFRESH)
    }
}

impl Pauses {
    pub(crate) fn new(refresh: Duration) -> Self {
        Pauses {
            state: RwLock::default(),
            read_at: Mutex::new(None),
            refresh,
        }
    }

    /// Read the table again if the last read is older than the refresh interval. An error
    /// keeps what was read before (a database outage does not resume anything).
    pub(crate) async fn refresh_if_due(&self, db: &DatabaseConnection) {
        {
            // Asked on every delivery a dispatcher takes: a loop that finds another one looking
            // does not wait for it.
            let mut at = match self.read_at.try_lock() {
                Ok(at) => at,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return,
            };
            if at.is_some_and(|at| at.elapsed() < self.refresh) {
                return;
            }
            *at = Some(Instant::now());
        }
        match crate::store::pause::list(db).await {
            Ok(rows) => {
                let mut next = State::default();
                for row in rows {
                    match row.kind.as_str() {
                        "consumer" => next.consumers.insert(row.name),
                        "destination" => next.destinations.insert(row.name),
                        _ => false,
                    };
                }
                self.replace(next);
            }
            Err(e) if crate::store::errors::is_missing_table(&e) => {
                self.replace(State::default());
            }
            Err(e) => {
                tracing::debug!(error = %e, "could not read outbox_pause; the pauses read before stay");
            }
        }
    }

    fn replace(&self, next: State) {
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        for (kind, before, after) in [
            ("consumer", &state.consumers, &next.consumers),
            ("destination", &state.destinations, &next.destinations),
        ] {
            for name in after.difference(before) {
                tracing::warn!(kind, name = %name, "paused by an operator (outbox_pause)");
                crate::metrics::paused(kind, name, true);
            }
            for name in before.difference(after) {
                tracing::info!(kind, name = %name, "resumed by an operator (outbox_pause)");
                crate::metrics::paused(kind, name, false);
            }
        }
        *state = next;
    }

    /// Whether consumer `name` is paused.
    pub(crate) fn consumer_paused(&self, name: &str) -> bool {
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        state.consumers.contains(name)
    }

    /// Whether any destination is paused.
    pub(crate) fn any_destination(&self) -> bool {
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        !state.destinations.is_empty()
    }

    /// Whether destination `name` is paused.
    pub(crate) fn destination_paused(&self, name: &str) -> bool {
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        state.destinations.contains(name)
    }
}
