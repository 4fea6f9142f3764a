//! The runtime: started from `main`, it finds every `#[inbox_handler]` linked into the binary and
//! runs the relay, one dispatcher and one worker per consumer, under one cancellation token.
//!
//! ```no_run
//! # async fn demo(db: sea_orm::DatabaseConnection) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_runtime::runtime::Runtime;
//! let runtime = Runtime::builder(db)
//!     .source("order-service")
//!     .expect_consumers(["inventory"]) // fail fast if a handler crate was not linked
//!     .start()
//!     .await?;
//! let outbox = runtime.outbox().clone(); // produce through it: commits wake the relay
//! // ... serve ...
//! runtime.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Without a transport, the runtime uses the database-local transport: the relay moves each
//! event into inbox rows of every local consumer subscribed to its type and marks it SENT in one
//! transaction. No broker, exactly once, on any backend including SQLite.
//!
//! **Linking.** Handlers register through the `inventory` crate: a handler in a crate the binary
//! never references may be dropped by the linker and silently not run. Reference such crates
//! (`use inventory_handlers as _;`), and name the consumers you expect with
//! [`RuntimeBuilder::expect_consumers`] so start-up fails instead.

use std::{collections::BTreeMap, fmt, sync::Arc, time::Duration};

mod start;
pub(crate) use start::{ByConsumer, Loops, RelayRole, join};

use sea_orm::DatabaseConnection;
use tokio::{sync::Notify, task::JoinHandle};
use tokio_util::sync::CancellationToken;

pub use crate::health::{Health, LoopReport};
use crate::{
    health::LoopHealth,
    inbox::{
        ConsumerStats, ConsumerStatsSnapshot, ExternalInbox, HandlerRegistration, InboxConfig,
        consumer::Consumer,
    },
    outbox::Outbox,
    registry::{EventCatalogue, RegistryError},
    relay::{Relay, RelayConfig, RelayStats, RelayStatsSnapshot},
    transport::{IntoTransport, Transport, local::LocalDelivery},
};

/// Why the runtime did not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The event or handler catalogue has problems (each listed).
    #[error("outbox registry: {}", list(.0))]
    Registry(Vec<RegistryError>),
    /// Two handlers claim the same consumer, event type and version.
    #[error(
        "consumer `{consumer}` has two handlers for `{event_type}` version {schema_version}: {first} and {second}"
    )]
    DuplicateHandler {
        /// Consumer.
        consumer: String,
        /// Event type.
        event_type: String,
        /// Schema version.
        schema_version: u32,
        /// Where the first one is.
        first: String,
        /// Where the second one is.
        second: String,
    },
    /// An expected consumer has no handler linked in.
    #[error(
        "expected consumer `{0}` has no #[inbox_handler] linked into this binary (found: {1}); \
         is the crate declaring it referenced from main?"
    )]
    MissingConsumer(String, String),
    /// The upcasters of the events the consumers handle have problems (each listed).
    #[error("upcasters: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Upcasters(Vec<crate::upcast::UpcastError>),
    /// The transport could not be set up.
    #[error(transparent)]
    Transport(#[from] crate::transport::TransportError),
    /// The retention policy would purge inbox rows a redelivery could still need.
    #[error("retention: {0}")]
    Retention(crate::retention::RetentionError),
    /// A setting was given that cannot apply (each says which and why).
    #[error("runtime settings: {0}")]
    Settings(String),
}

impl Default for Janitor {
    fn default() -> Self {
        Janitor {
            policy: crate::retention::RetentionPolicy::default(),
            interval: std::time::Duration::from_secs(60),
            broker_window: std::time::Duration::from_secs(24 * 3600),
            manual_window: std::time::Duration::from_secs(24 * 3600),
        }
    }
}

/// Purge old rows every interval while this instance holds the janitor lease; hand the lease
/// back at shutdown.
async fn run_janitor(
    db: DatabaseConnection,
    janitor: Janitor,
    instance: String,
    shutdown: CancellationToken,
    health: &LoopHealth,
) {
    let mut failures = 0;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            result = crate::retention::purge_once_if_leader(&db, &janitor.policy, &instance) => {
                failures = if result.is_ok() { 0 } else { failures + 1 };
                match result {
                    Ok(Some(report)) if report.deleted() > 0 => {
                        health.success();
                        tracing::info!(
                            outbox_deleted = report.outbox_deleted,
                            inbox_deleted = report.inbox_deleted,
                            batches = report.batches,
                            "retention purge"
                        );
                    }
                    Ok(_) => health.success(),
                    Err(e) => {
                        health.failure(&e.to_string());
                        tracing::warn!(error = %e, "retention purge failed");
                    }
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(pause_after(janitor.interval, failures)) => {}
        }
    }
    if let Err(e) = crate::retention::release_lease(&db, &instance).await {
        tracing::debug!(error = %e, "could not release the janitor lease");
    }
}

/// How long a periodic loop waits before its next round: its interval, or after failed rounds a
/// shorter, growing pause (1 s, 2 s, 4 s, … up to the interval), so that it notices soon when
/// the database is back.
fn pause_after(interval: Duration, failures: u32) -> Duration {
    if failures == 0 {
        return interval;
    }
    Duration::from_secs(1 << (failures - 1).min(10)).min(interval)
}

fn list(errors: &[RegistryError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Every handler linked into this binary, grouped by consumer, checked for duplicates.
pub fn handlers() -> Result<BTreeMap<&'static str, Vec<&'static HandlerRegistration>>, RuntimeError>
{
    crate::inbox::linked_handlers().map_err(|d| RuntimeError::DuplicateHandler {
        consumer: d.consumer,
        event_type: d.event_type,
        schema_version: d.schema_version,
        first: d.first,
        second: d.second,
    })
}

/// The upcasters of the event types these consumers handle: no duplicate, each one step, and
/// no gap below a handled version.
fn check_upcasters(
    by_consumer: &BTreeMap<&'static str, Vec<&'static HandlerRegistration>>,
) -> Result<(), RuntimeError> {
    let upcasters = crate::upcast::Upcasters::linked();
    let handled: std::collections::BTreeSet<&str> = by_consumer
        .values()
        .flatten()
        .filter(|r| r.source.is_none())
        .map(|r| r.event_type)
        .collect();
    let mut problems: Vec<_> = upcasters
        .check()
        .into_iter()
        .filter(|e| match e {
            crate::upcast::UpcastError::Duplicate { event_type, .. }
            | crate::upcast::UpcastError::NotOneStep { event_type, .. } => {
                handled.contains(event_type.as_str())
            }
            _ => true,
        })
        .collect();
    for (consumer, regs) in by_consumer {
        problems.extend(upcasters.check_consumer(consumer, regs));
    }
    for reg in upcasters.all() {
        if handled.contains(reg.event_type) {
            tracing::info!(
                event_type = reg.event_type, from = reg.from_version, to = reg.to_version,
                upcaster = %reg.location(), "upcaster"
            );
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(RuntimeError::Upcasters(problems))
    }
}

/// Configures and starts a [`Runtime`] (or, given [`databases`](RuntimeBuilder::databases), a
/// [`Fleet`](crate::fleet::Fleet) over a set of databases).
#[derive(Clone)]
pub struct RuntimeBuilder {
    pub(crate) db: DatabaseConnection,
    pub(crate) outbox: Option<Outbox>,
    pub(crate) source: Option<String>,
    pub(crate) transport: Option<Arc<dyn Transport>>,
    pub(crate) relay: Option<RelayConfig>,
    pub(crate) instance: Option<String>,
    pub(crate) inbox: InboxConfig,
    pub(crate) consumers: Option<Vec<String>>,
    pub(crate) expected: Vec<String>,
    pub(crate) metrics_interval: Option<std::time::Duration>,
    retention: Option<Janitor>,
    #[cfg(feature = "postgres-wal")]
    pub(crate) wal: Option<crate::relay::WalConfig>,
}

/// Retention settings of the runtime's janitor.
#[derive(Debug, Clone)]
struct Janitor {
    policy: crate::retention::RetentionPolicy,
    interval: std::time::Duration,
    broker_window: std::time::Duration,
    manual_window: std::time::Duration,
}

impl fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("transport", &self.transport.as_ref().map(|t| t.name()))
            .field("relay", &self.relay)
            .field("inbox", &self.inbox)
            .field("consumers", &self.consumers)
            .field("expected", &self.expected)
            .finish()
    }
}

impl RuntimeBuilder {
    /// Produce through this handle (its commits wake the runtime's relay).
    pub fn outbox(mut self, outbox: &Outbox) -> Self {
        self.outbox = Some(outbox.clone());
        self
    }

    /// The service's CloudEvents `source`, when the runtime creates the outbox handle.
    /// Default `outbox`. Given together with [`outbox`](Self::outbox), whose handle has its
    /// source already, [`start`](Self::start) refuses both with [`RuntimeError::Settings`].
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Publish to and consume from a broker (a transport by value or in an `Arc`). Without
    /// one, the database-local transport is used.
    pub fn transport(mut self, transport: impl IntoTransport) -> Self {
        self.transport = Some(transport.into_transport());
        self
    }

    /// Relay settings.
    pub fn relay_config(mut self, config: RelayConfig) -> Self {
        self.relay = Some(config);
        self
    }

    /// The name this runtime's loops record as the owner of what they claim and lease: the
    /// relay's `locked_by` and its row in `outbox_relay`, each consumer's worker
    /// (`{instance}/{consumer}`) and the janitor (`{instance}/janitor`). Given, it replaces the
    /// relay's [`RelayConfig::relay_id`]. Default: the relay's id when this runtime runs a relay,
    /// else `host-pid-random`.
    pub fn instance_id(mut self, id: impl Into<String>) -> Self {
        self.instance = Some(id.into());
        self
    }

    /// The relay reads committed events from PostgreSQL's WAL (see [`Relay::with_wal`]). It
    /// needs the relay and a broker: without either, [`start`](Self::start) refuses it with
    /// [`RuntimeError::Settings`].
    #[cfg(feature = "postgres-wal")]
    pub fn wal(mut self, config: crate::relay::WalConfig) -> Self {
        self.wal = Some(config);
        self
    }

    /// Run no relay in this process (a consumer-only service, or relays run elsewhere).
    pub fn without_relay(mut self) -> Self {
        self.relay = None;
        self
    }

    /// Inbox settings.
    pub fn inbox_config(mut self, config: InboxConfig) -> Self {
        self.inbox = config;
        self
    }

    /// Run only these consumers of the handlers linked in (default: all). An empty list runs
    /// none: a producer-only process.
    pub fn consumers<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.consumers = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Fail start-up unless each of these consumers has at least one handler linked in.
    pub fn expect_consumers<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.expected.extend(names.into_iter().map(Into::into));
        self
    }

    /// How often to sample the backlog gauges (`outbox_backlog_events`,
    /// `outbox_oldest_pending_age_seconds`, `inbox_backlog_messages`); `None` samples none.
    /// Default 15 s.
    pub fn metrics_interval(mut self, interval: Option<std::time::Duration>) -> Self {
        self.metrics_interval = interval;
        self
    }

    /// Run the retention janitor with `policy` (default [`RetentionPolicy::default`]: SENT
    /// outbox rows deleted after 7 days, DONE inbox rows after 14), every `interval` (default
    /// 1 min), one instance at a time (a lease). `None` turns it off.
    ///
    /// Start-up refuses an inbox window shorter than the redelivery horizon: the broker's
    /// duplicate window or retention (`broker_window`, default 1 day) plus the relay's longest
    /// retry span plus `manual_window` (default 1 day) for an operator to replay dead letters.
    /// A message redelivered after its inbox row was purged would be handled again.
    ///
    /// [`RetentionPolicy::default`]: crate::retention::RetentionPolicy
    pub fn retention(
        mut self,
        policy: Option<crate::retention::RetentionPolicy>,
        interval: std::time::Duration,
    ) -> Self {
        self.retention = policy.map(|policy| Janitor {
            policy,
            interval,
            ..Janitor::default()
        });
        self
    }

    /// The windows the janitor's start-up check adds up (see [`retention`](Self::retention)).
    pub fn redelivery_windows(
        mut self,
        broker_window: std::time::Duration,
        manual_window: std::time::Duration,
    ) -> Self {
        if let Some(janitor) = &mut self.retention {
            janitor.broker_window = broker_window;
            janitor.manual_window = manual_window;
        }
        self
    }
}

/// The running SDK: relay, dispatchers and workers. Stop it with [`shutdown`](Self::shutdown).
pub struct Runtime {
    outbox: Outbox,
    shutdown: CancellationToken,
    tasks: Vec<(Arc<LoopHealth>, JoinHandle<()>)>,
    consumers: BTreeMap<&'static str, Arc<ConsumerStats>>,
    relay_stats: Option<Arc<RelayStats>>,
    external: ExternalInbox,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("outbox", &self.outbox)
            .field("consumers", &self.consumers.keys().collect::<Vec<_>>())
            .field("loops", &self.tasks.len())
            .finish()
    }
}

impl Runtime {
    /// Configure a runtime over `db`.
    pub fn builder(db: DatabaseConnection) -> RuntimeBuilder {
        RuntimeBuilder {
            db,
            outbox: None,
            source: None,
            transport: None,
            relay: Some(RelayConfig::default()),
            instance: None,
            inbox: InboxConfig::default(),
            consumers: None,
            expected: Vec::new(),
            metrics_interval: Some(std::time::Duration::from_secs(15)),
            retention: Some(Janitor::default()),
            #[cfg(feature = "postgres-wal")]
            wal: None,
        }
    }

    /// The outbox handle to produce through.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// Records messages from outside (webhooks, other systems' messages) for the consumers'
    /// workers, waking the worker of a consumer that runs here.
    pub fn external_inbox(&self) -> ExternalInbox {
        self.external.clone()
    }

    /// The consumers running here.
    pub fn consumers(&self) -> Vec<&'static str> {
        self.consumers.keys().copied().collect()
    }

    /// A consumer's counters.
    pub fn consumer_stats(&self, consumer: &str) -> Option<ConsumerStatsSnapshot> {
        self.consumers.get(consumer).map(|s| s.snapshot())
    }

    /// The relay's counters, if a relay runs here.
    pub fn relay_stats(&self) -> Option<RelayStatsSnapshot> {
        self.relay_stats.as_ref().map(|s| s.snapshot())
    }

    /// The liveness and readiness probes of this runtime, for a platform's health checks (see
    /// [`Probes`](crate::health::Probes); `health::router` serves them with the `axum` feature).
    pub fn probes(&self) -> crate::health::Probes {
        crate::health::Probes::new(
            self.tasks.iter().map(|(h, _)| h.clone()).collect(),
            self.external.db().clone(),
            self.relay_stats.clone(),
            self.shutdown.clone(),
        )
    }

    /// Each loop's health.
    pub fn health(&self) -> Health {
        Health {
            loops: self.tasks.iter().map(|(h, _)| h.report()).collect(),
        }
    }

    /// Stop every loop: no new claims or deliveries, work in flight finishes, unstarted claims
    /// are handed back. Returns the final counters once every loop has ended.
    pub async fn shutdown(self) -> RuntimeReport {
        self.shutdown.cancel();
        start::join(self.tasks).await;
        let report = RuntimeReport {
            consumers: self
                .consumers
                .iter()
                .map(|(name, stats)| (*name, stats.snapshot()))
                .collect(),
            relay: self.relay_stats.as_ref().map(|s| s.snapshot()),
        };
        tracing::info!(?report, "outbox runtime stopped");
        report
    }
}

/// The counters of a runtime that has stopped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeReport {
    /// Per consumer.
    pub consumers: BTreeMap<&'static str, ConsumerStatsSnapshot>,
    /// The relay's, if one ran.
    pub relay: Option<RelayStatsSnapshot>,
}

impl RuntimeReport {
    /// A consumer's counters (zeros if it did not run).
    pub fn consumer(&self, name: &str) -> ConsumerStatsSnapshot {
        self.consumers.get(name).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periodic_loops_come_back_sooner_after_failures() {
        let minute = Duration::from_secs(60);
        assert_eq!(pause_after(minute, 0), minute);
        assert_eq!(pause_after(minute, 1), Duration::from_secs(1));
        assert_eq!(pause_after(minute, 3), Duration::from_secs(4));
        assert_eq!(pause_after(minute, 7), minute);
        assert_eq!(pause_after(minute, 1_000), minute);
        assert_eq!(
            pause_after(Duration::from_millis(200), 1),
            Duration::from_millis(200)
        );
    }
}
