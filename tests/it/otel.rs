//! With the `opentelemetry` feature, every road of an event shows in OpenTelemetry, named after
//! the messaging semantic conventions: the relay's `send` span (claim loop, fast path, WAL relay,
//! database-local transport) is a child of the span that enqueued the event, however much later
//! and from whichever task the relay sends it; the consumer's `receive` and `process` spans carry
//! the consumer group, the destination and the message id; the worker's retries and the external
//! messages received are spans of their own. The spans come from a real broker (NATS JetStream)
//! and database (PostgreSQL) run, read back from an in-memory exporter. (Not SQLite: its
//! connection threads enter the spans of their statements under the process-wide subscriber
//! another test of this binary installs, which knows nothing of this test's spans.)
//!
//! The tracing subscriber is each test's own, set on every thread of the test's tokio runtime:
//! the spans of the other tests in the process do not reach its exporter.

use std::time::Duration;

use crate::common::carts::*;
use crate::common::nats::transport;
use crate::common::*;
use opentelemetry::trace::{SpanKind, Status, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use outbox::inbox::{InboxConfig, IncomingMessage};
use outbox::prelude::*;
use outbox::relay::RelayConfig;
use outbox::runtime::Runtime;
use outbox::transport::Transport;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

#[inbox_handler(consumer = "t-otel", backoff = "10ms")]
async fn handle(_tx: &InboxTransaction, _event: Event<LineAdded>) -> Result<(), HandlerError> {
    Ok(())
}

#[derive(Debug, serde::Deserialize)]
struct Payment {
    #[allow(dead_code)]
    amount: i64,
}

#[inbox_handler(
    consumer = "t-otel-hooks",
    source = "otel-psp",
    message_type = "payment.succeeded"
)]
async fn payment(_tx: &InboxTransaction, _message: Event<Payment>) -> Result<(), HandlerError> {
    Ok(())
}

/// Run `body` with an OpenTelemetry pipeline of its own (a `tracing` subscriber with the
/// `tracing-opentelemetry` layer, exporting into memory); return the spans it exported and what
/// `body` returned. It runs on a thread of its own that is parked afterwards, never ended: a
/// span something still held would be exported while the thread's locals are torn down, which
/// aborts.
fn traced<T, F>(body: impl FnOnce(InMemorySpanExporter) -> F + Send + 'static) -> (Vec<SpanData>, T)
where
    T: Send + 'static,
    F: std::future::Future<Output = T>,
{
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("outbox-test")));
        let dispatch = tracing::Dispatch::new(subscriber);
        // Each thread keeps the subscriber until it ends.
        let run = std::panic::AssertUnwindSafe(|| {
            on_own_runtime(
                move || std::mem::forget(tracing::dispatcher::set_default(&dispatch)),
                async {
                    outbox::trace::otel::install();
                    // The callsites' cached interest, as the process's live subscribers see it
                    // now (another test's subscriber may have been alone when a callsite was
                    // first hit).
                    tracing::callsite::rebuild_interest_cache();
                    body(exporter.clone()).await
                },
            )
        });
        let outcome = std::panic::catch_unwind(run);
        let _ = provider.force_flush();
        let spans = exporter.get_finished_spans().unwrap_or_default();
        let _ = done.send(outcome.map(|value| (spans, value)));
        loop {
            std::thread::park();
        }
    });
    match result.recv().expect("the traced thread reports") {
        Ok(pair) => pair,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// The attribute `key` of `span`, as text.
fn attr(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

/// The spans with `outbox.road` = `road` and `messaging.operation.type` = `operation`.
fn on_road<'a>(spans: &'a [SpanData], road: &str, operation: &str) -> Vec<&'a SpanData> {
    spans
        .iter()
        .filter(|s| {
            attr(s, "outbox.road").as_deref() == Some(road)
                && attr(s, "messaging.operation.type").as_deref() == Some(operation)
        })
        .collect()
}

/// Check the attributes every span of the conventions carries.
fn check(span: &SpanData, kind: SpanKind, expected: &[(&str, &str)]) {
    assert_eq!(span.span_kind, kind, "{span:#?}");
    for (key, value) in expected {
        assert_eq!(
            attr(span, key).as_deref(),
            Some(*value),
            "{key} of {}: {:#?}",
            span.name,
            span.attributes
        );
    }
}

/// `span` is a child of the context the event was enqueued under: the outbox row's
/// `traceparent` (trace id, and the enqueuing span's id).
/// The one `send` span of `road`, checked: a producer span of `system` to `destination` for
/// message `id`, in the trace of `traceparent`.
fn one_send<'a>(
    spans: &'a [SpanData],
    road: &str,
    (system, destination): (&str, &str),
    id: &str,
    traceparent: &str,
) -> &'a SpanData {
    let sends = on_road(spans, road, "send");
    assert_eq!(sends.len(), 1, "one send span: {spans:#?}");
    check(
        sends[0],
        SpanKind::Producer,
        &[
            ("messaging.system", system),
            ("messaging.destination.name", destination),
            ("messaging.message.id", id),
        ],
    );
    in_trace_of(sends[0], traceparent);
    sends[0]
}

fn in_trace_of(span: &SpanData, traceparent: &str) {
    let mut parts = traceparent.split('-').skip(1);
    let (trace, parent) = (parts.next().unwrap(), parts.next().unwrap());
    assert_eq!(
        span.span_context.trace_id().to_string(),
        trace,
        "{} in the producer's trace",
        span.name
    );
    assert_eq!(
        span.parent_span_id.to_string(),
        parent,
        "{}'s parent is the producer's span",
        span.name
    );
}

/// The event id and `traceparent` of the first outbox row.
async fn first_event(db: &outbox::sea_orm::DatabaseConnection) -> (String, String) {
    let row = &outbox_rows(db).await[0];
    let traceparent = row.headers["traceparent"].as_str().expect("a traceparent");
    (row.event_id.to_string(), traceparent.to_owned())
}

/// Whether `consumer` handled a message (DONE) within 30 s.
async fn handled_one(db: &outbox::sea_orm::DatabaseConnection, consumer: &str) -> bool {
    eventually(Duration::from_secs(30), || async {
        inbox_rows(db, consumer)
            .await
            .iter()
            .any(|r| r.status == "DONE")
    })
    .await
}

/// Enqueue one line for `cart` in a transaction of `outbox`, inside a span named `root`.
async fn commit_one(db: &outbox::sea_orm::DatabaseConnection, outbox: &Outbox, cart: &str) {
    let root = tracing::info_span!("checkout", cart);
    async {
        let tx = outbox.begin(db).await.unwrap();
        tx.enqueue(&LineAdded {
            cart: cart.into(),
            seq: 1,
        })
        .unwrap();
        let _ = tx.commit().await.unwrap();
    }
    .instrument(root)
    .await;
}

fn nats_destination(transport: &dyn Transport) -> String {
    transport
        .routing()
        .unwrap()
        .address(LineAdded::EVENT_TYPE, LineAdded::AGGREGATE_TYPE)
}

/// The claim loop publishes an event committed through a handle without a fast path: its
/// `send` span is in the producer's trace; the consumer's `receive` and `process` spans carry
/// the consumer group and the same destination and message id, and the handler's span continues
/// the producer's trace across the broker.
#[test]
fn the_claim_loop_and_the_consumer_follow_the_conventions() {
    let (spans, context) = traced(|_| async move {
        let t = test_db(Backend::Postgres, "otel_claim_loop").await?;
        let nats = transport("otel_claim").await?;
        let runtime = Runtime::builder(t.db.clone())
            .source("carts")
            .transport(nats.0.clone())
            .consumers(["t-otel"])
            .relay_config(RelayConfig::default().poll_interval(Duration::from_millis(50)))
            .start()
            .await
            .unwrap();
        // A handle of its own: no fast path, the claim loop finds the event.
        commit_one(&t.db, &Outbox::new("carts"), "otel-claim").await;
        let handled = handled_one(&t.db, "t-otel").await;
        runtime.shutdown().await;
        assert!(handled, "the event was handled");
        let (event_id, traceparent) = first_event(&t.db).await;
        Some((event_id, traceparent, nats_destination(&nats.0)))
    });
    let Some((event_id, traceparent, destination)) = context else {
        return;
    };
    let send = one_send(
        &spans,
        "claim_loop",
        ("nats", &destination),
        &event_id,
        &traceparent,
    );
    assert_eq!(send.name, format!("send {destination}"));
    check(
        send,
        SpanKind::Producer,
        &[
            ("messaging.operation.name", "send"),
            ("outbox.event_type", LineAdded::EVENT_TYPE),
            ("outbox.aggregate.id", "otel-claim"),
        ],
    );
    assert_eq!(send.status, Status::Unset);
    let checkout = spans
        .iter()
        .find(|s| s.name == "checkout")
        .expect("the producer's span");
    assert!(
        traceparent.contains(&checkout.span_context.trace_id().to_string()),
        "the event carries the trace of the request that enqueued it"
    );

    let consumer = [
        ("messaging.system", "nats"),
        ("messaging.consumer.group.name", "t-otel"),
        ("messaging.destination.name", destination.as_str()),
        ("messaging.message.id", event_id.as_str()),
    ];
    let receive = on_road(&spans, "consumer", "receive");
    assert_eq!(receive.len(), 1, "{spans:#?}");
    assert_eq!(receive[0].name, format!("receive {destination}"));
    check(receive[0], SpanKind::Consumer, &consumer);
    assert_eq!(
        attr(receive[0], "outbox.delivery_count").as_deref(),
        Some("1")
    );

    let process = on_road(&spans, "consumer", "process");
    assert_eq!(process.len(), 1, "{spans:#?}");
    assert_eq!(process[0].name, format!("process {destination}"));
    check(process[0], SpanKind::Consumer, &consumer);
    assert_eq!(attr(process[0], "outbox.attempt").as_deref(), Some("1"));
    in_trace_of(process[0], &traceparent);
}

/// The fast path publishes what a commit through the runtime's handle wrote: its `send` span
/// is in the producer's trace. A handler that fails once is a failed `process` span (`error.type`
/// `retry`, status error) on the consumer's road, then a `process` span of the worker, attempt 2.
#[test]
fn the_fast_path_and_the_workers_retry_follow_the_conventions() {
    let (spans, context) = traced(|exporter| async move {
        let t = test_db(Backend::Postgres, "otel_fast_path").await?;
        let nats = transport("otel_fast").await?;
        let faults = outbox::testing::HandlerFaults::new();
        faults.fail("t-otel", LineAdded::EVENT_TYPE, 1);
        let runtime = Runtime::builder(t.db.clone())
            .source("carts")
            .transport(nats.0.clone())
            .consumers(["t-otel"])
            .inbox_config(InboxConfig::default().faults(&faults))
            .relay_config(RelayConfig::default().poll_interval(Duration::from_millis(50)))
            .start()
            .await
            .unwrap();
        // A loaded machine may leave a commit to the claim loop (the fast path takes what it
        // has room for): commit one event at a time until the fast path published one.
        let mut fast = None;
        for n in 0..5 {
            commit_one(&t.db, runtime.outbox(), &format!("otel-fast-{n}")).await;
            let handled = eventually(Duration::from_secs(30), || async {
                inbox_rows(&t.db, "t-otel")
                    .await
                    .iter()
                    .filter(|r| r.status == "DONE")
                    .count()
                    == n + 1
            })
            .await;
            assert!(handled, "event {n} was handled");
            let spans = exporter.get_finished_spans().unwrap();
            if let Some(send) = on_road(&spans, "fast_path", "send").first() {
                fast = attr(send, "messaging.message.id");
                break;
            }
        }
        runtime.shutdown().await;
        assert_eq!(faults.injected(), 1);
        let fast = fast.expect("one of five commits published by the fast path");
        let rows = outbox_rows(&t.db).await;
        let traceparent_of = |id: &str| {
            let row = rows.iter().find(|r| r.event_id.to_string() == id).unwrap();
            row.headers["traceparent"].as_str().unwrap().to_owned()
        };
        let first = rows[0].event_id.to_string();
        Some((
            (traceparent_of(&fast), fast),
            (traceparent_of(&first), first),
            nats_destination(&nats.0),
        ))
    });
    let Some(((fast_traceparent, fast), (traceparent, event_id), destination)) = context else {
        return;
    };
    one_send(
        &spans,
        "fast_path",
        ("nats", &destination),
        &fast,
        &fast_traceparent,
    );

    let of_first = |road: &str| -> Vec<&SpanData> {
        on_road(&spans, road, "process")
            .into_iter()
            .filter(|s| attr(s, "messaging.message.id").as_deref() == Some(event_id.as_str()))
            .collect()
    };
    let first = of_first("consumer");
    assert_eq!(first.len(), 1, "{spans:#?}");
    check(
        first[0],
        SpanKind::Consumer,
        &[
            ("messaging.message.id", &event_id),
            ("outbox.attempt", "1"),
            ("error.type", "retry"),
        ],
    );
    assert!(matches!(first[0].status, Status::Error { .. }));
    let retry = of_first("worker");
    assert_eq!(retry.len(), 1, "{spans:#?}");
    check(
        retry[0],
        SpanKind::Consumer,
        &[
            ("messaging.system", "nats"),
            ("messaging.consumer.group.name", "t-otel"),
            ("messaging.message.id", &event_id),
            ("outbox.attempt", "2"),
        ],
    );
    assert_eq!(attr(retry[0], "error.type"), None);
    in_trace_of(retry[0], &traceparent);
}

/// The database-local transport moves the event into the consumer's inbox in a `send` span of
/// the producer's trace; the worker handles it in a `process` span.
#[test]
fn the_local_transport_follows_the_conventions() {
    let (spans, context) = traced(|_| async move {
        let t = test_db(Backend::Postgres, "otel_local").await?;
        let runtime = Runtime::builder(t.db.clone())
            .source("carts")
            .consumers(["t-otel"])
            .relay_config(RelayConfig::default().poll_interval(Duration::from_millis(50)))
            .start()
            .await
            .unwrap();
        commit_one(&t.db, runtime.outbox(), "otel-local").await;
        let handled = handled_one(&t.db, "t-otel").await;
        runtime.shutdown().await;
        assert!(handled, "the event was handled");
        Some(first_event(&t.db).await)
    });
    let Some((event_id, traceparent)) = context else {
        return;
    };
    one_send(
        &spans,
        "local",
        ("database-local", LineAdded::EVENT_TYPE),
        &event_id,
        &traceparent,
    );
    let process = on_road(&spans, "worker", "process");
    assert_eq!(process.len(), 1, "{spans:#?}");
    check(
        process[0],
        SpanKind::Consumer,
        &[
            ("messaging.system", "database-local"),
            ("messaging.consumer.group.name", "t-otel"),
            ("messaging.message.id", &event_id),
        ],
    );
    in_trace_of(process[0], &traceparent);
}

/// An external message (what a webhook endpoint hands to the inbox) is received in a `receive`
/// span with its consumer, id and receipt, and handled by the worker in a `process` span whose
/// system is `webhook`; the same message again is a `duplicate` receipt.
#[test]
fn external_messages_received_follow_the_conventions() {
    let (spans, context) = traced(|_| async move {
        let t = test_db(Backend::Postgres, "otel_webhook").await?;
        let runtime = Runtime::builder(t.db.clone())
            .consumers(["t-otel-hooks"])
            .start()
            .await
            .unwrap();
        let message = IncomingMessage::new(
            "t-otel-hooks",
            "otel-psp",
            "evt_otel_1",
            "payment.succeeded",
            br#"{"amount": 5}"#.to_vec(),
        )
        .ordering_key("cus_1");
        let inbox = runtime.external_inbox();
        assert!(inbox.receive(&message).await.unwrap().is_new());
        assert!(!inbox.receive(&message).await.unwrap().is_new());
        let handled = handled_one(&t.db, "t-otel-hooks").await;
        runtime.shutdown().await;
        assert!(handled, "the message was handled");
        Some(())
    });
    if context.is_none() {
        return;
    }
    let received = on_road(&spans, "webhook", "receive");
    assert_eq!(received.len(), 2, "{spans:#?}");
    for span in &received {
        check(
            span,
            SpanKind::Consumer,
            &[
                ("messaging.system", "webhook"),
                ("messaging.consumer.group.name", "t-otel-hooks"),
                ("messaging.message.id", "evt_otel_1"),
                ("outbox.event_type", "payment.succeeded"),
                ("outbox.aggregate.id", "cus_1"),
            ],
        );
    }
    let receipts: Vec<_> = received
        .iter()
        .filter_map(|s| attr(s, "outbox.receipt"))
        .collect();
    assert_eq!(receipts, ["new", "duplicate"]);
    let process = on_road(&spans, "worker", "process");
    assert_eq!(process.len(), 1, "{spans:#?}");
    check(
        process[0],
        SpanKind::Consumer,
        &[
            ("messaging.system", "webhook"),
            ("messaging.consumer.group.name", "t-otel-hooks"),
            ("messaging.message.id", "evt_otel_1"),
        ],
    );
}

/// The WAL relay publishes what it reads from the slot in a `send` span of the producer's trace.
#[cfg(feature = "postgres-wal")]
#[test]
fn the_wal_relay_follows_the_conventions() {
    let (spans, context) = traced(|_| async move {
        let t = logical_test_db("otel_wal").await?;
        let nats = transport("otel_wal").await?;
        let wal = outbox::relay::WalConfig::new(t.url.clone())
            .slot("outbox_otel_wal")
            .table_grace(Duration::from_secs(60));
        let runtime = Runtime::builder(t.db.clone())
            .source("carts")
            .transport(nats.0.clone())
            .consumers(["t-otel"])
            .relay_config(RelayConfig::default().listen(false))
            .wal(wal)
            .start()
            .await
            .unwrap();
        // Streaming, not only the slot there (a slot being created is active before its
        // consistent point).
        let streaming = eventually(Duration::from_secs(20), || async {
            runtime.relay_stats().map(|s| s.wal) == Some(outbox::relay::WalReader::Streaming)
                && outbox::store::wal::slot(&t.db, "outbox_otel_wal")
                    .await
                    .unwrap()
                    .is_some_and(|s| s.active)
        })
        .await;
        assert!(streaming, "the relay streams from its slot");
        // A handle of its own: no fast path, the WAL stream finds the event.
        commit_one(&t.db, &Outbox::new("carts"), "otel-wal").await;
        let handled = handled_one(&t.db, "t-otel").await;
        runtime.shutdown().await;
        assert!(handled, "the event was handled");
        let (event_id, traceparent) = first_event(&t.db).await;
        // An inactive slot would keep the cluster's WAL.
        outbox::store::wal::drop_slot(&t.db, "outbox_otel_wal", true)
            .await
            .unwrap();
        Some((event_id, traceparent, nats_destination(&nats.0)))
    });
    let Some((event_id, traceparent, destination)) = context else {
        return;
    };
    one_send(
        &spans,
        "wal",
        ("nats", &destination),
        &event_id,
        &traceparent,
    );
}
