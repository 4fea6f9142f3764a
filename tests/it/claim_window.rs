//! Claims with per-aggregate order when the front of the queue cannot fill a batch, on real
//! PostgreSQL, MariaDB and SQLite: the heads query reads a window of the first unfinished rows
//! (1,024 for the small batches used here), and the heads behind that window must still be
//! found. A DEAD event with a longer tail than the window, or a head another relay holds, must
//! not stop other aggregates; a backlog deeper than the window in a few aggregates must still
//! give full batches; the inbox worker's claim behaves the same.

use std::{collections::HashMap, sync::Arc, time::Duration};

use crate::common::carts::*;
use crate::common::*;
use outbox::prelude::*;
use outbox::relay::{Backoff, Relay, RelayConfig};
use outbox::sea_orm::{Statement, TransactionTrait};
use outbox::store::Failure;
use outbox::store::claim::ClaimParams;
use outbox::store::inbox::{self as inbox_store, InboxState, NewInboxRow};
use outbox::store::relay::{ClaimedEvent, Fence, Settlement, claim, settle};
use outbox::transport::memory::MemoryTransport;

/// More rows than the window the heads query reads for batches up to 128.
const PAST_THE_WINDOW: u32 = 1_100;

fn params(relay_id: &str, batch_size: usize) -> ClaimParams<'_> {
    ClaimParams {
        owner: relay_id,
        batch_size,
        lease: std::time::Duration::from_secs(30),
        ordering: true,
        max_attempts: 10,
    }
}

fn relay(t: &TestDb, transport: &MemoryTransport, batch: usize) -> Relay {
    Relay::new(t.db.clone(), Arc::new(transport.clone())).with_config(
        RelayConfig::default()
            .batch_size(batch)
            .poll_interval(Duration::from_millis(50))
            .backoff(
                Backoff::default()
                    .base(Duration::from_millis(10))
                    .cap(Duration::from_millis(50))
                    .jitter(0.0),
            )
            .max_attempts(1_000),
    )
}

/// Commit `seqs` lines of `cart`, in one transaction.
async fn lines(t: &TestDb, outbox: &Outbox, cart: &str, seqs: std::ops::Range<u32>) {
    let tx = outbox.begin(&t.db).await.unwrap();
    for seq in seqs {
        tx.enqueue(&LineAdded {
            cart: cart.to_owned(),
            seq,
        })
        .unwrap();
    }
    let _ = tx.commit().await.unwrap();
}

async fn exec(t: &TestDb, sql: &str) {
    t.db.execute_raw(Statement::from_string(
        t.dialect().backend(),
        sql.to_owned(),
    ))
    .await
    .unwrap();
}

/// Per cart, the `seq`s of a claim in id order.
fn seqs_by_cart(events: &[ClaimedEvent]) -> HashMap<String, Vec<u32>> {
    let mut by_cart: HashMap<String, Vec<u32>> = HashMap::new();
    for e in events {
        by_cart.entry(e.aggregate_id.clone()).or_default().push(
            serde_json::from_str::<serde_json::Value>(&e.payload).unwrap()["seq"]
                .as_u64()
                .unwrap() as u32,
        );
    }
    by_cart
}

/// Each cart's part of a claim starts at `seq` 0 and has no gap: a head and the run behind it.
fn assert_heads_and_runs(by_cart: &HashMap<String, Vec<u32>>) {
    for (cart, seqs) in by_cart {
        let expected: Vec<u32> = (0..seqs.len() as u32).collect();
        assert_eq!(
            seqs, &expected,
            "{cart}: not its head and the run behind it"
        );
    }
}

/// Hand a claim back untouched.
async fn release(t: &TestDb, token: uuid::Uuid, events: &[ClaimedEvent]) {
    let released = settle(
        &t.db,
        Fence::Claim(token),
        &Settlement {
            released: events.iter().map(|e| e.id).collect(),
            ..Settlement::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(released.released, events.len() as u64);
}

/// A row of the stuck cart: its status and attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StuckRow {
    status: String,
    attempts: i64,
}

impl StuckRow {
    fn new(status: &str, attempts: i64) -> Self {
        StuckRow {
            status: status.to_owned(),
            attempts,
        }
    }
}

/// The stuck cart's rows, with its head DEAD, in id order.
async fn stuck_rows(t: &TestDb) -> Vec<StuckRow> {
    outbox_rows(&t.db)
        .await
        .into_iter()
        .filter(|r| r.aggregate_id == "stuck")
        .map(|r| StuckRow::new(&r.status, r.attempts))
        .collect()
}

/// A DEAD head whose aggregate fills the whole window: the carts committed after it are still
/// claimed (their heads and runs), drained in order, and the stuck cart stays back untouched.
async fn dead_head_with_a_tail_longer_than_the_window(t: TestDb) {
    let outbox = Outbox::new("carts");
    lines(&t, &outbox, "stuck", 0..1 + PAST_THE_WINDOW).await;
    for cart in 0..5 {
        lines(&t, &outbox, &format!("cart-{cart}"), 0..4).await;
    }
    let head = scalar_i64(&t.db, "SELECT MIN(id) FROM outbox_event").await;
    exec(
        &t,
        &format!(
            "UPDATE outbox_event SET status = 'DEAD', attempts = 3, last_error = 'poison' \
             WHERE id = {head}"
        ),
    )
    .await;

    let c = claim(&t.db, &params("relay-a", 10)).await.unwrap();
    assert_eq!(
        c.events.len(),
        10,
        "a full batch from the carts behind the window"
    );
    let by_cart = seqs_by_cart(&c.events);
    assert!(!by_cart.contains_key("stuck"), "{by_cart:?}");
    assert_eq!(
        by_cart.len(),
        5,
        "every cart's head is claimed: {by_cart:?}"
    );
    assert_heads_and_runs(&by_cart);
    release(&t, c.token, &c.events).await;

    let transport = MemoryTransport::new();
    let report = relay(&t, &transport, 10).drain(20).await.unwrap();
    assert_eq!(report.sent, 20);
    let messages = transport.messages();
    let order = per_aggregate_order(
        messages
            .iter()
            .map(|m| (m.event_id.to_string(), m.aggregate_id.clone(), &m.body[..])),
    );
    assert!(!order.contains_key("stuck"));
    assert_eq!(order.len(), 5);
    assert_strictly_increasing(&order, 4);
    let stuck = stuck_rows(&t).await;
    assert_eq!(stuck[0], StuckRow::new("DEAD", 3));
    assert!(
        stuck[1..].iter().all(|r| r == &StuckRow::new("PENDING", 0)),
        "the stuck cart waits behind its DEAD head, uncharged"
    );
    assert_eq!(stuck.len() as u32, 1 + PAST_THE_WINDOW);
}

/// A head another relay holds, with a tail longer than the window: a second relay claims the
/// other carts, never a row of the held cart.
async fn held_head_with_a_tail_longer_than_the_window(t: TestDb) {
    let outbox = Outbox::new("carts");
    lines(&t, &outbox, "stuck", 0..1 + PAST_THE_WINDOW).await;
    for cart in 0..3 {
        lines(&t, &outbox, &format!("cart-{cart}"), 0..2).await;
    }
    let a = claim(&t.db, &params("relay-a", 1)).await.unwrap();
    assert_eq!(a.events.len(), 1);
    assert_eq!(a.events[0].aggregate_id, "stuck");

    let b = claim(&t.db, &params("relay-b", 10)).await.unwrap();
    let by_cart = seqs_by_cart(&b.events);
    assert_eq!(b.events.len(), 6, "{by_cart:?}");
    assert!(!by_cart.contains_key("stuck"), "{by_cart:?}");
    assert_heads_and_runs(&by_cart);
    let c = claim(&t.db, &params("relay-c", 10)).await.unwrap();
    assert!(c.events.is_empty(), "nothing else is claimable");
}

/// Five carts with a backlog deeper than the window: each claim is a full batch of their heads
/// and the runs behind them, and draining keeps every cart's order.
async fn few_aggregates_with_a_deep_backlog(t: TestDb) {
    let outbox = Outbox::new("carts");
    let per_cart = 300;
    let total = produce(&t, &outbox, 5, per_cart, 500).await;
    assert!(total as u32 > PAST_THE_WINDOW);

    let c = claim(&t.db, &params("relay-a", 50)).await.unwrap();
    assert_eq!(c.events.len(), 50, "heads and runs fill the batch");
    let by_cart = seqs_by_cart(&c.events);
    assert_eq!(by_cart.len(), 5);
    assert_heads_and_runs(&by_cart);
    // Relay B gets nothing: A holds every head.
    let b = claim(&t.db, &params("relay-b", 50)).await.unwrap();
    assert!(b.events.is_empty(), "{:?}", seqs_by_cart(&b.events));
    release(&t, c.token, &c.events).await;

    let transport = MemoryTransport::new();
    let relays: Vec<_> = (0..2)
        .map(|i| {
            Relay::new(t.db.clone(), Arc::new(transport.clone()))
                .with_config(
                    RelayConfig::default()
                        .relay_id(format!("relay-{i}"))
                        .batch_size(50)
                        .poll_interval(Duration::from_millis(20)),
                )
                .spawn()
        })
        .collect();
    wait_all_sent(&t, total, Duration::from_secs(120)).await;
    for r in relays {
        r.shutdown().await.unwrap();
    }
    let messages = transport.messages();
    assert_eq!(messages.len(), total);
    assert_strictly_increasing(
        &per_aggregate_order(
            messages
                .iter()
                .map(|m| (m.event_id.to_string(), m.aggregate_id.clone(), &m.body[..])),
        ),
        per_cart,
    );
}

/// Record inbox rows for `consumer`: `seqs` of `cart` (`None`: no aggregate), PENDING unless a
/// state is given for the first.
async fn inbox_rows_of(
    t: &TestDb,
    consumer: &str,
    cart: Option<&str>,
    seqs: std::ops::Range<u32>,
    first: Option<InboxState>,
) {
    let tx = t.db.begin().await.unwrap();
    let start = seqs.start;
    for seq in seqs {
        let id = format!("{}:{seq}", cart.unwrap_or("loose"));
        let state = match (&first, seq == start) {
            (Some(state), true) => state.clone(),
            _ => InboxState::Pending,
        };
        let row = NewInboxRow {
            consumer,
            message_id: &id,
            event_type: Some("line.added"),
            aggregate_type: cart.map(|_| "cart"),
            aggregate_id: cart,
            payload: b"{}",
            ..NewInboxRow::default()
        };
        assert!(inbox_store::insert(&tx, &row, &state).await.unwrap());
    }
    tx.commit().await.unwrap();
}

/// Claim and mark DONE until a claim is empty; the message ids handled, in order.
async fn work_off_inbox(t: &TestDb, consumer: &str, batch: usize) -> Vec<String> {
    let mut handled = Vec::new();
    for _ in 0..1_000 {
        let c = inbox_store::claim(&t.db, consumer, &params("worker", batch))
            .await
            .unwrap();
        if c.messages.is_empty() {
            return handled;
        }
        let tx = t.db.begin().await.unwrap();
        for m in &c.messages {
            assert!(inbox_store::mark_done(&tx, m.id, c.token).await.unwrap());
            handled.push(m.message_id.clone());
        }
        tx.commit().await.unwrap();
    }
    panic!("the inbox never ran dry");
}

/// Per cart, the sequence numbers of message ids `cart:seq`, in handling order.
fn inbox_order(handled: &[String]) -> HashMap<String, Vec<u32>> {
    let mut order: HashMap<String, Vec<u32>> = HashMap::new();
    for id in handled {
        let (cart, seq) = id.rsplit_once(':').unwrap();
        order
            .entry(cart.to_owned())
            .or_default()
            .push(seq.parse().unwrap());
    }
    order
}

/// The inbox worker's claim: a DEAD message whose aggregate fills the window holds back only
/// that aggregate; the others (and a message without an aggregate) behind it are handled in
/// order; another consumer's rows count for nothing.
async fn inbox_dead_head_with_a_tail_longer_than_the_window(t: TestDb) {
    let dead = InboxState::Failed(Failure::Dead {
        attempts: 5,
        error: "poison".into(),
    });
    inbox_rows_of(&t, "audit", Some("cart-9"), 0..3, None).await;
    inbox_rows_of(
        &t,
        "billing",
        Some("stuck"),
        0..1 + PAST_THE_WINDOW,
        Some(dead),
    )
    .await;
    for cart in 0..4 {
        inbox_rows_of(&t, "billing", Some(&format!("cart-{cart}")), 0..3, None).await;
    }
    inbox_rows_of(&t, "billing", None, 0..2, None).await;

    let c = inbox_store::claim(&t.db, "billing", &params("worker", 10))
        .await
        .unwrap();
    let ids: Vec<&str> = c.messages.iter().map(|m| m.message_id.as_str()).collect();
    assert_eq!(c.messages.len(), 10, "{ids:?}");
    assert!(ids.iter().all(|id| !id.starts_with("stuck:")), "{ids:?}");
    for cart in 0..4 {
        let head = format!("cart-{cart}:0");
        assert!(ids.contains(&head.as_str()), "{head} not claimed: {ids:?}");
    }
    assert!(
        ids.contains(&"loose:0") && ids.contains(&"loose:1"),
        "messages without an aggregate are heads: {ids:?}"
    );
    let ids: Vec<i64> = c.messages.iter().map(|m| m.id).collect();
    inbox_store::release(&t.db, c.token, &ids, &[])
        .await
        .unwrap();

    let order = inbox_order(&work_off_inbox(&t, "billing", 10).await);
    assert!(!order.contains_key("stuck"), "{order:?}");
    for cart in 0..4 {
        assert_eq!(order[&format!("cart-{cart}")], [0, 1, 2]);
    }
    assert_eq!(order["loose"].len(), 2);
    let billing = inbox_rows(&t.db, "billing").await;
    let stuck: Vec<&str> = billing
        .iter()
        .filter(|r| r.message_id.starts_with("stuck:"))
        .map(|r| r.status.as_str())
        .collect();
    assert_eq!(stuck.len() as u32, 1 + PAST_THE_WINDOW);
    assert_eq!(stuck[0], "DEAD");
    assert!(stuck[1..].iter().all(|s| *s == "PENDING"));
    let audit = inbox_rows(&t.db, "audit").await;
    assert!(audit.iter().all(|r| r.status == "PENDING"), "{audit:?}");
}

/// The inbox worker's claim with three aggregates deeper than the window: full batches of heads
/// and runs, every aggregate handled in order.
async fn inbox_few_aggregates_with_a_deep_backlog(t: TestDb) {
    for cart in 0..3 {
        inbox_rows_of(&t, "billing", Some(&format!("cart-{cart}")), 0..400, None).await;
    }
    let c = inbox_store::claim(&t.db, "billing", &params("worker", 40))
        .await
        .unwrap();
    assert_eq!(c.messages.len(), 40, "heads and runs fill the batch");
    let handled: Vec<String> = c.messages.iter().map(|m| m.message_id.clone()).collect();
    let first = inbox_order(&handled);
    assert_eq!(first.len(), 3);
    for seqs in first.values() {
        let expected: Vec<u32> = (0..seqs.len() as u32).collect();
        assert_eq!(seqs, &expected);
    }
    let ids: Vec<i64> = c.messages.iter().map(|m| m.id).collect();
    inbox_store::release(&t.db, c.token, &ids, &[])
        .await
        .unwrap();

    let order = inbox_order(&work_off_inbox(&t, "billing", 40).await);
    for cart in 0..3 {
        let expected: Vec<u32> = (0..400).collect();
        assert_eq!(order[&format!("cart-{cart}")], expected);
    }
}

backend_tests! {
    window_dead_head => dead_head_with_a_tail_longer_than_the_window;
    window_held_head => held_head_with_a_tail_longer_than_the_window;
    window_deep_backlog => few_aggregates_with_a_deep_backlog;
    window_inbox_dead_head => inbox_dead_head_with_a_tail_longer_than_the_window;
    window_inbox_deep_backlog => inbox_few_aggregates_with_a_deep_backlog;
}
