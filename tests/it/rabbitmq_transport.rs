//! The RabbitMQ transport against a real broker (127.0.0.1:5672, guest/guest; override with
//! `OUTBOX_TEST_RABBITMQ_URL`).
//!
//! Each test works in its own namespace (`t_<test>_<random>`): its own exchange and consumer
//! queues, deleted when the test ends, so tests run in parallel. When the broker is not reachable
//! the tests say so loudly and pass, unless `OUTBOX_REQUIRE_SERVICES=1`, which makes a missing
//! broker a failure.

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use outbox::transport::{
    Delivery, OutgoingMessage, PublishError, SubscribeOptions, Subscription, Transport,
    rabbitmq::{
        QueueType, RabbitMqTransport,
        lapin::{
            self, ExchangeKind,
            options::{
                BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
            },
            types::{AMQPValue, FieldTable},
        },
    },
};
use uuid::Uuid;

use crate::common::assert_shared_and_fanned_out;

use crate::common::rabbitmq::*;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn message(event_type: &str, n: usize) -> OutgoingMessage {
    let event_id = Uuid::now_v7();
    let body = serde_json::json!({
        "specversion": "1.0",
        "id": event_id.to_string(),
        "type": event_type,
        "source": "/tests/rabbitmq",
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

async fn publish_ok(transport: &RabbitMqTransport, messages: &[OutgoingMessage]) {
    let results = transport.publish(messages).await;
    assert_eq!(results.len(), messages.len());
    for (i, result) in results.iter().enumerate() {
        assert!(result.is_ok(), "message {i} not confirmed: {result:?}");
    }
}

fn assert_unroutable(result: &Result<(), PublishError>, event_type: &str) {
    match result {
        Err(PublishError::Rejected(reason)) => {
            assert!(reason.contains("unroutable"), "unclear reason: {reason}");
            assert!(
                reason.contains(event_type),
                "the reason names the routing key: {reason}"
            );
        }
        other => panic!("expected an unroutable rejection for `{event_type}`, got {other:?}"),
    }
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

fn options(max_in_flight: usize) -> SubscribeOptions {
    SubscribeOptions {
        max_in_flight,
        ..SubscribeOptions::default()
    }
}

/// Polls until `queue` holds `expected` ready messages (acks and requeues are asynchronous).
async fn wait_for_depth(transport: &TestTransport, queue: &str, expected: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let depth = transport.queue_depth(queue).await;
        if depth == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "queue `{queue}` holds {depth} messages, expected {expected}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Setup and topology
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_is_idempotent_and_declares_a_durable_topic_exchange() {
    let Some(transport) = transport("setup").await else {
        return;
    };
    assert_eq!(transport.exchange(), transport.namespace());
    transport.setup().await.expect("first setup");
    transport.setup().await.expect("second setup");

    let channel = transport.channel().await.expect("channel");
    let exchange = transport.exchange();
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(
            exchange.into(),
            ExchangeKind::Topic,
            passive,
            FieldTable::default(),
        )
        .await
        .expect("the exchange exists");
    // The broker accepts a redeclare only with the same type and durability.
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(
            exchange.into(),
            ExchangeKind::Topic,
            durable,
            FieldTable::default(),
        )
        .await
        .expect("it is a durable topic exchange");
    let as_direct = channel
        .exchange_declare(
            exchange.into(),
            ExchangeKind::Direct,
            durable,
            FieldTable::default(),
        )
        .await
        .expect_err("not a direct exchange");
    assert!(
        as_direct.to_string().contains("PRECONDITION_FAILED"),
        "{as_direct}"
    );
    let channel = transport.channel().await.expect("channel");
    let transient = channel
        .exchange_declare(
            exchange.into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect_err("not a transient exchange");
    assert!(
        transient.to_string().contains("PRECONDITION_FAILED"),
        "{transient}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_refuses_an_existing_exchange_of_another_type() {
    let Some(transport) = transport("setup_conflict").await else {
        return;
    };
    let channel = transport.channel().await.expect("channel");
    channel
        .exchange_declare(
            transport.exchange().into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("a fanout exchange of the same name");

    let err = transport.setup().await.expect_err("setup must refuse it");
    let text = err.to_string();
    assert!(text.contains("durable topic"), "unclear error: {text}");
    assert!(
        text.contains(transport.exchange()),
        "unnamed exchange: {text}"
    );
    // The failed declare does not poison the transport.
    transport.health().await.expect("healthy");
}

// ---------------------------------------------------------------------------------------------
// Publishing
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_confirms_a_thousand_messages_stored_in_order_with_their_properties() {
    let Some(transport) = transport("thousand").await else {
        return;
    };
    transport.setup().await.expect("setup");
    let queue = transport.declare_queue("audit", &["order.placed"]).await;
    assert_eq!(queue, format!("{}.audit", transport.namespace()));
    let messages = batch("order.placed", 1_000);

    publish_ok(&transport, &messages).await;

    assert_eq!(transport.queue_depth(&queue).await, 1_000);
    let channel = transport.channel().await.expect("channel");
    for (n, sent) in messages.iter().enumerate() {
        let got = channel
            .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
            .unwrap_or_else(|| panic!("message {n} is missing"));
        let properties = &got.delivery.properties;
        assert_eq!(
            properties.message_id().as_ref().map(|id| id.as_str()),
            Some(sent.event_id.to_string().as_str()),
            "message {n} out of order"
        );
        assert_eq!(got.delivery.data, sent.body.to_vec());
        assert_eq!(got.delivery.routing_key.as_str(), "order.placed");
        assert_eq!(got.delivery.exchange.as_str(), transport.exchange());
        assert!(!got.delivery.redelivered);
        assert_eq!(
            properties.content_type().as_ref().map(|c| c.as_str()),
            Some("application/cloudevents+json")
        );
        assert_eq!(*properties.delivery_mode(), Some(2), "not persistent");
        assert_eq!(
            properties.kind().as_ref().map(|k| k.as_str()),
            Some("order.placed")
        );
        let headers = properties.headers().as_ref().expect("headers");
        let header = |name: &str| match headers.inner().get(name) {
            Some(AMQPValue::LongString(value)) => value.to_string(),
            other => panic!("header {name}: {other:?}"),
        };
        assert_eq!(header("ce-id"), sent.event_id.to_string());
        assert_eq!(header("ce-type"), "order.placed");
        assert_eq!(header("ce-specversion"), "1.0");
    }
    let rest = channel
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .expect("basic.get");
    assert!(rest.is_none(), "more than 1,000 messages stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_messages_are_rejected_and_routable_ones_confirmed() {
    let Some(transport) = transport("unroutable").await else {
        return;
    };
    transport.setup().await.expect("setup");
    let queue = transport.declare_queue("billing", &["order.placed"]).await;
    let messages = vec![
        message("order.placed", 0),
        message("order.shipped", 0),
        message("order.placed", 1),
        message("order.cancelled", 0),
        message("order.shipped", 1),
        message("order.placed", 2),
    ];

    let results = transport.publish(&messages).await;

    assert_eq!(results.len(), 6);
    for (result, sent) in results.iter().zip(&messages) {
        if sent.event_type == "order.placed" {
            assert!(result.is_ok(), "{result:?}");
        } else {
            assert_unroutable(result, &sent.event_type);
        }
    }
    assert_eq!(transport.queue_depth(&queue).await, 3);

    // Nothing but unroutable messages: none is reported as sent.
    let lost = batch("order.shipped", 5);
    for result in transport.publish(&lost).await {
        assert_unroutable(&result, "order.shipped");
    }

    // Once a queue is bound for the type, the same messages go through.
    let shipping = transport
        .declare_queue("shipping", &["order.shipped"])
        .await;
    publish_ok(&transport, &lost).await;
    assert_eq!(transport.queue_depth(&shipping).await, 5);
    assert_eq!(transport.queue_depth(&queue).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_before_setup_is_rejected_and_recovers_after_setup() {
    let Some(transport) = transport("no_setup").await else {
        return;
    };
    let results = transport.publish(&batch("order.placed", 3)).await;
    assert_eq!(results.len(), 3);
    for result in &results {
        match result {
            Err(PublishError::Rejected(reason)) => {
                assert!(reason.contains("setup()"), "no hint in: {reason}");
                assert!(reason.contains(transport.exchange()), "{reason}");
            }
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    // The broker closed the publish channel; the next publish opens a new one.
    transport.setup().await.expect("setup");
    let queue = transport.declare_queue("late", &["order.placed"]).await;
    publish_ok(&transport, &batch("order.placed", 3)).await;
    assert_eq!(transport.queue_depth(&queue).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_nacks_and_oversized_messages_fail_permanently() {
    let Some(transport) =
        transport_with("nacks", |builder| builder.max_message_size(64 * 1024)).await
    else {
        return;
    };
    transport.setup().await.expect("setup");
    // A queue that holds two messages and refuses more: the broker nacks the overflow.
    let queue = format!("{}.bounded", transport.namespace());
    transport.track_queue(&queue);
    let channel = transport.channel().await.expect("channel");
    let mut arguments = FieldTable::default();
    arguments.insert("x-max-length".into(), AMQPValue::LongLongInt(2));
    arguments.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            arguments,
        )
        .await
        .expect("declare");
    channel
        .queue_bind(
            queue.as_str().into(),
            transport.exchange().into(),
            "order.placed".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind");

    let mut oversized = message("order.placed", 9);
    oversized.body = vec![b'x'; 100 * 1024].into();
    let mut messages = batch("order.placed", 4);
    messages.insert(1, oversized);

    let results = transport.publish(&messages).await;

    assert_eq!(results.len(), 5);
    assert!(results[0].is_ok(), "{:?}", results[0]);
    match &results[1] {
        Err(err @ PublishError::Permanent(reason)) => {
            assert!(err.is_permanent());
            assert!(reason.contains("maximum message size"), "{reason}");
        }
        other => panic!("expected a permanent failure, got {other:?}"),
    }
    assert!(results[2].is_ok(), "{:?}", results[2]);
    for result in &results[3..] {
        match result {
            Err(PublishError::Rejected(reason)) => {
                assert!(reason.contains("basic.nack"), "unclear reason: {reason}")
            }
            other => panic!("expected a nack, got {other:?}"),
        }
    }
    assert_eq!(transport.queue_depth(&queue).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishes_each_get_their_own_confirms_and_returns() {
    let Some(transport) = transport("concurrent").await else {
        return;
    };
    transport.setup().await.expect("setup");
    let queue = transport.declare_queue("orders", &["order.placed"]).await;

    let mut tasks = Vec::new();
    for _ in 0..8 {
        let transport = RabbitMqTransport::clone(&transport);
        tasks.push(tokio::spawn(async move {
            let messages: Vec<OutgoingMessage> = (0..50)
                .map(|n| {
                    let event_type = if n % 2 == 0 {
                        "order.placed"
                    } else {
                        "order.shipped"
                    };
                    message(event_type, n)
                })
                .collect();
            let results = transport.publish(&messages).await;
            (messages, results)
        }));
    }
    for task in tasks {
        let (messages, results) = task.await.expect("task");
        assert_eq!(results.len(), messages.len());
        for (result, sent) in results.iter().zip(&messages) {
            if sent.event_type == "order.placed" {
                assert!(result.is_ok(), "{result:?}");
            } else {
                assert_unroutable(result, "order.shipped");
            }
        }
    }
    assert_eq!(transport.queue_depth(&queue).await, 8 * 25);
}

// ---------------------------------------------------------------------------------------------
// Consuming
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_delivers_in_order_and_ack_settles() {
    let Some(transport) = transport("ack").await else {
        return;
    };
    transport.setup().await.expect("setup");
    let mut subscription = transport
        .subscribe_as("billing", &["order.placed"], &options(16))
        .await;
    transport
        .declare_queue("shipping", &["order.shipped"])
        .await;
    let mut messages = Vec::new();
    for n in 0..5 {
        messages.push(message("order.placed", n));
        messages.push(message("order.shipped", n));
    }
    publish_ok(&transport, &messages).await;

    let subject = format!("{}.order.placed", transport.namespace());
    for sent in messages.iter().filter(|m| m.event_type == "order.placed") {
        let delivery = next_delivery(&mut subscription).await;
        assert_eq!(delivery.subject, subject);
        assert_eq!(delivery.message_id, Some(sent.event_id.to_string()));
        assert_eq!(delivery.body, sent.body);
        assert_eq!(delivery.delivery_count, 1);
        delivery.ack().await.expect("ack");
    }
    assert!(
        next_within(&mut subscription, Duration::from_secs(1))
            .await
            .is_none(),
        "an unexpected delivery"
    );

    // Acked for good: closing the channel requeues nothing.
    drop(subscription);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let queue = transport.queue_name("billing");
    assert_eq!(transport.queue_depth(&queue).await, 0);
    assert_eq!(
        transport
            .queue_depth(&transport.queue_name("shipping"))
            .await,
        5
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_requeues_and_a_dropped_subscription_returns_its_unacked_deliveries() {
    let Some(transport) = transport("nack").await else {
        return;
    };
    transport.setup().await.expect("setup");
    let mut subscription = transport
        .subscribe_as("retrying", &["order.placed"], &options(16))
        .await;
    let messages = batch("order.placed", 2);
    publish_ok(&transport, &messages).await;

    let first = next_delivery(&mut subscription).await;
    let second = next_delivery(&mut subscription).await;
    assert_eq!(first.message_id, Some(messages[0].event_id.to_string()));
    assert_eq!(second.message_id, Some(messages[1].event_id.to_string()));
    assert_eq!((first.delivery_count, second.delivery_count), (1, 1));

    first.nack(None).await.expect("nack");
    let redelivered = next_delivery(&mut subscription).await;
    assert_eq!(
        redelivered.message_id,
        Some(messages[0].event_id.to_string())
    );
    assert_eq!(redelivered.delivery_count, 2, "flagged as a redelivery");
    redelivered.ack().await.expect("ack");

    // The second is never settled; dropping the subscription closes its channel.
    drop(second);
    drop(subscription);
    let mut again = transport
        .subscribe_as("retrying", &["order.placed"], &options(16))
        .await;
    let returned = next_delivery(&mut again).await;
    assert_eq!(returned.message_id, Some(messages[1].event_id.to_string()));
    assert_eq!(returned.delivery_count, 2);
    returned.ack().await.expect("ack");
    assert!(
        next_within(&mut again, Duration::from_secs(1))
            .await
            .is_none()
    );
    drop(again);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        transport
            .queue_depth(&transport.queue_name("retrying"))
            .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_nack_returns_at_once_and_requeues_after_the_delay() {
    let Some(transport) = transport("nack_delay").await else {
        return;
    };
    transport.setup().await.expect("setup");
    let mut subscription = transport
        .subscribe_as("delaying", &["order.placed"], &options(16))
        .await;
    let messages = batch("order.placed", 1);
    publish_ok(&transport, &messages).await;

    let delivery = next_delivery(&mut subscription).await;
    let nacked_at = Instant::now();
    delivery
        .nack(Some(Duration::from_millis(400)))
        .await
        .expect("nack");
    assert!(
        nacked_at.elapsed() < Duration::from_millis(200),
        "a delayed nack blocked the caller for {:?}",
        nacked_at.elapsed()
    );
    let redelivered = next_delivery(&mut subscription).await;
    assert!(
        nacked_at.elapsed() >= Duration::from_millis(350),
        "requeued before the delay: {:?}",
        nacked_at.elapsed()
    );
    assert_eq!(
        redelivered.message_id,
        Some(messages[0].event_id.to_string())
    );
    assert_eq!(redelivered.delivery_count, 2);
    redelivered.ack().await.expect("ack");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_queues_count_every_delivery() {
    let Some(transport) =
        transport_with("quorum", |builder| builder.queue_type(QueueType::Quorum)).await
    else {
        return;
    };
    transport.setup().await.expect("setup");
    let mut subscription = transport
        .subscribe_as("counting", &["order.placed"], &options(16))
        .await;
    let messages = batch("order.placed", 1);
    publish_ok(&transport, &messages).await;

    for expected in 1..=3 {
        let delivery = next_delivery(&mut subscription).await;
        assert_eq!(delivery.message_id, Some(messages[0].event_id.to_string()));
        assert_eq!(delivery.delivery_count, expected);
        if expected < 3 {
            delivery.nack(None).await.expect("nack");
        } else {
            delivery.ack().await.expect("ack");
        }
    }
    drop(subscription);

    // The queue keeps its kind: a classic redeclare is refused with a clear error.
    let classic = RabbitMqTransport::builder(rabbitmq_url())
        .namespace(transport.namespace())
        .connect()
        .await
        .expect("connect");
    let err = classic
        .declare_consumer_queue("counting", &types(&["order.placed"]))
        .await
        .expect_err("a quorum queue cannot become classic");
    let text = err.to_string();
    assert!(text.contains("other settings"), "unclear error: {text}");
    assert!(text.contains(&transport.queue_name("counting")), "{text}");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_consumer_name_shares_deliveries_and_different_names_each_get_all() {
    let Some(transport) = transport("groups").await else {
        return;
    };
    transport.setup().await.expect("setup");
    let small = options(4);
    let worker_1 = transport
        .subscribe_as("workers", &["order.placed"], &small)
        .await;
    let worker_2 = transport
        .subscribe_as("workers", &["order.placed"], &small)
        .await;
    let auditor = transport
        .subscribe_as("auditors", &["order.placed"], &small)
        .await;
    let messages = batch("order.placed", 40);
    publish_ok(&transport, &messages).await;
    let all: Vec<String> = messages.iter().map(|m| m.event_id.to_string()).collect();

    let idle = Duration::from_secs(2);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_of_two_types_gets_only_those() {
    let Some(transport) = transport("filter").await else {
        return;
    };
    transport.setup().await.expect("setup");
    let mut subscription = transport
        .subscribe_as("shipping", &["order.placed", "order.shipped"], &options(16))
        .await;
    transport
        .declare_queue("refunds", &["order.cancelled"])
        .await;
    let mut messages = Vec::new();
    for n in 0..3 {
        messages.push(message("order.placed", n));
        messages.push(message("order.cancelled", n));
        messages.push(message("order.shipped", n));
    }
    publish_ok(&transport, &messages).await;

    for sent in messages
        .iter()
        .filter(|m| m.event_type != "order.cancelled")
    {
        let delivery = next_delivery(&mut subscription).await;
        assert_eq!(delivery.message_id, Some(sent.event_id.to_string()));
        assert_eq!(
            delivery.subject,
            format!("{}.{}", transport.namespace(), sent.event_type)
        );
        delivery.ack().await.expect("ack");
    }
    assert!(
        next_within(&mut subscription, Duration::from_secs(1))
            .await
            .is_none(),
        "a delivery of another type"
    );
    assert_eq!(
        transport
            .queue_depth(&transport.queue_name("refunds"))
            .await,
        3
    );

    // The group now wants only `order.shipped`. The queue is still bound to `order.placed`
    // (bindings are only added), so those still arrive; the subscription acks and skips them.
    drop(subscription);
    let mut narrower = transport
        .subscribe_as("shipping", &["order.shipped"], &options(16))
        .await;
    let later = vec![
        message("order.placed", 10),
        message("order.shipped", 10),
        message("order.placed", 11),
        message("order.shipped", 11),
    ];
    publish_ok(&transport, &later).await;
    for sent in later.iter().filter(|m| m.event_type == "order.shipped") {
        let delivery = next_delivery(&mut narrower).await;
        assert_eq!(delivery.message_id, Some(sent.event_id.to_string()));
        delivery.ack().await.expect("ack");
    }
    assert!(
        next_within(&mut narrower, Duration::from_secs(1))
            .await
            .is_none()
    );
    drop(narrower);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        transport
            .queue_depth(&transport.queue_name("shipping"))
            .await,
        0,
        "the skipped deliveries were settled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribing_checks_its_arguments() {
    let Some(transport) = transport("arguments").await else {
        return;
    };
    let err = transport
        .subscribe("billing", &types(&["order.*"]), &options(4))
        .await
        .expect_err("a wildcard is not an event type");
    assert!(err.to_string().contains("wildcard"), "{err}");
    let err = transport
        .subscribe("billing", &[], &options(4))
        .await
        .expect_err("no event type");
    assert!(err.to_string().contains("no event type"), "{err}");
    let err = transport
        .subscribe("", &types(&["order.placed"]), &options(4))
        .await
        .expect_err("no consumer name");
    assert!(err.to_string().contains("consumer name"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_and_unicode_payloads_round_trip_byte_exact() {
    let Some(transport) = transport("payloads").await else {
        return;
    };
    transport.setup().await.expect("setup");
    let mut subscription = transport
        .subscribe_as("archive", &["order.placed", "commande.passée"], &options(4))
        .await;

    let mut large = message("order.placed", 0);
    let mut rng = fastrand::Rng::with_seed(7);
    large.body = (0..500 * 1024)
        .map(|_| rng.u8(..))
        .collect::<Vec<u8>>()
        .into();
    let mut unicode = message("commande.passée", 1);
    unicode.body = serde_json::to_vec(&serde_json::json!({
        "specversion": "1.0",
        "id": unicode.event_id.to_string(),
        "type": "commande.passée",
        "data": { "text": "héllo wörld — 日本語 🎉 \u{0000} \u{fffd} ∑", "emoji": "👩‍👩‍👧‍👦" },
    }))
    .expect("json")
    .into();
    let messages = vec![large, unicode];
    publish_ok(&transport, &messages).await;

    for sent in &messages {
        let delivery = next_delivery(&mut subscription).await;
        assert_eq!(delivery.message_id, Some(sent.event_id.to_string()));
        assert_eq!(delivery.body.len(), sent.body.len());
        assert!(
            delivery.body == sent.body,
            "body of `{}` changed",
            sent.event_type
        );
        assert_eq!(
            delivery.subject,
            format!("{}.{}", transport.namespace(), sent.event_type)
        );
        delivery.ack().await.expect("ack");
    }
}

// ---------------------------------------------------------------------------------------------
// Health and connections
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_ok_on_a_live_broker_and_names_a_missing_exchange() {
    let Some(transport) = transport("health").await else {
        return;
    };
    assert_eq!(transport.name(), "rabbitmq");
    let err = transport.health().await.expect_err("no exchange yet");
    assert!(err.to_string().contains("setup()"), "no hint in: {err}");
    transport.setup().await.expect("setup");
    transport.health().await.expect("healthy");
    assert!(transport.is_connected());
    let shown = format!("{:?}", *transport);
    assert!(
        !shown.contains("guest:guest"),
        "the password leaks: {shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_a_closed_port_fails_instead_of_hanging() {
    let started = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(15),
        RabbitMqTransport::builder("amqp://guest:guest@127.0.0.1:1/%2f")
            .connection_timeout(Duration::from_secs(2))
            .connect(),
    )
    .await
    .expect("connect returned instead of hanging");
    let err = result.expect_err("nothing listens on port 1");
    let text = err.to_string();
    assert!(
        text.contains("127.0.0.1:1"),
        "the error names the broker: {text}"
    );
    assert!(!text.contains("guest:guest"), "the password leaks: {text}");
    assert!(started.elapsed() < Duration::from_secs(15));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_connection_is_reopened_by_the_next_call() {
    let Some(transport) = transport("reconnect").await else {
        return;
    };
    transport.setup().await.expect("setup");
    let mut subscription = transport
        .subscribe_as("survivor", &["order.placed"], &options(16))
        .await;
    let before = batch("order.placed", 2);
    publish_ok(&transport, &before).await;
    let unacked = next_delivery(&mut subscription).await;
    assert_eq!(unacked.message_id, Some(before[0].event_id.to_string()));

    let connection = transport.connection().await.expect("connection");
    connection
        .close(200, "test: connection closed".into())
        .await
        .expect("close");
    drop(connection);
    assert!(!transport.is_connected());

    // The subscription ends (after at most one error)...
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match subscription.next().await {
                Some(Ok(_)) => continue,
                Some(Err(_)) => continue,
                None => break,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the subscription did not end");
    assert!(
        unacked.ack().await.is_err(),
        "acking on a closed channel cannot succeed"
    );

    // ...and the next calls reconnect.
    let after = batch("order.placed", 2);
    publish_ok(&transport, &after).await;
    assert!(transport.is_connected());
    transport.health().await.expect("healthy again");
    let mut resubscribed = transport
        .subscribe_as("survivor", &["order.placed"], &options(16))
        .await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        let delivery = next_delivery(&mut resubscribed).await;
        ids.push(delivery.message_id.clone().expect("message id"));
        delivery.ack().await.expect("ack");
    }
    let expected: HashSet<String> = before
        .iter()
        .chain(&after)
        .map(|m| m.event_id.to_string())
        .collect();
    assert_eq!(ids.iter().cloned().collect::<HashSet<_>>(), expected);
    drop(resubscribed);
    wait_for_depth(&transport, &transport.queue_name("survivor"), 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_fails_calls_until_the_transport_reconnects() {
    let direct = rabbitmq_url();
    let Ok(uri) = direct.parse::<lapin::uri::AMQPUri>() else {
        panic!("invalid OUTBOX_TEST_RABBITMQ_URL");
    };
    let target = match tokio::net::lookup_host((uri.authority.host.as_str(), uri.authority.port))
        .await
        .ok()
        .and_then(|mut addresses| addresses.next())
    {
        Some(address) => address,
        None => panic!("cannot resolve {}", uri.authority.host),
    };
    let proxy = BrokerProxy::start(target).await;
    let Some(transport) = transport_at("outage", &proxy.url(), |builder| {
        builder.publish_timeout(Duration::from_secs(2))
    })
    .await
    else {
        return;
    };
    transport.setup().await.expect("setup");
    let mut subscription = transport
        .subscribe_as("steadfast", &["order.placed"], &options(16))
        .await;
    let before = batch("order.placed", 3);
    publish_ok(&transport, &before).await;
    let unacked = next_delivery(&mut subscription).await;
    assert_eq!(unacked.message_id, Some(before[0].event_id.to_string()));

    proxy.cut();

    // The subscription ends (after handing out what it had already received, and at most one
    // error).
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while subscription.next().await.is_some() {}
    })
    .await;
    assert!(ended.is_ok(), "the subscription did not notice the outage");
    let deadline = Instant::now() + Duration::from_secs(10);
    while transport.is_connected() {
        assert!(Instant::now() < deadline, "the outage went unnoticed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // During the outage nothing is reported as sent, and calls fail fast.
    let during = batch("order.placed", 3);
    let started = Instant::now();
    for result in transport.publish(&during).await {
        match result {
            Err(PublishError::Connection(reason)) => {
                assert!(
                    reason.contains("127.0.0.1"),
                    "the error names the broker: {reason}"
                )
            }
            other => panic!("expected a connection failure, got {other:?}"),
        }
    }
    // The publish failed on its old channel or on a reconnect attempt; after a failed attempt,
    // calls fail at once until the backoff has passed.
    let _ = transport
        .health()
        .await
        .expect_err("unhealthy during the outage");
    let err = transport
        .health()
        .await
        .expect_err("unhealthy during the outage");
    assert!(
        err.to_string().contains("next attempt"),
        "a failed attempt backs off: {err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "calls during the outage hung: {:?}",
        started.elapsed()
    );

    proxy.restore().await;

    // The next calls reconnect (once the backoff has passed).
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let results = transport.publish(&during).await;
        if results.iter().all(Result::is_ok) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no reconnection after the outage: {results:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    transport.health().await.expect("healthy again");
    drop(unacked);
    let mut resubscribed = transport
        .subscribe_as("steadfast", &["order.placed"], &options(16))
        .await;
    let mut ids = HashSet::new();
    for _ in 0..before.len() + during.len() {
        let delivery = next_delivery(&mut resubscribed).await;
        ids.insert(delivery.message_id.clone().expect("message id"));
        delivery.ack().await.expect("ack");
    }
    let expected: HashSet<String> = before
        .iter()
        .chain(&during)
        .map(|m| m.event_id.to_string())
        .collect();
    assert_eq!(ids, expected, "a message was lost in the outage");
    assert!(
        next_within(&mut resubscribed, Duration::from_secs(1))
            .await
            .is_none()
    );
}
