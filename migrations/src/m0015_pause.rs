//! `outbox_pause`: what an operator paused, a consumer (it takes no messages: nothing is
//! nacked into retries, they wait in the broker or as PENDING rows) or a destination (its
//! events wait PENDING, no attempt spent). Every instance reads the table every few seconds and
//! honours it; a row's removal resumes. Pausing and resuming are audited in
//! `outbox_admin_action`.

use crate::{Down, Script, Transaction};

pub(crate) const MIGRATION: Script = Script {
    name: "outbox_0015_pause",
    postgres: POSTGRES_UP,
    mysql: MYSQL_UP,
    sqlite: SQLITE_UP,
    down: Down::All(DOWN),
    transaction: Transaction::Backend,
};

const POSTGRES_UP: &[&str] = &[r#"CREATE TABLE outbox_pause (
        kind          VARCHAR(16) NOT NULL,
        name          VARCHAR(255) NOT NULL,
        paused_at     TIMESTAMPTZ NOT NULL,
        paused_by     VARCHAR(255) NULL,
        reason        TEXT NULL,
        PRIMARY KEY (kind, name)
    )"#];

const MYSQL_UP: &[&str] = &[r#"CREATE TABLE outbox_pause (
        kind          VARCHAR(16) NOT NULL,
        name          VARCHAR(255) NOT NULL,
        paused_at     DATETIME(6) NOT NULL,
        paused_by     VARCHAR(255) NULL,
        reason        TEXT NULL,
        PRIMARY KEY (kind, name)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"#];

const SQLITE_UP: &[&str] = &[r#"CREATE TABLE outbox_pause (
        kind          TEXT NOT NULL,
        name          TEXT NOT NULL,
        paused_at     TEXT NOT NULL,
        paused_by     TEXT NULL,
        reason        TEXT NULL,
        PRIMARY KEY (kind, name)
    )"#];

const DOWN: &[&str] = &["DROP TABLE outbox_pause"];
