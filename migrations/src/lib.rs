//! SeaORM migrations for the outbox SDK's tables: `outbox_event`, `inbox_event` and the
//! operations' tables beside them.
//!
//! Two ways to apply them:
//!
//! - apps without a migrator call [`migrate`], which records what it applied in its own table,
//!   `outbox_migrations`, so it never clashes with an app's `seaql_migrations`;
//! - apps with a SeaORM `MigratorTrait` compose [`migrations`] into their own list:
//!
//! ```ignore
//! impl MigratorTrait for Migrator {
//!     fn migrations() -> Vec<Box<dyn MigrationTrait>> {
//!         let mut all = outbox::migrations();
//!         all.push(Box::new(m20260101_000001_create_orders::Migration));
//!         all
//!     }
//! }
//! ```
//!
//! Migration names are namespaced (`outbox_0001_…`) and never change once released.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{DatabaseConnection, DbBackend};

mod m0001_outbox_event;
mod m0002_inbox_event;
mod m0003_inbox_aggregate_version;
mod m0004_admin_action;
mod m0005_relay;
mod m0006_inbox_external;
mod m0007_inbox_drop_message_id_key;
mod m0008_failure;
mod m0009_scheduled;
mod m0010_failure_class;
mod m0011_claim_floor;
mod m0012_open_idx;
mod m0013_sent_rotation;
mod m0014_inbox_rotation;
mod m0015_pause;

/// Every migration of the SDK, in order, for composing into an application's `Migrator`.
pub fn migrations() -> Vec<Box<dyn MigrationTrait>> {
    vec![
        Box::new(m0001_outbox_event::MIGRATION),
        Box::new(m0002_inbox_event::MIGRATION),
        Box::new(m0003_inbox_aggregate_version::MIGRATION),
        Box::new(m0004_admin_action::MIGRATION),
        Box::new(m0005_relay::MIGRATION),
        Box::new(m0006_inbox_external::MIGRATION),
        Box::new(m0007_inbox_drop_message_id_key::MIGRATION),
        Box::new(m0008_failure::MIGRATION),
        Box::new(m0009_scheduled::MIGRATION),
        Box::new(m0010_failure_class::MIGRATION),
        Box::new(m0011_claim_floor::MIGRATION),
        Box::new(m0012_open_idx::MIGRATION),
        Box::new(m0013_sent_rotation::Migration),
        Box::new(m0014_inbox_rotation::Migration),
        Box::new(m0015_pause::MIGRATION),
    ]
}

/// A migration written as SQL, one script per backend.
struct Script {
    name: &'static str,
    postgres: &'static [&'static str],
    mysql: &'static [&'static str],
    sqlite: &'static [&'static str],
    down: Down,
    /// Where the statements run.
    transaction: Transaction,
}

/// Whether a migration's statements run in one transaction.
#[derive(Clone, Copy)]
enum Transaction {
    /// SeaORM's default: one transaction on PostgreSQL, none elsewhere.
    Backend,
    /// One transaction on every backend. A script whose statements depend on the schema changes
    /// of the ones before it (SQLite's table rebuild: its `RENAME` after its `DROP`) needs one
    /// connection; SeaORM runs SQLite migrations without a transaction, statement by statement
    /// on whichever pooled connection is free.
    One,
    /// None on any backend: PostgreSQL's `CREATE INDEX CONCURRENTLY`, which builds an index
    /// without blocking writes, refuses to run inside a transaction.
    None,
}

/// How a migration is undone.
enum Down {
    /// The same statements on every backend.
    All(&'static [&'static str]),
    /// One script per backend: PostgreSQL, MySQL, SQLite.
    Each(
        &'static [&'static str],
        &'static [&'static str],
        &'static [&'static str],
    ),
}

impl MigrationName for Script {
    fn name(&self) -> &str {
        self.name
    }
}

// `MigrationTrait` declares `&SchemaManager` with an elided lifetime; the impl must match it.
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for Script {
    fn use_transaction(&self) -> Option<bool> {
        match self.transaction {
            Transaction::Backend => None,
            Transaction::One => Some(true),
            Transaction::None => Some(false),
        }
    }

    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let script = match manager.get_database_backend() {
            DbBackend::Postgres => self.postgres,
            DbBackend::MySql => self.mysql,
            _ => self.sqlite,
        };
        run_script(manager, script).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let script = match (&self.down, manager.get_database_backend()) {
            (Down::All(all), _) => all,
            (Down::Each(postgres, _, _), DbBackend::Postgres) => postgres,
            (Down::Each(_, mysql, _), DbBackend::MySql) => mysql,
            (Down::Each(_, _, sqlite), _) => sqlite,
        };
        run_script(manager, script).await
    }
}

/// A migrator for the SDK's tables alone, tracked in `outbox_migrations`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        migrations()
    }

    fn migration_table_name() -> DynIden {
        "outbox_migrations".into_iden()
    }
}

/// Apply every pending SDK migration (idempotent).
pub async fn migrate(db: &DatabaseConnection) -> Result<(), DbErr> {
    Migrator::up(db, None).await
}

/// Run each statement of a backend's script in order.
async fn run_script(manager: &SchemaManager<'_>, script: &[&str]) -> Result<(), DbErr> {
    let conn = manager.get_connection();
    for stmt in script {
        conn.execute_unprepared(stmt).await?;
    }
    Ok(())
}
