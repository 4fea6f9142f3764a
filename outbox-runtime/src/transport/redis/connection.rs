//! Connections to the server: one connection attempt, a subscription's reading connection,
//! commands on the publishing connection, and [`Failure`], how a failed command is classified.

use std::{fmt, time::Duration};

use ::redis::{AsyncConnectionConfig, Client, Cmd, RedisError, Value, aio::MultiplexedConnection};

use super::{RedisConfig, RedisTransport};

impl RedisTransport {
    /// Runs `cmd` on the publishing connection within the command timeout.
    pub(super) async fn command(&self, cmd: &Cmd) -> Result<Value, Failure> {
        let timeout = self.inner.config.command_timeout();
        let mut conn = self.inner.manager.clone();
        match tokio::time::timeout(timeout, cmd.query_async::<Value>(&mut conn)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(Failure::from_redis(err)),
            Err(_elapsed) => Err(Failure::Connection(format!("no reply within {timeout:?}"))),
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
