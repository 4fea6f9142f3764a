//! Spans and metrics named after OpenTelemetry's
//! [messaging semantic conventions](https://opentelemetry.io/docs/specs/semconv/messaging/), on
//! every road an event takes.
//!
//! Spans are `tracing` spans at `INFO` level under the target `outbox::telemetry`; with the
//! `tracing-opentelemetry` layer they become OpenTelemetry spans with the conventions' names,
//! kinds and attributes (`otel.name`, `otel.kind` and `otel.status_code` are the fields that
//! layer reads). Without a subscriber that wants them they cost a callsite check.
//!
//! | road | span name | kind | `messaging.operation.type` |
//! |---|---|---|---|
//! | the claim loop, the fast path, the WAL relay (one span per message) | `send {destination}` | producer | `send` |
//! | the database-local transport (one span per event moved into the inbox) | `send {event type}` | producer | `send` |
//! | a consumer's delivery from the broker: recording it in the inbox | `receive {destination}` | consumer | `receive` |
//! | a webhook or [`ExternalInbox::receive`](crate::inbox::ExternalInbox::receive) | `receive {consumer}` | consumer | `receive` |
//! | a handler's run, from a delivery or by the worker (retries, stored and local messages) | `process {destination}` | consumer | `process` |
//!
//! Each carries `messaging.system` (the transport's name: `nats`, `kafka`, `rabbitmq`,
//! `redis`, `memory`, `database-local`; `webhook` for external messages),
//! `messaging.destination.name` (the subject, topic, routing key or stream key the transport
//! uses; the event type where no broker is involved), `messaging.message.id` (the event id, which
//! is also the CloudEvents `id` and the broker's deduplication key), `messaging.operation.name`,
//! and on the consumer's side `messaging.consumer.group.name` (the consumer's name). A failed
//! publish or handler run sets `error.type` and the span's status to error. The SDK adds
//! `outbox.road` (`claim_loop`, `fast_path`, `wal`, `local`, `consumer`, `worker`, `webhook`),
//! `outbox.event_type`, `outbox.aggregate.type`, `outbox.aggregate.id` and, on `process`,
//! `outbox.attempt`.
//!
//! With the `opentelemetry` feature and [`trace::otel::install`](crate::trace::otel), a `send`
//! and a `process` span are children of the span that enqueued the event: a send the relay makes
//! later, from another task or another process, is in the producer's trace.
//!
//! The conventions' metrics are recorded beside the SDK's own (see [`crate::metrics`]):
//!
//! | name | kind | unit | attributes |
//! |---|---|---|---|
//! | `messaging.client.sent.messages` | counter | `{message}` | `messaging.system`, `messaging.operation.name`, `messaging.destination.name`, `error.type` on failure |
//! | `messaging.client.operation.duration` | histogram | `s` | `messaging.system`, `messaging.operation.name` (one publish call of the transport) |
//! | `messaging.client.consumed.messages` | counter | `{message}` | `messaging.system`, `messaging.operation.name`, `messaging.consumer.group.name` |
//! | `messaging.process.duration` | histogram | `s` | `messaging.system`, `messaging.operation.name`, `messaging.consumer.group.name`, `error.type` on failure |
//!
//! A Prometheus exporter writes the dots as underscores (`messaging_client_sent_messages`).

use std::time::Duration;

use metrics::{Unit, counter, describe_counter, describe_histogram, histogram};
use tracing::{Span, field::Empty};

/// `messaging.client.sent.messages`: messages a transport was asked to publish, with
/// `error.type` for those it did not confirm.
pub const SENT_MESSAGES: &str = "messaging.client.sent.messages";
/// `messaging.client.operation.duration`: one publish call of a transport, in seconds.
pub const OPERATION_DURATION: &str = "messaging.client.operation.duration";
/// `messaging.client.consumed.messages`: messages a consumer received from a broker or a
/// webhook (the database-local transport's rows are counted as sent, into the inbox).
pub const CONSUMED_MESSAGES: &str = "messaging.client.consumed.messages";
/// `messaging.process.duration`: one handler run, in seconds, with `error.type` when it failed.
pub const PROCESS_DURATION: &str = "messaging.process.duration";

/// The span target: filter with `outbox::telemetry=info`.
pub const TARGET: &str = "outbox::telemetry";

/// The road an event or message is on (the `outbox.road` attribute).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Road {
    ClaimLoop,
    FastPath,
    Wal,
    Local,
    Consumer,
    Worker,
    Webhook,
}

impl Road {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Road::ClaimLoop => "claim_loop",
            Road::FastPath => "fast_path",
            Road::Wal => "wal",
            Road::Local => "local",
            Road::Consumer => "consumer",
            Road::Worker => "worker",
            Road::Webhook => "webhook",
        }
    }
}

/// Describe the conventions' metrics to the installed recorder.
pub(crate) fn describe() {
    describe_counter!(
        SENT_MESSAGES,
        Unit::Count,
        "Messages a transport was asked to publish (error.type: not confirmed)"
    );
    describe_histogram!(
        OPERATION_DURATION,
        Unit::Seconds,
        "One publish call of a transport"
    );
    describe_counter!(
        CONSUMED_MESSAGES,
        Unit::Count,
        "Messages a consumer received"
    );
    describe_histogram!(PROCESS_DURATION, Unit::Seconds, "One handler run");
}

/// What a `send` span describes.
pub(crate) struct Send<'a> {
    pub(crate) road: Road,
    pub(crate) system: &'static str,
    pub(crate) destination: &'a str,
    pub(crate) message_id: &'a dyn std::fmt::Display,
    pub(crate) event_type: &'a str,
    pub(crate) aggregate_type: &'a str,
    pub(crate) aggregate_id: &'a str,
    pub(crate) body_size: usize,
    /// The W3C `traceparent` and `tracestate` the event was enqueued under.
    pub(crate) traceparent: Option<&'a str>,
    pub(crate) tracestate: Option<&'a str>,
}

/// A producer span for one message, a child of the span that enqueued it.
pub(crate) fn send_span(send: &Send<'_>) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "outbox.send",
        otel.name = format!("send {}", send.destination),
        otel.kind = "producer",
        otel.status_code = Empty,
        messaging.system = send.system,
        messaging.operation.type = "send",
        messaging.operation.name = "send",
        messaging.destination.name = send.destination,
        messaging.message.id = %send.message_id,
        messaging.message.body.size = send.body_size,
        messaging.kafka.message.key = Empty,
        messaging.rabbitmq.destination.routing_key = Empty,
        error.type = Empty,
        outbox.road = send.road.as_str(),
        outbox.event_type = send.event_type,
        outbox.aggregate.type = send.aggregate_type,
        outbox.aggregate.id = send.aggregate_id,
    );
    if !span.is_disabled() {
        match send.system {
            "kafka" => {
                span.record("messaging.kafka.message.key", send.aggregate_id);
            }
            "rabbitmq" => {
                span.record(
                    "messaging.rabbitmq.destination.routing_key",
                    send.destination,
                );
            }
            _ => {}
        }
        continue_trace(&span, send.traceparent, send.tracestate);
    }
    span
}

/// What a `receive` or `process` span describes.
pub(crate) struct Consume<'a> {
    pub(crate) road: Road,
    pub(crate) system: &'static str,
    pub(crate) consumer: &'a str,
    pub(crate) destination: &'a str,
    pub(crate) message_id: &'a dyn std::fmt::Display,
    pub(crate) event_type: &'a str,
    pub(crate) aggregate_id: &'a str,
}

/// A consumer span for recording a delivered or received message.
pub(crate) fn receive_span(consume: &Consume<'_>) -> Span {
    consume_span(consume, "receive")
}

/// A consumer span for one handler run; its parent is set by the caller (the producer's span
/// with OpenTelemetry).
pub(crate) fn process_span(consume: &Consume<'_>, attempt: u32) -> Span {
    let span = consume_span(consume, "process");
    span.record("outbox.attempt", attempt);
    span
}

/// The consumer's span of `operation` (`receive` or `process`): its fields are declared here
/// once, those of one operation only recorded by its caller.
fn consume_span(consume: &Consume<'_>, operation: &'static str) -> Span {
    tracing::info_span!(
        target: TARGET,
        "outbox.consume",
        otel.name = format!("{operation} {}", consume.destination),
        otel.kind = "consumer",
        otel.status_code = Empty,
        messaging.system = consume.system,
        messaging.operation.type = operation,
        messaging.operation.name = operation,
        messaging.destination.name = consume.destination,
        messaging.consumer.group.name = consume.consumer,
        messaging.message.id = %consume.message_id,
        error.type = Empty,
        outbox.road = consume.road.as_str(),
        outbox.event_type = consume.event_type,
        outbox.aggregate.id = consume.aggregate_id,
        outbox.attempt = Empty,
        outbox.delivery_count = Empty,
        outbox.receipt = Empty,
    )
}

/// Mark `span` failed with `error_type` (a short, low-cardinality class).
pub(crate) fn failed(span: &Span, error_type: &str) {
    span.record("error.type", error_type);
    span.record("otel.status_code", "error");
}

/// Make the span a child of the W3C context the event was enqueued under (with OpenTelemetry
/// installed; without it, nothing to do).
#[allow(unused_variables)]
fn continue_trace(span: &Span, traceparent: Option<&str>, tracestate: Option<&str>) {
    #[cfg(feature = "opentelemetry")]
    if crate::trace::otel::installed()
        && let Some(parent) = traceparent
            .and_then(|tp| crate::trace::TraceContext::new(tp, tracestate.map(str::to_owned)).ok())
    {
        crate::trace::otel::set_parent(span, &parent);
    }
}

/// One publish call of `system`'s transport: `sent` messages, the error class of each that was
/// not confirmed, and how long the call took.
pub(crate) fn sent(
    system: &'static str,
    destinations: impl Iterator<Item = (String, Option<&'static str>)>,
    took: Duration,
) {
    histogram!(OPERATION_DURATION, "messaging.system" => system, "messaging.operation.name" => "send")
        .record(took.as_secs_f64());
    for (destination, error) in destinations {
        match error {
            None => counter!(
                SENT_MESSAGES,
                "messaging.system" => system,
                "messaging.operation.name" => "send",
                "messaging.destination.name" => destination,
            )
            .increment(1),
            Some(error) => counter!(
                SENT_MESSAGES,
                "messaging.system" => system,
                "messaging.operation.name" => "send",
                "messaging.destination.name" => destination,
                "error.type" => error,
            )
            .increment(1),
        }
    }
}

/// `n` messages `consumer` received through `system`.
pub(crate) fn consumed(system: &'static str, consumer: &str, n: usize) {
    counter!(
        CONSUMED_MESSAGES,
        "messaging.system" => system,
        "messaging.operation.name" => "receive",
        "messaging.consumer.group.name" => consumer.to_owned(),
    )
    .increment(n as u64);
}

/// One handler run of `consumer`, failed with `error` when it did.
pub(crate) fn processed(
    system: &'static str,
    consumer: &'static str,
    took: Duration,
    error: Option<&'static str>,
) {
    let seconds = took.as_secs_f64();
    match error {
        None => histogram!(
            PROCESS_DURATION,
            "messaging.system" => system,
            "messaging.operation.name" => "process",
            "messaging.consumer.group.name" => consumer,
        )
        .record(seconds),
        Some(error) => histogram!(
            PROCESS_DURATION,
            "messaging.system" => system,
            "messaging.operation.name" => "process",
            "messaging.consumer.group.name" => consumer,
            "error.type" => error,
        )
        .record(seconds),
    }
}
