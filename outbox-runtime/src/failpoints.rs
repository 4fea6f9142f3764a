//! Failpoints for fault-injection tests (feature `failpoints`; without it they compile to nothing).
//!
//! Each constant names a place where a crash or an error hurts most. Arm one with
//! [`cfg()`](fn@cfg) (or the `FAILPOINTS` environment variable read by
//! [`FailScenario::setup`]) using the `fail` crate's action syntax:
//!
//! - `return`: the SDK behaves as if the process had died at that point, without writing or
//!   acknowledging anything more (the relay's claimed rows stay leased, the broker redelivers);
//! - `panic`: panics there; with a panic hook that aborts, the process dies at exactly that point;
//! - `sleep(ms)`, `pause`, `N%action`, `N*action`, `a->b`: as the `fail` crate documents.
//!
//! ```no_run
//! # fn main() {
//! use outbox_runtime::failpoints::{self, RELAY_AFTER_PUBLISH};
//! // The next 3 rounds publish, then "die" before marking their events SENT.
//! failpoints::cfg(RELAY_AFTER_PUBLISH, "3*return").unwrap();
//! # }
//! ```

pub use fail::{FailScenario, cfg, list, remove};

/// The relay claimed events (they are PROCESSING, leased to it) and has not published them.
pub const RELAY_AFTER_CLAIM: &str = "outbox::relay::after_claim";
/// The broker confirmed the events; the relay has not marked them SENT.
pub const RELAY_AFTER_PUBLISH: &str = "outbox::relay::after_publish";
/// A transaction committed events the relay's fast path owns (PROCESSING, leased to it); the
/// fast path has not published them.
pub const FAST_PATH_AFTER_COMMIT: &str = "outbox::fast_path::after_commit";
/// The broker confirmed the fast path's events; they are not marked SENT.
pub const FAST_PATH_AFTER_PUBLISH: &str = "outbox::fast_path::after_publish";
/// The broker confirmed the events the WAL relay read from the log; they are not marked SENT
/// and the slot's position is not confirmed.
pub const WAL_AFTER_PUBLISH: &str = "outbox::wal::after_publish";
/// The WAL relay marked a batch SENT; the slot's position is not confirmed (the batch is read
/// again).
pub const WAL_BEFORE_CONFIRM: &str = "outbox::wal::before_confirm";
/// A handler returned `Ok`; its transaction (effects, inbox row, follow-up events) is not
/// committed.
pub const INBOX_AFTER_HANDLER: &str = "outbox::inbox::after_handler";
/// The handler's transaction committed; the broker has not been acknowledged.
pub const INBOX_AFTER_COMMIT: &str = "outbox::inbox::after_commit";
/// A handler failed and its transaction rolled back; the RETRY (or DEAD) state is not stored.
pub const INBOX_STORE_RETRY: &str = "outbox::inbox::store_retry";
/// A webhook's message is recorded and committed; the sender has not been answered.
pub const WEBHOOK_AFTER_COMMIT: &str = "outbox::webhook::after_commit";
/// The retention janitor deleted a batch and has not deleted the next one.
pub const JANITOR_BETWEEN_BATCHES: &str = "outbox::janitor::between_batches";

/// Every failpoint, for harnesses that arm them in turn.
pub const ALL: [&str; 11] = [
    RELAY_AFTER_CLAIM,
    RELAY_AFTER_PUBLISH,
    FAST_PATH_AFTER_COMMIT,
    FAST_PATH_AFTER_PUBLISH,
    WAL_AFTER_PUBLISH,
    WAL_BEFORE_CONFIRM,
    INBOX_AFTER_HANDLER,
    INBOX_AFTER_COMMIT,
    INBOX_STORE_RETRY,
    WEBHOOK_AFTER_COMMIT,
    JANITOR_BETWEEN_BATCHES,
];

/// What a `return` failpoint fired: a type of this module's own, so that no error a database or
/// driver returns can pass for it, whatever its message says.
#[derive(Debug, thiserror::Error)]
#[error("failpoint {0} fired")]
struct Injected(String);

/// The error a `return` failpoint makes the SDK see: a database error carrying [`Injected`].
pub(crate) fn injected(name: &str) -> sea_orm::DbErr {
    sea_orm::DbErr::TryIntoErr {
        from: "failpoint",
        into: "crash",
        source: std::sync::Arc::new(Injected(name.to_owned())),
    }
}

/// Whether `err` came from a `return` failpoint: the process "died", so nothing more is done.
pub(crate) fn is_injected(err: &sea_orm::DbErr) -> bool {
    matches!(err, sea_orm::DbErr::TryIntoErr { source, .. } if source.downcast_ref::<Injected>().is_some())
}

#[cfg(test)]
mod tests {
    use sea_orm::DbErr;

    use super::{RELAY_AFTER_CLAIM, injected, is_injected};

    #[test]
    fn only_a_fired_failpoint_is_injected() {
        let fired = injected(RELAY_AFTER_CLAIM);
        assert!(is_injected(&fired));
        assert!(
            fired
                .to_string()
                .contains("outbox::relay::after_claim fired"),
            "{fired}"
        );
        // Errors that say the same words are not.
        for imitation in [
            DbErr::Custom(format!("failpoint {RELAY_AFTER_CLAIM} fired")),
            DbErr::Custom(fired.to_string()),
            DbErr::TryIntoErr {
                from: "failpoint",
                into: "crash",
                source: std::sync::Arc::new(std::io::Error::other("failpoint fired")),
            },
        ] {
            assert!(!is_injected(&imitation), "{imitation}");
        }
    }
}
