//! Publishing with publisher confirms: the single confirm-mode channel, the properties of each
//! message, and a batch's sends, confirms and returns mapped to per-message results.

use crate::transport::publish_results;
use std::{
    collections::HashMap,
    time::{SystemTime, UNIX_EPOCH},
};

use futures_util::FutureExt;
use lapin::{
    BasicProperties, Channel, Confirmation, ErrorKind, ExchangeKind, PublisherConfirm,
    message::BasicReturnMessage,
    options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions},
    protocol::{AMQPErrorKind, AMQPSoftError, constants::REPLY_SUCCESS},
    types::{AMQPValue, FieldTable, LongString, ShortString},
};
use tokio::time::Instant;

use super::{MAX_NAME_BYTES, RabbitMqTransport, connection::CLOSE_TIMEOUT, short};
use crate::transport::{OutgoingMessage, PublishError};

/// The `content_type` of every published message: a CloudEvents 1.0 JSON envelope
/// (structured mode).
pub use crate::transport::CONTENT_TYPE;

pub(super) struct PublishChannel {
    channel: Channel,
    /// Set while a batch runs on the channel; still set afterwards means that batch was cancelled
    /// midway and the channel holds confirms nobody awaits.
    in_use: bool,
}

impl RabbitMqTransport {
    /// [`Transport::publish`](crate::transport::Transport::publish): the batch on the publish
    /// channel, one call at a time.
    pub(super) async fn publish_all(
        &self,
        messages: &[OutgoingMessage],
    ) -> Vec<Result<(), PublishError>> {
        if messages.is_empty() {
            return Vec::new();
        }
        let mut slot = self.inner.publisher.lock().await;
        let channel = match self.publish_channel(&mut slot).await {
            Ok(channel) => channel,
            Err(err) => return vec![Err(err); messages.len()],
        };
        if let Some(current) = slot.as_mut() {
            current.in_use = true;
        }
        let generation = self.generation();
        let batch = self.publish_batch(&channel, messages).await;
        match slot.as_mut() {
            Some(current) if !batch.retire => current.in_use = false,
            _ => *slot = None,
        }
        if batch.timed_out {
            // A silent connection (a partition, a dead host) would time every batch out.
            self.give_up(generation, "a publish confirm").await;
        }
        batch.results
    }

    /// The publish channel: the current one when it is usable, otherwise a new one in confirm
    /// mode (reconnecting first when needed), once the exchange is known to exist.
    async fn publish_channel(
        &self,
        slot: &mut Option<PublishChannel>,
    ) -> Result<Channel, PublishError> {
        if let Some(current) = slot.as_ref() {
            if !current.in_use && current.channel.status().connected() {
                return Ok(current.channel.clone());
            }
            if current.in_use {
                tracing::debug!("a publish was cancelled midway; replacing its channel");
            }
            *slot = None;
        }
        let uri = &self.inner.display_uri;
        let channel = self
            .channel()
            .await
            .map_err(|err| PublishError::Connection(err.message))?;
        // Check the exchange before publishing to it. A publish to a missing exchange makes the
        // broker close the channel, and lapin may still write publish frames queued for it after
        // its `close-ok`, which the broker answers by closing the whole connection.
        let exchange = &self.inner.exchange;
        let passive = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        self.api(
            || format!("check exchange `{exchange}`"),
            channel.exchange_declare(
                short(exchange),
                ExchangeKind::Topic,
                passive,
                FieldTable::default(),
            ),
        )
        .await
        .map_err(|err| match err.soft_error() {
            Some(AMQPSoftError::NOTFOUND) => PublishError::Rejected(format!(
                "exchange `{exchange}` does not exist (has `setup()` run?): {err}"
            )),
            Some(_) => PublishError::Rejected(format!("{err} (RabbitMQ at {uri})")),
            None => PublishError::Connection(format!("{err} (RabbitMQ at {uri})")),
        })?;
        self.api(
            || "enable publisher confirms".to_owned(),
            channel.confirm_select(ConfirmSelectOptions::default()),
        )
        .await
        .map_err(|err| PublishError::Connection(format!("{err} (RabbitMQ at {uri})")))?;
        *slot = Some(PublishChannel {
            channel: channel.clone(),
            in_use: false,
        });
        Ok(channel)
    }

    /// The routing key of a message, or why it cannot be sent at all.
    fn check_message(&self, message: &OutgoingMessage) -> Result<ShortString, PublishError> {
        let max = self.inner.config.max_message_size;
        if message.body.len() > max {
            return Err(PublishError::Permanent(format!(
                "event `{}` is {} bytes, more than the maximum message size of {max} bytes \
                 (`max_message_size`, which should match the broker's)",
                message.event_id,
                message.body.len()
            )));
        }
        if message.event_type.is_empty() {
            return Err(PublishError::Permanent(format!(
                "event `{}` has an empty event type, which cannot be a routing key",
                message.event_id
            )));
        }
        ShortString::try_new(message.event_type.as_str()).map_err(|_| {
            PublishError::Permanent(format!(
                "event type `{}` is {} bytes long; AMQP routing keys hold at most {MAX_NAME_BYTES}",
                message.event_type,
                message.event_type.len()
            ))
        })
    }

    fn properties(message: &OutgoingMessage, routing_key: &ShortString) -> BasicProperties {
        let event_id = message.event_id.to_string();
        let mut headers = FieldTable::default();
        headers.insert("ce-specversion".into(), long("1.0"));
        headers.insert("ce-id".into(), long(&event_id));
        headers.insert("ce-type".into(), long(&message.event_type));
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        BasicProperties::default()
            .with_content_type(CONTENT_TYPE.into())
            .with_delivery_mode(2)
            .with_message_id(event_id.into())
            .with_type(routing_key.clone())
            .with_timestamp(now)
            .with_app_id("outbox".into())
            .with_headers(headers)
    }

    fn publish_error(&self, err: &lapin::Error) -> PublishError {
        let exchange = &self.inner.exchange;
        match err.kind() {
            ErrorKind::ProtocolError(amqp) => match amqp.kind() {
                AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) => PublishError::Rejected(format!(
                    "exchange `{exchange}` does not exist (has `setup()` run?): {amqp}"
                )),
                AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) => PublishError::Rejected(
                    format!("the broker refused publishing to exchange `{exchange}`: {amqp}"),
                ),
                AMQPErrorKind::Soft(_) => {
                    PublishError::Rejected(format!("the broker closed the publish channel: {amqp}"))
                }
                AMQPErrorKind::Hard(_) => PublishError::Connection(format!(
                    "RabbitMQ at {} closed the connection: {amqp}",
                    self.inner.display_uri
                )),
            },
            _ => PublishError::Connection(format!(
                "publishing to RabbitMQ at {}: {err}",
                self.inner.display_uri
            )),
        }
    }

    /// Publishes `messages` on `channel` and awaits their confirms. See
    /// [`Transport::publish`](crate::transport::Transport::publish).
    async fn publish_batch(&self, channel: &Channel, messages: &[OutgoingMessage]) -> Batch {
        let timeout = self.inner.config.publish_timeout;
        let exchange = short(&self.inner.exchange);
        let mandatory = BasicPublishOptions {
            mandatory: true,
            immediate: false,
        };
        let mut results: Vec<Option<Result<(), PublishError>>> = vec![None; messages.len()];
        let mut retire = false;
        let mut send_timed_out = false;

        // 1. Send everything; the confirms are awaited afterwards.
        let mut awaiting: Vec<(usize, PublisherConfirm, Instant)> =
            Vec::with_capacity(messages.len());
        let mut send_failure: Option<PublishError> = None;
        let mut unsent: Vec<usize> = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            if send_failure.is_some() {
                unsent.push(index);
                continue;
            }
            let routing_key = match self.check_message(message) {
                Ok(key) => key,
                Err(err) => {
                    results[index] = Some(Err(err));
                    continue;
                }
            };
            let properties = Self::properties(message, &routing_key);
            let deadline = Instant::now() + timeout;
            let send = channel.basic_publish(
                exchange.clone(),
                routing_key,
                mandatory,
                &message.body,
                properties,
            );
            match tokio::time::timeout_at(deadline, send).await {
                Ok(Ok(confirm)) => awaiting.push((index, confirm, deadline)),
                Ok(Err(err)) => {
                    retire = true;
                    send_failure = Some(self.publish_error(&err));
                    unsent.push(index);
                }
                Err(_elapsed) => {
                    retire = true;
                    send_timed_out = true;
                    send_failure = Some(PublishError::Timeout(timeout));
                    unsent.push(index);
                }
            }
        }

        // 2. Await every confirm, each until its own deadline.
        let mut returned: Vec<BasicReturnMessage> = Vec::new();
        let mut confirmed: Vec<(usize, bool)> = Vec::with_capacity(awaiting.len());
        let mut timed_out: Vec<PublisherConfirm> = Vec::new();
        let mut channel_failure: Option<PublishError> = None;
        for (index, mut confirm, deadline) in awaiting {
            match tokio::time::timeout_at(deadline, &mut confirm).await {
                Ok(Ok(Confirmation::Ack(message))) => {
                    returned.extend(message);
                    confirmed.push((index, true));
                }
                Ok(Ok(Confirmation::Nack(message))) => {
                    returned.extend(message);
                    confirmed.push((index, false));
                }
                Ok(Ok(Confirmation::NotRequested)) => {
                    retire = true;
                    results[index] = Some(Err(PublishError::Rejected(
                        "internal error: the publish channel is not in confirm mode".to_owned(),
                    )));
                }
                Ok(Err(err)) => {
                    retire = true;
                    let err = self.publish_error(&err);
                    channel_failure.get_or_insert_with(|| err.clone());
                    results[index] = Some(Err(err));
                }
                Err(_elapsed) => {
                    retire = true;
                    results[index] = Some(Err(PublishError::Timeout(timeout)));
                    timed_out.push(confirm);
                }
            }
        }

        // 3. After a timeout, close the channel so every confirm still pending resolves (acked,
        //    nacked or failed): a late one may carry the return of another message.
        let mut returns_complete = true;
        let timed_out_any = send_timed_out || !timed_out.is_empty();
        if !timed_out.is_empty() {
            let close = channel.close(REPLY_SUCCESS, "outbox: publisher confirm timeout".into());
            if tokio::time::timeout(CLOSE_TIMEOUT, close).await.is_err() {
                tracing::warn!(exchange = %self.inner.exchange, "closing a stalled publish channel timed out");
            }
            for confirm in timed_out {
                match confirm.now_or_never() {
                    Some(Ok(confirmation)) => returned.extend(confirmation.take_message()),
                    Some(Err(_)) => {}
                    None => returns_complete = false,
                }
            }
        }

        // 4. Match returns to messages by event id and routing key.
        let mut returns: HashMap<(String, String), String> = HashMap::new();
        for message in returned {
            let id = message
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.to_string())
                .unwrap_or_default();
            let key = message.delivery.routing_key.to_string();
            let reason = format!("{} {}", message.reply_code, message.reply_text);
            returns.insert((id, key), reason);
        }
        // Returns this soon after connecting say the broker is not ready (see `recovery_grace`).
        let age = self.connection_age();
        let recovering = age < self.inner.config.recovery_grace;
        let mut matched = 0;
        for (index, acked) in confirmed {
            let message = &messages[index];
            let key = (message.event_id.to_string(), message.event_type.clone());
            results[index] = Some(if let Some(reason) = returns.get(&key) {
                matched += 1;
                if recovering {
                    Err(PublishError::Connection(format!(
                        "RabbitMQ returned the message as unroutable (routing key `{}` on \
                         exchange `{}`: {reason}) {age:.1?} after the connection opened: a \
                         broker back from a restart routes to a durable queue only once it has \
                         recovered it, so for {:?} after connecting this is taken for a broker \
                         that is not ready yet",
                        message.event_type, self.inner.exchange, self.inner.config.recovery_grace
                    )))
                } else {
                    Err(PublishError::Rejected(format!(
                        "unroutable: no queue is bound for routing key `{}` on exchange `{}` \
                         (the broker returned the message: {reason}); declare the consumers' \
                         queues before publishing",
                        message.event_type, self.inner.exchange
                    )))
                }
            } else if !acked {
                Err(PublishError::Rejected(format!(
                    "the broker refused to store the message (basic.nack), e.g. a queue bound \
                     for `{}` is full and rejects publishes",
                    message.event_type
                )))
            } else if !returns_complete {
                // A confirm that never resolved may hold this message's return: unknown.
                Err(PublishError::Timeout(timeout))
            } else {
                Ok(())
            });
        }
        if matched < returns.len() {
            tracing::warn!(
                exchange = %self.inner.exchange,
                unmatched = returns.len() - matched,
                "the broker returned messages that are not part of the batch"
            );
        }
        if let Some(failure) = channel_failure.or(send_failure) {
            for index in unsent {
                results[index] = Some(Err(failure.clone()));
            }
        }
        let results = publish_results(results);
        Batch {
            results,
            retire,
            timed_out: timed_out_any,
        }
    }
}

/// The outcome of one batch.
struct Batch {
    results: Vec<Result<(), PublishError>>,
    /// The channel must not be used again.
    retire: bool,
    /// A send or a confirm timed out: the connection is given up too.
    timed_out: bool,
}

fn long(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}
