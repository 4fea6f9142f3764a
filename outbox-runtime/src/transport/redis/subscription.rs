//! A subscription: [`RedisSubscription`] (one Redis consumer inside the group), the entries it
//! holds until they are settled, and its loop (reconnect, then claim, re-read or read).

use crate::transport::{check_consumer_name, distinct_event_types};
use std::{
    collections::{HashSet, VecDeque},
    fmt,
    sync::Arc,
    time::Duration,
};

use ::redis::{Cmd, Value, aio::MultiplexedConnection};
use tokio::time::Instant;

use super::{
    RedisTransport, TRANSPORT,
    ack::RedisAcker,
    connection::{Failure, open_read_connection},
    group::{JANITOR_INTERVAL, JANITOR_MIN_IDLE, delete_if_idle},
    held::{Held, Ids},
    reply::{Fields, parse_consumers},
};
use crate::transport::{Delivery, SubscribeOptions, Subscription, TransportError};

/// Entries asked for in one `XREADGROUP` or `XAUTOCLAIM`, at most (never more than the free
/// room under `max_in_flight`).
const MAX_READ_BATCH: usize = 256;

/// Claim sweeps run at most this often.
const MIN_SWEEP_INTERVAL: Duration = Duration::from_millis(50);

/// Longest wait between two reconnection attempts of a subscription.
pub(super) const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// First wait between two reconnection attempts of a subscription.
const MIN_RETRY_DELAY: Duration = Duration::from_millis(100);

impl RedisTransport {
    /// [`Transport::subscribe`](crate::transport::Transport::subscribe): creates the group if
    /// needed and opens the subscription's reading connection.
    pub(super) async fn open_subscription(
        &self,
        consumer: &str,
        event_types: &[String],
        options: &SubscribeOptions,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        check_consumer_name(TRANSPORT, consumer)?;
        let types: HashSet<String> = distinct_event_types(TRANSPORT, consumer, event_types)?
            .into_iter()
            .map(str::to_owned)
            .collect();
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

/// An entry ready to be handed out.
#[derive(Debug)]
pub(super) struct Ready {
    pub(super) id: String,
    pub(super) fields: Fields,
    pub(super) delivery_count: u32,
}

/// The deliveries of one Redis consumer in a consumer group.
pub(super) struct RedisSubscription {
    pub(super) transport: RedisTransport,
    pub(super) ids: Arc<Ids>,
    pub(super) types: HashSet<String>,
    pub(super) claim_idle: Duration,
    max_in_flight: usize,
    sweep_interval: Duration,
    /// The reading connection; `None` after it failed.
    pub(super) conn: Option<MultiplexedConnection>,
    /// After a reconnection: re-read this consumer's own pending entries from this id on.
    pub(super) reread_from: Option<String>,
    pub(super) buffer: VecDeque<Ready>,
    /// Entries of types this subscription does not want, to acknowledge.
    pub(super) to_ack: Vec<String>,
    pub(super) held: Arc<Held>,
    pub(super) claim_cursor: String,
    pub(super) next_sweep: Instant,
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
        let mut conn = self.transport.shared();
        let ids = self.ids.clone();
        let timeout = self.transport.inner.config.command_timeout();
        runtime.spawn(async move {
            let _ =
                tokio::time::timeout(timeout, delete_if_idle(&mut conn, &ids, &ids.consumer)).await;
        });
    }
}

impl RedisSubscription {
    fn delivery(&self, ready: Ready) -> Delivery {
        let subject = match &ready.fields.event_type {
            Some(event_type) => self.transport.subject(event_type),
            None => self.ids.key.clone(),
        };
        let acker = RedisAcker {
            transport: self.transport.clone(),
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
    pub(super) async fn query(&mut self, cmd: &Cmd, timeout: Duration) -> Result<Value, Failure> {
        let Some(conn) = self.conn.as_mut() else {
            return Err(Failure::Connection("not connected".to_owned()));
        };
        match tokio::time::timeout(timeout, cmd.query_async::<Value>(conn)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(Failure::from_redis(err)),
            Err(_elapsed) => Err(Failure::Connection(format!("no reply within {timeout:?}"))),
        }
    }

    pub(super) fn command_timeout(&self) -> Duration {
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
}

impl RedisSubscription {
    /// Removes consumers of the group that have nothing pending and have been idle for long;
    /// failures are only logged.
    pub(super) async fn remove_idle_consumers(&mut self) {
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
        let mut conn = self.transport.shared();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names_are_unique_and_readable() {
        let (a, b) = (member_name(), member_name());
        assert_ne!(a, b);
        assert!(a.contains(&format!("-{}-", std::process::id())), "{a}");
        assert!(!a.contains(' '));
    }
}
