//! A subscription: declaring the consumer's queue and consuming it on a channel of its own
//! ([`RabbitMqSubscription`]), skipping other event types, and counting deliveries.

use std::{collections::HashSet, fmt};

use bytes::Bytes;
use futures_util::StreamExt;
use lapin::{
    Channel, Consumer,
    options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions},
    types::{AMQPValue, FieldTable, ShortString},
};

use super::{RabbitMqTransport, TRANSPORT, ack::RabbitMqAcker};
use crate::transport::{Delivery, SubscribeOptions, Subscription, TransportError, routing_name};

impl RabbitMqTransport {
    /// [`Transport::subscribe`](crate::transport::Transport::subscribe): declares the topology,
    /// sets the prefetch and starts consuming.
    pub(super) async fn open_subscription(
        &self,
        consumer: &str,
        event_types: &[String],
        options: &SubscribeOptions,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        let (queue, keys) = self.consumer_topology(consumer, event_types)?;
        let channel = self.channel().await?;
        self.declare_topology(&channel, &queue, &keys).await?;
        let prefetch = self.inner.config.effective_prefetch(options);
        self.api(
            || format!("set the prefetch of a consumer of `{queue}`"),
            channel.basic_qos(prefetch, BasicQosOptions::default()),
        )
        .await
        .map_err(|err| err.into_transport_error(&self.inner.display_uri))?;
        let tag_consumer: String = consumer.chars().take(100).collect();
        let tag = format!("outbox:{tag_consumer}:{}", uuid::Uuid::new_v4().simple());
        let consumer_stream = self
            .api(
                || format!("consume queue `{queue}`"),
                channel.basic_consume(
                    queue.clone(),
                    ShortString::try_new(tag).unwrap_or_default(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                ),
            )
            .await
            .map_err(|err| err.into_transport_error(&self.inner.display_uri))?;
        tracing::debug!(
            queue = %queue,
            exchange = %self.inner.exchange,
            event_types = ?keys,
            prefetch,
            "subscribed"
        );
        Ok(Box::new(RabbitMqSubscription {
            queue: queue.to_string(),
            namespace: self.inner.config.namespace.clone(),
            event_types: keys.iter().map(|key| (*key).to_owned()).collect(),
            consumer: consumer_stream,
            _channel: channel,
            finished: false,
        }))
    }
}

/// The broker's count of earlier deliveries (`x-delivery-count`, quorum queues) plus one;
/// otherwise 2 when the message is flagged redelivered, 1 when not.
fn delivery_count(delivery: &lapin::message::Delivery) -> u32 {
    let counted = delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get("x-delivery-count"))
        .and_then(amqp_u32);
    match counted {
        Some(earlier) => earlier.saturating_add(1),
        None if delivery.redelivered => 2,
        None => 1,
    }
}

fn amqp_u32(value: &AMQPValue) -> Option<u32> {
    match value {
        AMQPValue::ShortShortUInt(n) => Some(u32::from(*n)),
        AMQPValue::ShortUInt(n) => Some(u32::from(*n)),
        AMQPValue::LongUInt(n) => Some(*n),
        AMQPValue::ShortShortInt(n) => u32::try_from(*n).ok(),
        AMQPValue::ShortInt(n) => u32::try_from(*n).ok(),
        AMQPValue::LongInt(n) => u32::try_from(*n).ok(),
        AMQPValue::LongLongInt(n) => u32::try_from(*n).ok(),
        _ => None,
    }
}

/// The deliveries of one consumer on its own channel; dropping it closes the channel, and the
/// broker requeues whatever was not acked.
struct RabbitMqSubscription {
    queue: String,
    namespace: String,
    /// Routing keys handed out; others are acked and skipped.
    event_types: HashSet<String>,
    consumer: Consumer,
    _channel: Channel,
    finished: bool,
}

impl fmt::Debug for RabbitMqSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitMqSubscription")
            .field("queue", &self.queue)
            .field("consumer_tag", &self.consumer.tag())
            .field("event_types", &self.event_types)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl Subscription for RabbitMqSubscription {
    async fn next(&mut self) -> Option<Result<Delivery, TransportError>> {
        loop {
            if self.finished {
                return None;
            }
            let delivery = match self.consumer.next().await {
                Some(Ok(delivery)) => delivery,
                Some(Err(err)) => {
                    self.finished = true;
                    return Some(Err(TransportError::new(
                        TRANSPORT,
                        format!(
                            "consuming queue `{}` failed: {err}; unacked deliveries return to \
                             the queue, subscribe again",
                            self.queue
                        ),
                    )));
                }
                None => {
                    // Cancelled: the channel closed or the queue was deleted.
                    self.finished = true;
                    return None;
                }
            };
            if delivery.acker.poisoned() {
                // Received before its channel closed: it cannot be acked, and the broker
                // redelivers it.
                continue;
            }
            if !self.event_types.contains(delivery.routing_key.as_str()) {
                // A binding of an earlier subscription of this group: settle and skip it.
                if let Err(err) = delivery.acker.ack(BasicAckOptions::default()).await {
                    tracing::warn!(
                        queue = %self.queue,
                        routing_key = %delivery.routing_key,
                        error = %err,
                        "could not ack a skipped delivery; it will be redelivered and skipped again"
                    );
                }
                continue;
            }
            let delivery_count = delivery_count(&delivery);
            let lapin::message::Delivery {
                routing_key,
                properties,
                data,
                acker,
                ..
            } = delivery;
            let message_id = properties.message_id().as_ref().map(|id| id.to_string());
            return Some(Ok(Delivery::new(
                Bytes::from(data),
                routing_name(&self.namespace, routing_key.as_str()),
                message_id,
                delivery_count,
                Box::new(RabbitMqAcker {
                    acker,
                    queue: self.queue.clone(),
                }),
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::BasicProperties;

    #[test]
    fn delivery_counts_come_from_the_header_or_the_flag() {
        let mut delivery =
            lapin::message::Delivery::mock(1, "x".into(), "order.placed".into(), false, vec![]);
        assert_eq!(delivery_count(&delivery), 1);
        delivery.redelivered = true;
        assert_eq!(delivery_count(&delivery), 2);
        let mut headers = FieldTable::default();
        headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(4));
        delivery.properties = BasicProperties::default().with_headers(headers);
        assert_eq!(delivery_count(&delivery), 5);
    }
}
