//! A set of databases whose owners stream their write-ahead log (`FleetDatabase::wal`, on the
//! PostgreSQL cluster with `wal_level = logical`): each database's owner reads that database's
//! slot and publishes what was committed there; when the database changes owner, the slot goes
//! with it; every event is published once.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use crate::common::carts::*;
use crate::common::*;
use outbox::fleet::{Fleet, FleetDatabase};
use outbox::prelude::*;
use outbox::relay::{RelayConfig, WalConfig};
use outbox::runtime::Runtime;
use outbox::store;
use outbox::transport::memory::MemoryTransport;

/// Slots are the cluster's: named after the test and the database.
fn slot(database: &str) -> String {
    format!("outbox_t_fleet_wal_{database}")
}

/// The set: each database with its own slot. With a long grace the claim loop beside the
/// stream never takes a row the stream could have published: what is SENT within seconds, a
/// stream published.
fn set(tenants: &[(&str, &TestDb)]) -> Vec<FleetDatabase> {
    tenants
        .iter()
        .map(|(name, t)| {
            FleetDatabase::new(*name, t.db.clone()).wal(
                WalConfig::new(t.url.clone())
                    .slot(slot(name))
                    .table_grace(Duration::from_secs(60)),
            )
        })
        .collect()
}

async fn instance(
    id: &str,
    control: &TestDb,
    transport: &MemoryTransport,
    tenants: &[(&str, &TestDb)],
) -> Fleet {
    Runtime::builder(control.db.clone())
        .source("fleet-wal")
        .instance_id(id)
        .transport(Arc::new(transport.clone()))
        .consumers(Vec::<String>::new())
        .relay_config(
            RelayConfig::default()
                .poll_interval(Duration::from_millis(100))
                .listen(false),
        )
        .metrics_interval(None)
        .databases(set(tenants))
        .heartbeat(Duration::from_millis(300))
        .lease(Duration::from_secs(2))
        .start()
        .await
        .unwrap()
}

/// Which instance streams each database's slot, by the slot's replication connection's name
/// being live (`active`) and the owner the control database names.
async fn streaming(fleet: &Fleet, tenants: &[(&str, &TestDb)]) -> BTreeMap<String, String> {
    let owners = fleet.owners().await.unwrap_or_default();
    let mut out = BTreeMap::new();
    for (name, t) in tenants {
        let active = store::wal::slot(&t.db, &slot(name))
            .await
            .ok()
            .flatten()
            .is_some_and(|s| s.active);
        let owner = owners
            .iter()
            .find(|o| o.database == *name)
            .and_then(|o| o.owner.clone());
        if let (true, Some(owner)) = (active, owner) {
            out.insert((*name).to_owned(), owner);
        }
    }
    out
}

/// Lines committed through a plain handle (no fast path: only a stream or the claim loop
/// publishes them).
async fn commit_many(t: &TestDb, carts: &[&str], seqs: std::ops::Range<u32>) -> usize {
    let outbox = Outbox::new("fleet-wal");
    let mut n = 0;
    for seq in seqs {
        let lines: Vec<(&str, u32)> = carts.iter().map(|c| (*c, seq)).collect();
        commit_lines(outbox.begin(&t.db).await.unwrap(), &lines).await;
        n += lines.len();
    }
    n
}

async fn all_sent_soon(t: &TestDb) -> bool {
    eventually(Duration::from_secs(15), || async {
        let counts = status_counts(&t.db).await;
        counts.keys().all(|s| s == "SENT")
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_stream_each_databases_wal_and_the_slot_moves_with_the_database() {
    let (Some(control), Some(acme), Some(globex)) = (
        test_db(Backend::Postgres, "fleet_wal_control").await,
        logical_test_db("fleet_wal_acme").await,
        logical_test_db("fleet_wal_globex").await,
    ) else {
        return;
    };
    let tenants = [("acme", &acme), ("globex", &globex)];
    let transport = MemoryTransport::new();

    // One instance owns both databases and streams both slots.
    let first = instance("pod-a", &control, &transport, &tenants).await;
    let both = eventually(Duration::from_secs(20), || async {
        streaming(&first, &tenants).await.len() == 2
    })
    .await;
    assert!(
        both,
        "both slots streamed: {:?}",
        streaming(&first, &tenants).await
    );
    let mut committed = 0;
    for (_, t) in &tenants {
        committed += commit_many(t, &["c1", "c2"], 0..5).await;
    }
    for (name, t) in &tenants {
        assert!(all_sent_soon(t).await, "{name}: published from its WAL");
    }

    // A second instance joins: one database (and its slot) moves to it.
    let second = instance("pod-b", &control, &transport, &tenants).await;
    let split = eventually(Duration::from_secs(30), || async {
        let owners = streaming(&second, &tenants).await;
        owners.len() == 2
            && owners
                .values()
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                == 2
    })
    .await;
    assert!(
        split,
        "one slot each: {:?}",
        streaming(&second, &tenants).await
    );
    for (_, t) in &tenants {
        committed += commit_many(t, &["c1", "c2"], 5..10).await;
    }
    for (name, t) in &tenants {
        assert!(all_sent_soon(t).await, "{name}: published by its new owner");
    }

    // The first instance leaves: its database and slot go to the second.
    first.shutdown().await;
    let moved = eventually(Duration::from_secs(30), || async {
        let owners = streaming(&second, &tenants).await;
        owners.len() == 2 && owners.values().all(|o| o == "pod-b")
    })
    .await;
    assert!(
        moved,
        "both slots with pod-b: {:?}",
        streaming(&second, &tenants).await
    );
    for (_, t) in &tenants {
        committed += commit_many(t, &["c1", "c2"], 10..15).await;
    }
    for (name, t) in &tenants {
        assert!(
            all_sent_soon(t).await,
            "{name}: published after the hand-over"
        );
    }
    second.shutdown().await;

    // Every event published once, in order per cart, carrying its database.
    let messages = transport.messages();
    let mut ids = std::collections::BTreeSet::new();
    let mut by_cart: BTreeMap<(String, String), Vec<u32>> = BTreeMap::new();
    for m in &messages {
        let envelope = outbox::Envelope::from_json(&m.body).unwrap();
        let database = envelope
            .extensions
            .get("tenant")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned();
        if ids.insert(m.event_id) {
            let data = envelope.data.as_ref().expect("data").get();
            let line: LineAdded = serde_json::from_str(data).unwrap();
            by_cart
                .entry((database, line.cart))
                .or_default()
                .push(line.seq);
        }
    }
    assert_eq!(ids.len(), committed, "every event published");
    assert_eq!(messages.len(), committed, "and once");
    for ((database, cart), seqs) in by_cart {
        assert!(
            ["acme", "globex"].contains(&database.as_str()),
            "{database}"
        );
        assert_eq!(
            seqs,
            (0..15).collect::<Vec<_>>(),
            "{database}/{cart} in order"
        );
    }
}
