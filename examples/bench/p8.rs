//! P8 delayed events: the relay's claim (with its look for due delayed events before it) while
//! no delayed event waits, and while `p8_scheduled` (1M) wait in `outbox_scheduled`, due in a day;
//! then how fast due ones move into the outbox. Target: the claim with 1M waiting at most 1.2x
//! the claim with none.

use std::time::{Duration, Instant};

use outbox::sea_orm::{ConnectionTrait, DatabaseConnection};
use outbox::store::claim::ClaimParams;
use outbox::store::relay::{Fence, Settlement, claim, settle};
use outbox::store::scheduled::promote;

use crate::report::{Measure, Spec, Target, m, spec};
use crate::support::{BoxError, Ctx, execute_bound, pre_enqueue, quantile, scalar_i64};

const AGGREGATES: u64 = 1_000;
const BATCH: usize = 500;
const CLAIMS: u64 = 30;
/// Delayed events made due for the promotion figure (at most a tenth of those waiting).
const DUE: u64 = 10_000;

pub(crate) async fn run(ctx: &Ctx) -> Result<Vec<Measure>, BoxError> {
    let result = measure(ctx).await;
    let cleared = ctx.db.execute_unprepared("TRUNCATE outbox_scheduled").await;
    let reset = ctx.reset().await;
    let out = result?;
    cleared?;
    reset?;
    Ok(out)
}

async fn measure(ctx: &Ctx) -> Result<Vec<Measure>, BoxError> {
    let db = &ctx.db;
    ctx.reset().await?;
    db.execute_unprepared("TRUNCATE outbox_scheduled").await?;
    let none = claims(ctx, "none").await?;

    let waiting = ctx.sizes.p8_scheduled;
    let t = Instant::now();
    add_scheduled(db, waiting).await?;
    db.execute_unprepared("VACUUM ANALYZE outbox_scheduled")
        .await?;
    println!(
        "  P8: {waiting} delayed events waiting, written in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let with = claims(ctx, "scheduled").await?;

    // Make some due and move them, as a relay does.
    let due = DUE.min(waiting / 10).max(1);
    execute_bound(
        db,
        "UPDATE outbox_scheduled SET due_at = now() - interval '1 second' WHERE id IN \
         (SELECT id FROM outbox_scheduled ORDER BY id LIMIT $1)",
        [(due as i64).into()],
    )
    .await?;
    let before = scalar_i64(db, "SELECT count(*) FROM outbox_event").await?;
    let t = Instant::now();
    let mut moved = 0;
    loop {
        let promoted = promote(db, BATCH).await?;
        moved += promoted.moved as u64;
        if promoted.moved < BATCH {
            break;
        }
    }
    let elapsed = t.elapsed();
    let after = scalar_i64(db, "SELECT count(*) FROM outbox_event").await?;
    let left = scalar_i64(db, "SELECT count(*) FROM outbox_scheduled").await? as u64;
    if moved != due || (after - before) as u64 != due || left != waiting - due {
        return Err(format!(
            "P8: moved {moved} of {due} due events ({} rows added, {left} left waiting)",
            after - before
        )
        .into());
    }
    let rate = due as f64 / elapsed.as_secs_f64();
    println!(
        "  P8: moved {due} due events into the outbox in {:.2} s = {rate:.0} ev/s",
        elapsed.as_secs_f64()
    );
    Ok(vec![
        m("p8.claim_ms.none", none, "ms"),
        m("p8.claim_ms.scheduled", with, "ms"),
        m("p8.promote", rate, "ev/s"),
    ])
}

/// `n` delayed events due in a day, spread over the aggregates.
async fn add_scheduled(db: &DatabaseConnection, n: u64) -> Result<(), BoxError> {
    let payload = serde_json::to_string(&crate::support::OrderPlaced::sample(1, 1))?;
    execute_bound(
        db,
        "INSERT INTO outbox_scheduled (event_id, source, event_type, schema_version, \
         aggregate_type, aggregate_id, payload, headers, due_at, created_at) \
         SELECT ('018f0000-0000-7000-9000-' || lpad(to_hex(g), 12, '0'))::uuid, 'bench', \
         'bench.order_placed', 1, 'order', 'customer-' || (g % $1), CAST($2 AS jsonb), \
         '{}'::jsonb, now() + interval '1 day' + g * interval '1 millisecond', now() \
         FROM generate_series(1::bigint, $3::bigint) g",
        [
            (AGGREGATES as i64).into(),
            payload.into(),
            (n as i64).into(),
        ],
    )
    .await?;
    Ok(())
}

/// The median of `CLAIMS` relay claims of `BATCH` pending events, each after the relay's look
/// for due delayed events (none is due), each settled as sent.
async fn claims(ctx: &Ctx, label: &str) -> Result<f64, BoxError> {
    let db = &ctx.db;
    let events = CLAIMS * BATCH as u64;
    pre_enqueue(db, events, AGGREGATES, "PENDING").await?;
    db.execute_unprepared("VACUUM ANALYZE outbox_event").await?;
    let params = ClaimParams {
        owner: "bench",
        batch_size: BATCH,
        lease: Duration::from_secs(30),
        ordering: true,
        max_attempts: 12,
    };
    let mut took = Vec::with_capacity(CLAIMS as usize);
    for _ in 0..CLAIMS {
        let t = Instant::now();
        let promoted = promote(db, BATCH).await?;
        let got = claim(db, &params).await?;
        took.push(t.elapsed().as_micros() as u64);
        if promoted.moved != 0 || got.events.len() != BATCH {
            return Err(format!(
                "P8 {label}: moved {} delayed events and claimed {} (expected 0 and {BATCH})",
                promoted.moved,
                got.events.len()
            )
            .into());
        }
        let settlement = Settlement {
            sent: got.events.iter().map(|e| e.id).collect(),
            ..Settlement::default()
        };
        settle(db, Fence::Claim(got.token), &settlement).await?;
    }
    took.sort_unstable();
    let p50 = quantile(&took, 0.5) as f64 / 1000.0;
    println!(
        "  P8 {label}: look for due events + claim {BATCH}: p50 {p50:.2} ms (min {:.2}, max {:.2})",
        took[0] as f64 / 1000.0,
        took[took.len() - 1] as f64 / 1000.0
    );
    ctx.reset().await?;
    Ok(p50)
}

pub(crate) fn specs() -> Vec<Spec> {
    vec![
        spec(
            "P8",
            "due look + claim 500, none waiting",
            "p8.claim_ms.none",
        ),
        spec(
            "P8",
            "due look + claim 500, 1M delayed waiting",
            "p8.claim_ms.scheduled",
        )
        .against("due look + claim 500, none waiting", "p8.claim_ms.none")
        .target(Target::RatioAtMost(1.2)),
        spec("P8", "due events moved into the outbox", "p8.promote"),
    ]
}
