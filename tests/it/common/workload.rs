//! The end-to-end tests' workload (outages, partitions): a producer committing a line to every
//! cart on a steady beat, and the consumers' effect rows it is checked against.

#![allow(dead_code, unreachable_pub)]

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use outbox::prelude::*;
use sea_orm::DatabaseConnection;

use super::carts::LineAdded;
use super::{TestDb, eventually, scalar_i64, status_counts, table_status_counts};

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
