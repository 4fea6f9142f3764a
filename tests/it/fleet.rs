//! One runtime over a set of databases (`outbox::fleet`): three instances serve six tenant
//! databases (PostgreSQL and MariaDB mixed) through Kafka (whose partitions keep an aggregate's
//! messages on one instance, so order holds across instances), each tenant's events handled
//! in that tenant's database; the background work is spread evenly, moves when an instance is
//! killed (its runtime dropped without a goodbye) and comes back when it returns; databases are
//! added and removed while it runs. Every tenant's events are handled exactly once, in order per
//! aggregate.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::common::carts::{LineAdded, record_in_database};
use crate::common::*;
use outbox::fleet::{DatabaseSource, Fleet, FleetDatabase, SourceError};
use outbox::prelude::*;
use outbox::relay::RelayConfig;
use outbox::runtime::Runtime;
use outbox::transport::kafka::KafkaTransport;
use sea_orm::DatabaseConnection;

const CONSUMER: &str = "t-fleet";

async fn kafka(namespace: &str) -> Option<KafkaTransport> {
    crate::rebalance::kafka_for("fleet", namespace).await
}

/// Records the line with the database the handler was told it runs in.
#[inbox_handler(consumer = "t-fleet")]
async fn handle(tx: &InboxTransaction, event: Event<LineAdded>) -> Result<(), HandlerError> {
    record_in_database(tx, &event).await
}

/// The tenants' list (names and URLs, shared like a tenants table), read by each instance
/// through a source of its own that connects to each database once, on the instance's runtime.
#[derive(Clone, Default)]
struct Tenants(Arc<Mutex<Vec<(String, String)>>>);

impl Tenants {
    fn add(&self, name: &str, url: &str) {
        self.0
            .lock()
            .unwrap()
            .push((name.to_owned(), url.to_owned()));
    }

    fn remove(&self, name: &str) {
        self.0.lock().unwrap().retain(|(n, _)| n != name);
    }

    fn names(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(n, _)| n.clone())
            .collect()
    }
}

struct Connecting {
    tenants: Tenants,
    pools: tokio::sync::Mutex<BTreeMap<String, DatabaseConnection>>,
}

#[async_trait::async_trait]
impl DatabaseSource for Connecting {
    async fn databases(&self) -> Result<Vec<FleetDatabase>, SourceError> {
        let list = self.tenants.0.lock().unwrap().clone();
        let mut pools = self.pools.lock().await;
        let mut out = Vec::new();
        for (name, url) in list {
            if !pools.contains_key(&name) {
                pools.insert(name.clone(), connect(&url, 3).await?);
            }
            out.push(FleetDatabase::new(name.clone(), pools[&name].clone()));
        }
        Ok(out)
    }
}

/// An instance on a tokio runtime of its own: dropping the runtime kills it (no shutdown, no
/// lease given back), as a SIGKILL would.
struct Instance {
    runtime: Option<tokio::runtime::Runtime>,
    fleet: Option<Fleet>,
}

impl Instance {
    async fn start(id: &str, control: &str, tenants: &Tenants, namespace: &str) -> Instance {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (id, control, namespace) = (id.to_owned(), control.to_owned(), namespace.to_owned());
        let source = Connecting {
            tenants: tenants.clone(),
            pools: Default::default(),
        };
        let fleet = runtime
            .spawn(async move {
                let control = connect(&control, 4).await.unwrap();
                let kafka = kafka(&namespace).await.expect("Kafka");
                Runtime::builder(control)
                    .source("fleet")
                    .instance_id(id)
                    .transport(kafka)
                    .consumers([CONSUMER])
                    .relay_config(RelayConfig::default().poll_interval(Duration::from_millis(200)))
                    .metrics_interval(None)
                    .databases(source)
                    .heartbeat(Duration::from_millis(300))
                    .lease(Duration::from_secs(2))
                    .refresh(Duration::from_millis(500))
                    .start()
                    .await
                    .unwrap()
            })
            .await
            .unwrap();
        Instance {
            runtime: Some(runtime),
            fleet: Some(fleet),
        }
    }

    fn fleet(&self) -> &Fleet {
        self.fleet.as_ref().unwrap()
    }

    /// Killed: its tasks stop where they are; its leases expire.
    fn kill(mut self) {
        std::mem::forget(self.fleet.take());
        self.runtime.take().unwrap().shutdown_background();
    }

    async fn shutdown(mut self) {
        let fleet = self.fleet.take().unwrap();
        let runtime = self.runtime.take().unwrap();
        runtime.spawn(fleet.shutdown()).await.unwrap();
        runtime.shutdown_background();
    }
}

/// Lines for `carts` carts of `database`, `per_cart` each, committed through `outbox` a few per
/// transaction; returns how many.
async fn produce(
    db: &DatabaseConnection,
    outbox: &Outbox,
    carts: u32,
    seqs: std::ops::Range<u32>,
) -> usize {
    let mut n = 0;
    for seq in seqs {
        let tx = outbox.begin(db).await.unwrap();
        for cart in 0..carts {
            tx.enqueue(&LineAdded {
                cart: format!("cart-{cart}"),
                seq,
            })
            .unwrap();
            n += 1;
        }
        let _ = tx.commit().await.unwrap();
    }
    n
}

/// The owners of every database as the control database says, and how many each instance has.
async fn spread(control: &DatabaseConnection, names: &[String]) -> BTreeMap<String, usize> {
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut counts = BTreeMap::new();
    for owner in outbox::fleet::owners(control, "fleet", &names)
        .await
        .unwrap()
    {
        *counts
            .entry(owner.owner.unwrap_or_else(|| "-".into()))
            .or_default() += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_six_databases_through_kills_and_changes() {
    let Some(control) = test_db(Backend::Postgres, "fleet_control").await else {
        return;
    };
    let mut tenants = Vec::new();
    for i in 0..7 {
        let backend = if i % 2 == 0 {
            Backend::Postgres
        } else {
            Backend::MySql
        };
        let Some(t) = test_db(backend, &format!("fleet_t{i}")).await else {
            return;
        };
        tenants.push((format!("tenant-{i}"), t));
    }
    let namespace = fresh_namespace("fleet");
    if kafka(&namespace).await.is_none() {
        return;
    }
    // Six databases at start; the seventh joins later.
    let set = Tenants::default();
    for (name, t) in &tenants[..6] {
        set.add(name, &t.url);
    }
    let mut instances = vec![
        Instance::start("pod-a", &control.url, &set, &namespace).await,
        Instance::start("pod-b", &control.url, &set, &namespace).await,
        Instance::start("pod-c", &control.url, &set, &namespace).await,
    ];
    let names: Vec<String> = set.names();
    let even = eventually(Duration::from_secs(20), || async {
        spread(&control.db, &names).await.values().all(|n| *n == 2)
            && spread(&control.db, &names).await.len() == 3
    })
    .await;
    assert!(
        even,
        "two databases each: {:?}",
        spread(&control.db, &names).await
    );
    let known = eventually(Duration::from_secs(5), || async {
        instances
            .iter()
            .map(|i| i.fleet().owned().len())
            .sum::<usize>()
            == 6
    })
    .await;
    assert!(known, "each instance knows what it owns");

    // Producers on every tenant: through an instance's handle (its fast path) and through a
    // plain handle (the owner's claim loop).
    let plain = Outbox::new("fleet");
    let mut expected: BTreeMap<String, usize> = BTreeMap::new();
    for (i, (name, t)) in tenants[..6].iter().enumerate() {
        let handle = instances[i % 3].fleet().outbox(name).expect("served");
        *expected.entry(name.clone()).or_default() += produce(&t.db, &handle, 4, 0..5).await;
        *expected.entry(name.clone()).or_default() += produce(&t.db, &plain, 4, 5..10).await;
    }

    // Kill pod-c: its two databases move to the others within the lease (2 s) and a heartbeat.
    let killed = instances.pop().unwrap();
    killed.kill();
    let killed_at = std::time::Instant::now();
    for (name, t) in &tenants[..6] {
        *expected.entry(name.clone()).or_default() += produce(&t.db, &plain, 4, 10..15).await;
    }
    let moved = eventually(Duration::from_secs(15), || async {
        let counts = spread(&control.db, &names).await;
        counts.get("pod-a") == Some(&3) && counts.get("pod-b") == Some(&3)
    })
    .await;
    let gap = killed_at.elapsed();
    assert!(
        moved,
        "the killed instance's databases moved: {:?}",
        spread(&control.db, &names).await
    );
    println!("fleet: databases owned again {gap:?} after the kill (lease 2 s)");

    // A database joins, another leaves.
    let (added, added_db) = (&tenants[6].0, &tenants[6].1);
    set.add(added, &added_db.url);
    set.remove("tenant-5");
    let names: Vec<String> = set.names();
    let served = eventually(Duration::from_secs(10), || async {
        instances
            .iter()
            .all(|i| i.fleet().outbox(added).is_some() && i.fleet().outbox("tenant-5").is_none())
    })
    .await;
    assert!(served, "every instance serves the new set");
    *expected.entry(added.clone()).or_default() += produce(&added_db.db, &plain, 4, 0..10).await;

    // pod-c comes back and gets its share again.
    instances.push(Instance::start("pod-c", &control.url, &set, &namespace).await);
    let back = eventually(Duration::from_secs(20), || async {
        let counts = spread(&control.db, &names).await;
        counts.len() == 3 && counts.values().all(|n| *n == 2)
    })
    .await;
    assert!(
        back,
        "the returning instance got its share: {:?}",
        spread(&control.db, &names).await
    );

    // Every tenant's events handled once, in its own database, in order per cart.
    for (name, t) in tenants.iter().filter(|(n, _)| n != "tenant-5") {
        let want = expected[name];
        let done = eventually(Duration::from_secs(60), || async {
            effects(&t.db).await.len() >= want
        })
        .await;
        let effects = effects(&t.db).await;
        assert!(done, "{name}: {} of {want} handled", effects.len());
        assert_eq!(effects.len(), want, "{name}: each event handled once");
        let mut by_cart: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
        for e in &effects {
            let (database, cart) = e.cart.split_once('|').unwrap();
            assert_eq!(database, name, "handled in its own database and told so");
            by_cart.entry(cart).or_default().push(e.seq);
        }
        for (cart, seqs) in by_cart {
            let sorted = (0..seqs.len() as i64).collect::<Vec<_>>();
            assert_eq!(seqs, sorted, "{name}/{cart}: in order, once each");
        }
        let rows = inbox_rows(&t.db, CONSUMER).await;
        assert!(
            rows.iter().all(|r| r.status == "DONE"),
            "{name}: inbox all DONE"
        );
    }
    // tenant-5 left the set: what was committed before stays in it, handled or not.
    for instance in instances {
        instance.shutdown().await;
    }
    let left = eventually(Duration::from_secs(5), || async {
        outbox::fleet::instances(&control.db, "fleet")
            .await
            .unwrap()
            .is_empty()
    })
    .await;
    assert!(left, "every instance gave its heartbeat up at shutdown");
}

/// A message from a service over one database names no database: with a default database it
/// is handled there; the handler is told which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_naming_no_database_go_to_the_default_one() {
    let (Some(control), Some(tenant), Some(single)) = (
        test_db(Backend::Postgres, "fleet_default_control").await,
        test_db(Backend::MySql, "fleet_default_tenant").await,
        test_db(Backend::Postgres, "fleet_default_single").await,
    ) else {
        return;
    };
    let namespace = fresh_namespace("fleet_default");
    let Some(transport) = kafka(&namespace).await else {
        return;
    };
    let tenants = Tenants::default();
    tenants.add("acme", &tenant.url);
    let fleet = Runtime::builder(control.db.clone())
        .source("fleet")
        .transport(transport.clone())
        .consumers([CONSUMER])
        .metrics_interval(None)
        .databases(Connecting {
            tenants,
            pools: Default::default(),
        })
        .default_database("acme")
        .start()
        .await
        .unwrap();
    // The producing service runs over one database: its envelopes carry no `tenant`.
    let producer = Runtime::builder(single.db.clone())
        .source("single")
        .transport(transport)
        .consumers(Vec::<String>::new())
        .start()
        .await
        .unwrap();
    let n = produce(&single.db, producer.outbox(), 2, 0..3).await;
    let handled = eventually(Duration::from_secs(60), || async {
        effects(&tenant.db).await.len() >= n
    })
    .await;
    let effects = effects(&tenant.db).await;
    assert!(
        handled,
        "{} of {n} handled in the default database",
        effects.len()
    );
    assert_eq!(effects.len(), n);
    assert!(
        effects.iter().all(|e| e.cart.starts_with("acme|")),
        "told which database"
    );
    assert!(
        inbox_rows(&control.db, CONSUMER).await.is_empty(),
        "nothing kept in the control database"
    );
    producer.shutdown().await;
    fleet.shutdown().await;
}
