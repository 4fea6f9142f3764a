//! Publishing: every message sent with its `Nats-Msg-Id` without waiting, then each JetStream
//! `PubAck` awaited, and the mapping of publish errors to per-message results.
//!
//! # Leader elections
//!
//! On a JetStream cluster one server leads each stream and stores what is published to it. When
//! that server dies, the others elect a new leader, which takes seconds; meanwhile nothing
//! answers a publish ("no responders"), and a message the dead leader took is never confirmed.
//! None of that is the message's fault, nor an outage of the broker: a publish waits the election
//! out, within its publish timeout, and sends the message again (its `Nats-Msg-Id` makes a copy
//! the old leader did store a duplicate the stream drops). It does so when nothing serves the
//! stream's subjects while the stream exists, when JetStream answers that it is temporarily
//! unavailable (code 503), when the connection was lost and the client is on another server of
//! the cluster, and, on a clustered stream, when no confirmation came for
//! [`ELECTION_PATIENCE`] and JetStream names no leader or another leader than before. Only a
//! message still unconfirmed at its deadline fails, as a timeout.

use crate::transport::CONTENT_TYPE;
use crate::transport::publish_results;
use std::{collections::VecDeque, future::IntoFuture, sync::atomic::Ordering, time::Duration};

use async_nats::{
    HeaderMap,
    connection::State,
    header::NATS_MESSAGE_ID,
    jetstream::{
        self, ErrorCode,
        context::{PublishAckFuture, PublishErrorKind},
        message::PublishMessage,
    },
};
use tokio::time::Instant;

use super::{Leadership, NatsTransport, config::is_valid_subject};
use crate::transport::{OutgoingMessage, PublishError};

/// Publishes one [`Transport::publish`](crate::transport::Transport::publish) call keeps
/// awaiting a `PubAck` for at most; once reached, it awaits the oldest before sending the next,
/// so huge batches do not pile up in memory.
const PUBLISH_WINDOW: usize = 4_096;

/// Publishes awaiting a `PubAck` per connection, over all concurrent `publish` calls. Past it a
/// publish fails at once with [`PublishError::Rejected`] (to be retried) instead of waiting,
/// which could deadlock calls that each hold unawaited acknowledgements.
pub(super) const MAX_ACKS_IN_FLIGHT: usize = 65_536;

/// On a clustered stream, how long a publish waits for its confirmation before it asks whether
/// the stream's leader changed (and then sends the message again).
pub const ELECTION_PATIENCE: Duration = Duration::from_secs(2);

/// The first pause before a message is sent again during an election; it doubles up to
/// [`MAX_RESEND_PAUSE`].
const FIRST_RESEND_PAUSE: Duration = Duration::from_millis(100);
const MAX_RESEND_PAUSE: Duration = Duration::from_secs(1);

/// What one wait for a confirmation came to.
enum Waited {
    Confirmed,
    /// The message must be sent again: the stream's leader is being elected or changed.
    Resend,
    Failed(PublishError),
}

impl NatsTransport {
    /// [`Transport::publish`](crate::transport::Transport::publish): sends the batch, at most
    /// [`PUBLISH_WINDOW`] awaiting a `PubAck` at a time, and awaits the acknowledgements.
    pub(super) async fn publish_all(
        &self,
        messages: &[OutgoingMessage],
    ) -> Vec<Result<(), PublishError>> {
        let mut results: Vec<Option<Result<(), PublishError>>> = vec![None; messages.len()];
        let mut pending: VecDeque<(usize, String, PublishAckFuture, Instant)> =
            VecDeque::with_capacity(messages.len().min(PUBLISH_WINDOW));
        let timeout = self.inner.config.publish_timeout;
        for (index, message) in messages.iter().enumerate() {
            if pending.len() >= PUBLISH_WINDOW
                && let Some((i, subject, ack, deadline)) = pending.pop_front()
            {
                results[i] = Some(self.confirm(&messages[i], subject, ack, deadline).await);
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
            results[i] = Some(self.confirm(&messages[i], subject, ack, deadline).await);
        }
        publish_results(results)
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
        headers.insert("Content-Type", CONTENT_TYPE);
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
                "{NO_STREAM} `{subject}` (has `setup()` run for stream `{}`?): {err}",
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
                    // "JetStream system temporarily unavailable", a stream or a cluster not ready:
                    // the broker's state, not the message's.
                    Some(api) if api.code() == 503 => {
                        PublishError::Rejected(format!("{UNAVAILABLE} `{subject}`: {api}"))
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

    /// Awaits one `PubAck`, until `deadline`, sending the message again while its stream's
    /// leader is being elected (see the module's documentation).
    async fn confirm(
        &self,
        message: &OutgoingMessage,
        subject: String,
        ack: PublishAckFuture,
        deadline: Instant,
    ) -> Result<(), PublishError> {
        let mut ack = ack.into_future();
        let mut sent = (self.connects(), self.known_leader());
        let mut pause = FIRST_RESEND_PAUSE;
        loop {
            match self.wait(&subject, &mut ack, &sent, deadline).await {
                Waited::Confirmed => return Ok(()),
                Waited::Failed(error) => return Err(error),
                Waited::Resend => {}
            }
            // Send again after a pause, as long as the deadline leaves time for it.
            let now = Instant::now();
            if now + pause >= deadline {
                return Err(PublishError::Timeout(self.inner.config.publish_timeout));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_RESEND_PAUSE);
            sent = (self.connects(), self.known_leader());
            match self.send_one(message).await {
                Ok(again) => ack = again.into_future(),
                Err(error) if self.election_may_explain(&error).await => {
                    // Not sent: wait for the next try as if it had found no leader.
                    ack = Box::pin(std::future::ready(Err(
                        jetstream::context::PublishError::new(PublishErrorKind::BrokenPipe),
                    )));
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// One wait for a confirmation: until `deadline`, or on a clustered stream until
    /// [`ELECTION_PATIENCE`] passed without one and the leader may have changed since the message
    /// was sent (`sent`: the client's connections then, and the leader known then).
    async fn wait(
        &self,
        subject: &str,
        ack: &mut <PublishAckFuture as IntoFuture>::IntoFuture,
        sent: &(u64, Option<String>),
        deadline: Instant,
    ) -> Waited {
        let (sent_on, sent_under) = sent;
        loop {
            let patience = match self.clustered() {
                true => deadline.min(Instant::now() + ELECTION_PATIENCE),
                false => deadline,
            };
            match tokio::time::timeout_at(patience, &mut *ack).await {
                // `duplicate: true` means the stream already stored this event id: still stored.
                Ok(Ok(_ack)) => return Waited::Confirmed,
                Ok(Err(err)) => {
                    let error = self.map_publish_error(subject, err);
                    return match self.election_may_explain(&error).await {
                        true => Waited::Resend,
                        false => Waited::Failed(error),
                    };
                }
                Err(_elapsed) if Instant::now() >= deadline => {
                    return Waited::Failed(PublishError::Timeout(
                        self.inner.config.publish_timeout,
                    ));
                }
                Err(_elapsed) => {
                    // A confirmation sent over a connection since lost never comes.
                    if self.connects() != *sent_on {
                        return Waited::Resend;
                    }
                    match self.leadership().await {
                        // The leader it was sent to still leads: keep waiting for this one.
                        Leadership::Leader(now) if sent_under.as_deref() == Some(now.as_str()) => {}
                        Leadership::Standalone | Leadership::Missing => {}
                        // No leader, or another (or none was known when it was sent).
                        Leadership::Leader(_) | Leadership::NoLeader => return Waited::Resend,
                    }
                }
            }
        }
    }

    /// Whether `error` may come from an election rather than from the message or an outage:
    /// nothing served the stream's subjects though the stream exists, JetStream answered that it
    /// is temporarily unavailable (code 503), or the connection was lost while the client has
    /// servers of a cluster to go to.
    async fn election_may_explain(&self, error: &PublishError) -> bool {
        match error {
            PublishError::Rejected(message) if message.starts_with(UNAVAILABLE) => true,
            PublishError::Rejected(_) if self.no_responders(error) => {
                !matches!(self.leadership().await, Leadership::Missing)
            }
            PublishError::Connection(_) => self.clustered(),
            _ => false,
        }
    }

    /// Whether a rejection says that nothing served the subject ("no responders").
    fn no_responders(&self, error: &PublishError) -> bool {
        matches!(error, PublishError::Rejected(message) if message.starts_with(NO_STREAM))
    }

    /// Times the client connected (a reconnect to the same or another server counts).
    fn connects(&self) -> u64 {
        self.inner
            .client
            .statistics()
            .connects
            .load(Ordering::Relaxed)
    }
}

/// How a rejection for want of a stream serving the subject begins.
const NO_STREAM: &str = "no JetStream stream stores";

/// How a rejection JetStream answered with "temporarily unavailable" (code 503) begins.
const UNAVAILABLE: &str = "JetStream is temporarily unavailable for";
