//! The NATS JetStream transport against a real nats-server (127.0.0.1:4222, JetStream on).
//!
//! Each test works in its own namespace and stream (`t_<test>_<random>`) and deletes the stream when
//! it ends, so tests run in parallel. When the server is not reachable the tests say so loudly and
//! pass, unless `OUTBOX_REQUIRE_SERVICES=1`, which makes a missing server a failure.

use std::time::{Duration, Instant};

use outbox::transport::{
    Delivery, OutgoingMessage, PublishError, SubscribeOptions, Subscription, Transport,
    nats::{NatsConfig, NatsTransport, async_nats, durable_name},
};
use uuid::Uuid;

use crate::common::assert_shared_and_fanned_out;

use crate::common::nats::{transport, transport_with};

fn message(event_type: &str, n: usize) -> OutgoingMessage {
    let event_id = Uuid::now_v7();
    let body = serde_json::json!({
        "specversion": "1.0",
        "id": event_id.to_string(),
        "type": event_type,
        "source": "/tests/nats",
        "data": { "n": n },
    });
    OutgoingMessage {
        event_id,
        event_type: event_type.to_owned(),
        aggregate_type: "order".to_owned(),
        aggregate_id: format!("order-{n}"),
        body: serde_json::to_vec(&body).expect("json").into(),
    }
}

fn batch(event_type: &str, count: usize) -> Vec<OutgoingMessage> {
    (0..count).map(|n| message(event_type, n)).collect()
}

async fn publish_ok(transport: &NatsTransport, messages: &[OutgoingMessage]) {
    let results = transport.publish(messages).await;
    assert_eq!(results.len(), messages.len());
    for (i, result) in results.iter().enumerate() {
        assert!(result.is_ok(), "message {i} not confirmed: {result:?}");
    }
}

async fn stream_messages(transport: &NatsTransport) -> u64 {
    transport
        .jetstream()
        .get_stream(transport.stream_name())
        .await
        .expect("stream info")
        .cached_info()
        .state
        .messages
}

/// The next delivery within `within`, or `None` when nothing arrived in time.
async fn next_within(
    subscription: &mut Box<dyn Subscription>,
    within: Duration,
) -> Option<Delivery> {
    match tokio::time::timeout(within, subscription.next()).await {
        Ok(Some(Ok(delivery))) => Some(delivery),
        Ok(Some(Err(err))) => panic!("subscription error: {err}"),
        Ok(None) => panic!("subscription closed"),
        Err(_) => None,
    }
}

async fn next_delivery(subscription: &mut Box<dyn Subscription>) -> Delivery {
    next_within(subscription, Duration::from_secs(10))
        .await
        .expect("a delivery within 10 s")
}

fn options(ack_wait: Duration, max_in_flight: usize) -> SubscribeOptions {
    SubscribeOptions {
        ack_wait,
        max_in_flight,
    }
}

fn types(names: &[&str]) -> Vec<String> {
    names.iter().map(|name| (*name).to_owned()).collect()
}

async fn consumer_info(
    transport: &NatsTransport,
    consumer: &str,
) -> async_nats::jetstream::consumer::Info {
    transport
        .jetstream()
        .get_stream(transport.stream_name())
        .await
        .expect("stream")
        .consumer_info(durable_name(consumer))
        .await
        .expect("consumer info")
}

#[tokio::test]
async fn setup_is_idempotent_and_creates_the_stream() {
    let Some(transport) = transport("setup").await else {
        return;
    };
    transport.setup().await.expect("first setup");
    transport.setup().await.expect("second setup");

    let stream = transport
        .jetstream()
        .get_stream(transport.stream_name())
        .await
        .expect("the stream exists");
    let info = stream.cached_info();
    assert_eq!(
        transport.stream_name(),
        transport.namespace().to_uppercase()
    );
    assert_eq!(
        info.config.subjects,
        vec![format!("{}.>", transport.namespace())]
    );
    assert_eq!(info.config.duplicate_window, Duration::from_secs(120));
    assert_eq!(
        info.config.storage,
        async_nats::jetstream::stream::StorageType::File
    );
    assert_eq!(info.state.messages, 0);

    // Changed settings are applied to the existing stream by the next setup.
    let reconfigured = NatsTransport::from_client(
        transport.client().clone(),
        NatsConfig::default()
            .namespace(transport.namespace())
            .duplicate_window(Duration::from_secs(30))
            .max_age(Duration::from_secs(3_600)),
    )
    .expect("valid config");
    reconfigured.setup().await.expect("setup with new settings");
    let info = transport
        .jetstream()
        .get_stream(transport.stream_name())
        .await
        .expect("the stream exists")
        .cached_info()
        .clone();
    assert_eq!(info.config.duplicate_window, Duration::from_secs(30));
    assert_eq!(info.config.max_age, Duration::from_secs(3_600));

    // The same stream name claimed for another namespace is refused with a clear error.
    let other = NatsTransport::from_client(
        transport.client().clone(),
        NatsConfig::default()
            .namespace(format!("{}_other", transport.namespace()))
            .stream_name(transport.stream_name()),
    )
    .expect("valid config");
    let err = other.setup().await.expect_err("subjects differ");
    assert!(
        err.to_string().contains("exists with subjects"),
        "unclear error: {err}"
    );
}

#[tokio::test]
async fn a_batch_of_1000_is_confirmed_and_stored_in_order() {
    let Some(transport) = transport("batch").await else {
        return;
    };
    transport.setup().await.expect("setup");
    let messages = batch("order.placed", 1_000);

    publish_ok(&transport, &messages).await;

    assert_eq!(stream_messages(&transport).await, 1_000);
    let stream = transport
        .jetstream()
        .get_stream(transport.stream_name())
        .await
        .expect("stream");
    let subject = format!("{}.order.placed", transport.namespace());
    for (i, sent) in messages.iter().enumerate() {
        let stored = stream
            .get_raw_message(i as u64 + 1)
            .await
            .expect("stored message");
        assert_eq!(stored.subject.as_str(), subject);
        assert_eq!(stored.payload, sent.body, "body of message {i}");
        let event_id = sent.event_id.to_string();
        assert_eq!(
            stored.headers.get("Nats-Msg-Id").map(|v| v.as_str()),
            Some(event_id.as_str()),
            "Nats-Msg-Id of message {i}"
        );
        assert_eq!(
            stored.headers.get("Content-Type").map(|v| v.as_str()),
            Some("application/cloudevents+json")
        );
        assert_eq!(
            stored.headers.get("ce-type").map(|v| v.as_str()),
            Some("order.placed")
        );
    }
}

#[tokio::test]
async fn republishing_inside_the_duplicate_window_is_deduplicated() {
    let Some(transport) = transport("dedup").await else {
        return;
    };
    transport.setup().await.expect("setup");
    let messages = batch("order.placed", 10);
    publish_ok(&transport, &messages).await;
    assert_eq!(stream_messages(&transport).await, 10);

    // A relay that crashed before marking the rows SENT publishes them again: still confirmed,
    // still stored once.
    publish_ok(&transport, &messages).await;
    assert_eq!(stream_messages(&transport).await, 10);

    // Half old, half new: only the new ones are added.
    let mut mixed = messages[..5].to_vec();
    mixed.extend(batch("order.placed", 5));
    publish_ok(&transport, &mixed).await;
    assert_eq!(stream_messages(&transport).await, 15);
}

#[tokio::test]
async fn publish_failures_are_reported_per_message() {
    let Some(transport) = transport("failures").await else {
        return;
    };

    // No stream stores the namespace yet: every message fails, none is reported as sent.
    let results = transport.publish(&batch("order.placed", 3)).await;
    assert_eq!(results.len(), 3);
    for result in &results {
        match result {
            Err(PublishError::Rejected(reason)) => {
                assert!(reason.contains("setup"), "unclear reason: {reason}")
            }
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    transport.setup().await.expect("setup");
    let max_payload = transport.client().server_info().max_payload;
    let mut oversized = message("order.placed", 1);
    oversized.body = vec![b'x'; 2 * 1024 * 1024].into();
    assert!(oversized.body.len() > max_payload);
    let messages = vec![
        message("order.placed", 0),
        oversized,
        message("order.placed", 2),
    ];

    let results = transport.publish(&messages).await;

    assert_eq!(results.len(), 3);
    assert!(results[0].is_ok(), "{:?}", results[0]);
    match &results[1] {
        Err(err @ PublishError::Permanent(reason)) => {
            assert!(err.is_permanent());
            assert!(
                reason.contains("max_payload") || reason.contains("size"),
                "unclear reason: {reason}"
            );
        }
        other => panic!("expected a permanent failure, got {other:?}"),
    }
    assert!(results[2].is_ok(), "{:?}", results[2]);
    assert_eq!(stream_messages(&transport).await, 2);
}

#[tokio::test]
async fn a_missing_pub_ack_is_a_timeout_and_batches_wait_in_parallel() {
    let Some(transport) = transport_with("timeout", |builder| {
        builder.publish_timeout(Duration::from_millis(500))
    })
    .await
    else {
        return;
    };
    // No stream, but a plain subscriber on the namespace: every publish reaches a responder that
    // never sends a PubAck.
    let _silent = transport
        .client()
        .subscribe(format!("{}.>", transport.namespace()))
        .await
        .expect("subscribe");
    transport.client().flush().await.expect("flush");

    let started = Instant::now();
    let results = transport.publish(&batch("order.placed", 20)).await;
    let elapsed = started.elapsed();

    assert_eq!(results.len(), 20);
    for result in &results {
        assert_eq!(
            result,
            &Err(PublishError::Timeout(Duration::from_millis(500)))
        );
    }
    assert!(
        elapsed >= Duration::from_millis(450),
        "gave up early: {elapsed:?}"
    );
    // Twenty sequential waits would take 10 s: the acknowledgements are awaited together.
    assert!(
        elapsed < Duration::from_secs(5),
        "not pipelined: {elapsed:?}"
    );
}

#[tokio::test]
async fn subscribe_delivers_in_order_and_ack_settles() {
    let Some(transport) = transport("ack").await else {
        return;
    };
    transport.setup().await.expect("setup");
    let mut messages = Vec::new();
    for n in 0..5 {
        messages.push(message("order.placed", n));
        messages.push(message("order.shipped", n));
    }
    publish_ok(&transport, &messages).await;

    let mut subscription = transport
        .subscribe(
            "billing",
            &types(&["order.placed"]),
            &options(Duration::from_secs(1), 16),
        )
        .await
        .expect("subscribe");

    let subject = format!("{}.order.placed", transport.namespace());
    for sent in messages.iter().filter(|m| m.event_type == "order.placed") {
        let delivery = next_delivery(&mut subscription).await;
        assert_eq!(delivery.subject, subject);
        assert_eq!(delivery.message_id, Some(sent.event_id.to_string()));
        assert_eq!(delivery.body, sent.body);
        assert_eq!(delivery.delivery_count, 1);
        delivery.ack().await.expect("ack");
    }

    // Acked deliveries are not redelivered once the ack wait (1 s) has passed.
    assert!(
        next_within(&mut subscription, Duration::from_millis(2_500))
            .await
            .is_none(),
        "an acked message was redelivered"
    );
    let info = consumer_info(&transport, "billing").await;
    assert_eq!(info.config.filter_subject, subject);
    assert_eq!(info.num_ack_pending, 0);
    assert_eq!(info.num_pending, 0);
    assert_eq!(info.num_redelivered, 0);
    assert_eq!(
        info.delivered.consumer_sequence, 5,
        "five deliveries, no redelivery"
    );
    assert_eq!(info.ack_floor.consumer_sequence, 5, "all five acked");
}

#[tokio::test]
async fn nack_and_ack_wait_redeliver() {
    let Some(transport) = transport("nack").await else {
        return;
    };
    transport.setup().await.expect("setup");
    let messages = batch("order.placed", 2);
    publish_ok(&transport, &messages).await;
    let mut subscription = transport
        .subscribe(
            "retrying",
            &types(&["order.placed"]),
            &options(Duration::from_secs(1), 16),
        )
        .await
        .expect("subscribe");

    let first = next_delivery(&mut subscription).await;
    let second = next_delivery(&mut subscription).await;
    assert_eq!(first.message_id, Some(messages[0].event_id.to_string()));
    assert_eq!(second.message_id, Some(messages[1].event_id.to_string()));
    assert_eq!((first.delivery_count, second.delivery_count), (1, 1));

    // The first is nacked with a delay, the second is never settled.
    let nacked_at = Instant::now();
    first
        .nack(Some(Duration::from_millis(200)))
        .await
        .expect("nack");
    drop(second);

    let redelivered = next_delivery(&mut subscription).await;
    assert_eq!(
        redelivered.message_id,
        Some(messages[0].event_id.to_string()),
        "the nacked message comes back first, after its 200 ms delay"
    );
    assert_eq!(redelivered.delivery_count, 2);
    assert!(
        nacked_at.elapsed() >= Duration::from_millis(150),
        "redelivered before the nack delay: {:?}",
        nacked_at.elapsed()
    );
    redelivered.ack().await.expect("ack");

    let expired = next_delivery(&mut subscription).await;
    assert_eq!(
        expired.message_id,
        Some(messages[1].event_id.to_string()),
        "the unsettled message comes back after the ack wait"
    );
    assert_eq!(expired.delivery_count, 2);
    assert!(
        nacked_at.elapsed() >= Duration::from_millis(800),
        "redelivered before the ack wait: {:?}",
        nacked_at.elapsed()
    );
    expired.ack().await.expect("ack");

    assert!(
        next_within(&mut subscription, Duration::from_millis(2_000))
            .await
            .is_none()
    );
    let info = consumer_info(&transport, "retrying").await;
    assert_eq!(info.num_ack_pending, 0);
    assert_eq!(info.ack_floor.stream_sequence, 2);
}

/// Reads and acks until nothing arrives for `idle`; returns the message ids in delivery order.
async fn drain(mut subscription: Box<dyn Subscription>, idle: Duration) -> Vec<String> {
    let mut ids = Vec::new();
    while let Some(delivery) = next_within(&mut subscription, idle).await {
        ids.push(delivery.message_id.clone().expect("message id"));
        delivery.ack().await.expect("ack");
    }
    ids
}

#[tokio::test]
async fn one_consumer_name_shares_deliveries_and_different_names_each_get_all() {
    let Some(transport) = transport("groups").await else {
        return;
    };
    transport.setup().await.expect("setup");
    let messages = batch("order.placed", 40);
    publish_ok(&transport, &messages).await;
    let all: Vec<String> = messages.iter().map(|m| m.event_id.to_string()).collect();
    let event_types = types(&["order.placed"]);
    let small = options(Duration::from_secs(30), 4);

    let worker_1 = transport
        .subscribe("workers", &event_types, &small)
        .await
        .expect("subscribe");
    let worker_2 = transport
        .subscribe("workers", &event_types, &small)
        .await
        .expect("subscribe");
    let auditor = transport
        .subscribe("auditors", &event_types, &small)
        .await
        .expect("subscribe");
    let idle = Duration::from_secs(3);
    let (got_1, got_2, audited) = tokio::join!(
        tokio::spawn(drain(worker_1, idle)),
        tokio::spawn(drain(worker_2, idle)),
        tokio::spawn(drain(auditor, idle)),
    );
    let (got_1, got_2, audited) = (
        got_1.expect("task"),
        got_2.expect("task"),
        audited.expect("task"),
    );

    assert_shared_and_fanned_out(&got_1, &got_2, &audited, &all);
}

#[tokio::test]
async fn a_consumer_of_two_types_skips_the_others() {
    let Some(transport) = transport("filter").await else {
        return;
    };
    transport.setup().await.expect("setup");
    let mut messages = Vec::new();
    for n in 0..3 {
        messages.push(message("order.placed", n));
        messages.push(message("order.cancelled", n));
        messages.push(message("order.shipped", n));
    }
    publish_ok(&transport, &messages).await;

    let mut subscription = transport
        .subscribe(
            "shipping",
            &types(&["order.placed", "order.shipped"]),
            &options(Duration::from_secs(1), 16),
        )
        .await
        .expect("subscribe");
    let wanted: Vec<&OutgoingMessage> = messages
        .iter()
        .filter(|m| m.event_type != "order.cancelled")
        .collect();
    for sent in &wanted {
        let delivery = next_delivery(&mut subscription).await;
        assert_eq!(delivery.message_id, Some(sent.event_id.to_string()));
        assert_eq!(
            delivery.subject,
            format!("{}.{}", transport.namespace(), sent.event_type)
        );
        delivery.ack().await.expect("ack");
    }
    assert!(
        next_within(&mut subscription, Duration::from_millis(2_500))
            .await
            .is_none(),
        "a skipped or acked message was delivered"
    );
    // The skipped `order.cancelled` deliveries were settled too: nothing pending on the broker.
    let info = consumer_info(&transport, "shipping").await;
    assert_eq!(
        info.config.filter_subject,
        format!("{}.>", transport.namespace())
    );
    assert_eq!(info.num_ack_pending, 0);
    assert_eq!(info.num_pending, 0);
    assert_eq!(info.ack_floor.stream_sequence, 9);

    // A consumer of the third type alone filters on the broker and gets just those.
    let mut cancelled = transport
        .subscribe(
            "refunds",
            &types(&["order.cancelled"]),
            &options(Duration::from_secs(1), 16),
        )
        .await
        .expect("subscribe");
    for sent in messages
        .iter()
        .filter(|m| m.event_type == "order.cancelled")
    {
        let delivery = next_delivery(&mut cancelled).await;
        assert_eq!(delivery.message_id, Some(sent.event_id.to_string()));
        delivery.ack().await.expect("ack");
    }
    assert!(
        next_within(&mut cancelled, Duration::from_millis(1_500))
            .await
            .is_none()
    );
}

#[tokio::test]
async fn changing_a_consumers_filter_is_applied_or_refused_clearly() {
    let Some(transport) = transport("refilter").await else {
        return;
    };
    transport.setup().await.expect("setup");
    let single = transport
        .subscribe(
            "changing",
            &types(&["order.placed"]),
            &SubscribeOptions::default(),
        )
        .await
        .expect("subscribe");
    drop(single);

    let result = transport
        .subscribe(
            "changing",
            &types(&["order.placed", "order.shipped"]),
            &SubscribeOptions::default(),
        )
        .await;
    let filter = consumer_info(&transport, "changing")
        .await
        .config
        .filter_subject;
    match result {
        // nats-server 2.10+ updates the filter in place.
        Ok(_) => assert_eq!(filter, format!("{}.>", transport.namespace())),
        // nats-server 2.9 cannot: the error says what to do.
        Err(err) => {
            let text = err.to_string();
            assert!(text.contains("filter subject"), "unclear error: {text}");
            assert!(text.contains("nats consumer rm"), "no remedy in: {text}");
            assert_eq!(filter, format!("{}.order.placed", transport.namespace()));
        }
    }
}

#[tokio::test]
async fn health_is_ok_on_a_live_server() {
    let Some(transport) = transport("health").await else {
        return;
    };
    transport.health().await.expect("healthy");
    assert_eq!(transport.name(), "nats");
}

#[tokio::test]
async fn connecting_to_a_closed_port_fails_instead_of_hanging() {
    let started = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(15),
        NatsTransport::builder("nats://127.0.0.1:1")
            .connection_timeout(Duration::from_secs(2))
            .connect(),
    )
    .await
    .expect("connect returned instead of hanging");
    let err = result.expect_err("nothing listens on port 1");
    assert!(
        err.to_string().contains("127.0.0.1:1"),
        "the error names the server: {err}"
    );
    assert!(started.elapsed() < Duration::from_secs(15));
}
