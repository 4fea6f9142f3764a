//! The relay's fast path on PostgreSQL, MariaDB and SQLite, publishing to the in-memory
//! transport: a commit's events are written already claimed by the running relay and published
//! right after COMMIT, unless an earlier event of their aggregate is still unsent (decided by
//! the INSERT itself); what the fast path does not finish is left to the claim loop.
//!
//! The relays here poll once an hour and do not listen for notifications, so an event that
//! reaches the broker within seconds was published by the fast path, or by a claim the fast path
//! asked for.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use crate::common::carts::*;
use crate::common::*;
use outbox::prelude::*;
use outbox::relay::{Backoff, Relay, RelayConfig, RelayHandle};
use outbox::sea_orm::{DbBackend, IsolationLevel, TransactionOptions};
use outbox::transport::memory::MemoryTransport;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "fast.keyed", aggregate = "cart")]
struct Keyed {
    #[event(aggregate_id)]
    cart: String,
    #[event(dedup_key)]
    key: String,
}

/// Fields neither in alphabetical order nor in the order of their names' lengths: a JSON column
/// (PostgreSQL's `jsonb`, MySQL's `JSON`) stores them in another order than they were written.
#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "fast.unsorted", aggregate = "cart")]
struct Unsorted {
    #[event(aggregate_id)]
    zebra: String,
    a_long_name: u32,
    mid: String,
}

const RELAY_ID: &str = "fast-relay";

fn config() -> RelayConfig {
    RelayConfig::default()
        .relay_id(RELAY_ID.to_owned())
        .poll_interval(Duration::from_secs(3_600))
        .linger(None)
        .listen(false)
        .backoff(
            Backoff::default()
                .base(Duration::from_millis(20))
                .cap(Duration::from_millis(200))
                .jitter(0.2),
        )
        .probe(
            Backoff::default()
                .base(Duration::from_millis(20))
                .cap(Duration::from_millis(100))
                .jitter(0.2),
        )
}

/// A relay with the fast path on `outbox`, once the fast path takes commits.
async fn start(t: &TestDb, outbox: &Outbox, transport: &MemoryTransport) -> RelayHandle {
    start_with(t, outbox, transport, config()).await
}

async fn start_with(
    t: &TestDb,
    outbox: &Outbox,
    transport: &MemoryTransport,
    config: RelayConfig,
) -> RelayHandle {
    let relay = Relay::new(t.db.clone(), Arc::new(transport.clone()))
        .with_config(config)
        .with_outbox(outbox)
        .spawn();
    assert!(
        eventually(Duration::from_secs(10), || async {
            outbox.fast_path_running()
        })
        .await,
        "the relay installs its fast path"
    );
    relay
}

/// A producer's transaction that the fast path takes: on MySQL at READ COMMITTED (at REPEATABLE
/// READ, the server's default, its events are left to the claim loop).
async fn begin(t: &TestDb, outbox: &Outbox) -> OutboxTransaction {
    if t.dialect().backend() == DbBackend::MySql {
        let options = TransactionOptions {
            isolation_level: Some(IsolationLevel::ReadCommitted),
            ..TransactionOptions::default()
        };
        outbox.begin_with_options(&t.db, options).await.unwrap()
    } else {
        outbox.begin(&t.db).await.unwrap()
    }
}

/// A relay polling every 100 ms (for what the claim loop finds by polling: retries once due),
/// on a new handle and transport.
async fn start_polling(t: &TestDb) -> (Outbox, MemoryTransport, RelayHandle) {
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let config = config().poll_interval(Duration::from_millis(100));
    let relay = start_with(t, &outbox, &transport, config).await;
    (outbox, transport, relay)
}

async fn commit(t: &TestDb, outbox: &Outbox, lines: &[(&str, u32)]) {
    commit_lines(begin(t, outbox).await, lines).await;
}

async fn published_right_after_commit(t: TestDb) {
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let relay = start(&t, &outbox, &transport).await;
    // Two events of one cart and one of another in one transaction, one more in a second.
    commit(&t, &outbox, &[("a", 0), ("b", 0), ("a", 1)]).await;
    commit(&t, &outbox, &[("c", 0)]).await;
    wait_all_sent(&t, 4, Duration::from_secs(20)).await;
    let stats = relay.shutdown().await.unwrap();
    assert_eq!(stats.sent, 4);

    let rows = outbox_rows(&t.db).await;
    // Both transactions' rows were written under the fast path's one token: no claim took them.
    let tokens: BTreeSet<_> = rows.iter().map(|r| r.claim_token).collect();
    assert_eq!(tokens.len(), 1, "one fencing token: {rows:?}");
    assert!(tokens.iter().all(Option::is_some));
    assert!(rows.iter().all(|r| r.status == "SENT"
        && r.attempts == 0
        && r.locked_by.as_deref() == Some(RELAY_ID)
        && r.sent_at.is_some_and(|s| s >= r.created_at)));
    let messages = transport.messages();
    assert_eq!(messages.len(), 4, "each event published once");
    let order = stream_order(&transport);
    assert_eq!(order["a"], vec![0, 1], "one aggregate's events in order");
}

async fn an_event_behind_an_unsent_one_waits(t: TestDb) {
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let relay = start(&t, &outbox, &transport).await;
    // The broker confirms slowly: the first event of cart `a` is still PROCESSING when the
    // next commits come.
    transport.delay_confirms(Duration::from_millis(1_500));
    commit(&t, &outbox, &[("a", 0)]).await;
    commit(&t, &outbox, &[("a", 1), ("b", 0)]).await;
    let rows = outbox_rows(&t.db).await;
    let status: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r.aggregate_id.as_str(), r.status.as_str()))
        .collect();
    assert_eq!(
        status,
        vec![("a", "PROCESSING"), ("a", "PENDING"), ("b", "PROCESSING")],
        "the INSERT leaves an event behind an unsent one of its aggregate to the claim loop"
    );
    assert_eq!(rows[1].locked_by, None);
    // Once the first is SENT, the fast path wakes the claim loop for the second (the loop
    // would otherwise sleep for an hour).
    wait_all_sent(&t, 3, Duration::from_secs(20)).await;
    relay.shutdown().await.unwrap();
    let messages = transport.messages();
    assert_eq!(messages.len(), 3);
    let order = stream_order(&transport);
    assert_eq!(order["a"], vec![0, 1]);
    let rows = outbox_rows(&t.db).await;
    assert_ne!(
        rows[1].claim_token, rows[0].claim_token,
        "the waiting event was claimed by the loop"
    );
}

async fn an_unavailable_broker_leaves_events_to_the_loop(t: TestDb) {
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let relay = start(&t, &outbox, &transport).await;
    transport.set_unavailable(true);
    commit(&t, &outbox, &[("a", 0)]).await;
    // The fast path finds the broker gone: the event goes back to PENDING, no attempt counted,
    // and the breaker opens.
    assert!(
        eventually(Duration::from_secs(10), || async {
            outbox_rows(&t.db).await[0].status == "PENDING"
        })
        .await,
        "{:?}",
        outbox_rows(&t.db).await
    );
    // While the breaker is open, commits write PENDING.
    commit(&t, &outbox, &[("b", 0)]).await;
    let rows = outbox_rows(&t.db).await;
    assert_eq!(rows[1].status, "PENDING");
    assert_eq!(rows[1].locked_by, None);
    transport.set_unavailable(false);
    wait_all_sent(&t, 2, Duration::from_secs(20)).await;
    relay.shutdown().await.unwrap();
    let rows = outbox_rows(&t.db).await;
    assert!(
        rows.iter().all(|r| r.attempts == 0),
        "an outage costs no attempt: {rows:?}"
    );
    assert_eq!(transport.messages().len(), 2);
}

async fn a_failed_publish_is_retried_by_the_loop(t: TestDb) {
    // The retry is due after its backoff, which the loop finds by polling.
    let (outbox, transport, relay) = start_polling(&t).await;
    transport.fail_next_publishes(1);
    commit(&t, &outbox, &[("a", 0), ("a", 1)]).await;
    wait_all_sent(&t, 2, Duration::from_secs(20)).await;
    relay.shutdown().await.unwrap();
    let rows = outbox_rows(&t.db).await;
    assert_eq!(rows[0].attempts, 1, "the failure counted: {rows:?}");
    assert_eq!(
        rows[1].attempts, 0,
        "the event behind it was released, not failed"
    );
    let order = stream_order(&transport);
    assert_eq!(order["a"], vec![0, 1]);
}

async fn dedup_keys_skip_with_the_fast_path(t: TestDb) {
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let relay = start(&t, &outbox, &transport).await;
    let keyed = |key: &str| Keyed {
        cart: "k".to_owned(),
        key: key.to_owned(),
    };
    let tx = begin(&t, &outbox).await;
    tx.enqueue(&keyed("one")).unwrap();
    tx.enqueue(&keyed("two")).unwrap();
    let report = tx.commit().await.unwrap();
    assert_eq!((report.written, report.skipped.len()), (2, 0));
    let tx = begin(&t, &outbox).await;
    tx.enqueue(&keyed("two")).unwrap();
    tx.enqueue(&keyed("three")).unwrap();
    let report = tx.commit().await.unwrap();
    assert_eq!(report.written, 1);
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].dedup_key, "two");
    wait_all_sent(&t, 3, Duration::from_secs(20)).await;
    relay.shutdown().await.unwrap();
    let keys: Vec<String> = outbox_rows(&t.db)
        .await
        .into_iter()
        .filter_map(|r| r.dedup_key)
        .collect();
    assert_eq!(keys, ["one", "two", "three"]);
    assert_eq!(transport.messages().len(), 3);
}

async fn shutdown_leaves_nothing_leased(t: TestDb) {
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let relay = start(&t, &outbox, &transport).await;
    transport.delay_confirms(Duration::from_millis(300));
    for seq in 0..20 {
        commit(&t, &outbox, &[("a", seq), ("b", seq)]).await;
    }
    relay.shutdown().await.unwrap();
    assert!(!outbox.fast_path_running());
    let counts = status_counts(&t.db).await;
    assert_eq!(
        counts.get("PROCESSING"),
        None,
        "what the fast path held is SENT or handed back: {counts:?}"
    );
    // Commits after the relay stopped are written for the next one.
    commit(&t, &outbox, &[("c", 0)]).await;
    assert_eq!(outbox_rows(&t.db).await.last().unwrap().status, "PENDING");
    // A relay started again publishes the rest, in order.
    transport.delay_confirms(Duration::ZERO);
    let relay = start(&t, &outbox, &transport).await;
    wait_all_sent(&t, 41, Duration::from_secs(30)).await;
    relay.shutdown().await.unwrap();
    let order = stream_order(&transport);
    assert_strictly_increasing(
        &order
            .into_iter()
            .filter(|(a, _)| a != "c")
            .collect::<std::collections::HashMap<_, _>>(),
        20,
    );
}

async fn every_copy_is_the_same_bytes(t: TestDb) {
    let (outbox, transport, relay) = start_polling(&t).await;
    // The fast path's publication is stored but its confirmation lost: the claim loop
    // publishes the event again.
    transport.lose_next_confirms(1);
    let tx = begin(&t, &outbox).await;
    tx.enqueue(&Unsorted {
        zebra: "z".to_owned(),
        a_long_name: 7,
        mid: "m".to_owned(),
    })
    .unwrap();
    assert_eq!(tx.commit().await.unwrap().written, 1);
    wait_all_sent(&t, 1, Duration::from_secs(20)).await;
    relay.shutdown().await.unwrap();
    let messages = transport.messages();
    assert_eq!(
        messages.len(),
        2,
        "published by the fast path, then by the claim loop"
    );
    assert_eq!(messages[0].event_id, messages[1].event_id);
    assert_eq!(
        String::from_utf8_lossy(&messages[0].body),
        String::from_utf8_lossy(&messages[1].body),
        "both copies carry the same bytes (a consumer takes a different body for a conflict)"
    );
}

async fn without_ordering_every_event_is_claimed(t: TestDb) {
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let config = config().ordering(false);
    let relay = start_with(&t, &outbox, &transport, config).await;
    transport.delay_confirms(Duration::from_millis(1_000));
    commit(&t, &outbox, &[("a", 0)]).await;
    commit(&t, &outbox, &[("a", 1)]).await;
    let status: Vec<String> = outbox_rows(&t.db)
        .await
        .into_iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(status, ["PROCESSING", "PROCESSING"]);
    wait_all_sent(&t, 2, Duration::from_secs(20)).await;
    relay.shutdown().await.unwrap();
    assert_eq!(transport.messages().len(), 2);
}

/// Producers committing many events at once, side by side, through the fast path: every
/// commit succeeds (on MySQL at READ COMMITTED its check takes no gap locks that could deadlock
/// them) and every event is published once.
async fn concurrent_producers(t: TestDb) {
    let t = Arc::new(t);
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let relay = start(&t, &outbox, &transport).await;
    let mut tasks = Vec::new();
    for p in 0..6 {
        let (t, outbox) = (t.clone(), outbox.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..10u32 {
                let lines: Vec<(String, u32)> = (0..20)
                    .map(|cart| (format!("p{p}-c{cart}"), round))
                    .collect();
                let lines: Vec<(&str, u32)> = lines.iter().map(|(c, s)| (c.as_str(), *s)).collect();
                commit(&t, &outbox, &lines).await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    wait_all_sent(&t, 1_200, Duration::from_secs(60)).await;
    relay.shutdown().await.unwrap();
    let order = stream_order(&transport);
    assert_eq!(order.len(), 120);
    assert_strictly_increasing(&order, 10);
}

/// On MySQL at REPEATABLE READ (the server's default) the fast path's check would take gap
/// locks: such a transaction's events are written PENDING for the claim loop.
async fn repeatable_read_on_mysql_goes_by_the_claim_loop(t: TestDb) {
    if t.dialect().backend() != DbBackend::MySql {
        return;
    }
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let relay = start(&t, &outbox, &transport).await;
    // At READ COMMITTED: the fast path's token.
    commit(&t, &outbox, &[("a", 0)]).await;
    // At REPEATABLE READ: written PENDING, claimed by the loop under a token of its own.
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.enqueue(&LineAdded {
        cart: "b".to_owned(),
        seq: 0,
    })
    .unwrap();
    assert_eq!(tx.commit().await.unwrap().written, 1);
    wait_all_sent(&t, 2, Duration::from_secs(20)).await;
    relay.shutdown().await.unwrap();
    let rows = outbox_rows(&t.db).await;
    assert_ne!(rows[0].claim_token, rows[1].claim_token, "{rows:?}");
}

async fn off_by_switch(t: TestDb) {
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let relay = Relay::new(t.db.clone(), Arc::new(transport.clone()))
        .with_config(config().fast_path(false))
        .with_outbox(&outbox)
        .spawn();
    commit(&t, &outbox, &[("a", 0)]).await;
    assert!(!outbox.fast_path_running());
    // The commit wakes the claim loop.
    wait_all_sent(&t, 1, Duration::from_secs(20)).await;
    relay.shutdown().await.unwrap();
}

/// With the relay listening (PostgreSQL), the fast path asks whether events wait behind the
/// ones it marked SENT only when something announced events written PENDING since their commit:
/// a later event of the aggregate committed through the same handle, and one committed through
/// another handle (as another process would: heard through `NOTIFY`), are both published once
/// the first is confirmed, although the claim loop polls once an hour.
async fn listening_relay_finds_what_waits_behind(t: TestDb) {
    if t.dialect().backend() != DbBackend::Postgres {
        return;
    }
    let outbox = Outbox::new("carts");
    let elsewhere = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let relay = start_with(&t, &outbox, &transport, config().listen(true)).await;
    // Quiet commits first: nothing waits behind them.
    commit(&t, &outbox, &[("q", 0)]).await;
    commit(&t, &outbox, &[("q", 1)]).await;
    wait_all_sent(&t, 2, Duration::from_secs(20)).await;

    transport.delay_confirms(Duration::from_millis(1_000));
    commit(&t, &outbox, &[("a", 0)]).await;
    commit(&t, &outbox, &[("a", 1)]).await;
    commit(&t, &outbox, &[("b", 0)]).await;
    commit(&t, &elsewhere, &[("b", 1)]).await;
    let rows = outbox_rows(&t.db).await;
    let waiting: Vec<(&str, &str)> = rows
        .iter()
        .filter(|r| r.status == "PENDING")
        .map(|r| (r.aggregate_id.as_str(), r.status.as_str()))
        .collect();
    assert_eq!(
        waiting,
        vec![("a", "PENDING"), ("b", "PENDING")],
        "{rows:?}"
    );
    wait_all_sent(&t, 6, Duration::from_secs(20)).await;
    relay.shutdown().await.unwrap();
    let order = stream_order(&transport);
    assert_eq!(order["a"], vec![0, 1]);
    assert_eq!(order["b"], vec![0, 1]);
    assert_eq!(transport.messages().len(), 6, "each event published once");
}

crate::backend_tests! {
    published => published_right_after_commit;
    waits_behind_unsent => an_event_behind_an_unsent_one_waits;
    broker_unavailable => an_unavailable_broker_leaves_events_to_the_loop;
    failed_publish => a_failed_publish_is_retried_by_the_loop;
    dedup_keys => dedup_keys_skip_with_the_fast_path;
    shutdown => shutdown_leaves_nothing_leased;
    switched_off => off_by_switch;
    same_bytes => every_copy_is_the_same_bytes;
    unordered => without_ordering_every_event_is_claimed;
    concurrent => concurrent_producers;
    mysql_repeatable_read => repeatable_read_on_mysql_goes_by_the_claim_loop;
    listening => listening_relay_finds_what_waits_behind;
}
