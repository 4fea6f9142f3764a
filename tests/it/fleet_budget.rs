//! A connection budget per database server over a set of databases: a database new to the fleet
//! that would take its server past the budget is refused and tried again at every refresh; one
//! the fleet already serves stays when instances join, and the servers' ceilings are reported.

use std::time::Duration;

use crate::common::*;
use crate::metrics::{labelled, recorded};
use outbox::fleet::{DatabaseSet, Fleet, FleetDatabase};
use outbox::runtime::Runtime;
use outbox::transport::memory::MemoryTransport;
use sea_orm::DatabaseConnection;

async fn start(control: &DatabaseConnection, set: &DatabaseSet, id: &str) -> Fleet {
    Runtime::builder(control.clone())
        .source("fleet-budget")
        .instance_id(id)
        .transport(MemoryTransport::new())
        .consumers(Vec::<String>::new())
        .metrics_interval(None)
        .databases(set.clone())
        .heartbeat(Duration::from_millis(200))
        .lease(Duration::from_secs(2))
        .refresh(Duration::from_millis(300))
        .connections_per_server(7)
        .start()
        .await
        .unwrap()
}

/// The gauge `name` of the server whose key starts with `scheme`.
fn server_gauge(body: &str, name: &str, scheme: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(&format!("{name}{{server=\"{scheme}://")))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Pools of 3 connections, a budget of 7 per server: two PostgreSQL databases fit (6), the
/// third is refused while the fleet serves them; a MariaDB database on its own server joins.
/// A second instance keeps serving what the first did (the ceiling, 12, is reported over the
/// limit); once it leaves and a database leaves the set, the refused one joins.
#[test]
fn a_database_past_its_servers_budget_is_refused_until_it_fits() {
    recorded(|handle| async move {
        let (Some(control), Some(a), Some(b), Some(c), Some(m)) = (
            test_db(Backend::Postgres, "fleet_budget_control").await,
            test_db(Backend::Postgres, "fleet_budget_a").await,
            test_db(Backend::Postgres, "fleet_budget_b").await,
            test_db(Backend::Postgres, "fleet_budget_c").await,
            test_db(Backend::MySql, "fleet_budget_m").await,
        ) else {
            return;
        };
        let mut set = Vec::new();
        for (name, t) in [("a", &a), ("b", &b), ("c", &c), ("m", &m)] {
            let pool = connect(&t.url, 3).await.unwrap();
            set.push(FleetDatabase::new(name, pool));
        }
        let set = DatabaseSet::new(set);
        let first = start(&control.db, &set, "budget-1").await;
        assert_eq!(first.databases(), ["a", "b", "m"]);
        let refused = first.refused();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].0, "c");
        assert!(
            refused[0].1.contains("budget of 7") && refused[0].1.contains("to 9"),
            "says why: {}",
            refused[0].1
        );
        let owns_all = eventually(Duration::from_secs(20), || async {
            first.owned().len() == 3
        })
        .await;
        assert!(
            owns_all,
            "the first instance owns what it serves: {:?}",
            first.owned()
        );
        let owners = first.owners().await.unwrap();
        assert!(owners.iter().all(|o| o.database != "c"), "{owners:?}");
        let body = handle.render();
        assert_eq!(
            server_gauge(&body, "outbox_fleet_server_connection_ceiling", "postgres"),
            Some(6.0),
            "{body}"
        );
        assert_eq!(
            server_gauge(&body, "outbox_fleet_server_connection_limit", "postgres"),
            Some(7.0),
            "{body}"
        );
        assert_eq!(
            server_gauge(&body, "outbox_fleet_server_connection_ceiling", "mysql"),
            Some(3.0),
            "{body}"
        );
        assert_eq!(
            labelled(&body, "outbox_fleet_database_refused", &[("database", "c")]),
            1.0,
            "{body}"
        );

        // A second instance: the databases the fleet serves stay served there too, the one
        // refused stays refused, and the servers' ceilings double.
        let second = start(&control.db, &set, "budget-2").await;
        assert_eq!(second.databases(), ["a", "b", "m"]);
        assert_eq!(second.refused().len(), 1);
        let doubled = eventually(Duration::from_secs(20), || async {
            server_gauge(
                &handle.render(),
                "outbox_fleet_server_connection_ceiling",
                "postgres",
            ) == Some(12.0)
        })
        .await;
        assert!(
            doubled,
            "the ceiling counts both instances: {}",
            handle.render()
        );
        let shared_out = eventually(Duration::from_secs(20), || async {
            first.owned().len() + second.owned().len() == 3 && !second.owned().is_empty()
        })
        .await;
        assert!(shared_out, "{:?} / {:?}", first.owned(), second.owned());

        // The second leaves and `b` leaves the set: `c` fits (3 + 3 on one instance) and joins.
        second.shutdown().await;
        assert!(set.remove("b"));
        let joined = eventually(Duration::from_secs(20), || async {
            first.databases() == ["a", "c", "m"] && first.owned().len() == 3
        })
        .await;
        assert!(
            joined,
            "c joined once it fit: {:?}, refused {:?}",
            first.databases(),
            first.refused()
        );
        assert!(first.refused().is_empty());
        let body = handle.render();
        assert_eq!(
            labelled(&body, "outbox_fleet_database_refused", &[("database", "c")]),
            0.0,
            "{body}"
        );
        assert_eq!(
            server_gauge(&body, "outbox_fleet_server_connection_ceiling", "postgres"),
            Some(6.0),
            "{body}"
        );
        first.shutdown().await;
    });
}
