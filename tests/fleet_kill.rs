//! Many databases, many instances, as processes: three instances of a service (copies of this
//! binary) serve twelve tenant databases, PostgreSQL and MariaDB alternating, through one fleet
//! (`outbox::fleet`) whose set is a tenants table in a control database, on Kafka (whose
//! partitions keep a cart's messages on one instance, so order holds across instances).
//!
//! The supervisor commits events to every tenant all the time (carts of lines, each line's
//! sequence number rising per cart) while it:
//!
//! - SIGKILLs a random instance 2 to 10 s after the last one came back and starts it again 0.5
//!   to 3 s later (a new process with a new instance id, as a rescheduled pod would be);
//! - adds two databases to the tenants table, and later drains one and removes it.
//!
//! It watches the control database every 100 ms (`fleet::owners`) and measures, for every
//! database, how long it had no live owner: from a kill until another instance (or the
//! restarted one) holds the database's lease, from a new database's arrival until its first
//! owner, and during a hand-over to a joining instance. It checks afterwards:
//!
//! - every tenant's events were handled exactly once, in that tenant's database (the handler
//!   records the database `EventMeta::database` names), in sequence order per cart; nothing is
//!   left PENDING in any outbox or short of DONE in any inbox;
//! - every database had a live owner again within the lease (3 s) and the heartbeat's tick after
//!   a kill, with room for a loaded machine (the figure is printed);
//! - once no instance has died for a while, every instance owns within one database of even.
//!
//! Figures (kills, the longest gap by cause, the spread) are printed and written as JSON to
//! `OUTBOX_FLEET_REPORT` (default `target/fleet-kill-report.json`). Longer runs:
//! `OUTBOX_FLEET_SECS=600 cargo test --features postgres,mysql,kafka,test-util --test fleet_kill`.
//!
//! A binary of its own (`harness = false`, outside `tests/it`): it runs copies of itself as the
//! instances and kills them, which may not happen to the other tests' process.

#[path = "it/common/mod.rs"]
mod common;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::carts::{LineAdded, record_in_database};
use common::{Backend, TestDb, connect, effects, inbox_rows, test_db};
use outbox::fleet::{DatabaseSource, FleetDatabase, SourceError};
use outbox::prelude::*;
use outbox::relay::RelayConfig;
use outbox::runtime::Runtime;
use outbox::sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use outbox::transport::kafka::KafkaTransport;

const ROLE: &str = "OUTBOX_FLEET_ROLE";
const CONTROL: &str = "OUTBOX_FLEET_CONTROL";
const NAMESPACE: &str = "OUTBOX_FLEET_NS";
const INSTANCE: &str = "OUTBOX_FLEET_INSTANCE";
const CONSUMER: &str = "fleet-kill";
const SOURCE: &str = "fleetkill";
const INSTANCES: usize = 3;
const DATABASES: usize = 12;
const LEASE: Duration = Duration::from_secs(3);
const HEARTBEAT: Duration = Duration::from_millis(500);
/// Room for a loaded machine beyond the lease and a heartbeat's tick: the instances are debug
/// builds sharing two cores with the databases, the broker and, in CI, the tests before them
/// (a run there saw 5.7 s with the other runs at 3.2–3.4 s).
const SLACK: Duration = Duration::from_secs(5);
const CARTS: u32 = 4;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Records the line with the database the handler was told it runs in.
#[inbox_handler(consumer = "fleet-kill")]
async fn handle(tx: &InboxTransaction, event: Event<LineAdded>) -> Result<(), HandlerError> {
    record_in_database(tx, &event).await
}

fn main() {
    if std::env::var(ROLE).is_ok() {
        return instance_main();
    }
    if !common::harness_selects("fleet_kill") {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    println!("\nrunning 1 test: fleet_kill");
    match runtime.block_on(supervise()) {
        Ok(true) => println!("test fleet_kill ... ok\n"),
        Ok(false) => println!("test fleet_kill ... skipped\n"),
        Err(failure) => {
            eprintln!("test fleet_kill ... FAILED\n{failure}");
            std::process::exit(101);
        }
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

fn env_secs(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------------
// An instance.

fn instance_main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = runtime.block_on(serve()) {
        eprintln!("instance {}: {e}", env(INSTANCE));
        std::process::exit(1);
    }
}

/// The tenants table of the control database, read again at every refresh; each tenant's
/// pool is opened once and dropped when the tenant leaves.
struct TenantsTable {
    control: DatabaseConnection,
    pools: tokio::sync::Mutex<BTreeMap<String, DatabaseConnection>>,
}

#[async_trait::async_trait]
impl DatabaseSource for TenantsTable {
    async fn databases(&self) -> Result<Vec<FleetDatabase>, SourceError> {
        let rows = self
            .control
            .query_all_raw(Statement::from_string(
                DbBackend::Postgres,
                "SELECT name, url FROM fleet_tenants ORDER BY name",
            ))
            .await?;
        let mut pools = self.pools.lock().await;
        let mut out = Vec::new();
        let mut listed = BTreeSet::new();
        for row in rows {
            let name: String = row.try_get("", "name")?;
            let url: String = row.try_get("", "url")?;
            if !pools.contains_key(&name) {
                pools.insert(name.clone(), connect(&url, 3).await?);
            }
            out.push(FleetDatabase::new(name.clone(), pools[&name].clone()));
            listed.insert(name);
        }
        pools.retain(|name, _| listed.contains(name));
        Ok(out)
    }
}

async fn serve() -> Result<(), BoxError> {
    let control = connect(&env(CONTROL), 4).await?;
    let transport = KafkaTransport::builder(kafka_bootstrap())
        .namespace(env(NAMESPACE))
        .partitions(6)
        .session_timeout(Duration::from_secs(3))
        .request_timeout(Duration::from_secs(5))
        .connect()
        .await?;
    let source = TenantsTable {
        control: control.clone(),
        pools: Default::default(),
    };
    let fleet = Runtime::builder(control)
        .source(SOURCE)
        .instance_id(env(INSTANCE))
        .transport(transport)
        .consumers([CONSUMER])
        .relay_config(RelayConfig::default().poll_interval(Duration::from_millis(200)))
        .metrics_interval(None)
        .databases(source)
        .heartbeat(HEARTBEAT)
        .lease(LEASE)
        .refresh(Duration::from_secs(1))
        .start()
        .await?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    term.recv().await;
    fleet.shutdown().await;
    Ok(())
}

fn kafka_bootstrap() -> String {
    std::env::var("OUTBOX_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

// ---------------------------------------------------------------------------------------------
// The supervisor.

/// Why a database had no live owner for a while.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum Cause {
    /// Its owner was killed.
    Kill,
    /// It joined the set.
    Added,
    /// Its owner handed it to another instance (one joined).
    Handover,
}

/// What the watcher knows and has seen.
#[derive(Default)]
struct Watch {
    /// The instance ids of the processes running now.
    alive: BTreeSet<String>,
    killed_at: BTreeMap<String, Instant>,
    /// The databases of the set now, with when each joined.
    set: BTreeMap<String, Instant>,
    /// The last live owner seen of each database.
    last_owner: BTreeMap<String, String>,
    /// Databases without a live owner: since when and why.
    unowned: BTreeMap<String, (Instant, Cause)>,
    /// Every gap that ended: database, cause, seconds.
    gaps: Vec<(String, Cause, f64)>,
    /// The last kill, restart or change of the set.
    last_change: Option<Instant>,
    /// Polls where every instance was running, nothing had changed for a while and every
    /// database was owned: the largest difference between two instances' counts.
    settled_polls: u64,
    settled_worst: usize,
    poll_errors: u64,
}

impl Watch {
    fn changed(&mut self) {
        self.last_change = Some(Instant::now());
    }

    /// One reading of the owners of the set's databases.
    fn observe(&mut self, owners: &[outbox::fleet::DatabaseOwner]) {
        let now = Instant::now();
        let mut counts: BTreeMap<String, usize> =
            self.alive.iter().map(|id| (id.clone(), 0)).collect();
        let mut all_owned = true;
        for o in owners {
            let live = o.owner.as_ref().filter(|id| self.alive.contains(*id));
            match live {
                Some(owner) => {
                    *counts.entry(owner.clone()).or_default() += 1;
                    if let Some((since, cause)) = self.unowned.remove(&o.database) {
                        let secs = now.duration_since(since).as_secs_f64();
                        self.gaps.push((o.database.clone(), cause, secs));
                    }
                    self.last_owner.insert(o.database.clone(), owner.clone());
                }
                None => {
                    all_owned = false;
                    if self.unowned.contains_key(&o.database) {
                        continue;
                    }
                    // A dead holder still named on the lease, or the last owner seen dead.
                    let dead = o
                        .owner
                        .clone()
                        .or_else(|| self.last_owner.get(&o.database).cloned())
                        .filter(|id| !self.alive.contains(id));
                    let entry = match dead.and_then(|id| self.killed_at.get(&id).copied()) {
                        Some(killed) => (killed, Cause::Kill),
                        None if !self.last_owner.contains_key(&o.database) => (
                            self.set.get(&o.database).copied().unwrap_or(now),
                            Cause::Added,
                        ),
                        None => (now, Cause::Handover),
                    };
                    self.unowned.insert(o.database.clone(), entry);
                }
            }
        }
        let quiet = self
            .last_change
            .is_none_or(|at| now.duration_since(at) > LEASE + Duration::from_secs(3));
        if quiet && all_owned && self.alive.len() == INSTANCES {
            let (min, max) = (
                counts.values().min().copied().unwrap_or(0),
                counts.values().max().copied().unwrap_or(0),
            );
            self.settled_polls += 1;
            self.settled_worst = self.settled_worst.max(max - min);
        }
    }

    fn longest(&self, cause: Cause) -> Option<(String, f64)> {
        self.gaps
            .iter()
            .filter(|(_, c, _)| *c == cause)
            .max_by(|a, b| a.2.total_cmp(&b.2))
            .map(|(db, _, secs)| (db.clone(), *secs))
    }
}

/// One instance slot: its process and how many lives it has had.
struct Slot {
    child: Option<Child>,
    id: String,
    lives: u32,
}

struct Harness {
    exe: PathBuf,
    dir: PathBuf,
    control_url: String,
    namespace: String,
    slots: Vec<Slot>,
    watch: Arc<Mutex<Watch>>,
    kills: u32,
}

impl Harness {
    fn spawn(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        slot.lives += 1;
        slot.id = format!("pod-{i}.{}", slot.lives);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("pod-{i}.log")))
            .expect("instance log");
        let child = Command::new(&self.exe)
            .env(ROLE, "instance")
            .env(CONTROL, &self.control_url)
            .env(NAMESPACE, &self.namespace)
            .env(INSTANCE, &slot.id)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .expect("start an instance");
        slot.child = Some(child);
        let mut watch = self.watch.lock().unwrap();
        watch.alive.insert(slot.id.clone());
        watch.changed();
    }

    fn sigkill(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        if let Some(mut child) = slot.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            self.kills += 1;
            let mut watch = self.watch.lock().unwrap();
            watch.alive.remove(&slot.id);
            watch.killed_at.insert(slot.id.clone(), Instant::now());
            watch.changed();
        }
    }

    /// An instance that died on its own is a failure: say which and show its log.
    fn check_alive(&mut self) -> Result<(), String> {
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if let Some(child) = &mut slot.child
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!(
                    "{} exited on its own ({status}):\n{}",
                    slot.id,
                    tail(&self.dir.join(format!("pod-{i}.log")))
                ));
            }
        }
        Ok(())
    }

    fn terminate_all(&mut self) {
        let children = self.slots.iter_mut().filter_map(|s| s.child.take());
        common::terminate(children.collect(), Duration::from_secs(20));
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        for slot in &mut self.slots {
            if let Some(mut child) = slot.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// The tenants the producer commits to, with the next sequence number of each and how many
/// events each has committed.
#[derive(Default)]
struct Production {
    active: BTreeMap<String, DatabaseConnection>,
    next_seq: BTreeMap<String, u32>,
    committed: BTreeMap<String, usize>,
}

/// One round: a transaction per active tenant, one line for each cart.
async fn produce_round(production: &Mutex<Production>, outbox: &Outbox) -> Result<(), String> {
    let active: Vec<(String, DatabaseConnection, u32)> = {
        let p = production.lock().unwrap();
        p.active
            .iter()
            .map(|(name, db)| (name.clone(), db.clone(), p.next_seq[name]))
            .collect()
    };
    for (name, db, seq) in active {
        let tx = outbox.begin(&db).await.map_err(|e| e.to_string())?;
        for cart in 0..CARTS {
            tx.enqueue(&LineAdded {
                cart: format!("cart-{cart}"),
                seq,
            })
            .map_err(|e| e.to_string())?;
        }
        let _ = tx.commit().await.map_err(|e| format!("{name}: {e}"))?;
        let mut p = production.lock().unwrap();
        *p.next_seq.get_mut(&name).unwrap() += 1;
        *p.committed.entry(name).or_default() += CARTS as usize;
    }
    Ok(())
}

async fn set_tenant(control: &DatabaseConnection, name: &str, url: Option<&str>) {
    let statement = match url {
        Some(url) => Statement::from_sql_and_values(
            DbBackend::Postgres,
            "INSERT INTO fleet_tenants (name, url) VALUES ($1, $2)",
            [name.into(), url.into()],
        ),
        None => Statement::from_sql_and_values(
            DbBackend::Postgres,
            "DELETE FROM fleet_tenants WHERE name = $1",
            [name.into()],
        ),
    };
    control.execute_raw(statement).await.expect("tenants table");
}

/// A tenant joins the set: a row of the tenants table, watched from now, produced to.
async fn join(
    control: &DatabaseConnection,
    watch: &Mutex<Watch>,
    production: &Mutex<Production>,
    name: &str,
    t: &TestDb,
) {
    set_tenant(control, name, Some(&t.url)).await;
    watch
        .lock()
        .unwrap()
        .set
        .insert(name.to_owned(), Instant::now());
    let mut p = production.lock().unwrap();
    p.active.insert(name.to_owned(), t.db.clone());
    p.next_seq.insert(name.to_owned(), 0);
}

async fn supervise() -> Result<bool, String> {
    let Some(control) = test_db(Backend::Postgres, "fleetkill_control").await else {
        return Ok(false);
    };
    let mut tenants: Vec<(String, TestDb)> = Vec::new();
    for i in 0..DATABASES + 2 {
        let backend = if i % 2 == 0 {
            Backend::Postgres
        } else {
            Backend::MySql
        };
        let Some(t) = test_db(backend, &format!("fleetkill_t{i}")).await else {
            return Ok(false);
        };
        tenants.push((format!("tenant-{i:02}"), t));
    }
    let namespace = common::fresh_namespace("fleetkill");
    let bootstrap = kafka_bootstrap();
    let reachable = KafkaTransport::builder(bootstrap.clone())
        .namespace(namespace.clone())
        .partitions(6)
        .connect();
    if common::connect_or_skip("Kafka", &bootstrap, "fleet_kill", reachable)
        .await
        .is_none()
    {
        return Ok(false);
    }
    control
        .db
        .execute_unprepared("CREATE TABLE fleet_tenants (name TEXT PRIMARY KEY, url TEXT NOT NULL)")
        .await
        .map_err(|e| e.to_string())?;
    let production = Arc::new(Mutex::new(Production::default()));
    let watch = Arc::new(Mutex::new(Watch::default()));
    for (name, t) in &tenants[..DATABASES] {
        join(&control.db, &watch, &production, name, t).await;
    }
    let dir = std::env::temp_dir().join(format!("outbox-fleet-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut h = Harness {
        exe: std::env::current_exe().map_err(|e| e.to_string())?,
        dir,
        control_url: control.url.clone(),
        namespace,
        slots: (0..INSTANCES)
            .map(|_| Slot {
                child: None,
                id: String::new(),
                lives: 0,
            })
            .collect(),
        watch: watch.clone(),
        kills: 0,
    };
    for i in 0..INSTANCES {
        h.spawn(i);
    }
    let started = Instant::now();

    // The watcher: every 100 ms, who owns what.
    let watcher = {
        let (watch, control) = (watch.clone(), control.db.clone());
        tokio::spawn(async move {
            loop {
                let names: Vec<String> = watch.lock().unwrap().set.keys().cloned().collect();
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                match outbox::fleet::owners(&control, SOURCE, &names).await {
                    Ok(owners) => watch.lock().unwrap().observe(&owners),
                    Err(_) => watch.lock().unwrap().poll_errors += 1,
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let result = run(&mut h, &control, &tenants, &production, &watch, started).await;
    watcher.abort();
    h.terminate_all();
    let report = result?;
    let left = common::eventually(Duration::from_secs(10), || async {
        outbox::fleet::instances(&control.db, SOURCE)
            .await
            .is_ok_and(|i| i.is_empty())
    })
    .await;
    if !left {
        return Err("instances stopped with SIGTERM kept their heartbeat rows".into());
    }
    let path = std::env::var("OUTBOX_FLEET_REPORT")
        .unwrap_or_else(|_| "target/fleet-kill-report.json".to_owned());
    let _ = std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap());
    Ok(true)
}

/// Owned by live instances, within one of even.
async fn even(
    control: &DatabaseConnection,
    watch: &Mutex<Watch>,
) -> Option<BTreeMap<String, usize>> {
    let (names, alive) = {
        let w = watch.lock().unwrap();
        (w.set.keys().cloned().collect::<Vec<_>>(), w.alive.clone())
    };
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let owners = outbox::fleet::owners(control, SOURCE, &names).await.ok()?;
    let mut counts: BTreeMap<String, usize> = alive.iter().map(|id| (id.clone(), 0)).collect();
    for o in owners {
        let owner = o.owner.filter(|id| alive.contains(id))?;
        *counts.get_mut(&owner)? += 1;
    }
    let (min, max) = (counts.values().min()?, counts.values().max()?);
    (max - min <= 1).then_some(counts)
}

/// Within a minute, the spread once it is within one of even (`None` if it never was); an
/// instance that died on its own is a failure.
async fn spread_evenly(
    h: &mut Harness,
    control: &DatabaseConnection,
    watch: &Mutex<Watch>,
) -> Result<Option<BTreeMap<String, usize>>, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        h.check_alive()?;
        if let Some(counts) = even(control, watch).await {
            return Ok(Some(counts));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(None)
}

async fn run(
    h: &mut Harness,
    control: &TestDb,
    tenants: &[(String, TestDb)],
    production: &Arc<Mutex<Production>>,
    watch: &Arc<Mutex<Watch>>,
    started: Instant,
) -> Result<serde_json::Value, String> {
    let first = spread_evenly(h, &control.db, watch)
        .await?
        .ok_or_else(|| "the twelve databases were never spread evenly".to_owned())?;
    let first_spread = started.elapsed();
    println!("fleet_kill: 12 databases owned {first:?} after {first_spread:.1?}");

    // Producers: a round of transactions every 250 ms until told to stop.
    let producing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let producer = {
        let (production, producing) = (production.clone(), producing.clone());
        tokio::spawn(async move {
            let outbox = Outbox::new(SOURCE);
            while producing.load(std::sync::atomic::Ordering::Relaxed) {
                produce_round(&production, &outbox).await?;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Ok::<(), String>(())
        })
    };

    // Kills, restarts and changes of the set.
    let seconds = env_secs("OUTBOX_FLEET_SECS", 45);
    let end = Instant::now() + Duration::from_secs(seconds);
    let (add_at, remove_at) = (
        Instant::now() + Duration::from_secs(seconds / 4),
        Instant::now() + Duration::from_secs(seconds / 2),
    );
    let (mut added, mut removed) = (false, None::<String>);
    let mut next_kill = Instant::now() + Duration::from_millis(fastrand::u64(2000..10_000));
    let mut restart: Option<(usize, Instant)> = None;
    while Instant::now() < end {
        h.check_alive()?;
        let now = Instant::now();
        if let Some((i, at)) = restart
            && now >= at
        {
            h.spawn(i);
            restart = None;
            next_kill = now + Duration::from_millis(fastrand::u64(2000..10_000));
        }
        if restart.is_none() && now >= next_kill {
            let i = fastrand::usize(0..INSTANCES);
            h.sigkill(i);
            restart = Some((i, now + Duration::from_millis(fastrand::u64(500..3000))));
        }
        if !added && now >= add_at {
            for (name, t) in &tenants[DATABASES..] {
                join(&control.db, watch, production, name, t).await;
            }
            watch.lock().unwrap().changed();
            added = true;
        }
        if removed.is_none() && now >= remove_at {
            // Drained first: no new event, everything committed handled, then out of the set.
            let (name, t) = &tenants[3];
            production.lock().unwrap().active.remove(name);
            let want = production.lock().unwrap().committed[name];
            let drained = common::eventually(Duration::from_secs(60), || async {
                effects(&t.db).await.len() >= want
            })
            .await;
            if !drained {
                return Err(format!("{name} did not drain before its removal"));
            }
            {
                let mut w = watch.lock().unwrap();
                w.set.remove(name);
                w.unowned.remove(name);
                w.changed();
            }
            set_tenant(&control.db, name, None).await;
            removed = Some(name.clone());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    producing.store(false, std::sync::atomic::Ordering::Relaxed);
    producer
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("producer: {e}"))?;
    if let Some((i, _)) = restart {
        h.spawn(i);
    }
    let produced_for = started.elapsed();

    // Every instance back: the set spreads evenly again.
    let spread = spread_evenly(h, &control.db, watch).await?.ok_or_else(|| {
        format!(
            "not spread within one of even after the last restart; alive {:?}",
            watch.lock().unwrap().alive
        )
    })?;

    // Everything handled, once, in its own database, in order per cart.
    let committed = production.lock().unwrap().committed.clone();
    let mut handled_total = 0;
    for (name, t) in tenants {
        let want = committed.get(name).copied().unwrap_or(0);
        let deadline = Instant::now() + Duration::from_secs(120);
        while effects(&t.db).await.len() < want && Instant::now() < deadline {
            h.check_alive()?;
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let effects = effects(&t.db).await;
        if effects.len() != want {
            return Err(format!(
                "{name}: {} of {want} events handled",
                effects.len()
            ));
        }
        handled_total += want;
        let mut by_cart: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
        for e in &effects {
            let (database, cart) = e.cart.split_once('|').unwrap_or(("", &e.cart));
            if database != name {
                return Err(format!("{name}: an event handled as {database:?}'s"));
            }
            by_cart.entry(cart).or_default().push(e.seq);
        }
        for (cart, seqs) in by_cart {
            if seqs != (0..seqs.len() as i64).collect::<Vec<_>>() {
                return Err(format!("{name}/{cart}: out of order or doubled: {seqs:?}"));
            }
        }
        let open = inbox_rows(&t.db, CONSUMER)
            .await
            .into_iter()
            .filter(|r| r.status != "DONE")
            .count();
        let pending: i64 = common::status_counts(&t.db)
            .await
            .iter()
            .filter(|(status, _)| *status != "SENT")
            .map(|(_, n)| n)
            .sum();
        if open > 0 || pending > 0 {
            return Err(format!(
                "{name}: {open} inbox rows short of DONE, {pending} outbox events not SENT"
            ));
        }
    }

    let w = watch.lock().unwrap();
    let (kill_db, kill_gap) = w.longest(Cause::Kill).unwrap_or_default();
    let bound = LEASE + HEARTBEAT + SLACK;
    let figure = |cause| {
        w.longest(cause)
            .map(|(db, secs)| format!("{secs:.2} s ({db})"))
            .unwrap_or_else(|| "-".into())
    };
    println!("fleet_kill: {INSTANCES} instances, {DATABASES} databases + 2 added − 1 removed");
    println!(
        "  produced for          {produced_for:.1?}, {handled_total} events handled once, in order"
    );
    println!("  SIGKILLs              {}", h.kills);
    println!(
        "  gaps after a kill     {} (longest {}; lease {LEASE:?}, heartbeat {HEARTBEAT:?})",
        w.gaps.iter().filter(|g| g.1 == Cause::Kill).count(),
        figure(Cause::Kill)
    );
    println!("  longest hand-over     {}", figure(Cause::Handover));
    println!("  first owner of added  {}", figure(Cause::Added));
    println!(
        "  settled polls         {} (worst spread {} apart), final {spread:?}",
        w.settled_polls, w.settled_worst
    );
    if h.kills == 0 {
        return Err("no instance was killed".into());
    }
    if kill_gap > bound.as_secs_f64() {
        return Err(format!(
            "{kill_db} had no live owner for {kill_gap:.2} s after a kill (bound {bound:?})"
        ));
    }
    if let Some((db, secs)) = w.longest(Cause::Handover)
        && secs > bound.as_secs_f64()
    {
        return Err(format!("{db} had no owner for {secs:.2} s in a hand-over"));
    }
    if w.settled_worst > 1 {
        return Err(format!(
            "a settled fleet was {} databases apart from even",
            w.settled_worst
        ));
    }
    Ok(serde_json::json!({
        "instances": INSTANCES,
        "databases": DATABASES,
        "added": 2,
        "removed": 1,
        "lease_secs": LEASE.as_secs_f64(),
        "heartbeat_secs": HEARTBEAT.as_secs_f64(),
        "produced_secs": produced_for.as_secs_f64(),
        "events_handled": handled_total,
        "sigkills": h.kills,
        "longest_gap_after_kill_secs": kill_gap,
        "longest_handover_secs": w.longest(Cause::Handover).map(|g| g.1),
        "first_owner_of_added_secs": w.longest(Cause::Added).map(|g| g.1),
        "gaps": w.gaps.iter().map(|(db, cause, secs)| serde_json::json!({"database": db, "cause": cause, "secs": secs})).collect::<Vec<_>>(),
        "settled_polls": w.settled_polls,
        "settled_worst_spread": w.settled_worst,
        "final_spread": spread,
        "poll_errors": w.poll_errors,
    }))
}
