//! Delayed events (`enqueue_at`, `enqueue_after`) on PostgreSQL, MariaDB and SQLite: committed
//! with their transaction, kept apart until due, published when due and not before (with the
//! fast path on), in their aggregate's order as of when they became due; surviving a relay that
//! was not running, retried like any event, deduplicated, refused with an aggregate version, and
//! counted apart from the backlog.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use crate::common::carts::*;
use crate::common::*;
use chrono::Utc;
use outbox::prelude::*;
use outbox::relay::{Backoff, Relay, RelayConfig};
use outbox::transport::memory::MemoryTransport;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "delayed.reminder", aggregate = "cart")]
struct Reminder {
    #[event(aggregate_id)]
    cart: String,
    #[event(dedup_key)]
    key: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "delayed.versioned", aggregate = "cart")]
struct Versioned {
    #[event(aggregate_id)]
    cart: String,
    #[event(aggregate_version)]
    version: i64,
}

fn reminder(cart: &str, key: &str) -> Reminder {
    Reminder {
        cart: cart.into(),
        key: key.into(),
    }
}

const POLL: Duration = Duration::from_millis(200);

fn config() -> RelayConfig {
    RelayConfig::default()
        .relay_id("delayed-relay".to_owned())
        .poll_interval(POLL)
        .backoff(
            Backoff::default()
                .base(Duration::from_millis(20))
                .cap(Duration::from_millis(100))
                .jitter(0.0),
        )
}

/// `(aggregate, seq)` of each message on the broker, in order.
fn published(transport: &MemoryTransport) -> Vec<(String, u64)> {
    transport
        .messages()
        .iter()
        .filter(|m| m.event_type == "line.added")
        .map(|m| {
            let body: serde_json::Value = serde_json::from_slice(&m.body).unwrap();
            (
                m.aggregate_id.clone(),
                body["data"]["seq"].as_u64().unwrap(),
            )
        })
        .collect()
}

async fn published_when_due_and_not_before(t: TestDb) {
    let outbox = Outbox::new("delayed-tests");
    let transport = MemoryTransport::new();
    let relay = Relay::new(t.db.clone(), Arc::new(transport.clone()))
        .with_config(config())
        .with_outbox(&outbox)
        .spawn();
    assert!(
        eventually(Duration::from_secs(10), || async {
            outbox.fast_path_running()
        })
        .await
    );
    let delay = Duration::from_millis(1_500);
    let tx = outbox.begin(&t.db).await.unwrap();
    let line = |seq| LineAdded {
        cart: "cart-d".into(),
        seq,
    };
    tx.enqueue(&line(0)).unwrap();
    let delayed = tx.enqueue_after(&line(1), delay).unwrap();
    tx.enqueue(&line(2)).unwrap();
    let report = tx.commit().await.unwrap();
    let committed = Instant::now();
    assert_eq!((report.written, report.scheduled), (2, 1), "{report:?}");

    // Waiting, it is counted apart from the backlog and holds nothing back.
    let status = outbox::admin::status(&t.db).await.unwrap();
    assert_eq!(status.outbox.scheduled, 1);
    let due = status.outbox.next_due_at.unwrap();
    assert!(
        due > status.at + chrono::Duration::milliseconds(1_000),
        "{due} {}",
        status.at
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            published(&transport).len() == 2
        })
        .await
    );
    assert_eq!(
        published(&transport),
        [("cart-d".to_owned(), 0), ("cart-d".to_owned(), 2)]
    );
    assert!(
        !outbox_rows(&t.db)
            .await
            .iter()
            .any(|r| r.event_id == delayed)
    );

    // Not before its time; then within about the poll interval (with room for a busy machine).
    assert!(
        eventually(delay + POLL + Duration::from_secs(5), || async {
            published(&transport).len() == 3
        })
        .await,
        "the delayed event was never published"
    );
    let seen_after = committed.elapsed();
    assert!(
        seen_after >= delay - Duration::from_millis(100),
        "published {seen_after:?} after the commit, before its delay of {delay:?}"
    );
    assert_eq!(published(&transport)[2], ("cart-d".to_owned(), 1));
    assert_eq!(transport.messages()[2].event_id, delayed);
    // It entered the outbox when due, by the database's clock, and was sent once. The broker's
    // copy lands before the relay settles the row, so the row turns SENT a moment later.
    let delayed_row = || async {
        outbox_rows(&t.db)
            .await
            .into_iter()
            .find(|r| r.event_id == delayed)
            .unwrap()
    };
    assert!(
        eventually(Duration::from_secs(10), || async {
            delayed_row().await.status == "SENT"
        })
        .await,
        "the delayed event was published but its row is {}",
        delayed_row().await.status
    );
    let row = delayed_row().await;
    assert!(row.created_at >= due, "{} < {due}", row.created_at);
    let status = outbox::admin::status(&t.db).await.unwrap();
    assert_eq!(
        (status.outbox.scheduled, status.outbox.next_due_at),
        (0, None)
    );
    relay.shutdown().await.unwrap();
    assert_eq!(transport.len(), 3);
}

async fn waits_for_a_relay_retries_and_deduplicates(t: TestDb) {
    let outbox = Outbox::new("delayed-tests");
    // Due at once, and soon: no relay runs, so both wait.
    let tx = outbox.begin(&t.db).await.unwrap();
    let past = tx
        .enqueue_at(
            &LineAdded {
                cart: "cart-r".into(),
                seq: 0,
            },
            Utc::now() - chrono::Duration::seconds(5),
        )
        .unwrap();
    let soon = tx
        .enqueue_after(
            &LineAdded {
                cart: "cart-r".into(),
                seq: 1,
            },
            Duration::from_millis(300),
        )
        .unwrap();
    // One with a key, twice in the buffer: the second is skipped and reported.
    let keyed = tx
        .enqueue_after(&reminder("cart-k", "remind-1"), Duration::from_secs(3_600))
        .unwrap();
    let twin = tx
        .enqueue_after(&reminder("cart-k", "remind-1"), Duration::from_secs(3_600))
        .unwrap();
    let report = tx.commit().await.unwrap();
    assert_eq!((report.written, report.scheduled), (0, 3), "{report:?}");
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].event_id, twin);
    // Again in another transaction: the waiting one holds the key.
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.enqueue_after(&reminder("cart-k", "remind-1"), Duration::from_secs(60))
        .unwrap();
    let report = tx.commit().await.unwrap();
    assert_eq!((report.scheduled, report.skipped.len()), (0, 1));
    // An aggregate version is refused at enqueue, and the transaction stays usable.
    let tx = outbox.begin(&t.db).await.unwrap();
    let refused = tx
        .enqueue_after(
            &Versioned {
                cart: "cart-v".into(),
                version: 7,
            },
            Duration::from_secs(1),
        )
        .unwrap_err();
    assert!(
        refused.to_string().contains("aggregate version"),
        "{refused}"
    );
    // A savepoint's delayed events join the transaction, or vanish with its rollback.
    let kept = tx.savepoint().await.unwrap();
    kept.enqueue_after(
        &LineAdded {
            cart: "cart-s".into(),
            seq: 0,
        },
        Duration::from_secs(3_600),
    )
    .unwrap();
    assert_eq!(kept.commit().await.unwrap().carried_to_parent, 1);
    let dropped = tx.savepoint().await.unwrap();
    dropped
        .enqueue_after(
            &LineAdded {
                cart: "cart-s".into(),
                seq: 1,
            },
            Duration::from_secs(3_600),
        )
        .unwrap();
    dropped.rollback().await.unwrap();
    assert_eq!(tx.commit().await.unwrap().scheduled, 1);

    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = outbox::admin::status(&t.db).await.unwrap();
    assert_eq!((status.outbox.scheduled, status.outbox.backlog), (4, 0));

    // A relay starts: the due ones move into the outbox; the broker refuses the first publish,
    // which is retried like any failure and sent.
    let transport = MemoryTransport::new();
    transport.fail_next_publishes(1);
    let relay = Relay::new(t.db.clone(), Arc::new(transport.clone())).with_config(config());
    let report = relay.run_once().await.unwrap();
    assert_eq!(report.claimed, 2, "{report:?}");
    for _ in 0..100 {
        if transport.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        relay.run_once().await.unwrap();
    }
    let ids: Vec<_> = transport.messages().iter().map(|m| m.event_id).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids.contains(&past) && ids.contains(&soon));
    let rows = outbox_rows(&t.db).await;
    assert!(rows.iter().all(|r| r.status == "SENT"));
    assert_eq!(rows.iter().map(|r| r.attempts).sum::<i64>(), 1, "{rows:?}");
    // The far ones wait on.
    let status = outbox::admin::status(&t.db).await.unwrap();
    assert_eq!(status.outbox.scheduled, 2);
    assert!(!rows.iter().any(|r| r.event_id == keyed));

    // Due while the outbox already holds its key: dropped when due, never published twice.
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.enqueue(&reminder("cart-z", "remind-2")).unwrap();
    tx.enqueue_at(
        &reminder("cart-z", "remind-2"),
        Utc::now() - chrono::Duration::seconds(1),
    )
    .unwrap();
    let report = tx.commit().await.unwrap();
    assert_eq!((report.written, report.scheduled), (1, 1));
    relay.run_once().await.unwrap();
    relay.run_once().await.unwrap();
    let reminders: Vec<_> = outbox_rows(&t.db)
        .await
        .into_iter()
        .filter(|r| r.aggregate_id == "cart-z")
        .collect();
    assert_eq!(reminders.len(), 1);
    assert_eq!(
        outbox::admin::status(&t.db).await.unwrap().outbox.scheduled,
        2
    );
}

/// Fault injection on the schema: a relay that cannot move delayed events (a column of
/// `outbox_scheduled` renamed away) still publishes everything else, and moves them once it can.
async fn a_broken_scheduled_table_does_not_stop_the_outbox(t: TestDb) {
    use outbox::sea_orm::ConnectionTrait;
    let outbox = Outbox::new("delayed-tests");
    let line = |seq| LineAdded {
        cart: "cart-b".into(),
        seq,
    };
    let tx = outbox.begin(&t.db).await.unwrap();
    let delayed = tx
        .enqueue_at(&line(0), Utc::now() - chrono::Duration::seconds(1))
        .unwrap();
    let _ = tx.commit().await.unwrap();
    t.db.execute_unprepared("ALTER TABLE outbox_scheduled RENAME COLUMN due_at TO due_when")
        .await
        .unwrap();
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.enqueue(&line(1)).unwrap();
    let _ = tx.commit().await.unwrap();
    let transport = MemoryTransport::new();
    let relay = Relay::new(t.db.clone(), Arc::new(transport.clone())).with_config(config());
    relay.run_once().await.unwrap();
    assert_eq!(published(&transport), [("cart-b".to_owned(), 1)]);
    t.db.execute_unprepared("ALTER TABLE outbox_scheduled RENAME COLUMN due_when TO due_at")
        .await
        .unwrap();
    relay.run_once().await.unwrap();
    assert_eq!(
        published(&transport),
        [("cart-b".to_owned(), 1), ("cart-b".to_owned(), 0)]
    );
    assert_eq!(transport.messages()[1].event_id, delayed);
}

backend_tests! {
    broken_table => a_broken_scheduled_table_does_not_stop_the_outbox;
    when_due => published_when_due_and_not_before;
    waits_retries_dedups => waits_for_a_relay_retries_and_deduplicates;
}
