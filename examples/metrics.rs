//! Serve the SDK's metrics on `/metrics` for Prometheus while orders flow.
//!
//! ```sh
//! cargo run --example metrics            # then: curl http://127.0.0.1:9464/metrics
//! ```
//!
//! `METRICS_ADDR` (default `127.0.0.1:9464`) sets the listen address, `RUN_SECONDS` (default 10)
//! how long to run. An order service and a consumer share a SQLite file; every second a few
//! orders commit, and the counters, the publish lag and handler duration histograms, and the
//! backlog gauges move.

use std::{net::SocketAddr, time::Duration};

use outbox::prelude::*;
use outbox::sea_orm::Database;
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", aggregate = "order")]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: u64,
}

#[inbox_handler(consumer = "metrics-example")]
async fn handle(_tx: &InboxTransaction, event: Event<OrderPlaced>) -> Result<(), HandlerError> {
    if event.order_id.is_multiple_of(7) && event.meta().attempt == 1 {
        return Err(HandlerError::retry("every seventh order fails once"));
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr: SocketAddr = std::env::var("METRICS_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:9464".into())
        .parse()?;
    let seconds: u64 = std::env::var("RUN_SECONDS").map_or(Ok(10), |s| s.parse())?;
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()?;

    let path = std::env::temp_dir().join("outbox-metrics-example.db");
    let _ = std::fs::remove_file(&path);
    let db = Database::connect(format!("sqlite://{}?mode=rwc", path.display())).await?;
    outbox::migrate(&db).await?;
    let runtime = Runtime::builder(db.clone())
        .source("order-service")
        .metrics_interval(Some(Duration::from_secs(1)))
        .start()
        .await?;
    println!("serving metrics on http://{addr}/metrics for {seconds} s");
    let mut order_id = 0;
    for _ in 0..seconds {
        let tx = runtime.outbox().begin(&db).await?;
        for _ in 0..5 {
            order_id += 1;
            tx.enqueue(&OrderPlaced { order_id })?;
        }
        let _ = tx.commit().await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let report = runtime.shutdown().await;
    println!("{report:#?}");
    Ok(())
}
