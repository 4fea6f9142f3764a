//! One clock: every instant the SDK writes or compares (leases, due times, `created_at`,
//! `sent_at`, `processed_at`, retention cutoffs, the janitor's lease, the admin API's ages) is the
//! database's current time, evaluated in the statement that uses it, plus an offset the process
//! chose (a lease of 30 s, a backoff of 4 s). Processes on hosts whose wall clocks differ then
//! agree by construction: nothing a process binds says what time it is.
//!
//! The process's own wall clock is read only where nothing depends on it agreeing with another
//! host's (log lines, a loop's last success); intervals inside one process (backoff, polling,
//! timeouts) use the monotonic clock.
//!
//! This file says what an instant is; `sql.rs` writes one into a statement (`Sql::time`) and
//! reads the database's current time (`database_now`).

use std::time::Duration;

/// An instant by the database's clock: its current time when the statement runs, shifted by an
/// offset the process chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DbTime {
    /// Microseconds after the database's current time (negative: before).
    offset_micros: i64,
}

impl DbTime {
    /// The database's current time.
    pub const NOW: DbTime = DbTime { offset_micros: 0 };

    /// `d` after the database's current time (a lease's end, a retry's due time).
    pub fn after(d: Duration) -> DbTime {
        DbTime {
            offset_micros: i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        }
    }

    /// `d` before the database's current time (a retention cutoff).
    pub fn before(d: Duration) -> DbTime {
        DbTime {
            offset_micros: i64::try_from(d.as_micros()).map_or(i64::MIN, |m| -m),
        }
    }

    /// The offset from the database's current time, in microseconds, as statements bind it:
    /// with the test clock's skew (see [`skew_by`]) added.
    pub(crate) fn offset_micros(self) -> i64 {
        self.offset_micros.saturating_add(skew::micros())
    }
}

/// The test clock: a skew added to the database's time in the statements a thread builds, so a
/// test can let time pass (leases expire, retries come due) without waiting. Only with the
/// `test-util` feature; without it the skew is always zero and compiled out.
#[cfg(feature = "test-util")]
mod skew {
    use std::cell::Cell;

    thread_local! {
        static SKEW_MICROS: Cell<i64> = const { Cell::new(0) };
    }

    pub(super) fn micros() -> i64 {
        SKEW_MICROS.with(Cell::get)
    }

    pub(super) fn set(micros: i64) {
        SKEW_MICROS.with(|skew| skew.set(micros));
    }
}

#[cfg(not(feature = "test-util"))]
mod skew {
    pub(super) fn micros() -> i64 {
        0
    }
}

/// For the SDK's own tests: statements built on this thread from now on read the database's
/// clock as running `by` ahead (behind, when negative). A test on a current-thread runtime lets
/// time pass with it; other threads are unaffected.
#[cfg(feature = "test-util")]
pub fn skew_by(by: chrono::Duration) {
    skew::set(by.num_microseconds().unwrap_or(i64::MAX));
}
