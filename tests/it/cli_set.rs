//! The `outbox` CLI over a set of databases (`--databases FILE`, PostgreSQL and MariaDB mixed):
//! `migrate --all` migrates each and reports the one whose server refuses, `status --all` shows
//! each database's owner from the fleet's control database (`UNOWNED` and exit status 5 for one
//! nobody owns) and its pending events, `--database NAME` points any command at one of them, and
//! a bad file is refused by line number. No password of the file is ever printed.

use std::{path::PathBuf, process::Output};

use crate::cli::{stderr, stdout};
use crate::common::carts::produce;
use crate::common::*;
use outbox::prelude::*;
use outbox::relay::Relay;
use outbox::transport::OutgoingMessage;
use outbox::transport::memory::MemoryTransport;
use sea_orm::ConnectionTrait;
use serde_json::Value as Json;

/// A database of the set whose server refuses connections, with a password in its URL.
const REFUSED: &str = "postgres://ops:s3cret-pw@127.0.0.1:1/nowhere";
const SECRET: &str = "s3cret-pw";

/// Run the binary with `args` and these environment variables, none of the CLI's own from the
/// environment of the test.
async fn outbox(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_outbox"));
    for name in [
        "DATABASE_URL",
        "OUTBOX_DATABASES",
        "OUTBOX_CONTROL_URL",
        "OUTBOX_FLEET_GROUP",
    ] {
        command.env_remove(name);
    }
    command.env("USER", "tester").envs(env.iter().copied());
    command.args(args);
    tokio::task::spawn_blocking(move || command.output().expect("run the outbox CLI"))
        .await
        .unwrap()
}

/// Expect exit status `code` and no password anywhere; returns stdout.
fn expect(out: &Output, code: i32, args: &[&str]) -> String {
    let (text, errors) = (stdout(out), stderr(out));
    assert_eq!(
        out.status.code(),
        Some(code),
        "outbox {args:?}\nstdout:\n{text}\nstderr:\n{errors}"
    );
    assert!(
        !text.contains(SECRET) && !errors.contains(SECRET),
        "a password printed by outbox {args:?}\nstdout:\n{text}\nstderr:\n{errors}"
    );
    text
}

async fn run_set(args: &[&str], code: i32) -> String {
    expect(&outbox(args, &[]).await, code, args)
}

fn json(text: &str) -> Json {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

/// The set's file, `name = url` a line, with a comment and a blank line.
fn write_set(test: &str, lines: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join("outbox-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{test}.conf"));
    let mut text = String::from("# the tenants\n\n");
    for (name, url) in lines {
        text.push_str(&format!("{name} = {url}\n"));
    }
    std::fs::write(&path, text).unwrap();
    path
}

/// A fresh database of `test` with none of the SDK's tables: its URL, or `None` (skipped).
async fn empty_db(backend: Backend, test: &str) -> Option<String> {
    let TestDb { name, url, db, .. } = test_db(backend, test).await?;
    db.close().await.ok();
    let (admin, drop) = match backend {
        Backend::Postgres => (
            postgres_admin_url(),
            format!("DROP DATABASE {name} WITH (FORCE)"),
        ),
        _ => (mysql_admin_url(), format!("DROP DATABASE {name}")),
    };
    let admin = connect(&admin, 1).await.unwrap();
    admin.execute_unprepared(&drop).await.unwrap();
    admin
        .execute_unprepared(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    admin.close().await.ok();
    Some(url)
}

async fn applied_migrations(url: &str) -> i64 {
    let db = connect(url, 1).await.unwrap();
    let n = scalar_i64(&db, "SELECT COUNT(*) AS n FROM outbox_migrations").await;
    db.close().await.ok();
    n
}

#[tokio::test]
async fn migrate_all_migrates_each_database_and_reports_the_one_that_fails() {
    let Some(acme) = empty_db(Backend::Postgres, "cli_set_migrate_pg").await else {
        return;
    };
    let Some(globex) = empty_db(Backend::MySql, "cli_set_migrate_my").await else {
        return;
    };
    let file = write_set(
        "cli_set_migrate",
        &[("acme", &acme), ("globex", &globex), ("initech", REFUSED)],
    );
    let file = file.to_str().unwrap();
    let sdk = outbox::migrations().len();

    let text = run_set(&["--databases", file, "migrate", "--all"], 1).await;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(
        lines[0],
        format!("acme     ok: {sdk} SDK migrations applied")
    );
    assert_eq!(
        lines[1],
        format!("globex   ok: {sdk} SDK migrations applied")
    );
    assert!(
        lines[2].starts_with(
            "initech  error: cannot connect to postgres://ops:***@127.0.0.1:1/nowhere"
        ),
        "{text}"
    );
    let out = outbox(&["--databases", file, "migrate", "--all"], &[]).await;
    assert!(
        stderr(&out).contains("error: 1 of 3 databases not migrated"),
        "{}",
        stderr(&out)
    );
    for url in [&acme, &globex] {
        assert_eq!(applied_migrations(url).await, sdk as i64);
    }

    // Again, as JSON: nothing left to apply, the same report.
    let report = json(&run_set(&["--json", "--databases", file, "migrate", "--all"], 1).await);
    let rows = report.as_array().unwrap();
    assert_eq!(rows.len(), 3);
    for (row, name) in rows.iter().zip(["acme", "globex"]) {
        assert_eq!(row["database"], name);
        assert_eq!(row["ok"], true);
        assert!(row["error"].is_null());
    }
    assert_eq!(rows[2]["database"], "initech");
    assert_eq!(rows[2]["ok"], false);
    assert!(
        rows[2]["error"].as_str().unwrap().contains("127.0.0.1:1"),
        "{report}"
    );

    // One of the set on its own; the refused one's error masks its password too.
    let text = run_set(&["--databases", file, "--database", "globex", "migrate"], 0).await;
    assert!(text.contains("database up to date"), "{text}");
    let out = outbox(
        &["--databases", file, "--database", "initech", "status"],
        &[],
    )
    .await;
    expect(&out, 1, &["--database", "initech", "status"]);
    assert!(stderr(&out).contains("ops:***@"), "{}", stderr(&out));
}

#[tokio::test]
async fn status_all_shows_each_owner_pending_events_and_the_unowned() {
    let Some(control) = test_db(Backend::Postgres, "cli_set_control").await else {
        return;
    };
    let Some(acme) = test_db(Backend::Postgres, "cli_set_status_pg").await else {
        return;
    };
    let Some(globex) = test_db(Backend::MySql, "cli_set_status_my").await else {
        return;
    };
    let producer = Outbox::new("cli-set");
    assert_eq!(produce(&acme, &producer, 3, 1, 10).await, 3);
    assert_eq!(produce(&globex, &producer, 2, 1, 10).await, 2);
    let file = write_set(
        "cli_set_status",
        &[("acme", &acme.url), ("globex", &globex.url)],
    );
    let file = file.to_str().unwrap();

    // Without a control database: the figures, owners not asked, nothing to alarm about.
    let rows = json(&run_set(&["--json", "--databases", file, "status", "--all"], 0).await);
    assert_eq!(rows[0]["database"], "acme");
    assert_eq!(rows[0]["owner"]["state"], "not_asked");
    assert_eq!(rows[0]["pending"], 3);
    assert_eq!(rows[1]["pending"], 2);
    assert_eq!(rows[1]["dead"], 0);
    assert!(rows[1]["oldest_pending_age_secs"].as_f64().unwrap() >= 0.0);
    let table = run_set(&["--databases", file, "status", "--all"], 0).await;
    assert!(table.starts_with("DATABASE  OWNER  PENDING"), "{table}");
    assert!(table.contains("owners not asked"), "{table}");

    // A fleet over acme only: acme is owned, globex is nobody's.
    let fleet = fleet_owning(&control.db, "cli-set", "acme", &acme.db).await;
    let control_url = control.url.as_str();
    let args = [
        "--json",
        "--databases",
        file,
        "status",
        "--all",
        "--control-url",
        control_url,
        "--group",
        "cli-set",
    ];
    let rows = json(&run_set(&args, 5).await);
    assert_eq!(rows[0]["owner"]["state"], "owned");
    assert_eq!(rows[0]["owner"]["instance"], "pod-a");
    assert_eq!(rows[0]["needs_attention"], false);
    assert_eq!(rows[0]["pending"], 3);
    assert_eq!(rows[1]["database"], "globex");
    assert_eq!(rows[1]["owner"]["state"], "unowned");
    assert_eq!(rows[1]["needs_attention"], true);
    assert_eq!(rows[1]["pending"], 2);
    let table = run_set(&args[1..], 5).await;
    let acme_row = table.lines().find(|l| l.starts_with("acme ")).unwrap();
    let globex_row = table.lines().find(|l| l.starts_with("globex ")).unwrap();
    assert!(
        acme_row.contains(" pod-a ") && acme_row.contains(" 3 "),
        "{table}"
    );
    assert!(
        globex_row.contains(" UNOWNED ") && globex_row.contains(" 2 "),
        "{table}"
    );
    assert!(
        table.contains("2 database(s): 1 unowned, 0 unreadable"),
        "{table}"
    );

    // The control database and group from the environment, as a cron job sets them.
    let out = outbox(
        &["--databases", file, "status", "--all"],
        &[
            ("OUTBOX_CONTROL_URL", control_url),
            ("OUTBOX_FLEET_GROUP", "cli-set"),
        ],
    )
    .await;
    assert!(expect(&out, 5, &["status", "--all"]).contains(" UNOWNED "));
    // A control database without the group to read: refused, not guessed.
    run_set(
        &[
            "--databases",
            file,
            "status",
            "--all",
            "--control-url",
            control_url,
        ],
        2,
    )
    .await;
    fleet.shutdown().await;
}

#[tokio::test]
async fn database_picks_one_of_the_set_for_any_command() {
    let Some(acme) = test_db(Backend::Postgres, "cli_set_pick_pg").await else {
        return;
    };
    let Some(globex) = test_db(Backend::MySql, "cli_set_pick_my").await else {
        return;
    };
    // globex's one event dies; acme's is sent.
    let producer = Outbox::new("cli-set");
    for t in [&acme, &globex] {
        produce(t, &producer, 1, 1, 1).await;
        let transport = MemoryTransport::new();
        if t.backend == Backend::MySql {
            transport.reject_permanently(Some(|_: &OutgoingMessage| true));
        }
        Relay::new(t.db.clone(), std::sync::Arc::new(transport))
            .drain(10)
            .await
            .unwrap();
    }
    let file = write_set(
        "cli_set_pick",
        &[
            ("acme", &acme.url),
            ("globex", &globex.url),
            ("initech", REFUSED),
        ],
    );
    let file = file.to_str().unwrap();

    let dead = json(
        &run_set(
            &[
                "--json",
                "--databases",
                file,
                "--database",
                "globex",
                "dead",
                "list",
            ],
            0,
        )
        .await,
    );
    assert_eq!(dead.as_array().unwrap().len(), 1, "{dead}");
    assert_eq!(dead[0]["event_type"], "line.added");
    let dead = json(
        &run_set(
            &[
                "--json",
                "--databases",
                file,
                "--database",
                "acme",
                "dead",
                "list",
            ],
            0,
        )
        .await,
    );
    assert_eq!(dead, serde_json::json!([]));
    // The file and the name from the environment; `--database` beats a DATABASE_URL there.
    let out = outbox(
        &["--json", "--database", "globex", "dead", "list"],
        &[("OUTBOX_DATABASES", file), ("DATABASE_URL", &acme.url)],
    )
    .await;
    let dead = json(&expect(&out, 0, &["--database", "globex", "dead", "list"]));
    assert_eq!(dead.as_array().unwrap().len(), 1, "{dead}");

    // Mistakes: each a usage error (2) that says what to do.
    for (args, says) in [
        (
            vec![
                "--databases",
                file,
                "--database",
                "umbrella",
                "dead",
                "list",
            ],
            "no database `umbrella`",
        ),
        (
            vec![
                "--databases",
                file,
                "--database",
                "acme",
                "--database-url",
                &acme.url,
                "status",
            ],
            "give one of them",
        ),
        (vec!["--database", "acme", "status"], "--databases FILE"),
        (vec!["--databases", file, "status"], "no database picked"),
        (vec!["status", "--all"], "needs the set of databases"),
        (
            vec![
                "--databases",
                file,
                "--database",
                "acme",
                "migrate",
                "--all",
            ],
            "drop --database NAME",
        ),
    ] {
        let out = outbox(&args, &[]).await;
        expect(&out, 2, &args);
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
    let out = outbox(
        &["--databases", file, "--database", "umbrella", "status"],
        &[],
    )
    .await;
    assert!(
        stderr(&out).contains("it names `acme`, `globex`, `initech`"),
        "{}",
        stderr(&out)
    );

    // A bad line: refused by its number, its text (a URL with a password) not shown.
    let bad = std::env::temp_dir()
        .join("outbox-tests")
        .join("cli_set_bad.conf");
    std::fs::write(
        &bad,
        format!("acme = {}\n# next: no name\n{REFUSED}\n", acme.url),
    )
    .unwrap();
    let bad = bad.to_str().unwrap();
    let out = outbox(&["--databases", bad, "status", "--all"], &[]).await;
    expect(&out, 2, &["--databases", bad]);
    assert!(
        stderr(&out).contains(&format!("{bad}:3: expected `name = url`")),
        "{}",
        stderr(&out)
    );
    std::fs::write(bad, "acme = sqlite://a.db\nacme = sqlite://b.db\n").unwrap();
    let out = outbox(&["--databases", bad, "--database", "acme", "status"], &[]).await;
    expect(&out, 2, &["--databases", bad]);
    assert!(
        stderr(&out).contains(":2: database `acme` is named twice (first on line 1)"),
        "{}",
        stderr(&out)
    );
}
