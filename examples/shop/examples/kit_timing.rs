//! How long a user's test takes with the test kit, against the same test written by polling
//! tables: commit an order, wait until `inventory` and `notification` have handled what it
//! cascades into, check the effects. Medians of several runs, on SQLite in memory and on
//! PostgreSQL (`OUTBOX_TEST_POSTGRES_URL`, default the local server), in the build profile it is
//! run with (`cargo run -p shop --example kit_timing`, a debug build like `cargo test`'s).
//!
//! - **kit**: `TestDb` (SQLite in memory, or a fresh PostgreSQL schema), the runtime with
//!   `testing::relay_config()`/`inbox_config()`, `Session::quiet`.
//! - **polling**: what a test did before the kit: a database of its own (SQLite in memory, or a
//!   `CREATE DATABASE` on PostgreSQL), migrated, the runtime with the intervals the quick start
//!   uses (100 ms), and a loop that counts settled inbox rows every 50 ms.

use std::time::{Duration, Instant};

use outbox::prelude::*;
use outbox::relay::RelayConfig;
use outbox::sea_orm::{ConnectOptions, Database, DatabaseConnection, Statement};
use outbox::testing::{self, Session, TestDb};
use shop::OrderPlaced;

const RUNS: usize = 15;

fn order() -> OrderPlaced {
    OrderPlaced {
        order_id: 1,
        customer: "ada".into(),
        sku: "kettle".into(),
        quantity: 2,
    }
}

async fn check(db: &DatabaseConnection) {
    assert_eq!(shop::available(db, "kettle").await.unwrap(), 8);
    assert_eq!(shop::notices(db).await.unwrap().len(), 1);
}

async fn with_kit(postgres: Option<&str>) -> Duration {
    let started = Instant::now();
    let db = match postgres {
        Some(url) => TestDb::postgres(url).await.unwrap(),
        None => TestDb::sqlite().await.unwrap(),
    };
    if std::env::var("KIT_TIMING_VERBOSE").is_ok() {
        eprintln!("TestDb ready in {:?}", started.elapsed());
    }
    shop::create_tables(&db).await.unwrap();
    shop::add_stock(&db, "kettle", 10).await.unwrap();
    let runtime = Runtime::builder(db.conn().clone())
        .source("shop")
        .relay_config(testing::relay_config())
        .inbox_config(testing::inbox_config())
        .start()
        .await
        .unwrap();
    let session = Session::start(&db).await.unwrap().runtime(&runtime);
    shop::place_order(runtime.outbox(), &db, &order())
        .await
        .unwrap();
    session.quiet(Duration::from_secs(30)).await.unwrap();
    check(&db).await;
    runtime.shutdown().await;
    let took = started.elapsed();
    db.cleanup().await.unwrap();
    took
}

async fn count(db: &DatabaseConnection, sql: &str) -> i64 {
    db.query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await
        .unwrap()
        .unwrap()
        .try_get_by_index::<i64>(0)
        .unwrap()
}

/// The database the polling runs use on PostgreSQL, one run after another.
const POLLING_DB: &str = "shop_kit_timing_polling";
const DROP_POLLING_DB: &str = "DROP DATABASE IF EXISTS shop_kit_timing_polling WITH (FORCE)";
const CREATE_POLLING_DB: &str = "CREATE DATABASE shop_kit_timing_polling";

async fn by_polling(postgres: Option<&str>) -> Duration {
    let started = Instant::now();
    let (db, admin) = match postgres {
        Some(url) => {
            let admin = Database::connect(url).await.unwrap();
            admin.execute_unprepared(DROP_POLLING_DB).await.unwrap();
            admin.execute_unprepared(CREATE_POLLING_DB).await.unwrap();
            let base = url.rsplit_once('/').map_or(url, |(base, _)| base);
            let db = Database::connect(format!("{base}/{POLLING_DB}"))
                .await
                .unwrap();
            (db, Some(admin))
        }
        None => {
            let mut options = ConnectOptions::new("sqlite::memory:");
            options.max_connections(1);
            (Database::connect(options).await.unwrap(), None)
        }
    };
    outbox::migrate(&db).await.unwrap();
    shop::create_tables(&db).await.unwrap();
    shop::add_stock(&db, "kettle", 10).await.unwrap();
    let runtime = Runtime::builder(db.clone())
        .source("shop")
        .relay_config(RelayConfig::default().poll_interval(Duration::from_millis(100)))
        .inbox_config(
            outbox::inbox::InboxConfig::default().poll_interval(Duration::from_millis(100)),
        )
        .start()
        .await
        .unwrap();
    shop::place_order(runtime.outbox(), &db, &order())
        .await
        .unwrap();
    let settled = "SELECT COUNT(*) FROM inbox_event WHERE status IN ('DONE', 'DEAD')";
    let settled_done = "SELECT (SELECT COUNT(*) FROM inbox_event WHERE status IN ('DONE', 'DEAD')) \
         + (SELECT COUNT(*) FROM inbox_done)";
    let sql = if postgres.is_some() {
        settled_done
    } else {
        settled
    };
    while count(&db, sql).await < 2 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check(&db).await;
    runtime.shutdown().await;
    let took = started.elapsed();
    db.close().await.ok();
    if let Some(admin) = admin {
        admin.execute_unprepared(DROP_POLLING_DB).await.unwrap();
    }
    took
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let url = std::env::var("OUTBOX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    println!("a test that commits an order and waits for two consumers, median of {RUNS} runs");
    println!(
        "{:<22} {:>12} {:>12} {:>8}",
        "database", "kit", "polling", "ratio"
    );
    for (name, postgres) in [
        ("SQLite in memory", None),
        ("PostgreSQL", Some(url.as_str())),
    ] {
        let (mut kit, mut polling) = (Vec::new(), Vec::new());
        for _ in 0..RUNS {
            kit.push(with_kit(postgres).await);
            polling.push(by_polling(postgres).await);
        }
        let (k, p) = (median(kit), median(polling));
        println!(
            "{name:<22} {:>9.1} ms {:>9.1} ms {:>7.2}x",
            k.as_secs_f64() * 1e3,
            p.as_secs_f64() * 1e3,
            p.as_secs_f64() / k.as_secs_f64()
        );
    }
}
