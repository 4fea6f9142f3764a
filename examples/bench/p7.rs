//! P7 webhooks accepted: HTTP 200s per second from 16 concurrent senders, through the SDK's
//! webhook endpoint (signature checked, the body read for its id, type and business key, the row
//! recorded under its two unique keys and committed before the answer), against a bare axum
//! handler that inserts one row per request with one bound statement, in the same run. Both
//! servers run in this process on loopback, the senders too; the senders sign every request the
//! same way for both. Acceptance only: handling is P4's.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use axum::{body::Bytes, extract::State, http::StatusCode, routing::post};
use http_body_util::Full;
use outbox::inbox::ExternalInbox;
use outbox::sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use outbox::webhook::{Field, HmacSha256, Webhook};

use crate::report::{Measure, Spec, Target, m, spec};
use crate::support::{BoxError, Ctx, next_ids, scalar_i64};

const SENDERS: usize = 16;
const SECRET: &[u8] = b"bench-webhook-secret";
const CONSUMER: &str = "bench-p7";

type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

pub(crate) async fn run(ctx: &Ctx) -> Result<Vec<Measure>, BoxError> {
    ctx.db
        .execute_unprepared(
            "CREATE TABLE IF NOT EXISTS bench_webhook (id BIGSERIAL PRIMARY KEY, \
             message_id TEXT NOT NULL, payload BYTEA NOT NULL, \
             received_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        )
        .await?;
    ctx.reset().await?;
    ctx.db.execute_unprepared("TRUNCATE bench_webhook").await?;
    let window = ctx.sizes.p2_window;

    // The baseline: one INSERT per request, answered 200.
    let bare = axum::Router::new()
        .route("/hook", post(bare_insert))
        .with_state(ctx.db.clone());
    let raw = load(bare, window).await?;
    let rows = scalar_i64(&ctx.db, "SELECT count(*) FROM bench_webhook").await? as u64;
    if rows != raw.accepted {
        return Err(format!("P7 bare: {rows} rows for {} 200s", raw.accepted).into());
    }

    // The same handler writing the row the SDK writes (its two unique keys and the worker's
    // indexes), by hand: what the table costs apart from the SDK's code.
    let bare_inbox = axum::Router::new()
        .route("/hook", post(bare_inbox_row))
        .with_state(ctx.db.clone());
    let raw_inbox_row = load(bare_inbox, window).await?;
    ctx.db
        .execute_unprepared("TRUNCATE inbox_event, inbox_done, inbox_key")
        .await?;

    let inbox = ExternalInbox::new(ctx.db.clone());
    let signed = Webhook::new(
        inbox.clone(),
        CONSUMER,
        "bench-psp",
        HmacSha256::new(SECRET),
    )
    .business_key(Field::json("/data/payment_id"));
    let sdk = load(sdk_router(signed), window).await?;
    let unsigned = Webhook::unsigned(inbox, CONSUMER, "bench-psp-2")
        .business_key(Field::json("/data/payment_id"));
    let sdk_unsigned = load(sdk_router(unsigned), window).await?;
    let stored = scalar_i64(
        &ctx.db,
        "SELECT count(*) FROM inbox_event WHERE consumer = 'bench-p7' AND status = 'PENDING'",
    )
    .await? as u64;
    if stored != sdk.accepted + sdk_unsigned.accepted {
        return Err(format!(
            "P7 SDK: {stored} rows for {} 200s",
            sdk.accepted + sdk_unsigned.accepted
        )
        .into());
    }
    ctx.reset().await?;
    ctx.db.execute_unprepared("TRUNCATE bench_webhook").await?;
    Ok(vec![
        m("p7.raw", raw.per_sec(), "req/s"),
        m("p7.raw_inbox_row", raw_inbox_row.per_sec(), "req/s"),
        m("p7.sdk", sdk.per_sec(), "req/s"),
        m("p7.sdk_unsigned", sdk_unsigned.per_sec(), "req/s"),
    ])
}

pub(crate) fn specs() -> Vec<Spec> {
    vec![
        spec("P7", "bare axum insert handler, 16 senders", "p7.raw"),
        spec(
            "P7",
            "SDK webhook accepted (HMAC checked), 16 senders",
            "p7.sdk",
        )
        .against("bare axum insert handler, 16 senders", "p7.raw")
        .target(Target::RatioAtLeast(0.8)),
        spec("P7", "SDK webhook accepted, unsigned", "p7.sdk_unsigned")
            .against("bare axum insert handler, 16 senders", "p7.raw"),
        spec(
            "P7",
            "bare handler writing the SDK's inbox row",
            "p7.raw_inbox_row",
        )
        .against("bare axum insert handler, 16 senders", "p7.raw"),
        spec(
            "P7",
            "SDK webhook accepted (vs the same row by hand)",
            "p7.sdk",
        )
        .against(
            "bare handler writing the SDK's inbox row",
            "p7.raw_inbox_row",
        ),
    ]
}

fn sdk_router(webhook: Webhook) -> axum::Router {
    axum::Router::new().route("/hook", outbox::webhook::axum::handler(webhook))
}

/// The baseline handler: the body stored with one bound INSERT.
async fn bare_insert(State(db): State<DatabaseConnection>, body: Bytes) -> StatusCode {
    let message_id = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["id"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let insert = Statement::from_sql_and_values(
        DbBackend::Postgres,
        "INSERT INTO bench_webhook (message_id, payload) VALUES ($1, $2)",
        [message_id.into(), body.to_vec().into()],
    );
    match db.execute_raw(insert).await {
        Ok(_) => StatusCode::OK,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The row the SDK records, written by hand with one bound statement: its id and type read from
/// the body, the business key too.
async fn bare_inbox_row(State(db): State<DatabaseConnection>, body: Bytes) -> StatusCode {
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let text = |pointer: &str| {
        json.pointer(pointer)
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_owned()
    };
    let insert = Statement::from_sql_and_values(
        DbBackend::Postgres,
        "INSERT INTO inbox_event (consumer, message_id, origin, biz_key, event_type, source, \
         payload, status, attempts, received_at) \
         VALUES ($1, $2, $3, $4, $5, $3, $6, 'PENDING', 0, now()) ON CONFLICT DO NOTHING",
        [
            "bench-p7-raw".into(),
            text("/id").into(),
            "bench-psp".into(),
            text("/data/payment_id").into(),
            text("/type").into(),
            body.to_vec().into(),
        ],
    );
    match db.execute_raw(insert).await {
        Ok(_) => StatusCode::OK,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

struct Accepted {
    accepted: u64,
    elapsed: Duration,
}

impl Accepted {
    fn per_sec(&self) -> f64 {
        self.accepted as f64 / self.elapsed.as_secs_f64()
    }
}

/// Serve `app` and send it signed payment events from 16 senders for `window`; count the 200s.
async fn load(app: axum::Router, window: Duration) -> Result<Accepted, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/hook", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let client: Client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let signer = Arc::new(HmacSha256::new(SECRET));
    let stop = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut senders = Vec::new();
    for _ in 0..SENDERS {
        let (client, url, signer, stop, accepted) = (
            client.clone(),
            url.clone(),
            signer.clone(),
            stop.clone(),
            accepted.clone(),
        );
        senders.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let id = next_ids(1);
                let body = serde_json::json!({
                    "id": format!("evt_{id}"),
                    "type": "payment.succeeded",
                    "data": { "payment_id": format!("pay_{id}"), "amount_cents": 4_599 }
                })
                .to_string()
                .into_bytes();
                let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() as i64;
                let mut request = hyper::Request::post(&url)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body.clone())))?;
                request.headers_mut().extend(signer.sign(now, &body));
                let response = client.request(request).await?;
                if response.status() != StatusCode::OK {
                    return Err(format!("answered {}", response.status()).into());
                }
                accepted.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, BoxError>(())
        }));
    }
    tokio::time::sleep(window).await;
    stop.store(true, Ordering::Relaxed);
    for sender in senders {
        sender.await??;
    }
    let elapsed = started.elapsed();
    server.abort();
    Ok(Accepted {
        accepted: accepted.load(Ordering::Relaxed),
        elapsed,
    })
}
