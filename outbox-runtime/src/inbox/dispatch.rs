//! The dispatcher: subscribe to the broker, decode each delivery, and hand it to one of
//! [`InboxConfig::concurrency`] lanes chosen by its aggregate, so deliveries of one aggregate run
//! one after another while different aggregates run in parallel. A lane takes what has arrived
//! (up to [`InboxConfig::commit_batch`]) and runs it in order: runs of inline messages as a
//! batch, the rest one by one.
//!
//! Over a set of databases (`fleet`), one dispatcher per consumer serves every database: each
//! delivery goes to the consumer of the database its envelope names (the `tenant` extension),
//! and runs in that database.
//!
//! [`InboxConfig::concurrency`]: super::InboxConfig::concurrency
//! [`InboxConfig::commit_batch`]: super::InboxConfig::commit_batch

use std::{collections::HashMap, sync::Arc};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{
    HandlerMode,
    batch::Inline,
    consumer::{Consumer, Decoded},
    digest::digest,
};
use crate::{
    envelope::Envelope,
    health::LoopHealth,
    transport::{Subscription, Transport},
};

/// Where a delivery goes: the consumer of the database it belongs to.
pub(crate) enum Routed {
    /// Record and handle it through this consumer (its database).
    To(Arc<Consumer>),
    /// Its envelope names no database where one is needed: the reason.
    Unknown(String),
    /// Its envelope names a database this runtime does not serve, or not yet (a database just
    /// added reaches each instance's set at its next refresh): the database and the reason.
    NotServed(String, String),
}

/// Picks the consumer of each decoded delivery (see `fleet`); without one, every delivery goes
/// to the dispatcher's own consumer.
pub(crate) type Route = Arc<dyn Fn(&Envelope) -> Routed + Send + Sync>;

/// How long the dispatcher waits for a database a delivery names to join this runtime's set
/// (holding what comes behind it, so that nothing of its aggregate overtakes it) before the
/// delivery is kept DEAD in the dispatcher's own database for an operator.
const NOT_SERVED_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A database waited for in vain is not waited for again for this long: its deliveries go
/// DEAD at once meanwhile (a database removed from the set, not one being added).
const NOT_SERVED_MEMORY: std::time::Duration = std::time::Duration::from_secs(120);

/// A delivery in a lane, with the consumer that records and handles it.
type Laned = (Arc<Consumer>, Decoded);

/// Why the dispatcher stopped reading a subscription.
enum Pumped {
    Shutdown,
    Resubscribe,
}

impl Consumer {
    /// Pull deliveries until shutdown; run them in `concurrency` lanes keyed by aggregate.
    pub(crate) async fn run_dispatcher(
        self: Arc<Self>,
        transport: Arc<dyn Transport>,
        shutdown: CancellationToken,
        health: Arc<LoopHealth>,
        route: Option<Route>,
    ) {
        let (lanes, workers) = self.spawn_lanes(&shutdown);
        // Failed subscriptions in a row, for the resubscribe backoff.
        let mut failures: u32 = 0;
        while !shutdown.is_cancelled() {
            let mut subscription = match transport
                .subscribe(self.name, &self.event_types, &self.config.subscribe)
                .await
            {
                Ok(s) => s,
                Err(e) => {
                    health.failure(&e.to_string());
                    tracing::warn!(consumer = self.name, error = %e, "subscribe failed; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(self.config.resubscribe.delay(failures)) => {}
                    }
                    failures = failures.saturating_add(1);
                    continue;
                }
            };
            failures = 0;
            health.success();
            match self
                .pump(
                    subscription.as_mut(),
                    &lanes,
                    route.as_ref(),
                    &health,
                    &shutdown,
                )
                .await
            {
                Pumped::Shutdown => break,
                Pumped::Resubscribe => continue,
            }
        }
        drop(lanes);
        for worker in workers {
            let _ = worker.await;
        }
    }

    /// The lanes: each takes what has arrived (up to `commit_batch`) and delivers it in order.
    fn spawn_lanes(
        self: &Arc<Self>,
        shutdown: &CancellationToken,
    ) -> (Vec<mpsc::Sender<Laned>>, Vec<tokio::task::JoinHandle<()>>) {
        let lanes = self.config.concurrency.max(1);
        let batch = self.config.commit_batch.max(1);
        let mut senders = Vec::with_capacity(lanes);
        let mut workers = Vec::with_capacity(lanes);
        for _ in 0..lanes {
            // Room for every delivery the broker may hand out at once: a busy lane never holds
            // the dispatcher (and the other lanes) up; memory stays bounded by `max_in_flight`.
            let (tx, mut rx) =
                mpsc::channel::<Laned>(self.config.subscribe.max_in_flight.max(batch));
            senders.push(tx);
            let shutdown = shutdown.clone();
            workers.push(tokio::spawn(async move {
                let mut arrived = Vec::with_capacity(batch);
                'lane: while rx.recv_many(&mut arrived, batch).await > 0 {
                    // The deliveries of one consumer (one database) go together.
                    for (consumer, run) in runs_by_consumer(std::mem::take(&mut arrived)) {
                        // Paused: what arrived waits here, neither handled nor nacked.
                        if !consumer.wait_while_paused(&shutdown).await {
                            break 'lane;
                        }
                        consumer.deliver_all(run, &shutdown).await;
                    }
                }
            }));
        }
        (senders, workers)
    }

    /// Read one subscription: decode each delivery and hand it to the lane of its aggregate,
    /// until shutdown, or until the subscription fails or ends (then resubscribe).
    async fn pump(
        self: &Arc<Self>,
        subscription: &mut dyn Subscription,
        lanes: &[mpsc::Sender<Laned>],
        route: Option<&Route>,
        health: &LoopHealth,
        shutdown: &CancellationToken,
    ) -> Pumped {
        // Databases waited for in vain, and when.
        let mut not_served: HashMap<String, std::time::Instant> = HashMap::new();
        loop {
            // Paused: take nothing more from the broker (what was taken waits in the lanes).
            if !self.wait_while_paused(shutdown).await {
                return Pumped::Shutdown;
            }
            let next = tokio::select! {
                _ = shutdown.cancelled() => return Pumped::Shutdown,
                next = subscription.next() => next,
            };
            match next {
                Some(Ok(delivery)) => {
                    health.success();
                    let decoded = Envelope::from_json(&delivery.body).map_err(|e| e.to_string());
                    let (consumer, decoded) = match (route, decoded) {
                        (Some(route), Ok(envelope)) => match route(&envelope) {
                            Routed::To(consumer) => (consumer, Ok(envelope)),
                            Routed::Unknown(why) => (self.clone(), Err(why)),
                            Routed::NotServed(database, why) => {
                                match self
                                    .await_database(
                                        route,
                                        &envelope,
                                        &database,
                                        &mut not_served,
                                        shutdown,
                                    )
                                    .await
                                {
                                    Some(consumer) => (consumer, Ok(envelope)),
                                    None if shutdown.is_cancelled() => return Pumped::Shutdown,
                                    None => (self.clone(), Err(why)),
                                }
                            }
                        },
                        (_, decoded) => (self.clone(), decoded),
                    };
                    let key = match &decoded {
                        Ok(e) => lane_key(&consumer.database, e),
                        Err(_) => delivery.message_id.clone().unwrap_or_default(),
                    };
                    let lane = (digest(key.as_bytes()) % lanes.len() as u64) as usize;
                    if lanes[lane]
                        .send((consumer, (delivery, decoded)))
                        .await
                        .is_err()
                    {
                        return Pumped::Shutdown;
                    }
                }
                Some(Err(e)) => {
                    health.failure(&e.to_string());
                    tracing::warn!(consumer = self.name, error = %e, "subscription error; resubscribing");
                    tokio::select! {
                        _ = shutdown.cancelled() => return Pumped::Shutdown,
                        _ = tokio::time::sleep(self.config.resubscribe.delay(0)) => {}
                    }
                    return Pumped::Resubscribe;
                }
                None => return Pumped::Resubscribe,
            }
        }
    }

    /// Deliveries that arrived together in one lane, in order: runs of messages a handler takes
    /// inline are recorded and handled in one transaction ([`Self::deliver_batch`]); the rest
    /// one by one.
    async fn deliver_all(&self, arrived: Vec<Decoded>, shutdown: &CancellationToken) {
        let mut run = Vec::new();
        for decoded in arrived {
            match self.take_inline(decoded) {
                Taken::Inline(inline) => run.push(inline),
                Taken::Other((delivery, decoded)) => {
                    self.deliver_run(std::mem::take(&mut run), shutdown).await;
                    self.deliver(delivery, decoded, shutdown).await;
                }
            }
        }
        self.deliver_run(run, shutdown).await;
    }

    /// A run of inline deliveries: a batch, or a single delivery.
    async fn deliver_run(&self, mut run: Vec<Inline>, shutdown: &CancellationToken) {
        if run.len() > 1 {
            self.deliver_batch(run, shutdown).await;
        } else if let Some(inline) = run.pop() {
            self.deliver(inline.delivery, Ok(inline.envelope), shutdown)
                .await;
        }
    }

    /// The delivery as an [`Inline`] one when a handler of this consumer runs it inline, else
    /// the delivery given back.
    fn take_inline(&self, (delivery, decoded): Decoded) -> Taken {
        if self.mode != HandlerMode::Inline {
            return Taken::Other((delivery, decoded));
        }
        match decoded {
            Ok(envelope) => match self.registration(&envelope) {
                Some(reg) => Taken::Inline(Inline {
                    delivery,
                    envelope,
                    reg,
                }),
                None => Taken::Other((delivery, Ok(envelope))),
            },
            Err(error) => Taken::Other((delivery, Err(error))),
        }
    }
}

impl Consumer {
    /// A delivery names a database this runtime does not serve: wait for it to join the set,
    /// taking nothing more from the broker meanwhile (what comes behind it, its aggregate's
    /// later events among them, must not overtake it), re-routing every 200 ms for up to
    /// [`NOT_SERVED_WAIT`]. `None`: it did not join (remembered for [`NOT_SERVED_MEMORY`]), or
    /// shutdown.
    async fn await_database(
        &self,
        route: &Route,
        envelope: &Envelope,
        database: &str,
        not_served: &mut HashMap<String, std::time::Instant>,
        shutdown: &CancellationToken,
    ) -> Option<Arc<Consumer>> {
        not_served.retain(|_, at| at.elapsed() < NOT_SERVED_MEMORY);
        if not_served.contains_key(database) {
            return None;
        }
        tracing::info!(consumer = self.name, message_id = %envelope.id, database, "a delivery for a database this runtime does not serve yet; waiting for the set to catch up");
        let deadline = tokio::time::Instant::now() + NOT_SERVED_WAIT;
        while tokio::time::Instant::now() < deadline {
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
            }
            if let Routed::To(consumer) = route(envelope) {
                return Some(consumer);
            }
        }
        tracing::warn!(consumer = self.name, message_id = %envelope.id, database, "a delivery for a database this runtime does not serve; kept DEAD here for an operator");
        not_served.insert(database.to_owned(), std::time::Instant::now());
        None
    }
}

/// What arrived, one run per consumer (per database in a set), in the order the consumers first
/// appear, each run in arrival order. An aggregate lives in one database, so its deliveries keep
/// their order; a lane whose deliveries alternate between databases still commits each
/// database's share together instead of one transaction a delivery.
fn runs_by_consumer(arrived: Vec<Laned>) -> Vec<(Arc<Consumer>, Vec<Decoded>)> {
    grouped(arrived, Arc::ptr_eq)
}

/// `items` grouped by key (`same`), groups in order of first appearance, items in order.
fn grouped<K, V>(items: Vec<(K, V)>, same: impl Fn(&K, &K) -> bool) -> Vec<(K, Vec<V>)> {
    let mut groups: Vec<(K, Vec<V>)> = Vec::new();
    for (key, item) in items {
        match groups.iter_mut().find(|(k, _)| same(k, &key)) {
            Some((_, group)) => group.push(item),
            None => groups.push((key, vec![item])),
        }
    }
    groups
}

/// A delivery a lane took: one to run inline, or one that goes the single way.
enum Taken {
    Inline(Inline),
    Other(Decoded),
}

/// Deliveries with the same key run in the same lane, one after another: the aggregate (or the
/// message), within its database in a set of databases.
fn lane_key(database: &str, envelope: &Envelope) -> String {
    match (&envelope.aggregate_type, &envelope.subject) {
        (Some(t), Some(id)) => format!("{database}/{t}/{id}"),
        _ => format!("{database}/{}", envelope.id),
    }
}

#[cfg(test)]
mod tests {
    use super::grouped;

    #[test]
    fn deliveries_are_grouped_by_database_keeping_their_order() {
        let arrived = vec![
            ("acme", 1),
            ("globex", 2),
            ("acme", 3),
            ("initech", 4),
            ("globex", 5),
        ];
        assert_eq!(
            grouped(arrived, |a, b| a == b),
            [
                ("acme", vec![1, 3]),
                ("globex", vec![2, 5]),
                ("initech", vec![4]),
            ]
        );
        assert!(grouped(Vec::<(u8, u8)>::new(), |a, b| a == b).is_empty());
    }
}
