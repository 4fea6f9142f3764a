//! `outbox_relay`: what each running relay last saw of its broker, for `outbox status` and the
//! admin API. One row per relay (its `relay_id`), written when the relay starts, when its
//! circuit breaker opens or closes, and on a heartbeat; a row whose `expires_at` passed belongs
//! to a relay that stopped without saying so.

use crate::{Down, Script, Transaction};

pub(crate) const MIGRATION: Script = Script {
    name: "outbox_0005_create_relay",
    postgres: POSTGRES_UP,
    mysql: MYSQL_UP,
    sqlite: SQLITE_UP,
    down: Down::All(DOWN),
    transaction: Transaction::Backend,
};

const POSTGRES_UP: &[&str] = &[r#"CREATE TABLE outbox_relay (
        relay_id          VARCHAR(255) PRIMARY KEY,
        transport         VARCHAR(64) NOT NULL,
        broker_state      VARCHAR(16) NOT NULL,
        broker_seen_at    TIMESTAMPTZ NULL,
        unavailable_since TIMESTAMPTZ NULL,
        outages           BIGINT NOT NULL DEFAULT 0,
        held_back         BIGINT NOT NULL DEFAULT 0,
        last_error        TEXT NULL,
        started_at        TIMESTAMPTZ NOT NULL,
        heartbeat_at      TIMESTAMPTZ NOT NULL,
        expires_at        TIMESTAMPTZ NOT NULL
    )"#];

const MYSQL_UP: &[&str] = &[r#"CREATE TABLE outbox_relay (
        relay_id          VARCHAR(255) NOT NULL,
        transport         VARCHAR(64) NOT NULL,
        broker_state      VARCHAR(16) NOT NULL,
        broker_seen_at    DATETIME(6) NULL,
        unavailable_since DATETIME(6) NULL,
        outages           BIGINT NOT NULL DEFAULT 0,
        held_back         BIGINT NOT NULL DEFAULT 0,
        last_error        TEXT NULL,
        started_at        DATETIME(6) NOT NULL,
        heartbeat_at      DATETIME(6) NOT NULL,
        expires_at        DATETIME(6) NOT NULL,
        PRIMARY KEY (relay_id)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"#];

const SQLITE_UP: &[&str] = &[r#"CREATE TABLE outbox_relay (
        relay_id          TEXT PRIMARY KEY,
        transport         TEXT NOT NULL,
        broker_state      TEXT NOT NULL,
        broker_seen_at    TEXT NULL,
        unavailable_since TEXT NULL,
        outages           INTEGER NOT NULL DEFAULT 0,
        held_back         INTEGER NOT NULL DEFAULT 0,
        last_error        TEXT NULL,
        started_at        TEXT NOT NULL,
        heartbeat_at      TEXT NOT NULL,
        expires_at        TEXT NOT NULL
    )"#];

const DOWN: &[&str] = &["DROP TABLE outbox_relay"];
