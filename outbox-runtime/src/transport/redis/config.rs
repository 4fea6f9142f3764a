//! Settings of the Redis transport: [`RedisConfig`] with its defaults and checks, where a new
//! consumer group starts ([`GroupStart`]), and [`RedisTransportBuilder`].

use std::time::Duration;

use ::redis::Client;

use super::{RedisTransport, TRANSPORT};
use crate::transport::{DEFAULT_NAMESPACE, TransportError};

/// Default stream length bound: each `XADD` trims the stream to about this many entries.
pub const DEFAULT_MAX_LEN: usize = 1_000_000;

/// Default longest time one `XREADGROUP` waits for new entries.
pub const DEFAULT_BLOCK: Duration = Duration::from_secs(1);

/// Default time to wait for the `XADD` replies of a publish.
pub const DEFAULT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Default time to wait for a TCP connection and the server's handshake.
pub const DEFAULT_CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// Default time a command other than a publish (acks, claims, reads beyond their block, the
/// health check's `PING`) waits for its reply before its connection is given up as silent.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a consumer group created by [`subscribe`](crate::transport::Transport::subscribe)
/// starts reading.
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
    pub(super) fn id(self) -> &'static str {
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
    pub(crate) namespace: String,
    /// Each `XADD` trims the stream to this many entries; `None` never trims. Default
    /// `Some(`[`DEFAULT_MAX_LEN`]`)`. Trimming drops entries whether or not every consumer group
    /// has read and acknowledged them.
    pub(crate) max_len: Option<usize>,
    /// Trim to exactly [`max_len`](Self::max_len) (`MAXLEN =`) instead of about it (`MAXLEN ~`,
    /// the default, which only removes whole internal nodes and is much cheaper).
    pub(crate) exact_trim: bool,
    /// Entries pending (delivered, not acknowledged) for longer than this are claimed by a live
    /// subscription of the group and delivered again. `None` (the default) uses each
    /// subscription's [`SubscribeOptions::ack_wait`](crate::transport::SubscribeOptions::ack_wait).
    pub(crate) claim_idle: Option<Duration>,
    /// Longest time one `XREADGROUP` waits for new entries; claim sweeps run at least this often.
    /// Default [`DEFAULT_BLOCK`] (1 s).
    pub(crate) block: Duration,
    /// How long a publish waits for its `XADD` replies before reporting
    /// [`PublishError::Timeout`](crate::transport::PublishError::Timeout). Default
    /// [`DEFAULT_PUBLISH_TIMEOUT`] (10 s).
    pub(crate) publish_timeout: Duration,
    /// Timeout of each connection attempt. Default [`DEFAULT_CONNECTION_TIMEOUT`] (5 s).
    pub(crate) connection_timeout: Duration,
    /// How long a command other than a publish (acks, claims, an `XREADGROUP` beyond its
    /// [`block`](Self::block), the health check's `PING`) waits for its reply. A connection that
    /// leaves such a command unanswered for longer is taken for dead, as one that went silent
    /// without closing (a partition, a dead host) is, and replaced (a publish that times out
    /// does not replace it: the relay then checks the server's health, whose `PING` does). Default
    /// [`DEFAULT_RESPONSE_TIMEOUT`] (10 s).
    pub(crate) response_timeout: Duration,
    /// Where a consumer group created by a subscription starts. Default
    /// [`GroupStart::Earliest`].
    pub(crate) group_start: GroupStart,
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
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
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

    /// Set how long a command other than a publish waits for its reply.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
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
    pub(super) fn command_timeout(&self) -> Duration {
        self.response_timeout
    }
}

pub(super) fn validate_config(config: &RedisConfig) -> Result<(), TransportError> {
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
    } else if config.response_timeout.is_zero() {
        Some("`response_timeout` must not be zero".to_owned())
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
    pub(super) url: String,
    pub(super) config: RedisConfig,
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
        /// How long a command other than a publish waits for its reply; a connection silent for
        /// longer is replaced. Default 10 s.
        response_timeout: Duration;
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(validate_config(&RedisConfig::default().response_timeout(Duration::ZERO)).is_err());
    }
}
