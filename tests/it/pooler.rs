//! Behind a connection pooler that shares server sessions between clients (PgBouncer in
//! transaction mode, `scripts/pgbouncer`): the SDK tells such a pooler from a direct connection,
//! and its relay polls there instead of leaving a `LISTEN` on a server session that other
//! clients go on to use (whose statements would then receive the notifications).

use std::time::Duration;

use crate::common::carts::*;
use crate::common::*;
use outbox::prelude::*;
use outbox::relay::{Relay, RelayConfig};
use outbox::store::notify::sessions_shared;
use outbox::transport::memory::MemoryTransport;
use sea_orm::{ConnectionTrait, DbBackend, Statement};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_sharing_sessions_is_told_from_a_direct_connection() {
    let Some(t) = test_db(Backend::PgBouncer, "pooler_detect").await else {
        return;
    };
    let direct = connect(&with_database(&postgres_admin_url(), &t.name), 2)
        .await
        .unwrap();
    assert!(
        sessions_shared(t.db.get_postgres_connection_pool())
            .await
            .unwrap(),
        "through PgBouncer in transaction mode, sessions are shared"
    );
    assert!(
        !sessions_shared(direct.get_postgres_connection_pool())
            .await
            .unwrap(),
        "a direct connection has a session of its own"
    );
}

/// A relay configured to listen, behind the pooler: it polls, no server session is left
/// listening, and producers committing (each commit sends its `NOTIFY`) and a reader running
/// statements meanwhile see no stray notification; every event is published once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_behind_the_pooler_polls_instead_of_listening() {
    let Some(t) = test_db(Backend::PgBouncer, "pooler_relay").await else {
        return;
    };
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let relay = Relay::new(t.db.clone(), std::sync::Arc::new(transport.clone()))
        .with_config(
            RelayConfig::default()
                .poll_interval(Duration::from_millis(100))
                .listen(true),
        )
        .with_outbox(&outbox)
        .spawn();
    // Another process's producers: their commits notify, and only polling finds them.
    let elsewhere = Outbox::new("carts");
    let mut tasks = Vec::new();
    for producer in 0..4u32 {
        let (db, outbox) = (t.db.clone(), elsewhere.clone());
        tasks.push(tokio::spawn(async move {
            for seq in 0..50u32 {
                let tx = outbox.begin(&db).await.unwrap();
                tx.enqueue(&LineAdded {
                    cart: format!("cart-{producer}"),
                    seq,
                })
                .unwrap();
                let _ = tx.commit().await.unwrap();
            }
        }));
    }
    let reader = {
        let db = t.db.clone();
        tokio::spawn(async move {
            for _ in 0..300 {
                db.query_one_raw(Statement::from_string(
                    DbBackend::Postgres,
                    "SELECT COUNT(*) AS n FROM outbox_event",
                ))
                .await
                .unwrap();
            }
        })
    };
    for task in tasks {
        task.await.expect("a producer's statements all answered");
    }
    reader.await.expect("the reader's statements all answered");
    wait_all_sent(&t, 200, Duration::from_secs(60)).await;
    let admin = connect(&postgres_admin_url(), 1).await.unwrap();
    let listening = admin
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT COUNT(*) AS n FROM pg_stat_activity WHERE datname = $1 AND query ILIKE 'LISTEN%'",
            [t.name.clone().into()],
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get::<i64>("", "n")
        .unwrap();
    assert_eq!(listening, 0, "no server session left listening");
    relay.shutdown().await.unwrap();
    let order = stream_order(&transport);
    assert_strictly_increasing(&order, 50);
    assert_eq!(transport.messages().len(), 200, "each event published once");
}
