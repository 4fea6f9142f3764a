//! Pause and resume a consumer or the publishing of a destination: [`pause`], [`resume`],
//! [`pauses`]. The pause is a row of `outbox_pause` (migration `outbox_0015`), written with its
//! audit row in one transaction; every runtime reads the table every
//! [`PAUSE_REFRESH`](crate::pause::PAUSE_REFRESH) and honours it:
//!
//! - a paused **consumer** takes no message: its dispatcher stops taking deliveries from the
//!   broker (they wait there; one already taken waits in the process, neither handled nor
//!   nacked), and its worker claims no stored or retried message (they stay PENDING or RETRY).
//!   Handlers already running finish.
//! - a paused **destination** (the subject, topic, routing key or stream an event is published
//!   to, as `outbox status` and the catalogue name it; the event type for the database-local
//!   and in-memory transports) publishes nothing: its events stay PENDING with no attempt
//!   counted, and with per-aggregate ordering the later events of their aggregates wait behind
//!   them. Other destinations go on.

use std::fmt;

use chrono::{DateTime, Utc};
use sea_orm::DatabaseConnection;
use serde::{Deserialize, Serialize};

use super::{Actor, AdminError, actions::ActionKind, db_error};
use crate::store::pause as sql;

/// What a pause applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum PauseKind {
    /// A consumer: it takes no message.
    Consumer,
    /// A destination: nothing is published to it.
    Destination,
}

impl PauseKind {
    /// `consumer` or `destination`, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            PauseKind::Consumer => "consumer",
            PauseKind::Destination => "destination",
        }
    }

    /// The kind named `text` (`consumer` or `destination`).
    pub fn parse(text: &str) -> Option<PauseKind> {
        match text {
            "consumer" => Some(PauseKind::Consumer),
            "destination" => Some(PauseKind::Destination),
            _ => None,
        }
    }
}

impl fmt::Display for PauseKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A pause in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct Paused {
    /// What is paused.
    pub kind: PauseKind,
    /// The consumer's or the destination's name.
    pub name: String,
    /// Since when, by the database's clock.
    pub since: DateTime<Utc>,
    /// Who paused it.
    pub by: Option<String>,
    /// Why.
    pub reason: Option<String>,
}

/// What [`pause`] or [`resume`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct PauseReport {
    /// `pause` or `resume`.
    pub action: ActionKind,
    /// What it applies to.
    pub kind: PauseKind,
    /// The name.
    pub name: String,
    /// Whether it changed anything: `false` when it was paused already (for a pause) or not
    /// paused (for a resume). Both are audited.
    pub changed: bool,
    /// The id of its row in `outbox_admin_action`.
    pub audit_id: i64,
}

/// The longest name a pause takes (the column's width).
pub const MAX_PAUSE_NAME_CHARS: usize = 255;

/// The transaction of a pause or resume of `name`, once the name is one a pause can have.
async fn begin(
    db: &DatabaseConnection,
    name: &str,
) -> Result<sea_orm::DatabaseTransaction, AdminError> {
    check_name(name)?;
    crate::store::tx::begin_admin(db)
        .await
        .map_err(db_error("beginning the action"))
}

fn check_name(name: &str) -> Result<(), AdminError> {
    let chars = name.chars().count();
    if chars == 0 || chars > MAX_PAUSE_NAME_CHARS || name.chars().any(char::is_control) {
        return Err(AdminError::OutOfRange {
            field: "name".to_owned(),
            value: format!("{:?}", crate::util::text::truncate(name, 80)),
            accepted: "1 to 255 characters, no control characters",
        });
    }
    Ok(())
}

/// Pause `kind` `name`. Every runtime honours it within a few seconds; see the module docs.
pub async fn pause(
    db: &DatabaseConnection,
    kind: PauseKind,
    name: &str,
    actor: &Actor,
) -> Result<PauseReport, AdminError> {
    let txn = begin(db, name).await?;
    let existing = sql::find(&txn, kind.as_str(), name)
        .await
        .map_err(db_error("reading outbox_pause"))?;
    if existing.is_none() {
        sql::insert(
            &txn,
            kind.as_str(),
            name,
            actor.name.as_deref(),
            actor.reason.as_deref(),
        )
        .await
        .map_err(db_error("writing outbox_pause"))?;
    }
    finish(
        txn,
        ActionKind::Pause,
        kind,
        name,
        existing.is_none(),
        actor,
    )
    .await
}

/// Resume `kind` `name`: every runtime takes it up again within a few seconds.
pub async fn resume(
    db: &DatabaseConnection,
    kind: PauseKind,
    name: &str,
    actor: &Actor,
) -> Result<PauseReport, AdminError> {
    let txn = begin(db, name).await?;
    let removed = sql::delete(&txn, kind.as_str(), name)
        .await
        .map_err(db_error("writing outbox_pause"))?;
    finish(txn, ActionKind::Resume, kind, name, removed, actor).await
}

/// Every pause in force, consumers first, by name.
pub async fn pauses(db: &DatabaseConnection) -> Result<Vec<Paused>, AdminError> {
    let rows = sql::list(db)
        .await
        .map_err(db_error("reading outbox_pause"))?;
    Ok(rows
        .into_iter()
        .filter_map(|row| {
            Some(Paused {
                kind: PauseKind::parse(&row.kind)?,
                name: row.name,
                since: row.paused_at,
                by: row.paused_by,
                reason: row.reason,
            })
        })
        .collect())
}

async fn finish(
    txn: sea_orm::DatabaseTransaction,
    action: ActionKind,
    kind: PauseKind,
    name: &str,
    changed: bool,
    actor: &Actor,
) -> Result<PauseReport, AdminError> {
    let target = format!("{kind} {name}");
    let audit_id =
        super::actions::audit_and_commit(txn, action, &target, u64::from(changed), actor).await?;
    tracing::info!(
        action = action.as_str(),
        target,
        changed,
        actor = actor.name.as_deref().unwrap_or(""),
        "outbox admin action"
    );
    Ok(PauseReport {
        action,
        kind,
        name: name.to_owned(),
        changed,
        audit_id,
    })
}
