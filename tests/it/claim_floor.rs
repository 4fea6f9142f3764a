//! The claim's floor on PostgreSQL (see the runtime's `store/floor.rs`): the relay's scans of
//! unsent rows start at the oldest unsent event that is not DEAD instead of at the first entry
//! of the partial index, which a held horizon fills with entries of events sent long ago. A
//! floor must never pass an event that can still appear below it: one inserted by a
//! transaction that commits late, and one an operator replays. These tests hold such an event
//! back while the relay claims for seconds (long enough for its floor to move) and check that
//! the floor stopped below it, and that it and the events behind it in its aggregate are
//! published, in order.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use crate::common::carts::*;
use crate::common::*;
use outbox::admin::{self, Actor, Selector, Target};
use outbox::prelude::*;
use outbox::relay::Relay;
use outbox::sea_orm::{Statement, TransactionTrait};
use outbox::transport::memory::MemoryTransport;

fn relay(t: &TestDb, transport: &MemoryTransport) -> Relay {
    Relay::new(t.db.clone(), Arc::new(transport.clone())).with_config(quick_relay().batch_size(50))
}

/// Commit line `seq` of `cart`.
async fn line(t: &TestDb, outbox: &Outbox, cart: &str, seq: u32) {
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.enqueue(&LineAdded {
        cart: cart.to_owned(),
        seq,
    })
    .unwrap();
    let _ = tx.commit().await.unwrap();
}

/// Commit events of other carts and run the relay for `length`: the floor moves meanwhile.
async fn traffic(t: &TestDb, outbox: &Outbox, relay: &Relay, length: Duration, seq: &mut u32) {
    let end = Instant::now() + length;
    while Instant::now() < end {
        line(t, outbox, &format!("busy-{}", *seq % 5), *seq).await;
        *seq += 1;
        relay.run_once().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `seq`s of `cart` as the broker received them.
fn published(transport: &MemoryTransport, cart: &str) -> Vec<u64> {
    transport
        .messages()
        .iter()
        .filter(|m| m.aggregate_id == cart)
        .map(|m| {
            let body: serde_json::Value = serde_json::from_slice(&m.body).unwrap();
            body["data"]["seq"].as_u64().unwrap()
        })
        .collect()
}

/// Run the relay until `cart` has `n` events on the broker (at most 20 s).
async fn drain(relay: &Relay, transport: &MemoryTransport, cart: &str, n: usize) {
    let end = Instant::now() + Duration::from_secs(20);
    while published(transport, cart).len() < n && Instant::now() < end {
        relay.run_once().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn scalar(t: &TestDb, sql: &str) -> i64 {
    let row =
        t.db.query_one_raw(Statement::from_string(
            t.dialect().backend(),
            sql.to_owned(),
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get::<i64>("", "n").unwrap()
}

/// A transaction inserts an event and stays open while the relay claims for three seconds:
/// the floor does not pass its id. Once it commits, its event and the next of its cart are
/// published in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_commit_stays_above_the_floor() {
    let Some(t) = test_db(Backend::Postgres, "claim_floor_late_commit").await else {
        return;
    };
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let relay = relay(&t, &transport);
    let mut seq = 0;
    traffic(&t, &outbox, &relay, Duration::from_millis(3_500), &mut seq).await;
    let before = relay
        .claim_floor()
        .expect("a floor after three seconds of claims");

    // The first line of cart `late`, inserted by a transaction that stays open.
    let open = t.db.begin().await.unwrap();
    let event_id = uuid::Uuid::now_v7();
    let late_id = open
        .query_one_raw(Statement::from_sql_and_values(
            t.dialect().backend(),
            "INSERT INTO outbox_event (event_id, source, event_type, schema_version, \
             aggregate_type, aggregate_id, payload, headers) \
             VALUES ($1, 'carts', 'line.added', 1, 'cart', 'late', \
             CAST($2 AS jsonb), '{}'::jsonb) RETURNING id",
            [
                event_id.into(),
                r#"{"cart":"late","seq":0}"#.to_owned().into(),
            ],
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get::<i64>("", "id")
        .unwrap();
    assert!(late_id > before);
    traffic(&t, &outbox, &relay, Duration::from_millis(3_500), &mut seq).await;
    let during = relay.claim_floor().unwrap();
    assert!(
        during <= late_id,
        "the floor ({during}) passed the open transaction's event ({late_id})"
    );
    let busy = scalar(
        &t,
        "SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'SENT'",
    )
    .await;
    assert_eq!(busy, i64::from(seq), "the other carts' events were all sent");

    open.commit().await.unwrap();
    line(&t, &outbox, "late", 1).await;
    drain(&relay, &transport, "late", 2).await;
    assert_eq!(published(&transport, "late"), [0, 1]);
}

/// An event goes DEAD, the next of its cart waits behind it, and the relay's floor moves past
/// it while other carts' events flow. The waiting event is still held back; once an operator
/// replays the dead one, both are published, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_below_the_floor_is_published_in_order() {
    let Some(t) = test_db(Backend::Postgres, "claim_floor_replay").await else {
        return;
    };
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    transport.reject_permanently(Some(|m: &outbox::transport::OutgoingMessage| {
        m.aggregate_id == "stuck"
    }));
    let relay = relay(&t, &transport);
    line(&t, &outbox, "stuck", 0).await;
    relay.run_once().await.unwrap();
    let dead_id = scalar(
        &t,
        "SELECT id AS n FROM outbox_event WHERE aggregate_id = 'stuck' AND status = 'DEAD'",
    )
    .await;
    transport.reject_permanently(None::<fn(&outbox::transport::OutgoingMessage) -> bool>);
    line(&t, &outbox, "stuck", 1).await;

    let mut seq = 0;
    traffic(&t, &outbox, &relay, Duration::from_millis(3_500), &mut seq).await;
    let floor = relay.claim_floor().expect("a floor after three seconds");
    assert!(
        floor > dead_id,
        "the floor ({floor}) stays at the DEAD event ({dead_id})"
    );
    assert!(
        published(&transport, "stuck").is_empty(),
        "the event behind the DEAD one was published"
    );

    let report = admin::replay(
        &t.db,
        &Selector::Ids(vec![Target::outbox(dead_id)]),
        &Actor::new("alice").reason("broker fixed"),
    )
    .await
    .unwrap();
    assert_eq!(report.outbox, 1);
    assert_eq!(
        scalar(
            &t,
            "SELECT generation AS n FROM outbox_rescan WHERE id = 1"
        )
        .await,
        1
    );
    drain(&relay, &transport, "stuck", 2).await;
    assert_eq!(published(&transport, "stuck"), [0, 1]);
}
