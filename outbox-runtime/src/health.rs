//! The runtime's health: each loop's, and the probes a platform asks (see [`Probes`]).

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::relay::RelayStats;

/// The health of one loop, updated by the loop itself.
#[derive(Debug)]
pub(crate) struct LoopHealth {
    name: String,
    alive: AtomicBool,
    state: Mutex<State>,
    /// How often a periodic loop ends a round (success or failure); `None` for a loop that
    /// waits for the broker or a stream and may be quiet for as long as nothing arrives.
    cadence: Option<Duration>,
    started: DateTime<Utc>,
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
            cadence: None,
            started: Utc::now(),
        }
    }

    /// A loop that ends a round at least every `cadence` (its poll interval).
    pub(crate) fn periodic(name: String, cadence: Duration) -> Self {
        LoopHealth {
            cadence: Some(cadence),
            ..LoopHealth::new(name)
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
        let last_round = match (&state.last_success, &state.last_error) {
            (Some(ok), Some((failed, _))) => Some(*ok.max(failed)),
            (Some(ok), None) => Some(*ok),
            (None, Some((failed, _))) => Some(*failed),
            (None, None) => None,
        };
        LoopReport {
            name: self.name.clone(),
            alive: self.alive.load(Ordering::Relaxed),
            healthy,
            last_success: state.last_success,
            last_error: state.last_error.map(|(at, e)| format!("{at}: {e}")),
            last_round,
            cadence: self.cadence,
            started: self.started,
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
    /// When a round last ended, successfully or not.
    pub last_round: Option<DateTime<Utc>>,
    /// How often the loop ends a round when it runs periodically (`None`: it waits for the
    /// broker or a stream).
    pub cadence: Option<Duration>,
    /// When the loop started.
    pub started: DateTime<Utc>,
}

impl LoopReport {
    /// How long a periodic loop has gone without ending a round beyond what it is allowed
    /// (`allowance`, or ten of its rounds if that is longer): `Some` when it is stuck.
    pub fn stuck_for(&self, allowance: Duration, now: DateTime<Utc>) -> Option<Duration> {
        let cadence = self.cadence?;
        let allowed = allowance.max(cadence.saturating_mul(10));
        let since = self.last_round.unwrap_or(self.started);
        let quiet = (now - since).to_std().unwrap_or_default();
        (quiet > allowed).then_some(quiet)
    }
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

/// One check of a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    /// As it should be.
    Pass,
    /// Degraded, and handled: reported, never a reason to take the pod out or restart it (a
    /// broker outage, a failed round that the loop retries).
    Warn,
    /// The probe fails because of it.
    Fail,
}

/// One named check and what it found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// `database`, `broker`, `loop:relay`, `loop:worker:inventory`, `runtime`.
    pub name: String,
    /// What it found.
    pub status: CheckStatus,
    /// Why, when not `pass` (no error text: a probe's answer is served without authentication).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A probe's answer: `fail` when any check fails, else `warn` when any warns, else `pass`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HealthReport {
    /// The worst of the checks.
    pub status: CheckStatus,
    /// Every check.
    pub checks: Vec<Check>,
}

impl HealthReport {
    fn of(checks: Vec<Check>) -> HealthReport {
        let status = checks
            .iter()
            .map(|c| c.status)
            .max_by_key(|s| match s {
                CheckStatus::Pass => 0,
                CheckStatus::Warn => 1,
                CheckStatus::Fail => 2,
            })
            .unwrap_or(CheckStatus::Pass);
        HealthReport { status, checks }
    }

    /// Whether the probe succeeds (`pass` or `warn`).
    pub fn is_ok(&self) -> bool {
        self.status != CheckStatus::Fail
    }
}

fn check(name: impl Into<String>, status: CheckStatus, detail: Option<String>) -> Check {
    Check {
        name: name.into(),
        status,
        detail,
    }
}

/// The liveness and readiness probes of a runtime (`Runtime::probes`), framework-free; with the
/// `axum` feature, [`router`] serves them.
///
/// - **Liveness** fails only for what a restart cures: a loop that ended while the runtime runs
///   (a panic), or a periodic loop that has not ended a round for [`stuck_after`](Self::stuck_after)
///   (default 5 minutes; ten of its intervals if longer). A worker runs its handlers in its
///   round, so a handler running longer than this makes its worker look stuck: set it above
///   your longest handler. A broker or database outage never fails it: restarting cures neither.
/// - **Readiness** fails when the database does not answer `SELECT 1` within
///   [`database_timeout`](Self::database_timeout) (default 2 s), when the runtime is shutting
///   down, or when liveness fails. A broker outage is a `warn`: the relay's breaker is open,
///   events wait in the outbox, and the service keeps taking requests, which is the point of an
///   outbox. So is a WAL relay's reader that is not streaming (check `wal`: reconnecting, or
///   polling the table after its slot was lost): the claim loop publishes from the table.
#[derive(Debug, Clone)]
pub struct Probes {
    loops: Vec<Arc<LoopHealth>>,
    db: DatabaseConnection,
    relay: Option<Arc<RelayStats>>,
    shutdown: CancellationToken,
    stuck_after: Duration,
    database_timeout: Duration,
}

impl Probes {
    pub(crate) fn new(
        loops: Vec<Arc<LoopHealth>>,
        db: DatabaseConnection,
        relay: Option<Arc<RelayStats>>,
        shutdown: CancellationToken,
    ) -> Probes {
        Probes {
            loops,
            db,
            relay,
            shutdown,
            stuck_after: Duration::from_secs(300),
            database_timeout: Duration::from_secs(2),
        }
    }

    /// How long a periodic loop may go without ending a round before liveness fails.
    pub fn stuck_after(mut self, after: Duration) -> Self {
        self.stuck_after = after;
        self
    }

    /// How long readiness waits for the database's answer.
    pub fn database_timeout(mut self, timeout: Duration) -> Self {
        self.database_timeout = timeout;
        self
    }

    fn loop_checks(&self, failed_round: CheckStatus) -> Vec<Check> {
        let now = Utc::now();
        let stopping = self.shutdown.is_cancelled();
        self.loops
            .iter()
            .map(|l| {
                let report = l.report();
                let name = format!("loop:{}", report.name);
                if !report.alive {
                    let status = if stopping {
                        CheckStatus::Pass
                    } else {
                        CheckStatus::Fail
                    };
                    return check(name, status, Some("the loop has ended".into()));
                }
                if let Some(quiet) = report.stuck_for(self.stuck_after, now) {
                    let detail = format!("no round ended for {} s", quiet.as_secs());
                    return check(name, CheckStatus::Fail, Some(detail));
                }
                if !report.healthy {
                    return check(name, failed_round, Some("its last round failed".into()));
                }
                check(name, CheckStatus::Pass, None)
            })
            .collect()
    }

    /// The liveness probe (see the type's documentation).
    pub fn liveness(&self) -> HealthReport {
        HealthReport::of(self.loop_checks(CheckStatus::Warn))
    }

    /// The readiness probe (see the type's documentation).
    pub async fn readiness(&self) -> HealthReport {
        let mut checks = Vec::new();
        if self.shutdown.is_cancelled() {
            checks.push(check(
                "runtime",
                CheckStatus::Fail,
                Some("shutting down".into()),
            ));
        }
        let answered = tokio::time::timeout(
            self.database_timeout,
            self.db.execute_unprepared("SELECT 1"),
        )
        .await;
        checks.push(match answered {
            Ok(Ok(_)) => check("database", CheckStatus::Pass, None),
            Ok(Err(_)) => check(
                "database",
                CheckStatus::Fail,
                Some("the database refused `SELECT 1`".into()),
            ),
            Err(_) => check(
                "database",
                CheckStatus::Fail,
                Some(format!(
                    "no answer to `SELECT 1` within {} ms",
                    self.database_timeout.as_millis()
                )),
            ),
        });
        if let Some(relay) = &self.relay {
            checks.push(if relay.snapshot().broker_unavailable {
                check(
                    "broker",
                    CheckStatus::Warn,
                    Some(
                        "unavailable: the relay's breaker is open, events wait in the outbox"
                            .into(),
                    ),
                )
            } else {
                check("broker", CheckStatus::Pass, None)
            });
            use crate::relay::WalReader;
            let wal = match relay.snapshot().wal {
                WalReader::Off => None,
                WalReader::Streaming => Some(check("wal", CheckStatus::Pass, None)),
                WalReader::Starting => Some(check(
                    "wal",
                    CheckStatus::Warn,
                    Some("preparing the replication slot".into()),
                )),
                WalReader::Reconnecting => Some(check(
                    "wal",
                    CheckStatus::Warn,
                    Some(
                        "the stream ended and is being opened again; the claim loop publishes \
                         what waits past the table grace"
                            .into(),
                    ),
                )),
                WalReader::Polling => Some(check(
                    "wal",
                    CheckStatus::Warn,
                    Some(
                        "cannot stream from the slot: the relay polls the table until it is \
                         restarted (nothing is lost)"
                            .into(),
                    ),
                )),
            };
            checks.extend(wal);
        }
        checks.extend(self.loop_checks(CheckStatus::Warn));
        HealthReport::of(checks)
    }
}

/// `GET /livez` and `GET /readyz`: 200 with the report as JSON when the probe succeeds, 503
/// when it fails (feature `axum`). Mount it on an internal port: it is served without
/// authentication, and says which loops run and whether the database and broker answer, never
/// an error's text.
#[cfg(feature = "axum")]
pub fn router(probes: Probes) -> axum::Router {
    use axum::{extract::State, response::IntoResponse, routing::get};

    fn answer(report: &HealthReport) -> axum::response::Response {
        let status = if report.is_ok() {
            http::StatusCode::OK
        } else {
            http::StatusCode::SERVICE_UNAVAILABLE
        };
        let body = serde_json::to_string(report).unwrap_or_default();
        (
            status,
            [
                (http::header::CONTENT_TYPE, "application/json"),
                (http::header::CACHE_CONTROL, "no-store"),
            ],
            body,
        )
            .into_response()
    }
    axum::Router::new()
        .route(
            "/livez",
            get(|State(p): State<Probes>| async move { answer(&p.liveness()) }),
        )
        .route(
            "/readyz",
            get(|State(p): State<Probes>| async move { answer(&p.readiness().await) }),
        )
        .with_state(probes)
}
