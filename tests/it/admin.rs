//! The admin API and the retention purge on real PostgreSQL, MariaDB and SQLite: status counts
//! and ages, dead letters listed, shown, replayed (and then published), ignored and resent, the
//! status guard on every change, the audit log, doctor, batched purges and the janitor lease.

use std::{sync::Arc, time::Duration};

use crate::common::carts::*;
use crate::common::*;
use chrono::{DateTime, Utc};
use outbox::admin::{
    self, Actor, AdminError, DeadLetterFilter, DoctorOptions, Page, Resend, Selector, SentFilter,
    Severity, Source, Target,
};
use outbox::prelude::*;
use outbox::relay::{Backoff, Relay, RelayConfig};
use outbox::retention::{self, RetentionError, RetentionPolicy};
use outbox::store::Failure;
use outbox::store::claim::ClaimParams;
use outbox::store::inbox::{InboxState as InitialState, NewInboxRow, insert};
use outbox::transport::OutgoingMessage;
use outbox::transport::memory::MemoryTransport;
use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait, Value};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "payment.failed", aggregate = "payment")]
struct PaymentFailed {
    #[event(aggregate_id)]
    payment: String,
    amount: u32,
}

fn relay_config() -> RelayConfig {
    RelayConfig::default()
        .relay_id("admin-test")
        .batch_size(100)
        .max_attempts(3)
        .backoff(
            Backoff::default()
                .base(Duration::from_millis(10))
                .cap(Duration::from_millis(50))
                .jitter(0.0),
        )
}

fn relay(t: &TestDb, transport: &MemoryTransport) -> Relay {
    Relay::new(t.db.clone(), Arc::new(transport.clone())).with_config(relay_config())
}

/// Run `sql` with `?` placeholders (numbered for PostgreSQL); returns the rows affected.
pub(crate) async fn exec<C: ConnectionTrait>(db: &C, sql: &str, values: Vec<Value>) -> u64 {
    let backend = db.get_database_backend();
    let sql = placeholders(backend, sql);
    db.execute_raw(Statement::from_sql_and_values(backend, sql, values))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .rows_affected()
}

fn placeholders(backend: DbBackend, sql: &str) -> String {
    if backend != DbBackend::Postgres {
        return sql.to_owned();
    }
    let mut out = String::new();
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(c);
        }
    }
    out
}

pub(crate) fn ago(d: Duration) -> DateTime<Utc> {
    Utc::now() - chrono::Duration::from_std(d).unwrap()
}

pub(crate) const MIN: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3_600);
const DAY: Duration = Duration::from_secs(86_400);

/// Insert an inbox row as the SDK records a delivery; returns its id.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn inbox_row(
    t: &TestDb,
    consumer: &str,
    message_id: &str,
    event_type: &str,
    aggregate_id: &str,
    payload: &[u8],
    state: InitialState,
    at: DateTime<Utc>,
) -> i64 {
    let row = NewInboxRow {
        consumer,
        message_id,
        event_type: Some(event_type),
        source: Some("test"),
        aggregate_type: Some("cart"),
        aggregate_id: Some(aggregate_id),
        aggregate_version: None,
        schema_version: Some(1),
        payload,
        ..NewInboxRow::default()
    };
    assert!(insert(&t.db, &row, &state).await.unwrap());
    backdate_inbox(&t.db, consumer, Some(message_id), at).await;
    inbox_id(t, consumer, message_id).await
}

async fn inbox_id(t: &TestDb, consumer: &str, message_id: &str) -> i64 {
    let backend = t.db.get_database_backend();
    let row =
        t.db.query_one_raw(Statement::from_sql_and_values(
            backend,
            placeholders(
                backend,
                &format!(
                    "SELECT id FROM {} WHERE consumer = ? AND message_id = ?",
                    inbox_source(backend)
                ),
            ),
            [consumer.into(), message_id.into()],
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get("", "id").unwrap()
}

/// One inbox row's (status, attempts, last_error, next_attempt_at, processed_at).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct InboxState {
    pub(crate) status: String,
    pub(crate) attempts: i64,
    pub(crate) last_error: Option<String>,
    pub(crate) next_attempt_at: Option<DateTime<Utc>>,
    pub(crate) processed_at: Option<DateTime<Utc>>,
}

pub(crate) async fn inbox_state(t: &TestDb, id: i64) -> InboxState {
    let d = t.dialect();
    let backend = d.backend();
    let cast = if backend == DbBackend::MySql {
        "SIGNED"
    } else {
        "BIGINT"
    };
    let row =
        t.db.query_one_raw(Statement::from_sql_and_values(
            backend,
            placeholders(
                backend,
                &format!(
                    "SELECT status, CAST(attempts AS {cast}) AS attempts, last_error, \
                     next_attempt_at, processed_at FROM {} WHERE id = ?",
                    inbox_source(backend)
                ),
            ),
            [id.into()],
        ))
        .await
        .unwrap()
        .unwrap();
    InboxState {
        status: row.try_get("", "status").unwrap(),
        attempts: row.try_get("", "attempts").unwrap(),
        last_error: row.try_get("", "last_error").unwrap(),
        next_attempt_at: d.get_opt_timestamp(&row, "next_attempt_at").unwrap(),
        processed_at: d.get_opt_timestamp(&row, "processed_at").unwrap(),
    }
}

pub(crate) async fn outbox_row(t: &TestDb, id: i64) -> OutboxRow {
    outbox_rows(&t.db)
        .await
        .into_iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("outbox row {id} missing"))
}

/// The fixture most tests share.
///
/// Outbox: carts cart-0..2 with lines seq 0 and 1, payments pay-0 and pay-1; the transport rejects
/// cart-1 and pay-1 permanently, so cart-1 seq 0 and pay-1 are DEAD (created 20 and 40 minutes
/// ago), cart-1 seq 1 is PENDING behind its dead predecessor, the other five are SENT.
///
/// Inbox: `inventory` has m-1 DEAD ("Stock service timeout", 60 min ago), m-2 DEAD with an
/// invalid UTF-8 payload ("invalid sku 50%_off", 30 min ago), m-3 DONE, m-4 PENDING (5 min ago);
/// `billing` has m-5 DEAD ("upstream TIMEOUT", 10 min ago) and m-6 RETRY (2 min ago).
#[derive(Debug)]
pub(crate) struct Fixture {
    pub(crate) dead_cart: OutboxRow,
    pub(crate) held_cart: OutboxRow,
    pub(crate) dead_payment: OutboxRow,
    pub(crate) sent: Vec<OutboxRow>,
    pub(crate) m1: i64,
    pub(crate) m2: i64,
    pub(crate) m3: i64,
    pub(crate) m4: i64,
    pub(crate) m5: i64,
    pub(crate) m6: i64,
}

pub(crate) async fn fixture(t: &TestDb) -> Fixture {
    let outbox = Outbox::new("admin-tests");
    let tx = outbox.begin(&t.db).await.unwrap();
    for seq in 0..2 {
        for cart in 0..3 {
            tx.enqueue(&LineAdded {
                cart: format!("cart-{cart}"),
                seq,
            })
            .unwrap();
        }
    }
    for payment in 0..2 {
        tx.enqueue(&PaymentFailed {
            payment: format!("pay-{payment}"),
            amount: 100,
        })
        .unwrap();
    }
    let _ = tx.commit().await.unwrap();
    let transport = MemoryTransport::new();
    transport.reject_permanently(Some(|m: &OutgoingMessage| {
        m.aggregate_id == "cart-1" || m.aggregate_id == "pay-1"
    }));
    let report = relay(t, &transport).drain(10).await.unwrap();
    assert_eq!((report.sent, report.dead), (5, 2), "{report:?}");

    let rows = outbox_rows(&t.db).await;
    let find = |aggregate: &str, status: &str| {
        rows.iter()
            .find(|r| r.aggregate_id == aggregate && r.status == status)
            .cloned()
            .unwrap_or_else(|| panic!("no {status} row of {aggregate}: {rows:?}"))
    };
    let dead_cart = find("cart-1", "DEAD");
    let held_cart = find("cart-1", "PENDING");
    let dead_payment = find("pay-1", "DEAD");
    let d = t.dialect();
    exec(
        &t.db,
        "UPDATE outbox_event SET created_at = ? WHERE id = ?",
        vec![d.timestamp(ago(20 * MIN)), dead_cart.id.into()],
    )
    .await;
    exec(
        &t.db,
        "UPDATE outbox_event SET created_at = ? WHERE id = ?",
        vec![d.timestamp(ago(40 * MIN)), dead_payment.id.into()],
    )
    .await;
    let sent = rows
        .iter()
        .filter(|r| r.status == "SENT")
        .cloned()
        .collect();

    let dead = |error: &str| {
        InitialState::Failed(Failure::Dead {
            attempts: 4,
            error: error.to_owned(),
        })
    };
    let json = br#"{"specversion":"1.0","id":"m","type":"line.added"}"#;
    let m1 = inbox_row(
        t,
        "inventory",
        "m-1",
        "line.added",
        "cart-5",
        json,
        dead("Stock service timeout"),
        ago(60 * MIN),
    )
    .await;
    let m2 = inbox_row(
        t,
        "inventory",
        "m-2",
        "payment.failed",
        "pay-9",
        b"{\"broken\": \xff\xfe}",
        dead("invalid sku 50%_off"),
        ago(30 * MIN),
    )
    .await;
    let m3 = inbox_row(
        t,
        "inventory",
        "m-3",
        "line.added",
        "cart-6",
        json,
        InitialState::Done,
        ago(50 * MIN),
    )
    .await;
    let m4 = inbox_row(
        t,
        "inventory",
        "m-4",
        "line.added",
        "cart-7",
        json,
        InitialState::Pending,
        ago(5 * MIN),
    )
    .await;
    let m5 = inbox_row(
        t,
        "billing",
        "m-5",
        "line.added",
        "cart-8",
        json,
        dead("upstream TIMEOUT"),
        ago(10 * MIN),
    )
    .await;
    let m6 = inbox_row(
        t,
        "billing",
        "m-6",
        "line.added",
        "cart-9",
        json,
        InitialState::Failed(Failure::Retry {
            attempts: 1,
            delay: HOUR,
            error: "flaky".into(),
        }),
        ago(2 * MIN),
    )
    .await;
    Fixture {
        dead_cart,
        held_cart,
        dead_payment,
        sent,
        m1,
        m2,
        m3,
        m4,
        m5,
        m6,
    }
}

/// An age read back is about the one written: the fixture's times carry microseconds, while a
/// backend's clock may be read to the millisecond (SQLite), so an age can come back a fraction of
/// a millisecond short: allowed a second below and a minute above.
fn assert_about(actual: Option<Duration>, expected: Duration, what: &str) {
    let actual = actual.unwrap_or_else(|| panic!("{what}: no age"));
    assert!(
        actual + Duration::from_secs(1) > expected && actual < expected + Duration::from_secs(60),
        "{what}: {actual:?}, expected about {expected:?}"
    );
}

async fn status_reports_counts_ages_and_stuck_rows(t: TestDb) {
    let empty = admin::status(&t.db).await.unwrap();
    assert_eq!(empty.outbox.total, 0);
    assert!(empty.outbox.counts.values().all(|n| *n == 0));
    assert_eq!(empty.outbox.counts.len(), 5, "every status listed");
    assert!(empty.consumers.is_empty());
    assert_eq!(empty.outbox.oldest_unsent_age, None);

    let f = fixture(&t).await;
    let d = t.dialect();
    // The held-back event is claimed by a relay that died 1 minute ago; it was enqueued 10
    // minutes ago.
    exec(
        &t.db,
        "UPDATE outbox_event SET status = 'PROCESSING', locked_by = 'gone', locked_until = ?, created_at = ? WHERE id = ?",
        vec![
            d.timestamp(ago(MIN)),
            d.timestamp(ago(10 * MIN)),
            f.held_cart.id.into(),
        ],
    )
    .await;
    // A billing message stuck the same way.
    let m7 = inbox_row(
        &t,
        "billing",
        "m-7",
        "line.added",
        "cart-10",
        b"{}",
        InitialState::Pending,
        ago(MIN),
    )
    .await;
    exec(
        &t.db,
        "UPDATE inbox_event SET status = 'PROCESSING', locked_until = ? WHERE id = ?",
        vec![d.timestamp(ago(3 * MIN)), m7.into()],
    )
    .await;

    let status = admin::status(&t.db).await.unwrap();
    let o = &status.outbox;
    let counts: Vec<(&str, u64)> = o.counts.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(
        counts,
        [
            ("DEAD", 2),
            ("PENDING", 0),
            ("PROCESSING", 1),
            ("RETRY", 0),
            ("SENT", 5)
        ]
    );
    assert_eq!((o.total, o.backlog, o.dead, o.stuck), (8, 1, 2, 1));
    assert_about(o.oldest_unsent_age, 10 * MIN, "oldest unsent");
    assert!(o.stuck_since.unwrap() <= ago(MIN));

    let names: Vec<&str> = status
        .consumers
        .iter()
        .map(|c| c.consumer.as_str())
        .collect();
    assert_eq!(names, ["billing", "inventory"]);
    let billing = &status.consumers[0];
    assert_eq!(billing.counts["DEAD"], 1);
    assert_eq!(billing.counts["RETRY"], 1);
    assert_eq!(billing.counts["PROCESSING"], 1);
    assert_eq!(
        (billing.total, billing.backlog, billing.dead, billing.stuck),
        (3, 2, 1, 1)
    );
    // Lag: the RETRY message received 2 minutes ago (the DEAD one is older, but not moving).
    assert_about(billing.lag, 2 * MIN, "billing lag");
    let inventory = &status.consumers[1];
    assert_eq!(inventory.counts["DEAD"], 2);
    assert_eq!(inventory.counts["DONE"], 1);
    assert_eq!(inventory.counts["PENDING"], 1);
    assert_eq!(inventory.counts["IGNORED"], 0);
    assert_eq!(
        (
            inventory.total,
            inventory.backlog,
            inventory.dead,
            inventory.stuck
        ),
        (4, 1, 2, 0)
    );
    assert_about(inventory.lag, 5 * MIN, "inventory lag");
    assert_eq!(status.dead_total(), 5);
    assert_eq!(status.stuck_total(), 2);
    let _ = (f.m1, f.m2, f.m3, f.m4, f.m5, f.m6);
}

async fn dead_letters_filter_and_paginate(t: TestDb) {
    let f = fixture(&t).await;
    let ids = |list: Vec<admin::DeadLetter>| -> Vec<String> {
        list.into_iter().map(|d| d.target.to_string()).collect()
    };
    let cart = Target::outbox(f.dead_cart.id).to_string();
    let payment = Target::outbox(f.dead_payment.id).to_string();
    let [m1, m2, m5] = [f.m1, f.m2, f.m5].map(|id| Target::inbox(id).to_string());

    // Newest first across both tables: m-5 (10 min), cart-1 (20), m-2 (30), pay-1 (40), m-1 (60).
    let all = admin::dead_letters(&t.db, &DeadLetterFilter::default(), Page::default())
        .await
        .unwrap();
    let (cart, payment, m1, m2, m5) = (
        cart.as_str(),
        payment.as_str(),
        m1.as_str(),
        m2.as_str(),
        m5.as_str(),
    );
    let expected = [m5, cart, m2, payment, m1];
    assert_eq!(ids(all.clone()), expected);
    let first = &all[1];
    assert_eq!(first.message_id, f.dead_cart.event_id.to_string());
    assert_eq!(first.event_type.as_deref(), Some("line.added"));
    assert_eq!(first.aggregate_id.as_deref(), Some("cart-1"));
    assert_eq!(first.attempts, 1);
    assert!(first.last_error.as_deref().unwrap().contains("permanently"));
    assert_eq!(all[0].consumer.as_deref(), Some("billing"));
    assert_eq!(all[0].attempts, 4);

    // Pages of two cover everything once, in order.
    let mut paged = Vec::new();
    for number in 1..=4 {
        let page =
            admin::dead_letters(&t.db, &DeadLetterFilter::default(), Page::number(number, 2))
                .await
                .unwrap();
        assert!(page.len() <= 2);
        if number == 4 {
            assert!(page.is_empty());
        }
        paged.extend(ids(page));
    }
    assert_eq!(paged, expected);

    let by = |filter: DeadLetterFilter| {
        let db = t.db.clone();
        async move {
            ids(admin::dead_letters(&db, &filter, Page::default())
                .await
                .unwrap())
        }
    };
    assert_eq!(
        by(DeadLetterFilter::default().consumer("inventory")).await,
        [m2, m1]
    );
    assert_eq!(
        by(DeadLetterFilter::default().event_type("payment.failed")).await,
        [m2, payment]
    );
    assert_eq!(
        by(DeadLetterFilter::default().aggregate_id("cart-1")).await,
        [cart]
    );
    // Case-insensitive substring.
    assert_eq!(
        by(DeadLetterFilter::default().error_contains("timeout")).await,
        [m5, m1]
    );
    // LIKE wildcards in the text are literal.
    assert_eq!(
        by(DeadLetterFilter::default().error_contains("50%_")).await,
        [m2]
    );
    assert!(
        by(DeadLetterFilter::default().error_contains("5%f"))
            .await
            .is_empty()
    );
    assert_eq!(
        by(DeadLetterFilter::default().source(Source::Outbox)).await,
        [cart, payment]
    );
    assert_eq!(
        by(DeadLetterFilter::default()
            .consumer("billing")
            .error_contains("timeout"))
        .await,
        [m5]
    );
    let err = admin::dead_letters(
        &t.db,
        &DeadLetterFilter::default()
            .consumer("inventory")
            .source(Source::Outbox),
        Page::default(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, AdminError::ConsumerOnOutbox), "{err}");
}

async fn dead_letter_shows_a_row_in_full(t: TestDb) {
    let f = fixture(&t).await;
    let detail = admin::dead_letter(&t.db, Target::outbox(f.dead_cart.id))
        .await
        .unwrap();
    assert_eq!(detail.status, "DEAD");
    assert_eq!(detail.summary.attempts, 1);
    assert!(
        detail
            .summary
            .last_error
            .as_deref()
            .unwrap()
            .contains("injected permanent rejection")
    );
    assert_eq!(detail.source.as_deref(), Some("admin-tests"));
    assert_eq!(detail.schema_version, Some(1));
    let payload: serde_json::Value = serde_json::from_str(&detail.payload).unwrap();
    assert_eq!(payload, serde_json::json!({"cart": "cart-1", "seq": 0}));
    let envelope = detail.envelope.as_ref().unwrap();
    assert_eq!(envelope["id"], f.dead_cart.event_id.to_string());
    assert_eq!(envelope["type"], "line.added");
    assert_eq!(envelope["subject"], "cart-1");
    assert_eq!(envelope["source"], "admin-tests");
    assert_eq!(envelope["data"]["seq"], 0);
    assert!(detail.headers.as_ref().unwrap().is_object());
    assert_eq!(detail.sent_at, None);
    let drift = (detail.summary.arrived_at - ago(20 * MIN))
        .num_seconds()
        .abs();
    assert!(
        drift <= 5,
        "created_at as set: {}",
        detail.summary.arrived_at
    );

    // Inbox payload bytes, shown lossily.
    let detail = admin::dead_letter(&t.db, Target::inbox(f.m2))
        .await
        .unwrap();
    assert_eq!(detail.status, "DEAD");
    assert_eq!(detail.summary.consumer.as_deref(), Some("inventory"));
    assert_eq!(detail.summary.message_id, "m-2");
    assert_eq!(detail.payload, "{\"broken\": \u{FFFD}\u{FFFD}}");
    assert!(detail.envelope.is_none());
    assert_eq!(detail.summary.attempts, 4);
    assert_eq!(
        detail.summary.last_error.as_deref(),
        Some("invalid sku 50%_off")
    );
    let detail = admin::dead_letter(&t.db, Target::inbox(f.m1))
        .await
        .unwrap();
    assert_eq!(detail.envelope.as_ref().unwrap()["type"], "line.added");

    // Any status can be shown.
    let sent = &f.sent[0];
    let detail = admin::dead_letter(&t.db, Target::outbox(sent.id))
        .await
        .unwrap();
    assert_eq!(detail.status, "SENT");
    assert!(detail.sent_at.is_some());

    let err = admin::dead_letter(&t.db, Target::outbox(9_999_999))
        .await
        .unwrap_err();
    assert!(matches!(err, AdminError::NotFound(_)), "{err}");
    assert!(
        err.to_string().contains("outbox:9999999 not found"),
        "{err}"
    );
}

async fn replay_moves_dead_letters_back_and_the_relay_publishes_them(t: TestDb) {
    let f = fixture(&t).await;
    let alice = Actor::new("alice").reason("broker limit raised");

    // One outbox event, by id.
    let report = admin::replay(
        &t.db,
        &Selector::Ids(vec![Target::outbox(f.dead_cart.id)]),
        &alice,
    )
    .await
    .unwrap();
    assert_eq!((report.outbox, report.inbox), (1, 0));
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    let row = outbox_row(&t, f.dead_cart.id).await;
    assert_eq!(row.status, "PENDING");
    assert_eq!(row.attempts, 0);
    assert_eq!(row.next_attempt_at, None);
    assert!(
        row.last_error.is_some(),
        "the last error stays until the event is sent"
    );
    let audit = admin::audit_log(&t.db, 10).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].id, report.audit_id);
    assert_eq!(audit[0].action, "replay");
    assert_eq!(audit[0].target, format!("outbox:{}", f.dead_cart.id));
    assert_eq!(audit[0].rows_affected, 1);
    assert_eq!(audit[0].actor.as_deref(), Some("alice"));
    assert_eq!(audit[0].reason.as_deref(), Some("broker limit raised"));
    assert!(audit[0].at <= Utc::now() && audit[0].at > ago(MIN));

    // A healthy relay publishes it, then the event it held back, in order.
    let transport = MemoryTransport::new();
    let report = relay(&t, &transport).drain(10).await.unwrap();
    assert_eq!(report.sent, 2);
    let published: Vec<_> = transport
        .messages()
        .iter()
        .map(|m| (m.event_id, seq_of(&m.body)))
        .collect();
    assert_eq!(
        published,
        [(f.dead_cart.event_id, 0), (f.held_cart.event_id, 1)]
    );
    let row = outbox_row(&t, f.dead_cart.id).await;
    assert_eq!(row.status, "SENT");
    assert_eq!(row.last_error, None);
    assert_eq!(outbox_row(&t, f.held_cart.id).await.status, "SENT");

    // Inbox messages by filter: DEAD → RETRY due now, a fresh attempt budget.
    let before = Utc::now();
    let report = admin::replay(
        &t.db,
        &Selector::Filter(DeadLetterFilter::default().consumer("inventory")),
        &Actor::new("bob"),
    )
    .await
    .unwrap();
    assert_eq!((report.outbox, report.inbox), (0, 2));
    for id in [f.m1, f.m2] {
        let state = inbox_state(&t, id).await;
        assert_eq!(state.status, "RETRY");
        assert_eq!(state.attempts, 0);
        let due = state.next_attempt_at.unwrap();
        assert!(
            due >= before - chrono::Duration::seconds(1) && due <= Utc::now(),
            "{due}"
        );
        assert!(state.last_error.is_some());
    }
    assert_eq!(inbox_state(&t, f.m5).await.status, "DEAD", "other consumer");
    let audit = admin::audit_log(&t.db, 1).await.unwrap();
    assert_eq!(audit[0].rows_affected, 2);
    assert_eq!(audit[0].actor.as_deref(), Some("bob"));
    assert_eq!(audit[0].reason, None);
    assert!(
        audit[0].target.contains("consumer = \"inventory\""),
        "{}",
        audit[0].target
    );

    // The consumer's worker claims them now.
    let claim = outbox::store::inbox::claim(
        &t.db,
        "inventory",
        &ClaimParams {
            owner: "worker",
            batch_size: 10,
            lease: std::time::Duration::from_secs(30),
            ordering: true,
            max_attempts: 5,
        },
    )
    .await
    .unwrap();
    let mut claimed: Vec<_> = claim
        .messages
        .iter()
        .map(|m| m.message_id.as_str())
        .collect();
    claimed.sort_unstable();
    assert_eq!(claimed, ["m-1", "m-2", "m-4"]);

    // An empty filter is refused; `All` takes what is left.
    let err = admin::replay(
        &t.db,
        &Selector::Filter(DeadLetterFilter::default()),
        &alice,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, AdminError::EmptyFilter(_)), "{err}");
    let report = admin::replay(&t.db, &Selector::All, &alice).await.unwrap();
    assert_eq!((report.outbox, report.inbox), (1, 1));
    assert_eq!(outbox_row(&t, f.dead_payment.id).await.status, "PENDING");
    assert_eq!(inbox_state(&t, f.m5).await.status, "RETRY");
    assert_eq!(admin::audit_log(&t.db, 10).await.unwrap().len(), 3);
    let _ = (f.m3, f.m6);
}

async fn ignore_finishes_dead_inbox_messages(t: TestDb) {
    let f = fixture(&t).await;
    let before = Utc::now();
    let report = admin::ignore(
        &t.db,
        &Selector::Ids(vec![
            Target::inbox(f.m1),
            Target::inbox(f.m3),
            Target::inbox(9_999_999),
        ]),
        &Actor::new("carol").reason("order cancelled"),
    )
    .await
    .unwrap();
    assert_eq!((report.outbox, report.inbox), (0, 1));
    let state = inbox_state(&t, f.m1).await;
    assert_eq!(state.status, "IGNORED");
    let processed = state.processed_at.unwrap();
    assert!(processed >= before - chrono::Duration::seconds(1) && processed <= Utc::now());
    assert_eq!(state.attempts, 4);
    // The DONE row and the missing one are reported, not touched.
    let mut skipped: Vec<(String, Option<String>)> = report
        .skipped
        .iter()
        .map(|s| (s.target.clone(), s.status.clone()))
        .collect();
    skipped.sort();
    assert_eq!(
        skipped,
        [
            (format!("inbox:{}", f.m3), Some("DONE".to_owned())),
            ("inbox:9999999".to_owned(), None),
        ]
    );
    assert_eq!(inbox_state(&t, f.m3).await.status, "DONE");
    assert_eq!(inbox_state(&t, f.m2).await.status, "DEAD");
    let audit = admin::audit_log(&t.db, 1).await.unwrap();
    assert_eq!(audit[0].action, "ignore");
    assert_eq!(audit[0].rows_affected, 1);
    assert_eq!(audit[0].actor.as_deref(), Some("carol"));
    assert_eq!(audit[0].reason.as_deref(), Some("order cancelled"));
    // Ignored messages no longer count as dead.
    let status = admin::status(&t.db).await.unwrap();
    let inventory = status
        .consumers
        .iter()
        .find(|c| c.consumer == "inventory")
        .unwrap();
    assert_eq!((inventory.counts["IGNORED"], inventory.dead), (1, 1));
    let _ = (f.m4, f.m5, f.m6);
}

async fn resend_publishes_a_sent_event_again(t: TestDb) {
    let f = fixture(&t).await;
    let sent = f
        .sent
        .iter()
        .find(|r| r.aggregate_id == "cart-0" && r.payload["seq"] == 0)
        .unwrap()
        .clone();
    let report = admin::resend(
        &t.db,
        &Resend::Events(vec![sent.event_id]),
        &Actor::new("dave"),
    )
    .await
    .unwrap();
    assert_eq!((report.outbox, report.inbox), (1, 0));
    assert!(report.skipped.is_empty());
    let row = outbox_row(&t, sent.id).await;
    assert_eq!(row.status, "PENDING");
    assert_eq!(row.sent_at, None);
    assert_eq!(row.attempts, 0);
    let audit = admin::audit_log(&t.db, 1).await.unwrap();
    assert_eq!(audit[0].action, "resend");
    assert_eq!(audit[0].target, format!("outbox event {}", sent.event_id));
    assert_eq!(audit[0].rows_affected, 1);

    let transport = MemoryTransport::new();
    let report = relay(&t, &transport).drain(10).await.unwrap();
    assert_eq!(report.sent, 1);
    let messages = transport.messages();
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].event_id, sent.event_id);
    let row = outbox_row(&t, sent.id).await;
    assert_eq!(row.status, "SENT");
    assert!(row.sent_at.is_some());

    // A DEAD event is not SENT: left alone; an unknown id is reported.
    let report = admin::resend(
        &t.db,
        &Resend::Events(vec![f.dead_cart.event_id]),
        &Actor::anonymous(),
    )
    .await
    .unwrap();
    assert_eq!(report.affected(), 0);
    assert_eq!(report.skipped[0].status.as_deref(), Some("DEAD"));
    assert_eq!(outbox_row(&t, f.dead_cart.id).await.status, "DEAD");
    let unknown = uuid::Uuid::now_v7();
    let report = admin::resend(&t.db, &Resend::Events(vec![unknown]), &Actor::anonymous())
        .await
        .unwrap();
    assert_eq!(report.affected(), 0);
    assert_eq!(report.skipped[0].status, None);
    let audit = admin::audit_log(&t.db, 1).await.unwrap();
    assert_eq!((audit[0].rows_affected, audit[0].actor.clone()), (0, None));
}

async fn guarded_changes_touch_nothing_in_the_wrong_state(t: TestDb) {
    let f = fixture(&t).await;
    let outbox_before = outbox_rows(&t.db).await;
    let inbox_before = inbox_rows(&t.db, "inventory").await;
    let sent = &f.sent[0];
    let report = admin::replay(
        &t.db,
        &Selector::Ids(vec![
            Target::outbox(sent.id),
            Target::outbox(f.held_cart.id),
            Target::inbox(f.m3),
            Target::inbox(f.m4),
        ]),
        &Actor::new("eve"),
    )
    .await
    .unwrap();
    assert_eq!(report.affected(), 0);
    let mut skipped: Vec<(String, Option<String>, &str)> = report
        .skipped
        .iter()
        .map(|s| (s.target.clone(), s.status.clone(), s.expected))
        .collect();
    skipped.sort();
    let mut expected = vec![
        (
            format!("outbox:{}", sent.id),
            Some("SENT".to_owned()),
            "DEAD",
        ),
        (
            format!("outbox:{}", f.held_cart.id),
            Some("PENDING".to_owned()),
            "DEAD",
        ),
        (format!("inbox:{}", f.m3), Some("DONE".to_owned()), "DEAD"),
        (
            format!("inbox:{}", f.m4),
            Some("PENDING".to_owned()),
            "DEAD",
        ),
    ];
    expected.sort();
    assert_eq!(skipped, expected);
    assert!(report.skipped[0].to_string().contains("left unchanged"));
    // Nothing changed, and the attempt is on record.
    let after = outbox_rows(&t.db).await;
    assert_eq!(
        format!("{outbox_before:?}"),
        format!("{after:?}"),
        "outbox untouched"
    );
    assert_eq!(inbox_rows(&t.db, "inventory").await, inbox_before);
    let audit = admin::audit_log(&t.db, 1).await.unwrap();
    assert_eq!(
        (audit[0].action.as_str(), audit[0].rows_affected),
        ("replay", 0)
    );

    // Nothing selected is an error, not a silent no-op.
    let err = admin::replay(&t.db, &Selector::Ids(vec![]), &Actor::anonymous())
        .await
        .unwrap_err();
    assert!(matches!(err, AdminError::NoIds("replay")), "{err}");
    let err = admin::ignore(&t.db, &Selector::Ids(vec![]), &Actor::anonymous())
        .await
        .unwrap_err();
    assert!(matches!(err, AdminError::NoIds("ignore")), "{err}");

    // A filter replay only ever matches DEAD rows.
    let report = admin::replay(
        &t.db,
        &Selector::Filter(DeadLetterFilter::default().aggregate_id("cart-0")),
        &Actor::anonymous(),
    )
    .await
    .unwrap();
    assert_eq!(report.affected(), 0);
    assert!(
        outbox_rows(&t.db)
            .await
            .iter()
            .filter(|r| r.aggregate_id == "cart-0")
            .all(|r| r.status == "SENT")
    );
    // Ignoring the RETRY message does nothing.
    let report = admin::ignore(
        &t.db,
        &Selector::Ids(vec![Target::inbox(f.m6)]),
        &Actor::anonymous(),
    )
    .await
    .unwrap();
    assert_eq!(report.affected(), 0);
    assert_eq!(inbox_state(&t, f.m6).await.status, "RETRY");
    let _ = (f.m1, f.m2, f.m5, f.dead_payment);
}

pub(crate) fn migration_names() -> Vec<String> {
    outbox::migrations()
        .iter()
        .map(|m| m.name().to_owned())
        .collect()
}

async fn doctor_finds_missing_indexes_migrations_and_stuck_rows(t: TestDb) {
    let options = DoctorOptions::new(migration_names());
    let report = admin::doctor(&t.db, &options).await.unwrap();
    assert!(report.is_healthy(), "{:#?}", report.findings);
    // The storage checks depend on the server's settings (see the storage test below).
    assert!(
        report
            .findings
            .iter()
            .filter(|f| f.check != "storage")
            .all(|f| f.severity <= Severity::Info),
        "{:#?}",
        report.findings
    );
    for check in ["tables", "indexes", "migrations", "stuck", "dead"] {
        assert!(
            report
                .findings
                .iter()
                .any(|f| f.check == check && f.severity == Severity::Ok),
            "{check}: {:#?}",
            report.findings
        );
    }

    // A consumer expected but not linked into this binary.
    let strict = DoctorOptions::new(migration_names()).expect_consumers(["inventory"]);
    let report = admin::doctor(&t.db, &strict).await.unwrap();
    assert!(report.findings.iter().any(|f| f.severity == Severity::Error
        && f.check == "handlers"
        && f.message.contains("`inventory`")));

    // Dead letters, a consumer with work but no handler here, a stuck row.
    let f = fixture(&t).await;
    exec(
        &t.db,
        "UPDATE outbox_event SET status = 'PROCESSING', locked_until = ? WHERE id = ?",
        vec![t.dialect().timestamp(ago(5 * MIN)), f.held_cart.id.into()],
    )
    .await;
    let report = admin::doctor(&t.db, &options).await.unwrap();
    assert!(report.is_healthy());
    let warning = |check: &str, text: &str| {
        report.findings.iter().any(|f| {
            f.severity == Severity::Warning && f.check == check && f.message.contains(text)
        })
    };
    assert!(
        warning("stuck", "1 outbox event(s) stuck"),
        "{:#?}",
        report.findings
    );
    assert!(
        warning("dead", "2 dead outbox event(s) and 3 dead inbox"),
        "{:#?}",
        report.findings
    );
    assert!(
        warning("handlers", "`inventory` has 1 unfinished"),
        "{:#?}",
        report.findings
    );

    // A dropped index and a migration not recorded are errors.
    let drop = match t.db.get_database_backend() {
        DbBackend::MySql => "DROP INDEX outbox_event_sent_at_idx ON outbox_event",
        _ => "DROP INDEX outbox_event_sent_at_idx",
    };
    t.db.execute_unprepared(drop).await.unwrap();
    exec(
        &t.db,
        "DELETE FROM outbox_migrations WHERE version = ?",
        vec!["outbox_0004_create_admin_action".into()],
    )
    .await;
    let report = admin::doctor(&t.db, &options).await.unwrap();
    assert!(!report.is_healthy());
    assert_eq!(report.worst(), Severity::Error);
    let errors: Vec<_> = report.with_severity(Severity::Error).collect();
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(errors.iter().any(|f| {
        f.check == "indexes"
            && f.message
                .contains("`outbox_event_sent_at_idx` on `outbox_event` is missing")
    }));
    assert!(
        errors
            .iter()
            .any(|f| f.check == "migrations"
                && f.message.contains("outbox_0004_create_admin_action"))
    );
    assert!(
        !report
            .findings
            .iter()
            .any(|f| f.check == "indexes" && f.severity == Severity::Ok)
    );
}

/// The storage guardrails: autovacuum off (for the server, and for a table), a table full of
/// dead row versions, and a session holding its snapshot past the threshold are each flagged by
/// the doctor with what to do, and `outbox status` shows the tables and the oldest holder.
/// SQLite has none of this and reports nothing.
async fn doctor_and_status_report_the_storage_and_what_holds_vacuum_back(t: TestDb) {
    let backend = t.db.get_database_backend();
    let options = DoctorOptions::new(migration_names()).horizon_age(Duration::from_secs(1));
    let findings = |report: &admin::DoctorReport, check: &str, text: &str| {
        report
            .findings
            .iter()
            .filter(|f| f.check == check && f.severity == Severity::Warning)
            .any(|f| f.message.contains(text))
    };
    if backend == DbBackend::Sqlite {
        let report = admin::doctor(&t.db, &options).await.unwrap();
        assert!(
            !report
                .findings
                .iter()
                .any(|f| f.check == "storage" || f.check == "horizon"),
            "{:#?}",
            report.findings
        );
        assert_eq!(
            admin::storage_status(&t.db).await.unwrap(),
            Default::default()
        );
        return;
    }

    // The tables as the server counts them.
    let status = admin::status(&t.db).await.unwrap();
    let tables: Vec<&str> = status
        .storage
        .tables
        .iter()
        .map(|t| t.table.as_str())
        .collect();
    let mut expected = vec![
        "outbox_event",
        "inbox_event",
        "outbox_failure",
        "outbox_scheduled",
        "outbox_sent",
        "outbox_key",
    ];
    if backend == DbBackend::Postgres {
        expected.extend(["inbox_done", "inbox_key"]);
    }
    assert_eq!(tables, expected);
    assert!(
        status
            .storage
            .tables
            .iter()
            .all(|t| t.bytes.unwrap_or(0) > 0)
    );

    if backend == DbBackend::Postgres {
        // Autovacuum: the server's setting as the doctor reads it, and a table's own.
        let server_on =
            t.db.query_one_raw(Statement::from_string(
                backend,
                "SELECT current_setting('autovacuum') = 'on' AS on",
            ))
            .await
            .unwrap()
            .unwrap()
            .try_get::<bool>("", "on")
            .unwrap();
        assert_eq!(status.storage.autovacuum, Some(server_on));
        let report = admin::doctor(&t.db, &options).await.unwrap();
        assert_eq!(
            findings(&report, "storage", "autovacuum is off on this server"),
            !server_on,
            "{:#?}",
            report.findings
        );
        t.db.execute_unprepared("ALTER TABLE outbox_event SET (autovacuum_enabled = false)")
            .await
            .unwrap();
        // Dead row versions: 12,000 events written and deleted, with vacuum kept away.
        t.db.execute_unprepared(
            "INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, \
             aggregate_id, payload, headers, status, created_at) \
             SELECT gen_random_uuid(), 'test', 'line.added', 1, 'cart', 'c-' || n, '{}', '{}', \
             'SENT', now() FROM generate_series(1, 12000) AS n",
        )
        .await
        .unwrap();
        t.db.execute_unprepared("DELETE FROM outbox_event")
            .await
            .unwrap();
        t.db.execute_unprepared("SELECT pg_stat_force_next_flush()")
            .await
            .unwrap();
        let mut report = admin::doctor(&t.db, &options).await.unwrap();
        for _ in 0..50 {
            if findings(&report, "storage", "dead row versions beside") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            report = admin::doctor(&t.db, &options).await.unwrap();
        }
        assert!(
            findings(&report, "storage", "autovacuum is off for `outbox_event`"),
            "{:#?}",
            report.findings
        );
        assert!(
            findings(
                &report,
                "storage",
                "`outbox_event` holds 12000 dead row versions"
            ),
            "{:#?}",
            report.findings
        );
        let status = admin::status(&t.db).await.unwrap();
        let outbox = &status.storage.tables[0];
        assert_eq!(outbox.dead_rows, Some(12_000));
        assert!(!outbox.autovacuum_enabled);
        t.db.execute_unprepared("VACUUM outbox_event")
            .await
            .unwrap();
        t.db.execute_unprepared("ALTER TABLE outbox_event RESET (autovacuum_enabled)")
            .await
            .unwrap();
        // An id sequence with a cache: ids out of the order rows are written in.
        let cached = |report: &admin::DoctorReport| {
            report.findings.iter().any(|f| {
                f.check == "storage"
                    && f.severity == Severity::Error
                    && f.message.starts_with(
                        "the ids of `outbox_event` come from a sequence that hands each session 20",
                    )
            })
        };
        assert!(!cached(&report), "{:#?}", report.findings);
        t.db.execute_unprepared("ALTER SEQUENCE outbox_event_id_seq CACHE 20")
            .await
            .unwrap();
        let report = admin::doctor(&t.db, &options).await.unwrap();
        assert!(cached(&report), "{:#?}", report.findings);
        t.db.execute_unprepared("ALTER SEQUENCE outbox_event_id_seq CACHE 1")
            .await
            .unwrap();
        let report = admin::doctor(&t.db, &options).await.unwrap();
        assert!(!cached(&report), "{:#?}", report.findings);
        t.db.execute_unprepared("SELECT pg_stat_force_next_flush()")
            .await
            .unwrap();
    }

    // A report that keeps its snapshot open: flagged once older than the threshold, with its
    // session, and gone once it ends.
    let report_query = t.connect_again().await;
    let held = report_query
        .begin_with_config(Some(sea_orm::IsolationLevel::RepeatableRead), None)
        .await
        .unwrap();
    if backend == DbBackend::Postgres {
        held.execute_unprepared("SET application_name = 'monthly-report'")
            .await
            .unwrap();
    }
    held.execute_unprepared("SELECT COUNT(*) FROM outbox_event")
        .await
        .unwrap();
    let pid_query = match backend {
        DbBackend::Postgres => "SELECT pg_backend_pid()::bigint AS pid",
        _ => "SELECT CAST(CONNECTION_ID() AS SIGNED) AS pid",
    };
    let pid: i64 = held
        .query_one_raw(Statement::from_string(backend, pid_query))
        .await
        .unwrap()
        .unwrap()
        .try_get("", "pid")
        .unwrap();
    let ours = format!("session {pid} (");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let report = admin::doctor(&t.db, &options).await.unwrap();
    let end_it = match backend {
        DbBackend::Postgres => format!("pg_terminate_backend({pid})"),
        _ => format!("KILL {pid}"),
    };
    assert!(
        findings(&report, "horizon", &ours) && findings(&report, "horizon", &end_it),
        "{:#?}",
        report.findings
    );
    if backend == DbBackend::Postgres {
        assert!(findings(&report, "horizon", "`monthly-report`"));
    }
    let lenient = DoctorOptions::new(migration_names());
    let report = admin::doctor(&t.db, &lenient).await.unwrap();
    assert!(
        report
            .findings
            .iter()
            .any(|f| f.check == "horizon" && f.severity == Severity::Ok),
        "under five minutes is not flagged by default: {:#?}",
        report.findings
    );
    // The oldest holder in `outbox status` (on MySQL, other tests' transactions on the same
    // server may be older: InnoDB's purge is server-wide).
    let status = admin::status(&t.db).await.unwrap();
    let oldest = status.storage.oldest_holder.expect("the report's session");
    assert_eq!(oldest.kind, "session");
    assert!(oldest.age_secs.unwrap_or(0) >= 1, "{oldest:?}");
    if backend == DbBackend::Postgres {
        assert_eq!(oldest.pid, Some(pid));
        assert_eq!(oldest.name, "monthly-report");
        assert_eq!(oldest.state.as_deref(), Some("idle in transaction"));
    }
    held.commit().await.unwrap();
    // MySQL's INNODB_TRX is a cache refreshed at most every 100 ms.
    let mut report = admin::doctor(&t.db, &options).await.unwrap();
    for _ in 0..20 {
        if !findings(&report, "horizon", &ours) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        report = admin::doctor(&t.db, &options).await.unwrap();
    }
    assert!(
        !findings(&report, "horizon", &ours),
        "{:#?}",
        report.findings
    );
}

/// Commit `n` line events for `carts` carts (in transactions of up to 2,000).
async fn enqueue_lines(t: &TestDb, outbox: &Outbox, prefix: &str, n: u32) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(2_000) {
        let tx = outbox.begin(&t.db).await.unwrap();
        for i in chunk {
            tx.enqueue(&LineAdded {
                cart: format!("{prefix}-{}", i % 50),
                seq: *i,
            })
            .unwrap();
        }
        let _ = tx.commit().await.unwrap();
    }
}

/// Mark every PENDING outbox row SENT at `at`; returns how many.
async fn mark_sent(t: &TestDb, at: DateTime<Utc>) -> u64 {
    exec(
        &t.db,
        "UPDATE outbox_event SET status = 'SENT', sent_at = ? WHERE status = 'PENDING'",
        vec![t.dialect().timestamp(at)],
    )
    .await
}

/// `n` inbox rows of `consumer` in `state`, received (and, if DONE, processed) at `at`.
async fn bulk_inbox(t: &TestDb, consumer: &str, n: usize, state: InitialState, at: DateTime<Utc>) {
    let txn = t.db.begin().await.unwrap();
    for i in 0..n {
        let message_id = format!("{consumer}-{i}");
        let row = NewInboxRow {
            consumer,
            message_id: &message_id,
            event_type: Some("line.added"),
            payload: b"{}",
            ..NewInboxRow::default()
        };
        assert!(insert(&txn, &row, &state).await.unwrap());
    }
    backdate_inbox(&txn, consumer, None, at).await;
    txn.commit().await.unwrap();
}

async fn count(t: &TestDb, sql: &str) -> i64 {
    scalar_i64(&t.db, sql).await
}

async fn purge_deletes_old_rows_in_batches_and_keeps_the_rest(t: TestDb) {
    // Rows written by an earlier release (the SENT events in `outbox_event` below, the handled
    // messages in `inbox_event`): retention deletes them row by row.
    inbox_rotation_off(&t.db).await;
    let outbox = Outbox::new("retention");
    enqueue_lines(&t, &outbox, "old", 10_000).await;
    assert_eq!(mark_sent(&t, ago(8 * DAY)).await, 10_000);
    enqueue_lines(&t, &outbox, "recent", 10).await;
    assert_eq!(mark_sent(&t, ago(6 * DAY)).await, 10);
    // Old but unfinished or dead: never purged.
    enqueue_lines(&t, &outbox, "waiting", 3).await;
    exec(
        &t.db,
        "UPDATE outbox_event SET created_at = ? WHERE status = 'PENDING'",
        vec![t.dialect().timestamp(ago(30 * DAY))],
    )
    .await;
    exec(
        &t.db,
        "UPDATE outbox_event SET status = 'DEAD' WHERE aggregate_id = 'waiting-0'",
        vec![],
    )
    .await;

    bulk_inbox(&t, "old", 5_000, InitialState::Done, ago(15 * DAY)).await;
    bulk_inbox(&t, "ignored", 3, InitialState::Done, ago(15 * DAY)).await;
    exec(
        &t.db,
        "UPDATE inbox_event SET status = 'IGNORED' WHERE consumer = 'ignored'",
        vec![],
    )
    .await;
    bulk_inbox(&t, "recent", 5, InitialState::Done, ago(13 * DAY)).await;
    bulk_inbox(
        &t,
        "dead",
        2,
        InitialState::Failed(Failure::Dead {
            attempts: 3,
            error: "x".into(),
        }),
        ago(40 * DAY),
    )
    .await;
    bulk_inbox(&t, "pending", 1, InitialState::Pending, ago(40 * DAY)).await;

    let policy = RetentionPolicy::default()
        .batch_size(1_000)
        .pause(Duration::from_millis(1));
    let report = retention::purge(&t.db, &policy).await.unwrap();
    assert_eq!(report.outbox_deleted, 10_000, "{report:?}");
    assert_eq!(report.inbox_deleted, 5_003, "{report:?}");
    // Ten full outbox batches and an empty one; five full inbox batches and a partial one; one
    // of each table's error history (the dead messages keep theirs).
    assert_eq!(report.batches, 19, "{report:?}");
    assert_eq!(report.failures_deleted, 0, "{report:?}");
    assert!(!report.lease_lost);
    assert!(report.sent_before <= ago(7 * DAY) && report.sent_before > ago(7 * DAY + MIN));

    assert_eq!(
        count(&t, "SELECT COUNT(*) AS n FROM outbox_event").await,
        13
    );
    assert_eq!(
        count(
            &t,
            "SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'SENT'"
        )
        .await,
        10
    );
    assert_eq!(
        count(
            &t,
            "SELECT COUNT(*) AS n FROM outbox_event WHERE aggregate_id LIKE 'recent-%'"
        )
        .await,
        10
    );
    let inbox: Vec<(String, i64)> = {
        let rows =
            t.db.query_all_raw(Statement::from_string(
                t.db.get_database_backend(),
                "SELECT consumer, COUNT(*) AS n FROM inbox_event GROUP BY consumer ORDER BY consumer"
                    .to_owned(),
            ))
            .await
            .unwrap();
        rows.iter()
            .map(|r| {
                (
                    r.try_get("", "consumer").unwrap(),
                    r.try_get("", "n").unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(
        inbox,
        [
            ("dead".to_owned(), 2),
            ("pending".to_owned(), 1),
            ("recent".to_owned(), 5)
        ]
    );
    let audit = admin::audit_log(&t.db, 5).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(Some(audit[0].id), report.audit_id);
    assert_eq!(
        (
            audit[0].action.as_str(),
            audit[0].rows_affected,
            audit[0].actor.as_deref()
        ),
        ("purge", 15_003, Some("retention"))
    );

    // Nothing left to delete: one empty batch per table and history, nothing recorded.
    let again = retention::purge(&t.db, &policy).await.unwrap();
    assert_eq!(
        (again.deleted(), again.batches, again.audit_id),
        (0, 4, None)
    );
    assert_eq!(admin::audit_log(&t.db, 5).await.unwrap().len(), 1);
}

async fn only_one_instance_purges_at_a_time(t: TestDb) {
    let outbox = Outbox::new("retention");
    enqueue_lines(&t, &outbox, "old", 3_000).await;
    mark_sent(&t, ago(8 * DAY)).await;
    let policy = RetentionPolicy::default()
        .batch_size(500)
        .pause(Duration::from_millis(5))
        .lease(Duration::from_secs(4));
    let (a, b) = tokio::join!(
        retention::purge_once_if_leader(&t.db, &policy, "instance-a"),
        retention::purge_once_if_leader(&t.db, &policy, "instance-b"),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(
        a.is_some() != b.is_some(),
        "exactly one purges: {a:?} {b:?}"
    );
    let (leader, follower, report) = match (a, b) {
        (Some(r), None) => ("instance-a", "instance-b", r),
        (None, Some(r)) => ("instance-b", "instance-a", r),
        _ => unreachable!(),
    };
    assert_eq!(report.outbox_deleted, 3_000);
    assert_eq!(count(&t, "SELECT COUNT(*) AS n FROM outbox_event").await, 0);
    let lease = retention::lease_holder(&t.db).await.unwrap().unwrap();
    let (holder, until) = (lease.holder, lease.until);
    assert_eq!(holder, leader);
    assert!(until > Utc::now());
    let audit = admin::audit_log(&t.db, 5).await.unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].actor, Some(format!("retention:{leader}")));

    // The leader keeps the lease while it runs; the follower waits.
    assert!(
        retention::purge_once_if_leader(&t.db, &policy, follower)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        retention::purge_once_if_leader(&t.db, &policy, leader)
            .await
            .unwrap()
            .is_some()
    );
    // Once the leader stops renewing, the lease lapses and the follower takes over.
    tokio::time::sleep(Duration::from_millis(4_300)).await;
    assert!(
        retention::purge_once_if_leader(&t.db, &policy, follower)
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(
        retention::lease_holder(&t.db)
            .await
            .unwrap()
            .unwrap()
            .holder,
        follower
    );
    // A leader releasing at shutdown hands over at once.
    assert!(retention::release_lease(&t.db, follower).await.unwrap());
    assert!(!retention::release_lease(&t.db, leader).await.unwrap());
    assert!(
        retention::purge_once_if_leader(&t.db, &policy, leader)
            .await
            .unwrap()
            .is_some()
    );
}

async fn ignore_and_resend_by_filter(t: TestDb) {
    let f = fixture(&t).await;
    let ops = || Actor::new("ops").reason("bulk fix");
    // Ignore refuses what is not the inbox.
    let err = admin::ignore(
        &t.db,
        &Selector::Ids(vec![Target::inbox(f.m1), Target::outbox(f.dead_cart.id)]),
        &ops(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, AdminError::WrongTable { .. }), "{err}");
    let err = admin::ignore(
        &t.db,
        &Selector::Filter(DeadLetterFilter::default().source(Source::Outbox)),
        &ops(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, AdminError::InboxOnly("ignore")), "{err}");
    let err = admin::ignore(
        &t.db,
        &Selector::Filter(DeadLetterFilter::default()),
        &ops(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, AdminError::EmptyFilter("ignore")), "{err}");
    assert_eq!(inbox_state(&t, f.m1).await.status, "DEAD");

    // By filter: inventory's dead messages whose error mentions a timeout (m1, not m2; m5 is
    // billing's).
    let report = admin::ignore(
        &t.db,
        &Selector::Filter(
            DeadLetterFilter::default()
                .consumer("inventory")
                .error_contains("timeout"),
        ),
        &ops(),
    )
    .await
    .unwrap();
    assert_eq!((report.outbox, report.inbox), (0, 1));
    assert_eq!(inbox_state(&t, f.m1).await.status, "IGNORED");
    assert_eq!(inbox_state(&t, f.m2).await.status, "DEAD");
    assert_eq!(inbox_state(&t, f.m5).await.status, "DEAD");
    let audit = admin::audit_log(&t.db, 1).await.unwrap();
    assert_eq!(audit[0].action, "ignore");
    assert_eq!(
        audit[0].target,
        r#"dead letters where consumer = "inventory", error contains "timeout""#
    );
    assert_eq!(audit[0].reason.as_deref(), Some("bulk fix"));

    // All: every dead inbox message left, and nothing else (the RETRY one, the outbox's dead).
    let report = admin::ignore(&t.db, &Selector::All, &ops()).await.unwrap();
    assert_eq!((report.outbox, report.inbox), (0, 2));
    assert_eq!(inbox_state(&t, f.m2).await.status, "IGNORED");
    assert_eq!(inbox_state(&t, f.m5).await.status, "IGNORED");
    assert_eq!(inbox_state(&t, f.m6).await.status, "RETRY");
    assert_eq!(inbox_state(&t, f.m4).await.status, "PENDING");
    assert_eq!(outbox_row(&t, f.dead_cart.id).await.status, "DEAD");
    let audit = admin::audit_log(&t.db, 1).await.unwrap();
    assert_eq!(audit[0].target, "every dead inbox message");

    // Resend by filter: an empty one is refused.
    let err = admin::resend(&t.db, &Resend::Filter(SentFilter::default()), &ops())
        .await
        .unwrap_err();
    assert!(matches!(err, AdminError::EmptySentFilter), "{err}");
    // One aggregate's sent events; its dead and held events are not SENT and stay.
    let sent_of = |cart: &str| -> Vec<i64> {
        f.sent
            .iter()
            .filter(|r| r.aggregate_id == cart)
            .map(|r| r.id)
            .collect()
    };
    let report = admin::resend(
        &t.db,
        &Resend::Filter(SentFilter::default().aggregate_id("cart-0")),
        &ops(),
    )
    .await
    .unwrap();
    assert_eq!((report.outbox, report.inbox), (2, 0));
    for id in sent_of("cart-0") {
        let row = outbox_row(&t, id).await;
        assert_eq!((row.status.as_str(), row.sent_at), ("PENDING", None));
    }
    for id in sent_of("cart-2") {
        assert_eq!(outbox_row(&t, id).await.status, "SENT");
    }
    // A window on sent_at: only cart-2's first event was sent three hours ago.
    let cart2 = sent_of("cart-2");
    exec(
        &t.db,
        "UPDATE outbox_sent SET sent_at = ? WHERE id = ?",
        vec![t.dialect().timestamp(ago(180 * MIN)), cart2[0].into()],
    )
    .await;
    let window = SentFilter::default()
        .aggregate_type("cart")
        .sent_after(ago(240 * MIN))
        .sent_before(ago(120 * MIN));
    let report = admin::resend(&t.db, &Resend::Filter(window), &ops())
        .await
        .unwrap();
    assert_eq!(report.outbox, 1);
    assert_eq!(outbox_row(&t, cart2[0]).await.status, "PENDING");
    assert_eq!(outbox_row(&t, cart2[1]).await.status, "SENT");
    let audit = admin::audit_log(&t.db, 1).await.unwrap();
    assert!(
        audit[0]
            .target
            .starts_with(r#"sent events where aggregate type = "cart", sent at or after "#),
        "{}",
        audit[0].target
    );
    // Nothing sent in the future.
    let report = admin::resend(
        &t.db,
        &Resend::Filter(SentFilter::default().sent_after(Utc::now() + chrono::Duration::hours(1))),
        &ops(),
    )
    .await
    .unwrap();
    assert_eq!(report.affected(), 0);
    // Several event ids: the SENT one moves, the DEAD one is reported.
    let payment = f.sent.iter().find(|r| r.aggregate_id == "pay-0").unwrap();
    let report = admin::resend(
        &t.db,
        &Resend::Events(vec![payment.event_id, f.dead_cart.event_id]),
        &ops(),
    )
    .await
    .unwrap();
    assert_eq!(report.outbox, 1);
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].status.as_deref(), Some("DEAD"));
    assert_eq!(outbox_row(&t, payment.id).await.status, "PENDING");
}

/// Run the relay until `id`'s row has `status`, letting backoffs pass.
async fn relay_until(t: &TestDb, transport: &MemoryTransport, id: i64, status: &str) {
    let relay = relay(t, transport);
    for _ in 0..200 {
        relay.run_once().await.unwrap();
        if outbox_row(t, id).await.status == status {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("outbox:{id} never became {status}");
}

/// Replay the dead outbox event `id` and run the relay until it has `status`.
async fn replay_until(t: &TestDb, transport: &MemoryTransport, id: i64, status: &str) {
    let target = Selector::Ids(vec![Target::outbox(id)]);
    admin::replay(&t.db, &target, &Actor::anonymous())
        .await
        .unwrap();
    relay_until(t, transport, id, status).await;
}

fn history(detail: &admin::DeadLetterDetail) -> Vec<(i64, &str)> {
    detail
        .failures
        .iter()
        .map(|f| (f.attempt, f.status.as_str()))
        .collect()
}

async fn error_history_keeps_every_failed_attempt(t: TestDb) {
    let f = fixture(&t).await;
    // The fixture's dead letters: a permanent refusal is one entry; an inbox row recorded DEAD
    // is one entry with its attempts.
    let cart = admin::dead_letter(&t.db, Target::outbox(f.dead_cart.id))
        .await
        .unwrap();
    assert_eq!(history(&cart), [(1, "DEAD")]);
    assert_eq!(
        cart.failures[0].error,
        cart.summary.last_error.clone().unwrap()
    );
    let m1 = admin::dead_letter(&t.db, Target::inbox(f.m1))
        .await
        .unwrap();
    assert_eq!(history(&m1), [(4, "DEAD")]);
    assert_eq!(m1.failures[0].error, "Stock service timeout");
    let m3 = admin::dead_letter(&t.db, Target::inbox(f.m3))
        .await
        .unwrap();
    assert!(m3.failures.is_empty());

    // A publish refused three times (the budget): two retries, then DEAD.
    let outbox = Outbox::new("admin-tests");
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.enqueue(&LineAdded {
        cart: "cart-h".into(),
        seq: 0,
    })
    .unwrap();
    let _ = tx.commit().await.unwrap();
    let id = outbox_rows(&t.db)
        .await
        .iter()
        .find(|r| r.aggregate_id == "cart-h")
        .unwrap()
        .id;
    let transport = MemoryTransport::new();
    transport.fail_matching(Some(|m: &OutgoingMessage| m.aggregate_id == "cart-h"));
    relay_until(&t, &transport, id, "DEAD").await;
    let detail = admin::dead_letter(&t.db, Target::outbox(id)).await.unwrap();
    assert_eq!(history(&detail), [(1, "RETRY"), (2, "RETRY"), (3, "DEAD")]);
    assert!(detail.failures.iter().all(|f| f.error.contains("injected")));
    assert!(detail.failures.windows(2).all(|w| w[0].at <= w[1].at));
    assert_eq!(
        detail.failures.last().map(|f| f.error.clone()),
        detail.summary.last_error
    );

    // Replayed and dead again: the earlier death stays in the history.
    replay_until(&t, &transport, id, "DEAD").await;
    let detail = admin::dead_letter(&t.db, Target::outbox(id)).await.unwrap();
    assert_eq!(
        history(&detail),
        [
            (1, "RETRY"),
            (2, "RETRY"),
            (3, "DEAD"),
            (1, "RETRY"),
            (2, "RETRY"),
            (3, "DEAD")
        ]
    );
    // Fixed and sent: the history is kept, `last_error` cleared.
    transport.clear_faults();
    replay_until(&t, &transport, id, "SENT").await;
    let detail = admin::dead_letter(&t.db, Target::outbox(id)).await.unwrap();
    assert_eq!(detail.failures.len(), 6);
    assert_eq!(detail.summary.last_error, None);

    // A worker's failures, fenced by its claim: a stale token appends nothing.
    let m = inbox_row(
        &t,
        "history",
        "m-h",
        "line.added",
        "cart-h",
        b"{}",
        InitialState::Pending,
        ago(MIN),
    )
    .await;
    let claim_params = ClaimParams {
        owner: "w",
        batch_size: 10,
        lease: Duration::from_secs(30),
        ordering: true,
        max_attempts: 5,
    };
    let claim = outbox::store::inbox::claim(&t.db, "history", &claim_params)
        .await
        .unwrap();
    let retry = Failure::Retry {
        attempts: 1,
        delay: Duration::ZERO,
        error: "stock service down".into(),
    };
    assert!(
        !outbox::store::inbox::mark_failed(&t.db, m, uuid::Uuid::new_v4(), &retry)
            .await
            .unwrap()
    );
    assert!(
        outbox::store::inbox::mark_failed(&t.db, m, claim.token, &retry)
            .await
            .unwrap()
    );
    let claim = outbox::store::inbox::claim(&t.db, "history", &claim_params)
        .await
        .unwrap();
    let dead = Failure::Dead {
        attempts: 2,
        error: "unknown sku".into(),
    };
    assert!(
        outbox::store::inbox::mark_failed(&t.db, m, claim.token, &dead)
            .await
            .unwrap()
    );
    let detail = admin::dead_letter(&t.db, Target::inbox(m)).await.unwrap();
    let errors: Vec<(i64, &str, &str)> = detail
        .failures
        .iter()
        .map(|f| (f.attempt, f.status.as_str(), f.error.as_str()))
        .collect();
    assert_eq!(
        errors,
        [
            (1, "RETRY", "stock service down"),
            (2, "DEAD", "unknown sku")
        ]
    );

    // Retention: history older than the window goes with finished rows (the sent event, the
    // ignored message) and stays with dead ones.
    admin::ignore(
        &t.db,
        &Selector::Ids(vec![Target::inbox(f.m2)]),
        &Actor::anonymous(),
    )
    .await
    .unwrap();
    exec(
        &t.db,
        "UPDATE outbox_failure SET failed_at = ?",
        vec![t.dialect().timestamp(ago(30 * DAY))],
    )
    .await;
    let report = retention::purge(&t.db, &RetentionPolicy::default())
        .await
        .unwrap();
    assert_eq!(report.failures_deleted, 7, "{report:?}");
    let kept = admin::dead_letter(&t.db, Target::outbox(id)).await.unwrap();
    assert!(kept.failures.is_empty());
    let m2 = admin::dead_letter(&t.db, Target::inbox(f.m2))
        .await
        .unwrap();
    assert!(m2.failures.is_empty());
    for (target, entries) in [
        (Target::outbox(f.dead_cart.id), 1),
        (Target::inbox(f.m1), 1),
        (Target::inbox(m), 2),
    ] {
        let detail = admin::dead_letter(&t.db, target).await.unwrap();
        assert_eq!(detail.failures.len(), entries, "{target}");
    }
}

backend_tests! {
    admin_status_counts => status_reports_counts_ages_and_stuck_rows;
    admin_dead_list => dead_letters_filter_and_paginate;
    admin_dead_show => dead_letter_shows_a_row_in_full;
    admin_replay => replay_moves_dead_letters_back_and_the_relay_publishes_them;
    admin_ignore => ignore_finishes_dead_inbox_messages;
    admin_by_filter => ignore_and_resend_by_filter;
    admin_error_history => error_history_keeps_every_failed_attempt;
    admin_resend => resend_publishes_a_sent_event_again;
    admin_guarded => guarded_changes_touch_nothing_in_the_wrong_state;
    admin_doctor => doctor_finds_missing_indexes_migrations_and_stuck_rows;
    admin_storage => doctor_and_status_report_the_storage_and_what_holds_vacuum_back;
    admin_purge => purge_deletes_old_rows_in_batches_and_keeps_the_rest;
    admin_purge_leader => only_one_instance_purges_at_a_time;
}

#[test]
fn policy_validation_refuses_a_dedup_window_shorter_than_the_redelivery_horizon() {
    let relay = RelayConfig::default();
    // JetStream keeps messages 3 days, operators may resend within 7: about 10 days.
    let horizon = retention::redelivery_horizon(3 * DAY, &relay, 7 * DAY);
    assert!(
        horizon > 10 * DAY && horizon < 10 * DAY + HOUR,
        "{horizon:?}"
    );
    let policy = RetentionPolicy::default();
    policy.validate(horizon).unwrap();

    let short = RetentionPolicy::default().done_after(9 * DAY);
    let err = short.validate(horizon).unwrap_err();
    assert!(
        matches!(err, RetentionError::WindowTooShort { .. }),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains("done_after = 9d"), "{text}");
    assert!(text.contains("redelivery horizon (10d"), "{text}");

    let no_batches = RetentionPolicy::default().batch_size(0);
    assert!(matches!(
        no_batches.validate(Duration::ZERO),
        Err(RetentionError::Invalid(_))
    ));
    let short_lease = RetentionPolicy::default().lease(Duration::from_millis(500));
    assert!(matches!(
        short_lease.validate(Duration::ZERO),
        Err(RetentionError::Invalid(_))
    ));
}

/// The issue's load case: a million SENT rows on PostgreSQL are purged in batches while a relay
/// keeps publishing what producers commit meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_a_million_rows_while_relaying_on_postgres() {
    let Some(t) = test_db(Backend::Postgres, "admin_purge_million_pg").await else {
        return;
    };
    const ROWS: i64 = 1_000_000;
    t.db.execute_unprepared(&format!(
        "INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, \
         aggregate_id, payload, headers, status, created_at, sent_at) \
         SELECT gen_random_uuid(), 'bulk', 'line.added', 1, 'cart', 'bulk-' || (g % 1000), \
         '{{\"cart\": \"bulk\", \"seq\": 0}}'::jsonb, '{{}}'::jsonb, 'SENT', \
         now() - interval '9 days', now() - interval '8 days' FROM generate_series(1, {ROWS}) g"
    ))
    .await
    .unwrap();
    t.db.execute_unprepared("ANALYZE outbox_event")
        .await
        .unwrap();

    let outbox = Outbox::new("live");
    let transport = MemoryTransport::new();
    let relay = Relay::new(t.db.clone(), Arc::new(transport.clone()))
        .with_config(relay_config().poll_interval(Duration::from_millis(100)))
        .with_outbox(&outbox)
        .spawn();
    let done = outbox::CancellationToken::new();
    let producer = tokio::spawn({
        let db = t.db.clone();
        let outbox = outbox.clone();
        let done = done.clone();
        async move {
            let mut produced = 0u32;
            while !done.is_cancelled() {
                let tx = outbox.begin(&db).await.unwrap();
                for _ in 0..10 {
                    tx.enqueue(&LineAdded {
                        cart: format!("live-{}", produced % 7),
                        seq: produced,
                    })
                    .unwrap();
                    produced += 1;
                }
                let _ = tx.commit().await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            produced
        }
    });

    let report = retention::purge(&t.db, &RetentionPolicy::default())
        .await
        .unwrap();
    let published_during_purge = transport.len();
    done.cancel();
    let produced = producer.await.unwrap() as usize;

    assert_eq!(report.outbox_deleted, ROWS as u64, "{report:?}");
    // 5,000 rows per batch: 200 full batches, one empty, one for the inbox, one for each error
    // history.
    assert_eq!(report.batches, 204, "{report:?}");
    assert!(
        published_during_purge * 2 >= produced,
        "the relay kept up during the purge: {published_during_purge} of {produced} published \
         in {:?}",
        report.elapsed
    );
    wait_all_sent(&t, produced, Duration::from_secs(30)).await;
    relay.shutdown().await.unwrap();
    assert_eq!(transport.len(), produced);
    assert_eq!(count_events(&t.db).await, produced as i64);
}
