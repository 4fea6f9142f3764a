//! Hosts whose wall clocks disagree: SDK processes run with libfaketime preloaded (Debian's
//! package `faketime`, which `.ci/run` installs), each with its wall clock shifted and its
//! monotonic clock untouched, against one database. Leases, due times and cutoffs are the
//! database's clock, so they agree:
//!
//! - **relays**: two relays publishing one backlog to Redis Streams (which keeps every copy),
//!   once with their clocks in step and once with the second relay 60 s ahead. The skewed run
//!   must put no more copies on the stream than the run in step: a relay whose clock runs ahead
//!   does not see the other relay's live leases as expired;
//! - **worker ahead**: an inbox worker 60 s ahead handles what is due, and leaves alone a message
//!   another worker holds under a live lease and a retry due in 45 s;
//! - **worker behind**: an inbox worker 60 s behind takes an expired lease and a due retry at
//!   once, not a minute late;
//! - **janitor ahead**: a retention janitor 2 days ahead neither takes the janitor lease another
//!   instance holds nor deletes a row younger than the retention window by the database's clock.
//!
//! The workers and the janitor run on PostgreSQL and MariaDB, the relays on PostgreSQL. Each
//! child first reports its wall clock's distance to the database's, and the supervisor checks that
//! the skew is really there, so a libfaketime that did nothing fails the test instead of passing
//! it.
//!
//! A binary of its own (`harness = false`, outside `tests/it`): it runs copies of itself as the
//! child processes, with libfaketime preloaded.

#[path = "it/common/mod.rs"]
mod common;

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use common::{Backend, TestDb, backdate_inbox, connect, effects, insert_effect, test_db};
use outbox::inbox::InboxConfig;
use outbox::prelude::*;
use outbox::relay::RelayConfig;
use outbox::retention::{self, RetentionPolicy};
use outbox::runtime::Runtime;
use outbox::sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement, Value};
use outbox::store::claim::ClaimParams;
use outbox::store::inbox::{self as inbox_store, InboxState, NewInboxRow};
use outbox::store::{Failure, database_now};
use outbox::transport::redis::{RedisTransport, redis};
use serde::{Deserialize, Serialize};

const ROLE: &str = "OUTBOX_SKEW_ROLE";
const DB_URL: &str = "OUTBOX_SKEW_DB";
const NAMESPACE: &str = "OUTBOX_SKEW_NS";
const DIR: &str = "OUTBOX_SKEW_DIR";
const WORKER: &str = "skew-worker";
const REDIS_URL: &str = "redis://127.0.0.1:6379";

#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[event(name = "skew.ticked", aggregate = "clock", version = 1)]
struct Ticked {
    #[event(aggregate_id)]
    clock: String,
    seq: i64,
}

#[inbox_handler(consumer = "skew-worker")]
async fn count_tick(tx: &InboxTransaction, event: Event<Ticked>) -> Result<(), HandlerError> {
    insert_effect(tx, event.id(), &event.clock, event.seq).await
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        return child_main(&role);
    }
    if common::harness_selects("clock_skew") {
        supervise();
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Children.

fn child_main(role: &str) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let dir = PathBuf::from(env(DIR));
    let result = runtime.block_on(async {
        let db = connect(&env(DB_URL), 8).await?;
        // What this process's wall clock says against the database's: the supervisor checks
        // that the skew it asked for is there.
        let offset = Utc::now() - database_now(&db).await?;
        write(
            &dir,
            &format!("{role}.clock"),
            &offset.num_seconds().to_string(),
        );
        match role {
            "relay-a" | "relay-b" => relay(db, role, &dir).await,
            "worker" => work(db).await,
            "janitor" => janitor(db, &dir).await,
            other => Err(format!("unknown role {other}").into()),
        }
    });
    if let Err(e) = result {
        eprintln!("clock_skew {role}: {e}");
        std::process::exit(1);
    }
}

fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("writing a report");
    std::fs::rename(&tmp, &path).expect("writing a report");
}

async fn terminated() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    term.recv().await;
}

async fn relay(db: DatabaseConnection, name: &str, dir: &Path) -> Result<(), BoxError> {
    let transport = RedisTransport::builder(REDIS_URL)
        .namespace(env(NAMESPACE))
        .connect()
        .await?;
    let runtime = Runtime::builder(db)
        .source("skew-relays")
        .transport(transport)
        .relay_config(
            RelayConfig::default()
                .relay_id(name.to_owned())
                .batch_size(20)
                .poll_interval(Duration::from_millis(50)),
        )
        .consumers(Vec::<String>::new())
        .retention(None, Duration::from_secs(60))
        .start()
        .await?;
    terminated().await;
    let sent = runtime.relay_stats().unwrap_or_default().sent;
    runtime.shutdown().await;
    write(dir, &format!("{name}.sent"), &sent.to_string());
    Ok(())
}

async fn work(db: DatabaseConnection) -> Result<(), BoxError> {
    let runtime = Runtime::builder(db)
        .source("skew-workers")
        .without_relay()
        .retention(None, Duration::from_secs(60))
        .consumers([WORKER])
        .inbox_config(InboxConfig::default().poll_interval(Duration::from_millis(100)))
        .start()
        .await?;
    terminated().await;
    runtime.shutdown().await;
    Ok(())
}

#[derive(Debug, Serialize, Deserialize)]
struct JanitorReport {
    /// Whether it took the janitor lease (another instance holds it).
    leader: bool,
    outbox_deleted: u64,
    inbox_deleted: u64,
}

async fn janitor(db: DatabaseConnection, dir: &Path) -> Result<(), BoxError> {
    let policy = janitor_policy();
    let leader = retention::purge_once_if_leader(&db, &policy, "janitor-b")
        .await?
        .is_some();
    let report = retention::purge(&db, &policy).await?;
    let report = JanitorReport {
        leader,
        outbox_deleted: report.outbox_deleted,
        inbox_deleted: report.inbox_deleted,
    };
    write(dir, "janitor.json", &serde_json::to_string(&report)?);
    Ok(())
}

fn janitor_policy() -> RetentionPolicy {
    RetentionPolicy::default()
        .sent_after(DAY)
        .done_after(DAY)
        .lease(Duration::from_secs(300))
}

const DAY: Duration = Duration::from_secs(86_400);

// ---------------------------------------------------------------------------------------------
// Supervisor.

/// A child process, under libfaketime when its clock is skewed.
struct Proc {
    name: String,
    child: Child,
}

impl Proc {
    fn start(scenario: &Scenario, role: &str, skew: &str) -> Proc {
        // A report of an earlier life of the same role is not this one's.
        let _ = std::fs::remove_file(scenario.dir.join(format!("{role}.clock")));
        let mut command = Command::new(std::env::current_exe().expect("the test binary"));
        if !skew.is_empty() {
            common::skew_wall_clock(&mut command, skew);
        }
        command
            .env(ROLE, role)
            .env(DB_URL, &scenario.db.url)
            .env(NAMESPACE, &scenario.namespace)
            .env(DIR, &scenario.dir)
            .stdin(Stdio::null());
        Proc {
            name: role.to_owned(),
            child: command.spawn().expect("starting a child"),
        }
    }

    /// Its wall clock's distance to the database's, once it reported it.
    fn clock_offset(&self, scenario: &Scenario) -> i64 {
        let path = scenario.dir.join(format!("{}.clock", self.name));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(text) = std::fs::read_to_string(&path) {
                return text.trim().parse().expect("a clock report");
            }
            assert!(
                Instant::now() < deadline,
                "{} never reported its clock",
                self.name
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop(mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        self.wait();
    }

    fn wait(&mut self) {
        let status = self.child.wait().expect("waiting for a child");
        assert!(status.success(), "{} exited with {status}", self.name);
    }
}

impl Drop for Proc {
    /// A child left behind by a failed check is killed, not orphaned.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Scenario {
    db: TestDb,
    namespace: String,
    dir: PathBuf,
}

impl Scenario {
    async fn new(backend: Backend, name: &str) -> Option<Scenario> {
        let db = test_db(backend, name).await?;
        let namespace = common::fresh_namespace(name);
        let dir = std::env::temp_dir()
            .join("outbox-clock-skew")
            .join(&namespace);
        std::fs::create_dir_all(&dir).expect("a report directory");
        Some(Scenario { db, namespace, dir })
    }

    /// Start `role` with its wall clock shifted by `skew` (`faketime`'s syntax, e.g. `+60s`), and
    /// check the skew is there.
    fn start(&self, role: &str, skew: &str, seconds: i64) -> Proc {
        let proc = Proc::start(self, role, skew);
        let offset = proc.clock_offset(self);
        assert!(
            (offset - seconds).abs() <= 5,
            "{role} should run {seconds} s off the database's clock, but runs {offset} s off"
        );
        proc
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).expect("a child's report")
    }
}

fn supervise() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if common::find_libfaketime().is_none() {
        let why = "libfaketime is not installed (Debian's package faketime; .ci/run installs it)";
        if common::services_required() {
            panic!("{why}");
        }
        eprintln!("\n*** SKIPPED clock_skew: {why} ***\n");
        println!("test result: ok. 0 passed; 0 failed; 1 ignored");
        return;
    }
    let started = Instant::now();
    let mut passed = 0;
    runtime.block_on(async {
        relays_apart_publish_no_more_copies_than_in_step().await;
        passed += 1;
        for backend in [Backend::Postgres, Backend::MySql] {
            workers_judge_leases_and_due_times_by_the_database_clock(backend).await;
            passed += 1;
            a_janitor_ahead_keeps_the_window_and_the_lease(backend).await;
            passed += 1;
        }
    });
    println!(
        "test result: ok. {passed} passed; 0 failed; 0 ignored; finished in {:.1}s",
        started.elapsed().as_secs_f64()
    );
}

/// Events committed, copies on the stream, and what each relay published.
#[derive(Debug)]
struct RelayRun {
    events: i64,
    entries: i64,
    sent: [u64; 2],
}

impl RelayRun {
    fn copies(&self) -> i64 {
        self.entries - self.events
    }
}

async fn relay_run(name: &str, skew: &str, seconds: i64) -> Option<RelayRun> {
    let scenario = Scenario::new(Backend::Postgres, name).await?;
    let transport = common::connect_or_skip(
        "Redis",
        REDIS_URL,
        name,
        RedisTransport::builder(REDIS_URL)
            .namespace(scenario.namespace.clone())
            .connect(),
    )
    .await?;
    let a = scenario.start("relay-a", "", 0);
    let b = scenario.start("relay-b", skew, seconds);

    // 2,400 events over 200 aggregates at about 400 a second, so both relays claim all along.
    let outbox = Outbox::new("skew-relays");
    let started = Instant::now();
    let mut produced = 0i64;
    while produced < 2_400 {
        let due = Duration::from_secs_f64(produced as f64 / 400.0);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        let tx = outbox.begin(&scenario.db.db).await.unwrap();
        for _ in 0..fastrand::i64(1..=5) {
            produced += 1;
            tx.enqueue(&Ticked {
                clock: format!("c{}", fastrand::u32(0..200)),
                seq: produced,
            })
            .unwrap();
        }
        let _ = tx.commit().await.unwrap();
    }
    let unsent = "SELECT COUNT(*) FROM outbox_event WHERE status <> 'SENT'";
    let drained = common::eventually(Duration::from_secs(60), || async {
        common::scalar_i64(&scenario.db.db, unsent).await == 0
    })
    .await;
    assert!(
        drained,
        "{name}: the relays did not publish the backlog: {:?}",
        common::status_counts(&scenario.db.db).await
    );
    a.stop();
    b.stop();
    let mut conn = transport.connection();
    let entries: i64 = redis::cmd("XLEN")
        .arg(transport.stream_key())
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg(transport.stream_key())
        .query_async(&mut conn)
        .await
        .unwrap();
    let sent = ["relay-a", "relay-b"].map(|r| {
        scenario
            .read(&format!("{r}.sent"))
            .trim()
            .parse::<u64>()
            .unwrap()
    });
    Some(RelayRun {
        events: produced,
        entries,
        sent,
    })
}

async fn relays_apart_publish_no_more_copies_than_in_step() {
    let Some(in_step) = relay_run("clock_skew_relays_in_step", "", 0).await else {
        return;
    };
    let Some(apart) = relay_run("clock_skew_relays_60s_apart", "+60s", 60).await else {
        return;
    };
    eprintln!(
        "clock_skew relays: in step {} events, {} entries ({} copies), published {:?}; \
         60 s apart {} events, {} entries ({} copies), published {:?}",
        in_step.events,
        in_step.entries,
        in_step.copies(),
        in_step.sent,
        apart.events,
        apart.entries,
        apart.copies(),
        apart.sent
    );
    for run in [&in_step, &apart] {
        assert!(
            run.sent.iter().all(|&n| n > 0),
            "both relays published: {run:?}"
        );
        assert!(run.entries >= run.events, "an event is missing: {run:?}");
    }
    assert!(
        apart.copies() <= in_step.copies(),
        "a relay 60 s ahead republished what the other relay held: {} copies against {} in step",
        apart.copies(),
        in_step.copies()
    );
}

// ---------------------------------------------------------------------------------------------
// Inbox workers.

/// A message of the worker's consumer, as a producer would publish it.
fn tick(message_id: &str, clock: &str, seq: i64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "specversion": "1.0", "id": message_id, "source": "skew", "type": "skew.ticked",
        "subject": clock, "aggregatetype": "clock", "schemaversion": 1,
        "datacontenttype": "application/json", "data": {"clock": clock, "seq": seq},
    }))
    .unwrap()
}

async fn record(db: &DatabaseConnection, message_id: &str, clock: &str, state: InboxState) {
    let payload = tick(message_id, clock, 1);
    let row = NewInboxRow {
        consumer: WORKER,
        message_id,
        event_type: Some("skew.ticked"),
        source: Some("skew"),
        aggregate_type: Some("clock"),
        aggregate_id: Some(clock),
        aggregate_version: None,
        schema_version: Some(1),
        payload: &payload,
        ..NewInboxRow::default()
    };
    assert!(inbox_store::insert(db, &row, &state).await.unwrap());
}

/// Claim every claimable message of the worker's consumer as `owner`, for `lease`.
async fn claim_as(db: &DatabaseConnection, owner: &str, lease: Duration) -> usize {
    let params = ClaimParams {
        owner,
        batch_size: 10,
        lease,
        ordering: true,
        max_attempts: 10,
    };
    inbox_store::claim(db, WORKER, &params)
        .await
        .unwrap()
        .messages
        .len()
}

fn retry_in(delay: Duration) -> InboxState {
    InboxState::Failed(Failure::Retry {
        attempts: 1,
        delay,
        error: "failed once".into(),
    })
}

/// `(status, locked_by, attempts)` of a message.
async fn inbox_state(db: &DatabaseConnection, message_id: &str) -> (String, Option<String>, i64) {
    let row = common::inbox_rows(db, WORKER)
        .await
        .into_iter()
        .find(|r| r.message_id == message_id)
        .unwrap_or_else(|| panic!("no inbox row {message_id}"));
    (row.status, row.locked_by, row.attempts)
}

async fn wait_done(db: &DatabaseConnection, ids: &[&str], within: Duration) -> bool {
    common::eventually(within, || async {
        let mut done = true;
        for id in ids {
            done &= inbox_state(db, id).await.0 == "DONE";
        }
        done
    })
    .await
}

async fn workers_judge_leases_and_due_times_by_the_database_clock(backend: Backend) {
    let name = format!("clock_skew_workers_{backend:?}");
    let Some(scenario) = Scenario::new(backend, &name).await else {
        return;
    };
    let db = &scenario.db.db;

    // Another worker holds `held` under a live 30 s lease.
    record(db, "held", "c-held", InboxState::Pending).await;
    assert_eq!(
        claim_as(db, "other-worker", Duration::from_secs(30)).await,
        1
    );
    record(db, "fresh", "c-fresh", InboxState::Pending).await;
    record(db, "due", "c-due", retry_in(Duration::ZERO)).await;
    record(db, "later", "c-later", retry_in(Duration::from_secs(45))).await;

    // A worker 60 s ahead handles what is due, and nothing else.
    let ahead = scenario.start("worker", "+60s", 60);
    assert!(
        wait_done(db, &["fresh", "due"], Duration::from_secs(20)).await,
        "{name}: the worker 60 s ahead did not handle what was due"
    );
    // Many polls later, still nothing else.
    tokio::time::sleep(Duration::from_secs(2)).await;
    ahead.stop();
    assert_eq!(
        inbox_state(db, "held").await,
        ("PROCESSING".into(), Some("other-worker".into()), 0),
        "{name}: the worker 60 s ahead took a live lease"
    );
    assert_eq!(
        inbox_state(db, "later").await,
        ("RETRY".into(), None, 1),
        "{name}: the worker 60 s ahead ran a retry 45 s early"
    );

    // A worker that crashed holding `expired`, whose lease ran out; a retry due now.
    record(db, "expired", "c-expired", InboxState::Pending).await;
    assert_eq!(claim_as(db, "crashed-worker", Duration::ZERO).await, 1);
    record(db, "due-again", "c-due-again", retry_in(Duration::ZERO)).await;
    // A worker 60 s behind takes both at once, not a minute later.
    let behind = scenario.start("worker", "-60s", -60);
    let handled = wait_done(db, &["expired", "due-again"], Duration::from_secs(20)).await;
    behind.stop();
    assert!(
        handled,
        "{name}: the worker 60 s behind left an expired lease or a due retry waiting"
    );

    // Each handled message had its effect once; the others none.
    let mut handled: Vec<String> = effects(db).await.into_iter().map(|e| e.cart).collect();
    handled.sort();
    assert_eq!(handled, ["c-due", "c-due-again", "c-expired", "c-fresh"]);
}

// ---------------------------------------------------------------------------------------------
// Janitor.

async fn exec(db: &DatabaseConnection, sql: &str, values: Vec<Value>) {
    let backend = db.get_database_backend();
    let sql = if backend == DbBackend::Postgres {
        sql.replacen('?', "$1", 1).replacen('?', "$2", 1)
    } else {
        sql.to_owned()
    };
    db.execute_raw(Statement::from_sql_and_values(backend, sql, values))
        .await
        .unwrap();
}

async fn a_janitor_ahead_keeps_the_window_and_the_lease(backend: Backend) {
    let name = format!("clock_skew_janitor_{backend:?}");
    let Some(scenario) = Scenario::new(backend, &name).await else {
        return;
    };
    let db = &scenario.db.db;
    let dialect = scenario.db.dialect();
    // Instance A holds the janitor lease for 5 minutes (it purges nothing yet).
    let policy = janitor_policy();
    assert!(
        retention::purge_once_if_leader(db, &policy, "janitor-a")
            .await
            .unwrap()
            .is_some()
    );

    // Rows finished an hour ago (inside the 1-day window) and 3 days ago, by the database's clock.
    let now: DateTime<Utc> = database_now(db).await.unwrap();
    let young = now - chrono::Duration::hours(1);
    let old = now - chrono::Duration::days(3);
    for (id, at) in [("young", young), ("old", old)] {
        record(db, id, id, InboxState::Done).await;
        backdate_inbox(db, WORKER, Some(id), at).await;
    }
    let outbox = Outbox::new("skew-janitor");
    let tx = outbox.begin(db).await.unwrap();
    for seq in [1, 2] {
        tx.enqueue(&Ticked {
            clock: "janitor".into(),
            seq,
        })
        .unwrap();
    }
    let _ = tx.commit().await.unwrap();
    for (id, at) in [(1, young), (2, old)] {
        exec(
            db,
            "UPDATE outbox_event SET status = 'SENT', sent_at = ? WHERE id = ?",
            vec![dialect.timestamp(at), i64::from(id).into()],
        )
        .await;
    }

    // A janitor two days ahead.
    let mut janitor = scenario.start("janitor", "+2d", 2 * 86_400);
    janitor.wait();
    let report: JanitorReport = serde_json::from_str(&scenario.read("janitor.json")).unwrap();
    assert!(
        !report.leader,
        "{name}: the janitor 2 days ahead took the lease instance A holds"
    );
    // On PostgreSQL the old handled message leaves with its slot of `inbox_done`, not as a
    // row deleted one by one (the rows left are checked below).
    let inbox_rows_deleted = if backend == Backend::Postgres { 0 } else { 1 };
    assert_eq!(
        (report.outbox_deleted, report.inbox_deleted),
        (1, inbox_rows_deleted),
        "{name}: only the rows older than the window go"
    );
    let left: Vec<String> = common::inbox_rows(db, WORKER)
        .await
        .into_iter()
        .map(|r| r.message_id)
        .collect();
    assert_eq!(left, ["young"], "{name}: inbox rows left");
    assert_eq!(
        common::scalar_i64(db, "SELECT MIN(id) FROM outbox_event").await,
        1,
        "{name}: the young SENT event stays"
    );
    assert_eq!(common::count_events(db).await, 1);
}
