//! The vocabulary of the operations API ([`crate::admin`], [`crate::retention`], the CLI): which
//! table and row an action names, who acts, how dead letters are filtered, what an operator is
//! shown of a row, and why a call failed. Below both the admin API and the SQL that builds these
//! values.

use std::{fmt, str::FromStr};

use chrono::{DateTime, Utc};
use sea_orm::DbErr;
use serde::{Serialize, Serializer};

/// Why an admin call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The SDK's tables (or the operations tables of migration `outbox_0004`) are missing.
    #[error(
        "the outbox tables are missing or out of date ({0}); apply the SDK migrations: \
         `outbox migrate`, `outbox::migrate(&db)`, or your own Migrator with `outbox::migrations()`"
    )]
    NotMigrated(DbErr),
    /// A database call failed.
    #[error("{doing} failed: {error}")]
    Database {
        /// What the admin API was doing.
        doing: &'static str,
        /// The database's error.
        error: DbErr,
    },
    /// No row has this id.
    #[error("{0} not found (ids are shown by `outbox dead list`)")]
    NotFound(String),
    /// A row id could not be parsed.
    #[error(
        "`{0}` is not a row id: write `outbox:ID` or `inbox:ID`, as `outbox dead list` shows them"
    )]
    BadTarget(String),
    /// A duration could not be parsed.
    #[error(
        "`{0}` is not a duration: write a number with a unit, e.g. `7d`, `36h`, `90m`, `30s`, `500ms`"
    )]
    BadDuration(String),
    /// A selection by filter with no criterion.
    #[error(
        "refusing to {0} every dead letter with an empty filter: narrow it (consumer, event type, \
         aggregate id, error text) or select all of them explicitly"
    )]
    EmptyFilter(&'static str),
    /// A selection by id with no id.
    #[error("no row ids given to {0}")]
    NoIds(&'static str),
    /// A selection of sent events with no criterion.
    #[error(
        "refusing to resend every sent event with an empty filter: narrow it (event type, \
         aggregate type, aggregate id, sent after, sent before) or name the event ids"
    )]
    EmptySentFilter,
    /// An inbox-only action given a filter limited to the outbox.
    #[error("{0} applies to inbox messages only, but the filter selects the outbox")]
    InboxOnly(&'static str),
    /// A date or duration outside what every backend can store (see
    /// [`admin::bounds`](crate::admin::bounds)): refused before any SQL runs.
    #[error("`{field}` = {value} is out of range: accepted are {accepted}")]
    OutOfRange {
        /// The parameter, as the API names it.
        field: String,
        /// The value given.
        value: String,
        /// The accepted range.
        accepted: &'static str,
    },
    /// A filter on a consumer, which only inbox rows have, limited to the outbox.
    #[error("a consumer filter selects inbox messages, but the selection is limited to the outbox")]
    ConsumerOnOutbox,
    /// An action given a row of the wrong table.
    #[error("{action} applies to {expected} rows only; {target} is not one")]
    WrongTable {
        /// The action.
        action: &'static str,
        /// The table it applies to.
        expected: Source,
        /// The row given.
        target: Target,
    },
}

/// Which table a row lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// `outbox_event`: events waiting for (or done with) the relay.
    Outbox,
    /// `inbox_event`: messages received by a consumer.
    Inbox,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Outbox => "outbox",
            Source::Inbox => "inbox",
        })
    }
}

impl FromStr for Source {
    type Err = AdminError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "outbox" | "outbox_event" => Ok(Source::Outbox),
            "inbox" | "inbox_event" => Ok(Source::Inbox),
            _ => Err(AdminError::BadTarget(s.to_owned())),
        }
    }
}

/// One row of `outbox_event` or `inbox_event`, written `outbox:12` or `inbox:7`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    /// The table.
    pub source: Source,
    /// The row's `id`.
    pub id: i64,
}

impl Target {
    /// A row of `outbox_event`.
    pub fn outbox(id: i64) -> Self {
        Target {
            source: Source::Outbox,
            id,
        }
    }

    /// A row of `inbox_event`.
    pub fn inbox(id: i64) -> Self {
        Target {
            source: Source::Inbox,
            id,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.source, self.id)
    }
}

impl FromStr for Target {
    type Err = AdminError;

    /// `outbox:12`, `inbox:7` (also `outbox/12`, `o:12`, `i:7`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || AdminError::BadTarget(s.to_owned());
        let (table, id) = s.trim().split_once([':', '/']).ok_or_else(bad)?;
        let source = match table.to_ascii_lowercase().as_str() {
            "o" => Source::Outbox,
            "i" => Source::Inbox,
            other => other.parse().map_err(|_| bad())?,
        };
        let id = id.trim().parse().map_err(|_| bad())?;
        Ok(Target { source, id })
    }
}

impl Serialize for Target {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Who performs an admin action and why, recorded in the audit table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Actor {
    /// Who (a person or a tool), if known.
    pub name: Option<String>,
    /// Why, if given.
    pub reason: Option<String>,
}

impl Actor {
    /// An actor called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Actor {
            name: Some(name.into()),
            reason: None,
        }
    }

    /// Nobody in particular.
    pub fn anonymous() -> Self {
        Actor::default()
    }

    /// With a reason.
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }
}

/// Which dead letters to list or replay. Every criterion given must hold; none given selects all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DeadLetterFilter {
    /// Only outbox events or only inbox messages (default: both).
    pub source: Option<Source>,
    /// Only this consumer's inbox messages (implies the inbox).
    pub consumer: Option<String>,
    /// Only this event type.
    pub event_type: Option<String>,
    /// Only this aggregate id.
    pub aggregate_id: Option<String>,
    /// Only rows whose last error contains this text (case-insensitive).
    pub error_contains: Option<String>,
}

impl DeadLetterFilter {
    /// Only this table.
    pub fn source(mut self, source: Source) -> Self {
        self.source = Some(source);
        self
    }

    /// Only this consumer's inbox messages.
    pub fn consumer(mut self, consumer: impl Into<String>) -> Self {
        self.consumer = Some(consumer.into());
        self
    }

    /// Only this event type.
    pub fn event_type(mut self, event_type: impl Into<String>) -> Self {
        self.event_type = Some(event_type.into());
        self
    }

    /// Only this aggregate id.
    pub fn aggregate_id(mut self, aggregate_id: impl Into<String>) -> Self {
        self.aggregate_id = Some(aggregate_id.into());
        self
    }

    /// Only rows whose last error contains this text (case-insensitive).
    pub fn error_contains(mut self, text: impl Into<String>) -> Self {
        self.error_contains = Some(text.into());
        self
    }

    /// Whether no criterion narrows the selection.
    pub fn is_empty(&self) -> bool {
        self.source.is_none()
            && self.consumer.is_none()
            && self.event_type.is_none()
            && self.aggregate_id.is_none()
            && self.error_contains.is_none()
    }

    /// The tables this filter selects from.
    pub(crate) fn sources(&self) -> Result<Vec<Source>, AdminError> {
        match (self.source, &self.consumer) {
            (Some(Source::Outbox), Some(_)) => Err(AdminError::ConsumerOnOutbox),
            (_, Some(_)) => Ok(vec![Source::Inbox]),
            (Some(source), None) => Ok(vec![source]),
            (None, None) => Ok(vec![Source::Outbox, Source::Inbox]),
        }
    }
}

impl fmt::Display for DeadLetterFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(source) = self.source {
            parts.push(format!("source = {source}"));
        }
        if let Some(consumer) = &self.consumer {
            parts.push(format!("consumer = {consumer:?}"));
        }
        if let Some(event_type) = &self.event_type {
            parts.push(format!("event type = {event_type:?}"));
        }
        if let Some(aggregate_id) = &self.aggregate_id {
            parts.push(format!("aggregate id = {aggregate_id:?}"));
        }
        if let Some(text) = &self.error_contains {
            parts.push(format!("error contains {text:?}"));
        }
        if parts.is_empty() {
            f.write_str("every dead letter")
        } else {
            write!(f, "dead letters where {}", parts.join(", "))
        }
    }
}

/// Which SENT outbox events [`resend`](crate::admin::resend) publishes again: every criterion
/// set must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SentFilter {
    /// Only this event type.
    pub event_type: Option<String>,
    /// Only this aggregate type.
    pub aggregate_type: Option<String>,
    /// Only this aggregate id.
    pub aggregate_id: Option<String>,
    /// Only events sent at or after this instant.
    pub sent_after: Option<DateTime<Utc>>,
    /// Only events sent before this instant.
    pub sent_before: Option<DateTime<Utc>>,
}

impl SentFilter {
    /// Only this event type.
    pub fn event_type(mut self, event_type: impl Into<String>) -> Self {
        self.event_type = Some(event_type.into());
        self
    }

    /// Only this aggregate type.
    pub fn aggregate_type(mut self, aggregate_type: impl Into<String>) -> Self {
        self.aggregate_type = Some(aggregate_type.into());
        self
    }

    /// Only this aggregate id.
    pub fn aggregate_id(mut self, aggregate_id: impl Into<String>) -> Self {
        self.aggregate_id = Some(aggregate_id.into());
        self
    }

    /// Only events sent at or after `at`.
    pub fn sent_after(mut self, at: DateTime<Utc>) -> Self {
        self.sent_after = Some(at);
        self
    }

    /// Only events sent before `at`.
    pub fn sent_before(mut self, at: DateTime<Utc>) -> Self {
        self.sent_before = Some(at);
        self
    }

    /// Whether no criterion narrows the selection.
    pub fn is_empty(&self) -> bool {
        self.event_type.is_none()
            && self.aggregate_type.is_none()
            && self.aggregate_id.is_none()
            && self.sent_after.is_none()
            && self.sent_before.is_none()
    }
}

impl fmt::Display for SentFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(event_type) = &self.event_type {
            parts.push(format!("event type = {event_type:?}"));
        }
        if let Some(aggregate_type) = &self.aggregate_type {
            parts.push(format!("aggregate type = {aggregate_type:?}"));
        }
        if let Some(aggregate_id) = &self.aggregate_id {
            parts.push(format!("aggregate id = {aggregate_id:?}"));
        }
        if let Some(at) = &self.sent_after {
            parts.push(format!(
                "sent at or after {}",
                crate::envelope::format_time(at)
            ));
        }
        if let Some(at) = &self.sent_before {
            parts.push(format!("sent before {}", crate::envelope::format_time(at)));
        }
        if parts.is_empty() {
            f.write_str("every sent event")
        } else {
            write!(f, "sent events where {}", parts.join(", "))
        }
    }
}

/// One dead letter, as [`dead_letters`](crate::admin::dead_letters) lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct DeadLetter {
    /// Its id: `outbox:12` or `inbox:7`.
    #[serde(rename = "id")]
    #[cfg_attr(feature = "console", schema(value_type = String, example = "outbox:12"))]
    pub target: Target,
    /// The consumer (inbox messages).
    pub consumer: Option<String>,
    /// The event id (outbox) or message id (inbox).
    pub message_id: String,
    /// Event type, when known.
    pub event_type: Option<String>,
    /// Aggregate type, when known.
    pub aggregate_type: Option<String>,
    /// Aggregate id, when known.
    pub aggregate_id: Option<String>,
    /// Attempts made.
    pub attempts: i64,
    /// Why it died.
    pub last_error: Option<String>,
    /// When it was enqueued (outbox `created_at`) or received (inbox `received_at`).
    pub arrived_at: DateTime<Utc>,
}

/// Every column of one outbox or inbox row, as [`dead_letter`](crate::admin::dead_letter) shows it.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct DeadLetterDetail {
    /// What the listing shows.
    #[serde(flatten)]
    pub summary: DeadLetter,
    /// Its current status (it may have been replayed since it was listed).
    pub status: String,
    /// CloudEvents source, when known.
    pub source: Option<String>,
    /// Payload schema version, when known.
    pub schema_version: Option<i64>,
    /// Aggregate version, when known.
    pub aggregate_version: Option<i64>,
    /// Producer-side dedup key (outbox).
    pub dedup_key: Option<String>,
    /// Trace context and user headers (outbox), or the headers a receiver kept with the
    /// message (inbox: a webhook's, a foreign message's). Values of headers that may hold a
    /// credential or a signature are shown as `***`.
    pub headers: Option<serde_json::Value>,
    /// The payload: the event's JSON data (outbox), or the message as received, decoded as UTF-8
    /// with invalid bytes replaced (inbox).
    pub payload: String,
    /// The CloudEvents envelope: the one the relay publishes (outbox), or the received message
    /// parsed as JSON when it is JSON (inbox).
    pub envelope: Option<serde_json::Value>,
    /// Why no envelope can be built from the outbox row (its payload or headers are broken).
    pub envelope_error: Option<String>,
    /// When it is due again (RETRY).
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Who holds or last held its lease.
    pub locked_by: Option<String>,
    /// When its lease ends or ended.
    pub locked_until: Option<DateTime<Utc>>,
    /// When the broker confirmed it (outbox).
    pub sent_at: Option<DateTime<Utc>>,
    /// When it was handled or ignored (inbox).
    pub processed_at: Option<DateTime<Utc>>,
    /// Its failed attempts, oldest first (the newest 100): what each attempt left it as and why.
    /// `last_error` is the newest of them.
    pub failures: Vec<FailureRecord>,
}

/// One failed attempt of an outbox event or inbox message, from the error history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct FailureRecord {
    /// The row's attempt count after this failure.
    pub attempt: i64,
    /// What the failure left it as: `RETRY` or `DEAD`.
    pub status: String,
    /// The error.
    pub error: String,
    /// When, by the database's clock.
    pub at: DateTime<Utc>,
}

/// One row of the audit table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct AdminAction {
    /// Row id.
    pub id: i64,
    /// `replay`, `ignore`, `resend`, `purge`, `pause` or `resume`.
    pub action: String,
    /// The rows or filter it applied to.
    pub target: String,
    /// Rows it changed or deleted.
    pub rows_affected: i64,
    /// Who, if given.
    pub actor: Option<String>,
    /// Why, if given.
    pub reason: Option<String>,
    /// When.
    pub at: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_print() {
        assert_eq!("outbox:12".parse::<Target>().unwrap(), Target::outbox(12));
        assert_eq!("inbox:7".parse::<Target>().unwrap(), Target::inbox(7));
        assert_eq!("i/7".parse::<Target>().unwrap(), Target::inbox(7));
        assert_eq!(Target::inbox(7).to_string(), "inbox:7");
        assert!("12".parse::<Target>().is_err());
        assert!("queue:1".parse::<Target>().is_err());
        assert!("outbox:x".parse::<Target>().is_err());
    }

    #[test]
    fn filters_choose_tables() {
        let f = DeadLetterFilter::default();
        assert!(f.is_empty());
        assert_eq!(f.sources().unwrap(), [Source::Outbox, Source::Inbox]);
        let f = DeadLetterFilter::default().consumer("inventory");
        assert_eq!(f.sources().unwrap(), [Source::Inbox]);
        let f = DeadLetterFilter::default()
            .consumer("inventory")
            .source(Source::Outbox);
        assert!(matches!(f.sources(), Err(AdminError::ConsumerOnOutbox)));
        assert_eq!(
            DeadLetterFilter::default()
                .event_type("order.placed")
                .error_contains("timeout")
                .to_string(),
            "dead letters where event type = \"order.placed\", error contains \"timeout\""
        );
    }
}
