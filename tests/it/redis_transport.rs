//! The Redis Streams transport against a real Redis (127.0.0.1:6379, 6.2 or newer).
//!
//! Each test works in its own namespace and stream key (`t_<test>_<random>:events`) and deletes
//! the key when it ends, so tests run in parallel. When the server is not reachable the tests say
//! so loudly and pass, unless `OUTBOX_REQUIRE_SERVICES=1`, which makes a missing server a failure.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use outbox::transport::{
    Delivery, OutgoingMessage, PublishError, SubscribeOptions, Subscription, Transport,
    redis::{
        GroupStart, RedisTransport, RedisTransportBuilder,
        redis::{
            self, Value,
            streams::{
                StreamInfoConsumersReply, StreamInfoGroupsReply, StreamPendingCountReply,
                StreamPendingReply, StreamRangeReply,
            },
        },
    },
};
use uuid::Uuid;

use crate::common::assert_shared_and_fanned_out;

use crate::common::services_required;

// ---------------------------------------------------------------------------------------------
// Harness: a transport on a fresh namespace whose stream key is deleted afterwards.
// ---------------------------------------------------------------------------------------------

const REDIS_URL: &str = "redis://127.0.0.1:6379";

/// A transport on a fresh namespace `t_<test>_<random>`; its stream key is deleted when it is
/// dropped, even when the test fails.
struct TestTransport(RedisTransport);

impl std::ops::Deref for TestTransport {
    type Target = RedisTransport;

    fn deref(&self) -> &RedisTransport {
        &self.0
    }
}

impl Drop for TestTransport {
    fn drop(&mut self) {
        // A blocking connection of its own: the test's runtime may be shutting down.
        let key = self.0.stream_key().to_owned();
        let Ok(client) = redis::Client::open(REDIS_URL) else {
            return;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(2)) else {
            return;
        };
        let _ = redis::cmd("DEL").arg(&key).query::<i64>(&mut conn);
    }
}

/// A transport on a fresh namespace, or `None` (after a loud message) when Redis is not
/// reachable.
async fn transport(test: &str) -> Option<TestTransport> {
    transport_with(test, |builder| builder).await
}

async fn transport_with(
    test: &str,
    configure: impl FnOnce(RedisTransportBuilder) -> RedisTransportBuilder,
) -> Option<TestTransport> {
    let random = Uuid::new_v4().simple().to_string();
    let namespace = format!("t_{test}_{}", &random[..10]);
    let builder = RedisTransport::builder(REDIS_URL)
        .namespace(namespace)
        .connection_timeout(Duration::from_secs(3));
    let connect = configure(builder).connect();
    let error = match tokio::time::timeout(Duration::from_secs(15), connect).await {
        Ok(Ok(transport)) => return Some(TestTransport(transport)),
        Ok(Err(err)) => err.to_string(),
        Err(_) => "connecting timed out".to_owned(),
    };
    if services_required() {
        panic!("Redis is required (OUTBOX_REQUIRE_SERVICES=1) but unavailable: {error}");
    }
    eprintln!(
        "\n*** SKIPPED {test}: Redis is not reachable at {REDIS_URL} ({error}); start it to run this test ***\n"
    );
    None
}

// ---------------------------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------------------------

fn message(event_type: &str, n: usize) -> OutgoingMessage {
    let event_id = Uuid::now_v7();
    let body = serde_json::json!({
        "specversion": "1.0",
        "id": event_id.to_string(),
        "type": event_type,
        "source": "/tests/redis",
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

async fn publish_ok(transport: &RedisTransport, messages: &[OutgoingMessage]) {
    let results = transport.publish(messages).await;
    assert_eq!(results.len(), messages.len());
    for (i, result) in results.iter().enumerate() {
        assert!(result.is_ok(), "message {i} not confirmed: {result:?}");
    }
}

/// Runs a command on the transport's own connection.
async fn query<T: redis::FromRedisValue>(transport: &RedisTransport, cmd: &redis::Cmd) -> T {
    let mut conn = transport.connection();
    cmd.query_async(&mut conn).await.expect("redis command")
}

async fn xlen(transport: &RedisTransport) -> usize {
    query(transport, redis::cmd("XLEN").arg(transport.stream_key())).await
}

async fn xrange(transport: &RedisTransport) -> StreamRangeReply {
    query(
        transport,
        redis::cmd("XRANGE")
            .arg(transport.stream_key())
            .arg("-")
            .arg("+"),
    )
    .await
}

fn field(entry: &redis::streams::StreamId, name: &str) -> Vec<u8> {
    match entry.map.get(name) {
        Some(Value::BulkString(bytes)) => bytes.clone(),
        other => panic!("field `{name}` of entry {}: {other:?}", entry.id),
    }
}

/// Pending entries of `group` (delivered, not acknowledged).
async fn pending(transport: &RedisTransport, group: &str) -> usize {
    query::<StreamPendingReply>(
        transport,
        redis::cmd("XPENDING")
            .arg(transport.stream_key())
            .arg(group),
    )
    .await
    .count()
}

/// Pending entries of `group` in detail: entry id, owner, delivery count.
async fn pending_entries(transport: &RedisTransport, group: &str) -> Vec<(String, String, usize)> {
    query::<StreamPendingCountReply>(
        transport,
        redis::cmd("XPENDING")
            .arg(transport.stream_key())
            .arg(group)
            .arg("-")
            .arg("+")
            .arg(1_000),
    )
    .await
    .ids
    .into_iter()
    .map(|p| (p.id, p.consumer, p.times_delivered))
    .collect()
}

async fn group_info(transport: &RedisTransport, group: &str) -> redis::streams::StreamInfoGroup {
    query::<StreamInfoGroupsReply>(
        transport,
        redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(transport.stream_key()),
    )
    .await
    .groups
    .into_iter()
    .find(|g| g.name == group)
    .unwrap_or_else(|| panic!("no group `{group}`"))
}

async fn consumers(transport: &RedisTransport, group: &str) -> Vec<(String, usize)> {
    query::<StreamInfoConsumersReply>(
        transport,
        redis::cmd("XINFO")
            .arg("CONSUMERS")
            .arg(transport.stream_key())
            .arg(group),
    )
    .await
    .consumers
    .into_iter()
    .map(|c| (c.name, c.pending))
    .collect()
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

/// Reads and acks until nothing arrives for `idle`; returns the message ids in delivery order.
async fn drain(mut subscription: Box<dyn Subscription>, idle: Duration) -> Vec<String> {
    let mut ids = Vec::new();
    while let Some(delivery) = next_within(&mut subscription, idle).await {
        ids.push(delivery.message_id.clone().expect("message id"));
        delivery.ack().await.expect("ack");
    }
    ids
}

// ---------------------------------------------------------------------------------------------
// Tests.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn setup_is_idempotent_and_refuses_a_key_of_another_type() {
    let Some(transport) = transport("setup").await else {
        return;
    };
    assert_eq!(
        transport.stream_key(),
        format!("{}:events", transport.namespace())
    );
    transport.setup().await.expect("first setup");
    transport.setup().await.expect("second setup");
    let kind: String = query(&transport, redis::cmd("TYPE").arg(transport.stream_key())).await;
    assert_eq!(kind, "none", "setup creates nothing; the first XADD does");

    publish_ok(&transport, &batch("order.placed", 1)).await;
    transport
        .setup()
        .await
        .expect("setup on an existing stream");
    let kind: String = query(&transport, redis::cmd("TYPE").arg(transport.stream_key())).await;
    assert_eq!(kind, "stream");
    assert_eq!(xlen(&transport).await, 1, "setup leaves the stream alone");

    // A namespace whose key holds something else: setup, publish and subscribe say so.
    let Some(taken) = transport_with("setup_taken", |b| b).await else {
        return;
    };
    let _: () = query(
        &taken,
        redis::cmd("SET")
            .arg(taken.stream_key())
            .arg("not a stream"),
    )
    .await;
    let err = taken.setup().await.expect_err("the key is a string");
    assert!(
        err.to_string().contains("not a stream") && err.to_string().contains(taken.stream_key()),
        "unclear error: {err}"
    );
    let results = taken.publish(&batch("order.placed", 2)).await;
    assert_eq!(results.len(), 2);
    for result in &results {
        match result {
            Err(PublishError::Rejected(reason)) => {
                assert!(reason.contains("not a stream"), "unclear reason: {reason}")
            }
            other => panic!("expected a rejection, got {other:?}"),
        }
    }
    let err = taken
        .subscribe(
            "billing",
            &types(&["order.placed"]),
            &SubscribeOptions::default(),
        )
        .await
        .expect_err("the key is a string");
    assert!(
        err.to_string().contains("not a stream"),
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

    assert_eq!(xlen(&transport).await, 1_000);
    let stored = xrange(&transport).await.ids;
    assert_eq!(stored.len(), 1_000);
    for (i, (entry, sent)) in stored.iter().zip(&messages).enumerate() {
        assert_eq!(
            field(entry, "id"),
            sent.event_id.to_string().into_bytes(),
            "event id of entry {i}"
        );
        assert_eq!(field(entry, "type"), b"order.placed");
        assert_eq!(
            field(entry, "aggregate"),
            format!("order/order-{i}").into_bytes()
        );
        assert_eq!(
            field(entry, "content-type"),
            b"application/cloudevents+json"
        );
        assert_eq!(
            field(entry, "body"),
            sent.body.as_ref(),
            "body of entry {i}"
        );
    }
}

#[tokio::test]
async fn max_len_trims_the_stream() {
    // Approximate (the default policy): at least the newest 100, at most one node more.
    let Some(approximate) = transport_with("trim_approx", |b| b.max_len(Some(100))).await else {
        return;
    };
    let messages = batch("order.placed", 500);
    publish_ok(&approximate, &messages).await;
    let len = xlen(&approximate).await;
    assert!(
        (100..200).contains(&len),
        "approximate trimming to 100 kept {len} entries"
    );
    let stored = xrange(&approximate).await.ids;
    let newest = stored.last().expect("entries");
    assert_eq!(
        field(newest, "id"),
        messages[499].event_id.to_string().into_bytes(),
        "the newest entries are the ones kept"
    );

    // Exact: the newest 100 exactly.
    let Some(exact) = transport_with("trim_exact", |b| b.max_len(Some(100)).exact_trim(true)).await
    else {
        return;
    };
    publish_ok(&exact, &messages).await;
    assert_eq!(xlen(&exact).await, 100);
    let stored = xrange(&exact).await.ids;
    assert_eq!(
        field(&stored[0], "id"),
        messages[400].event_id.to_string().into_bytes()
    );

    // Unbounded: everything stays.
    let Some(unbounded) = transport_with("trim_none", |b| b.max_len(None)).await else {
        return;
    };
    publish_ok(&unbounded, &messages).await;
    assert_eq!(xlen(&unbounded).await, 500);
}

#[tokio::test]
async fn a_paused_server_is_a_timeout_not_a_failure() {
    let Some(transport) =
        transport_with("timeout", |b| b.publish_timeout(Duration::from_millis(300))).await
    else {
        return;
    };
    // Redis holds every write command for up to 2 s. Pause and unpause go through a connection
    // of their own: Redis answers a connection in order, so an UNPAUSE sent behind the paused
    // XADDs would wait for them.
    let mut admin = transport
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("admin connection");
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(2_000)
        .arg("WRITE")
        .query_async(&mut admin)
        .await
        .expect("CLIENT PAUSE");
    let started = Instant::now();
    let results = transport.publish(&batch("order.placed", 20)).await;
    let elapsed = started.elapsed();
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut admin)
        .await
        .expect("CLIENT UNPAUSE");

    assert_eq!(results.len(), 20);
    for result in &results {
        assert_eq!(
            result,
            &Err(PublishError::Timeout(Duration::from_millis(300)))
        );
    }
    assert!(
        elapsed >= Duration::from_millis(250),
        "gave up early: {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_millis(1_500),
        "waited too long: {elapsed:?}"
    );

    // A timeout is not "not stored": the paused XADDs ran once the server resumed.
    let deadline = Instant::now() + Duration::from_secs(5);
    while xlen(&transport).await < 20 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(xlen(&transport).await, 20);
    // The connection is still usable.
    publish_ok(&transport, &batch("order.placed", 1)).await;
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

    // Acked deliveries are not redelivered once the claim idle time (1 s) has passed.
    assert!(
        next_within(&mut subscription, Duration::from_millis(2_500))
            .await
            .is_none(),
        "an acked message was redelivered"
    );
    assert_eq!(pending(&transport, "billing").await, 0);
    let group = group_info(&transport, "billing").await;
    assert_eq!(group.pending, 0);
    let last = xrange(&transport)
        .await
        .ids
        .last()
        .expect("entries")
        .id
        .clone();
    assert_eq!(
        group.last_delivered_id, last,
        "the group read the whole stream"
    );
    assert_eq!(group.lag, Some(0));
    // One Redis consumer, nothing pending for it.
    let members = consumers(&transport, "billing").await;
    assert_eq!(members.len(), 1, "{members:?}");
    assert_eq!(members[0].1, 0);
}

#[tokio::test]
async fn a_new_group_starts_where_configured() {
    let Some(earliest) = transport("start_earliest").await else {
        return;
    };
    publish_ok(&earliest, &batch("order.placed", 3)).await;
    let mut from_start = earliest
        .subscribe(
            "audit",
            &types(&["order.placed"]),
            &SubscribeOptions::default(),
        )
        .await
        .expect("subscribe");
    for _ in 0..3 {
        next_delivery(&mut from_start)
            .await
            .ack()
            .await
            .expect("ack");
    }

    let Some(latest) = transport_with("start_latest", |b| b.group_start(GroupStart::Latest)).await
    else {
        return;
    };
    publish_ok(&latest, &batch("order.placed", 3)).await;
    let mut from_now = latest
        .subscribe(
            "audit",
            &types(&["order.placed"]),
            &SubscribeOptions::default(),
        )
        .await
        .expect("subscribe");
    let after = message("order.placed", 9);
    publish_ok(&latest, std::slice::from_ref(&after)).await;
    let delivery = next_delivery(&mut from_now).await;
    assert_eq!(
        delivery.message_id,
        Some(after.event_id.to_string()),
        "a group created at `$` skips what was published before it"
    );
    delivery.ack().await.expect("ack");
    assert!(
        next_within(&mut from_now, Duration::from_millis(1_500))
            .await
            .is_none()
    );
}

#[tokio::test]
async fn a_crashed_subscriptions_deliveries_are_claimed_by_a_live_one() {
    let Some(transport) = transport("crash").await else {
        return;
    };
    let messages = batch("order.placed", 3);
    publish_ok(&transport, &messages).await;
    let event_types = types(&["order.placed"]);
    let quick = options(Duration::from_millis(300), 16);

    let mut crashed = transport
        .subscribe("workers", &event_types, &quick)
        .await
        .expect("subscribe");
    let first = next_delivery(&mut crashed).await;
    assert_eq!(first.message_id, Some(messages[0].event_id.to_string()));
    first.ack().await.expect("ack");
    let second = next_delivery(&mut crashed).await;
    assert_eq!(second.message_id, Some(messages[1].event_id.to_string()));
    assert_eq!(second.delivery_count, 1);
    // The process dies: the delivery in hand is never settled, the third message was read from
    // Redis (into the subscription's buffer) but never handed out.
    drop(second);
    drop(crashed);
    let crashed_at = Instant::now();
    let left = pending_entries(&transport, "workers").await;
    assert_eq!(left.len(), 2, "two entries left pending: {left:?}");
    let crashed_consumer = left[0].1.clone();

    let mut survivor = transport
        .subscribe("workers", &event_types, &quick)
        .await
        .expect("subscribe");
    let mut redelivered = Vec::new();
    for _ in 0..2 {
        let delivery = next_delivery(&mut survivor).await;
        assert!(
            delivery.delivery_count >= 2,
            "a claimed entry is a redelivery: {delivery:?}"
        );
        redelivered.push(delivery);
    }
    assert!(
        crashed_at.elapsed() >= Duration::from_millis(200),
        "claimed before the idle time: {:?}",
        crashed_at.elapsed()
    );
    let ids: Vec<Option<String>> = redelivered.iter().map(|d| d.message_id.clone()).collect();
    assert_eq!(
        ids,
        vec![
            Some(messages[1].event_id.to_string()),
            Some(messages[2].event_id.to_string())
        ]
    );
    // Redis moved both entries to the survivor's consumer.
    let now_pending = pending_entries(&transport, "workers").await;
    assert_eq!(now_pending.len(), 2);
    for (_, owner, times) in &now_pending {
        assert_ne!(owner, &crashed_consumer);
        assert!(*times >= 2);
    }
    for delivery in redelivered {
        delivery.ack().await.expect("ack");
    }
    assert_eq!(pending(&transport, "workers").await, 0);
    assert!(
        next_within(&mut survivor, Duration::from_millis(1_000))
            .await
            .is_none(),
        "nothing else to deliver"
    );
}

#[tokio::test]
async fn nack_and_claim_idle_redeliver() {
    let Some(transport) = transport("nack").await else {
        return;
    };
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
    let read_at = Instant::now();
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
    let waited = nacked_at.elapsed();
    assert!(
        waited >= Duration::from_millis(150),
        "redelivered before the nack delay: {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(900),
        "the nack delay was not honoured, the entry waited for the claim idle time: {waited:?}"
    );
    redelivered.ack().await.expect("ack");

    let expired = next_delivery(&mut subscription).await;
    assert_eq!(
        expired.message_id,
        Some(messages[1].event_id.to_string()),
        "the unsettled message comes back after the claim idle time"
    );
    assert_eq!(expired.delivery_count, 2);
    assert!(
        read_at.elapsed() >= Duration::from_millis(900),
        "redelivered before the claim idle time: {:?}",
        read_at.elapsed()
    );
    expired.ack().await.expect("ack");

    assert!(
        next_within(&mut subscription, Duration::from_millis(2_000))
            .await
            .is_none()
    );
    assert_eq!(pending(&transport, "retrying").await, 0);
}

#[tokio::test]
async fn one_consumer_name_shares_deliveries_and_different_names_each_get_all() {
    let Some(transport) = transport("groups").await else {
        return;
    };
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
    assert_eq!(pending(&transport, "workers").await, 0);
    assert_eq!(pending(&transport, "auditors").await, 0);
}

#[tokio::test]
async fn a_consumer_of_two_types_gets_them_in_order_and_skips_the_others() {
    let Some(transport) = transport("filter").await else {
        return;
    };
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
    // One stream: placed and shipped of each order arrive interleaved, in publish order.
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
        assert_eq!(delivery.delivery_count, 1);
        delivery.ack().await.expect("ack");
    }
    assert!(
        next_within(&mut subscription, Duration::from_millis(2_500))
            .await
            .is_none(),
        "a skipped or acked message was delivered"
    );
    // The skipped `order.cancelled` entries were acknowledged too: nothing pending.
    assert_eq!(pending(&transport, "shipping").await, 0);
    let group = group_info(&transport, "shipping").await;
    assert_eq!(group.lag, Some(0));
    assert_eq!(group.entries_read, Some(9));

    // A consumer of the third type gets just those.
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
    assert_eq!(pending(&transport, "refunds").await, 0);
}

#[tokio::test]
async fn a_subscription_recovers_its_connection_and_rereads_its_pending_entries() {
    let Some(transport) = transport("reconnect").await else {
        return;
    };
    let messages = batch("order.placed", 3);
    publish_ok(&transport, &messages[..1]).await;
    let mut subscription = transport
        .subscribe(
            "recovering",
            &types(&["order.placed"]),
            &options(Duration::from_secs(30), 16),
        )
        .await
        .expect("subscribe");
    let delivery = next_delivery(&mut subscription).await;
    assert_eq!(delivery.message_id, Some(messages[0].event_id.to_string()));
    delivery.ack().await.expect("ack");
    let members = consumers(&transport, "recovering").await;
    assert_eq!(members.len(), 1);
    let member = members[0].0.clone();

    // The reply to a read is lost with the connection: the entry is pending for the
    // subscription's consumer, but the subscription never saw it.
    publish_ok(&transport, &messages[1..2]).await;
    let read: Value = query(
        &transport,
        redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("recovering")
            .arg(&member)
            .arg("COUNT")
            .arg(10)
            .arg("STREAMS")
            .arg(transport.stream_key())
            .arg(">"),
    )
    .await;
    assert_ne!(read, Value::Nil);
    let client_name = format!("outbox:{member}");
    let old_id = client_id(&transport, &client_name)
        .await
        .expect("the reading connection is named after its consumer");
    let killed: i64 = query(
        &transport,
        redis::cmd("CLIENT").arg("KILL").arg("ID").arg(&old_id),
    )
    .await;
    assert_eq!(killed, 1);

    let recovered = next_delivery(&mut subscription).await;
    assert_eq!(
        recovered.message_id,
        Some(messages[1].event_id.to_string()),
        "the subscription re-read its own pending entry after reconnecting"
    );
    assert_eq!(recovered.delivery_count, 2);
    let new_id = client_id(&transport, &client_name)
        .await
        .expect("a new reading connection");
    assert_ne!(new_id, old_id);
    recovered.ack().await.expect("ack");
    assert_eq!(pending(&transport, "recovering").await, 0);

    // Then new entries flow again.
    publish_ok(&transport, &messages[2..]).await;
    let fresh = next_delivery(&mut subscription).await;
    assert_eq!(fresh.message_id, Some(messages[2].event_id.to_string()));
    assert_eq!(fresh.delivery_count, 1);
    fresh.ack().await.expect("ack");
}

/// The id of the client connection named `name`, from `CLIENT LIST`.
async fn client_id(transport: &RedisTransport, name: &str) -> Option<String> {
    let list: String = query(transport, redis::cmd("CLIENT").arg("LIST")).await;
    list.lines().find_map(|line| {
        let fields: HashMap<&str, &str> = line
            .split(' ')
            .filter_map(|pair| pair.split_once('='))
            .collect();
        if fields.get("name") == Some(&name) {
            fields.get("id").map(|id| (*id).to_owned())
        } else {
            None
        }
    })
}

#[tokio::test]
async fn a_finished_subscription_removes_its_consumer_unless_it_left_work_pending() {
    let Some(transport) = transport("cleanup").await else {
        return;
    };
    publish_ok(&transport, &batch("order.placed", 2)).await;
    let event_types = types(&["order.placed"]);
    let one_at_a_time = options(Duration::from_secs(30), 1);

    let mut tidy = transport
        .subscribe("cleanup", &event_types, &one_at_a_time)
        .await
        .expect("subscribe");
    next_delivery(&mut tidy).await.ack().await.expect("ack");
    assert_eq!(consumers(&transport, "cleanup").await.len(), 1);
    drop(tidy);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !consumers(&transport, "cleanup").await.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        consumers(&transport, "cleanup").await.is_empty(),
        "the consumer with nothing pending is removed"
    );

    let mut sloppy = transport
        .subscribe("cleanup", &event_types, &one_at_a_time)
        .await
        .expect("subscribe");
    let unsettled = next_delivery(&mut sloppy).await;
    drop(unsettled);
    drop(sloppy);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let members = consumers(&transport, "cleanup").await;
    assert_eq!(members.len(), 1, "kept: it still owns a pending entry");
    assert_eq!(members[0].1, 1);
}

#[tokio::test]
async fn health_is_ok_on_a_live_server() {
    let Some(transport) = transport("health").await else {
        return;
    };
    transport.health().await.expect("healthy");
    assert_eq!(transport.name(), "redis");
}

#[tokio::test]
async fn connecting_to_a_closed_port_fails_instead_of_hanging() {
    let started = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(15),
        RedisTransport::builder("redis://127.0.0.1:1")
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
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );

    let invalid = RedisTransport::connect("http://127.0.0.1:6379").await;
    assert!(
        invalid
            .expect_err("not a redis URL")
            .to_string()
            .contains("URL"),
    );
}

#[tokio::test]
async fn large_and_unicode_payloads_round_trip_byte_exact() {
    let Some(transport) = transport("payloads").await else {
        return;
    };
    let mut large = message("order.placed", 0);
    let text: String = "héllo wörld ✓ 注文 🚚 ".repeat(25_000);
    large.body = serde_json::to_vec(&serde_json::json!({ "data": text }))
        .expect("json")
        .into();
    assert!(large.body.len() >= 500_000, "{} bytes", large.body.len());
    let mut unicode = message("order.placed", 1);
    unicode.body = "{\"data\":\"Ωμέγα – 東京 – 🦀 – \\u0000 – \u{10FFFF}\"}"
        .as_bytes()
        .to_vec()
        .into();
    let mut binary = message("order.placed", 2);
    binary.body = (0..=255u8)
        .chain((0..=255u8).rev())
        .collect::<Vec<u8>>()
        .into();
    let messages = vec![large, unicode, binary];
    publish_ok(&transport, &messages).await;

    let stored = xrange(&transport).await.ids;
    assert_eq!(stored.len(), 3);
    for (entry, sent) in stored.iter().zip(&messages) {
        assert_eq!(field(entry, "body"), sent.body.as_ref());
    }

    let mut subscription = transport
        .subscribe(
            "payloads",
            &types(&["order.placed"]),
            &SubscribeOptions::default(),
        )
        .await
        .expect("subscribe");
    for sent in &messages {
        let delivery = next_delivery(&mut subscription).await;
        assert_eq!(delivery.message_id, Some(sent.event_id.to_string()));
        assert_eq!(delivery.body.len(), sent.body.len());
        assert!(delivery.body == sent.body, "body differs");
        delivery.ack().await.expect("ack");
    }
}
