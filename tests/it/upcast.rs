//! Upcasters on PostgreSQL, MariaDB and SQLite: a producer still emitting versions 1 and 2 of an
//! event, a consumer whose handler takes version 3 (through a broker: the relay publishes what the
//! producer committed), the chain 1 → 2 → 3 applied right before the handler with the received
//! version in its metadata, an upcaster that fails leaving the message DEAD with its error and
//! handled once replayed after the fix, and a chain with a missing step refused at start-up. And
//! a version-1 producer in another process, publishing to NATS JetStream, with this process's
//! version-3 consumer.

use std::{collections::HashSet, sync::Mutex, time::Duration};

use crate::common::*;
use outbox::admin::{self, Actor, DeadLetterFilter, Page, Selector};
use outbox::inbox::InboxConfig;
use outbox::prelude::*;
use outbox::relay::RelayConfig;
use outbox::runtime::RuntimeError;
use outbox::transport::memory::MemoryTransport;
use outbox::upcast::UpcastError;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent, schemars::JsonSchema)]
#[event(name = "upcast.order_placed", aggregate = "order", version = 1)]
struct OrderPlacedV1 {
    #[event(aggregate_id)]
    order: String,
    total: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent, schemars::JsonSchema)]
#[event(name = "upcast.order_placed", aggregate = "order", version = 2)]
struct OrderPlacedV2 {
    #[event(aggregate_id)]
    order: String,
    total: f64,
    currency: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent, schemars::JsonSchema)]
#[event(name = "upcast.order_placed", aggregate = "order", version = 3)]
struct OrderPlacedV3 {
    #[event(aggregate_id)]
    order: String,
    total_cents: i64,
    currency: String,
}

/// Version 1 knew one currency.
#[upcaster]
fn order_placed_v1_to_v2(old: OrderPlacedV1) -> OrderPlacedV2 {
    OrderPlacedV2 {
        order: old.order,
        total: old.total,
        currency: "EUR".into(),
    }
}

/// The orders whose refund the v2 → v3 step has been "fixed" to take (per order, as the tests of
/// each backend run at once).
static REFUNDS_FIXED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

fn refund_fixed(order: &str) -> bool {
    REFUNDS_FIXED
        .lock()
        .unwrap()
        .as_ref()
        .is_some_and(|fixed| fixed.contains(order))
}

/// Cents instead of a float; on the JSON, as a version whose struct is gone would be.
#[upcaster(event = "upcast.order_placed", from = 2)]
fn order_placed_v2_to_v3(mut payload: serde_json::Value) -> Result<serde_json::Value, String> {
    let total = payload["total"].as_f64().ok_or("`total` is not a number")?;
    if total < 0.0 && !refund_fixed(payload["order"].as_str().unwrap_or_default()) {
        return Err(format!("a negative total ({total}) has no version 3"));
    }
    let object = payload.as_object_mut().ok_or("not an object")?;
    object.remove("total");
    object.insert(
        "total_cents".into(),
        ((total * 100.0).round() as i64).into(),
    );
    Ok(payload)
}

#[inbox_handler(consumer = "t-upcast", max_attempts = 2, backoff = "10ms")]
async fn take_v3(tx: &InboxTransaction, event: Event<OrderPlacedV3>) -> Result<(), HandlerError> {
    let received = event.meta().received_schema_version.unwrap_or(0);
    let what = format!("{}:{}:v{received}", event.order, event.currency);
    insert_effect(tx, event.id(), &what, event.total_cents).await
}

// A chain with a gap: 1 → 2 exists, 2 → 3 does not, and the handler takes 3.
#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "upcast.gap", aggregate = "order", version = 1)]
struct GapV1 {
    #[event(aggregate_id)]
    order: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "upcast.gap", aggregate = "order", version = 2)]
struct GapV2 {
    #[event(aggregate_id)]
    order: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "upcast.gap", aggregate = "order", version = 3)]
struct GapV3 {
    #[event(aggregate_id)]
    order: String,
}

#[upcaster]
fn gap_v1_to_v2(old: GapV1) -> GapV2 {
    GapV2 { order: old.order }
}

#[inbox_handler(consumer = "t-upcast-gap")]
async fn take_gap_v3(_tx: &InboxTransaction, _event: Event<GapV3>) -> Result<(), HandlerError> {
    Ok(())
}

async fn old_versions_reach_the_new_handler(t: TestDb) {
    let transport = MemoryTransport::new();
    let outbox = Outbox::new("upcast-producer");
    let runtime = Runtime::builder(t.db.clone())
        .outbox(&outbox)
        .transport(transport.clone())
        .relay_config(RelayConfig::default().poll_interval(Duration::from_millis(100)))
        .consumers(["t-upcast"])
        .inbox_config(InboxConfig::default().max_attempts(2))
        .start()
        .await
        .unwrap();
    // A producer in the middle of a rolling deploy: all three versions, and a refund the v3
    // step cannot take yet.
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let order = |n: u32| format!("o-{n}-{}", &tag[..8]);
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.enqueue(&OrderPlacedV1 {
        order: order(1),
        total: 12.5,
    })
    .unwrap();
    tx.enqueue(&OrderPlacedV2 {
        order: order(2),
        total: 7.25,
        currency: "USD".into(),
    })
    .unwrap();
    tx.enqueue(&OrderPlacedV3 {
        order: order(3),
        total_cents: 99,
        currency: "CHF".into(),
    })
    .unwrap();
    let refund = tx
        .enqueue(&OrderPlacedV1 {
            order: order(4),
            total: -3.0,
        })
        .unwrap();
    let _ = tx.commit().await.unwrap();

    assert!(
        eventually(Duration::from_secs(30), || async {
            effects(&t.db).await.len() == 3
                && inbox_rows(&t.db, "t-upcast")
                    .await
                    .iter()
                    .any(|r| r.status == "DEAD")
        })
        .await,
        "three handled and one DEAD: {:?}",
        inbox_rows(&t.db, "t-upcast").await
    );
    let handled = handled(&t.db).await;
    assert_eq!(
        handled,
        [
            (format!("{}:EUR:v1", order(1)), 1250),
            (format!("{}:USD:v2", order(2)), 725),
            (format!("{}:CHF:v3", order(3)), 99)
        ]
    );
    // The inbox keeps what was received.
    let rows = inbox_rows(&t.db, "t-upcast").await;
    let dead: Vec<_> = rows.iter().filter(|r| r.status == "DEAD").collect();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message_id, refund.to_string());
    let error = dead[0].last_error.clone().unwrap();
    assert!(
        error.contains("upcasting `upcast.order_placed` from version 2 to 3 failed")
            && error.contains("a negative total (-3) has no version 3"),
        "{error}"
    );
    let listed = admin::dead_letters(
        &t.db,
        &DeadLetterFilter::default().consumer("t-upcast"),
        Page::default(),
    )
    .await
    .unwrap();
    let detail = admin::dead_letter(&t.db, listed[0].target).await.unwrap();
    assert_eq!(detail.schema_version, Some(1), "stored as received");

    // The fix is deployed; an operator replays the old dead letter.
    REFUNDS_FIXED
        .lock()
        .unwrap()
        .get_or_insert_with(HashSet::new)
        .insert(order(4));
    admin::replay(
        &t.db,
        &Selector::Ids(vec![listed[0].target]),
        &Actor::new("ops").reason("refunds upcast"),
    )
    .await
    .unwrap();
    assert!(
        eventually(Duration::from_secs(30), || async {
            effects(&t.db).await.len() == 4
        })
        .await
    );
    assert!(
        effects(&t.db)
            .await
            .iter()
            .any(|e| e.cart == format!("{}:EUR:v1", order(4)) && e.seq == -300)
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_with_a_missing_step_is_refused_at_start_up() {
    let db = sea_orm::Database::connect("sqlite::memory:").await.unwrap();
    let err = Runtime::builder(db)
        .transport(MemoryTransport::new())
        .without_relay()
        .consumers(["t-upcast-gap"])
        .start()
        .await
        .unwrap_err();
    let RuntimeError::Upcasters(problems) = &err else {
        panic!("{err}");
    };
    assert!(
        matches!(
            problems.as_slice(),
            [UpcastError::MissingStep { event_type, first_from: 1, missing: 2, next: 3, handled: 3, .. }]
                if event_type == "upcast.gap"
        ),
        "{problems:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("none from version 2 to 3") && text.contains("take_gap_v3"),
        "{text}"
    );
    // The complete chain starts.
    let db = sea_orm::Database::connect("sqlite::memory:").await.unwrap();
    assert!(
        Runtime::builder(db)
            .transport(MemoryTransport::new())
            .without_relay()
            .consumers(["t-upcast"])
            .start()
            .await
            .is_ok()
    );
}

/// Not a test of its own: the producer process that
/// `a_v1_producer_and_a_v3_consumer_in_two_processes` starts (it runs this test by name, with
/// `OUTBOX_UPCAST_PRODUCER` set to the database URL and the NATS namespace). An old release of
/// the producing service: it knows version 1 only, commits 20 orders and relays them to NATS.
/// Without the variable it returns at once.
#[cfg(all(feature = "postgres", feature = "nats"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upcast_producer_process() {
    use outbox::relay::Relay;
    use outbox::transport::nats::NatsTransport;
    let Ok(spec) = std::env::var("OUTBOX_UPCAST_PRODUCER") else {
        return;
    };
    let (url, namespace) = spec.split_once(' ').unwrap();
    let db = sea_orm::Database::connect(url).await.unwrap();
    let outbox = Outbox::new("orders-v1");
    for n in 0..20 {
        let tx = outbox.begin(&db).await.unwrap();
        tx.enqueue(&OrderPlacedV1 {
            order: format!("p-{n}"),
            total: f64::from(n) + 0.5,
        })
        .unwrap();
        let _ = tx.commit().await.unwrap();
    }
    let transport = NatsTransport::builder(crate::common::nats::NATS_URL)
        .namespace(namespace)
        .connect()
        .await
        .unwrap();
    let relay = Relay::new(db.clone(), std::sync::Arc::new(transport));
    let report = relay.drain(100).await.unwrap();
    assert_eq!(report.sent, 20, "{report:?}");
}

/// A producer still on version 1 in one process, a consumer on version 3 in this one, NATS
/// JetStream between them: every order handled once, upcast through both steps.
#[cfg(all(feature = "postgres", feature = "nats"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_producer_and_a_v3_consumer_in_two_processes() {
    use outbox::transport::nats::NatsTransport;
    let test = backend_test_name(module_path!(), "procs");
    let Some(t) = test_db(Backend::Postgres, &test).await else {
        return;
    };
    let Some(nats) = crate::common::nats::transport(&test).await else {
        return;
    };
    let transport = NatsTransport::builder(crate::common::nats::NATS_URL)
        .namespace(nats.namespace())
        .connect()
        .await
        .unwrap();
    let runtime = Runtime::builder(t.connect_again().await)
        .transport(transport)
        .without_relay()
        .consumers(["t-upcast"])
        .start()
        .await
        .unwrap();
    let child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["upcast::upcast_producer_process", "--exact", "--nocapture"])
        .env(
            "OUTBOX_UPCAST_PRODUCER",
            format!("{} {}", t.url, nats.namespace()),
        )
        .output()
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&child.stdout);
    assert!(
        child.status.success() && out.contains("1 passed"),
        "the producer process failed:\n{out}\n{}",
        String::from_utf8_lossy(&child.stderr)
    );
    assert!(
        eventually(Duration::from_secs(60), || async {
            effects(&t.db).await.len() == 20
        })
        .await,
        "{} of 20 handled",
        effects(&t.db).await.len()
    );
    let handled = handled(&t.db).await;
    let mut expected: Vec<(String, i64)> = (0..20)
        .map(|n| (format!("p-{n}:EUR:v1"), i64::from(n) * 100 + 50))
        .collect();
    expected.sort();
    assert_eq!(handled, expected);
    let rows = inbox_rows(&t.db, "t-upcast").await;
    assert!(
        rows.len() == 20 && rows.iter().all(|r| r.status == "DONE"),
        "{rows:?}"
    );
    runtime.shutdown().await;
}

backend_tests! {
    old_versions => old_versions_reach_the_new_handler;
}

/// What the handlers recorded, as (what, amount), sorted.
async fn handled(db: &sea_orm::DatabaseConnection) -> Vec<(String, i64)> {
    let mut handled: Vec<(String, i64)> = effects(db)
        .await
        .into_iter()
        .map(|e| (e.cart, e.seq))
        .collect();
    handled.sort();
    handled
}

/// The test kit delivers a version 1 event to the handler of version 3: the upcasters run, and
/// one that refuses the payload sends the message DEAD with its reason.
#[cfg(feature = "testing")]
#[tokio::test]
async fn the_kit_delivers_an_old_version_through_the_upcasters() {
    let Some(t) = test_db(Backend::Postgres, "kit_upcast").await else {
        return;
    };
    let consumer = outbox::testing::TestConsumer::new("t-upcast", &t.db).unwrap();
    let outcome = consumer
        .deliver(&OrderPlacedV1 {
            order: "kit-1".into(),
            total: 12.5,
        })
        .await
        .unwrap();
    assert!(outcome.is_done(), "{outcome:?}");
    let effects = effects(&t.db).await;
    assert_eq!(effects.len(), 1);
    assert_eq!(
        (effects[0].cart.as_str(), effects[0].seq),
        ("kit-1:EUR:v1", 1250)
    );
    let refused = consumer
        .deliver(&OrderPlacedV1 {
            order: "kit-2".into(),
            total: -1.0,
        })
        .await
        .unwrap();
    assert!(refused.is_dead(), "{refused:?}");
    assert!(
        refused
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("a negative total (-1) has no version 3")),
        "{refused:?}"
    );
}
