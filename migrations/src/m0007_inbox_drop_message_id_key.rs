//! The contract step of `outbox_0006`: drop the old unique `(consumer, message_id)`, so that two
//! external senders may use the same message id. The inbox's physical key is
//! `(consumer, origin, message_id)` from here on.
//!
//! For a rolling upgrade from a release before `outbox_0006`, apply migrations up to
//! `outbox_0006` first (`Migrator::up(db, Some(n))`), roll the new release out, and apply this
//! one once no process of the previous release runs: those processes name the old key in their
//! `ON CONFLICT` on PostgreSQL and SQLite. Until then the new release works too; only an external
//! message whose id another source of the same consumer used already is refused, with an error
//! that names this migration.
//!
//! SQLite cannot drop a table constraint, so there the table is rebuilt with its rows, its ids
//! and its id sequence.

use crate::{Down, Script, Transaction};

pub(crate) const MIGRATION: Script = Script {
    name: "outbox_0007_inbox_drop_message_id_key",
    postgres: POSTGRES_UP,
    mysql: MYSQL_UP,
    sqlite: SQLITE_UP,
    down: Down::Each(POSTGRES_DOWN, MYSQL_DOWN, SQLITE_DOWN),
    transaction: Transaction::One,
};

const POSTGRES_UP: &[&str] =
    &["ALTER TABLE inbox_event DROP CONSTRAINT inbox_event_consumer_message_key"];

const MYSQL_UP: &[&str] = &["ALTER TABLE inbox_event DROP INDEX inbox_event_consumer_message_key"];

// The table as `outbox_0002` and `outbox_0006` left it, without the old key: written out, since a
// released migration never changes and must not depend on code that may.
const SQLITE_UP: &[&str] = &[
    r#"CREATE TABLE inbox_event_rebuilt (
        id                INTEGER PRIMARY KEY AUTOINCREMENT,
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
        origin            TEXT NOT NULL DEFAULT '',
        biz_key           TEXT NULL,
        headers           TEXT NULL
    )"#,
    "INSERT INTO inbox_event_rebuilt (id, consumer, message_id, event_type, source, \
     aggregate_type, aggregate_id, aggregate_version, schema_version, payload, status, attempts, \
     next_attempt_at, locked_by, locked_until, claim_token, received_at, processed_at, last_error, \
     origin, biz_key, headers) \
     SELECT id, consumer, message_id, event_type, source, aggregate_type, aggregate_id, \
     aggregate_version, schema_version, payload, status, attempts, next_attempt_at, locked_by, \
     locked_until, claim_token, received_at, processed_at, last_error, origin, biz_key, headers \
     FROM inbox_event ORDER BY id",
    // Ids already handed out (rows retention deleted) are not handed out again.
    "DELETE FROM sqlite_sequence WHERE name = 'inbox_event_rebuilt'",
    "INSERT INTO sqlite_sequence (name, seq) SELECT 'inbox_event_rebuilt', \
     MAX(COALESCE((SELECT MAX(seq) FROM sqlite_sequence WHERE name = 'inbox_event'), 0), \
     COALESCE((SELECT MAX(id) FROM inbox_event), 0))",
    "DROP TABLE inbox_event",
    "ALTER TABLE inbox_event_rebuilt RENAME TO inbox_event",
    "CREATE INDEX inbox_event_unfinished_idx ON inbox_event (consumer, id) WHERE status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')",
    "CREATE INDEX inbox_event_aggregate_idx ON inbox_event (consumer, aggregate_type, aggregate_id, id) WHERE status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')",
    "CREATE INDEX inbox_event_processed_at_idx ON inbox_event (processed_at) WHERE status IN ('DONE', 'IGNORED')",
    "CREATE UNIQUE INDEX inbox_event_message_key ON inbox_event (consumer, origin, message_id)",
    "CREATE UNIQUE INDEX inbox_event_business_key ON inbox_event (consumer, event_type, biz_key) WHERE biz_key IS NOT NULL",
];

// Undone only while every message id is unique per consumer.
const POSTGRES_DOWN: &[&str] = &["ALTER TABLE inbox_event ADD CONSTRAINT \
     inbox_event_consumer_message_key UNIQUE (consumer, message_id)"];

const MYSQL_DOWN: &[&str] = &["ALTER TABLE inbox_event ADD UNIQUE KEY \
     inbox_event_consumer_message_key (consumer, message_id)"];

const SQLITE_DOWN: &[&str] = &["CREATE UNIQUE INDEX inbox_event_consumer_message_key \
     ON inbox_event (consumer, message_id)"];
