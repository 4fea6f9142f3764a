//! The metrics a Prometheus server would scrape, from a running runtime: the series exist and
//! move as events are written, published and handled. The exporter's recorder is the test's
//! own, set on every thread of the test's tokio runtime, so the counters hold this test's events
//! only, not those of the other tests in the process.

use std::time::Duration;

use crate::common::carts::*;
use crate::common::*;
use outbox::inbox::InboxConfig;
use outbox::prelude::*;
use outbox::relay::RelayConfig;
use outbox::runtime::Runtime;
use sea_orm::{ConnectionTrait, TransactionTrait};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[inbox_handler(consumer = "t-metrics", backoff = "10ms")]
async fn handle(tx: &InboxTransaction, event: Event<LineAdded>) -> Result<(), HandlerError> {
    if event.seq == 0 && event.meta().attempt == 1 {
        return Err(HandlerError::retry("first attempt of the first line fails"));
    }
    record_line(tx, &event).await
}

async fn scrape(port: u16) -> String {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}

/// The value of the first sample whose line starts with `series` (name plus labels).
fn value(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A Prometheus exporter listening on `port`, serving from a thread of its own, as
/// `PrometheusBuilder::install` starts one, but with its recorder returned instead of installed
/// for the whole process.
fn exporter(port: u16) -> &'static metrics_exporter_prometheus::PrometheusRecorder {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (recorder, exporter) = {
        let _entered = runtime.enter();
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(([127, 0, 0, 1], port))
            .build()
            .expect("a Prometheus exporter")
    };
    std::thread::spawn(move || runtime.block_on(exporter));
    Box::leak(Box::new(recorder))
}

#[test]
fn prometheus_scrape_shows_the_series_moving() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let recorder = exporter(port);
    // Each thread keeps the recorder until it ends; the recorder is never freed.
    on_own_runtime(
        move || std::mem::forget(metrics::set_default_local_recorder(recorder)),
        scrape_while_running(port),
    );
}

async fn scrape_while_running(port: u16) {
    let Some(t) = test_db(Backend::SqliteFile, "metrics_scrape").await else {
        return;
    };
    let runtime = Runtime::builder(t.db.clone())
        .source("carts")
        .consumers(["t-metrics"])
        .metrics_interval(Some(Duration::from_millis(100)))
        .relay_config(RelayConfig::default().poll_interval(Duration::from_millis(50)))
        .inbox_config(InboxConfig::default().poll_interval(Duration::from_millis(50)))
        .start()
        .await
        .unwrap();
    let outbox = runtime.outbox().clone();
    let first = produce(&t, &outbox, 5, 2, 10).await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            effects(&t.db).await.len() == first
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(300)).await; // a gauge sample after the work
    let before = scrape(port).await;

    assert_eq!(
        value(&before, "outbox_events_written_total"),
        Some(first as f64),
        "{before}"
    );
    assert_eq!(
        value(
            &before,
            "outbox_events_published_total{transport=\"database-local\"}"
        ),
        Some(first as f64)
    );
    assert_eq!(
        value(
            &before,
            "inbox_messages_total{consumer=\"t-metrics\",outcome=\"handled\"}"
        ),
        Some(first as f64)
    );
    assert_eq!(
        value(
            &before,
            "inbox_messages_total{consumer=\"t-metrics\",outcome=\"retried\"}"
        ),
        Some(5.0),
        "the five seq-0 lines failed once"
    );
    assert!(
        before.contains("inbox_handler_duration_seconds"),
        "{before}"
    );
    assert_eq!(
        value(&before, "outbox_backlog_events{status=\"PENDING\"}"),
        Some(0.0)
    );
    assert!(before.contains("outbox_oldest_pending_age_seconds"));
    assert!(
        before.contains("# HELP outbox_events_written_total"),
        "the runtime describes its metrics to the recorder in effect: {before}"
    );

    // More work moves the counters.
    let second = produce(&t, &outbox, 3, 1, 10).await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            effects(&t.db).await.len() == first + second
        })
        .await
    );
    let after = scrape(port).await;
    runtime.shutdown().await;
    assert_eq!(
        value(&after, "outbox_events_written_total"),
        Some((first + second) as f64)
    );
    assert_eq!(
        value(
            &after,
            "inbox_messages_total{consumer=\"t-metrics\",outcome=\"handled\"}"
        ),
        Some((first + second) as f64)
    );
}

/// Run `body` on a tokio runtime of its own whose threads record into a fresh Prometheus recorder;
/// `body` gets the handle that renders what was recorded.
pub(crate) fn recorded<F: std::future::Future<Output = ()>>(
    body: impl FnOnce(metrics_exporter_prometheus::PrometheusHandle) -> F,
) {
    let recorder: &'static metrics_exporter_prometheus::PrometheusRecorder = Box::leak(Box::new(
        metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder(),
    ));
    let handle = recorder.handle();
    on_own_runtime(
        move || std::mem::forget(metrics::set_default_local_recorder(recorder)),
        body(handle),
    );
}

/// The storage gauges, sampled on PostgreSQL: the queue tables' bytes and rows, and how long the
/// oldest snapshot has been held (a report's transaction left open).
#[test]
fn storage_gauges_show_the_tables_and_the_held_horizon() {
    recorded(|handle| async move {
        let Some(t) = test_db(Backend::Postgres, "metrics_storage").await else {
            return;
        };
        let report_query = t.connect_again().await;
        let held = report_query
            .begin_with_config(Some(sea_orm::IsolationLevel::RepeatableRead), None)
            .await
            .unwrap();
        held.execute_unprepared("SELECT COUNT(*) FROM outbox_event")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        outbox::metrics::sample(&t.db).await.unwrap();
        let body = handle.render();
        let bytes = value(&body, "outbox_table_bytes{table=\"outbox_event\"}");
        assert!(bytes.is_some_and(|b| b > 0.0), "{body}");
        assert!(
            value(&body, "outbox_table_dead_rows{table=\"inbox_event\"}").is_some(),
            "{body}"
        );
        let held_for = value(&body, "outbox_xmin_horizon_age_seconds").unwrap_or(0.0);
        assert!(held_for >= 1.0, "{body}");

        held.commit().await.unwrap();
        outbox::metrics::sample(&t.db).await.unwrap();
        let body = handle.render();
        let held_for = value(&body, "outbox_xmin_horizon_age_seconds").unwrap_or(f64::MAX);
        assert!(held_for < 1.0, "{body}");
    });
}

/// Each claim of the claim loop is timed (`outbox_relay_claim_duration_seconds`), whether it
/// found events or not: the figure that grows first when the queue's scans slow down.
#[test]
fn the_claim_loop_reports_its_claim_time() {
    recorded(|handle| async move {
        let Some(t) = test_db(Backend::SqliteFile, "metrics_claim_time").await else {
            return;
        };
        let transport = outbox::transport::memory::MemoryTransport::new();
        let relay = outbox::relay::Relay::new(t.db.clone(), std::sync::Arc::new(transport));
        let outbox = Outbox::new("carts");
        let tx = outbox.begin(&t.db).await.unwrap();
        for seq in 0..3 {
            tx.enqueue(&LineAdded {
                cart: "c-claim".into(),
                seq,
            })
            .unwrap();
        }
        let _ = tx.commit().await.unwrap();
        let first = relay.run_once().await.unwrap();
        let second = relay.run_once().await.unwrap();
        assert_eq!((first.sent, second.claimed), (3, 0), "{first:?} {second:?}");
        let body = handle.render();
        let count = "outbox_relay_claim_duration_seconds_count{transport=\"memory\"}";
        assert_eq!(value(&body, count), Some(2.0), "{body}");
        let sum = value(
            &body,
            "outbox_relay_claim_duration_seconds_sum{transport=\"memory\"}",
        );
        assert!(sum.is_some_and(|s| s > 0.0), "{body}");
    });
}

#[inbox_handler(consumer = "t-metrics-otel")]
async fn handle_conventions(
    tx: &InboxTransaction,
    event: Event<LineAdded>,
) -> Result<(), HandlerError> {
    record_line(tx, &event).await
}

/// Beside the SDK's series, OpenTelemetry's messaging metrics are recorded under their names
/// (a Prometheus exporter writes the dots as underscores), with the broker's system, the
/// destination and the consumer group; and each handled event's time from its producer's commit
/// to its handler's commit, per consumer.
#[cfg(feature = "nats")]
#[test]
fn the_conventions_metrics_and_the_end_to_end_time_are_recorded() {
    recorded(|handle| async move {
        let Some(t) = test_db(Backend::SqliteFile, "metrics_conventions").await else {
            return;
        };
        let Some(nats) = crate::common::nats::transport("metrics_conventions").await else {
            return;
        };
        let destination = outbox::transport::Transport::routing(&nats.0)
            .unwrap()
            .address(LineAdded::EVENT_TYPE, LineAdded::AGGREGATE_TYPE);
        let runtime = Runtime::builder(t.db.clone())
            .source("carts")
            .transport(nats.0.clone())
            .consumers(["t-metrics-otel"])
            .start()
            .await
            .unwrap();
        commit_lines(
            runtime.outbox().begin(&t.db).await.unwrap(),
            &[("c-otel", 0), ("c-otel", 1), ("c-otel", 2)],
        )
        .await;
        assert!(
            eventually(Duration::from_secs(30), || async {
                effects(&t.db).await.len() == 3
            })
            .await
        );
        runtime.shutdown().await;
        let body = handle.render();
        let sent = format!(
            "messaging_client_sent_messages{{messaging_system=\"nats\",\
             messaging_operation_name=\"send\",messaging_destination_name=\"{destination}\"}}"
        );
        assert_eq!(value(&body, &sent), Some(3.0), "{body}");
        let consumed = "messaging_client_consumed_messages{messaging_system=\"nats\",\
             messaging_operation_name=\"receive\",messaging_consumer_group_name=\"t-metrics-otel\"}";
        assert_eq!(value(&body, consumed), Some(3.0), "{body}");
        let processed = "messaging_process_duration_count{messaging_system=\"nats\",\
             messaging_operation_name=\"process\",messaging_consumer_group_name=\"t-metrics-otel\"}";
        assert_eq!(value(&body, processed), Some(3.0), "{body}");
        assert!(
            value(
                &body,
                "messaging_client_operation_duration_count{messaging_system=\"nats\""
            )
            .is_some_and(|calls| calls >= 1.0),
            "{body}"
        );
        let end_to_end = "inbox_end_to_end_seconds_count{consumer=\"t-metrics-otel\"}";
        assert_eq!(value(&body, end_to_end), Some(3.0), "{body}");
        let slowest = value(
            &body,
            "inbox_end_to_end_seconds{consumer=\"t-metrics-otel\",quantile=\"1\"}",
        );
        assert!(
            slowest.is_some_and(|s| s > 0.0 && s < 30.0),
            "the end-to-end time is the seconds between commit and handling: {body}"
        );
    });
}

#[inbox_handler(consumer = "t-metrics-fleet")]
async fn handle_fleet(tx: &InboxTransaction, event: Event<LineAdded>) -> Result<(), HandlerError> {
    record_line(tx, &event).await
}

/// The sum of the samples of `name` whose labels include every one of `labels`.
pub(crate) fn labelled(body: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Over a set of databases, the relay's and the consumers' series carry the database's name:
/// two tenant databases, events in each, counted apart.
#[test]
fn a_fleets_series_carry_the_database() {
    recorded(|handle| async move {
        let (Some(control), Some(acme), Some(globex)) = (
            test_db(Backend::SqliteFile, "metrics_fleet_control").await,
            test_db(Backend::SqliteFile, "metrics_fleet_acme").await,
            test_db(Backend::SqliteFile, "metrics_fleet_globex").await,
        ) else {
            return;
        };
        let fleet = Runtime::builder(control.db.clone())
            .source("metrics-fleet")
            .transport(outbox::transport::memory::MemoryTransport::new())
            .consumers(["t-metrics-fleet"])
            .relay_config(RelayConfig::default().poll_interval(Duration::from_millis(50)))
            .metrics_interval(None)
            .databases(vec![
                outbox::fleet::FleetDatabase::new("acme", acme.db.clone()),
                outbox::fleet::FleetDatabase::new("globex", globex.db.clone()),
            ])
            .start()
            .await
            .unwrap();
        for (t, name, n) in [(&acme, "acme", 3), (&globex, "globex", 2)] {
            let outbox = fleet.outbox(name).expect("served");
            let tx = outbox.begin(&t.db).await.unwrap();
            for seq in 0..n {
                tx.enqueue(&LineAdded {
                    cart: format!("{name}-cart"),
                    seq,
                })
                .unwrap();
            }
            let _ = tx.commit().await.unwrap();
        }
        let handled = |name: &str| {
            let labels = [
                ("consumer", "t-metrics-fleet"),
                ("outcome", "handled"),
                ("database", name),
            ];
            labelled(&handle.render(), "inbox_messages_total", &labels)
        };
        let both = eventually(Duration::from_secs(30), || async {
            handled("acme") == 3.0 && handled("globex") == 2.0
        })
        .await;
        let body = handle.render();
        assert!(both, "handled per database: {body}");
        for (name, n) in [("acme", 3.0), ("globex", 2.0)] {
            let published = labelled(
                &body,
                "outbox_events_published_total",
                &[("transport", "memory"), ("database", name)],
            );
            assert_eq!(published, n, "{name} published: {body}");
        }
        assert_eq!(
            labelled(&body, "inbox_messages_total", &[("outcome", "handled")]),
            5.0,
            "no series without the database: {body}"
        );
        fleet.shutdown().await;
    });
}
