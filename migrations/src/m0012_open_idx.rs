//! The id-ordered indexes of the work queues hold only the rows a claim can take or has in
//! flight (PENDING, PROCESSING, RETRY), no longer DEAD ones: `outbox_event_open_idx` replaces
//! `outbox_event_unsent_idx`, `inbox_event_open_idx` replaces `inbox_event_unfinished_idx`
//! (PostgreSQL and SQLite; MySQL has no partial indexes and keeps its status ranges).
//!
//! Why: the per-aggregate checks ("an earlier event of this aggregate is not SENT", "a DEAD
//! event of this aggregate") must be read from the aggregate indexes. While a long transaction
//! holds the xmin horizon, vacuum removes nothing, the old id index's row estimate stays at what
//! it last counted, and PostgreSQL's planner took that index for nearly empty: it read the
//! checks from it, walking every retained entry, and a producer's commit went from a
//! millisecond to a second. A check that must see DEAD rows cannot be served by an index that
//! leaves them out, so it has one plan only. The claim's scans by id never needed DEAD rows: a
//! DEAD row is not claimable, and it stays visible to the ordering checks through the aggregate
//! indexes.
//!
//! Online on PostgreSQL: each index is built with `CREATE INDEX CONCURRENTLY` (writes go on
//! while it builds; it waits for transactions older than itself to end), outside a transaction,
//! and the old one is dropped only once the new one is valid. A run cut short is run again
//! whole: it first drops what a failed build may have left. During a rolling upgrade the
//! previous release's scans by id, which no index serves any more, read the primary key from
//! their floor (the first unfinished row), so they stay cheap; only its once-a-minute scan from
//! the first row reads the retained finished rows.

use crate::{Down, Script, Transaction};

pub(crate) const MIGRATION: Script = Script {
    name: "outbox_0012_open_idx",
    postgres: POSTGRES_UP,
    mysql: &[],
    sqlite: SQLITE_UP,
    down: Down::Each(POSTGRES_DOWN, &[], SQLITE_DOWN),
    transaction: Transaction::None,
};

const POSTGRES_UP: &[&str] = &[
    "DROP INDEX CONCURRENTLY IF EXISTS outbox_event_open_idx",
    "CREATE INDEX CONCURRENTLY outbox_event_open_idx ON outbox_event (id) WHERE status IN ('PENDING', 'PROCESSING', 'RETRY')",
    "DROP INDEX CONCURRENTLY IF EXISTS outbox_event_unsent_idx",
    "DROP INDEX CONCURRENTLY IF EXISTS inbox_event_open_idx",
    "CREATE INDEX CONCURRENTLY inbox_event_open_idx ON inbox_event (consumer, id) WHERE status IN ('PENDING', 'PROCESSING', 'RETRY')",
    "DROP INDEX CONCURRENTLY IF EXISTS inbox_event_unfinished_idx",
];

const SQLITE_UP: &[&str] = &[
    "CREATE INDEX IF NOT EXISTS outbox_event_open_idx ON outbox_event (id) WHERE status IN ('PENDING', 'PROCESSING', 'RETRY')",
    "DROP INDEX IF EXISTS outbox_event_unsent_idx",
    "CREATE INDEX IF NOT EXISTS inbox_event_open_idx ON inbox_event (consumer, id) WHERE status IN ('PENDING', 'PROCESSING', 'RETRY')",
    "DROP INDEX IF EXISTS inbox_event_unfinished_idx",
];

const POSTGRES_DOWN: &[&str] = &[
    "DROP INDEX CONCURRENTLY IF EXISTS inbox_event_unfinished_idx",
    "CREATE INDEX CONCURRENTLY inbox_event_unfinished_idx ON inbox_event (consumer, id) WHERE status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')",
    "DROP INDEX CONCURRENTLY IF EXISTS inbox_event_open_idx",
    "DROP INDEX CONCURRENTLY IF EXISTS outbox_event_unsent_idx",
    "CREATE INDEX CONCURRENTLY outbox_event_unsent_idx ON outbox_event (id) WHERE status <> 'SENT'",
    "DROP INDEX CONCURRENTLY IF EXISTS outbox_event_open_idx",
];

const SQLITE_DOWN: &[&str] = &[
    "CREATE INDEX IF NOT EXISTS inbox_event_unfinished_idx ON inbox_event (consumer, id) WHERE status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')",
    "DROP INDEX IF EXISTS inbox_event_open_idx",
    "CREATE INDEX IF NOT EXISTS outbox_event_unsent_idx ON outbox_event (id) WHERE status <> 'SENT'",
    "DROP INDEX IF EXISTS outbox_event_open_idx",
];
