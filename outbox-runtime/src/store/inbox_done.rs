//! Handled messages in their own table (PostgreSQL, migration `outbox_0014`): a message handled
//! in its delivery's transaction is written straight into `inbox_done`, and one a worker handles
//! moves there, fenced, when it is marked DONE; `inbox_event` keeps what is unfinished. What a
//! redelivery is recognised by is kept in `inbox_key`: every recording takes its keys (the
//! message key `(consumer, origin, message_id)`, and an external message's business key) for
//! the period it arrives in and the next, in the same statement as the row, so a key is known
//! for at least one period (two weeks by default) and at most two, whether its row is still
//! there or not. Both tables rotate through fixed slots that retention empties whole (see
//! `rotation.rs`): the inbox leaves no dead row versions behind at steady state.
//!
//! The rotation is on once `outbox_rotation` has its rows (see the migration: an installation
//! whose inbox held messages switches it on after a rolling upgrade); until then messages are
//! recorded as before, DONE rows in `inbox_event`.

use sea_orm::{ConnectionTrait, DbErr, Value};

use super::{
    DbTime, Dialect, INBOX_TABLE,
    rotation::{self, Rotation},
    sql::Sql,
    status::InboxStatus,
};

/// `inbox_done`: handled messages, kept for the retention window.
pub const DONE_TABLE: &str = "inbox_done";
/// `inbox_key`: the keys of recorded messages, per period.
pub const INBOX_KEY_TABLE: &str = "inbox_key";

/// The columns a message keeps in `inbox_done` once handled, besides its slot, its status and
/// `processed_at`.
pub(crate) const DONE_COLUMNS: &str = "id, consumer, message_id, origin, biz_key, headers, \
     event_type, source, aggregate_type, aggregate_id, aggregate_version, schema_version, \
     payload, attempts, locked_by, claim_token, received_at";

/// The scope of a message key in `inbox_key`: `m:` and who assigned the id.
pub(crate) fn message_scope(origin: &str) -> String {
    format!("m:{origin}")
}

/// The period keys are written for, on a database whose inbox rotates.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyPeriod {
    bucket: i64,
    rotation: Rotation,
}

/// The current key period when handled messages go to `inbox_done` on this database; `None`
/// where they stay in `inbox_event` (MySQL/MariaDB, SQLite, or the rotation not switched on).
pub(crate) async fn rotating<C: ConnectionTrait>(conn: &C) -> Result<Option<KeyPeriod>, DbErr> {
    if !Dialect::of(conn).rotates_inbox() {
        return Ok(None);
    }
    match rotation::now(conn, INBOX_KEY_TABLE).await {
        Ok(now) => Ok(now.map(|(bucket, rotation)| KeyPeriod { bucket, rotation })),
        // A schema from before `outbox_0013` (a rolling upgrade's first step): no rotation.
        Err(e) if super::errors::is_missing_table(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether the inbox rotates on this database (for readers that look in both tables).
pub(crate) fn may_hold_done<C: ConnectionTrait>(conn: &C) -> bool {
    Dialect::of(conn).rotates_inbox()
}

/// Whether handled messages rotate on a database, as far as a consumer has seen: once the
/// rotation is on it stays on (nothing switches it off), so a consumer that saw it on records
/// without asking again. Shared by the loops of one consumer on one database.
#[derive(Debug, Clone, Default)]
pub(crate) struct RotationSeen(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl RotationSeen {
    /// Whether the inbox rotates on this database: `true` without a query once seen on.
    pub(crate) async fn rotates<C: ConnectionTrait>(&self, conn: &C) -> Result<bool, DbErr> {
        use std::sync::atomic::Ordering;
        if !Dialect::of(conn).rotates_inbox() {
            return Ok(false);
        }
        if self.0.load(Ordering::Relaxed) {
            return Ok(true);
        }
        let on = rotating(conn).await?.is_some();
        self.0.store(on, Ordering::Relaxed);
        Ok(on)
    }

    /// A recording found the rotation off after all (its row in `outbox_rotation` is gone):
    /// ask again next time.
    pub(crate) fn forget(&self) {
        self.0.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `kp AS (…), k AS (INSERT INTO inbox_key … RETURNING consumer, scope, name)`: the current
/// key period by the database's clock (`kp`, no row when the rotation is off), and each key of
/// the statement's `n (i, consumer, scope, name)` written for that period and the next, in the
/// order of `i`; a row of an earlier period left in a slot that came round again is overwritten
/// as if absent. A key live in this period returns no row for it, so a key is new to this
/// statement exactly when both its rows come back. With `guard`, no key is written while any
/// of them is live (a message whose business key was taken must not take its message key), as
/// far as the statement's snapshot sees.
pub(crate) fn push_key_ctes(sql: &mut Sql, guard: bool) {
    let bucket = sql.dialect().bucket_expression("r.slot_seconds");
    sql.push(&format!(
        "kp AS (SELECT {bucket} AS bucket, r.slots FROM {} r WHERE r.table_name = '{INBOX_KEY_TABLE}'), \
         k AS (INSERT INTO {INBOX_KEY_TABLE} (slot, bucket, consumer, scope, name) \
         SELECT CAST(p.bucket % kp.slots AS SMALLINT), p.bucket, n.consumer, n.scope, n.name \
         FROM kp CROSS JOIN n CROSS JOIN LATERAL (VALUES (kp.bucket), (kp.bucket + 1)) AS p (bucket)",
        rotation::ROTATION_TABLE
    ));
    if guard {
        sql.push(&format!(
            " WHERE NOT EXISTS (SELECT 1 FROM {INBOX_KEY_TABLE} x JOIN n y \
             ON x.consumer = y.consumer AND x.scope = y.scope AND x.name = y.name \
             WHERE x.slot = CAST(kp.bucket % kp.slots AS SMALLINT) AND x.bucket = kp.bucket)"
        ));
    }
    sql.push(&format!(
        " ORDER BY n.i, p.bucket \
         ON CONFLICT (slot, consumer, scope, name) DO UPDATE SET bucket = excluded.bucket \
         WHERE {INBOX_KEY_TABLE}.bucket < excluded.bucket - 1 RETURNING consumer, scope, name)"
    ));
}

/// Whether `(consumer, scope, name)` is a live key in the current period.
pub(crate) async fn key_live<C: ConnectionTrait>(
    conn: &C,
    period: &KeyPeriod,
    consumer: &str,
    scope: &str,
    name: &str,
) -> Result<bool, DbErr> {
    let mut sql = Sql::new(Dialect::of(conn));
    sql.push(&format!(
        "SELECT 1 AS live FROM {INBOX_KEY_TABLE} WHERE slot = "
    ))
    .bind(Value::from(period.rotation.slot(period.bucket) as i16))
    .push(" AND bucket = ")
    .bind(period.bucket.into())
    .push(" AND consumer = ")
    .bind(consumer.to_owned().into())
    .push(" AND scope = ")
    .bind(scope.to_owned().into())
    .push(" AND name = ")
    .bind(name.to_owned().into());
    Ok(conn.query_one_raw(sql.build()).await?.is_some())
}

/// `(SELECT count(*) FROM k WHERE …) = 2`: the key of `{v}.scope_expr`/`name` is new.
pub(crate) fn fresh(v: &str, scope: &str, name: &str) -> String {
    format!(
        "(SELECT count(*) FROM k WHERE k.consumer = {v}.consumer AND k.scope = {scope} \
         AND k.name = {name}) = 2"
    )
}

/// `INSERT INTO inbox_done (slot, …) SELECT <the slot of now>, `: the head of an insert of
/// handled messages.
pub(crate) fn insert_head(dialect: Dialect, columns: &str) -> String {
    format!(
        "INSERT INTO {DONE_TABLE} (slot, {columns}) SELECT {}, ",
        rotation::slot_now(dialect, DONE_TABLE, false)
    )
}

/// Inside the handler's transaction: move the claimed message `id` from `inbox_event` to
/// `inbox_done` as DONE, fenced by the claim token. `false` means another worker owns it now.
pub(crate) async fn mark_done<C: ConnectionTrait>(
    conn: &C,
    id: i64,
    token: uuid::Uuid,
) -> Result<bool, DbErr> {
    let dialect = Dialect::of(conn);
    let mut sql = Sql::new(dialect);
    // The fence is written `(…) IS TRUE` (no partial index can serve it, see `relay.rs`); the
    // row is found by its id.
    sql.push(&format!(
        "WITH moved AS (DELETE FROM {INBOX_TABLE} WHERE id = "
    ))
    .bind(id.into())
    .push(&format!(
        " AND (status = {} AND claim_token = ",
        InboxStatus::Processing.literal()
    ))
    .bind(dialect.uuid(token))
    .push(&format!(") IS TRUE RETURNING {DONE_COLUMNS}) "))
    .push(&insert_head(
        dialect,
        &format!("{DONE_COLUMNS}, status, processed_at"),
    ))
    .push(&DONE_COLUMNS.replace("attempts", "attempts + 1"))
    .push(&format!(", {}, ", InboxStatus::Done.literal()))
    .time(DbTime::NOW)
    .push(" FROM moved");
    Ok(conn.execute_raw(sql.build()).await?.rows_affected() == 1)
}

/// Move a message recorded DONE in `inbox_done` by this transaction back into `inbox_event`
/// under its id, with `status`, `attempts`, `next_attempt_at`, `last_error` and `processed_at`
/// as `sql_tail` selects them (the columns after the message's own). Returns whether it moved.
pub(crate) async fn move_back<C: ConnectionTrait>(
    conn: &C,
    consumer: &str,
    message_id: &str,
    state: impl FnOnce(&mut Sql),
) -> Result<bool, DbErr> {
    const KEPT: &str = "id, consumer, message_id, origin, biz_key, headers, event_type, source, \
         aggregate_type, aggregate_id, aggregate_version, schema_version, payload, received_at";
    let mut sql = Sql::new(Dialect::of(conn));
    // The newest row of the key: the one this transaction recorded (an older one of a key whose
    // period ended may still be kept).
    sql.push(&format!(
        "WITH moved AS (DELETE FROM {DONE_TABLE} WHERE id = (SELECT MAX(id) FROM {DONE_TABLE} \
         WHERE consumer = "
    ))
    .bind(consumer.to_owned().into())
    .push(" AND origin = '' AND message_id = ")
    .bind(message_id.to_owned().into())
    .push(&format!(
        ") RETURNING {KEPT}) INSERT INTO {INBOX_TABLE} ({KEPT}, status, attempts, \
             next_attempt_at, last_error, processed_at) SELECT {KEPT}, "
    ));
    state(&mut sql);
    sql.push(" FROM moved");
    Ok(conn.execute_raw(sql.build()).await?.rows_affected() > 0)
}

/// The rotations `outbox_0014` gives `inbox_done` (a day, 35 slots) and `inbox_key` (two weeks,
/// 4 slots).
const DEFAULT_ROTATIONS: [(&str, i64, i32); 2] =
    [(DONE_TABLE, 86_400, 35), (INBOX_KEY_TABLE, 14 * 86_400, 4)];

/// Switch the inbox's rotation on (PostgreSQL): once no consumer of a release before
/// `outbox_0014` runs against this database, handled messages go to `inbox_done` and keys to
/// `inbox_key` (the migration switches it on by itself where `inbox_event` was empty). Returns
/// whether it was off; `false` also where the backend keeps handled messages in `inbox_event`.
/// The same as the SQL the guide gives in book/src/upgrades.md (`admin::rotate_inbox` for users).
pub(crate) async fn switch_on<C: ConnectionTrait>(conn: &C) -> Result<bool, DbErr> {
    if !Dialect::of(conn).rotates_inbox() {
        return Ok(false);
    }
    let mut sql = Sql::new(Dialect::of(conn));
    sql.push(&format!(
        "INSERT INTO {} (table_name, slot_seconds, slots) VALUES ",
        rotation::ROTATION_TABLE
    ));
    for (i, (table, seconds, slots)) in DEFAULT_ROTATIONS.iter().enumerate() {
        if i > 0 {
            sql.push(", ");
        }
        sql.bind_list([
            Value::from(*table),
            Value::from(*seconds),
            Value::from(*slots),
        ]);
    }
    sql.push(" ON CONFLICT (table_name) DO NOTHING");
    Ok(conn.execute_raw(sql.build()).await?.rows_affected() > 0)
}
