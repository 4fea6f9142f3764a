//! [`Backoff`]: the retry delays of the relay, the inbox worker and the transports.

use std::time::Duration;

/// Exponential backoff with a cap and random jitter: `min(base · 2^attempt, cap) + jitter`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Backoff {
    pub(crate) base: Duration,
    pub(crate) cap: Duration,
    pub(crate) jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(300),
            jitter: 0.2,
        }
    }
}

crate::util::setters! {
    Backoff {
        /// Delay after the first failure. Default 1 s.
        base: Duration,

        /// Largest delay before jitter. Default 300 s.
        cap: Duration,

        /// Up to this fraction of the delay is added at random, so retries of many events spread
        /// out. Default 0.2.
        jitter: f64,
    }
}

impl Backoff {
    /// The delay before retry number `attempt` (0 for the first retry), without jitter.
    pub fn base_delay(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.min(31));
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The delay before retry number `attempt`, with jitter.
    pub fn delay(&self, attempt: u32) -> Duration {
        let delay = self.base_delay(attempt);
        let jitter = self.jitter.clamp(0.0, 1.0);
        // A cap near `Duration::MAX` saturates instead of panicking.
        let extra = Duration::try_from_secs_f64(delay.as_secs_f64() * jitter * fastrand::f64())
            .unwrap_or(Duration::MAX);
        delay.saturating_add(extra)
    }
}

/// How long an idle loop (the relay's claim loop, an inbox worker) sleeps before it claims
/// again: `poll` doubled for each claim in a row that found nothing (`empty_claims`), at most `idle_max`, and never past `next_due`, the
/// time until the earliest waiting row (a delayed event, a retry) is due (but at least `poll`). `idle_max` below `poll`
/// means no back-off.
pub(crate) fn idle_sleep(
    poll: Duration,
    idle_max: Duration,
    empty_claims: u32,
    next_due: Option<Duration>,
) -> Duration {
    let doubled = poll.saturating_mul(1u32 << empty_claims.min(16));
    let sleep = doubled.min(idle_max).max(poll);
    match next_due {
        Some(due) => sleep.min(due.max(poll)),
        None => sleep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_loop_backs_off_to_its_cap_and_no_further() {
        let (poll, cap) = (Duration::from_secs(1), Duration::from_secs(5));
        let sleeps: Vec<u64> = (0..6)
            .map(|n| idle_sleep(poll, cap, n, None).as_secs())
            .collect();
        assert_eq!(sleeps, [1, 2, 4, 5, 5, 5]);
        assert_eq!(idle_sleep(poll, cap, u32::MAX, None), cap, "no overflow");
    }

    #[test]
    fn without_a_cap_above_the_poll_there_is_no_back_off() {
        let poll = Duration::from_millis(200);
        for n in [0, 3, 40] {
            assert_eq!(idle_sleep(poll, poll, n, None), poll);
            assert_eq!(idle_sleep(poll, Duration::ZERO, n, None), poll);
        }
    }

    #[test]
    fn an_idle_sleep_ends_when_a_delayed_event_is_due_but_not_before_the_poll() {
        let (poll, cap) = (Duration::from_secs(1), Duration::from_secs(5));
        let due_in = |ms| Some(Duration::from_millis(ms));
        assert_eq!(
            idle_sleep(poll, cap, 4, due_in(2500)),
            Duration::from_millis(2500)
        );
        assert_eq!(
            idle_sleep(poll, cap, 4, due_in(0)),
            poll,
            "due already: the poll"
        );
        assert_eq!(idle_sleep(poll, cap, 4, due_in(60_000)), cap);
        assert_eq!(idle_sleep(poll, cap, 0, due_in(100)), poll);
    }
    use proptest::prelude::*;

    #[test]
    fn backoff_saturates_with_an_absurd_cap() {
        let backoff = Backoff {
            base: Duration::from_secs(1),
            cap: Duration::MAX,
            jitter: 1.0,
        };
        assert!(backoff.delay(200) >= backoff.base_delay(200));
        assert_eq!(backoff.base_delay(u32::MAX), Duration::from_secs(1 << 31));
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let b = Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(300),
            jitter: 0.0,
        };
        let delays: Vec<u64> = (0..12).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
    }

    proptest! {
        #[test]
        fn backoff_is_monotone_capped_and_jitter_bounded(
            base_ms in 1u64..10_000, cap_ms in 1u64..1_000_000, jitter in 0.0f64..1.0, n in 0u32..80
        ) {
            let b = Backoff { base: Duration::from_millis(base_ms), cap: Duration::from_millis(cap_ms), jitter };
            prop_assert!(b.base_delay(n) <= b.base_delay(n + 1));
            prop_assert!(b.base_delay(n) <= b.cap);
            let d = b.delay(n);
            prop_assert!(d >= b.base_delay(n));
            prop_assert!(d <= b.base_delay(n).mul_f64(1.0 + jitter) + Duration::from_nanos(1));
        }
    }
}
