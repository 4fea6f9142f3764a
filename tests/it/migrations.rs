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
    assert_eq!(applied, 5);

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
        _ => assert!(
            indexes.iter().any(|i| i == "outbox_event_unsent_idx"),
            "{indexes:?}"
        ),
    }

    Migrator::down(&t.db, None).await.unwrap();
    assert!(!table_exists(&t.db, "outbox_event").await);
    assert!(!table_exists(&t.db, "inbox_event").await);
    assert!(!table_exists(&t.db, "inbox_aggregate_version").await);
    assert!(!table_exists(&t.db, "outbox_admin_action").await);
    assert!(!table_exists(&t.db, "outbox_lease").await);
    assert!(!table_exists(&t.db, "outbox_relay").await);
    assert_eq!(
        scalar_i64(&t.db, "SELECT COUNT(*) AS n FROM outbox_migrations").await,
        0
    );

    Migrator::up(&t.db, None).await.unwrap();
    assert!(table_exists(&t.db, "outbox_event").await);
    assert!(table_exists(&t.db, "inbox_event").await);
    assert!(table_exists(&t.db, "inbox_aggregate_version").await);
    assert!(table_exists(&t.db, "outbox_relay").await);
    Migrator::up(&t.db, None).await.unwrap();
    assert_eq!(
        scalar_i64(&t.db, "SELECT COUNT(*) AS n FROM outbox_migrations").await,
        5
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
            "outbox_0005_create_relay"
        ]
    );
    AppMigrator::down(&t.db, None).await.unwrap();
    assert!(!table_exists(&t.db, "outbox_event").await);
    assert!(!table_exists(&t.db, "invoice").await);
}

backend_tests! {
    up_down => up_down_up;
    composed => composed_into_an_app_migrator;
}
