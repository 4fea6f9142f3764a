//! Every failpoint armed with `return` (the SDK acts as if its process died at that point) in a
//! running runtime on PostgreSQL with the in-memory transport: the events still reach the
//! handler, each handled exactly once, and nothing is left behind. The process-kill harness
//! (`tests/chaos.rs`) arms the same failpoints with `panic` in real processes over JetStream.
//!
//! Failpoints are global to the process, so the scenarios take turns, and they are a binary of
//! their own (outside `tests/it`): an armed failpoint fires in every runtime of the process, so
//! it would strike the other integration tests running beside these.

#[path = "it/common/mod.rs"]
mod common;

use std::{
    sync::atomic::{AtomicBool, AtomicUsize, Ordering},
    time::Duration,
};

use common::carts::*;
use common::*;
use outbox::failpoints::{self, FailScenario};
use outbox::inbox::InboxConfig;
use outbox::prelude::*;
use outbox::relay::{Backoff, RelayConfig};
use outbox::retention::RetentionPolicy;
use outbox::runtime::Runtime;
use outbox::transport::{SubscribeOptions, memory::MemoryTransport};

/// One scenario at a time: failpoints are process-wide.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Handler runs in the current scenario (committed or not).
static RUNS: AtomicUsize = AtomicUsize::new(0);

/// Fail the first attempt of every event while set.
static FAIL_FIRST: AtomicBool = AtomicBool::new(false);

#[inbox_handler(consumer = "fp", backoff = "10ms", backoff_cap = "50ms")]
async fn record(tx: &InboxTransaction, event: Event<LineAdded>) -> Result<(), HandlerError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    if FAIL_FIRST.load(Ordering::SeqCst) && event.meta().attempt == 1 {
        return Err(HandlerError::retry("first attempt fails"));
    }
    record_line(tx, &event).await
}

const EVENTS: usize = 40; // 8 carts x 5 lines

/// How the scenario's relay publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Only through the claim loop (for the loop's failpoints: with the fast path on, every
    /// event could go by the fast path and they would never fire).
    ClaimLoop,
    /// Through its fast path, with the claim loop as the safety net.
    FastPath,
    /// From the WAL (on the PostgreSQL cluster with `wal_level = logical`).
    #[cfg_attr(not(feature = "postgres-wal"), allow(dead_code))]
    Wal,
}

/// A runtime whose relay publishes as `mode` says.
async fn start(t: &TestDb, transport: &MemoryTransport, mode: Mode) -> Runtime {
    let fast_path = mode == Mode::FastPath;
    let builder = Runtime::builder(t.db.clone());
    #[cfg(feature = "postgres-wal")]
    let builder = match mode {
        Mode::Wal => builder.wal(
            outbox::relay::WalConfig::new(t.url.clone())
                .slot(format!("outbox_{}", t.name))
                .table_grace(Duration::from_secs(2)),
        ),
        _ => builder,
    };
    builder
        .transport(transport.clone())
        .consumers(["fp"])
        .relay_config(
            RelayConfig::default()
                .lease(Duration::from_millis(500))
                .fast_path(fast_path)
                .fast_path_lease(Duration::from_millis(500))
                .poll_interval(Duration::from_millis(50))
                .error_delay(Duration::from_millis(50))
                .backoff(
                    Backoff::default()
                        .base(Duration::from_millis(10))
                        .cap(Duration::from_millis(50))
                        .jitter(0.1),
                ),
        )
        .inbox_config(
            InboxConfig::default()
                .lease(Duration::from_millis(500))
                .poll_interval(Duration::from_millis(50))
                .subscribe(SubscribeOptions::default().ack_wait(Duration::from_millis(300))),
        )
        .retention(None, Duration::from_secs(60))
        .start()
        .await
        .unwrap()
}

/// Produce, let the runtime deliver through the armed failpoint, and check the outcome a user
/// relies on. Returns the runtime's final report and how often the failpoint fired.
async fn survives(test: &str, failpoint: &str, actions: &str) -> Option<Outcome> {
    survives_with(test, failpoint, actions, false, Mode::FastPath).await
}

async fn survives_with(
    test: &str,
    failpoint: &str,
    actions: &str,
    fail_first: bool,
    mode: Mode,
) -> Option<Outcome> {
    let _turn = TURN.lock().await;
    FAIL_FIRST.store(fail_first, Ordering::SeqCst);
    let t = match mode {
        Mode::Wal => logical_test_db(test).await?,
        _ => test_db(Backend::Postgres, test).await?,
    };
    let scenario = FailScenario::setup();
    failpoints::cfg(failpoint, actions).unwrap();
    RUNS.store(0, Ordering::SeqCst);
    let transport = MemoryTransport::new();
    let runtime = start(&t, &transport, mode).await;
    if mode == Mode::FastPath {
        // The relay's fast path takes the commits (those behind an unsent event of their cart
        // wait for the claim loop).
        assert!(
            eventually(Duration::from_secs(10), || async {
                runtime.outbox().fast_path_running()
            })
            .await
        );
    }
    if mode == Mode::Wal {
        // The relay streams: commits from now on are in its slot.
        let slot = format!("outbox_{}", t.name);
        assert!(
            // Streaming, not only the slot there (a slot being created is active before its
            // consistent point).
            eventually(Duration::from_secs(20), || async {
                runtime.relay_stats().map(|s| s.wal) == Some(outbox::relay::WalReader::Streaming)
                    && outbox::store::wal::slot(&t.db, &slot)
                        .await
                        .unwrap()
                        .is_some_and(|s| s.active)
            })
            .await,
            "{test}: the relay streams from its slot"
        );
    }
    produce(&t, runtime.outbox(), 8, 5, 10).await;
    let settled = eventually(Duration::from_secs(30), || async {
        effects(&t.db).await.len() >= EVENTS
            && status_counts(&t.db).await.get("SENT") == Some(&(EVENTS as i64))
            && inbox_rows(&t.db, "fp")
                .await
                .iter()
                .all(|r| r.status == "DONE")
    })
    .await;
    // Let late redeliveries arrive: they must be suppressed, not handled.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let report = runtime.shutdown().await;
    scenario.teardown();
    if mode == Mode::Wal {
        // Slots are the cluster's: leave none holding its WAL.
        outbox::store::wal::drop_slot(&t.db, &format!("outbox_{}", t.name), true)
            .await
            .unwrap();
    }
    assert!(settled, "{test}: not everything was delivered and handled");

    let effects = effects(&t.db).await;
    let mut ids: Vec<&str> = effects.iter().map(|e| e.event_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(effects.len(), EVENTS, "{test}: one effect per event");
    assert_eq!(ids.len(), EVENTS, "{test}: no event handled twice");
    let rows = outbox_rows(&t.db).await;
    assert!(rows.iter().all(|r| r.status == "SENT"), "{test}: {rows:?}");
    let inbox = inbox_rows(&t.db, "fp").await;
    assert_eq!(inbox.len(), EVENTS, "{test}: one inbox row per event");
    assert!(
        inbox.iter().all(|r| r.status == "DONE"),
        "{test}: {inbox:?}"
    );
    Some(Outcome {
        report,
        transport,
        rows,
        order: effect_order(&effects),
        runs: RUNS.load(Ordering::SeqCst),
    })
}

struct Outcome {
    report: outbox::runtime::RuntimeReport,
    transport: MemoryTransport,
    rows: Vec<OutboxRow>,
    /// Per cart, the lines in the order their effects committed.
    order: std::collections::HashMap<String, Vec<u32>>,
    /// Handler runs, committed or not.
    runs: usize,
}

fn effect_order(effects: &[effect::Model]) -> std::collections::HashMap<String, Vec<u32>> {
    let mut sorted: Vec<&effect::Model> = effects.iter().collect();
    sorted.sort_by_key(|e| e.id);
    let mut order = std::collections::HashMap::<String, Vec<u32>>::new();
    for e in sorted {
        order.entry(e.cart.clone()).or_default().push(e.seq as u32);
    }
    order
}

/// A publisher died holding leased rows it had not published (the relay after its claim, the
/// fast path after the commit): they were taken over when the lease expired, which counts as an
/// attempt, and published once.
async fn dies_before_publishing(test: &str, failpoint: &str, mode: Mode) {
    let Some(o) = survives_with(test, failpoint, "2*return", false, mode).await else {
        return;
    };
    assert!(
        o.rows.iter().any(|r| r.attempts >= 1),
        "{test}: a taken-over event shows its attempt: {:?}",
        o.rows
    );
    assert_eq!(
        o.transport.len(),
        EVENTS,
        "{test}: nothing was published twice"
    );
    assert_strictly_increasing(&o.order, 5);
}

/// A publisher died after the broker confirmed, before marking SENT: the rows were published
/// again after the lease, with the same bytes, and the inbox suppressed the copies.
async fn dies_before_marking(test: &str, failpoint: &str, mode: Mode) {
    let Some(o) = survives_with(test, failpoint, "1*return", false, mode).await else {
        return;
    };
    assert!(
        o.transport.len() > EVENTS,
        "{test}: the unmarked events were published again: {} messages",
        o.transport.len()
    );
    assert!(o.report.consumer("fp").duplicates > 0, "{:?}", o.report);
    assert_strictly_increasing(&o.order, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_dies_after_claim() {
    dies_before_publishing(
        "fp_after_claim",
        failpoints::RELAY_AFTER_CLAIM,
        Mode::ClaimLoop,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_dies_after_publish() {
    dies_before_marking(
        "fp_after_publish",
        failpoints::RELAY_AFTER_PUBLISH,
        Mode::ClaimLoop,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_path_dies_after_commit() {
    dies_before_publishing(
        "fp_fast_after_commit",
        failpoints::FAST_PATH_AFTER_COMMIT,
        Mode::FastPath,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_path_dies_after_publish() {
    dies_before_marking(
        "fp_fast_after_publish",
        failpoints::FAST_PATH_AFTER_PUBLISH,
        Mode::FastPath,
    )
    .await;
}

/// The WAL relay died after the broker confirmed a batch, before marking it SENT or confirming
/// the slot's position: the batch is read from the slot again and published again, the inbox
/// suppresses the copies, and no event is charged an attempt (nothing was claimed).
#[cfg(feature = "postgres-wal")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_relay_dies_after_publish() {
    let Some(o) = survives_with(
        "fp_wal_after_publish",
        failpoints::WAL_AFTER_PUBLISH,
        "1*return",
        false,
        Mode::Wal,
    )
    .await
    else {
        return;
    };
    assert!(
        o.transport.len() > EVENTS,
        "the unmarked batch was published again: {} messages",
        o.transport.len()
    );
    assert!(o.report.consumer("fp").duplicates > 0, "{:?}", o.report);
    assert!(o.rows.iter().all(|r| r.attempts == 0), "{:?}", o.rows);
    assert_strictly_increasing(&o.order, 5);
}

/// The WAL relay died after marking a batch SENT, before confirming the slot's position: the
/// batch is read again, and the check against the rows skips what is SENT, so nothing is
/// published twice.
#[cfg(feature = "postgres-wal")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wal_relay_dies_before_confirming() {
    let Some(o) = survives_with(
        "fp_wal_before_confirm",
        failpoints::WAL_BEFORE_CONFIRM,
        "2*return",
        false,
        Mode::Wal,
    )
    .await
    else {
        return;
    };
    assert_eq!(o.transport.len(), EVENTS, "nothing was published twice");
    assert!(
        o.rows
            .iter()
            .all(|r| r.attempts == 0 && r.claim_token.is_none()),
        "{:?}",
        o.rows
    );
    assert_strictly_increasing(&o.order, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_dies_after_handler_before_commit() {
    let Some(o) = survives(
        "fp_after_handler",
        failpoints::INBOX_AFTER_HANDLER,
        "3*return",
    )
    .await
    else {
        return;
    };
    // The handler's work was rolled back with its inbox row; the redelivery ran it again.
    assert_eq!(o.runs, EVENTS + 3, "three runs were lost and repeated");
    assert_eq!(o.report.consumer("fp").handled, EVENTS as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_dies_after_commit_before_ack() {
    let Some(o) = survives(
        "fp_after_commit",
        failpoints::INBOX_AFTER_COMMIT,
        "3*return",
    )
    .await
    else {
        return;
    };
    // Committed but never acked: the broker redelivered, the inbox suppressed the copies.
    let stats = o.report.consumer("fp");
    assert!(stats.duplicates >= 3, "{stats:?}");
    assert_eq!(o.runs, EVENTS, "a copy never reached the handler");
    assert_eq!(stats.handled, EVENTS as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_dies_while_storing_a_retry() {
    let outcome = survives_with(
        "fp_store_retry",
        failpoints::INBOX_STORE_RETRY,
        "5*return",
        true,
        Mode::FastPath,
    )
    .await;
    let Some(o) = outcome else {
        return;
    };
    // Each first attempt fails; five of those fail twice (the failure was not stored, the
    // redelivery is a first attempt again), then the stored retry succeeds.
    assert_eq!(o.runs, 2 * EVENTS + 5);
    let stats = o.report.consumer("fp");
    assert_eq!(stats.retried, EVENTS as u64, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn janitor_dies_between_batches() {
    let _turn = TURN.lock().await;
    let Some(t) = test_db(Backend::Postgres, "fp_janitor").await else {
        return;
    };
    let outbox = Outbox::new("fp");
    produce(&t, &outbox, 4, 5, 20).await;
    t.db.execute_unprepared(
        "UPDATE outbox_event SET status = 'SENT', sent_at = now() - interval '1 hour'",
    )
    .await
    .unwrap();
    let policy = RetentionPolicy::default()
        .sent_after(Duration::from_secs(60))
        .batch_size(5)
        .pause(Duration::ZERO)
        .lease(Duration::from_secs(10));
    let scenario = FailScenario::setup();
    failpoints::cfg(failpoints::JANITOR_BETWEEN_BATCHES, "1*return").unwrap();
    let first = outbox::retention::purge_once_if_leader(&t.db, &policy, "janitor-a").await;
    let error = first.expect_err("the janitor died after its first batch");
    assert!(error.to_string().contains("failpoint"), "{error}");
    // The first batch was committed on its own; the rest waits for the next run.
    assert_eq!(count_events(&t.db).await, 15);
    let second = outbox::retention::purge_once_if_leader(&t.db, &policy, "janitor-a")
        .await
        .unwrap()
        .expect("still the leader");
    scenario.teardown();
    assert_eq!(second.outbox_deleted, 15);
    assert_eq!(count_events(&t.db).await, 0);
}

/// A payment provider's webhook body: JSON of its own.
#[derive(Debug, serde::Deserialize)]
struct Payment {
    payment_id: String,
}

/// Webhook payments handled: one effect each.
#[inbox_handler(
    consumer = "fp-hooks",
    source = "psp-fp",
    message_type = "payment.succeeded"
)]
async fn record_payment(
    tx: &InboxTransaction,
    message: Event<Payment>,
) -> Result<(), HandlerError> {
    insert_effect(tx, message.id(), &message.payment_id, 1).await
}

/// The webhook receiver stops after the commit and before its answer (a `500` with `return`,
/// a dropped connection with `panic`): the sender, seeing no 200, sends again, and the copy is
/// answered `200 duplicate`. Each payment takes effect once. On PostgreSQL, and MariaDB and
/// SQLite with their features.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_dies_after_commit_before_answer() {
    use common::http as web;
    use outbox::webhook::{HmacSha256, SignatureVerifier as _, Webhook};
    let _turn = TURN.lock().await;
    let mut backends = vec![(Backend::Postgres, "pg")];
    #[cfg(feature = "mysql")]
    backends.push((Backend::MySql, "my"));
    #[cfg(feature = "sqlite")]
    backends.push((Backend::SqliteFile, "lf"));
    for (backend, tag) in backends {
        let Some(t) = test_db(backend, &format!("fp_webhook_{tag}")).await else {
            continue;
        };
        let runtime = worker_runtime(&t.db, ["fp-hooks"]).await;
        let secret = b"fp-secret".to_vec();
        let webhook = Webhook::new(
            runtime.external_inbox(),
            "fp-hooks",
            "psp-fp",
            HmacSha256::new(secret.clone()),
        );
        let app = axum::Router::new().route("/hooks", outbox::webhook::axum::handler(webhook));
        let (addr, server) = web::serve(app).await;
        let url = format!("http://{addr}/hooks");
        let client = web::client();
        let signer = HmacSha256::new(secret);
        let send = |id: &'static str| {
            let body =
                format!(r#"{{"id":"{id}","type":"payment.succeeded","payment_id":"pay-{id}"}}"#)
                    .into_bytes();
            let headers = signer.sign(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs() as i64,
                &body,
            );
            assert!(
                signer
                    .verify(&headers, &body, std::time::SystemTime::now())
                    .is_ok()
            );
            let (client, url) = (client.clone(), url.clone());
            async move { web::post(&client, &url, &headers, body).await }
        };

        let scenario = FailScenario::setup();
        for (id, action) in [("evt_return", "1*return"), ("evt_panic", "1*panic")] {
            failpoints::cfg(failpoints::WEBHOOK_AFTER_COMMIT, action).unwrap();
            let first = send(id).await;
            match action {
                "1*return" => {
                    let answer = first.unwrap();
                    assert_eq!(answer.status, 500, "{tag}: {answer:?}");
                    assert!(answer.body.contains("after the commit"), "{answer:?}");
                }
                _ => assert!(first.is_err(), "{tag}: the connection dropped: {first:?}"),
            }
            // Committed already: the sender's retry is recognised.
            let retry = send(id).await.unwrap();
            assert_eq!(
                (retry.status.as_u16(), retry.outcome()),
                (200, "duplicate".to_owned()),
                "{tag}: {retry:?}"
            );
        }
        scenario.teardown();
        let handled = eventually(Duration::from_secs(20), || async {
            effects(&t.db).await.len() >= 2
        })
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(handled, "{tag}: both payments handled");
        let effects = effects(&t.db).await;
        let mut payments: Vec<&str> = effects.iter().map(|e| e.cart.as_str()).collect();
        payments.sort_unstable();
        assert_eq!(payments, ["pay-evt_panic", "pay-evt_return"], "{tag}");
        let rows = inbox_rows(&t.db, "fp-hooks").await;
        assert_eq!(rows.len(), 2, "{tag}: {rows:?}");
        assert!(rows.iter().all(|r| r.status == "DONE"), "{tag}: {rows:?}");
        server.abort();
        runtime.shutdown().await;
    }
}
