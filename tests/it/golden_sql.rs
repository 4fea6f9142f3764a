//! Golden files of the SQL the SDK runs: a fixed scenario through the public API (and `store`
//! functions where there is none) on PostgreSQL, MariaDB and SQLite, with the text of every
//! statement the driver sent captured and compared with `tests/golden/sql/<backend>.sql`.
//!
//! A changed statement fails the test with the first lines that differ. If the change is meant,
//! rewrite the files and review them as SQL in the diff:
//!
//! ```text
//! OUTBOX_BLESS=1 cargo test --all-features --test it -- golden_sql
//! git diff tests/golden/sql
//! ```
//!
//! How the text is caught: the scenario's connection logs its statements (SeaORM's
//! `sqlx_logging`); sqlx reports each as a `sqlx::query` event with the statement in
//! `db.statement` (in `summary` when it is four words or fewer). A process-wide subscriber keeps
//! only those events, and only inside a `golden_sql` span, which routes them to its scenario: the
//! span is current in the scenario's task, and SQLite's worker thread enters the caller's span for
//! each command. Migrations and the test's own reads run outside the span and are not captured.
//! The text is normalised so the files are stable: whitespace collapsed, placeholders masked
//! (`?`), placeholder lists and repeated rows collapsed (`(…)`, `(…), …`), UUIDs, timestamps and
//! numbers in `IN` lists replaced; identical statements of one step are listed once.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use crate::common::*;
use outbox::admin::{self, Actor, DeadLetterFilter, Page, Resend, Selector, Target};
use outbox::inbox::{ExternalInbox, IncomingMessage};
use outbox::prelude::*;
use outbox::relay::{Backoff, Relay, RelayConfig};
use outbox::retention::{self, RetentionPolicy};
use outbox::store::Failure;
use outbox::store::broker_state::{self, BrokerReport};
use outbox::store::claim::ClaimParams;
use outbox::transport::OutgoingMessage;
use outbox::transport::memory::MemoryTransport;
use sea_orm::{ConnectOptions, Database, DatabaseConnection, TransactionTrait};
use serde::{Deserialize, Serialize};
use tracing::Instrument;

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "golden.placed", aggregate = "order")]
struct Placed {
    #[event(aggregate_id)]
    order: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "golden.keyed", aggregate = "order")]
struct Keyed {
    #[event(aggregate_id)]
    order: String,
    #[event(dedup_key)]
    key: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "golden.versioned", aggregate = "order")]
struct Versioned {
    #[event(aggregate_id)]
    order: String,
    #[event(aggregate_version)]
    version: i64,
}

/// Catching the statements: a process-wide subscriber that sees only sqlx's query events and
/// the `golden_sql` spans, and files each statement under the span's capture number.
mod capture {
    use super::*;
    use tracing::field::{Field, Visit};
    use tracing::{Event, Metadata, Subscriber, span};
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
    use tracing_subscriber::registry::LookupSpan;

    /// The span a scenario's steps run in.
    pub(super) const SPAN: &str = "golden_sql";
    const TARGET: &str = "sqlx::query";

    /// Statements caught so far, per capture number.
    static CAUGHT: Mutex<Option<HashMap<u64, Vec<String>>>> = Mutex::new(None);

    /// The capture number stored on a `golden_sql` span.
    struct Capture(u64);

    struct Catcher;

    #[derive(Default)]
    struct Fields {
        capture: Option<u64>,
        statement: Option<String>,
        summary: Option<String>,
    }

    impl Visit for Fields {
        fn record_u64(&mut self, field: &Field, value: u64) {
            if field.name() == "capture" {
                self.capture = Some(value);
            }
        }

        fn record_str(&mut self, field: &Field, value: &str) {
            match field.name() {
                "db.statement" => self.statement = Some(value.to_owned()),
                "summary" => self.summary = Some(value.to_owned()),
                _ => {}
            }
        }

        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if matches!(field.name(), "db.statement" | "summary") {
                // Not expected (sqlx records strings), but never lose a statement silently.
                self.record_str(field, &format!("{value:?}"));
            }
        }
    }

    impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Catcher {
        fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
            metadata.target() == TARGET || metadata.name() == SPAN
        }

        fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
            let mut fields = Fields::default();
            attrs.record(&mut fields);
            if let (Some(capture), Some(span)) = (fields.capture, ctx.span(id)) {
                span.extensions_mut().insert(Capture(capture));
            }
        }

        fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
            if event.metadata().target() != TARGET {
                return;
            }
            let Some(capture) = ctx.event_scope(event).and_then(|scope| {
                scope
                    .into_iter()
                    .find_map(|span| span.extensions().get::<Capture>().map(|c| c.0))
            }) else {
                return;
            };
            let mut fields = Fields::default();
            event.record(&mut fields);
            let text = match (fields.statement, fields.summary) {
                (Some(statement), _) if !statement.trim().is_empty() => statement,
                (_, Some(summary)) => summary,
                _ => return,
            };
            CAUGHT
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert_with(HashMap::new)
                .entry(capture)
                .or_default()
                .push(text);
        }
    }

    /// Install the subscriber once per process. Tests that trace set their own subscriber on
    /// their own threads, which takes precedence there.
    pub(super) fn install() {
        static INSTALLED: OnceLock<()> = OnceLock::new();
        INSTALLED.get_or_init(|| {
            let subscriber = tracing_subscriber::registry().with(Catcher);
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other process-wide subscriber in the `it` binary");
        });
    }

    /// Take what capture `number` caught so far.
    pub(super) fn take(number: u64) -> Vec<String> {
        CAUGHT
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashMap::new)
            .remove(&number)
            .unwrap_or_default()
    }
}

/// The normalised text of one statement: one line, stable from run to run.
fn normalise(sql: &str) -> String {
    let text = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    let text = mask_literals(&text);
    let text = collapse_lists(&text);
    collapse_repeats(&text)
}

/// `$N` → `?`; quoted timestamps → `'<time>'`; UUIDs → `<uuid>`.
fn mask_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '$' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()) {
            i += 1;
            while chars.get(i).is_some_and(|d| d.is_ascii_digit()) {
                i += 1;
            }
            out.push('?');
            continue;
        }
        if is_uuid_at(&chars, i) {
            out.push_str("<uuid>");
            i += 36;
            continue;
        }
        if c == '\''
            && let Some(end) = chars[i + 1..].iter().position(|&q| q == '\'')
            && looks_like_time(&chars[i + 1..i + 1 + end].iter().collect::<String>())
        {
            out.push_str("'<time>'");
            i += end + 2;
            continue;
        }
        out.push(c);
        i += 1;
    }
    out
}

fn is_uuid_at(chars: &[char], i: usize) -> bool {
    if i + 36 > chars.len() || (i > 0 && chars[i - 1].is_ascii_hexdigit()) {
        return false;
    }
    let dashes = [8, 13, 18, 23];
    let shape = (0..36).all(|k| {
        let c = chars[i + k];
        if dashes.contains(&k) {
            c == '-'
        } else {
            c.is_ascii_hexdigit()
        }
    });
    shape && !chars.get(i + 36).is_some_and(|c| c.is_ascii_hexdigit())
}

fn looks_like_time(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() >= 10
        && bytes[..4].iter().all(u8::is_ascii_digit)
        && bytes[4] == b'-'
        && bytes[5..7].iter().all(u8::is_ascii_digit)
        && bytes[7] == b'-'
}

/// A parenthesised list of only placeholders, or of only numbers after `IN`, → `(…)`.
fn collapse_lists(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('(') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after
            .find([')', '('])
            .filter(|&k| after.as_bytes()[k] == b')')
        else {
            out.push('(');
            rest = after;
            continue;
        };
        let items: Vec<&str> = after[..close].split(',').map(str::trim).collect();
        let placeholders = items.len() > 1 && items.iter().all(|item| *item == "?");
        let after_in = out.trim_end().to_ascii_uppercase().ends_with(" IN");
        let numbers = after_in
            && items
                .iter()
                .all(|item| !item.is_empty() && item.chars().all(|c| c.is_ascii_digit()));
        if placeholders || numbers || (after_in && items.iter().all(|item| *item == "?")) {
            out.push_str("(…)");
        } else {
            out.push('(');
            out.push_str(&after[..close]);
            out.push(')');
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

/// A parenthesised group repeated right after itself (`X, X, X`: the rows of a multi-row
/// INSERT) → `X, …`.
fn collapse_repeats(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('(') {
        out.push_str(&rest[..open]);
        let group_len = balanced_len(&rest[open..]);
        let Some(len) = group_len else {
            out.push_str(&rest[open..]);
            return out;
        };
        let group = &rest[open..open + len];
        let mut tail = &rest[open + len..];
        let mut repeated = false;
        while let Some(next) = tail.strip_prefix(", ").and_then(|t| t.strip_prefix(group)) {
            tail = next;
            repeated = true;
        }
        out.push_str(group);
        if repeated {
            out.push_str(", …");
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// The length of the balanced group at the start of `text` (which starts with `(`).
fn balanced_len(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// The statements of a scenario, step by step.
struct Recorder {
    capture: u64,
    steps: Vec<(String, Vec<String>)>,
}

impl Recorder {
    fn new() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        capture::install();
        Recorder {
            capture: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            steps: Vec::new(),
        }
    }

    /// Run `work` as the step `label`, catching its statements.
    async fn step<T>(&mut self, label: &str, work: impl std::future::Future<Output = T>) -> T {
        let span = tracing::info_span!(capture::SPAN, capture = self.capture);
        let value = work.instrument(span).await;
        let mut statements: Vec<String> = Vec::new();
        for text in capture::take(self.capture) {
            let text = normalise(&text);
            if !statements.contains(&text) {
                statements.push(text);
            }
        }
        assert!(!statements.is_empty(), "step `{label}` caught no statement");
        self.steps.push((label.to_owned(), statements));
        value
    }

    fn render(&self, backend: &str) -> String {
        let mut text = format!(
            "-- Every statement the SDK sends to {backend} in the scenario of tests/it/golden_sql.rs,\n\
             -- normalised; transaction control as the driver logs it (SQLite's is not logged).\n\
             -- Regenerate: OUTBOX_BLESS=1 cargo test --all-features --test it -- golden_sql\n"
        );
        for (label, statements) in &self.steps {
            text.push_str(&format!("\n-- {label}\n"));
            for statement in statements {
                text.push_str(statement);
                text.push('\n');
            }
        }
        text
    }
}

/// Compare `actual` with the golden file, or rewrite it under `OUTBOX_BLESS=1`.
fn check_golden(file: &str, actual: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/sql")
        .join(file);
    if std::env::var("OUTBOX_BLESS").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        eprintln!("golden_sql: wrote {}", path.display());
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    if expected == actual {
        return;
    }
    let (old, new): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    let mut report = String::new();
    let mut shown = 0;
    for i in 0..old.len().max(new.len()) {
        let (was, is) = (old.get(i), new.get(i));
        if was != is {
            report.push_str(&format!(
                "line {}:\n  golden: {}\n  now:    {}\n",
                i + 1,
                was.unwrap_or(&"<none>"),
                is.unwrap_or(&"<none>")
            ));
            shown += 1;
            if shown == 5 {
                break;
            }
        }
    }
    panic!(
        "the SQL the SDK runs differs from {} (first differing lines below). If the change is \
         meant, run with OUTBOX_BLESS=1 and review the diff of tests/golden/sql.\n{report}",
        path.display()
    );
}

fn relay_config() -> RelayConfig {
    RelayConfig::default()
        .relay_id("golden-relay")
        .batch_size(10)
        .max_attempts(3)
        .backoff(
            Backoff::default()
                .base(Duration::from_secs(600))
                .cap(Duration::from_secs(600))
                .jitter(0.0),
        )
}

/// A connection to the test's database whose statements are logged.
async fn logged_connection(t: &TestDb) -> DatabaseConnection {
    let max = if t.backend == Backend::SqliteFile {
        1
    } else {
        4
    };
    let mut opts = ConnectOptions::new(t.url.clone());
    opts.sqlx_logging(true)
        .max_connections(max)
        .min_connections(max)
        .connect_timeout(Duration::from_secs(5));
    Database::connect(opts).await.expect("logged connection")
}

const CONSUMER: &str = "golden-consumer";

async fn scenario(t: TestDb, file: &str) {
    let db = logged_connection(&t).await;
    let mut r = Recorder::new();
    let outbox = Outbox::new("golden");
    let transport = MemoryTransport::new();
    let relay = Relay::new(db.clone(), Arc::new(transport.clone())).with_config(relay_config());
    let order = |order: &str| Placed {
        order: order.into(),
    };

    // Producing.
    r.step("enqueue + commit: one event", async {
        let tx = outbox.begin(&db).await.unwrap();
        tx.enqueue(&order("o-1")).unwrap();
        let _ = tx.commit().await.unwrap();
    })
    .await;
    r.step("enqueue + commit: an event with a dedup key", async {
        let tx = outbox.begin(&db).await.unwrap();
        tx.enqueue(&Keyed {
            order: "o-1".into(),
            key: "k-1".into(),
        })
        .unwrap();
        let _ = tx.commit().await.unwrap();
    })
    .await;
    r.step(
        "enqueue + commit: an event with an aggregate version",
        async {
            let tx = outbox.begin(&db).await.unwrap();
            tx.enqueue(&Versioned {
                order: "o-2".into(),
                version: 1,
            })
            .unwrap();
            let _ = tx.commit().await.unwrap();
        },
    )
    .await;
    r.step("enqueue + commit: three events in one transaction", async {
        let tx = outbox.begin(&db).await.unwrap();
        for order_id in ["o-3", "o-4", "o-5"] {
            tx.enqueue(&order(order_id)).unwrap();
        }
        let _ = tx.commit().await.unwrap();
    })
    .await;

    // Relaying.
    r.step("relay: claim, publish, settle SENT", async {
        let report = relay.run_once().await.unwrap();
        assert_eq!(report.sent, 6, "{report:?}");
    })
    .await;
    let fail = |aggregate: &'static str| move |m: &OutgoingMessage| m.aggregate_id == aggregate;
    let tx = outbox.begin(&t.db).await.unwrap();
    tx.enqueue(&order("o-fail")).unwrap();
    tx.enqueue(&order("o-poison")).unwrap();
    let _ = tx.commit().await.unwrap();
    transport.fail_matching(Some(fail("o-fail")));
    transport.reject_permanently(Some(fail("o-poison")));
    r.step(
        "relay: a failed publish goes RETRY with its class, a permanent rejection DEAD",
        async {
            let report = relay.run_once().await.unwrap();
            assert_eq!((report.retried, report.dead), (1, 1), "{report:?}");
        },
    )
    .await;
    transport.clear_faults();
    r.step("relay: nothing due", async {
        let report = relay.run_once().await.unwrap();
        assert_eq!(report.claimed, 0, "{report:?}");
    })
    .await;

    // Delayed events.
    r.step("delayed: enqueue_after + commit", async {
        let tx = outbox.begin(&db).await.unwrap();
        tx.enqueue_after(&order("o-later"), Duration::from_millis(1))
            .unwrap();
        let _ = tx.commit().await.unwrap();
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    r.step(
        "delayed: the relay promotes the due event and publishes it",
        async {
            let report = relay.run_once().await.unwrap();
            assert_eq!(report.sent, 1, "{report:?}");
        },
    )
    .await;

    // Consuming: external messages recorded, claimed by a worker and settled.
    let inbox = ExternalInbox::new(db.clone());
    r.step("inbox: receive external messages", async {
        for id in ["m-1", "m-2", "m-3"] {
            let message = IncomingMessage::new(CONSUMER, "golden-psp", id, "payment.done", "{}")
                .business_key(format!("biz-{id}"));
            inbox.receive(&message).await.unwrap();
        }
        // The same message again: a duplicate.
        let again = IncomingMessage::new(CONSUMER, "golden-psp", "m-1", "payment.done", "{}")
            .business_key("biz-m-1");
        inbox.receive(&again).await.unwrap();
    })
    .await;
    let params = ClaimParams {
        owner: "golden-worker",
        batch_size: 10,
        lease: Duration::from_secs(60),
        ordering: true,
        max_attempts: 3,
    };
    let claim = r
        .step("inbox worker: claim", async {
            outbox::store::inbox::claim(&db, CONSUMER, &params)
                .await
                .unwrap()
        })
        .await;
    assert_eq!(claim.messages.len(), 3, "{claim:?}");
    let ids: Vec<i64> = claim.messages.iter().map(|m| m.id).collect();
    r.step("inbox worker: a handler commits, DONE", async {
        let txn = db.begin().await.unwrap();
        assert!(
            outbox::store::inbox::mark_done(&txn, ids[0], claim.token)
                .await
                .unwrap()
        );
        txn.commit().await.unwrap();
    })
    .await;
    r.step("inbox worker: a handler fails, RETRY", async {
        let failure = Failure::after(1, 3, false, || Duration::from_secs(600), "busy".into());
        assert!(
            outbox::store::inbox::mark_failed(&db, ids[1], claim.token, &failure)
                .await
                .unwrap()
        );
    })
    .await;
    r.step("inbox worker: a handler fails permanently, DEAD", async {
        let failure = Failure::after(1, 3, true, || Duration::ZERO, "bad input".into());
        assert!(
            outbox::store::inbox::mark_failed(&db, ids[2], claim.token, &failure)
                .await
                .unwrap()
        );
    })
    .await;

    // Operating.
    r.step("admin: status", async {
        admin::status(&db).await.unwrap();
    })
    .await;
    let dead = r
        .step("admin: list dead letters", async {
            admin::dead_letters(&db, &DeadLetterFilter::default(), Page::default())
                .await
                .unwrap()
        })
        .await;
    assert_eq!(dead.len(), 2, "{dead:?}");
    let rows = outbox_rows(&t.db).await;
    let poison = rows.iter().find(|r| r.aggregate_id == "o-poison").unwrap();
    let sent = rows.iter().find(|r| r.aggregate_id == "o-3").unwrap();
    let actor = Actor::new("golden").reason("golden files");
    r.step("admin: show a dead letter", async {
        admin::dead_letter(&db, Target::outbox(poison.id))
            .await
            .unwrap();
    })
    .await;
    r.step("admin: replay a dead event", async {
        let report = admin::replay(&db, &Selector::Ids(vec![Target::outbox(poison.id)]), &actor)
            .await
            .unwrap();
        assert_eq!(report.outbox, 1);
    })
    .await;
    r.step("admin: ignore a dead message", async {
        let report = admin::ignore(&db, &Selector::Ids(vec![Target::inbox(ids[2])]), &actor)
            .await
            .unwrap();
        assert_eq!(report.inbox, 1);
    })
    .await;
    r.step("admin: resend a sent event", async {
        let report = admin::resend(&db, &Resend::Events(vec![sent.event_id]), &actor)
            .await
            .unwrap();
        assert_eq!(report.outbox, 1);
    })
    .await;
    r.step("admin: audit log", async {
        admin::audit_log(&db, 10).await.unwrap();
    })
    .await;

    // Retention and leases.
    let policy = RetentionPolicy::default();
    r.step("retention: purge", async {
        retention::purge(&db, &policy).await.unwrap();
    })
    .await;
    for label in [
        "retention: lease acquired, purge as leader",
        "retention: lease renewed, purge as leader",
    ] {
        r.step(label, async {
            assert!(
                retention::purge_once_if_leader(&db, &policy, "golden-janitor")
                    .await
                    .unwrap()
                    .is_some()
            );
        })
        .await;
    }
    r.step("retention: lease released", async {
        retention::release_lease(&db, "golden-janitor")
            .await
            .unwrap();
    })
    .await;

    // The relay's heartbeat: its view of the broker.
    let report = BrokerReport {
        relay_id: "golden-relay",
        transport: "memory",
        available: true,
        seen_ago: Some(Duration::from_secs(1)),
        unavailable_for: None,
        outages: 0,
        held_back: 0,
        last_error: None,
        expires_in: Duration::from_secs(60),
    };
    r.step("relay heartbeat: first report", async {
        broker_state::record(&db, &report).await.unwrap();
    })
    .await;
    r.step("relay heartbeat: next report", async {
        broker_state::record(&db, &report).await.unwrap();
    })
    .await;
    r.step("relay heartbeat: the relays' rows", async {
        broker_state::relays(&db).await.unwrap();
    })
    .await;

    db.close().await.ok();
    check_golden(file, &r.render(file.trim_end_matches(".sql")));
}

async fn run(backend: Backend, tag: &str, file: &str) {
    let test = backend_test_name(module_path!(), tag);
    if let Some(t) = test_db(backend, &test).await {
        scenario(t, file).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres() {
    run(Backend::Postgres, "pg", "postgres.sql").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql() {
    run(Backend::MySql, "my", "mysql.sql").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    run(Backend::SqliteFile, "lf", "sqlite.sql").await;
}

#[cfg(test)]
mod normalising {
    use super::normalise;

    #[test]
    fn masks_and_collapses() {
        assert_eq!(
            normalise("SELECT a\n   FROM t WHERE id IN ($1, $2, $3) AND b = $4"),
            "SELECT a FROM t WHERE id IN (…) AND b = ?"
        );
        assert_eq!(
            normalise("INSERT INTO t (a, b) VALUES (?, now() + ?), (?, now() + ?), (?, now() + ?)"),
            "INSERT INTO t (a, b) VALUES (?, now() + ?), …"
        );
        assert_eq!(
            normalise("DELETE FROM t WHERE id IN (3, 4) AND at < '2026-12-04 04:05:05'"),
            "DELETE FROM t WHERE id IN (…) AND at < '<time>'"
        );
        assert_eq!(
            normalise("UPDATE t SET x = 'a1b2c3d4-0000-4000-8000-0123456789ab'"),
            "UPDATE t SET x = '<uuid>'"
        );
    }
}
