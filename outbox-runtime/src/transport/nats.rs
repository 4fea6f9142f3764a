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
    collections::{HashSet, VecDeque},
    fmt,
    sync::Arc,
    time::Duration,
};

use async_nats::{
    Client, ConnectOptions, HeaderMap,
    connection::State,
    header::NATS_MESSAGE_ID,
    jetstream::{
        self, AckKind, ErrorCode,
        consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull},
        context::{CreateStreamErrorKind, GetStreamErrorKind, PublishAckFuture, PublishErrorKind},
        message::PublishMessage,
        stream::{self, RetentionPolicy, StorageType},
    },
};
use futures_util::StreamExt;
use tokio::time::Instant;

use super::{
    DEFAULT_NAMESPACE, Delivery, OutgoingMessage, PublishError, SubscribeOptions, Subscription,
    Transport, TransportError, routing_name,
};

/// The `async-nats` version this transport is built on, re-exported so the versions of
/// [`NatsTransport::from_client`]'s client and of [`NatsTransport::jetstream`] cannot drift apart.
pub use async_nats;

const TRANSPORT: &str = "nats";

/// Default stream duplicate window: a republish with the same `Nats-Msg-Id` inside it is dropped.
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Default time to wait for a JetStream `PubAck`.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Default time to wait for the TCP connection and the server's handshake.
pub const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// Lower bound of the timeout of JetStream API requests (stream and consumer management, double
/// acks); the publish timeout raises it when longer.
const API_TIMEOUT: Duration = Duration::from_secs(10);

/// Publishes one [`Transport::publish`] call keeps awaiting a `PubAck` for at most; once reached,
/// it awaits the oldest before sending the next, so huge batches do not pile up in memory.
const PUBLISH_WINDOW: usize = 4_096;

/// Publishes awaiting a `PubAck` per connection, over all concurrent `publish` calls. Past it a
/// publish fails at once with [`PublishError::Rejected`] (to be retried) instead of waiting,
/// which could deadlock calls that each hold unawaited acknowledgements.
const MAX_ACKS_IN_FLIGHT: usize = 65_536;

/// Pull requests expire after this long and are renewed.
const PULL_EXPIRES: Duration = Duration::from_secs(30);

/// The server sends an idle heartbeat on a pending pull request this often; missing two of them
/// surfaces as an error from [`Subscription::next`].
const PULL_HEARTBEAT: Duration = Duration::from_secs(10);

/// Messages asked for in one pull request, at most (never more than `max_in_flight`).
const MAX_PULL_BATCH: usize = 256;

/// Settings of a [`NatsTransport`].
///
/// ```
/// use std::time::Duration;
/// use outbox_runtime::transport::nats::NatsConfig;
///
/// let config = NatsConfig::default()
///     .namespace("shop")
///     .publish_timeout(Duration::from_secs(5));
/// assert_eq!(config.resolved_stream_name(), "SHOP");
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NatsConfig {
    /// Subjects are `{namespace}.{event_type}`. Default [`DEFAULT_NAMESPACE`] (`outbox`).
    pub namespace: String,
    /// The stream storing the namespace's subjects; `None` derives it from the namespace (see
    /// [`resolved_stream_name`](Self::resolved_stream_name)).
    pub stream_name: Option<String>,
    /// The stream's duplicate window. Default [`DEFAULT_DUPLICATE_WINDOW`] (two minutes). With a
    /// shorter [`max_age`](Self::max_age) the window is shortened to it, as JetStream requires.
    pub duplicate_window: Duration,
    /// How long a publish waits for its `PubAck` before it is reported as
    /// [`PublishError::Timeout`]. Default [`DEFAULT_PUBLISH_TIMEOUT`] (10 s).
    pub publish_timeout: Duration,
    /// Messages older than this are removed from the stream; `None` keeps them (the default).
    pub max_age: Option<Duration>,
    /// The stream's retention policy. Default [`RetentionPolicy::Limits`].
    pub retention: RetentionPolicy,
    /// The stream's storage. Default [`StorageType::File`].
    pub storage: StorageType,
    /// Connection timeout used by [`NatsTransportBuilder::connect`]. Default
    /// [`DEFAULT_CONNECTION_TIMEOUT`] (5 s).
    pub connection_timeout: Duration,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            namespace: DEFAULT_NAMESPACE.to_owned(),
            stream_name: None,
            duplicate_window: DEFAULT_DUPLICATE_WINDOW,
            publish_timeout: DEFAULT_PUBLISH_TIMEOUT,
            max_age: None,
            retention: RetentionPolicy::Limits,
            storage: StorageType::File,
            connection_timeout: DEFAULT_CONNECTION_TIMEOUT,
        }
    }
}

impl NatsConfig {
    /// Route events under `namespace` (`{namespace}.{event_type}`).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Store events in the stream `name` instead of the one derived from the namespace.
    pub fn stream_name(mut self, name: impl Into<String>) -> Self {
        self.stream_name = Some(name.into());
        self
    }

    /// Set the stream's duplicate window.
    pub fn duplicate_window(mut self, window: Duration) -> Self {
        self.duplicate_window = window;
        self
    }

    /// Set how long a publish waits for its `PubAck`.
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// Remove messages older than `max_age` from the stream.
    pub fn max_age(mut self, max_age: Duration) -> Self {
        self.max_age = Some(max_age);
        self
    }

    /// Set the stream's retention policy.
    pub fn retention(mut self, retention: RetentionPolicy) -> Self {
        self.retention = retention;
        self
    }

    /// Set the stream's storage.
    pub fn storage(mut self, storage: StorageType) -> Self {
        self.storage = storage;
        self
    }

    /// Set the connection timeout.
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// The duplicate window the stream is given: [`duplicate_window`](Self::duplicate_window),
    /// at most [`max_age`](Self::max_age).
    pub fn effective_duplicate_window(&self) -> Duration {
        match self.max_age {
            Some(max_age) if !max_age.is_zero() => self.duplicate_window.min(max_age),
            _ => self.duplicate_window,
        }
    }

    /// The stream name in use: [`stream_name`](Self::stream_name) when set, otherwise the
    /// namespace upper-cased with every character other than ASCII letters, digits, `_` and `-`
    /// replaced by `_` (`outbox` → `OUTBOX`, `shop.eu` → `SHOP_EU`).
    pub fn resolved_stream_name(&self) -> String {
        match &self.stream_name {
            Some(name) => name.clone(),
            None => self
                .namespace
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                        c.to_ascii_uppercase()
                    } else {
                        '_'
                    }
                })
                .collect(),
        }
    }
}

/// Builds a [`NatsTransport`] that opens its own connection. Created by
/// [`NatsTransport::builder`].
#[derive(Debug, Clone)]
pub struct NatsTransportBuilder {
    url: String,
    config: NatsConfig,
}

impl NatsTransportBuilder {
    delegate_setters! {
        /// Route events under `namespace`. Default `outbox`.
        namespace: impl Into<String>;
        /// Use the stream `name`. Default: derived from the namespace (`OUTBOX`).
        stream_name: impl Into<String>;
        /// Set the stream's duplicate window. Default two minutes.
        duplicate_window: Duration;
        /// Set how long a publish waits for its `PubAck`. Default 10 s.
        publish_timeout: Duration;
        /// Remove messages older than `max_age` from the stream. Default: kept.
        max_age: Duration;
        /// Set the stream's retention policy. Default limits.
        retention: RetentionPolicy;
        /// Set the stream's storage. Default file.
        storage: StorageType;
        /// Fail the connection attempt after `timeout`. Default 5 s.
        connection_timeout: Duration;
    }

    /// Replace every setting at once.
    pub fn config(mut self, config: NatsConfig) -> Self {
        self.config = config;
        self
    }

    /// Connect to the server.
    ///
    /// The initial connection is tried once (a server that is down is an error, not a hang);
    /// once connected, the client reconnects on its own after a connection loss.
    pub async fn connect(self) -> Result<NatsTransport, TransportError> {
        validate_config(&self.config)?;
        let client = ConnectOptions::new()
            .name("outbox")
            .connection_timeout(self.config.connection_timeout)
            .connect(self.url.as_str())
            .await
            .map_err(|err| {
                TransportError::new(
                    TRANSPORT,
                    format!("cannot connect to NATS at `{}`: {err}", self.url),
                )
            })?;
        NatsTransport::from_client(client, self.config)
    }
}

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
}

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

    /// Configure a transport that connects to `url`.
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
            .timeout(config.publish_timeout.max(API_TIMEOUT))
            .max_ack_inflight(MAX_ACKS_IN_FLIGHT)
            .backpressure_on_inflight(false)
            .build(client.clone());
        let stream_name = config.resolved_stream_name();
        Ok(NatsTransport {
            inner: Arc::new(Inner {
                client,
                jetstream,
                config,
                stream_name,
            }),
        })
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

    fn stream_subject(&self) -> String {
        format!("{}.>", self.inner.config.namespace)
    }

    fn stream_config(&self) -> stream::Config {
        let config = &self.inner.config;
        stream::Config {
            name: self.inner.stream_name.clone(),
            description: Some(format!(
                "outbox events published under `{}.>`",
                config.namespace
            )),
            subjects: vec![self.stream_subject()],
            duplicate_window: config.effective_duplicate_window(),
            max_age: config.max_age.unwrap_or_default(),
            retention: config.retention,
            storage: config.storage,
            ..Default::default()
        }
    }

    /// Checks an existing stream against the configuration: fails when it stores other
    /// subjects, brings the duplicate window and max age in line when they differ.
    async fn reconcile_stream(&self, existing: stream::Config) -> Result<(), TransportError> {
        let wanted = self.stream_subject();
        if existing.subjects != [wanted.as_str()] {
            return Err(TransportError::new(
                TRANSPORT,
                format!(
                    "stream `{}` exists with subjects {:?}, not [\"{wanted}\"]: it belongs to \
                     something else; choose another stream name or namespace",
                    existing.name, existing.subjects
                ),
            ));
        }
        let config = &self.inner.config;
        let max_age = config.max_age.unwrap_or_default();
        let duplicate_window = config.effective_duplicate_window();
        if existing.storage != config.storage || existing.retention != config.retention {
            tracing::warn!(
                stream = %existing.name,
                existing_storage = ?existing.storage,
                existing_retention = ?existing.retention,
                wanted_storage = ?config.storage,
                wanted_retention = ?config.retention,
                "the stream's storage or retention differs from the configuration; \
                 JetStream cannot change them in place, keeping the stream as it is"
            );
        }
        if existing.duplicate_window != duplicate_window || existing.max_age != max_age {
            tracing::info!(
                stream = %existing.name,
                ?duplicate_window,
                ?max_age,
                "updating the stream's duplicate window and max age"
            );
            let name = existing.name.clone();
            let updated = stream::Config {
                duplicate_window,
                max_age,
                ..existing
            };
            self.inner
                .jetstream
                .update_stream(updated)
                .await
                .map_err(|err| {
                    TransportError::new(
                        TRANSPORT,
                        format!("cannot update the settings of stream `{name}`: {err}"),
                    )
                })?;
        }
        Ok(())
    }

    /// Sends one message; the `PubAck` future is returned without being awaited.
    async fn send_one(&self, message: &OutgoingMessage) -> Result<PublishAckFuture, PublishError> {
        let subject = self.subject(&message.event_type);
        if !is_valid_subject(&subject) {
            return Err(PublishError::Permanent(format!(
                "event type `{}` does not make a valid NATS subject (`{subject}`): \
                 tokens must be non-empty, without whitespace, `*` or `>`",
                message.event_type
            )));
        }
        let event_id = message.event_id.to_string();
        let mut headers = HeaderMap::new();
        headers.insert(NATS_MESSAGE_ID, event_id.as_str());
        headers.insert("Content-Type", "application/cloudevents+json");
        headers.insert("ce-specversion", "1.0");
        headers.insert("ce-id", event_id.as_str());
        headers.insert("ce-type", message.event_type.as_str());
        let publish = PublishMessage::build()
            .payload(message.body.clone())
            .headers(headers);
        let timeout = self.inner.config.publish_timeout;
        match tokio::time::timeout(
            timeout,
            self.inner.jetstream.send_publish(subject.clone(), publish),
        )
        .await
        {
            Ok(Ok(ack)) => Ok(ack),
            Ok(Err(err)) => Err(self.map_publish_error(&subject, err)),
            Err(_elapsed) => Err(PublishError::Timeout(timeout)),
        }
    }

    fn map_publish_error(
        &self,
        subject: &str,
        err: jetstream::context::PublishError,
    ) -> PublishError {
        match err.kind() {
            PublishErrorKind::TimedOut => PublishError::Timeout(self.inner.config.publish_timeout),
            // Checked by the client before sending, from the server's INFO: never retried.
            PublishErrorKind::MaxPayloadExceeded => PublishError::Permanent(format!(
                "message on `{subject}` is larger than the server's max_payload: {err} \
                 (CloudEvents envelope and headers included; raise max_payload on the server or \
                 keep payloads smaller)"
            )),
            PublishErrorKind::StreamNotFound => PublishError::Rejected(format!(
                "no JetStream stream stores `{subject}` (has `setup()` run for stream `{}`?): \
                 {err}",
                self.inner.stream_name
            )),
            PublishErrorKind::BrokenPipe => {
                PublishError::Connection(format!("publish on `{subject}`: {err}"))
            }
            PublishErrorKind::MaxAckPending => PublishError::Rejected(format!(
                "too many publishes awaiting confirmation on this connection: {err}"
            )),
            _ => {
                let api_error = std::error::Error::source(&err)
                    .and_then(|source| source.downcast_ref::<jetstream::Error>());
                match api_error {
                    Some(api) if api.error_code() == ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM => {
                        PublishError::Permanent(format!(
                            "message on `{subject}` exceeds the stream's maximum message size: \
                             {api}"
                        ))
                    }
                    Some(api) => {
                        PublishError::Rejected(format!("stream refused `{subject}`: {api}"))
                    }
                    None if self.inner.client.connection_state() != State::Connected => {
                        PublishError::Connection(format!("publish on `{subject}`: {err}"))
                    }
                    None => PublishError::Rejected(format!("publish on `{subject}`: {err}")),
                }
            }
        }
    }

    /// Awaits one `PubAck`, until `deadline`.
    async fn confirm(
        &self,
        subject: String,
        ack: PublishAckFuture,
        deadline: Instant,
    ) -> Result<(), PublishError> {
        match tokio::time::timeout_at(deadline, ack).await {
            // `duplicate: true` means the stream already stored this event id: still stored.
            Ok(Ok(_ack)) => Ok(()),
            Ok(Err(err)) => Err(self.map_publish_error(&subject, err)),
            Err(_elapsed) => Err(PublishError::Timeout(self.inner.config.publish_timeout)),
        }
    }

    async fn consumer(
        &self,
        durable: &str,
        filter_subject: String,
        description: String,
        options: &SubscribeOptions,
    ) -> Result<PullConsumer, TransportError> {
        let stream_name = &self.inner.stream_name;
        let stream = self
            .inner
            .jetstream
            .get_stream(stream_name)
            .await
            .map_err(|err| {
                let hint = match err.kind() {
                    GetStreamErrorKind::JetStream(api)
                        if api.error_code() == ErrorCode::STREAM_NOT_FOUND =>
                    {
                        " (has `setup()` run?)"
                    }
                    _ => "",
                };
                TransportError::new(
                    TRANSPORT,
                    format!("cannot open stream `{stream_name}`{hint}: {err}"),
                )
            })?;
        let config = pull::Config {
            durable_name: Some(durable.to_owned()),
            description: Some(description),
            deliver_policy: DeliverPolicy::All,
            ack_policy: AckPolicy::Explicit,
            ack_wait: options.ack_wait,
            max_ack_pending: i64::try_from(options.max_in_flight.max(1)).unwrap_or(i64::MAX),
            filter_subject: filter_subject.clone(),
            ..Default::default()
        };
        match stream.create_consumer(config).await {
            Ok(consumer) => Ok(consumer),
            Err(err) => {
                // Say why when the durable consumer exists with another filter: a server may
                // refuse to change a consumer's filter subject (nats-server 2.9.10 allows it).
                let existing_filter = stream
                    .consumer_info(durable)
                    .await
                    .ok()
                    .map(|info| info.config.filter_subject);
                let message = match existing_filter {
                    Some(existing) if existing != filter_subject => format!(
                        "durable consumer `{durable}` on stream `{stream_name}` exists with \
                         filter subject `{existing}`, but this subscription needs \
                         `{filter_subject}`, and the server refused to change it: {err}; \
                         delete the consumer (`nats consumer rm {stream_name} {durable}`; it \
                         then starts again from the first message in the stream) or subscribe \
                         under another consumer name"
                    ),
                    _ => format!(
                        "cannot create durable consumer `{durable}` on stream `{stream_name}`: \
                         {err}"
                    ),
                };
                Err(TransportError::new(TRANSPORT, message))
            }
        }
    }
}

#[async_trait::async_trait]
impl Transport for NatsTransport {
    fn name(&self) -> &'static str {
        TRANSPORT
    }

    /// Gets or creates the stream (`{namespace}.>`, duplicate window, storage, retention, max
    /// age). An existing stream of the same name must store exactly `{namespace}.>`; its
    /// duplicate window and max age are updated to the configuration.
    async fn setup(&self) -> Result<(), TransportError> {
        let js = &self.inner.jetstream;
        let name = &self.inner.stream_name;
        match js.get_stream(name).await {
            Ok(stream) => {
                return self
                    .reconcile_stream(stream.cached_info().config.clone())
                    .await;
            }
            Err(err) => match err.kind() {
                GetStreamErrorKind::JetStream(api)
                    if api.error_code() == ErrorCode::STREAM_NOT_FOUND => {}
                _ => {
                    return Err(TransportError::new(
                        TRANSPORT,
                        format!("cannot look up stream `{name}`: {err}"),
                    ));
                }
            },
        }
        match js.create_stream(self.stream_config()).await {
            Ok(_) => {
                tracing::info!(stream = %name, subjects = %self.stream_subject(), "created the stream");
                Ok(())
            }
            Err(err) => match err.kind() {
                // Another instance created it in the meantime.
                CreateStreamErrorKind::JetStream(api)
                    if api.error_code() == ErrorCode::STREAM_NAME_EXIST =>
                {
                    let stream = js.get_stream(name).await.map_err(|err| {
                        TransportError::new(
                            TRANSPORT,
                            format!("cannot look up stream `{name}`: {err}"),
                        )
                    })?;
                    self.reconcile_stream(stream.cached_info().config.clone())
                        .await
                }
                CreateStreamErrorKind::JetStream(api)
                    if api.error_code() == ErrorCode::STREAM_SUBJECT_OVERLAP =>
                {
                    Err(TransportError::new(
                        TRANSPORT,
                        format!(
                            "cannot create stream `{name}`: its subjects `{}` overlap those of \
                             another stream ({api}); set `stream_name` to that stream or use \
                             another namespace",
                            self.stream_subject()
                        ),
                    ))
                }
                _ => Err(TransportError::new(
                    TRANSPORT,
                    format!("cannot create stream `{name}`: {err}"),
                )),
            },
        }
    }

    /// Sends every message (up to 4,096 awaiting confirmation at a time), then awaits each
    /// `PubAck` within the publish timeout counted from its send. Errors: no `PubAck` in time →
    /// [`PublishError::Timeout`]; over the server's `max_payload` or the stream's maximum message
    /// size → [`PublishError::Permanent`]; lost connection → [`PublishError::Connection`];
    /// anything else the server refuses (no stream for the subject, limits) →
    /// [`PublishError::Rejected`].
    async fn publish(&self, messages: &[OutgoingMessage]) -> Vec<Result<(), PublishError>> {
        let mut results: Vec<Option<Result<(), PublishError>>> = vec![None; messages.len()];
        let mut pending: VecDeque<(usize, String, PublishAckFuture, Instant)> =
            VecDeque::with_capacity(messages.len().min(PUBLISH_WINDOW));
        let timeout = self.inner.config.publish_timeout;
        for (index, message) in messages.iter().enumerate() {
            if pending.len() >= PUBLISH_WINDOW
                && let Some((i, subject, ack, deadline)) = pending.pop_front()
            {
                results[i] = Some(self.confirm(subject, ack, deadline).await);
            }
            match self.send_one(message).await {
                Ok(ack) => pending.push_back((
                    index,
                    self.subject(&message.event_type),
                    ack,
                    Instant::now() + timeout,
                )),
                Err(err) => results[index] = Some(Err(err)),
            }
        }
        for (i, subject, ack, deadline) in pending {
            results[i] = Some(self.confirm(subject, ack, deadline).await);
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
        let durable = durable_name(consumer);
        if durable.is_empty() {
            return Err(TransportError::new(
                TRANSPORT,
                "the consumer name must not be empty",
            ));
        }
        let mut types: Vec<&str> = Vec::with_capacity(event_types.len());
        for event_type in event_types {
            if !types.contains(&event_type.as_str()) {
                types.push(event_type.as_str());
            }
        }
        if types.is_empty() {
            return Err(TransportError::new(
                TRANSPORT,
                format!("consumer `{consumer}` subscribes to no event type"),
            ));
        }
        let subjects: HashSet<String> = types.iter().map(|t| self.subject(t)).collect();
        if let Some(bad) = subjects.iter().find(|s| !is_valid_subject(s)) {
            return Err(TransportError::new(
                TRANSPORT,
                format!(
                    "consumer `{consumer}`: `{bad}` is not a valid NATS subject (event type \
                     tokens must be non-empty, without whitespace, `*` or `>`)"
                ),
            ));
        }
        let (filter_subject, client_filter) = match types.as_slice() {
            [only] => (self.subject(only), None),
            _ => (self.stream_subject(), Some(subjects)),
        };
        let description = format!("outbox consumer `{consumer}`: {}", types.join(", "));
        let pull_consumer = self
            .consumer(&durable, filter_subject, description, options)
            .await?;
        let batch = options.max_in_flight.clamp(1, MAX_PULL_BATCH);
        let messages = pull_consumer
            .stream()
            .max_messages_per_batch(batch)
            .expires(PULL_EXPIRES)
            .heartbeat(PULL_HEARTBEAT)
            .messages()
            .await
            .map_err(|err| {
                TransportError::new(
                    TRANSPORT,
                    format!("cannot pull from consumer `{durable}`: {err}"),
                )
            })?;
        tracing::debug!(
            consumer = %durable,
            stream = %self.inner.stream_name,
            event_types = ?types,
            "subscribed"
        );
        Ok(Box::new(NatsSubscription {
            durable,
            stream: self.inner.stream_name.clone(),
            client_filter,
            messages,
            client: self.inner.client.clone(),
        }))
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
        let timeout = API_TIMEOUT.max(self.inner.config.publish_timeout);
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

/// The JetStream durable consumer name used for the consumer group `consumer`: every character
/// other than ASCII letters, digits, `_` and `-` becomes `_` (NATS forbids `.`, `*`, `>`,
/// whitespace and path separators in names). `inventory` stays `inventory`, `billing.v2` becomes
/// `billing_v2`; two group names that differ only in such characters share one consumer.
///
/// ```
/// use outbox_runtime::transport::nats::durable_name;
///
/// assert_eq!(durable_name("billing.v2"), "billing_v2");
/// assert_eq!(durable_name("inventory"), "inventory");
/// ```
pub fn durable_name(consumer: &str) -> String {
    consumer
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Whether `name` can be a stream or consumer name.
fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| {
            !c.is_whitespace() && !c.is_control() && !matches!(c, '.' | '*' | '>' | '/' | '\\')
        })
}

/// Whether `subject` is a valid subject to publish on (no wildcards).
fn is_valid_subject(subject: &str) -> bool {
    subject.split('.').all(|token| {
        !token.is_empty()
            && token
                .chars()
                .all(|c| !c.is_whitespace() && !c.is_control() && c != '*' && c != '>')
    })
}

fn validate_config(config: &NatsConfig) -> Result<(), TransportError> {
    if !is_valid_subject(&config.namespace) {
        return Err(TransportError::new(
            TRANSPORT,
            format!(
                "namespace `{}` cannot prefix NATS subjects: use dot-separated, non-empty tokens \
                 without whitespace, `*` or `>`",
                config.namespace
            ),
        ));
    }
    let stream = config.resolved_stream_name();
    if !is_valid_name(&stream) {
        return Err(TransportError::new(
            TRANSPORT,
            format!(
                "`{stream}` is not a valid JetStream stream name: it must be non-empty, without \
                 whitespace, `.`, `*`, `>`, `/` or `\\`"
            ),
        ));
    }
    Ok(())
}

/// The deliveries of one pull consumer.
struct NatsSubscription {
    durable: String,
    stream: String,
    /// Subjects to hand out when the consumer filters on the whole namespace.
    client_filter: Option<HashSet<String>>,
    messages: pull::Stream,
    /// Acks go out on this connection.
    client: Client,
}

impl fmt::Debug for NatsSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsSubscription")
            .field("consumer", &self.durable)
            .field("stream", &self.stream)
            .field("client_filter", &self.client_filter)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl Subscription for NatsSubscription {
    async fn next(&mut self) -> Option<Result<Delivery, TransportError>> {
        loop {
            let message = match self.messages.next().await? {
                Ok(message) => message,
                Err(err) => {
                    return Some(Err(TransportError::new(
                        TRANSPORT,
                        format!(
                            "pulling from consumer `{}` on stream `{}`: {err}",
                            self.durable, self.stream
                        ),
                    )));
                }
            };
            if let Some(filter) = &self.client_filter
                && !filter.contains(message.subject.as_str())
            {
                // Another event type under the namespace: settle it so it is not redelivered.
                if let Err(err) = message.ack().await {
                    tracing::warn!(
                        consumer = %self.durable,
                        subject = %message.subject,
                        error = %err,
                        "could not ack a skipped delivery; it will be redelivered and skipped again"
                    );
                }
                continue;
            }
            let delivery_count = match message.info() {
                Ok(info) => u32::try_from(info.delivered.max(1)).unwrap_or(u32::MAX),
                Err(err) => {
                    tracing::warn!(
                        consumer = %self.durable,
                        error = %err,
                        "delivery without JetStream metadata; counting it as a first delivery"
                    );
                    1
                }
            };
            let (message, acker) = message.split();
            let message_id = message
                .headers
                .as_ref()
                .and_then(|headers| headers.get(NATS_MESSAGE_ID))
                .map(|value| value.as_str().to_owned());
            return Some(Ok(Delivery::new(
                message.payload,
                message.subject.to_string(),
                message_id,
                delivery_count,
                Box::new(NatsAcker {
                    acker,
                    client: self.client.clone(),
                }),
            )));
        }
    }
}

/// Settles a delivery. An ack returns once it is written to the connection, not once the
/// server answered: a double ack would cost a round trip per message, and an ack lost on the way
/// only means a redelivery after `ack_wait`, which the inbox takes as a duplicate. The acks of a
/// batch settled together share one write. A nack waits for the server's answer.
struct NatsAcker {
    acker: jetstream::message::Acker,
    client: Client,
}

#[async_trait::async_trait]
impl super::Acker for NatsAcker {
    async fn ack(&self) -> Result<(), TransportError> {
        self.acker
            .ack()
            .await
            .map_err(|err| TransportError::new(TRANSPORT, format!("ack failed: {err}")))?;
        self.client
            .flush()
            .await
            .map_err(|err| TransportError::new(TRANSPORT, format!("ack not written: {err}")))
    }

    async fn nack(&self, delay: Option<Duration>) -> Result<(), TransportError> {
        self.acker
            .double_ack_with(AckKind::Nak(delay))
            .await
            .map_err(|err| TransportError::new(TRANSPORT, format!("nack failed: {err}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_name_is_derived_from_the_namespace() {
        assert_eq!(NatsConfig::default().resolved_stream_name(), "OUTBOX");
        assert_eq!(
            NatsConfig::default()
                .namespace("shop.eu-1")
                .resolved_stream_name(),
            "SHOP_EU-1"
        );
        assert_eq!(
            NatsConfig::default()
                .stream_name("EVENTS")
                .resolved_stream_name(),
            "EVENTS"
        );
    }

    #[test]
    fn consumer_names_are_sanitized() {
        assert_eq!(durable_name("inventory"), "inventory");
        assert_eq!(durable_name("billing.v2 eu/*>"), "billing_v2_eu___");
    }

    #[test]
    fn subjects_and_names_are_checked() {
        assert!(is_valid_subject("outbox.order.placed"));
        assert!(!is_valid_subject("outbox..placed"));
        assert!(!is_valid_subject("outbox.order.*"));
        assert!(!is_valid_subject("outbox.order placed"));
        assert!(is_valid_name("OUTBOX"));
        assert!(!is_valid_name("OUT.BOX"));
        assert!(validate_config(&NatsConfig::default().namespace("a.>")).is_err());
        assert!(validate_config(&NatsConfig::default().stream_name("a b")).is_err());
    }

    #[test]
    fn the_duplicate_window_never_exceeds_max_age() {
        let config = NatsConfig::default();
        assert_eq!(
            config.effective_duplicate_window(),
            DEFAULT_DUPLICATE_WINDOW
        );
        let config = config.max_age(Duration::from_secs(30));
        assert_eq!(config.effective_duplicate_window(), Duration::from_secs(30));
    }
}
