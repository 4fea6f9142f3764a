//! The connections a set of databases holds on each database server.
//!
//! Every instance holds one pool per database of the set (the one its [`DatabaseSource`] gives),
//! and a pool never opens more than its `max_connections`. So the most connections a service
//! holds on one server is its live instances × the sum of the pool sizes of that server's
//! databases: the *ceiling*. Each database's server is asked who it is when the database joins
//! (PostgreSQL: its address and port, `max_connections` less the superusers' reserve; MySQL /
//! MariaDB: `@@hostname`, `@@port`, `@@max_connections`; a SQLite file has no server).
//!
//! With a budget ([`FleetBuilder::connections_per_server`](super::FleetBuilder::connections_per_server)),
//! a database that is new to the fleet (no instance has held its lease yet) joins only if its
//! server's ceiling stays within the budget; otherwise it is refused (logged, listed by
//! [`Fleet::refused`](super::Fleet::refused), `outbox_fleet_database_refused`) and tried again at
//! every refresh. A database the fleet already serves is never dropped: when instances join and
//! take a server's ceiling over the budget (or, with no budget, over the server's own
//! `max_connections`), the ceiling and the limit are reported
//! (`outbox_fleet_server_connection_ceiling` / `_limit`, a warning once per change) for an
//! operator to size the pools down or the budget up.
//!
//! [`DatabaseSource`]: super::DatabaseSource

use std::collections::BTreeMap;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement};

/// A database server as the fleet counts its connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Server {
    /// `postgres://host:port` or `mysql://host:port`, as the server names itself.
    pub(crate) key: String,
    /// How many client connections the server accepts (PostgreSQL: less the superusers'
    /// reserve).
    pub(crate) max_connections: Option<u32>,
}

/// What one database of the set costs its server: at most `pool` connections per instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Footprint {
    pub(crate) server: Server,
    pub(crate) pool: u32,
}

/// The server `db` is on and its pool's size; `None` for a SQLite file (no server to share) or
/// a connection that is not a pool.
pub(crate) async fn probe(db: &DatabaseConnection) -> Result<Option<Footprint>, DbErr> {
    let Some(pool) = pool_size(db) else {
        return Ok(None);
    };
    let (sql, scheme) = match db.get_database_backend() {
        // The address is NULL over a Unix socket: the port still tells clusters apart.
        DbBackend::Postgres => (
            "SELECT coalesce(host(inet_server_addr()), 'localhost') AS host, \
             current_setting('port') AS port, \
             (current_setting('max_connections')::int \
              - current_setting('superuser_reserved_connections')::int) AS max_connections",
            "postgres",
        ),
        DbBackend::MySql => (
            "SELECT @@hostname AS host, CAST(@@port AS CHAR) AS port, \
             CAST(@@max_connections AS SIGNED) AS max_connections",
            "mysql",
        ),
        _ => return Ok(None),
    };
    let backend = db.get_database_backend();
    let Some(row) = db
        .query_one_raw(Statement::from_string(backend, sql))
        .await?
    else {
        return Ok(None);
    };
    let host: String = row.try_get("", "host")?;
    let port: String = row.try_get("", "port")?;
    let max: Option<i64> = row
        .try_get::<Option<i64>>("", "max_connections")
        .or_else(|_| {
            row.try_get::<Option<i32>>("", "max_connections")
                .map(|v| v.map(i64::from))
        })?;
    Ok(Some(Footprint {
        server: Server {
            key: format!("{scheme}://{host}:{port}"),
            max_connections: max.and_then(|m| u32::try_from(m).ok()),
        },
        pool,
    }))
}

/// The most connections `db`'s pool opens.
fn pool_size(db: &DatabaseConnection) -> Option<u32> {
    match &db.inner {
        #[cfg(feature = "postgres")]
        sea_orm::DatabaseConnectionType::SqlxPostgresPoolConnection(_) => Some(
            db.get_postgres_connection_pool()
                .options()
                .get_max_connections(),
        ),
        #[cfg(feature = "mysql")]
        sea_orm::DatabaseConnectionType::SqlxMySqlPoolConnection(_) => Some(
            db.get_mysql_connection_pool()
                .options()
                .get_max_connections(),
        ),
        _ => None,
    }
}

/// One server's connections over the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Load {
    /// Live instances × the sum of the pools of its databases served.
    pub(crate) ceiling: u64,
    /// The budget, or else the server's own `max_connections`.
    pub(crate) limit: Option<u64>,
}

/// Each server's ceiling with `instances` live instances, over the footprints of the databases
/// served.
pub(crate) fn loads<'a>(
    footprints: impl IntoIterator<Item = &'a Footprint>,
    instances: usize,
    budget: Option<u32>,
) -> BTreeMap<String, Load> {
    let mut loads: BTreeMap<String, Load> = BTreeMap::new();
    for footprint in footprints {
        let load = loads
            .entry(footprint.server.key.clone())
            .or_insert_with(|| Load {
                ceiling: 0,
                limit: budget.or(footprint.server.max_connections).map(u64::from),
            });
        load.ceiling += u64::from(footprint.pool) * instances.max(1) as u64;
    }
    loads
}

/// Whether a database new to the fleet with `footprint` may join, given the footprints of the
/// databases served: `Err` says why not.
pub(crate) fn admit<'a>(
    footprint: &Footprint,
    served: impl IntoIterator<Item = &'a Footprint>,
    instances: usize,
    budget: u32,
) -> Result<(), String> {
    let instances = instances.max(1) as u64;
    let on_server: u64 = served
        .into_iter()
        .filter(|f| f.server.key == footprint.server.key)
        .map(|f| u64::from(f.pool))
        .sum();
    let ceiling = (on_server + u64::from(footprint.pool)) * instances;
    if ceiling <= u64::from(budget) {
        return Ok(());
    }
    Err(format!(
        "it would take the connections the service may hold on {} to {ceiling} ({instances} \
         instance(s) × pools of {} connections in all), over the budget of {budget} per \
         server: give the tenants' pools fewer connections (`max_connections`), raise \
         `connections_per_server`, or move the database to another server",
        footprint.server.key,
        on_server + u64::from(footprint.pool)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(key: &str, pool: u32) -> Footprint {
        Footprint {
            server: Server {
                key: key.into(),
                max_connections: Some(100),
            },
            pool,
        }
    }

    #[test]
    fn the_ceiling_counts_every_instance_and_every_pool_of_a_server() {
        let served = [
            on("pg://a:5432", 4),
            on("pg://a:5432", 2),
            on("pg://b:5432", 3),
        ];
        let loads = loads(&served, 3, None);
        assert_eq!(loads["pg://a:5432"].ceiling, 18);
        assert_eq!(loads["pg://b:5432"].ceiling, 9);
        assert_eq!(
            loads["pg://a:5432"].limit,
            Some(100),
            "the server's own limit without a budget"
        );
        let budgeted = super::loads(&served, 1, Some(40));
        assert_eq!(
            budgeted["pg://a:5432"],
            Load {
                ceiling: 6,
                limit: Some(40)
            }
        );
        assert!(super::loads(&[], 3, Some(40)).is_empty());
    }

    #[test]
    fn a_new_database_joins_only_within_its_servers_budget() {
        let served = [
            on("pg://a:5432", 4),
            on("pg://a:5432", 4),
            on("pg://b:5432", 4),
        ];
        // 2 instances × (8 + 4) = 24 on a.
        assert!(admit(&on("pg://a:5432", 4), &served, 2, 24).is_ok());
        let refused = admit(&on("pg://a:5432", 4), &served, 2, 23).unwrap_err();
        assert!(
            refused.contains("pg://a:5432") && refused.contains("24") && refused.contains("23"),
            "{refused}"
        );
        // Another server's databases do not count.
        assert!(admit(&on("pg://c:5432", 4), &served, 2, 8).is_ok());
        // No live instance read yet counts as this one.
        assert!(admit(&on("pg://c:5432", 4), &[], 0, 4).is_ok());
        assert!(admit(&on("pg://c:5432", 5), &[], 0, 4).is_err());
    }
}
