//! The producer half on real PostgreSQL, MariaDB and SQLite (file and in-memory): business rows
//! and events commit together or not at all.

use std::collections::{BTreeMap, HashSet};

use crate::common::*;
use chrono::Utc;
use outbox::prelude::*;
use sea_orm::{ActiveModelTrait, ConnectionTrait, Set, TransactionTrait};
use serde::{Deserialize, Serialize, Serializer};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", aggregate = "order", version = 2)]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: i64,
    #[event(aggregate_version)]
    version: u32,
    order_no: String,
    total_cents: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "payment.requested", aggregate = "order")]
struct PaymentRequested {
    #[event(aggregate_id)]
    order_id: i64,
    #[event(dedup_key)]
    request_key: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "refund.requested", aggregate = "order")]
struct RefundRequested {
    #[event(aggregate_id)]
    order_id: i64,
    #[event(dedup_key)]
    request_key: Option<String>,
}

/// An event whose payload cannot be serialized: serde_json rejects it at `enqueue`.
#[derive(Debug, Clone, Deserialize, DomainEvent)]
#[event(name = "order.broken", aggregate = "order")]
struct Unserializable {
    #[event(aggregate_id)]
    order_id: i64,
}

impl Serialize for Unserializable {
    fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom(
            "the payment token must never leave the service",
        ))
    }
}

fn placed(order_id: i64) -> OrderPlaced {
    OrderPlaced {
        order_id,
        version: 1,
        order_no: format!("SO-{order_id:05}"),
        total_cents: order_id * 100,
    }
}

fn order(id: i64) -> order::ActiveModel {
    order::ActiveModel {
        id: Set(id),
        order_no: Set(format!("SO-{id:05}")),
        total_cents: Set(id * 100),
    }
}

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

async fn commit_writes_rows_and_events(t: TestDb) {
    let outbox = Outbox::new("order-service");
    let mut wake = outbox.subscribe();
    assert!(!wake.has_changed());
    let before = Utc::now() - chrono::Duration::seconds(1);

    let tx = outbox.begin(&t.db).await.unwrap();
    order(1).insert(&tx).await.unwrap();
    let first = tx.enqueue(&placed(1)).unwrap();
    let trace = TraceContext::new(TRACEPARENT, Some("vendor=opaque".into())).unwrap();
    let mut headers = BTreeMap::new();
    headers.insert("tenant".to_owned(), "acme".to_owned());
    let second = trace
        .scope(async {
            tx.enqueue_with_headers(
                &PaymentRequested {
                    order_id: 1,
                    request_key: None,
                },
                headers,
            )
        })
        .await
        .unwrap();
    assert_eq!(tx.buffered(), 2);
    // Not written before commit: the transaction itself sees no event rows yet.
    assert_eq!(count_events(&tx).await, 0);
    let report = tx.commit().await.unwrap();
    assert_eq!(report.written, 2);
    assert!(report.skipped.is_empty());
    assert!(wake.has_changed(), "commit must wake local relays");

    assert_eq!(count_orders(&t.db).await, 1);
    let rows = outbox_rows(&t.db).await;
    assert_eq!(rows.len(), 2);
    let (a, b) = (&rows[0], &rows[1]);
    assert!(a.id < b.id, "ids follow enqueue order");
    assert_eq!(a.event_id, first);
    assert_eq!(a.event_id.get_version_num(), 7, "event ids are UUIDv7");
    assert_eq!(a.source, "order-service");
    assert_eq!(a.event_type, "order.placed");
    assert_eq!(a.schema_version, 2);
    assert_eq!(a.aggregate_type, "order");
    assert_eq!(a.aggregate_id, "1");
    assert_eq!(a.aggregate_version, Some(1));
    assert_eq!(a.dedup_key, None);
    assert_eq!(
        a.payload,
        serde_json::json!({"order_id": 1, "version": 1, "order_no": "SO-00001", "total_cents": 100})
    );
    assert_eq!(a.headers, serde_json::json!({}));
    assert_eq!(a.status, "PENDING");
    assert_eq!(a.attempts, 0);
    assert_eq!(a.next_attempt_at, None);
    assert_eq!(a.locked_by, None);
    assert_eq!(a.claim_token, None);
    assert_eq!(a.sent_at, None);
    assert_eq!(a.last_error, None);
    assert!(a.created_at >= before && a.created_at <= Utc::now() + chrono::Duration::seconds(1));

    assert_eq!(b.event_id, second);
    assert_eq!(b.event_type, "payment.requested");
    assert_eq!(b.schema_version, 1, "version defaults to 1");
    assert_eq!(b.aggregate_version, None);
    assert_eq!(
        b.headers,
        serde_json::json!({"tenant": "acme", "traceparent": TRACEPARENT, "tracestate": "vendor=opaque"})
    );
    wake.woken().await; // returns at once: a commit happened since subscribe
}

async fn rollback_paths_leave_nothing(t: TestDb) {
    let outbox = Outbox::new("order-service");
    let wake = outbox.subscribe();

    // Explicit rollback.
    let tx = outbox.begin(&t.db).await.unwrap();
    order(1).insert(&tx).await.unwrap();
    tx.enqueue(&placed(1)).unwrap();
    tx.rollback().await.unwrap();

    // Dropped without commit.
    {
        let tx = outbox.begin(&t.db).await.unwrap();
        order(2).insert(&tx).await.unwrap();
        tx.enqueue(&placed(2)).unwrap();
    }

    // The closure form returning Err.
    let result: Result<(), TransactionError<String>> = outbox
        .transaction(&t.db, |tx| {
            Box::pin(async move {
                order(3).insert(tx).await.map_err(|e| e.to_string())?;
                tx.enqueue(&placed(3)).map_err(|e| e.to_string())?;
                Err("payment declined".to_owned())
            })
        })
        .await;
    assert_eq!(
        result.unwrap_err().into_callback().as_deref(),
        Some("payment declined")
    );

    assert_eq!(count_orders(&t.db).await, 0);
    assert_eq!(count_events(&t.db).await, 0);
    assert!(!wake.has_changed(), "nothing committed, nobody woken");

    // The closure form returning Ok commits both.
    let n: Result<i64, TransactionError<sea_orm::DbErr>> = outbox
        .transaction(&t.db, |tx| {
            Box::pin(async move {
                order(4).insert(tx).await?;
                tx.enqueue(&placed(4)).unwrap();
                Ok(4)
            })
        })
        .await;
    assert_eq!(n.unwrap(), 4);
    assert_eq!(count_orders(&t.db).await, 1);
    assert_eq!(outbox_rows(&t.db).await[0].aggregate_id, "4");
}

async fn savepoints_keep_or_discard_their_events(t: TestDb) {
    let outbox = Outbox::new("order-service");
    let tx = outbox.begin(&t.db).await.unwrap();
    order(1).insert(&tx).await.unwrap();
    tx.enqueue(&placed(1)).unwrap();

    // Rolled-back savepoint: its row and its event vanish, the outer work stays.
    let sp = tx.savepoint().await.unwrap();
    assert!(sp.is_savepoint());
    order(2).insert(&sp).await.unwrap();
    sp.enqueue(&placed(2)).unwrap();
    sp.rollback().await.unwrap();

    // Dropped savepoint: same.
    {
        let sp = tx.savepoint().await.unwrap();
        order(3).insert(&sp).await.unwrap();
        sp.enqueue(&placed(3)).unwrap();
    }

    // Released savepoint: its event joins the outer transaction.
    let sp = tx.savepoint().await.unwrap();
    order(4).insert(&sp).await.unwrap();
    sp.enqueue(&placed(4)).unwrap();
    let released = sp.commit().await.unwrap();
    assert_eq!(released.carried_to_parent, 1);
    assert_eq!(released.written, 0);

    // SeaORM's own nested-transaction API goes through the same savepoints.
    let nested: Result<(), sea_orm::TransactionError<sea_orm::DbErr>> = tx
        .transaction(|sp| {
            Box::pin(async move {
                order(5).insert(sp).await?;
                sp.enqueue(&placed(5)).unwrap();
                Err(sea_orm::DbErr::Custom("undo order 5".into()))
            })
        })
        .await;
    assert!(nested.is_err());
    let sp = TransactionTrait::begin(&tx).await.unwrap();
    order(6).insert(&sp).await.unwrap();
    sp.enqueue(&placed(6)).unwrap();
    sea_orm::TransactionSession::commit(sp).await.unwrap();

    let report = tx.commit().await.unwrap();
    assert_eq!(report.written, 3);
    let ids: Vec<String> = outbox_rows(&t.db)
        .await
        .into_iter()
        .map(|r| r.aggregate_id)
        .collect();
    assert_eq!(ids, ["1", "4", "6"]);
    assert_eq!(count_orders(&t.db).await, 3);

    // A released savepoint's events still roll back with the outer transaction.
    let tx = outbox.begin(&t.db).await.unwrap();
    let sp = tx.savepoint().await.unwrap();
    order(7).insert(&sp).await.unwrap();
    sp.enqueue(&placed(7)).unwrap();
    let _ = sp.commit().await.unwrap();
    drop(tx);
    assert_eq!(count_events(&t.db).await, 3);
    assert_eq!(count_orders(&t.db).await, 3);
}

async fn ten_thousand_events_in_one_transaction(t: TestDb) {
    let outbox = Outbox::new("bulk-loader");
    let tx = outbox.begin(&t.db).await.unwrap();
    order(1).insert(&tx).await.unwrap();
    let mut ids = Vec::with_capacity(10_000);
    for i in 0..10_000 {
        ids.push(tx.enqueue(&placed(i)).unwrap());
    }
    let report = tx.commit().await.unwrap();
    assert_eq!(report.written, 10_000);
    let rows = outbox_rows(&t.db).await;
    assert_eq!(rows.len(), 10_000);
    // Rows are in enqueue order, one per returned id.
    let stored: Vec<uuid::Uuid> = rows.iter().map(|r| r.event_id).collect();
    assert_eq!(stored, ids);
    assert!(rows.windows(2).all(|w| w[0].id < w[1].id));
    assert_eq!(rows[9_999].aggregate_id, "9999");
}

async fn parallel_transactions_each_write_their_events(t: TestDb) {
    const TASKS: i64 = 8;
    const PER_TASK: i64 = 500;
    let outbox = Outbox::new("order-service");
    let mut handles = Vec::new();
    for task in 0..TASKS {
        let outbox = outbox.clone();
        let db = t.db.clone();
        handles.push(tokio::spawn(async move {
            for i in 0..PER_TASK {
                let id = task * PER_TASK + i;
                let tx = outbox.begin(&db).await.unwrap();
                order(id).insert(&tx).await.unwrap();
                tx.enqueue(&placed(id)).unwrap();
                let report = tx.commit().await.unwrap();
                assert_eq!(report.written, 1);
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let rows = outbox_rows(&t.db).await;
    assert_eq!(rows.len(), 4_000);
    assert_eq!(count_orders(&t.db).await, 4_000);
    let event_ids: HashSet<uuid::Uuid> = rows.iter().map(|r| r.event_id).collect();
    assert_eq!(event_ids.len(), 4_000, "event ids are unique");
    let aggregates: HashSet<&str> = rows.iter().map(|r| r.aggregate_id.as_str()).collect();
    assert_eq!(aggregates.len(), 4_000, "one event per committed order");
}

async fn dedup_key_skips_duplicates_without_aborting(t: TestDb) {
    let outbox = Outbox::new("payments");
    let request = |order_id, key: &str| PaymentRequested {
        order_id,
        request_key: Some(key.to_owned()),
    };

    let tx = outbox.begin(&t.db).await.unwrap();
    order(1).insert(&tx).await.unwrap();
    tx.enqueue(&request(1, "req-1")).unwrap();
    let dup = tx.enqueue(&request(1, "req-1")).unwrap();
    // Same key, another event type: not a duplicate.
    tx.enqueue(&RefundRequested {
        order_id: 1,
        request_key: Some("req-1".into()),
    })
    .unwrap();
    // No key: never deduplicated.
    tx.enqueue(&PaymentRequested {
        order_id: 1,
        request_key: None,
    })
    .unwrap();
    tx.enqueue(&PaymentRequested {
        order_id: 1,
        request_key: None,
    })
    .unwrap();
    let report = tx.commit().await.unwrap();
    assert_eq!(report.written, 4);
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].event_id, dup);
    assert_eq!(report.skipped[0].dedup_key, "req-1");
    assert_eq!(report.skipped[0].event_type, "payment.requested");

    // A later transaction repeating the key: skipped, and the transaction's other work commits.
    let tx = outbox.begin(&t.db).await.unwrap();
    order(2).insert(&tx).await.unwrap();
    let again = tx.enqueue(&request(2, "req-1")).unwrap();
    let fresh = tx.enqueue(&request(2, "req-2")).unwrap();
    tx.enqueue(&placed(2)).unwrap();
    let report = tx.commit().await.unwrap();
    assert_eq!(report.written, 2);
    assert_eq!(
        report
            .skipped
            .iter()
            .map(|s| s.event_id)
            .collect::<Vec<_>>(),
        [again]
    );
    assert_eq!(count_orders(&t.db).await, 2);

    let rows = outbox_rows(&t.db).await;
    assert_eq!(rows.len(), 6);
    assert!(rows.iter().any(|r| r.event_id == fresh));
    assert!(
        !rows
            .iter()
            .any(|r| r.event_id == dup || r.event_id == again)
    );
    let keyed: Vec<_> = rows
        .iter()
        .filter(|r| r.event_type == "payment.requested" && r.dedup_key.as_deref() == Some("req-1"))
        .collect();
    assert_eq!(keyed.len(), 1);
}

async fn bad_events_fail_at_enqueue_and_keep_the_transaction(t: TestDb) {
    let outbox = Outbox::builder("order-service")
        .max_payload_bytes(512)
        .build();
    let tx = outbox.begin(&t.db).await.unwrap();
    order(1).insert(&tx).await.unwrap();

    let err = tx.enqueue(&Unserializable { order_id: 1 }).unwrap_err();
    assert!(matches!(
        err,
        EnqueueError::Serialize {
            event_type: "order.broken",
            ..
        }
    ));
    let text = err.to_string();
    assert!(
        text.contains("`order.broken`") && text.contains("must never leave the service"),
        "{text}"
    );

    let mut big = placed(1);
    big.order_no = "x".repeat(600);
    let err = tx.enqueue(&big).unwrap_err();
    assert!(
        matches!(err, EnqueueError::PayloadTooLarge { limit: 512, .. }),
        "{err}"
    );

    let mut headers = BTreeMap::new();
    headers.insert("Tenant-Id".to_owned(), "acme".to_owned());
    let err = tx.enqueue_with_headers(&placed(1), headers).unwrap_err();
    assert!(err.to_string().contains("`Tenant-Id`"), "{err}");
    let mut headers = BTreeMap::new();
    headers.insert("traceparent".to_owned(), "forged".to_owned());
    assert!(tx.enqueue_with_headers(&placed(1), headers).is_err());

    let err = tx
        .enqueue(&PaymentRequested {
            order_id: 1,
            request_key: Some("k".repeat(256)),
        })
        .unwrap_err();
    assert!(err.to_string().contains("dedup key"), "{err}");

    // NUL: no backend may store it in an attribute, and PostgreSQL's jsonb not in a payload.
    let err = tx
        .enqueue(&PaymentRequested {
            order_id: 1,
            request_key: Some("k\0".into()),
        })
        .unwrap_err();
    assert!(err.to_string().contains("NUL"), "{err}");
    let mut headers = BTreeMap::new();
    headers.insert("tenant".to_owned(), "ac\0me".to_owned());
    let err = tx.enqueue_with_headers(&placed(1), headers).unwrap_err();
    assert!(err.to_string().contains("`tenant` holds a NUL"), "{err}");
    let mut nul = placed(1);
    nul.order_no = "A\0B".into();
    let result = tx.enqueue(&nul);
    if t.backend.is_postgres() {
        let err = result.unwrap_err();
        assert!(err.to_string().contains("jsonb"), "{err}");
    } else {
        assert!(result.is_ok(), "other backends store a NUL in the payload");
    }
    let expected = usize::from(!t.backend.is_postgres());
    assert_eq!(tx.buffered(), expected, "failed enqueues buffer nothing");
    drop(tx);
    let tx = outbox.begin(&t.db).await.unwrap();
    order(1).insert(&tx).await.unwrap();

    assert_eq!(tx.buffered(), 0, "failed enqueues buffer nothing");
    tx.enqueue(&placed(1)).unwrap();
    let report = tx.commit().await.unwrap();
    assert_eq!(report.written, 1);
    assert_eq!(count_orders(&t.db).await, 1);
    assert_eq!(outbox_rows(&t.db).await[0].event_type, "order.placed");
}

async fn small_insert_batches_write_everything(t: TestDb) {
    // Several multi-row INSERT statements per commit, with a dedup key straddling two batches.
    let outbox = Outbox::builder("order-service")
        .insert_batch_rows(7)
        .build();
    let tx = outbox.begin(&t.db).await.unwrap();
    for i in 0..50 {
        tx.enqueue(&placed(i)).unwrap();
        if i % 10 == 0 {
            tx.enqueue(&PaymentRequested {
                order_id: i,
                request_key: Some(format!("k{}", i % 20)),
            })
            .unwrap();
        }
    }
    let report = tx.commit().await.unwrap();
    // keys k0 (i=0,20,40) and k10 (i=10,30): 5 keyed events, 2 distinct keys.
    assert_eq!(report.written, 52);
    assert_eq!(report.skipped.len(), 3);
    assert_eq!(count_events(&t.db).await, 52);
}

async fn after_commit_runs_only_once_committed(t: TestDb) {
    use std::sync::{Arc, Mutex};
    let outbox = Outbox::new("order-service");
    let ran: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let note = |name: &'static str| {
        let ran = ran.clone();
        move || ran.lock().unwrap().push(name)
    };

    let tx = outbox.begin(&t.db).await.unwrap();
    order(1).insert(&tx).await.unwrap();
    tx.enqueue(&placed(1)).unwrap();
    tx.after_commit(note("outer"));
    let kept = tx.savepoint().await.unwrap();
    kept.after_commit(note("released savepoint"));
    let _ = kept.commit().await.unwrap();
    let undone = tx.savepoint().await.unwrap();
    undone.after_commit(note("rolled-back savepoint"));
    undone.rollback().await.unwrap();
    {
        let dropped = tx.savepoint().await.unwrap();
        dropped.after_commit(note("dropped savepoint"));
    }
    assert!(ran.lock().unwrap().is_empty(), "nothing runs before COMMIT");
    let _ = tx.commit().await.unwrap();
    assert_eq!(*ran.lock().unwrap(), ["outer", "released savepoint"]);
    assert_eq!(
        count_events(&t.db).await,
        1,
        "the callbacks ran after the rows committed"
    );

    // Rolled back or dropped: never run.
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.after_commit(note("rolled back"));
    tx.rollback().await.unwrap();
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.after_commit(note("dropped"));
    drop(tx);
    // A statement failed (duplicate primary key): PostgreSQL aborts the transaction, and its
    // COMMIT is a rollback that must not count as committed. Other backends commit the rest.
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.after_commit(note("after a failed statement"));
    order(1).insert(&tx).await.unwrap_err();
    let committed = tx.commit().await.is_ok();
    let expected: &[&str] = if committed {
        &["outer", "released savepoint", "after a failed statement"]
    } else {
        &["outer", "released savepoint"]
    };
    assert_eq!(*ran.lock().unwrap(), expected);
    assert_eq!(committed, !t.backend.is_postgres());
    assert_eq!(count_orders(&t.db).await, 1);
    let mut expected = expected.to_vec();

    // The same failure inside a savepoint: PostgreSQL refuses its release, and the savepoint is
    // rolled back instead, which leaves the enclosing transaction whole: it commits for real.
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.after_commit(note("after a failed savepoint"));
    let inner = tx.savepoint().await.unwrap();
    order(1).insert(&inner).await.unwrap_err();
    let released = inner.commit().await.is_ok();
    assert_eq!(released, !t.backend.is_postgres());
    let _ = tx.commit().await.unwrap();
    expected.push("after a failed savepoint");
    assert_eq!(*ran.lock().unwrap(), expected);

    // A failure rolled back with its savepoint leaves the transaction whole.
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.after_commit(note("after a rolled-back failure"));
    let inner = tx.savepoint().await.unwrap();
    order(1).insert(&inner).await.unwrap_err();
    inner.rollback().await.unwrap();
    order(2).insert(&tx).await.unwrap();
    let _ = tx.commit().await.unwrap();
    expected.push("after a rolled-back failure");
    assert_eq!(*ran.lock().unwrap(), expected);
    assert_eq!(count_orders(&t.db).await, 2);

    if t.backend.is_postgres() {
        // A statement given up on before its answer (its future dropped by a timeout) that the
        // server then failed: the driver reports its error at the commit, and no callback runs.
        let tx = outbox.begin(&t.db).await.unwrap();
        tx.after_commit(note("after an abandoned statement"));
        let slow_failure = tx.execute_unprepared(
            "SELECT 1 / length(CAST(pg_sleep(0.3) AS text)) AS n", // division by zero
        );
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), slow_failure)
                .await
                .is_err()
        );
        tx.commit().await.unwrap_err();
        assert_eq!(*ran.lock().unwrap(), expected);
    }
}

/// A transaction without events whose statements all succeeded commits with no extra round trip
/// before its callbacks; one whose statement failed asks the server first (PostgreSQL), so a
/// silent rollback never runs them.
async fn after_commit_asks_only_after_a_failure(t: TestDb) {
    let statements = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut db = t.db.clone();
    let seen = statements.clone();
    db.set_metric_callback(move |info| seen.lock().unwrap().push(info.statement.sql.clone()));
    let outbox = Outbox::new("order-service");
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let note = || {
        let ran = ran.clone();
        move || {
            ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    };
    let asked = || {
        statements
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.as_str() == "SELECT 1")
            .count()
    };

    let tx = outbox.begin(&db).await.unwrap();
    order(1).insert(&tx).await.unwrap();
    tx.after_commit(note());
    let _ = tx.commit().await.unwrap();
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(asked(), 0, "{:?}", statements.lock().unwrap());

    let tx = outbox.begin(&db).await.unwrap();
    order(1).insert(&tx).await.unwrap_err();
    tx.after_commit(note());
    let committed = tx.commit().await.is_ok();
    let postgres = t.backend.is_postgres();
    assert_eq!(committed, !postgres);
    assert_eq!(asked(), usize::from(postgres));
    assert_eq!(
        ran.load(std::sync::atomic::Ordering::SeqCst),
        if postgres { 1 } else { 2 }
    );
    assert_eq!(count_orders(&t.db).await, 1);
}

/// The commit's INSERT checks for a conflict on `(event_type, dedup_key)` only when an event
/// carries a deduplication key: without one nothing can conflict, and the plain INSERT is what a
/// hand-written outbox sends. (MySQL keeps its clause, which covers every unique key.)
async fn conflict_check_only_with_a_dedup_key(t: TestDb) {
    let inserts = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut db = t.db.clone();
    let seen = inserts.clone();
    db.set_metric_callback(move |info| {
        if info.statement.sql.starts_with("INSERT INTO outbox_event") {
            seen.lock().unwrap().push(info.statement.sql.clone());
        }
    });
    let outbox = Outbox::new("payments");
    let tx = outbox.begin(&db).await.unwrap();
    tx.enqueue(&placed(1)).unwrap();
    let _ = tx.commit().await.unwrap();
    let tx = outbox.begin(&db).await.unwrap();
    tx.enqueue(&PaymentRequested {
        order_id: 1,
        request_key: Some("req-1".into()),
    })
    .unwrap();
    let _ = tx.commit().await.unwrap();

    let inserts = inserts.lock().unwrap().clone();
    assert_eq!(inserts.len(), 2, "{inserts:?}");
    let mysql = t.backend == Backend::MySql;
    assert_eq!(
        inserts[0].contains("ON CONFLICT") || inserts[0].contains("ON DUPLICATE KEY"),
        mysql,
        "no key: {}",
        inserts[0]
    );
    assert!(
        inserts[1].contains("ON CONFLICT") || inserts[1].contains("ON DUPLICATE KEY"),
        "a key: {}",
        inserts[1]
    );
    assert_eq!(outbox_rows(&t.db).await.len(), 2);
}

backend_tests! {
    after_commit => after_commit_runs_only_once_committed;
    after_commit_asks => after_commit_asks_only_after_a_failure;
    commit_writes => commit_writes_rows_and_events;
    rollback_paths => rollback_paths_leave_nothing;
    savepoints => savepoints_keep_or_discard_their_events;
    ten_thousand => ten_thousand_events_in_one_transaction;
    parallel => parallel_transactions_each_write_their_events;
    dedup => dedup_key_skips_duplicates_without_aborting;
    bad_events => bad_events_fail_at_enqueue_and_keep_the_transaction;
    small_batches => small_insert_batches_write_everything;
    conflict_check => conflict_check_only_with_a_dedup_key;
}

/// The committed events are registered in the compile-time catalogue.
#[test]
fn events_are_in_the_catalogue() {
    let catalogue = outbox::registry::EventCatalogue::load().expect("no duplicate event types");
    catalogue
        .require(["order.placed", "payment.requested", "refund.requested"])
        .unwrap();
    let reg = catalogue.get("order.placed", 2).unwrap();
    assert_eq!(reg.aggregate_type, "order");
    assert_eq!(reg.rust_type, "OrderPlaced");
    assert!(reg.file.ends_with("outbox_transaction.rs"), "{}", reg.file);
}
