//! Operating the set: migrations over every database, and each database's owner and figures
//! in one report, so a database nobody owns, or one whose events wait, shows in the first look.
//!
//! ```no_run
//! # async fn demo(
//! #     control: sea_orm::DatabaseConnection,
//! #     databases: Vec<outbox_runtime::fleet::FleetDatabase>,
//! # ) {
//! use outbox_runtime::fleet;
//!
//! for row in fleet::status(Some(&control), "order-service", &databases).await {
//!     if row.needs_attention() {
//!         eprintln!("{}: {:?} {:?}", row.database, row.ownership, row.figures);
//!     }
//! }
//! # }
//! ```
//!
//! Each database is read (or migrated) on its own: one that fails is reported with its error,
//! and the others still are. Errors are the database's own text, never a URL (the functions
//! only see connections).

use std::{fmt, future::Future, time::Duration};

use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use sea_orm::{DatabaseConnection, DbErr};
use serde::{Serialize, Serializer};

use super::{FleetDatabase, MAX_DATABASE_NAME_CHARS};
use crate::admin;

/// How many databases are read or migrated at once.
const AT_ONCE: usize = 4;

/// Whether `name` can name a database of a set: 1 to
/// [`MAX_DATABASE_NAME_CHARS`](super::MAX_DATABASE_NAME_CHARS) characters, not blank, without
/// control characters (the check a [`Fleet`](super::Fleet) makes when it reads its set). The
/// error says what is wrong.
pub fn check_database_name(name: &str) -> Result<(), String> {
    let chars = name.chars().count();
    if name.trim().is_empty()
        || chars > MAX_DATABASE_NAME_CHARS
        || name.chars().any(char::is_control)
    {
        return Err(format!(
            "database name {:?} cannot serve: names are 1 to {MAX_DATABASE_NAME_CHARS} \
             characters, not blank, without control characters",
            crate::util::text::truncate(name, 64)
        ));
    }
    Ok(())
}

/// The database answers a ping: a connection that is not connected
/// (`DatabaseConnection::default()`, say for a database whose server refused) is reported, not
/// used.
async fn answers(db: &DatabaseConnection) -> Result<(), String> {
    db.ping()
        .await
        .map_err(|e| format!("the database does not answer: {e}"))
}

/// What a migration run did to one database (see [`migrate_each`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DatabaseMigration {
    /// The database's name.
    pub database: String,
    /// Migrated, or the error that stopped it.
    pub result: Result<(), String>,
}

impl Serialize for DatabaseMigration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct View<'a> {
            database: &'a str,
            ok: bool,
            error: Option<&'a str>,
        }
        View {
            database: &self.database,
            ok: self.result.is_ok(),
            error: self.result.as_ref().err().map(String::as_str),
        }
        .serialize(s)
    }
}

/// Apply `migrate` to each of `databases` (a few at a time), going on past a database that
/// fails (or whose connection is not connected: `DatabaseConnection::default()`): one entry per
/// database, in the order given. `outbox::fleet::migrate_all` applies the
/// SDK's migrations this way; an application's own `Migrator` goes through here too:
///
/// ```no_run
/// # async fn demo(databases: Vec<outbox_runtime::fleet::FleetDatabase>) {
/// # struct Migrator;
/// # impl Migrator { async fn up(_: &sea_orm::DatabaseConnection, _: Option<u32>) -> Result<(), sea_orm::DbErr> { Ok(()) } }
/// let report = outbox_runtime::fleet::migrate_each(&databases, |db| async move {
///     Migrator::up(&db, None).await
/// })
/// .await;
/// let failed = report.iter().filter(|m| m.result.is_err()).count();
/// # }
/// ```
pub async fn migrate_each<F, Fut>(databases: &[FleetDatabase], migrate: F) -> Vec<DatabaseMigration>
where
    F: Fn(DatabaseConnection) -> Fut,
    Fut: Future<Output = Result<(), DbErr>>,
{
    futures_util::stream::iter(databases)
        .map(|database| {
            let db = database.connection().clone();
            let migrate = &migrate;
            async move {
                let result = match answers(&db).await {
                    Ok(()) => migrate(db).await.map_err(|e| e.to_string()),
                    Err(e) => Err(e),
                };
                if let Err(error) = &result {
                    tracing::warn!(database = %database.name(), %error, "migrations failed");
                } else {
                    tracing::info!(database = %database.name(), "migrations applied");
                }
                DatabaseMigration {
                    database: database.name().to_owned(),
                    result,
                }
            }
        })
        .buffered(AT_ONCE)
        .collect()
        .await
}

/// Who holds a database's lease, in a [`DatabaseStatus`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[serde(tag = "state", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Ownership {
    /// No control database was given: owners were not asked.
    NotAsked,
    /// `instance` holds the lease, until `until`.
    Owned {
        /// The instance's id.
        instance: String,
        /// When its lease ends unless renewed.
        until: Option<DateTime<Utc>>,
    },
    /// Nobody holds the lease: the database's background work (claims, retries, janitor) is
    /// not running anywhere. `until`: when the last holder's lease ended, if it ever had one.
    Unowned {
        /// When the last lease ended.
        until: Option<DateTime<Utc>>,
    },
    /// The control database could not be read.
    Unknown {
        /// Why.
        error: String,
    },
}

/// One database's figures, from [`admin::status`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct DatabaseFigures {
    /// Outbox events not yet sent (PENDING, PROCESSING and RETRY: the outbox's backlog).
    pub pending: u64,
    /// When the oldest of them was enqueued.
    pub oldest_pending_at: Option<DateTime<Utc>>,
    /// How long it has waited, by the database's clock (seconds in JSON).
    #[serde(
        rename = "oldest_pending_age_secs",
        serialize_with = "crate::admin::opt_secs"
    )]
    pub oldest_pending_age: Option<Duration>,
    /// DEAD rows, outbox and every consumer's inbox, waiting for an operator.
    pub dead: u64,
    /// Inbox messages not yet handled (PENDING, PROCESSING and RETRY), all consumers.
    pub inbox_backlog: u64,
}

impl DatabaseFigures {
    fn of(status: &admin::Status) -> Self {
        DatabaseFigures {
            pending: status.outbox.backlog,
            oldest_pending_at: status.outbox.oldest_unsent_at,
            oldest_pending_age: status.outbox.oldest_unsent_age,
            dead: status.dead_total(),
            inbox_backlog: status.consumers.iter().map(|c| c.backlog).sum(),
        }
    }
}

/// One database of the set in [`status`]: its owner and its figures.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DatabaseStatus {
    /// The database's name.
    pub database: String,
    /// Who holds its lease.
    pub ownership: Ownership,
    /// Its figures, or why it could not be read.
    pub figures: Result<DatabaseFigures, String>,
}

impl DatabaseStatus {
    /// Nobody owns it, its owner could not be read, or it could not be read itself: the
    /// alarm an operator acts on.
    pub fn needs_attention(&self) -> bool {
        self.figures.is_err()
            || matches!(
                self.ownership,
                Ownership::Unowned { .. } | Ownership::Unknown { .. }
            )
    }
}

impl Serialize for DatabaseStatus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct View<'a> {
            database: &'a str,
            owner: &'a Ownership,
            #[serde(flatten)]
            figures: Option<&'a DatabaseFigures>,
            error: Option<&'a str>,
            needs_attention: bool,
        }
        View {
            database: &self.database,
            owner: &self.ownership,
            figures: self.figures.as_ref().ok(),
            error: self.figures.as_ref().err().map(String::as_str),
            needs_attention: self.needs_attention(),
        }
        .serialize(s)
    }
}

/// Every database's owner in the fleet `group` (read from `control`, when given) and figures:
/// the outbox's pending events and the age of the oldest, dead rows and the inbox's backlog.
/// One entry per database, in the order given; a database that cannot be read (or a
/// connection that is not connected: `DatabaseConnection::default()`) gets its error instead of
/// figures, and every other database still reports.
pub async fn status(
    control: Option<&DatabaseConnection>,
    group: &str,
    databases: &[FleetDatabase],
) -> Vec<DatabaseStatus> {
    let names: Vec<&str> = databases.iter().map(FleetDatabase::name).collect();
    let owners = match control {
        None => Ok(None),
        Some(control) => super::owners(control, group, &names).await.map(Some),
    };
    let ownership = |index: usize| match &owners {
        Ok(None) => Ownership::NotAsked,
        Ok(Some(owners)) => match owners.get(index) {
            Some(super::DatabaseOwner {
                owner: Some(instance),
                until,
                ..
            }) => Ownership::Owned {
                instance: instance.clone(),
                until: *until,
            },
            Some(owner) => Ownership::Unowned { until: owner.until },
            None => Ownership::Unowned { until: None },
        },
        Err(e) => Ownership::Unknown {
            error: format!("the control database could not be read: {e}"),
        },
    };
    let figures: Vec<Result<DatabaseFigures, String>> = futures_util::stream::iter(databases)
        .map(figures_of)
        .buffered(AT_ONCE)
        .collect()
        .await;
    databases
        .iter()
        .zip(figures)
        .enumerate()
        .map(|(index, (database, figures))| DatabaseStatus {
            database: database.name().to_owned(),
            ownership: ownership(index),
            figures,
        })
        .collect()
}

/// One database's figures. A named function, not a closure: its future is `Send` for any
/// lifetime of the reference, so [`status`] can run on a multi-threaded runtime's task (the
/// console's handler).
async fn figures_of(database: &FleetDatabase) -> Result<DatabaseFigures, String> {
    answers(database.connection()).await?;
    admin::status(database.connection())
        .await
        .map(|status| DatabaseFigures::of(&status))
        .map_err(|e| e.to_string())
}

impl fmt::Display for Ownership {
    /// The instance, `UNOWNED`, `-` (not asked) or `?` (unknown).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ownership::NotAsked => f.write_str("-"),
            Ownership::Owned { instance, .. } => f.write_str(instance),
            Ownership::Unowned { .. } => f.write_str("UNOWNED"),
            Ownership::Unknown { .. } => f.write_str("?"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_as_the_fleet_checks_them() {
        assert!(check_database_name("acme").is_ok());
        assert!(check_database_name(&"a".repeat(super::super::MAX_DATABASE_NAME_CHARS)).is_ok());
        for bad in [
            "",
            "  ",
            "tab\there",
            &"a".repeat(super::super::MAX_DATABASE_NAME_CHARS + 1),
        ] {
            let error = check_database_name(bad).unwrap_err();
            assert!(error.contains("cannot serve"), "{error}");
        }
    }

    #[tokio::test]
    async fn a_database_that_cannot_be_read_reports_its_error_and_the_others_still_do() {
        let databases = vec![
            FleetDatabase::new("gone", DatabaseConnection::default()),
            FleetDatabase::new("also-gone", DatabaseConnection::default()),
        ];
        let rows = status(None, "g", &databases).await;
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].database, "also-gone");
        for row in &rows {
            assert_eq!(row.ownership, Ownership::NotAsked);
            assert!(row.figures.is_err());
            assert!(row.needs_attention());
        }
        let json = serde_json::to_value(&rows[0]).unwrap();
        assert_eq!(json["owner"]["state"], "not_asked");
        assert!(json["error"].is_string());
        let migrated =
            migrate_each(&databases, |_| async { Err(DbErr::Custom("no".into())) }).await;
        assert_eq!(
            serde_json::to_value(&migrated[1]).unwrap(),
            serde_json::json!({
                "database": "also-gone",
                "ok": false,
                "error": "the database does not answer: Connection Error: Disconnected"
            })
        );
    }
}
