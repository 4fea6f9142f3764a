//! Retention: delete what the SDK no longer needs, in small batches, one instance at a time.
//!
//! [`purge`] deletes SENT outbox events whose `sent_at` is older than
//! [`RetentionPolicy::sent_after`] and DONE or IGNORED inbox messages whose `processed_at` is
//! older than [`RetentionPolicy::done_after`], the inbox's *dedup window*. It never touches
//! anything unfinished or DEAD. Each batch of at most [`RetentionPolicy::batch_size`] rows is its
//! own short transaction, followed by a [`pause`](RetentionPolicy::pause), so a purge of
//! millions of rows never holds a long lock and relays and consumers keep running alongside.
//! Then it deletes the error history (`outbox_failure`) of rows that are finished or gone, older
//! than the same windows; a DEAD or unfinished row keeps its whole history.
//!
//! **Work queues given back their space (PostgreSQL).** While something holds the xmin horizon,
//! every event that leaves `outbox_event` and every message that leaves `inbox_event` stays
//! there as a dead version, and after the hold vacuum keeps the pages for reuse: the table would
//! keep the size of its longest hold for good. When a work queue's heap is at least
//! [`RetentionPolicy::compact_above`] and its live rows fill at most a quarter of it (counted at
//! 2 KiB a row), and nothing has held the horizon longer than [`COMPACT_HOLD_LIMIT`], a purge
//! rewrites the table with its live rows (`CLUSTER` by the primary key: ids, states and what
//! other transactions see stay as they were, and the WAL relay sees no new rows). Its writers
//! wait for the rewrite (milliseconds for a queue's few live rows); the rewrite waits at most
//! [`RetentionPolicy::compact_lock_timeout`] for the table's lock and is tried again at the next
//! purge otherwise. It needs the table's owner, like the migrations (another role gets a
//! warning in the log, and the table is left as it is).
//!
//! **The dedup window.** An inbox row is what makes a redelivered message a no-op. Delete it,
//! and a copy of the message arriving later is handled again. So `done_after` must be at least
//! the longest time after handling in which a copy can still arrive, the *redelivery horizon*:
//!
//! ```text
//! redelivery horizon = broker window      how long the broker may redeliver or keep a copy
//!                                         (JetStream max_age / duplicate window, a RabbitMQ
//!                                         queue's TTL, a Redis stream's retention)
//!                    + relay retry span   how long a relay may republish an event it thinks
//!                                         failed (sum of its backoff delays with jitter, plus a
//!                                         lease per attempt): see [`relay_retry_span`]
//!                    + manual window      how long after the fact an operator may `resend` or
//!                                         replay an event
//! ```
//!
//! [`redelivery_horizon`] adds them up; [`RetentionPolicy::validate`] refuses a policy whose
//! `done_after` is shorter. With the database-local transport the broker window is zero.
//!
//! The producer-side deduplication window does not depend on `sent_after`: an event's
//! `dedup_key` is refused by the unique index while the event is unsent, and by `outbox_key`
//! for at least one rotation period (a week by default) after that, whether its sent row is
//! still kept or not.
//!
//! **One instance at a time.** [`purge_once_if_leader`] runs a purge only in the instance that
//! holds the lease row `retention` of the table `outbox_lease` (same SQL on PostgreSQL, MySQL and
//! SQLite, no session-bound lock that a connection pool could lose). The lease lasts
//! [`RetentionPolicy::lease`] and is renewed before every batch; the holder keeps it after a
//! purge (it stays the leader while it keeps running), and another instance takes over once it
//! lapses, e.g. after the leader crashed. A purge that finds its lease taken stops after the
//! batch in flight. Purging twice at once would be harmless (deletes are idempotent), only
//! wasteful: the lease keeps the load on one instance.
//!
//! The runtime's janitor loop calls [`purge_once_if_leader`] on an interval; the CLI's
//! `outbox purge` calls [`purge_as`] directly.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::DatabaseConnection;
use serde::Serialize;

use crate::{
    admin::{
        ActionKind, Actor, AdminError, HumanBytes, HumanDuration, Source, bounds, db_error, secs,
    },
    relay::RelayConfig,
    store::{
        self, admin as sql, compact::Rewrite, lease, lease::LeaseHolder, retention as purge_sql,
    },
    util::backoff::Backoff,
};

/// The largest [`RetentionPolicy::batch_size`]: rows deleted in one transaction.
pub const MAX_BATCH_SIZE: usize = 100_000;

/// A work queue is rewritten only when nothing (a session's transaction, a prepared
/// transaction) has held the xmin horizon longer than this: the rewrite keeps every version a
/// holder may still see, so during a hold it would give back little.
pub const COMPACT_HOLD_LIMIT: Duration = Duration::from_secs(60);

/// The most a live row is counted at in a work queue's heap (PostgreSQL moves the payload of a
/// larger row to its TOAST table).
const ROW_BYTES_BOUND: i64 = 2048;

/// A work queue is rewritten when its live rows, at [`ROW_BYTES_BOUND`] each, fill at most one
/// part in this many of its heap.
const COMPACT_FILL: i64 = 4;

/// The name of the retention lease in `outbox_lease`.
pub const LEASE_NAME: &str = "retention";

/// What to delete and how fast.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetentionPolicy {
    pub(crate) sent_after: Duration,
    pub(crate) done_after: Duration,
    pub(crate) batch_size: usize,
    pub(crate) pause: Duration,
    pub(crate) lease: Duration,
    pub(crate) compact_above: Option<u64>,
    pub(crate) compact_lock_timeout: Duration,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        RetentionPolicy {
            sent_after: Duration::from_secs(7 * 86_400),
            done_after: Duration::from_secs(14 * 86_400),
            batch_size: 5_000,
            pause: Duration::from_millis(50),
            lease: Duration::from_secs(300),
            compact_above: Some(16 << 20),
            compact_lock_timeout: Duration::from_millis(100),
        }
    }
}

crate::util::setters! {
    RetentionPolicy {
        /// Delete SENT outbox events sent longer ago than this. Default 7 days.
        sent_after: Duration,

        /// Delete DONE and IGNORED inbox messages processed longer ago than this: the dedup window.
        /// Default 14 days.
        done_after: Duration,

        /// Rows per batch (per transaction). Default 5,000.
        batch_size: usize,

        /// Sleep between batches, giving other writers room. Default 50 ms.
        pause: Duration,

        /// How long the janitor lease lasts from its last renewal (renewed before each batch).
        /// Default 5 minutes.
        lease: Duration,

        /// Rewrite a work queue (`outbox_event`, `inbox_event`) whose heap has at least this many
        /// bytes and is at most a quarter full (see the module docs); `None` never does.
        /// PostgreSQL only. Default 16 MiB.
        compact_above: Option<u64>,

        /// How long a rewrite waits for its table's lock before giving up until the next purge
        /// (writers of the table queue behind it meanwhile). Default 100 ms, at most 10 s.
        compact_lock_timeout: Duration,
    }
}

/// Why a purge did not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RetentionError {
    /// The dedup window is shorter than the redelivery horizon.
    #[error(
        "the inbox dedup window (done_after = {window}) is shorter than the redelivery horizon \
         ({horizon}): a copy of a message arriving after its inbox row was purged would be \
         handled twice; set done_after to at least {horizon}"
    )]
    WindowTooShort {
        /// The policy's `done_after`.
        window: HumanDuration,
        /// The horizon it must cover.
        horizon: HumanDuration,
    },
    /// A setting is out of range.
    #[error("invalid retention policy: {0}")]
    Invalid(String),
    /// The database failed.
    #[error(transparent)]
    Database(#[from] AdminError),
}

impl RetentionPolicy {
    /// Check the policy: a dedup window at least `redelivery_horizon` long (see the module docs
    /// and [`redelivery_horizon`]), a batch size of at least one, and a lease longer than the
    /// pause between batches.
    pub fn validate(&self, redelivery_horizon: Duration) -> Result<(), RetentionError> {
        self.check_settings()?;
        bounds::check_age("redelivery_horizon", redelivery_horizon).map_err(invalid)?;
        if self.done_after < redelivery_horizon {
            return Err(RetentionError::WindowTooShort {
                window: HumanDuration(self.done_after),
                horizon: HumanDuration(redelivery_horizon),
            });
        }
        Ok(())
    }

    fn check_settings(&self) -> Result<(), RetentionError> {
        // The cutoffs and the lease's end are counted from the database's clock: each must stay
        // within what every backend stores.
        bounds::check_age("sent_after", self.sent_after).map_err(invalid)?;
        bounds::check_age("done_after", self.done_after).map_err(invalid)?;
        bounds::check_age("lease", self.lease).map_err(invalid)?;
        if !(1..=MAX_BATCH_SIZE).contains(&self.batch_size) {
            return Err(RetentionError::Invalid(format!(
                "batch_size is 1 to {MAX_BATCH_SIZE}, not {}",
                self.batch_size
            )));
        }
        if self.compact_lock_timeout.is_zero()
            || self.compact_lock_timeout > Duration::from_secs(10)
        {
            return Err(RetentionError::Invalid(format!(
                "compact_lock_timeout is more than 0 and at most 10s, not {}",
                HumanDuration(self.compact_lock_timeout)
            )));
        }
        if self.lease <= self.pause + Duration::from_secs(1) {
            return Err(RetentionError::Invalid(format!(
                "the lease ({}) must outlast a batch and its pause ({}) by more than a second",
                HumanDuration(self.lease),
                HumanDuration(self.pause)
            )));
        }
        Ok(())
    }
}

/// An out-of-range setting, as an invalid policy.
fn invalid(error: AdminError) -> RetentionError {
    RetentionError::Invalid(error.to_string())
}

/// How long a relay with `config` may keep republishing an event it believes failed: every
/// backoff delay at its maximum jitter, plus one lease per attempt (an expired lease counts as an
/// attempt, and is only noticed when it expires).
pub fn relay_retry_span(config: &RelayConfig) -> Duration {
    backoff_span(&config.backoff, config.max_attempts) + config.lease * config.max_attempts
}

fn backoff_span(backoff: &Backoff, max_attempts: u32) -> Duration {
    let jitter = 1.0 + backoff.jitter.clamp(0.0, 1.0);
    (0..max_attempts.saturating_sub(1))
        .map(|attempt| backoff.base_delay(attempt).mul_f64(jitter))
        .sum()
}

/// The redelivery horizon the dedup window must cover: `broker_window` (how long the broker may
/// redeliver or keep a copy of a message) + the relay's retry span + `manual_window` (how long
/// after the fact operators may resend or replay). See the module docs.
pub fn redelivery_horizon(
    broker_window: Duration,
    relay: &RelayConfig,
    manual_window: Duration,
) -> Duration {
    broker_window + relay_retry_span(relay) + manual_window
}

/// What a purge deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct PurgeReport {
    /// SENT outbox events deleted one by one (those an earlier release marked SENT in
    /// `outbox_event`; sent events in `outbox_sent` leave by whole slots, [`PurgeReport::slots_emptied`]).
    pub outbox_deleted: u64,
    /// DONE and IGNORED inbox messages deleted.
    pub inbox_deleted: u64,
    /// Entries of the error history deleted: those of finished (or deleted) rows older than the
    /// table's window. Not counted in [`PurgeReport::deleted`].
    pub failures_deleted: u64,
    /// Delete transactions run.
    pub batches: u64,
    /// Slots of the rotating tables (`outbox_sent`, `outbox_key`) emptied whole: each drops a
    /// slot's rows at once, however many; they are not counted in [`PurgeReport::deleted`] or
    /// `outbox_deleted`, which count the rows deleted one by one (SENT rows an earlier release
    /// left in `outbox_event`).
    pub slots_emptied: u64,
    /// Work queues rewritten with their live rows (see the module docs).
    pub compacted: Vec<Compacted>,
    /// Outbox events sent before this instant were eligible.
    pub sent_before: DateTime<Utc>,
    /// Inbox messages processed before this instant were eligible.
    pub done_before: DateTime<Utc>,
    /// How long it took (seconds in JSON).
    #[serde(rename = "elapsed_secs", serialize_with = "secs")]
    #[cfg_attr(feature = "console", schema(value_type = f64))]
    pub elapsed: Duration,
    /// The purge stopped early because another instance took the lease.
    pub lease_lost: bool,
    /// The audit row recording it (only written when something was deleted, or for an operator's
    /// [`purge_as`]).
    pub audit_id: Option<i64>,
}

/// A work queue a purge rewrote with its live rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct Compacted {
    /// `outbox_event` or `inbox_event`.
    pub table: String,
    /// Bytes of its heap before.
    pub bytes_before: i64,
    /// Bytes of its heap after.
    pub bytes_after: i64,
    /// Its live rows (the server's count) before.
    pub live_rows: i64,
}

impl PurgeReport {
    /// Rows deleted, outbox and inbox.
    pub fn deleted(&self) -> u64 {
        self.outbox_deleted + self.inbox_deleted
    }
}

/// Purge now, whoever else may be purging. Recorded in the audit table (actor `retention`) when
/// it deleted anything.
///
/// Cancel-safe: dropping the future loses at most the batch in flight, which rolls back.
pub async fn purge(
    db: &DatabaseConnection,
    policy: &RetentionPolicy,
) -> Result<PurgeReport, RetentionError> {
    policy.check_settings()?;
    run(db, policy, None, &Actor::new("retention"), false).await
}

/// [`purge`] on an operator's behalf: always recorded in the audit table, with `actor`.
pub async fn purge_as(
    db: &DatabaseConnection,
    policy: &RetentionPolicy,
    actor: &Actor,
) -> Result<PurgeReport, RetentionError> {
    policy.check_settings()?;
    run(db, policy, None, actor, true).await
}

/// Purge if this instance holds (or can take) the retention lease; `None` when another instance
/// holds it. For the runtime's janitor loop: call it on an interval from every instance.
pub async fn purge_once_if_leader(
    db: &DatabaseConnection,
    policy: &RetentionPolicy,
    instance_id: &str,
) -> Result<Option<PurgeReport>, RetentionError> {
    policy.check_settings()?;
    if !renew(db, policy, instance_id).await? {
        tracing::debug!(instance_id, "retention lease held by another instance");
        return Ok(None);
    }
    let actor = Actor::new(format!("retention:{instance_id}"));
    run(db, policy, Some(instance_id), &actor, false)
        .await
        .map(Some)
}

/// Give the retention lease up (e.g. at shutdown) if `instance_id` holds it, so another instance
/// can take over at once. Returns whether it held it.
pub async fn release_lease(
    db: &DatabaseConnection,
    instance_id: &str,
) -> Result<bool, RetentionError> {
    Ok(lease::release_lease(db, LEASE_NAME, instance_id)
        .await
        .map_err(db_error("releasing the retention lease"))?)
}

/// Who holds the retention lease, and until when (it may have lapsed).
pub async fn lease_holder(db: &DatabaseConnection) -> Result<Option<LeaseHolder>, RetentionError> {
    Ok(lease::lease_holder(db, LEASE_NAME)
        .await
        .map_err(db_error("reading the retention lease"))?)
}

async fn renew(
    db: &DatabaseConnection,
    policy: &RetentionPolicy,
    instance_id: &str,
) -> Result<bool, RetentionError> {
    Ok(
        lease::acquire_lease(db, LEASE_NAME, instance_id, policy.lease)
            .await
            .map_err(db_error("taking the retention lease"))?,
    )
}

fn cutoff(now: DateTime<Utc>, age: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(age)
        .ok()
        .and_then(|age| now.checked_sub_signed(age))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

async fn run(
    db: &DatabaseConnection,
    policy: &RetentionPolicy,
    leader: Option<&str>,
    actor: &Actor,
    always_record: bool,
) -> Result<PurgeReport, RetentionError> {
    let started = std::time::Instant::now();
    // The cutoffs count back from the database's clock, read once: the janitor's own clock
    // could run days ahead and delete rows inside the dedup window.
    let now = store::database_now(db)
        .await
        .map_err(db_error("reading the database's clock"))?;
    let mut report = PurgeReport {
        outbox_deleted: 0,
        inbox_deleted: 0,
        failures_deleted: 0,
        batches: 0,
        slots_emptied: 0,
        compacted: Vec::new(),
        sent_before: cutoff(now, policy.sent_after),
        done_before: cutoff(now, policy.done_after),
        elapsed: Duration::ZERO,
        lease_lost: false,
        audit_id: None,
    };
    // The rows first, then the history of what is finished or gone.
    'tables: for (source, history) in [
        (Source::Outbox, false),
        (Source::Inbox, false),
        (Source::Outbox, true),
        (Source::Inbox, true),
    ] {
        loop {
            if let Some(instance_id) = leader
                && report.batches > 0
                && !renew(db, policy, instance_id).await?
            {
                tracing::warn!(
                    instance_id,
                    "retention lease taken by another instance: purge stopped"
                );
                report.lease_lost = true;
                break 'tables;
            }
            let cutoff = match source {
                Source::Outbox => report.sent_before,
                Source::Inbox => report.done_before,
            };
            let deleted = match (source, history) {
                (_, true) => store::failures::purge(db, source, cutoff, policy.batch_size)
                    .await
                    .map_err(db_error("deleting the error history of finished rows"))?,
                (Source::Outbox, false) => purge_sql::purge_sent(db, cutoff, policy.batch_size)
                    .await
                    .map_err(db_error("deleting sent outbox events"))?,
                (Source::Inbox, false) => purge_sql::purge_finished(db, cutoff, policy.batch_size)
                    .await
                    .map_err(db_error("deleting processed inbox messages"))?,
            };
            report.batches += 1;
            match (source, history) {
                (_, true) => report.failures_deleted += deleted,
                (Source::Outbox, false) => report.outbox_deleted += deleted,
                (Source::Inbox, false) => report.inbox_deleted += deleted,
            }
            if deleted < policy.batch_size as u64 {
                break;
            }
            failpoint!(
                crate::failpoints::JANITOR_BETWEEN_BATCHES,
                Err(
                    db_error("deleting the next batch")(crate::failpoints::injected(
                        crate::failpoints::JANITOR_BETWEEN_BATCHES
                    ))
                    .into()
                )
            );
            tokio::time::sleep(policy.pause).await;
        }
    }
    if !report.lease_lost {
        for (table, window) in [
            (store::sent::SENT_TABLE, Some(policy.sent_after)),
            (store::keys::KEY_TABLE, None),
            (store::inbox_done::DONE_TABLE, Some(policy.done_after)),
            (store::inbox_done::INBOX_KEY_TABLE, None),
        ] {
            let emptied = store::rotation::empty_expired(db, table, window)
                .await
                .map_err(db_error("emptying the expired slots of a rotating table"))?;
            report.slots_emptied += emptied.len() as u64;
        }
        report.compacted = compact(db, policy).await?;
    }
    report.elapsed = started.elapsed();
    if always_record
        || report.deleted() > 0
        || report.slots_emptied > 0
        || !report.compacted.is_empty()
    {
        let mut target = format!(
            "outbox_event SENT before {}; inbox_event DONE/IGNORED before {}",
            crate::envelope::format_time(&report.sent_before),
            crate::envelope::format_time(&report.done_before),
        );
        for table in &report.compacted {
            target.push_str(&format!(
                "; {} rewritten from {} to {}",
                table.table,
                HumanBytes(table.bytes_before.max(0) as u64),
                HumanBytes(table.bytes_after.max(0) as u64),
            ));
        }
        if report.slots_emptied > 0 {
            target.push_str(&format!(
                "; {} slot(s) of outbox_sent, outbox_key, inbox_done and inbox_key emptied",
                report.slots_emptied
            ));
        }
        report.audit_id = Some(
            sql::record_action(
                db,
                ActionKind::Purge.as_str(),
                &target,
                report.deleted(),
                actor.name.as_deref(),
                actor.reason.as_deref(),
            )
            .await
            .map_err(db_error("recording the purge in outbox_admin_action"))?,
        );
    }
    tracing::info!(
        outbox_deleted = report.outbox_deleted,
        inbox_deleted = report.inbox_deleted,
        batches = report.batches,
        slots_emptied = report.slots_emptied,
        elapsed_ms = report.elapsed.as_millis() as u64,
        lease_lost = report.lease_lost,
        "retention purge"
    );
    Ok(report)
}

/// Whether a work queue is worth rewriting: [`bloated`], and nothing holding the horizon longer
/// than [`COMPACT_HOLD_LIMIT`] (`oldest_hold`: the longest any session or prepared transaction
/// has).
fn worth_compacting(
    table: &store::compact::Occupancy,
    above: Option<u64>,
    oldest_hold: Option<Duration>,
) -> bool {
    bloated(table, above) && oldest_hold.is_none_or(|age| age <= COMPACT_HOLD_LIMIT)
}

/// Whether a work queue's heap is at least `above` bytes (`None`: never) and its live rows (at
/// [`ROW_BYTES_BOUND`] each) fill at most a [`COMPACT_FILL`]th of it.
fn bloated(table: &store::compact::Occupancy, above: Option<u64>) -> bool {
    above.is_some_and(|above| {
        u64::try_from(table.heap_bytes).is_ok_and(|bytes| bytes >= above.max(1))
            && table
                .live_rows
                .max(0)
                .saturating_mul(ROW_BYTES_BOUND * COMPACT_FILL)
                <= table.heap_bytes
    })
}

/// Rewrite the work queues worth it (PostgreSQL; nothing elsewhere). A rewrite that did not get
/// its lock in time is left to the next purge.
async fn compact(
    db: &DatabaseConnection,
    policy: &RetentionPolicy,
) -> Result<Vec<Compacted>, RetentionError> {
    let size = |e| db_error("reading the work queues' size")(e);
    let bloated: Vec<store::compact::Occupancy> = store::compact::occupancy(db)
        .await
        .map_err(size)?
        .into_iter()
        .filter(|table| bloated(table, policy.compact_above))
        .collect();
    if bloated.is_empty() {
        return Ok(Vec::new());
    }
    let oldest_hold = store::health::holders(db)
        .await
        .map_err(db_error("reading what holds the xmin horizon"))?
        .iter()
        .filter(|holder| holder.kind != store::health::HolderKind::Slot)
        .filter_map(|holder| holder.age)
        .max();
    let mut rewritten = Vec::new();
    for table in &bloated {
        if !worth_compacting(table, policy.compact_above, oldest_hold) {
            tracing::info!(
                table = %table.table,
                heap_bytes = table.heap_bytes,
                held_secs = oldest_hold.map(|age| age.as_secs()),
                "work queue not rewritten while the xmin horizon is held"
            );
            continue;
        }
        let started = std::time::Instant::now();
        match store::compact::compact(db, &table.table, policy.compact_lock_timeout)
            .await
            .map_err(db_error("rewriting a work queue with its live rows"))?
        {
            Rewrite::Done => rewritten.push((table, started.elapsed())),
            Rewrite::LockBusy => tracing::info!(
                table = %table.table,
                lock_timeout_ms = policy.compact_lock_timeout.as_millis() as u64,
                "work queue not rewritten: its lock was busy; the next purge tries again"
            ),
            Rewrite::NotOwner => tracing::warn!(
                table = %table.table,
                heap_bytes = table.heap_bytes,
                live_rows = table.live_rows,
                "work queue not rewritten: the janitor's role does not own the table; run \
                 the janitor as the role that ran the migrations, or set \
                 RetentionPolicy::compact_above(None) and rewrite it yourself \
                 (CLUSTER by its primary key)"
            ),
            Rewrite::NotApplicable => {}
        }
    }
    if rewritten.is_empty() {
        return Ok(Vec::new());
    }
    // The sizes after, read once for every table rewritten.
    let after = store::compact::occupancy(db).await.map_err(size)?;
    Ok(rewritten
        .into_iter()
        .map(|(table, took)| {
            let bytes_after = after
                .iter()
                .find(|now| now.table == table.table)
                .map_or(0, |now| now.heap_bytes);
            tracing::info!(
                table = %table.table,
                bytes_before = table.heap_bytes,
                bytes_after,
                live_rows = table.live_rows,
                elapsed_ms = took.as_millis() as u64,
                "work queue rewritten with its live rows"
            );
            Compacted {
                table: table.table.clone(),
                bytes_before: table.heap_bytes,
                bytes_after,
                live_rows: table.live_rows,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_refuses_a_short_dedup_window() {
        let policy = RetentionPolicy::default();
        assert!(policy.validate(Duration::from_secs(86_400)).is_ok());
        let err = policy
            .validate(Duration::from_secs(30 * 86_400))
            .unwrap_err();
        assert!(matches!(err, RetentionError::WindowTooShort { .. }));
        assert!(err.to_string().contains("done_after = 14d"), "{err}");
        assert!(err.to_string().contains("30d"), "{err}");
        let zero = RetentionPolicy {
            batch_size: 0,
            ..RetentionPolicy::default()
        };
        assert!(matches!(
            zero.validate(Duration::ZERO),
            Err(RetentionError::Invalid(_))
        ));
    }

    fn queue(heap_bytes: i64, live_rows: i64) -> store::compact::Occupancy {
        store::compact::Occupancy {
            table: "outbox_event".to_owned(),
            heap_bytes,
            live_rows,
        }
    }

    #[test]
    fn a_work_queue_is_rewritten_when_large_and_nearly_empty() {
        let above = Some(16 << 20);
        // 90 MB for 12 rows, nothing holding the horizon: rewritten.
        assert!(worth_compacting(&queue(90 << 20, 12), above, None));
        // Below the threshold, or with it off: left alone.
        assert!(!worth_compacting(&queue(8 << 20, 12), above, None));
        assert!(!worth_compacting(&queue(90 << 20, 12), None, None));
        // A backlog that fills a quarter of it or more (at 2 KiB a row): left alone.
        let quarter = (90 << 20) / (2048 * 4);
        assert!(worth_compacting(&queue(90 << 20, quarter), above, None));
        assert!(!worth_compacting(
            &queue(90 << 20, quarter + 1),
            above,
            None
        ));
        // A holder of a minute is tolerated; a longer one keeps what the rewrite would remove.
        assert!(worth_compacting(
            &queue(90 << 20, 12),
            above,
            Some(COMPACT_HOLD_LIMIT)
        ));
        assert!(!worth_compacting(
            &queue(90 << 20, 12),
            above,
            Some(COMPACT_HOLD_LIMIT + Duration::from_secs(1))
        ));
        // The statistics' counts can be off: a negative count is none.
        assert!(worth_compacting(&queue(90 << 20, -1), above, None));
    }

    #[test]
    fn validate_refuses_a_lock_wait_out_of_range() {
        for timeout in [Duration::ZERO, Duration::from_secs(11)] {
            let policy = RetentionPolicy::default().compact_lock_timeout(timeout);
            assert!(
                matches!(policy.validate(Duration::ZERO), Err(RetentionError::Invalid(m)) if m.contains("compact_lock_timeout")),
                "{timeout:?}"
            );
        }
    }

    #[test]
    fn horizon_adds_broker_relay_and_manual_windows() {
        let relay = RelayConfig {
            max_attempts: 3,
            lease: Duration::from_secs(10),
            backoff: Backoff {
                base: Duration::from_secs(1),
                cap: Duration::from_secs(60),
                jitter: 0.5,
            },
            ..RelayConfig::default()
        };
        // Delays 1 s and 2 s at 1.5× jitter, plus three 10 s leases.
        assert_eq!(
            relay_retry_span(&relay),
            Duration::from_millis(4_500 + 30_000)
        );
        assert_eq!(
            redelivery_horizon(Duration::from_secs(100), &relay, Duration::from_secs(1_000)),
            Duration::from_millis(1_134_500)
        );
    }
}
