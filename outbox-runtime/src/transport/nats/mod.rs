//! NATS JetStream transport (feature `nats`).
//!
//! # Topology
//!
//! One stream per namespace stores every event: the stream `OUTBOX` (see
//! [`NatsConfig::stream_name`]) captures the subjects `outbox.>`, and an event of type
//! `order.placed` is published on `outbox.order.placed` ([`routing_name`]). [`setup`] creates the
//! stream, idempotently.
//!
//! # Publishing
//!
//! [`publish`] sends the whole batch without waiting, then awaits every JetStream `PubAck`: a
//! message is reported `Ok` only once the stream stored it. Each message carries its event id as
//! `Nats-Msg-Id`, so the server drops a republish of the same event inside the stream's duplicate
//! window (default two minutes) and still acknowledges it: a relay that crashed between the
//! broker's confirmation and marking the row `SENT` does not create a second copy.
//!
//! # On a cluster
//!
//! Give every server's URL, comma-separated, and keep the stream on three servers
//! ([`NatsConfig::replicas`]): when a server dies the client goes on through another, and when
//! it led the stream a publish waits out the election of the next leader (seconds) and sends its
//! messages again within its publish timeout ([`ELECTION_PATIENCE`]); the duplicate window drops
//! the copies the old leader did store. An election is neither the message's failure (no
//! attempt is counted) nor an outage (the relay's breaker stays closed).
//!
//! # Consuming
//!
//! [`subscribe`] binds a durable pull consumer named after the consumer group (see
//! [`durable_name`]) with explicit acks. Subscriptions with the same consumer name share the
//! consumer and therefore split the deliveries between them; different names each receive
//! everything.
//!
//! ```no_run
//! # async fn demo() -> Result<(), outbox_runtime::transport::TransportError> {
//! use std::time::Duration;
//! use outbox_runtime::transport::{Transport, nats::NatsTransport};
//!
//! let transport = NatsTransport::builder("nats://127.0.0.1:4222")
//!     .namespace("shop")
//!     .duplicate_window(Duration::from_secs(300))
//!     .connect()
//!     .await?;
//! transport.setup().await?;
//! assert_eq!(transport.stream_name(), "SHOP");
//! # Ok(())
//! # }
//! ```
//!
//! [`setup`]: Transport::setup
//! [`publish`]: Transport::publish
//! [`subscribe`]: Transport::subscribe

use std::{
    fmt,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use async_nats::{
    Client,
    connection::State,
    jetstream::{self, ErrorCode, context::GetStreamErrorKind},
};
use tokio::time::Instant;

use super::{
    OutgoingMessage, PublishError, SubscribeOptions, Subscription, Transport, TransportError,
    routing_name,
};

/// The `async-nats` version this transport is built on, re-exported so the versions of
/// [`NatsTransport::from_client`]'s client and of [`NatsTransport::jetstream`] cannot drift apart.
pub use async_nats;

const TRANSPORT: &str = "nats";

mod ack;
mod config;
mod publish;
mod stream;
mod subscription;

pub use config::{
    DEFAULT_CONNECTION_TIMEOUT, DEFAULT_DUPLICATE_WINDOW, DEFAULT_PING_INTERVAL,
    DEFAULT_PUBLISH_TIMEOUT, DEFAULT_PULL_HEARTBEAT, DEFAULT_REQUEST_TIMEOUT, NatsConfig,
    NatsTransportBuilder,
};
pub use publish::ELECTION_PATIENCE;
pub use subscription::durable_name;

use config::validate_config;
use publish::MAX_ACKS_IN_FLIGHT;

/// The NATS JetStream transport. Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct NatsTransport {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    jetstream: jetstream::Context,
    config: NatsConfig,
    stream_name: String,
    /// The stream is kept by a cluster (JetStream reports its leader): publishes watch for
    /// elections.
    clustered: AtomicBool,
    /// What JetStream last said of the stream's leader, and when.
    leader: std::sync::Mutex<Option<(Instant, Leadership)>>,
    /// Held while JetStream is asked, so that concurrent publishes ask once.
    asking: tokio::sync::Mutex<()>,
}

/// What JetStream says of the stream's leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Leadership {
    /// The server leading the stream.
    Leader(String),
    /// No leader (an election), or no answer from JetStream in time.
    NoLeader,
    /// A stream on a single server: no elections.
    Standalone,
    /// No such stream.
    Missing,
}

/// How long an answer about the stream's leader is reused: the confirmations of a batch that
/// waited out an election ask once.
const LEADERSHIP_REUSED_FOR: Duration = Duration::from_millis(250);

/// How long the question about the stream's leader may take.
const LEADERSHIP_QUESTION: Duration = Duration::from_secs(1);

impl fmt::Debug for NatsTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsTransport")
            .field("namespace", &self.inner.config.namespace)
            .field("stream", &self.inner.stream_name)
            .field("connection", &self.inner.client.connection_state())
            .finish()
    }
}

impl NatsTransport {
    /// Connect to `url` with the default settings (namespace `outbox`, stream `OUTBOX`).
    pub async fn connect(url: &str) -> Result<Self, TransportError> {
        Self::builder(url).connect().await
    }

    /// Configure a transport that connects to `url`: one server, or the servers of a cluster
    /// separated by commas (`nats://n1:4222,nats://n2:4222,nats://n3:4222`; see
    /// [`NatsTransportBuilder::connect`]).
    pub fn builder(url: impl Into<String>) -> NatsTransportBuilder {
        NatsTransportBuilder {
            url: url.into(),
            config: NatsConfig::default(),
        }
    }

    /// Use an existing connection, e.g. one opened with credentials or TLS.
    ///
    /// Fails when the namespace or the stream name cannot be used as NATS names.
    pub fn from_client(client: Client, config: NatsConfig) -> Result<Self, TransportError> {
        validate_config(&config)?;
        let jetstream = jetstream::ContextBuilder::new()
            .timeout(config.publish_timeout.max(config.request_timeout))
            .max_ack_inflight(MAX_ACKS_IN_FLIGHT)
            .backpressure_on_inflight(false)
            .build(client.clone());
        let stream_name = config.resolved_stream_name();
        let clustered = AtomicBool::new(config.replicas.is_some_and(|r| r > 1));
        Ok(NatsTransport {
            inner: Arc::new(Inner {
                client,
                jetstream,
                config,
                stream_name,
                clustered,
                leader: std::sync::Mutex::new(None),
                asking: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// Whether the stream is kept by a cluster, as far as the transport knows.
    pub(super) fn clustered(&self) -> bool {
        self.inner.clustered.load(Ordering::Relaxed)
    }

    /// Record whether the stream is kept by a cluster (from its info).
    pub(super) fn set_clustered(&self, clustered: bool) {
        self.inner.clustered.store(clustered, Ordering::Relaxed);
    }

    /// The server that led the stream at the last answer, without asking.
    pub(super) fn known_leader(&self) -> Option<String> {
        match &*self.inner.leader.lock().unwrap_or_else(|p| p.into_inner()) {
            Some((_, Leadership::Leader(leader))) => Some(leader.clone()),
            _ => None,
        }
    }

    /// Ask JetStream who leads the stream (an answer less than [`LEADERSHIP_REUSED_FOR`] old is
    /// reused).
    pub(super) async fn leadership(&self) -> Leadership {
        let _asking = self.inner.asking.lock().await;
        if let Some((asked, answer)) = &*self.inner.leader.lock().unwrap_or_else(|p| p.into_inner())
            && asked.elapsed() < LEADERSHIP_REUSED_FOR
        {
            return answer.clone();
        }
        let ask = self.inner.jetstream.get_stream(&self.inner.stream_name);
        let answer = match tokio::time::timeout(LEADERSHIP_QUESTION, ask).await {
            Ok(Ok(stream)) => match &stream.cached_info().cluster {
                Some(cluster) => {
                    self.set_clustered(true);
                    match cluster.leader.as_deref().filter(|l| !l.is_empty()) {
                        Some(leader) => Leadership::Leader(leader.to_owned()),
                        None => Leadership::NoLeader,
                    }
                }
                None => Leadership::Standalone,
            },
            Ok(Err(err)) => match err.kind() {
                GetStreamErrorKind::JetStream(api)
                    if api.error_code() == ErrorCode::STREAM_NOT_FOUND =>
                {
                    Leadership::Missing
                }
                _ => Leadership::NoLeader,
            },
            Err(_elapsed) => Leadership::NoLeader,
        };
        *self.inner.leader.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now(), answer.clone()));
        answer
    }

    /// The JetStream context, for inspecting streams and consumers.
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.inner.jetstream
    }

    /// The underlying connection.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The namespace events are routed under.
    pub fn namespace(&self) -> &str {
        &self.inner.config.namespace
    }

    /// The name of the stream storing the namespace's events.
    pub fn stream_name(&self) -> &str {
        &self.inner.stream_name
    }

    /// The settings in use.
    pub fn config(&self) -> &NatsConfig {
        &self.inner.config
    }

    /// The subject an event type is published on: `{namespace}.{event_type}`.
    pub fn subject(&self, event_type: &str) -> String {
        routing_name(&self.inner.config.namespace, event_type)
    }
}

#[async_trait::async_trait]
impl Transport for NatsTransport {
    fn name(&self) -> &'static str {
        TRANSPORT
    }

    fn routing(&self) -> Option<crate::transport::Routing> {
        Some(crate::transport::Routing::Nats {
            namespace: self.inner.config.namespace.clone(),
        })
    }

    /// Gets or creates the stream (`{namespace}.>`, duplicate window, storage, retention, max
    /// age). An existing stream of the same name must store exactly `{namespace}.>`; its
    /// duplicate window and max age are updated to the configuration.
    async fn setup(&self) -> Result<(), TransportError> {
        self.ensure_stream().await
    }

    /// Sends every message (up to 4,096 awaiting confirmation at a time), then awaits each
    /// `PubAck` within the publish timeout counted from its send. Errors: no `PubAck` in time →
    /// [`PublishError::Timeout`]; over the server's `max_payload` or the stream's maximum message
    /// size → [`PublishError::Permanent`]; lost connection → [`PublishError::Connection`];
    /// anything else the server refuses (no stream for the subject, limits) →
    /// [`PublishError::Rejected`].
    async fn publish(&self, messages: &[OutgoingMessage]) -> Vec<Result<(), PublishError>> {
        self.publish_all(messages).await
    }

    /// Binds the durable pull consumer [`durable_name`]`(consumer)` (explicit ack, deliver all,
    /// `ack_wait` and `max_ack_pending` from `options`) and starts pulling.
    ///
    /// With one event type the consumer filters on `{namespace}.{event_type}`. With several it
    /// filters on `{namespace}.>`, because nats-server before 2.10 supports only one filter
    /// subject per consumer, and the subscription acks and skips the deliveries of other types.
    /// All subscriptions under one consumer name should therefore list the same event types:
    /// one listing fewer acks away the messages another one wanted.
    async fn subscribe(
        &self,
        consumer: &str,
        event_types: &[String],
        options: &SubscribeOptions,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        self.open_subscription(consumer, event_types, options).await
    }

    /// A JetStream account-info request: the connection is up and JetStream answers.
    async fn health(&self) -> Result<(), TransportError> {
        let state = self.inner.client.connection_state();
        if state != State::Connected {
            return Err(TransportError::new(
                TRANSPORT,
                format!("not connected to the server ({state})"),
            ));
        }
        // `$JS.API.INFO`, read as plain JSON: `Context::query_account` cannot parse the answer
        // of nats-server 2.9.
        let timeout = self.inner.config.request_timeout;
        let empty = serde_json::json!({});
        let request = self
            .inner
            .jetstream
            .request::<_, _, serde_json::Value>("INFO", &empty);
        match tokio::time::timeout(timeout, request).await {
            Ok(Ok(answer)) => match answer.get("error") {
                None => Ok(()),
                Some(error) => Err(TransportError::new(
                    TRANSPORT,
                    format!("JetStream refused the account info request: {error}"),
                )),
            },
            Ok(Err(err)) => Err(TransportError::new(
                TRANSPORT,
                format!("JetStream does not answer: {err}"),
            )),
            Err(_elapsed) => Err(TransportError::new(
                TRANSPORT,
                format!("JetStream did not answer within {timeout:?}"),
            )),
        }
    }
}
