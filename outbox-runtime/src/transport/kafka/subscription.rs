//! Consuming: a member of the consumer's group, handing out deliveries and committing, by hand,
//! only offsets whose messages and every message before them are settled.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    sync::{Arc, Mutex, OnceLock, Weak},
    time::Duration,
};

use bytes::Bytes;
use rdkafka::{
    ClientContext, Message, Offset, TopicPartitionList,
    consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer},
    error::KafkaResult,
    message::Headers,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{
    EVENT_ID_HEADER, EVENT_TYPE_HEADER, KafkaTransport, TRANSPORT, client_config, millis,
    offsets::{Offsets, Partition},
};
use crate::transport::{Acker, Delivery, SubscribeOptions, Subscription, TransportError};

type KafkaConsumer = StreamConsumer<GroupContext>;

/// How long acks are gathered before their offsets are committed together.
const COMMIT_EVERY: Duration = Duration::from_millis(50);

/// State shared by the subscription, its acks, its committer and its rebalance callbacks.
#[derive(Default)]
struct Shared {
    offsets: Mutex<Offsets>,
    /// Commit positions waiting for the committer, per partition.
    to_commit: Mutex<HashMap<Partition, i64>>,
    commit_now: Notify,
    /// A delivery was settled (room for another one).
    settled: Notify,
    consumer: OnceLock<Weak<KafkaConsumer>>,
    seek_timeout: Duration,
}

impl Shared {
    fn offsets(&self) -> std::sync::MutexGuard<'_, Offsets> {
        self.offsets.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn to_commit(&self) -> std::sync::MutexGuard<'_, HashMap<Partition, i64>> {
        self.to_commit.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Settle a delivery and queue the partition's commit when its position moved.
    fn settle(&self, partition: &Partition, offset: i64) {
        if let Some(position) = self.offsets().settle(partition, offset) {
            self.to_commit().insert(partition.clone(), position);
            self.commit_now.notify_one();
        }
        self.settled.notify_one();
    }
}

fn commit_list(positions: impl IntoIterator<Item = (Partition, i64)>) -> TopicPartitionList {
    let mut list = TopicPartitionList::new();
    for ((topic, partition), position) in positions {
        // Only fails for an invalid partition, which a delivered message never has.
        let _ = list.add_partition_offset(&topic, partition, Offset::Offset(position));
    }
    list
}

/// Rebalance and commit callbacks of the group member.
struct GroupContext {
    shared: Arc<Shared>,
    group: String,
}

impl ClientContext for GroupContext {}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(revoked) = rebalance else {
            return;
        };
        let partitions: Vec<Partition> = revoked
            .elements()
            .iter()
            .map(|e| (e.topic().to_owned(), e.partition()))
            .collect();
        // Commit what is settled of the partitions leaving, before another member reads them.
        let positions: Vec<(Partition, i64)> = {
            let mut to_commit = self.shared.to_commit();
            partitions
                .iter()
                .filter_map(|p| to_commit.remove(p).map(|pos| (p.clone(), pos)))
                .collect()
        };
        if !positions.is_empty()
            && let Err(e) = consumer.commit(&commit_list(positions), CommitMode::Sync)
        {
            tracing::warn!(
                group = %self.group, error = %e,
                "kafka: committing revoked partitions failed; their settled messages will be \
                 delivered again to the new owner (the inbox recognises them)"
            );
        }
        let mut offsets = self.shared.offsets();
        for partition in &partitions {
            offsets.revoke(partition);
        }
        tracing::debug!(group = %self.group, revoked = partitions.len(), "kafka partitions revoked");
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(assigned) => {
                let mut offsets = self.shared.offsets();
                for e in assigned.elements() {
                    offsets.assign((e.topic().to_owned(), e.partition()));
                }
                tracing::debug!(group = %self.group, assigned = assigned.count(), "kafka partitions assigned");
            }
            Rebalance::Error(e) => {
                tracing::warn!(group = %self.group, error = %e, "kafka rebalance failed");
            }
            Rebalance::Revoke(_) => {}
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, _offsets: &TopicPartitionList) {
        if let Err(e) = result {
            tracing::warn!(
                group = %self.group, error = %e,
                "kafka offset commit failed; the messages after the last committed offset will \
                 be delivered again after a restart or rebalance (the inbox recognises them)"
            );
        }
    }
}

/// A subscription: one member of the group `{namespace}.{consumer}`.
pub(super) struct KafkaSubscription {
    transport: KafkaTransport,
    consumer: Arc<KafkaConsumer>,
    shared: Arc<Shared>,
    types: HashSet<String>,
    max_in_flight: usize,
    stop: CancellationToken,
    /// The last receive error was logged (logged once per streak).
    failing: bool,
}

impl fmt::Debug for KafkaSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSubscription")
            .field("types", &self.types)
            .field("max_in_flight", &self.max_in_flight)
            .finish_non_exhaustive()
    }
}

impl KafkaSubscription {
    pub(super) fn start(
        transport: &KafkaTransport,
        consumer_name: &str,
        topics: &[String],
        types: HashSet<String>,
        options: &SubscribeOptions,
    ) -> Result<Self, TransportError> {
        let config = transport.config();
        let group = transport.group_id(consumer_name);
        let shared = Arc::new(Shared {
            seek_timeout: config.request_timeout,
            ..Shared::default()
        });
        let session = millis(config.session_timeout);
        let consumer: KafkaConsumer = client_config(&transport.inner.bootstrap_servers, config)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            // A pattern subscription finds topics created later within this long.
            .set("topic.metadata.refresh.interval.ms", "5000")
            .set("session.timeout.ms", session.to_string())
            .set("heartbeat.interval.ms", (session / 4).max(100).to_string())
            .create_with_context(GroupContext {
                shared: shared.clone(),
                group: group.clone(),
            })
            .map_err(|e| {
                TransportError::new(TRANSPORT, format!("cannot create consumer `{group}`: {e}"))
            })?;
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        consumer.subscribe(&names).map_err(|e| {
            TransportError::new(
                TRANSPORT,
                format!("consumer `{group}` cannot subscribe to {topics:?}: {e}"),
            )
        })?;
        let consumer = Arc::new(consumer);
        let _ = shared.consumer.set(Arc::downgrade(&consumer));
        let stop = CancellationToken::new();
        tokio::spawn(commit_loop(
            consumer.clone(),
            shared.clone(),
            stop.clone(),
            group,
        ));
        Ok(KafkaSubscription {
            transport: transport.clone(),
            consumer,
            shared,
            types,
            max_in_flight: options.max_in_flight.max(1),
            stop,
            failing: false,
        })
    }
}

impl Drop for KafkaSubscription {
    fn drop(&mut self) {
        // The committer commits what is settled, then lets the consumer go (it leaves the group).
        self.stop.cancel();
    }
}

/// Commit queued positions every [`COMMIT_EVERY`] while acks come in; at the end, once more,
/// synchronously.
async fn commit_loop(
    consumer: Arc<KafkaConsumer>,
    shared: Arc<Shared>,
    stop: CancellationToken,
    group: String,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = shared.commit_now.notified() => {}
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(COMMIT_EVERY) => {}
        }
        let positions: Vec<(Partition, i64)> = shared.to_commit().drain().collect();
        if !positions.is_empty()
            && let Err(e) = consumer.commit(&commit_list(positions), CommitMode::Async)
        {
            tracing::warn!(group = %group, error = %e, "kafka offset commit could not be sent");
        }
    }
    let positions: Vec<(Partition, i64)> = shared.to_commit().drain().collect();
    let _ = tokio::task::spawn_blocking(move || {
        if !positions.is_empty()
            && let Err(e) = consumer.commit(&commit_list(positions), CommitMode::Sync)
        {
            tracing::warn!(group = %group, error = %e, "kafka: the last offset commit failed");
        }
        consumer.unsubscribe();
        drop(consumer);
    })
    .await;
}

fn header<'a>(message: &'a impl Message, name: &str) -> Option<&'a str> {
    let headers = message.headers()?;
    headers
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| std::str::from_utf8(h.value?).ok())
}

#[async_trait::async_trait]
impl Subscription for KafkaSubscription {
    async fn next(&mut self) -> Option<Result<Delivery, TransportError>> {
        loop {
            // At most `max_in_flight` deliveries unsettled.
            loop {
                let room = self.shared.settled.notified();
                if self.shared.offsets().unsettled() < self.max_in_flight {
                    break;
                }
                tokio::select! {
                    _ = self.stop.cancelled() => return None,
                    _ = room => {}
                }
            }
            let message = match self.consumer.recv().await {
                Ok(message) => message,
                Err(e) => {
                    // librdkafka reconnects and rejoins by itself: report the first error of a
                    // streak and keep reading.
                    if !self.failing {
                        self.failing = true;
                        tracing::warn!(error = %e, "kafka consumer error; librdkafka retries");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            self.failing = false;
            let partition: Partition = (message.topic().to_owned(), message.partition());
            let offset = message.offset();
            let event_type = header(&message, EVENT_TYPE_HEADER).map(str::to_owned);
            let count = self.shared.offsets().delivered(&partition, offset);
            if let Some(other) = &event_type
                && !self.types.contains(other)
            {
                // Another consumer's type on a shared topic: consumed as far as this one goes.
                self.shared.settle(&partition, offset);
                continue;
            }
            let body = Bytes::copy_from_slice(message.payload().unwrap_or_default());
            let subject = self
                .transport
                .subject(event_type.as_deref().unwrap_or(message.topic()));
            let message_id = header(&message, EVENT_ID_HEADER).map(str::to_owned);
            let acker = KafkaAcker {
                shared: self.shared.clone(),
                partition,
                offset,
            };
            return Some(Ok(Delivery::new(
                body,
                subject,
                message_id,
                count,
                Box::new(acker),
            )));
        }
    }
}

/// Settles one delivery: records it as done for the offset commit, or rewinds its partition.
struct KafkaAcker {
    shared: Arc<Shared>,
    partition: Partition,
    offset: i64,
}

#[async_trait::async_trait]
impl Acker for KafkaAcker {
    async fn ack(&self) -> Result<(), TransportError> {
        self.shared.settle(&self.partition, self.offset);
        Ok(())
    }

    async fn nack(&self, delay: Option<Duration>) -> Result<(), TransportError> {
        let (shared, (topic, partition), offset) =
            (self.shared.clone(), self.partition.clone(), self.offset);
        // The partition's later messages go on meanwhile; its commits stay behind this one.
        tokio::spawn(async move {
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
            let key = (topic.clone(), partition);
            if !shared.offsets().rewind(&key, offset) {
                return; // revoked or already rewound past it: the new owner reads it again
            }
            shared.settled.notify_one();
            let Some(consumer) = shared.consumer.get().and_then(Weak::upgrade) else {
                return;
            };
            let timeout = shared.seek_timeout;
            let _ = tokio::task::spawn_blocking(move || {
                if let Err(e) = consumer.seek(&topic, partition, Offset::Offset(offset), timeout) {
                    tracing::warn!(
                        topic, partition, offset, error = %e,
                        "kafka: seeking back to a nacked message failed; it is delivered again \
                         after a restart or rebalance"
                    );
                }
            })
            .await;
        });
        Ok(())
    }
}
