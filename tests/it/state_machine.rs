//! Model-based property tests of the outbox and inbox state machines.
//!
//! Each case builds a fresh in-memory SQLite database with the real migrations and drives the
//! real store functions (`store::relay::{claim, settle, move_to_inbox}`,
//! `store::inbox::{insert, claim, mark_done, mark_failed, release}`, the admin API) through a
//! random sequence of operations: commits and rollbacks, claims by two relays or workers with
//! their own fencing tokens, publishes and handlers that succeed or fail (transiently or
//! permanently), crashes that never settle a claim, time passing past leases and retry times,
//! operators replaying, resending and ignoring, and stale relays settling after their lease was
//! taken over. Every instant is the database's clock, read inside the statement that uses it;
//! time passes through a skew the store adds to that clock in the statements the calling thread
//! builds (`outbox::store::clock::skew_by`): each case runs on one thread, and moving time on
//! (past leases, retry times) moves the skew. The real clock moves too, a few milliseconds
//! between statements, so each written instant is checked against the database's time read just
//! before and just after the step that wrote it, and a claim against what was claimable at
//! either end.
//!
//! After every step each row must be in a legal state with consistent columns, a claim must take
//! only claimable rows in per-aggregate order (and some row whenever one is eligible), and a
//! write fenced off by its claim token must change nothing. Order: the broker's first
//! publication of an event comes after the first publication of every earlier event of its
//! aggregate, and a row is SENT only after a publication (a stale relay that published an
//! aggregate's run in order may still mark a later row SENT after a takeover reclaimed an
//! earlier one: that earlier row is then published twice, which the inbox absorbs); a message
//! becomes DONE only after every earlier message of its consumer and aggregate is DONE or
//! IGNORED. At the end the case drains: with every publish and handler succeeding and time
//! moving on, the tables come to rest within a bounded number of rounds with each aggregate a run
//! of SENT (DONE or IGNORED) rows followed, if anything is left, by a DEAD row holding the rest
//! back; after an operator resolves the dead letters, every row is SENT (DONE or IGNORED): no
//! row is unreachable.
//!
//! `PROPTEST_CASES` sets the number of cases per state machine (default 128).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Display;
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use outbox::admin::{self, Actor, Selector, Target};
use outbox::prelude::*;
use outbox::relay::Backoff;
use outbox::sea_orm::{
    ConnectOptions, ConnectionTrait, Database, DatabaseConnection, Statement, TransactionTrait,
};
use outbox::store::claim::ClaimParams;
use outbox::store::clock::skew_by;
use outbox::store::inbox::{self as inbox_store, InboxClaim, InboxState, NewInboxRow, Recorded};
use outbox::store::local::move_to_inbox;
use outbox::store::relay::{self as relay_store, Claim, FailedEvent, Settlement};
use outbox::store::{Dialect, Failure, FailureClass, database_now};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use serde::{Deserialize, Serialize};

/// Cases per state machine unless `PROPTEST_CASES` says otherwise.
const DEFAULT_CASES: u32 = 128;
/// Lease of every claim, in seconds.
const LEASE_SECS: i64 = 30;
/// Lease of every claim.
const LEASE: Duration = Duration::from_secs(LEASE_SECS.unsigned_abs());
/// One drain round moves time on by this much: past every lease and every retry time.
const DRAIN_STEP_SECS: i64 = 3_600;
const AGGREGATE_TYPE: &str = "thing";

fn backoff() -> Backoff {
    Backoff::default()
        .base(Duration::from_secs(1))
        .cap(Duration::from_secs(60))
        .jitter(0.2)
}

#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[event(name = "thing.happened", aggregate = "thing", version = 1)]
struct Happened {
    #[event(aggregate_id)]
    thing: String,
    seq: u32,
}

// ---------------------------------------------------------------------------------------------
// Shared plumbing

fn fail(e: impl Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// The database's current time, as the statements this thread builds read it (skew included).
async fn db_now(db: &DatabaseConnection) -> Result<DateTime<Utc>, TestCaseError> {
    database_now(db).await.map_err(fail)
}

/// The database adds an offset (a retry's delay) to its clock rounded to the millisecond
/// (SQLite), so an instant written that far ahead may be off by half a millisecond.
const OFFSET_ROUNDING: chrono::Duration = chrono::Duration::microseconds(500);

/// The database's time read just before and just after an operation (this thread's skew
/// included): every statement of the operation read its clock in between. `before` is cut to
/// the millisecond, as SQLite reads its clock.
#[derive(Debug, Clone, Copy)]
struct Window {
    before: DateTime<Utc>,
    after: DateTime<Utc>,
}

impl Window {
    fn new(before: DateTime<Utc>, after: DateTime<Utc>) -> Window {
        Window {
            before: before.trunc_subsecs(3),
            after,
        }
    }

    /// `t` was written as the database's time during the operation.
    fn check_now(&self, t: Option<DateTime<Utc>>, what: &str) -> Result<(), TestCaseError> {
        self.check_ahead(t, chrono::Duration::zero(), chrono::Duration::zero(), what)
    }

    /// `t` was written as the database's time during the operation plus `offset`, which the
    /// database may have rounded by up to `slack`.
    fn check_ahead(
        &self,
        t: Option<DateTime<Utc>>,
        offset: chrono::Duration,
        slack: chrono::Duration,
        what: &str,
    ) -> Result<(), TestCaseError> {
        let Some(t) = t else {
            return Err(fail(format!("{what} is not set")));
        };
        prop_assert!(
            self.before - slack <= t - offset && t - offset <= self.after + slack,
            "{} {} is not {} (± {}) after a time in {:?}",
            what,
            t,
            offset,
            slack,
            self
        );
        Ok(())
    }
}

/// A failed attempt was written as asked: RETRY due its delay after the database's time during
/// the write, the delay within the backoff window of the attempt; DEAD with no due time.
fn check_failure_written(
    next_attempt_at: Option<DateTime<Utc>>,
    failure: &Failure,
    window: &Window,
) -> Result<(), TestCaseError> {
    // A DEAD row is not due again: it has no `next_attempt_at`.
    prop_assert_eq!(next_attempt_at.is_some(), failure.due().is_some());
    if let Failure::Retry { delay, .. } = failure {
        let delay = chrono::Duration::from_std(*delay).map_err(fail)?;
        window.check_ahead(next_attempt_at, delay, OFFSET_ROUNDING, "next_attempt_at")?;
        // Backoff: due no sooner than the base delay, no later than base plus jitter, after
        // the write (some instant in the window).
        let next_attempt_at = next_attempt_at.expect("checked above");
        let base = backoff().base_delay(failure.attempts() - 1);
        let most = chrono::Duration::from_std(base.mul_f64(1.2) + Duration::from_micros(1))
            .map_err(fail)?;
        let base = chrono::Duration::from_std(base).map_err(fail)?;
        prop_assert!(
            next_attempt_at - window.before >= base - OFFSET_ROUNDING
                && next_attempt_at - window.after <= most + OFFSET_ROUNDING,
            "next_attempt_at {} outside the backoff window [{:?}, {:?}] after {:?}",
            next_attempt_at,
            base,
            most,
            window
        );
    }
    Ok(())
}

/// Let time pass: the database's clock reads `by` later in this thread's statements from now on.
fn advance_clock(skew: &mut chrono::Duration, by: i64) {
    *skew += chrono::Duration::seconds(by);
    skew_by(*skew);
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

/// Run `case` over `strategy` on a current-thread runtime; panic with the minimal failing input.
fn run_cases<S, F, Fut>(name: &str, strategy: S, case: F)
where
    S: Strategy,
    S::Value: std::fmt::Debug,
    F: Fn(S::Value) -> Fut,
    Fut: std::future::Future<Output = Result<(), TestCaseError>>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let started = std::time::Instant::now();
    match runner.run(&strategy, |value| rt.block_on(case(value))) {
        Ok(()) => eprintln!("{name}: {} cases in {:.1?}", cases(), started.elapsed()),
        Err(TestError::Fail(reason, value)) => {
            panic!("{name} failed: {reason}\nminimal failing input: {value:#?}")
        }
        Err(e) => panic!("{name}: {e}"),
    }
}

async fn fresh_db() -> Result<DatabaseConnection, TestCaseError> {
    let mut opts = ConnectOptions::new("sqlite::memory:");
    opts.sqlx_logging(false)
        .max_connections(1)
        .min_connections(1)
        .acquire_timeout(Duration::from_secs(5));
    let db = Database::connect(opts).await.map_err(fail)?;
    outbox::migrate(&db).await.map_err(fail)?;
    Ok(db)
}

fn actor() -> Actor {
    Actor::new("state-machine-test")
}

/// Two relays (or inbox workers) with their own ids and claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    A,
    B,
}

impl Who {
    fn index(self) -> usize {
        match self {
            Who::A => 0,
            Who::B => 1,
        }
    }

    fn id(self) -> &'static str {
        match self {
            Who::A => "relay-a",
            Who::B => "relay-b",
        }
    }

    fn other(self) -> Who {
        match self {
            Who::A => Who::B,
            Who::B => Who::A,
        }
    }
}

fn who() -> impl Strategy<Value = Who> {
    prop_oneof![Just(Who::A), Just(Who::B)]
}

/// What a publish (outbox) or a handler (inbox) does with one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ok,
    Transient,
    Permanent,
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        6 => Just(Outcome::Ok),
        3 => Just(Outcome::Transient),
        1 => Just(Outcome::Permanent),
    ]
}

fn advance() -> impl Strategy<Value = i64> {
    // Around the lease (30 s), the first retry delays and past the backoff cap (60 s + 20%).
    prop_oneof![
        Just(0i64),
        Just(1),
        Just(5),
        Just(LEASE_SECS - 1),
        Just(LEASE_SECS + 1),
        Just(61),
        Just(400),
    ]
}

/// How often the interesting transitions happened, over all cases: a generator that never
/// reaches them proves nothing.
#[derive(Debug, Default)]
struct Coverage {
    claims: usize,
    reclaimed: usize,
    reclaimed_dead: usize,
    fenced_writes: usize,
    done: usize,
    retried: usize,
    dead: usize,
    released: usize,
    replayed: usize,
    resent_or_ignored: usize,
    duplicates: usize,
    blocked_behind_dead: usize,
    handed_back: usize,
    processing_behind_dead: usize,
    fast_owned: usize,
    fast_blocked: usize,
    wal_published: usize,
    wal_left: usize,
    wal_replayed: usize,
}

impl Coverage {
    fn add(&mut self, other: &Coverage) {
        self.claims += other.claims;
        self.reclaimed += other.reclaimed;
        self.reclaimed_dead += other.reclaimed_dead;
        self.fenced_writes += other.fenced_writes;
        self.done += other.done;
        self.retried += other.retried;
        self.dead += other.dead;
        self.released += other.released;
        self.replayed += other.replayed;
        self.resent_or_ignored += other.resent_or_ignored;
        self.duplicates += other.duplicates;
        self.blocked_behind_dead += other.blocked_behind_dead;
        self.handed_back += other.handed_back;
        self.processing_behind_dead += other.processing_behind_dead;
        self.fast_owned += other.fast_owned;
        self.fast_blocked += other.fast_blocked;
        self.wal_published += other.wal_published;
        self.wal_left += other.wal_left;
        self.wal_replayed += other.wal_replayed;
    }

    /// With enough cases, every transition the test is about must have happened.
    fn assert_reached(&self, name: &str) {
        eprintln!("{name}: {self:?}");
        if cases() < 32 {
            return;
        }
        for (what, n) in [
            ("claims", self.claims),
            ("reclaims of expired leases", self.reclaimed),
            ("DEAD after too many expired leases", self.reclaimed_dead),
            ("fenced-off writes of stale claims", self.fenced_writes),
            ("successful publishes/handlers", self.done),
            ("retries", self.retried),
            ("dead letters", self.dead),
            ("released claims", self.released),
            ("replays", self.replayed),
            ("resends/ignores", self.resent_or_ignored),
            (
                "expired claims handed back behind a new dead letter",
                self.handed_back,
            ),
        ] {
            assert!(n > 0, "{name}: no case exercised {what}: {self:?}");
        }
        if name.starts_with("outbox") {
            for (what, n) in [
                ("commits owned by the fast path", self.fast_owned),
                (
                    "fast-path commits left to the claim loop",
                    self.fast_blocked,
                ),
                ("events the WAL relay published", self.wal_published),
                ("events the WAL relay left to the table", self.wal_left),
                ("WAL batches read again", self.wal_replayed),
            ] {
                assert!(n > 0, "{name}: no case exercised {what}: {self:?}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Outbox

#[derive(Debug, Clone)]
enum OutboxOp {
    /// A business transaction commits `events` events of one aggregate.
    Commit { aggregate: u8, events: u8 },
    /// A business transaction enqueues an event, then rolls back.
    RolledBack { aggregate: u8 },
    /// A relay claims a batch (a relay still holding a claim has crashed and restarted).
    Claim { relay: Who, batch: u8 },
    /// A relay publishes its claim with these outcomes (cycled) and settles it.
    Publish { relay: Who, outcomes: Vec<Outcome> },
    /// A relay shuts down before publishing: its claim is handed back.
    Shutdown { relay: Who },
    /// A relay dies holding its claim; the rows stay PROCESSING until the lease expires.
    Crash { relay: Who },
    /// A business transaction commits through a relay's fast path: its events are written
    /// claimed by the fast path unless an earlier event of their aggregate is unsent, and join
    /// the fast path's claim in flight.
    FastCommit { aggregate: u8, events: u8 },
    /// The fast path publishes what it holds with these outcomes (cycled) and settles it.
    FastPublish { outcomes: Vec<Outcome> },
    /// The fast path's process dies holding its events (it comes back with a new token).
    FastCrash,
    /// A relay stalls past its lease and the other relay (restarting) claims: the stalled
    /// relay still holds its claim and will publish and settle it later, stale.
    TakeOver { relay: Who, batch: u8 },
    /// The WAL relay reads up to `batch` committed events from its slot's confirmed position
    /// (commit order), checks them against the rows, publishes what it may with these
    /// outcomes (cycled), and ends as `end` says.
    WalBatch {
        batch: u8,
        outcomes: Vec<Outcome>,
        end: WalEnd,
    },
    /// The database-local transport moves a batch into the inbox.
    LocalDelivery { batch: u8 },
    /// Time passes.
    Advance { seconds: i64 },
    /// An operator replays a row (only DEAD rows change).
    Replay { pick: u8 },
    /// An operator resends a row (only SENT rows change).
    Resend { pick: u8 },
}

/// How a WAL relay's batch ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WalEnd {
    /// Settled (SENT in bulk, failures written) and the slot's position confirmed.
    Confirm,
    /// Settled, then the process died before confirming: the batch is read again.
    DieBeforeConfirm,
    /// The broker confirmed, then the process died: nothing settled, nothing confirmed.
    DieAfterPublish,
}

#[derive(Debug, Clone)]
struct OutboxCase {
    max_attempts: u32,
    ops: Vec<OutboxOp>,
}

fn outbox_op() -> impl Strategy<Value = OutboxOp> {
    prop_oneof![
        4 => (0u8..3, 1u8..4).prop_map(|(aggregate, events)| OutboxOp::Commit { aggregate, events }),
        1 => (0u8..3).prop_map(|aggregate| OutboxOp::RolledBack { aggregate }),
        5 => (who(), 1u8..6).prop_map(|(relay, batch)| OutboxOp::Claim { relay, batch }),
        4 => (who(), prop::collection::vec(outcome(), 1..5))
            .prop_map(|(relay, outcomes)| OutboxOp::Publish { relay, outcomes }),
        1 => who().prop_map(|relay| OutboxOp::Shutdown { relay }),
        2 => who().prop_map(|relay| OutboxOp::Crash { relay }),
        1 => (who(), 1u8..6).prop_map(|(relay, batch)| OutboxOp::TakeOver { relay, batch }),
        3 => (0u8..3, 1u8..4).prop_map(|(aggregate, events)| OutboxOp::FastCommit { aggregate, events }),
        3 => prop::collection::vec(outcome(), 1..5).prop_map(|outcomes| OutboxOp::FastPublish { outcomes }),
        1 => Just(OutboxOp::FastCrash),
        3 => (1u8..8, prop::collection::vec(outcome(), 1..5), prop_oneof![
            4 => Just(WalEnd::Confirm),
            1 => Just(WalEnd::DieBeforeConfirm),
            1 => Just(WalEnd::DieAfterPublish),
        ])
            .prop_map(|(batch, outcomes, end)| OutboxOp::WalBatch { batch, outcomes, end }),
        1 => (1u8..6).prop_map(|batch| OutboxOp::LocalDelivery { batch }),
        4 => advance().prop_map(|seconds| OutboxOp::Advance { seconds }),
        1 => any::<u8>().prop_map(|pick| OutboxOp::Replay { pick }),
        1 => any::<u8>().prop_map(|pick| OutboxOp::Resend { pick }),
    ]
}

fn outbox_case() -> impl Strategy<Value = OutboxCase> {
    (1u32..=4, prop::collection::vec(outbox_op(), 1..60))
        .prop_map(|(max_attempts, ops)| OutboxCase { max_attempts, ops })
}

/// One `outbox_event` row, every column the state machine touches.
#[derive(Debug, Clone, PartialEq)]
struct OutRow {
    id: i64,
    event_id: uuid::Uuid,
    aggregate: String,
    status: String,
    attempts: i64,
    next_attempt_at: Option<DateTime<Utc>>,
    locked_by: Option<String>,
    locked_until: Option<DateTime<Utc>>,
    claim_token: Option<uuid::Uuid>,
    sent_at: Option<DateTime<Utc>>,
    last_error: Option<String>,
}

async fn outbox_rows(db: &DatabaseConnection) -> Result<BTreeMap<i64, OutRow>, TestCaseError> {
    let d = Dialect::of(db);
    let rows = db
        .query_all_raw(Statement::from_string(
            d.backend(),
            "SELECT id, event_id, aggregate_id, status, attempts, next_attempt_at, locked_by, \
             locked_until, claim_token, sent_at, last_error FROM outbox_event ORDER BY id",
        ))
        .await
        .map_err(fail)?;
    let mut out = BTreeMap::new();
    for row in rows {
        let r = (|| -> Result<OutRow, outbox::sea_orm::DbErr> {
            Ok(OutRow {
                id: row.try_get("", "id")?,
                event_id: d.get_uuid(&row, "event_id")?,
                aggregate: row.try_get("", "aggregate_id")?,
                status: row.try_get("", "status")?,
                attempts: row.try_get("", "attempts")?,
                next_attempt_at: d.get_opt_timestamp(&row, "next_attempt_at")?,
                locked_by: row.try_get("", "locked_by")?,
                locked_until: d.get_opt_timestamp(&row, "locked_until")?,
                claim_token: d.get_opt_uuid(&row, "claim_token")?,
                sent_at: d.get_opt_timestamp(&row, "sent_at")?,
                last_error: row.try_get("", "last_error")?,
            })
        })()
        .map_err(fail)?;
        out.insert(r.id, r);
    }
    // Sent events, moved to `outbox_sent` with what they keep.
    let sent = db
        .query_all_raw(Statement::from_string(
            d.backend(),
            "SELECT id, event_id, aggregate_id, attempts, locked_by, claim_token, sent_at \
             FROM outbox_sent ORDER BY id",
        ))
        .await
        .map_err(fail)?;
    for row in sent {
        let r = (|| -> Result<OutRow, outbox::sea_orm::DbErr> {
            Ok(OutRow {
                id: row.try_get("", "id")?,
                event_id: d.get_uuid(&row, "event_id")?,
                aggregate: row.try_get("", "aggregate_id")?,
                status: "SENT".to_owned(),
                attempts: row.try_get("", "attempts")?,
                next_attempt_at: None,
                locked_by: row.try_get("", "locked_by")?,
                locked_until: None,
                claim_token: d.get_opt_uuid(&row, "claim_token")?,
                sent_at: d.get_opt_timestamp(&row, "sent_at")?,
                last_error: None,
            })
        })()
        .map_err(fail)?;
        out.insert(r.id, r);
    }
    Ok(out)
}

/// The fast path's `locked_by`.
const FAST_OWNER: &str = "fast-path";

/// An empty claim under a new fast-path token: a process (re)started.
fn fast_claim() -> Claim {
    Claim {
        token: uuid::Uuid::new_v4(),
        events: Vec::new(),
        dead: Vec::new(),
        unreadable: 0,
        claimed_at: None,
        before: Default::default(),
    }
}

/// Every row in a legal state with consistent columns.
fn check_outbox_rows(rows: &BTreeMap<i64, OutRow>, max: u32) -> Result<(), TestCaseError> {
    let max = i64::from(max);
    for r in rows.values() {
        prop_assert!(
            (0..=max).contains(&r.attempts),
            "attempts out of range: {r:?}"
        );
        match r.status.as_str() {
            "PENDING" => {
                prop_assert!(r.locked_until.is_none() && r.sent_at.is_none(), "{r:?}");
                prop_assert!(r.attempts < max, "PENDING without attempts left: {r:?}");
            }
            "PROCESSING" => {
                prop_assert!(
                    r.locked_until.is_some() && r.claim_token.is_some() && r.locked_by.is_some(),
                    "PROCESSING without lease, token or owner: {r:?}"
                );
                prop_assert!(r.sent_at.is_none(), "{r:?}");
                prop_assert!(r.attempts < max, "PROCESSING without attempts left: {r:?}");
            }
            "RETRY" => {
                prop_assert!(r.next_attempt_at.is_some(), "RETRY without due time: {r:?}");
                prop_assert!(r.locked_until.is_none() && r.sent_at.is_none(), "{r:?}");
                prop_assert!(r.last_error.is_some(), "RETRY without error: {r:?}");
                prop_assert!((1..max).contains(&r.attempts), "RETRY attempts: {r:?}");
            }
            "SENT" => {
                prop_assert!(r.sent_at.is_some(), "SENT without sent_at: {r:?}");
                prop_assert!(r.locked_until.is_none() && r.last_error.is_none(), "{r:?}");
            }
            "DEAD" => {
                prop_assert!(r.last_error.is_some(), "DEAD without error: {r:?}");
                prop_assert!(r.locked_until.is_none() && r.sent_at.is_none(), "{r:?}");
                prop_assert!(r.attempts >= 1, "DEAD without an attempt: {r:?}");
            }
            other => prop_assert!(false, "unknown status {other}: {r:?}"),
        }
    }
    Ok(())
}

/// A SENT row was published (confirmed by the broker) at least once.
fn check_sent_published(
    rows: &BTreeMap<i64, OutRow>,
    published: &HashSet<i64>,
) -> Result<(), TestCaseError> {
    for r in rows.values().filter(|r| r.status == "SENT") {
        prop_assert!(
            published.contains(&r.id),
            "row is SENT but was never published: {r:?}"
        );
    }
    Ok(())
}

fn outbox_claimable(r: &OutRow, now: DateTime<Utc>) -> bool {
    match r.status.as_str() {
        "PENDING" => true,
        "RETRY" => r.next_attempt_at.is_some_and(|t| t <= now),
        "PROCESSING" => r.locked_until.is_some_and(|t| t < now),
        _ => false,
    }
}

/// Rows other than `changed` are exactly as they were.
fn unchanged_except<R: PartialEq + std::fmt::Debug>(
    before: &BTreeMap<i64, R>,
    after: &BTreeMap<i64, R>,
    changed: &HashSet<i64>,
    what: &str,
) -> Result<(), TestCaseError> {
    for (id, b) in before {
        if changed.contains(id) {
            continue;
        }
        prop_assert_eq!(
            after.get(id),
            Some(b),
            "{} changed row {} it does not own",
            what,
            id
        );
    }
    Ok(())
}

struct OutboxModel {
    db: DatabaseConnection,
    outbox: Outbox,
    /// How far ahead of the real clock the database's clock reads: time passed in the case.
    skew: chrono::Duration,
    max_attempts: u32,
    committed: usize,
    seq: u32,
    in_flight: [Option<Claim>; 2],
    /// What the fast path holds: the events commits wrote claimed by it, under its token.
    fast: Claim,
    /// The WAL relay's slot: every committed event's id in commit order, and how many of them
    /// its confirmed position is past; `replay` is set while a batch read once is read again.
    wal_log: Vec<i64>,
    wal_confirmed: usize,
    wal_replay: bool,
    moved_locally: HashSet<uuid::Uuid>,
    /// Rows the broker confirmed at least once: the first publication of each row of an
    /// aggregate must come in id order.
    published: HashSet<i64>,
    cov: Coverage,
}

impl OutboxModel {
    async fn new(max_attempts: u32) -> Result<Self, TestCaseError> {
        // A new case: no time has passed.
        skew_by(chrono::Duration::zero());
        Ok(OutboxModel {
            db: fresh_db().await?,
            outbox: Outbox::new("state-machine"),
            skew: chrono::Duration::zero(),
            max_attempts,
            committed: 0,
            seq: 0,
            in_flight: [None, None],
            fast: fast_claim(),
            wal_log: Vec::new(),
            wal_confirmed: 0,
            wal_replay: false,
            moved_locally: HashSet::new(),
            published: HashSet::new(),
            cov: Coverage::default(),
        })
    }

    async fn rows(&self) -> Result<BTreeMap<i64, OutRow>, TestCaseError> {
        outbox_rows(&self.db).await
    }

    async fn step(&mut self, op: &OutboxOp) -> Result<(), TestCaseError> {
        let before = self.rows().await?;
        match op {
            OutboxOp::Commit { aggregate, events } => {
                let tx = self.outbox.begin(&self.db).await.map_err(fail)?;
                for _ in 0..*events {
                    self.seq += 1;
                    tx.enqueue(&Happened {
                        thing: format!("t{aggregate}"),
                        seq: self.seq,
                    })
                    .map_err(fail)?;
                }
                let report = tx.commit().await.map_err(fail)?;
                prop_assert_eq!(report.written, usize::from(*events));
                self.committed += usize::from(*events);
            }
            OutboxOp::RolledBack { aggregate } => {
                let tx = self.outbox.begin(&self.db).await.map_err(fail)?;
                self.seq += 1;
                tx.enqueue(&Happened {
                    thing: format!("t{aggregate}"),
                    seq: self.seq,
                })
                .map_err(fail)?;
                tx.rollback().await.map_err(fail)?;
            }
            OutboxOp::Claim { relay, batch } => {
                // A relay that still holds a claim has crashed and restarted.
                let claim = self
                    .claim_checked(relay.id(), usize::from(*batch), &before)
                    .await?;
                self.in_flight[relay.index()] = Some(claim);
            }
            OutboxOp::Publish { relay, outcomes } => {
                if let Some(claim) = self.in_flight[relay.index()].take() {
                    self.publish_and_settle(&claim, outcomes, &before).await?;
                }
            }
            OutboxOp::Shutdown { relay } => {
                if let Some(claim) = self.in_flight[relay.index()].take() {
                    let mut settlement = Settlement::default();
                    for event in &claim.events {
                        settlement.released.push(event.id);
                        if event.reclaimed {
                            settlement.released_reclaimed.push(event.id);
                        }
                    }
                    self.settle_checked(
                        relay_store::Fence::Claim(claim.token),
                        &settlement,
                        &before,
                    )
                    .await?;
                }
            }
            OutboxOp::Crash { relay } => {
                self.in_flight[relay.index()] = None;
            }
            OutboxOp::FastCommit { aggregate, events } => {
                self.fast_commit_checked(*aggregate, *events, &before)
                    .await?;
            }
            OutboxOp::FastPublish { outcomes } => {
                let empty = Claim {
                    events: Vec::new(),
                    ..self.fast.clone()
                };
                let claim = std::mem::replace(&mut self.fast, empty);
                if !claim.events.is_empty() {
                    self.publish_and_settle(&claim, outcomes, &before).await?;
                }
            }
            OutboxOp::FastCrash => {
                self.fast = fast_claim();
            }
            OutboxOp::TakeOver { relay, batch } => {
                advance_clock(&mut self.skew, LEASE_SECS + 1);
                let before = self.rows().await?;
                let other = relay.other();
                let claim = self
                    .claim_checked(other.id(), usize::from(*batch), &before)
                    .await?;
                self.in_flight[other.index()] = Some(claim);
            }
            OutboxOp::WalBatch {
                batch,
                outcomes,
                end,
            } => {
                self.wal_batch_checked(usize::from(*batch), outcomes, *end, &before)
                    .await?;
            }
            OutboxOp::LocalDelivery { batch } => {
                self.local_delivery_checked(usize::from(*batch), &before)
                    .await?;
            }
            OutboxOp::Advance { seconds } => {
                advance_clock(&mut self.skew, *seconds);
            }
            OutboxOp::Replay { pick } => {
                if let Some(target) = pick_row(&before, *pick) {
                    self.replay_checked(target, &before).await?;
                }
            }
            OutboxOp::Resend { pick } => {
                if let Some(target) = pick_row(&before, *pick) {
                    self.resend_checked(target, &before).await?;
                }
            }
        }
        let after = self.rows().await?;
        prop_assert_eq!(
            after.len(),
            self.committed,
            "rows exist exactly for committed events"
        );
        // Commits reach the WAL relay's slot in commit order (one at a time here: id order).
        self.wal_log
            .extend(after.keys().filter(|id| !before.contains_key(id)));
        check_outbox_rows(&after, self.max_attempts)?;
        check_sent_published(&after, &self.published)?;
        Ok(())
    }

    fn params<'a>(&self, relay_id: &'a str, batch: usize) -> ClaimParams<'a> {
        ClaimParams {
            owner: relay_id,
            batch_size: batch,
            lease: LEASE,
            ordering: true,
            max_attempts: self.max_attempts,
        }
    }

    /// Claim, and check the claim took only claimable rows, in order, and made progress.
    async fn claim_checked(
        &mut self,
        relay_id: &str,
        batch: usize,
        before: &BTreeMap<i64, OutRow>,
    ) -> Result<Claim, TestCaseError> {
        let params = self.params(relay_id, batch);
        let started = db_now(&self.db).await?;
        let claim = relay_store::claim(&self.db, &params).await.map_err(fail)?;
        let window = Window::new(started, db_now(&self.db).await?);
        let after = self.rows().await?;
        self.cov.claims += 1;
        // The claim read the clock somewhere in the window: it may take a row claimable by its
        // end (claimability only grows with time), and must take one if one was by its start.
        let (early, late) = (window.before, window.after);
        prop_assert!(claim.events.len() + claim.dead.len() <= batch);
        prop_assert!(
            claim.events.windows(2).all(|w| w[0].id < w[1].id),
            "claimed events not in id order"
        );
        let claimed: HashSet<i64> = claim.events.iter().map(|e| e.id).collect();
        for event in &claim.events {
            let b = &before[&event.id];
            let a = &after[&event.id];
            prop_assert!(
                outbox_claimable(b, late),
                "claimed a row that is not due: {b:?} ({window:?})"
            );
            let reclaim = b.status == "PROCESSING";
            prop_assert_eq!(event.reclaimed, reclaim);
            prop_assert_eq!(&a.status, "PROCESSING");
            prop_assert_eq!(a.claim_token, Some(claim.token));
            prop_assert_eq!(a.locked_by.as_deref(), Some(relay_id));
            window.check_ahead(
                a.locked_until,
                chrono::Duration::seconds(LEASE_SECS),
                chrono::Duration::zero(),
                "lease",
            )?;
            prop_assert_eq!(a.attempts, b.attempts + i64::from(reclaim));
            prop_assert_eq!(i64::from(event.attempts), a.attempts);
            for earlier in before.range(..event.id).map(|(_, e)| e) {
                prop_assert!(
                    earlier.aggregate != b.aggregate
                        || earlier.status == "SENT"
                        || claimed.contains(&earlier.id),
                    "claimed row {} while earlier row {:?} of its aggregate is unsent",
                    event.id,
                    earlier
                );
            }
            if reclaim {
                self.cov.reclaimed += 1;
            }
        }
        for event in &claim.dead {
            let b = &before[&event.id];
            let a = &after[&event.id];
            prop_assert!(
                b.status == "PROCESSING" && outbox_claimable(b, late),
                "{b:?} ({window:?})"
            );
            prop_assert_eq!(&a.status, "DEAD");
            prop_assert_eq!(a.attempts, b.attempts + 1);
            prop_assert!(a.attempts >= i64::from(self.max_attempts));
            self.cov.reclaimed_dead += 1;
        }
        let mut changed: HashSet<i64> = claimed
            .iter()
            .copied()
            .chain(claim.dead.iter().map(|e| e.id))
            .collect();
        // Expired claims behind an event this claim made DEAD are handed back as PENDING,
        // with no attempt counted.
        let dead_aggregates: HashSet<&str> = claim
            .dead
            .iter()
            .map(|e| before[&e.id].aggregate.as_str())
            .collect();
        for (id, b) in before {
            let a = &after[id];
            if changed.contains(id) || a == b {
                continue;
            }
            prop_assert!(
                b.status == "PROCESSING"
                    && outbox_claimable(b, late)
                    && dead_aggregates.contains(b.aggregate.as_str()),
                "claim changed row {id} it does not own: {b:?} -> {a:?}"
            );
            prop_assert_eq!(&a.status, "PENDING");
            prop_assert_eq!(a.attempts, b.attempts);
            prop_assert_eq!(a.locked_until, None);
            changed.insert(*id);
            self.cov.handed_back += 1;
        }
        unchanged_except(before, &after, &changed, "claim")?;
        if changed.is_empty() {
            // No progress is only right when nothing is eligible.
            for r in before.values() {
                let free = before
                    .range(..r.id)
                    .all(|(_, e)| e.aggregate != r.aggregate || e.status == "SENT");
                prop_assert!(
                    !(outbox_claimable(r, early) && free),
                    "claim took nothing although row {r:?} is due and first of its aggregate \
                     ({window:?})"
                );
            }
        }
        Ok(claim)
    }

    /// Commit through the fast path, and check the INSERT's decision: an event is written
    /// claimed by the fast path exactly when no earlier event of its aggregate (committed
    /// before this transaction) is unsent; the rest are PENDING and unleased.
    async fn fast_commit_checked(
        &mut self,
        aggregate: u8,
        events: u8,
        before: &BTreeMap<i64, OutRow>,
    ) -> Result<(), TestCaseError> {
        let thing = format!("t{aggregate}");
        let tx = self.outbox.begin(&self.db).await.map_err(fail)?;
        for _ in 0..events {
            self.seq += 1;
            tx.enqueue(&Happened {
                thing: thing.clone(),
                seq: self.seq,
            })
            .map_err(fail)?;
        }
        let (report, owned) = tx
            .commit_claimed(FAST_OWNER, self.fast.token, LEASE)
            .await
            .map_err(fail)?;
        prop_assert_eq!(report.written, usize::from(events));
        self.committed += usize::from(events);
        let after = self.rows().await?;
        let blocked = before
            .values()
            .any(|r| r.aggregate == thing && r.status != "SENT");
        let new: Vec<&OutRow> = after
            .values()
            .filter(|r| !before.contains_key(&r.id))
            .collect();
        prop_assert_eq!(new.len(), usize::from(events));
        for r in &new {
            if blocked {
                prop_assert_eq!(&r.status, "PENDING", "behind an unsent event: {:?}", r);
                prop_assert!(r.locked_by.is_none() && r.locked_until.is_none(), "{r:?}");
            } else {
                prop_assert_eq!(
                    &r.status,
                    "PROCESSING",
                    "first unsent of its aggregate: {:?}",
                    r
                );
                prop_assert_eq!(r.claim_token, Some(self.fast.token));
                prop_assert_eq!(r.locked_by.as_deref(), Some(FAST_OWNER));
            }
        }
        let owned_ids: Vec<i64> = owned.iter().map(|e| e.id).collect();
        let expected: Vec<i64> = if blocked {
            Vec::new()
        } else {
            new.iter().map(|r| r.id).collect()
        };
        prop_assert_eq!(
            owned_ids,
            expected,
            "the commit hands over what it owns, in id order"
        );
        if blocked {
            self.cov.fast_blocked += 1;
        } else {
            self.cov.fast_owned += 1;
        }
        unchanged_except(
            before,
            &after,
            &new.iter().map(|r| r.id).collect(),
            "fast commit",
        )?;
        self.fast.events.extend(owned);
        Ok(())
    }

    /// A WAL relay's batch: the events after the slot's confirmed position, checked against the
    /// rows ([`outbox::store::wal::check`], [`outbox::store::wal::choose`]); what it may publish
    /// is published with `outcomes` and settled on rows still PENDING.
    async fn wal_batch_checked(
        &mut self,
        batch: usize,
        outcomes: &[Outcome],
        end: WalEnd,
        before: &BTreeMap<i64, OutRow>,
    ) -> Result<(), TestCaseError> {
        let upto = (self.wal_confirmed + batch).min(self.wal_log.len());
        let ids = self.wal_log[self.wal_confirmed..upto].to_vec();
        if ids.is_empty() {
            return Ok(());
        }
        if self.wal_replay {
            self.cov.wal_replayed += 1;
        }
        // The stream's image of each row: as it was inserted.
        let events: Vec<relay_store::ClaimedEvent> = ids
            .iter()
            .map(|id| {
                let r = &before[id];
                relay_store::ClaimedEvent {
                    id: r.id,
                    event_id: r.event_id,
                    source: "state-machine".into(),
                    event_type: "happened".into(),
                    schema_version: 1,
                    aggregate_type: AGGREGATE_TYPE.into(),
                    aggregate_id: r.aggregate.clone(),
                    aggregate_version: None,
                    payload: "{}".into(),
                    headers: "{}".into(),
                    created_at: Utc::now(),
                    attempts: 0,
                    reclaimed: false,
                }
            })
            .collect();
        let checks = outbox::store::wal::check(&self.db, &ids)
            .await
            .map_err(fail)?;
        let (publish, left) = outbox::store::wal::choose(events, &checks, true);
        self.cov.wal_left += left;
        // Only PENDING rows whose earlier events of the aggregate are all SENT or published
        // before them in this batch.
        let chosen: HashSet<i64> = publish.iter().map(|e| e.id).collect();
        for e in &publish {
            let row = &before[&e.id];
            prop_assert_eq!(
                &row.status,
                "PENDING",
                "the stream publishes PENDING rows only"
            );
            prop_assert_eq!(
                i64::from(e.attempts),
                row.attempts,
                "attempts as the row has them"
            );
            for earlier in before.range(..e.id).map(|(_, r)| r) {
                prop_assert!(
                    earlier.aggregate != row.aggregate
                        || earlier.status == "SENT"
                        || chosen.contains(&earlier.id),
                    "the stream publishes row {} ahead of unsent row {}: {:?}",
                    e.id,
                    earlier.id,
                    earlier
                );
            }
        }
        let claim = Claim {
            token: uuid::Uuid::nil(),
            events: publish,
            dead: Vec::new(),
            unreadable: 0,
            claimed_at: None,
            before: Default::default(),
        };
        let settlement = self.decide(&claim, outcomes);
        self.record_publications(&settlement.sent, before)?;
        self.cov.wal_published += settlement.sent.len();
        if end == WalEnd::DieAfterPublish {
            self.wal_replay = true;
            return Ok(());
        }
        self.settle_checked(relay_store::Fence::Pending, &settlement, before)
            .await?;
        match end {
            WalEnd::Confirm => {
                self.wal_confirmed = upto;
                self.wal_replay = false;
            }
            _ => self.wal_replay = true,
        }
        Ok(())
    }

    /// Publish a claim as the relay does, record what the broker confirmed, and settle.
    async fn publish_and_settle(
        &mut self,
        claim: &Claim,
        outcomes: &[Outcome],
        before: &BTreeMap<i64, OutRow>,
    ) -> Result<(), TestCaseError> {
        let settlement = self.decide(claim, outcomes);
        self.record_publications(&settlement.sent, before)?;
        self.settle_checked(relay_store::Fence::Claim(claim.token), &settlement, before)
            .await
    }

    /// The broker confirmed these rows, in this order. The first publication of a row must
    /// come after the first publication of every earlier row of its aggregate. (A row
    /// published again, by a stale relay or after an operator's resend, is a duplicate the
    /// inbox absorbs.)
    fn record_publications(
        &mut self,
        ids: &[i64],
        rows: &BTreeMap<i64, OutRow>,
    ) -> Result<(), TestCaseError> {
        for id in ids {
            if self.published.contains(id) {
                continue;
            }
            let row = &rows[id];
            for earlier in rows.range(..id).map(|(_, e)| e) {
                prop_assert!(
                    earlier.aggregate != row.aggregate || self.published.contains(&earlier.id),
                    "row {} of aggregate {} published before row {} ever was: {earlier:?}",
                    id,
                    row.aggregate,
                    earlier.id
                );
            }
            self.published.insert(*id);
        }
        Ok(())
    }

    /// What the relay does with a claim: publish each aggregate's events in order; the first
    /// failure of an aggregate is recorded and the rest of its run is handed back.
    fn decide(&self, claim: &Claim, outcomes: &[Outcome]) -> Settlement {
        let mut settlement = Settlement::default();
        let mut groups: Vec<Vec<&relay_store::ClaimedEvent>> = Vec::new();
        let mut index: HashMap<&str, usize> = HashMap::new();
        for event in &claim.events {
            let slot = *index.entry(&event.aggregate_id).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[slot].push(event);
        }
        let mut next = outcomes.iter().copied().cycle();
        for group in groups {
            let mut run = group.into_iter();
            while let Some(event) = run.next() {
                match next.next().unwrap_or(Outcome::Ok) {
                    Outcome::Ok => settlement.sent.push(event.id),
                    failure => {
                        let failure_was = failure;
                        let attempts = event.attempts + 1;
                        let delay = backoff().delay(event.attempts);
                        let error = format!("{failure:?} failure");
                        let failure =
                            if failure == Outcome::Permanent || attempts >= self.max_attempts {
                                Failure::Dead { attempts, error }
                            } else {
                                Failure::Retry {
                                    attempts,
                                    delay,
                                    error,
                                }
                            };
                        settlement.failed.push(FailedEvent {
                            id: event.id,
                            failure,
                            class: if failure_was == Outcome::Permanent {
                                FailureClass::Permanent
                            } else {
                                FailureClass::Rejected
                            },
                        });
                        for rest in run.by_ref() {
                            settlement.released.push(rest.id);
                            if rest.reclaimed {
                                settlement.released_reclaimed.push(rest.id);
                            }
                        }
                    }
                }
            }
        }
        settlement
    }

    /// Settle, and check that exactly the rows still held by this claim moved as settled, and
    /// that every other row (taken over, or moved on meanwhile) is untouched.
    async fn settle_checked(
        &mut self,
        fence: relay_store::Fence,
        settlement: &Settlement,
        before: &BTreeMap<i64, OutRow>,
    ) -> Result<(), TestCaseError> {
        let started = db_now(&self.db).await?;
        let settled = relay_store::settle(&self.db, fence, settlement)
            .await
            .map_err(fail)?;
        let window = Window::new(started, db_now(&self.db).await?);
        let after = self.rows().await?;
        // The rows the fence lets the write-back change: PROCESSING under the claim's token, or
        // (the WAL relay) still PENDING.
        let owned = |id: &i64| {
            before.get(id).is_some_and(|b| match fence {
                relay_store::Fence::Claim(token) => {
                    b.status == "PROCESSING" && b.claim_token == Some(token)
                }
                relay_store::Fence::Pending => b.status == "PENDING",
            })
        };
        let mut changed = HashSet::new();
        let mut expected = (0u64, 0u64, 0u64);
        for id in settlement.sent.iter().filter(|id| owned(id)) {
            let (b, a) = (&before[id], &after[id]);
            prop_assert_eq!(&a.status, "SENT");
            window.check_now(a.sent_at, "sent_at")?;
            prop_assert_eq!(a.attempts, b.attempts);
            changed.insert(*id);
            expected.0 += 1;
            self.cov.done += 1;
        }
        for f in settlement.failed.iter().filter(|f| owned(&f.id)) {
            let a = &after[&f.id];
            let dead = f.failure.is_dead();
            prop_assert_eq!(&a.status, if dead { "DEAD" } else { "RETRY" });
            prop_assert_eq!(a.attempts, i64::from(f.failure.attempts()));
            check_failure_written(a.next_attempt_at, &f.failure, &window)?;
            changed.insert(f.id);
            expected.1 += 1;
            if dead {
                self.cov.dead += 1;
            } else {
                self.cov.retried += 1;
            }
        }
        let refunded: HashSet<i64> = settlement.released_reclaimed.iter().copied().collect();
        for id in settlement.released.iter().filter(|id| owned(id)) {
            let (b, a) = (&before[id], &after[id]);
            prop_assert_eq!(&a.status, "PENDING");
            prop_assert_eq!(a.attempts, b.attempts - i64::from(refunded.contains(id)));
            changed.insert(*id);
            expected.2 += 1;
            self.cov.released += 1;
        }
        prop_assert_eq!(
            (settled.sent, settled.failed, settled.released),
            expected,
            "settle reports the rows it changed"
        );
        let asked = settlement.sent.len() + settlement.failed.len() + settlement.released.len();
        if changed.len() < asked {
            self.cov.fenced_writes += asked - changed.len();
        }
        unchanged_except(before, &after, &changed, "a fenced settle")
    }

    /// The database-local transport: due rows become SENT with one inbox row each, in order.
    async fn local_delivery_checked(
        &mut self,
        batch: usize,
        before: &BTreeMap<i64, OutRow>,
    ) -> Result<(), TestCaseError> {
        let params = self.params("relay-local", batch);
        let routes = |_: &str| vec!["local"];
        let started = db_now(&self.db).await?;
        let moved = move_to_inbox(&self.db, &params, &routes, &[])
            .await
            .map_err(fail)?;
        let window = Window::new(started, db_now(&self.db).await?);
        let after = self.rows().await?;
        let changed: HashSet<i64> = before
            .keys()
            .filter(|id| before[*id] != after[*id])
            .copied()
            .collect();
        prop_assert_eq!(moved.events + moved.dead, changed.len());
        let mut delivered: Vec<i64> = changed
            .iter()
            .copied()
            .filter(|id| after[id].status == "SENT")
            .collect();
        delivered.sort_unstable();
        self.record_publications(&delivered, before)?;
        prop_assert!(changed.len() <= batch);
        for id in &changed {
            let (b, a) = (&before[id], &after[id]);
            prop_assert!(
                outbox_claimable(b, window.after),
                "moved a row not due: {b:?} ({window:?})"
            );
            if a.status == "DEAD" {
                continue;
            }
            prop_assert_eq!(&a.status, "SENT");
            window.check_now(a.sent_at, "sent_at")?;
            self.moved_locally.insert(a.event_id);
        }
        prop_assert_eq!(moved.inbox_rows + moved.duplicates, moved.events);
        let inbox_rows = self
            .db
            .query_one_raw(Statement::from_string(
                Dialect::of(&self.db).backend(),
                "SELECT COUNT(*) AS n FROM inbox_event WHERE consumer = 'local'",
            ))
            .await
            .map_err(fail)?
            .expect("a count")
            .try_get::<i64>("", "n")
            .map_err(fail)?;
        prop_assert_eq!(
            usize::try_from(inbox_rows).unwrap_or(0),
            self.moved_locally.len(),
            "one inbox row per event moved, resent or not"
        );
        self.cov.done += changed.len();
        self.cov.duplicates += moved.duplicates;
        Ok(())
    }

    async fn replay_checked(
        &mut self,
        target: &OutRow,
        before: &BTreeMap<i64, OutRow>,
    ) -> Result<(), TestCaseError> {
        let report = admin::replay(
            &self.db,
            &Selector::Ids(vec![Target::outbox(target.id)]),
            &actor(),
        )
        .await
        .map_err(fail)?;
        let after = self.rows().await?;
        let a = &after[&target.id];
        if target.status == "DEAD" {
            prop_assert_eq!(report.outbox, 1);
            prop_assert_eq!(&a.status, "PENDING");
            prop_assert_eq!(a.attempts, 0);
            prop_assert!(
                a.next_attempt_at.is_none() && a.claim_token.is_none() && a.locked_by.is_none()
            );
            self.cov.replayed += 1;
            unchanged_except(before, &after, &HashSet::from([target.id]), "replay")
        } else {
            prop_assert_eq!(report.outbox, 0);
            prop_assert_eq!(report.skipped.len(), 1);
            unchanged_except(before, &after, &HashSet::new(), "a refused replay")
        }
    }

    async fn resend_checked(
        &mut self,
        target: &OutRow,
        before: &BTreeMap<i64, OutRow>,
    ) -> Result<(), TestCaseError> {
        let report = admin::resend(
            &self.db,
            &admin::Resend::Events(vec![target.event_id]),
            &actor(),
        )
        .await
        .map_err(fail)?;
        let after = self.rows().await?;
        let a = &after[&target.id];
        if target.status == "SENT" {
            prop_assert_eq!(report.outbox, 1);
            prop_assert_eq!(&a.status, "PENDING");
            prop_assert_eq!(a.attempts, 0);
            prop_assert!(a.sent_at.is_none() && a.claim_token.is_none() && a.last_error.is_none());
            self.cov.resent_or_ignored += 1;
            unchanged_except(before, &after, &HashSet::from([target.id]), "resend")
        } else {
            prop_assert_eq!(report.outbox, 0);
            prop_assert_eq!(report.skipped.len(), 1);
            unchanged_except(before, &after, &HashSet::new(), "a refused resend")
        }
    }

    /// Every publish succeeds and time moves on: the outbox must come to rest within a bounded
    /// number of rounds. Returns the rounds it took.
    async fn drain(&mut self) -> Result<usize, TestCaseError> {
        let bound = self.committed + 2;
        for round in 0..bound {
            advance_clock(&mut self.skew, DRAIN_STEP_SECS);
            let before = self.rows().await?;
            let claim = self.claim_checked("relay-drain", 50, &before).await?;
            let after_claim = self.rows().await?;
            if claim.events.is_empty() && claim.dead.is_empty() {
                return Ok(round);
            }
            self.publish_and_settle(&claim, &[Outcome::Ok], &after_claim)
                .await?;
            let after = self.rows().await?;
            check_outbox_rows(&after, self.max_attempts)?;
            check_sent_published(&after, &self.published)?;
        }
        Err(fail(format!(
            "the outbox did not come to rest within {bound} rounds: {:#?}",
            self.rows().await?
        )))
    }

    /// At rest, each aggregate is a run of SENT rows, then, if anything is left, a DEAD row
    /// holding the rest back until an operator acts. A row held back may be PROCESSING under an
    /// expired lease when its claim crashed and the event ahead of it died some other way than
    /// by the claim that reclaims it (which hands such rows back as PENDING); a replay of the
    /// dead event makes them claimable again.
    async fn check_at_rest(&mut self) -> Result<(), TestCaseError> {
        let rows = self.rows().await?;
        let mut blocked: HashSet<&str> = HashSet::new();
        for r in rows.values() {
            if blocked.contains(r.aggregate.as_str()) {
                if r.status != "SENT" && r.status != "DEAD" {
                    self.cov.blocked_behind_dead += 1;
                }
                if r.status == "PROCESSING" {
                    self.cov.processing_behind_dead += 1;
                }
                continue;
            }
            match r.status.as_str() {
                "SENT" => {}
                "DEAD" => {
                    blocked.insert(&r.aggregate);
                }
                _ => prop_assert!(
                    false,
                    "row unreachable at rest, not behind a dead letter: {r:?}\n{rows:#?}"
                ),
            }
        }
        Ok(())
    }
}

fn pick_row<R>(rows: &BTreeMap<i64, R>, pick: u8) -> Option<&R> {
    if rows.is_empty() {
        return None;
    }
    rows.values().nth(usize::from(pick) % rows.len())
}

async fn run_outbox_case(
    case: OutboxCase,
    cov: &std::cell::RefCell<Coverage>,
) -> Result<(), TestCaseError> {
    let mut model = OutboxModel::new(case.max_attempts).await?;
    for op in &case.ops {
        model.step(op).await?;
    }
    // The crashed relays' claims are gone; stale relays may still settle (fenced off) later.
    model.drain().await?;
    // The operator replays every dead letter until none is left (a row that sat behind a dead
    // one under an expired lease may use up its own budget when reclaimed, and die in turn).
    let bound = model.committed + 1;
    for round in 0.. {
        model.check_at_rest().await?;
        let before = model.rows().await?;
        let dead = before.values().filter(|r| r.status == "DEAD").count() as u64;
        if dead == 0 {
            break;
        }
        prop_assert!(round < bound, "dead letters keep coming back after replay");
        let report = admin::replay(&model.db, &Selector::All, &actor())
            .await
            .map_err(fail)?;
        prop_assert_eq!(report.outbox, dead);
        model.cov.replayed += 1;
        model.drain().await?;
    }
    let rows = model.rows().await?;
    for r in rows.values() {
        prop_assert_eq!(&r.status, "SENT", "after replay every row is sent: {:?}", r);
    }
    // A relay that held a claim all along settles now: fenced off, nothing changes.
    for slot in 0..2 {
        if let Some(claim) = model.in_flight[slot].take() {
            model
                .publish_and_settle(&claim, &[Outcome::Transient], &rows)
                .await?;
        }
    }
    let fast = std::mem::replace(&mut model.fast, fast_claim());
    if !fast.events.is_empty() {
        model
            .publish_and_settle(&fast, &[Outcome::Transient], &rows)
            .await?;
    }
    cov.borrow_mut().add(&model.cov);
    Ok(())
}

#[test]
fn outbox_rows_stay_legal_and_always_reach_sent_or_dead() {
    let cov = std::cell::RefCell::new(Coverage::default());
    run_cases("outbox state machine", outbox_case(), |case| {
        run_outbox_case(case, &cov)
    });
    cov.borrow().assert_reached("outbox coverage");
}

/// A fixed sequence: a relay whose lease expired and whose rows another relay reclaimed and
/// sent cannot overwrite them.
#[test]
fn outbox_stale_relay_is_fenced_off() {
    use OutboxOp::*;
    let cov = std::cell::RefCell::new(Coverage::default());
    let case = OutboxCase {
        max_attempts: 3,
        ops: vec![
            Commit {
                aggregate: 0,
                events: 2,
            },
            Claim {
                relay: Who::A,
                batch: 5,
            },
            Advance {
                seconds: LEASE_SECS + 1,
            },
            Claim {
                relay: Who::B,
                batch: 5,
            },
            Publish {
                relay: Who::B,
                outcomes: vec![Outcome::Ok],
            },
            Publish {
                relay: Who::A,
                outcomes: vec![Outcome::Transient],
            },
        ],
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run_outbox_case(case, &cov)).unwrap();
    let cov = cov.borrow();
    assert_eq!(cov.reclaimed, 2, "{cov:?}");
    // A's failure record for the first event and the release of the second are fenced off.
    assert_eq!(cov.fenced_writes, 2, "{cov:?}");
}

/// A fixed sequence: relays that keep crashing on an event make it DEAD after `max_attempts`
/// expired leases, and the events behind it wait until an operator replays it.
#[test]
fn outbox_poison_event_ends_dead_after_expired_leases() {
    use OutboxOp::*;
    let cov = std::cell::RefCell::new(Coverage::default());
    let mut ops = vec![Commit {
        aggregate: 0,
        events: 1,
    }];
    for relay in [Who::A, Who::B, Who::A, Who::B] {
        ops.push(Claim { relay, batch: 1 });
        ops.push(Crash { relay });
        ops.push(Advance {
            seconds: LEASE_SECS + 1,
        });
    }
    ops.push(Commit {
        aggregate: 0,
        events: 1,
    });
    let case = OutboxCase {
        max_attempts: 3,
        ops,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run_outbox_case(case, &cov)).unwrap();
    let cov = cov.borrow();
    assert_eq!(cov.reclaimed_dead, 1, "{cov:?}");
    assert_eq!(cov.blocked_behind_dead, 1, "{cov:?}");
}

// ---------------------------------------------------------------------------------------------
// Inbox

const CONSUMERS: [&str; 2] = ["c0", "c1"];

#[derive(Debug, Clone, Copy)]
enum Arrival {
    /// Stored mode: recorded PENDING for the worker.
    Stored,
    /// Handled inline on delivery (unless behind an unfinished message of its aggregate).
    Inline(Outcome),
}

#[derive(Debug, Clone)]
enum InboxOp {
    /// A new message arrives for a consumer.
    Deliver {
        consumer: u8,
        aggregate: u8,
        arrival: Arrival,
    },
    /// The broker delivers a recorded message again.
    Redeliver {
        pick: u8,
        arrival: Arrival,
    },
    /// A worker claims a batch of one consumer (a worker still holding a claim has restarted).
    Claim {
        worker: Who,
        consumer: u8,
        batch: u8,
    },
    /// A worker runs the handlers of its claim with these outcomes (cycled).
    Handle {
        worker: Who,
        outcomes: Vec<Outcome>,
    },
    /// A worker shuts down before handling: its claim is handed back.
    Shutdown {
        worker: Who,
    },
    /// A worker dies holding its claim.
    Crash {
        worker: Who,
    },
    /// A worker stalls past its lease and the other worker (restarting) claims the same
    /// consumer: the stalled worker still holds its claim and will handle it later, stale.
    TakeOver {
        worker: Who,
        batch: u8,
    },
    Advance {
        seconds: i64,
    },
    /// An operator replays a row (only DEAD rows change).
    Replay {
        pick: u8,
    },
    /// An operator ignores a row (only DEAD rows change).
    Ignore {
        pick: u8,
    },
}

#[derive(Debug, Clone)]
struct InboxCase {
    max_attempts: u32,
    ops: Vec<InboxOp>,
    /// How the operator resolves the dead letters left at rest: replay (true) or ignore.
    replay_at_rest: Vec<bool>,
}

fn arrival() -> impl Strategy<Value = Arrival> {
    prop_oneof![
        2 => Just(Arrival::Stored),
        3 => outcome().prop_map(Arrival::Inline),
    ]
}

fn inbox_op() -> impl Strategy<Value = InboxOp> {
    prop_oneof![
        5 => (0u8..2, 0u8..3, arrival()).prop_map(|(consumer, aggregate, arrival)| {
            InboxOp::Deliver { consumer, aggregate, arrival }
        }),
        1 => (any::<u8>(), arrival()).prop_map(|(pick, arrival)| InboxOp::Redeliver { pick, arrival }),
        5 => (who(), prop_oneof![3 => Just(0u8), 1 => Just(1u8)], 1u8..6)
            .prop_map(|(worker, consumer, batch)| InboxOp::Claim { worker, consumer, batch }),
        4 => (who(), prop::collection::vec(outcome(), 1..5))
            .prop_map(|(worker, outcomes)| InboxOp::Handle { worker, outcomes }),
        1 => who().prop_map(|worker| InboxOp::Shutdown { worker }),
        2 => who().prop_map(|worker| InboxOp::Crash { worker }),
        2 => (who(), 1u8..6).prop_map(|(worker, batch)| InboxOp::TakeOver { worker, batch }),
        4 => advance().prop_map(|seconds| InboxOp::Advance { seconds }),
        1 => any::<u8>().prop_map(|pick| InboxOp::Replay { pick }),
        1 => any::<u8>().prop_map(|pick| InboxOp::Ignore { pick }),
    ]
}

fn inbox_case() -> impl Strategy<Value = InboxCase> {
    (
        1u32..=4,
        prop::collection::vec(inbox_op(), 1..60),
        prop::collection::vec(any::<bool>(), 1..8),
    )
        .prop_map(|(max_attempts, ops, replay_at_rest)| InboxCase {
            max_attempts,
            ops,
            replay_at_rest,
        })
}

/// One `inbox_event` row, every column the state machine touches.
#[derive(Debug, Clone, PartialEq)]
struct InRow {
    id: i64,
    consumer: String,
    message_id: String,
    aggregate: Option<String>,
    status: String,
    attempts: i64,
    next_attempt_at: Option<DateTime<Utc>>,
    locked_by: Option<String>,
    locked_until: Option<DateTime<Utc>>,
    claim_token: Option<uuid::Uuid>,
    processed_at: Option<DateTime<Utc>>,
    last_error: Option<String>,
}

impl InRow {
    fn lane(&self) -> (&str, Option<&str>) {
        (&self.consumer, self.aggregate.as_deref())
    }

    fn finished(&self) -> bool {
        self.status == "DONE" || self.status == "IGNORED"
    }
}

async fn inbox_rows(db: &DatabaseConnection) -> Result<BTreeMap<i64, InRow>, TestCaseError> {
    let d = Dialect::of(db);
    let rows = db
        .query_all_raw(Statement::from_string(
            d.backend(),
            "SELECT id, consumer, message_id, aggregate_id, status, attempts, next_attempt_at, \
             locked_by, locked_until, claim_token, processed_at, last_error FROM inbox_event \
             ORDER BY id",
        ))
        .await
        .map_err(fail)?;
    let mut out = BTreeMap::new();
    for row in rows {
        let r = (|| -> Result<InRow, outbox::sea_orm::DbErr> {
            Ok(InRow {
                id: row.try_get("", "id")?,
                consumer: row.try_get("", "consumer")?,
                message_id: row.try_get("", "message_id")?,
                aggregate: row.try_get("", "aggregate_id")?,
                status: row.try_get("", "status")?,
                attempts: row.try_get("", "attempts")?,
                next_attempt_at: d.get_opt_timestamp(&row, "next_attempt_at")?,
                locked_by: row.try_get("", "locked_by")?,
                locked_until: d.get_opt_timestamp(&row, "locked_until")?,
                claim_token: d.get_opt_uuid(&row, "claim_token")?,
                processed_at: d.get_opt_timestamp(&row, "processed_at")?,
                last_error: row.try_get("", "last_error")?,
            })
        })()
        .map_err(fail)?;
        out.insert(r.id, r);
    }
    Ok(out)
}

fn check_inbox_rows(rows: &BTreeMap<i64, InRow>, max: u32) -> Result<(), TestCaseError> {
    let max = i64::from(max);
    for r in rows.values() {
        prop_assert!(
            (0..=max).contains(&r.attempts),
            "attempts out of range: {r:?}"
        );
        match r.status.as_str() {
            "PENDING" => {
                prop_assert!(
                    r.locked_until.is_none() && r.processed_at.is_none(),
                    "{r:?}"
                );
                prop_assert!(r.attempts < max, "PENDING without attempts left: {r:?}");
            }
            "PROCESSING" => {
                prop_assert!(
                    r.locked_until.is_some() && r.claim_token.is_some() && r.locked_by.is_some(),
                    "PROCESSING without lease, token or owner: {r:?}"
                );
                prop_assert!(r.processed_at.is_none(), "{r:?}");
                prop_assert!(r.attempts < max, "PROCESSING without attempts left: {r:?}");
            }
            "RETRY" => {
                prop_assert!(r.next_attempt_at.is_some(), "RETRY without due time: {r:?}");
                prop_assert!(
                    r.locked_until.is_none() && r.processed_at.is_none(),
                    "{r:?}"
                );
                prop_assert!(r.last_error.is_some(), "RETRY without error: {r:?}");
                // 0 after an operator's replay: a fresh budget.
                prop_assert!((0..max).contains(&r.attempts), "RETRY attempts: {r:?}");
            }
            "DONE" => {
                prop_assert!(r.processed_at.is_some(), "DONE without processed_at: {r:?}");
                prop_assert!(r.locked_until.is_none() && r.last_error.is_none(), "{r:?}");
                prop_assert!(r.attempts >= 1, "DONE without an attempt: {r:?}");
            }
            "DEAD" => {
                prop_assert!(r.last_error.is_some(), "DEAD without error: {r:?}");
                prop_assert!(
                    r.locked_until.is_none() && r.processed_at.is_none(),
                    "{r:?}"
                );
            }
            "IGNORED" => {
                prop_assert!(
                    r.processed_at.is_some(),
                    "IGNORED without processed_at: {r:?}"
                );
                prop_assert!(r.locked_until.is_none(), "{r:?}");
            }
            other => prop_assert!(false, "unknown status {other}: {r:?}"),
        }
    }
    Ok(())
}

/// A message that became DONE in this step comes after every earlier message of its
/// consumer and aggregate (each DONE or IGNORED by an operator).
fn check_done_order(
    before: &BTreeMap<i64, InRow>,
    after: &BTreeMap<i64, InRow>,
) -> Result<(), TestCaseError> {
    for r in after.values() {
        let newly_done = r.status == "DONE" && before.get(&r.id).is_none_or(|b| b.status != "DONE");
        if !newly_done {
            continue;
        }
        for earlier in after.range(..r.id).map(|(_, e)| e) {
            prop_assert!(
                earlier.lane() != r.lane() || earlier.finished(),
                "message {} handled before message {:?} of its aggregate",
                r.id,
                earlier
            );
        }
    }
    Ok(())
}

fn inbox_claimable(r: &InRow, now: DateTime<Utc>) -> bool {
    match r.status.as_str() {
        "PENDING" => true,
        "RETRY" => r.next_attempt_at.is_some_and(|t| t <= now),
        "PROCESSING" => r.locked_until.is_some_and(|t| t < now),
        _ => false,
    }
}

struct InboxModel {
    db: DatabaseConnection,
    /// How far ahead of the real clock the database's clock reads: time passed in the case.
    skew: chrono::Duration,
    max_attempts: u32,
    messages: usize,
    in_flight: [Option<(&'static str, InboxClaim)>; 2],
    cov: Coverage,
}

impl InboxModel {
    async fn new(max_attempts: u32) -> Result<Self, TestCaseError> {
        // A new case: no time has passed.
        skew_by(chrono::Duration::zero());
        Ok(InboxModel {
            db: fresh_db().await?,
            skew: chrono::Duration::zero(),
            max_attempts,
            messages: 0,
            in_flight: [None, None],
            cov: Coverage::default(),
        })
    }

    async fn rows(&self) -> Result<BTreeMap<i64, InRow>, TestCaseError> {
        inbox_rows(&self.db).await
    }

    async fn step(&mut self, op: &InboxOp) -> Result<(), TestCaseError> {
        let before = self.rows().await?;
        match op {
            InboxOp::Deliver {
                consumer,
                aggregate,
                arrival,
            } => {
                self.messages += 1;
                let message_id = format!("m{}", self.messages);
                let aggregate = format!("t{aggregate}");
                let consumer = CONSUMERS[usize::from(*consumer)];
                let inserted = self
                    .deliver(consumer, &message_id, &aggregate, *arrival)
                    .await?;
                prop_assert!(inserted, "a new message is recorded");
                let after = self.rows().await?;
                prop_assert_eq!(after.len(), before.len() + 1);
                unchanged_except(&before, &after, &HashSet::new(), "a delivery")?;
            }
            InboxOp::Redeliver { pick, arrival } => {
                if let Some(r) = pick_row(&before, *pick) {
                    let (consumer, message_id) = (r.consumer.clone(), r.message_id.clone());
                    let consumer = CONSUMERS
                        .into_iter()
                        .find(|c| *c == consumer)
                        .expect("a known consumer");
                    let aggregate = r.aggregate.clone().unwrap_or_default();
                    let inserted = self
                        .deliver(consumer, &message_id, &aggregate, *arrival)
                        .await?;
                    prop_assert!(!inserted, "a redelivery is suppressed");
                    let after = self.rows().await?;
                    unchanged_except(&before, &after, &HashSet::new(), "a duplicate delivery")?;
                    prop_assert_eq!(after.len(), before.len());
                    self.cov.duplicates += 1;
                }
            }
            InboxOp::Claim {
                worker,
                consumer,
                batch,
            } => {
                let consumer = CONSUMERS[usize::from(*consumer)];
                let claim = self
                    .claim_checked(worker.id(), consumer, usize::from(*batch), &before)
                    .await?;
                self.in_flight[worker.index()] = Some((consumer, claim));
            }
            InboxOp::Handle { worker, outcomes } => {
                if let Some((_, claim)) = self.in_flight[worker.index()].take() {
                    self.handle_checked(&claim, outcomes).await?;
                }
            }
            InboxOp::Shutdown { worker } => {
                if let Some((_, claim)) = self.in_flight[worker.index()].take() {
                    self.release_checked(&claim, &claim.messages.iter().collect::<Vec<_>>())
                        .await?;
                }
            }
            InboxOp::Crash { worker } => {
                self.in_flight[worker.index()] = None;
            }
            InboxOp::TakeOver { worker, batch } => {
                advance_clock(&mut self.skew, LEASE_SECS + 1);
                let consumer = self.in_flight[worker.index()]
                    .as_ref()
                    .map_or(CONSUMERS[0], |(consumer, _)| *consumer);
                let before = self.rows().await?;
                let other = worker.other();
                let claim = self
                    .claim_checked(other.id(), consumer, usize::from(*batch), &before)
                    .await?;
                self.in_flight[other.index()] = Some((consumer, claim));
            }
            InboxOp::Advance { seconds } => {
                advance_clock(&mut self.skew, *seconds);
            }
            InboxOp::Replay { pick } => {
                if let Some(target) = pick_row(&before, *pick) {
                    self.resolve_checked(target, true, &before).await?;
                }
            }
            InboxOp::Ignore { pick } => {
                if let Some(target) = pick_row(&before, *pick) {
                    self.resolve_checked(target, false, &before).await?;
                }
            }
        }
        let after = self.rows().await?;
        check_inbox_rows(&after, self.max_attempts)?;
        check_done_order(&before, &after)?;
        Ok(())
    }

    /// A delivery as the consumer records it: stored for the worker (stored mode, or behind an
    /// unfinished message of its aggregate), or handled inline in the transaction that records
    /// it, a failure then recorded as RETRY or DEAD. Returns whether it was recorded.
    async fn deliver(
        &mut self,
        consumer: &'static str,
        message_id: &str,
        aggregate: &str,
        arrival: Arrival,
    ) -> Result<bool, TestCaseError> {
        let row = NewInboxRow {
            consumer,
            message_id,
            event_type: Some("thing.happened"),
            source: Some("state-machine"),
            aggregate_type: Some(AGGREGATE_TYPE),
            aggregate_id: Some(aggregate),
            aggregate_version: None,
            schema_version: Some(1),
            payload: b"{}",
            ..NewInboxRow::default()
        };
        let failure = match arrival {
            Arrival::Stored => {
                return inbox_store::insert(&self.db, &row, &InboxState::Pending)
                    .await
                    .map_err(fail);
            }
            Arrival::Inline(outcome) => outcome,
        };
        // Recorded in the handler's transaction: PENDING behind an unfinished message of its
        // aggregate (committed without running the handler), else DONE and handled.
        let tx = self.db.begin().await.map_err(fail)?;
        let recorded = inbox_store::record_batch(&tx, std::slice::from_ref(&row), true)
            .await
            .map_err(fail)?;
        match recorded.first() {
            Some(Recorded::Pending) => {
                tx.commit().await.map_err(fail)?;
                return Ok(true);
            }
            Some(Recorded::Done) if failure == Outcome::Ok => {
                tx.commit().await.map_err(fail)?;
                self.cov.done += 1;
                return Ok(true);
            }
            Some(Recorded::Done) => tx.rollback().await.map_err(fail)?,
            Some(Recorded::Duplicate) | None => {
                tx.rollback().await.map_err(fail)?;
                return Ok(false);
            }
        }
        // The handler's transaction (with the inbox record) rolled back; record the failure.
        let state = self.failure_state(failure, 1);
        inbox_store::insert(&self.db, &row, &state)
            .await
            .map_err(fail)
    }

    fn failure_state(&mut self, failure: Outcome, attempts: u32) -> InboxState {
        if failure == Outcome::Permanent || attempts >= self.max_attempts {
            self.cov.dead += 1;
            InboxState::Failed(Failure::Dead {
                attempts,
                error: format!("{failure:?} failure"),
            })
        } else {
            self.cov.retried += 1;
            InboxState::Failed(Failure::Retry {
                attempts,
                delay: backoff().delay(attempts - 1),
                error: format!("{failure:?} failure"),
            })
        }
    }

    async fn claim_checked(
        &mut self,
        worker_id: &str,
        consumer: &str,
        batch: usize,
        before: &BTreeMap<i64, InRow>,
    ) -> Result<InboxClaim, TestCaseError> {
        let params = ClaimParams {
            owner: worker_id,
            batch_size: batch,
            lease: LEASE,
            ordering: true,
            max_attempts: self.max_attempts,
        };
        let started = db_now(&self.db).await?;
        let claim = inbox_store::claim(&self.db, consumer, &params)
            .await
            .map_err(fail)?;
        let window = Window::new(started, db_now(&self.db).await?);
        let after = self.rows().await?;
        self.cov.claims += 1;
        // The claim read the clock somewhere in the window: it may take a message claimable by
        // its end (claimability only grows with time), and must take one if one was by its start.
        let (early, late) = (window.before, window.after);
        prop_assert!(claim.messages.len() + claim.dead <= batch);
        let claimed: HashSet<i64> = claim.messages.iter().map(|m| m.id).collect();
        for m in &claim.messages {
            let b = &before[&m.id];
            let a = &after[&m.id];
            prop_assert_eq!(&b.consumer, consumer, "claimed another consumer's message");
            prop_assert!(
                inbox_claimable(b, late),
                "claimed a message not due: {b:?} ({window:?})"
            );
            let reclaim = b.status == "PROCESSING";
            prop_assert_eq!(m.reclaimed, reclaim);
            prop_assert_eq!(&a.status, "PROCESSING");
            prop_assert_eq!(a.claim_token, Some(claim.token));
            prop_assert_eq!(a.locked_by.as_deref(), Some(worker_id));
            window.check_ahead(
                a.locked_until,
                chrono::Duration::seconds(LEASE_SECS),
                chrono::Duration::zero(),
                "lease",
            )?;
            prop_assert_eq!(a.attempts, b.attempts + i64::from(reclaim));
            prop_assert_eq!(i64::from(m.attempts), a.attempts);
            for earlier in before.range(..m.id).map(|(_, e)| e) {
                prop_assert!(
                    earlier.lane() != b.lane()
                        || earlier.finished()
                        || claimed.contains(&earlier.id),
                    "claimed message {} while earlier message {:?} of its aggregate is unfinished",
                    m.id,
                    earlier
                );
            }
            if reclaim {
                self.cov.reclaimed += 1;
            }
        }
        let mut changed = claimed.clone();
        let mut dead = 0;
        let mut dead_lanes = HashSet::new();
        let mut handed_back = Vec::new();
        for (id, b) in before {
            let a = &after[id];
            if claimed.contains(id) || a == b {
                continue;
            }
            prop_assert!(
                b.status == "PROCESSING" && b.consumer == consumer && inbox_claimable(b, late),
                "claim changed a row it may not take: {b:?} -> {a:?} ({window:?})"
            );
            changed.insert(*id);
            if a.status == "PENDING" {
                // An expired claim behind a message this claim made DEAD: handed back, with
                // no attempt counted (checked below: its lane holds a new dead letter).
                prop_assert_eq!(a.attempts, b.attempts);
                prop_assert_eq!(a.locked_until, None);
                handed_back.push(b.lane());
                self.cov.handed_back += 1;
                continue;
            }
            prop_assert_eq!(&a.status, "DEAD");
            prop_assert_eq!(a.attempts, b.attempts + 1);
            prop_assert!(a.attempts >= i64::from(self.max_attempts));
            dead_lanes.insert(b.lane());
            dead += 1;
            self.cov.reclaimed_dead += 1;
        }
        for lane in handed_back {
            prop_assert!(
                dead_lanes.contains(&lane),
                "a message handed back although nothing ahead of it died: {lane:?}"
            );
        }
        prop_assert_eq!(claim.dead, dead);
        unchanged_except(before, &after, &changed, "an inbox claim")?;
        if changed.is_empty() {
            for r in before.values().filter(|r| r.consumer == consumer) {
                let free = before
                    .range(..r.id)
                    .all(|(_, e)| e.lane() != r.lane() || e.finished());
                prop_assert!(
                    !(inbox_claimable(r, early) && free),
                    "claim took nothing although message {r:?} is due and first of its \
                     aggregate ({window:?})"
                );
            }
        }
        Ok(claim)
    }

    /// What the worker does with a claim: per aggregate in order, run the handler; on success
    /// mark DONE in the handler's transaction (fenced), on failure record RETRY or DEAD (fenced);
    /// after the first failure or a fenced-off write, hand the rest of the aggregate back.
    async fn handle_checked(
        &mut self,
        claim: &InboxClaim,
        outcomes: &[Outcome],
    ) -> Result<(), TestCaseError> {
        let mut groups: Vec<Vec<&inbox_store::ClaimedMessage>> = Vec::new();
        let mut index: HashMap<Option<&str>, usize> = HashMap::new();
        for m in &claim.messages {
            let slot = *index.entry(m.aggregate_id.as_deref()).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[slot].push(m);
        }
        let mut next = outcomes.iter().copied().cycle();
        for group in groups {
            let mut run = group.into_iter();
            while let Some(m) = run.next() {
                let before = self.rows().await?;
                let b = &before[&m.id];
                let owned = b.status == "PROCESSING" && b.claim_token == Some(claim.token);
                let outcome = next.next().unwrap_or(Outcome::Ok);
                let started = db_now(&self.db).await?;
                let (written, failure) = match outcome {
                    Outcome::Ok => {
                        let tx = self.db.begin().await.map_err(fail)?;
                        let marked = inbox_store::mark_done(&tx, m.id, claim.token)
                            .await
                            .map_err(fail)?;
                        tx.commit().await.map_err(fail)?;
                        (marked, None)
                    }
                    failure => {
                        let attempts = m.attempts + 1;
                        let InboxState::Failed(failure) = self.failure_state(failure, attempts)
                        else {
                            unreachable!("a failure state")
                        };
                        let marked =
                            inbox_store::mark_failed(&self.db, m.id, claim.token, &failure)
                                .await
                                .map_err(fail)?;
                        (marked, Some(failure))
                    }
                };
                let window = Window::new(started, db_now(&self.db).await?);
                let after = self.rows().await?;
                prop_assert_eq!(
                    written,
                    owned,
                    "a write lands iff the claim still owns the row"
                );
                if written {
                    let a = &after[&m.id];
                    match &failure {
                        None => {
                            prop_assert_eq!(&a.status, "DONE");
                            prop_assert_eq!(a.attempts, b.attempts + 1);
                            window.check_now(a.processed_at, "processed_at")?;
                            self.cov.done += 1;
                        }
                        Some(failure) => {
                            prop_assert_eq!(
                                &a.status,
                                if failure.is_dead() { "DEAD" } else { "RETRY" },
                                "{:?}",
                                a
                            );
                            prop_assert_eq!(a.attempts, b.attempts + 1);
                            check_failure_written(a.next_attempt_at, failure, &window)?;
                        }
                    }
                    unchanged_except(&before, &after, &HashSet::from([m.id]), "a handler")?;
                } else {
                    self.cov.fenced_writes += 1;
                    unchanged_except(&before, &after, &HashSet::new(), "a fenced write")?;
                }
                check_done_order(&before, &after)?;
                if outcome != Outcome::Ok || !written {
                    let rest: Vec<&inbox_store::ClaimedMessage> = run.by_ref().collect();
                    self.release_checked(claim, &rest).await?;
                }
            }
        }
        Ok(())
    }

    async fn release_checked(
        &mut self,
        claim: &InboxClaim,
        messages: &[&inbox_store::ClaimedMessage],
    ) -> Result<(), TestCaseError> {
        if messages.is_empty() {
            return Ok(());
        }
        let before = self.rows().await?;
        let ids: Vec<i64> = messages.iter().map(|m| m.id).collect();
        let reclaimed: Vec<i64> = messages
            .iter()
            .filter(|m| m.reclaimed)
            .map(|m| m.id)
            .collect();
        let released = inbox_store::release(&self.db, claim.token, &ids, &reclaimed)
            .await
            .map_err(fail)?;
        let after = self.rows().await?;
        let mut changed = HashSet::new();
        for id in &ids {
            let b = &before[id];
            if b.status == "PROCESSING" && b.claim_token == Some(claim.token) {
                let a = &after[id];
                prop_assert_eq!(&a.status, "PENDING");
                prop_assert_eq!(a.attempts, b.attempts - i64::from(reclaimed.contains(id)));
                changed.insert(*id);
                self.cov.released += 1;
            } else {
                self.cov.fenced_writes += 1;
            }
        }
        prop_assert_eq!(released, changed.len() as u64);
        unchanged_except(&before, &after, &changed, "a release")
    }

    async fn resolve_checked(
        &mut self,
        target: &InRow,
        replay: bool,
        before: &BTreeMap<i64, InRow>,
    ) -> Result<(), TestCaseError> {
        let report = if replay {
            admin::replay(
                &self.db,
                &Selector::Ids(vec![Target::inbox(target.id)]),
                &actor(),
            )
            .await
        } else {
            admin::ignore(
                &self.db,
                &Selector::Ids(vec![Target::inbox(target.id)]),
                &actor(),
            )
            .await
        }
        .map_err(fail)?;
        let after = self.rows().await?;
        let a = &after[&target.id];
        if target.status == "DEAD" {
            prop_assert_eq!(report.inbox, 1);
            if replay {
                prop_assert_eq!(&a.status, "RETRY");
                prop_assert_eq!(a.attempts, 0);
                prop_assert!(a.next_attempt_at.is_some() && a.claim_token.is_none());
                self.cov.replayed += 1;
            } else {
                prop_assert_eq!(&a.status, "IGNORED");
                self.cov.resent_or_ignored += 1;
            }
            unchanged_except(
                before,
                &after,
                &HashSet::from([target.id]),
                "an admin action",
            )
        } else {
            prop_assert_eq!(report.inbox, 0);
            prop_assert_eq!(report.skipped.len(), 1);
            unchanged_except(before, &after, &HashSet::new(), "a refused admin action")
        }
    }

    /// Every handler succeeds and time moves on: the inbox must come to rest within a bounded
    /// number of rounds.
    async fn drain(&mut self) -> Result<usize, TestCaseError> {
        let bound = self.rows().await?.len() + 2;
        for round in 0..bound {
            advance_clock(&mut self.skew, DRAIN_STEP_SECS);
            let mut progress = false;
            for consumer in CONSUMERS {
                let before = self.rows().await?;
                let claim = self
                    .claim_checked("worker-drain", consumer, 50, &before)
                    .await?;
                let after = self.rows().await?;
                progress |= before != after;
                self.handle_checked(&claim, &[Outcome::Ok]).await?;
                let after = self.rows().await?;
                check_inbox_rows(&after, self.max_attempts)?;
            }
            if !progress {
                return Ok(round);
            }
        }
        Err(fail(format!(
            "the inbox did not come to rest within {bound} rounds: {:#?}",
            self.rows().await?
        )))
    }

    /// At rest, each consumer's aggregate is a run of DONE or IGNORED messages, then, if
    /// anything is left, a DEAD message holding the rest back until an operator acts.
    async fn check_at_rest(&mut self) -> Result<Vec<i64>, TestCaseError> {
        let rows = self.rows().await?;
        let mut blocked: HashSet<(&str, Option<&str>)> = HashSet::new();
        let mut dead = Vec::new();
        for r in rows.values() {
            if blocked.contains(&r.lane()) {
                if r.status == "DEAD" {
                    dead.push(r.id);
                } else if !r.finished() {
                    self.cov.blocked_behind_dead += 1;
                }
                if r.status == "PROCESSING" {
                    self.cov.processing_behind_dead += 1;
                }
                continue;
            }
            match r.status.as_str() {
                "DONE" | "IGNORED" => {}
                "DEAD" => {
                    blocked.insert(r.lane());
                    dead.push(r.id);
                }
                _ => prop_assert!(
                    false,
                    "message unreachable at rest, not behind a dead letter: {r:?}\n{rows:#?}"
                ),
            }
        }
        Ok(dead)
    }
}

async fn run_inbox_case(
    case: InboxCase,
    cov: &std::cell::RefCell<Coverage>,
) -> Result<(), TestCaseError> {
    let mut model = InboxModel::new(case.max_attempts).await?;
    for op in &case.ops {
        model.step(op).await?;
    }
    model.drain().await?;
    // The operator resolves dead letters until none is left; each round must end at rest.
    for round in 0.. {
        let dead = model.check_at_rest().await?;
        if dead.is_empty() {
            break;
        }
        prop_assert!(round < 100, "dead letters keep coming back");
        for (i, id) in dead.into_iter().enumerate() {
            let replay = case.replay_at_rest[(round + i) % case.replay_at_rest.len()];
            let before = model.rows().await?;
            let target = before[&id].clone();
            model.resolve_checked(&target, replay, &before).await?;
        }
        model.drain().await?;
    }
    for r in model.rows().await?.values() {
        prop_assert!(
            r.finished(),
            "after the operator acted, every message is finished: {r:?}"
        );
    }
    cov.borrow_mut().add(&model.cov);
    Ok(())
}

#[test]
fn inbox_rows_stay_legal_and_always_reach_done_dead_or_ignored() {
    let cov = std::cell::RefCell::new(Coverage::default());
    run_cases("inbox state machine", inbox_case(), |case| {
        run_inbox_case(case, &cov)
    });
    cov.borrow().assert_reached("inbox coverage");
}

/// A fixed sequence: a worker whose lease expired cannot mark DONE, RETRY or release a message
/// another worker took over.
#[test]
fn inbox_stale_worker_is_fenced_off() {
    use InboxOp::*;
    let cov = std::cell::RefCell::new(Coverage::default());
    let case = InboxCase {
        max_attempts: 3,
        ops: vec![
            Deliver {
                consumer: 0,
                aggregate: 0,
                arrival: Arrival::Stored,
            },
            Deliver {
                consumer: 0,
                aggregate: 0,
                arrival: Arrival::Stored,
            },
            Claim {
                worker: Who::A,
                consumer: 0,
                batch: 5,
            },
            Advance {
                seconds: LEASE_SECS + 1,
            },
            Claim {
                worker: Who::B,
                consumer: 0,
                batch: 5,
            },
            Handle {
                worker: Who::A,
                outcomes: vec![Outcome::Transient],
            },
            Handle {
                worker: Who::B,
                outcomes: vec![Outcome::Ok],
            },
        ],
        replay_at_rest: vec![true],
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run_inbox_case(case, &cov)).unwrap();
    let cov = cov.borrow();
    assert_eq!(cov.reclaimed, 2, "{cov:?}");
    // A's failure record and the release of its second message are both fenced off.
    assert_eq!(cov.fenced_writes, 2, "{cov:?}");
}

/// A fixed sequence: a worker whose message died meanwhile (its lease expired once too often,
/// so the next claim made it DEAD, still carrying the stale worker's token) cannot mark it DONE.
#[test]
fn inbox_stale_worker_cannot_finish_a_message_that_died_meanwhile() {
    use InboxOp::*;
    let cov = std::cell::RefCell::new(Coverage::default());
    let case = InboxCase {
        max_attempts: 1,
        ops: vec![
            Deliver {
                consumer: 0,
                aggregate: 0,
                arrival: Arrival::Stored,
            },
            Claim {
                worker: Who::A,
                consumer: 0,
                batch: 1,
            },
            TakeOver {
                worker: Who::A,
                batch: 1,
            },
            Handle {
                worker: Who::A,
                outcomes: vec![Outcome::Ok],
            },
        ],
        replay_at_rest: vec![true],
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run_inbox_case(case, &cov)).unwrap();
    let cov = cov.borrow();
    assert_eq!(cov.reclaimed_dead, 1, "{cov:?}");
    assert_eq!(cov.fenced_writes, 1, "{cov:?}");
}

/// The same for the outbox: a relay cannot mark SENT an event that died while it stalled.
#[test]
fn outbox_stale_relay_cannot_send_an_event_that_died_meanwhile() {
    use OutboxOp::*;
    let cov = std::cell::RefCell::new(Coverage::default());
    let case = OutboxCase {
        max_attempts: 1,
        ops: vec![
            Commit {
                aggregate: 0,
                events: 1,
            },
            Claim {
                relay: Who::A,
                batch: 1,
            },
            TakeOver {
                relay: Who::A,
                batch: 1,
            },
            Publish {
                relay: Who::A,
                outcomes: vec![Outcome::Ok],
            },
        ],
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run_outbox_case(case, &cov)).unwrap();
    let cov = cov.borrow();
    assert_eq!(cov.reclaimed_dead, 1, "{cov:?}");
    assert_eq!(cov.fenced_writes, 1, "{cov:?}");
}
