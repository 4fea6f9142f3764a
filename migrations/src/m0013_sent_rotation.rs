//! Sent events leave `outbox_event`: marking an event SENT moves it, in the same statement or
//! transaction, into `outbox_sent`, and the dedup keys that must outlive the row are kept in
//! `outbox_key`. Both tables rotate through a fixed set of slots (`outbox_rotation` says how
//! long a slot lasts and how many there are): rows go to the slot of the time they are written,
//! by the database's clock, and retention empties a slot whole once every row in it is older
//! than the window, with `TRUNCATE` (PostgreSQL: `LIST` partitions; MySQL/MariaDB: `LIST`
//! partitions and `TRUNCATE PARTITION`; SQLite: one table, `DELETE` by slot). No partition is
//! ever created or dropped at run time, so none can be missing when a row arrives.
//!
//! `outbox_event` keeps the unfinished rows (PENDING, PROCESSING, RETRY, DEAD): the claim, the
//! fast path and every per-aggregate check read a table whose size is the backlog, not the
//! retention window.
//!
//! Nothing is copied: SENT rows written by an earlier release stay in `outbox_event` and leave it
//! by the retention they had. A rolling upgrade keeps working: the previous release marks SENT
//! in place and finds its dedup keys in `outbox_event`; this release finds them in both tables.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

/// Seconds a slot of `outbox_sent` lasts by default: a day.
const SENT_SLOT_SECONDS: i64 = 86_400;
/// Slots of `outbox_sent` by default: enough for a 30-day window (window / slot + 3, rounded
/// up, with room to spare).
const SENT_SLOTS: i32 = 35;
/// Seconds a slot of `outbox_key` lasts by default: a week. A key is written to the slot of its
/// time and the next one, so it is found for at least a slot's time after it was written; each
/// row says which period (`bucket`) it was written for, so a row a late retention left behind
/// is never taken for a live key.
const KEY_SLOT_SECONDS: i64 = 7 * 86_400;
/// Slots of `outbox_key`: the current one, the next (written), the one before (emptied next)
/// and one to spare.
const KEY_SLOTS: i32 = 4;

pub(crate) struct Migration;

impl MigrationName for Migration {
    fn name(&self) -> &str {
        "outbox_0013_sent_rotation"
    }
}

/// The columns `outbox_sent` keeps of an event: what it was, and who sent it under which claim
/// (`locked_by`, `claim_token`); its due time, lease and error are done with.
const SENT_COLUMNS_POSTGRES: &str = r#"
        slot              SMALLINT NOT NULL,
        id                BIGINT NOT NULL,
        event_id          UUID NOT NULL,
        source            VARCHAR(255) NOT NULL,
        event_type        VARCHAR(255) NOT NULL,
        schema_version    INTEGER NOT NULL,
        aggregate_type    VARCHAR(128) NOT NULL,
        aggregate_id      VARCHAR(255) NOT NULL,
        aggregate_version BIGINT NULL,
        dedup_key         VARCHAR(255) NULL,
        payload           JSONB NOT NULL,
        headers           JSONB NOT NULL,
        attempts          INTEGER NOT NULL,
        locked_by         VARCHAR(255) NULL,
        claim_token       UUID NULL,
        created_at        TIMESTAMPTZ NOT NULL,
        sent_at           TIMESTAMPTZ NOT NULL"#;

const SENT_COLUMNS_MYSQL: &str = r#"
        slot              SMALLINT NOT NULL,
        id                BIGINT NOT NULL,
        event_id          CHAR(36) CHARACTER SET ascii NOT NULL,
        source            VARCHAR(255) NOT NULL,
        event_type        VARCHAR(255) NOT NULL,
        schema_version    INT NOT NULL,
        aggregate_type    VARCHAR(128) NOT NULL,
        aggregate_id      VARCHAR(255) NOT NULL,
        aggregate_version BIGINT NULL,
        dedup_key         VARCHAR(255) NULL,
        payload           JSON NOT NULL,
        headers           JSON NOT NULL,
        attempts          INT NOT NULL,
        locked_by         VARCHAR(255) NULL,
        claim_token       CHAR(36) CHARACTER SET ascii NULL,
        created_at        DATETIME(6) NOT NULL,
        sent_at           DATETIME(6) NOT NULL"#;

const SENT_COLUMNS_SQLITE: &str = r#"
        slot              INTEGER NOT NULL,
        id                INTEGER NOT NULL,
        event_id          TEXT NOT NULL,
        source            TEXT NOT NULL,
        event_type        TEXT NOT NULL,
        schema_version    INTEGER NOT NULL,
        aggregate_type    TEXT NOT NULL,
        aggregate_id      TEXT NOT NULL,
        aggregate_version INTEGER NULL,
        dedup_key         TEXT NULL,
        payload           TEXT NOT NULL,
        headers           TEXT NOT NULL,
        attempts          INTEGER NOT NULL,
        locked_by         TEXT NULL,
        claim_token       TEXT NULL,
        created_at        TEXT NOT NULL,
        sent_at           TEXT NOT NULL"#;

fn rotation_table(backend: DbBackend) -> Vec<String> {
    let create = match backend {
        DbBackend::MySql => {
            "CREATE TABLE outbox_rotation (
        table_name   VARCHAR(64) NOT NULL,
        slot_seconds BIGINT NOT NULL,
        slots        INT NOT NULL,
        PRIMARY KEY (table_name)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        }
        _ => {
            "CREATE TABLE outbox_rotation (
        table_name   VARCHAR(64) NOT NULL PRIMARY KEY,
        slot_seconds BIGINT NOT NULL CHECK (slot_seconds > 0),
        slots        INTEGER NOT NULL CHECK (slots >= 4)
    )"
        }
    };
    vec![
        create.to_owned(),
        format!(
            "INSERT INTO outbox_rotation (table_name, slot_seconds, slots) VALUES \
             ('outbox_sent', {SENT_SLOT_SECONDS}, {SENT_SLOTS}), \
             ('outbox_key', {KEY_SLOT_SECONDS}, {KEY_SLOTS})"
        ),
    ]
}

/// `PARTITION s0 VALUES IN (0), …` for MySQL.
fn mysql_partitions(slots: i32) -> String {
    (0..slots)
        .map(|s| format!("PARTITION s{s} VALUES IN ({s})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `CREATE TABLE {table}_s{n} PARTITION OF {table} FOR VALUES IN (n)` for each slot.
fn postgres_partitions(table: &str, slots: i32) -> impl Iterator<Item = String> + '_ {
    (0..slots)
        .map(move |s| format!("CREATE TABLE {table}_s{s} PARTITION OF {table} FOR VALUES IN ({s})"))
}

fn up_statements(backend: DbBackend) -> Vec<String> {
    let mut statements = rotation_table(backend);
    match backend {
        DbBackend::Postgres => {
            statements.push(format!(
                "CREATE TABLE outbox_sent ({SENT_COLUMNS_POSTGRES}\n    ) PARTITION BY LIST (slot)"
            ));
            statements.push("CREATE INDEX outbox_sent_id_idx ON outbox_sent (id)".to_owned());
            statements
                .push("CREATE INDEX outbox_sent_event_id_idx ON outbox_sent (event_id)".to_owned());
            statements.extend(postgres_partitions("outbox_sent", SENT_SLOTS));
            statements.push(
                "CREATE TABLE outbox_key (
        slot       SMALLINT NOT NULL,
        bucket     BIGINT NOT NULL,
        event_type VARCHAR(255) NOT NULL,
        dedup_key  VARCHAR(255) NOT NULL,
        event_id   UUID NOT NULL,
        PRIMARY KEY (slot, event_type, dedup_key)
    ) PARTITION BY LIST (slot)"
                    .to_owned(),
            );
            statements.extend(postgres_partitions("outbox_key", KEY_SLOTS));
        }
        DbBackend::MySql => {
            statements.push(format!(
                "CREATE TABLE outbox_sent ({SENT_COLUMNS_MYSQL},
        KEY outbox_sent_id_idx (id),
        KEY outbox_sent_event_id_idx (event_id)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin PARTITION BY LIST (slot) ({})",
                mysql_partitions(SENT_SLOTS)
            ));
            statements.push(format!(
                "CREATE TABLE outbox_key (
        slot       SMALLINT NOT NULL,
        bucket     BIGINT NOT NULL,
        event_type VARCHAR(255) NOT NULL,
        dedup_key  VARCHAR(255) NOT NULL,
        event_id   CHAR(36) CHARACTER SET ascii NOT NULL,
        PRIMARY KEY (slot, event_type, dedup_key)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin PARTITION BY LIST (slot) ({})",
                mysql_partitions(KEY_SLOTS)
            ));
        }
        _ => {
            statements.push(format!(
                "CREATE TABLE outbox_sent ({SENT_COLUMNS_SQLITE}\n    )"
            ));
            statements.push("CREATE INDEX outbox_sent_id_idx ON outbox_sent (id)".to_owned());
            statements
                .push("CREATE INDEX outbox_sent_event_id_idx ON outbox_sent (event_id)".to_owned());
            statements.push(
                "CREATE INDEX outbox_sent_slot_idx ON outbox_sent (slot, sent_at)".to_owned(),
            );
            statements.push(
                "CREATE TABLE outbox_key (
        slot       INTEGER NOT NULL,
        bucket     INTEGER NOT NULL,
        event_type TEXT NOT NULL,
        dedup_key  TEXT NOT NULL,
        event_id   TEXT NOT NULL,
        PRIMARY KEY (slot, event_type, dedup_key)
    )"
                .to_owned(),
            );
        }
    }
    statements
}

#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let conn = manager.get_connection();
        for statement in up_statements(manager.get_database_backend()) {
            conn.execute_unprepared(&statement).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let conn = manager.get_connection();
        for statement in [
            "DROP TABLE outbox_key",
            "DROP TABLE outbox_sent",
            "DROP TABLE outbox_rotation",
        ] {
            conn.execute_unprepared(statement).await?;
        }
        Ok(())
    }
}
