//! Receiving webhooks: a payment provider's events, stored and committed before the `200`, then
//! handled once each by the inbox's worker. SQLite by default, no other service:
//!
//! ```sh
//! cargo run --example webhooks
//! ```
//!
//! (`DATABASE_URL=postgres://… cargo run --example webhooks --features postgres` runs it on
//! another database.)
//!
//! The receiver is an axum app on a loopback port; the provider's events are JSON signed with
//! HMAC-SHA256 over `"{timestamp}.{body}"`. A built-in sender plays the provider: a burst of
//! payments from 16 concurrent connections, some of them sent twice (a provider retries when
//! it is unsure) and one sent five times at once, one payment reported again under a new event id
//! (the same business fact), one request with a forged signature and one that is not JSON. The
//! ledger "times out" once for some payments (retried with backoff) and refuses one customer for
//! good (DEAD, where an operator sees it and can replay it). At the end the example prints what
//! the sender was answered and what the inbox did.

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use outbox::inbox::InboxConfig;
use outbox::prelude::*;
use outbox::relay::Backoff;
use outbox::sea_orm::{ActiveModelTrait, Database, EntityTrait, PaginatorTrait, Schema, Set};
use outbox::webhook::{Field, HmacSha256, Webhook};
use serde::Deserialize;

/// The billing service's ledger: one row per settled payment.
mod ledger {
    use outbox::sea_orm;
    use outbox::sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "ledger")]
    pub(crate) struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub payment_id: String,
        pub customer: String,
        pub amount_cents: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub(crate) enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// What the provider sends: its own JSON, not one of our events.
#[derive(Debug, Deserialize)]
struct PaymentSucceeded {
    data: Payment,
}

#[derive(Debug, Deserialize)]
struct Payment {
    payment_id: String,
    customer: String,
    amount_cents: i64,
}

/// Ledger time-outs still to happen (the first attempt of every 10th payment).
static LEDGER_TIMEOUTS: AtomicU32 = AtomicU32::new(0);

/// Settle a payment in the ledger, in the inbox transaction: it commits once per payment.
#[inbox_handler(
    consumer = "billing",
    source = "acme-pay",
    message_type = "payment.succeeded",
    max_attempts = 3,
    backoff = "100ms",
    backoff_cap = "500ms"
)]
async fn settle_payment(
    tx: &InboxTransaction,
    message: Event<PaymentSucceeded>,
) -> Result<(), HandlerError> {
    let payment = &message.data;
    if payment.customer == "cus_blocked" {
        return Err(HandlerError::permanent(format!(
            "customer {} is blocked: refund payment {} by hand",
            payment.customer, payment.payment_id
        )));
    }
    if message.meta().attempt == 1
        && payment.payment_id.ends_with('0')
        && LEDGER_TIMEOUTS
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    {
        return Err(HandlerError::retry("ledger timed out"));
    }
    ledger::ActiveModel {
        payment_id: Set(payment.payment_id.clone()),
        customer: Set(payment.customer.clone()),
        amount_cents: Set(payment.amount_cents),
    }
    .insert(tx)
    .await?;
    Ok(())
}

const SECRET: &[u8] = b"whsec_example_only_use_a_real_secret";

fn payment_event(event_id: &str, payment: usize, customer: &str) -> Vec<u8> {
    serde_json::json!({
        "id": event_id,
        "type": "payment.succeeded",
        "data": {
            "payment_id": format!("pay_{payment:04}"),
            "customer": customer,
            "amount_cents": 1_000 + payment,
        }
    })
    .to_string()
    .into_bytes()
}

type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

/// One request of the built-in sender: the answer's status and `status` field.
async fn send(
    client: &Client,
    url: &str,
    signer: &HmacSha256,
    body: Vec<u8>,
) -> Result<(u16, String), Box<dyn std::error::Error + Send + Sync>> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() as i64;
    let mut request = hyper::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.clone())))?;
    request.headers_mut().extend(signer.sign(now, &body));
    let response = client.request(request).await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let outcome = match answer["status"].as_str() {
        Some(outcome) => outcome.to_owned(),
        None => answer["error"].as_str().unwrap_or("").to_owned(),
    };
    Ok((status, outcome))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = match std::env::var("DATABASE_URL") {
        Ok(url) => url,
        Err(_) => {
            let path = std::env::temp_dir().join("outbox-webhooks.db");
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
            format!("sqlite://{}?mode=rwc", path.display())
        }
    };
    let db = Database::connect(&url).await?;
    outbox::migrate(&db).await?;
    let schema = Schema::new(db.get_database_backend());
    db.execute(&schema.create_table_from_entity(ledger::Entity))
        .await?;
    LEDGER_TIMEOUTS.store(5, Ordering::SeqCst);

    // The runtime's worker handles what the webhook records; no relay or broker is needed here.
    let runtime = Runtime::builder(db.clone())
        .expect_consumers(["billing"])
        .without_relay()
        .inbox_config(
            InboxConfig::default()
                .poll_interval(Duration::from_millis(100))
                .backoff(
                    Backoff::default()
                        .base(Duration::from_millis(100))
                        .cap(Duration::from_millis(500))
                        .jitter(0.2),
                ),
        )
        .start()
        .await?;

    // The endpoint: who the messages are for and from, how they are signed, where their id,
    // type, business key and ordering key are.
    let webhook = Webhook::new(
        runtime.external_inbox(),
        "billing",
        "acme-pay",
        HmacSha256::new(SECRET),
    )
    .message_id(Field::json("/id"))
    .message_type(Field::json("/type"))
    .business_key(Field::json("/data/payment_id"))
    .ordering_key(Field::json("/data/customer"));
    let app = axum::Router::new().route(
        "/webhooks/acme-pay",
        outbox::webhook::axum::handler(webhook),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}/webhooks/acme-pay", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    println!("receiving webhooks at {endpoint}");

    // The provider: 200 payments, 40 of them sent twice, one sent five times at once, one paid
    // again under a new event id, a forged signature and a body that is not JSON.
    let client: Client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let signer = HmacSha256::new(SECRET);
    let mut bodies: Vec<Vec<u8>> = (1..=200)
        .map(|n| {
            let customer = if n == 77 {
                "cus_blocked".to_owned()
            } else {
                format!("cus_{}", n % 25)
            };
            payment_event(&format!("evt_{n:04}"), n, &customer)
        })
        .collect();
    let resent: Vec<Vec<u8>> = (1..=40).map(|n| bodies[n * 5 - 1].clone()).collect();
    bodies.extend(resent);
    bodies.push(payment_event("evt_9999", 12, "cus_12"));
    let mut answers: BTreeMap<String, u32> = BTreeMap::new();
    let mut results: Vec<(u16, String)> = futures::stream::iter(bodies)
        .map(|body| send(&client, &endpoint, &signer, body))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let copy = payment_event("evt_0201", 201, "cus_1");
    for answer in
        futures::future::join_all((0..5).map(|_| send(&client, &endpoint, &signer, copy.clone())))
            .await
    {
        results.push(answer?);
    }
    let forged = HmacSha256::new(b"a guess".to_vec());
    results.push(
        send(
            &client,
            &endpoint,
            &forged,
            payment_event("evt_x", 1, "cus_1"),
        )
        .await?,
    );
    results.push(send(&client, &endpoint, &signer, b"amount=10".to_vec()).await?);
    for (status, outcome) in &results {
        let key = match *status {
            200 => format!("200 {outcome}"),
            _ => format!("{status} ({outcome})"),
        };
        *answers.entry(key).or_default() += 1;
    }

    // Wait until the worker has settled everything it received.
    let settled = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let stats = runtime.consumer_stats("billing").unwrap_or_default();
            if stats.handled + stats.dead >= 201 {
                break stats;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await?;

    println!("\nthe sender was answered ({} requests):", results.len());
    for (answer, n) in &answers {
        println!("  {n:>4}  {answer}");
    }
    println!("\nthe inbox (consumer `billing`):");
    println!("  {:>4}  handled", settled.handled);
    println!("  {:>4}  retried (and then handled)", settled.retried);
    println!("  {:>4}  dead, kept for an operator", settled.dead);
    let dead = outbox::admin::dead_letters(&db, &Default::default(), Default::default()).await?;
    for letter in &dead {
        println!(
            "        {} {}: {}",
            letter.target,
            letter.message_id,
            letter.last_error.as_deref().unwrap_or("")
        );
    }
    let settled_payments = ledger::Entity::find().count(&db).await?;
    println!("\nledger: {settled_payments} payments settled, each once");
    assert_eq!(
        settled_payments, 200,
        "every payment but the blocked one, once"
    );

    server.abort();
    runtime.shutdown().await;
    Ok(())
}
