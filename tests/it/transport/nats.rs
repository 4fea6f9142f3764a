//! The NATS JetStream transport against a real nats-server (127.0.0.1:4222, JetStream on): its
//! fixture for the shared suite, and what only JetStream has (the stream's configuration,
//! `Nats-Msg-Id` deduplication, PubAck timeouts, consumer filters).
//!
//! Each test works in its own namespace and stream (`t_<test>_<random>`) and deletes the stream
//! when it ends.

use std::time::{Duration, Instant};

use outbox::transport::{
    OutgoingMessage, SubscribeOptions, Transport,
    nats::{NatsConfig, NatsTransport, async_nats, durable_name},
};

use super::{
    Fixture, Stored, assert_permanent, assert_rejected, assert_timed_out, batch, message,
    publish_ok, types,
};
use crate::common::nats::{TestTransport, transport, transport_with};

/// A JetStream transport on a stream of the test's own.
pub(crate) struct Nats(TestTransport);

#[async_trait::async_trait]
impl Fixture for Nats {
    const NAME: &'static str = "nats";
    const CLOSED_PORT_URL: &'static str = "nats://127.0.0.1:1";

    async fn open(test: &str) -> Option<Self> {
        transport(test).await.map(Nats)
    }

    wrapped_transport!(NatsTransport, |f| f.0.0);

    /// Every message of the stream, by sequence number.
    async fn stored(&self) -> Vec<Stored> {
        let stream = self
            .0
            .jetstream()
            .get_stream(self.0.stream_name())
            .await
            .expect("stream");
        let count = stream_messages(&self.0).await;
        let mut all = Vec::new();
        for seq in 1..=count {
            let raw = stream.get_raw_message(seq).await.expect("stored message");
            let header = |name: &str| raw.headers.get(name).map(|v| v.as_str().to_owned());
            all.push(Stored {
                message_id: header("Nats-Msg-Id").expect("Nats-Msg-Id"),
                event_type: header("ce-type").expect("ce-type"),
                content_type: header("Content-Type"),
                body: raw.payload.to_vec(),
                fields: [("subject".to_owned(), raw.subject.to_string())].into(),
            });
        }
        all
    }

    fn check_stored(&self, i: usize, stored: &Stored, sent: &OutgoingMessage) {
        assert_eq!(
            stored.field("subject"),
            format!("{}.{}", self.namespace(), sent.event_type),
            "subject of message {i}"
        );
    }

    async fn after_acks(&self) {
        let info = consumer_info(&self.0, "billing").await;
        assert_eq!(
            info.config.filter_subject,
            format!("{}.order.placed", self.namespace())
        );
        assert_eq!(info.num_ack_pending, 0);
        assert_eq!(info.num_pending, 0);
        assert_eq!(info.num_redelivered, 0);
        assert_eq!(
            info.delivered.consumer_sequence, 5,
            "five deliveries, no redelivery"
        );
        assert_eq!(info.ack_floor.consumer_sequence, 5, "all five acked");
    }

    async fn after_filtered(&self) {
        // The skipped `order.cancelled` deliveries were settled too: nothing pending on the
        // broker. A consumer of a single type filters on the broker instead.
        let info = consumer_info(&self.0, "shipping").await;
        assert_eq!(
            info.config.filter_subject,
            format!("{}.>", self.namespace())
        );
        assert_eq!(info.num_ack_pending, 0);
        assert_eq!(info.num_pending, 0);
        assert_eq!(info.ack_floor.stream_sequence, 9);
    }

    async fn after_redelivered(&self) {
        let info = consumer_info(&self.0, "retrying").await;
        assert_eq!(info.num_ack_pending, 0);
        assert_eq!(info.ack_floor.stream_sequence, 2);
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
async fn republishing_inside_the_duplicate_window_is_deduplicated() {
    let Some(transport) = transport("dedup").await else {
        return;
    };
    transport.setup().await.expect("setup");
    let messages = batch("order.placed", 10);
    publish_ok(&*transport, &messages).await;
    assert_eq!(stream_messages(&transport).await, 10);

    // A relay that crashed before marking the rows SENT publishes them again: still confirmed,
    // still stored once.
    publish_ok(&*transport, &messages).await;
    assert_eq!(stream_messages(&transport).await, 10);

    // Half old, half new: only the new ones are added.
    let mut mixed = messages[..5].to_vec();
    mixed.extend(batch("order.placed", 5));
    publish_ok(&*transport, &mixed).await;
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
    assert_rejected(&results, &["setup"]);

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
    assert_permanent(&results[1], &["max_payload", "size"]);
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

    // Twenty sequential waits would take 10 s: the acknowledgements are awaited together.
    assert_timed_out(
        &results,
        20,
        Duration::from_millis(500),
        elapsed,
        Duration::from_secs(5),
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
