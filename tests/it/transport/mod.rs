//! One suite of transport-level tests for every transport: what a transport must do whatever
//! broker is behind it (confirmed publish, stored in order, consumer groups, ack, nack and
//! redelivery, type filters, byte-exact payloads, health, a dead server), written once as generic
//! functions over a [`Fixture`] and instantiated per transport by the macros at the end. A new
//! transport is a fixture in a module of its own plus one line in each macro that applies.
//!
//! What only one broker has (JetStream's `Nats-Msg-Id` dedup, Redis replies and trimming,
//! RabbitMQ exchanges, bindings and queue types, reconnects) is tested in that broker's module,
//! which also implements the fixture's hooks: the broker-specific checks at the end of a shared
//! test, e.g. what the broker's own consumer state shows once every delivery was acked.
//!
//! Each test works in a namespace of its own (`t_<test>_<random>`), removed when it ends, so
//! tests run in parallel. A broker that is not reachable is skipped loudly, unless
//! `OUTBOX_REQUIRE_SERVICES=1`, which makes it a failure.

use std::time::{Duration, Instant};

use outbox::transport::{
    Delivery, OutgoingMessage, PublishError, SubscribeOptions, Subscription, Transport,
};
use uuid::Uuid;

use crate::common::assert_shared_and_fanned_out;

/// One message as the broker stored it, read back by [`Fixture::stored`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Stored {
    /// The message id the broker keeps (the event id).
    pub(crate) message_id: String,
    /// The event type the broker keeps with the message.
    pub(crate) event_type: String,
    /// The content type the broker keeps, if it keeps one.
    pub(crate) content_type: Option<String>,
    /// The body, as stored.
    pub(crate) body: Vec<u8>,
    /// Whatever else the broker keeps (subject, headers, properties, fields), by name.
    pub(crate) fields: std::collections::BTreeMap<String, String>,
}

impl Stored {
    /// The broker-specific field `name`.
    pub(crate) fn field(&self, name: &str) -> &str {
        self.fields
            .get(name)
            .unwrap_or_else(|| panic!("no `{name}` in {self:?}"))
    }
}

/// A connection attempt of [`Fixture::connect`].
pub(crate) type Connecting =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

/// The items of a [`Fixture`] that wraps one of `crate::common`'s test transports (reached by
/// `$inner`, e.g. `self.0.0`): the transport, its namespace, and connecting through its builder
/// `$builder`.
macro_rules! wrapped_transport {
    ($builder:ty, |$fixture:ident| $inner:expr) => {
        fn transport(&self) -> &dyn outbox::transport::Transport {
            let $fixture = self;
            &$inner
        }

        fn namespace(&self) -> &str {
            let $fixture = self;
            $inner.namespace()
        }

        fn connect(url: &str, timeout: std::time::Duration) -> $crate::transport::Connecting {
            let builder = <$builder>::builder(url).connection_timeout(timeout);
            Box::pin($crate::transport::connect_error(builder.connect()))
        }
    };
}

/// A transport on a namespace of the test's own, and how to look into its broker.
#[async_trait::async_trait]
pub(crate) trait Fixture: Send + Sync + Sized + 'static {
    /// `Transport::name`.
    const NAME: &'static str;
    /// The content type stored with each message (`None`: the transport keeps none).
    const CONTENT_TYPE: Option<&'static str> = Some("application/cloudevents+json");
    /// Whether `health` is ok before `setup` (RabbitMQ's is not: there is no exchange yet).
    const HEALTHY_BEFORE_SETUP: bool = true;
    /// A URL of the transport's scheme to a port nothing listens on.
    const CLOSED_PORT_URL: &'static str = "";
    /// Whether a message redelivered to another subscription of its group carries a delivery
    /// count above 1 (Kafka keeps none: a new group member sees a first delivery).
    const REDELIVERIES_COUNTED_BY_THE_BROKER: bool = true;
    /// How long new members of a group may take to get their share (Kafka: joining and
    /// rebalancing the group); added to the group test's idle wait.
    const GROUP_SETTLE: Duration = Duration::ZERO;
    /// Whether a consumer sees one order across messages of different keys (Kafka orders per
    /// partition only, and spreads keys over partitions).
    const ORDERED_ACROSS_KEYS: bool = true;

    /// A transport on a fresh namespace, or `None` (after a loud message) when the broker is not
    /// reachable.
    async fn open(test: &str) -> Option<Self>;

    /// The transport under test.
    fn transport(&self) -> &dyn Transport;

    /// The namespace the transport publishes under.
    fn namespace(&self) -> &str;

    /// Connect to `url` with a connection timeout of `timeout`; the error's text on failure.
    fn connect(_url: &str, _timeout: Duration) -> Connecting {
        unreachable!("{} has no server to connect to", Self::NAME)
    }

    /// Make the consumer group `consumer` exist before the messages it must get are published.
    /// RabbitMQ routes a message only to the queues bound when it arrives; a stream keeps
    /// everything for groups created later.
    async fn declare(&self, _consumer: &str, _event_types: &[&str]) {}

    /// Subscribe the consumer group `consumer` (removed with the namespace).
    async fn subscribe(
        &self,
        consumer: &str,
        event_types: &[&str],
        options: &SubscribeOptions,
    ) -> Box<dyn Subscription> {
        self.transport()
            .subscribe(consumer, &types(event_types), options)
            .await
            .expect("subscribe")
    }

    /// Keep every message of `event_types` published from now on where [`stored`] reads it
    /// (RabbitMQ: a queue of its own; a stream keeps everything anyway).
    ///
    /// [`stored`]: Fixture::stored
    async fn keep_stored(&self, _event_types: &[&str]) {}

    /// Every message the broker stored, in order.
    async fn stored(&self) -> Vec<Stored>;

    /// The broker-specific checks of the `i`-th stored message, `sent` as published.
    fn check_stored(&self, _i: usize, _stored: &Stored, _sent: &OutgoingMessage) {}

    /// The broker's view once consumer `billing` of `subscribe_delivers_in_order_and_ack_settles`
    /// acked its five `order.placed` deliveries, its subscription still open.
    async fn after_acks(&self) {}

    /// The broker's view once consumer `shipping` of
    /// `a_consumer_of_two_types_gets_them_in_order_and_skips_the_others` acked the six of its
    /// types among nine, its subscription still open.
    async fn after_filtered(&self) {}

    /// The broker's view once both groups of
    /// `one_consumer_name_shares_deliveries_and_different_names_each_get_all` drained.
    async fn after_groups(&self) {}

    /// The broker's view once consumer `retrying` of `nack_and_ack_wait_redeliver` acked its two
    /// messages, each delivered twice.
    async fn after_redelivered(&self) {}

    /// The broker's view once the subscriptions of `consumer` were dropped, everything acked.
    async fn after_closed(&self, _consumer: &str) {}

    /// Broker-specific checks of a healthy transport.
    async fn check_healthy(&self) {}

    /// Broker-specific checks of the error connecting to [`CLOSED_PORT_URL`].
    ///
    /// [`CLOSED_PORT_URL`]: Fixture::CLOSED_PORT_URL
    fn check_connect_error(_text: &str) {}
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

pub(crate) fn message(event_type: &str, n: usize) -> OutgoingMessage {
    let event_id = Uuid::now_v7();
    let body = serde_json::json!({
        "specversion": "1.0",
        "id": event_id.to_string(),
        "type": event_type,
        "source": "/tests/transport",
        "data": { "n": n },
    });
    OutgoingMessage {
        event_id,
        event_type: event_type.to_owned(),
        aggregate_type: "order".to_owned(),
        aggregate_id: format!("order-{n}"),
        body: serde_json::to_vec(&body).expect("json").into(),
        headers: Vec::new(),
    }
}

pub(crate) fn batch(event_type: &str, count: usize) -> Vec<OutgoingMessage> {
    (0..count).map(|n| message(event_type, n)).collect()
}

/// `count` rounds of one message of each of `event_types`, in that order.
fn interleaved(event_types: &[&str], count: usize) -> Vec<OutgoingMessage> {
    (0..count)
        .flat_map(|n| event_types.iter().map(move |t| message(t, n)))
        .collect()
}

pub(crate) async fn publish_ok(transport: &dyn Transport, messages: &[OutgoingMessage]) {
    let results = transport.publish(messages).await;
    assert_eq!(results.len(), messages.len());
    for (i, result) in results.iter().enumerate() {
        assert!(result.is_ok(), "message {i} not confirmed: {result:?}");
    }
}

/// Every result is a rejection whose reason contains each of `fragments`.
pub(crate) fn assert_rejected(results: &[Result<(), PublishError>], fragments: &[&str]) {
    for result in results {
        match result {
            Err(PublishError::Rejected(reason)) => {
                for fragment in fragments {
                    assert!(reason.contains(fragment), "no `{fragment}` in: {reason}");
                }
            }
            other => panic!("expected a rejection, got {other:?}"),
        }
    }
}

/// A permanent failure whose reason contains one of `fragments`.
pub(crate) fn assert_permanent(result: &Result<(), PublishError>, fragments: &[&str]) {
    match result {
        Err(err @ PublishError::Permanent(reason)) => {
            assert!(err.is_permanent());
            assert!(
                fragments.iter().any(|f| reason.contains(f)),
                "unclear reason: {reason}"
            );
        }
        other => panic!("expected a permanent failure, got {other:?}"),
    }
}

/// A publish of `count` messages that took `elapsed` timed out on each after `timeout`, neither
/// early nor later than `at_most`.
pub(crate) fn assert_timed_out(
    results: &[Result<(), PublishError>],
    count: usize,
    timeout: Duration,
    elapsed: Duration,
    at_most: Duration,
) {
    assert_eq!(results.len(), count);
    for result in results {
        assert_eq!(result, &Err(PublishError::Timeout(timeout)));
    }
    assert!(
        elapsed >= timeout - Duration::from_millis(50),
        "gave up early: {elapsed:?}"
    );
    assert!(elapsed < at_most, "waited too long: {elapsed:?}");
}

/// The error's text when `connect` fails.
pub(crate) async fn connect_error<T, E: std::fmt::Display>(
    connect: impl std::future::Future<Output = Result<T, E>>,
) -> Result<(), String> {
    connect.await.map(drop).map_err(|err| err.to_string())
}

/// Nothing is delivered within `within`.
pub(crate) async fn assert_nothing_within(
    subscription: &mut Box<dyn Subscription>,
    within: Duration,
    why: &str,
) {
    assert!(next_within(subscription, within).await.is_none(), "{why}");
}

/// The next delivery, of `sent`, delivered for the `delivery_count`-th time.
pub(crate) async fn next_of(
    subscription: &mut Box<dyn Subscription>,
    sent: &OutgoingMessage,
    delivery_count: u32,
    why: &str,
) -> Delivery {
    let delivery = next_delivery(subscription).await;
    assert_eq!(
        delivery.message_id,
        Some(sent.event_id.to_string()),
        "{why}"
    );
    assert_eq!(delivery.delivery_count, delivery_count, "{why}");
    delivery
}

/// The next delivery within `within`, or `None` when nothing arrived in time.
pub(crate) async fn next_within(
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

pub(crate) async fn next_delivery(subscription: &mut Box<dyn Subscription>) -> Delivery {
    next_within(subscription, Duration::from_secs(10))
        .await
        .expect("a delivery within 10 s")
}

pub(crate) fn options(ack_wait: Duration, max_in_flight: usize) -> SubscribeOptions {
    SubscribeOptions::default()
        .ack_wait(ack_wait)
        .max_in_flight(max_in_flight)
}

pub(crate) fn types(names: &[&str]) -> Vec<String> {
    names.iter().map(|name| (*name).to_owned()).collect()
}

/// Reads and acks until nothing arrives for `idle`; returns the message ids in delivery order.
pub(crate) async fn drain(mut subscription: Box<dyn Subscription>, idle: Duration) -> Vec<String> {
    let mut ids = Vec::new();
    while let Some(delivery) = next_within(&mut subscription, idle).await {
        ids.push(delivery.message_id.clone().expect("message id"));
        delivery.ack().await.expect("ack");
    }
    ids
}

/// Subscribes `consumer` to `event_types` (ack wait 1 s), receives the messages of those types
/// among `published` in order, each on its own subject and delivered for the first time, acks
/// them, and sees nothing else arrive for `quiet`.
async fn receive_only<F: Fixture>(
    fixture: &F,
    consumer: &str,
    event_types: &[&str],
    published: &[OutgoingMessage],
    quiet: Duration,
) -> Box<dyn Subscription> {
    let mut subscription = fixture
        .subscribe(consumer, event_types, &options(Duration::from_secs(1), 16))
        .await;
    for sent in published
        .iter()
        .filter(|m| event_types.contains(&m.event_type.as_str()))
    {
        let delivery = next_of(&mut subscription, sent, 1, "in publish order").await;
        assert_eq!(
            delivery.subject,
            format!("{}.{}", fixture.namespace(), sent.event_type)
        );
        assert_eq!(delivery.body, sent.body);
        delivery.ack().await.expect("ack");
    }
    assert_nothing_within(
        &mut subscription,
        quiet,
        "a message was delivered again, or one of another type",
    )
    .await;
    subscription
}

// ---------------------------------------------------------------------------------------------
// The suite
// ---------------------------------------------------------------------------------------------

pub(crate) async fn a_batch_of_1000_is_confirmed_and_stored_in_order<F: Fixture>(fixture: F) {
    fixture.transport().setup().await.expect("setup");
    fixture.keep_stored(&["order.placed"]).await;
    let messages = batch("order.placed", 1_000);

    publish_ok(fixture.transport(), &messages).await;

    let stored = fixture.stored().await;
    assert_eq!(stored.len(), 1_000);
    for (i, (stored, sent)) in stored.iter().zip(&messages).enumerate() {
        assert_eq!(
            stored.message_id,
            sent.event_id.to_string(),
            "message {i} out of order"
        );
        assert_eq!(stored.event_type, "order.placed");
        assert_eq!(stored.content_type.as_deref(), F::CONTENT_TYPE);
        assert_eq!(stored.body, sent.body.as_ref(), "body of message {i}");
        fixture.check_stored(i, stored, sent);
    }
}

pub(crate) async fn subscribe_delivers_in_order_and_ack_settles<F: Fixture>(fixture: F) {
    fixture.transport().setup().await.expect("setup");
    fixture.declare("billing", &["order.placed"]).await;
    fixture.declare("shipping", &["order.shipped"]).await;
    let messages = interleaved(&["order.placed", "order.shipped"], 5);
    publish_ok(fixture.transport(), &messages).await;

    // Acked deliveries are not redelivered once the ack wait (1 s) has passed.
    let subscription = receive_only(
        &fixture,
        "billing",
        &["order.placed"],
        &messages,
        Duration::from_millis(2_500),
    )
    .await;
    fixture.after_acks().await;

    // Acked for good: closing the subscription gives nothing back.
    drop(subscription);
    fixture.after_closed("billing").await;

    // The other type went to the other group, all of it.
    receive_only(
        &fixture,
        "shipping",
        &["order.shipped"],
        &messages,
        Duration::ZERO,
    )
    .await;
}

pub(crate) async fn one_consumer_name_shares_deliveries_and_different_names_each_get_all<
    F: Fixture,
>(
    fixture: F,
) {
    fixture.transport().setup().await.expect("setup");
    fixture.declare("workers", &["order.placed"]).await;
    fixture.declare("auditors", &["order.placed"]).await;
    let messages = batch("order.placed", 40);
    publish_ok(fixture.transport(), &messages).await;
    let all: Vec<String> = messages.iter().map(|m| m.event_id.to_string()).collect();
    let small = options(Duration::from_secs(30), 4);

    let worker_1 = fixture
        .subscribe("workers", &["order.placed"], &small)
        .await;
    let worker_2 = fixture
        .subscribe("workers", &["order.placed"], &small)
        .await;
    let auditor = fixture
        .subscribe("auditors", &["order.placed"], &small)
        .await;
    let idle = Duration::from_secs(3) + F::GROUP_SETTLE;
    let (got_1, got_2, audited) = tokio::join!(
        tokio::spawn(drain(worker_1, idle)),
        tokio::spawn(drain(worker_2, idle)),
        tokio::spawn(drain(auditor, idle)),
    );
    let (got_1, got_2, mut audited) = (
        got_1.expect("task"),
        got_2.expect("task"),
        audited.expect("task"),
    );
    if !F::ORDERED_ACROSS_KEYS {
        // Every message has a key of its own here: only completeness and uniqueness hold.
        audited.sort_by_key(|id| all.iter().position(|a| a == id));
    }

    assert_shared_and_fanned_out(&got_1, &got_2, &audited, &all);
    fixture.after_groups().await;
}

pub(crate) async fn a_consumer_of_two_types_gets_them_in_order_and_skips_the_others<F: Fixture>(
    fixture: F,
) {
    fixture.transport().setup().await.expect("setup");
    fixture
        .declare("shipping", &["order.placed", "order.shipped"])
        .await;
    fixture.declare("refunds", &["order.cancelled"]).await;
    let messages = interleaved(&["order.placed", "order.cancelled", "order.shipped"], 3);
    publish_ok(fixture.transport(), &messages).await;

    // Placed and shipped of each order arrive interleaved, in publish order; the skipped
    // cancelled orders and the acked deliveries do not come back.
    let _subscription = receive_only(
        &fixture,
        "shipping",
        &["order.placed", "order.shipped"],
        &messages,
        Duration::from_millis(2_500),
    )
    .await;
    fixture.after_filtered().await;

    // A consumer of the third type gets just those.
    let cancelled = receive_only(
        &fixture,
        "refunds",
        &["order.cancelled"],
        &messages,
        Duration::from_millis(1_500),
    )
    .await;
    drop(cancelled);
    fixture.after_closed("refunds").await;
}

pub(crate) async fn large_and_unicode_payloads_round_trip_byte_exact<F: Fixture>(fixture: F) {
    fixture.transport().setup().await.expect("setup");
    let event_types = ["order.placed", "commande.passée"];
    fixture.keep_stored(&event_types).await;
    fixture.declare("archive", &event_types).await;

    let mut large_text = message("order.placed", 0);
    let text: String = "héllo wörld ✓ 注文 🚚 ".repeat(25_000);
    large_text.body = serde_json::to_vec(&serde_json::json!({ "data": text }))
        .expect("json")
        .into();
    assert!(
        large_text.body.len() >= 500_000,
        "{} bytes",
        large_text.body.len()
    );
    let mut large_binary = message("order.placed", 1);
    let mut rng = fastrand::Rng::with_seed(7);
    large_binary.body = (0..500 * 1024)
        .map(|_| rng.u8(..))
        .collect::<Vec<u8>>()
        .into();
    let mut unicode = message("order.placed", 2);
    unicode.body = "{\"data\":\"Ωμέγα – 東京 – 🦀 – \\u0000 – \u{10FFFF}\"}"
        .as_bytes()
        .to_vec()
        .into();
    // A unicode event type too.
    let mut unicode_type = message("commande.passée", 3);
    unicode_type.body = serde_json::to_vec(&serde_json::json!({
        "specversion": "1.0",
        "id": unicode_type.event_id.to_string(),
        "type": "commande.passée",
        "data": { "text": "héllo wörld — 日本語 🎉 \u{0000} \u{fffd} ∑", "emoji": "👩‍👩‍👧‍👦" },
    }))
    .expect("json")
    .into();
    let mut binary = message("order.placed", 4);
    binary.body = (0..=255u8)
        .chain((0..=255u8).rev())
        .collect::<Vec<u8>>()
        .into();
    let messages = vec![large_text, large_binary, unicode, unicode_type, binary];
    publish_ok(fixture.transport(), &messages).await;

    let stored = fixture.stored().await;
    assert_eq!(stored.len(), messages.len());
    for (i, (stored, sent)) in stored.iter().zip(&messages).enumerate() {
        assert_eq!(stored.event_type, sent.event_type);
        assert!(stored.body == sent.body.as_ref(), "stored body {i} differs");
        fixture.check_stored(i, stored, sent);
    }

    let mut subscription = fixture
        .subscribe(
            "archive",
            &event_types,
            &options(Duration::from_secs(30), 4),
        )
        .await;
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
            format!("{}.{}", fixture.namespace(), sent.event_type)
        );
        delivery.ack().await.expect("ack");
    }
}

/// Subscribes `consumer` to `order.placed` with `ack_wait` after publishing `count` of them,
/// and takes the first delivery of each.
async fn first_deliveries<F: Fixture>(
    fixture: &F,
    consumer: &str,
    count: usize,
    ack_wait: Duration,
) -> (Vec<OutgoingMessage>, Box<dyn Subscription>, Vec<Delivery>) {
    fixture.transport().setup().await.expect("setup");
    fixture.declare(consumer, &["order.placed"]).await;
    let messages = batch("order.placed", count);
    publish_ok(fixture.transport(), &messages).await;
    let mut subscription = fixture
        .subscribe(consumer, &["order.placed"], &options(ack_wait, 16))
        .await;
    let mut deliveries = Vec::new();
    for sent in &messages {
        deliveries.push(next_of(&mut subscription, sent, 1, "first delivery, in order").await);
    }
    (messages, subscription, deliveries)
}

pub(crate) async fn nack_requeues_and_a_dropped_subscriptions_deliveries_return<F: Fixture>(
    fixture: F,
) {
    let quick = Duration::from_secs(1);
    let (messages, mut subscription, deliveries) =
        first_deliveries(&fixture, "retrying", 2, quick).await;
    let [first, second] = <[Delivery; 2]>::try_from(deliveries).expect("two deliveries");

    first.nack(None).await.expect("nack");
    let redelivered = next_of(
        &mut subscription,
        &messages[0],
        2,
        "flagged as a redelivery",
    )
    .await;
    redelivered.ack().await.expect("ack");

    // The second is never settled; its subscription goes away.
    drop(second);
    drop(subscription);
    let mut again = fixture
        .subscribe("retrying", &["order.placed"], &options(quick, 16))
        .await;
    let count = if F::REDELIVERIES_COUNTED_BY_THE_BROKER {
        2
    } else {
        1
    };
    let returned = next_of(&mut again, &messages[1], count, "back from the dropped one").await;
    returned.ack().await.expect("ack");
    assert_nothing_within(&mut again, Duration::from_millis(2_000), "all acked").await;
    drop(again);
    fixture.after_closed("retrying").await;
}

pub(crate) async fn a_delayed_nack_returns_at_once_and_redelivers_after_the_delay<F: Fixture>(
    fixture: F,
) {
    let (messages, mut subscription, deliveries) =
        first_deliveries(&fixture, "delaying", 1, Duration::from_secs(30)).await;
    let delivery = deliveries.into_iter().next().expect("a delivery");
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
    let redelivered = next_of(&mut subscription, &messages[0], 2, "redelivered").await;
    assert!(
        nacked_at.elapsed() >= Duration::from_millis(350),
        "requeued before the delay: {:?}",
        nacked_at.elapsed()
    );
    redelivered.ack().await.expect("ack");
}

/// For transports whose broker redelivers what was not settled within the ack wait.
pub(crate) async fn nack_and_ack_wait_redeliver<F: Fixture>(fixture: F) {
    let (messages, mut subscription, deliveries) =
        first_deliveries(&fixture, "retrying", 2, Duration::from_secs(1)).await;
    let read_at = Instant::now();
    let [first, second] = <[Delivery; 2]>::try_from(deliveries).expect("two deliveries");

    // The first is nacked with a delay, the second is never settled.
    let nacked_at = Instant::now();
    first
        .nack(Some(Duration::from_millis(200)))
        .await
        .expect("nack");
    drop(second);

    let redelivered = next_of(
        &mut subscription,
        &messages[0],
        2,
        "the nacked message comes back first, after its 200 ms delay",
    )
    .await;
    let waited = nacked_at.elapsed();
    assert!(
        waited >= Duration::from_millis(150),
        "redelivered before the nack delay: {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(900),
        "the nack delay was not honoured, the message waited for the ack wait: {waited:?}"
    );
    redelivered.ack().await.expect("ack");

    let expired = next_of(
        &mut subscription,
        &messages[1],
        2,
        "the unsettled message comes back after the ack wait",
    )
    .await;
    assert!(
        read_at.elapsed() >= Duration::from_millis(900),
        "redelivered before the ack wait: {:?}",
        read_at.elapsed()
    );
    assert!(
        nacked_at.elapsed() >= Duration::from_millis(800),
        "redelivered before the ack wait: {:?}",
        nacked_at.elapsed()
    );
    expired.ack().await.expect("ack");

    assert_nothing_within(&mut subscription, Duration::from_millis(2_000), "all acked").await;
    fixture.after_redelivered().await;
}

pub(crate) async fn health_is_ok_on_a_live_broker<F: Fixture>(fixture: F) {
    assert_eq!(fixture.transport().name(), F::NAME);
    let before_setup = fixture.transport().health().await;
    if F::HEALTHY_BEFORE_SETUP {
        before_setup.expect("healthy");
    } else {
        let err = before_setup.expect_err("nothing set up yet");
        assert!(err.to_string().contains("setup()"), "no hint in: {err}");
    }
    fixture.transport().setup().await.expect("setup");
    fixture.transport().health().await.expect("healthy");
    fixture.check_healthy().await;
}

/// A subscription names its group and at least one event type.
pub(crate) async fn subscribing_checks_its_arguments<F: Fixture>(fixture: F) {
    let transport = fixture.transport();
    let err = transport
        .subscribe("billing", &[], &options(Duration::from_secs(30), 4))
        .await
        .expect_err("no event type");
    assert!(err.to_string().contains("no event type"), "{err}");
    let err = transport
        .subscribe(
            "",
            &types(&["order.placed"]),
            &options(Duration::from_secs(30), 4),
        )
        .await
        .expect_err("no consumer name");
    assert!(err.to_string().contains("consumer name"), "{err}");
}

/// For broker transports.
pub(crate) async fn connecting_to_a_closed_port_fails_instead_of_hanging<F: Fixture>() {
    let started = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(15),
        F::connect(F::CLOSED_PORT_URL, Duration::from_secs(2)),
    )
    .await
    .expect("connect returned instead of hanging");
    let text = result.expect_err("nothing listens on port 1");
    assert!(
        text.contains("127.0.0.1:1"),
        "the error names the server: {text}"
    );
    F::check_connect_error(&text);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// Instances
// ---------------------------------------------------------------------------------------------

// The fixtures (after `wrapped_transport!`, which they use).
#[cfg(feature = "kafka")]
pub(crate) mod kafka;
mod memory;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "rabbitmq")]
mod rabbitmq;
#[cfg(feature = "redis")]
mod redis;

/// Instantiates a suite's tests in a module per transport: `transport => Fixture;`.
macro_rules! instantiate {
    ($suite:ident: $($(#[$attr:meta])* $transport:ident => $fixture:ty;)+) => {$(
        $(#[$attr])*
        mod $transport {
            $suite!($fixture, $transport);
        }
    )+};
}

/// Tests of a fixture `$f` on a fresh namespace named after the transport and the test.
macro_rules! fixture_tests {
    ($f:ty, $transport:ident: $($test:ident => $tag:literal,)+) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let name = concat!(stringify!($transport), "_", $tag);
            if let Some(fixture) = <$f as $crate::transport::Fixture>::open(name).await {
                $crate::transport::$test(fixture).await;
            }
        }
    )+};
}

/// What every transport does, a broker's or the in-memory one.
macro_rules! stream_suite {
    ($f:ty, $transport:ident) => {
        fixture_tests! { $f, $transport:
            a_batch_of_1000_is_confirmed_and_stored_in_order => "batch",
            subscribe_delivers_in_order_and_ack_settles => "ack",
            a_consumer_of_two_types_gets_them_in_order_and_skips_the_others => "filter",
            large_and_unicode_payloads_round_trip_byte_exact => "payloads",
            nack_requeues_and_a_dropped_subscriptions_deliveries_return => "nack",
            a_delayed_nack_returns_at_once_and_redelivers_after_the_delay => "nack_delay",
            health_is_ok_on_a_live_broker => "health",
            subscribing_checks_its_arguments => "arguments",
        }
    };
}

/// What every transport with a broker behind it does. (The in-memory transport hands a group's
/// deliveries to whichever subscription asks first, so two subscriptions need not share.)
macro_rules! broker_suite {
    ($f:ty, $transport:ident) => {
        fixture_tests! { $f, $transport:
            one_consumer_name_shares_deliveries_and_different_names_each_get_all => "groups",
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn connecting_to_a_closed_port_fails_instead_of_hanging() {
            $crate::transport::connecting_to_a_closed_port_fails_instead_of_hanging::<$f>().await;
        }
    };
}

/// What a transport does whose broker redelivers after the ack wait.
macro_rules! ack_wait_suite {
    ($f:ty, $transport:ident) => {
        fixture_tests! { $f, $transport:
            nack_and_ack_wait_redeliver => "ack_wait",
        }
    };
}

mod stream {
    instantiate! { stream_suite:
        memory => super::super::memory::Memory;
        #[cfg(feature = "nats")]
        nats => super::super::nats::Nats;
        #[cfg(feature = "redis")]
        redis => super::super::redis::Redis;
        #[cfg(feature = "rabbitmq")]
        rabbitmq => super::super::rabbitmq::RabbitMq;
        #[cfg(feature = "kafka")]
        kafka => super::super::kafka::Kafka;
    }
}

mod broker {
    instantiate! { broker_suite:
        #[cfg(feature = "nats")]
        nats => super::super::nats::Nats;
        #[cfg(feature = "redis")]
        redis => super::super::redis::Redis;
        #[cfg(feature = "rabbitmq")]
        rabbitmq => super::super::rabbitmq::RabbitMq;
        #[cfg(feature = "kafka")]
        kafka => super::super::kafka::Kafka;
    }
}

mod ack_wait {
    instantiate! { ack_wait_suite:
        memory => super::super::memory::Memory;
        #[cfg(feature = "nats")]
        nats => super::super::nats::Nats;
        #[cfg(feature = "redis")]
        redis => super::super::redis::Redis;
    }
}
