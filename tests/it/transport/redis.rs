//! The Redis Streams transport against a real Redis (127.0.0.1:6379, 6.2 or newer): its fixture
//! for the shared suite, and what only Redis has (the stream key and its trimming, a paused
//! server, where a new group starts, claiming a crashed consumer's entries, named connections
//! and consumer cleanup).
//!
//! Each test works in its own namespace and stream key (`t_<test>_<random>:events`) and deletes
//! the key when it ends.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use outbox::transport::{
    OutgoingMessage, SubscribeOptions, Transport,
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

use super::{
    Fixture, Stored, assert_rejected, assert_timed_out, batch, message, next_delivery, next_within,
    options, publish_ok, types,
};
use crate::common::{connect_or_skip, fresh_namespace};

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
    let builder = RedisTransport::builder(REDIS_URL)
        .namespace(fresh_namespace(test))
        .connection_timeout(Duration::from_secs(3));
    let connect = configure(builder).connect();
    connect_or_skip("Redis", REDIS_URL, test, connect)
        .await
        .map(TestTransport)
}

/// A Redis Streams transport on a stream key of the test's own.
pub(crate) struct Redis(TestTransport);

#[async_trait::async_trait]
impl Fixture for Redis {
    const NAME: &'static str = "redis";
    const CLOSED_PORT_URL: &'static str = "redis://127.0.0.1:1";

    async fn open(test: &str) -> Option<Self> {
        transport(test).await.map(Redis)
    }

    wrapped_transport!(RedisTransport, |f| f.0.0);

    /// Every entry of the stream (`XRANGE - +`), as many as `XLEN` counts.
    async fn stored(&self) -> Vec<Stored> {
        let entries = xrange(&self.0).await.ids;
        assert_eq!(xlen(&self.0).await, entries.len());
        entries
            .iter()
            .map(|entry| {
                let text = |name: &str| String::from_utf8(field(entry, name)).expect("utf-8");
                Stored {
                    message_id: text("id"),
                    event_type: text("type"),
                    content_type: Some(text("content-type")),
                    body: field(entry, "body"),
                    fields: [("aggregate".to_owned(), text("aggregate"))].into(),
                }
            })
            .collect()
    }

    fn check_stored(&self, i: usize, stored: &Stored, sent: &OutgoingMessage) {
        assert_eq!(
            stored.field("aggregate"),
            format!("{}/{}", sent.aggregate_type, sent.aggregate_id),
            "aggregate of entry {i}"
        );
    }

    async fn after_acks(&self) {
        assert_eq!(pending(&self.0, "billing").await, 0);
        let group = group_info(&self.0, "billing").await;
        assert_eq!(group.pending, 0);
        let last = xrange(&self.0)
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
        let members = consumers(&self.0, "billing").await;
        assert_eq!(members.len(), 1, "{members:?}");
        assert_eq!(members[0].pending, 0);
    }

    async fn after_filtered(&self) {
        // The skipped `order.cancelled` entries were acknowledged too: nothing pending.
        assert_eq!(pending(&self.0, "shipping").await, 0);
        let group = group_info(&self.0, "shipping").await;
        assert_eq!(group.lag, Some(0));
        assert_eq!(group.entries_read, Some(9));
    }

    async fn after_groups(&self) {
        assert_eq!(pending(&self.0, "workers").await, 0);
        assert_eq!(pending(&self.0, "auditors").await, 0);
    }

    async fn after_redelivered(&self) {
        assert_eq!(pending(&self.0, "retrying").await, 0);
    }

    async fn after_closed(&self, consumer: &str) {
        assert_eq!(pending(&self.0, consumer).await, 0);
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------------------------

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

/// One pending entry of a group: delivered, not acknowledged.
#[derive(Debug, Clone)]
struct PendingEntry {
    owner: String,
    times_delivered: usize,
}

/// Pending entries of `group` in detail.
async fn pending_entries(transport: &RedisTransport, group: &str) -> Vec<PendingEntry> {
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
    .map(|p| PendingEntry {
        owner: p.consumer,
        times_delivered: p.times_delivered,
    })
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

/// One Redis consumer of a group, and how many entries it has pending.
#[derive(Debug, Clone)]
struct Member {
    name: String,
    pending: usize,
}

async fn consumers(transport: &RedisTransport, group: &str) -> Vec<Member> {
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
    .map(|c| Member {
        name: c.name,
        pending: c.pending,
    })
    .collect()
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

    publish_ok(&*transport, &batch("order.placed", 1)).await;
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
    assert_rejected(&results, &["not a stream"]);
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
async fn max_len_trims_the_stream() {
    // Approximate (the default policy): at least the newest 100, at most one node more.
    let Some(approximate) = transport_with("trim_approx", |b| b.max_len(Some(100))).await else {
        return;
    };
    let messages = batch("order.placed", 500);
    publish_ok(&*approximate, &messages).await;
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
    publish_ok(&*exact, &messages).await;
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
    publish_ok(&*unbounded, &messages).await;
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

    assert_timed_out(
        &results,
        20,
        Duration::from_millis(300),
        elapsed,
        Duration::from_millis(1_500),
    );

    // A timeout is not "not stored": the paused XADDs ran once the server resumed.
    let deadline = Instant::now() + Duration::from_secs(5);
    while xlen(&transport).await < 20 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(xlen(&transport).await, 20);
    // The connection is still usable.
    publish_ok(&*transport, &batch("order.placed", 1)).await;
}

#[tokio::test]
async fn a_new_group_starts_where_configured() {
    let Some(earliest) = transport("start_earliest").await else {
        return;
    };
    publish_ok(&*earliest, &batch("order.placed", 3)).await;
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
    publish_ok(&*latest, &batch("order.placed", 3)).await;
    let mut from_now = latest
        .subscribe(
            "audit",
            &types(&["order.placed"]),
            &SubscribeOptions::default(),
        )
        .await
        .expect("subscribe");
    let after = message("order.placed", 9);
    publish_ok(&*latest, std::slice::from_ref(&after)).await;
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
    publish_ok(&*transport, &messages).await;
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
    let crashed_consumer = left[0].owner.clone();

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
    for entry in &now_pending {
        assert_ne!(entry.owner, crashed_consumer);
        assert!(entry.times_delivered >= 2);
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
async fn a_subscription_recovers_its_connection_and_rereads_its_pending_entries() {
    let Some(transport) = transport("reconnect").await else {
        return;
    };
    let messages = batch("order.placed", 3);
    publish_ok(&*transport, &messages[..1]).await;
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
    let member = members[0].name.clone();

    // The reply to a read is lost with the connection: the entry is pending for the
    // subscription's consumer, but the subscription never saw it.
    publish_ok(&*transport, &messages[1..2]).await;
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
    publish_ok(&*transport, &messages[2..]).await;
    let fresh = next_delivery(&mut subscription).await;
    assert_eq!(fresh.message_id, Some(messages[2].event_id.to_string()));
    assert_eq!(fresh.delivery_count, 1);
    fresh.ack().await.expect("ack");
}

#[tokio::test]
async fn a_finished_subscription_removes_its_consumer_unless_it_left_work_pending() {
    let Some(transport) = transport("cleanup").await else {
        return;
    };
    publish_ok(&*transport, &batch("order.placed", 2)).await;
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
    assert_eq!(members[0].pending, 1);
}

#[tokio::test]
async fn a_url_of_another_scheme_is_refused() {
    let invalid = RedisTransport::connect("http://127.0.0.1:6379").await;
    assert!(
        invalid
            .expect_err("not a redis URL")
            .to_string()
            .contains("URL"),
    );
}
