//! The states of the SDK's tables, one typed enum per state machine, rendered into SQL by the
//! statement builders: no statement spells a status by hand.
//!
//! ```text
//! outbox_event: PENDING → PROCESSING → SENT
//!                          PROCESSING → RETRY → PROCESSING …   (publish failed; due later)
//!                          PROCESSING | RETRY → DEAD           (max_attempts)
//!               admin:     DEAD → PENDING (replay), SENT → PENDING (resend)
//! inbox_event:  (insert) → DONE | PENDING | RETRY | DEAD
//!               PENDING | RETRY → PROCESSING → DONE | RETRY | DEAD   (worker)
//!               admin:     DEAD → RETRY (replay), DEAD → IGNORED
//! ```

macro_rules! statuses {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        // Not every table's enum needs each of these (the claim's `WorkStatus` never lists all).
        #[allow(dead_code)]
        impl $name {
            /// Every state.
            pub const ALL: [$name; [$($text),+].len()] = [$($name::$variant),+];

            /// The value stored in the `status` column.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The value as an SQL string literal, for predicates that must match a partial
            /// index's exactly (a bound parameter would not).
            pub const fn literal(self) -> &'static str {
                match self {
                    $($name::$variant => concat!("'", $text, "'"),)+
                }
            }

            /// The state a `status` column holds, if it is one of these.
            pub fn parse(text: &str) -> Option<Self> {
                match text {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }

            /// `{prefix}status IN ('A', 'B')` (or `= 'A'` for one).
            pub fn in_list(prefix: &str, states: &[Self]) -> String {
                in_list(prefix, states.iter().map(|s| s.literal()))
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// `{prefix}status IN (…)` (or `= …` for one) of status literals.
pub(crate) fn in_literals(prefix: &str, literals: &[&str]) -> String {
    in_list(prefix, literals.iter().copied())
}

fn in_list<'a>(prefix: &str, literals: impl Iterator<Item = &'a str>) -> String {
    let literals: Vec<&str> = literals.collect();
    match literals.as_slice() {
        [one] => format!("{prefix}status = {one}"),
        many => format!("{prefix}status IN ({})", many.join(", ")),
    }
}

statuses! {
    /// `outbox_event.status`.
    OutboxStatus {
        /// Committed, not yet claimed.
        Pending = "PENDING",
        /// Claimed by a relay under a lease.
        Processing = "PROCESSING",
        /// Confirmed by the broker.
        Sent = "SENT",
        /// A publish failed; due again at `next_attempt_at`.
        Retry = "RETRY",
        /// Gave up after `max_attempts`; waits for an operator.
        Dead = "DEAD",
    }
}

statuses! {
    /// `inbox_event.status`.
    InboxStatus {
        /// Recorded, to be handled by the worker.
        Pending = "PENDING",
        /// Claimed by a worker under a lease.
        Processing = "PROCESSING",
        /// Handled; its effects committed.
        Done = "DONE",
        /// The handler failed; due again at `next_attempt_at`.
        Retry = "RETRY",
        /// Cannot be handled; waits for an operator.
        Dead = "DEAD",
        /// Set aside by an operator.
        Ignored = "IGNORED",
    }
}

statuses! {
    /// The states both work queues (`outbox_event`, `inbox_event`) share: what a claim reads.
    WorkStatus {
        /// Waiting to be claimed.
        Pending = "PENDING",
        /// Claimed under a lease.
        Processing = "PROCESSING",
        /// Due again at `next_attempt_at`.
        Retry = "RETRY",
        /// Holds its aggregate back until an operator acts.
        Dead = "DEAD",
    }
}

impl OutboxStatus {
    /// Every state but SENT: the rows a relay still has to do something about.
    pub const UNSENT: [OutboxStatus; 4] = [
        OutboxStatus::Pending,
        OutboxStatus::Processing,
        OutboxStatus::Retry,
        OutboxStatus::Dead,
    ];
}

impl InboxStatus {
    /// The states that hold a message's aggregate back (the partial indexes' predicate).
    pub const UNFINISHED: [InboxStatus; 4] = [
        InboxStatus::Pending,
        InboxStatus::Processing,
        InboxStatus::Retry,
        InboxStatus::Dead,
    ];

    /// The states a worker still has to handle.
    pub const OPEN: [InboxStatus; 3] = [
        InboxStatus::Pending,
        InboxStatus::Processing,
        InboxStatus::Retry,
    ];

    /// The states retention may delete.
    pub const FINISHED: [InboxStatus; 2] = [InboxStatus::Done, InboxStatus::Ignored];
}

impl WorkStatus {
    /// The rows a claim can take or has in flight: what the queues' id indexes hold
    /// (`outbox_event_open_idx`, `inbox_event_open_idx`). DEAD rows are left out: they are not
    /// claimable, and the ordering checks find them through the aggregate indexes.
    pub const OPEN: [WorkStatus; 3] = [
        WorkStatus::Pending,
        WorkStatus::Processing,
        WorkStatus::Retry,
    ];
}

/// Where a failed attempt goes, on either table: due again later, or given up on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Try again `delay` after the failure is written (by the database's clock).
    Retry {
        /// Attempts so far, this one included.
        attempts: u32,
        /// How long after the write it is due again.
        delay: std::time::Duration,
        /// Why it failed.
        error: String,
    },
    /// Give up; an operator must look.
    Dead {
        /// Attempts so far, this one included.
        attempts: u32,
        /// Why.
        error: String,
    },
}

impl Failure {
    /// The fate of a failed attempt, the same on both tables: DEAD when the failure can never
    /// be cured (`permanent`) or `attempts` (this one included) reached `max_attempts`, else
    /// RETRY after `delay()`.
    pub fn after(
        attempts: u32,
        max_attempts: u32,
        permanent: bool,
        delay: impl FnOnce() -> std::time::Duration,
        error: String,
    ) -> Failure {
        if permanent || attempts >= max_attempts {
            Failure::Dead { attempts, error }
        } else {
            Failure::Retry {
                attempts,
                delay: delay(),
                error,
            }
        }
    }

    /// Attempts so far.
    pub fn attempts(&self) -> u32 {
        match self {
            Failure::Retry { attempts, .. } | Failure::Dead { attempts, .. } => *attempts,
        }
    }

    /// Why it failed.
    pub fn error(&self) -> &str {
        match self {
            Failure::Retry { error, .. } | Failure::Dead { error, .. } => error,
        }
    }

    /// When it is due again, by the database's clock (`None` when DEAD).
    pub fn due(&self) -> Option<super::DbTime> {
        match self {
            Failure::Retry { delay, .. } => Some(super::DbTime::after(*delay)),
            Failure::Dead { .. } => None,
        }
    }

    /// Whether it is given up on.
    pub fn is_dead(&self) -> bool {
        matches!(self, Failure::Dead { .. })
    }

    /// The state it puts an outbox row in.
    pub fn outbox_status(&self) -> OutboxStatus {
        if self.is_dead() {
            OutboxStatus::Dead
        } else {
            OutboxStatus::Retry
        }
    }

    /// The state it puts an inbox row in.
    pub fn inbox_status(&self) -> InboxStatus {
        if self.is_dead() {
            InboxStatus::Dead
        } else {
            InboxStatus::Retry
        }
    }
}

/// `outbox_event.failure_class`: what kind of failure an event's last failed attempt was,
/// written beside `last_error`. The relay decides by the class, never by the wording of
/// `last_error` (rows failed by a release before `outbox_0010` have no class).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureClass {
    /// The broker did not confirm in time.
    Timeout,
    /// The connection to the broker failed before the confirm.
    Connection,
    /// The broker refused the message; a retry may succeed.
    Rejected,
    /// The message can never be published (refused for good, or no envelope can be made).
    Permanent,
    /// Relays crashed or hung while publishing it, more times than allowed.
    LeaseExpired,
    /// The row cannot be read (written by hand with a malformed value).
    Unreadable,
}

impl FailureClass {
    /// The classes of failures that may say the broker is unavailable rather than anything
    /// about the event: after an outage, the retries they pushed back are due at once.
    pub const OUTAGE: [FailureClass; 2] = [FailureClass::Timeout, FailureClass::Connection];

    /// The value as an SQL string literal.
    pub const fn literal(self) -> &'static str {
        match self {
            FailureClass::Timeout => "'TIMEOUT'",
            FailureClass::Connection => "'CONNECTION'",
            FailureClass::Rejected => "'REJECTED'",
            FailureClass::Permanent => "'PERMANENT'",
            FailureClass::LeaseExpired => "'LEASE_EXPIRED'",
            FailureClass::Unreadable => "'UNREADABLE'",
        }
    }

    /// The value stored in the column.
    pub const fn as_str(self) -> &'static str {
        match self {
            FailureClass::Timeout => "TIMEOUT",
            FailureClass::Connection => "CONNECTION",
            FailureClass::Rejected => "REJECTED",
            FailureClass::Permanent => "PERMANENT",
            FailureClass::LeaseExpired => "LEASE_EXPIRED",
            FailureClass::Unreadable => "UNREADABLE",
        }
    }
}

impl std::fmt::Display for FailureClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Failure;

    #[test]
    fn the_fate_of_a_failed_attempt() {
        let second = Duration::from_secs(1);
        // (attempts, max_attempts, permanent, dead)
        let cases = [
            (1, 3, false, false),
            (2, 3, false, false),
            (3, 3, false, true),
            (4, 3, false, true),
            (1, 3, true, true),
            (1, 1, false, true),
            (1, 0, false, true),
        ];
        for (attempts, max, permanent, dead) in cases {
            let failure = Failure::after(attempts, max, permanent, || second, "e".into());
            assert_eq!(
                failure.is_dead(),
                dead,
                "{attempts}/{max} permanent={permanent}"
            );
            assert_eq!(failure.attempts(), attempts);
            assert_eq!(failure.error(), "e");
            assert_eq!(failure.due().is_some(), !dead);
        }
    }
}
