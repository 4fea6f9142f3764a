//! A subscription: the durable pull consumer of a consumer group ([`durable_name`]), created or
//! updated on subscribe, and [`NatsSubscription`], which pulls from it and skips other types.

use crate::transport::{check_consumer_name, distinct_event_types};
use std::{collections::HashSet, fmt, time::Duration};

use async_nats::{
    Client,
    header::NATS_MESSAGE_ID,
    jetstream::{
        ErrorCode,
        consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull},
        context::GetStreamErrorKind,
    },
};
use futures_util::StreamExt;

use super::{NatsTransport, TRANSPORT, ack::NatsAcker, config::is_valid_subject};
use crate::transport::{Delivery, SubscribeOptions, Subscription, TransportError};

/// Pull requests expire after this long and are renewed.
const PULL_EXPIRES: Duration = Duration::from_secs(30);

/// Messages asked for in one pull request, at most (never more than `max_in_flight`).
const MAX_PULL_BATCH: usize = 256;

impl NatsTransport {
    /// [`Transport::subscribe`](crate::transport::Transport::subscribe): binds the durable pull
    /// consumer and starts pulling.
    pub(super) async fn open_subscription(
        &self,
        consumer: &str,
        event_types: &[String],
        options: &SubscribeOptions,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        let durable = durable_name(consumer);
        check_consumer_name(TRANSPORT, &durable)?;
        let types = distinct_event_types(TRANSPORT, consumer, event_types)?;
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
            .heartbeat(self.inner.config.pull_heartbeat)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_names_are_sanitized() {
        assert_eq!(durable_name("inventory"), "inventory");
        assert_eq!(durable_name("billing.v2 eu/*>"), "billing_v2_eu___");
    }
}
