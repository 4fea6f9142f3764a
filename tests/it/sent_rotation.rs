//! Sent events leave `outbox_event` (`outbox_0013`): a mark of SENT moves the row into
//! `outbox_sent`, whose slots retention empties whole; a producer's dedup key outlives its
//! event's row in `outbox_key`; SENT rows an earlier release left in `outbox_event` stay
//! readable, resendable and purgeable.

use std::time::Duration;

use crate::common::carts::*;
use crate::common::*;
use outbox::prelude::*;
use outbox::relay::{Relay, RelayConfig, RelayHandle};
use outbox::retention::{self as janitor, RetentionPolicy};
use outbox::transport::memory::MemoryTransport;
use sea_orm::ConnectionTrait;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "rotation.keyed", aggregate = "cart")]
struct Keyed {
    #[event(aggregate_id)]
    cart: String,
    #[event(dedup_key)]
    key: String,
}

fn keyed(cart: &str, key: &str) -> Keyed {
    Keyed {
        cart: cart.to_owned(),
        key: key.to_owned(),
    }
}

fn start(t: &TestDb, outbox: &Outbox, transport: &MemoryTransport) -> RelayHandle {
    Relay::new(t.db.clone(), std::sync::Arc::new(transport.clone()))
        .with_config(
            RelayConfig::default()
                .relay_id("rotation-relay".to_owned())
                .poll_interval(Duration::from_millis(50)),
        )
        .with_outbox(outbox)
        .spawn()
}

async fn hot_rows(t: &TestDb) -> i64 {
    scalar_i64(&t.db, "SELECT COUNT(*) AS n FROM outbox_event").await
}

/// Enqueue `events` in one transaction; returns (written, skipped keys).
async fn commit_keyed(t: &TestDb, outbox: &Outbox, events: &[Keyed]) -> (usize, Vec<String>) {
    let tx = outbox.begin(&t.db).await.unwrap();
    for event in events {
        tx.enqueue(event).unwrap();
    }
    let report = tx.commit().await.unwrap();
    (
        report.written,
        report.skipped.iter().map(|s| s.dedup_key.clone()).collect(),
    )
}

async fn sent_events_leave_the_queue_table(t: TestDb) {
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let relay = start(&t, &outbox, &transport);
    produce(&t, &outbox, 3, 4, 4).await;
    wait_all_sent(&t, 12, Duration::from_secs(20)).await;
    relay.shutdown().await.unwrap();

    assert_eq!(hot_rows(&t).await, 0, "outbox_event holds the backlog only");
    let sent = sent_rows(&t.db).await;
    assert_eq!(sent.len(), 12);
    assert_eq!(transport.messages().len(), 12);
    for row in &sent {
        assert!(row.sent_at.is_some_and(|s| s >= row.created_at), "{row:?}");
        assert!(row.claim_token.is_some(), "who sent it is kept: {row:?}");
        assert_eq!(row.locked_by.as_deref(), Some("rotation-relay"), "{row:?}");
    }
    // Every row went to the slot of the period it was sent in.
    let (current, rotation) = outbox::store::rotation::now(&t.db, "outbox_sent")
        .await
        .unwrap()
        .unwrap();
    let slots = outbox::store::rotation::rows_per_slot(&t.db, "outbox_sent")
        .await
        .unwrap();
    assert!(
        slots
            .iter()
            .all(|(slot, _)| *slot == rotation.slot(current) || *slot == rotation.slot(current - 1)),
        "{slots:?} (current slot {})",
        rotation.slot(current)
    );
}

async fn a_dedup_key_outlives_its_sent_event(t: TestDb) {
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let relay = start(&t, &outbox, &transport);
    assert_eq!(
        commit_keyed(&t, &outbox, &[keyed("k", "one"), keyed("k", "two")]).await,
        (2, vec![])
    );
    wait_all_sent(&t, 2, Duration::from_secs(20)).await;
    assert_eq!(hot_rows(&t).await, 0);
    // The rows have left outbox_event; their keys have not.
    assert_eq!(
        commit_keyed(&t, &outbox, &[keyed("k", "two"), keyed("k", "three")]).await,
        (1, vec!["two".to_owned()])
    );
    wait_all_sent(&t, 3, Duration::from_secs(20)).await;
    // Each key is written for this period and the next.
    assert_eq!(
        scalar_i64(
            &t.db,
            "SELECT COUNT(*) AS n FROM outbox_key WHERE dedup_key = 'one'"
        )
        .await,
        2
    );
    // A key row a late retention left from a period long gone is not a live key.
    t.db.execute_unprepared("UPDATE outbox_key SET bucket = bucket - 8 WHERE dedup_key = 'one'")
        .await
        .unwrap();
    assert_eq!(
        commit_keyed(&t, &outbox, &[keyed("k", "one")]).await,
        (1, vec![])
    );
    wait_all_sent(&t, 4, Duration::from_secs(20)).await;
    relay.shutdown().await.unwrap();
    let keys: Vec<String> = transport
        .messages()
        .iter()
        .map(|m| {
            let body: serde_json::Value = serde_json::from_slice(&m.body).unwrap();
            body["data"]["key"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    assert_eq!(keys, ["one", "two", "three", "one"]);
}

async fn retention_empties_expired_slots_whole(t: TestDb) {
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let relay = start(&t, &outbox, &transport);
    produce(&t, &outbox, 2, 10, 10).await;
    commit_keyed(&t, &outbox, &[keyed("k", "kept"), keyed("k", "gone")]).await;
    wait_all_sent(&t, 22, Duration::from_secs(20)).await;
    relay.shutdown().await.unwrap();

    // Half of the sent events, and one key, as if written long enough ago.
    let first = scalar_i64(&t.db, "SELECT MIN(id) AS n FROM outbox_sent").await;
    let window = Duration::from_secs(3600);
    age_sent(&t.db, &format!("id < {}", first + 11), window).await;
    let (current, keys) = outbox::store::rotation::now(&t.db, "outbox_key")
        .await
        .unwrap()
        .unwrap();
    t.db.execute_unprepared(&format!(
        "UPDATE outbox_key SET slot = {}, bucket = {} WHERE dedup_key = 'gone' AND bucket = {}",
        keys.slot(current - 2),
        current - 2,
        current
    ))
    .await
    .unwrap();

    let policy = RetentionPolicy::default().sent_after(window);
    let report = janitor::purge(&t.db, &policy).await.unwrap();
    assert_eq!(report.slots_emptied, 2, "{report:?}");
    assert_eq!(report.outbox_deleted, 0, "no row deleted one by one");
    assert_eq!(sent_count(&t.db).await, 11, "the recent ones stay");
    assert_eq!(
        scalar_i64(
            &t.db,
            &format!("SELECT MIN(id) AS n FROM outbox_sent WHERE id >= {first}")
        )
        .await,
        first + 11
    );
    assert_eq!(
        scalar_i64(
            &t.db,
            "SELECT COUNT(*) AS n FROM outbox_key WHERE dedup_key = 'gone'"
        )
        .await,
        1,
        "the key's row of its own period went; the next period's stays"
    );
    let audit = outbox::admin::audit_log(&t.db, 1).await.unwrap();
    assert!(
        audit[0]
            .target
            .contains("2 slot(s) of outbox_sent, outbox_key, inbox_done and inbox_key emptied"),
        "{audit:?}"
    );
    // Nothing left to empty: nothing happens, nothing is recorded.
    let again = janitor::purge(&t.db, &policy).await.unwrap();
    assert_eq!((again.slots_emptied, again.audit_id), (0, None));
}

async fn an_earlier_releases_sent_rows_stay_usable(t: TestDb) {
    // An earlier release marked SENT in place, with a dedup key.
    let outbox = Outbox::new("carts");
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.enqueue(&keyed("old", "legacy")).unwrap();
    tx.enqueue(&LineAdded {
        cart: "old".to_owned(),
        seq: 1,
    })
    .unwrap();
    assert_eq!(tx.commit().await.unwrap().written, 2);
    let old = match t.db.get_database_backend() {
        sea_orm::DbBackend::Sqlite => "'2020-01-01T00:00:00.000000Z'",
        _ => "'2020-01-01 00:00:00'",
    };
    t.db.execute_unprepared(&format!(
        "UPDATE outbox_event SET status = 'SENT', sent_at = {old}"
    ))
    .await
    .unwrap();
    t.db.execute_unprepared("DELETE FROM outbox_key")
        .await
        .unwrap();
    let legacy = outbox_rows(&t.db).await;
    assert_eq!(legacy.len(), 2);

    // Its key still holds while its row is in outbox_event.
    assert_eq!(
        commit_keyed(&t, &outbox, &[keyed("old", "legacy")]).await,
        (0, vec!["legacy".to_owned()])
    );
    // It is SENT to the operator, and can be resent.
    let status = outbox::admin::status(&t.db).await.unwrap();
    assert_eq!(status.outbox.counts.get("SENT"), Some(&2), "{status:?}");
    let report = outbox::admin::resend(
        &t.db,
        &outbox::admin::Resend::Events(vec![legacy[1].event_id]),
        &outbox::admin::Actor::new("ops").reason("upgrade"),
    )
    .await
    .unwrap();
    assert_eq!(report.outbox, 1);
    assert_eq!(status_counts(&t.db).await.get("PENDING"), Some(&1));
    // And it leaves by the retention it had: deleted one by one once old enough.
    let report = janitor::purge(&t.db, &RetentionPolicy::default())
        .await
        .unwrap();
    assert_eq!(report.outbox_deleted, 1, "{report:?}");
    assert_eq!(status_counts(&t.db).await.get("SENT"), None);
}

backend_tests! {
    leave => sent_events_leave_the_queue_table;
    keys => a_dedup_key_outlives_its_sent_event;
    retention => retention_empties_expired_slots_whole;
    earlier_release => an_earlier_releases_sent_rows_stay_usable;
}
