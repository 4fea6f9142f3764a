//! `inbox_event`: one row per (consumer, message id), the record that makes handling idempotent.

use sea_orm_migration::prelude::*;

use crate::{run_script, script_for};

pub(crate) struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "outbox_0002_create_inbox_event"
    }
}

const POSTGRES_UP: &[&str] = &[
    r#"CREATE TABLE inbox_event (
        consumer          VARCHAR(128) NOT NULL,
        message_id        VARCHAR(255) NOT NULL,
        event_type        VARCHAR(255) NULL,
        source            VARCHAR(255) NULL,
        aggregate_type    VARCHAR(128) NULL,
        aggregate_id      VARCHAR(255) NULL,
        aggregate_version BIGINT NULL,
        schema_version    INTEGER NULL,
        payload           BYTEA NOT NULL,
        status            VARCHAR(16) NOT NULL,
        attempts          INTEGER NOT NULL DEFAULT 0,
        next_attempt_at   TIMESTAMPTZ NULL,
        locked_by         VARCHAR(255) NULL,
        locked_until      TIMESTAMPTZ NULL,
        claim_token       UUID NULL,
        received_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
        processed_at      TIMESTAMPTZ NULL,
        last_error        TEXT NULL,
        PRIMARY KEY (consumer, message_id),
        CONSTRAINT inbox_event_status_check
            CHECK (status IN ('PENDING', 'PROCESSING', 'DONE', 'RETRY', 'DEAD', 'IGNORED'))
    )"#,
    // The retry loop claims due rows; the index holds only rows that still need work.
    "CREATE INDEX inbox_event_due_idx ON inbox_event (next_attempt_at) WHERE status IN ('PENDING', 'PROCESSING', 'RETRY')",
    // Per-aggregate order for consumers: \"is an earlier message of this aggregate unfinished?\"
    "CREATE INDEX inbox_event_aggregate_idx ON inbox_event (consumer, aggregate_type, aggregate_id) WHERE status IN ('PENDING', 'PROCESSING', 'RETRY')",
    // Retention deletes DONE rows older than the dedup window.
    "CREATE INDEX inbox_event_processed_at_idx ON inbox_event (processed_at) WHERE status IN ('DONE', 'IGNORED')",
];

const MYSQL_UP: &[&str] = &[r#"CREATE TABLE inbox_event (
        consumer          VARCHAR(128) NOT NULL,
        message_id        VARCHAR(255) NOT NULL,
        event_type        VARCHAR(255) NULL,
        source            VARCHAR(255) NULL,
        aggregate_type    VARCHAR(128) NULL,
        aggregate_id      VARCHAR(255) NULL,
        aggregate_version BIGINT NULL,
        schema_version    INT NULL,
        payload           LONGBLOB NOT NULL,
        status            VARCHAR(16) NOT NULL,
        attempts          INT NOT NULL DEFAULT 0,
        next_attempt_at   DATETIME(6) NULL,
        locked_by         VARCHAR(255) NULL,
        locked_until      DATETIME(6) NULL,
        claim_token       CHAR(36) CHARACTER SET ascii NULL,
        received_at       DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
        processed_at      DATETIME(6) NULL,
        last_error        TEXT NULL,
        PRIMARY KEY (consumer, message_id),
        KEY inbox_event_due_idx (status, next_attempt_at),
        KEY inbox_event_aggregate_idx (consumer, aggregate_type, aggregate_id, status),
        KEY inbox_event_processed_at_idx (status, processed_at)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"#];

const SQLITE_UP: &[&str] = &[
    r#"CREATE TABLE inbox_event (
        consumer          TEXT NOT NULL,
        message_id        TEXT NOT NULL,
        event_type        TEXT NULL,
        source            TEXT NULL,
        aggregate_type    TEXT NULL,
        aggregate_id      TEXT NULL,
        aggregate_version INTEGER NULL,
        schema_version    INTEGER NULL,
        payload           BLOB NOT NULL,
        status            TEXT NOT NULL
            CHECK (status IN ('PENDING', 'PROCESSING', 'DONE', 'RETRY', 'DEAD', 'IGNORED')),
        attempts          INTEGER NOT NULL DEFAULT 0,
        next_attempt_at   TEXT NULL,
        locked_by         TEXT NULL,
        locked_until      TEXT NULL,
        claim_token       TEXT NULL,
        received_at       TEXT NOT NULL,
        processed_at      TEXT NULL,
        last_error        TEXT NULL,
        PRIMARY KEY (consumer, message_id)
    )"#,
    "CREATE INDEX inbox_event_due_idx ON inbox_event (next_attempt_at) WHERE status IN ('PENDING', 'PROCESSING', 'RETRY')",
    "CREATE INDEX inbox_event_aggregate_idx ON inbox_event (consumer, aggregate_type, aggregate_id) WHERE status IN ('PENDING', 'PROCESSING', 'RETRY')",
    "CREATE INDEX inbox_event_processed_at_idx ON inbox_event (processed_at) WHERE status IN ('DONE', 'IGNORED')",
];

const DOWN: &[&str] = &["DROP TABLE inbox_event"];

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
