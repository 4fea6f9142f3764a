//! The admin API: see what is stuck, how far behind each side is and what died, and fix it.
//!
//! Read-only: [`status`], [`dead_letters`], [`dead_letter`], [`failure_groups`], [`audit_log`]
//! and [`doctor()`].
//! State changes: [`replay`], [`ignore`] and [`resend`] (and [`replay_group`], [`ignore_group`]
//! for a whole [`FailureGroup`]), each one short transaction that
//!
//! - moves only rows in the state the action expects (the expected status is part of the
//!   `UPDATE`): a row that is in another state, or gone, is left alone and listed in
//!   [`ActionReport::skipped`];
//! - appends one row to the audit table `outbox_admin_action` (what, which rows, how many, who,
//!   why, when), committed together with the change.
//!
//! The `outbox` CLI (feature `cli` of the `outbox` crate) is a thin shell over these functions.
//!
//! ```no_run
//! # async fn demo(db: sea_orm::DatabaseConnection) -> Result<(), outbox_runtime::admin::AdminError> {
//! use outbox_runtime::admin::{self, Actor, DeadLetterFilter, Page, Selector};
//!
//! let status = admin::status(&db).await?;
//! println!("outbox backlog {}, dead {}", status.outbox.backlog, status.outbox.dead);
//!
//! let filter = DeadLetterFilter::default().consumer("inventory").error_contains("timeout");
//! for dead in admin::dead_letters(&db, &filter, Page::default()).await? {
//!     println!("{} {:?} {:?}", dead.target, dead.event_type, dead.last_error);
//! }
//! let report = admin::replay(&db, &Selector::Filter(filter), &Actor::new("alice").reason("stock service fixed")).await?;
//! println!("replayed {}", report.affected());
//! # Ok(()) }
//! ```
//!
//! **Replay semantics.** An outbox event goes DEAD → PENDING with `attempts = 0`, no lease and no
//! backoff: the next relay round publishes it (and then the events of its aggregate it held
//! back). An inbox message goes DEAD → RETRY due now with `attempts = 0`: the consumer's worker
//! handles it at its next round. In both, `last_error` is kept, so an operator still sees why it
//! died, until the row succeeds (a relay's SENT and a worker's DONE clear it). Every failed
//! attempt is also kept in the error history (`outbox_failure`), which [`dead_letter`] returns
//! as [`DeadLetterDetail::failures`]: a replayed row's earlier deaths stay visible.
//!
//! **Resend** moves SENT outbox events back to PENDING (`sent_at` cleared), by event id or by a
//! [`SentFilter`] (event type, aggregate, when sent), so the relay publishes them again with the
//! same event ids: for a broker or a consumer that lost messages. Consumers whose
//! inbox still holds the event id suppress it as a duplicate.

mod actions;
pub mod bounds;
mod dead_letters;
mod doctor;
mod duration;
mod groups;
mod pause;
mod status;
mod storage;

use std::time::Duration;

use sea_orm::DbErr;
use serde::Serializer;

pub use crate::operations::{
    Actor, AdminAction, AdminError, DeadLetter, DeadLetterDetail, DeadLetterFilter, FailureRecord,
    SentFilter, Source, Target,
};
pub use actions::{
    ActionKind, ActionReport, Resend, Selector, Skipped, audit_log, ignore, replay, resend,
};
pub use dead_letters::{Page, dead_letter, dead_letters};
pub use doctor::{DoctorOptions, DoctorReport, Finding, Severity, doctor};
pub use duration::{HumanBytes, HumanDuration};
pub use groups::{
    FailureGroup, GROUP_SCAN_LIMIT, error_fingerprint, failure_groups, ignore_group,
    normalise_error, replay_group,
};
pub use pause::{MAX_PAUSE_NAME_CHARS, PauseKind, PauseReport, Paused, pause, pauses, resume};
pub use status::{
    ConsumerStatus, OutboxStatus, RelayStatus, Status, StatusCounts, WalSlotStatus, status,
};
pub use storage::{
    HorizonStatus, MIN_DEAD_ROWS, StorageStatus, TableStatus, rotate_inbox, storage_status,
};

/// Map a database error, recognising a missing table (the migrations were not applied).
pub(crate) fn db_error(doing: &'static str) -> impl FnOnce(DbErr) -> AdminError {
    move |source| {
        if crate::store::errors::is_missing_table(&source) {
            AdminError::NotMigrated(source)
        } else {
            AdminError::Database {
                doing,
                error: source,
            }
        }
    }
}

/// Serialize an optional duration as seconds (a float).
pub(crate) fn opt_secs<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_f64(d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

/// Serialize a duration as seconds (a float).
pub(crate) fn secs<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}
