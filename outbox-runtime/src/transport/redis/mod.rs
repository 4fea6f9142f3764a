//! Redis Streams transport (feature `redis`).
//!
//! # Topology
//!
//! One stream per namespace stores every event: the key `outbox:events` (see
//! [`RedisConfig::stream_key`]). Each entry carries the fields `id` (the event id), `type` (the
//! event type), `aggregate` (`{aggregate type}/{aggregate id}`), `content-type`
//! (`application/cloudevents+json`) and `body` (the CloudEvents JSON, byte for byte).
//!
//! One stream rather than one per event type, because a stream is the only unit Redis orders: a
//! consumer of `order.placed` and `order.shipped` reading two streams could see the shipment of an
//! order before its placement. With one stream, the events of an aggregate reach every consumer
//! group in the order they were published, whatever their types. The price is that a consumer
//! group reads every entry of the namespace and skips (acknowledges) the types it did not
//! subscribe to; use several namespaces to keep unrelated, busy event families apart.
//!
//! # Publishing
//!
//! [`publish`] sends a batch as one pipeline of `XADD`s (one round trip; batches above 1,000
//! messages or 16 MiB are split into several pipelines, sent one after the other) and reports a
//! message `Ok` only once its `XADD` reply, the entry id, arrived: Redis has then applied it. What
//! happens to it afterwards depends on the server's persistence (AOF, replication), which this
//! transport cannot see. Redis 7 has no broker-side deduplication: a relay that crashed between
//! the reply and marking the row `SENT` publishes the event again, and the inbox deduplicates it.
//!
//! Each `XADD` trims the stream to about [`RedisConfig::max_len`] entries (default
//! [`DEFAULT_MAX_LEN`], approximate `MAXLEN ~`). **Trimming does not care about consumer
//! groups**: an entry a slow or stopped group has not read yet, or has read but not acknowledged,
//! is dropped all the same. Size `max_len` for the longest outage a consumer may have, or set it
//! to `None` to keep every entry (and trim with your own `XTRIM`).
//!
//! # Consuming
//!
//! [`subscribe`] reads through the consumer group named exactly like the consumer
//! (`XGROUP CREATE … MKSTREAM`, created on first use). A new group starts, by default, at the
//! beginning of the stream ([`GroupStart::Earliest`], like a JetStream consumer delivering all):
//! a consumer deployed after the producer still sees every event the stream retains. Each
//! [`Subscription`] is its own Redis consumer inside the group (named `{host}-{pid}-{random}`), so
//! subscriptions with the same consumer name share the deliveries and different names each receive
//! everything. A subscription reads with `XREADGROUP … BLOCK`, on a connection of its own so that
//! a blocked read never delays publishes or acks, and keeps at most
//! [`SubscribeOptions::max_in_flight`] entries read but not yet settled.
//!
//! Redelivery. An entry stays pending in the group until it is acknowledged (`XACK`). Entries
//! pending for longer than [`claim_idle`](RedisConfig::claim_idle) (default: the subscription's
//! [`ack_wait`](SubscribeOptions::ack_wait)) are taken over with `XAUTOCLAIM` by any live
//! subscription of the group, which checks about once per [`block`](RedisConfig::block)
//! interval: the messages of a crashed process, or of a delivery dropped without being settled,
//! are delivered again, with the delivery count Redis keeps (`2` or more). A delivery still in
//! the hands of a slow handler after `claim_idle` may be claimed, and handed out again, by another
//! subscription of the group (the inbox deduplicates); the subscription holding it never hands
//! out a second copy itself (its own claim merely resets the entry's idle time). Redeliveries, as
//! with every broker, can overtake later messages of the same aggregate.
//!
//! [`nack`](crate::transport::Delivery::nack) leaves the entry pending and backdates its
//! delivery time (`XCLAIM … IDLE`), so the next claim sweep of any subscription of the group
//! delivers it again once `delay` has passed (immediately with no delay). Delays longer than
//! `claim_idle` are shortened to `claim_idle`: Redis cannot hide a pending entry for longer.
//!
//! Reconnection. The publishing connection is a [`ConnectionManager`]: after a connection loss the
//! failing command reports an error and the manager reconnects in the background. A
//! subscription's reading connection reconnects inside [`Subscription::next`]; once reconnected it
//! first re-reads its own pending entries (`XREADGROUP … 0`, e.g. entries whose reply the lost
//! connection swallowed), then resumes with new ones (`>`). When reconnecting fails, `next`
//! returns the error; calling it again retries, with a backoff of up to 5 s.
//!
//! Housekeeping. A subscription that ends with nothing pending removes its Redis consumer from the
//! group; consumers left behind by crashed processes are removed by a live subscription once they
//! have nothing pending and have been idle for ten minutes (or `2 × claim_idle`, whichever is
//! longer). Both checks run atomically on the server, so no pending entry is ever dropped.
//!
//! ```no_run
//! # async fn demo() -> Result<(), outbox_runtime::transport::TransportError> {
//! use std::time::Duration;
//! use outbox_runtime::transport::{Transport, redis::RedisTransport};
//!
//! let transport = RedisTransport::builder("redis://127.0.0.1:6379")
//!     .namespace("shop")
//!     .max_len(Some(5_000_000))
//!     .claim_idle(Duration::from_secs(60))
//!     .connect()
//!     .await?;
//! transport.setup().await?;
//! assert_eq!(transport.stream_key(), "shop:events");
//! # Ok(())
//! # }
//! ```
//!
//! [`publish`]: Transport::publish
//! [`subscribe`]: Transport::subscribe

use std::{fmt, sync::Arc};

use ::redis::{
    Client,
    aio::{ConnectionManager, ConnectionManagerConfig},
};

use super::{
    OutgoingMessage, PublishError, SubscribeOptions, Subscription, Transport, TransportError,
    routing_name,
};

/// The `redis` crate version this transport is built on, re-exported so the versions of
/// [`RedisTransport::from_client`]'s client and of [`RedisTransport::connection`] cannot drift
/// apart.
pub use ::redis;

const TRANSPORT: &str = "redis";

mod ack;
mod config;
mod connection;
mod group;
mod held;
mod publish;
mod read;
mod reply;
mod subscription;

pub use config::{
    DEFAULT_BLOCK, DEFAULT_CONNECTION_TIMEOUT, DEFAULT_MAX_LEN, DEFAULT_PUBLISH_TIMEOUT,
    DEFAULT_RESPONSE_TIMEOUT, GroupStart, RedisConfig, RedisTransportBuilder,
};
pub use publish::CONTENT_TYPE;

use config::validate_config;
use connection::{SharedConnection, open_connection};
use reply::value_to_string;
use subscription::MAX_RETRY_DELAY;

/// The Redis Streams transport. Cheap to clone: clones share the connections.
#[derive(Clone)]
pub struct RedisTransport {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    shared: SharedConnection,
    config: RedisConfig,
    stream_key: String,
    /// `host:port` (or socket path) for messages; never the URL, which may hold a password.
    server: String,
}

impl fmt::Debug for RedisTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTransport")
            .field("server", &self.inner.server)
            .field("namespace", &self.inner.config.namespace)
            .field("stream", &self.inner.stream_key)
            .finish_non_exhaustive()
    }
}

impl RedisTransport {
    /// Connect to `url` (`redis://[user:password@]host:port[/db]`) with the default settings
    /// (namespace `outbox`, stream `outbox:events`).
    pub async fn connect(url: &str) -> Result<Self, TransportError> {
        Self::builder(url).connect().await
    }

    /// Configure a transport that connects to `url`.
    pub fn builder(url: impl Into<String>) -> RedisTransportBuilder {
        RedisTransportBuilder {
            url: url.into(),
            config: RedisConfig::default(),
        }
    }

    /// Use a client configured elsewhere (TLS, credentials, RESP3): connects once to check the
    /// server answers, then opens the publishing connection.
    pub async fn from_client(client: Client, config: RedisConfig) -> Result<Self, TransportError> {
        validate_config(&config)?;
        let server = client.get_connection_info().addr().to_string();
        // One plain attempt first, so a server that is down fails now instead of after the
        // connection manager's retries.
        let probe = open_connection(&client, config.connection_timeout)
            .await
            .map_err(|err| {
                TransportError::new(
                    TRANSPORT,
                    format!("cannot connect to Redis at `{server}`: {err}"),
                )
            })?;
        drop(probe);
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connection_timeout))
            // Every command is bounded by this transport's own timeouts.
            .set_response_timeout(None)
            .set_max_delay(MAX_RETRY_DELAY);
        let manager = ConnectionManager::new_with_config(client.clone(), manager_config.clone())
            .await
            .map_err(|err| {
                TransportError::new(
                    TRANSPORT,
                    format!("cannot connect to Redis at `{server}`: {err}"),
                )
            })?;
        let stream_key = config.stream_key();
        Ok(RedisTransport {
            inner: Arc::new(Inner {
                shared: SharedConnection::new(client.clone(), manager_config, manager),
                client,
                config,
                stream_key,
                server,
            }),
        })
    }

    /// The publishing connection (it reconnects on its own, and is replaced when it leaves a
    /// command unanswered), for inspecting the stream and its groups.
    pub fn connection(&self) -> ConnectionManager {
        self.shared()
    }

    /// The client the transport opens its connections with.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The namespace events are stored under.
    pub fn namespace(&self) -> &str {
        &self.inner.config.namespace
    }

    /// The stream key storing the namespace's events: `{namespace}:events`.
    pub fn stream_key(&self) -> &str {
        &self.inner.stream_key
    }

    /// The settings in use.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// The routing name of an event type, reported as
    /// [`Delivery::subject`](crate::transport::Delivery::subject): `{namespace}.{event_type}`.
    pub fn subject(&self, event_type: &str) -> String {
        routing_name(&self.inner.config.namespace, event_type)
    }
}

#[async_trait::async_trait]
impl Transport for RedisTransport {
    fn name(&self) -> &'static str {
        TRANSPORT
    }

    fn routing(&self) -> Option<crate::transport::Routing> {
        Some(crate::transport::Routing::Redis {
            stream_key: self.inner.stream_key.clone(),
        })
    }

    /// Checks that the server answers and that the stream key is free or holds a stream.
    /// Creates nothing: the first `XADD` creates the stream, the first subscription of a consumer
    /// its group. Idempotent.
    async fn setup(&self) -> Result<(), TransportError> {
        self.health().await?;
        let key = &self.inner.stream_key;
        let mut cmd = ::redis::cmd("TYPE");
        cmd.arg(key);
        let kind = self.command(&cmd).await.map_err(|failure| {
            TransportError::new(TRANSPORT, format!("cannot inspect key `{key}`: {failure}"))
        })?;
        match value_to_string(&kind).as_deref() {
            Some("none") | Some("stream") => Ok(()),
            Some(other) => Err(TransportError::new(
                TRANSPORT,
                format!(
                    "key `{key}` exists and holds a {other}, not a stream: it belongs to \
                     something else; delete it or use another namespace"
                ),
            )),
            None => Err(TransportError::new(
                TRANSPORT,
                format!("unexpected reply to `TYPE {key}`: {kind:?}"),
            )),
        }
    }

    /// Pipelines one `XADD` per message (at most 1,000 messages or 16 MiB per round trip, the
    /// pipelines sent one after the other) and maps each reply: an entry id → `Ok`; a server
    /// error (wrong key type, out of memory, …) → [`PublishError::Rejected`]; no reply within the
    /// publish timeout → [`PublishError::Timeout`]; a lost connection →
    /// [`PublishError::Connection`]; a body over Redis' 512 MiB argument limit →
    /// [`PublishError::Permanent`]. After a timeout or connection failure the rest of the batch
    /// is not sent and reports the same error.
    async fn publish(&self, messages: &[OutgoingMessage]) -> Vec<Result<(), PublishError>> {
        self.publish_all(messages).await
    }

    /// Creates the consumer group `consumer` if needed (see [`GroupStart`]) and opens a reading
    /// connection for a new Redis consumer in it.
    ///
    /// Every event type of the namespace reaches the group; the subscription acknowledges and
    /// skips the types it was not given. All subscriptions under one consumer name should
    /// therefore list the same event types: one listing fewer acks away the messages another one
    /// wanted.
    async fn subscribe(
        &self,
        consumer: &str,
        event_types: &[String],
        options: &SubscribeOptions,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        self.open_subscription(consumer, event_types, options).await
    }

    /// `PING`, within the command timeout.
    async fn health(&self) -> Result<(), TransportError> {
        let server = &self.inner.server;
        match self.command(&::redis::cmd("PING")).await {
            Ok(reply) if value_to_string(&reply).as_deref() == Some("PONG") => Ok(()),
            Ok(reply) => Err(TransportError::new(
                TRANSPORT,
                format!("unexpected reply to PING from `{server}`: {reply:?}"),
            )),
            Err(failure) => Err(TransportError::new(
                TRANSPORT,
                format!("Redis at `{server}` does not answer: {failure}"),
            )),
        }
    }
}
