//! Publishing: every message sent with its `Nats-Msg-Id` without waiting, then each JetStream
//! `PubAck` awaited, and the mapping of publish errors to per-message results.

use crate::transport::CONTENT_TYPE;
use crate::transport::publish_results;
use std::collections::VecDeque;

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

use super::{NatsTransport, config::is_valid_subject};
use crate::transport::{OutgoingMessage, PublishError};

/// Publishes one [`Transport::publish`](crate::transport::Transport::publish) call keeps
/// awaiting a `PubAck` for at most; once reached, it awaits the oldest before sending the next,
/// so huge batches do not pile up in memory.
const PUBLISH_WINDOW: usize = 4_096;

/// Publishes awaiting a `PubAck` per connection, over all concurrent `publish` calls. Past it a
/// publish fails at once with [`PublishError::Rejected`] (to be retried) instead of waiting,
/// which could deadlock calls that each hold unawaited acknowledgements.
pub(super) const MAX_ACKS_IN_FLIGHT: usize = 65_536;

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
}
