//! The SQL the SDK runs. Every statement that touches the SDK's tables lives under this module,
//! and nothing above it asks which backend a connection is on.
//!
//! - `dialect`: what differs between the backends, as capabilities of a `Dialect`,
//!   implemented in `postgres`, `mysql` and `sqlite`;
//! - `clock`: the one clock, the database's (`DbTime`);
//! - `sql`: the statement builder, `tx`: the short transactions the SDK's statements run in,
//!   `status`: the tables' states, `errors`: what a database error means;
//! - `outbox`: the commit-time INSERT of buffered events, `scheduled`: delayed events, kept
//!   apart until due;
//! - `claim`: claiming rows of a work queue in id order, per aggregate; `floor`: where a
//!   claim's scans may start (PostgreSQL);
//! - `relay`: the relay's claim and write-back, `local`: the database-local transport;
//! - `inbox`: recording deliveries, the worker's claim and write-back;
//! - `admin`: operators' reads and state changes and the audit log, `retention`: purging
//!   finished rows, `lease`: named leases, `schema`: introspection for `doctor`,
//!   `stats`: backlog counts for the metrics, `broker_state`: each relay's view of its broker,
//!   `failures`: the error history of failed attempts;
//! - `sent`: sent events moved out of the work queue, `rotation`: the tables that rotate
//!   through slots and are emptied a slot at a time, `compact`: the work queues rewritten with
//!   their live rows after a held horizon;
//! - `wal`: the WAL relay's publication, slot and batch check (PostgreSQL).

pub mod admin;
pub mod backend;
pub mod broker_state;
pub mod claim;
pub mod clock;
pub mod compact;
pub mod dialect;
pub mod errors;
pub mod failures;
pub mod floor;
pub mod health;
pub mod inbox;
pub mod inbox_done;
pub mod keys;
#[cfg(feature = "testing")]
pub mod kit;
pub mod lease;
pub mod local;
pub mod mysql;
pub mod notify;
pub(crate) mod outbox;
pub mod pause;
pub mod postgres;
pub mod relay;
pub mod retention;
pub mod rotation;
pub mod scheduled;
pub mod schema;
pub mod sent;
pub mod sql;
pub mod sqlite;
pub mod standby;
pub mod stats;
pub mod status;
pub mod tx;
pub mod wal;

pub use clock::DbTime;
pub use dialect::Dialect;
pub use errors::{is_connection_error, is_transient};
pub(crate) use outbox::{InsertOutcome, insert_events};
pub use sql::database_now;
pub use status::{Failure, FailureClass, InboxStatus, OutboxStatus};

/// The outbox table.
pub const OUTBOX_TABLE: &str = "outbox_event";
/// The inbox table.
pub const INBOX_TABLE: &str = "inbox_event";
/// The admin audit log.
pub const ACTION_TABLE: &str = "outbox_admin_action";
/// The lease table.
pub const LEASE_TABLE: &str = "outbox_lease";
/// Each relay's view of its broker.
pub const RELAY_TABLE: &str = "outbox_relay";
/// The aggregate-version guard's table.
pub const AGGREGATE_VERSION_TABLE: &str = "inbox_aggregate_version";

/// An integer column, whatever width the backend gives it (`INTEGER` is `i32` on PostgreSQL and
/// MySQL, `i64` on SQLite; `COUNT(*)` is `i64` everywhere).
pub fn get_i64(row: &sea_orm::QueryResult, column: &str) -> Result<i64, sea_orm::DbErr> {
    match row.try_get::<i64>("", column) {
        Ok(v) => Ok(v),
        Err(first) => match row.try_get::<i32>("", column) {
            Ok(v) => Ok(i64::from(v)),
            Err(_) => Err(first),
        },
    }
}

/// An optional integer column, whatever width the backend gives it.
pub fn get_opt_i64(
    row: &sea_orm::QueryResult,
    column: &str,
) -> Result<Option<i64>, sea_orm::DbErr> {
    match row.try_get::<Option<i64>>("", column) {
        Ok(v) => Ok(v),
        Err(first) => match row.try_get::<Option<i32>>("", column) {
            Ok(v) => Ok(v.map(i64::from)),
            Err(_) => Err(first),
        },
    }
}
