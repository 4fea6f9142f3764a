//! A work queue that a held horizon left large and nearly empty is rewritten by retention with
//! its live rows (PostgreSQL): the table comes back to its size, its unfinished events stay as
//! they were and are still sent; a rewrite that cannot have the table's lock in time is left to
//! the next purge and loses nothing. Elsewhere a purge rewrites nothing.

use std::time::Duration;

use crate::common::carts::*;
use crate::common::*;
use outbox::prelude::*;
use outbox::relay::{Relay, RelayConfig};
use outbox::retention::{self as janitor, RetentionPolicy};
use outbox::transport::memory::MemoryTransport;
use sea_orm::{ConnectionTrait, TransactionTrait};

async fn heap_bytes(t: &TestDb) -> i64 {
    scalar_i64(
        &t.db,
        "SELECT pg_relation_size('outbox_event')::bigint AS n",
    )
    .await
}

/// The ids and event ids of `outbox_event`, in id order.
async fn queue(t: &TestDb) -> Vec<(i64, uuid::Uuid)> {
    outbox_rows(&t.db)
        .await
        .iter()
        .map(|row| (row.id, row.event_id))
        .collect()
}

async fn a_large_nearly_empty_queue_is_rewritten(t: TestDb) {
    let outbox = Outbox::new("carts");
    let policy = RetentionPolicy::default().compact_above(Some(1 << 20));
    // Three events to keep, 20,000 that leave (as if sent while the horizon was held), two
    // more to keep at the table's end, so vacuum could not give the space back by itself.
    commit_lines(
        outbox.begin(&t.db).await.unwrap(),
        &[("kept", 0), ("kept", 1), ("kept", 2)],
    )
    .await;
    let first_gone = scalar_i64(&t.db, "SELECT MAX(id) + 1 AS n FROM outbox_event").await;
    produce(&t, &outbox, 100, 200, 2_000).await;
    let last_gone = scalar_i64(&t.db, "SELECT MAX(id) AS n FROM outbox_event").await;
    commit_lines(
        outbox.begin(&t.db).await.unwrap(),
        &[("kept", 3), ("kept", 4)],
    )
    .await;
    t.db.execute_unprepared(&format!(
        "DELETE FROM outbox_event WHERE id BETWEEN {first_gone} AND {last_gone}"
    ))
    .await
    .unwrap();
    let kept = queue(&t).await;
    assert_eq!(kept.len(), 5);

    if !t.backend.is_postgres() {
        let report = janitor::purge(&t.db, &policy).await.unwrap();
        assert!(report.compacted.is_empty(), "{report:?}");
        assert_eq!(queue(&t).await, kept);
        return;
    }
    // The server's statistics count the rows each connection wrote once it reports them (up to
    // seconds later, in any order), and an automatic ANALYZE in between can count some twice:
    // wait until every connection's inserts and the delete are reported, then count afresh, as
    // the next automatic ANALYZE would.
    assert!(
        eventually(Duration::from_secs(30), || async {
            scalar_i64(
                &t.db,
                "SELECT CASE WHEN n_tup_ins >= 20005 AND n_tup_del >= 20000 THEN 1::bigint ELSE 0::bigint END \
                 AS n FROM pg_stat_user_tables WHERE relname = 'outbox_event'",
            )
            .await
                == 1
        })
        .await
    );
    t.db.execute_unprepared("ANALYZE outbox_event")
        .await
        .unwrap();
    assert_eq!(
        scalar_i64(
            &t.db,
            "SELECT n_live_tup AS n FROM pg_stat_user_tables WHERE relname = 'outbox_event'"
        )
        .await,
        5
    );
    let before = heap_bytes(&t).await;
    assert!(before > 2 << 20, "the 20,000 rows took {before} bytes");

    // A reader of the table in a transaction: the rewrite waits for its lock 100 ms, then
    // gives up until the next purge, and the purge succeeds.
    let reader = t.db.begin().await.unwrap();
    reader
        .execute_unprepared("LOCK TABLE outbox_event IN ACCESS SHARE MODE")
        .await
        .unwrap();
    let report = janitor::purge(&t.db, &policy).await.unwrap();
    assert!(report.compacted.is_empty(), "{report:?}");
    assert_eq!(heap_bytes(&t).await, before);
    reader.rollback().await.unwrap();

    // The next purge rewrites it (or the one after, should autovacuum hold the table just then):
    // a few pages, the same rows, recorded in the audit log.
    let mut report = janitor::purge(&t.db, &policy).await.unwrap();
    for _ in 0..50 {
        if !report.compacted.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        report = janitor::purge(&t.db, &policy).await.unwrap();
    }
    assert_eq!(report.compacted.len(), 1, "{report:?}");
    let rewritten = &report.compacted[0];
    assert_eq!(rewritten.table, "outbox_event");
    assert_eq!(rewritten.bytes_before, before);
    let after = heap_bytes(&t).await;
    assert_eq!(rewritten.bytes_after, after);
    assert!(after <= 64 << 10, "{after} bytes for 5 rows");
    assert_eq!(queue(&t).await, kept);
    let audit = scalar_i64(
        &t.db,
        "SELECT COUNT(*) AS n FROM outbox_admin_action \
         WHERE action = 'purge' AND target LIKE '%outbox_event rewritten from%'",
    )
    .await;
    assert_eq!(audit, 1);
    // Nothing left to give back: the next purge leaves it alone.
    let report = janitor::purge(&t.db, &policy).await.unwrap();
    assert!(report.compacted.is_empty(), "{report:?}");

    // The kept events are still sent, in their order.
    let transport = MemoryTransport::new();
    let relay = Relay::new(t.db.clone(), std::sync::Arc::new(transport.clone()))
        .with_config(RelayConfig::default().poll_interval(Duration::from_millis(50)))
        .spawn();
    assert!(
        eventually(Duration::from_secs(20), || async {
            transport.messages().len() == 5
        })
        .await,
        "{} of 5 sent",
        transport.messages().len()
    );
    relay.shutdown().await.unwrap();
    let sent: Vec<uuid::Uuid> = transport.messages().iter().map(|m| m.event_id).collect();
    let ids: Vec<uuid::Uuid> = kept.iter().map(|(_, id)| *id).collect();
    assert_eq!(sent, ids);
}

backend_tests! {
    rewritten => a_large_nearly_empty_queue_is_rewritten;
}
