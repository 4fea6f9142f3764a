//! P1 producer overhead: the same business transaction (insert an order) alone, with its outbox
//! rows written by hand, and through `OutboxTransaction`, at 1 and 16 concurrent clients.

use std::sync::Arc;

use outbox::prelude::*;
use outbox::sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, Statement, TransactionTrait, Value,
};

use crate::report::{Measure, Spec, Target, m, spec};
use crate::support::{BoxError, Ctx, LoadResult, OrderPlaced, closed_loop, insert_order};

const CLIENTS: [usize; 2] = [1, 16];
const CUSTOMERS: i64 = 1_000;
/// Turns each variant takes within its window.
const SLICES: u32 = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// The order insert alone.
    Alone,
    /// The order insert and `n` outbox rows in one hand-written multi-row INSERT.
    Hand(usize),
    /// The order insert and `n` events through `OutboxTransaction`, cross-process wake-up on.
    Sdk(usize),
    /// As `Sdk`, with the cross-process wake-up off.
    SdkNoWake(usize),
    /// The order insert and the event written only to the WAL (`pg_logical_emit_message`, on a
    /// server with `wal_level = logical`): what a tableless outbox would cost.
    Emit,
}

impl Variant {
    fn key(self) -> String {
        match self {
            Variant::Alone => "alone".into(),
            Variant::Hand(n) => format!("hand{n}"),
            Variant::Sdk(n) => format!("sdk{n}"),
            Variant::SdkNoWake(n) => format!("sdk{n}_nowake"),
            Variant::Emit => "emit1".into(),
        }
    }
}

const VARIANTS: [Variant; 6] = [
    Variant::Alone,
    Variant::Hand(1),
    Variant::Sdk(1),
    Variant::SdkNoWake(1),
    Variant::Hand(10),
    Variant::Sdk(10),
];

pub(crate) async fn run(ctx: &Ctx) -> Result<Vec<Measure>, BoxError> {
    ctx.reset().await?;
    let woken = Outbox::new("bench-p1");
    let silent = Outbox::builder("bench-p1").notify_channel(None).build();
    let mut out = Vec::new();
    let mut variants = VARIANTS.to_vec();
    if crate::support::wal_available(ctx).await? {
        variants.push(Variant::Emit);
    }
    // Variants take turns in short slices, so that a noisy moment on a shared machine falls on
    // all of them rather than on one.
    let slice = ctx.sizes.p1_window / SLICES;
    for clients in CLIENTS {
        let mut totals = vec![(0u64, 0f64, 0u64); variants.len()];
        for _ in 0..SLICES {
            for (i, variant) in variants.iter().copied().enumerate() {
                let db = ctx.db.clone();
                let outbox = match variant {
                    Variant::SdkNoWake(_) => silent.clone(),
                    _ => woken.clone(),
                };
                let shared = Arc::new((db, outbox));
                let result: LoadResult = closed_loop(clients, slice, move |id| {
                    let shared = shared.clone();
                    async move {
                        let (db, outbox) = &*shared;
                        transaction(db, outbox, variant, id).await
                    }
                })
                .await?;
                totals[i].0 += result.ops;
                totals[i].1 += result.elapsed.as_secs_f64();
                totals[i].2 += result.latencies_us.iter().sum::<u64>();
            }
        }
        for (variant, (ops, seconds, latency_us)) in variants.iter().copied().zip(totals) {
            let key = format!("p1.c{clients}.{}", variant.key());
            out.push(m(format!("{key}.tps"), ops as f64 / seconds, "tx/s"));
            out.push(m(
                format!("{key}.mean_ms"),
                latency_us as f64 / ops.max(1) as f64 / 1000.0,
                "ms",
            ));
        }
    }
    check_rows(ctx).await?;
    Ok(out)
}

/// Every committed transaction left its order and exactly its events.
async fn check_rows(ctx: &Ctx) -> Result<(), BoxError> {
    let orders = crate::support::scalar_i64(&ctx.db, "SELECT count(*) FROM bench_order").await?;
    let events = crate::support::scalar_i64(
        &ctx.db,
        "SELECT (SELECT count(*) FROM outbox_event) + (SELECT count(*) FROM outbox_sent)",
    )
    .await?;
    if orders == 0 || events < orders / 2 {
        return Err(format!("P1 wrote {orders} orders but {events} events").into());
    }
    Ok(())
}

/// The outbox rows a hand-rolled outbox writes: the same columns and payload as the SDK's.
async fn insert_by_hand(
    conn: &impl ConnectionTrait,
    event: &OrderPlaced,
    n: usize,
) -> Result<(), BoxError> {
    let payload = serde_json::to_string(event)?;
    let mut sql = String::from(
        "INSERT INTO outbox_event (event_id, source, event_type, schema_version, aggregate_type, \
         aggregate_id, aggregate_version, dedup_key, payload, headers, created_at) VALUES ",
    );
    let mut values: Vec<Value> = Vec::with_capacity(n * 11);
    for i in 0..n {
        let p = i * 11;
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str(&format!(
            "(${}, ${}, ${}, ${}, ${}, ${}, ${}, ${}, CAST(${} AS jsonb), CAST(${} AS jsonb), ${})",
            p + 1,
            p + 2,
            p + 3,
            p + 4,
            p + 5,
            p + 6,
            p + 7,
            p + 8,
            p + 9,
            p + 10,
            p + 11
        ));
        values.push(uuid::Uuid::now_v7().into());
        values.push("bench-p1".into());
        values.push("bench.order_placed".into());
        values.push(1i64.into());
        values.push("order".into());
        values.push(event.customer.clone().into());
        values.push(Option::<i64>::None.into());
        values.push(Option::<String>::None.into());
        values.push(payload.clone().into());
        values.push("{}".into());
        values.push(chrono::Utc::now().into());
    }
    conn.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        sql,
        values,
    ))
    .await?;
    Ok(())
}

async fn transaction(
    db: &DatabaseConnection,
    outbox: &Outbox,
    variant: Variant,
    id: i64,
) -> Result<(), BoxError> {
    let event = OrderPlaced::sample(id, CUSTOMERS);
    match variant {
        Variant::Alone => {
            let tx = db.begin().await?;
            insert_order(&tx, &event).await?;
            tx.commit().await?;
        }
        Variant::Hand(n) => {
            let tx = db.begin().await?;
            insert_order(&tx, &event).await?;
            insert_by_hand(&tx, &event, n).await?;
            tx.commit().await?;
        }
        Variant::Emit => {
            let tx = db.begin().await?;
            insert_order(&tx, &event).await?;
            let envelope = serde_json::to_string(&event)?;
            tx.execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT pg_logical_emit_message(true, 'outbox', $1::text)",
                [envelope.into()],
            ))
            .await?;
            tx.commit().await?;
        }
        Variant::Sdk(n) | Variant::SdkNoWake(n) => {
            let tx = outbox.begin(db).await?;
            insert_order(&tx, &event).await?;
            for _ in 0..n {
                tx.enqueue(&event)?;
            }
            let _ = tx.commit().await?;
        }
    }
    Ok(())
}

pub(crate) fn specs() -> Vec<Spec> {
    let mut specs = Vec::new();
    for clients in CLIENTS {
        let k = |v: &str| format!("p1.c{clients}.{v}.tps");
        let c = format!("{clients} client{}", if clients == 1 { "" } else { "s" });
        specs.push(spec("P1", format!("order alone, {c}"), k("alone")));
        specs.push(
            spec("P1", format!("SDK 1 event, {c}"), k("sdk1"))
                .against(format!("by hand: order + 1 row, {c}"), k("hand1"))
                // Throughput ratio >= 1/1.1: the SDK costs at most 10% over the hand-written
                // transaction.
                .target(Target::RatioAtLeast(0.91)),
        );
        specs.push(
            spec(
                "P1",
                format!("SDK 1 event, {c} (vs order alone)"),
                k("sdk1"),
            )
            .against(format!("order alone, {c}"), k("alone")),
        );
        specs.push(
            spec("P1", format!("SDK 10 events, {c}"), k("sdk10"))
                .against(format!("by hand: order + 10 rows, {c}"), k("hand10"))
                .target(Target::RatioAtLeast(0.91)),
        );
        specs.push(
            spec("P1", format!("SDK 1 event, wake-up on, {c}"), k("sdk1"))
                .against(format!("SDK 1 event, wake-up off, {c}"), k("sdk1_nowake"))
                .target(Target::RatioAtLeast(0.90)),
        );
        // What a tableless outbox (the event only in the WAL) would save, against the order
        // alone and the SDK (only on a server with wal_level = logical).
        specs.push(
            spec(
                "P1",
                format!("tableless: order + WAL message, {c}"),
                k("emit1"),
            )
            .against(format!("order alone, {c}"), k("alone")),
        );
        specs.push(
            spec("P1", format!("SDK 1 event (vs tableless), {c}"), k("sdk1"))
                .against(format!("tableless: order + WAL message, {c}"), k("emit1")),
        );
    }
    specs.push(
        spec(
            "P1",
            "SDK 1 event, 1 client, mean latency",
            "p1.c1.sdk1.mean_ms",
        )
        .against("by hand, 1 client, mean latency", "p1.c1.hand1.mean_ms")
        .target(Target::RatioAtMost(1.1)),
    );
    specs
}
