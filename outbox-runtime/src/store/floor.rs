//! The claim's floor: an id below which a work queue holds no unfinished row that is not DEAD,
//! and never will again without an operator, so that a claim's scans of the partial index of
//! open rows (PENDING, PROCESSING, RETRY) start there instead of at the index's first entry.
//!
//! Why: a row that leaves the queue (SENT, DONE) keeps its entry in the partial indexes of
//! open rows until vacuum removes it, and vacuum cannot while any snapshot older than the
//! change is held (a report query, a backup, a session idle in transaction). Every scan from
//! the first entry then visits each such row's heap tuple: after two minutes of a held horizon
//! at 400 events/s the claim's `MIN(id)` took half a second. With a floor the scans start at
//! the oldest unfinished row the queue still has, and stay as cheap as without the hold.
//!
//! A floor is only safe if no row below it can still appear: a transaction that inserted a row
//! and has not committed yet is invisible to the statement that finds the lowest unfinished id,
//! and may commit later, below it. So a floor is found in two steps (PostgreSQL's snapshots
//! say when the second may be taken):
//!
//! 1. a sample reads the lowest open (unfinished, not DEAD) id from the current floor up (a
//!    *candidate*); every row below it that the sample could not see belongs to a transaction
//!    that was running then, or was just starting its INSERT;
//! 2. the candidate is *sealed* by the first sample at least [`SEAL_AFTER`] later, which
//!    records the first transaction id not yet assigned then (`xmax`): every transaction of
//!    step 1, the starting ones included, has an id below it;
//! 3. a sample whose oldest running transaction (`xmin`) is at or past that `xmax` confirms
//!    the candidate: those transactions have all ended, their rows are visible to it, and the
//!    floor becomes the lower of the candidate and what that sample found.
//!
//! DEAD rows stay below the floor (they wait for an operator); the ordering check looks for
//! them in their own small partial index. An operator's replay or resend makes a finished row
//! unfinished again, below the floor: it bumps the generation in `outbox_rescan` in the same
//! transaction, and every claim statement compares that generation with the one its floor was
//! found under, scanning from the start when they differ, until the next sample, read from the
//! first row, lowers the floor to what it finds and adopts the new generation. The floor is also
//! checked from the first row every [`CHECK_EVERY`] (lowered at once, never dropped), for a row
//! made unfinished by a tool that does not bump the generation (an older release's CLI during a
//! rolling upgrade).
//!
//! A transaction that holds an id of its own open (a session idle in transaction after a
//! write) stops the confirmations: the floor stays where it was, and the scans cost what they
//! cost without one, which `outbox doctor` reports as a held horizon. A read-only holder (a
//! report, `pg_dump`) does not.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, DbErr};

use super::{Dialect, claim::Queue, get_i64, get_opt_i64, sql::Sql};

/// The table whose one row holds the generation that operators' replays and resends bump.
pub const RESCAN_TABLE: &str = "outbox_rescan";

/// How long after a candidate its sealing sample comes: longer than any INSERT takes between
/// drawing its row's id and taking its transaction id.
pub const SEAL_AFTER: Duration = Duration::from_secs(1);

/// How often a claimer samples: at most once this often.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// How often a sample reads from the first row of the index, to find a row made unfinished below
/// the floor by a tool that does not bump the generation.
pub const CHECK_EVERY: Duration = Duration::from_secs(60);

/// Candidates waiting for their confirmation, at most (while a transaction holds the horizon
/// with an id of its own, no candidate is confirmed: newer ones are not kept).
const MAX_CANDIDATES: usize = 4;

/// What one sample read, in one statement and one snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// The id it read from ([`Floor::from`]).
    pub from: i64,
    /// The lowest unfinished, not DEAD, id at or above the floor; with none, one above the
    /// highest id handed out (0 before the first).
    pub low: i64,
    /// The oldest transaction id still running.
    pub xmin: i64,
    /// The first transaction id not assigned yet.
    pub xmax: i64,
    /// The rescan generation.
    pub generation: i64,
}

/// A floor and the generation it was found under: what a claim statement binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// No unfinished, not DEAD, row has a lower id.
    pub low: i64,
    /// The rescan generation it holds for.
    pub generation: i64,
}

#[derive(Debug, Clone, Copy)]
struct Candidate {
    low: i64,
    taken: Instant,
    /// The `xmax` of the first sample at least [`SEAL_AFTER`] later.
    sealed: Option<i64>,
}

/// One claimer's floor on one queue (see the module's documentation).
#[derive(Debug)]
pub struct Floor {
    confirmed: Option<i64>,
    generation: Option<i64>,
    candidates: VecDeque<Candidate>,
    sampled: Option<Instant>,
    /// When the last sample from the first row was read.
    checked: Option<Instant>,
    /// The rescan generation changed: the next sample reads from the first row.
    rescan: bool,
}

impl Default for Floor {
    fn default() -> Self {
        Self::new()
    }
}

impl Floor {
    /// No floor yet: scans start at the first entry.
    pub fn new() -> Self {
        Floor {
            confirmed: None,
            generation: None,
            candidates: VecDeque::new(),
            sampled: None,
            checked: None,
            rescan: false,
        }
    }

    /// The floor to bind, if one is confirmed.
    pub fn bound(&self) -> Option<Bound> {
        Some(Bound {
            low: self.confirmed?,
            generation: self.generation?,
        })
    }

    /// Whether a sample is due at `now`; the lower bound it reads from is [`Floor::from`].
    pub fn due(&self, now: Instant) -> bool {
        self.sampled
            .is_none_or(|at| now.saturating_duration_since(at) >= SAMPLE_EVERY)
    }

    /// Where the next sample looks from: the floor; the first row when there is none yet,
    /// after the rescan generation changed, and every [`CHECK_EVERY`].
    pub fn from(&self, now: Instant) -> i64 {
        if self.rescan || self.check_due(now) {
            0
        } else {
            self.confirmed.unwrap_or(0)
        }
    }

    fn check_due(&self, now: Instant) -> bool {
        self.checked
            .is_none_or(|at| now.saturating_duration_since(at) >= CHECK_EVERY)
    }

    /// Take in a sample read at `now` from [`Sample::from`] (what [`Floor::from`] said).
    ///
    /// A sample read from the first row lowers the floor to the lowest unfinished row it saw,
    /// if that is lower, at once (lowering a floor is always safe), and adopts its generation:
    /// the claims keep a floor while it is checked.
    pub fn observe(&mut self, sample: Sample, now: Instant) {
        self.sampled = Some(now);
        let changed = self.generation.is_some_and(|g| g != sample.generation);
        if sample.from == 0 {
            self.confirmed = self.confirmed.map(|c| c.min(sample.low));
            self.checked = Some(now);
            self.rescan = false;
            if changed {
                // Candidates were read before the operator's change: read them again.
                self.candidates.clear();
            }
            self.generation = Some(sample.generation);
        } else if changed {
            // Read from a floor an operator's change may have made void (the claims ignore it
            // meanwhile, their generation being old): the next sample reads from the start.
            self.rescan = true;
            return;
        }
        for candidate in &mut self.candidates {
            if candidate.sealed.is_none()
                && now.saturating_duration_since(candidate.taken) >= SEAL_AFTER
            {
                candidate.sealed = Some(sample.xmax);
            }
        }
        while let Some(first) = self.candidates.front() {
            match first.sealed {
                Some(xmax) if sample.xmin >= xmax => {
                    // Every row below the candidate that its sample could not see is visible
                    // to this one: the lowest of them, if any is unfinished, is at least
                    // `sample.low`'s equal.
                    let low = first.low.min(sample.low);
                    self.confirmed = Some(self.confirmed.map_or(low, |c| c.max(low)));
                    self.candidates.pop_front();
                }
                _ => break,
            }
        }
        let advances = self.confirmed.is_none_or(|c| sample.low > c)
            && self.candidates.back().is_none_or(|c| sample.low > c.low);
        if advances && self.candidates.len() < MAX_CANDIDATES {
            self.candidates.push_back(Candidate {
                low: sample.low,
                taken: now,
                sealed: None,
            });
        }
    }
}

/// A claimer's floor before a claim: sampled with `sample` (from the id it is given) when a
/// sample is due; then the bound to claim with. A sample that fails leaves the floor as it
/// was (the claim that follows reports what is wrong with the database).
pub async fn refresh<Fut>(
    floor: &std::sync::Mutex<Floor>,
    sample: impl FnOnce(i64) -> Fut,
) -> Option<Bound>
where
    Fut: std::future::Future<Output = Result<Option<Sample>, DbErr>>,
{
    let now = Instant::now();
    let from = {
        let floor = floor.lock().unwrap_or_else(|p| p.into_inner());
        if !floor.due(now) {
            return floor.bound();
        }
        floor.from(now)
    };
    let sampled = sample(from).await;
    let mut floor = floor.lock().unwrap_or_else(|p| p.into_inner());
    match sampled {
        Ok(Some(sample)) => floor.observe(sample, now),
        Ok(None) => {}
        Err(e) => tracing::debug!(
            error = %e,
            "could not sample a claim's floor; it stays where it was"
        ),
    }
    floor.bound()
}

/// Read a [`Sample`] of `queue` from `from` up: on a dialect without snapshots, `None`.
pub async fn sample<C: ConnectionTrait>(
    conn: &C,
    queue: &Queue<'_>,
    from: i64,
) -> Result<Option<Sample>, DbErr> {
    let dialect = queue.dialect;
    if !dialect.snapshots() {
        return Ok(None);
    }
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "SELECT COALESCE((SELECT MIN(x.id) FROM {table} x WHERE {live} AND x.id >= ",
        table = queue.table,
        live = queue.open("x."),
    ))
    .bind(from.into());
    super::claim::push_scope_of(&mut sql, queue, "x.");
    sql.push(&format!(
        "), {next}, 0) AS low, {snapshot}, \
         (SELECT generation FROM {RESCAN_TABLE} WHERE id = 1) AS generation",
        next = dialect.next_id(queue.table),
        snapshot = dialect.snapshot_columns(),
    ));
    let Some(row) = conn.query_one_raw(sql.build()).await? else {
        return Ok(None);
    };
    Ok(Some(Sample {
        from,
        low: get_i64(&row, "low")?,
        xmin: get_i64(&row, "snap_xmin")?,
        xmax: get_i64(&row, "snap_xmax")?,
        generation: get_opt_i64(&row, "generation")?.unwrap_or(0),
    }))
}

/// `(SELECT CASE WHEN generation = <g> THEN <low> ELSE 0 END FROM outbox_rescan WHERE id = 1)`:
/// the floor as a claim statement uses it, 0 (the whole index) once an operator made a row
/// unfinished again after the floor was found.
pub(crate) fn push_low(sql: &mut Sql, bound: Bound) {
    sql.push("COALESCE((SELECT CASE WHEN r.generation = ")
        .bind(bound.generation.into())
        .push(" THEN ")
        .bind(bound.low.into())
        .push(&format!(
            " ELSE 0 END FROM {RESCAN_TABLE} r WHERE r.id = 1), 0)"
        ));
}

/// Bump the rescan generation: in the transaction of an operator's change that makes finished
/// rows unfinished again.
pub(crate) async fn rescan<C: ConnectionTrait>(conn: &C) -> Result<(), DbErr> {
    let dialect = Dialect::of(conn);
    let sql = format!("UPDATE {RESCAN_TABLE} SET generation = generation + 1 WHERE id = 1");
    conn.execute_raw(dialect.raw(sql)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    fn sample(low: i64, xmin: i64, xmax: i64) -> Sample {
        Sample {
            from: 0,
            low,
            xmin,
            xmax,
            generation: 0,
        }
    }

    #[test]
    fn a_candidate_is_confirmed_once_the_transactions_after_its_seal_have_ended() {
        let t = Instant::now();
        let mut floor = Floor::new();
        floor.observe(sample(100, 50, 60), t);
        assert_eq!(floor.bound(), None, "a first sample is only a candidate");
        floor.observe(sample(120, 55, 70), at(t, 1000));
        assert_eq!(floor.bound(), None, "sealed at xmax 70, not confirmed");
        floor.observe(sample(130, 69, 75), at(t, 2000));
        assert_eq!(
            floor.bound(),
            None,
            "transaction 69 may hold a row below 100"
        );
        floor.observe(sample(140, 70, 80), at(t, 3000));
        assert_eq!(
            floor.bound(),
            Some(Bound {
                low: 100,
                generation: 0
            })
        );
    }

    #[test]
    fn a_late_commit_below_the_candidate_lowers_what_is_confirmed() {
        let t = Instant::now();
        let mut floor = Floor::new();
        floor.observe(sample(100, 50, 60), t);
        floor.observe(sample(100, 55, 70), at(t, 1000));
        // Row 90 committed late: the confirming sample sees it.
        floor.observe(sample(90, 70, 80), at(t, 2000));
        assert_eq!(floor.bound().map(|b| b.low), Some(90));
    }

    #[test]
    fn a_seal_waits_for_a_sample_a_second_later() {
        let t = Instant::now();
        let mut floor = Floor::new();
        floor.observe(sample(100, 50, 60), t);
        floor.observe(sample(100, 60, 61), at(t, 400));
        floor.observe(sample(100, 61, 62), at(t, 800));
        assert_eq!(floor.bound(), None, "sealed no earlier than a second after");
        floor.observe(sample(100, 62, 63), at(t, 1000));
        floor.observe(sample(100, 63, 64), at(t, 1400));
        assert_eq!(floor.bound().map(|b| b.low), Some(100));
    }

    #[test]
    fn a_transaction_that_keeps_its_id_holds_the_floor_where_it_was() {
        let t = Instant::now();
        let mut floor = Floor::new();
        floor.observe(sample(100, 50, 60), t);
        floor.observe(sample(200, 55, 70), at(t, 1000));
        floor.observe(sample(300, 70, 80), at(t, 2000));
        assert_eq!(floor.bound().map(|b| b.low), Some(100));
        // Transaction 75 stays open from here on: 200's seal (80) is never reached.
        for s in 3..30 {
            floor.observe(sample(300 + s, 75, 90 + s), at(t, s as u64 * 1000));
            assert_eq!(floor.bound().map(|b| b.low), Some(100));
        }
        // It ends: the candidates sealed meanwhile are confirmed, in turn.
        floor.observe(sample(400, 200, 210), at(t, 30_000));
        assert!(floor.bound().is_some_and(|b| b.low > 200));
        assert!(floor.candidates.len() <= MAX_CANDIDATES);
    }

    #[test]
    fn the_floor_never_goes_down_within_a_generation() {
        let t = Instant::now();
        let mut floor = Floor::new();
        floor.observe(sample(500, 50, 60), t);
        floor.observe(sample(500, 60, 70), at(t, 1000));
        floor.observe(sample(500, 70, 80), at(t, 2000));
        assert_eq!(floor.bound().map(|b| b.low), Some(500));
        // Samples read from the floor up: a lower low cannot come back, but stays harmless.
        floor.observe(sample(500, 80, 90), at(t, 3000));
        floor.observe(sample(600, 90, 95), at(t, 4000));
        floor.observe(sample(600, 95, 99), at(t, 5000));
        floor.observe(sample(600, 99, 120), at(t, 6000));
        assert_eq!(floor.bound().map(|b| b.low), Some(600));
    }

    #[test]
    fn a_new_generation_is_read_from_the_start_and_lowers_the_floor() {
        let t = Instant::now();
        let mut floor = Floor::new();
        floor.observe(sample(100, 50, 60), t);
        floor.observe(sample(100, 60, 70), at(t, 1000));
        floor.observe(sample(100, 70, 80), at(t, 2000));
        assert_eq!(floor.bound().map(|b| b.low), Some(100));
        // An operator replayed row 40: the sample read from the floor cannot have seen it.
        floor.observe(
            Sample {
                from: 100,
                generation: 1,
                ..sample(100, 80, 90)
            },
            at(t, 3000),
        );
        assert_eq!(
            floor.bound(),
            Some(Bound {
                low: 100,
                generation: 0
            }),
            "kept, under the old generation the claims no longer trust"
        );
        assert_eq!(floor.from(at(t, 4000)), 0, "read from the start");
        floor.observe(
            Sample {
                generation: 1,
                ..sample(40, 90, 95)
            },
            at(t, 4000),
        );
        assert_eq!(
            floor.bound(),
            Some(Bound {
                low: 40,
                generation: 1
            })
        );
        assert_eq!(floor.from(at(t, 5000)), 40);
    }

    #[test]
    fn the_floor_is_checked_from_the_start_every_minute() {
        let t = Instant::now();
        let mut floor = Floor::new();
        floor.observe(sample(100, 50, 60), t);
        floor.observe(
            Sample {
                from: 100,
                ..sample(100, 60, 70)
            },
            at(t, 1000),
        );
        floor.observe(
            Sample {
                from: 100,
                ..sample(100, 70, 80)
            },
            at(t, 2000),
        );
        assert_eq!(floor.from(at(t, 59_000)), 100);
        assert_eq!(floor.from(at(t, 60_000)), 0, "read from the start");
        // A row below the floor made unfinished by a tool that keeps no generation.
        floor.observe(sample(40, 80, 90), at(t, 60_000));
        assert_eq!(
            floor.bound().map(|b| b.low),
            Some(40),
            "lowered at once, never without a floor"
        );
        assert_eq!(floor.from(at(t, 61_000)), 40);
    }

    #[test]
    fn samples_are_due_once_a_second() {
        let t = Instant::now();
        let mut floor = Floor::new();
        assert!(floor.due(t));
        floor.observe(sample(1, 1, 2), t);
        assert!(!floor.due(at(t, 999)));
        assert!(floor.due(at(t, 1000)));
    }
}
