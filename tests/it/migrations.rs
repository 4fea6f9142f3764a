//! The SDK's migrations: up, down and up again on every backend, alone or inside an app's Migrator.

use crate::common::*;
use outbox::Migrator;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement};
use sea_orm_migration::prelude::*;

async fn table_exists(db: &DatabaseConnection, table: &str) -> bool {
    let backend = db.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => format!(
            "SELECT COUNT(*) AS n FROM information_schema.tables WHERE table_schema = 'public' AND table_name = '{table}'"
        ),
        DbBackend::MySql => format!(
            "SELECT COUNT(*) AS n FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = '{table}'"
        ),
        _ => format!(
            "SELECT COUNT(*) AS n FROM sqlite_master WHERE type = 'table' AND name = '{table}'"
        ),
    };
    scalar_i64(db, &sql).await == 1
}

async fn index_names(db: &DatabaseConnection, table: &str) -> Vec<String> {
    let backend = db.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => {
            format!("SELECT indexname AS name FROM pg_indexes WHERE tablename = '{table}'")
        }
        DbBackend::MySql => format!(
            "SELECT DISTINCT index_name AS name FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = '{table}'"
        ),
        _ => {
            format!("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = '{table}'")
        }
    };
    let rows = db
        .query_all_raw(Statement::from_string(backend, sql))
        .await
        .unwrap();
    rows.iter()
        .map(|r| r.try_get::<String>("", "name").unwrap())
        .collect()
}

async fn up_down_up(t: TestDb) {
    // test_db already ran `outbox::migrate`; running it again changes nothing.
    outbox::migrate(&t.db).await.unwrap();
    assert!(table_exists(&t.db, "outbox_event").await);
    assert!(table_exists(&t.db, "inbox_event").await);
    assert!(table_exists(&t.db, "outbox_migrations").await);
    assert!(
        !table_exists(&t.db, "seaql_migrations").await,
        "outbox::migrate keeps to its own table"
    );
    let applied = scalar_i64(&t.db, "SELECT COUNT(*) AS n FROM outbox_migrations").await;
    assert_eq!(applied, 15);

    let indexes = index_names(&t.db, "outbox_event").await;
    for expected in ["outbox_event_dedup_key_idx", "outbox_event_event_id_key"] {
        assert!(
            indexes
                .iter()
                .any(|i| i == expected || i.starts_with("sqlite_autoindex")),
            "{expected} missing from {indexes:?}"
        );
    }
    match t.db.get_database_backend() {
        DbBackend::MySql => assert!(
            indexes.iter().any(|i| i == "outbox_event_status_idx"),
            "{indexes:?}"
        ),
        _ => {
            assert!(
                indexes.iter().any(|i| i == "outbox_event_open_idx"),
                "{indexes:?}"
            );
            assert!(
                !indexes.iter().any(|i| i == "outbox_event_unsent_idx"),
                "{indexes:?}"
            );
            let inbox = index_names(&t.db, "inbox_event").await;
            assert!(
                inbox.iter().any(|i| i == "inbox_event_open_idx"),
                "{inbox:?}"
            );
            assert!(
                !inbox.iter().any(|i| i == "inbox_event_unfinished_idx"),
                "{inbox:?}"
            );
        }
    }

    Migrator::down(&t.db, None).await.unwrap();
    assert!(!table_exists(&t.db, "outbox_event").await);
    assert!(!table_exists(&t.db, "inbox_event").await);
    assert!(!table_exists(&t.db, "inbox_aggregate_version").await);
    assert!(!table_exists(&t.db, "outbox_admin_action").await);
    assert!(!table_exists(&t.db, "outbox_lease").await);
    assert!(!table_exists(&t.db, "outbox_relay").await);
    assert!(!table_exists(&t.db, "outbox_failure").await);
    assert!(!table_exists(&t.db, "outbox_scheduled").await);
    assert!(!table_exists(&t.db, "outbox_rescan").await);
    assert!(!table_exists(&t.db, "outbox_sent").await);
    assert!(!table_exists(&t.db, "outbox_key").await);
    assert!(!table_exists(&t.db, "outbox_rotation").await);
    assert_eq!(
        scalar_i64(&t.db, "SELECT COUNT(*) AS n FROM outbox_migrations").await,
        0
    );

    Migrator::up(&t.db, None).await.unwrap();
    assert!(table_exists(&t.db, "outbox_event").await);
    assert!(table_exists(&t.db, "inbox_event").await);
    assert!(table_exists(&t.db, "inbox_aggregate_version").await);
    assert!(table_exists(&t.db, "outbox_relay").await);
    assert!(table_exists(&t.db, "outbox_failure").await);
    assert!(table_exists(&t.db, "outbox_scheduled").await);
    assert_eq!(
        scalar_i64(
            &t.db,
            "SELECT generation AS n FROM outbox_rescan WHERE id = 1"
        )
        .await,
        0
    );
    Migrator::up(&t.db, None).await.unwrap();
    assert_eq!(
        scalar_i64(&t.db, "SELECT COUNT(*) AS n FROM outbox_migrations").await,
        15
    );
}

/// An application's own migration, composed with the SDK's.
struct CreateInvoice;

impl MigrationName for CreateInvoice {
    fn name(&self) -> &str {
        "m20260101_000001_create_invoice"
    }
}

#[async_trait::async_trait]
#[allow(elided_lifetimes_in_paths)]
impl MigrationTrait for CreateInvoice {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("invoice")
                    .col(ColumnDef::new("id").big_integer().not_null().primary_key())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table("invoice").to_owned())
            .await
    }
}

struct AppMigrator;

#[async_trait::async_trait]
impl MigratorTrait for AppMigrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        let mut all = outbox::migrations();
        all.push(Box::new(CreateInvoice));
        all
    }
}

async fn composed_into_an_app_migrator(t: TestDb) {
    // Start from an empty schema: the app's Migrator owns everything.
    Migrator::down(&t.db, None).await.unwrap();
    AppMigrator::up(&t.db, None).await.unwrap();
    assert!(table_exists(&t.db, "outbox_event").await);
    assert!(table_exists(&t.db, "inbox_event").await);
    assert!(table_exists(&t.db, "invoice").await);
    let names =
        t.db.query_all_raw(Statement::from_string(
            t.db.get_database_backend(),
            "SELECT version FROM seaql_migrations ORDER BY version".to_owned(),
        ))
        .await
        .unwrap()
        .iter()
        .map(|r| r.try_get::<String>("", "version").unwrap())
        .collect::<Vec<_>>();
    assert_eq!(
        names,
        [
            "m20260101_000001_create_invoice",
            "outbox_0001_create_outbox_event",
            "outbox_0002_create_inbox_event",
            "outbox_0003_create_inbox_aggregate_version",
            "outbox_0004_create_admin_action",
            "outbox_0005_create_relay",
            "outbox_0006_inbox_external_keys",
            "outbox_0007_inbox_drop_message_id_key",
            "outbox_0008_create_failure",
            "outbox_0009_create_scheduled",
            "outbox_0010_failure_class",
            "outbox_0011_claim_floor",
            "outbox_0012_open_idx",
            "outbox_0013_sent_rotation",
            "outbox_0014_inbox_rotation",
            "outbox_0015_pause"
        ]
    );
    AppMigrator::down(&t.db, None).await.unwrap();
    assert!(!table_exists(&t.db, "outbox_event").await);
    assert!(!table_exists(&t.db, "invoice").await);
}

/// How the release before `outbox_0006` recorded a delivery: the old key in its conflict clause
/// (`INSERT IGNORE` on MySQL), no `origin`, `biz_key` or `headers`.
async fn old_release_insert(
    db: &DatabaseConnection,
    consumer: &str,
    message_id: &str,
    payload: &[u8],
) -> Result<u64, DbErr> {
    let backend = db.get_database_backend();
    let (head, values, tail) = match backend {
        DbBackend::Postgres => (
            "INSERT INTO",
            "($1, $2, 'order.placed', 'svc', $3, 'PENDING', 0, now())",
            " ON CONFLICT (consumer, message_id) DO NOTHING",
        ),
        DbBackend::MySql => (
            "INSERT IGNORE INTO",
            "(?, ?, 'order.placed', 'svc', ?, 'PENDING', 0, UTC_TIMESTAMP(6))",
            "",
        ),
        _ => (
            "INSERT INTO",
            "(?, ?, 'order.placed', 'svc', ?, 'PENDING', 0, strftime('%Y-%m-%dT%H:%M:%f000Z', 'now'))",
            " ON CONFLICT (consumer, message_id) DO NOTHING",
        ),
    };
    let sql = format!(
        "{head} inbox_event (consumer, message_id, event_type, source, payload, status, attempts, \
         received_at) VALUES {values}{tail}"
    );
    let result = db
        .execute_raw(Statement::from_sql_and_values(
            backend,
            sql,
            [consumer.into(), message_id.into(), payload.to_vec().into()],
        ))
        .await?;
    Ok(result.rows_affected())
}

/// Upgrading a database that holds inbox rows, with processes of the previous release still
/// writing: `outbox_0006` keeps every row and the old statements working, the new release can
/// receive external messages beside them, and `outbox_0007` (applied once the old release is
/// gone) lets two sources use the same message id, still keeping every row, id and the id
/// sequence.
async fn upgrade_keeps_rows_and_a_rolling_upgrade_working(t: TestDb) {
    use outbox::inbox::{ExternalInbox, IncomingMessage, Receipt, ReceiveError};
    let db = &t.db;
    // Back to the schema of the release before `outbox_0006`.
    Migrator::down(db, Some(10)).await.unwrap();
    assert_eq!(
        scalar_i64(db, "SELECT COUNT(*) AS n FROM outbox_migrations").await,
        5
    );
    for n in 0..5 {
        let id = format!("0190a0b0-0000-7000-8000-00000000000{n}");
        assert_eq!(
            old_release_insert(db, "billing", &id, b"{}").await.unwrap(),
            1
        );
    }
    // The newest row is gone (retention), so the id sequence is ahead of the rows.
    let last = scalar_i64(db, "SELECT MAX(id) AS n FROM inbox_event").await;
    db.execute_unprepared(&format!("DELETE FROM inbox_event WHERE id = {last}"))
        .await
        .unwrap();

    // Expand: the old release goes on writing, and is still deduplicated.
    Migrator::up(db, Some(1)).await.unwrap();
    let id0 = "0190a0b0-0000-7000-8000-000000000000";
    assert_eq!(
        old_release_insert(db, "billing", id0, b"{}").await.unwrap(),
        0
    );
    let id9 = "0190a0b0-0000-7000-8000-000000000009";
    assert_eq!(
        old_release_insert(db, "billing", id9, b"{}").await.unwrap(),
        1
    );
    // The new release receives external messages beside the old rows...
    let inbox = ExternalInbox::new(db.clone());
    let message = |source: &str, id: &str| {
        IncomingMessage::new("billing", source, id, "payment.succeeded", b"{}".to_vec())
    };
    assert_eq!(
        inbox.receive(&message("psp-a", "evt_1")).await.unwrap(),
        Receipt::New
    );
    assert!(matches!(
        inbox.receive(&message("psp-a", "evt_1")).await.unwrap(),
        Receipt::Duplicate { .. }
    ));
    // ...but while the old key is in place, another source's `evt_1` is refused, saying what
    // to do, and nothing is stored.
    let refused = inbox.receive(&message("psp-b", "evt_1")).await.unwrap_err();
    assert!(matches!(refused, ReceiveError::OldKey { .. }), "{refused}");
    assert!(refused.to_string().contains("outbox_0007"), "{refused}");

    // Contract, once the old release is gone.
    Migrator::up(db, None).await.unwrap();
    assert_eq!(
        scalar_i64(db, "SELECT COUNT(*) AS n FROM outbox_migrations").await,
        15
    );
    assert_eq!(
        inbox.receive(&message("psp-b", "evt_1")).await.unwrap(),
        Receipt::New
    );
    let rows = inbox_rows(db, "billing").await;
    let ids: Vec<&str> = rows.iter().map(|r| r.message_id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "0190a0b0-0000-7000-8000-000000000000",
            "0190a0b0-0000-7000-8000-000000000001",
            "0190a0b0-0000-7000-8000-000000000002",
            "0190a0b0-0000-7000-8000-000000000003",
            "0190a0b0-0000-7000-8000-000000000009",
            "evt_1",
            "evt_1"
        ]
    );
    assert_eq!(
        scalar_i64(
            db,
            "SELECT COUNT(*) AS n FROM inbox_event WHERE origin = ''"
        )
        .await,
        5
    );
    // No id handed out before is handed out again.
    assert!(
        scalar_i64(
            db,
            "SELECT MIN(id) AS n FROM inbox_event WHERE origin <> ''"
        )
        .await
            > last
    );
    // This release's own deliveries are still deduplicated by their id.
    let row = outbox::store::inbox::NewInboxRow {
        consumer: "billing",
        message_id: id9,
        payload: b"{}",
        ..Default::default()
    };
    let pending = outbox::store::inbox::InboxState::Pending;
    assert!(
        !outbox::store::inbox::insert(db, &row, &pending)
            .await
            .unwrap()
    );

    // Down (through `outbox_0007`) and up again keep the rows (the old key comes back while ids
    // are unique per consumer, so the second `evt_1` goes first).
    db.execute_unprepared("DELETE FROM inbox_event WHERE origin = 'psp-b'")
        .await
        .unwrap();
    Migrator::down(db, Some(9)).await.unwrap();
    assert_eq!(
        old_release_insert(db, "billing", id9, b"{}").await.unwrap(),
        0
    );
    Migrator::up(db, None).await.unwrap();
    assert_eq!(inbox_rows(db, "billing").await.len(), 6);
}

backend_tests! {
    up_down => up_down_up;
    composed => composed_into_an_app_migrator;
    upgrade => upgrade_keeps_rows_and_a_rolling_upgrade_working;
}

/// A fresh SQLite file migrated through a pool of several connections (as `outbox migrate`
/// opens it): the inbox's table rebuild in `outbox_0007` runs on one connection, so its `RENAME`
/// sees its `DROP`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_sqlite_file_migrates_through_a_pool() {
    let dir = std::env::temp_dir().join(format!("outbox-pool-migrate-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.join("pool.db").display());
    let mut options = sea_orm::ConnectOptions::new(url);
    options
        .sqlx_logging(false)
        .max_connections(4)
        .min_connections(4);
    let db = sea_orm::Database::connect(options).await.unwrap();
    outbox::migrate(&db).await.unwrap();
    for table in [
        "outbox_event",
        "inbox_event",
        "outbox_admin_action",
        "outbox_relay",
    ] {
        assert!(table_exists(&db, table).await, "{table} missing");
    }
    assert!(!table_exists(&db, "inbox_event_rebuilt").await);
    // Idempotent.
    outbox::migrate(&db).await.unwrap();
    db.close().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
