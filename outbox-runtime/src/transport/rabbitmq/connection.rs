//! The connection and its channels: reconnecting with a backoff after a loss, opening and
//! closing channels, running one broker operation within the response timeout ([`ApiError`]),
//! and giving up a connection that left an operation or a confirm unanswered.

use std::{
    fmt,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use lapin::{
    Channel, Connection, ConnectionProperties, ErrorKind,
    protocol::{AMQPErrorKind, AMQPSoftError, constants::REPLY_SUCCESS},
    uri::AMQPUri,
};
use tokio::time::Instant;

use super::{RabbitMqConfig, RabbitMqTransport, TRANSPORT};
use crate::transport::TransportError;

/// How long closing a publish channel after a confirm timeout may take.
pub(super) const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Reconnect backoff after a failed attempt: doubles from the base up to the cap.
const RECONNECT_BACKOFF_BASE: Duration = Duration::from_millis(200);
const RECONNECT_BACKOFF_CAP: Duration = Duration::from_secs(2);

pub(super) struct ConnectionSlot {
    pub(super) current: Option<Arc<Connection>>,
    /// Counted up at each new connection.
    pub(super) generation: u64,
    /// Failed reconnect attempts in a row.
    pub(super) failures: u32,
    /// No new attempt before this instant.
    pub(super) retry_at: Option<Instant>,
    pub(super) last_error: String,
}

impl RabbitMqTransport {
    /// The connection, reopened first if it was lost (subject to the reconnect backoff).
    pub async fn connection(&self) -> Result<Arc<Connection>, TransportError> {
        let mut slot = self.inner.connection.lock().await;
        if let Some(connection) = &slot.current
            && connection.status().connected()
        {
            return Ok(connection.clone());
        }
        let now = Instant::now();
        if let Some(retry_at) = slot.retry_at
            && now < retry_at
        {
            return Err(TransportError::new(
                TRANSPORT,
                format!(
                    "not connected to RabbitMQ at {}: the last attempt failed ({}); next attempt \
                     in {:?}",
                    self.inner.display_uri,
                    slot.last_error,
                    retry_at - now
                ),
            ));
        }
        let lost = slot.current.take().is_some();
        if lost {
            tracing::warn!(uri = %self.inner.display_uri, "connection to RabbitMQ lost; reconnecting");
        }
        match open_connection(&self.inner.uri, &self.inner.config).await {
            Ok(connection) => {
                if slot.failures > 0 || lost {
                    tracing::info!(uri = %self.inner.display_uri, "reconnected to RabbitMQ");
                }
                if let Ok(mut status) = self.inner.status.write() {
                    *status = connection.status().clone();
                }
                let connection = Arc::new(connection);
                let generation = slot.generation.wrapping_add(1);
                self.inner.generation.store(generation, Ordering::Release);
                if let Ok(mut opened_at) = self.inner.opened_at.lock() {
                    *opened_at = Instant::now();
                }
                *slot = ConnectionSlot {
                    current: Some(connection.clone()),
                    generation,
                    failures: 0,
                    retry_at: None,
                    last_error: String::new(),
                };
                Ok(connection)
            }
            Err(err) => {
                slot.failures = slot.failures.saturating_add(1);
                let backoff = RECONNECT_BACKOFF_BASE
                    .saturating_mul(1 << slot.failures.saturating_sub(1).min(16))
                    .min(RECONNECT_BACKOFF_CAP);
                slot.retry_at = Some(Instant::now() + backoff);
                slot.last_error = err.clone();
                tracing::warn!(
                    uri = %self.inner.display_uri,
                    error = %err,
                    failures = slot.failures,
                    ?backoff,
                    "cannot connect to RabbitMQ"
                );
                Err(TransportError::new(
                    TRANSPORT,
                    format!(
                        "cannot connect to RabbitMQ at {}: {err}",
                        self.inner.display_uri
                    ),
                ))
            }
        }
    }

    /// A new channel on the [`connection`](Self::connection), e.g. to inspect queues
    /// (`queue_declare` with `passive`). It closes when its last clone is dropped.
    pub async fn channel(&self) -> Result<Channel, TransportError> {
        let connection = self.connection().await?;
        match self.open_channel(&connection).await {
            Err(_) if !connection.status().connected() => {
                // The connection closed under us (the broker may close it at any time, e.g.
                // after a protocol error): reconnect once.
                drop(connection);
                let connection = self.connection().await?;
                self.open_channel(&connection).await
            }
            result => result,
        }
    }

    /// How long ago the current connection opened.
    pub(super) fn connection_age(&self) -> Duration {
        self.inner
            .opened_at
            .lock()
            .map_or(Duration::MAX, |opened_at| opened_at.elapsed())
    }

    /// The generation of the current connection: pass it to [`give_up`](Self::give_up).
    pub(super) fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    /// Give up the connection of `generation`, which left an operation or a confirm unanswered
    /// (a partition or a dead host leaves it silent without closing it): the next call opens a
    /// new one. It is not closed, which on a silent connection would wait for an answer that
    /// never comes (and stop its heartbeats); its missed heartbeats close it, and end its
    /// subscriptions, or it closes once nothing uses it.
    pub(super) async fn give_up(&self, generation: u64, why: &str) {
        let mut slot = self.inner.connection.lock().await;
        if slot.generation != generation || slot.current.is_none() {
            return;
        }
        slot.current = None;
        if let Ok(mut status) = self.inner.status.write() {
            *status = lapin::ConnectionStatus::default();
        }
        tracing::warn!(
            uri = %self.inner.display_uri,
            "a RabbitMQ connection left {why} unanswered: giving it up for a new one"
        );
    }

    /// Runs one broker operation within the response timeout; a timeout gives the connection
    /// up.
    pub(super) async fn api<T>(
        &self,
        what: impl FnOnce() -> String,
        operation: impl Future<Output = lapin::Result<T>>,
    ) -> Result<T, ApiError> {
        let timeout = self.inner.config.response_timeout;
        let generation = self.generation();
        match tokio::time::timeout(timeout, operation).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(ApiError::Broker(what(), err)),
            Err(_elapsed) => {
                let what = what();
                self.give_up(generation, &format!("an operation ({what})"))
                    .await;
                Err(ApiError::Timeout(what, timeout))
            }
        }
    }

    pub(super) async fn open_channel(
        &self,
        connection: &Connection,
    ) -> Result<Channel, TransportError> {
        self.api(|| "open a channel".to_owned(), connection.create_channel())
            .await
            .map_err(|err| err.into_transport_error(&self.inner.display_uri))
    }
}

/// A failed topology operation.
pub(super) enum ApiError {
    Broker(String, lapin::Error),
    Timeout(String, Duration),
}

impl ApiError {
    pub(super) fn soft_error(&self) -> Option<AMQPSoftError> {
        match self {
            ApiError::Broker(_, err) => match err.kind() {
                ErrorKind::ProtocolError(amqp) => match amqp.kind() {
                    AMQPErrorKind::Soft(soft) => Some(soft.clone()),
                    AMQPErrorKind::Hard(_) => None,
                },
                _ => None,
            },
            ApiError::Timeout(..) => None,
        }
    }

    pub(super) fn into_transport_error(self, uri: &str) -> TransportError {
        TransportError::new(TRANSPORT, format!("{self} (RabbitMQ at {uri})"))
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiError::Broker(what, err) => write!(f, "cannot {what}: {err}"),
            ApiError::Timeout(what, timeout) => {
                write!(f, "cannot {what}: no answer within {timeout:?}")
            }
        }
    }
}

pub(super) async fn open_connection(
    uri: &AMQPUri,
    config: &RabbitMqConfig,
) -> Result<Connection, String> {
    let properties = ConnectionProperties::default()
        .with_connection_name(config.connection_name.as_str().into());
    let mut uri = uri.clone();
    if uri.query.heartbeat.is_none() {
        uri.query.heartbeat = Some(config.heartbeat_seconds());
    }
    let connect = Connection::connect_uri(uri, properties);
    match tokio::time::timeout(config.connection_timeout, connect).await {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_elapsed) => Err(format!("no answer within {:?}", config.connection_timeout)),
    }
}

/// Closes a short-lived channel; failures do not matter (it closes when dropped anyway).
pub(super) async fn close_quietly(channel: Channel) {
    if channel.status().connected() {
        let _ =
            tokio::time::timeout(CLOSE_TIMEOUT, channel.close(REPLY_SUCCESS, "OK".into())).await;
    }
}

/// `scheme://user@host:port (vhost `…`)`: the URI without its password.
pub(super) fn redact(uri: &AMQPUri) -> String {
    format!(
        "{}://{}@{}:{} (vhost `{}`)",
        uri.scheme,
        uri.authority.userinfo.username,
        uri.authority.host,
        uri.authority.port,
        uri.vhost
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    #[test]
    fn uris_are_shown_without_the_password() {
        let uri = AMQPUri::from_str("amqp://app:s3cret@broker:5673/prod").expect("uri");
        let shown = redact(&uri);
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("app@broker:5673"), "{shown}");
    }
}
