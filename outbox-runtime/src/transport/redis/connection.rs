//! Connections to the server: one connection attempt, a subscription's reading connection,
//! the shared (publishing) connection, replaced when it goes silent, commands on it, and
//! [`Failure`], how a failed command is classified.

use std::{
    fmt,
    future::Future,
    sync::{PoisonError, RwLock},
    time::Duration,
};

use ::redis::{
    AsyncConnectionConfig, Client, Cmd, RedisError, RedisResult, Value,
    aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection},
};

use super::{RedisConfig, RedisTransport};

/// The connection publishes, acks, claims and health checks share: a [`ConnectionManager`],
/// which reconnects by itself after a connection *error*. A connection that goes silent without
/// closing (a partition, a dead host) reports no error, only commands that never get a reply; the
/// manager would keep it forever. So a command without a reply in time replaces the manager with
/// a fresh one, which connects on first use.
pub(super) struct SharedConnection {
    client: Client,
    config: ConnectionManagerConfig,
    /// The manager in use and its generation, counted up at each replacement.
    current: RwLock<(u64, ConnectionManager)>,
}

impl SharedConnection {
    pub(super) fn new(
        client: Client,
        config: ConnectionManagerConfig,
        manager: ConnectionManager,
    ) -> Self {
        SharedConnection {
            client,
            config,
            current: RwLock::new((0, manager)),
        }
    }

    /// The manager in use, with its generation.
    pub(super) fn get(&self) -> (u64, ConnectionManager) {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replace the manager of `generation` (unless another caller already did): it left a
    /// command unanswered for too long.
    pub(super) fn replace(&self, generation: u64) {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        if current.0 != generation {
            return;
        }
        match ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone()) {
            Ok(manager) => {
                tracing::warn!(
                    "a Redis connection left a command unanswered: replacing it with a new one"
                );
                *current = (generation + 1, manager);
            }
            Err(err) => tracing::warn!(error = %err, "cannot replace a silent Redis connection"),
        }
    }
}

impl RedisTransport {
    /// The shared connection in use (it reconnects on its own).
    pub(super) fn shared(&self) -> ConnectionManager {
        self.inner.shared.get().1
    }

    /// Runs `query` on the shared connection within `timeout`; `None` when no reply came in
    /// time, after which the connection is replaced.
    pub(super) async fn on_shared<T, Fut>(
        &self,
        timeout: Duration,
        query: impl FnOnce(ConnectionManager) -> Fut,
    ) -> Option<RedisResult<T>>
    where
        Fut: Future<Output = RedisResult<T>>,
    {
        let (generation, conn) = self.inner.shared.get();
        match tokio::time::timeout(timeout, query(conn)).await {
            Ok(result) => Some(result),
            Err(_elapsed) => {
                self.inner.shared.replace(generation);
                None
            }
        }
    }

    /// Runs `cmd` on the shared connection within the command timeout.
    pub(super) async fn command(&self, cmd: &Cmd) -> Result<Value, Failure> {
        let timeout = self.inner.config.command_timeout();
        let reply = self
            .on_shared(timeout, |mut conn| async move {
                cmd.query_async::<Value>(&mut conn).await
            })
            .await;
        match reply {
            Some(Ok(value)) => Ok(value),
            Some(Err(err)) => Err(Failure::from_redis(err)),
            None => Err(Failure::Connection(format!("no reply within {timeout:?}"))),
        }
    }
}

/// Why a command failed, as far as a subscription cares.
#[derive(Debug)]
pub(super) enum Failure {
    /// The connection is lost or silent: reconnect.
    Connection(String),
    /// The server answered with an error.
    Server { code: String, message: String },
    /// Anything else (a reply that cannot be parsed, a client-side error).
    Other(String),
}

impl Failure {
    pub(super) fn from_redis(err: RedisError) -> Self {
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

pub(super) fn is_connection_error(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || err.is_unrecoverable_error()
}

/// One connection attempt, bounded by `timeout`.
pub(super) async fn open_connection(
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
pub(super) async fn open_read_connection(
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
