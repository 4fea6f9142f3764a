//! Webhooks received through the axum handler, on a real HTTP server with a real HTTP client,
//! on PostgreSQL, MariaDB and SQLite: stored and committed before the `200`, each business
//! effect once through duplicates, concurrent copies and the same business fact under a new id,
//! retries to DEAD and an operator's replay, refused requests that store nothing, and a database
//! outage answered `503` with nothing lost.

use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use crate::common::http::{self as web, Answer, HttpClient};
use crate::common::*;
use futures::StreamExt;
use outbox::admin::{self, Actor, Selector};
use outbox::inbox::ExternalInbox;
use outbox::prelude::*;
use outbox::webhook::{Field, HmacSha256, Webhook};
use serde::Deserialize;

const SOURCE: &str = "psp-test";
const CONSUMER: &str = "wh-payments";
const SECRET: &[u8] = b"whsec_2f9c1e7a_test_only";

/// A payment provider's event: not one of our `DomainEvent`s, just JSON.
#[derive(Debug, Deserialize)]
struct PaymentEvent {
    data: Payment,
}

#[derive(Debug, Deserialize)]
struct Payment {
    payment_id: String,
    customer: String,
    amount: i64,
}

/// One effect row per handled payment, in the handler's transaction.
#[inbox_handler(
    consumer = "wh-payments",
    source = "psp-test",
    message_type = "payment.succeeded",
    max_attempts = 3,
    backoff = "10ms",
    backoff_cap = "30ms"
)]
async fn payment_succeeded(
    tx: &InboxTransaction,
    message: Event<PaymentEvent>,
) -> Result<(), HandlerError> {
    if should_fail(&message.data.customer) {
        return Err(HandlerError::retry("ledger unavailable (injected)"));
    }
    assert_eq!(message.meta().source, SOURCE);
    assert_eq!(
        message.meta().business_key.as_deref(),
        Some(message.data.payment_id.as_str())
    );
    insert_effect(
        tx,
        message.id(),
        &message.data.payment_id,
        message.data.amount,
    )
    .await
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn event(id: &str, payment: &str, customer: &str, amount: i64) -> Vec<u8> {
    serde_json::json!({
        "id": id,
        "type": "payment.succeeded",
        "data": { "payment_id": payment, "customer": customer, "amount": amount }
    })
    .to_string()
    .into_bytes()
}

/// The receiver under test: the runtime's worker, and the webhook served over HTTP.
struct Receiver {
    runtime: Runtime,
    url: String,
    server: tokio::task::JoinHandle<()>,
    client: HttpClient,
    signer: HmacSha256,
}

fn webhook(inbox: ExternalInbox) -> Webhook {
    Webhook::new(inbox, CONSUMER, SOURCE, HmacSha256::new(SECRET))
        .business_key(Field::json("/data/payment_id"))
        .ordering_key(Field::json("/data/customer"))
        .max_body_bytes(4096)
}

impl Receiver {
    async fn start(t: &TestDb) -> Self {
        Self::start_with(t, webhook).await
    }

    async fn start_with(t: &TestDb, configure: impl FnOnce(ExternalInbox) -> Webhook) -> Self {
        let runtime = worker_runtime(&t.db, [CONSUMER]).await;
        let app = axum::Router::new().route(
            "/hooks/payments",
            outbox::webhook::axum::handler(configure(runtime.external_inbox())),
        );
        let (addr, server) = web::serve(app).await;
        Receiver {
            runtime,
            url: format!("http://{addr}/hooks/payments"),
            server,
            client: web::client(),
            signer: HmacSha256::new(SECRET),
        }
    }

    /// Send `body` signed now, as the provider does.
    async fn send(&self, body: Vec<u8>) -> Answer {
        let headers = self.signer.sign(now(), &body);
        web::post(&self.client, &self.url, &headers, body)
            .await
            .unwrap()
    }

    async fn stop(self) {
        self.server.abort();
        self.runtime.shutdown().await;
    }
}

async fn effects_by_payment(t: &TestDb) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for effect in effects(&t.db).await {
        *counts.entry(effect.cart).or_insert(0) += 1;
    }
    counts
}

async fn wait_for_effects(t: &TestDb, n: usize) {
    let done = eventually(Duration::from_secs(90), || async {
        effects(&t.db).await.len() >= n
    })
    .await;
    assert!(
        done,
        "{} of {n} effects after 90 s",
        effects(&t.db).await.len()
    );
}

/// 1,000 deliveries, 30% of them copies of earlier ones, from 16 concurrent senders, and 50
/// concurrent copies of one more message: every answer is a 200, each payment takes effect
/// exactly once, and the inbox holds one DONE row per message.
async fn each_effect_once_through_duplicates_and_concurrent_copies(t: TestDb) {
    let receiver = Receiver::start(&t).await;
    let tag = &t.name;
    let unique = 700;
    let mut deliveries: Vec<usize> = (0..unique).collect();
    deliveries.extend((0..300).map(|i| (i * 7) % unique));
    fastrand::shuffle(&mut deliveries);
    let bodies: Vec<Vec<u8>> = deliveries
        .iter()
        .map(|i| {
            event(
                &format!("evt_{i}"),
                &format!("pay-{tag}-{i}"),
                &format!("cus-{tag}-{}", i % 20),
                100 + *i as i64,
            )
        })
        .collect();
    let answers: Vec<Answer> = futures::stream::iter(bodies)
        .map(|body| receiver.send(body))
        .buffer_unordered(16)
        .collect()
        .await;
    let hot = event("evt_hot", &format!("pay-{tag}-hot"), "cus-hot", 1);
    let copies: Vec<Answer> =
        futures::future::join_all((0..50).map(|_| receiver.send(hot.clone()))).await;

    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for answer in answers.iter().chain(&copies) {
        assert_eq!(answer.status, 200, "{answer:?}");
        *outcomes.entry(answer.outcome()).or_default() += 1;
    }
    assert_eq!(
        outcomes,
        BTreeMap::from([("duplicate".into(), 300 + 49), ("received".into(), 701)])
    );
    wait_for_effects(&t, unique + 1).await;
    // Nothing more comes: give the worker a moment to show a second effect if it would.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let counts = effects_by_payment(&t).await;
    assert_eq!(counts.len(), unique + 1);
    assert!(counts.values().all(|n| *n == 1), "{counts:?}");
    let rows = inbox_rows(&t.db, CONSUMER).await;
    assert_eq!(rows.len(), unique + 1);
    assert!(rows.iter().all(|r| r.status == "DONE"), "{rows:?}");
    assert!(rows.iter().all(|r| r.source.as_deref() == Some(SOURCE)));
    let stats = receiver.runtime.consumer_stats(CONSUMER).unwrap();
    assert_eq!(stats.handled, (unique + 1) as u64);
    receiver.stop().await;
}

/// A handler that keeps failing: RETRY with backoff, DEAD after `max_attempts`, then an
/// operator's replay after the fix handles it once.
async fn a_failing_handler_retries_dies_and_is_replayed(t: TestDb) {
    let receiver = Receiver::start(&t).await;
    let customer = format!("cus-{}-failing", t.name);
    fail_times(&customer, 1_000);
    let answer = receiver
        .send(event("evt_f", &format!("pay-{}-f", t.name), &customer, 5))
        .await;
    assert_eq!(
        (answer.status.as_u16(), answer.outcome()),
        (200, "received".into())
    );
    // The counters move just after the commit that marks the row DEAD: wait for both.
    let dead = eventually(Duration::from_secs(30), || async {
        inbox_rows(&t.db, CONSUMER).await[0].status == "DEAD"
            && receiver.runtime.consumer_stats(CONSUMER).unwrap().dead == 1
    })
    .await;
    let row = inbox_rows(&t.db, CONSUMER).await.remove(0);
    assert!(dead, "{row:?}");
    assert_eq!(row.attempts, 3);
    assert!(
        row.last_error
            .as_deref()
            .unwrap()
            .contains("ledger unavailable"),
        "{row:?}"
    );
    assert!(effects(&t.db).await.is_empty());
    let stats = receiver.runtime.consumer_stats(CONSUMER).unwrap();
    assert_eq!((stats.retried, stats.dead), (2, 1));

    // The operator sees it with the other dead letters, fixes the cause and replays it.
    let letters = admin::dead_letters(&t.db, &Default::default(), Default::default())
        .await
        .unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].message_id, "evt_f");
    fail_times(&customer, 0);
    let report = admin::replay(
        &t.db,
        &Selector::Ids(vec![letters[0].target]),
        &Actor::new("ops").reason("ledger is back"),
    )
    .await
    .unwrap();
    assert_eq!(report.inbox, 1);
    wait_for_effects(&t, 1).await;
    let row = inbox_rows(&t.db, CONSUMER).await.remove(0);
    assert_eq!(row.status, "DONE");
    assert_eq!(effects(&t.db).await.len(), 1);
    receiver.stop().await;
}

/// The two dedup layers: the same business fact under a new message id is recognised (answered
/// `200 duplicate`, recorded and handled once); the same message id from another source is
/// another message; the same id from the same source with other bytes is a conflict kept DEAD.
async fn business_key_and_source_scoped_ids(t: TestDb) {
    let receiver = Receiver::start(&t).await;
    let payment = format!("pay-{}-1", t.name);
    let first = receiver.send(event("evt_a", &payment, "cus-a", 10)).await;
    assert_eq!(first.outcome(), "received");
    let again = receiver.send(event("evt_b", &payment, "cus-a", 10)).await;
    assert_eq!(
        (again.status.as_u16(), again.outcome()),
        (200, "duplicate".into())
    );
    let conflict = receiver.send(event("evt_a", &payment, "cus-a", 99)).await;
    assert_eq!(
        (conflict.status.as_u16(), conflict.outcome()),
        (200, "conflict".into())
    );

    // Another source's `evt_a`, through its own endpoint.
    let other = Webhook::new(
        receiver.runtime.external_inbox(),
        CONSUMER,
        "psp-other",
        HmacSha256::new(SECRET),
    );
    let app = axum::Router::new().route("/hooks/other", outbox::webhook::axum::handler(other));
    let (addr, server) = web::serve(app).await;
    let body = event("evt_a", "x-1", "cus-x", 1);
    let answer = web::post(
        &receiver.client,
        &format!("http://{addr}/hooks/other"),
        &receiver.signer.sign(now(), &body),
        body,
    )
    .await
    .unwrap();
    assert_eq!(answer.outcome(), "received");

    wait_for_effects(&t, 1).await;
    let settled = eventually(Duration::from_secs(20), || async {
        inbox_rows(&t.db, CONSUMER)
            .await
            .iter()
            .all(|r| r.status == "DONE" || r.status == "DEAD")
    })
    .await;
    assert!(settled);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rows = inbox_rows(&t.db, CONSUMER).await;
    let summary: Vec<(String, Option<String>, String)> = rows
        .iter()
        .map(|r| {
            let id = match r.message_id.split_once("#conflict-") {
                Some((id, _)) => format!("{id}#conflict"),
                None => r.message_id.clone(),
            };
            (id, r.source.clone(), r.status.clone())
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("evt_a".into(), Some(SOURCE.into()), "DONE".into()),
            ("evt_a#conflict".into(), Some(SOURCE.into()), "DEAD".into()),
            ("evt_a".into(), Some("psp-other".into()), "DEAD".into()),
        ]
    );
    assert!(
        rows[1]
            .last_error
            .as_deref()
            .unwrap()
            .contains("different payload")
    );
    assert!(
        rows[2]
            .last_error
            .as_deref()
            .unwrap()
            .contains("no handler for external messages from `psp-other`"),
        "{:?}",
        rows[2]
    );
    assert_eq!(effects_by_payment(&t).await, BTreeMap::from([(payment, 1)]));
    server.abort();
    receiver.stop().await;
}

/// Requests that are not what they claim or cannot be read: the right status, a clear body,
/// and nothing stored. A readable body that the handler cannot take is stored and ends DEAD
/// with its bytes.
async fn refused_requests_store_nothing(t: TestDb) {
    let receiver = Receiver::start(&t).await;
    let body = event("evt_r", "pay-r", "cus-r", 1);
    let post = |headers: hyper::HeaderMap, body: Vec<u8>| {
        let client = receiver.client.clone();
        let url = receiver.url.clone();
        async move { web::post(&client, &url, &headers, body).await.unwrap() }
    };

    let forged = HmacSha256::new(b"not-the-secret".to_vec()).sign(now(), &body);
    let answer = post(forged, body.clone()).await;
    assert_eq!(answer.status, 401, "{answer:?}");
    assert!(answer.body.contains("no signature matches"), "{answer:?}");
    assert!(!answer.body.contains("whsec"), "{answer:?}");

    let stale = receiver.signer.sign(now() - 3600, &body);
    let answer = post(stale, body.clone()).await;
    assert_eq!(answer.status, 401);
    assert!(
        answer.body.contains("away from this server's clock"),
        "{answer:?}"
    );

    let answer = post(hyper::HeaderMap::new(), body.clone()).await;
    assert_eq!(answer.status, 401);
    assert!(
        answer.body.contains("`webhook-timestamp` is missing"),
        "{answer:?}"
    );

    let big = event("evt_big", &"p".repeat(5000), "cus", 1);
    let answer = post(receiver.signer.sign(now(), &big), big).await;
    assert_eq!(answer.status, 413, "{answer:?}");
    assert!(answer.body.contains("at most 4096 bytes"), "{answer:?}");

    let text = b"payment_id=pay-r&amount=1".to_vec();
    let answer = post(receiver.signer.sign(now(), &text), text).await;
    assert_eq!(answer.status, 400);
    assert!(answer.body.contains("not JSON"), "{answer:?}");

    let no_id =
        br#"{"type":"payment.succeeded","data":{"payment_id":"p","customer":"c"}}"#.to_vec();
    let answer = post(receiver.signer.sign(now(), &no_id), no_id).await;
    assert_eq!(answer.status, 400);
    assert!(answer.body.contains("no message id"), "{answer:?}");
    assert!(inbox_rows(&t.db, CONSUMER).await.is_empty());

    // JSON the handler's type cannot take (`amount` is text): stored, then DEAD with its bytes.
    let odd = br#"{"id":"evt_odd","type":"payment.succeeded","data":{"payment_id":"pay-odd","customer":"c","amount":"ten"}}"#.to_vec();
    let answer = receiver.send(odd.clone()).await;
    assert_eq!(answer.outcome(), "received");
    let dead = eventually(Duration::from_secs(20), || async {
        inbox_rows(&t.db, CONSUMER).await[0].status == "DEAD"
    })
    .await;
    let row = inbox_rows(&t.db, CONSUMER).await.remove(0);
    assert!(dead, "{row:?}");
    assert_eq!(row.payload, odd);
    assert!(
        row.last_error
            .as_deref()
            .unwrap()
            .contains("does not match"),
        "{row:?}"
    );
    assert!(effects(&t.db).await.is_empty());
    receiver.stop().await;
}

/// Messages with the same ordering key are handled in arrival order: the first fails once and
/// the two behind it wait for its retry; another customer's message does not wait. Only the
/// headers asked for are kept, never the signature's, and handlers see them.
async fn ordering_key_and_kept_headers(t: TestDb) {
    let receiver = Receiver::start_with(&t, |inbox| {
        webhook(inbox)
            .keep_header(hyper::header::HeaderName::from_static("x-request-id"))
            .keep_header(hyper::header::HeaderName::from_static("webhook-signature"))
            .keep_header(hyper::header::AUTHORIZATION)
    })
    .await;
    let customer = format!("cus-{}-ordered", t.name);
    fail_times(&customer, 1);
    for n in 1..=3 {
        let body = event(
            &format!("evt_o{n}"),
            &format!("pay-{}-o{n}", t.name),
            &customer,
            n,
        );
        let mut headers = receiver.signer.sign(now(), &body);
        headers.insert("x-request-id", format!("req-{n}").parse().unwrap());
        headers.insert("authorization", "Bearer do-not-keep".parse().unwrap());
        let answer = web::post(&receiver.client, &receiver.url, &headers, body)
            .await
            .unwrap();
        assert_eq!(answer.outcome(), "received");
    }
    let other = receiver
        .send(event("evt_p", &format!("pay-{}-p", t.name), "cus-other", 9))
        .await;
    assert_eq!(other.outcome(), "received");
    wait_for_effects(&t, 4).await;
    let order: Vec<i64> = effects(&t.db)
        .await
        .iter()
        .filter(|e| e.event_id.starts_with("evt_o"))
        .map(|e| e.seq)
        .collect();
    assert_eq!(order, [1, 2, 3], "one customer's payments in arrival order");
    let row = inbox_rows(&t.db, CONSUMER).await.remove(0);
    assert_eq!((row.message_id.as_str(), row.attempts), ("evt_o1", 2));
    let headers =
        t.db.query_one_raw(sea_orm::Statement::from_string(
            t.db.get_database_backend(),
            format!(
                "SELECT headers FROM {} WHERE message_id = 'evt_o2'",
                inbox_source(t.db.get_database_backend())
            ),
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get::<String>("", "headers")
        .unwrap();
    let headers: BTreeMap<String, String> = serde_json::from_str(&headers).unwrap();
    assert_eq!(
        headers,
        BTreeMap::from([
            ("content-type".to_owned(), "application/json".to_owned()),
            ("x-request-id".to_owned(), "req-2".to_owned()),
        ])
    );
    receiver.stop().await;
}

/// `receive_in` records in the caller's transaction: nothing if it rolls back, the message if
/// it commits; a copy in a later transaction is a duplicate.
async fn receive_in_the_callers_transaction(t: TestDb) {
    use outbox::inbox::{IncomingMessage, Receipt};
    use sea_orm::TransactionTrait;
    let inbox = ExternalInbox::new(t.db.clone());
    let message = IncomingMessage::new(
        CONSUMER,
        SOURCE,
        "evt_tx",
        "payment.succeeded",
        b"{}".to_vec(),
    )
    .business_key("pay-tx");
    let txn = t.db.begin().await.unwrap();
    assert_eq!(
        inbox.receive_in(&txn, &message).await.unwrap(),
        Receipt::New
    );
    txn.rollback().await.unwrap();
    assert!(inbox_rows(&t.db, CONSUMER).await.is_empty());

    let txn = t.db.begin().await.unwrap();
    assert_eq!(
        inbox.receive_in(&txn, &message).await.unwrap(),
        Receipt::New
    );
    txn.commit().await.unwrap();
    let txn = t.db.begin().await.unwrap();
    assert!(matches!(
        inbox.receive_in(&txn, &message).await.unwrap(),
        Receipt::Duplicate { .. }
    ));
    let other_id = IncomingMessage {
        message_id: "evt_tx2".into(),
        ..message.clone()
    };
    assert_eq!(
        inbox.receive_in(&txn, &other_id).await.unwrap(),
        Receipt::SameBusinessFact {
            source: SOURCE.into(),
            message_id: "evt_tx".into(),
            status: "PENDING".into()
        }
    );
    txn.commit().await.unwrap();
    let rows = inbox_rows(&t.db, CONSUMER).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].message_id.as_str(), rows[0].status.as_str()),
        ("evt_tx", "PENDING")
    );
    // Bad input is refused before anything is written.
    let long = IncomingMessage {
        message_id: "x".repeat(256),
        ..message
    };
    let error = inbox.receive(&long).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("`message_id` is 256 characters long"),
        "{error}"
    );
}

backend_tests! {
    ordering => ordering_key_and_kept_headers;
    receive_in => receive_in_the_callers_transaction;
    effects_once => each_effect_once_through_duplicates_and_concurrent_copies;
    retry_dead_replay => a_failing_handler_retries_dies_and_is_replayed;
    dedup_layers => business_key_and_source_scoped_ids;
    refused => refused_requests_store_nothing;
}

/// The database goes away under the receiver: requests are answered `503` with `Retry-After`
/// (never a 200, never a 500) within the webhook's database timeout, nothing is stored, and
/// once it is back the sender's retry is recorded and handled once.
async fn database_down_answers_503_and_loses_nothing(t: TestDb) {
    let customer = format!("cus-{}-down", t.name);
    let body = event("evt_down", &format!("pay-{}-down", t.name), &customer, 7);
    enum Outage {
        /// The server's connections are cut.
        Proxy(web::Proxy),
        /// Another connection holds the file's write lock, as another process can.
        Lock(sea_orm::DatabaseConnection),
    }
    let (receiver_db, outage) = match t.backend {
        Backend::Postgres | Backend::PgBouncer | Backend::MySql => {
            let proxy = web::Proxy::start(web::server_of(&t.url)).await;
            let db = connect(&web::through(&t.url, proxy.addr), 4).await.unwrap();
            proxy.down();
            (db, Outage::Proxy(proxy))
        }
        _ => {
            // One connection, so that the COMMIT ends the transaction the BEGIN started.
            let holder = connect(&t.url, 1).await.unwrap();
            holder.execute_unprepared("BEGIN EXCLUSIVE").await.unwrap();
            (t.connect_again().await, Outage::Lock(holder))
        }
    };
    let receiver = Receiver::start_with(&t, |_| {
        webhook(ExternalInbox::new(receiver_db.clone())).database_timeout(Duration::from_secs(2))
    })
    .await;
    let answer = receiver.send(body.clone()).await;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_eq!(answer.retry_after.as_deref(), Some("5"));
    assert!(answer.body.contains("try again later"), "{answer:?}");

    // Back: the sender retries until it gets its 200.
    // Nothing is stored while the database is away (read past the outage: directly, or by the
    // connection holding the lock).
    let stored = match &outage {
        Outage::Proxy(_) => inbox_rows(&t.db, CONSUMER).await,
        Outage::Lock(holder) => inbox_rows(holder, CONSUMER).await,
    };
    assert!(stored.is_empty(), "nothing stored while down: {stored:?}");
    match &outage {
        Outage::Proxy(proxy) => proxy.up(),
        Outage::Lock(holder) => {
            holder.execute_unprepared("COMMIT").await.unwrap();
        }
    }
    let mut answer = receiver.send(body.clone()).await;
    for _ in 0..20 {
        if answer.status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        answer = receiver.send(body.clone()).await;
    }
    // `received`, or `duplicate` when the statement the 503 gave up waiting for went through
    // once the lock was released: either way the message is in, once.
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        ["received", "duplicate"].contains(&answer.outcome().as_str()),
        "{answer:?}"
    );
    wait_for_effects(&t, 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rows = inbox_rows(&t.db, CONSUMER).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].status, "DONE");
    assert_eq!(effects(&t.db).await.len(), 1);
    receiver.stop().await;
    drop(outage);
}

mod database_down {
    use super::*;

    async fn run(backend: Backend, tag: &str) {
        let test = backend_test_name(module_path!(), tag);
        if let Some(t) = test_db(backend, &test).await {
            database_down_answers_503_and_loses_nothing(t).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        run(Backend::Postgres, "pg").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mysql() {
        run(Backend::MySql, "my").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_file() {
        run(Backend::SqliteFile, "lf").await;
    }
}

/// The test kit records a provider's message in the external inbox as the endpoint does and
/// works it: the handler's effect, and the same message (or the same payment under another id)
/// recognised as a duplicate.
#[cfg(feature = "testing")]
#[tokio::test]
async fn the_kit_receives_a_webhook_message_and_recognises_it_again() {
    use outbox::inbox::{IncomingMessage, Receipt};
    let Some(t) = test_db(Backend::Postgres, "kit_webhook").await else {
        return;
    };
    let payments = outbox::testing::TestConsumer::new(CONSUMER, &t.db).unwrap();
    let message = |id: &str| {
        IncomingMessage::new(
            CONSUMER,
            SOURCE,
            id,
            "payment.succeeded",
            event(id, "pay_kit_1", "cus_kit", 4200),
        )
        .business_key("pay_kit_1")
    };
    let (receipt, outcome) = payments.receive(&message("evt_kit_1")).await.unwrap();
    assert!(receipt.is_new(), "{receipt:?}");
    assert!(outcome.is_done(), "{outcome:?}");
    let (again, _) = payments.receive(&message("evt_kit_1")).await.unwrap();
    assert!(matches!(again, Receipt::Duplicate { .. }), "{again:?}");
    let (same_payment, _) = payments.receive(&message("evt_kit_2")).await.unwrap();
    assert!(!same_payment.is_new(), "{same_payment:?}");
    let effects = effects(&t.db).await;
    assert_eq!(effects.len(), 1, "{effects:?}");
    assert_eq!(
        (effects[0].cart.as_str(), effects[0].seq),
        ("pay_kit_1", 4200)
    );
}
