//! The dialect of a connection: its backend's capabilities (see `backend.rs`), and how values
//! are written and read. Code above the store asks the [`Dialect`] of a connection what it can
//! do, never which backend it is.

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, QueryResult, Statement, Value};
use uuid::Uuid;

use super::{backend::Backend, mysql::MySql, postgres::Postgres, sqlite::Sqlite};

/// The SQL dialect of a connection: what its backend can do and how values are written and
/// read.
#[derive(Clone, Copy)]
pub struct Dialect {
    backend: &'static dyn Backend,
}

impl std::fmt::Debug for Dialect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Dialect")
            .field(&self.backend.db_backend())
            .finish()
    }
}

impl std::ops::Deref for Dialect {
    type Target = dyn Backend;

    fn deref(&self) -> &Self::Target {
        self.backend
    }
}

impl Dialect {
    /// The dialect of a connection.
    pub fn of<C: ConnectionTrait + ?Sized>(conn: &C) -> Self {
        Self::from_backend(conn.get_database_backend())
    }

    /// SeaORM's name of the backend, for tests that write their own SQL (the SDK's own code asks
    /// the dialect's capabilities instead).
    #[cfg(feature = "test-util")]
    pub fn backend(&self) -> DbBackend {
        self.backend.db_backend()
    }

    pub(crate) fn from_backend(backend: DbBackend) -> Self {
        Dialect {
            backend: match backend {
                DbBackend::Postgres => &Postgres,
                DbBackend::MySql => &MySql,
                _ => &Sqlite,
            },
        }
    }

    /// Read a UUID column.
    pub fn get_uuid(&self, row: &QueryResult, column: &str) -> Result<Uuid, DbErr> {
        self.backend
            .get_opt_uuid(row, column)?
            .ok_or_else(|| DbErr::Type(format!("column {column} is NULL, not a UUID")))
    }

    /// Read a timestamp column.
    pub fn get_timestamp(&self, row: &QueryResult, column: &str) -> Result<DateTime<Utc>, DbErr> {
        self.backend
            .get_opt_timestamp(row, column)?
            .ok_or_else(|| DbErr::Type(format!("column {column} is NULL, not a timestamp")))
    }

    pub(crate) fn statement(&self, sql: String, values: Vec<Value>) -> Statement {
        Statement::from_sql_and_values(self.backend.db_backend(), sql, values)
    }

    pub(crate) fn raw(&self, sql: impl Into<String>) -> Statement {
        Statement::from_string(self.backend.db_backend(), sql)
    }
}
