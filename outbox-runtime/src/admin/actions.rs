//! The state changes an operator makes, each in one short transaction with its audit row:
//! [`replay`], [`ignore`], [`resend`]; and the audit log.

use std::fmt;

use sea_orm::DatabaseConnection;
use serde::Serialize;
use uuid::Uuid;

use super::{
    Actor, AdminAction, AdminError, DeadLetterFilter, SentFilter, Source, Target, db_error,
};
use crate::store::{
    admin::{self as sql, Rows, lock_statuses},
    status::{OutboxStatus, WorkStatus},
};

/// The state replay and ignore expect, in either table.
const DEAD: &str = WorkStatus::Dead.as_str();

/// What [`replay`] and [`ignore`] change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// These rows.
    Ids(Vec<Target>),
    /// Every dead letter matching a filter; an empty filter is refused (use [`Selector::All`]).
    Filter(DeadLetterFilter),
    /// Every dead letter, outbox and inbox (for [`ignore`]: every dead inbox message).
    All,
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selector::Ids(ids) => f.write_str(
                &ids.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            Selector::Filter(filter) => write!(f, "{filter}"),
            Selector::All => f.write_str("every dead letter"),
        }
    }
}

/// The kind of an admin action, as recorded in `outbox_admin_action.action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ActionKind {
    /// DEAD → PENDING (outbox) or RETRY (inbox).
    Replay,
    /// Inbox DEAD → IGNORED.
    Ignore,
    /// Outbox SENT → PENDING.
    Resend,
    /// Retention purge.
    Purge,
    /// A consumer or a destination paused.
    Pause,
    /// A consumer or a destination resumed.
    Resume,
}

impl ActionKind {
    /// The name stored in the audit table.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::Replay => "replay",
            ActionKind::Ignore => "ignore",
            ActionKind::Resend => "resend",
            ActionKind::Purge => "purge",
            ActionKind::Pause => "pause",
            ActionKind::Resume => "resume",
        }
    }
}

/// A row an action left alone: it is in another state than the action expects, or gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct Skipped {
    /// The row (`outbox:12`, `inbox:7`) or event id asked for.
    pub target: String,
    /// Its status, or `None` when there is no such row.
    pub status: Option<String>,
    /// The status the action applies to.
    #[cfg_attr(feature = "console", schema(value_type = String))]
    pub expected: &'static str,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.status {
            Some(status) => write!(
                f,
                "{} is {status}, not {}: left unchanged",
                self.target, self.expected
            ),
            None => write!(f, "{} not found", self.target),
        }
    }
}

/// What a state-changing admin action did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct ActionReport {
    /// The action.
    pub action: ActionKind,
    /// The id of its row in `outbox_admin_action`.
    pub audit_id: i64,
    /// Outbox rows changed.
    pub outbox: u64,
    /// Inbox rows changed.
    pub inbox: u64,
    /// Rows asked for by id that were left alone.
    pub skipped: Vec<Skipped>,
}

impl ActionReport {
    fn new(action: ActionKind) -> Self {
        ActionReport {
            action,
            audit_id: 0,
            outbox: 0,
            inbox: 0,
            skipped: Vec::new(),
        }
    }

    /// Rows changed, outbox and inbox.
    pub fn affected(&self) -> u64 {
        self.outbox + self.inbox
    }
}

fn split(targets: &[Target]) -> (Vec<i64>, Vec<i64>) {
    let mut outbox = Vec::new();
    let mut inbox = Vec::new();
    for t in targets {
        match t.source {
            Source::Outbox => outbox.push(t.id),
            Source::Inbox => inbox.push(t.id),
        }
    }
    outbox.sort_unstable();
    outbox.dedup();
    inbox.sort_unstable();
    inbox.dedup();
    (outbox, inbox)
}

/// Lock `ids`' rows and split them into those in `expected` state and the rest (reported).
async fn partition(
    txn: &sea_orm::DatabaseTransaction,
    source: Source,
    ids: &[i64],
    expected: &'static str,
    skipped: &mut Vec<Skipped>,
) -> Result<Vec<i64>, AdminError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let found = lock_statuses(txn, source, ids)
        .await
        .map_err(db_error("reading the rows' current status"))?;
    let mut ready = Vec::with_capacity(ids.len());
    for id in ids {
        match found.get(id) {
            Some(status) if status == expected => ready.push(*id),
            status => skipped.push(Skipped {
                target: Target { source, id: *id }.to_string(),
                status: status.cloned(),
                expected,
            }),
        }
    }
    Ok(ready)
}

/// Give dead letters another chance: outbox DEAD → PENDING, inbox DEAD → RETRY due now, both
/// with `attempts = 0` (see the module docs). Rows not DEAD are left alone (and, when selected by
/// id, reported in [`ActionReport::skipped`]). Recorded in the audit table.
pub async fn replay(
    db: &DatabaseConnection,
    selector: &Selector,
    actor: &Actor,
) -> Result<ActionReport, AdminError> {
    let sources = match selector {
        Selector::Ids(ids) if ids.is_empty() => return Err(AdminError::NoIds("replay")),
        Selector::Filter(filter) if filter.is_empty() => {
            return Err(AdminError::EmptyFilter("replay"));
        }
        Selector::Filter(filter) => filter.sources()?,
        _ => Vec::new(),
    };
    let txn = crate::store::tx::begin_admin(db)
        .await
        .map_err(db_error("beginning the replay"))?;
    let mut report = ActionReport::new(ActionKind::Replay);
    let doing = "replaying dead letters";
    match selector {
        Selector::Ids(targets) => {
            let (outbox, inbox) = split(targets);
            let outbox =
                partition(&txn, Source::Outbox, &outbox, DEAD, &mut report.skipped).await?;
            let inbox = partition(&txn, Source::Inbox, &inbox, DEAD, &mut report.skipped).await?;
            if !outbox.is_empty() {
                report.outbox = sql::replay_outbox(&txn, Rows::Ids(&outbox))
                    .await
                    .map_err(db_error(doing))?;
            }
            if !inbox.is_empty() {
                report.inbox = sql::replay_inbox(&txn, Rows::Ids(&inbox))
                    .await
                    .map_err(db_error(doing))?;
            }
        }
        Selector::Filter(filter) => {
            for source in sources {
                match source {
                    Source::Outbox => {
                        report.outbox = sql::replay_outbox(&txn, Rows::Filter(filter))
                            .await
                            .map_err(db_error(doing))?;
                    }
                    Source::Inbox => {
                        report.inbox = sql::replay_inbox(&txn, Rows::Filter(filter))
                            .await
                            .map_err(db_error(doing))?;
                    }
                }
            }
        }
        Selector::All => {
            let all = DeadLetterFilter::default();
            report.outbox = sql::replay_outbox(&txn, Rows::Filter(&all))
                .await
                .map_err(db_error(doing))?;
            report.inbox = sql::replay_inbox(&txn, Rows::Filter(&all))
                .await
                .map_err(db_error(doing))?;
        }
    }
    finish(txn, &mut report, &selector.to_string(), actor).await?;
    Ok(report)
}

/// Record the action in the audit table and commit it with the change.
/// Append the action's audit row in `txn` and commit it; returns the row's id.
pub(super) async fn audit_and_commit(
    txn: sea_orm::DatabaseTransaction,
    action: ActionKind,
    target: &str,
    affected: u64,
    actor: &Actor,
) -> Result<i64, AdminError> {
    let audit_id = sql::record_action(
        &txn,
        action.as_str(),
        target,
        affected,
        actor.name.as_deref(),
        actor.reason.as_deref(),
    )
    .await
    .map_err(db_error("recording the action in outbox_admin_action"))?;
    txn.commit()
        .await
        .map_err(db_error("committing the action"))?;
    Ok(audit_id)
}

async fn finish(
    txn: sea_orm::DatabaseTransaction,
    report: &mut ActionReport,
    target: &str,
    actor: &Actor,
) -> Result<(), AdminError> {
    report.audit_id =
        audit_and_commit(txn, report.action, target, report.affected(), actor).await?;
    tracing::info!(
        action = report.action.as_str(),
        target,
        outbox = report.outbox,
        inbox = report.inbox,
        skipped = report.skipped.len(),
        actor = actor.name.as_deref().unwrap_or(""),
        "outbox admin action"
    );
    Ok(())
}

/// Decide not to handle dead inbox messages: DEAD → IGNORED, with `processed_at` set so that
/// retention purges them after the dedup window. They no longer hold their aggregate back.
/// Selected by inbox id, by a filter (limited to the inbox), or all of them; rows not DEAD are
/// left alone (and, when selected by id, reported in [`ActionReport::skipped`]).
pub async fn ignore(
    db: &DatabaseConnection,
    selector: &Selector,
    actor: &Actor,
) -> Result<ActionReport, AdminError> {
    const ACTION: &str = "ignore";
    match selector {
        Selector::Ids(ids) if ids.is_empty() => return Err(AdminError::NoIds(ACTION)),
        Selector::Ids(ids) => {
            if let Some(target) = ids.iter().find(|t| t.source != Source::Inbox) {
                return Err(AdminError::WrongTable {
                    action: ACTION,
                    expected: Source::Inbox,
                    target: *target,
                });
            }
        }
        Selector::Filter(filter) if filter.is_empty() => {
            return Err(AdminError::EmptyFilter(ACTION));
        }
        Selector::Filter(filter) => {
            if filter.sources()? == [Source::Outbox] {
                return Err(AdminError::InboxOnly(ACTION));
            }
        }
        Selector::All => {}
    }
    let txn = crate::store::tx::begin_admin(db)
        .await
        .map_err(db_error("beginning the ignore"))?;
    let mut report = ActionReport::new(ActionKind::Ignore);
    let doing = "ignoring dead inbox messages";
    let all = DeadLetterFilter::default();
    let ready;
    let selected = match selector {
        Selector::Ids(targets) => {
            let (_, ids) = split(targets);
            ready = partition(&txn, Source::Inbox, &ids, DEAD, &mut report.skipped).await?;
            (!ready.is_empty()).then_some(Rows::Ids(&ready))
        }
        Selector::Filter(filter) => Some(Rows::Filter(filter)),
        Selector::All => Some(Rows::Filter(&all)),
    };
    if let Some(selected) = selected {
        report.inbox = sql::ignore_inbox(&txn, selected)
            .await
            .map_err(db_error(doing))?;
    }
    let target = match selector {
        Selector::All => "every dead inbox message".to_owned(),
        other => other.to_string(),
    };
    finish(txn, &mut report, &target, actor).await?;
    Ok(report)
}

/// What [`resend`] publishes again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resend {
    /// These events, by event id.
    Events(Vec<Uuid>),
    /// Every SENT event matching a filter; an empty filter is refused.
    Filter(SentFilter),
}

impl fmt::Display for Resend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resend::Events(ids) => write!(
                f,
                "outbox event {}",
                ids.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Resend::Filter(filter) => write!(f, "{filter}"),
        }
    }
}

/// Publish SENT outbox events again: SENT → PENDING with `sent_at` cleared, by event id or by a
/// filter. Events in another state are left alone (and, when named by id, reported in
/// [`ActionReport::skipped`]).
pub async fn resend(
    db: &DatabaseConnection,
    which: &Resend,
    actor: &Actor,
) -> Result<ActionReport, AdminError> {
    match which {
        Resend::Events(ids) if ids.is_empty() => return Err(AdminError::NoIds("resend")),
        Resend::Filter(filter) if filter.is_empty() => return Err(AdminError::EmptySentFilter),
        Resend::Filter(filter) => filter.check()?,
        Resend::Events(_) => {}
    }
    let txn = crate::store::tx::begin_admin(db)
        .await
        .map_err(db_error("beginning the resend"))?;
    let mut report = ActionReport::new(ActionKind::Resend);
    let doing = "resending events";
    match which {
        Resend::Events(event_ids) => {
            let mut wanted = event_ids.clone();
            wanted.sort_unstable();
            wanted.dedup();
            let found = sql::lock_by_event_ids(&txn, &wanted)
                .await
                .map_err(db_error("looking the events up"))?;
            let mut ready = Vec::with_capacity(wanted.len());
            for event_id in &wanted {
                match found.get(event_id) {
                    Some((id, status)) if status == OutboxStatus::Sent.as_str() => ready.push(*id),
                    other => report.skipped.push(Skipped {
                        target: format!("outbox event {event_id}"),
                        status: other.map(|(_, status)| status.clone()),
                        expected: OutboxStatus::Sent.as_str(),
                    }),
                }
            }
            if !ready.is_empty() {
                report.outbox = sql::resend_outbox(&txn, Rows::Ids(&ready))
                    .await
                    .map_err(db_error(doing))?;
            }
        }
        Resend::Filter(filter) => {
            report.outbox = sql::resend_outbox(&txn, Rows::Sent(filter))
                .await
                .map_err(db_error(doing))?;
        }
    }
    finish(txn, &mut report, &which.to_string(), actor).await?;
    Ok(report)
}

/// The newest `limit` admin actions, newest first.
pub async fn audit_log(
    db: &DatabaseConnection,
    limit: u32,
) -> Result<Vec<AdminAction>, AdminError> {
    sql::audit_log(db, u64::from(limit.max(1)))
        .await
        .map_err(db_error("reading outbox_admin_action"))
}
