//! The runtime's liveness and readiness probes, served by `health::router` and asked over HTTP:
//! a broker outage keeps the pod ready (the breaker's state reported), a database outage takes
//! it out of readiness but never fails liveness, and a stuck loop fails liveness.

use std::time::Duration;

use crate::common::http::{self as web, client, send, serve};
use crate::common::*;
use outbox::health::Probes;
use outbox::prelude::*;
use outbox::relay::RelayConfig;
use outbox::transport::memory::MemoryTransport;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "health.job_queued", aggregate = "job")]
struct JobQueued {
    #[event(aggregate_id)]
    job: i64,
}

/// A handler that never returns: its worker's round never ends.
#[inbox_handler(consumer = "t-health-stall", mode = "stored")]
async fn stall(_tx: &InboxTransaction, _event: Event<JobQueued>) -> Result<(), HandlerError> {
    tokio::time::sleep(Duration::from_secs(3_600)).await;
    Ok(())
}

/// `GET path` on the probes' router: the status code and the JSON body.
async fn probe(base: &str, path: &str) -> (u16, Value) {
    let answer = send(
        &client(),
        hyper::Method::GET,
        &format!("{base}{path}"),
        &hyper::HeaderMap::new(),
        Vec::new(),
    )
    .await
    .unwrap();
    let body = serde_json::from_str(&answer.body)
        .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {}", answer.body));
    (answer.status.as_u16(), body)
}

fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name}: {report}"))
}

async fn served(probes: Probes) -> (String, tokio::task::JoinHandle<()>) {
    let (addr, task) = serve(outbox::health::router(probes)).await;
    (format!("http://{addr}"), task)
}

async fn commit(db: &outbox::sea_orm::DatabaseConnection, outbox: &Outbox, job: i64) {
    let tx = outbox.begin(db).await.unwrap();
    tx.enqueue(&JobQueued { job }).unwrap();
    assert_eq!(tx.commit().await.unwrap().written, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_keeps_the_pod_ready_and_alive() {
    let Some(t) = test_db(Backend::SqliteMemory, "health_broker").await else {
        return;
    };
    let broker = MemoryTransport::new();
    let runtime = Runtime::builder(t.db.clone())
        .source("health")
        .consumers(Vec::<String>::new())
        .transport(broker.clone())
        .relay_config(RelayConfig::default().poll_interval(Duration::from_millis(20)))
        .start()
        .await
        .unwrap();
    let (base, server) = served(runtime.probes()).await;
    let (status, ready) = probe(&base, "/readyz").await;
    assert_eq!(
        (status, &ready["status"]),
        (200, &Value::from("pass")),
        "{ready}"
    );
    assert_eq!(check(&ready, "broker")["status"], "pass");

    broker.set_unavailable(true);
    commit(&t.db, runtime.outbox(), 1).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !runtime.relay_stats().unwrap().broker_unavailable {
        assert!(
            std::time::Instant::now() < deadline,
            "the breaker never opened"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, ready) = probe(&base, "/readyz").await;
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["status"], "warn", "{ready}");
    let broker_check = check(&ready, "broker");
    assert_eq!(broker_check["status"], "warn");
    assert!(
        broker_check["detail"]
            .as_str()
            .unwrap()
            .contains("breaker is open"),
        "{ready}"
    );
    let (status, live) = probe(&base, "/livez").await;
    assert_eq!(status, 200, "{live}");
    assert_ne!(live["status"], "fail", "{live}");

    broker.set_unavailable(false);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while runtime.relay_stats().unwrap().broker_unavailable {
        assert!(
            std::time::Instant::now() < deadline,
            "the breaker never closed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        check(&probe(&base, "/readyz").await.1, "broker")["status"],
        "pass"
    );
    server.abort();
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_takes_the_pod_out_of_readiness_but_never_restarts_it() {
    let Some(t) = test_db(Backend::Postgres, "health_database").await else {
        return;
    };
    let proxy = web::Proxy::start(web::server_of(&t.url)).await;
    let db = connect(&web::through(&t.url, proxy.addr), 4).await.unwrap();
    let runtime = Runtime::builder(db)
        .source("health")
        .consumers(Vec::<String>::new())
        .relay_config(RelayConfig::default().poll_interval(Duration::from_millis(50)))
        .start()
        .await
        .unwrap();
    let probes = runtime
        .probes()
        .database_timeout(Duration::from_millis(500));
    let (base, server) = served(probes).await;
    assert_eq!(probe(&base, "/readyz").await.0, 200);

    proxy.down();
    let (status, ready) = probe(&base, "/readyz").await;
    assert_eq!(status, 503, "{ready}");
    assert_eq!(check(&ready, "database")["status"], "fail", "{ready}");
    // Nothing of the error's text is served.
    assert!(
        !ready.to_string().contains(&proxy.addr.to_string()),
        "{ready}"
    );
    // Loops that fail their rounds meanwhile are degraded, not dead: liveness holds.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, live) = probe(&base, "/livez").await;
    assert_eq!(status, 200, "{live}");

    proxy.up();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, ready) = probe(&base, "/readyz").await;
        if status == 200 {
            assert_eq!(check(&ready, "database")["status"], "pass");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never ready again: {ready}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.abort();
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_loop_fails_liveness_and_readiness() {
    // On PostgreSQL: on SQLite the stalled handler's transaction holds the database's one write
    // lock, and every loop that writes waits behind it.
    let Some(t) = test_db(Backend::Postgres, "health_stuck").await else {
        return;
    };
    let runtime = Runtime::builder(t.db.clone())
        .source("health")
        .consumers(["t-health-stall"])
        .relay_config(RelayConfig::default().poll_interval(Duration::from_millis(20)))
        .inbox_config(
            outbox::inbox::InboxConfig::default().poll_interval(Duration::from_millis(20)),
        )
        .start()
        .await
        .unwrap();
    let probes = runtime.probes().stuck_after(Duration::from_secs(2));
    let (base, server) = served(probes).await;
    let (status, live) = probe(&base, "/livez").await;
    assert_eq!(
        (status, &live["status"]),
        (200, &Value::from("pass")),
        "{live}"
    );

    // The job reaches the worker, whose handler never returns.
    commit(&t.db, runtime.outbox(), 7).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let live = loop {
        let (status, live) = probe(&base, "/livez").await;
        if status == 503 {
            break live;
        }
        assert!(std::time::Instant::now() < deadline, "never failed: {live}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let worker = check(&live, "loop:worker:t-health-stall");
    assert_eq!(worker["status"], "fail", "{live}");
    assert!(
        worker["detail"]
            .as_str()
            .unwrap()
            .starts_with("no round ended for"),
        "{live}"
    );
    // The other loops keep running (asked again if a loaded machine held the relay's round back).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut live = live;
    while check(&live, "loop:relay")["status"] == "fail" {
        assert!(
            std::time::Instant::now() < deadline,
            "the relay looks stuck too: {live}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        live = probe(&base, "/livez").await.1;
    }
    assert_eq!(
        check(&live, "loop:worker:t-health-stall")["status"],
        "fail",
        "{live}"
    );
    let (status, ready) = probe(&base, "/readyz").await;
    assert_eq!(status, 503, "{ready}");
    server.abort();
    drop(runtime);
}

/// A WAL relay's reader shows in readiness: `pass` while it streams; once its slot is gone it
/// polls the table, reported as a `warn`, and the pod stays ready (the claim loop publishes).
#[cfg(feature = "postgres-wal")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_readers_state_is_in_readiness() {
    let Some(t) = logical_test_db("health_wal").await else {
        return;
    };
    let slot = "outbox_health_wal";
    let runtime = Runtime::builder(t.db.clone())
        .source("health")
        .consumers(Vec::<String>::new())
        .transport(MemoryTransport::new())
        .relay_config(
            RelayConfig::default()
                .listen(false)
                .poll_interval(Duration::from_millis(100)),
        )
        .wal(outbox::relay::WalConfig::new(t.url.clone()).slot(slot))
        .start()
        .await
        .unwrap();
    let (base, server) = served(runtime.probes()).await;
    let streaming = eventually(Duration::from_secs(20), || async {
        check(&probe(&base, "/readyz").await.1, "wal")["status"] == "pass"
    })
    .await;
    assert!(streaming, "{}", probe(&base, "/readyz").await.1);
    assert_eq!(
        runtime.relay_stats().unwrap().wal,
        outbox::relay::WalReader::Streaming
    );

    // The slot goes (an operator dropped it): the relay cannot stream again.
    outbox::store::wal::drop_slot(&t.db, slot, true)
        .await
        .unwrap();
    let polling = eventually(Duration::from_secs(30), || async {
        runtime.relay_stats().unwrap().wal == outbox::relay::WalReader::Polling
    })
    .await;
    assert!(polling, "{:?}", runtime.relay_stats());
    let (status, ready) = probe(&base, "/readyz").await;
    assert_eq!(status, 200, "{ready}");
    let wal = check(&ready, "wal");
    assert_eq!(wal["status"], "warn", "{ready}");
    assert!(
        wal["detail"].as_str().unwrap().contains("polls the table"),
        "{ready}"
    );
    // Still published, from the table.
    commit(&t.db, runtime.outbox(), 7).await;
    let sent = eventually(Duration::from_secs(20), || async {
        outbox_rows(&t.db).await.iter().all(|r| r.status == "SENT")
    })
    .await;
    assert!(sent, "{:?}", outbox_rows(&t.db).await);
    server.abort();
    runtime.shutdown().await;
    // The relay did not create it again while polling; nothing is left to keep the WAL.
    assert!(
        outbox::store::wal::slot(&t.db, slot)
            .await
            .unwrap()
            .is_none()
    );
}
