//! The relay tests' workload: carts whose lines must reach the broker in order.

#![allow(dead_code, unreachable_pub)]

use std::collections::{HashMap, HashSet};

use outbox::prelude::*;
use serde::{Deserialize, Serialize};

use super::TestDb;

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "line.added", aggregate = "cart")]
pub struct LineAdded {
    #[event(aggregate_id)]
    pub cart: String,
    pub seq: u32,
}

/// Commit `per_aggregate` events for each of `aggregates` carts, interleaved, `per_tx` per
/// transaction. Returns the number committed.
pub async fn produce(
    t: &TestDb,
    outbox: &Outbox,
    aggregates: u32,
    per_aggregate: u32,
    per_tx: usize,
) -> usize {
    let mut all = Vec::new();
    for seq in 0..per_aggregate {
        for a in 0..aggregates {
            all.push(LineAdded {
                cart: format!("cart-{a}"),
                seq,
            });
        }
    }
    for chunk in all.chunks(per_tx) {
        let tx = outbox.begin(&t.db).await.unwrap();
        for e in chunk {
            tx.enqueue(e).unwrap();
        }
        let _ = tx.commit().await.unwrap();
    }
    all.len()
}

/// Enqueue one line per `(cart, seq)` in `tx` and commit it; every line is written.
pub async fn commit_lines(tx: OutboxTransaction, lines: &[(&str, u32)]) {
    for (cart, seq) in lines {
        tx.enqueue(&LineAdded {
            cart: (*cart).to_owned(),
            seq: *seq,
        })
        .unwrap();
    }
    let report = tx.commit().await.unwrap();
    assert_eq!(report.written, lines.len());
}

/// A handler's effect for a line: one `effect` row with its cart and `seq`.
pub async fn record_line(
    tx: &InboxTransaction,
    event: &Event<LineAdded>,
) -> Result<(), HandlerError> {
    super::insert_effect(tx, event.id(), &event.cart, i64::from(event.seq)).await
}

/// The `seq` of a published line, read from its CloudEvents body.
pub fn seq_of(body: &[u8]) -> u32 {
    let envelope = Envelope::from_json(body).unwrap();
    let data: serde_json::Value = envelope.data_as().unwrap();
    data["seq"].as_u64().unwrap() as u32
}

/// Per aggregate, the sequence numbers in stream order, counting each event id once.
pub fn per_aggregate_order<'a>(
    messages: impl IntoIterator<Item = (String, String, &'a [u8])>,
) -> HashMap<String, Vec<u32>> {
    let mut seen = HashSet::new();
    let mut order: HashMap<String, Vec<u32>> = HashMap::new();
    for (event_id, aggregate_id, body) in messages {
        if seen.insert(event_id) {
            order.entry(aggregate_id).or_default().push(seq_of(body));
        }
    }
    order
}

/// Per cart, the lines in the order the in-memory transport received them (each event once).
pub fn stream_order(
    transport: &outbox::transport::memory::MemoryTransport,
) -> HashMap<String, Vec<u32>> {
    per_aggregate_order(
        transport
            .messages()
            .iter()
            .map(|m| (m.event_id.to_string(), m.aggregate_id.clone(), &m.body[..])),
    )
}

pub fn assert_strictly_increasing(order: &HashMap<String, Vec<u32>>, per_aggregate: u32) {
    for (aggregate, seqs) in order {
        assert_eq!(
            seqs.len() as u32,
            per_aggregate,
            "{aggregate}: every event published"
        );
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "{aggregate}: published out of order: {seqs:?}"
        );
    }
}

pub async fn wait_all_sent(t: &TestDb, total: usize, timeout: std::time::Duration) {
    let ok = super::eventually(timeout, || async {
        super::status_counts(&t.db)
            .await
            .get("SENT")
            .copied()
            .unwrap_or(0)
            == total as i64
    })
    .await;
    assert!(
        ok,
        "not all events SENT in {timeout:?}: {:?}",
        super::status_counts(&t.db).await
    );
}

/// The effect of a line handled in a set of databases: recorded under `database|cart`, the
/// database being the one the handler was told it runs in (`EventMeta::database`).
pub async fn record_in_database(
    tx: &InboxTransaction,
    event: &Event<LineAdded>,
) -> Result<(), HandlerError> {
    let database = event.meta().database.clone().unwrap_or_default();
    super::insert_effect(
        tx,
        event.id(),
        &format!("{database}|{}", event.cart),
        i64::from(event.seq),
    )
    .await
}
