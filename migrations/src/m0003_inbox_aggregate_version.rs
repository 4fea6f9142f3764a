//! `inbox_aggregate_version`: the newest aggregate version each consumer accepted, for handlers
//! that drop stale events (`InboxTransaction::accept_version`).

use sea_orm_migration::prelude::*;

use crate::{run_script, script_for};

pub(crate) struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "outbox_0003_create_inbox_aggregate_version"
    }
}

const POSTGRES_UP: &[&str] = &[r#"CREATE TABLE inbox_aggregate_version (
        consumer       VARCHAR(128) NOT NULL,
        aggregate_type VARCHAR(128) NOT NULL,
        aggregate_id   VARCHAR(255) NOT NULL,
        version        BIGINT NOT NULL,
        updated_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
        PRIMARY KEY (consumer, aggregate_type, aggregate_id)
    )"#];

const MYSQL_UP: &[&str] = &[r#"CREATE TABLE inbox_aggregate_version (
        consumer       VARCHAR(128) NOT NULL,
        aggregate_type VARCHAR(128) NOT NULL,
        aggregate_id   VARCHAR(255) NOT NULL,
        version        BIGINT NOT NULL,
        updated_at     DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
        PRIMARY KEY (consumer, aggregate_type, aggregate_id)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"#];

const SQLITE_UP: &[&str] = &[r#"CREATE TABLE inbox_aggregate_version (
        consumer       TEXT NOT NULL,
        aggregate_type TEXT NOT NULL,
        aggregate_id   TEXT NOT NULL,
        version        INTEGER NOT NULL,
        updated_at     TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP,
        PRIMARY KEY (consumer, aggregate_type, aggregate_id)
    )"#];

const DOWN: &[&str] = &["DROP TABLE inbox_aggregate_version"];

// `MigrationTrait` declares `&SchemaManager` with an elided lifetime; the impl must match it.
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let backend = manager.get_database_backend();
        run_script(
            manager,
            script_for(backend, POSTGRES_UP, MYSQL_UP, SQLITE_UP),
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        run_script(manager, DOWN).await
    }
}
