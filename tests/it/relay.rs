//! The relay on real PostgreSQL, MariaDB and SQLite, publishing to the in-memory transport with
//! injected faults (publish failures, lost confirms, slow confirms): claims, leases, fencing,
//! backoff, dead letters, per-aggregate order, wake-up and shutdown.

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant},
};

use crate::common::carts::*;
use crate::common::*;
use chrono::Utc;
use outbox::admin;
use outbox::prelude::*;
use outbox::relay::{Backoff, Relay, RelayConfig};
use outbox::sea_orm::{ConnectionTrait, DbBackend, Statement};
use outbox::store::claim::ClaimParams;
use outbox::store::relay::{Fence, Settlement, claim, settle};
use outbox::transport::OutgoingMessage;
use outbox::transport::memory::{MemoryTransport, StoredMessage};

/// Longer than the database clock's resolution (SQLite's is a millisecond): a lease of zero has
/// expired once this has passed.
const LEASE_RUNS_OUT: Duration = Duration::from_millis(5);

fn config(batch: usize) -> RelayConfig {
    quick_relay().batch_size(batch)
}

/// Per aggregate, the sequence numbers in the transport's log, each event id counted once.
fn log_order(messages: &[StoredMessage]) -> std::collections::HashMap<String, Vec<u32>> {
    per_aggregate_order(
        messages
            .iter()
            .map(|m| (m.event_id.to_string(), m.aggregate_id.clone(), &m.body[..])),
    )
}

async fn four_relays_publish_each_event_once(t: TestDb) {
    let outbox = Outbox::new("carts");
    let total = produce(&t, &outbox, 500, 6, 250).await;
    let transport = MemoryTransport::new();
    let relays: Vec<_> = (0..4)
        .map(|i| {
            Relay::new(t.db.clone(), Arc::new(transport.clone()))
                .with_config(config(200).relay_id(format!("relay-{i}")))
                .with_outbox(&outbox)
                .spawn()
        })
        .collect();
    wait_all_sent(&t, total, Duration::from_secs(120)).await;
    let mut sent_by_relays = 0;
    for r in relays {
        sent_by_relays += r.shutdown().await.unwrap().sent;
    }
    let messages = transport.messages();
    let ids: HashSet<_> = messages.iter().map(|m| m.event_id).collect();
    assert_eq!(messages.len(), total, "each event published exactly once");
    assert_eq!(ids.len(), total);
    assert_eq!(sent_by_relays, total as u64);
    let rows = outbox_rows(&t.db).await;
    assert!(
        rows.iter()
            .all(|r| r.status == "SENT" && r.sent_at.is_some() && r.attempts == 0)
    );
    assert!(rows.iter().all(|r| {
        r.locked_by
            .as_deref()
            .is_some_and(|l| l.starts_with("relay-"))
    }));
    // The envelope on the wire matches the row.
    let first = Envelope::from_json(
        &messages
            .iter()
            .find(|m| m.event_id == rows[0].event_id)
            .unwrap()
            .body,
    )
    .unwrap();
    assert_eq!(first.id, rows[0].event_id.to_string());
    assert_eq!(first.source, "carts");
    assert_eq!(first.event_type, "line.added");
    assert_eq!(
        first.subject.as_deref(),
        Some(rows[0].aggregate_id.as_str())
    );
    assert_eq!(first.time, Some(rows[0].created_at));
    assert_eq!(first.aggregate_type.as_deref(), Some("cart"));
    assert_eq!(first.schema_version, Some(1));
    assert_strictly_increasing(&log_order(&messages), 6);
}

async fn order_survives_random_failures_and_four_relays(t: TestDb) {
    let outbox = Outbox::new("carts");
    let total = produce(&t, &outbox, 50, 200, 500).await;
    let transport = MemoryTransport::new();
    transport.fail_randomly(0.05);
    let relays: Vec<_> = (0..4)
        .map(|i| {
            Relay::new(t.db.clone(), Arc::new(transport.clone()))
                .with_config(config(100).relay_id(format!("relay-{i}")))
                .spawn()
        })
        .collect();
    wait_all_sent(&t, total, Duration::from_secs(300)).await;
    let mut retried = 0;
    for r in relays {
        retried += r.shutdown().await.unwrap().retried;
    }
    assert!(retried > 0, "failures were injected and retried");
    let messages = transport.messages();
    assert_eq!(
        messages.len(),
        total,
        "a failed publish stores nothing, so no duplicates"
    );
    assert_strictly_increasing(&log_order(&messages), 200);
    let rows = outbox_rows(&t.db).await;
    assert!(
        rows.iter().any(|r| r.attempts > 0),
        "some events needed retries"
    );
}

async fn failures_back_off_then_dead_while_others_flow(t: TestDb) {
    let outbox = Outbox::new("carts");
    let poison = LineAdded {
        cart: "poison".into(),
        seq: 0,
    };
    let behind = LineAdded {
        cart: "poison".into(),
        seq: 1,
    };
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.enqueue(&poison).unwrap();
    tx.enqueue(&behind).unwrap();
    for seq in 0..5 {
        tx.enqueue(&LineAdded {
            cart: "healthy".into(),
            seq,
        })
        .unwrap();
    }
    let _ = tx.commit().await.unwrap();

    let transport = MemoryTransport::new();
    transport.fail_matching(Some(|m: &OutgoingMessage| m.aggregate_id == "poison"));
    let base = Duration::from_millis(200);
    let relay = Relay::new(t.db.clone(), Arc::new(transport.clone())).with_config(
        config(100).max_attempts(3).backoff(
            Backoff::default()
                .base(base)
                .cap(Duration::from_secs(10))
                .jitter(0.0),
        ),
    );

    let mut delays = Vec::new();
    for attempt in 1..=3u32 {
        // Wait until the poison event is due again.
        let started = Utc::now();
        let ok = eventually(Duration::from_secs(10), || async {
            relay.run_once().await.unwrap();
            outbox_rows(&t.db).await[0].attempts == i64::from(attempt)
        })
        .await;
        assert!(ok, "attempt {attempt} happened");
        let row = outbox_rows(&t.db).await.remove(0);
        assert!(
            row.last_error
                .as_deref()
                .unwrap()
                .contains("injected failure"),
            "{:?}",
            row.last_error
        );
        assert_ne!(row.status, "PROCESSING");
        assert_eq!(row.failure_class.as_deref(), Some("REJECTED"), "{row:?}");
        if attempt < 3 {
            assert_eq!(row.status, "RETRY");
            let delay = row.next_attempt_at.unwrap() - started;
            delays.push(delay);
            // min(base * 2^(attempt-1), cap), no jitter: the delay doubles.
            let expected = chrono::Duration::from_std(base * 2u32.pow(attempt - 1)).unwrap();
            assert!(
                delay >= expected,
                "attempt {attempt}: next_attempt_at only {delay} ahead, expected {expected}"
            );
        } else {
            assert_eq!(row.status, "DEAD", "DEAD after max_attempts");
        }
    }
    assert!(delays[1] > delays[0], "backoff grows: {delays:?}");

    let rows = outbox_rows(&t.db).await;
    assert_eq!(
        rows[1].status, "PENDING",
        "the next event of the dead aggregate waits behind it"
    );
    assert_eq!(
        rows[1].attempts, 0,
        "events held back are not charged attempts"
    );
    assert!(
        rows[2..].iter().all(|r| r.status == "SENT"),
        "other aggregates flowed"
    );
    let healthy: Vec<u32> = transport
        .messages()
        .iter()
        .map(|m| seq_of(&m.body))
        .collect();
    assert_eq!(healthy, [0, 1, 2, 3, 4]);
    assert_eq!(relay.stats().dead, 1);
}

async fn permanent_rejection_is_dead_at_once(t: TestDb) {
    let outbox = Outbox::new("carts");
    produce(&t, &outbox, 3, 1, 10).await;
    let transport = MemoryTransport::new();
    transport.reject_permanently(Some(|m: &OutgoingMessage| m.aggregate_id == "cart-1"));
    let relay = Relay::new(t.db.clone(), Arc::new(transport.clone())).with_config(config(10));
    let report = relay.drain(10).await.unwrap();
    assert_eq!((report.sent, report.dead, report.retried), (2, 1, 0));
    let dead: Vec<_> = outbox_rows(&t.db)
        .await
        .into_iter()
        .filter(|r| r.status == "DEAD")
        .collect();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].aggregate_id, "cart-1");
    assert_eq!(dead[0].attempts, 1);
    assert!(
        dead[0]
            .last_error
            .as_deref()
            .unwrap()
            .contains("permanently")
    );
    assert_eq!(dead[0].failure_class.as_deref(), Some("PERMANENT"));
}

async fn stale_relay_cannot_overwrite_a_newer_claim(t: TestDb) {
    let outbox = Outbox::new("carts");
    produce(&t, &outbox, 2, 1, 10).await;
    // Relay A claims with a lease that has already run out (it hung).
    let a = claim(
        &t.db,
        &ClaimParams {
            owner: "relay-a",
            batch_size: 10,
            lease: Duration::ZERO,
            ordering: true,
            max_attempts: 5,
        },
    )
    .await
    .unwrap();
    assert_eq!(a.events.len(), 2);
    // The lease ends when it is taken; a moment later, by the database's clock, it has expired.
    tokio::time::sleep(LEASE_RUNS_OUT).await;
    // Relay B reclaims both: the expired lease counts an attempt.
    let b = claim(
        &t.db,
        &ClaimParams {
            owner: "relay-b",
            batch_size: 10,
            lease: std::time::Duration::from_secs(30),
            ordering: true,
            max_attempts: 5,
        },
    )
    .await
    .unwrap();
    assert_eq!(b.events.len(), 2);
    assert!(b.events.iter().all(|e| e.reclaimed && e.attempts == 1));
    assert_ne!(a.token, b.token);
    // A wakes up and tries to mark one SENT and release the other: fenced off.
    let stale = settle(
        &t.db,
        Fence::Claim(a.token),
        &Settlement {
            sent: vec![a.events[0].id],
            released: vec![a.events[1].id],
            ..Settlement::default()
        },
    )
    .await
    .unwrap();
    assert_eq!((stale.sent, stale.released), (0, 0));
    let rows = outbox_rows(&t.db).await;
    assert!(
        rows.iter()
            .all(|r| r.status == "PROCESSING" && r.locked_by.as_deref() == Some("relay-b"))
    );
    // B's own writes go through.
    let fresh = settle(
        &t.db,
        Fence::Claim(b.token),
        &Settlement {
            sent: b.events.iter().map(|e| e.id).collect(),
            ..Settlement::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(fresh.sent, 2);
    let rows = outbox_rows(&t.db).await;
    assert!(
        rows.iter()
            .all(|r| r.status == "SENT" && r.attempts == 1 && r.claim_token == Some(b.token))
    );
}

async fn expired_leases_end_dead(t: TestDb) {
    let outbox = Outbox::new("carts");
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.enqueue(&LineAdded {
        cart: "hang".into(),
        seq: 0,
    })
    .unwrap();
    tx.enqueue(&LineAdded {
        cart: "hang".into(),
        seq: 1,
    })
    .unwrap();
    let _ = tx.commit().await.unwrap();
    let expired = |relay_id: &'static str| ClaimParams {
        owner: relay_id,
        batch_size: 1,
        lease: Duration::ZERO,
        ordering: true,
        max_attempts: 3,
    };
    // A relay that crashes mid-publish, three times over.
    for (i, relay) in ["r1", "r2", "r3"].into_iter().enumerate() {
        let c = claim(&t.db, &expired(relay)).await.unwrap();
        assert_eq!(c.events.len(), 1, "claim {i}");
        assert_eq!(c.events[0].attempts, i as u32);
        tokio::time::sleep(LEASE_RUNS_OUT).await;
    }
    let c = claim(&t.db, &expired("r4")).await.unwrap();
    assert!(
        c.events.is_empty(),
        "the poison event is not handed out again"
    );
    assert_eq!(c.dead.len(), 1);
    let rows = outbox_rows(&t.db).await;
    assert_eq!(rows[0].status, "DEAD");
    assert_eq!(rows[0].attempts, 3);
    assert!(
        rows[0]
            .last_error
            .as_deref()
            .unwrap()
            .contains("lease expired")
    );
    assert_eq!(rows[0].failure_class.as_deref(), Some("LEASE_EXPIRED"));
    assert_eq!(rows[1].status, "PENDING", "its successor waits behind it");
}

async fn lost_confirm_is_republished_and_deduplicated(t: TestDb) {
    let outbox = Outbox::new("carts");
    produce(&t, &outbox, 1, 3, 10).await;
    let transport = MemoryTransport::new().deduplicate(true);
    transport.lose_next_confirms(1);
    let relay = Relay::new(t.db.clone(), Arc::new(transport.clone())).with_config(
        config(10).backoff(
            Backoff::default()
                .base(Duration::from_millis(1))
                .cap(Duration::from_millis(1))
                .jitter(0.0),
        ),
    );
    let first = relay.run_once().await.unwrap();
    assert_eq!((first.sent, first.retried, first.released), (0, 1, 2));
    assert_eq!(
        transport.len(),
        1,
        "the broker stored the message whose confirm was lost"
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    relay.drain(10).await.unwrap();
    assert_eq!(status_counts(&t.db).await.get("SENT"), Some(&3));
    assert_eq!(transport.len(), 3);
    assert_eq!(
        transport.duplicates_dropped(),
        1,
        "the republish was dropped by the broker"
    );
    assert_strictly_increasing(&log_order(&transport.messages()), 3);
}

async fn commit_wakes_the_relay_before_the_poll_interval(t: TestDb) {
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let relay = Relay::new(t.db.clone(), Arc::new(transport.clone()))
        .with_config(config(100).poll_interval(Duration::from_secs(30)))
        .with_outbox(&outbox)
        .spawn();
    // Let it finish its first (empty) round and go to sleep.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    produce(&t, &outbox, 1, 1, 1).await;
    assert_eq!(transport.wait_for(1, Duration::from_secs(10)).await, 1);
    let latency = started.elapsed();
    relay.shutdown().await.unwrap();
    assert!(
        latency < Duration::from_secs(10),
        "woken by the commit, not the 30 s poll ({latency:?})"
    );
}

/// A relay claims the next batch while the last one is being published. An event committed
/// behind an aggregate whose earlier event is still in flight cannot be taken by that claim; the
/// relay looks again once the round in flight settles, instead of waiting for its poll.
async fn event_behind_a_round_in_flight_is_not_left_to_the_poll(t: TestDb) {
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    transport.delay_confirms(Duration::from_millis(400));
    let relay = Relay::new(t.db.clone(), Arc::new(transport.clone()))
        .with_config(
            config(100)
                .poll_interval(Duration::from_secs(60))
                .listen(false),
        )
        .with_outbox(&outbox)
        .spawn();
    tokio::time::sleep(Duration::from_millis(300)).await; // the first, empty round is over
    let line = |cart: &str, seq: u32| LineAdded {
        cart: cart.into(),
        seq,
    };
    let commit = |events: Vec<LineAdded>| {
        let outbox = outbox.clone();
        let db = t.db.clone();
        async move {
            let tx = outbox.begin(&db).await.unwrap();
            for e in &events {
                tx.enqueue(e).unwrap();
            }
            let _ = tx.commit().await.unwrap();
        }
    };
    let started = Instant::now();
    commit(vec![line("a", 0)]).await;
    // a/0 is claimed and waits for its confirm; a/1 and b/0 arrive meanwhile.
    tokio::time::sleep(Duration::from_millis(150)).await;
    commit(vec![line("a", 1), line("b", 0)]).await;
    let got = transport.wait_for(3, Duration::from_secs(20)).await;
    let elapsed = started.elapsed();
    relay.shutdown().await.unwrap();
    assert_eq!(got, 3, "every event published");
    assert!(
        elapsed < Duration::from_secs(20),
        "not left to the 60 s poll ({elapsed:?})"
    );
    assert_eq!(status_counts(&t.db).await.get("SENT"), Some(&3));
    let order = log_order(&transport.messages());
    assert_eq!(order["a"], vec![0, 1], "a/0 before a/1");
}

async fn shutdown_during_backlog_loses_nothing(t: TestDb) {
    let outbox = Outbox::new("carts");
    let total = produce(&t, &outbox, 40, 25, 200).await;
    let transport = MemoryTransport::new();
    transport.delay_confirms(Duration::from_millis(15));
    let relay = Relay::new(t.db.clone(), Arc::new(transport.clone()))
        .with_config(config(50))
        .spawn();
    assert!(transport.wait_for(60, Duration::from_secs(30)).await >= 60);
    relay.shutdown().await.unwrap();
    let counts = status_counts(&t.db).await;
    assert_eq!(
        counts.get("PROCESSING"),
        None,
        "no claim left behind: {counts:?}"
    );
    let sent = counts.get("SENT").copied().unwrap_or(0);
    assert!(
        sent > 0 && (sent as usize) < total,
        "stopped mid-backlog: {counts:?}"
    );
    assert_eq!(
        transport.len(),
        sent as usize,
        "exactly the SENT events were published"
    );
    assert!(
        outbox_rows(&t.db).await.iter().all(|r| r.attempts == 0),
        "shutdown charges no attempt"
    );

    transport.delay_confirms(Duration::ZERO);
    let relay = Relay::new(t.db.clone(), Arc::new(transport.clone())).with_config(config(500));
    relay.drain(100).await.unwrap();
    assert_eq!(
        status_counts(&t.db).await.get("SENT"),
        Some(&(total as i64))
    );
    assert_eq!(
        transport.len(),
        total,
        "nothing published twice, nothing lost"
    );
    assert_strictly_increasing(&log_order(&transport.messages()), 25);
}

async fn unordered_mode_publishes_in_one_wave(t: TestDb) {
    let outbox = Outbox::new("carts");
    let total = produce(&t, &outbox, 2, 50, 100).await;
    let transport = MemoryTransport::new();
    let relay = Relay::new(t.db.clone(), Arc::new(transport.clone()))
        .with_config(config(500).ordering(false));
    let report = relay.run_once().await.unwrap();
    assert_eq!(report.sent, total);
    assert_eq!(
        transport.publish_calls(),
        1,
        "one pipelined batch without ordering"
    );
}

/// A broker outage longer than the whole retry budget (3 attempts, 10 to 40 ms apart) spends no
/// attempt: the relay hands its claim back, claims nothing while the broker's health check
/// fails, and publishes everything in order once it answers again. A retry that an earlier
/// outage pushed back becomes due at once; one that failed on its own keeps its due time.
async fn an_outage_longer_than_the_retry_budget_spends_no_attempt(t: TestDb) {
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let relay = Relay::new(t.db.clone(), Arc::new(transport.clone())).with_config(
        config(8)
            .max_attempts(3)
            .backoff(
                Backoff::default()
                    .base(Duration::from_millis(10))
                    .cap(Duration::from_millis(40))
                    .jitter(0.0),
            )
            .probe(
                Backoff::default()
                    .base(Duration::from_millis(20))
                    .cap(Duration::from_millis(200))
                    .jitter(0.2),
            ),
    );
    let handle = relay.spawn();
    // The broker goes away once the relay is running; then events are committed.
    tokio::time::sleep(Duration::from_millis(100)).await;
    transport.set_unavailable(true);
    let total = produce(&t, &outbox, 4, 5, 20).await;
    // Many times the retry budget.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rows = outbox_rows(&t.db).await;
    assert!(
        rows.iter()
            .all(|r| r.status == "PENDING" && r.attempts == 0),
        "the outage spent attempts: {rows:?}"
    );
    assert!(transport.is_empty());
    assert!(
        handle.stats().outages >= 1,
        "the relay saw the outage: {:?}",
        handle.stats()
    );
    // `outbox status` tells the outage: the relay's breaker is open, the backlog waits for it.
    let status = admin::status(&t.db).await.unwrap();
    assert_eq!(status.relays.len(), 1, "{:#?}", status.relays);
    let seen = &status.relays[0];
    assert!(seen.current && !seen.broker_available, "{seen:#?}");
    assert_eq!(seen.transport, "memory");
    assert!(
        (1..=total as u64).contains(&seen.held_back),
        "the claim handed back is counted: {seen:#?}"
    );
    assert_eq!(seen.outages, 1, "{seen:#?}");
    assert!(
        seen.unavailable_for
            .is_some_and(|d| d >= Duration::from_secs(1)),
        "{seen:#?}"
    );
    assert!(
        seen.last_error
            .as_deref()
            .is_some_and(|e| e.contains("unavailable")),
        "{seen:#?}"
    );
    assert!(status.broker_unavailable());
    assert_eq!(status.outbox.delayed_by_outage, total as u64);

    let calls_while_down = transport.publish_calls();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        transport.publish_calls(),
        calls_while_down,
        "nothing is published while the broker is unavailable"
    );

    // Retries of four later events, all due in an hour: two failed by the previous release
    // (no `failure_class`; only `last_error`'s wording tells an outage), two by this one, whose
    // class decides whatever the wording says.
    let backend = t.db.get_database_backend();
    let retry = |id: i64, class: Option<&str>, error: &str| {
        let sql = if backend == DbBackend::Postgres {
            "UPDATE outbox_event SET status = 'RETRY', attempts = 1, failure_class = $1, \
             last_error = $2, next_attempt_at = $3 WHERE id = $4"
        } else {
            "UPDATE outbox_event SET status = 'RETRY', attempts = 1, failure_class = ?, \
             last_error = ?, next_attempt_at = ? WHERE id = ?"
        };
        Statement::from_sql_and_values(
            backend,
            sql,
            [
                class.map(str::to_owned).into(),
                error.into(),
                t.dialect()
                    .timestamp(chrono::Utc::now() + chrono::Duration::hours(1)),
                id.into(),
            ],
        )
    };
    // One cart each, so that no retry holds another back.
    for cart in ["retry-a", "retry-b", "retry-c", "retry-d"] {
        commit_lines(outbox.begin(&t.db).await.unwrap(), &[(cart, 0)]).await;
    }
    let last = outbox_rows(&t.db).await;
    let [legacy_outage, legacy_own, outage_id, own_id] = [0, 1, 2, 3].map(|i| last[total + i].id);
    for (id, class, error) in [
        (
            legacy_outage,
            None,
            "broker connection failed: reset by peer",
        ),
        (legacy_own, None, "broker rejected the message: no route"),
        (
            outage_id,
            Some("CONNECTION"),
            "the link to the broker went away",
        ),
        (
            own_id,
            Some("REJECTED"),
            "broker connection failed: looks like an outage",
        ),
    ] {
        t.db.execute_raw(retry(id, class, error)).await.unwrap();
    }

    let back = Instant::now();
    transport.set_unavailable(false);
    let drained = eventually(Duration::from_secs(10), || async {
        status_counts(&t.db).await.get("SENT").copied().unwrap_or(0) == total as i64 + 2
    })
    .await;
    let took = back.elapsed();
    let status = admin::status(&t.db).await.unwrap();
    let stats = handle.shutdown().await.unwrap();
    assert!(drained, "drained within 10 s of the broker's return");
    let seen = &status.relays[0];
    assert!(seen.current && seen.broker_available, "{seen:#?}");
    assert_eq!(
        (seen.held_back, seen.outages, seen.unavailable_for),
        (0, stats.outages, None),
        "{seen:#?}"
    );
    assert!(
        seen.broker_seen_ago
            .is_some_and(|d| d < Duration::from_secs(10)),
        "{seen:#?}"
    );
    assert_eq!(status.outbox.delayed_by_outage, 0);
    assert!(
        admin::status(&t.db).await.unwrap().relays.is_empty(),
        "a relay that stopped removes its row"
    );
    eprintln!("relay outage (memory): drained {total} events {took:.2?} after the broker's return");
    let rows = outbox_rows(&t.db).await;
    for own_id in [legacy_own, own_id] {
        let own = rows.iter().find(|r| r.id == own_id).unwrap();
        assert_eq!(
            (own.status.as_str(), own.attempts),
            ("RETRY", 1),
            "a retry of the message's own failure keeps its due time: {own:?}"
        );
    }
    assert!(
        rows.iter()
            .filter(|r| r.id != own_id && r.id != legacy_own)
            .all(|r| r.status == "SENT"
                && r.failure_class.is_none()
                && r.attempts == i64::from(r.id == outage_id || r.id == legacy_outage)),
        "{rows:?}"
    );
    assert_eq!(stats.dead, 0);
    let messages: Vec<_> = transport
        .messages()
        .into_iter()
        .filter(|m| rows[..total].iter().any(|r| r.event_id == m.event_id))
        .collect();
    assert_strictly_increasing(&log_order(&messages), 5);
}

/// An idle relay (nothing to publish) finds an outage by its heartbeat's health check, and
/// `outbox status` shows it until the broker answers again.
async fn idle_relay_reports_the_outage(t: TestDb) {
    let transport = MemoryTransport::new();
    let handle = Relay::new(t.db.clone(), Arc::new(transport.clone()))
        .with_config(config(8).heartbeat(Duration::from_millis(100)))
        .spawn();
    let broker = |available: bool| {
        let db = t.db.clone();
        async move {
            let status = admin::status(&db).await.unwrap();
            status.relays.len() == 1
                && status.relays[0].current
                && status.relays[0].broker_available == available
        }
    };
    assert!(eventually(Duration::from_secs(10), || broker(true)).await);
    transport.set_unavailable(true);
    assert!(
        eventually(Duration::from_secs(10), || broker(false)).await,
        "{:#?}",
        admin::status(&t.db).await.unwrap().relays
    );
    let status = admin::status(&t.db).await.unwrap();
    assert_eq!(status.relays[0].held_back, 0, "nothing was claimed");
    assert_eq!(status.outbox.delayed_by_outage, 0, "nothing waits");
    transport.set_unavailable(false);
    assert!(eventually(Duration::from_secs(10), || broker(true)).await);
    let stats = handle.shutdown().await.unwrap();
    assert_eq!(stats.outages, 1);
    assert_eq!(transport.publish_calls(), 0);
}

/// Single rounds (`run_once`, `drain`) during an outage hand their claims back without
/// attempts, and the next round after the broker's return publishes.
async fn single_rounds_try_the_broker_each_time(t: TestDb) {
    let outbox = Outbox::new("carts");
    let total = produce(&t, &outbox, 2, 3, 6).await;
    let transport = MemoryTransport::new();
    let relay = Relay::new(t.db.clone(), Arc::new(transport.clone())).with_config(config(10));
    transport.set_unavailable(true);
    let down = relay.drain(3).await.unwrap();
    assert_eq!((down.sent, down.retried, down.dead), (0, 0, 0), "{down:?}");
    assert!(down.released >= 2, "the claims were handed back: {down:?}");
    assert!(outbox_rows(&t.db).await.iter().all(|r| r.attempts == 0));
    transport.set_unavailable(false);
    let back = relay.drain(10).await.unwrap();
    assert_eq!(back.sent, total, "{back:?}");
    assert_strictly_increasing(&log_order(&transport.messages()), 3);
}

/// After an outage the broker is on trial until it confirms a publish: a timeout while its
/// health check answers is still the broker's (no attempt), as a broker that has just restarted
/// answers a ping before it confirms publishes. Outside a trial a timeout counts, and a trial
/// that runs out is not renewed by the outages it finds, so a message the broker never confirms
/// still ends DEAD. Lost confirms (stored, reported unconfirmed) stand for the timeouts.
async fn a_returned_broker_is_on_trial_until_it_confirms(t: TestDb) {
    let outbox = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let handle = Relay::new(t.db.clone(), Arc::new(transport.clone()))
        .with_config(
            config(8)
                .max_attempts(3)
                .probe(
                    Backoff::default()
                        .base(Duration::from_millis(20))
                        .cap(Duration::from_millis(100))
                        .jitter(0.0),
                )
                .recovery_trial(Duration::from_secs(2)),
        )
        .spawn();
    let row = |index: usize| {
        let db = t.db.clone();
        async move { outbox_rows(&db).await.into_iter().nth(index) }
    };
    let sent = |index: usize| {
        let row = row(index);
        async move { row.await.is_some_and(|r| r.status == "SENT") }
    };

    // 1. An outage (once the relay has set up); on the broker's return its first three
    //    publishes go unconfirmed.
    tokio::time::sleep(Duration::from_millis(200)).await;
    transport.set_unavailable(true);
    produce(&t, &outbox, 1, 1, 1).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            handle.stats().outages >= 1
        })
        .await,
        "{:?} {:?}",
        handle.stats(),
        outbox_rows(&t.db).await
    );
    transport.lose_next_confirms(3);
    transport.set_unavailable(false);
    assert!(eventually(Duration::from_secs(10), || sent(0)).await);
    let first = row(0).await.unwrap();
    assert_eq!(
        first.attempts, 0,
        "the trial's timeouts are the broker's: {first:?}"
    );
    assert!(
        handle.stats().outages >= 2,
        "each unconfirmed trial publish waits for the broker again: {:?}",
        handle.stats()
    );

    // 2. The broker confirmed: a timeout is the message's again.
    transport.lose_next_confirms(1);
    produce(&t, &outbox, 1, 1, 1).await;
    assert!(eventually(Duration::from_secs(10), || sent(1)).await);
    assert_eq!(
        row(1).await.unwrap().attempts,
        1,
        "a timeout outside a trial counts"
    );

    // 3. Another outage, and a broker that never confirms again: the trial runs out and the
    //    message spends its attempts.
    transport.set_unavailable(true);
    let outages = handle.stats().outages;
    produce(&t, &outbox, 1, 1, 1).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            handle.stats().outages > outages
        })
        .await
    );
    transport.lose_next_confirms(usize::MAX);
    transport.set_unavailable(false);
    let dead = eventually(Duration::from_secs(20), || async {
        row(2).await.is_some_and(|r| r.status == "DEAD")
    })
    .await;
    let third = row(2).await.unwrap();
    let stats = handle.shutdown().await.unwrap();
    assert!(
        dead,
        "ends DEAD once the trial is over: {third:?} {stats:?}"
    );
    assert_eq!(third.attempts, 3, "{third:?}");
    assert!(
        third
            .last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("no confirmation from the broker")),
        "{third:?}"
    );
    assert_eq!(third.failure_class.as_deref(), Some("TIMEOUT"), "{third:?}");
}

backend_tests! {
    recovery_trial => a_returned_broker_is_on_trial_until_it_confirms;
    outage_spends_no_attempt => an_outage_longer_than_the_retry_budget_spends_no_attempt;
    single_rounds_after_outage => single_rounds_try_the_broker_each_time;
    idle_outage => idle_relay_reports_the_outage;
    four_relays => four_relays_publish_each_event_once;
    order_random_failures => order_survives_random_failures_and_four_relays;
    backoff_dead => failures_back_off_then_dead_while_others_flow;
    permanent => permanent_rejection_is_dead_at_once;
    fencing => stale_relay_cannot_overwrite_a_newer_claim;
    lease_dead => expired_leases_end_dead;
    lost_confirm => lost_confirm_is_republished_and_deduplicated;
    wakeup => commit_wakes_the_relay_before_the_poll_interval;
    behind_in_flight => event_behind_a_round_in_flight_is_not_left_to_the_poll;
    shutdown => shutdown_during_backlog_loses_nothing;
    unordered => unordered_mode_publishes_in_one_wave;
}

/// PostgreSQL only: a commit in another process (another pool and `Outbox` handle) wakes the
/// relay through LISTEN/NOTIFY long before its 30 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_from_another_process_wakes_the_relay() {
    let Some(t) = test_db(Backend::Postgres, "relay_notify_pg").await else {
        return;
    };
    let relay_side = Outbox::new("carts");
    let transport = MemoryTransport::new();
    let relay = Relay::new(t.db.clone(), Arc::new(transport.clone()))
        .with_config(config(100).poll_interval(Duration::from_secs(30)))
        .with_outbox(&relay_side)
        .spawn();
    tokio::time::sleep(Duration::from_millis(500)).await; // first round done, LISTEN in place

    let other_db = t.connect_again().await;
    let producer = Outbox::new("carts"); // another handle: no in-process signal reaches the relay
    let tx = producer.begin(&other_db).await.unwrap();
    tx.enqueue(&LineAdded {
        cart: "x".into(),
        seq: 0,
    })
    .unwrap();
    let _ = tx.commit().await.unwrap();
    let got = transport.wait_for(1, Duration::from_secs(10)).await;
    relay.shutdown().await.unwrap();
    assert_eq!(got, 1, "woken by NOTIFY, not by the 30 s poll");
}
