//! Waiting until streaming standbys hold a commit (PostgreSQL): the primary knows how far each
//! standby has flushed the write-ahead log (`pg_stat_replication.flush_lsn`), and what a
//! standby has flushed survives its promotion. A row this session can read was committed at a
//! position no later than the log's current end, so once enough standbys have flushed past the
//! position read after it, a failover cannot take it back.
//!
//! A standby promoted between the work and the wait could hold the position without holding
//! the work (its own log went on from where it forked): the server's timeline, which moves on at
//! every promotion, is compared with the one seen before the work ([`Timeline`]).
//!
//! The role that reads `pg_stat_replication` must see its positions: a superuser, or a member of
//! `pg_monitor` (`pg_read_all_stats`); for others they read NULL and no standby ever counts.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement};

/// How long a relay's batch, or a consumer's delivery, waits for the standbys before it is
/// handed back (published by a later round) or nacked (redelivered).
pub const WAIT: Duration = Duration::from_secs(5);

/// The first pause between two looks at the standbys; doubled up to [`LOOK_CAP`].
const LOOK_FIRST: Duration = Duration::from_millis(2);
const LOOK_CAP: Duration = Duration::from_millis(50);

/// What [`wait_for_standbys`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standbys {
    /// `standbys` standbys have flushed past the position.
    Held,
    /// Fewer had by the deadline.
    NotYet {
        /// The position waited for (`pg_lsn` text).
        position: String,
        /// How many standbys had flushed past it.
        standbys: i64,
    },
    /// The server's timeline moved on since the work began: a standby was promoted in between,
    /// and what was read or written before may not be on the server answering now.
    Promoted {
        /// The timeline now.
        now: String,
    },
}

/// The server's timeline as a relay or a consumer last saw it, shared by all of its work: a
/// commit, or a read, made before a promotion is not known to be on the promoted server, so a
/// change of timeline between the work and the wait is never "held".
///
/// Each piece of work takes [`Timeline::seen`] before it touches the database and hands it to
/// the wait. Comparing with the last timeline seen at the wait instead would let work done on
/// the old primary pass once another piece of work had met the new one.
#[derive(Debug, Default)]
pub struct Timeline(std::sync::Mutex<Known>);

#[derive(Debug, Default)]
struct Known {
    timeline: Option<String>,
    /// Moves on at every timeline seen for the first time.
    generation: u64,
}

/// What a [`Timeline`] knew before a piece of work began (see [`Timeline::seen`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Seen(u64);

impl Seen {
    /// Nothing known: the server was not asked yet.
    pub const UNKNOWN: Seen = Seen(0);

    /// What two pieces of work handled together knew: the older.
    pub fn and(self, other: Seen) -> Seen {
        self.min(other)
    }
}

impl Timeline {
    /// Learn the timeline now, before any work that will be waited for.
    pub async fn learn(&self, db: &DatabaseConnection) -> Result<(), DbErr> {
        let now = timeline(db).await?;
        self.note(&now);
        Ok(())
    }

    /// What is known now: to take before a piece of work that will be waited for.
    pub fn seen(&self) -> Seen {
        Seen(self.0.lock().unwrap_or_else(|p| p.into_inner()).generation)
    }

    /// Remember `now` as the server's timeline; what is known then.
    fn note(&self, now: &str) -> Seen {
        let mut known = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if known.timeline.as_deref() != Some(now) {
            known.timeline = Some(now.to_owned());
            known.generation += 1;
        }
        Seen(known.generation)
    }
}

/// The timeline of the server answering (the first eight hex digits of the current log
/// segment's name; it moves on at every promotion).
const TIMELINE: &str = "substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)";

/// Standbys only: a logical replication connection (a WAL relay's, a CDC tool's) is listed
/// beside them but holds nothing a promotion keeps.
const PHYSICAL: &str = "pid NOT IN (SELECT active_pid FROM pg_replication_slots \
                        WHERE slot_type = 'logical' AND active_pid IS NOT NULL)";

pub(crate) async fn timeline(db: &DatabaseConnection) -> Result<String, DbErr> {
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            format!("SELECT {TIMELINE} AS timeline"),
        ))
        .await?
        .ok_or_else(|| DbErr::Custom("no answer about the timeline".into()))?;
    row.try_get("", "timeline")
}

/// Wait until `standbys` standbys have flushed the log past its current end (read now), for at
/// most `timeout`, on the timeline `timeline` knew as `before` (taken before the work; a change
/// since is [`Standbys::Promoted`]). An error (the primary gone, a failover under way) is the
/// caller's to treat as "not held".
pub async fn wait_for_standbys(
    db: &DatabaseConnection,
    standbys: u32,
    timeout: Duration,
    timeline: &Timeline,
    before: Seen,
) -> Result<Standbys, DbErr> {
    if db.get_database_backend() != DbBackend::Postgres {
        return Err(DbErr::Custom(
            "waiting for standbys needs PostgreSQL's streaming replication".into(),
        ));
    }
    let wanted = i64::from(standbys);
    let first = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            format!(
                "SELECT pg_current_wal_lsn()::text AS position, {TIMELINE} AS timeline, \
                 (SELECT COUNT(*) FROM pg_stat_replication WHERE flush_lsn >= \
                 pg_current_wal_lsn() AND {PHYSICAL}) AS standbys"
            ),
        ))
        .await?
        .ok_or_else(|| DbErr::Custom("no answer about the standbys".into()))?;
    let position: String = first.try_get("", "position")?;
    let mut on: String = first.try_get("", "timeline")?;
    let mut held: i64 = first.try_get("", "standbys")?;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = LOOK_FIRST;
    loop {
        if timeline.note(&on) != before {
            return Ok(Standbys::Promoted { now: on });
        }
        if held >= wanted {
            return Ok(Standbys::Held);
        }
        if tokio::time::Instant::now() + pause > deadline {
            return Ok(Standbys::NotYet {
                position,
                standbys: held,
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LOOK_CAP);
        (on, held) = flushed_past(db, &position).await?;
    }
}

/// The timeline, and how many standbys have flushed past `position`.
async fn flushed_past(db: &DatabaseConnection, position: &str) -> Result<(String, i64), DbErr> {
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            format!(
                "SELECT {TIMELINE} AS timeline, (SELECT COUNT(*) FROM pg_stat_replication \
                 WHERE flush_lsn >= $1::pg_lsn AND {PHYSICAL}) AS standbys"
            ),
            [position.into()],
        ))
        .await?
        .ok_or_else(|| DbErr::Custom("no answer about the standbys".into()))?;
    Ok((row.try_get("", "timeline")?, row.try_get("", "standbys")?))
}

/// Why what `timeline`'s owner just read or wrote, having known `before` of the timeline
/// beforehand, must not be announced yet (published, acked): `None` once `wanted` standbys hold
/// it, else a reason for the log. With the timeline not known before the work (the server was
/// away when it began), it is learnt now and this work waits for the next round.
pub async fn not_held(
    db: &DatabaseConnection,
    wanted: u32,
    timeline: &Timeline,
    before: Seen,
) -> Option<String> {
    if wanted == 0 {
        return None;
    }
    if before == Seen::UNKNOWN {
        return Some(match timeline.learn(db).await {
            Ok(()) => "the server's timeline was not known before the work; learnt now".into(),
            Err(e) => format!("could not ask the primary for its timeline: {e}"),
        });
    }
    match wait_for_standbys(db, wanted, WAIT, timeline, before).await {
        Ok(Standbys::Held) => None,
        Ok(Standbys::Promoted { now }) => Some(format!(
            "the server was promoted (its timeline is {now} now) since the work was done"
        )),
        Ok(Standbys::NotYet { position, standbys }) => Some(format!(
            "{standbys} of {wanted} standby(s) flushed the log past {position} within {WAIT:?} \
             (see pg_stat_replication)"
        )),
        Err(e) => Some(format!("could not ask the primary about its standbys: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_begun_before_a_new_timeline_is_never_held_after_it() {
        let timeline = Timeline::default();
        assert_eq!(timeline.seen(), Seen::UNKNOWN);
        let first = timeline.note("00000001");
        let before_a = timeline.seen();
        let before_b = timeline.seen();
        assert_eq!(before_a, first);
        // The same timeline again: what began before it is still on it.
        assert_eq!(timeline.note("00000001"), before_a);
        // One piece of work meets the promoted server first ...
        assert_ne!(timeline.note("00000002"), before_a);
        // ... and the other, begun before the promotion, meets it after: not the same.
        assert_ne!(timeline.note("00000002"), before_b);
        // Work begun after the first meeting is.
        let after = timeline.seen();
        assert_eq!(timeline.note("00000002"), after);
        // Two pieces handled together knew the older.
        assert_eq!(before_b.and(after), before_b);
    }
}
