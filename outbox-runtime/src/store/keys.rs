//! Producers' dedup keys that outlive their events' rows. An event leaves `outbox_event` when it
//! is sent, and its `(event_type, dedup_key)` with it; `outbox_key` keeps the key for the
//! rotation's period (a week by default): each key is written for the period it arrives in and
//! the next one, and a later event with the same key finds it in its own period's slot, so a
//! key is kept at least one period and at most two. The unique index of `outbox_event` still
//! refuses a key while its event is unsent, however long that takes.
//!
//! Each row says which period it was written for: a row a late retention left in a slot that
//! has come round again is older than the period before, and is overwritten as if absent.

use std::collections::HashSet;

use sea_orm::{ConnectionTrait, DbErr, Value};
use uuid::Uuid;

use super::{Dialect, get_i64, outbox::PendingEvent, rotation, sql::Sql};

/// `outbox_key`: the producers' dedup keys, per period.
pub const KEY_TABLE: &str = "outbox_key";

/// Events per statement (two rows of five values each).
const CHUNK: usize = 200;

/// Of `keyed` events (each with a dedup key, none sharing one), the ids of those whose key an
/// earlier event took within the period; the others' keys are recorded, for this period and the
/// next, in the caller's transaction.
pub(crate) async fn take<C: ConnectionTrait>(
    conn: &C,
    keyed: &[&PendingEvent],
) -> Result<HashSet<Uuid>, DbErr> {
    let mut taken = HashSet::new();
    if keyed.is_empty() {
        return Ok(taken);
    }
    let Some((bucket, rotation)) = rotation::now(conn, KEY_TABLE).await? else {
        return Ok(taken);
    };
    let dialect = Dialect::of(conn);
    let periods = [
        (rotation.slot(bucket), bucket),
        (rotation.slot(bucket + 1), bucket + 1),
    ];
    for chunk in keyed.chunks(CHUNK) {
        let mut sql = Sql::new(dialect);
        sql.push(&format!(
            "INSERT INTO {KEY_TABLE} (slot, bucket, event_type, dedup_key, event_id) VALUES "
        ));
        let mut first = true;
        for event in chunk {
            for (slot, period) in periods {
                if !first {
                    sql.push(", ");
                }
                first = false;
                sql.bind_list([
                    Value::from(slot),
                    Value::from(period),
                    Value::from(event.event_type.clone()),
                    Value::from(event.dedup_key.clone()),
                    dialect.uuid(event.event_id),
                ]);
            }
        }
        sql.push(" ").push(dialect.key_upsert());
        let mine = if dialect.insert_returning() {
            sql.push(" RETURNING event_id, bucket");
            let mut mine = HashSet::new();
            for row in conn.query_all_raw(sql.build()).await? {
                if get_i64(&row, "bucket")? == bucket {
                    mine.insert(dialect.get_uuid(&row, "event_id")?);
                }
            }
            mine
        } else {
            conn.execute_raw(sql.build()).await?;
            holders(conn, chunk, periods[0]).await?
        };
        taken.extend(
            chunk
                .iter()
                .map(|event| event.event_id)
                .filter(|id| !mine.contains(id)),
        );
    }
    Ok(taken)
}

/// The event ids that hold `chunk`'s keys in `(slot, bucket)`, read back where an `INSERT`
/// returns no rows.
async fn holders<C: ConnectionTrait>(
    conn: &C,
    chunk: &[&PendingEvent],
    (slot, bucket): (i32, i64),
) -> Result<HashSet<Uuid>, DbErr> {
    let dialect = Dialect::of(conn);
    let mut sql = Sql::new(dialect);
    sql.push(&format!("SELECT event_id FROM {KEY_TABLE} WHERE slot = "))
        .bind(slot.into())
        .push(" AND bucket = ")
        .bind(bucket.into())
        .push(" AND (");
    for (i, event) in chunk.iter().enumerate() {
        if i > 0 {
            sql.push(" OR ");
        }
        sql.push("(event_type = ")
            .bind(event.event_type.clone().into())
            .push(" AND dedup_key = ")
            .bind(event.dedup_key.clone().into())
            .push(")");
    }
    sql.push(")");
    conn.query_all_raw(sql.build())
        .await?
        .iter()
        .map(|row| dialect.get_uuid(row, "event_id"))
        .collect()
}
