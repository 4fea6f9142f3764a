//! The relay publishing to a real NATS JetStream from PostgreSQL, MariaDB and SQLite.
//!
//! The fault-injection wrapper below is the one stand-in: it forwards to the real broker and then
//! pretends some confirms were lost, or refuses some messages before sending them, so the tests
//! can show what the relay does when that happens on a real stream.

use std::{
    collections::HashSet,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use crate::common::carts::*;
use crate::common::nats::transport;
use crate::common::*;
use outbox::prelude::*;
use outbox::relay::{Backoff, Relay, RelayConfig};
use outbox::transport::{
    OutgoingMessage, PublishError, SubscribeOptions, Subscription, Transport, TransportError,
    nats::NatsTransport,
};

fn config(batch: usize, relay: usize) -> RelayConfig {
    quick_relay()
        .relay_id(format!("relay-{relay}"))
        .batch_size(batch)
}

/// One message on the stream.
#[derive(Debug, Clone)]
struct OnStream {
    /// Its `Nats-Msg-Id`.
    message_id: String,
    /// The aggregate id, the envelope's `subject`.
    aggregate_id: String,
    body: Vec<u8>,
}

/// Every message on the stream, in stream order.
async fn stream_contents(nats: &NatsTransport) -> Vec<OnStream> {
    let stream = nats
        .jetstream()
        .get_stream(nats.stream_name())
        .await
        .unwrap();
    let count = stream.get_info().await.unwrap().state.messages;
    let mut out = Vec::with_capacity(count as usize);
    for seq in 1..=count {
        let m = stream.get_raw_message(seq).await.unwrap();
        let message_id = m.headers.get("Nats-Msg-Id").unwrap().as_str().to_owned();
        let envelope = Envelope::from_json(&m.payload).unwrap();
        out.push(OnStream {
            message_id,
            aggregate_id: envelope.subject.unwrap(),
            body: m.payload.to_vec(),
        });
    }
    out
}

/// Per aggregate, the sequence numbers on the stream (see `per_aggregate_order`).
fn order_on_stream(contents: &[OnStream]) -> std::collections::HashMap<String, Vec<u32>> {
    per_aggregate_order(
        contents
            .iter()
            .map(|m| (m.message_id.clone(), m.aggregate_id.clone(), &m.body[..])),
    )
}

async fn ten_thousand_events_four_relays_once_each_on_the_stream(t: TestDb) {
    let test = format!("tenk_{}", t.name.rsplit('_').next().unwrap());
    let Some(nats) = transport(&test).await else {
        return;
    };
    nats.setup().await.unwrap();
    let outbox = Outbox::new("carts");
    let total = produce(&t, &outbox, 1_000, 10, 500).await;
    assert_eq!(total, 10_000);
    let relays: Vec<_> = (0..4)
        .map(|i| {
            Relay::new(t.db.clone(), Arc::new(nats.0.clone()))
                .with_config(config(500, i))
                .with_outbox(&outbox)
                .spawn()
        })
        .collect();
    wait_all_sent(&t, total, Duration::from_secs(240)).await;
    let mut sent = 0;
    for r in relays {
        sent += r.shutdown().await.unwrap().sent;
    }
    assert_eq!(
        sent, 10_000,
        "each event was published by exactly one relay, once"
    );
    let contents = stream_contents(&nats).await;
    assert_eq!(contents.len(), 10_000);
    let ids: HashSet<&str> = contents.iter().map(|m| m.message_id.as_str()).collect();
    assert_eq!(ids.len(), 10_000, "no event id twice on the stream");
    let rows: HashSet<String> = outbox_rows(&t.db)
        .await
        .iter()
        .map(|r| r.event_id.to_string())
        .collect();
    assert_eq!(
        ids,
        rows.iter().map(String::as_str).collect(),
        "exactly the outbox's events"
    );
    let order = order_on_stream(&contents);
    assert_strictly_increasing(&order, 10);
}

/// Forwards to a real transport; loses the confirm of the first `lose` messages it delivers and
/// refuses each message with probability `refuse` before sending it.
#[derive(Debug)]
struct Faulty {
    inner: NatsTransport,
    lose: AtomicUsize,
    refuse: f64,
}

#[async_trait::async_trait]
impl Transport for Faulty {
    fn name(&self) -> &'static str {
        "faulty-nats"
    }

    async fn setup(&self) -> Result<(), TransportError> {
        self.inner.setup().await
    }

    async fn publish(&self, messages: &[OutgoingMessage]) -> Vec<Result<(), PublishError>> {
        let send: Vec<bool> = messages
            .iter()
            .map(|_| self.refuse == 0.0 || fastrand::f64() >= self.refuse)
            .collect();
        let to_send: Vec<OutgoingMessage> = messages
            .iter()
            .zip(&send)
            .filter(|(_, s)| **s)
            .map(|(m, _)| m.clone())
            .collect();
        let mut sent = self.inner.publish(&to_send).await.into_iter();
        send.iter()
            .map(|s| {
                if !s {
                    return Err(PublishError::Rejected(
                        "refused before sending (injected)".into(),
                    ));
                }
                let result = sent.next().unwrap();
                if result.is_ok()
                    && self
                        .lose
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok()
                {
                    return Err(PublishError::Timeout(Duration::from_secs(10)));
                }
                result
            })
            .collect()
    }

    async fn subscribe(
        &self,
        consumer: &str,
        event_types: &[String],
        options: &SubscribeOptions,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        self.inner.subscribe(consumer, event_types, options).await
    }

    async fn health(&self) -> Result<(), TransportError> {
        self.inner.health().await
    }
}

async fn lost_confirms_are_republished_and_jetstream_drops_duplicates(t: TestDb) {
    let test = format!("lost_{}", t.name.rsplit('_').next().unwrap());
    let Some(nats) = transport(&test).await else {
        return;
    };
    nats.setup().await.unwrap();
    let outbox = Outbox::new("carts");
    let total = produce(&t, &outbox, 5, 4, 20).await;
    let faulty = Arc::new(Faulty {
        inner: nats.0.clone(),
        lose: AtomicUsize::new(5),
        refuse: 0.0,
    });
    let relay = Relay::new(t.db.clone(), faulty).with_config(
        config(100, 0).backoff(
            Backoff::default()
                .base(Duration::from_millis(1))
                .cap(Duration::from_millis(1))
                .jitter(0.0),
        ),
    );
    let first = relay.run_once().await.unwrap();
    assert_eq!(first.retried, 5, "five confirms lost in the first wave");
    assert_eq!(
        first.released,
        total - 5,
        "their aggregates wait behind them"
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    relay.drain(50).await.unwrap();
    assert_eq!(
        status_counts(&t.db).await.get("SENT"),
        Some(&(total as i64))
    );
    let contents = stream_contents(&nats).await;
    assert_eq!(
        contents.len(),
        total,
        "JetStream dropped the 5 republished duplicates"
    );
    let rows = outbox_rows(&t.db).await;
    assert_eq!(rows.iter().filter(|r| r.attempts == 1).count(), 5);
    let order = order_on_stream(&contents);
    assert_strictly_increasing(&order, 4);
}

backend_tests! {
    ten_thousand => ten_thousand_events_four_relays_once_each_on_the_stream;
    lost_confirm => lost_confirms_are_republished_and_jetstream_drops_duplicates;
}

/// 50 aggregates × 200 events, 4 relays, 5% of publishes refused: per-aggregate order on the
/// stream is strictly increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_on_the_stream_with_failures_and_four_relays() {
    let Some(t) = test_db(Backend::Postgres, "relay_nats_order_pg").await else {
        return;
    };
    let Some(nats) = transport("order_pg").await else {
        return;
    };
    nats.setup().await.unwrap();
    let outbox = Outbox::new("carts");
    let total = produce(&t, &outbox, 50, 200, 500).await;
    let faulty = Arc::new(Faulty {
        inner: nats.0.clone(),
        lose: AtomicUsize::new(0),
        refuse: 0.05,
    });
    let relays: Vec<_> = (0..4)
        .map(|i| {
            Relay::new(t.db.clone(), faulty.clone())
                .with_config(config(100, i))
                .spawn()
        })
        .collect();
    wait_all_sent(&t, total, Duration::from_secs(300)).await;
    let mut retried = 0;
    for r in relays {
        retried += r.shutdown().await.unwrap().retried;
    }
    assert!(retried > 0, "failures were injected");
    let contents = stream_contents(&nats).await;
    assert_eq!(contents.len(), total);
    let order = order_on_stream(&contents);
    assert_strictly_increasing(&order, 200);
}
