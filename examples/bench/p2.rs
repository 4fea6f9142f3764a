//! P2 relay throughput PostgreSQL → JetStream, confirmed: pre-enqueued events drained by 1, 2
//! and 4 relays, against a raw claim+mark SQL loop without publishing and raw pipelined
//! publishing; and what a running relay costs 16 producing clients.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use outbox::prelude::*;
use outbox::relay::{Relay, RelayConfig};
use outbox::sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, QueryResult, Statement, TransactionTrait, Value,
};
use outbox::transport::nats::async_nats;

use crate::report::{Measure, Spec, Target, m, spec};
use crate::support::{self, BoxError, Ctx, closed_loop, execute_bound, pre_enqueue, wait_drained};

pub(crate) const RELAYS: [usize; 3] = [1, 2, 4];
const RAW_WORKERS: [usize; 2] = [1, 4];
/// Aggregates the backlog is spread over.
const AGGREGATES: u64 = 10_000;
const BATCH: usize = 500;
const IN_FLIGHT: usize = 512;

pub(crate) async fn run(ctx: &Ctx) -> Result<Vec<Measure>, BoxError> {
    let n = ctx.sizes.p2_events;
    let mut out = Vec::new();

    for workers in RAW_WORKERS {
        ctx.reset().await?;
        pre_enqueue(&ctx.db, n, AGGREGATES, "PENDING").await?;
        let t = Instant::now();
        let claimed = raw_claim_mark(&ctx.db, workers).await?;
        let elapsed = t.elapsed();
        if claimed != n {
            return Err(format!("raw claim+mark saw {claimed} of {n} rows").into());
        }
        out.push(m(
            format!("p2.raw_claim_mark.w{workers}"),
            n as f64 / elapsed.as_secs_f64(),
            "ev/s",
        ));
    }

    let rate = raw_publish(ctx, n).await?;
    out.push(m("p2.raw_publish", rate, "msg/s"));

    // The hand-written relay draining the same backlog: claim, publish, mark.
    ctx.reset().await?;
    pre_enqueue(&ctx.db, n, AGGREGATES, "PENDING").await?;
    let transport = ctx.transport("bench_p2rawrelay").await?;
    let t = Instant::now();
    let published = raw_relay(
        ctx.db.clone(),
        async_nats::jetstream::new(ctx.nats.clone()),
        transport.subject("bench.order_placed"),
        Arc::new(AtomicBool::new(true)),
    )
    .await?;
    let elapsed = t.elapsed();
    let stored = stream_len(ctx, transport.stream_name()).await?;
    ctx.drop_stream(&transport).await;
    if published != n || stored != n {
        return Err(format!(
            "the hand-written relay published {published} of {n} (stream holds {stored})"
        )
        .into());
    }
    out.push(m("p2.raw_relay", n as f64 / elapsed.as_secs_f64(), "ev/s"));

    #[cfg(feature = "postgres-wal")]
    if support::wal_available(ctx).await? {
        out.push(m("p2.wal_relay", wal_drain(ctx).await?, "ev/s"));
        out.push(m(
            "p2.producers_beside_wal_relay",
            producers_beside_wal_relay(ctx).await?,
            "tx/s",
        ));
    }

    for relays in RELAYS {
        let rate = sdk_relays(ctx, relays, true).await?;
        out.push(m(format!("p2.relay.r{relays}"), rate, "ev/s"));
    }
    // What per-aggregate order costs one relay: the same drain with ordering off.
    let rate = sdk_relays(ctx, 1, false).await?;
    out.push(m("p2.relay_unordered.r1", rate, "ev/s"));

    out.extend(producers_beside_relay(ctx).await?);
    #[cfg(feature = "kafka")]
    out.extend(crate::kafka::p2(ctx).await?);
    Ok(out)
}

/// The WAL relay draining a backlog committed after its slot was created (so that the backlog
/// is in the WAL): events/s, from the relay's start to the last event confirmed and marked.
#[cfg(feature = "postgres-wal")]
async fn wal_drain(ctx: &Ctx) -> Result<f64, BoxError> {
    let n = ctx.sizes.p2_events;
    let limit = Duration::from_secs(600);
    ctx.reset().await?;
    let _ = support::drop_wal_slot(ctx).await;
    let config = support::wal_config(ctx);
    outbox::store::wal::ensure_publication(&ctx.db, config.publication_name()).await?;
    outbox::store::wal::create_slot(&ctx.db, config.slot_name()).await?;
    pre_enqueue(&ctx.db, n, AGGREGATES, "PENDING").await?;
    let transport = Arc::new(ctx.transport("bench_p2wal").await?);
    let relay = Relay::new(ctx.db.clone(), transport.clone())
        .with_config(RelayConfig::default().batch_size(BATCH).listen(false))
        .with_wal(config);
    let (elapsed, stats) = support::relay_until(relay, n, limit).await?;
    let published = stats.sent;
    let stored = stream_len(ctx, transport.stream_name()).await?;
    ctx.drop_stream(&transport).await;
    support::drop_wal_slot(ctx).await?;
    let unsent = support::scalar_i64(
        &ctx.db,
        "SELECT count(*) FROM outbox_event WHERE status <> 'SENT'",
    )
    .await?;
    if published != n || stored != n || unsent != 0 {
        return Err(format!(
            "the WAL relay published {published} of {n} (stream holds {stored}, {unsent} unsent)"
        )
        .into());
    }
    Ok(n as f64 / elapsed.as_secs_f64())
}

/// The 16 producers of [`producers_beside_relay`] beside a WAL relay: transactions/s.
#[cfg(feature = "postgres-wal")]
async fn producers_beside_wal_relay(ctx: &Ctx) -> Result<f64, BoxError> {
    const CLIENTS: usize = 16;
    let outbox = Outbox::new("bench-p2");
    ctx.reset().await?;
    let _ = support::drop_wal_slot(ctx).await;
    let transport = Arc::new(ctx.transport("bench_p2prodwal").await?);
    let relay = Relay::new(ctx.db.clone(), transport.clone())
        .with_config(RelayConfig::default().listen(false))
        .with_wal(support::wal_config(ctx))
        .spawn();
    support::wait_streaming(ctx).await?;
    let beside = closed_loop(
        CLIENTS,
        ctx.sizes.p2_window,
        order_producer(ctx.db.clone(), outbox),
    )
    .await?;
    wait_drained(&ctx.db, Instant::now(), Duration::from_secs(120)).await?;
    let published = relay.shutdown().await?.sent;
    ctx.drop_stream(&transport).await;
    support::drop_wal_slot(ctx).await?;
    let committed = support::scalar_i64(
        &ctx.db,
        "SELECT (SELECT count(*) FROM outbox_event) + (SELECT count(*) FROM outbox_sent)",
    )
    .await?;
    if published < committed as u64 {
        return Err(format!("the WAL relay published {published} of {committed} events").into());
    }
    Ok(beside.per_sec())
}

/// `relays` SDK relays draining the pre-enqueued backlog to JetStream, confirmed: events/s.
async fn sdk_relays(ctx: &Ctx, relays: usize, ordering: bool) -> Result<f64, BoxError> {
    let n = ctx.sizes.p2_events;
    let limit = Duration::from_secs(600);
    ctx.reset().await?;
    pre_enqueue(&ctx.db, n, AGGREGATES, "PENDING").await?;
    let transport = Arc::new(ctx.transport("bench_p2").await?);
    let t = Instant::now();
    let handles: Vec<_> = (0..relays)
        .map(|_| {
            Relay::new(ctx.db.clone(), transport.clone())
                .with_config(
                    RelayConfig::default()
                        .batch_size(BATCH)
                        .listen(false)
                        .ordering(ordering),
                )
                .spawn()
        })
        .collect();
    // Counted from the relays' own statistics: polling the table would load the database
    // being measured.
    loop {
        let sent: u64 = handles.iter().map(|h| h.stats().sent).sum();
        if sent >= n {
            break;
        }
        if t.elapsed() > limit {
            return Err(format!("{relays} relay(s) sent {sent} of {n} in {limit:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = t.elapsed();
    wait_drained(&ctx.db, Instant::now(), Duration::from_secs(30)).await?;
    let mut published = 0;
    for handle in handles {
        published += handle.shutdown().await?.sent;
    }
    let stream_messages = stream_len(ctx, transport.stream_name()).await?;
    ctx.drop_stream(&transport).await;
    if published < n || stream_messages != n {
        return Err(format!(
            "{relays} relay(s) published {published} (stream holds {stream_messages}) of {n}"
        )
        .into());
    }
    Ok(n as f64 / elapsed.as_secs_f64())
}

/// Claim 500 PENDING rows (`SKIP LOCKED`), then mark them SENT, each in its own transaction
/// without waiting for the WAL flush, until none is left: the database's share of a relay.
async fn raw_claim_mark(db: &DatabaseConnection, workers: usize) -> Result<u64, BoxError> {
    let mut tasks = Vec::new();
    for w in 0..workers {
        let db = db.clone();
        tasks.push(tokio::spawn(async move {
            let mut claimed = 0u64;
            loop {
                let tx = db.begin().await?;
                tx.execute_unprepared("SET LOCAL synchronous_commit = off").await?;
                let token = uuid::Uuid::new_v4();
                let rows = tx
                    .query_all_raw(Statement::from_sql_and_values(
                        DbBackend::Postgres,
                        format!(
                            "UPDATE outbox_event o SET status = 'PROCESSING', locked_by = 'raw-{w}', \
                             locked_until = now() + interval '30 seconds', claim_token = $1 \
                             FROM (SELECT id FROM outbox_event WHERE status <> 'SENT' AND status = 'PENDING' \
                             ORDER BY id LIMIT {BATCH} FOR UPDATE SKIP LOCKED) c WHERE o.id = c.id \
                             RETURNING o.id, o.event_id, o.event_type, o.aggregate_id, o.payload"
                        ),
                        [token.into()],
                    ))
                    .await?;
                tx.commit().await?;
                if rows.is_empty() {
                    return Ok::<_, BoxError>(claimed);
                }
                let ids: Vec<i64> = rows
                    .iter()
                    .map(|r| r.try_get::<i64>("", "id"))
                    .collect::<Result<_, _>>()?;
                claimed += ids.len() as u64;
                let tx = db.begin().await?;
                tx.execute_unprepared("SET LOCAL synchronous_commit = off").await?;
                let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
                tx.execute_raw(Statement::from_sql_and_values(
                    DbBackend::Postgres,
                    format!(
                        "UPDATE outbox_event SET status = 'SENT', sent_at = now(), locked_by = NULL, \
                         locked_until = NULL WHERE id IN ({list}) AND claim_token = $1"
                    ),
                    [Value::from(token)],
                ))
                .await?;
                tx.commit().await?;
            }
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    Ok(total)
}

/// Publish `n` envelopes of the bench event to JetStream with a message id each, `IN_FLIGHT`
/// awaiting their acks at once: what the broker takes.
async fn raw_publish(ctx: &Ctx, n: u64) -> Result<f64, BoxError> {
    let transport = ctx.transport("bench_p2raw").await?;
    let subject = transport.subject("bench.order_placed");
    let jetstream = async_nats::jetstream::new(ctx.nats.clone());
    let body = Bytes::from(serde_json::to_vec(&serde_json::json!({
        "specversion": "1.0", "id": uuid::Uuid::now_v7().to_string(), "type": "bench.order_placed",
        "source": "bench", "subject": "customer-1", "time": chrono::Utc::now().to_rfc3339(),
        "datacontenttype": "application/json",
        "data": crate::support::OrderPlaced::sample(1, 1),
    }))?);
    let t = Instant::now();
    let mut pending = std::collections::VecDeque::with_capacity(IN_FLIGHT);
    for i in 0..n {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("raw-{i}").as_str());
        let ack = jetstream
            .publish_with_headers(subject.clone(), headers, body.clone())
            .await?;
        pending.push_back(ack);
        if pending.len() >= IN_FLIGHT
            && let Some(ack) = pending.pop_front()
        {
            ack.await?;
        }
    }
    for ack in pending {
        ack.await?;
    }
    let rate = n as f64 / t.elapsed().as_secs_f64();
    let stored = stream_len(ctx, transport.stream_name()).await?;
    ctx.drop_stream(&transport).await;
    if stored != n {
        return Err(format!("raw publish: the stream holds {stored} of {n}").into());
    }
    Ok(rate)
}

pub(crate) async fn stream_len(ctx: &Ctx, stream: &str) -> Result<u64, BoxError> {
    let jetstream = async_nats::jetstream::new(ctx.nats.clone());
    let mut stream = jetstream.get_stream(stream).await?;
    Ok(stream.info().await?.state.messages)
}

/// A producing client of P2: each call commits one order with its event through `outbox`.
fn order_producer(
    db: DatabaseConnection,
    outbox: Outbox,
) -> impl Fn(i64) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), BoxError>> + Send>>
+ Clone
+ Send
+ Sync
+ 'static {
    move |id: i64| {
        let db = db.clone();
        let outbox = outbox.clone();
        Box::pin(async move {
            let event = crate::support::OrderPlaced::sample(id, 1_000);
            crate::support::place_order(&db, &outbox, &event).await?;
            Ok::<_, BoxError>(())
        })
    }
}

/// 16 clients committing an order with its event, alone and then beside a running relay that
/// publishes what they commit (woken by the cross-process wake-up).
async fn producers_beside_relay(ctx: &Ctx) -> Result<Vec<Measure>, BoxError> {
    const CLIENTS: usize = 16;
    let outbox = Outbox::new("bench-p2");
    ctx.reset().await?;
    let alone = closed_loop(
        CLIENTS,
        ctx.sizes.p2_window,
        order_producer(ctx.db.clone(), outbox.clone()),
    )
    .await?;

    ctx.reset().await?;
    let transport = Arc::new(ctx.transport("bench_p2prod").await?);
    let relay = Relay::new(ctx.db.clone(), transport.clone())
        .with_outbox(&outbox)
        .spawn();
    let beside = closed_loop(
        CLIENTS,
        ctx.sizes.p2_window,
        order_producer(ctx.db.clone(), outbox.clone()),
    )
    .await?;
    wait_drained(&ctx.db, Instant::now(), Duration::from_secs(120)).await?;
    let published = relay.shutdown().await?.sent;
    ctx.drop_stream(&transport).await;
    let committed = support::scalar_i64(
        &ctx.db,
        "SELECT (SELECT count(*) FROM outbox_event) + (SELECT count(*) FROM outbox_sent)",
    )
    .await?;
    if published < committed as u64 {
        return Err(format!("the relay published {published} of {committed} events").into());
    }

    // The same producers beside the hand-written relay: what relaying costs them at all.
    ctx.reset().await?;
    let transport = ctx.transport("bench_p2prodraw").await?;
    let stop = Arc::new(AtomicBool::new(false));
    let raw = tokio::spawn(raw_relay(
        ctx.db.clone(),
        async_nats::jetstream::new(ctx.nats.clone()),
        transport.subject("bench.order_placed"),
        stop.clone(),
    ));
    let beside_raw = closed_loop(
        CLIENTS,
        ctx.sizes.p2_window,
        order_producer(ctx.db.clone(), outbox.clone()),
    )
    .await?;
    wait_drained(&ctx.db, Instant::now(), Duration::from_secs(120)).await?;
    stop.store(true, Ordering::Relaxed);
    let published = raw.await??;
    let stored = stream_len(ctx, transport.stream_name()).await?;
    ctx.drop_stream(&transport).await;
    let committed = support::scalar_i64(
        &ctx.db,
        "SELECT (SELECT count(*) FROM outbox_event) + (SELECT count(*) FROM outbox_sent)",
    )
    .await?;
    if published != committed as u64 || stored != published {
        return Err(format!(
            "the hand-written relay published {published} of {committed} events (stream holds {stored})"
        )
        .into());
    }
    Ok(vec![
        m("p2.producers_alone", alone.per_sec(), "tx/s"),
        m("p2.producers_beside_relay", beside.per_sec(), "tx/s"),
        m(
            "p2.producers_beside_raw_relay",
            beside_raw.per_sec(),
            "tx/s",
        ),
    ])
}

/// A minimal hand-written relay: claim up to 500 unsent rows with `SKIP LOCKED` and mark them
/// SENT once JetStream acknowledged them (message ids set, acks awaited `IN_FLIGHT` at a time),
/// each step in its own transaction without waiting for the WAL flush; when nothing is left,
/// look again 1 ms later. No ordering, no retries, no leases taken over. Returns how many it
/// published once `stop` is set and the table is drained.
pub(crate) async fn raw_relay(
    db: DatabaseConnection,
    jetstream: async_nats::jetstream::Context,
    subject: String,
    stop: Arc<AtomicBool>,
) -> Result<u64, BoxError> {
    let mut published = 0u64;
    loop {
        let rows = raw_claim(&db).await?;
        if rows.is_empty() {
            if stop.load(Ordering::Relaxed) {
                return Ok(published);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        let mut ids = Vec::with_capacity(rows.len());
        let mut pending = std::collections::VecDeque::with_capacity(IN_FLIGHT);
        for row in &rows {
            ids.push(row.try_get::<i64>("", "id")?);
            let event_id: uuid::Uuid = row.try_get("", "event_id")?;
            let payload: String = row.try_get("", "payload")?;
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", event_id.to_string().as_str());
            pending.push_back(
                jetstream
                    .publish_with_headers(subject.clone(), headers, payload.into())
                    .await?,
            );
            if pending.len() >= IN_FLIGHT
                && let Some(ack) = pending.pop_front()
            {
                ack.await?;
            }
        }
        for ack in pending {
            ack.await?;
        }
        published += ids.len() as u64;
        raw_mark_sent(&db, ids).await?;
    }
}

/// The hand-written relays' claim: up to 500 PENDING rows, oldest first, `SKIP LOCKED`, set
/// PROCESSING in a transaction of their own without waiting for the WAL flush. Each row has
/// `id`, `event_id`, `aggregate_id` and `payload` (as text).
pub(crate) async fn raw_claim(db: &DatabaseConnection) -> Result<Vec<QueryResult>, BoxError> {
    let tx = db.begin().await?;
    tx.execute_unprepared("SET LOCAL synchronous_commit = off")
        .await?;
    let rows = tx
        .query_all_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "UPDATE outbox_event o SET status = 'PROCESSING' \
             FROM (SELECT id FROM outbox_event WHERE status <> 'SENT' AND status = 'PENDING' \
             ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) c WHERE o.id = c.id \
             RETURNING o.id, o.event_id, o.aggregate_id, o.payload::text AS payload",
            [(BATCH as i64).into()],
        ))
        .await?;
    tx.commit().await?;
    Ok(rows)
}

/// The hand-written relays' mark: `ids` SENT, in a transaction of its own without waiting for
/// the WAL flush.
pub(crate) async fn raw_mark_sent(db: &DatabaseConnection, ids: Vec<i64>) -> Result<(), BoxError> {
    let tx = db.begin().await?;
    tx.execute_unprepared("SET LOCAL synchronous_commit = off")
        .await?;
    execute_bound(
        &tx,
        "UPDATE outbox_event SET status = 'SENT', sent_at = now() WHERE id = ANY($1)",
        [ids.into()],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

pub(crate) fn specs(_ctx: &Ctx) -> Vec<Spec> {
    let mut specs = vec![
        spec("P2", "raw claim+mark, 1 worker", "p2.raw_claim_mark.w1"),
        spec("P2", "raw claim+mark, 4 workers", "p2.raw_claim_mark.w4"),
        spec("P2", "raw pipelined publish", "p2.raw_publish"),
        spec(
            "P2",
            "hand-written relay (claim, publish, mark)",
            "p2.raw_relay",
        ),
    ];
    for relays in RELAYS {
        let s = if relays == 1 { "" } else { "s" };
        specs.push(
            spec(
                "P2",
                format!("SDK {relays} relay{s} → JetStream"),
                format!("p2.relay.r{relays}"),
            )
            .against("raw claim+mark, 1 worker", "p2.raw_claim_mark.w1")
            .target(Target::RatioAtLeast(0.75)),
        );
        specs.push(
            spec(
                "P2",
                format!("SDK {relays} relay{s} (vs hand-written relay)"),
                format!("p2.relay.r{relays}"),
            )
            .against("hand-written relay (claim, publish, mark)", "p2.raw_relay"),
        );
        specs.push(
            spec(
                "P2",
                format!("SDK {relays} relay{s} (vs publish)"),
                format!("p2.relay.r{relays}"),
            )
            .against("raw pipelined publish", "p2.raw_publish"),
        );
    }
    specs.push(
        spec("P2", "SDK 1 relay, ordering off", "p2.relay_unordered.r1")
            .against("raw claim+mark, 1 worker", "p2.raw_claim_mark.w1"),
    );
    specs.push(
        spec(
            "P2",
            "SDK 1 relay, ordering off (vs hand-written relay)",
            "p2.relay_unordered.r1",
        )
        .against("hand-written relay (claim, publish, mark)", "p2.raw_relay"),
    );
    specs.push(
        spec("P2", "SDK 1 relay (vs sqlxmq drain)", "p2.relay.r1")
            .against("sqlxmq drain", "p6.sqlxmq.drain")
            .target(Target::RatioAtLeast(10.0)),
    );
    specs.push(
        spec("P2", "WAL relay → JetStream", "p2.wal_relay")
            .against("hand-written relay (claim, publish, mark)", "p2.raw_relay")
            .target(Target::RatioAtLeast(1.0)),
    );
    specs.push(
        spec(
            "P2",
            "16 producers beside a WAL relay",
            "p2.producers_beside_wal_relay",
        )
        .against("16 producers, no relay", "p2.producers_alone")
        .target(Target::RatioAtLeast(0.90)),
    );
    specs.push(
        spec(
            "P2",
            "16 producers beside a relay",
            "p2.producers_beside_relay",
        )
        .against("16 producers, no relay", "p2.producers_alone")
        .target(Target::RatioAtLeast(0.85)),
    );
    specs.push(
        spec(
            "P2",
            "16 producers beside a hand-written relay",
            "p2.producers_beside_raw_relay",
        )
        .against("16 producers, no relay", "p2.producers_alone"),
    );
    specs.push(
        spec(
            "P2",
            "16 producers beside a relay (vs hand-written)",
            "p2.producers_beside_relay",
        )
        .against(
            "16 producers beside a hand-written relay",
            "p2.producers_beside_raw_relay",
        ),
    );
    #[cfg(feature = "kafka")]
    specs.extend(crate::kafka::p2_specs());
    specs
}
