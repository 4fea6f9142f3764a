//! Handled messages leave `inbox_event` on PostgreSQL: a message handled in its delivery's
//! transaction is written straight into `inbox_done`, and one a worker handles later moves
//! there when it is marked DONE. The keys a redelivery is recognised by are kept in `inbox_key`
//! for the rotation's period (two weeks by default), so the dedup window no longer depends on
//! keeping every handled message's row. Both tables rotate through fixed slots
//! (`outbox_rotation`, as `outbox_sent` and `outbox_key` do) that retention empties whole with
//! `TRUNCATE`: under a held xmin horizon, the inbox leaves no dead row versions behind.
//!
//! `inbox_event` keeps what is unfinished (PENDING, PROCESSING, RETRY, DEAD) and IGNORED rows.
//!
//! MySQL/MariaDB and SQLite keep handled messages in `inbox_event` (deleted row by row after
//! the dedup window): there, this migration changes nothing.
//!
//! A rolling upgrade: the previous release recognises redeliveries by `inbox_event` alone, so
//! a message this release handled and wrote to `inbox_done` would be handled again by a
//! previous-release consumer. The rotation is therefore switched on by its rows in
//! `outbox_rotation`: this migration adds them only while `inbox_event` is empty (a new
//! installation); elsewhere an operator adds them once no consumer of the previous release runs
//! (the guide, book/src/upgrades.md, "Handled messages in their own table"). Until then this
//! release records messages as the previous one did.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{DbBackend, Statement};

/// Seconds a slot of `inbox_done` lasts by default: a day.
const DONE_SLOT_SECONDS: i64 = 86_400;
/// Slots of `inbox_done`: enough for a 30-day window.
const DONE_SLOTS: i32 = 35;
/// Seconds a slot of `inbox_key` lasts by default: two weeks, the default dedup window. A key is
/// written for the period it arrives in and the next one, so it is recognised for at least a
/// period and at most two.
const KEY_SLOT_SECONDS: i64 = 14 * 86_400;
/// Slots of `inbox_key`: the current one, the next, the one before and one to spare.
const KEY_SLOTS: i32 = 4;

pub(crate) struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "outbox_0014_inbox_rotation"
    }
}

/// The rows that switch the rotation on, for an empty `inbox_event`.
pub(crate) fn rotation_rows() -> String {
    format!(
        "INSERT INTO outbox_rotation (table_name, slot_seconds, slots) \
         SELECT t.table_name, t.slot_seconds, t.slots FROM (VALUES \
         ('inbox_done', {DONE_SLOT_SECONDS}::BIGINT, {DONE_SLOTS}), \
         ('inbox_key', {KEY_SLOT_SECONDS}::BIGINT, {KEY_SLOTS})) AS t (table_name, slot_seconds, slots) \
         WHERE NOT EXISTS (SELECT 1 FROM inbox_event)"
    )
}

/// `CREATE TABLE {table}_s{n} PARTITION OF {table} FOR VALUES IN (n)` for each slot.
fn partitions(table: &str, slots: i32) -> impl Iterator<Item = String> + '_ {
    (0..slots)
        .map(move |s| format!("CREATE TABLE {table}_s{s} PARTITION OF {table} FOR VALUES IN ({s})"))
}

/// The statements, given the name of `inbox_event`'s id sequence (shared, so that an id names
/// one message in either table).
fn up_statements(sequence: &str) -> Vec<String> {
    let mut statements = vec![format!(
        "CREATE TABLE inbox_done (
        slot              SMALLINT NOT NULL,
        id                BIGINT NOT NULL DEFAULT nextval('{sequence}'),
        consumer          VARCHAR(128) NOT NULL,
        message_id        VARCHAR(255) NOT NULL,
        origin            VARCHAR(255) NOT NULL,
        biz_key           VARCHAR(255) NULL,
        headers           TEXT NULL,
        event_type        VARCHAR(255) NULL,
        source            VARCHAR(255) NULL,
        aggregate_type    VARCHAR(128) NULL,
        aggregate_id      VARCHAR(255) NULL,
        aggregate_version BIGINT NULL,
        schema_version    INTEGER NULL,
        payload           BYTEA NOT NULL,
        status            VARCHAR(16) NOT NULL,
        attempts          INTEGER NOT NULL,
        locked_by         VARCHAR(255) NULL,
        claim_token       UUID NULL,
        received_at       TIMESTAMPTZ NOT NULL,
        processed_at      TIMESTAMPTZ NOT NULL
    ) PARTITION BY LIST (slot)"
    )];
    statements.push("CREATE INDEX inbox_done_id_idx ON inbox_done (id)".to_owned());
    statements.push(
        "CREATE INDEX inbox_done_message_idx ON inbox_done (consumer, origin, message_id)"
            .to_owned(),
    );
    statements.push(
        "CREATE INDEX inbox_done_business_idx ON inbox_done (consumer, event_type, biz_key) \
         WHERE biz_key IS NOT NULL"
            .to_owned(),
    );
    statements.extend(partitions("inbox_done", DONE_SLOTS));
    statements.push(
        "CREATE TABLE inbox_key (
        slot     SMALLINT NOT NULL,
        bucket   BIGINT NOT NULL,
        consumer VARCHAR(128) NOT NULL,
        scope    VARCHAR(260) NOT NULL,
        name     VARCHAR(255) NOT NULL,
        PRIMARY KEY (slot, consumer, scope, name)
    ) PARTITION BY LIST (slot)"
            .to_owned(),
    );
    statements.extend(partitions("inbox_key", KEY_SLOTS));
    statements.push(rotation_rows());
    statements
}

#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        let conn = manager.get_connection();
        let sequence = conn
            .query_one_raw(Statement::from_string(
                DbBackend::Postgres,
                "SELECT pg_get_serial_sequence('inbox_event', 'id') AS name",
            ))
            .await?
            .and_then(|row| row.try_get::<Option<String>>("", "name").ok().flatten())
            .ok_or_else(|| DbErr::Migration("inbox_event.id has no sequence".to_owned()))?;
        for statement in up_statements(&sequence) {
            conn.execute_unprepared(&statement).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        let conn = manager.get_connection();
        for statement in [
            "DELETE FROM outbox_rotation WHERE table_name IN ('inbox_done', 'inbox_key')",
            "DROP TABLE inbox_key",
            "DROP TABLE inbox_done",
        ] {
            conn.execute_unprepared(statement).await?;
        }
        Ok(())
    }
}
