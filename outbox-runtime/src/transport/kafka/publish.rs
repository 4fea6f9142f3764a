//! Publishing: every message of a batch is handed to the idempotent producer, then each counts
//! as confirmed only by its delivery report (partition and offset known). `send` merely queues.

use std::time::Duration;

use rdkafka::{
    error::{KafkaError, RDKafkaErrorCode},
    message::{Header, OwnedHeaders},
    producer::{FutureRecord, Producer},
};

use super::{EVENT_ID_HEADER, EVENT_TYPE_HEADER, KafkaTransport};
use crate::transport::{CONTENT_TYPE, OutgoingMessage, PublishError};

/// Bytes a record takes besides its value and key: the record's own framing and its headers'.
fn header_bytes(headers: &[(&str, &[u8])]) -> usize {
    64 + headers
        .iter()
        .map(|(name, value)| name.len() + value.len() + 8)
        .sum::<usize>()
}

impl KafkaTransport {
    /// [`Transport::publish`](crate::transport::Transport::publish).
    pub(super) async fn publish_all(
        &self,
        messages: &[OutgoingMessage],
    ) -> Vec<Result<(), PublishError>> {
        let config = &self.inner.config;
        let producer = self.producer();
        let mut pending = Vec::with_capacity(messages.len());
        let mut results: Vec<Option<Result<(), PublishError>>> = vec![None; messages.len()];
        let topics: Vec<String> = messages
            .iter()
            .map(|m| config.topic_for(&m.event_type, &m.aggregate_type))
            .collect();
        // Each topic of the batch made sure of once; a topic that cannot be created fails only
        // its own messages.
        let mut unavailable: std::collections::HashMap<&str, String> = Default::default();
        for topic in topics.iter().collect::<std::collections::BTreeSet<_>>() {
            if let Err(error) = self.ensure_topics(std::slice::from_ref(topic)).await {
                unavailable.insert(topic, error.to_string());
            }
        }
        for (index, (message, topic)) in messages.iter().zip(&topics).enumerate() {
            if let Some(error) = unavailable.get(topic.as_str()) {
                results[index] = Some(Err(PublishError::Connection(error.clone())));
                continue;
            }
            let event_id = message.event_id.to_string();
            let mut headers: Vec<(&str, &[u8])> = vec![
                ("content-type", CONTENT_TYPE.as_bytes()),
                (EVENT_ID_HEADER, event_id.as_bytes()),
                (EVENT_TYPE_HEADER, message.event_type.as_bytes()),
            ];
            headers.extend(
                message
                    .headers
                    .iter()
                    .map(|(name, value)| (name.as_str(), value.as_bytes())),
            );
            let size = message.body.len() + message.aggregate_id.len() + header_bytes(&headers);
            if size > config.max_message_bytes {
                results[index] = Some(Err(PublishError::Permanent(format!(
                    "event `{}` ({}) is {size} bytes as a Kafka record, over the limit of {} bytes \
                     (`max_message_bytes`, the producer's `message.max.bytes`)",
                    message.event_id, message.event_type, config.max_message_bytes
                ))));
                continue;
            }
            let record = FutureRecord::to(topic)
                .key(message.aggregate_id.as_bytes())
                .payload(&message.body[..])
                .headers(headers.iter().fold(OwnedHeaders::new(), |h, (key, value)| {
                    h.insert(Header {
                        key,
                        value: Some(*value),
                    })
                }));
            match producer.send_result(record) {
                Ok(delivery) => pending.push((index, delivery)),
                Err((error, _)) => results[index] = Some(Err(queue_error(error))),
            }
        }
        // Every delivery report arrives within `message.timeout.ms` (the publish timeout);
        // waiting a little longer bounds a producer that stopped reporting.
        let deadline =
            tokio::time::Instant::now() + config.publish_timeout + Duration::from_secs(5);
        // A failure that says the producer itself cannot go on.
        let mut broken: Option<String> = None;
        for (index, delivery) in pending {
            let result = match tokio::time::timeout_at(deadline, delivery).await {
                Ok(Ok(Ok(report))) if report.partition >= 0 && report.offset >= 0 => Ok(()),
                Ok(Ok(Ok(report))) => Err(PublishError::Rejected(format!(
                    "delivery report without a position (partition {}, offset {})",
                    report.partition, report.offset
                ))),
                Ok(Ok(Err((error, _)))) => {
                    if broken.is_none() && producer_state_error(&error) {
                        broken = Some(error.to_string());
                    }
                    Err(delivery_error(error, config.publish_timeout))
                }
                Ok(Err(_canceled)) => Err(PublishError::Connection(
                    "the producer was closed before the delivery report".into(),
                )),
                Err(_) => Err(PublishError::Timeout(config.publish_timeout)),
            };
            results[index] = Some(result);
        }
        let fatal = producer
            .client()
            .fatal_error()
            .map(|(code, reason)| format!("{code}: {reason}"))
            .or(broken);
        if let Some(fatal) = fatal {
            // The producer cannot be used again: what it failed is not the messages' fault.
            let reason = format!("the producer hit a fatal error ({fatal})");
            self.replace_producer(&producer, &reason);
            for result in results.iter_mut().flatten() {
                if let Err(error) = result
                    && !error.is_permanent()
                {
                    *result = Err(PublishError::Connection(reason.clone()));
                }
            }
        }
        crate::transport::publish_results(results)
    }
}

/// A message librdkafka did not take into its queue.
fn queue_error(error: KafkaError) -> PublishError {
    match error.rdkafka_error_code() {
        Some(RDKafkaErrorCode::QueueFull) => PublishError::Connection(
            "the producer's queue is full: the broker is not taking messages".into(),
        ),
        Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidMessageSize) => {
            PublishError::Permanent(format!("the producer refused the message: {error}"))
        }
        _ => PublishError::Rejected(format!("the producer refused the message: {error}")),
    }
}

/// Whether a failed delivery says the producer's own state is broken (fenced, out of sequence):
/// it cannot publish again, a new producer can.
fn producer_state_error(error: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        error.rdkafka_error_code(),
        Some(
            C::Fatal
                | C::ProducerFenced
                | C::InvalidProducerEpoch
                | C::OutOfOrderSequenceNumber
                | C::UnknownProducerId
                | C::InvalidProducerIdMapping
        )
    )
}

/// A failed delivery report.
fn delivery_error(error: KafkaError, timeout: Duration) -> PublishError {
    use RDKafkaErrorCode as C;
    match error.rdkafka_error_code() {
        Some(C::MessageTimedOut | C::RequestTimedOut) => PublishError::Timeout(timeout),
        Some(C::MessageSizeTooLarge | C::InvalidMessageSize | C::MessageBatchTooLarge) => {
            PublishError::Permanent(format!("the broker refused the message: {error}"))
        }
        // The producer's state, not the message: a new producer publishes it.
        _ if producer_state_error(&error) => {
            PublishError::Connection(format!("the producer cannot go on: {error}"))
        }
        Some(
            C::AllBrokersDown
            | C::BrokerTransportFailure
            | C::NetworkException
            | C::BrokerNotAvailable
            | C::PurgeQueue
            | C::PurgeInflight,
        ) => PublishError::Connection(error.to_string()),
        _ => PublishError::Rejected(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_failures_map_to_publish_errors() {
        let failed = |code| KafkaError::MessageProduction(code);
        let timeout = Duration::from_secs(10);
        assert_eq!(
            delivery_error(failed(RDKafkaErrorCode::MessageTimedOut), timeout),
            PublishError::Timeout(timeout)
        );
        assert!(
            delivery_error(failed(RDKafkaErrorCode::MessageSizeTooLarge), timeout).is_permanent()
        );
        assert!(matches!(
            delivery_error(failed(RDKafkaErrorCode::AllBrokersDown), timeout),
            PublishError::Connection(_)
        ));
        assert!(matches!(
            delivery_error(failed(RDKafkaErrorCode::UnknownTopicOrPartition), timeout),
            PublishError::Rejected(_)
        ));
        assert!(queue_error(failed(RDKafkaErrorCode::QueueFull)).may_be_unavailable());
    }
}
