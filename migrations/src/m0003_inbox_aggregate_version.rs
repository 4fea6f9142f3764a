//! `inbox_aggregate_version`: the newest aggregate version each consumer accepted, for handlers
//! that drop stale events (`InboxTransaction::accept_version`).

use crate::{Down, Script, Transaction};

pub(crate) const MIGRATION: Script = Script {
    name: "outbox_0003_create_inbox_aggregate_version",
    postgres: POSTGRES_UP,
    mysql: MYSQL_UP,
    sqlite: SQLITE_UP,
    down: Down::All(DOWN),
    transaction: Transaction::Backend,
};

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
