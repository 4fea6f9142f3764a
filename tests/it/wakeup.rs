//! Wake-up signals after commit: in-process always, and on PostgreSQL a coalesced `NOTIFY` sent
//! outside the business transaction for relays in other processes.

use std::time::{Duration, Instant};

use crate::common::*;
use outbox::prelude::*;
use sea_orm::sqlx::postgres::PgListener;
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[event(name = "stock.adjusted", aggregate = "sku")]
struct StockAdjusted {
    #[event(aggregate_id)]
    sku: String,
    delta: i32,
}

async fn listener(t: &TestDb, channel: &str) -> PgListener {
    let mut listener = PgListener::connect(&t.url)
        .await
        .expect("LISTEN connection");
    listener.listen(channel).await.unwrap();
    listener
}

async fn drain(listener: &mut PgListener, wait: Duration) -> usize {
    let mut n = 0;
    while let Ok(Ok(Some(_))) = tokio::time::timeout(wait, listener.try_recv()).await {
        n += 1;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_commit_notifies_other_processes() {
    let Some(t) = test_db(Backend::Postgres, "wakeup_notify_pg").await else {
        return;
    };
    let outbox = Outbox::builder("inventory")
        .notify_channel(Some("outbox_wakeup_test"))
        .build();
    let mut listener = listener(&t, "outbox_wakeup_test").await;

    // A transaction that rolls back sends nothing.
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.enqueue(&StockAdjusted {
        sku: "A-1".into(),
        delta: 1,
    })
    .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(drain(&mut listener, Duration::from_millis(300)).await, 0);

    let tx = outbox.begin(&t.db).await.unwrap();
    tx.enqueue(&StockAdjusted {
        sku: "A-1".into(),
        delta: 1,
    })
    .unwrap();
    let _ = tx.commit().await.unwrap();
    let note = tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("a NOTIFY within 10 s of commit")
        .unwrap();
    assert_eq!(note.channel(), "outbox_wakeup_test");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_hints_are_coalesced() {
    let Some(t) = test_db(Backend::Postgres, "wakeup_coalesce_pg").await else {
        return;
    };
    let interval = Duration::from_millis(500);
    let outbox = Outbox::builder("inventory")
        .notify_channel(Some("outbox_coalesce_test"))
        .notify_interval(interval)
        .build();
    let mut listener = listener(&t, "outbox_coalesce_test").await;

    let commits = 200;
    let started = Instant::now();
    for i in 0..commits {
        let tx = outbox.begin(&t.db).await.unwrap();
        tx.enqueue(&StockAdjusted {
            sku: format!("S-{i}"),
            delta: 1,
        })
        .unwrap();
        let _ = tx.commit().await.unwrap();
    }
    let elapsed = started.elapsed();
    let received = drain(&mut listener, interval * 3).await;
    // One leading hint, then at most one per interval, plus the trailing one.
    let bound = 2 + (elapsed.as_millis() / interval.as_millis()) as usize;
    assert!(received >= 1, "at least one hint for {commits} commits");
    assert!(
        received <= bound && received < commits,
        "{received} hints for {commits} commits in {elapsed:?} (at most {bound} allowed)"
    );
    assert_eq!(count_events(&t.db).await, commits as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_hint_can_be_turned_off() {
    let Some(t) = test_db(Backend::Postgres, "wakeup_off_pg").await else {
        return;
    };
    let outbox = Outbox::builder("inventory").notify_channel(None).build();
    let mut listener = listener(&t, outbox::DEFAULT_NOTIFY_CHANNEL).await;
    let mut wake = outbox.subscribe();
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.enqueue(&StockAdjusted {
        sku: "B-2".into(),
        delta: -1,
    })
    .unwrap();
    let _ = tx.commit().await.unwrap();
    // The in-process signal still fires.
    tokio::time::timeout(Duration::from_secs(5), wake.woken())
        .await
        .unwrap();
    assert_eq!(drain(&mut listener, Duration::from_millis(500)).await, 0);
}
