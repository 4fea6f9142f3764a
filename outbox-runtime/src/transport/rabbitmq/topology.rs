//! Topology: the topic exchange, each consumer group's durable queue (named by [`queue_name`])
//! and its bindings, with the checks on names and binding keys.

use crate::transport::{check_consumer_name, distinct_event_types};
use lapin::{
    Channel, ExchangeKind,
    options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions},
    protocol::AMQPSoftError,
    types::{FieldTable, ShortString},
};

use super::{MAX_NAME_BYTES, RabbitMqTransport, TRANSPORT, close_quietly};
use crate::transport::TransportError;

/// The durable queue of the consumer group `consumer` under `namespace`:
/// `{namespace}.{consumer}`, with every character other than ASCII letters, digits, `_`, `-`,
/// `.` and `:` replaced by `_`. Two group names that differ only in such characters share a queue.
///
/// ```
/// use outbox_runtime::transport::rabbitmq::queue_name;
///
/// assert_eq!(queue_name("outbox", "inventory"), "outbox.inventory");
/// assert_eq!(queue_name("shop", "billing v2/eu"), "shop.billing_v2_eu");
/// ```
pub fn queue_name(namespace: &str, consumer: &str) -> String {
    let sanitize = |c: char| {
        if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':') {
            c
        } else {
            '_'
        }
    };
    namespace
        .chars()
        .map(sanitize)
        .chain(std::iter::once('.'))
        .chain(consumer.chars().map(sanitize))
        .collect()
}

impl RabbitMqTransport {
    /// Declare the exchange, the durable queue of the consumer group `consumer` and its bindings
    /// for `event_types`, without consuming; returns the queue's name. Idempotent.
    ///
    /// From then on the queue keeps every event of those types for the group, even before its
    /// first [`subscribe`](crate::transport::Transport::subscribe): run it when provisioning,
    /// before producers publish. Bindings are only ever added; remove one that is no longer
    /// wanted with `rabbitmqadmin delete binding` or the management UI (a subscription acks and
    /// skips deliveries of types it did not ask for).
    pub async fn declare_consumer_queue(
        &self,
        consumer: &str,
        event_types: &[String],
    ) -> Result<String, TransportError> {
        let (queue, keys) = self.consumer_topology(consumer, event_types)?;
        let channel = self.channel().await?;
        let result = self.declare_topology(&channel, &queue, &keys).await;
        close_quietly(channel).await;
        result.map(|()| queue.to_string())
    }

    /// Declares the exchange: durable, topic.
    pub(super) async fn declare_exchange(&self, channel: &Channel) -> Result<(), TransportError> {
        let exchange = &self.inner.exchange;
        let options = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        self.api(
            || format!("declare exchange `{exchange}`"),
            channel.exchange_declare(
                short(exchange),
                ExchangeKind::Topic,
                options,
                FieldTable::default(),
            ),
        )
        .await
        .map_err(|err| match err.soft_error() {
            Some(AMQPSoftError::PRECONDITIONFAILED) => TransportError::new(
                TRANSPORT,
                format!(
                    "exchange `{exchange}` exists, but not as a durable topic exchange ({err}): \
                     delete it or configure another exchange or namespace"
                ),
            ),
            _ => err.into_transport_error(&self.inner.display_uri),
        })
    }

    /// The queue and the binding keys of a consumer group, checked.
    pub(super) fn consumer_topology<'a>(
        &self,
        consumer: &str,
        event_types: &'a [String],
    ) -> Result<(ShortString, Vec<&'a str>), TransportError> {
        check_consumer_name(TRANSPORT, consumer)?;
        let name = self.queue_name(consumer);
        let queue = ShortString::try_new(name.as_str()).map_err(|_| {
            TransportError::new(
                TRANSPORT,
                format!(
                    "consumer `{consumer}`: queue name `{name}` is {} bytes long; AMQP allows {MAX_NAME_BYTES}",
                    name.len()
                ),
            )
        })?;
        for event_type in event_types {
            if let Err(reason) = check_binding_key(event_type) {
                return Err(TransportError::new(
                    TRANSPORT,
                    format!("consumer `{consumer}`: {reason}"),
                ));
            }
        }
        let keys = distinct_event_types(TRANSPORT, consumer, event_types)?;
        Ok((queue, keys))
    }

    /// Declares the exchange, the queue and its bindings on `channel`.
    pub(super) async fn declare_topology(
        &self,
        channel: &Channel,
        queue: &ShortString,
        keys: &[&str],
    ) -> Result<(), TransportError> {
        self.declare_exchange(channel).await?;
        let queue_type = self.inner.config.queue_type;
        let options = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        self.api(
            || format!("declare queue `{queue}`"),
            channel.queue_declare(queue.clone(), options, queue_type.arguments()),
        )
        .await
        .map_err(|err| match err.soft_error() {
            Some(AMQPSoftError::PRECONDITIONFAILED) => TransportError::new(
                TRANSPORT,
                format!(
                    "queue `{queue}` exists with other settings than a durable {queue_type:?} \
                     queue ({err}): configure the queue type it has, or delete it \
                     (`rabbitmqctl delete_queue {queue}`; its messages are lost) or use another \
                     consumer name"
                ),
            ),
            Some(AMQPSoftError::RESOURCELOCKED) => TransportError::new(
                TRANSPORT,
                format!("queue `{queue}` is exclusive to another connection ({err})"),
            ),
            _ => err.into_transport_error(&self.inner.display_uri),
        })?;
        let exchange = short(&self.inner.exchange);
        for key in keys {
            self.api(
                || format!("bind queue `{queue}` to exchange `{exchange}` with key `{key}`"),
                channel.queue_bind(
                    queue.clone(),
                    exchange.clone(),
                    short(key),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                ),
            )
            .await
            .map_err(|err| err.into_transport_error(&self.inner.display_uri))?;
        }
        Ok(())
    }
}

/// An AMQP short string from a name already checked to fit.
pub(super) fn short(name: &str) -> ShortString {
    ShortString::try_new(name).unwrap_or_default()
}

/// Whether `event_type` can be a binding key that matches exactly that routing key.
fn check_binding_key(event_type: &str) -> Result<(), String> {
    if event_type.is_empty() {
        return Err("an empty event type cannot be a binding key".to_owned());
    }
    if event_type.len() > MAX_NAME_BYTES {
        return Err(format!(
            "event type `{event_type}` is {} bytes long; AMQP binding keys hold at most \
             {MAX_NAME_BYTES}",
            event_type.len()
        ));
    }
    if event_type.split('.').any(|word| word == "*" || word == "#") {
        return Err(format!(
            "event type `{event_type}` contains a `*` or `#` word, which a topic exchange reads \
             as a wildcard"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_are_sanitized() {
        assert_eq!(queue_name("outbox", "inventory"), "outbox.inventory");
        assert_eq!(
            queue_name("shop.eu", "billing v2/*"),
            "shop.eu.billing_v2__"
        );
        assert_eq!(queue_name("ns", "ünï"), "ns._n_");
    }

    #[test]
    fn binding_keys_cannot_be_wildcards() {
        assert!(check_binding_key("order.placed").is_ok());
        assert!(check_binding_key("order.pl*ced").is_ok());
        assert!(check_binding_key("order.*").is_err());
        assert!(check_binding_key("#").is_err());
        assert!(check_binding_key("").is_err());
        assert!(check_binding_key(&"x".repeat(256)).is_err());
    }
}
