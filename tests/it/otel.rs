//! With the `opentelemetry` feature, the producer's OpenTelemetry span travels in the envelope
//! through a real broker (NATS JetStream), and the consumer's `outbox.handle` span is its child:
//! one trace from the request that committed the event to the handler that consumed it.
//!
//! The tracing subscriber is the test's own, set on every thread of the test's tokio runtime:
//! the spans of the other tests in the process do not reach its exporter.

use std::time::Duration;

use crate::common::carts::*;
use crate::common::nats::transport;
use crate::common::*;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use outbox::prelude::*;
use outbox::relay::RelayConfig;
use outbox::runtime::Runtime;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

#[inbox_handler(consumer = "t-otel")]
async fn handle(_tx: &InboxTransaction, _event: Event<LineAdded>) -> Result<(), HandlerError> {
    Ok(())
}

#[test]
fn the_handler_span_continues_the_producers_trace() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("outbox-test")));
    let dispatch = tracing::Dispatch::new(subscriber);
    // Each thread keeps the subscriber until it ends.
    on_own_runtime(
        move || std::mem::forget(tracing::dispatcher::set_default(&dispatch)),
        one_trace_across_the_broker(exporter, provider),
    );
}

async fn one_trace_across_the_broker(exporter: InMemorySpanExporter, provider: SdkTracerProvider) {
    let Some(t) = test_db(Backend::Postgres, "otel_trace_pg").await else {
        return;
    };
    let Some(nats) = transport("otel_pg").await else {
        return;
    };
    assert!(outbox::trace::otel::install());

    let runtime = Runtime::builder(t.db.clone())
        .source("carts")
        .transport(nats.0.clone())
        .consumers(["t-otel"])
        .relay_config(RelayConfig::default().poll_interval(Duration::from_millis(50)))
        .start()
        .await
        .unwrap();
    let outbox = runtime.outbox().clone();
    let checkout = tracing::info_span!("checkout");
    async {
        let tx = outbox.begin(&t.db).await.unwrap();
        tx.enqueue(&LineAdded {
            cart: "otel".into(),
            seq: 1,
        })
        .unwrap();
        let _ = tx.commit().await.unwrap();
    }
    .instrument(checkout)
    .await;

    let handled = eventually(Duration::from_secs(30), || async {
        inbox_rows(&t.db, "t-otel")
            .await
            .iter()
            .any(|r| r.status == "DONE")
    })
    .await;
    runtime.shutdown().await;
    assert!(handled, "the event was handled");
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let checkout = spans
        .iter()
        .find(|s| s.name == "checkout")
        .expect("the producer's span");
    let handle = spans
        .iter()
        .find(|s| s.name == "outbox.handle")
        .expect("the handler's span");
    assert_eq!(
        handle.span_context.trace_id(),
        checkout.span_context.trace_id(),
        "one trace across the broker"
    );
    let producer_side: Vec<_> = spans
        .iter()
        .filter(|s| s.span_context.trace_id() == checkout.span_context.trace_id())
        .map(|s| s.span_context.span_id())
        .collect();
    assert!(
        producer_side.contains(&handle.parent_span_id),
        "the handler's parent is a span of the producer"
    );
    assert_ne!(
        handle.span_context.span_id(),
        checkout.span_context.span_id()
    );
    let row = &outbox_rows(&t.db).await[0];
    let traceparent = row.headers["traceparent"].as_str().unwrap();
    assert!(traceparent.contains(&checkout.span_context.trace_id().to_string()));
}
