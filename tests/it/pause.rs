//! An operator pauses a consumer or the publishing of a destination, and resumes it, through the
//! admin API and the CLI: every instance honours it within seconds; a paused consumer takes no
//! message (nothing is nacked into retries: the messages wait in the broker), a paused
//! destination's events wait PENDING with no attempt spent while other destinations go on, and
//! later events of their aggregates wait behind them; both are audited and shown in status.
//! Against PostgreSQL and NATS JetStream, with two runtime instances.

use std::time::Duration;

use crate::cli::{run, run_json};
use crate::common::carts::*;
use crate::common::nats::transport;
use crate::common::*;
use outbox::admin::{self, Actor, PauseKind};
use outbox::prelude::*;
use outbox::relay::RelayConfig;
use outbox::runtime::Runtime;
use outbox::transport::Transport;

#[inbox_handler(consumer = "t-pause")]
async fn handle(tx: &InboxTransaction, event: Event<LineAdded>) -> Result<(), HandlerError> {
    record_line(tx, &event).await
}

/// A second event type of the cart, published to a destination of its own.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, DomainEvent)]
#[event(name = "pause.cart_checked_out", aggregate = "cart")]
struct CheckedOut {
    #[event(aggregate_id)]
    cart: String,
}

/// Longer than a refresh of `outbox_pause` and a loop's round: by then every instance honours
/// a pause.
const HONOURED: Duration = Duration::from_secs(4);

async fn instance(t: &TestDb, nats: &crate::common::nats::TestTransport, id: &str) -> Runtime {
    Runtime::builder(t.db.clone())
        .source("carts")
        .transport(nats.0.clone())
        .consumers(["t-pause"])
        .relay_config(
            RelayConfig::default()
                .relay_id(id.to_owned())
                .poll_interval(Duration::from_millis(100)),
        )
        .start()
        .await
        .unwrap()
}

/// Whether `n` events are SENT within 30 s.
async fn sent_reaches(t: &TestDb, n: usize) -> bool {
    eventually(Duration::from_secs(30), || async {
        sent(t).await.len() == n
    })
    .await
}

/// The events marked SENT (in `outbox_event` or, once the rotation is on, `outbox_sent`).
async fn sent(t: &TestDb) -> Vec<OutboxRow> {
    outbox_rows(&t.db)
        .await
        .into_iter()
        .filter(|r| r.status == "SENT")
        .collect()
}

/// The events not SENT yet.
async fn unsent(t: &TestDb) -> Vec<OutboxRow> {
    outbox_rows(&t.db)
        .await
        .into_iter()
        .filter(|r| r.status != "SENT")
        .collect()
}

async fn commit(t: &TestDb, outbox: &Outbox, cart: &str, seqs: std::ops::Range<u32>) {
    let lines: Vec<(&str, u32)> = seqs.map(|seq| (cart, seq)).collect();
    commit_lines(outbox.begin(&t.db).await.unwrap(), &lines).await;
}

/// A paused consumer takes nothing on either instance: the events are published, but no
/// message is recorded, handled or retried until it is resumed; then each is handled once, on
/// its first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_consumer_takes_nothing_until_resumed() {
    let Some(t) = test_db(Backend::Postgres, "pause_consumer").await else {
        return;
    };
    let Some(nats) = transport("pause_consumer").await else {
        return;
    };
    let a = instance(&t, &nats, "pause-a").await;
    let b = instance(&t, &nats, "pause-b").await;
    commit(&t, a.outbox(), "cart-1", 0..3).await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            effects(&t.db).await.len() == 3
        })
        .await
    );

    let alice = Actor::new("alice").reason("stock service down");
    let report = admin::pause(&t.db, PauseKind::Consumer, "t-pause", &alice)
        .await
        .unwrap();
    assert!(report.changed);
    tokio::time::sleep(HONOURED).await;
    commit(&t, a.outbox(), "cart-1", 3..6).await;
    commit(&t, b.outbox(), "cart-2", 0..3).await;
    // Published to the broker, taken by no instance.
    assert!(
        sent_reaches(&t, 9).await,
        "the events are published while the consumer is paused"
    );
    tokio::time::sleep(HONOURED).await;
    assert_eq!(
        effects(&t.db).await.len(),
        3,
        "nothing handled while paused"
    );
    assert_eq!(
        inbox_rows(&t.db, "t-pause").await.len(),
        3,
        "nothing recorded (or retried) while paused"
    );
    let status = admin::status(&t.db).await.unwrap();
    assert_eq!(status.paused.len(), 1, "{:?}", status.paused);
    assert_eq!(status.paused[0].name, "t-pause");
    assert_eq!(status.paused[0].by.as_deref(), Some("alice"));
    assert_eq!(
        status.paused[0].reason.as_deref(),
        Some("stock service down")
    );

    let report = admin::resume(&t.db, PauseKind::Consumer, "t-pause", &Actor::new("bob"))
        .await
        .unwrap();
    assert!(report.changed);
    assert!(
        eventually(Duration::from_secs(30), || async {
            effects(&t.db).await.len() == 9
        })
        .await,
        "everything handled once resumed"
    );
    a.shutdown().await;
    b.shutdown().await;
    let effects = effects(&t.db).await;
    let ids: std::collections::BTreeSet<&str> =
        effects.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids.len(), 9, "each event handled once");
    // (Order across instances is not promised: each can take messages of one aggregate.)
    for (cart, n) in [("cart-1", 6), ("cart-2", 3)] {
        let mut seqs: Vec<i64> = effects
            .iter()
            .filter(|e| e.cart == cart)
            .map(|e| e.seq)
            .collect();
        seqs.sort_unstable();
        assert_eq!(seqs, (0..n).collect::<Vec<_>>(), "{cart}: each once");
    }
    let rows = inbox_rows(&t.db, "t-pause").await;
    assert!(
        rows.iter().all(|r| r.status == "DONE" && r.attempts <= 1),
        "no message was nacked into a retry: {rows:?}"
    );
    let audit = admin::audit_log(&t.db, 10).await.unwrap();
    let actions: Vec<(&str, &str)> = audit
        .iter()
        .map(|a| (a.action.as_str(), a.target.as_str()))
        .collect();
    assert!(
        actions.contains(&("pause", "consumer t-pause")),
        "{actions:?}"
    );
    assert!(
        actions.contains(&("resume", "consumer t-pause")),
        "{actions:?}"
    );
}

/// A paused destination publishes nothing, from the fast path or the claim loop: its events
/// stay PENDING with no attempt, and a later event of another destination in the same
/// aggregate waits behind them; other aggregates' events of another destination are published.
/// Once resumed, everything is published in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_destination_holds_its_events_and_no_others() {
    let Some(t) = test_db(Backend::Postgres, "pause_destination").await else {
        return;
    };
    let Some(nats) = transport("pause_destination").await else {
        return;
    };
    let routing = nats.0.routing().unwrap();
    let lines = routing.address(LineAdded::EVENT_TYPE, LineAdded::AGGREGATE_TYPE);
    let checkouts = routing.address(CheckedOut::EVENT_TYPE, CheckedOut::AGGREGATE_TYPE);
    admin::pause(&t.db, PauseKind::Destination, &lines, &Actor::new("alice"))
        .await
        .unwrap();
    let a = instance(&t, &nats, "dest-a").await;
    let b = instance(&t, &nats, "dest-b").await;
    // Through the fast path (a's handle) and the claim loop (a handle without one).
    for outbox in [a.outbox().clone(), Outbox::new("carts")] {
        let tx = outbox.begin(&t.db).await.unwrap();
        tx.enqueue(&LineAdded {
            cart: "held".into(),
            seq: 0,
        })
        .unwrap();
        tx.enqueue(&CheckedOut {
            cart: "held".into(),
        })
        .unwrap();
        tx.enqueue(&CheckedOut {
            cart: format!("free-{}", outbox.source()),
        })
        .unwrap();
        let _ = tx.commit().await.unwrap();
    }
    assert!(
        sent_reaches(&t, 2).await,
        "the other destination's events of other aggregates are published"
    );
    tokio::time::sleep(HONOURED).await;
    let published = sent(&t).await;
    assert_eq!(published.len(), 2, "{published:?}");
    assert!(
        published
            .iter()
            .all(|r| r.aggregate_id.starts_with("free-")),
        "{published:?}"
    );
    let waiting = unsent(&t).await;
    assert_eq!(waiting.len(), 4, "{waiting:?}");
    assert!(
        waiting
            .iter()
            .all(|r| r.status == "PENDING" && r.attempts == 0 && r.aggregate_id == "held"),
        "held back without an attempt: {waiting:?}"
    );
    let status = run_json(&t.url, &["status"]).await;
    assert_eq!(status["paused"][0]["kind"], "destination");
    assert_eq!(status["paused"][0]["name"], lines.as_str());

    admin::resume(&t.db, PauseKind::Destination, &lines, &Actor::new("alice"))
        .await
        .unwrap();
    assert!(
        sent_reaches(&t, 6).await,
        "everything is published once resumed: {:?}",
        unsent(&t).await
    );
    a.shutdown().await;
    b.shutdown().await;
    let held: Vec<_> = sent(&t)
        .await
        .into_iter()
        .filter(|r| r.aggregate_id == "held")
        .collect();
    assert_eq!(held.len(), 4, "{held:?}");
    assert!(
        held.iter().all(|r| r.attempts == 0),
        "no attempt was spent on the paused destination: {held:?}"
    );
    // The other destination was never paused.
    assert!(
        !admin::pauses(&t.db)
            .await
            .unwrap()
            .iter()
            .any(|p| p.name == checkouts)
    );
}

/// The CLI pauses and resumes, lists the pauses, shows them in `status`, and refuses a name
/// no pause can have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_pauses_and_resumes() {
    let Some(t) = test_db(Backend::SqliteFile, "pause_cli").await else {
        return;
    };
    let url = t.url.as_str();
    let out = run(
        url,
        &[
            "pause",
            "consumer",
            "inventory",
            "--actor",
            "alice",
            "--reason",
            "stock down",
        ],
        0,
    )
    .await;
    assert!(out.contains("paused consumer inventory"), "{out}");
    let out = run(url, &["pause", "consumer", "inventory"], 0).await;
    assert!(out.contains("was paused already"), "{out}");
    run(url, &["pause", "destination", "shop.order.placed"], 0).await;
    let listed = run_json(url, &["pauses"]).await;
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    assert_eq!(listed[0]["kind"], "consumer");
    assert_eq!(listed[0]["by"], "alice");
    assert_eq!(listed[0]["reason"], "stock down");
    assert_eq!(listed[1]["name"], "shop.order.placed");
    assert_eq!(listed[1]["by"], "tester", "the user running the CLI");
    let table = run(url, &["status"], 0).await;
    assert!(table.contains("PAUSED"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("consumer") && l.contains("inventory") && l.contains("alice")),
        "{table}"
    );
    let out = run(url, &["resume", "consumer", "inventory"], 0).await;
    assert!(out.contains("resumed consumer inventory"), "{out}");
    let out = run(url, &["resume", "consumer", "inventory"], 0).await;
    assert!(out.contains("was not paused"), "{out}");
    let table = run(url, &["pauses"], 0).await;
    assert!(!table.contains("inventory"), "{table}");
    let audit = run_json(url, &["audit"]).await;
    let actions: Vec<String> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            format!(
                "{} {}",
                a["action"].as_str().unwrap(),
                a["target"].as_str().unwrap()
            )
        })
        .collect();
    assert!(
        actions.contains(&"pause consumer inventory".to_owned()),
        "{actions:?}"
    );
    assert!(
        actions.contains(&"resume consumer inventory".to_owned()),
        "{actions:?}"
    );
    let long = "x".repeat(300);
    let refused = crate::cli::cli(Some(url), &["pause", "consumer", &long]).await;
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        crate::cli::stderr(&refused).contains("1 to 255 characters"),
        "{}",
        crate::cli::stderr(&refused)
    );
    let refused = crate::cli::cli(Some(url), &["pause", "queue", "x"]).await;
    assert_eq!(
        refused.status.code(),
        Some(2),
        "an unknown kind is a usage error"
    );
}

#[inbox_handler(consumer = "t-pause-local")]
async fn handle_local(tx: &InboxTransaction, event: Event<LineAdded>) -> Result<(), HandlerError> {
    record_line(tx, &event).await
}

/// With the database-local transport the relay still moves events into a paused consumer's
/// inbox (that is their delivery), and its worker claims none of them until it is resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_local_consumer_claims_nothing() {
    let Some(t) = test_db(Backend::SqliteFile, "pause_local").await else {
        return;
    };
    admin::pause(
        &t.db,
        PauseKind::Consumer,
        "t-pause-local",
        &Actor::new("alice"),
    )
    .await
    .unwrap();
    let runtime = Runtime::builder(t.db.clone())
        .source("carts")
        .consumers(["t-pause-local"])
        .relay_config(RelayConfig::default().poll_interval(Duration::from_millis(50)))
        .start()
        .await
        .unwrap();
    commit(&t, runtime.outbox(), "cart-l", 0..3).await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            inbox_rows(&t.db, "t-pause-local").await.len() == 3
        })
        .await,
        "delivered into the inbox"
    );
    tokio::time::sleep(HONOURED).await;
    let rows = inbox_rows(&t.db, "t-pause-local").await;
    assert!(
        rows.iter()
            .all(|r| r.status == "PENDING" && r.attempts == 0),
        "{rows:?}"
    );
    assert!(effects(&t.db).await.is_empty());
    admin::resume(
        &t.db,
        PauseKind::Consumer,
        "t-pause-local",
        &Actor::new("alice"),
    )
    .await
    .unwrap();
    assert!(
        eventually(Duration::from_secs(30), || async {
            effects(&t.db).await.len() == 3
        })
        .await,
        "handled once resumed"
    );
    runtime.shutdown().await;
    let seqs: Vec<i64> = effects(&t.db).await.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [0, 1, 2]);
}
