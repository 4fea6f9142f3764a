//! What the claim's floor needs (PostgreSQL keeps one; see the runtime's `store/floor.rs`):
//!
//! - `outbox_rescan`, one row whose `generation` an operator's replay or resend bumps in its own
//!   transaction: a finished row made unfinished again lies below the floors that claimers
//!   keep, and they start over when they see the generation change;
//! - on PostgreSQL, `outbox_event_aggregate_dead_idx` and `inbox_event_aggregate_dead_idx`: the
//!   DEAD events (messages of a consumer) per aggregate, which stay below the floor, for the
//!   claims' "no earlier row of this aggregate is unfinished" check. They hold only dead
//!   letters, so they stay small.
//!
//! Nothing changes for code that does not know these: a rolling upgrade applies this migration
//! first and the previous release keeps running beside the new one.

use crate::{Down, Script, Transaction};

pub(crate) const MIGRATION: Script = Script {
    name: "outbox_0011_claim_floor",
    postgres: POSTGRES_UP,
    mysql: MYSQL_UP,
    sqlite: SQLITE_UP,
    down: Down::Each(POSTGRES_DOWN, DOWN, DOWN),
    transaction: Transaction::Backend,
};

const POSTGRES_UP: &[&str] = &[
    r#"CREATE TABLE outbox_rescan (
        id         SMALLINT PRIMARY KEY,
        generation BIGINT NOT NULL DEFAULT 0,
        CONSTRAINT outbox_rescan_one_row CHECK (id = 1)
    )"#,
    "INSERT INTO outbox_rescan (id, generation) VALUES (1, 0)",
    "CREATE INDEX outbox_event_aggregate_dead_idx ON outbox_event (aggregate_type, aggregate_id, id) WHERE status = 'DEAD'",
    "CREATE INDEX inbox_event_aggregate_dead_idx ON inbox_event (consumer, aggregate_type, aggregate_id, id) WHERE status = 'DEAD'",
];

const MYSQL_UP: &[&str] = &[
    r#"CREATE TABLE outbox_rescan (
        id         SMALLINT NOT NULL,
        generation BIGINT NOT NULL DEFAULT 0,
        PRIMARY KEY (id)
    ) ENGINE=InnoDB"#,
    "INSERT INTO outbox_rescan (id, generation) VALUES (1, 0)",
];

const SQLITE_UP: &[&str] = &[
    r#"CREATE TABLE outbox_rescan (
        id         INTEGER PRIMARY KEY CHECK (id = 1),
        generation INTEGER NOT NULL DEFAULT 0
    )"#,
    "INSERT INTO outbox_rescan (id, generation) VALUES (1, 0)",
];

const POSTGRES_DOWN: &[&str] = &[
    "DROP INDEX inbox_event_aggregate_dead_idx",
    "DROP INDEX outbox_event_aggregate_dead_idx",
    "DROP TABLE outbox_rescan",
];

const DOWN: &[&str] = &["DROP TABLE outbox_rescan"];
