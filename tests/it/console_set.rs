//! One console over a set of databases (`Console::for_set`), PostgreSQL and MariaDB mixed, over a
//! real HTTP server and client: `GET /api/databases` shows the owner from a running fleet's
//! control database (`UNOWNED` for the database nobody owns) and each database's pending events;
//! every other route works on the database its `database` parameter names (a dead letter listed
//! in its own database only, a replay changing the row of the database named and audited there);
//! an unknown database is a 404 naming it, a malformed name a 400, no token a 401. In a real
//! browser, the page shows the set's overview with the unowned database highlighted, and the
//! selector switches every view to the database picked.

use std::time::Duration;

use hyper::{HeaderMap, Method, StatusCode, header::HeaderValue};
use outbox::console::{Console, ConsoleAuth};
use outbox::fleet::FleetDatabase;
use outbox::prelude::*;
use outbox::relay::Relay;
use outbox::transport::OutgoingMessage;
use outbox::transport::memory::MemoryTransport;
use serde_json::{Value, json};

use crate::admin::outbox_row;
use crate::common::carts::produce;
use crate::common::http::{Answer, HttpClient, client, send, serve};
use crate::common::*;
use crate::console::{browser_tools, output_of};

const TOKEN: &str = "console-set-token-0123456789";

/// acme (PostgreSQL, owned by a running fleet instance `pod-a`, 3 events pending) and globex
/// (MariaDB, nobody's, 2 events pending behind a DEAD one), and the console over both.
struct Set {
    acme: TestDb,
    globex: TestDb,
    /// globex's DEAD outbox row.
    dead: i64,
    fleet: outbox::fleet::Fleet,
    base: String,
    client: HttpClient,
    task: tokio::task::JoinHandle<()>,
    control: TestDb,
}

impl Set {
    async fn start(test: &str) -> Option<Set> {
        let control = test_db(Backend::Postgres, &format!("{test}_control")).await?;
        let acme = test_db(Backend::Postgres, &format!("{test}_acme")).await?;
        let globex = test_db(Backend::MySql, &format!("{test}_globex")).await?;
        let producer = Outbox::new("console-set");
        // globex's first event dies; then events wait in both.
        produce(&globex, &producer, 1, 1, 1).await;
        let transport = MemoryTransport::new();
        transport.reject_permanently(Some(|_: &OutgoingMessage| true));
        Relay::new(globex.db.clone(), std::sync::Arc::new(transport))
            .drain(10)
            .await
            .unwrap();
        let dead = scalar_i64(
            &globex.db,
            "SELECT MIN(id) AS n FROM outbox_event WHERE status = 'DEAD'",
        )
        .await;
        assert_eq!(produce(&globex, &producer, 2, 1, 10).await, 2);
        assert_eq!(produce(&acme, &producer, 3, 1, 10).await, 3);

        let fleet = fleet_owning(&control.db, "console-set", "acme", &acme.db).await;
        let app = Console::for_set(
            vec![
                FleetDatabase::new("acme", acme.db.clone()),
                FleetDatabase::new("globex", globex.db.clone()),
            ],
            ConsoleAuth::bearer("ops", TOKEN).unwrap(),
        )
        .control(control.db.clone(), "console-set")
        .router();
        let (addr, task) = serve(app).await;
        Some(Set {
            acme,
            globex,
            dead,
            fleet,
            base: format!("http://{addr}"),
            client: client(),
            task,
            control,
        })
    }

    async fn call(&self, method: Method, path: &str, token: bool, body: Option<Value>) -> Answer {
        let mut headers = HeaderMap::new();
        if token {
            headers.insert(
                "authorization",
                HeaderValue::from_str(&format!("Bearer {TOKEN}")).unwrap(),
            );
        }
        let body = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        send(
            &self.client,
            method,
            &format!("{}{path}", self.base),
            &headers,
            body,
        )
        .await
        .unwrap()
    }

    /// `GET path` authenticated: its status and JSON.
    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let answer = self.call(Method::GET, path, true, None).await;
        (answer.status, json_of(&answer))
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let answer = self.call(Method::POST, path, true, Some(body)).await;
        (answer.status, json_of(&answer))
    }

    async fn stop(self) {
        self.task.abort();
        self.fleet.shutdown().await;
    }
}

fn json_of(answer: &Answer) -> Value {
    serde_json::from_str(&answer.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", answer.status, answer.body))
}

/// The reasons in a database's audit log.
async fn audited_reasons(t: &TestDb) -> Vec<String> {
    outbox::admin::audit_log(&t.db, 100)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|a| a.reason)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_works_on_the_database_named() {
    let Some(set) = Set::start("console_set_api").await else {
        return;
    };

    // The set: acme owned by the fleet's instance, globex nobody's; their pending events.
    let (status, rows) = set.get("/api/databases").await;
    assert_eq!(status, StatusCode::OK, "{rows}");
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0]["database"], "acme");
    assert_eq!(rows[0]["owner"]["state"], "owned");
    assert_eq!(rows[0]["owner"]["instance"], "pod-a");
    assert_eq!(rows[0]["pending"], 3);
    assert_eq!(rows[0]["dead"], 0);
    assert!(rows[0]["oldest_pending_age_secs"].as_f64().unwrap() >= 0.0);
    assert_eq!(rows[0]["needs_attention"], false);
    assert_eq!(rows[1]["database"], "globex");
    assert_eq!(rows[1]["owner"]["state"], "unowned");
    assert_eq!(rows[1]["pending"], 2);
    assert_eq!(rows[1]["dead"], 1);
    assert_eq!(rows[1]["needs_attention"], true);
    assert!(rows[1]["error"].is_null());

    // Each database's own status and dead letters.
    let (status, acme) = set.get("/api/status?database=acme").await;
    assert_eq!(status, StatusCode::OK, "{acme}");
    assert_eq!(acme["outbox"]["backlog"], 3);
    assert_eq!(acme["outbox"]["dead"], 0);
    let (_, globex) = set.get("/api/status?database=globex").await;
    assert_eq!(globex["outbox"]["backlog"], 2);
    assert_eq!(globex["outbox"]["dead"], 1);
    let dead_id = format!("outbox:{}", set.dead);
    let (status, list) = set
        .get("/api/dead-letters?limit=10&database=globex&page=1")
        .await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let ids: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [dead_id.as_str()]);
    let (_, list) = set.get("/api/dead-letters?database=acme").await;
    assert_eq!(list["items"], json!([]));
    let (status, detail) = set
        .get(&format!("/api/dead-letters/{dead_id}?database=globex"))
        .await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    assert_eq!(detail["status"], "DEAD");

    // A replay acts on the database named only: in acme the same id is a PENDING event, left
    // alone; in globex the dead row goes back to PENDING. Each is audited where it acted.
    let (status, report) = set
        .post(
            "/api/replay?database=acme",
            json!({"ids": [dead_id], "reason": "asked of acme"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["outbox"], 0, "{report}");
    assert_eq!(report["skipped"][0]["status"], "PENDING", "{report}");
    assert_eq!(outbox_row(&set.globex, set.dead).await.status, "DEAD");
    assert_eq!(outbox_row(&set.acme, set.dead).await.status, "PENDING");
    let (status, report) = set
        .post(
            "/api/replay?database=globex",
            json!({"ids": [dead_id], "reason": "globex fixed"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["outbox"], 1, "{report}");
    assert_eq!(outbox_row(&set.globex, set.dead).await.status, "PENDING");
    assert_eq!(audited_reasons(&set.globex).await, ["globex fixed"]);
    assert_eq!(audited_reasons(&set.acme).await, ["asked of acme"]);
    let (_, list) = set.get("/api/dead-letters?database=globex").await;
    assert_eq!(list["items"], json!([]));
    let (_, rows) = set.get("/api/databases").await;
    assert_eq!(rows[1]["dead"], 0);
    assert_eq!(rows[1]["pending"], 3);

    // No database named, an unknown one, a malformed one.
    let (status, error) = set.get("/api/status").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("serves 2 databases"),
        "{error}"
    );
    let (status, error) = set
        .get("/api/dead-letters?database=%3Cb%3E%22umbrella%22")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{error}");
    assert_eq!(
        error["error"],
        "no database `<b>\"umbrella\"` in this console's set (GET /api/databases lists them)"
    );
    let (status, _) = set
        .post(
            "/api/replay?database=umbrella",
            json!({"all": true, "reason": "nowhere"}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    for bad in [
        format!("/api/status?database={}", "a".repeat(129)),
        "/api/status?database=acme%0A".to_owned(),
        "/api/status?database=".to_owned(),
        "/api/status?database=acme&database=globex".to_owned(),
    ] {
        let (status, error) = set.get(&bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {error}");
        assert!(error["error"].as_str().unwrap().contains("`database`"));
    }

    // Nothing without a token: not the list, not a database's rows, no write.
    for (method, path, body) in [
        (Method::GET, "/api/databases", None),
        (Method::GET, "/api/dead-letters?database=globex", None),
        (Method::GET, "/api/status?database=umbrella", None),
        (
            Method::POST,
            "/api/replay?database=acme",
            Some(json!({"all": true, "reason": "try"})),
        ),
    ] {
        let answer = set.call(method, path, false, body).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{path}");
        assert!(
            !answer.body.contains("acme") && !answer.body.contains("umbrella"),
            "{path}: {}",
            answer.body
        );
    }
    assert_eq!(audited_reasons(&set.acme).await, ["asked of acme"]);
    set.stop().await;
}

/// A console over one database takes no `database` parameter.
#[tokio::test]
async fn a_console_over_one_database_names_none() {
    let Some(t) = test_db(Backend::SqliteFile, "console_set_one").await else {
        return;
    };
    let app = Console::new(t.db.clone(), ConsoleAuth::bearer("ops", TOKEN).unwrap()).router();
    let (addr, task) = serve(app).await;
    let client = client();
    let mut headers = HeaderMap::new();
    headers.insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {TOKEN}")).unwrap(),
    );
    let url = |path: &str| format!("http://{addr}{path}");
    let answer = send(
        &client,
        Method::GET,
        &url("/api/databases"),
        &headers,
        vec![],
    )
    .await
    .unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(json_of(&answer), json!([]));
    let answer = send(&client, Method::GET, &url("/api/status"), &headers, vec![])
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let answer = send(
        &client,
        Method::GET,
        &url("/api/status?database=acme"),
        &headers,
        vec![],
    )
    .await
    .unwrap();
    assert_eq!(answer.status, StatusCode::NOT_FOUND, "{}", answer.body);
    assert!(
        answer.body.contains("serves one database"),
        "{}",
        answer.body
    );
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_over_a_set_in_a_real_browser() {
    let Some(tools) = browser_tools() else {
        return;
    };
    let Some(set) = Set::start("console_set_page").await else {
        return;
    };
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-set-screenshots");
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/console_set.cjs");
    let mut command = std::process::Command::new("node");
    command
        .arg(script)
        .env("PLAYWRIGHT_CORE", &tools.playwright_core)
        .env("CHROMIUM", &tools.chromium)
        .env("CONSOLE_URL", format!("{}/", set.base))
        .env("CONSOLE_TOKEN", TOKEN)
        .env("SCREENSHOTS", &shots);
    let output = output_of(command).await;
    assert!(
        output.status.success(),
        "the browser run failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(seen["errors"], json!([]), "{seen}");
    assert_eq!(seen["failedRequests"], json!([]), "{seen}");

    // The overview of the set: each database's owner and figures, the unowned one highlighted.
    let rows = seen["databases"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{seen}");
    assert_eq!(rows[0]["database"], "acme");
    assert_eq!(rows[0]["owner"], "pod-a");
    assert_eq!(rows[0]["pending"], "3");
    assert_eq!(rows[0]["dead"], "0");
    assert_eq!(rows[0]["attention"], "false");
    assert_eq!(rows[1]["database"], "globex");
    assert_eq!(rows[1]["owner"], "UNOWNED");
    assert_eq!(rows[1]["pending"], "2");
    assert_eq!(rows[1]["dead"], "1");
    assert_eq!(rows[1]["problem"], "unowned");
    assert_eq!(rows[1]["attention"], "true");
    assert_ne!(
        rows[0]["background"], rows[1]["background"],
        "the unowned database is not highlighted: {seen}"
    );
    assert_eq!(
        seen["options"],
        json!([
            {"value": "acme", "text": "acme", "attention": "false"},
            {"value": "globex", "text": "globex (unowned)", "attention": "true"},
        ])
    );

    // The status view follows the selector.
    assert_eq!(seen["selectedFirst"], "acme");
    assert_eq!(seen["acme"]["backlog"], "3");
    assert_eq!(seen["acme"]["dead"], "0");
    assert_eq!(seen["globex"]["backlog"], "2");
    assert_eq!(seen["globex"]["dead"], "1");
    assert_eq!(seen["selectedRow"], "globex");
    assert_eq!(seen["showing"], "Database globex");
    // So do the dead letters: globex's one, none in acme.
    assert_eq!(
        seen["globexDead"],
        json!([format!("outbox:{}", set.dead)]),
        "{seen}"
    );
    assert_eq!(seen["acmeDead"], json!(["no dead letters"]), "{seen}");
    assert!(shots.join("set.png").exists());
    set.stop().await;
}

/// `outbox --databases FILE serve` serves the set (owners from `--control-url` and `--group`),
/// and logs the database each request worked on; with `--database NAME` it serves that one.
#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_serve_serves_the_set_of_the_file() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    let Some(set) = Set::start("console_set_cli").await else {
        return;
    };
    let dir = std::env::temp_dir().join("outbox-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("console_set_cli.conf");
    std::fs::write(
        &file,
        format!("acme = {}\nglobex = {}\n", set.acme.url, set.globex.url),
    )
    .unwrap();
    // The console over `args`, its log lines as they come.
    let serve = |args: Vec<String>, serve_args: Vec<String>| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_outbox"))
            .env_remove("DATABASE_URL")
            .env_remove("OUTBOX_DATABASES")
            .env_remove("OUTBOX_CONTROL_URL")
            .env_remove("OUTBOX_FLEET_GROUP")
            .env_remove("RUST_LOG")
            .env("OUTBOX_CONSOLE_TOKEN", TOKEN)
            .args(args)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(serve_args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start outbox serve");
        let (send, lines) = std::sync::mpsc::channel::<String>();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        (child, lines)
    };
    let wait_for = |lines: &std::sync::mpsc::Receiver<String>, parts: &[&str]| {
        let mut seen = Vec::new();
        while let Ok(line) = lines.recv_timeout(Duration::from_secs(30)) {
            if parts.iter().all(|p| line.contains(p)) {
                return line;
            }
            seen.push(line);
        }
        panic!("no log line with {parts:?} in:\n{}", seen.join("\n"));
    };
    let base_of = |start: &str| {
        start
            .split("url=")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no url in {start}"))
            .trim_end_matches('/')
            .to_owned()
    };
    let file = file.to_str().unwrap().to_owned();
    let mut headers = HeaderMap::new();
    headers.insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {TOKEN}")).unwrap(),
    );
    let get = |url: String| {
        let headers = headers.clone();
        let client = set.client.clone();
        async move {
            let answer = send(&client, Method::GET, &url, &headers, vec![])
                .await
                .unwrap();
            (answer.status, json_of(&answer))
        }
    };

    let (mut child, lines) = serve(
        vec!["--databases".into(), file.clone()],
        vec![
            "--control-url".into(),
            set.control.url.clone(),
            "--group".into(),
            "console-set".into(),
        ],
    );
    let start = wait_for(&lines, &["outbox console serving"]);
    assert!(start.contains("2 databases of the set"), "{start}");
    let base = base_of(&start);
    let (status, rows) = get(format!("{base}/api/databases")).await;
    assert_eq!(status, StatusCode::OK, "{rows}");
    assert_eq!(rows[0]["database"], "acme");
    assert_eq!(rows[0]["owner"]["instance"], "pod-a");
    assert_eq!(rows[1]["database"], "globex");
    assert_eq!(rows[1]["owner"]["state"], "unowned");
    assert_eq!(rows[1]["dead"], 1);
    let (status, globex) = get(format!("{base}/api/status?database=globex")).await;
    assert_eq!(status, StatusCode::OK, "{globex}");
    assert_eq!(globex["outbox"]["backlog"], 2);
    let logged = wait_for(&lines, &["console request", r#"path="/api/status""#]);
    assert!(logged.contains(r#"database="globex""#), "{logged}");
    let _ = child.kill();
    let _ = child.wait();

    // One database of the file: a console over it alone.
    let (mut child, lines) = serve(
        vec![
            "--databases".into(),
            file,
            "--database".into(),
            "globex".into(),
        ],
        vec![],
    );
    let base = base_of(&wait_for(&lines, &["outbox console serving"]));
    let (_, rows) = get(format!("{base}/api/databases")).await;
    assert_eq!(rows, json!([]));
    let (status, globex) = get(format!("{base}/api/status")).await;
    assert_eq!(status, StatusCode::OK, "{globex}");
    assert_eq!(globex["outbox"]["backlog"], 2);
    let _ = child.kill();
    let _ = child.wait();
    set.stop().await;
}
