//! The end-to-end tests' workload (outages, partitions): a producer committing a line to every
//! cart on a steady beat, and the consumers' effect rows it is checked against.

#![allow(dead_code, unreachable_pub)]

use std::{
    collections::{BTreeMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use outbox::inbox::InboxConfig;
use outbox::prelude::*;
use outbox::relay::{Backoff, RelayConfig};
use outbox::runtime::{Health, Runtime};
use outbox::transport::SubscribeOptions;
use sea_orm::DatabaseConnection;

use super::carts::LineAdded;
use super::{
    TestDb, effects, eventually, outbox_rows, scalar_i64, status_counts, table_status_counts,
};

/// Aggregates (carts) the producer writes to; each transaction adds the next line to every one.
pub const CARTS: u32 = 4;
/// Pause between the producer's transactions.
pub const PRODUCE_EVERY: Duration = Duration::from_millis(100);

/// Commits one transaction every [`PRODUCE_EVERY`], each adding line `seq` to every cart, until
/// stopped. Counts only what committed.
pub struct Producer {
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<BTreeMap<String, Vec<u32>>>,
}

impl Producer {
    pub fn spawn(db: DatabaseConnection, outbox: Outbox) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let stop = stop.clone();
            let committed = committed.clone();
            async move {
                let mut lines: BTreeMap<String, Vec<u32>> = BTreeMap::new();
                let mut seq = 0;
                while !stop.load(Ordering::Relaxed) {
                    let tx = outbox.begin(&db).await.expect("producer: begin");
                    for cart in 0..CARTS {
                        tx.enqueue(&LineAdded {
                            cart: format!("cart-{cart}"),
                            seq,
                        })
                        .unwrap();
                    }
                    let report = tx.commit().await.expect("producer: commit");
                    assert_eq!(report.written, CARTS as usize);
                    for cart in 0..CARTS {
                        lines.entry(format!("cart-{cart}")).or_default().push(seq);
                    }
                    committed.fetch_add(CARTS as usize, Ordering::Relaxed);
                    seq += 1;
                    tokio::time::sleep(PRODUCE_EVERY).await;
                }
                lines
            }
        });
        Producer {
            stop,
            committed,
            task,
        }
    }

    pub fn committed(&self) -> usize {
        self.committed.load(Ordering::Relaxed)
    }

    /// Stop and return, per cart, the lines committed in order.
    pub async fn stop(self) -> BTreeMap<String, Vec<u32>> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the producer ran to the end")
    }
}

/// Effect rows written by the consumers' handlers.
pub async fn count_effects(db: &DatabaseConnection) -> usize {
    scalar_i64(db, "SELECT COUNT(*) FROM effect").await as usize
}

/// Wait until `n` effects exist; fail with the state of both tables if they do not appear.
/// Returns how long it took.
pub async fn wait_for_effects(t: &TestDb, n: usize, timeout: Duration) -> Duration {
    let started = Instant::now();
    let ok = eventually(timeout, || async { count_effects(&t.db).await >= n }).await;
    assert!(
        ok,
        "{}: only {} of {n} events handled within {timeout:?}; outbox {:?}, inbox {:?}",
        t.name,
        count_effects(&t.db).await,
        status_counts(&t.db).await,
        table_status_counts(&t.db, "inbox_event").await,
    );
    started.elapsed()
}

/// Long enough for a message handled twice to show up as a second effect row.
pub const SETTLE: Duration = Duration::from_millis(500);

/// The relay's retry delays: 0.2, 0.4, 0.8, 1.6, 3.2, 3.2, … s, plus up to 20%.
pub fn backoff() -> Backoff {
    Backoff::default()
        .base(Duration::from_millis(200))
        .cap(Duration::from_millis(3_200))
        .jitter(0.2)
}

/// The relay's retry budget, shrunk so that a broker outage outlasts it many times over.
pub const MAX_ATTEMPTS: u32 = 5;

/// How long an event's failed attempts take, at the least, to use the whole budget.
pub fn retry_budget() -> Duration {
    (0..MAX_ATTEMPTS - 1).map(|n| backoff().base_delay(n)).sum()
}

/// The relay of the outage and partition tests: quick polls, [`backoff`], [`MAX_ATTEMPTS`].
pub fn relay_config() -> RelayConfig {
    RelayConfig::default()
        .poll_interval(Duration::from_millis(50))
        .lease(Duration::from_secs(10))
        .backoff(backoff())
        .max_attempts(MAX_ATTEMPTS)
        .error_delay(Duration::from_millis(200))
}

/// The consumers of the outage and partition tests: quick polls, short leases.
pub fn inbox_config() -> InboxConfig {
    InboxConfig::default()
        .poll_interval(Duration::from_millis(50))
        .lease(Duration::from_secs(5))
        .subscribe(SubscribeOptions::default().ack_wait(Duration::from_secs(5)))
}

/// Wait until the consumer's dispatcher has subscribed.
pub async fn wait_subscribed(runtime: &Runtime, consumer: &str) {
    let name = format!("dispatch:{consumer}");
    let subscribed = eventually(Duration::from_secs(30), || async {
        runtime
            .health()
            .loops
            .iter()
            .any(|l| l.name == name && l.last_success.is_some())
    })
    .await;
    assert!(subscribed, "{name} subscribed: {:#?}", runtime.health());
}

/// Each loop, healthy or failing with its last error, on one line.
pub fn loops_summary(health: &Health) -> String {
    health
        .loops
        .iter()
        .map(|l| match (&l.last_error, l.healthy) {
            (Some(e), false) => format!("{} failing ({e})", l.name),
            _ => format!("{} healthy", l.name),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every committed event has exactly one effect row, and nothing is left unfinished in the
/// outbox or the inbox. Returns the carts whose effects are not in the order of their lines,
/// with that order.
pub async fn assert_everything_handled_once(
    t: &TestDb,
    consumer: &str,
    lines: &BTreeMap<String, Vec<u32>>,
) -> Vec<(String, Vec<u32>)> {
    let committed: usize = lines.values().map(Vec::len).sum();
    let effects = effects(&t.db).await;
    let outbox = outbox_rows(&t.db).await;
    assert_eq!(outbox.len(), committed, "an event row per committed event");
    assert_eq!(
        effects.len(),
        committed,
        "{}: one effect per committed event",
        t.name
    );
    assert!(effects.iter().all(|e| e.consumer == consumer));
    let effect_ids: HashSet<&str> = effects.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(effect_ids.len(), committed, "an event handled twice");
    let event_ids: HashSet<String> = outbox.iter().map(|r| r.event_id.to_string()).collect();
    assert_eq!(
        effect_ids,
        event_ids.iter().map(String::as_str).collect::<HashSet<_>>(),
        "the effects are those of the committed events"
    );
    assert_eq!(
        status_counts(&t.db).await,
        BTreeMap::from([("SENT".to_owned(), committed as i64)]),
        "{}: every event SENT, none PENDING, PROCESSING, RETRY or DEAD",
        t.name
    );
    assert_eq!(
        table_status_counts(&t.db, "inbox_event").await,
        BTreeMap::from([("DONE".to_owned(), committed as i64)]),
        "{}: every message DONE, none PENDING, PROCESSING, RETRY or DEAD",
        t.name
    );
    let mut per_cart: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for e in &effects {
        per_cart
            .entry(e.cart.clone())
            .or_default()
            .push(u32::try_from(e.seq).unwrap());
    }
    assert_eq!(
        per_cart.keys().collect::<Vec<_>>(),
        lines.keys().collect::<Vec<_>>()
    );
    per_cart
        .into_iter()
        .filter(|(cart, handled)| Some(handled) != lines.get(cart))
        .collect()
}
