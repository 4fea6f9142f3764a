//! Settings of the NATS transport: [`NatsConfig`] with its defaults, the checks on names and
//! subjects, and [`NatsTransportBuilder`], which connects.

use std::time::Duration;

use async_nats::{
    ConnectOptions,
    jetstream::stream::{RetentionPolicy, StorageType},
};

use super::{NatsTransport, TRANSPORT};
use crate::transport::{DEFAULT_NAMESPACE, TransportError};

/// Default stream duplicate window: a republish with the same `Nats-Msg-Id` inside it is dropped.
pub const DEFAULT_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Default time to wait for a JetStream `PubAck`.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Default time to wait for the TCP connection and the server's handshake.
pub const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// Default interval of the client's pings: a connection that leaves two pings unanswered is
/// closed and replaced, so a silent one is noticed within about three intervals.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(10);

/// Default time to wait for the answer to a JetStream API request (stream and consumer
/// management, health checks).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Default interval of the idle heartbeats the server sends on a pending pull request; two
/// missed ones are reported by the subscription.
pub const DEFAULT_PULL_HEARTBEAT: Duration = Duration::from_secs(10);

/// Longest pull heartbeat: half the time a pull request lives.
pub(super) const MAX_PULL_HEARTBEAT: Duration = Duration::from_secs(15);

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
    pub(crate) namespace: String,
    /// The stream storing the namespace's subjects; `None` derives it from the namespace (see
    /// [`resolved_stream_name`](Self::resolved_stream_name)).
    pub(crate) stream_name: Option<String>,
    /// The stream's duplicate window. Default [`DEFAULT_DUPLICATE_WINDOW`] (two minutes). With a
    /// shorter [`max_age`](Self::max_age) the window is shortened to it, as JetStream requires.
    pub(crate) duplicate_window: Duration,
    /// How long a publish waits for its `PubAck` before it is reported as
    /// [`PublishError::Timeout`](crate::transport::PublishError::Timeout). Default
    /// [`DEFAULT_PUBLISH_TIMEOUT`] (10 s).
    pub(crate) publish_timeout: Duration,
    /// Messages older than this are removed from the stream; `None` keeps them (the default).
    pub(crate) max_age: Option<Duration>,
    /// The stream's retention policy. Default [`RetentionPolicy::Limits`].
    pub(crate) retention: RetentionPolicy,
    /// The stream's storage. Default [`StorageType::File`].
    pub(crate) storage: StorageType,
    /// Connection timeout used by [`NatsTransportBuilder::connect`]. Default
    /// [`DEFAULT_CONNECTION_TIMEOUT`] (5 s).
    pub(crate) connection_timeout: Duration,
    /// How often the client pings the server, used by [`NatsTransportBuilder::connect`]; a
    /// connection with two pings unanswered is closed and replaced, so one that went silent
    /// without closing (a partition, a dead host) is noticed within about three intervals.
    /// Default [`DEFAULT_PING_INTERVAL`] (10 s).
    pub(crate) ping_interval: Duration,
    /// How long a JetStream API request (stream and consumer management, the health check)
    /// waits for its answer; the publish timeout raises it for the JetStream context when
    /// longer. Default [`DEFAULT_REQUEST_TIMEOUT`] (10 s).
    pub(crate) request_timeout: Duration,
    /// How often the server sends an idle heartbeat on a subscription's pending pull request;
    /// two missed heartbeats are reported by [`Subscription::next`](crate::transport::Subscription::next).
    /// At most 15 s. Default [`DEFAULT_PULL_HEARTBEAT`] (10 s).
    pub(crate) pull_heartbeat: Duration,
    /// Copies of the stream a JetStream cluster keeps, on as many servers (1 to 5); `None` leaves
    /// it to the server (one copy). With 3, the stream survives the loss of one server: another
    /// copy is elected leader within seconds and goes on storing. Default `None`.
    pub(crate) replicas: Option<usize>,
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
            ping_interval: DEFAULT_PING_INTERVAL,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            pull_heartbeat: DEFAULT_PULL_HEARTBEAT,
            replicas: None,
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

    /// Set how often the client pings the server.
    pub fn ping_interval(mut self, interval: Duration) -> Self {
        self.ping_interval = interval;
        self
    }

    /// Set how long a JetStream API request waits for its answer.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Set how often the server sends idle heartbeats on a pending pull request.
    pub fn pull_heartbeat(mut self, interval: Duration) -> Self {
        self.pull_heartbeat = interval;
        self
    }

    /// Keep `replicas` copies of the stream on a JetStream cluster (1 to 5, at most the
    /// cluster's servers). 3 is the choice for production: a server's loss moves the stream's
    /// leadership to another copy, and publishes wait out the election instead of failing. An
    /// existing stream with another count is scaled to it by [`setup`](crate::transport::Transport::setup).
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.replicas = Some(replicas);
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
    pub(super) url: String,
    pub(super) config: NatsConfig,
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
        /// Ping the server this often; two unanswered pings replace the connection. Default
        /// 10 s.
        ping_interval: Duration;
        /// How long a JetStream API request (and the health check) waits. Default 10 s.
        request_timeout: Duration;
        /// Idle heartbeat interval of pending pull requests (at most 15 s). Default 10 s.
        pull_heartbeat: Duration;
        /// Copies of the stream on a JetStream cluster (1 to 5). Default: the server's (one).
        replicas: usize;
    }

    /// Replace every setting at once.
    pub fn config(mut self, config: NatsConfig) -> Self {
        self.config = config;
        self
    }

    /// Connect to the server, or to one of the servers of a cluster.
    ///
    /// The URL may list several servers separated by commas
    /// (`nats://n1:4222,nats://n2:4222,nats://n3:4222`): the client connects to one of them and,
    /// when it loses that one, reconnects to another (and to the servers the cluster announces).
    /// Give every server of a cluster, so that a client started while one is down still
    /// connects.
    ///
    /// The initial connection is tried once per server (servers that are all down are an error,
    /// not a hang); once connected, the client reconnects on its own after a connection loss.
    pub async fn connect(self) -> Result<NatsTransport, TransportError> {
        validate_config(&self.config)?;
        let servers = server_list(&self.url);
        if servers.is_empty() {
            return Err(TransportError::new(
                TRANSPORT,
                format!("no NATS server in `{}`", self.url),
            ));
        }
        let client = ConnectOptions::new()
            .name("outbox")
            .connection_timeout(self.config.connection_timeout)
            .ping_interval(self.config.ping_interval)
            .request_timeout(Some(self.config.request_timeout))
            .connect(servers.as_slice())
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

/// The servers of a comma-separated URL list, each trimmed, empty entries left out.
pub(super) fn server_list(urls: &str) -> Vec<&str> {
    urls.split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
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
pub(super) fn is_valid_subject(subject: &str) -> bool {
    subject.split('.').all(|token| {
        !token.is_empty()
            && token
                .chars()
                .all(|c| !c.is_whitespace() && !c.is_control() && c != '*' && c != '>')
    })
}

pub(super) fn validate_config(config: &NatsConfig) -> Result<(), TransportError> {
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
    crate::transport::check_nonzero(
        TRANSPORT,
        &[
            ("publish_timeout", config.publish_timeout),
            ("connection_timeout", config.connection_timeout),
            ("ping_interval", config.ping_interval),
            ("request_timeout", config.request_timeout),
            ("pull_heartbeat", config.pull_heartbeat),
        ],
    )?;
    if let Some(replicas) = config.replicas
        && !(1..=5).contains(&replicas)
    {
        return Err(TransportError::new(
            TRANSPORT,
            format!("`replicas` must be 1 to 5 (JetStream's limit), got {replicas}"),
        ));
    }
    if config.pull_heartbeat > MAX_PULL_HEARTBEAT {
        return Err(TransportError::new(
            TRANSPORT,
            format!(
                "`pull_heartbeat` must be at most {MAX_PULL_HEARTBEAT:?} (half a pull request's \
                 life), got {:?}",
                config.pull_heartbeat
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
    fn subjects_and_names_are_checked() {
        assert!(is_valid_subject("outbox.order.placed"));
        assert!(!is_valid_subject("outbox..placed"));
        assert!(!is_valid_subject("outbox.order.*"));
        assert!(!is_valid_subject("outbox.order placed"));
        assert!(is_valid_name("OUTBOX"));
        assert!(!is_valid_name("OUT.BOX"));
        assert!(validate_config(&NatsConfig::default().namespace("a.>")).is_err());
        assert!(validate_config(&NatsConfig::default().stream_name("a b")).is_err());
        assert!(validate_config(&NatsConfig::default().ping_interval(Duration::ZERO)).is_err());
        assert!(
            validate_config(&NatsConfig::default().pull_heartbeat(Duration::from_secs(20)))
                .is_err()
        );
        assert!(validate_config(&NatsConfig::default().replicas(0)).is_err());
        assert!(validate_config(&NatsConfig::default().replicas(6)).is_err());
        assert!(validate_config(&NatsConfig::default().replicas(3)).is_ok());
    }

    #[test]
    fn a_url_may_list_the_servers_of_a_cluster() {
        assert_eq!(
            server_list("nats://a:4222, nats://b:4223,,nats://c:4224 "),
            ["nats://a:4222", "nats://b:4223", "nats://c:4224"]
        );
        assert_eq!(server_list("nats://a:4222"), ["nats://a:4222"]);
        assert!(server_list(" , ").is_empty());
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
