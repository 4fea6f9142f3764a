//! Inbox handlers and the runtime on real PostgreSQL, MariaDB and SQLite: effectively-once
//! handling through duplicates and lost acks, retries, dead letters, per-aggregate order,
//! consume-then-produce atomicity, bad input, stored mode, and the database-local transport.
//! Deliveries come through the in-memory transport (its lost-ack fault is injected on purpose)
//! or the database-local one.

use std::{
    collections::HashMap,
    sync::{LazyLock, Mutex},
    time::Duration,
};

use crate::common::carts::*;
use crate::common::*;
use bytes::Bytes;
use outbox::inbox::InboxConfig;
use outbox::prelude::*;
use outbox::relay::RelayConfig;
use outbox::runtime::Runtime;
use outbox::store::Failure;
use outbox::store::inbox::{self as inbox_store, InboxState, NewInboxRow};
use outbox::transport::SubscribeOptions;
use outbox::transport::{OutgoingMessage, Transport, memory::MemoryTransport};
use serde::{Deserialize, Serialize};

async fn record(tx: &InboxTransaction, event: &Event<LineAdded>) -> Result<(), HandlerError> {
    record_line(tx, event).await
}

#[inbox_handler(consumer = "t-inline", backoff = "10ms", backoff_cap = "50ms")]
async fn inline_handler(
    tx: &InboxTransaction,
    event: Event<LineAdded>,
) -> Result<(), HandlerError> {
    record(tx, &event).await?;
    if should_fail(&event.cart) {
        return Err(HandlerError::retry("transient failure injected"));
    }
    Ok(())
}

#[inbox_handler(
    consumer = "t-limited",
    max_attempts = 3,
    backoff = "10ms",
    backoff_cap = "20ms"
)]
async fn limited_handler(
    tx: &InboxTransaction,
    event: Event<LineAdded>,
) -> Result<(), HandlerError> {
    if event.cart.starts_with("poison") {
        return Err(HandlerError::retry(format!(
            "cannot reserve stock for {}",
            event.cart
        )));
    }
    record(tx, &event).await
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "line.priced", aggregate = "cart")]
struct LinePriced {
    #[event(aggregate_id)]
    cart: String,
    seq: u32,
}

#[inbox_handler(consumer = "t-chain", max_attempts = 2, backoff = "10ms")]
async fn chain_handler(tx: &InboxTransaction, event: Event<LineAdded>) -> Result<(), HandlerError> {
    record(tx, &event).await?;
    tx.enqueue(&LinePriced {
        cart: event.cart.clone(),
        seq: event.seq,
    })?;
    if event.cart.starts_with("broken") {
        return Err(HandlerError::permanent("price list missing"));
    }
    Ok(())
}

#[inbox_handler(consumer = "t-stored", mode = "stored")]
async fn stored_handler(
    tx: &InboxTransaction,
    event: Event<LineAdded>,
) -> Result<(), HandlerError> {
    record(tx, &event).await
}

#[inbox_handler(consumer = "t-notify")]
async fn notify_handler(
    tx: &InboxTransaction,
    event: Event<LineAdded>,
) -> Result<(), HandlerError> {
    record(tx, &event).await
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "cart.repriced", aggregate = "cart")]
struct CartRepriced {
    #[event(aggregate_id)]
    cart: String,
    #[event(aggregate_version)]
    version: i64,
}

#[inbox_handler(consumer = "t-versioned", ordering = false)]
async fn versioned_handler(
    tx: &InboxTransaction,
    event: Event<CartRepriced>,
) -> Result<(), HandlerError> {
    if !tx.accept_version(&event).await? {
        return Ok(()); // stale: a newer price was applied already
    }
    insert_effect(tx, event.id(), &event.cart, event.version).await
}

/// Top-level transaction ids (PostgreSQL) in which `t-batch` ran each first attempt.
static BATCH_XIDS: LazyLock<Mutex<HashMap<String, i64>>> = LazyLock::new(Mutex::default);

#[inbox_handler(consumer = "t-batch", backoff = "10ms", backoff_cap = "50ms")]
async fn batch_handler(tx: &InboxTransaction, event: Event<LineAdded>) -> Result<(), HandlerError> {
    if event.cart.ends_with("gate") {
        // Holds the only lane while the rest of the messages arrive: they form one batch.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if tx.get_database_backend() == sea_orm::DbBackend::Postgres && event.meta().attempt == 1 {
        let row = tx
            .query_one_raw(sea_orm::Statement::from_string(
                sea_orm::DbBackend::Postgres,
                "SELECT txid_current()::bigint AS xid",
            ))
            .await?
            .unwrap();
        let xid: i64 = row.try_get("", "xid")?;
        BATCH_XIDS
            .lock()
            .unwrap()
            .insert(format!("{}/{}", event.cart, event.seq), xid);
    }
    record(tx, &event).await?;
    if should_fail(&event.cart) {
        if event.cart.contains("sqlfail") {
            // A failing statement aborts the savepoint (on PostgreSQL, the whole transaction
            // unless the savepoint is rolled back).
            tx.execute_unprepared("INSERT INTO no_such_table VALUES (1)")
                .await?;
        }
        return Err(HandlerError::retry("transient failure injected"));
    }
    Ok(())
}

fn inbox_config() -> InboxConfig {
    quick_inbox()
}

fn relay_config() -> RelayConfig {
    RelayConfig::default().poll_interval(Duration::from_millis(50))
}

/// The CloudEvents body of a line, as a producer would publish it.
fn message(cart: &str, seq: u32) -> OutgoingMessage {
    let event_id = uuid::Uuid::now_v7();
    let body = serde_json::json!({
        "specversion": "1.0", "id": event_id.to_string(), "source": "tests", "type": "line.added",
        "subject": cart, "aggregatetype": "cart", "schemaversion": 1,
        "datacontenttype": "application/json", "data": {"cart": cart, "seq": seq},
    });
    raw(event_id, "line.added", serde_json::to_vec(&body).unwrap())
}

fn raw(event_id: uuid::Uuid, event_type: &str, body: Vec<u8>) -> OutgoingMessage {
    OutgoingMessage {
        event_id,
        event_type: event_type.to_owned(),
        aggregate_type: "cart".into(),
        aggregate_id: "x".into(),
        body: Bytes::from(body),
        headers: Vec::new(),
    }
}

async fn consumer_runtime(t: &TestDb, transport: &MemoryTransport, consumer: &str) -> Runtime {
    Runtime::builder(t.db.clone())
        .transport(transport.clone())
        .without_relay()
        .consumers([consumer])
        .expect_consumers([consumer])
        .inbox_config(inbox_config())
        .start()
        .await
        .unwrap()
}

async fn wait_until<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    assert!(
        eventually(Duration::from_secs(60), check).await,
        "timed out waiting until {what}"
    );
}

async fn same_message_five_times_one_effect(t: TestDb) {
    let transport = MemoryTransport::new();
    let runtime = consumer_runtime(&t, &transport, "t-inline").await;
    let m = message("dup-cart", 1);
    for _ in 0..5 {
        assert!(transport.publish(std::slice::from_ref(&m)).await[0].is_ok());
    }
    wait_until("5 deliveries settled", || async {
        let s = runtime.consumer_stats("t-inline").unwrap();
        s.handled + s.duplicates == 5
    })
    .await;
    let stats = runtime.shutdown().await.consumer("t-inline");
    assert_eq!((stats.handled, stats.duplicates), (1, 4));
    let effects = effects(&t.db).await;
    assert_eq!(effects.len(), 1, "one effect for five deliveries");
    assert_eq!(effects[0].event_id, m.event_id.to_string());
    let rows = inbox_rows(&t.db, "t-inline").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, "DONE");
}

async fn lost_ack_is_redelivered_and_suppressed(t: TestDb) {
    let transport = MemoryTransport::new();
    let config =
        inbox_config().subscribe(SubscribeOptions::default().ack_wait(Duration::from_millis(300)));
    let runtime = Runtime::builder(t.db.clone())
        .transport(transport.clone())
        .without_relay()
        .consumers(["t-inline"])
        .inbox_config(config)
        .start()
        .await
        .unwrap();
    transport.lose_next_acks(1);
    let m = message("lost-ack", 1);
    assert!(transport.publish(&[m]).await[0].is_ok());
    wait_until("the redelivery was suppressed", || async {
        runtime.consumer_stats("t-inline").unwrap().duplicates == 1
    })
    .await;
    let stats = runtime.shutdown().await.consumer("t-inline");
    assert_eq!(stats.handled, 1);
    assert_eq!(
        effects(&t.db).await.len(),
        1,
        "handled once although delivered twice"
    );
}

async fn transient_errors_retry_then_done(t: TestDb) {
    let cart = format!("flaky-{}", t.name);
    fail_times(&cart, 2);
    let transport = MemoryTransport::new();
    let runtime = consumer_runtime(&t, &transport, "t-inline").await;
    assert!(transport.publish(&[message(&cart, 1)]).await[0].is_ok());
    wait_until("the message is DONE", || async {
        inbox_rows(&t.db, "t-inline")
            .await
            .first()
            .is_some_and(|r| r.status == "DONE")
    })
    .await;
    let stats = runtime.shutdown().await.consumer("t-inline");
    let rows = inbox_rows(&t.db, "t-inline").await;
    assert_eq!(rows[0].attempts, 3, "two failed attempts, then success");
    assert_eq!((stats.retried, stats.handled), (2, 1));
    let effects = effects(&t.db).await;
    assert_eq!(
        effects.len(),
        1,
        "failed attempts rolled their effects back"
    );
}

async fn permanent_failures_dead_after_limit_others_flow(t: TestDb) {
    let transport = MemoryTransport::new();
    let runtime = consumer_runtime(&t, &transport, "t-limited").await;
    let mut messages = vec![message("poison-1", 0)];
    for i in 0..10 {
        messages.push(message(&format!("healthy-{i}"), 0));
    }
    assert!(transport.publish(&messages).await.iter().all(Result::is_ok));
    wait_until("poison DEAD and the rest DONE", || async {
        let rows = inbox_rows(&t.db, "t-limited").await;
        rows.len() == 11
            && rows
                .iter()
                .all(|r| r.status == "DONE" || r.status == "DEAD")
    })
    .await;
    let stats = runtime.shutdown().await.consumer("t-limited");
    let rows = inbox_rows(&t.db, "t-limited").await;
    let dead: Vec<_> = rows.iter().filter(|r| r.status == "DEAD").collect();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message_id, messages[0].event_id.to_string());
    assert_eq!(dead[0].attempts, 3, "DEAD after max_attempts = 3");
    assert!(
        dead[0]
            .last_error
            .as_deref()
            .unwrap()
            .contains("cannot reserve stock for poison-1")
    );
    assert_eq!(stats.dead, 1);
    assert_eq!(
        effects(&t.db).await.len(),
        10,
        "every healthy message handled"
    );
    // Every failed attempt is in the error history, oldest first, the last one DEAD.
    let listed = outbox::admin::dead_letters(
        &t.db,
        &outbox::admin::DeadLetterFilter::default().consumer("t-limited"),
        outbox::admin::Page::default(),
    )
    .await
    .unwrap();
    assert_eq!(listed.len(), 1);
    let detail = outbox::admin::dead_letter(&t.db, listed[0].target)
        .await
        .unwrap();
    let history: Vec<(i64, &str)> = detail
        .failures
        .iter()
        .map(|f| (f.attempt, f.status.as_str()))
        .collect();
    assert_eq!(history, [(1, "RETRY"), (2, "RETRY"), (3, "DEAD")]);
    assert!(
        detail
            .failures
            .iter()
            .all(|f| f.error.contains("cannot reserve stock for poison-1")),
        "{:?}",
        detail.failures
    );
    assert!(detail.failures.windows(2).all(|w| w[0].at <= w[1].at));
}

async fn per_aggregate_order_under_keyed_concurrency(t: TestDb) {
    let transport = MemoryTransport::new();
    let runtime = consumer_runtime(&t, &transport, "t-inline").await;
    // Some carts fail now and then: later lines wait behind the retry.
    for a in 0..20 {
        if a % 4 == 0 {
            fail_times(&format!("{}-cart-{a}", t.name), 2);
        }
    }
    let mut messages = Vec::new();
    for seq in 0..15 {
        for a in 0..20 {
            messages.push(message(&format!("{}-cart-{a}", t.name), seq));
        }
    }
    assert!(transport.publish(&messages).await.iter().all(Result::is_ok));
    wait_until("all 300 handled", || async {
        runtime.consumer_stats("t-inline").unwrap().handled == 300
    })
    .await;
    runtime.shutdown().await;
    let per_cart = effects_per_cart(&t.db).await;
    assert_eq!(per_cart.len(), 20);
    for (cart, seqs) in per_cart {
        assert_eq!(
            seqs,
            (0..15).collect::<Vec<_>>(),
            "{cart} handled out of order"
        );
    }
}

async fn consume_then_produce_is_atomic(t: TestDb) {
    let transport = MemoryTransport::new();
    let runtime = consumer_runtime(&t, &transport, "t-chain").await;
    let ok = message("fine-cart", 1);
    let broken = message("broken-cart", 1);
    assert!(
        transport
            .publish(&[ok.clone(), broken.clone()])
            .await
            .iter()
            .all(Result::is_ok)
    );
    wait_until("both settled", || async {
        let rows = inbox_rows(&t.db, "t-chain").await;
        rows.len() == 2
            && rows
                .iter()
                .all(|r| r.status == "DONE" || r.status == "DEAD")
    })
    .await;
    runtime.shutdown().await;
    let rows = outbox_rows(&t.db).await;
    assert_eq!(
        rows.len(),
        1,
        "only the handled message produced its follow-up"
    );
    assert_eq!(rows[0].event_type, "line.priced");
    assert_eq!(rows[0].aggregate_id, "fine-cart");
    let effects = effects(&t.db).await;
    assert_eq!(effects.len(), 1);
    assert_eq!(effects[0].event_id, ok.event_id.to_string());
    let dead = inbox_rows(&t.db, "t-chain")
        .await
        .into_iter()
        .find(|r| r.status == "DEAD")
        .unwrap();
    assert_eq!(dead.message_id, broken.event_id.to_string());
    assert!(dead.last_error.unwrap().contains("price list missing"));
}

async fn bad_input_is_dead_with_a_clear_error(t: TestDb) {
    let transport = MemoryTransport::new();
    let runtime = consumer_runtime(&t, &transport, "t-inline").await;
    let id = uuid::Uuid::now_v7;
    let cases: Vec<(OutgoingMessage, &str)> = vec![
        (raw(id(), "line.added", b"{\"specversion\":\"1.0\",".to_vec()), "not valid JSON"),
        (raw(id(), "line.added", br#"{"specversion":"1.0","source":"s","type":"line.added"}"#.to_vec()), "`id` is missing"),
        (raw(id(), "line.added", br#"{"specversion":"0.3","id":"x1","source":"s","type":"line.added"}"#.to_vec()), "specversion"),
        (raw(id(), "line.added", br#"{"specversion":"1.0","id":"x2","source":"s","type":"line.removed","data":{}}"#.to_vec()), "no handler for event type `line.removed`"),
        (raw(id(), "line.added", br#"{"specversion":"1.0","id":"x3","source":"s","type":"line.added","schemaversion":7,"data":{}}"#.to_vec()), "schema version 7"),
        (raw(id(), "line.added", br#"{"specversion":"1.0","id":"x4","source":"s","type":"line.added","data":{"cart":5}}"#.to_vec()), "does not match"),
        (raw(id(), "line.added", vec![0xff, 0xfe, 0x00]), "not UTF-8"),
    ];
    let messages: Vec<OutgoingMessage> = cases.iter().map(|(m, _)| m.clone()).collect();
    assert!(transport.publish(&messages).await.iter().all(Result::is_ok));
    let good = message("after-bad-input", 1);
    assert!(transport.publish(std::slice::from_ref(&good)).await[0].is_ok());
    wait_until("every message settled", || async {
        let rows = inbox_rows(&t.db, "t-inline").await;
        rows.len() == cases.len() + 1
            && rows
                .iter()
                .all(|r| r.status == "DONE" || r.status == "DEAD")
    })
    .await;
    runtime.shutdown().await;
    let rows = inbox_rows(&t.db, "t-inline").await;
    for (_, expected) in &cases {
        assert!(
            rows.iter().any(|r| r.status == "DEAD"
                && r.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains(expected))),
            "no DEAD row mentioning {expected:?}: {rows:?}"
        );
    }
    assert!(
        rows.iter()
            .any(|r| r.status == "DONE" && r.message_id == good.event_id.to_string()),
        "the loop kept going"
    );
    assert_eq!(effects(&t.db).await.len(), 1);
}

async fn stored_mode_acks_first_then_handles(t: TestDb) {
    let transport = MemoryTransport::new();
    let runtime = consumer_runtime(&t, &transport, "t-stored").await;
    let m = message("stored-cart", 1);
    assert!(transport.publish(std::slice::from_ref(&m)).await[0].is_ok());
    wait_until("handled by the worker", || async {
        runtime.consumer_stats("t-stored").unwrap().handled == 1
    })
    .await;
    let stats = runtime.shutdown().await.consumer("t-stored");
    assert_eq!(stats.stored, 1, "stored before handling");
    let rows = inbox_rows(&t.db, "t-stored").await;
    assert_eq!(rows[0].status, "DONE");
    assert_eq!(effects(&t.db).await.len(), 1);
}

async fn local_transport_delivers_to_every_consumer_once(t: TestDb) {
    for a in 0..3 {
        fail_times(&format!("{}-local-{a}", t.name), 1);
    }
    let runtime = Runtime::builder(t.db.clone())
        .source("carts")
        .consumers(["t-inline", "t-notify"])
        .relay_config(relay_config())
        .inbox_config(inbox_config())
        .start()
        .await
        .unwrap();
    let outbox = runtime.outbox().clone();
    let mut expected = 0;
    for seq in 0..10 {
        let tx = outbox.begin(&t.db).await.unwrap();
        for a in 0..3 {
            tx.enqueue(&LineAdded {
                cart: format!("{}-local-{a}", t.name),
                seq,
            })
            .unwrap();
            expected += 1;
        }
        let _ = tx.commit().await.unwrap();
    }
    wait_until("both consumers handled every event", || async {
        effects(&t.db).await.len() == 2 * expected
    })
    .await;
    // Resend everything: the inbox suppresses the second delivery.
    let db = &t.db;
    sea_orm::ConnectionTrait::execute_unprepared(db, "UPDATE outbox_event SET status = 'PENDING'")
        .await
        .unwrap();
    wait_until("resent events were moved again", || async {
        status_counts(db).await.get("SENT").copied() == Some(expected as i64)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let inline = runtime.shutdown().await.consumer("t-inline");
    let effects = effects(&t.db).await;
    assert_eq!(
        effects.len(),
        2 * expected,
        "exactly once per consumer and event"
    );
    assert_eq!(inline.retried, 3, "the injected failures were retried");
    for consumer in ["t-inline", "t-notify"] {
        let mut per_cart: HashMap<String, Vec<i64>> = HashMap::new();
        for e in effects.iter().filter(|e| e.consumer == consumer) {
            per_cart.entry(e.cart.clone()).or_default().push(e.seq);
        }
        for (cart, seqs) in per_cart {
            assert_eq!(
                seqs,
                (0..10).collect::<Vec<_>>(),
                "{consumer}/{cart} out of order"
            );
        }
    }
    assert!(
        inbox_rows(&t.db, "t-inline")
            .await
            .iter()
            .all(|r| r.status == "DONE")
    );
}

async fn version_guard_drops_stale_events(t: TestDb) {
    let transport = MemoryTransport::new();
    // One lane: delivered in publish order, so "stale" is deterministic.
    let config = inbox_config().concurrency(1);
    let runtime = Runtime::builder(t.db.clone())
        .transport(transport.clone())
        .without_relay()
        .consumers(["t-versioned"])
        .inbox_config(config)
        .start()
        .await
        .unwrap();
    let versions = [1, 3, 2, 3, 5, 4];
    let messages: Vec<OutgoingMessage> = versions
        .iter()
        .map(|v| {
            let id = uuid::Uuid::now_v7();
            let body = serde_json::json!({
                "specversion": "1.0", "id": id.to_string(), "source": "tests", "type": "cart.repriced",
                "subject": "c-1", "aggregatetype": "cart", "aggregateversion": v, "schemaversion": 1,
                "data": {"cart": "c-1", "version": v},
            });
            raw(id, "cart.repriced", serde_json::to_vec(&body).unwrap())
        })
        .collect();
    assert!(transport.publish(&messages).await.iter().all(Result::is_ok));
    wait_until("all six handled", || async {
        runtime.consumer_stats("t-versioned").unwrap().handled == 6
    })
    .await;
    runtime.shutdown().await;
    let applied: Vec<i64> = effects(&t.db).await.iter().map(|e| e.seq).collect();
    assert_eq!(
        applied,
        [1, 3, 5],
        "stale and repeated versions were dropped"
    );
}

/// A runtime whose `t-batch` consumer has one lane and batches of up to 32.
async fn batch_runtime(t: &TestDb, transport: &MemoryTransport) -> Runtime {
    let config = inbox_config().concurrency(1).commit_batch(32);
    Runtime::builder(t.db.clone())
        .transport(transport.clone())
        .without_relay()
        .consumers(["t-batch"])
        .inbox_config(config)
        .start()
        .await
        .unwrap()
}

/// Publish a gate message (its handler holds the only lane for a while), then `batch`: the
/// batch arrives while the lane is busy and is taken in one go.
async fn publish_behind_gate(transport: &MemoryTransport, gate: &str, batch: &[OutgoingMessage]) {
    assert!(transport.publish(&[message(gate, 0)]).await[0].is_ok());
    tokio::time::sleep(Duration::from_millis(100)).await; // the gate is being handled
    assert!(transport.publish(batch).await.iter().all(Result::is_ok));
}

/// The effects' sequence numbers per cart, in the order they were applied.
async fn effects_per_cart(db: &sea_orm::DatabaseConnection) -> HashMap<String, Vec<i64>> {
    let mut per_cart: HashMap<String, Vec<i64>> = HashMap::new();
    for e in effects(db).await {
        per_cart.entry(e.cart).or_default().push(e.seq);
    }
    per_cart
}

/// Deliveries that arrive together in a lane commit in one transaction, each handler in its own
/// savepoint: a failing handler (even one whose SQL failed) rolls back only its own work, its
/// message is stored for retry in the same commit, later messages of its aggregate wait behind it,
/// a duplicate in the batch is suppressed, and everything else commits once.
async fn batched_deliveries_isolate_each_handler(t: TestDb) {
    let transport = MemoryTransport::new();
    let runtime = batch_runtime(&t, &transport).await;
    let cart = |name: &str| format!("{}-{name}", t.name);
    fail_times(&cart("flaky"), 1);
    fail_times(&cart("sqlfail"), 1);
    let a1 = message(&cart("steady"), 1);
    let batch = vec![
        a1.clone(),
        message(&cart("flaky"), 1),
        message(&cart("flaky"), 2), // behind flaky/1's retry
        message(&cart("steady"), 2),
        a1, // a duplicate inside the batch
        message(&cart("sqlfail"), 1),
        message(&cart("sqlfail"), 2),
        message(&cart("steady"), 3),
    ];
    publish_behind_gate(&transport, &cart("gate"), &batch).await;
    wait_until("8 messages handled", || async {
        runtime.consumer_stats("t-batch").unwrap().handled == 8
    })
    .await;
    let stats = runtime.shutdown().await.consumer("t-batch");
    assert_eq!(stats.handled, 8, "gate + 7 distinct messages");
    assert_eq!(stats.duplicates, 1);
    assert_eq!(stats.retried, 2, "flaky/1 and sqlfail/1 failed once");
    assert_eq!(
        stats.stored, 2,
        "flaky/2 and sqlfail/2 waited behind their retries"
    );
    assert_eq!(stats.dead, 0);
    assert_eq!(
        stats.batch_reruns, 1,
        "flaky/1 sent the batch through one run with savepoints, where sqlfail/1 failed"
    );

    let per_cart = effects_per_cart(&t.db).await;
    assert_eq!(per_cart[&cart("steady")], [1, 2, 3]);
    assert_eq!(
        per_cart[&cart("flaky")],
        [1, 2],
        "the failed attempt's effect was rolled back; order kept"
    );
    assert_eq!(per_cart[&cart("sqlfail")], [1, 2]);
    let rows = inbox_rows(&t.db, "t-batch").await;
    assert_eq!(rows.len(), 8);
    assert!(rows.iter().all(|r| r.status == "DONE"), "{rows:?}");

    if t.backend.is_postgres() {
        let xids = BATCH_XIDS.lock().unwrap();
        let ours: Vec<i64> = xids
            .iter()
            .filter(|(k, _)| k.starts_with(&t.name) && !k.contains("gate"))
            .map(|(_, xid)| *xid)
            .collect();
        let distinct: std::collections::HashSet<_> = ours.iter().collect();
        assert!(
            distinct.len() < ours.len(),
            "the batch's first attempts ran in one transaction: {xids:?}"
        );
    }
}

/// A batch whose handlers all succeed commits in its first run, without savepoints. A failing
/// handler sends its batch through a second run with a savepoint per handler, which records its
/// failure without running it again and commits the other handlers' work once.
async fn batches_take_savepoints_only_after_a_failure(t: TestDb) {
    let transport = MemoryTransport::new();
    let runtime = batch_runtime(&t, &transport).await;
    let cart = |name: &str| format!("{}-{name}", t.name);
    let clean: Vec<_> = (1..=6).map(|seq| message(&cart("clean"), seq)).collect();
    publish_behind_gate(&transport, &cart("gate"), &clean).await;
    wait_until("the clean batch handled", || async {
        runtime.consumer_stats("t-batch").unwrap().handled == 7
    })
    .await;
    let stats = runtime.consumer_stats("t-batch").unwrap();
    assert_eq!(stats.batch_reruns, 0, "a batch without failures runs once");

    fail_times(&cart("once"), 1);
    let mixed = vec![
        message(&cart("before"), 1),
        message(&cart("once"), 1),
        message(&cart("after"), 1),
    ];
    publish_behind_gate(&transport, &cart("gate2"), &mixed).await;
    wait_until("the mixed batch handled", || async {
        runtime.consumer_stats("t-batch").unwrap().handled == 11
    })
    .await;
    let stats = runtime.shutdown().await.consumer("t-batch");
    assert_eq!(
        stats.retried, 1,
        "the failed handler was recorded for retry, not run again at once"
    );
    assert_eq!(
        stats.batch_reruns, 1,
        "the failure sent its batch through a run with savepoints"
    );
    let per_cart = effects_per_cart(&t.db).await;
    assert_eq!(per_cart[&cart("clean")], [1, 2, 3, 4, 5, 6]);
    assert_eq!(
        per_cart[&cart("before")],
        [1],
        "run in both passes, committed once"
    );
    assert_eq!(per_cart[&cart("after")], [1]);
    assert_eq!(per_cart[&cart("once")], [1], "handled on its retry");
    let rows = inbox_rows(&t.db, "t-batch").await;
    assert_eq!(rows.len(), 11);
    assert!(rows.iter().all(|r| r.status == "DONE"), "{rows:?}");
}

/// A batch whose aggregate has an unfinished message recorded before it (here waiting for its
/// retry): the batch's messages of that aggregate are recorded PENDING by the statement that
/// records the batch and are not handled; the others are. Once the earlier message is handled,
/// they follow it in order.
async fn batch_waits_behind_an_earlier_unfinished_message(t: TestDb) {
    let transport = MemoryTransport::new();
    let runtime = batch_runtime(&t, &transport).await;
    let cart = |name: &str| format!("{}-{name}", t.name);
    let held = cart("held");
    // held/1 failed before this batch and waits for a retry far ahead.
    let first = message(&held, 1);
    let first_id = first.event_id.to_string();
    let row = NewInboxRow {
        consumer: "t-batch",
        message_id: &first_id,
        event_type: Some("line.added"),
        source: Some("tests"),
        aggregate_type: Some("cart"),
        aggregate_id: Some(&held),
        aggregate_version: None,
        schema_version: Some(1),
        payload: &first.body,
        ..NewInboxRow::default()
    };
    let retry_later = |delay| {
        InboxState::Failed(Failure::Retry {
            attempts: 1,
            delay,
            error: "failed before the batch".into(),
        })
    };
    let far = Duration::from_secs(3_600);
    assert!(
        inbox_store::insert(&t.db, &row, &retry_later(far))
            .await
            .unwrap()
    );

    let batch = vec![
        message(&held, 2),
        message(&cart("free"), 1),
        message(&held, 3),
        message(&cart("free"), 2),
    ];
    publish_behind_gate(&transport, &cart("gate"), &batch).await;
    wait_until("the batch recorded", || async {
        let stats = runtime.consumer_stats("t-batch").unwrap();
        stats.handled == 3 && stats.stored == 2
    })
    .await;
    let per_cart = effects_per_cart(&t.db).await;
    assert_eq!(per_cart[&cart("free")], [1, 2]);
    assert!(!per_cart.contains_key(&held), "held/2 and held/3 waited");
    let statuses: Vec<String> = inbox_rows(&t.db, "t-batch")
        .await
        .into_iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(
        statuses,
        ["RETRY", "DONE", "PENDING", "DONE", "PENDING", "DONE"],
        "held/1, gate, held/2, free/1, held/3, free/2 in arrival order"
    );

    // held/1 comes due: it is handled, then the two behind it, in order.
    inbox_store::restate(&t.db, "t-batch", &first_id, &retry_later(Duration::ZERO))
        .await
        .unwrap();
    wait_until("held/1..3 handled", || async {
        runtime.consumer_stats("t-batch").unwrap().handled == 6
    })
    .await;
    let stats = runtime.shutdown().await.consumer("t-batch");
    assert_eq!((stats.dead, stats.duplicates), (0, 0));
    assert_eq!(effects_per_cart(&t.db).await[&held], [1, 2, 3]);
    let rows = inbox_rows(&t.db, "t-batch").await;
    assert!(rows.iter().all(|r| r.status == "DONE"), "{rows:?}");
}

backend_tests! {
    batch_behind_unfinished => batch_waits_behind_an_earlier_unfinished_message;
    batched => batched_deliveries_isolate_each_handler;
    batch_savepoints => batches_take_savepoints_only_after_a_failure;
    version_guard => version_guard_drops_stale_events;
    five_deliveries => same_message_five_times_one_effect;
    lost_ack => lost_ack_is_redelivered_and_suppressed;
    transient => transient_errors_retry_then_done;
    dead_after_limit => permanent_failures_dead_after_limit_others_flow;
    keyed_order => per_aggregate_order_under_keyed_concurrency;
    chain_atomic => consume_then_produce_is_atomic;
    bad_input => bad_input_is_dead_with_a_clear_error;
    stored_mode => stored_mode_acks_first_then_handles;
    local_transport => local_transport_delivers_to_every_consumer_once;
}

#[test]
fn handlers_are_registered_with_their_options() {
    let handlers = outbox::runtime::handlers().unwrap();
    let limited = &handlers["t-limited"][0];
    assert_eq!(limited.event_type, "line.added");
    assert_eq!(limited.max_attempts, Some(3));
    assert_eq!(limited.backoff_base_ms, Some(10));
    assert_eq!(
        handlers["t-stored"][0].mode,
        outbox::inbox::HandlerMode::Stored
    );
    assert!(limited.file.ends_with("inbox.rs"));
}

#[tokio::test]
async fn start_fails_for_a_missing_expected_consumer() {
    let db = sea_orm::Database::connect("sqlite::memory:").await.unwrap();
    let err = Runtime::builder(db)
        .expect_consumers(["billing"])
        .start()
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("`billing`") && text.contains("t-inline"),
        "{text}"
    );
}

/// A setting that cannot apply is refused at start, not ignored: a `source` beside an outbox
/// handle, which has its own.
#[tokio::test]
async fn a_source_beside_an_outbox_handle_is_refused() {
    let Some(t) = test_db(Backend::SqliteMemory, "inbox_source_and_outbox").await else {
        return;
    };
    let outbox = Outbox::new("order-service");
    let refused = Runtime::builder(t.db.clone())
        .outbox(&outbox)
        .source("billing-service")
        .consumers(Vec::<String>::new())
        .start()
        .await
        .expect_err("a source beside an outbox handle");
    let message = refused.to_string();
    assert!(
        matches!(refused, outbox::runtime::RuntimeError::Settings(_)),
        "{refused:?}"
    );
    assert!(
        message.contains("billing-service") && message.contains("order-service"),
        "{message}"
    );
    // The WAL mode needs a relay and a broker.
    #[cfg(feature = "postgres-wal")]
    for (builder, says) in [
        (
            Runtime::builder(t.db.clone()).without_relay(),
            "runs no relay",
        ),
        (Runtime::builder(t.db.clone()), "without a broker"),
    ] {
        let wal = outbox::relay::WalConfig::new("postgres://localhost/unused");
        let refused = builder
            .wal(wal)
            .consumers(Vec::<String>::new())
            .start()
            .await
            .expect_err("a WAL mode that cannot apply");
        assert!(
            matches!(&refused, outbox::runtime::RuntimeError::Settings(m) if m.contains(says)),
            "{refused:?}"
        );
    }
    // Either alone starts.
    for builder in [
        Runtime::builder(t.db.clone()).outbox(&outbox),
        Runtime::builder(t.db.clone()).source("billing-service"),
    ] {
        let runtime = builder
            .consumers(Vec::<String>::new())
            .start()
            .await
            .unwrap();
        runtime.shutdown().await;
    }
}

/// `RuntimeBuilder::instance_id` names what every loop of the runtime owns: the relay's row in
/// `outbox_relay` and the stored worker's `locked_by` (`{instance}/{consumer}`); without it a
/// consumer-only runtime still names its workers.
#[tokio::test]
async fn the_instance_id_names_the_relay_and_the_workers() {
    let Some(t) = test_db(Backend::SqliteMemory, "inbox_instance_id").await else {
        return;
    };
    let transport = MemoryTransport::new();
    let runtime = Runtime::builder(t.db.clone())
        .transport(transport.clone())
        .instance_id("orders-7")
        .relay_config(relay_config().heartbeat(Duration::from_millis(100)))
        .consumers(["t-stored"])
        .inbox_config(inbox_config())
        .start()
        .await
        .unwrap();
    assert!(transport.publish(&[message("named-cart", 1)]).await[0].is_ok());
    wait_until("handled by the worker and the relay recorded", || async {
        let status = outbox::admin::status(&t.db).await.unwrap();
        runtime.consumer_stats("t-stored").unwrap().handled == 1
            && status.relays.iter().any(|r| r.relay_id == "orders-7")
    })
    .await;
    runtime.shutdown().await;
    let rows = inbox_rows(&t.db, "t-stored").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, "DONE");
    assert_eq!(rows[0].locked_by.as_deref(), Some("orders-7/t-stored"));

    let transport = MemoryTransport::new();
    let runtime = consumer_runtime(&t, &transport, "t-stored").await;
    assert!(transport.publish(&[message("unnamed-cart", 1)]).await[0].is_ok());
    wait_until("handled by the worker", || async {
        runtime.consumer_stats("t-stored").unwrap().handled == 1
    })
    .await;
    runtime.shutdown().await;
    let rows = inbox_rows(&t.db, "t-stored").await;
    let unnamed = rows
        .iter()
        .find(|r| r.status == "DONE" && r.locked_by.as_deref() != Some("orders-7/t-stored"));
    let owner = unnamed
        .and_then(|r| r.locked_by.clone())
        .expect("a second row, handled");
    assert!(
        owner.ends_with("/t-stored") && owner.len() > "/t-stored".len(),
        "{owner}"
    );
}

/// The test kit shows the aggregate-version guard: a version older than one handled is
/// recognised as stale and has no effect.
#[cfg(feature = "testing")]
#[tokio::test]
async fn the_kit_shows_the_version_guard_dropping_a_stale_event() {
    let Some(t) = test_db(Backend::SqliteMemory, "kit_versioned").await else {
        return;
    };
    let consumer = outbox::testing::TestConsumer::new("t-versioned", &t.db).unwrap();
    let newer = CartRepriced {
        cart: "kit".into(),
        version: 2,
    };
    assert!(consumer.deliver(&newer).await.unwrap().is_done());
    let stale = consumer
        .deliver(&CartRepriced {
            cart: "kit".into(),
            version: 1,
        })
        .await
        .unwrap();
    assert!(stale.is_done(), "{stale:?}");
    let effects = effects(&t.db).await;
    assert_eq!(effects.len(), 1, "{effects:?}");
    assert_eq!(effects[0].seq, 2);
}
