//! The WAL relay (feature `postgres-wal`) on the PostgreSQL cluster with `wal_level = logical`
//! (`scripts/pg-logical`), publishing to the in-memory transport: committed events read from a
//! logical replication slot and published in commit order without a claim; what the stream
//! leaves (events behind an unsent one, failures) taken by the claim loop beside it; a relay
//! restarted on its slot; the fallback to polling when the slot is dropped; the slot's lag in
//! `outbox status` and `outbox doctor` while no relay streams.
//!
//! Slots are the cluster's, not the database's: each test streams from a slot of its own.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use crate::common::carts::*;
use crate::common::*;
use outbox::admin::{DoctorOptions, Severity};
use outbox::prelude::*;
use outbox::relay::WalConfig;
use outbox::relay::{Backoff, Relay, RelayConfig, RelayHandle};
use outbox::store;
use outbox::transport::memory::MemoryTransport;

/// The relay's settings: its claim loop polls every 100 ms, so that what the stream leaves to
/// the table goes soon; no notifications (the stream is what reacts to commits).
fn config() -> RelayConfig {
    RelayConfig::default()
        .relay_id("wal-relay".to_owned())
        .poll_interval(Duration::from_millis(100))
        .linger(None)
        .listen(false)
        .backoff(
            Backoff::default()
                .base(Duration::from_millis(50))
                .cap(Duration::from_millis(200))
                .jitter(0.2),
        )
        .probe(
            Backoff::default()
                .base(Duration::from_millis(20))
                .cap(Duration::from_millis(200))
                .jitter(0.2),
        )
}

/// A WAL configuration on the test's own slot. With a long grace, the claim loop never takes a
/// PENDING row the stream could have published: what is SENT quickly, the stream published.
fn wal(t: &TestDb, slot: &str, grace: Duration) -> WalConfig {
    WalConfig::new(t.url.clone()).slot(slot).table_grace(grace)
}

async fn start(t: &TestDb, transport: &MemoryTransport, wal: WalConfig) -> RelayHandle {
    let relay = Relay::new(t.db.clone(), Arc::new(transport.clone()))
        .with_config(config())
        .with_wal(wal.clone())
        .spawn();
    // Streaming: the slot exists, past its consistent point, and a relay reads it.
    assert!(
        eventually(Duration::from_secs(20), || async {
            relay.stats().wal == outbox::relay::WalReader::Streaming
                && store::wal::slot(&t.db, wal.slot_name())
                    .await
                    .unwrap()
                    .is_some_and(|s| s.active)
        })
        .await,
        "the relay streams from slot {}",
        wal.slot_name()
    );
    relay
}

async fn commit(t: &TestDb, outbox: &Outbox, lines: &[(&str, u32)]) {
    commit_lines(outbox.begin(&t.db).await.unwrap(), lines).await;
}

fn distinct(transport: &MemoryTransport) -> usize {
    transport
        .messages()
        .iter()
        .map(|m| m.event_id)
        .collect::<BTreeSet<_>>()
        .len()
}

async fn current_lsn(t: &TestDb) -> String {
    let row =
        t.db.query_one_raw(outbox::sea_orm::Statement::from_string(
            outbox::sea_orm::DbBackend::Postgres,
            "SELECT pg_current_wal_lsn()::text AS lsn",
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get("", "lsn").unwrap()
}

/// Whether position `a` is after `b`.
async fn lsn_after(t: &TestDb, a: &str, b: &str) -> bool {
    let row =
        t.db.query_one_raw(outbox::sea_orm::Statement::from_sql_and_values(
            outbox::sea_orm::DbBackend::Postgres,
            "SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn) > 0 AS after",
            [a.into(), b.into()],
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get("", "after").unwrap()
}

macro_rules! logical_db {
    ($name:literal) => {
        match logical_test_db($name).await {
            Some(t) => t,
            None => return,
        }
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_in_commit_order_without_claiming() {
    let t = logical_db!("wal_streams");
    let transport = MemoryTransport::new();
    let relay = start(
        &t,
        &transport,
        wal(&t, "outbox_t_streams", Duration::from_secs(600)),
    )
    .await;
    let outbox = Outbox::new("carts");
    // 12 carts × 10 lines, interleaved, 7 per transaction.
    let total = produce(&t, &outbox, 12, 10, 7).await;
    wait_all_sent(&t, total, Duration::from_secs(30)).await;
    assert!(relay.streams_wal());
    let stats = relay.shutdown().await.unwrap();
    assert_eq!(stats.sent as usize, total);

    assert_eq!(
        transport.messages().len(),
        total,
        "each event published once"
    );
    assert_strictly_increasing(&stream_order(&transport), 10);
    let rows = outbox_rows(&t.db).await;
    assert!(
        rows.iter().all(|r| r.claim_token.is_none()
            && r.locked_by.is_none()
            && r.attempts == 0
            && r.sent_at.is_some_and(|s| s >= r.created_at)),
        "no row was claimed: {:?}",
        rows.iter().find(|r| r.claim_token.is_some())
    );
    // The slot's position follows: nothing of the outbox is left behind it.
    let slot = store::wal::slot(&t.db, "outbox_t_streams")
        .await
        .unwrap()
        .unwrap();
    assert!(!slot.active, "the relay let go of the slot at shutdown");
    store::wal::drop_slot(&t.db, "outbox_t_streams", true)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_on_its_slot_and_reports_lag_while_stopped() {
    let t = logical_db!("wal_restart");
    let slot = "outbox_t_restart";
    let outbox = Outbox::new("carts");
    let first = MemoryTransport::new();
    let relay = start(&t, &first, wal(&t, slot, Duration::from_secs(600))).await;
    let before = produce(&t, &outbox, 4, 5, 4).await;
    wait_all_sent(&t, before, Duration::from_secs(30)).await;
    relay.shutdown().await.unwrap();
    assert_eq!(first.messages().len(), before);

    // Stopped: commits pile up in the WAL behind the slot's position.
    for seq in 5..9 {
        commit(&t, &outbox, &[("cart-0", seq), ("cart-1", seq)]).await;
    }
    let before_last = current_lsn(&t).await;
    commit(&t, &outbox, &[("cart-0", 9), ("cart-1", 9)]).await;
    let status = outbox::admin::status(&t.db).await.unwrap();
    let reported = status
        .wal_slots
        .iter()
        .find(|s| s.slot == slot)
        .expect("the slot is in outbox status");
    assert!(!reported.active);
    assert!(
        reported.lag_bytes > 0,
        "a stopped relay's slot lags: {reported:?}"
    );
    let doctor = outbox::admin::doctor(&t.db, &DoctorOptions::default().without_handler_check())
        .await
        .unwrap();
    assert!(
        doctor.findings.iter().any(|f| f.check == "wal"
            && f.severity == Severity::Warning
            && f.message.contains(slot)),
        "doctor warns about the idle slot: {:?}",
        doctor.findings
    );
    // Below the configured lag the warning says only that nothing streams; at or above it, the
    // lag is flagged with the threshold.
    let flagged = |findings: &[outbox::admin::Finding]| {
        findings.iter().any(|f| {
            f.check == "wal"
                && f.severity == Severity::Warning
                && f.message.contains(slot)
                && f.message.contains("flagged from 1 bytes")
        })
    };
    assert!(!flagged(&doctor.findings), "{:?}", doctor.findings);
    let strict = DoctorOptions::default().without_handler_check().slot_lag(1);
    let doctor = outbox::admin::doctor(&t.db, &strict).await.unwrap();
    assert!(flagged(&doctor.findings), "{:?}", doctor.findings);

    // Restarted on the same slot: the rest, and nothing of what the first relay sent.
    let second = MemoryTransport::new();
    let relay = start(&t, &second, wal(&t, slot, Duration::from_secs(600))).await;
    wait_all_sent(&t, before + 10, Duration::from_secs(30)).await;
    relay.shutdown().await.unwrap();
    assert_eq!(
        second.messages().len(),
        10,
        "only the events committed while it was stopped"
    );
    let order = stream_order(&second);
    assert_eq!(order["cart-0"], (5..10).collect::<Vec<_>>());
    assert_eq!(order["cart-1"], (5..10).collect::<Vec<_>>());
    assert!(
        outbox_rows(&t.db)
            .await
            .iter()
            .all(|r| r.claim_token.is_none())
    );
    let after = store::wal::slot(&t.db, slot).await.unwrap().unwrap();
    assert!(
        lsn_after(&t, after.confirmed_lsn.as_deref().unwrap(), &before_last).await,
        "the restarted relay confirmed past the last commit (after {before_last}): {after:?}"
    );
    store::wal::drop_slot(&t.db, slot, true).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn falls_back_to_polling_when_the_slot_is_dropped() {
    let t = logical_db!("wal_fallback");
    let slot = "outbox_t_fallback";
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let relay = start(&t, &transport, wal(&t, slot, Duration::from_secs(600))).await;
    commit(&t, &outbox, &[("a", 0), ("b", 0)]).await;
    wait_all_sent(&t, 2, Duration::from_secs(30)).await;

    // The broker goes away: the next events stay PENDING. Then the slot is dropped under the
    // relay (an operator, or the server invalidating it).
    transport.set_unavailable(true);
    commit(&t, &outbox, &[("a", 1), ("a", 2), ("c", 0)]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(store::wal::drop_slot(&t.db, slot, true).await.unwrap());
    transport.set_unavailable(false);
    // Everything pending reaches the broker by polling (the grace no longer applies), in order.
    wait_all_sent(&t, 5, Duration::from_secs(30)).await;
    assert!(!relay.streams_wal(), "the relay says it polls now");
    commit(&t, &outbox, &[("a", 3)]).await;
    wait_all_sent(&t, 6, Duration::from_secs(30)).await;
    relay.shutdown().await.unwrap();
    assert_eq!(distinct(&transport), 6);
    assert_eq!(stream_order(&transport)["a"], vec![0, 1, 2, 3]);
    assert!(
        store::wal::slot(&t.db, slot).await.unwrap().is_none(),
        "the fallen-back relay does not create a slot behind the operator's back"
    );
    let rows = outbox_rows(&t.db).await;
    assert!(
        rows.iter().all(|r| r.attempts == 0),
        "no attempt charged: {rows:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_publish_leaves_its_aggregate_to_the_table() {
    let t = logical_db!("wal_failure");
    let slot = "outbox_t_failure";
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    // A grace long enough that only what the stream leaves goes by the claim loop, even on a
    // loaded machine.
    let relay = start(&t, &transport, wal(&t, slot, Duration::from_secs(5))).await;
    // Cart `a`'s first line is refused once (a failure of this message, not an outage).
    let refused = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let once = refused.clone();
    transport.fail_matching(Some(move |m: &outbox::transport::OutgoingMessage| {
        m.aggregate_id == "a"
            && seq_of(&m.body) == 0
            && !once.swap(true, std::sync::atomic::Ordering::SeqCst)
    }));
    commit(&t, &outbox, &[("a", 0), ("a", 1), ("b", 0)]).await;
    commit(&t, &outbox, &[("a", 2), ("b", 1)]).await;
    wait_all_sent(&t, 5, Duration::from_secs(30)).await;
    relay.shutdown().await.unwrap();
    assert!(refused.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(stream_order(&transport)["a"], vec![0, 1, 2]);
    assert_eq!(stream_order(&transport)["b"], vec![0, 1]);
    let rows = outbox_rows(&t.db).await;
    let a0 = rows.iter().find(|r| r.aggregate_id == "a").unwrap();
    assert_eq!(a0.attempts, 1, "the refused event counted one attempt");
    // `b` went by the stream; `a`'s retry and the lines behind it by the claim loop.
    assert!(
        rows.iter()
            .filter(|r| r.aggregate_id == "b")
            .all(|r| r.claim_token.is_none()),
        "{rows:#?}"
    );
    assert!(
        rows.iter()
            .filter(|r| r.aggregate_id == "a")
            .all(|r| r.claim_token.is_some())
    );
    store::wal::drop_slot(&t.db, slot, true).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_behind_a_backlog_from_before_the_slot_wait_for_it() {
    let t = logical_db!("wal_backlog");
    let slot = "outbox_t_backlog";
    let outbox = Outbox::new("carts");
    // Committed before any slot existed: not in the stream.
    commit(&t, &outbox, &[("a", 0), ("a", 1)]).await;
    let transport = MemoryTransport::new();
    let relay = start(&t, &transport, wal(&t, slot, Duration::from_millis(300))).await;
    commit(&t, &outbox, &[("a", 2), ("b", 0)]).await;
    wait_all_sent(&t, 4, Duration::from_secs(30)).await;
    relay.shutdown().await.unwrap();
    assert_eq!(transport.messages().len(), 4);
    assert_eq!(
        stream_order(&transport)["a"],
        vec![0, 1, 2],
        "the stream did not jump the backlog"
    );
    store::wal::drop_slot(&t.db, slot, true).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_spends_no_attempt() {
    let t = logical_db!("wal_outage");
    let slot = "outbox_t_outage";
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let relay = start(&t, &transport, wal(&t, slot, Duration::from_secs(600))).await;
    transport.set_unavailable(true);
    for seq in 0..5 {
        commit(&t, &outbox, &[("a", seq), ("b", seq)]).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        status_counts(&t.db).await.get("SENT").copied().unwrap_or(0),
        0
    );
    transport.set_unavailable(false);
    wait_all_sent(&t, 10, Duration::from_secs(30)).await;
    relay.shutdown().await.unwrap();
    assert_strictly_increasing(&stream_order(&transport), 5);
    let rows = outbox_rows(&t.db).await;
    assert!(
        rows.iter()
            .all(|r| r.attempts == 0 && r.claim_token.is_none()),
        "{rows:?}"
    );
    store::wal::drop_slot(&t.db, slot, true).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_relay_takes_the_slot_over() {
    let t = logical_db!("wal_standby");
    let slot = "outbox_t_standby";
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let first = start(&t, &transport, wal(&t, slot, Duration::from_secs(600))).await;
    let second = Relay::new(t.db.clone(), Arc::new(transport.clone()))
        .with_config(config().relay_id("wal-standby"))
        .with_wal(wal(&t, slot, Duration::from_secs(600)))
        .spawn();
    commit(&t, &outbox, &[("a", 0), ("b", 0)]).await;
    wait_all_sent(&t, 2, Duration::from_secs(30)).await;
    assert!(
        first.streams_wal() && second.streams_wal(),
        "both are in WAL mode"
    );
    // The streaming relay stops; the standby takes the slot over and streams the rest.
    first.shutdown().await.unwrap();
    commit(&t, &outbox, &[("a", 1), ("b", 1), ("a", 2)]).await;
    wait_all_sent(&t, 5, Duration::from_secs(30)).await;
    assert!(
        store::wal::slot(&t.db, slot)
            .await
            .unwrap()
            .is_some_and(|s| s.active),
        "the standby streams from the slot"
    );
    second.shutdown().await.unwrap();
    assert_eq!(transport.messages().len(), 5, "each event published once");
    assert_eq!(stream_order(&transport)["a"], vec![0, 1, 2]);
    assert!(
        outbox_rows(&t.db)
            .await
            .iter()
            .all(|r| r.claim_token.is_none()),
        "every event went by a stream"
    );
    store::wal::drop_slot(&t.db, slot, true).await.unwrap();
}

/// A slot no relay reads shows its lag in the metrics the runtime's sampler exports.
#[test]
fn a_stopped_relay_shows_as_slot_lag_in_the_metrics() {
    let recorder: &'static _ = Box::leak(Box::new(
        metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder(),
    ));
    on_own_runtime(
        move || std::mem::forget(metrics::set_default_local_recorder(recorder)),
        async move {
            let t = logical_db!("wal_metrics");
            let slot = "outbox_t_metrics";
            // A slot, as a WAL relay that stopped leaves it; then commits it does not read.
            store::wal::ensure_publication(&t.db, "outbox_events")
                .await
                .unwrap();
            assert!(store::wal::create_slot(&t.db, slot).await.unwrap());
            let outbox = Outbox::new("carts");
            produce(&t, &outbox, 3, 3, 3).await;
            outbox::metrics::sample(&t.db).await.unwrap();
            let rendered = recorder.handle().render();
            let lag = rendered
                .lines()
                .find(|l| l.starts_with(&format!("outbox_wal_slot_lag_bytes{{slot=\"{slot}\"}}")))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<f64>().ok());
            assert!(lag.is_some_and(|lag| lag > 0.0), "{rendered}");
            assert!(
                rendered.contains(&format!(
                    "outbox_wal_slot_retained_bytes{{slot=\"{slot}\"}}"
                )),
                "{rendered}"
            );
            store::wal::drop_slot(&t.db, slot, true).await.unwrap();
        },
    );
}
