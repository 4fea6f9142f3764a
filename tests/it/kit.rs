//! The test kit's own guarantees: a database per test on every backend, isolated and dropped;
//! due times moved by the database's clock. (How the kit reads as a user's tests is shown by
//! `examples/shop/tests/shop.rs`; the SDK's own tests use it in `inbox`, `upcast` and `webhooks`.)

use std::time::Duration;

use crate::common::*;
use outbox::prelude::*;
use outbox::sea_orm::{DatabaseConnection, DbBackend, Statement};
use outbox::testing::{self, EventState, Mark, TestDb, TestDbKind};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, DomainEvent)]
#[event(name = "kit.parcel_shipped", aggregate = "parcel")]
struct ParcelShipped {
    #[event(aggregate_id)]
    parcel: i64,
}

async fn ship(db: &DatabaseConnection, parcel: i64) {
    let tx = Outbox::new("kit").begin(db).await.unwrap();
    tx.enqueue(&ParcelShipped { parcel }).unwrap();
    let report = tx.commit().await.unwrap();
    assert_eq!(report.written, 1);
}

/// Two test databases of a backend, or none (skipped) when its server does not answer.
async fn pair(backend: Backend) -> Option<(TestDb, TestDb)> {
    let make = || async {
        match backend {
            Backend::Postgres => TestDb::postgres(&postgres_admin_url()).await,
            Backend::MySql => TestDb::mysql(&mysql_admin_url()).await,
            _ => TestDb::sqlite().await,
        }
    };
    match (make().await, make().await) {
        (Ok(a), Ok(b)) => Some((a, b)),
        (Err(e), _) | (_, Err(e)) => {
            assert!(!services_required(), "{backend:?}: {e}");
            eprintln!("SKIPPED: {backend:?} is not reachable ({e})");
            None
        }
    }
}

/// Whether the schema or database `kind` names exists on its server.
async fn exists(kind: &TestDbKind) -> bool {
    let (url, sql, backend, name) = match kind {
        TestDbKind::PostgresSchema(s) => (
            postgres_admin_url(),
            "SELECT 1 AS one FROM pg_namespace WHERE nspname = $1",
            DbBackend::Postgres,
            s.clone(),
        ),
        TestDbKind::MySqlDatabase(d) => (
            mysql_admin_url(),
            "SELECT 1 AS one FROM information_schema.schemata WHERE schema_name = ?",
            DbBackend::MySql,
            d.clone(),
        ),
        TestDbKind::SqliteMemory => return false,
    };
    let admin = connect(&url, 1).await.unwrap();
    let found = admin
        .query_one_raw(Statement::from_sql_and_values(backend, sql, [name.into()]))
        .await
        .unwrap()
        .is_some();
    admin.close().await.ok();
    found
}

async fn isolated_and_dropped(backend: Backend) {
    let Some((a, b)) = pair(backend).await else {
        return;
    };
    if backend != Backend::SqliteMemory {
        assert_ne!(a.kind(), b.kind());
    }
    ship(&a, 1).await;
    ship(&a, 2).await;
    ship(&b, 3).await;
    let in_a = testing::events(&a, &Mark::start()).await.unwrap();
    let in_b = testing::events(&b, &Mark::start()).await.unwrap();
    assert_eq!(
        in_a.of::<ParcelShipped>(),
        [ParcelShipped { parcel: 1 }, ParcelShipped { parcel: 2 }]
    );
    assert_eq!(in_b.of::<ParcelShipped>(), [ParcelShipped { parcel: 3 }]);
    let (kind_a, kind_b) = (a.kind().clone(), b.kind().clone());
    if backend != Backend::SqliteMemory {
        assert!(exists(&kind_a).await, "{kind_a:?} was not made");
    }
    a.cleanup().await.unwrap();
    b.cleanup().await.unwrap();
    assert!(!exists(&kind_a).await, "{kind_a:?} was not dropped");
    assert!(!exists(&kind_b).await, "{kind_b:?} was not dropped");
}

#[tokio::test]
async fn test_databases_are_isolated_and_dropped_on_sqlite() {
    isolated_and_dropped(Backend::SqliteMemory).await;
}

#[tokio::test]
async fn test_databases_are_isolated_and_dropped_on_postgres() {
    isolated_and_dropped(Backend::Postgres).await;
}

#[tokio::test]
async fn test_databases_are_isolated_and_dropped_on_mysql() {
    isolated_and_dropped(Backend::MySql).await;
}

async fn due_times_move_by_the_database_clock(backend: Backend) {
    let Some((db, other)) = pair(backend).await else {
        return;
    };
    let tx = Outbox::new("kit").begin(&db).await.unwrap();
    tx.enqueue_after(&ParcelShipped { parcel: 9 }, Duration::from_secs(3600))
        .unwrap();
    assert_eq!(tx.commit().await.unwrap().scheduled, 1);
    let due_at = |events: &testing::Events| match events.all()[0].state {
        EventState::Scheduled(Some(at)) => at,
        ref other => panic!("not scheduled: {other:?}"),
    };
    let first = due_at(&testing::events(&db, &Mark::start()).await.unwrap());

    // Half an hour of waiting: still scheduled, thirty minutes sooner.
    let moved = testing::advance(&db, Duration::from_secs(1800))
        .await
        .unwrap();
    assert_eq!(moved.scheduled, 0);
    let second = due_at(&testing::events(&db, &Mark::start()).await.unwrap());
    assert_eq!((first - second).num_seconds(), 1800);

    // Another 31 minutes: due now, by the database's clock.
    let moved = testing::advance(&db, Duration::from_secs(31 * 60))
        .await
        .unwrap();
    assert_eq!(moved.scheduled, 1);
    let now = outbox::store::database_now(&*db).await.unwrap();
    let third = due_at(&testing::events(&db, &Mark::start()).await.unwrap());
    assert!(third <= now, "{third} is after the database's {now}");
    assert_eq!(testing::make_due(&db).await.unwrap().scheduled, 0);
    db.cleanup().await.unwrap();
    other.cleanup().await.unwrap();
}

#[tokio::test]
async fn due_times_move_by_the_database_clock_on_sqlite() {
    due_times_move_by_the_database_clock(Backend::SqliteMemory).await;
}

#[tokio::test]
async fn due_times_move_by_the_database_clock_on_postgres() {
    due_times_move_by_the_database_clock(Backend::Postgres).await;
}

#[tokio::test]
async fn due_times_move_by_the_database_clock_on_mysql() {
    due_times_move_by_the_database_clock(Backend::MySql).await;
}

/// PostgreSQL schemas are migrated ahead, in the background, and taken by renaming; one migrated
/// by other migrations is never taken, and is dropped.
#[tokio::test]
async fn postgres_schemas_are_migrated_ahead_and_others_migrations_dropped() {
    let url = postgres_admin_url();
    let admin = match connect(&url, 1).await {
        Ok(admin) => admin,
        Err(e) => {
            assert!(!services_required(), "PostgreSQL: {e}");
            return;
        }
    };
    let foreign = "outbox_ready_00000000_1_1_1";
    admin
        .execute_unprepared(&format!("CREATE SCHEMA IF NOT EXISTS {foreign}"))
        .await
        .unwrap();
    let first = TestDb::postgres(&url).await.unwrap();
    let ready = |admin: DatabaseConnection| async move {
        admin
            .query_all_raw(Statement::from_string(
                DbBackend::Postgres,
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'outbox\\_ready\\_%'",
            ))
            .await
            .unwrap()
            .iter()
            .map(|r| r.try_get::<String>("", "nspname").unwrap())
            .collect::<Vec<_>>()
    };
    assert!(!ready(admin.clone()).await.contains(&foreign.to_owned()));
    // The replenishing thread leaves at least one migrated schema ready.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while ready(admin.clone()).await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no schema was made ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = TestDb::postgres(&url).await.unwrap();
    ship(&second, 5).await;
    let events = testing::events(&second, &Mark::start()).await.unwrap();
    assert_eq!(events.of::<ParcelShipped>(), [ParcelShipped { parcel: 5 }]);
    first.cleanup().await.unwrap();
    second.cleanup().await.unwrap();
    admin.close().await.ok();
}

// A consumer for the inbox row the snapshot test flips.
#[inbox_handler(consumer = "t-kit")]
async fn parcel_shipped(
    _tx: &InboxTransaction,
    _event: Event<ParcelShipped>,
) -> Result<(), HandlerError> {
    Ok(())
}

/// Set the status of the kit's event and of `t-kit`'s inbox row in one transaction.
async fn flip(db: &DatabaseConnection, event: &str, message: &str) {
    use outbox::sea_orm::{
        ConnectionTrait, TransactionTrait,
        sea_query::{Alias, Expr, ExprTrait, Query},
    };
    let backend = db.get_database_backend();
    let txn = db.begin().await.unwrap();
    let outbox = Query::update()
        .table(Alias::new("outbox_event"))
        .value(Alias::new("status"), event)
        .and_where(Expr::col(Alias::new("event_type")).eq("kit.parcel_shipped"))
        .to_owned();
    let inbox = Query::update()
        .table(Alias::new("inbox_event"))
        .value(Alias::new("status"), message)
        .and_where(Expr::col(Alias::new("consumer")).eq("t-kit"))
        .to_owned();
    for update in [outbox, inbox] {
        let done = txn.execute(&update).await.unwrap();
        assert_eq!(done.rows_affected(), 1, "{}", backend.build(&update));
    }
    txn.commit().await.unwrap();
}

/// A step committed between two of a session's reads (an inbox row settled in the same commit
/// as the event it produced) never looks quiet: each look reads one snapshot. Here an event and
/// an inbox row trade being the one thing moving, in one transaction, over and over; read
/// statement by statement, the outbox read after a flip and the inbox read before the next one
/// would both find nothing.
async fn a_step_between_two_reads_never_looks_quiet(backend: Backend) {
    let Some((db, other)) = pair(backend).await else {
        return;
    };
    ship(&db, 1).await;
    let consumer = testing::TestConsumer::new("t-kit", &db).unwrap();
    assert!(
        consumer
            .deliver_bytes(b"not an event")
            .await
            .unwrap()
            .is_dead()
    );
    let session = testing::Session::start(&db).await.unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flipper = {
        let (db, stop) = ((*db).clone(), stop.clone());
        tokio::spawn(async move {
            let mut flips = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                match flips % 2 {
                    0 => flip(&db, "DEAD", "PENDING").await,
                    _ => flip(&db, "PENDING", "DEAD").await,
                }
                flips += 1;
                tokio::task::yield_now().await;
            }
            flips
        })
    };
    let looked = session.quiet(Duration::from_secs(3)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let flips = flipper.await.unwrap();
    assert!(flips >= 20, "{backend:?}: only {flips} flips in 3 s");
    match looked {
        Err(testing::KitError::NotQuiet(moving)) => {
            assert!(moving.contains("- 1 "), "{backend:?}: {moving}")
        }
        other => panic!(
            "{backend:?}: quiet while one row moved at every moment ({flips} flips): {other:?}"
        ),
    }
    // Once neither moves, it is quiet.
    flip(&db, "DEAD", "DEAD").await;
    let quiet = session.quiet(Duration::from_secs(3)).await.unwrap();
    assert!(quiet.events.is_empty(), "{backend:?}: {:?}", quiet.events);
    db.cleanup().await.unwrap();
    other.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_step_between_two_reads_never_looks_quiet_on_sqlite() {
    a_step_between_two_reads_never_looks_quiet(Backend::SqliteMemory).await;
}

#[tokio::test]
async fn a_step_between_two_reads_never_looks_quiet_on_postgres() {
    a_step_between_two_reads_never_looks_quiet(Backend::Postgres).await;
}

#[tokio::test]
async fn a_step_between_two_reads_never_looks_quiet_on_mysql() {
    a_step_between_two_reads_never_looks_quiet(Backend::MySql).await;
}
