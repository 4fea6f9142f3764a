//! The test kit (feature `testing`, for `[dev-dependencies]`): everything in
//! [`outbox_runtime::testing`], and [`TestDb`], a migrated database of a test's own.
//!
//! ```toml
//! [dev-dependencies]
//! outbox = { version = "0.1", features = ["testing"] }
//! ```
//!
//! The user guide's "Testing with the kit" chapter walks through each part.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

pub use outbox_runtime::testing::*;

mod warm;

use crate::sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, DbErr, Statement,
};

/// Test schemas and databases older than this are dropped when a new one is made: what tests
/// that never cleaned up (a panic, a killed run) left behind.
const STALE_AFTER: Duration = Duration::from_secs(3600);

/// The prefix of every schema or database the kit makes.
const PREFIX: &str = "outbox_test_";

/// Where a [`TestDb`] lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TestDbKind {
    /// SQLite in memory, on one connection that lives as long as the `TestDb`.
    SqliteMemory,
    /// A PostgreSQL schema of its own: every connection's `search_path` is that schema.
    PostgresSchema(String),
    /// A MySQL/MariaDB database of its own.
    MySqlDatabase(String),
}

/// A migrated database of one test's own, so tests run in parallel with `cargo test`: SQLite in
/// memory, a fresh PostgreSQL schema, or a fresh MySQL/MariaDB database. It derefs to its
/// [`DatabaseConnection`].
///
/// ```no_run
/// # async fn f() -> Result<(), outbox::sea_orm::DbErr> {
/// let db = outbox::testing::TestDb::sqlite().await?; // or TestDb::from_env()
/// let outbox = outbox::Outbox::new("order-service");
/// let tx = outbox.begin(&db).await.unwrap();
/// # Ok(()) }
/// ```
///
/// A PostgreSQL schema shares its database with other tests' schemas: the WAL relay (which
/// reads a whole database) needs a database of its own.
#[derive(Debug, Clone)]
pub struct TestDb {
    db: DatabaseConnection,
    kind: TestDbKind,
    admin_url: Option<String>,
}

impl std::ops::Deref for TestDb {
    type Target = DatabaseConnection;

    fn deref(&self) -> &DatabaseConnection {
        &self.db
    }
}

/// A name no other test of any process takes: the time (for the stale sweep), the process and a
/// counter.
fn fresh_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "{PREFIX}{}_{}_{}",
        now.as_secs(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Whether a kit-made name is older than [`STALE_AFTER`].
fn is_stale(name: &str) -> bool {
    let Some(secs) = name
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.split('_').next())
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return false;
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    now.saturating_sub(secs) > STALE_AFTER.as_secs()
}

/// An identifier the kit made (letters, digits and `_` only), quoted.
fn quoted(name: &str) -> String {
    debug_assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    format!("\"{name}\"")
}

async fn connect(options: ConnectOptions) -> Result<DatabaseConnection, DbErr> {
    Database::connect(options).await
}

impl TestDb {
    /// SQLite in memory, migrated: nothing to install, nothing left behind.
    pub async fn sqlite() -> Result<TestDb, DbErr> {
        let mut options = ConnectOptions::new("sqlite::memory:");
        // One connection, kept: an in-memory database lives and dies with its connection.
        options
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .sqlx_logging(false);
        let db = connect(options).await?;
        crate::migrate(&db).await?;
        Ok(TestDb {
            db,
            kind: TestDbKind::SqliteMemory,
            admin_url: None,
        })
    }

    /// A fresh schema in the PostgreSQL database at `url`, migrated; every connection of the
    /// pool works in it. Migrating a schema takes a few hundred statements, so the kit keeps a
    /// few migrated schemas ready in that database (made in the background, kept across test
    /// runs, never one of an earlier release's migrations) and a test takes one by renaming it.
    /// Schemas of this kit's tests older than an hour are dropped first.
    pub async fn postgres(url: &str) -> Result<TestDb, DbErr> {
        let admin = connect(admin_options(url)).await?;
        let stale = admin
            .query_all_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)",
                [PREFIX.into()],
            ))
            .await?;
        for row in stale {
            let name: String = row.try_get("", "nspname")?;
            if is_stale(&name) {
                let drop = format!("DROP SCHEMA IF EXISTS {} CASCADE", quoted(&name));
                admin.execute_unprepared(&drop).await.ok();
            }
        }
        warm::sweep(&admin).await?;
        let schema = fresh_name();
        let taken = warm::take(&admin, &schema).await?;
        if !taken {
            admin
                .execute_unprepared(&format!("CREATE SCHEMA {}", quoted(&schema)))
                .await?;
        }
        admin.close().await.ok();
        let db = warm::pool(url, &schema, 10).await?;
        if !taken {
            crate::migrate(&db).await?;
        }
        warm::replenish(url);
        Ok(TestDb {
            db,
            kind: TestDbKind::PostgresSchema(schema),
            admin_url: Some(url.to_owned()),
        })
    }

    /// A fresh database on the MySQL/MariaDB server at `url` (its path names any database the
    /// user may connect to), migrated. Databases of this kit older than an hour are dropped
    /// first.
    pub async fn mysql(url: &str) -> Result<TestDb, DbErr> {
        let admin = connect(admin_options(url)).await?;
        let stale = admin
            .query_all_raw(Statement::from_sql_and_values(
                DbBackend::MySql,
                "SELECT schema_name AS name FROM information_schema.schemata \
                 WHERE schema_name LIKE CONCAT(?, '%')",
                [PREFIX.into()],
            ))
            .await?;
        for row in stale {
            let name: String = row.try_get("", "name")?;
            if is_stale(&name) {
                let drop = format!("DROP DATABASE IF EXISTS `{name}`");
                admin.execute_unprepared(&drop).await.ok();
            }
        }
        let name = fresh_name();
        admin
            .execute_unprepared(&format!("CREATE DATABASE `{name}`"))
            .await?;
        admin.close().await.ok();
        let mut options = ConnectOptions::new(with_path(url, &name));
        options.max_connections(10).sqlx_logging(false);
        let db = connect(options).await?;
        crate::migrate(&db).await?;
        Ok(TestDb {
            db,
            kind: TestDbKind::MySqlDatabase(name),
            admin_url: Some(url.to_owned()),
        })
    }

    /// From the environment: `OUTBOX_TEST_DATABASE_URL` naming a PostgreSQL (`postgres://…`) or
    /// MySQL/MariaDB (`mysql://…`) server, or SQLite in memory when it is unset or empty. One
    /// test suite runs on each backend by setting the variable.
    pub async fn from_env() -> Result<TestDb, DbErr> {
        match std::env::var("OUTBOX_TEST_DATABASE_URL") {
            Ok(url) if url.starts_with("postgres") => TestDb::postgres(&url).await,
            Ok(url) if url.starts_with("mysql") || url.starts_with("mariadb") => {
                TestDb::mysql(&url).await
            }
            Ok(url) if !url.is_empty() && !url.starts_with("sqlite") => Err(DbErr::Custom(
                "OUTBOX_TEST_DATABASE_URL must name postgres://, mysql:// or sqlite: (got a URL \
                 of another scheme)"
                    .to_owned(),
            )),
            _ => TestDb::sqlite().await,
        }
    }

    /// The connection (also reached through `Deref`).
    pub fn conn(&self) -> &DatabaseConnection {
        &self.db
    }

    /// Where it lives.
    pub fn kind(&self) -> &TestDbKind {
        &self.kind
    }

    /// Drop the schema or database (nothing to do for SQLite in memory) and close the pool.
    /// Optional: what is not dropped is swept by a later `TestDb` after an hour.
    pub async fn cleanup(self) -> Result<(), DbErr> {
        self.db.close().await.ok();
        let Some(url) = self.admin_url else {
            return Ok(());
        };
        let sql = match &self.kind {
            TestDbKind::PostgresSchema(s) => format!("DROP SCHEMA IF EXISTS {} CASCADE", quoted(s)),
            TestDbKind::MySqlDatabase(d) => format!("DROP DATABASE IF EXISTS `{d}`"),
            TestDbKind::SqliteMemory => return Ok(()),
        };
        let admin = connect(admin_options(&url)).await?;
        admin.execute_unprepared(&sql).await?;
        admin.close().await.ok();
        Ok(())
    }
}

fn admin_options(url: &str) -> ConnectOptions {
    let mut options = ConnectOptions::new(url);
    options.max_connections(1).sqlx_logging(false);
    options
}

/// `url` with its path (the database) replaced by `database`, its query kept.
fn with_path(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[after_scheme..]
        .find('/')
        .map_or(base.len(), |i| after_scheme + i);
    let mut out = format!("{}/{database}", &base[..host_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_is_replaced_in_a_url() {
        assert_eq!(
            with_path("mysql://root@127.0.0.1:3306/test", "x"),
            "mysql://root@127.0.0.1:3306/x"
        );
        assert_eq!(
            with_path("mysql://root@127.0.0.1:3306", "x"),
            "mysql://root@127.0.0.1:3306/x"
        );
        assert_eq!(
            with_path("mysql://u:p@h/db?ssl-mode=disabled", "x"),
            "mysql://u:p@h/x?ssl-mode=disabled"
        );
    }

    #[test]
    fn only_old_kit_names_are_stale() {
        assert!(is_stale("outbox_test_1000_1_0"));
        assert!(!is_stale(&fresh_name()));
        assert!(!is_stale("orders"));
        assert!(!is_stale("outbox_test_x_1_0"));
    }
}
