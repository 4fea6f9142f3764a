//! An in-process transport for tests and examples, with fault injection.
//!
//! Published messages are appended to one ordered log (the "stream"); consumer groups read it
//! with explicit ack, nack and redelivery after an ack wait, like a broker's durable consumer.
//! Faults can be injected on the publish path: fail the next N messages, fail at random, fail
//! messages matching a predicate, delay confirms, or lose a confirm after storing the message.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    fmt,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use bytes::Bytes;
use tokio::sync::watch;
use uuid::Uuid;

use super::{
    Acker, Delivery, OutgoingMessage, PublishError, SubscribeOptions, Subscription, Transport,
    TransportError, routing_name,
};

type Predicate = Arc<dyn Fn(&OutgoingMessage) -> bool + Send + Sync>;

/// One message the transport accepted.
#[derive(Debug, Clone)]
pub struct StoredMessage {
    /// Position in the log, from 1.
    pub seq: u64,
    /// Routing name.
    pub subject: String,
    /// Event id (the message id).
    pub event_id: Uuid,
    /// Event type.
    pub event_type: String,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// The body as published.
    pub body: Bytes,
}

/// In-process transport. Clones share the same log and consumer groups.
#[derive(Clone)]
pub struct MemoryTransport {
    shared: Arc<Shared>,
}

struct Shared {
    namespace: String,
    state: Mutex<State>,
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    log: Vec<StoredMessage>,
    dedup: Option<HashSet<Uuid>>,
    groups: HashMap<String, Group>,
    faults: Faults,
    publish_calls: u64,
    duplicates_dropped: u64,
}

#[derive(Default)]
struct Faults {
    fail_next: usize,
    lose_confirm_next: usize,
    confirm_delay: Duration,
    fail_probability: f64,
    fail_matching: Option<Predicate>,
    permanent_matching: Option<Predicate>,
    unavailable: bool,
    lose_acks: usize,
}

struct Group {
    event_types: HashSet<String>,
    cursor: usize,
    ready: VecDeque<(u64, u32)>,
    in_flight: HashMap<u64, InFlight>,
    ack_wait: Duration,
    max_in_flight: usize,
}

struct InFlight {
    deadline: Instant,
    count: u32,
}

impl fmt::Debug for MemoryTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        f.debug_struct("MemoryTransport")
            .field("namespace", &self.shared.namespace)
            .field("messages", &state.log.len())
            .field("groups", &state.groups.len())
            .finish()
    }
}

impl Default for MemoryTransport {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryTransport {
    /// A transport under the default namespace, without broker-side deduplication.
    pub fn new() -> Self {
        Self::with_namespace(super::DEFAULT_NAMESPACE)
    }

    /// A transport under `namespace`.
    pub fn with_namespace(namespace: impl Into<String>) -> Self {
        let (changed, _) = watch::channel(0);
        MemoryTransport {
            shared: Arc::new(Shared {
                namespace: namespace.into(),
                state: Mutex::new(State::default()),
                changed,
            }),
        }
    }

    /// Drop a message whose event id was already accepted, like JetStream's `Nats-Msg-Id`
    /// window (here: forever). The publish still reports success.
    pub fn deduplicate(self, on: bool) -> Self {
        self.state().dedup = on.then(HashSet::new);
        self
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.shared.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Reject the next `n` messages (not stored).
    pub fn fail_next_publishes(&self, n: usize) {
        self.state().faults.fail_next = n;
    }

    /// Store the next `n` messages but report them as unconfirmed (a lost confirm).
    pub fn lose_next_confirms(&self, n: usize) {
        self.state().faults.lose_confirm_next = n;
    }

    /// Report the next `n` consumer acks as done but forget them, so the messages are
    /// redelivered after the ack wait (an ack lost on the way to the broker).
    pub fn lose_next_acks(&self, n: usize) {
        self.state().faults.lose_acks = n;
    }

    /// Wait this long before confirming each publish call.
    pub fn delay_confirms(&self, delay: Duration) {
        self.state().faults.confirm_delay = delay;
    }

    /// Reject each message with this probability (0.0 to 1.0).
    pub fn fail_randomly(&self, probability: f64) {
        self.state().faults.fail_probability = probability.clamp(0.0, 1.0);
    }

    /// Reject (retryably) every message matching `predicate`; `None` stops.
    pub fn fail_matching(
        &self,
        predicate: Option<impl Fn(&OutgoingMessage) -> bool + Send + Sync + 'static>,
    ) {
        self.state().faults.fail_matching = predicate.map(|p| Arc::new(p) as Predicate);
    }

    /// Reject permanently every message matching `predicate`; `None` stops.
    pub fn reject_permanently(
        &self,
        predicate: Option<impl Fn(&OutgoingMessage) -> bool + Send + Sync + 'static>,
    ) {
        self.state().faults.permanent_matching = predicate.map(|p| Arc::new(p) as Predicate);
    }

    /// Make the broker unreachable (`true`) or reachable again.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.state().faults.unavailable = unavailable;
    }

    /// Clear every injected fault.
    pub fn clear_faults(&self) {
        self.state().faults = Faults::default();
    }

    /// Every accepted message, in order.
    pub fn messages(&self) -> Vec<StoredMessage> {
        self.state().log.clone()
    }

    /// How many messages were accepted.
    pub fn len(&self) -> usize {
        self.state().log.len()
    }

    /// Whether none were.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many `publish` calls were made.
    pub fn publish_calls(&self) -> u64 {
        self.state().publish_calls
    }

    /// How many republished messages deduplication dropped.
    pub fn duplicates_dropped(&self) -> u64 {
        self.state().duplicates_dropped
    }

    /// Redeliver every unacknowledged delivery of `consumer` now.
    pub fn redeliver(&self, consumer: &str) {
        let now = Instant::now();
        if let Some(group) = self.state().groups.get_mut(consumer) {
            for flight in group.in_flight.values_mut() {
                flight.deadline = now;
            }
        }
        self.bump();
    }

    /// Wait until at least `n` messages were accepted, or `timeout` passes. Returns the count.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> usize {
        let mut rx = self.shared.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let len = self.len();
            if len >= n {
                return len;
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                return self.len();
            }
        }
    }
}

#[async_trait::async_trait]
impl Transport for MemoryTransport {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn setup(&self) -> Result<(), TransportError> {
        self.health().await
    }

    async fn publish(&self, messages: &[OutgoingMessage]) -> Vec<Result<(), PublishError>> {
        let (delay, results) = {
            let mut state = self.state();
            state.publish_calls += 1;
            let delay = state.faults.confirm_delay;
            let mut results = Vec::with_capacity(messages.len());
            for message in messages {
                results.push(state.accept(&self.shared.namespace, message));
            }
            (delay, results)
        };
        self.bump();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        results
    }

    async fn subscribe(
        &self,
        consumer: &str,
        event_types: &[String],
        options: &SubscribeOptions,
    ) -> Result<Box<dyn Subscription>, TransportError> {
        super::check_consumer_name("memory", consumer)?;
        super::distinct_event_types("memory", consumer, event_types)?;
        self.health().await?;
        let mut state = self.state();
        let group = state
            .groups
            .entry(consumer.to_owned())
            .or_insert_with(|| Group {
                event_types: HashSet::new(),
                cursor: 0,
                ready: VecDeque::new(),
                in_flight: HashMap::new(),
                ack_wait: options.ack_wait,
                max_in_flight: options.max_in_flight.max(1),
            });
        group.event_types.extend(event_types.iter().cloned());
        group.ack_wait = options.ack_wait;
        group.max_in_flight = options.max_in_flight.max(1);
        Ok(Box::new(MemorySubscription {
            transport: self.clone(),
            consumer: consumer.to_owned(),
            changed: self.shared.changed.subscribe(),
        }))
    }

    async fn health(&self) -> Result<(), TransportError> {
        if self.state().faults.unavailable {
            Err(TransportError::new(
                "memory",
                "broker unavailable (injected)",
            ))
        } else {
            Ok(())
        }
    }
}

impl State {
    fn accept(&mut self, namespace: &str, message: &OutgoingMessage) -> Result<(), PublishError> {
        let faults = &mut self.faults;
        if faults.unavailable {
            return Err(PublishError::Connection(
                "broker unavailable (injected)".into(),
            ));
        }
        if faults.fail_next > 0 {
            faults.fail_next -= 1;
            return Err(PublishError::Rejected("injected failure".into()));
        }
        if faults
            .permanent_matching
            .as_ref()
            .is_some_and(|p| p(message))
        {
            return Err(PublishError::Permanent(
                "injected permanent rejection".into(),
            ));
        }
        if faults.fail_matching.as_ref().is_some_and(|p| p(message)) {
            return Err(PublishError::Rejected(
                "injected failure for matching message".into(),
            ));
        }
        if faults.fail_probability > 0.0 && fastrand::f64() < faults.fail_probability {
            return Err(PublishError::Rejected("injected random failure".into()));
        }
        let lose_confirm = if faults.lose_confirm_next > 0 {
            faults.lose_confirm_next -= 1;
            true
        } else {
            false
        };
        let duplicate = match &mut self.dedup {
            Some(seen) => !seen.insert(message.event_id),
            None => false,
        };
        if duplicate {
            self.duplicates_dropped += 1;
        } else {
            let seq = self.log.len() as u64 + 1;
            self.log.push(StoredMessage {
                seq,
                subject: routing_name(namespace, &message.event_type),
                event_id: message.event_id,
                event_type: message.event_type.clone(),
                aggregate_type: message.aggregate_type.clone(),
                aggregate_id: message.aggregate_id.clone(),
                body: message.body.clone(),
            });
        }
        if lose_confirm {
            return Err(PublishError::Timeout(Duration::ZERO));
        }
        Ok(())
    }

    /// The next delivery for `consumer`, or how long to wait before one may be due.
    fn next_delivery(&mut self, consumer: &str) -> Result<Option<(u64, u32)>, Option<Instant>> {
        let now = Instant::now();
        let Some(group) = self.groups.get_mut(consumer) else {
            return Ok(None);
        };
        let expired: Vec<u64> = group
            .in_flight
            .iter()
            .filter(|(_, f)| f.deadline <= now)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in expired {
            if let Some(flight) = group.in_flight.remove(&seq) {
                group.ready.push_back((seq, flight.count + 1));
            }
        }
        if group.in_flight.len() >= group.max_in_flight {
            return Err(group.in_flight.values().map(|f| f.deadline).min());
        }
        let next = if let Some(item) = group.ready.pop_front() {
            Some(item)
        } else {
            let mut found = None;
            while group.cursor < self.log.len() {
                let message = &self.log[group.cursor];
                group.cursor += 1;
                if group.event_types.contains(&message.event_type) {
                    found = Some((message.seq, 1));
                    break;
                }
            }
            found
        };
        match next {
            Some((seq, count)) => {
                group.in_flight.insert(
                    seq,
                    InFlight {
                        deadline: now + group.ack_wait,
                        count,
                    },
                );
                Ok(Some((seq, count)))
            }
            None => Err(group.in_flight.values().map(|f| f.deadline).min()),
        }
    }
}

struct MemorySubscription {
    transport: MemoryTransport,
    consumer: String,
    changed: watch::Receiver<u64>,
}

impl fmt::Debug for MemorySubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemorySubscription")
            .field("consumer", &self.consumer)
            .finish()
    }
}

#[async_trait::async_trait]
impl Subscription for MemorySubscription {
    async fn next(&mut self) -> Option<Result<Delivery, TransportError>> {
        loop {
            self.changed.borrow_and_update();
            let next = self.transport.state().next_delivery(&self.consumer);
            match next {
                Ok(Some((seq, count))) => {
                    let message = self.transport.state().log[(seq - 1) as usize].clone();
                    let acker = MemoryAcker {
                        transport: self.transport.clone(),
                        consumer: self.consumer.clone(),
                        seq,
                    };
                    return Some(Ok(Delivery::new(
                        message.body,
                        message.subject,
                        Some(message.event_id.to_string()),
                        count,
                        Box::new(acker),
                    )));
                }
                Ok(None) => return None,
                Err(due) => {
                    let wait = due
                        .map(|d| d.saturating_duration_since(Instant::now()))
                        .unwrap_or(Duration::from_secs(3600));
                    let _ = tokio::time::timeout(wait, self.changed.changed()).await;
                }
            }
        }
    }
}

struct MemoryAcker {
    transport: MemoryTransport,
    consumer: String,
    seq: u64,
}

#[async_trait::async_trait]
impl Acker for MemoryAcker {
    async fn ack(&self) -> Result<(), TransportError> {
        let mut state = self.transport.state();
        if state.faults.lose_acks > 0 {
            state.faults.lose_acks -= 1;
            return Ok(());
        }
        if let Some(group) = state.groups.get_mut(&self.consumer) {
            group.in_flight.remove(&self.seq);
        }
        drop(state);
        self.transport.bump();
        Ok(())
    }

    async fn nack(&self, delay: Option<Duration>) -> Result<(), TransportError> {
        if let Some(group) = self.transport.state().groups.get_mut(&self.consumer)
            && let Some(flight) = group.in_flight.get_mut(&self.seq)
        {
            flight.deadline = Instant::now() + delay.unwrap_or(Duration::ZERO);
        }
        self.transport.bump();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(n: u64, event_type: &str) -> OutgoingMessage {
        OutgoingMessage {
            event_id: Uuid::from_u128(u128::from(n)),
            event_type: event_type.into(),
            aggregate_type: "order".into(),
            aggregate_id: n.to_string(),
            body: Bytes::from(format!("{{\"n\":{n}}}")),
            headers: Vec::new(),
        }
    }

    #[tokio::test]
    async fn publish_faults_and_dedup() {
        let t = MemoryTransport::new().deduplicate(true);
        t.fail_next_publishes(1);
        t.lose_next_confirms(1);
        let r = t
            .publish(&[message(1, "a"), message(2, "a"), message(3, "a")])
            .await;
        assert!(matches!(r[0], Err(PublishError::Rejected(_))));
        assert!(
            matches!(r[1], Err(PublishError::Timeout(_))),
            "lost confirm"
        );
        assert!(r[2].is_ok());
        assert_eq!(t.len(), 2, "a lost confirm still stored the message");
        let r = t.publish(&[message(2, "a")]).await;
        assert!(r[0].is_ok());
        assert_eq!(t.len(), 2, "the republish was deduplicated");
        assert_eq!(t.duplicates_dropped(), 1);
        t.reject_permanently(Some(|m: &OutgoingMessage| m.aggregate_id == "4"));
        assert!(
            t.publish(&[message(4, "a")]).await[0]
                .as_ref()
                .unwrap_err()
                .is_permanent()
        );
    }

    #[tokio::test]
    async fn consumer_groups_ack_nack_redeliver() {
        let t = MemoryTransport::new();
        let options = SubscribeOptions::default()
            .ack_wait(Duration::from_millis(100))
            .max_in_flight(10);
        let mut sub = t.subscribe("inv", &["a".into()], &options).await.unwrap();
        let r = t
            .publish(&[message(1, "a"), message(2, "b"), message(3, "a")])
            .await;
        assert!(r.iter().all(Result::is_ok));
        let d1 = sub.next().await.unwrap().unwrap();
        assert_eq!(
            d1.message_id.as_deref(),
            Some(Uuid::from_u128(1).to_string().as_str())
        );
        assert_eq!(d1.delivery_count, 1);
        let d3 = sub.next().await.unwrap().unwrap();
        assert_eq!(d3.body, Bytes::from("{\"n\":3}"), "type b was filtered out");
        d1.ack().await.unwrap();
        d3.nack(None).await.unwrap();
        let again = sub.next().await.unwrap().unwrap();
        assert_eq!(again.body, Bytes::from("{\"n\":3}"));
        assert_eq!(again.delivery_count, 2);
        // Not acked: redelivered after the ack wait.
        drop(again);
        let third = tokio::time::timeout(Duration::from_secs(5), sub.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(third.delivery_count, 3);
        third.ack().await.unwrap();
        let none = tokio::time::timeout(Duration::from_millis(300), sub.next()).await;
        assert!(none.is_err(), "nothing left to deliver");
    }
}
