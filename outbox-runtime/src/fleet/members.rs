//! The fleet's rows in the control database's `outbox_lease`: one per live instance (its
//! heartbeat) and one per owned database (its lease), under names that start with the fleet's
//! group. Names are digests (the column holds 64 characters); the holder column holds the
//! instance's id.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr};

use crate::{
    inbox::digest::digest,
    store::{DbTime, Dialect, LEASE_TABLE, sql::Sql},
};

/// The names of one fleet's rows.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    /// `fleet:{digest of the group}:`.
    prefix: String,
}

impl Names {
    pub(crate) fn new(group: &str) -> Self {
        Names {
            prefix: format!("fleet:{:08x}:", digest(group.as_bytes()) >> 32),
        }
    }

    /// The heartbeat row of `instance`.
    pub(crate) fn instance(&self, instance: &str) -> String {
        format!("{}in:{:016x}", self.prefix, digest(instance.as_bytes()))
    }

    /// The lease of `database`.
    pub(crate) fn database(&self, database: &str) -> String {
        format!("{}db:{:016x}", self.prefix, digest(database.as_bytes()))
    }

    fn instances_prefix(&self) -> String {
        format!("{}in:", self.prefix)
    }
}

/// What the control database holds of a fleet now.
#[derive(Debug, Default, Clone)]
pub(crate) struct Membership {
    /// The live instances (their heartbeat has not expired).
    pub(crate) instances: Vec<String>,
    /// The lease rows, by name: holder, until when, and whether that is still ahead by the
    /// control database's clock (expired rows are kept until taken over).
    pub(crate) leases: BTreeMap<String, (String, DateTime<Utc>, bool)>,
}

impl Membership {
    /// Who holds the lease of `database` now, if anyone.
    pub(crate) fn owner(&self, names: &Names, database: &str) -> Option<&str> {
        let (holder, _, live) = self.leases.get(&names.database(database))?;
        live.then_some(holder.as_str())
    }
}

/// Every row of the fleet: one statement.
pub(crate) async fn read(control: &DatabaseConnection, names: &Names) -> Result<Membership, DbErr> {
    let dialect = Dialect::of(control);
    let mut sql = Sql::new(dialect);
    // The prefix is `fleet:`, hex digits and colons: nothing `LIKE` reads as a wildcard.
    sql.push("SELECT name, holder, locked_until, CASE WHEN locked_until > ")
        .time(DbTime::NOW)
        .push(&format!(
            " THEN 1 ELSE 0 END AS live FROM {LEASE_TABLE} WHERE name LIKE "
        ))
        .bind(format!("{}%", names.prefix).into());
    let rows = control.query_all_raw(sql.build()).await?;
    let mut membership = Membership::default();
    let instances = names.instances_prefix();
    for row in rows {
        let name: String = row.try_get("", "name")?;
        let holder: String = row.try_get("", "holder")?;
        let until = dialect.get_timestamp(&row, "locked_until")?;
        let live: i64 = row
            .try_get::<i64>("", "live")
            .or_else(|_| row.try_get::<i32>("", "live").map(i64::from))?;
        if name.starts_with(&instances) {
            if live == 1 {
                membership.instances.push(holder);
            }
        } else {
            membership.leases.insert(name, (holder, until, live == 1));
        }
    }
    membership.instances.sort();
    Ok(membership)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_the_lease_column_and_differ_by_group() {
        let a = Names::new("order-service");
        let b = Names::new("billing");
        let long = "t".repeat(500);
        assert!(a.database(&long).len() <= 64);
        assert!(a.instance(&long).len() <= 64);
        assert_ne!(a.database("tenant-1"), b.database("tenant-1"));
        assert_ne!(a.database("tenant-1"), a.instance("tenant-1"));
        assert!(a.instance("pod-1").starts_with(&a.instances_prefix()));
        assert!(!a.database("pod-1").starts_with(&a.instances_prefix()));
    }
}
