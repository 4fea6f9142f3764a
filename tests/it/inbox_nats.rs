//! Two runtimes of one service sharing a consumer name over real NATS JetStream: every event is
//! handled exactly once as far as the database is concerned.

use std::time::Duration;

use crate::common::carts::*;
use crate::common::nats::transport;
use crate::common::*;
use outbox::inbox::InboxConfig;
use outbox::prelude::*;
use outbox::relay::RelayConfig;
use outbox::runtime::Runtime;
use outbox::transport::nats::NatsTransport;

#[inbox_handler(consumer = "t-nats")]
async fn handle(tx: &InboxTransaction, event: Event<LineAdded>) -> Result<(), HandlerError> {
    record_line(tx, &event).await
}

async fn start(t: &TestDb, nats: &NatsTransport, name: &str) -> Runtime {
    // Each runtime has its own connections, as two processes would.
    let db = t.connect_again().await;
    let transport = NatsTransport::builder(crate::common::nats::NATS_URL)
        .namespace(nats.namespace())
        .connect()
        .await
        .unwrap();
    Runtime::builder(db)
        .source("carts")
        .transport(transport)
        .relay_config(
            RelayConfig::default()
                .relay_id(name.to_owned())
                .poll_interval(Duration::from_millis(50)),
        )
        .inbox_config(InboxConfig::default().poll_interval(Duration::from_millis(50)))
        .consumers(["t-nats"])
        .expect_consumers(["t-nats"])
        .start()
        .await
        .unwrap()
}

async fn two_runtimes_share_a_consumer(t: TestDb) {
    let test = format!("inbox2_{}", t.name.rsplit('_').next().unwrap());
    let Some(nats) = transport(&test).await else {
        return;
    };
    let a = start(&t, &nats, "runtime-a").await;
    let b = start(&t, &nats, "runtime-b").await;
    // Both produce: each runtime's relay publishes what its own service commits.
    let mut total = 0;
    for (runtime, prefix) in [(&a, "a"), (&b, "b")] {
        for seq in 0..15 {
            let tx = runtime.outbox().begin(&t.db).await.unwrap();
            for cart in 0..10 {
                tx.enqueue(&LineAdded {
                    cart: format!("{prefix}-{cart}"),
                    seq,
                })
                .unwrap();
                total += 1;
            }
            let _ = tx.commit().await.unwrap();
        }
    }
    let ok = eventually(Duration::from_secs(120), || async {
        effects(&t.db).await.len() >= total
    })
    .await;
    // Let redeliveries, if any, arrive before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (sa, sb) = (
        a.consumer_stats("t-nats").unwrap(),
        b.consumer_stats("t-nats").unwrap(),
    );
    a.shutdown().await;
    b.shutdown().await;
    assert!(
        ok,
        "not every event handled: {} of {total}",
        effects(&t.db).await.len()
    );
    let effects = effects(&t.db).await;
    assert_eq!(effects.len(), total, "each event handled exactly once");
    let ids: std::collections::HashSet<&str> =
        effects.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids.len(), total);
    assert_eq!(sa.handled + sb.handled, total as u64);
    let rows = inbox_rows(&t.db, "t-nats").await;
    assert_eq!(rows.len(), total);
    assert!(rows.iter().all(|r| r.status == "DONE"));
    assert_eq!(
        status_counts(&t.db).await.get("SENT"),
        Some(&(total as i64))
    );
}

// Two runtimes need two connections to one database: not possible with in-memory SQLite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runtimes_postgres() {
    if let Some(t) = test_db(Backend::Postgres, "inbox_nats_two_pg").await {
        two_runtimes_share_a_consumer(t).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runtimes_mysql() {
    if let Some(t) = test_db(Backend::MySql, "inbox_nats_two_my").await {
        two_runtimes_share_a_consumer(t).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runtimes_sqlite_file() {
    if let Some(t) = test_db(Backend::SqliteFile, "inbox_nats_two_lf").await {
        two_runtimes_share_a_consumer(t).await;
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, DomainEvent)]
#[event(name = "line.traced", aggregate = "cart")]
struct LineTraced {
    #[event(aggregate_id)]
    cart: String,
    seq: u32,
}

#[inbox_handler(consumer = "t-trace")]
async fn trace_handler(tx: &InboxTransaction, event: Event<LineAdded>) -> Result<(), HandlerError> {
    // Whatever the handler enqueues continues the producer's trace.
    tx.enqueue(&LineTraced {
        cart: event.cart.clone(),
        seq: event.seq,
    })?;
    Ok(())
}

/// The W3C trace context captured at enqueue travels through JetStream, and the handler's work
/// continues the producer's trace: its follow-up event has the same trace id, a new parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_context_survives_the_broker() {
    let Some(t) = test_db(Backend::Postgres, "inbox_nats_trace_pg").await else {
        return;
    };
    let Some(nats) = transport("trace_pg").await else {
        return;
    };
    let runtime = Runtime::builder(t.db.clone())
        .source("carts")
        .transport(nats.0.clone())
        .consumers(["t-trace"])
        .relay_config(RelayConfig::default().poll_interval(Duration::from_millis(50)))
        .start()
        .await
        .unwrap();
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let trace = outbox::trace::TraceContext::new(traceparent, Some("shop=1".into())).unwrap();
    let outbox = runtime.outbox().clone();
    trace
        .scope(async {
            let tx = outbox.begin(&t.db).await.unwrap();
            tx.enqueue(&LineAdded {
                cart: "traced".into(),
                seq: 1,
            })
            .unwrap();
            let _ = tx.commit().await.unwrap();
        })
        .await;
    let ok = eventually(Duration::from_secs(30), || async {
        outbox_rows(&t.db)
            .await
            .iter()
            .any(|r| r.event_type == "line.traced")
    })
    .await;
    runtime.shutdown().await;
    assert!(ok, "the handler ran and enqueued its follow-up");
    let rows = outbox_rows(&t.db).await;
    let original = rows.iter().find(|r| r.event_type == "line.added").unwrap();
    assert_eq!(original.headers["traceparent"], traceparent);
    let follow_up = rows.iter().find(|r| r.event_type == "line.traced").unwrap();
    let child = follow_up.headers["traceparent"].as_str().unwrap();
    let child = outbox::trace::TraceContext::new(child, None).unwrap();
    assert_eq!(
        child.trace_id(),
        "4bf92f3577b34da6a3ce929d0e0e4736",
        "same trace after the broker"
    );
    assert_ne!(
        child.parent_id(),
        "00f067aa0ba902b7",
        "a new span of that trace"
    );
    assert_eq!(follow_up.headers["tracestate"], "shop=1");
}
