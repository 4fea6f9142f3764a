//! The RabbitMQ transport against a real broker (127.0.0.1:5672, guest/guest; override with
//! `OUTBOX_TEST_RABBITMQ_URL`): its fixture for the shared suite, and what only RabbitMQ has
//! (the topic exchange, unroutable messages and nacks, queue types and bindings, reconnecting
//! after a closed connection or an outage).
//!
//! Each test works in its own namespace (`t_<test>_<random>`): its own exchange and consumer
//! queues, deleted when the test ends.

use std::{
    collections::HashSet,
    sync::Mutex,
    time::{Duration, Instant},
};

use outbox::transport::{
    OutgoingMessage, PublishError, SubscribeOptions, Subscription, Transport,
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

use super::{
    Fixture, Stored, assert_permanent, assert_rejected, batch, message, next_delivery, next_within,
    publish_ok,
};
use crate::common::rabbitmq::*;

/// A RabbitMQ transport on an exchange of the test's own, and the queue [`Fixture::stored`]
/// reads.
pub(crate) struct RabbitMq {
    transport: TestTransport,
    audit: Mutex<Option<String>>,
}

impl std::ops::Deref for RabbitMq {
    type Target = TestTransport;

    fn deref(&self) -> &TestTransport {
        &self.transport
    }
}

#[async_trait::async_trait]
impl Fixture for RabbitMq {
    const NAME: &'static str = "rabbitmq";
    const HEALTHY_BEFORE_SETUP: bool = false;
    const CLOSED_PORT_URL: &'static str = "amqp://guest:guest@127.0.0.1:1/%2f";

    async fn open(test: &str) -> Option<Self> {
        Some(RabbitMq {
            transport: transport(test).await?,
            audit: Mutex::new(None),
        })
    }

    wrapped_transport!(RabbitMqTransport, |f| f.transport.transport);

    async fn declare(&self, consumer: &str, event_types: &[&str]) {
        self.declare_queue(consumer, event_types).await;
    }

    async fn subscribe(
        &self,
        consumer: &str,
        event_types: &[&str],
        options: &SubscribeOptions,
    ) -> Box<dyn Subscription> {
        self.subscribe_as(consumer, event_types, options).await
    }

    /// The queue of a consumer group `audit` that nothing consumes.
    async fn keep_stored(&self, event_types: &[&str]) {
        let queue = self.declare_queue("audit", event_types).await;
        assert_eq!(queue, format!("{}.audit", self.namespace()));
        *self.audit.lock().unwrap() = Some(queue);
    }

    /// Takes every message out of the `audit` queue, as many as it holds.
    async fn stored(&self) -> Vec<Stored> {
        let queue = self.audit.lock().unwrap().clone().expect("keep_stored");
        let depth = self.queue_depth(&queue).await;
        let channel = self.channel().await.expect("channel");
        let mut all = Vec::new();
        for n in 0..depth {
            let got = channel
                .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
                .await
                .expect("basic.get")
                .unwrap_or_else(|| panic!("message {n} is missing"));
            let properties = &got.delivery.properties;
            let text = |value: Option<&lapin::types::ShortString>| value.map(|v| v.to_string());
            let mut fields = std::collections::BTreeMap::new();
            fields.insert(
                "routing-key".to_owned(),
                got.delivery.routing_key.to_string(),
            );
            fields.insert("exchange".to_owned(), got.delivery.exchange.to_string());
            fields.insert(
                "redelivered".to_owned(),
                got.delivery.redelivered.to_string(),
            );
            fields.insert(
                "delivery-mode".to_owned(),
                format!("{:?}", properties.delivery_mode()),
            );
            for (name, value) in properties.headers().as_ref().expect("headers").inner() {
                let AMQPValue::LongString(value) = value else {
                    panic!("header {name}: {value:?}");
                };
                fields.insert(name.to_string(), value.to_string());
            }
            all.push(Stored {
                message_id: text(properties.message_id().as_ref()).expect("message id"),
                event_type: text(properties.kind().as_ref()).expect("type"),
                content_type: text(properties.content_type().as_ref()),
                body: got.delivery.data.clone(),
                fields,
            });
        }
        let rest = channel
            .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get");
        assert!(
            rest.is_none(),
            "more messages stored than the queue counted"
        );
        all
    }

    fn check_stored(&self, i: usize, stored: &Stored, sent: &OutgoingMessage) {
        assert_eq!(stored.field("routing-key"), sent.event_type, "message {i}");
        assert_eq!(stored.field("exchange"), self.exchange());
        assert_eq!(stored.field("redelivered"), "false");
        assert_eq!(stored.field("delivery-mode"), "Some(2)", "not persistent");
        assert_eq!(stored.field("ce-id"), sent.event_id.to_string());
        assert_eq!(stored.field("ce-type"), sent.event_type);
        assert_eq!(stored.field("ce-specversion"), "1.0");
    }

    async fn after_filtered(&self) {
        // The cancelled orders wait in the queue of the group that wants them.
        assert_eq!(self.queue_depth(&self.queue_name("refunds")).await, 3);
    }

    /// A dropped subscription closes its channel: what it had not acked would be back in the
    /// queue.
    async fn after_closed(&self, consumer: &str) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(self.queue_depth(&self.queue_name(consumer)).await, 0);
    }

    async fn check_healthy(&self) {
        assert!(self.is_connected());
        let shown = format!("{:?}", *self.transport);
        assert!(
            !shown.contains("guest:guest"),
            "the password leaks: {shown}"
        );
    }

    fn check_connect_error(text: &str) {
        assert!(!text.contains("guest:guest"), "the password leaks: {text}");
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn options(max_in_flight: usize) -> SubscribeOptions {
    SubscribeOptions::default().max_in_flight(max_in_flight)
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
async fn unroutable_messages_are_rejected_and_routable_ones_confirmed() {
    // Past the grace after connecting (see the next test).
    let Some(transport) = transport_with("unroutable", |b| b.recovery_grace(Duration::ZERO)).await
    else {
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
    publish_ok(&*transport, &lost).await;
    assert_eq!(transport.queue_depth(&shipping).await, 5);
    assert_eq!(transport.queue_depth(&queue).await, 3);
}

/// Right after a connection opens, a returned message says the broker is not ready (a broker
/// back from a crash restores a durable queue's bindings only once it has recovered the queue):
/// a connection failure, on which the relay spends no attempt; once the grace has passed, the
/// same return is a rejection again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_just_after_connecting_is_a_broker_not_ready() {
    let grace = Duration::from_secs(2);
    let Some(transport) = transport_with("unroutable_grace", |b| b.recovery_grace(grace)).await
    else {
        return;
    };
    transport.setup().await.expect("setup");
    let queue = transport.declare_queue("billing", &["order.placed"]).await;
    let messages = vec![message("order.shipped", 0), message("order.placed", 0)];

    let results = transport.publish(&messages).await;
    match &results[0] {
        Err(error @ PublishError::Connection(reason)) => {
            assert!(error.may_be_unavailable());
            assert!(
                reason.contains("unroutable") && reason.contains("order.shipped"),
                "{reason}"
            );
            assert!(reason.contains("after the connection opened"), "{reason}");
        }
        other => panic!("expected a broker not ready, got {other:?}"),
    }
    assert!(results[1].is_ok(), "{:?}", results[1]);

    tokio::time::sleep(grace).await;
    let results = transport.publish(&messages).await;
    assert_unroutable(&results[0], "order.shipped");
    assert!(results[1].is_ok(), "{:?}", results[1]);
    assert_eq!(transport.queue_depth(&queue).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_before_setup_is_rejected_and_recovers_after_setup() {
    let Some(transport) = transport("no_setup").await else {
        return;
    };
    let results = transport.publish(&batch("order.placed", 3)).await;
    assert_eq!(results.len(), 3);
    assert_rejected(&results, &["setup()", transport.exchange()]);

    // The broker closed the publish channel; the next publish opens a new one.
    transport.setup().await.expect("setup");
    let queue = transport.declare_queue("late", &["order.placed"]).await;
    publish_ok(&*transport, &batch("order.placed", 3)).await;
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
    assert_permanent(&results[1], &["maximum message size"]);
    assert!(results[2].is_ok(), "{:?}", results[2]);
    assert_rejected(&results[3..], &["basic.nack"]);
    assert_eq!(transport.queue_depth(&queue).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishes_each_get_their_own_confirms_and_returns() {
    let Some(transport) = transport_with("concurrent", |b| b.recovery_grace(Duration::ZERO)).await
    else {
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
    publish_ok(&*transport, &messages).await;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wildcard_is_not_an_event_type() {
    let Some(transport) = transport("arguments").await else {
        return;
    };
    let err = transport
        .subscribe("billing", &types(&["order.*"]), &options(4))
        .await
        .expect_err("a wildcard is not an event type");
    assert!(err.to_string().contains("wildcard"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrower_group_keeps_its_bindings_and_skips_the_other_types() {
    let Some(transport) = transport("narrower").await else {
        return;
    };
    transport.setup().await.expect("setup");
    let subscription = transport
        .subscribe_as("shipping", &["order.placed", "order.shipped"], &options(16))
        .await;

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
    publish_ok(&*transport, &later).await;
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

// ---------------------------------------------------------------------------------------------
// Connections
// ---------------------------------------------------------------------------------------------

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
    publish_ok(&*transport, &before).await;
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
    publish_ok(&*transport, &after).await;
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
    publish_ok(&*transport, &before).await;
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
