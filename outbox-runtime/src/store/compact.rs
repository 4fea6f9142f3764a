//! Giving back the space a queue table kept through a held xmin horizon (PostgreSQL).
//!
//! `outbox_event` and `inbox_event` hold unfinished rows only: a sent event moves to
//! `outbox_sent`, a handled message to `inbox_done`. While something holds the xmin horizon
//! (a report's long transaction, a forgotten session), every row that leaves stays behind as a
//! dead version, and the table grows with the traffic for as long as the hold lasts. Once it
//! ends, vacuum frees those pages for new rows, but it returns to the filesystem only the empty
//! pages at the table's end: the table keeps the size of its longest hold, new rows spread
//! over all of it, and every scan and vacuum reads it whole.
//!
//! [`compact`] rewrites such a table with its live rows alone (`CLUSTER` by its primary key),
//! in a transaction that waits at most the given time for the table's lock and gives up
//! otherwise: writers of the table wait for the rewrite, which for a queue table's few live rows
//! takes milliseconds. The rewrite keeps every row as it was (ids, states, the versions other
//! transactions may still see) and is not decoded as new rows by logical replication, so the
//! WAL relay publishes nothing twice.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, TransactionTrait};

use super::get_i64;

use super::{Dialect, INBOX_TABLE, OUTBOX_TABLE, sql::Sql};

/// The tables [`compact`] rewrites: the two work queues.
pub const HOT_TABLES: [&str; 2] = [OUTBOX_TABLE, INBOX_TABLE];

/// A work queue's heap and the rows it holds, as the server's statistics say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Occupancy {
    /// One of [`HOT_TABLES`].
    pub table: String,
    /// Bytes of the table's heap (its main fork: neither its indexes nor its TOAST).
    pub heap_bytes: i64,
    /// Rows visible now (`n_live_tup`, counted as transactions insert and delete).
    pub live_rows: i64,
}

/// The occupancy of [`HOT_TABLES`] that exist; empty on backends other than PostgreSQL.
pub async fn occupancy<C: ConnectionTrait>(db: &C) -> Result<Vec<Occupancy>, DbErr> {
    if db.get_database_backend() != DbBackend::Postgres {
        return Ok(Vec::new());
    }
    let mut sql = Sql::new(Dialect::of(db));
    sql.push(
        "SELECT c.relname::text AS table_name, pg_relation_size(c.oid)::bigint AS heap_bytes, \
         COALESCE(s.n_live_tup, 0)::bigint AS live_rows \
         FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid \
         WHERE c.relkind = 'r' AND c.relnamespace = to_regnamespace(current_schema()) \
         AND c.relname IN ",
    )
    .bind_list(HOT_TABLES.map(|table| sea_orm::Value::from(table.to_owned())))
    .push(" ORDER BY c.relname");
    db.query_all_raw(sql.build())
        .await?
        .iter()
        .map(|row| {
            Ok(Occupancy {
                table: row.try_get("", "table_name")?,
                heap_bytes: get_i64(row, "heap_bytes")?,
                live_rows: get_i64(row, "live_rows")?,
            })
        })
        .collect()
}

/// The statements that rewrite `table` (one of [`HOT_TABLES`]) by its primary key, then drop
/// the mark `CLUSTER` leaves on the index (no later bare `CLUSTER` should pick the table up).
fn rewrite(table: &str) -> Option<[&'static str; 2]> {
    match table {
        OUTBOX_TABLE => Some([
            "CLUSTER outbox_event USING outbox_event_pkey",
            "ALTER TABLE outbox_event SET WITHOUT CLUSTER",
        ]),
        INBOX_TABLE => Some([
            "CLUSTER inbox_event USING inbox_event_pkey",
            "ALTER TABLE inbox_event SET WITHOUT CLUSTER",
        ]),
        _ => None,
    }
}

/// What became of a rewrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rewrite {
    /// The table was rewritten.
    Done,
    /// Its lock was not had within the time allowed (a long reader or writer of the table); a
    /// later pass may try again.
    LockBusy,
    /// The connection's role does not own the table (PostgreSQL lets only its owner rewrite it).
    NotOwner,
    /// Not a table this rewrites, or not PostgreSQL.
    NotApplicable,
}

/// Rewrite `table` (one of [`HOT_TABLES`]) with its live rows alone, waiting at most
/// `lock_timeout` for its lock.
pub async fn compact(
    db: &DatabaseConnection,
    table: &str,
    lock_timeout: Duration,
) -> Result<Rewrite, DbErr> {
    let Some(statements) = rewrite(table) else {
        return Ok(Rewrite::NotApplicable);
    };
    if db.get_database_backend() != DbBackend::Postgres {
        return Ok(Rewrite::NotApplicable);
    }
    let dialect = Dialect::of(db);
    let txn = db.begin().await?;
    let mut limit = Sql::new(dialect);
    limit
        .push("SELECT set_config('lock_timeout', ")
        .bind(format!("{}ms", lock_timeout.as_millis().max(1)).into())
        .push(", true) AS lock_timeout");
    txn.query_one_raw(limit.build()).await?;
    for statement in statements {
        if let Err(e) = txn.execute_raw(dialect.raw(statement)).await {
            let outcome = if super::errors::is_lock_timeout(&e) {
                Rewrite::LockBusy
            } else if super::errors::is_not_owner(&e) {
                Rewrite::NotOwner
            } else {
                return Err(e);
            };
            txn.rollback().await?;
            return Ok(outcome);
        }
    }
    txn.commit().await?;
    Ok(Rewrite::Done)
}
