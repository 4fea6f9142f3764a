//! Tables that rotate through a fixed set of slots (`outbox_sent`, `outbox_key`): a row goes to
//! the slot of the period it is written in, by the database's clock (`bucket` = seconds since
//! the epoch / the slot's length; slot = bucket mod slots), and retention empties a slot whole
//! once the newest period that wrote to it is older than the window, with `TRUNCATE` where the
//! backend has partitions (PostgreSQL, MySQL/MariaDB) and a `DELETE` by slot on SQLite.
//!
//! Nothing is created or dropped at run time: every slot exists from the migration on, so a
//! row never finds its partition missing, and the catalog does not churn. A slot is emptied only
//! while it is at least one period away from being written again; a slot whose rows are not yet
//! old enough when it comes round again cannot be emptied whole, which is why the rotation must
//! cover the window with room to spare ([`Rotation::covers`]).

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Value};

use super::{Dialect, get_i64, sql::Sql};

/// How long a slot lasts and how many there are, per rotating table.
pub const ROTATION_TABLE: &str = "outbox_rotation";

/// A table's rotation, as `outbox_rotation` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// Seconds a slot is written for.
    pub slot_seconds: i64,
    /// How many slots there are.
    pub slots: i32,
}

impl Rotation {
    /// The longest window whose rows the rotation can drop whole: a slot is emptied once the
    /// newest period that wrote to it is a window old, and only while it is at least one period
    /// away from its next turn (three periods: the one being written, the one before it, whose
    /// rows may still be in transactions that started then, and one of margin).
    pub fn longest_window(&self) -> Duration {
        let spare = i64::from(self.slots) - 3;
        Duration::from_secs(u64::try_from(spare.max(0) * self.slot_seconds).unwrap_or(0))
    }

    /// Whether rows kept for `window` leave by whole slots.
    pub fn covers(&self, window: Duration) -> bool {
        window <= self.longest_window()
    }

    /// The slot of period `bucket`.
    pub fn slot(&self, bucket: i64) -> i32 {
        i32::try_from(bucket.rem_euclid(i64::from(self.slots))).unwrap_or(0)
    }

    /// The slots that may be emptied at period `current`, given the window: each slot whose
    /// newest period is at least a window old and whose next turn is at least two periods away.
    pub fn expired(&self, current: i64, window: Duration) -> Vec<i32> {
        let length = self.slot_seconds.max(1);
        // Whole periods between the end of a slot's newest period and now that cover the window.
        let seconds = i64::try_from(window.as_secs()).unwrap_or(i64::MAX / 2);
        let window_periods = (seconds + length - 1) / length;
        let slots = i64::from(self.slots);
        (0..slots)
            .filter(|&slot| {
                // The newest period at or before `current` that used this slot.
                let newest = current - (current - slot).rem_euclid(slots);
                let age = current - newest;
                age > window_periods && age <= slots - 2
            })
            .filter_map(|slot| i32::try_from(slot).ok())
            .collect()
    }
}

/// `(SELECT <the slot of now, or of the next period> FROM outbox_rotation …)`: the slot a row of
/// `table` written by this statement goes to.
pub(crate) fn slot_now(dialect: Dialect, table: &str, next: bool) -> String {
    let bucket = dialect.bucket_expression("r.slot_seconds");
    let bucket = if next {
        format!("({bucket} + 1)")
    } else {
        bucket
    };
    format!("(SELECT {bucket} % r.slots FROM {ROTATION_TABLE} r WHERE r.table_name = '{table}')")
}

/// `table`'s rotation and the current period by the database's clock; `None` when the table
/// does not rotate (or `outbox_0013` is not applied).
pub async fn now<C: ConnectionTrait>(
    conn: &C,
    table: &str,
) -> Result<Option<(i64, Rotation)>, DbErr> {
    let dialect = Dialect::of(conn);
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "SELECT {} AS bucket, r.slot_seconds, r.slots FROM {ROTATION_TABLE} r \
         WHERE r.table_name = ",
        dialect.bucket_expression("r.slot_seconds")
    ))
    .bind(table.to_owned().into());
    let Some(row) = conn.query_one_raw(sql.build()).await? else {
        return Ok(None);
    };
    Ok(Some((
        get_i64(&row, "bucket")?,
        Rotation {
            slot_seconds: get_i64(&row, "slot_seconds")?,
            slots: i32::try_from(get_i64(&row, "slots")?).unwrap_or(i32::MAX),
        },
    )))
}

/// Empty the slots of `table` whose rows are all older than `window` (by default one slot's
/// length: the keys' window; see [`Rotation::expired`]); slots already empty are left alone. A
/// window longer than the rotation covers empties nothing (the rows stay longer than asked,
/// and a warning says which setting to change). Returns the slots emptied, whatever they held
/// (their rows are not counted: a partition is truncated whole).
pub async fn empty_expired(
    db: &DatabaseConnection,
    table: &str,
    window: Option<Duration>,
) -> Result<Vec<i32>, DbErr> {
    let mut emptied = Vec::new();
    let Some((current, rotation)) = now(db, table).await? else {
        return Ok(emptied);
    };
    let window = window.unwrap_or(Duration::from_secs(
        u64::try_from(rotation.slot_seconds).unwrap_or(0),
    ));
    if !rotation.covers(window) {
        tracing::warn!(
            table,
            window_secs = window.as_secs(),
            longest_secs = rotation.longest_window().as_secs(),
            slots = rotation.slots,
            slot_seconds = rotation.slot_seconds,
            "the retention window is longer than the table's rotation keeps: its rows are kept \
             until the window shrinks or the slots are made longer (outbox_rotation)"
        );
        return Ok(emptied);
    }
    let dialect = Dialect::of(db);
    let expired = rotation.expired(current, window);
    if expired.is_empty() {
        return Ok(emptied);
    }
    // Every slot is asked, not only the expired ones: the statement's text then depends on the
    // rotation alone, not on the time of day, so it is one statement to the database's
    // statistics (and to the golden files).
    let every: Vec<i32> = (0..rotation.slots).collect();
    let holding = db
        .query_all_raw(dialect.raw(dialect.slots_with_rows(table, &every)))
        .await?
        .iter()
        .map(|row| get_i64(row, "slot").map(|s| i32::try_from(s).unwrap_or(-1)))
        .collect::<Result<Vec<_>, DbErr>>()?;
    for slot in holding.into_iter().filter(|slot| expired.contains(slot)) {
        let statements = dialect.empty_slot(table, slot);
        let txn = super::tx::begin_admin(db).await?;
        for statement in &statements {
            txn.execute_raw(dialect.raw(statement.clone())).await?;
        }
        txn.commit().await?;
        emptied.push(slot);
    }
    Ok(emptied)
}

/// The rows of `table` per slot, for tests.
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
pub async fn rows_per_slot<C: ConnectionTrait>(
    conn: &C,
    table: &str,
) -> Result<Vec<(i32, i64)>, DbErr> {
    let dialect = Dialect::of(conn);
    let rows = conn
        .query_all_raw(dialect.raw(format!(
            "SELECT slot + 0 AS slot, COUNT(*) AS n FROM {table} GROUP BY slot ORDER BY slot"
        )))
        .await?;
    rows.iter()
        .map(|row| {
            Ok((
                i32::try_from(get_i64(row, "slot")?).unwrap_or(-1),
                get_i64(row, "n")?,
            ))
        })
        .collect()
}

/// Set `table`'s rotation, for a database whose rotating tables are empty (a new installation,
/// a test, a benchmark): the number of slots is the migration's, only their length changes.
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
pub async fn set_slot_length<C: ConnectionTrait>(
    conn: &C,
    table: &str,
    slot_seconds: i64,
) -> Result<(), DbErr> {
    let mut sql = Sql::new(Dialect::of(conn));
    sql.push(&format!("UPDATE {ROTATION_TABLE} SET slot_seconds = "))
        .bind(Value::from(slot_seconds.max(1)))
        .push(" WHERE table_name = ")
        .bind(table.to_owned().into());
    conn.execute_raw(sql.build()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Rotation = Rotation {
        slot_seconds: 86_400,
        slots: 10,
    };

    #[test]
    fn a_slot_is_emptied_once_its_newest_period_is_a_window_old() {
        let week = Duration::from_secs(7 * 86_400);
        // Period 100 writes slot 0; its rows are written until period 101 begins. At 107 the
        // newest of them are 6 to 7 days old: not yet. At 108 they are all at least 7 days old.
        assert_eq!(DAY.slot(100), 0);
        assert!(!DAY.expired(107, week).contains(&0));
        assert_eq!(DAY.expired(108, week), vec![0]);
        // Each period empties the slot of eight periods before.
        for current in 100..140 {
            assert_eq!(
                DAY.expired(current, week),
                vec![DAY.slot(current - 8)],
                "{current}"
            );
        }
        // The slot being written, and the next one, are never emptied, whatever the window.
        for window in [Duration::ZERO, Duration::from_secs(1), week] {
            for current in 100..140 {
                let expired = DAY.expired(current, window);
                assert!(!expired.contains(&DAY.slot(current)), "{current}");
                assert!(!expired.contains(&DAY.slot(current + 1)), "{current}");
            }
        }
    }

    #[test]
    fn a_window_the_rotation_cannot_cover_empties_nothing() {
        let month = Duration::from_secs(30 * 86_400);
        assert!(!DAY.covers(month));
        assert!(DAY.covers(Duration::from_secs(7 * 86_400)));
        for current in 100..140 {
            assert!(DAY.expired(current, month).is_empty(), "{current}");
        }
    }

    #[test]
    fn keys_are_kept_for_the_period_they_are_checked_in() {
        // Keys: a row is written for its period and the next; checks read the current period's
        // slot. With 4 slots and a window of one period, the slot of period k is emptied only
        // at k + 2.
        let keys = Rotation {
            slot_seconds: 7 * 86_400,
            slots: 4,
        };
        let window = Duration::from_secs(7 * 86_400);
        for current in 10..30 {
            let expired = keys.expired(current, window);
            assert_eq!(expired, vec![keys.slot(current - 2)], "{current}");
        }
    }
}
