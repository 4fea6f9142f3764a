//! The claim's floor on PostgreSQL (see the runtime's `store/floor.rs`): the relay's scans of
//! unsent rows start at the oldest unsent event that is not DEAD instead of at the first entry
//! of the partial index, which a held horizon fills with entries of events sent long ago. A
//! floor must never pass an event that can still appear below it: one inserted by a
//! transaction that commits late, and one an operator replays. These tests hold such an event
//! back while the relay claims for seconds (long enough for its floor to move) and check that
//! the floor stopped below it, and that it and the events behind it in its aggregate are
//! published, in order. The inbox worker's claim takes the same floor.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use crate::common::carts::*;
use crate::common::*;
use outbox::admin::{self, Actor, Selector, Target};
use outbox::prelude::*;
use outbox::relay::Relay;
use outbox::sea_orm::{DatabaseTransaction, Statement, TransactionTrait};
use outbox::store::Failure;
use outbox::store::claim::ClaimParams;
use outbox::store::floor::Bound;
use outbox::store::inbox::{self as inbox_store, InboxState, NewInboxRow};
use outbox::transport::memory::MemoryTransport;

/// How long a test waits for a floor to be confirmed.
const CONFIRMED: Duration = Duration::from_secs(30);

fn relay(t: &TestDb, transport: &MemoryTransport) -> Relay {
    Relay::new(t.db.clone(), Arc::new(transport.clone())).with_config(quick_relay().batch_size(50))
}

/// A relay with the fast path on `outbox`, polling (no `LISTEN`), spawned: a handle to read its
/// floor from, and the running loop's.
fn fast_relay(
    t: &TestDb,
    outbox: &Outbox,
    transport: &MemoryTransport,
) -> (Relay, outbox::relay::RelayHandle) {
    let relay = Relay::new(t.db.clone(), Arc::new(transport.clone()))
        .with_config(quick_relay().batch_size(50).listen(false))
        .with_outbox(outbox);
    let floor = relay.clone();
    (floor, relay.spawn())
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
    traffic_until(t, outbox, relay, length, seq, |_| false).await;
}

/// [`traffic`] until the relay's floor satisfies `enough` (at most `length`); whether it did.
async fn traffic_until(
    t: &TestDb,
    outbox: &Outbox,
    relay: &Relay,
    length: Duration,
    seq: &mut u32,
    enough: impl Fn(i64) -> bool,
) -> bool {
    let end = Instant::now() + length;
    while Instant::now() < end {
        if relay.claim_floor().is_some_and(&enough) {
            return true;
        }
        line(t, outbox, &format!("busy-{}", *seq % 5), *seq).await;
        *seq += 1;
        relay.run_once().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Commit events of other carts for `length` while a spawned relay runs, or until its floor
/// satisfies `enough`; returns the next `seq`.
async fn busy(
    t: &TestDb,
    outbox: &Outbox,
    relay: &Relay,
    length: Duration,
    mut seq: u32,
    enough: impl Fn(i64) -> bool,
) -> u32 {
    let end = Instant::now() + length;
    while Instant::now() < end && !relay.claim_floor().is_some_and(&enough) {
        line(t, outbox, &format!("busy-{}", seq % 5), seq).await;
        seq += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    seq
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

/// The first line of cart `late`, inserted by a transaction left open; the transaction and the
/// row's id.
async fn open_late_event(t: &TestDb) -> (DatabaseTransaction, i64) {
    let open = t.db.begin().await.unwrap();
    let late_id = open
        .query_one_raw(Statement::from_sql_and_values(
            t.dialect().backend(),
            "INSERT INTO outbox_event (event_id, source, event_type, schema_version, \
             aggregate_type, aggregate_id, payload, headers) \
             VALUES ($1, 'carts', 'line.added', 1, 'cart', 'late', \
             CAST($2 AS jsonb), '{}'::jsonb) RETURNING id",
            [
                uuid::Uuid::now_v7().into(),
                r#"{"cart":"late","seq":0}"#.to_owned().into(),
            ],
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get::<i64>("", "id")
        .unwrap();
    (open, late_id)
}

async fn scalar(t: &TestDb, sql: &str) -> i64 {
    scalar_i64(&t.db, sql).await
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
    // A floor is confirmed once the transactions running when it was read have ended, on the
    // whole server: other tests' transactions may take a while.
    assert!(
        traffic_until(&t, &outbox, &relay, CONFIRMED, &mut seq, |_| true).await,
        "no floor after {CONFIRMED:?} of claims"
    );
    let before = relay.claim_floor().unwrap();

    // The first line of cart `late`, inserted by a transaction that stays open.
    let (open, late_id) = open_late_event(&t).await;
    assert!(late_id > before);
    traffic(&t, &outbox, &relay, Duration::from_millis(3_500), &mut seq).await;
    let during = relay.claim_floor().unwrap();
    assert!(
        during <= late_id,
        "the floor ({during}) passed the open transaction's event ({late_id})"
    );
    let busy = scalar(&t, "SELECT COUNT(*) AS n FROM outbox_sent").await;
    assert_eq!(
        busy,
        i64::from(seq),
        "the other carts' events were all sent"
    );

    open.commit().await.unwrap();
    line(&t, &outbox, "late", 1).await;
    drain(&relay, &transport, "late", 2).await;
    assert_eq!(published(&transport, "late"), [0, 1]);
}

/// The same with the fast path: commits write their events claimed unless an earlier event of
/// their aggregate is unsent, and the INSERT looks for one from the relay's floor up. The late
/// transaction's event is found by the next commit of its cart, which leaves its own event to
/// the claim loop: both are published in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_commit_stays_above_the_fast_paths_floor() {
    let Some(t) = test_db(Backend::Postgres, "claim_floor_late_fast").await else {
        return;
    };
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let (floor, handle) = fast_relay(&t, &outbox, &transport);
    let seq = busy(&t, &outbox, &floor, CONFIRMED, 0, |_| true).await;
    let before = floor
        .claim_floor()
        .expect("a floor after claims and commits");

    let (open, late_id) = open_late_event(&t).await;
    assert!(late_id > before);
    let seq = busy(
        &t,
        &outbox,
        &floor,
        Duration::from_millis(3_500),
        seq,
        |_| false,
    )
    .await;
    let during = floor.claim_floor().unwrap();
    assert!(
        during <= late_id,
        "the floor ({during}) passed the open transaction's event ({late_id})"
    );

    open.commit().await.unwrap();
    line(&t, &outbox, "late", 1).await;
    let end = Instant::now() + Duration::from_secs(20);
    while published(&transport, "late").len() < 2 && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    handle.shutdown().await.unwrap();
    assert_eq!(published(&transport, "late"), [0, 1]);
    let sent = scalar(&t, "SELECT COUNT(*) AS n FROM outbox_sent").await;
    assert_eq!(sent, i64::from(seq) + 2, "every event was sent");
}

/// With the fast path sending every event as its commit returns, the claim loop's samples
/// almost never see an unsent event, and once the commits stop none does: the floor still
/// moves past the newest event while a report query holds the horizon, so the loop's scans
/// skip the hold's sent events instead of reading every one left in the index (the highest
/// *visible* id would be no help: every row has moved to `outbox_sent`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_follows_the_newest_id_when_every_event_is_sent() {
    let Some(t) = test_db(Backend::Postgres, "claim_floor_all_sent").await else {
        return;
    };
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let (floor, handle) = fast_relay(&t, &outbox, &transport);
    // A report query left open: its snapshot keeps every sent row's index entries.
    let report =
        t.db.begin_with_config(Some(outbox::sea_orm::IsolationLevel::RepeatableRead), None)
            .await
            .unwrap();
    let _ = scalar_i64(&report, "SELECT COUNT(*) AS n FROM outbox_sent").await;

    let seq = busy(&t, &outbox, &floor, Duration::from_secs(1), 0, |_| false).await;
    // No commit from here on: no sample can see an unsent event.
    let end = Instant::now() + CONFIRMED;
    while scalar(&t, "SELECT COUNT(*) AS n FROM outbox_event").await > 0 && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let newest = scalar(&t, "SELECT MAX(id) AS n FROM outbox_sent").await;
    while floor.claim_floor().is_none_or(|f| f <= newest) && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reached = floor.claim_floor();
    report.rollback().await.unwrap();
    handle.shutdown().await.unwrap();
    assert!(
        reached.is_some_and(|f| f > newest),
        "the floor ({reached:?}) stayed at or below the last event sent, {newest}"
    );
    assert_eq!(
        scalar(&t, "SELECT COUNT(*) AS n FROM outbox_event").await,
        0,
        "every event was sent"
    );
    assert_eq!(
        scalar(&t, "SELECT COUNT(*) AS n FROM outbox_sent").await,
        i64::from(seq)
    );
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
    traffic_until(&t, &outbox, &relay, CONFIRMED, &mut seq, |f| f > dead_id).await;
    let floor = relay
        .claim_floor()
        .expect("a floor after claims and commits");
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
        scalar(&t, "SELECT generation AS n FROM outbox_rescan WHERE id = 1").await,
        1
    );
    drain(&relay, &transport, "stuck", 2).await;
    assert_eq!(published(&transport, "stuck"), [0, 1]);
}

/// Record `seqs` of `cart` for consumer `inventory` in `state`, one transaction each; their
/// row ids.
async fn inbox_rows(
    t: &TestDb,
    cart: &str,
    seqs: std::ops::Range<u32>,
    state: InboxState,
) -> Vec<i64> {
    let mut ids = Vec::new();
    for seq in seqs {
        let message_id = format!("{cart}:{seq}");
        let row = NewInboxRow {
            consumer: "inventory",
            message_id: &message_id,
            event_type: Some("line.added"),
            aggregate_type: Some("cart"),
            aggregate_id: Some(cart),
            payload: b"{}",
            ..NewInboxRow::default()
        };
        let tx = t.db.begin().await.unwrap();
        assert!(inbox_store::insert(&tx, &row, &state).await.unwrap());
        tx.commit().await.unwrap();
        ids.push(
            scalar(
                t,
                &format!(
                    "SELECT id AS n FROM {} WHERE consumer = 'inventory' \
                     AND message_id = '{message_id}'",
                    inbox_source(t.dialect().backend())
                ),
            )
            .await,
        );
    }
    ids
}

/// The message ids of an inbox claim with `floor`, in id order (the claim is handed back).
async fn inbox_claim(t: &TestDb, floor: Bound) -> Vec<String> {
    let params = ClaimParams {
        owner: "worker",
        batch_size: 10,
        lease: Duration::from_secs(30),
        ordering: true,
        max_attempts: 10,
    };
    let claim = inbox_store::claim_from(&t.db, "inventory", &params, Some(floor))
        .await
        .unwrap();
    let ids: Vec<i64> = claim.messages.iter().map(|m| m.id).collect();
    inbox_store::release(&t.db, claim.token, &ids, &[])
        .await
        .unwrap();
    claim.messages.into_iter().map(|m| m.message_id).collect()
}

/// The inbox worker's claim from a floor: a DEAD message below the floor still holds the rest
/// of its aggregate back, the messages above it are claimed, and once an operator replays the
/// DEAD one (bumping the rescan generation) the same floor no longer hides it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_claim_from_a_floor() {
    let Some(t) = test_db(Backend::Postgres, "claim_floor_inbox").await else {
        return;
    };
    let dead = InboxState::Failed(Failure::Dead {
        attempts: 5,
        error: "poison".into(),
    });
    let stuck = inbox_rows(&t, "stuck", 0..1, dead).await;
    inbox_rows(&t, "handled", 0..5, InboxState::Done).await;
    let behind = inbox_rows(&t, "stuck", 1..3, InboxState::Pending).await;
    inbox_rows(&t, "fresh", 0..3, InboxState::Pending).await;
    let floor = Bound {
        low: behind[0],
        generation: 0,
    };
    assert!(stuck[0] < floor.low);
    assert_eq!(
        inbox_claim(&t, floor).await,
        ["fresh:0", "fresh:1", "fresh:2"],
        "the messages behind the DEAD one below the floor stay back"
    );

    let report = admin::replay(
        &t.db,
        &Selector::Ids(vec![Target::inbox(stuck[0])]),
        &Actor::new("alice").reason("handler fixed"),
    )
    .await
    .unwrap();
    assert_eq!(report.inbox, 1);
    assert_eq!(
        inbox_claim(&t, floor).await,
        [
            "stuck:0", "stuck:1", "stuck:2", "fresh:0", "fresh:1", "fresh:2"
        ],
        "after the replay the claim looks below the floor"
    );
}
