//! `outbox_event.failure_class`: what kind of failure the last failed attempt was (`TIMEOUT`,
//! `CONNECTION`, `REJECTED`, `PERMANENT`, `LEASE_EXPIRED`, `UNREADABLE`), written beside
//! `last_error`. The relay decides by the class, never by the wording of the message: after a
//! broker outage it makes the retries that the outage (a timeout, a lost connection) pushed back
//! due at once.
//!
//! The column is added without touching existing rows: a row failed by the previous release has
//! no class (`NULL`), and the relay recognises its outage failures by `last_error` as that
//! release wrote it, so a rolling upgrade needs no backfill.

use crate::{Down, Script, Transaction};

pub(crate) const MIGRATION: Script = Script {
    name: "outbox_0010_failure_class",
    postgres: POSTGRES_UP,
    mysql: MYSQL_UP,
    sqlite: SQLITE_UP,
    down: Down::All(DOWN),
    transaction: Transaction::Backend,
};

const POSTGRES_UP: &[&str] =
    &["ALTER TABLE outbox_event ADD COLUMN failure_class VARCHAR(16) NULL"];

const MYSQL_UP: &[&str] = &["ALTER TABLE outbox_event ADD COLUMN failure_class VARCHAR(16) NULL"];

const SQLITE_UP: &[&str] = &["ALTER TABLE outbox_event ADD COLUMN failure_class TEXT NULL"];

const DOWN: &[&str] = &["ALTER TABLE outbox_event DROP COLUMN failure_class"];
