//! Outages, end to end through the runtime (relay, dispatcher, worker) on PostgreSQL, while a
//! producer commits events without pause:
//!
//! - a broker of the test's own (NATS, RabbitMQ, Redis) is killed like a crash (SIGKILL), stays
//!   down for 20 s while commits go on, and is started again on the same data;
//! - the PostgreSQL connections of the relay and the consumer are terminated with
//!   `pg_terminate_backend`, ten times over a few seconds.
//!
//! Each time every committed event must end with exactly one effect row, nothing may stay
//! PENDING, PROCESSING or RETRY, the runtime must be healthy again, and the outage must be
//! visible: in the metrics, the runtime's report and the loops' health. A broker outage is
//! nobody's message's fault: it lasts far longer than the relay's (shrunk) retry budget, yet no
//! attempt is spent and nothing goes DEAD; the relay stops claiming while the broker is away
//! (its breaker is open) and drains the backlog once it is back, in seconds (the figure is
//! printed). Per-aggregate order of the effects is asserted too.
//!
//! Each test runs on a tokio runtime of its own whose threads record metrics into a Prometheus
//! recorder of the test's own, so the tests run in parallel without mixing their counters.

use std::{
    collections::{BTreeMap, HashMap},
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crate::common::carts::{LineAdded, record_line};
use crate::common::own_server::{Broker, OwnServer};
use crate::common::workload::{
    CARTS, Producer, SETTLE, assert_everything_handled_once, count_effects, inbox_config,
    loops_summary, relay_config, retry_budget, wait_for_effects, wait_subscribed,
};
use crate::common::*;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use outbox::prelude::*;
use outbox::runtime::{Runtime, RuntimeReport};
use outbox::transport::Transport;
use sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement,
};

/// The relay's poll interval where commits reach it only through LISTEN/NOTIFY.
const POLL_WITHOUT_NOTIFY: Duration = Duration::from_secs(5);
/// How long a broker stays down.
const OUTAGE: Duration = Duration::from_secs(20);
/// How long a publish waits for the broker's confirmation.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(1);

// One consumer per test, each writing one effect row per handled event.
#[inbox_handler(consumer = "outage-nats", backoff = "50ms", backoff_cap = "1s")]
async fn outage_nats(tx: &InboxTransaction, event: Event<LineAdded>) -> Result<(), HandlerError> {
    record_line(tx, &event).await
}

#[inbox_handler(consumer = "outage-rabbitmq", backoff = "50ms", backoff_cap = "1s")]
async fn outage_rabbitmq(
    tx: &InboxTransaction,
    event: Event<LineAdded>,
) -> Result<(), HandlerError> {
    record_line(tx, &event).await
}

#[cfg(feature = "kafka")]
#[inbox_handler(consumer = "outage-kafka", backoff = "50ms", backoff_cap = "1s")]
async fn outage_kafka(tx: &InboxTransaction, event: Event<LineAdded>) -> Result<(), HandlerError> {
    record_line(tx, &event).await
}

#[cfg(feature = "kafka")]
#[inbox_handler(consumer = "outage-kafka-killed", backoff = "50ms", backoff_cap = "1s")]
async fn outage_kafka_killed(
    tx: &InboxTransaction,
    event: Event<LineAdded>,
) -> Result<(), HandlerError> {
    record_line(tx, &event).await
}

#[inbox_handler(consumer = "outage-redis", backoff = "50ms", backoff_cap = "1s")]
async fn outage_redis(tx: &InboxTransaction, event: Event<LineAdded>) -> Result<(), HandlerError> {
    record_line(tx, &event).await
}

/// Holds its connection a little longer (as real handlers do), so that terminations hit
/// handlers in flight and not only idle connections.
#[inbox_handler(consumer = "pg-kill", backoff = "50ms", backoff_cap = "1s")]
async fn pg_kill(tx: &InboxTransaction, event: Event<LineAdded>) -> Result<(), HandlerError> {
    record_line(tx, &event).await?;
    tx.execute_unprepared("SELECT pg_sleep(0.05)").await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Metrics of the test's own.

/// Run `scenario` on a tokio runtime of its own whose threads all record into a fresh
/// Prometheus recorder (a thread-local default recorder, set on every runtime thread).
fn with_own_metrics<F, Fut>(scenario: F)
where
    F: FnOnce(Metrics) -> Fut,
    Fut: Future<Output = ()>,
{
    let recorder: &'static PrometheusRecorder =
        Box::leak(Box::new(PrometheusBuilder::new().build_recorder()));
    let metrics = Metrics(recorder.handle());
    // The thread keeps the recorder until it ends; the recorder is never freed.
    on_own_runtime(
        move || std::mem::forget(metrics::set_default_local_recorder(recorder)),
        scenario(metrics),
    );
}

#[derive(Clone)]
struct Metrics(PrometheusHandle);

impl Metrics {
    /// Every sample as `name{labels}` → value.
    fn samples(&self) -> HashMap<String, f64> {
        self.0
            .render()
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                Some((series.to_owned(), value.parse().ok()?))
            })
            .collect()
    }

    /// One series' value, 0 if it was never recorded.
    fn value(&self, series: &str) -> f64 {
        self.samples().get(series).copied().unwrap_or(0.0)
    }
}

// ---------------------------------------------------------------------------------------------
// The workload.

async fn count(db: &DatabaseConnection, sql: &str) -> i64 {
    scalar_i64(db, sql).await
}

// ---------------------------------------------------------------------------------------------
// A broker killed for 20 s.

async fn connect(broker: Broker, url: String) -> Arc<dyn Transport> {
    match broker {
        #[cfg(not(feature = "kafka"))]
        Broker::Kafka => unreachable!("Kafka tests need the `kafka` feature"),
        #[cfg(feature = "kafka")]
        Broker::Kafka => Arc::new(
            outbox::transport::kafka::KafkaTransport::builder(url)
                .namespace("outages")
                .partitions(3)
                .publish_timeout(PUBLISH_TIMEOUT)
                .request_timeout(PUBLISH_TIMEOUT)
                .session_timeout(Duration::from_secs(3))
                .connect()
                .await
                .unwrap(),
        ),
        Broker::Nats => Arc::new(
            outbox::transport::nats::NatsTransport::builder(url)
                .namespace("outages")
                .publish_timeout(PUBLISH_TIMEOUT)
                .connect()
                .await
                .unwrap(),
        ),
        Broker::RabbitMq => Arc::new(
            outbox::transport::rabbitmq::RabbitMqTransport::builder(url)
                .namespace("outages")
                .publish_timeout(PUBLISH_TIMEOUT)
                // A reconnect inside a publish may not hold the relay up for longer.
                .connection_timeout(PUBLISH_TIMEOUT)
                .connect()
                .await
                .unwrap(),
        ),
        Broker::Redis => Arc::new(
            outbox::transport::redis::RedisTransport::builder(url)
                .namespace("outages")
                .publish_timeout(PUBLISH_TIMEOUT)
                .claim_idle(Duration::from_secs(2))
                .connect()
                .await
                .unwrap(),
        ),
    }
}

/// The database's clock, in seconds since the epoch.
async fn db_now(db: &DatabaseConnection) -> f64 {
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT extract(epoch FROM clock_timestamp())::float8 AS now",
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get("", "now").unwrap()
}

/// Print when `what` happened, by the database's clock in seconds from `since`, so that it lines
/// up with the [`timeline`] of a failure.
async fn mark(db: &DatabaseConnection, test: &str, since: f64, what: &str) {
    eprintln!("{test}: {what} at {:.3} s", db_now(db).await - since);
}

/// When each event was committed and each failure written, in seconds from `since`: where
/// an unexpected failure sits against the outage (whose times the test prints).
async fn timeline(db: &DatabaseConnection, since: f64) -> String {
    let rows = db
        .query_all_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT 'failure of row ' || f.row_id || ' (attempt ' || f.attempt || ')' AS what, \
                    extract(epoch FROM f.failed_at)::float8 - $1 AS at \
             FROM outbox_failure f WHERE f.queue = 'outbox' \
             UNION ALL \
             SELECT 'commit of row ' || e.id, extract(epoch FROM e.created_at)::float8 - $1 \
             FROM outbox_event e \
             WHERE e.id IN (SELECT row_id FROM outbox_failure WHERE queue = 'outbox') \
             ORDER BY at",
            [since.into()],
        ))
        .await
        .unwrap();
    rows.iter()
        .map(|r| {
            let what: String = r.try_get("", "what").unwrap();
            let at: f64 = r.try_get("", "at").unwrap();
            format!("{at:.3} s {what}")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// What a watcher saw while the broker was away and coming back.
#[derive(Debug, Default)]
struct Watched {
    /// The most attempts any unsent outbox row had.
    max_attempts: i64,
    /// Whether `outbox_broker_available` was seen at 0 (the relay's breaker open).
    saw_unavailable: bool,
    /// Largest `outbox_oldest_pending_age_seconds` sampled.
    max_oldest_age: f64,
    /// When the first publish after the restart was confirmed.
    recovered_at: Option<Instant>,
}

/// Sample the outbox's unsent rows and the relay's metrics every 100 ms until stopped.
fn watch(
    db: DatabaseConnection,
    metrics: Metrics,
    published: String,
    available: String,
    resumed: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Watched> {
    tokio::spawn(async move {
        let mut watched = Watched::default();
        let mut published_at_restart = None;
        while !stop.load(Ordering::Relaxed) {
            let most = count(
                &db,
                "SELECT CAST(COALESCE(MAX(attempts), 0) AS BIGINT) FROM outbox_event WHERE status <> 'SENT'",
            )
            .await;
            watched.max_attempts = watched.max_attempts.max(most);
            let samples = metrics.samples();
            let get = |s: &str| samples.get(s).copied();
            watched.saw_unavailable |= get(&available) == Some(0.0);
            watched.max_oldest_age = watched
                .max_oldest_age
                .max(get("outbox_oldest_pending_age_seconds").unwrap_or(0.0));
            if resumed.load(Ordering::Relaxed) {
                let published = get(&published).unwrap_or(0.0);
                let at_restart = *published_at_restart.get_or_insert(published);
                if watched.recovered_at.is_none() && published > at_restart {
                    watched.recovered_at = Some(Instant::now());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        watched
    })
}

/// How a test's broker goes away for [`OUTAGE`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Killed (SIGKILL) and started again on its data.
    Kill,
    /// Frozen (SIGSTOP) and let go on (SIGCONT): its connections stay open and silent. The
    /// in-memory Kafka broker's outage, which a kill would empty.
    Freeze,
}

async fn survives_a_20s_broker_outage(
    broker: Broker,
    fault: Fault,
    consumer: &'static str,
    test: &str,
    metrics: Metrics,
) {
    let started = Instant::now();
    let Some(t) = test_db(Backend::Postgres, test).await else {
        return;
    };
    let started_db = db_now(&t.db).await;
    // A Kafka broker that is killed keeps its log in a file (nisshi on SQLite).
    let server = match (broker, fault) {
        (Broker::Kafka, Fault::Kill) => OwnServer::start_durable_kafka(test, None).await,
        _ => OwnServer::start(broker, test).await,
    };
    let Some(server) = server else {
        return;
    };
    let transport = connect(broker, server.url()).await;
    let label = transport.name();
    let published = format!("outbox_events_published_total{{transport=\"{label}\"}}");
    let failures = format!("outbox_publish_failures_total{{transport=\"{label}\"}}");
    let available = format!("outbox_broker_available{{transport=\"{label}\"}}");
    let outages = format!("outbox_broker_outages_total{{transport=\"{label}\"}}");
    let runtime = Runtime::builder(t.db.clone())
        .source("outages")
        .consumers([consumer])
        .transport(transport)
        .relay_config(relay_config())
        .inbox_config(inbox_config())
        .metrics_interval(Some(Duration::from_millis(100)))
        .start()
        .await
        .unwrap();
    // A RabbitMQ publish before the consumer's queue is bound is unroutable, and fails.
    wait_subscribed(&runtime, consumer).await;
    mark(&t.db, test, started_db, "subscribed").await;
    let producer = Producer::spawn(t.db.clone(), runtime.outbox().clone());
    // Events flow end to end before the broker goes.
    wait_for_effects(&t, 4 * CARTS as usize, Duration::from_secs(30)).await;
    mark(&t.db, test, started_db, "flowing").await;
    assert_eq!(
        metrics.value(&failures),
        0.0,
        "no failure before the outage"
    );

    let resumed = Arc::new(AtomicBool::new(false));
    let stop_watching = Arc::new(AtomicBool::new(false));
    let watcher = watch(
        t.db.clone(),
        metrics.clone(),
        published.clone(),
        available.clone(),
        resumed.clone(),
        stop_watching.clone(),
    );
    let handled_before = count_effects(&t.db).await;
    let committed_before = producer.committed();
    let killed_at = Instant::now();
    mark(&t.db, test, started_db, "broker stopped").await;
    match fault {
        Fault::Kill => server.stop(), // SIGKILL
        Fault::Freeze => server.freeze(),
    }
    // Once the relay has seen the outage, it claims nothing until the broker is back.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rounds_at = runtime.relay_stats().unwrap_or_default().rounds;
    let sent_early = sent_rows(&t.db).await;
    tokio::time::sleep(OUTAGE.saturating_sub(killed_at.elapsed())).await;
    let rounds_while_down = runtime.relay_stats().unwrap_or_default().rounds - rounds_at;
    let down_for = killed_at.elapsed();
    let committed_while_down = producer.committed() - committed_before;
    let handled_while_down = count_effects(&t.db).await - handled_before;
    let sent_late = sent_rows(&t.db).await;
    let failures_while_down = metrics.value(&failures);
    let health_while_down = runtime.health();
    let status_while_down = outbox::admin::status(&t.db).await.unwrap();
    resumed.store(true, Ordering::Relaxed);
    match fault {
        Fault::Kill => server.resume().await.unwrap(),
        Fault::Freeze => server.thaw(),
    }
    let restarted_after = killed_at.elapsed();
    mark(&t.db, test, started_db, "broker back").await;

    // Commits go on while the runtime catches up, then stop.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let lines = producer.stop().await;
    let committed: usize = lines.values().map(Vec::len).sum();
    wait_for_effects(&t, committed, Duration::from_secs(120)).await;
    let drained_after = killed_at.elapsed();
    // Anything handled twice would show up now.
    tokio::time::sleep(SETTLE).await;
    stop_watching.store(true, Ordering::Relaxed);
    let watched = watcher.await.unwrap();
    let health = runtime.health();
    let status_after = outbox::admin::status(&t.db).await.unwrap();
    let report = runtime.shutdown().await;

    let out_of_order = assert_everything_handled_once(&t, consumer, &lines).await;
    assert!(
        out_of_order.is_empty(),
        "{test}: effects of one cart out of order: {out_of_order:?}"
    );
    assert!(
        committed_while_down >= 100,
        "commits went on during the outage: {committed_while_down}"
    );
    // The broker was really away: nothing was confirmed while it was, and the consumer handled
    // only what had been published before (a Kafka consumer may still be working through what
    // it fetched before the broker froze).
    assert_eq!(
        sent_early, sent_late,
        "nothing was confirmed while the broker was down"
    );
    assert!(
        handled_before + handled_while_down <= sent_late,
        "nothing new reached the consumer while the broker was down: \
         {handled_while_down} handled after {handled_before}, {sent_late} sent"
    );

    // The outage was nobody's message's fault: no attempt spent, nothing DEAD, though the
    // outage lasted far longer than the retry budget; and no hot loop while it lasted.
    let rows = outbox_rows(&t.db).await;
    let attempts: i64 = rows.iter().map(|r| r.attempts).sum();
    let recovered_after = watched
        .recovered_at
        .map(|at| at - killed_at)
        .expect("a publish was confirmed after the restart");
    let errors: std::collections::BTreeSet<&str> = rows
        .iter()
        .filter(|r| r.attempts > 0)
        .filter_map(|r| r.last_error.as_deref())
        .collect();
    assert_eq!(
        attempts,
        0,
        "the outage spent attempts on the events: {errors:?}; history: {:?}; timeline: {}",
        outbox_failures(&t.db).await,
        timeline(&t.db, started_db).await
    );
    assert_eq!(watched.max_attempts, 0, "an unsent row counted an attempt");
    assert!(
        OUTAGE > retry_budget(),
        "the outage outlasts the retry budget"
    );
    assert!(
        watched.saw_unavailable,
        "the relay's breaker was seen open: {watched:?}"
    );
    assert!(
        rounds_while_down <= 5,
        "the relay kept claiming while the broker was away: {rounds_while_down} rounds"
    );
    let drain_after_return = drained_after.saturating_sub(restarted_after);
    assert!(
        drain_after_return <= Duration::from_secs(30),
        "{test}: the backlog drained {drain_after_return:.1?} after the broker's return"
    );

    // The metrics saw it all, and agree with the rows and the report.
    assert_eq!(metrics.value(&failures), 0.0, "{failures}");
    assert!(metrics.value(&outages) >= 1.0, "{outages}");
    assert_eq!(
        metrics.value(&available),
        1.0,
        "{available} after the outage"
    );
    assert_eq!(metrics.value(&published), committed as f64, "{published}");
    assert_eq!(
        metrics.value(&format!(
            "inbox_messages_total{{consumer=\"{consumer}\",outcome=\"handled\"}}"
        )),
        committed as f64
    );
    assert_eq!(
        metrics.value(&format!(
            "inbox_messages_total{{consumer=\"{consumer}\",outcome=\"dead\"}}"
        )),
        0.0
    );
    assert!(
        watched.max_oldest_age >= 15.0,
        "the oldest pending age grew during the outage: {}",
        watched.max_oldest_age
    );
    for status in ["PENDING", "PROCESSING", "RETRY", "DEAD"] {
        assert_eq!(
            metrics.value(&format!("outbox_backlog_events{{status=\"{status}\"}}")),
            0.0,
            "{status} backlog after draining"
        );
    }
    // `outbox status` told the outage while it lasted: the relay's breaker open for most of it,
    // the broker unseen as long, the backlog waiting for it.
    assert_eq!(status_while_down.relays.len(), 1, "{status_while_down:#?}");
    let seen = &status_while_down.relays[0];
    assert!(seen.current && !seen.broker_available, "{seen:#?}");
    assert_eq!(seen.transport, label);
    let half = OUTAGE / 2;
    assert!(
        seen.unavailable_for.is_some_and(|d| d >= half)
            && seen.broker_seen_ago.is_some_and(|d| d >= half),
        "{seen:#?}"
    );
    assert!(
        status_while_down.outbox.delayed_by_outage > 0
            && status_while_down.outbox.delayed_by_outage == status_while_down.outbox.backlog,
        "{:#?}",
        status_while_down.outbox
    );
    let seen = &status_after.relays[0];
    assert!(seen.current && seen.broker_available, "{seen:#?}");
    assert_eq!(
        (seen.held_back, seen.unavailable_for),
        (0, None),
        "{seen:#?}"
    );
    assert_eq!(status_after.outbox.delayed_by_outage, 0);

    let relay = report.relay.expect("the relay ran");
    assert_eq!(relay.retried, 0, "{report:?}");
    assert!(relay.outages >= 1, "{report:?}");
    assert_eq!(relay.sent, committed as u64, "{report:?}");
    assert_eq!(relay.dead, 0, "{report:?}");
    let inbox = report.consumer(consumer);
    assert_eq!(inbox.handled, committed as u64, "{report:?}");
    assert_eq!(inbox.dead, 0, "{report:?}");
    // The consumer reconnected and resubscribed without marking anything as failed.
    assert_eq!(inbox.retried, 0, "{report:?}");
    let relay_while_down = health_while_down
        .loops
        .iter()
        .find(|l| l.name == "relay")
        .expect("a relay loop");
    assert!(
        !relay_while_down.healthy
            && relay_while_down
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("broker unavailable")),
        "the relay reported the outage in its health: {health_while_down:#?}"
    );
    assert!(
        health.is_healthy() && health.loops.iter().all(|l| l.alive),
        "every loop healthy after the outage: {health:#?}"
    );

    eprintln!(
        "{test}: broker down {down_for:.1?} (restarted after {restarted_after:.1?}, first \
         confirm after {recovered_after:.1?}, drained after {drained_after:.1?}: \
         {drain_after_return:.1?} after the broker's return); {committed} events committed \
         ({committed_while_down} while down, {handled_while_down} handled while down); {attempts} \
         attempts spent, {failures_while_down} failed publishes while down, {rounds_while_down} \
         relay rounds in the last {:.0?} of the outage; max oldest pending age {:.1} s; {}; loops \
         while down: {}; total {:.1?}",
        OUTAGE - Duration::from_secs(5),
        watched.max_oldest_age,
        summary(&report),
        loops_summary(&health_while_down),
        started.elapsed(),
    );
}

fn summary(report: &RuntimeReport) -> String {
    format!("relay {:?}; consumers {:?}", report.relay, report.consumers)
}

#[test]
fn nats_broker_killed_for_20s() {
    with_own_metrics(|metrics| {
        survives_a_20s_broker_outage(
            Broker::Nats,
            Fault::Kill,
            "outage-nats",
            "outages_nats",
            metrics,
        )
    });
}

#[test]
fn rabbitmq_broker_killed_for_20s() {
    with_own_metrics(|metrics| {
        survives_a_20s_broker_outage(
            Broker::RabbitMq,
            Fault::Kill,
            "outage-rabbitmq",
            "outages_rabbitmq",
            metrics,
        )
    });
}

/// The in-memory broker (tansu), frozen (SIGSTOP) for 20 s: a hung host.
#[cfg(feature = "kafka")]
#[test]
fn kafka_broker_frozen_for_20s() {
    with_own_metrics(|metrics| {
        survives_a_20s_broker_outage(
            Broker::Kafka,
            Fault::Freeze,
            "outage-kafka",
            "outages_kafka",
            metrics,
        )
    });
}

/// A broker with its log in a file (nisshi on SQLite), killed (SIGKILL) for 20 s and started
/// again on it.
#[cfg(feature = "kafka")]
#[test]
fn kafka_broker_killed_for_20s() {
    with_own_metrics(|metrics| {
        survives_a_20s_broker_outage(
            Broker::Kafka,
            Fault::Kill,
            "outage-kafka-killed",
            "outages_kafka_killed",
            metrics,
        )
    });
}

#[test]
fn redis_broker_killed_for_20s() {
    with_own_metrics(|metrics| {
        survives_a_20s_broker_outage(
            Broker::Redis,
            Fault::Kill,
            "outage-redis",
            "outages_redis",
            metrics,
        )
    });
}

// ---------------------------------------------------------------------------------------------
// The runtime's PostgreSQL connections terminated.

/// Terminate every backend of `database` whose `application_name` is `app`; returns how many.
async fn terminate(db: &DatabaseConnection, database: &str, app: &str) -> i64 {
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT COUNT(*) AS n FROM ( \
               SELECT pg_terminate_backend(pid) AS terminated FROM pg_stat_activity \
               WHERE datname = $1 AND application_name = $2 AND pid <> pg_backend_pid() \
             ) k WHERE terminated",
            [database.into(), app.into()],
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get("", "n").unwrap()
}

#[test]
fn runtime_survives_its_postgres_connections_being_killed() {
    with_own_metrics(|metrics| async move {
        let started = Instant::now();
        let Some(t) = test_db(Backend::Postgres, "outages_pg_kill").await else {
            return;
        };
        let Some(nats) = crate::common::nats::transport("outages_pg_kill").await else {
            return;
        };
        // The runtime's own pool, recognisable in pg_stat_activity; the producer's is spared.
        let app = "outbox_outages_runtime";
        let mut options = ConnectOptions::new(format!("{}?application_name={app}", t.url));
        options
            .sqlx_logging(false)
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(10));
        let runtime_db = Database::connect(options).await.unwrap();
        let runtime = Runtime::builder(runtime_db)
            .source("outages")
            .consumers(["pg-kill"])
            .transport(Arc::new(nats.0.clone()))
            .relay_config(
                relay_config()
                    .lease(Duration::from_secs(3))
                    .poll_interval(POLL_WITHOUT_NOTIFY),
            )
            .inbox_config(inbox_config().lease(Duration::from_secs(3)))
            .metrics_interval(Some(Duration::from_millis(100)))
            .start()
            .await
            .unwrap();
        let producer = Producer::spawn(t.db.clone(), Outbox::new("outages"));
        wait_for_effects(&t, 4 * CARTS as usize, Duration::from_secs(30)).await;

        // Loops whose health reported an error at some point.
        let mut failing_loops: BTreeMap<String, String> = BTreeMap::new();
        let mut terminated = Vec::new();
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(400)).await;
            terminated.push(terminate(&t.db, &t.name, app).await);
            tokio::time::sleep(Duration::from_millis(50)).await;
            for l in runtime.health().loops {
                if let Some(e) = l.last_error {
                    failing_loops.insert(l.name, e);
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut lines = producer.stop().await;
        let committed: usize = lines.values().map(Vec::len).sum();
        let drained_after = wait_for_effects(&t, committed, Duration::from_secs(60)).await;
        tokio::time::sleep(SETTLE).await;

        // The relay still hears of commits at once: one more transaction is handled well
        // within the poll interval.
        let probe = Outbox::new("outages").begin(&t.db).await.unwrap();
        for (cart, seqs) in &mut lines {
            let seq = seqs.last().map_or(0, |s| s + 1);
            probe
                .enqueue(&LineAdded {
                    cart: cart.clone(),
                    seq,
                })
                .unwrap();
            seqs.push(seq);
        }
        let _ = probe.commit().await.unwrap();
        let probed = Instant::now();
        let committed = committed + CARTS as usize;
        let probe_handled = eventually(POLL_WITHOUT_NOTIFY / 2, || async {
            count_effects(&t.db).await >= committed
        })
        .await;
        let probe_latency = probed.elapsed();
        assert!(
            probe_handled,
            "a commit after the terminations waited for the relay's poll: the LISTEN \
             connection was not re-established"
        );
        wait_for_effects(&t, committed, Duration::from_secs(10)).await;
        tokio::time::sleep(SETTLE).await;
        let healthy = eventually(Duration::from_secs(10), || async {
            runtime.health().is_healthy()
        })
        .await;
        let health = runtime.health();
        let report = runtime.shutdown().await;
        for l in &health.loops {
            if let Some(e) = &l.last_error {
                failing_loops.insert(l.name.clone(), e.clone());
            }
        }

        assert!(
            terminated.iter().all(|n| *n >= 1),
            "each round terminated connections of the runtime: {terminated:?}"
        );
        // A delivery whose connection died before it was recorded is tried again in its lane,
        // so later messages of its cart wait behind it: order holds.
        let out_of_order = assert_everything_handled_once(&t, "pg-kill", &lines).await;
        assert!(
            out_of_order.is_empty(),
            "effects of one cart out of order: {out_of_order:?}"
        );
        assert!(healthy, "every loop healthy again: {health:#?}");
        assert!(health.loops.iter().all(|l| l.alive), "{health:#?}");

        // The errors were seen: in the metrics and the report, or the loops' health.
        let relay_errors = metrics.value("outbox_relay_errors_total");
        let retried =
            metrics.value("inbox_messages_total{consumer=\"pg-kill\",outcome=\"retried\"}");
        let handled =
            metrics.value("inbox_messages_total{consumer=\"pg-kill\",outcome=\"handled\"}");
        let relay = report.relay.expect("the relay ran");
        let inbox = report.consumer("pg-kill");
        assert_eq!(relay_errors, relay.errors as f64, "{report:?}");
        assert_eq!(retried, inbox.retried as f64, "{report:?}");
        assert_eq!(handled, committed as f64);
        assert_eq!(inbox.handled, committed as u64, "{report:?}");
        assert_eq!(relay.sent, committed as u64, "{report:?}");
        assert_eq!(relay.dead + inbox.dead, 0, "{report:?}");
        assert!(
            relay_errors + retried > 0.0 || !failing_loops.is_empty(),
            "the terminations were noticed somewhere"
        );

        eprintln!(
            "outages_pg_kill: terminated {terminated:?} runtime connections ({} in all); \
             {committed} events committed and handled once, drained {drained_after:.1?} after \
             the producer stopped, a later commit handled in {probe_latency:.1?}; relay errors {relay_errors}, inbox \
             retried {retried}; loops that reported errors {failing_loops:#?}; carts out of \
             order {out_of_order:?}; {}; total {:.1?}",
            terminated.iter().sum::<i64>(),
            summary(&report),
            started.elapsed(),
        );
    });
}

/// How many events the relay has marked `SENT`.
async fn sent_rows(db: &DatabaseConnection) -> usize {
    outbox_rows(db)
        .await
        .iter()
        .filter(|row| row.status == "SENT")
        .count()
}
