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
//! [`nack`](Delivery::nack) leaves the entry pending and backdates its delivery time
//! (`XCLAIM … IDLE`), so the next claim sweep of any subscription of the group delivers it again
//! once `delay` has passed (immediately with no delay). Delays longer than `claim_idle` are
//! shortened to `claim_idle`: Redis cannot hide a pending entry for longer.
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

use std::{
    collections::{HashMap, HashSet, VecDeque},
    fmt,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use ::redis::{
    AsyncConnectionConfig, Client, Cmd, RedisError, Value,
    aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection},
};
use bytes::Bytes;
use tokio::{sync::Notify, time::Instant};

use super::{
    DEFAULT_NAMESPACE, Delivery, OutgoingMessage, PublishError, SubscribeOptions, Subscription,
    Transport, TransportError, routing_name,
};

/// The `redis` crate version this transport is built on, re-exported so the versions of
/// [`RedisTransport::from_client`]'s client and of [`RedisTransport::connection`] cannot drift
/// apart.
pub use ::redis;

const TRANSPORT: &str = "redis";

/// Default stream length bound: each `XADD` trims the stream to about this many entries.
pub const DEFAULT_MAX_LEN: usize = 1_000_000;

/// Default longest time one `XREADGROUP` waits for new entries.
pub const DEFAULT_BLOCK: Duration = Duration::from_secs(1);

/// Default time to wait for the `XADD` replies of a publish.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Default time to wait for a TCP connection and the server's handshake.
pub const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// The value of every entry's `content-type` field.
pub const CONTENT_TYPE: &str = "application/cloudevents+json";

/// Lower bound of the timeout of commands other than publishes (acks, claims, health); the
/// publish timeout raises it when longer.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Messages sent in one pipeline, at most.
const PUBLISH_CHUNK_MESSAGES: usize = 1_000;

/// Body bytes sent in one pipeline, at most (a single larger message is sent alone).
const PUBLISH_CHUNK_BYTES: usize = 16 * 1024 * 1024;

/// Redis refuses arguments longer than `proto-max-bulk-len` (default 512 MiB).
const MAX_BODY_BYTES: usize = 512 * 1024 * 1024;

/// Entries asked for in one `XREADGROUP` or `XAUTOCLAIM`, at most (never more than the free
/// room under `max_in_flight`).
const MAX_READ_BATCH: usize = 256;

/// Claim sweeps run at most this often.
const MIN_SWEEP_INTERVAL: Duration = Duration::from_millis(50);

/// Consumers of the group with nothing pending are looked for this often.
const JANITOR_INTERVAL: Duration = Duration::from_secs(300);

/// Consumers idle for less than this are never removed by the janitor.
const JANITOR_MIN_IDLE: Duration = Duration::from_secs(600);

/// Longest wait between two reconnection attempts of a subscription.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// First wait between two reconnection attempts of a subscription.
const MIN_RETRY_DELAY: Duration = Duration::from_millis(100);

/// Removes a consumer from its group only when it has nothing pending, atomically:
/// `KEYS[1]` stream, `ARGV[1]` group, `ARGV[2]` consumer. Returns 0 when removed, -1 when kept.
const DELETE_IDLE_CONSUMER: &str = r"
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #pending == 0 then
  redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
  return 0
end
return -1
";

/// Where a consumer group created by [`subscribe`](Transport::subscribe) starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupStart {
    /// At the first entry still in the stream (`XGROUP CREATE … 0`): a consumer deployed after
    /// the producer receives every event the stream retains. The default.
    #[default]
    Earliest,
    /// After the last entry (`XGROUP CREATE … $`): only events published after the group was
    /// created. Events published before the first subscription are never delivered to it.
    Latest,
}

impl GroupStart {
    fn id(self) -> &'static str {
        match self {
            GroupStart::Earliest => "0",
            GroupStart::Latest => "$",
        }
    }
}

/// Settings of a [`RedisTransport`].
///
/// ```
/// use std::time::Duration;
/// use outbox_runtime::transport::redis::RedisConfig;
///
/// let config = RedisConfig::default()
///     .namespace("shop")
///     .max_len(None)
///     .publish_timeout(Duration::from_secs(5));
/// assert_eq!(config.stream_key(), "shop:events");
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisConfig {
    /// Events are stored in the stream `{namespace}:events`. Default [`DEFAULT_NAMESPACE`]
    /// (`outbox`).
    pub namespace: String,
    /// Each `XADD` trims the stream to this many entries; `None` never trims. Default
    /// `Some(`[`DEFAULT_MAX_LEN`]`)`. Trimming drops entries whether or not every consumer group
    /// has read and acknowledged them.
    pub max_len: Option<usize>,
    /// Trim to exactly [`max_len`](Self::max_len) (`MAXLEN =`) instead of about it (`MAXLEN ~`,
    /// the default, which only removes whole internal nodes and is much cheaper).
    pub exact_trim: bool,
    /// Entries pending (delivered, not acknowledged) for longer than this are claimed by a live
    /// subscription of the group and delivered again. `None` (the default) uses each
    /// subscription's [`SubscribeOptions::ack_wait`].
    pub claim_idle: Option<Duration>,
    /// Longest time one `XREADGROUP` waits for new entries; claim sweeps run at least this often.
    /// Default [`DEFAULT_BLOCK`] (1 s).
    pub block: Duration,
    /// How long a publish waits for its `XADD` replies before reporting
    /// [`PublishError::Timeout`]. Default [`DEFAULT_PUBLISH_TIMEOUT`] (10 s).
    pub publish_timeout: Duration,
    /// Timeout of each connection attempt. Default [`DEFAULT_CONNECTION_TIMEOUT`] (5 s).
    pub connection_timeout: Duration,
    /// Where a consumer group created by a subscription starts. Default
    /// [`GroupStart::Earliest`].
    pub group_start: GroupStart,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            namespace: DEFAULT_NAMESPACE.to_owned(),
            max_len: Some(DEFAULT_MAX_LEN),
            exact_trim: false,
            claim_idle: None,
            block: DEFAULT_BLOCK,
            publish_timeout: DEFAULT_PUBLISH_TIMEOUT,
            connection_timeout: DEFAULT_CONNECTION_TIMEOUT,
            group_start: GroupStart::Earliest,
        }
    }
}

impl RedisConfig {
    /// Store events in the stream `{namespace}:events`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Trim the stream to about `max_len` entries on each publish; `None` never trims.
    pub fn max_len(mut self, max_len: Option<usize>) -> Self {
        self.max_len = max_len;
        self
    }

    /// Trim to exactly `max_len` entries (`true`) or about it (`false`, the default).
    pub fn exact_trim(mut self, exact: bool) -> Self {
        self.exact_trim = exact;
        self
    }

    /// Claim entries pending for longer than `idle`, for every subscription.
    pub fn claim_idle(mut self, idle: Duration) -> Self {
        self.claim_idle = Some(idle);
        self
    }

    /// Set the longest wait of one `XREADGROUP`.
    pub fn block(mut self, block: Duration) -> Self {
        self.block = block;
        self
    }

    /// Set how long a publish waits for its `XADD` replies.
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// Set the timeout of each connection attempt.
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Set where new consumer groups start.
    pub fn group_start(mut self, start: GroupStart) -> Self {
        self.group_start = start;
        self
    }

    /// The stream storing the namespace's events: `{namespace}:events`.
    pub fn stream_key(&self) -> String {
        format!("{}:events", self.namespace)
    }

    /// Timeout of commands other than publishes.
    fn command_timeout(&self) -> Duration {
        COMMAND_TIMEOUT.max(self.publish_timeout)
    }
}

fn validate_config(config: &RedisConfig) -> Result<(), TransportError> {
    let problem = if config.namespace.is_empty() {
        Some("the namespace must not be empty".to_owned())
    } else if config.max_len == Some(0) {
        Some("`max_len` must be at least 1 (or `None` to never trim)".to_owned())
    } else if config.block < Duration::from_millis(1) {
        Some(format!(
            "`block` must be at least 1 ms, got {:?}",
            config.block
        ))
    } else if config.publish_timeout.is_zero() {
        Some("`publish_timeout` must not be zero".to_owned())
    } else if config.connection_timeout.is_zero() {
        Some("`connection_timeout` must not be zero".to_owned())
    } else {
        match config.claim_idle {
            Some(idle) if idle < Duration::from_millis(1) => {
                Some(format!("`claim_idle` must be at least 1 ms, got {idle:?}"))
            }
            _ => None,
        }
    };
    match problem {
        Some(problem) => Err(TransportError::new(TRANSPORT, problem)),
        None => Ok(()),
    }
}

/// Builds a [`RedisTransport`] that opens its own connections. Created by
/// [`RedisTransport::builder`].
#[derive(Debug, Clone)]
pub struct RedisTransportBuilder {
    url: String,
    config: RedisConfig,
}

impl RedisTransportBuilder {
    delegate_setters! {
        /// Store events in `{namespace}:events`. Default `outbox`.
        namespace: impl Into<String>;
        /// Trim the stream to about `max_len` entries; `None` never trims. Default 1,000,000.
        max_len: Option<usize>;
        /// Trim exactly instead of approximately. Default approximately.
        exact_trim: bool;
        /// Claim entries pending longer than `idle`. Default: each subscription's `ack_wait`.
        claim_idle: Duration;
        /// Longest wait of one `XREADGROUP`. Default 1 s.
        block: Duration;
        /// How long a publish waits for its `XADD` replies. Default 10 s.
        publish_timeout: Duration;
        /// Timeout of each connection attempt. Default 5 s.
        connection_timeout: Duration;
        /// Where new consumer groups start. Default the earliest retained entry.
        group_start: GroupStart;
    }

    /// Replace every setting at once.
    pub fn config(mut self, config: RedisConfig) -> Self {
        self.config = config;
        self
    }

    /// Connect to the server.
    ///
    /// The initial connection is tried once (a server that is down is an error, not a hang);
    /// once connected, the transport reconnects on its own after a connection loss.
    pub async fn connect(self) -> Result<RedisTransport, TransportError> {
        let client = Client::open(self.url.as_str())
            .map_err(|err| TransportError::new(TRANSPORT, format!("invalid Redis URL: {err}")))?;
        RedisTransport::from_client(client, self.config).await
    }
}

/// The Redis Streams transport. Cheap to clone: clones share the connections.
#[derive(Clone)]
pub struct RedisTransport {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    manager: ConnectionManager,
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
        let manager = ConnectionManager::new_with_config(client.clone(), manager_config)
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
                client,
                manager,
                config,
                stream_key,
                server,
            }),
        })
    }

    /// The publishing connection (it reconnects on its own), for inspecting the stream and its
    /// groups.
    pub fn connection(&self) -> ConnectionManager {
        self.inner.manager.clone()
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

    /// The routing name of an event type, reported as [`Delivery::subject`]:
    /// `{namespace}.{event_type}`.
    pub fn subject(&self, event_type: &str) -> String {
        routing_name(&self.inner.config.namespace, event_type)
    }

    /// Runs `cmd` on the publishing connection within the command timeout.
    async fn command(&self, cmd: &Cmd) -> Result<Value, Failure> {
        let timeout = self.inner.config.command_timeout();
        let mut conn = self.inner.manager.clone();
        match tokio::time::timeout(timeout, cmd.query_async::<Value>(&mut conn)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(Failure::from_redis(err)),
            Err(_elapsed) => Err(Failure::Connection(format!("no reply within {timeout:?}"))),
        }
    }

    /// The `XADD` of one message.
    fn xadd(&self, message: &OutgoingMessage) -> Cmd {
        let mut cmd = ::redis::cmd("XADD");
        cmd.arg(&self.inner.stream_key);
        if let Some(max_len) = self.inner.config.max_len {
            let mode = if self.inner.config.exact_trim {
                "="
            } else {
                "~"
            };
            cmd.arg("MAXLEN").arg(mode).arg(max_len);
        }
        cmd.arg("*")
            .arg("id")
            .arg(message.event_id.to_string())
            .arg("type")
            .arg(&message.event_type)
            .arg("aggregate")
            .arg(format!(
                "{}/{}",
                message.aggregate_type, message.aggregate_id
            ))
            .arg("content-type")
            .arg(CONTENT_TYPE)
            .arg("body")
            .arg(message.body.as_ref());
        cmd
    }

    /// A per-message error for a server error reply to an `XADD`.
    fn rejected(&self, code: &str, detail: impl fmt::Display) -> PublishError {
        let key = &self.inner.stream_key;
        match code {
            "WRONGTYPE" => PublishError::Rejected(format!(
                "key `{key}` holds a value that is not a stream ({detail}); delete it or use \
                 another namespace"
            )),
            "OOM" => PublishError::Rejected(format!(
                "Redis is out of memory (maxmemory reached) and refused `XADD` to `{key}`: \
                 {detail}"
            )),
            _ => PublishError::Rejected(format!("Redis refused `XADD` to `{key}`: {detail}")),
        }
    }

    /// Sends one pipeline and maps every reply.
    async fn publish_chunk(
        &self,
        messages: &[OutgoingMessage],
        members: &[usize],
        results: &mut [Option<Result<(), PublishError>>],
    ) -> Option<PublishError> {
        let mut pipe = ::redis::pipe();
        pipe.ignore_errors();
        for &index in members {
            pipe.add_command(self.xadd(&messages[index]));
        }
        let timeout = self.inner.config.publish_timeout;
        let mut conn = self.inner.manager.clone();
        let replies =
            match tokio::time::timeout(timeout, pipe.query_async::<Vec<Value>>(&mut conn)).await {
                Ok(Ok(replies)) => replies,
                Ok(Err(err)) => {
                    let error = self.map_publish_error(err);
                    for &index in members {
                        results[index] = Some(Err(error.clone()));
                    }
                    return Some(error);
                }
                Err(_elapsed) => {
                    let error = PublishError::Timeout(timeout);
                    for &index in members {
                        results[index] = Some(Err(error.clone()));
                    }
                    return Some(error);
                }
            };
        if replies.len() != members.len() {
            let error = PublishError::Connection(format!(
                "expected {} `XADD` replies, got {}",
                members.len(),
                replies.len()
            ));
            for &index in members {
                results[index] = Some(Err(error.clone()));
            }
            return Some(error);
        }
        for (&index, reply) in members.iter().zip(replies) {
            results[index] = Some(match reply {
                // The entry id: stored.
                Value::BulkString(_) | Value::SimpleString(_) => Ok(()),
                Value::ServerError(err) => Err(self.rejected(err.code(), &err)),
                other => Err(PublishError::Rejected(format!(
                    "unexpected `XADD` reply: {other:?}"
                ))),
            });
        }
        None
    }

    fn map_publish_error(&self, err: RedisError) -> PublishError {
        if err.is_timeout() {
            PublishError::Timeout(self.inner.config.publish_timeout)
        } else if is_connection_error(&err) {
            PublishError::Connection(format!("publish to `{}`: {err}", self.inner.server))
        } else if let Some(code) = err.code() {
            let code = code.to_owned();
            self.rejected(&code, err)
        } else {
            PublishError::Rejected(format!("publish to `{}`: {err}", self.inner.stream_key))
        }
    }

    /// `XGROUP CREATE key group <start> MKSTREAM`; an existing group is kept as it is.
    async fn create_group(&self, group: &str) -> Result<(), TransportError> {
        let key = &self.inner.stream_key;
        let mut cmd = ::redis::cmd("XGROUP");
        cmd.arg("CREATE")
            .arg(key)
            .arg(group)
            .arg(self.inner.config.group_start.id())
            .arg("MKSTREAM");
        match self.command(&cmd).await {
            Ok(_) => {
                tracing::info!(
                    stream = %key,
                    group,
                    start = ?self.inner.config.group_start,
                    "created the consumer group"
                );
                Ok(())
            }
            Err(Failure::Server { code, .. }) if code == "BUSYGROUP" => Ok(()),
            Err(Failure::Server { code, message }) if code == "WRONGTYPE" => {
                Err(TransportError::new(
                    TRANSPORT,
                    format!(
                        "cannot create consumer group `{group}`: key `{key}` holds a value that \
                         is not a stream ({message}); delete it or use another namespace"
                    ),
                ))
            }
            Err(failure) => Err(TransportError::new(
                TRANSPORT,
                format!("cannot create consumer group `{group}` on stream `{key}`: {failure}"),
            )),
        }
    }
}

#[async_trait::async_trait]
impl Transport for RedisTransport {
    fn name(&self) -> &'static str {
        TRANSPORT
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
        let mut results: Vec<Option<Result<(), PublishError>>> = vec![None; messages.len()];
        let mut failed: Option<PublishError> = None;
        let mut index = 0;
        while index < messages.len() {
            let mut members = Vec::new();
            let mut bytes = 0;
            while index < messages.len() && members.len() < PUBLISH_CHUNK_MESSAGES {
                let message = &messages[index];
                if let Some(error) = &failed {
                    results[index] = Some(Err(error.clone()));
                } else if message.body.len() > MAX_BODY_BYTES {
                    results[index] = Some(Err(PublishError::Permanent(format!(
                        "event `{}` ({}) is {} bytes, over Redis' 512 MiB argument limit",
                        message.event_id,
                        message.event_type,
                        message.body.len()
                    ))));
                } else if !members.is_empty() && bytes + message.body.len() > PUBLISH_CHUNK_BYTES {
                    break;
                } else {
                    bytes += message.body.len();
                    members.push(index);
                }
                index += 1;
            }
            if members.is_empty() {
                continue;
            }
            if let Some(error) = self.publish_chunk(messages, &members, &mut results).await {
                failed = Some(error);
            }
        }
        results
            .into_iter()
            .map(|result| {
                result.unwrap_or_else(|| {
                    Err(PublishError::Rejected(
                        "internal error: no publish result".into(),
                    ))
                })
            })
            .collect()
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
        if consumer.is_empty() {
            return Err(TransportError::new(
                TRANSPORT,
                "the consumer name must not be empty",
            ));
        }
        let types: HashSet<String> = event_types.iter().cloned().collect();
        if types.is_empty() {
            return Err(TransportError::new(
                TRANSPORT,
                format!("consumer `{consumer}` subscribes to no event type"),
            ));
        }
        let claim_idle = self
            .inner
            .config
            .claim_idle
            .unwrap_or(options.ack_wait)
            .max(Duration::from_millis(1));
        self.create_group(consumer).await?;
        let member = member_name();
        let conn = open_read_connection(&self.inner.client, &self.inner.config, &member)
            .await
            .map_err(|err| {
                TransportError::new(
                    TRANSPORT,
                    format!(
                        "cannot open a reading connection to Redis at `{}`: {err}",
                        self.inner.server
                    ),
                )
            })?;
        let block = self.inner.config.block;
        let sweep_interval = (claim_idle / 4).max(MIN_SWEEP_INTERVAL).min(block);
        let now = Instant::now();
        tracing::debug!(
            stream = %self.inner.stream_key,
            group = consumer,
            consumer = %member,
            event_types = ?types,
            ?claim_idle,
            "subscribed"
        );
        Ok(Box::new(RedisSubscription {
            transport: self.clone(),
            ids: Arc::new(Ids {
                key: self.inner.stream_key.clone(),
                group: consumer.to_owned(),
                consumer: member,
            }),
            types,
            claim_idle,
            max_in_flight: options.max_in_flight.max(1),
            sweep_interval,
            conn: Some(conn),
            reread_from: None,
            buffer: VecDeque::new(),
            to_ack: Vec::new(),
            held: Arc::new(Held::default()),
            claim_cursor: "0-0".to_owned(),
            next_sweep: now,
            next_janitor: now + JANITOR_INTERVAL.mul_f64(fastrand::f64()),
            retry_at: None,
            retry_delay: MIN_RETRY_DELAY,
        }))
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

/// Why a command failed, as far as a subscription cares.
#[derive(Debug)]
enum Failure {
    /// The connection is lost or silent: reconnect.
    Connection(String),
    /// The server answered with an error.
    Server { code: String, message: String },
    /// Anything else (a reply that cannot be parsed, a client-side error).
    Other(String),
}

impl Failure {
    fn from_redis(err: RedisError) -> Self {
        if is_connection_error(&err) {
            Failure::Connection(err.to_string())
        } else if let Some(code) = err.code() {
            Failure::Server {
                code: code.to_owned(),
                message: err.to_string(),
            }
        } else {
            Failure::Other(err.to_string())
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Connection(message) => write!(f, "connection lost: {message}"),
            Failure::Server { message, .. } => write!(f, "{message}"),
            Failure::Other(message) => write!(f, "{message}"),
        }
    }
}

fn is_connection_error(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || err.is_unrecoverable_error()
}

/// One connection attempt, bounded by `timeout`.
async fn open_connection(
    client: &Client,
    timeout: Duration,
) -> Result<MultiplexedConnection, String> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(None);
    // The client's own timeout covers the TCP connect and the handshake; this one is a backstop.
    match tokio::time::timeout(
        timeout + Duration::from_secs(1),
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_elapsed) => Err(format!("no connection within {timeout:?}")),
    }
}

/// A subscription's reading connection, named `outbox:{member}` in `CLIENT LIST`.
async fn open_read_connection(
    client: &Client,
    config: &RedisConfig,
    member: &str,
) -> Result<MultiplexedConnection, String> {
    let mut conn = open_connection(client, config.connection_timeout).await?;
    let mut cmd = ::redis::cmd("CLIENT");
    cmd.arg("SETNAME").arg(format!("outbox:{member}"));
    match tokio::time::timeout(
        config.command_timeout(),
        cmd.query_async::<Value>(&mut conn),
    )
    .await
    {
        Ok(Ok(_)) => {}
        // A name is a convenience for operators; a server refusing it is no reason to fail.
        Ok(Err(err)) => tracing::debug!(error = %err, "CLIENT SETNAME refused"),
        Err(_elapsed) => return Err("no reply to CLIENT SETNAME".to_owned()),
    }
    Ok(conn)
}

/// A Redis consumer name unique to one subscription: `{host}-{pid}-{random}`.
fn member_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::env::var("COMPUTERNAME").ok())
        .unwrap_or_default();
    let host: String = host
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    let host = if host.is_empty() { "host" } else { &host };
    format!("{host}-{}-{:08x}", std::process::id(), fastrand::u32(..))
}

/// Stream, group and Redis consumer of one subscription.
#[derive(Debug)]
struct Ids {
    key: String,
    group: String,
    consumer: String,
}

/// Entry ids a subscription read and has not settled yet (buffered or handed out).
#[derive(Debug, Default)]
struct Held {
    ids: Mutex<HashSet<String>>,
    /// Signalled when an entry is settled or dropped: there is room for another.
    settled: Notify,
}

impl Held {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.ids.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    fn contains(&self, id: &str) -> bool {
        self.lock().contains(id)
    }

    fn insert(&self, id: &str) {
        self.lock().insert(id.to_owned());
    }

    fn release(&self, id: &str) {
        let removed = self.lock().remove(id);
        if removed {
            self.settled.notify_one();
        }
    }
}

/// A stream entry as read.
#[derive(Debug)]
struct Entry {
    id: String,
    /// `None` when the entry is still pending but no longer in the stream (trimmed or deleted).
    fields: Option<Fields>,
}

#[derive(Debug)]
struct Fields {
    event_id: Option<String>,
    event_type: Option<String>,
    body: Bytes,
}

/// An entry ready to be handed out.
#[derive(Debug)]
struct Ready {
    id: String,
    fields: Fields,
    delivery_count: u32,
}

/// The deliveries of one Redis consumer in a consumer group.
struct RedisSubscription {
    transport: RedisTransport,
    ids: Arc<Ids>,
    types: HashSet<String>,
    claim_idle: Duration,
    max_in_flight: usize,
    sweep_interval: Duration,
    /// The reading connection; `None` after it failed.
    conn: Option<MultiplexedConnection>,
    /// After a reconnection: re-read this consumer's own pending entries from this id on.
    reread_from: Option<String>,
    buffer: VecDeque<Ready>,
    /// Entries of types this subscription does not want, to acknowledge.
    to_ack: Vec<String>,
    held: Arc<Held>,
    claim_cursor: String,
    next_sweep: Instant,
    next_janitor: Instant,
    /// When the next attempt may run after an error.
    retry_at: Option<Instant>,
    retry_delay: Duration,
}

impl fmt::Debug for RedisSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSubscription")
            .field("stream", &self.ids.key)
            .field("group", &self.ids.group)
            .field("consumer", &self.ids.consumer)
            .field("event_types", &self.types)
            .field("claim_idle", &self.claim_idle)
            .field("connected", &self.conn.is_some())
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl Subscription for RedisSubscription {
    /// Never returns `None`: errors (Redis unreachable, the key replaced by another type) are
    /// reported and the next call tries again after a backoff.
    async fn next(&mut self) -> Option<Result<Delivery, TransportError>> {
        loop {
            if let Some(ready) = self.buffer.pop_front() {
                return Some(Ok(self.delivery(ready)));
            }
            if let Some(at) = self.retry_at.take() {
                tokio::time::sleep_until(at).await;
            }
            match self.step().await {
                Ok(()) => self.retry_delay = MIN_RETRY_DELAY,
                Err(err) => {
                    self.retry_at = Some(Instant::now() + self.retry_delay);
                    self.retry_delay = (self.retry_delay * 2).min(MAX_RETRY_DELAY);
                    return Some(Err(err));
                }
            }
        }
    }
}

impl Drop for RedisSubscription {
    fn drop(&mut self) {
        // Remove this Redis consumer from the group when nothing is left pending for it; entries
        // still pending keep it until they are claimed (the janitor removes it later).
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut conn = self.transport.inner.manager.clone();
        let ids = self.ids.clone();
        let timeout = self.transport.inner.config.command_timeout();
        runtime.spawn(async move {
            let _ =
                tokio::time::timeout(timeout, delete_if_idle(&mut conn, &ids, &ids.consumer)).await;
        });
    }
}

/// Runs [`DELETE_IDLE_CONSUMER`] for `consumer`; `Ok(true)` when it was removed.
async fn delete_if_idle(
    conn: &mut ConnectionManager,
    ids: &Ids,
    consumer: &str,
) -> Result<bool, RedisError> {
    let mut cmd = ::redis::cmd("EVAL");
    cmd.arg(DELETE_IDLE_CONSUMER)
        .arg(1)
        .arg(&ids.key)
        .arg(&ids.group)
        .arg(consumer);
    let removed = cmd.query_async::<i64>(conn).await? == 0;
    if removed {
        tracing::debug!(stream = %ids.key, group = %ids.group, consumer, "removed an idle consumer");
    }
    Ok(removed)
}

impl RedisSubscription {
    fn delivery(&self, ready: Ready) -> Delivery {
        let subject = match &ready.fields.event_type {
            Some(event_type) => self.transport.subject(event_type),
            None => self.ids.key.clone(),
        };
        let acker = RedisAcker {
            conn: self.transport.inner.manager.clone(),
            ids: self.ids.clone(),
            entry_id: ready.id,
            claim_idle: self.claim_idle,
            timeout: self.transport.inner.config.command_timeout(),
            held: self.held.clone(),
        };
        Delivery::new(
            ready.fields.body,
            subject,
            ready.fields.event_id,
            ready.delivery_count,
            Box::new(acker),
        )
    }

    fn error(&self, what: &str, failure: impl fmt::Display) -> TransportError {
        TransportError::new(
            TRANSPORT,
            format!(
                "{what} (stream `{}`, group `{}`, consumer `{}`): {failure}",
                self.ids.key, self.ids.group, self.ids.consumer
            ),
        )
    }

    /// One round of work: reconnect if needed, then claim, re-read or read.
    async fn step(&mut self) -> Result<(), TransportError> {
        if self.conn.is_none() {
            self.reconnect().await?;
        }
        match self.exchange().await {
            Ok(()) => Ok(()),
            Err(Failure::Connection(message)) => {
                tracing::warn!(
                    stream = %self.ids.key,
                    group = %self.ids.group,
                    consumer = %self.ids.consumer,
                    error = %message,
                    "lost the reading connection; reconnecting"
                );
                self.conn = None;
                self.reconnect().await
            }
            Err(Failure::Server { code, .. }) if code == "NOGROUP" => {
                // The stream or the group was deleted: recreate it and go on.
                tracing::warn!(
                    stream = %self.ids.key,
                    group = %self.ids.group,
                    "the consumer group disappeared (stream or group deleted); recreating it"
                );
                self.transport.create_group(&self.ids.group).await
            }
            Err(Failure::Server { code, message })
                if code == "ERR" && message.contains("unknown command") =>
            {
                Err(self.error(
                    "Redis does not know a stream command (XAUTOCLAIM needs Redis 6.2 or newer)",
                    message,
                ))
            }
            Err(failure) => Err(self.error("reading from the stream failed", failure)),
        }
    }

    async fn reconnect(&mut self) -> Result<(), TransportError> {
        let inner = &self.transport.inner;
        let conn = open_read_connection(&inner.client, &inner.config, &self.ids.consumer)
            .await
            .map_err(|err| {
                self.error(
                    &format!("cannot reconnect to Redis at `{}`", inner.server),
                    err,
                )
            })?;
        tracing::info!(
            stream = %self.ids.key,
            group = %self.ids.group,
            consumer = %self.ids.consumer,
            "reading connection re-established; re-reading own pending entries"
        );
        self.conn = Some(conn);
        self.reread_from = Some("0".to_owned());
        Ok(())
    }

    /// Runs `cmd` on the reading connection within `timeout`.
    async fn query(&mut self, cmd: &Cmd, timeout: Duration) -> Result<Value, Failure> {
        let Some(conn) = self.conn.as_mut() else {
            return Err(Failure::Connection("not connected".to_owned()));
        };
        match tokio::time::timeout(timeout, cmd.query_async::<Value>(conn)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(Failure::from_redis(err)),
            Err(_elapsed) => Err(Failure::Connection(format!("no reply within {timeout:?}"))),
        }
    }

    fn command_timeout(&self) -> Duration {
        self.transport.inner.config.command_timeout()
    }

    async fn exchange(&mut self) -> Result<(), Failure> {
        self.flush_skipped().await?;
        let notified = self.held.settled.notified();
        let room = self.max_in_flight.saturating_sub(self.held.len());
        if room == 0 {
            // Wait for a delivery to be settled; wake up anyway to keep sweeping.
            let block = self.transport.inner.config.block;
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(block) => {}
            }
            return Ok(());
        }
        drop(notified);
        let count = room.min(MAX_READ_BATCH);
        let now = Instant::now();
        if now >= self.next_janitor {
            self.next_janitor = now + JANITOR_INTERVAL;
            self.remove_idle_consumers().await;
        }
        if now >= self.next_sweep {
            self.next_sweep = now + self.sweep_interval;
            self.sweep(count).await?;
            if !self.buffer.is_empty() {
                return Ok(());
            }
        }
        if let Some(from) = self.reread_from.clone() {
            return self.reread(&from, count).await;
        }
        self.read_new(count).await
    }

    /// Acknowledges the entries of other event types.
    async fn flush_skipped(&mut self) -> Result<(), Failure> {
        if self.to_ack.is_empty() {
            return Ok(());
        }
        let mut cmd = ::redis::cmd("XACK");
        cmd.arg(&self.ids.key)
            .arg(&self.ids.group)
            .arg(&self.to_ack);
        self.query(&cmd, self.command_timeout()).await?;
        self.to_ack.clear();
        Ok(())
    }

    /// `XREADGROUP … >`: entries never delivered to the group.
    async fn read_new(&mut self, count: usize) -> Result<(), Failure> {
        let block = self
            .transport
            .inner
            .config
            .block
            .min(self.next_sweep.saturating_duration_since(Instant::now()))
            .max(Duration::from_millis(1));
        let mut cmd = ::redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.ids.group)
            .arg(&self.ids.consumer)
            .arg("COUNT")
            .arg(count)
            .arg("BLOCK")
            .arg(block.as_millis().max(1) as u64)
            .arg("STREAMS")
            .arg(&self.ids.key)
            .arg(">");
        let reply = self.query(&cmd, block + self.command_timeout()).await?;
        let entries = parse_read_reply(reply).map_err(Failure::Other)?;
        let ready = entries
            .into_iter()
            .filter_map(|entry| self.triage(entry))
            .map(|(id, fields)| Ready {
                id,
                fields,
                delivery_count: 1,
            })
            .collect();
        self.accept(ready);
        self.flush_skipped().await
    }

    /// `XREADGROUP … <from>`: this consumer's own pending entries, after a reconnection.
    async fn reread(&mut self, from: &str, count: usize) -> Result<(), Failure> {
        let mut cmd = ::redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.ids.group)
            .arg(&self.ids.consumer)
            .arg("COUNT")
            .arg(count)
            .arg("STREAMS")
            .arg(&self.ids.key)
            .arg(from);
        let reply = self.query(&cmd, self.command_timeout()).await?;
        let entries = parse_read_reply(reply).map_err(Failure::Other)?;
        self.reread_from = match entries.last() {
            Some(last) if entries.len() >= count => Some(last.id.clone()),
            _ => None,
        };
        let mut lost = Vec::new();
        let mut wanted = Vec::new();
        for entry in entries {
            if self.held.contains(&entry.id) {
                // Handed out before the connection failed and not settled yet.
                continue;
            }
            if entry.fields.is_none() {
                lost.push(entry.id.clone());
            }
            if let Some(item) = self.triage(entry) {
                wanted.push(item);
            }
        }
        if !lost.is_empty() {
            tracing::warn!(
                stream = %self.ids.key,
                group = %self.ids.group,
                count = lost.len(),
                "pending entries were trimmed or deleted from the stream before being \
                 acknowledged: they are lost for this group (raise `max_len`?)"
            );
        }
        let ready = self.with_delivery_counts(wanted).await?;
        self.accept(ready);
        self.flush_skipped().await
    }

    /// `XAUTOCLAIM`: entries pending longer than `claim_idle`, in this group, for any consumer.
    async fn sweep(&mut self, count: usize) -> Result<(), Failure> {
        let mut cmd = ::redis::cmd("XAUTOCLAIM");
        cmd.arg(&self.ids.key)
            .arg(&self.ids.group)
            .arg(&self.ids.consumer)
            .arg(self.claim_idle.as_millis().max(1) as u64)
            .arg(&self.claim_cursor)
            .arg("COUNT")
            .arg(count);
        let reply = self.query(&cmd, self.command_timeout()).await?;
        let (cursor, entries, deleted) = parse_autoclaim_reply(reply).map_err(Failure::Other)?;
        self.claim_cursor = cursor;
        if !deleted.is_empty() {
            tracing::warn!(
                stream = %self.ids.key,
                group = %self.ids.group,
                count = deleted.len(),
                "pending entries were trimmed or deleted from the stream before being \
                 acknowledged: they are lost for this group (raise `max_len`?)"
            );
        }
        let mut wanted = Vec::new();
        for entry in entries {
            if self.held.contains(&entry.id) {
                // Still held by this subscription: the claim just renewed it.
                continue;
            }
            if let Some(item) = self.triage(entry) {
                wanted.push(item);
            }
        }
        if !wanted.is_empty() {
            tracing::debug!(
                stream = %self.ids.key,
                group = %self.ids.group,
                consumer = %self.ids.consumer,
                count = wanted.len(),
                "claimed pending entries for redelivery"
            );
        }
        let ready = self.with_delivery_counts(wanted).await?;
        self.accept(ready);
        self.flush_skipped().await
    }

    /// Keeps entries of subscribed types (or without a type, which cannot be filtered), queues
    /// the others for acknowledgement.
    fn triage(&mut self, entry: Entry) -> Option<(String, Fields)> {
        let Some(fields) = entry.fields else {
            // Pending but gone from the stream: nothing to deliver, settle it.
            self.to_ack.push(entry.id);
            return None;
        };
        match &fields.event_type {
            Some(event_type) if !self.types.contains(event_type) => {
                self.to_ack.push(entry.id);
                None
            }
            _ => Some((entry.id, fields)),
        }
    }

    /// Looks up how often each entry was delivered (`XPENDING key group id id 1`, pipelined);
    /// entries no longer pending for this consumer (acknowledged or claimed by another one
    /// meanwhile) are left out.
    async fn with_delivery_counts(
        &mut self,
        entries: Vec<(String, Fields)>,
    ) -> Result<Vec<Ready>, Failure> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = ::redis::pipe();
        for (id, _) in &entries {
            pipe.cmd("XPENDING")
                .arg(&self.ids.key)
                .arg(&self.ids.group)
                .arg(id)
                .arg(id)
                .arg(1);
        }
        let timeout = self.command_timeout();
        let Some(conn) = self.conn.as_mut() else {
            return Err(Failure::Connection("not connected".to_owned()));
        };
        let replies =
            match tokio::time::timeout(timeout, pipe.query_async::<Vec<Value>>(conn)).await {
                Ok(Ok(replies)) => replies,
                Ok(Err(err)) => return Err(Failure::from_redis(err)),
                Err(_elapsed) => {
                    return Err(Failure::Connection(format!("no reply within {timeout:?}")));
                }
            };
        let mut ready = Vec::with_capacity(entries.len());
        for ((id, fields), reply) in entries.into_iter().zip(replies) {
            match parse_pending_entry(reply) {
                Some((owner, count)) if owner == self.ids.consumer => ready.push(Ready {
                    id,
                    fields,
                    delivery_count: count.max(1),
                }),
                _ => {}
            }
        }
        Ok(ready)
    }

    fn accept(&mut self, ready: Vec<Ready>) {
        for item in ready {
            self.held.insert(&item.id);
            self.buffer.push_back(item);
        }
    }

    /// Removes consumers of the group that have nothing pending and have been idle for long;
    /// failures are only logged.
    async fn remove_idle_consumers(&mut self) {
        let min_idle = JANITOR_MIN_IDLE.max(self.claim_idle * 2);
        let mut cmd = ::redis::cmd("XINFO");
        cmd.arg("CONSUMERS").arg(&self.ids.key).arg(&self.ids.group);
        let reply = match self.query(&cmd, self.command_timeout()).await {
            Ok(reply) => reply,
            Err(failure) => {
                tracing::debug!(error = %failure, "cannot list the group's consumers");
                return;
            }
        };
        let mut conn = self.transport.inner.manager.clone();
        for (name, pending, idle) in parse_consumers(reply) {
            if name == self.ids.consumer || pending > 0 || idle < min_idle {
                continue;
            }
            let removal = delete_if_idle(&mut conn, &self.ids, &name);
            match tokio::time::timeout(self.command_timeout(), removal).await {
                Ok(Ok(_)) => {}
                Ok(Err(err)) => {
                    tracing::debug!(consumer = %name, error = %err, "cannot remove an idle consumer");
                    return;
                }
                Err(_elapsed) => return,
            }
        }
    }
}

/// Settles one entry: `XACK`, or a backdated `XCLAIM` for a nack.
struct RedisAcker {
    conn: ConnectionManager,
    ids: Arc<Ids>,
    entry_id: String,
    claim_idle: Duration,
    timeout: Duration,
    held: Arc<Held>,
}

impl RedisAcker {
    async fn run(&self, cmd: Cmd, what: &str) -> Result<Value, TransportError> {
        let mut conn = self.conn.clone();
        let error = |message: String| {
            TransportError::new(
                TRANSPORT,
                format!(
                    "{what} of entry `{}` (stream `{}`, group `{}`) failed: {message}",
                    self.entry_id, self.ids.key, self.ids.group
                ),
            )
        };
        match tokio::time::timeout(self.timeout, cmd.query_async::<Value>(&mut conn)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(error(err.to_string())),
            Err(_elapsed) => Err(error(format!("no reply within {:?}", self.timeout))),
        }
    }
}

#[async_trait::async_trait]
impl super::Acker for RedisAcker {
    /// `XACK`; returns once Redis replied. An entry that was no longer pending (acknowledged
    /// through a redelivered copy) is fine.
    async fn ack(&self) -> Result<(), TransportError> {
        let mut cmd = ::redis::cmd("XACK");
        cmd.arg(&self.ids.key)
            .arg(&self.ids.group)
            .arg(&self.entry_id);
        let acked = self.run(cmd, "ack").await?;
        if matches!(acked, Value::Int(0)) {
            tracing::debug!(
                entry = %self.entry_id,
                group = %self.ids.group,
                "acked an entry that was no longer pending"
            );
        }
        self.held.release(&self.entry_id);
        Ok(())
    }

    /// Keeps the entry pending and backdates its last delivery to `claim_idle - delay` ago
    /// (`XCLAIM … IDLE … JUSTID`, which leaves the delivery count alone), so a claim sweep
    /// delivers it again once `delay` has passed; at most `claim_idle`.
    async fn nack(&self, delay: Option<Duration>) -> Result<(), TransportError> {
        // Released first: this subscription's own sweep must not skip the entry as held.
        self.held.release(&self.entry_id);
        let idle = self.claim_idle.saturating_sub(delay.unwrap_or_default());
        let mut cmd = ::redis::cmd("XCLAIM");
        cmd.arg(&self.ids.key)
            .arg(&self.ids.group)
            .arg(&self.ids.consumer)
            .arg(0)
            .arg(&self.entry_id)
            .arg("IDLE")
            .arg(idle.as_millis() as u64)
            .arg("JUSTID");
        self.run(cmd, "nack").await.map(|_| ())
    }
}

impl Drop for RedisAcker {
    fn drop(&mut self) {
        // Settled or dropped unsettled: either way no longer held (a dropped one is claimed
        // again after `claim_idle`).
        self.held.release(&self.entry_id);
    }
}

/// A bulk or simple string reply as text.
fn value_to_string(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Okay => Some("OK".to_owned()),
        _ => None,
    }
}

fn value_to_u64(value: &Value) -> Option<u64> {
    match value {
        Value::Int(n) => u64::try_from(*n).ok(),
        other => value_to_string(other)?.parse().ok(),
    }
}

/// `[id, [field, value, …] | nil]`.
fn parse_entry(value: Value) -> Result<Entry, String> {
    let Value::Array(mut parts) = value else {
        return Err(format!("a stream entry is not an array: {value:?}"));
    };
    if parts.len() < 2 {
        return Err(format!("a stream entry has {} parts, not 2", parts.len()));
    }
    let raw_fields = parts.swap_remove(1);
    let id = value_to_string(&parts[0])
        .ok_or_else(|| format!("a stream entry id is not a string: {:?}", parts[0]))?;
    let pairs: Vec<(Value, Value)> = match raw_fields {
        Value::Nil => return Ok(Entry { id, fields: None }),
        Value::Array(items) => {
            let mut pairs = Vec::with_capacity(items.len() / 2);
            let mut items = items.into_iter();
            while let (Some(field), Some(value)) = (items.next(), items.next()) {
                pairs.push((field, value));
            }
            pairs
        }
        Value::Map(pairs) => pairs,
        other => {
            return Err(format!(
                "the fields of entry `{id}` are not an array: {other:?}"
            ));
        }
    };
    let mut fields = Fields {
        event_id: None,
        event_type: None,
        body: Bytes::new(),
    };
    for (field, value) in pairs {
        match value_to_string(&field).as_deref() {
            Some("id") => fields.event_id = value_to_string(&value),
            Some("type") => fields.event_type = value_to_string(&value),
            Some("body") => {
                fields.body = match value {
                    Value::BulkString(bytes) => Bytes::from(bytes),
                    Value::SimpleString(text) => Bytes::from(text),
                    _ => Bytes::new(),
                }
            }
            _ => {}
        }
    }
    Ok(Entry {
        id,
        fields: Some(fields),
    })
}

fn parse_entries(value: Value) -> Result<Vec<Entry>, String> {
    match value {
        Value::Nil => Ok(Vec::new()),
        Value::Array(items) => items
            .into_iter()
            // Redis 6.2 reports claimed entries that no longer exist as nil.
            .filter(|item| !matches!(item, Value::Nil))
            .map(parse_entry)
            .collect(),
        other => Err(format!("stream entries are not an array: {other:?}")),
    }
}

/// `XREADGROUP` reply: nil on timeout, else `[[key, entries]]` (RESP2) or `{key: entries}`
/// (RESP3), for our single key.
fn parse_read_reply(value: Value) -> Result<Vec<Entry>, String> {
    match value {
        Value::Nil => Ok(Vec::new()),
        Value::Array(streams) => {
            let mut entries = Vec::new();
            for stream in streams {
                let Value::Array(mut pair) = stream else {
                    return Err(format!("unexpected XREADGROUP reply: {stream:?}"));
                };
                if pair.len() != 2 {
                    return Err(format!("unexpected XREADGROUP reply: {pair:?}"));
                }
                entries.extend(parse_entries(pair.swap_remove(1))?);
            }
            Ok(entries)
        }
        Value::Map(streams) => {
            let mut entries = Vec::new();
            for (_key, value) in streams {
                entries.extend(parse_entries(value)?);
            }
            Ok(entries)
        }
        other => Err(format!("unexpected XREADGROUP reply: {other:?}")),
    }
}

/// `XAUTOCLAIM` reply: `[next cursor, entries, deleted ids]` (no deleted ids before Redis 7).
fn parse_autoclaim_reply(value: Value) -> Result<(String, Vec<Entry>, Vec<String>), String> {
    let Value::Array(parts) = value else {
        return Err(format!("unexpected XAUTOCLAIM reply: {value:?}"));
    };
    let mut parts = parts.into_iter();
    let (Some(cursor), Some(entries)) = (parts.next(), parts.next()) else {
        return Err("XAUTOCLAIM reply has fewer than 2 parts".to_owned());
    };
    let cursor =
        value_to_string(&cursor).ok_or_else(|| format!("XAUTOCLAIM cursor: {cursor:?}"))?;
    let entries = parse_entries(entries)?;
    let deleted = match parts.next() {
        Some(Value::Array(ids)) => ids.iter().filter_map(value_to_string).collect(),
        _ => Vec::new(),
    };
    Ok((cursor, entries, deleted))
}

/// `XPENDING key group id id 1` reply: `[[id, consumer, idle, count]]`, empty when the entry is
/// not pending. Returns the owner and the delivery count.
fn parse_pending_entry(value: Value) -> Option<(String, u32)> {
    let Value::Array(mut rows) = value else {
        return None;
    };
    if rows.is_empty() {
        return None;
    }
    let Value::Array(row) = rows.swap_remove(0) else {
        return None;
    };
    let owner = value_to_string(row.get(1)?)?;
    let count = value_to_u64(row.get(3)?)?;
    Some((owner, u32::try_from(count).unwrap_or(u32::MAX)))
}

/// `XINFO CONSUMERS` reply: name, pending count and idle time of each consumer.
fn parse_consumers(value: Value) -> Vec<(String, u64, Duration)> {
    let Value::Array(consumers) = value else {
        return Vec::new();
    };
    let mut parsed = Vec::new();
    for consumer in consumers {
        let pairs: Vec<(Value, Value)> = match consumer {
            Value::Map(pairs) => pairs,
            Value::Array(items) => {
                let mut pairs = Vec::with_capacity(items.len() / 2);
                let mut items = items.into_iter();
                while let (Some(field), Some(value)) = (items.next(), items.next()) {
                    pairs.push((field, value));
                }
                pairs
            }
            _ => continue,
        };
        let info: HashMap<String, Value> = pairs
            .into_iter()
            .filter_map(|(field, value)| Some((value_to_string(&field)?, value)))
            .collect();
        let (Some(name), Some(pending), Some(idle)) = (
            info.get("name").and_then(value_to_string),
            info.get("pending").and_then(value_to_u64),
            info.get("idle").and_then(value_to_u64),
        ) else {
            continue;
        };
        parsed.push((name, pending, Duration::from_millis(idle)));
    }
    parsed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn entry(id: &str, event_type: &str, body: &str) -> Value {
        Value::Array(vec![
            bulk(id),
            Value::Array(vec![
                bulk("id"),
                bulk("e-1"),
                bulk("type"),
                bulk(event_type),
                bulk("body"),
                bulk(body),
            ]),
        ])
    }

    #[test]
    fn the_stream_key_is_derived_from_the_namespace() {
        let config = RedisConfig::default();
        assert_eq!(config.stream_key(), "outbox:events");
        assert_eq!(config.max_len, Some(DEFAULT_MAX_LEN));
        assert_eq!(config.group_start, GroupStart::Earliest);
        assert_eq!(
            RedisConfig::default().namespace("shop").stream_key(),
            "shop:events"
        );
    }

    #[test]
    fn invalid_settings_are_refused() {
        assert!(validate_config(&RedisConfig::default()).is_ok());
        assert!(validate_config(&RedisConfig::default().namespace("")).is_err());
        assert!(validate_config(&RedisConfig::default().max_len(Some(0))).is_err());
        assert!(validate_config(&RedisConfig::default().max_len(None)).is_ok());
        assert!(validate_config(&RedisConfig::default().block(Duration::ZERO)).is_err());
        assert!(validate_config(&RedisConfig::default().claim_idle(Duration::ZERO)).is_err());
    }

    #[test]
    fn member_names_are_unique_and_readable() {
        let (a, b) = (member_name(), member_name());
        assert_ne!(a, b);
        assert!(a.contains(&format!("-{}-", std::process::id())), "{a}");
        assert!(!a.contains(' '));
    }

    #[test]
    fn read_replies_are_parsed() {
        assert!(parse_read_reply(Value::Nil).expect("nil").is_empty());
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("ns:events"),
            Value::Array(vec![
                entry("1-0", "order.placed", "{}"),
                Value::Array(vec![bulk("2-0"), Value::Nil]),
            ]),
        ])]);
        let entries = parse_read_reply(reply).expect("parsed");
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].id, "1-0");
        let fields = entries[0].fields.as_ref().expect("fields");
        assert_eq!(fields.event_type.as_deref(), Some("order.placed"));
        assert_eq!(fields.event_id.as_deref(), Some("e-1"));
        assert_eq!(fields.body, Bytes::from_static(b"{}"));
        assert!(entries[1].fields.is_none(), "a deleted entry has no fields");
    }

    #[test]
    fn autoclaim_and_pending_replies_are_parsed() {
        let reply = Value::Array(vec![
            bulk("0-0"),
            Value::Array(vec![entry("3-0", "t", "x"), Value::Nil]),
            Value::Array(vec![bulk("1-0")]),
        ]);
        let (cursor, entries, deleted) = parse_autoclaim_reply(reply).expect("parsed");
        assert_eq!(cursor, "0-0");
        assert_eq!(entries.len(), 1);
        assert_eq!(deleted, vec!["1-0".to_owned()]);

        let pending = Value::Array(vec![Value::Array(vec![
            bulk("3-0"),
            bulk("host-1-ab"),
            Value::Int(1200),
            Value::Int(3),
        ])]);
        assert_eq!(
            parse_pending_entry(pending),
            Some(("host-1-ab".to_owned(), 3))
        );
        assert_eq!(parse_pending_entry(Value::Array(Vec::new())), None);

        let consumers = Value::Array(vec![Value::Array(vec![
            bulk("name"),
            bulk("host-1-ab"),
            bulk("pending"),
            Value::Int(0),
            bulk("idle"),
            Value::Int(5_000),
        ])]);
        assert_eq!(
            parse_consumers(consumers),
            vec![("host-1-ab".to_owned(), 0, Duration::from_secs(5))]
        );
    }
}
