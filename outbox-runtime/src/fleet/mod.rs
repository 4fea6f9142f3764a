//! One runtime over a set of databases: a database per tenant (or per shard), PostgreSQL,
//! MySQL/MariaDB or SQLite in any mix, served by every instance of a service, with the work that
//! needs one owner at a time spread over the instances.
//!
//! ```no_run
//! # async fn demo(
//! #     control: sea_orm::DatabaseConnection,
//! #     acme: sea_orm::DatabaseConnection,
//! #     globex: sea_orm::DatabaseConnection,
//! #     nats: outbox_runtime::transport::nats::NatsTransport,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_runtime::{fleet::{DatabaseSet, FleetDatabase}, runtime::Runtime};
//!
//! let tenants = DatabaseSet::new([
//!     FleetDatabase::new("acme", acme),
//!     FleetDatabase::new("globex", globex),
//! ]);
//! let fleet = Runtime::builder(control) // the control database: leases and heartbeats
//!     .source("order-service")
//!     .transport(nats)
//!     .databases(tenants.clone()) // or any `DatabaseSource`, read again every 10 s
//!     .start()
//!     .await?;
//! let outbox = fleet.outbox("acme").expect("a database of the set"); // produce through it
//! // ... serve; `tenants.add(…)` / `tenants.remove("globex")` while it runs ...
//! fleet.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! **Who does what.** Every instance runs, for every database, the fast path (it publishes what
//! its own commits wrote) and a share of the consumers' deliveries: one dispatcher per consumer
//! reads the broker for all databases and records each message, and runs its handler, in the
//! database its envelope names (the `tenant` extension, which the relay writes; a handler reads
//! it as [`EventMeta::database`](crate::inbox::EventMeta::database)). The rest is owned: for
//! each database exactly one instance at a time runs the claim loop, the delayed events'
//! promotion, the consumers' workers (retries, stored and local messages), the
//! retention janitor and the metrics sampler.
//!
//! **How owners are chosen.** Self-assignment over leases in a control database (its
//! `outbox_lease`, migrated like any other): each instance renews a heartbeat row every
//! [`heartbeat`](FleetBuilder::heartbeat) and reads the live instances; every instance computes
//! the same assignment from that list (rendezvous hashing with fixed counts, so no instance
//! owns more than one database above another), and takes the lease of a database it should own
//! once nobody else holds it. No election, no leader to lose: an instance that leaves releases
//! its leases and its databases move within a heartbeat; one that dies is seen gone when its
//! heartbeat expires ([`lease`](FleetBuilder::lease), 10 s by default) and its databases move
//! then; one that joins gets its share as the others hand it over. Two owners at once cannot
//! break anything (claims are leased and fenced, the janitor has its own lease): the leases keep the work from being done twice, not the books correct.
//!
//! **A database nobody owns** is the failure the peers' trackers report (a backlog nobody
//! noticed): [`Fleet::owners`] and [`owners`] list every database's owner, the
//! `outbox_fleet_database_owned{database}` gauge, set by every instance, drops to 0 for such a
//! database (the `OutboxDatabaseUnowned` alert rule), and the owner's sampler reports each
//! database's `outbox_oldest_pending_age_seconds{database}`.
//!
//! Not over a set: the WAL relay (`wal()` is refused: replication slots are named per server,
//! each database would need its own). The `outbox` CLI operates a set from a file of names and
//! URLs (`--databases FILE`: `migrate --all`, `status --all` with each database's owner, and
//! `--database NAME` for any command); [`migrate_each`] (the facade's
//! `outbox::fleet::migrate_all` runs the SDK's migrations with it) and [`status`] are the same
//! as functions.
//!
//! **Connections** are bounded per database server, not per database × instance:
//! [`FleetBuilder::connections_per_server`] refuses a database new to the fleet whose pool would
//! take its server past the budget (see [`Fleet::refused`]), and every instance reports each
//! server's ceiling (live instances × its databases' pool sizes) against the budget, or the
//! server's own `max_connections`.
//!
//! **When the control database is unreachable** every instance keeps what it owns (and no
//! instance takes over anything): the tenants' work goes on, and the assignment resumes when the
//! control database answers.

mod assign;
mod budget;
mod members;
mod run;
mod tenant;

use std::{
    collections::BTreeMap,
    fmt,
    sync::{Arc, RwLock},
    time::Duration,
};

use sea_orm::{DatabaseConnection, DbErr};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{
    health::{Health, LoopHealth},
    inbox::{ExternalInbox, consumer::Consumer},
    outbox::Outbox,
    runtime::{ByConsumer, RuntimeBuilder, RuntimeError},
};
use members::Names;
use tenant::Tenant;
mod ops;
pub use ops::{
    DatabaseFigures, DatabaseMigration, DatabaseStatus, Ownership, check_database_name,
    migrate_each, status,
};

/// A database of the set: its name (the tenant or shard, carried by every envelope it sends)
/// and its connection.
#[derive(Clone)]
pub struct FleetDatabase {
    name: String,
    db: DatabaseConnection,
    /// The WAL relay's settings for this database, run by its owner.
    #[cfg(feature = "postgres-wal")]
    wal: Option<crate::relay::WalConfig>,
}

impl fmt::Debug for FleetDatabase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetDatabase")
            .field("name", &self.name)
            .field("backend", &self.db.get_database_backend())
            .finish()
    }
}

impl FleetDatabase {
    /// The database `name` at `db` (migrated like any other: `outbox migrate`, or `outbox::migrate`).
    pub fn new(name: impl Into<String>, db: DatabaseConnection) -> Self {
        FleetDatabase {
            name: name.into(),
            db,
            #[cfg(feature = "postgres-wal")]
            wal: None,
        }
    }

    /// The database's owner relays from its write-ahead log (PostgreSQL with
    /// `wal_level = logical`; see [`Relay::with_wal`](crate::relay::Relay::with_wal)) instead
    /// of polling its table; every other instance still runs the fast path for its own commits.
    /// Each database needs a slot of its own (slots are named per server): name it after the
    /// database. When the database changes owner, the new owner's relay waits as a standby
    /// (polling the table) until the old owner's replication connection has gone, then takes
    /// the slot over.
    #[cfg(feature = "postgres-wal")]
    pub fn wal(mut self, config: crate::relay::WalConfig) -> Self {
        self.wal = Some(config);
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its connection.
    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }
}

/// Why a [`DatabaseSource`] could not list the databases.
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

/// Where the set of databases comes from: a list, a tenants table, a configuration service. The
/// runtime reads it at start and again every [`refresh`](FleetBuilder::refresh): a database that
/// appears is served, one that disappears stops being served (what it holds stays in it).
#[async_trait::async_trait]
pub trait DatabaseSource: Send + Sync + 'static {
    /// The databases to serve now. An error keeps the set read before (and is logged).
    async fn databases(&self) -> Result<Vec<FleetDatabase>, SourceError>;
}

#[async_trait::async_trait]
impl DatabaseSource for Vec<FleetDatabase> {
    async fn databases(&self) -> Result<Vec<FleetDatabase>, SourceError> {
        Ok(self.clone())
    }
}

/// A set of databases the application changes while the runtime runs (clones share it).
#[derive(Clone, Default)]
pub struct DatabaseSet {
    databases: Arc<RwLock<Vec<FleetDatabase>>>,
}

impl fmt::Debug for DatabaseSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseSet")
            .field("names", &self.names())
            .finish()
    }
}

impl DatabaseSet {
    /// A set of these databases.
    pub fn new(databases: impl IntoIterator<Item = FleetDatabase>) -> Self {
        let set = DatabaseSet::default();
        for database in databases {
            set.add(database);
        }
        set
    }

    /// Add a database, or replace the one of that name.
    pub fn add(&self, database: FleetDatabase) {
        let mut databases = self.databases.write().unwrap_or_else(|p| p.into_inner());
        databases.retain(|d| d.name != database.name);
        databases.push(database);
    }

    /// Remove the database `name`; true if it was in the set.
    pub fn remove(&self, name: &str) -> bool {
        let mut databases = self.databases.write().unwrap_or_else(|p| p.into_inner());
        let before = databases.len();
        databases.retain(|d| d.name != name);
        databases.len() != before
    }

    /// The names, in the order added.
    pub fn names(&self) -> Vec<String> {
        let databases = self.databases.read().unwrap_or_else(|p| p.into_inner());
        databases.iter().map(|d| d.name.clone()).collect()
    }
}

#[async_trait::async_trait]
impl DatabaseSource for DatabaseSet {
    async fn databases(&self) -> Result<Vec<FleetDatabase>, SourceError> {
        Ok(self
            .databases
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone())
    }
}

/// The longest database name: it travels in every envelope and names loops and metrics.
pub const MAX_DATABASE_NAME_CHARS: usize = 128;

/// Configures and starts a [`Fleet`]: the [`RuntimeBuilder`]'s settings apply to every database.
pub struct FleetBuilder {
    base: RuntimeBuilder,
    source: Arc<dyn DatabaseSource>,
    lease: Duration,
    heartbeat: Duration,
    refresh: Duration,
    group: Option<String>,
    default_database: Option<String>,
    connections_per_server: Option<u32>,
}

impl fmt::Debug for FleetBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FleetBuilder")
            .field("base", &self.base)
            .field("lease", &self.lease)
            .field("heartbeat", &self.heartbeat)
            .field("refresh", &self.refresh)
            .field("group", &self.group)
            .field("default_database", &self.default_database)
            .field("connections_per_server", &self.connections_per_server)
            .finish()
    }
}

impl RuntimeBuilder {
    /// Serve a set of databases instead of the builder's one, which becomes the control
    /// database (where the instances' heartbeats and the databases' leases are kept; it may be
    /// one of the set too). See [`fleet`](crate::fleet).
    pub fn databases(self, source: impl DatabaseSource) -> FleetBuilder {
        FleetBuilder {
            base: self,
            source: Arc::new(source),
            lease: Duration::from_secs(10),
            heartbeat: Duration::from_secs(2),
            refresh: Duration::from_secs(10),
            group: None,
            default_database: None,
            connections_per_server: None,
        }
    }
}

impl FleetBuilder {
    /// How long an instance's heartbeat and a database's lease last without renewal: a dead
    /// instance's databases move this long after its last heartbeat. Default 10 s; at least
    /// three heartbeats.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often each instance renews its heartbeat and leases and looks at the others.
    /// Default 2 s.
    pub fn heartbeat(mut self, heartbeat: Duration) -> Self {
        self.heartbeat = heartbeat;
        self
    }

    /// How often the [`DatabaseSource`] is read again. Default 10 s.
    pub fn refresh(mut self, refresh: Duration) -> Self {
        self.refresh = refresh;
        self
    }

    /// The name the instances of one service share in the control database (default: the
    /// service's CloudEvents `source`). Two services sharing a control database need two names.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Where a message that names no database goes (one from a service that runs over a
    /// single database, without the `tenant` extension): this database of the set. Without
    /// one, such messages are kept DEAD in the control database for an operator.
    pub fn default_database(mut self, name: impl Into<String>) -> Self {
        self.default_database = Some(name.into());
        self
    }

    /// The most connections the service's instances together may hold on one database server
    /// (PostgreSQL or MySQL/MariaDB; a SQLite file has none): live instances × the
    /// `max_connections` of the pools of that server's databases. A database new to the
    /// fleet that would take its server past it is refused (logged, [`Fleet::refused`], the
    /// `outbox_fleet_database_refused` gauge) and tried again at every refresh; one the fleet
    /// already serves is never dropped, and a server taken past it by instances joining is
    /// reported (`outbox_fleet_server_connection_ceiling` over `_limit`). Without a budget the
    /// same figures are reported against each server's own `max_connections`, and nothing is
    /// refused.
    pub fn connections_per_server(mut self, connections: u32) -> Self {
        self.connections_per_server = Some(connections);
        self
    }

    /// Check the settings, read the set of databases, and start serving it.
    pub async fn start(self) -> Result<Fleet, RuntimeError> {
        crate::metrics::describe();
        self.base.check_settings()?;
        if self.heartbeat.is_zero() || self.lease < self.heartbeat.saturating_mul(3) {
            return Err(RuntimeError::Settings(format!(
                "the fleet's lease ({:?}) must last at least three heartbeats ({:?} each), and \
                 the heartbeat must be above zero",
                self.lease, self.heartbeat
            )));
        }
        if self.connections_per_server == Some(0) {
            return Err(RuntimeError::Settings(
                "`connections_per_server` must allow at least one connection".into(),
            ));
        }
        #[cfg(feature = "postgres-wal")]
        if self.base.wal.is_some() {
            return Err(RuntimeError::Settings(
                "`wal()` cannot apply over a set of databases: replication slots are named per \
                 server and each database needs a slot of its own; give each database its WAL \
                 settings with `FleetDatabase::wal`"
                    .into(),
            ));
        }
        let by_consumer = self.base.consumers_to_run()?;
        if let Some(transport) = &self.base.transport {
            transport.setup().await?;
        }
        let instance = self.base.owner_name();
        let source_name = match (&self.base.outbox, &self.base.source) {
            (Some(outbox), _) => outbox.source().to_owned(),
            (None, Some(source)) => source.clone(),
            (None, None) => "outbox".to_owned(),
        };
        let group = self.group.clone().unwrap_or_else(|| source_name.clone());
        let shutdown = CancellationToken::new();
        let shared = Arc::new(Shared {
            control: self.base.db.clone(),
            names: Names::new(&group),
            group,
            instance,
            source_name,
            by_consumer,
            lease: self.lease,
            heartbeat: self.heartbeat,
            refresh: self.refresh,
            source: self.source.clone(),
            tenants: RwLock::default(),
            connections_per_server: self.connections_per_server,
            instances: std::sync::atomic::AtomicUsize::new(1),
            refused: RwLock::default(),
            reported: std::sync::Mutex::default(),
            default_database: self.default_database.clone(),
            shutdown: shutdown.clone(),
            base: self.base,
        });
        let databases = shared.source.databases().await.map_err(|e| {
            RuntimeError::Settings(format!("the set of databases could not be read: {e}"))
        })?;
        let databases = checked(databases).map_err(RuntimeError::Settings)?;
        // The instances already running count in each server's connections from the start.
        if let Ok(membership) = members::read(&shared.control, &shared.names).await {
            let others = membership
                .instances
                .iter()
                .filter(|i| **i != shared.instance)
                .count();
            shared
                .instances
                .store(others + 1, std::sync::atomic::Ordering::Relaxed);
        }
        run::apply_set(&shared, databases).await;
        let mut tasks = shared.start_dispatchers();
        let health = Arc::new(LoopHealth::periodic("fleet".to_owned(), shared.heartbeat));
        let (loop_shared, loop_health, token) = (shared.clone(), health.clone(), shutdown.clone());
        let task = tokio::spawn(async move {
            run::run(&loop_shared, &token, &loop_health).await;
            loop_health.stopped();
        });
        tasks.push((health, task));
        tracing::info!(
            instance = %shared.instance, group = %shared.group,
            databases = shared.database_names().len(), "outbox fleet started"
        );
        Ok(Fleet {
            shared,
            shutdown,
            tasks,
        })
    }
}

/// The databases of a source's answer, each once; an error names a name that cannot serve.
fn checked(databases: Vec<FleetDatabase>) -> Result<Vec<FleetDatabase>, String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::with_capacity(databases.len());
    for database in databases {
        check_database_name(&database.name)?;
        #[cfg(feature = "postgres-wal")]
        if let Some(wal) = &database.wal {
            if database.db.get_database_backend() != sea_orm::DbBackend::Postgres {
                return Err(format!(
                    "database {:?}: `wal()` needs PostgreSQL; its owner's claim loop can poll it \
                     instead (leave `wal()` out)",
                    database.name
                ));
            }
            let taken = out.iter().any(|other: &FleetDatabase| {
                other.name != database.name
                    && other.wal.as_ref().is_some_and(|w| w.slot == wal.slot)
            });
            if taken && !seen.contains(&database.name) {
                return Err(format!(
                    "database {:?}: its WAL slot {:?} is another database's too; give each \
                     database a slot of its own",
                    database.name, wal.slot
                ));
            }
        }
        if seen.insert(database.name.clone()) {
            out.push(database);
        } else {
            tracing::warn!(database = %database.name, "a database named twice in the set; the first is served");
        }
    }
    Ok(out)
}

/// What the fleet's loops share.
pub(crate) struct Shared {
    base: RuntimeBuilder,
    control: DatabaseConnection,
    names: Names,
    group: String,
    instance: String,
    source_name: String,
    by_consumer: ByConsumer,
    lease: Duration,
    heartbeat: Duration,
    refresh: Duration,
    source: Arc<dyn DatabaseSource>,
    tenants: RwLock<BTreeMap<String, Arc<Tenant>>>,
    /// See [`FleetBuilder::connections_per_server`].
    connections_per_server: Option<u32>,
    /// The live instances at the last heartbeat (this one included).
    instances: std::sync::atomic::AtomicUsize,
    /// The databases of the set refused for their server's budget, and why.
    refused: RwLock<BTreeMap<String, String>>,
    /// Each server's connection load last reported, to warn once per change.
    reported: std::sync::Mutex<BTreeMap<String, budget::Load>>,
    /// Where messages naming no database go (see [`FleetBuilder::default_database`]).
    default_database: Option<String>,
    shutdown: CancellationToken,
}

impl Shared {
    fn tenant(&self, name: &str) -> Option<Arc<Tenant>> {
        self.tenants
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    fn tenants(&self) -> Vec<Arc<Tenant>> {
        self.tenants
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    fn database_names(&self) -> Vec<String> {
        self.tenants
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// One dispatcher per consumer for every database: each delivery goes to the consumer of
    /// the database its envelope names. Deliveries for a database not served here go back to
    /// the broker a few times, then DEAD into the control database for an operator.
    fn start_dispatchers(self: &Arc<Self>) -> Vec<(Arc<LoopHealth>, JoinHandle<()>)> {
        let Some(transport) = self.base.transport.clone() else {
            return Vec::new();
        };
        let mut tasks = Vec::new();
        for (name, regs) in &self.by_consumer {
            let mut consumer = Consumer::new(
                name,
                regs,
                self.base.inbox.clone(),
                self.control.clone(),
                Outbox::new(self.source_name.clone()),
                Default::default(),
                format!("{}/{name}", self.instance),
            );
            consumer.system = transport.name();
            let consumer = Arc::new(consumer);
            if !consumer.takes_events() {
                continue;
            }
            let shared = Arc::downgrade(self);
            let consumer_name: &'static str = name;
            let route: crate::inbox::dispatch::Route = Arc::new(move |envelope| {
                use crate::inbox::dispatch::Routed;
                let Some(shared) = shared.upgrade() else {
                    return Routed::Unknown("the runtime is stopping".into());
                };
                let Some(database) = envelope
                    .extensions
                    .get(crate::envelope::DATABASE_EXTENSION)
                    .and_then(|v| v.as_str())
                    .or(shared.default_database.as_deref())
                else {
                    return Routed::Unknown(format!(
                        "the message names no database (no `{}` extension), and this runtime \
                         serves a set of databases",
                        crate::envelope::DATABASE_EXTENSION
                    ));
                };
                match shared
                    .tenant(database)
                    .and_then(|t| t.consumer(consumer_name))
                {
                    Some(consumer) => Routed::To(consumer),
                    None => Routed::NotServed(
                        database.to_owned(),
                        format!(
                            "database `{}` is not one this runtime serves",
                            crate::util::text::truncate(database, MAX_DATABASE_NAME_CHARS)
                        ),
                    ),
                }
            });
            let health = Arc::new(LoopHealth::new(format!("dispatch:{name}")));
            let (transport, token, loop_health) =
                (transport.clone(), self.shutdown.clone(), health.clone());
            let task = tokio::spawn(async move {
                consumer
                    .run_dispatcher(transport, token, loop_health.clone(), Some(route))
                    .await;
                loop_health.stopped();
            });
            tasks.push((health, task));
        }
        tasks
    }
}

/// A runtime over a set of databases (see [`fleet`](crate::fleet)). Stop it with
/// [`shutdown`](Self::shutdown).
pub struct Fleet {
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    tasks: Vec<(Arc<LoopHealth>, JoinHandle<()>)>,
}

impl fmt::Debug for Fleet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fleet")
            .field("instance", &self.shared.instance)
            .field("group", &self.shared.group)
            .field("databases", &self.shared.database_names())
            .field("owned", &self.owned())
            .finish()
    }
}

/// Who owns a database of the set, as the control database says.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DatabaseOwner {
    /// The database's name.
    pub database: String,
    /// The instance holding its lease now; `None`: nobody (an alarm when it lasts).
    pub owner: Option<String>,
    /// When the current (or last) holder's lease ends.
    pub until: Option<chrono::DateTime<chrono::Utc>>,
}

impl Fleet {
    /// This instance's id (the holder name in the control database).
    pub fn instance(&self) -> &str {
        &self.shared.instance
    }

    /// The outbox handle to produce through for the database `name` (its commits wake this
    /// instance's fast path for that database); `None` if the set has no such database.
    pub fn outbox(&self, name: &str) -> Option<Outbox> {
        self.shared.tenant(name).map(|t| t.outbox.clone())
    }

    /// The connection of the database `name`.
    pub fn database(&self, name: &str) -> Option<DatabaseConnection> {
        self.shared.tenant(name).map(|t| t.db.clone())
    }

    /// The external inbox of the database `name` (webhooks and other systems' messages for
    /// that tenant).
    pub fn external_inbox(&self, name: &str) -> Option<ExternalInbox> {
        self.shared.tenant(name).map(|t| t.external_inbox())
    }

    /// The names of the databases served now.
    pub fn databases(&self) -> Vec<String> {
        self.shared.database_names()
    }

    /// The databases of the set not served because their server's connections would exceed
    /// the budget ([`FleetBuilder::connections_per_server`]), each with why; tried again at
    /// every refresh.
    pub fn refused(&self) -> Vec<(String, String)> {
        self.shared
            .refused
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(name, why)| (name.clone(), why.clone()))
            .collect()
    }

    /// The databases this instance owns now.
    pub fn owned(&self) -> Vec<String> {
        self.shared
            .tenants()
            .iter()
            .filter(|t| t.is_owner())
            .map(|t| t.name.clone())
            .collect()
    }

    /// Every database's owner, read from the control database now.
    pub async fn owners(&self) -> Result<Vec<DatabaseOwner>, DbErr> {
        let names = self.databases();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        owners(&self.shared.control, &self.shared.group, &names).await
    }

    /// Each loop's health: the fleet's, the dispatchers', and every database's loops run here.
    pub fn health(&self) -> Health {
        let mut loops: Vec<_> = self.tasks.iter().map(|(h, _)| h.report()).collect();
        for tenant in self.shared.tenants() {
            loops.extend(tenant.health());
        }
        Health { loops }
    }

    /// Stop: every database's loops end (claims handed back), this instance's leases and
    /// heartbeat are given up so the others take its databases over at once.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        crate::runtime::join(self.tasks).await;
        tracing::info!(instance = %self.shared.instance, "outbox fleet stopped");
    }
}

/// Who owns each of `databases` in the fleet `group` (its CloudEvents source unless named
/// otherwise), read from the control database.
pub async fn owners(
    control: &DatabaseConnection,
    group: &str,
    databases: &[&str],
) -> Result<Vec<DatabaseOwner>, DbErr> {
    let names = Names::new(group);
    let membership = members::read(control, &names).await?;
    Ok(databases
        .iter()
        .map(|database| {
            let lease = membership.leases.get(&names.database(database));
            DatabaseOwner {
                database: (*database).to_owned(),
                owner: membership.owner(&names, database).map(str::to_owned),
                until: lease.map(|(_, until, _)| *until),
            }
        })
        .collect())
}

/// The live instances of the fleet `group`, read from the control database.
pub async fn instances(control: &DatabaseConnection, group: &str) -> Result<Vec<String>, DbErr> {
    Ok(members::read(control, &Names::new(group)).await?.instances)
}
