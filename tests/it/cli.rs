//! The `outbox` CLI binary against a SQLite file and a PostgreSQL database: status as JSON and as
//! a table, dead letters listed and shown, replay, ignore, resend and purge changing rows, the
//! audit log, doctor, and readable errors with a non-zero exit status.

use std::{process::Output, sync::Arc, time::Duration};

use crate::common::carts::*;
use crate::common::*;
use chrono::{DateTime, Utc};
use outbox::prelude::*;
use outbox::relay::{Relay, RelayConfig};
use outbox::store::Failure;
use outbox::store::inbox::{InboxState, NewInboxRow, insert};
use outbox::transport::OutgoingMessage;
use outbox::transport::memory::MemoryTransport;
use sea_orm::{ConnectionTrait, DbBackend, Statement, Value};
use serde_json::Value as Json;

/// Run the binary with `args` against `url`, without any `DATABASE_URL` from the environment.
pub(crate) async fn cli(url: Option<&str>, args: &[&str]) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_outbox"));
    command.env_remove("DATABASE_URL").env("USER", "tester");
    if let Some(url) = url {
        command.arg("--database-url").arg(url);
    }
    command.args(args);
    tokio::task::spawn_blocking(move || command.output().expect("run the outbox CLI"))
        .await
        .unwrap()
}

pub(crate) fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Run and expect exit status `code`; returns stdout.
pub(crate) async fn run(url: &str, args: &[&str], code: i32) -> String {
    let out = cli(Some(url), args).await;
    assert_eq!(
        out.status.code(),
        Some(code),
        "outbox {args:?}\nstdout:\n{}\nstderr:\n{}",
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

pub(crate) async fn run_json(url: &str, args: &[&str]) -> Json {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let text = run(url, &all, 0).await;
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("outbox {args:?}: not JSON ({e}):\n{text}"))
}

async fn exec(t: &TestDb, sql: &str, values: Vec<Value>) {
    let backend = t.db.get_database_backend();
    let mut text = String::new();
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' && backend == DbBackend::Postgres {
            n += 1;
            text.push_str(&format!("${n}"));
        } else {
            text.push(c);
        }
    }
    t.db.execute_raw(Statement::from_sql_and_values(backend, text, values))
        .await
        .unwrap();
}

fn ago(hours: i64) -> DateTime<Utc> {
    Utc::now() - chrono::Duration::hours(hours)
}

async fn status_of(t: &TestDb, table: &str, id: i64) -> String {
    let row =
        t.db.query_one_raw(Statement::from_string(
            t.db.get_database_backend(),
            format!("SELECT status FROM {table} WHERE id = {id}"),
        ))
        .await
        .unwrap();
    match row {
        Some(row) => row.try_get("", "status").unwrap(),
        // A sent event moved to `outbox_sent`.
        None if table == "outbox_event" => {
            assert_eq!(
                scalar_i64(
                    &t.db,
                    &format!("SELECT COUNT(*) AS n FROM outbox_sent WHERE id = {id}")
                )
                .await,
                1,
                "outbox:{id} is nowhere"
            );
            "SENT".to_owned()
        }
        None => panic!("{table}:{id} is gone"),
    }
}

/// Three cart events (cart-1's DEAD, the others SENT), a dead and an old DONE inbox message.
async fn fixture(t: &TestDb) -> (OutboxRow, Vec<OutboxRow>, i64, i64) {
    let outbox = Outbox::new("cli-tests");
    produce(t, &outbox, 3, 1, 10).await;
    let transport = MemoryTransport::new();
    transport.reject_permanently(Some(|m: &OutgoingMessage| m.aggregate_id == "cart-1"));
    let report = Relay::new(t.db.clone(), Arc::new(transport))
        .drain(10)
        .await
        .unwrap();
    assert_eq!((report.sent, report.dead), (2, 1));
    let rows = outbox_rows(&t.db).await;
    let dead = rows.iter().find(|r| r.status == "DEAD").unwrap().clone();
    let sent: Vec<_> = rows.into_iter().filter(|r| r.status == "SENT").collect();
    let mut ids = Vec::new();
    for (message_id, state, at) in [
        (
            "m-dead",
            InboxState::Failed(Failure::Dead {
                attempts: 5,
                error: "stock service timeout".into(),
            }),
            ago(1),
        ),
        ("m-done", InboxState::Done, ago(72)),
    ] {
        let row = NewInboxRow {
            consumer: "inventory",
            message_id,
            event_type: Some("line.added"),
            aggregate_type: Some("cart"),
            aggregate_id: Some("cart-9"),
            payload: b"{\"specversion\":\"1.0\"}",
            ..NewInboxRow::default()
        };
        assert!(insert(&t.db, &row, &state).await.unwrap());
        backdate_inbox(&t.db, "inventory", Some(message_id), at).await;
        let found = inbox_rows(&t.db, "inventory").await;
        assert!(found.iter().any(|r| r.message_id == message_id));
    }
    let rows =
        t.db.query_all_raw(Statement::from_string(
            t.db.get_database_backend(),
            format!(
                "SELECT id FROM {} ORDER BY id",
                inbox_source(t.db.get_database_backend())
            ),
        ))
        .await
        .unwrap();
    for row in rows {
        ids.push(row.try_get::<i64>("", "id").unwrap());
    }
    (dead, sent, ids[0], ids[1])
}

async fn cli_operates_the_outbox(backend: Backend, test: &str) {
    let Some(t) = test_db(backend, test).await else {
        return;
    };
    let url = t.url.as_str();
    let (dead, sent, inbox_dead, inbox_done) = fixture(&t).await;

    // status, as JSON and as a table.
    let status = run_json(url, &["status"]).await;
    assert_eq!(status["outbox"]["counts"]["SENT"], 2);
    assert_eq!(status["outbox"]["counts"]["DEAD"], 1);
    assert_eq!(status["outbox"]["counts"]["PENDING"], 0);
    assert_eq!(status["outbox"]["total"], 3);
    assert_eq!(status["outbox"]["dead"], 1);
    assert_eq!(status["outbox"]["backlog"], 0);
    assert!(status["outbox"]["oldest_unsent_age_secs"].is_null());
    let consumer = &status["consumers"][0];
    assert_eq!(consumer["consumer"], "inventory");
    assert_eq!(consumer["counts"]["DEAD"], 1);
    assert_eq!(consumer["counts"]["DONE"], 1);
    assert_eq!(consumer["dead"], 1);
    let table = run(url, &["status"], 0).await;
    assert!(table.contains("OUTBOX  total 3  backlog 0"), "{table}");
    assert!(table.contains("inventory"), "{table}");
    // The queue tables' health, where the server keeps statistics (not SQLite).
    let storage = status["storage"]["tables"].as_array().unwrap();
    match backend {
        Backend::SqliteFile | Backend::SqliteMemory => {
            assert!(storage.is_empty());
            assert!(!table.contains("STORAGE"), "{table}");
        }
        _ => {
            assert_eq!(storage[0]["table"], "outbox_event");
            assert!(storage[0]["bytes"].as_i64().unwrap() > 0);
            assert!(table.contains("STORAGE\n"), "{table}");
            assert!(
                table.lines().any(|l| l.starts_with("outbox_event ")),
                "{table}"
            );
        }
    }

    // dead list and show.
    let list = run_json(url, &["dead", "list"]).await;
    let ids: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    let outbox_id = format!("outbox:{}", dead.id);
    let inbox_id = format!("inbox:{inbox_dead}");
    // Newest first: the outbox event was enqueued just now, the inbox message an hour ago.
    assert_eq!(ids, [outbox_id.as_str(), inbox_id.as_str()]);
    let list = run_json(url, &["dead", "list", "--consumer", "inventory"]).await;
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["last_error"], "stock service timeout");
    let list = run_json(url, &["dead", "list", "--limit", "1", "--page", "2"]).await;
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["id"], inbox_id.as_str());
    let table = run(url, &["dead", "list", "--error", "TIMEOUT"], 0).await;
    assert!(table.starts_with("ID"), "{table}");
    assert!(
        table.contains(&inbox_id) && !table.contains(&outbox_id),
        "{table}"
    );
    let shown = run_json(url, &["dead", "show", &outbox_id]).await;
    assert_eq!(shown["status"], "DEAD");
    assert_eq!(shown["envelope"]["type"], "line.added");
    assert_eq!(shown["envelope"]["subject"], "cart-1");
    let text = run(url, &["dead", "show", &outbox_id], 0).await;
    assert!(text.contains("permanently"), "{text}");
    assert!(text.contains("envelope:"), "{text}");
    // Its error history: the one refusal.
    assert_eq!(shown["failures"].as_array().unwrap().len(), 1, "{shown}");
    assert_eq!(shown["failures"][0]["status"], "DEAD");
    assert!(text.contains("failures (oldest first):"), "{text}");
    assert!(text.contains("attempt 1   DEAD"), "{text}");

    // replay --id: the row changes, the audit log says who and why.
    let report = run_json(
        url,
        &[
            "replay",
            "--id",
            &outbox_id,
            "--actor",
            "ops",
            "--reason",
            "size limit raised",
        ],
    )
    .await;
    assert_eq!(report["outbox"], 1);
    assert_eq!(status_of(&t, "outbox_event", dead.id).await, "PENDING");
    // Again: the row is no longer DEAD, so nothing changes and the exit status says so.
    let again = run(url, &["replay", "--id", &outbox_id], 3).await;
    assert!(again.contains("is PENDING, not DEAD"), "{again}");

    // ignore: by id, or by a filter that the inbox has; nothing selected is refused.
    for (args, needle) in [
        (&["ignore"][..], "say what to ignore"),
        (
            &["ignore", "--source", "outbox", "--type", "x"][..],
            "inbox messages only",
        ),
        (&["ignore", "7", "--all"][..], "choose one way"),
    ] {
        let refused = cli(Some(url), args).await;
        assert_eq!(refused.status.code(), Some(1), "{args:?}");
        assert!(stderr(&refused).contains(needle), "{}", stderr(&refused));
    }
    let text = run(
        url,
        &[
            "ignore",
            "--consumer",
            "inventory",
            "--error",
            "TIMEOUT",
            "--reason",
            "cancelled",
        ],
        0,
    )
    .await;
    assert!(text.contains("ignored 1 row(s)"), "{text}");
    assert_eq!(status_of(&t, "inbox_event", inbox_dead).await, "IGNORED");

    // resend by filter: SENT → PENDING, sent_at cleared; only what matches.
    let event = &sent[0];
    let report = run_json(
        url,
        &[
            "resend",
            "--type",
            "line.added",
            "--aggregate",
            &event.aggregate_id,
            "--sent-after",
            "2000-01-01T00:00:00Z",
        ],
    )
    .await;
    assert_eq!(report["outbox"], 1);
    let row = outbox_rows(&t.db)
        .await
        .into_iter()
        .find(|r| r.id == event.id)
        .unwrap();
    assert_eq!((row.status.as_str(), row.sent_at), ("PENDING", None));
    assert_eq!(status_of(&t, "outbox_event", sent[1].id).await, "SENT");
    // By event id: the replayed event is not SENT, so it is reported and the exit status says so.
    let text = run(url, &["resend", &dead.event_id.to_string()], 3).await;
    assert!(text.contains("is PENDING, not SENT"), "{text}");
    let refused = cli(Some(url), &["resend", "--sent-after", "yesterday"]).await;
    assert_eq!(refused.status.code(), Some(2));

    // purge: the other SENT event was sent 3 hours ago, the DONE message processed 3 days ago.
    age_sent(
        &t.db,
        &format!("id = {}", sent[1].id),
        Duration::from_secs(2 * 3600),
    )
    .await;
    // A policy refused before any SQL runs is a bad command line.
    let refused = cli(Some(url), &["purge", "--done-after", "1h"]).await;
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        stderr(&refused)
            .contains("dedup window (done_after = 1h) is shorter than the redelivery horizon (1d)"),
        "{}",
        stderr(&refused)
    );
    let report = run_json(
        url,
        &[
            "purge",
            "--sent-after",
            "2h",
            "--done-after",
            "2d",
            "--batch-size",
            "1",
        ],
    )
    .await;
    // The sent event's slot is emptied whole, and on PostgreSQL the handled message's too.
    let rotating_inbox = t.db.get_database_backend() == sea_orm::DbBackend::Postgres;
    assert_eq!(report["outbox_deleted"], 0);
    assert_eq!(report["slots_emptied"], if rotating_inbox { 2 } else { 1 });
    assert_eq!(report["inbox_deleted"], if rotating_inbox { 0 } else { 1 });
    assert!(report["batches"].as_u64().unwrap() >= 4);
    assert_eq!(count_events(&t.db).await, 2);
    assert_eq!(inbox_rows(&t.db, "inventory").await.len(), 1);
    let _ = inbox_done;

    // The audit log holds every action, newest first.
    let audit = run_json(url, &["audit"]).await;
    let actions: Vec<(&str, &str, i64)> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["action"].as_str().unwrap(),
                a["actor"].as_str().unwrap(),
                a["rows_affected"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        [
            // Rows of emptied slots are not counted one by one.
            ("purge", "tester", if rotating_inbox { 0 } else { 1 }),
            ("resend", "tester", 0),
            ("resend", "tester", 1),
            ("ignore", "tester", 1),
            ("replay", "tester", 0),
            ("replay", "ops", 1),
        ]
    );
    assert_eq!(audit[5]["reason"], "size limit raised");

    // doctor: healthy; migrate is idempotent.
    let text = run(url, &["doctor"], 0).await;
    assert!(text.contains("healthy: 0 error(s)"), "{text}");
    let text = run(url, &["migrate"], 0).await;
    assert!(text.contains("database up to date"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_on_sqlite_file() {
    cli_operates_the_outbox(Backend::SqliteFile, "cli_ops_lf").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_on_postgres() {
    cli_operates_the_outbox(Backend::Postgres, "cli_ops_pg").await;
}

/// `outbox status` while a relay's broker is unavailable and after it is back: the relay's row,
/// the events it held back, and the backlog waiting for the broker.
async fn cli_status_shows_a_broker_outage(backend: Backend, test: &str) {
    let Some(t) = test_db(backend, test).await else {
        return;
    };
    let url = t.url.as_str();
    let outbox = Outbox::new("cli-tests");
    // The in-memory transport with an injected outage stands for the broker.
    let transport = MemoryTransport::new();
    let handle = Relay::new(t.db.clone(), Arc::new(transport.clone()))
        .with_config(
            RelayConfig::default()
                .relay_id("relay-a")
                .poll_interval(Duration::from_millis(50))
                .heartbeat(Duration::from_millis(200)),
        )
        .spawn();
    let started = eventually(Duration::from_secs(10), || async {
        run_json(url, &["status"]).await["relays"][0]["broker_available"] == true
    })
    .await;
    assert!(started, "{}", run(url, &["status"], 0).await);
    // The broker goes away; then orders are committed.
    transport.set_unavailable(true);
    let total = produce(&t, &outbox, 3, 2, 10).await;
    let unavailable = eventually(Duration::from_secs(10), || async {
        let status = run_json(url, &["status"]).await;
        status["relays"][0]["broker_available"] == false
            && status["relays"][0]["held_back"].as_u64() > Some(0)
    })
    .await;
    assert!(unavailable, "{}", run(url, &["status"], 0).await);
    let status = run_json(url, &["status"]).await;
    let relay = &status["relays"][0];
    assert_eq!(relay["relay_id"], "relay-a");
    assert_eq!(relay["transport"], "memory");
    assert_eq!(relay["current"], true);
    assert_eq!(relay["outages"], 1);
    assert!(
        (1..=total as u64).contains(&relay["held_back"].as_u64().unwrap_or(0)),
        "each event held back is counted once: {relay}"
    );
    assert!(relay["unavailable_secs"].as_f64().is_some(), "{relay}");
    assert!(relay["broker_seen_secs_ago"].as_f64().is_some(), "{relay}");
    assert_eq!(status["outbox"]["delayed_by_outage"], total);
    let table = run(url, &["status"], 0).await;
    assert!(
        table.contains(&format!("{total} backlog events wait for the broker")),
        "{table}"
    );
    let line = table
        .lines()
        .find(|l| l.starts_with("relay-a"))
        .unwrap_or_else(|| panic!("no relay line:\n{table}"));
    assert!(
        line.contains("memory") && line.contains("UNAVAILABLE"),
        "{table}"
    );

    transport.set_unavailable(false);
    let back = eventually(Duration::from_secs(10), || async {
        let status = run_json(url, &["status"]).await;
        status["relays"][0]["broker_available"] == true
            && status["outbox"]["counts"]["SENT"] == total
    })
    .await;
    assert!(back, "{}", run(url, &["status"], 0).await);
    let status = run_json(url, &["status"]).await;
    assert_eq!(status["relays"][0]["held_back"], 0);
    assert!(status["relays"][0]["unavailable_secs"].is_null());
    assert_eq!(status["outbox"]["delayed_by_outage"], 0);
    let table = run(url, &["status"], 0).await;
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("relay-a") && l.contains("available")),
        "{table}"
    );
    assert!(!table.contains("wait for the broker"), "{table}");
    handle.shutdown().await.unwrap();
    let table = run(url, &["status"], 0).await;
    assert!(table.contains("RELAYS  none running"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_a_broker_outage_on_sqlite_file() {
    cli_status_shows_a_broker_outage(Backend::SqliteFile, "cli_outage_lf").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_a_broker_outage_on_postgres() {
    cli_status_shows_a_broker_outage(Backend::Postgres, "cli_outage_pg").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_exits_non_zero_on_a_broken_schema() {
    let Some(t) = test_db(Backend::SqliteFile, "cli_doctor_lf").await else {
        return;
    };
    t.db.execute_unprepared("DROP INDEX outbox_event_open_idx")
        .await
        .unwrap();
    let out = cli(Some(&t.url), &["doctor"]).await;
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("error    indexes     index `outbox_event_open_idx`"),
        "{text}"
    );
    assert!(text.contains("unhealthy: 1 error(s)"), "{text}");
}

#[tokio::test]
async fn bad_urls_exit_non_zero_with_a_readable_message() {
    let out = cli(
        Some("postgres://nobody:secret@127.0.0.1:1/none"),
        &["status"],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.starts_with("error: cannot connect to postgres://nobody:***@127.0.0.1:1/none"),
        "{err}"
    );
    assert!(
        !err.contains("secret"),
        "the password is not printed: {err}"
    );

    let out = cli(Some("oracle://db/x"), &["status"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("unsupported database URL `oracle://db/x`"),
        "{}",
        stderr(&out)
    );

    let out = cli(None, &["status"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("pass --database-url URL or set DATABASE_URL"));

    // A database without the SDK's tables says how to create them.
    let dir = std::env::temp_dir().join("outbox-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cli_empty.db");
    let _ = std::fs::remove_file(&path);
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let out = cli(Some(&url), &["status"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("apply the SDK migrations"),
        "{}",
        stderr(&out)
    );

    // Bad input gets a message saying what to write instead.
    let out = cli(Some(&url), &["dead", "show", "12"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("write `outbox:ID` or `inbox:ID`"),
        "{}",
        stderr(&out)
    );
    let out = cli(Some(&url), &["replay"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("say what to replay"),
        "{}",
        stderr(&out)
    );
}

/// Every row's status and the audit trail's length: what a refused command must leave alone.
async fn snapshot(t: &TestDb) -> (Vec<(i64, String)>, Vec<(String, String)>, i64) {
    let outbox = outbox_rows(&t.db)
        .await
        .into_iter()
        .map(|r| (r.id, r.status))
        .collect();
    let inbox = inbox_rows(&t.db, "inventory")
        .await
        .into_iter()
        .map(|r| (r.message_id, r.status))
        .collect();
    let audit = scalar_i64(&t.db, "SELECT COUNT(*) AS n FROM outbox_admin_action").await;
    (outbox, inbox, audit)
}

/// Dates and durations beyond what every backend stores are refused before any SQL runs: exit
/// status 2, the flag and the accepted range named, nothing changed.
async fn out_of_range_input_is_refused(backend: Backend, test: &str) {
    let Some(t) = test_db(backend, test).await else {
        return;
    };
    let url = t.url.as_str();
    fixture(&t).await;
    let before = snapshot(&t).await;
    let instants = "1000-01-01T00:00:00Z to 9999-12-31T23:59:59Z";
    let ages = "0s to 36500d (100 years)";
    for (args, flag, range) in [
        (
            &[
                "resend",
                "--type",
                "line.added",
                "--sent-after=-5000-01-01T00:00:00Z",
            ][..],
            "--sent-after",
            instants,
        ),
        (
            &["resend", "--sent-before", "0999-12-31T23:59:59Z"][..],
            "--sent-before",
            instants,
        ),
        (
            &["purge", "--sent-after", "3000000d"][..],
            "--sent-after",
            ages,
        ),
        (
            &["purge", "--done-after", "2400000d", "--sent-after", "1d"][..],
            "--done-after",
            ages,
        ),
        (
            &["purge", "--redelivery-horizon", "99999999999w"][..],
            "--redelivery-horizon",
            ages,
        ),
        (
            &["purge", "--batch-size", "0"][..],
            "--batch-size",
            "1..=100000",
        ),
    ] {
        let out = cli(Some(url), args).await;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag) && err.contains(range), "{args:?}: {err}");
        assert!(
            !err.contains("out of range for type"),
            "no database text: {err}"
        );
    }
    assert_eq!(
        snapshot(&t).await,
        before,
        "nothing changed, nothing audited"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_input_on_postgres() {
    out_of_range_input_is_refused(Backend::Postgres, "cli_range_pg").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_input_on_sqlite_file() {
    out_of_range_input_is_refused(Backend::SqliteFile, "cli_range_lf").await;
}

/// A dead letter whose error, aggregate id and payload hold terminal escape sequences (clear the
/// screen, set the window title, a bidirectional override) prints them escaped in `dead list` and
/// `dead show`, and exactly in `--json`; a 100 KB error (60 KB on MySQL) takes one short line in
/// the list and prints whole in `dead show`.
async fn hostile_text_prints_escaped(backend: Backend, test: &str) {
    let Some(t) = test_db(backend, test).await else {
        return;
    };
    let url = t.url.as_str();
    let error =
        "\u{1b}[2Jscreen cleared \u{1b}]0;owned\u{7} \u{9b}31m \u{202e}desrever\nsecond line";
    // 100 KB; MySQL's TEXT column holds 64 KB.
    let size = if backend == Backend::MySql { 60 } else { 100 } * 1024;
    let huge = format!("first of many lines\n{}", "x".repeat(size));
    let mut ids = Vec::new();
    for (message_id, aggregate_id, error) in [
        ("m-escape", "cart-\u{1b}[31mred", error),
        ("m-huge", "cart-huge", huge.as_str()),
    ] {
        let row = NewInboxRow {
            consumer: "inventory",
            message_id,
            event_type: Some("line.added"),
            aggregate_type: Some("cart"),
            aggregate_id: Some(aggregate_id),
            payload: "{\"note\":\"\u{1b}[2J\u{9b}\"}".as_bytes(),
            ..NewInboxRow::default()
        };
        let state = InboxState::Failed(Failure::Dead {
            attempts: 5,
            error: error.to_owned(),
        });
        assert!(insert(&t.db, &row, &state).await.unwrap());
        let id = scalar_i64(
            &t.db,
            &format!("SELECT id AS n FROM inbox_event WHERE message_id = '{message_id}'"),
        )
        .await;
        ids.push(id);
    }
    // The store keeps 4,000 characters of an error; a row written otherwise (by hand, by an
    // older version) may hold more.
    exec(
        &t,
        "UPDATE inbox_event SET last_error = ? WHERE id = ?",
        vec![huge.as_str().into(), ids[1].into()],
    )
    .await;
    let raw = ['\u{1b}', '\u{7}', '\u{9b}', '\u{202e}'];

    let list = run(url, &["dead", "list"], 0).await;
    assert!(!list.contains(raw), "raw control characters in:\n{list}");
    assert!(
        list.contains("\\x1b[2Jscreen cleared \\x1b]0;owned\\x07 \\x9b31m \\u{202e}desrever…"),
        "{list}"
    );
    assert!(list.contains("cart-\\x1b[31mred"), "{list}");
    assert!(
        !list.contains("second line"),
        "lists show the first line: {list}"
    );
    assert!(list.contains("first of many lines…"), "{list}");
    assert!(
        list.lines().all(|line| line.chars().count() < 300),
        "every line short:\n{list}"
    );

    let show = run(url, &["dead", "show", &format!("inbox:{}", ids[0])], 0).await;
    assert!(!show.contains(raw), "raw control characters in:\n{show}");
    assert!(show.contains("\\x1b]0;owned\\x07"), "{show}");
    assert!(
        show.contains("second line"),
        "the detail shows the whole error: {show}"
    );
    assert!(
        show.contains("{\"note\":\"\\x1b[2J\\x9b\"}"),
        "the payload escaped too: {show}"
    );
    let show_huge = run(url, &["dead", "show", &format!("inbox:{}", ids[1])], 0).await;
    assert!(show_huge.contains(&"x".repeat(size)), "the whole error");

    let json = run_json(url, &["dead", "show", &format!("inbox:{}", ids[0])]).await;
    assert_eq!(json["last_error"], error, "--json is exact");
    assert_eq!(json["aggregate_id"], "cart-\u{1b}[31mred");
    let listed = run_json(url, &["dead", "list"]).await;
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["last_error"] == huge),
        "--json lists the whole error"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_text_on_postgres() {
    hostile_text_prints_escaped(Backend::Postgres, "cli_escape_pg").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_text_on_mysql() {
    hostile_text_prints_escaped(Backend::MySql, "cli_escape_my").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_text_on_sqlite_file() {
    hostile_text_prints_escaped(Backend::SqliteFile, "cli_escape_lf").await;
}

/// `outbox serve`'s log on standard error, as text and as JSON lines: the start-up line (address,
/// database with its password masked, authentication), a line per request (method, path,
/// status, time, operator), and a 5xx at ERROR with its cause.
#[cfg(feature = "console")]
mod serve_log {
    use std::io::BufRead;
    use std::process::{Child, Command, Stdio};
    use std::sync::mpsc;

    use hyper::{HeaderMap, Method, header::HeaderValue};

    use super::*;
    use crate::common::http::{client, send};

    const TOKEN: &str = "serve-log-test-token-0123456789";
    const PASSWORD: &str = "s3cret-pw";

    /// The CLI serving the console, and its log's lines as they come.
    struct Serving {
        child: Child,
        lines: mpsc::Receiver<String>,
        seen: Vec<String>,
    }

    impl Serving {
        fn start(url: &str, format: &str) -> Self {
            let mut child = Command::new(env!("CARGO_BIN_EXE_outbox"))
                .env_remove("DATABASE_URL")
                .env_remove("RUST_LOG")
                .env("USER", "tester")
                .env("OUTBOX_CONSOLE_TOKEN", TOKEN)
                .args(["--database-url", url, "--log-format", format])
                .args(["serve", "--listen", "127.0.0.1:0"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start outbox serve");
            let stderr = child.stderr.take().unwrap();
            let (send, lines) = mpsc::channel();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if send.send(line).is_err() {
                        break;
                    }
                }
            });
            Serving {
                child,
                lines,
                seen: Vec::new(),
            }
        }

        /// The first line (from now on, or already seen) holding every one of `parts`.
        fn wait_for(&mut self, parts: &[&str]) -> String {
            let holds = |line: &String| parts.iter().all(|p| line.contains(p));
            if let Some(line) = self.seen.iter().find(|l| holds(l)) {
                return line.clone();
            }
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
                match self.lines.recv_timeout(left) {
                    Ok(line) => {
                        self.seen.push(line.clone());
                        if holds(&line) {
                            return line;
                        }
                    }
                    Err(_) => break,
                }
            }
            panic!("no log line with {parts:?} in:\n{}", self.seen.join("\n"));
        }
    }

    impl Drop for Serving {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    async fn call(base: &str, method: Method, path: &str, token: bool, body: &str) -> u16 {
        let mut headers = HeaderMap::new();
        if token {
            headers.insert(
                "authorization",
                HeaderValue::from_str(&format!("Bearer {TOKEN}")).unwrap(),
            );
        }
        let answer = send(
            &client(),
            method,
            &format!("{base}{path}"),
            &headers,
            body.as_bytes().to_vec(),
        )
        .await
        .unwrap();
        answer.status.as_u16()
    }

    /// The requests whose lines the test looks for: a read, a refused read, a write, and a read
    /// that fails on the server (the audit table renamed away).
    async fn requests(t: &TestDb, base: &str) {
        assert_eq!(call(base, Method::GET, "/api/status", true, "").await, 200);
        assert_eq!(call(base, Method::GET, "/api/doctor", false, "").await, 401);
        let replay = r#"{"all": true, "reason": "log test"}"#;
        assert_eq!(
            call(base, Method::POST, "/api/replay", true, replay).await,
            200
        );
        exec(
            t,
            "ALTER TABLE outbox_admin_action RENAME TO admin_action_away",
            vec![],
        )
        .await;
        let failed = call(base, Method::GET, "/api/audit", true, "").await;
        exec(
            t,
            "ALTER TABLE admin_action_away RENAME TO outbox_admin_action",
            vec![],
        )
        .await;
        assert_eq!(failed, 503);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serve_logs_its_start_and_every_request() {
        let Some(t) = test_db(Backend::Postgres, "cli_serve_log_pg").await else {
            return;
        };
        let url = t
            .url
            .replacen("://postgres@", &format!("://postgres:{PASSWORD}@"), 1);
        assert!(url.contains(PASSWORD), "a URL with a password: {url}");

        // Text.
        let mut serving = Serving::start(&url, "text");
        let start = serving.wait_for(&["outbox console serving"]);
        assert!(start.contains(" INFO "), "{start}");
        assert!(
            start.contains("postgres://postgres:***@127.0.0.1"),
            "{start}"
        );
        assert!(!start.contains(PASSWORD), "the password is masked: {start}");
        assert!(start.contains(r#"auth="bearer token""#), "{start}");
        assert!(start.contains(r#"operator=tester"#), "{start}");
        let base = start
            .split("url=")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no url in {start}"))
            .trim_end_matches('/')
            .to_owned();
        requests(&t, &base).await;
        let ok = serving.wait_for(&["console request", "method=GET", r#"path="/api/status""#]);
        assert!(
            ok.contains("status=200") && ok.contains("elapsed_ms="),
            "{ok}"
        );
        assert!(ok.contains(r#"operator="tester""#), "{ok}");
        let refused = serving.wait_for(&["console request", r#"path="/api/doctor""#]);
        assert!(
            refused.contains("status=401") && !refused.contains("operator"),
            "{refused}"
        );
        let write = serving.wait_for(&["console request", "method=POST", r#"path="/api/replay""#]);
        assert!(
            write.contains("status=200") && write.contains(r#"operator="tester""#),
            "{write}"
        );
        let failed = serving.wait_for(&["console request failed", r#"path="/api/audit""#]);
        assert!(
            failed.contains(" ERROR ") && failed.contains("status=503"),
            "{failed}"
        );
        assert!(
            failed.contains("outbox tables are missing"),
            "the cause: {failed}"
        );
        assert!(
            serving
                .seen
                .iter()
                .all(|l| !l.contains(TOKEN) && !l.contains(PASSWORD)),
            "no secret in the log:\n{}",
            serving.seen.join("\n")
        );
        drop(serving);

        // JSON lines.
        let mut serving = Serving::start(&url, "json");
        let start: Json =
            serde_json::from_str(&serving.wait_for(&["outbox console serving"])).unwrap();
        assert_eq!(start["level"], "INFO", "{start}");
        assert!(!start.to_string().contains(PASSWORD), "{start}");
        assert!(
            start["database"]
                .as_str()
                .unwrap()
                .starts_with("postgres://postgres:***@"),
            "{start}"
        );
        let base = start["url"]
            .as_str()
            .unwrap()
            .trim_end_matches('/')
            .to_owned();
        requests(&t, &base).await;
        let write: Json =
            serde_json::from_str(&serving.wait_for(&["console request", r#""method":"POST""#]))
                .unwrap();
        assert_eq!(write["path"], "/api/replay", "{write}");
        assert_eq!(write["status"], 200, "{write}");
        assert_eq!(write["operator"], "tester", "{write}");
        assert!(write["elapsed_ms"].as_f64().is_some(), "{write}");
        let failed: Json =
            serde_json::from_str(&serving.wait_for(&["console request failed"])).unwrap();
        assert_eq!(failed["level"], "ERROR", "{failed}");
        assert_eq!(failed["status"], 503, "{failed}");
        assert!(
            failed["cause"]
                .as_str()
                .unwrap()
                .contains("outbox tables are missing"),
            "{failed}"
        );
        for line in &serving.seen {
            serde_json::from_str::<Json>(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        }
    }
}
