//! The admin API: see what is stuck, how far behind each side is and what died, and fix it.
//!
//! Read-only: [`status`], [`dead_letters`], [`dead_letter`], [`audit_log`] and [`doctor()`].
//! State changes: [`replay`], [`ignore`] and [`resend`], each one short transaction that
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
//! died, until the row succeeds (a relay's SENT and a worker's DONE clear it).
//!
//! **Resend** moves a SENT outbox event back to PENDING (`sent_at` cleared), so the relay
//! publishes it again with the same event id: for a broker that lost messages. Consumers whose
//! inbox still holds the event id suppress it as a duplicate.

mod doctor;

use std::{collections::BTreeMap, fmt, str::FromStr, time::Duration};

use chrono::{DateTime, Utc};
use sea_orm::{DatabaseConnection, DbErr};
use serde::{Serialize, Serializer};
use uuid::Uuid;

use crate::store::{
    admin as sql,
    admin::{Rows, lock_statuses},
    inbox::inbox_status,
    outbox_status,
};

pub use doctor::{DoctorOptions, DoctorReport, Finding, Severity, doctor};

/// Why an admin call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The SDK's tables (or the operations tables of migration `outbox_0004`) are missing.
    #[error(
        "the outbox tables are missing or out of date ({0}); apply the SDK migrations: \
         `outbox migrate`, `outbox::migrate(&db)`, or your own Migrator with `outbox::migrations()`"
    )]
    NotMigrated(#[source] DbErr),
    /// A database call failed.
    #[error("{doing} failed: {source}")]
    Database {
        /// What the admin API was doing.
        doing: &'static str,
        /// The database's error.
        #[source]
        source: DbErr,
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

/// Map a database error, recognising a missing table (the migrations were not applied).
pub(crate) fn db_error(doing: &'static str) -> impl FnOnce(DbErr) -> AdminError {
    move |source| {
        let text = source.to_string();
        let missing_table = text.contains("no such table")
            || (text.contains("relation") && text.contains("does not exist"))
            || (text.contains("Table") && text.contains("doesn't exist"));
        if missing_table {
            AdminError::NotMigrated(source)
        } else {
            AdminError::Database { doing, source }
        }
    }
}

/// Which table a row lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
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

/// Serialize an optional duration as seconds (a float).
fn opt_secs<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_f64(d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

/// Serialize a duration as seconds (a float).
pub(crate) fn secs<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// Counts per status; every status the table knows is listed, with 0 when it has none.
pub type StatusCounts = BTreeMap<String, u64>;

/// What [`status`] found.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Status {
    /// When it was taken (ages are measured from here).
    pub at: DateTime<Utc>,
    /// The outbox.
    pub outbox: OutboxStatus,
    /// Each consumer seen in the inbox, by name.
    pub consumers: Vec<ConsumerStatus>,
}

impl Status {
    /// DEAD rows in the outbox and every consumer's inbox.
    pub fn dead_total(&self) -> u64 {
        self.outbox.dead + self.consumers.iter().map(|c| c.dead).sum::<u64>()
    }

    /// Rows in PROCESSING whose lease expired, outbox and inbox.
    pub fn stuck_total(&self) -> u64 {
        self.outbox.stuck + self.consumers.iter().map(|c| c.stuck).sum::<u64>()
    }
}

/// The outbox side of [`Status`].
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct OutboxStatus {
    /// Rows per status.
    pub counts: StatusCounts,
    /// All rows.
    pub total: u64,
    /// Not yet sent and still moving: PENDING, PROCESSING and RETRY.
    pub backlog: u64,
    /// When the oldest backlog event was enqueued.
    pub oldest_unsent_at: Option<DateTime<Utc>>,
    /// How long the oldest backlog event has waited (seconds in JSON).
    #[serde(rename = "oldest_unsent_age_secs", serialize_with = "opt_secs")]
    pub oldest_unsent_age: Option<Duration>,
    /// DEAD events, waiting for an operator (they hold back their aggregate's later events).
    pub dead: u64,
    /// PROCESSING events whose lease expired: their relay stopped. A running relay reclaims them.
    pub stuck: u64,
    /// The earliest expired lease among them.
    pub stuck_since: Option<DateTime<Utc>>,
}

/// One consumer's side of [`Status`].
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ConsumerStatus {
    /// Consumer name.
    pub consumer: String,
    /// Rows per status.
    pub counts: StatusCounts,
    /// All rows.
    pub total: u64,
    /// Not yet handled and still moving: PENDING, PROCESSING and RETRY.
    pub backlog: u64,
    /// When the oldest backlog message was received.
    pub oldest_unfinished_at: Option<DateTime<Utc>>,
    /// How long the oldest backlog message has waited: the consumer's lag (seconds in JSON).
    #[serde(rename = "lag_secs", serialize_with = "opt_secs")]
    pub lag: Option<Duration>,
    /// DEAD messages, waiting for an operator.
    pub dead: u64,
    /// PROCESSING messages whose lease expired: their worker stopped.
    pub stuck: u64,
    /// The earliest expired lease among them.
    pub stuck_since: Option<DateTime<Utc>>,
}

const OUTBOX_STATUSES: [&str; 5] = [
    outbox_status::PENDING,
    outbox_status::PROCESSING,
    outbox_status::RETRY,
    outbox_status::DEAD,
    outbox_status::SENT,
];

const INBOX_STATUSES: [&str; 6] = [
    inbox_status::PENDING,
    inbox_status::PROCESSING,
    inbox_status::RETRY,
    inbox_status::DEAD,
    inbox_status::DONE,
    inbox_status::IGNORED,
];

const MOVING: [&str; 3] = ["PENDING", "PROCESSING", "RETRY"];

fn age(now: DateTime<Utc>, then: Option<DateTime<Utc>>) -> Option<Duration> {
    then.map(|t| (now - t).to_std().unwrap_or_default())
}

/// Counts per status, backlog, oldest backlog age and dead count of the outbox and of each
/// consumer, and rows stuck in PROCESSING behind an expired lease.
///
/// Counts are exact (`COUNT(*)` per status), so on tables with many millions of rows this takes
/// as long as scanning the status index.
pub async fn status(db: &DatabaseConnection) -> Result<Status, AdminError> {
    let now = Utc::now();
    let mut outbox = OutboxStatus {
        counts: OUTBOX_STATUSES
            .iter()
            .map(|s| ((*s).to_owned(), 0))
            .collect(),
        total: 0,
        backlog: 0,
        oldest_unsent_at: None,
        oldest_unsent_age: None,
        dead: 0,
        stuck: 0,
        stuck_since: None,
    };
    for row in sql::outbox_counts(db)
        .await
        .map_err(db_error("counting outbox events"))?
    {
        let n = u64::try_from(row.count).unwrap_or(0);
        *outbox.counts.entry(row.status.clone()).or_default() += n;
        outbox.total += n;
        if MOVING.contains(&row.status.as_str()) {
            outbox.backlog += n;
            outbox.oldest_unsent_at = min_time(outbox.oldest_unsent_at, row.oldest);
        }
    }
    outbox.dead = outbox.counts[outbox_status::DEAD];
    outbox.oldest_unsent_age = age(now, outbox.oldest_unsent_at);
    for (_, n, since) in sql::stuck(db, Source::Outbox, now)
        .await
        .map_err(db_error("looking for stuck outbox events"))?
    {
        outbox.stuck = u64::try_from(n).unwrap_or(0);
        outbox.stuck_since = since;
    }

    let mut consumers: BTreeMap<String, ConsumerStatus> = BTreeMap::new();
    for row in sql::inbox_counts(db)
        .await
        .map_err(db_error("counting inbox messages"))?
    {
        let name = row.consumer.clone().unwrap_or_default();
        let c = consumer_entry(&mut consumers, &name);
        let n = u64::try_from(row.count).unwrap_or(0);
        *c.counts.entry(row.status.clone()).or_default() += n;
        c.total += n;
        if MOVING.contains(&row.status.as_str()) {
            c.backlog += n;
            c.oldest_unfinished_at = min_time(c.oldest_unfinished_at, row.oldest);
        }
    }
    for (consumer, n, since) in sql::stuck(db, Source::Inbox, now)
        .await
        .map_err(db_error("looking for stuck inbox messages"))?
    {
        let c = consumer_entry(&mut consumers, consumer.as_deref().unwrap_or_default());
        c.stuck = u64::try_from(n).unwrap_or(0);
        c.stuck_since = since;
    }
    for c in consumers.values_mut() {
        c.dead = c.counts[inbox_status::DEAD];
        c.lag = age(now, c.oldest_unfinished_at);
    }
    Ok(Status {
        at: now,
        outbox,
        consumers: consumers.into_values().collect(),
    })
}

fn consumer_entry<'a>(
    consumers: &'a mut BTreeMap<String, ConsumerStatus>,
    name: &str,
) -> &'a mut ConsumerStatus {
    consumers
        .entry(name.to_owned())
        .or_insert_with(|| ConsumerStatus {
            consumer: name.to_owned(),
            counts: INBOX_STATUSES
                .iter()
                .map(|s| ((*s).to_owned(), 0))
                .collect(),
            total: 0,
            backlog: 0,
            oldest_unfinished_at: None,
            lag: None,
            dead: 0,
            stuck: 0,
            stuck_since: None,
        })
}

fn min_time(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
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
    fn sources(&self) -> Result<Vec<Source>, AdminError> {
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

/// A page of a listing: at most `limit` items after skipping `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    /// Items per page (1 to 1,000). Default 50.
    pub limit: u32,
    /// Items skipped.
    pub offset: u64,
}

impl Default for Page {
    fn default() -> Self {
        Page {
            limit: 50,
            offset: 0,
        }
    }
}

impl Page {
    /// The largest page.
    pub const MAX_LIMIT: u32 = 1_000;

    /// Page `number` (from 1) of pages of `limit` items.
    pub fn number(number: u64, limit: u32) -> Self {
        let limit = limit.clamp(1, Self::MAX_LIMIT);
        Page {
            limit,
            offset: number.saturating_sub(1) * u64::from(limit),
        }
    }
}

/// One dead letter, as [`dead_letters`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct DeadLetter {
    /// Its id: `outbox:12` or `inbox:7`.
    #[serde(rename = "id")]
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

/// Every column of one outbox or inbox row, as [`dead_letter`] shows it.
#[derive(Debug, Clone, Serialize)]
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
    /// Trace context and user headers (outbox).
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
}

/// Dead outbox events and inbox messages matching `filter`, newest first (by `created_at` /
/// `received_at`, then id), one page of them.
pub async fn dead_letters(
    db: &DatabaseConnection,
    filter: &DeadLetterFilter,
    page: Page,
) -> Result<Vec<DeadLetter>, AdminError> {
    let limit = u64::from(page.limit.clamp(1, Page::MAX_LIMIT));
    let want = page.offset.saturating_add(limit);
    let mut all = Vec::new();
    for source in filter.sources()? {
        all.extend(
            sql::dead_letters(db, source, filter, want)
                .await
                .map_err(db_error("listing dead letters"))?,
        );
    }
    all.sort_by(|a, b| {
        b.arrived_at
            .cmp(&a.arrived_at)
            .then(a.target.source.cmp(&b.target.source))
            .then(b.target.id.cmp(&a.target.id))
    });
    Ok(all
        .into_iter()
        .skip(usize::try_from(page.offset).unwrap_or(usize::MAX))
        .take(usize::try_from(limit).unwrap_or(usize::MAX))
        .collect())
}

/// One outbox or inbox row in full, whatever its status.
pub async fn dead_letter(
    db: &DatabaseConnection,
    which: Target,
) -> Result<DeadLetterDetail, AdminError> {
    let found = match which.source {
        Source::Outbox => sql::outbox_detail(db, which.id).await,
        Source::Inbox => sql::inbox_detail(db, which.id).await,
    }
    .map_err(db_error("reading a row"))?;
    found.ok_or_else(|| AdminError::NotFound(which.to_string()))
}

/// What [`replay`] changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// These rows.
    Ids(Vec<Target>),
    /// Every dead letter matching a filter; an empty filter is refused (use [`Selector::All`]).
    Filter(DeadLetterFilter),
    /// Every dead letter, outbox and inbox.
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
}

impl ActionKind {
    /// The name stored in the audit table.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::Replay => "replay",
            ActionKind::Ignore => "ignore",
            ActionKind::Resend => "resend",
            ActionKind::Purge => "purge",
        }
    }
}

/// A row an action left alone: it is in another state than the action expects, or gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Skipped {
    /// The row (`outbox:12`, `inbox:7`) or event id asked for.
    pub target: String,
    /// Its status, or `None` when there is no such row.
    pub status: Option<String>,
    /// The status the action applies to.
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
    let now = Utc::now();
    let sources = match selector {
        Selector::Ids(ids) if ids.is_empty() => return Err(AdminError::NoIds("replay")),
        Selector::Filter(filter) if filter.is_empty() => {
            return Err(AdminError::EmptyFilter("replay"));
        }
        Selector::Filter(filter) => filter.sources()?,
        _ => Vec::new(),
    };
    let txn = sql::begin(db)
        .await
        .map_err(db_error("beginning the replay"))?;
    let mut report = ActionReport::new(ActionKind::Replay);
    let doing = "replaying dead letters";
    match selector {
        Selector::Ids(targets) => {
            let (outbox, inbox) = split(targets);
            let outbox =
                partition(&txn, Source::Outbox, &outbox, "DEAD", &mut report.skipped).await?;
            let inbox = partition(&txn, Source::Inbox, &inbox, "DEAD", &mut report.skipped).await?;
            if !outbox.is_empty() {
                report.outbox = sql::replay_outbox(&txn, Rows::Ids(&outbox))
                    .await
                    .map_err(db_error(doing))?;
            }
            if !inbox.is_empty() {
                report.inbox = sql::replay_inbox(&txn, Rows::Ids(&inbox), now)
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
                        report.inbox = sql::replay_inbox(&txn, Rows::Filter(filter), now)
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
            report.inbox = sql::replay_inbox(&txn, Rows::Filter(&all), now)
                .await
                .map_err(db_error(doing))?;
        }
    }
    finish(txn, &mut report, &selector.to_string(), actor, now).await?;
    Ok(report)
}

/// Record the action in the audit table and commit it with the change.
async fn finish(
    txn: sea_orm::DatabaseTransaction,
    report: &mut ActionReport,
    target: &str,
    actor: &Actor,
    now: DateTime<Utc>,
) -> Result<(), AdminError> {
    report.audit_id = sql::record_action(
        &txn,
        report.action.as_str(),
        target,
        report.affected(),
        actor.name.as_deref(),
        actor.reason.as_deref(),
        now,
    )
    .await
    .map_err(db_error("recording the action in outbox_admin_action"))?;
    txn.commit()
        .await
        .map_err(db_error("committing the action"))?;
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
pub async fn ignore(
    db: &DatabaseConnection,
    ids: &[i64],
    actor: &Actor,
) -> Result<ActionReport, AdminError> {
    if ids.is_empty() {
        return Err(AdminError::NoIds("ignore"));
    }
    let now = Utc::now();
    let targets: Vec<Target> = ids.iter().map(|id| Target::inbox(*id)).collect();
    let (_, ids) = split(&targets);
    let txn = sql::begin(db)
        .await
        .map_err(db_error("beginning the ignore"))?;
    let mut report = ActionReport::new(ActionKind::Ignore);
    let ready = partition(&txn, Source::Inbox, &ids, "DEAD", &mut report.skipped).await?;
    if !ready.is_empty() {
        report.inbox = sql::ignore_inbox(&txn, &ready, now)
            .await
            .map_err(db_error("ignoring dead inbox messages"))?;
    }
    let target = Selector::Ids(targets).to_string();
    finish(txn, &mut report, &target, actor, now).await?;
    Ok(report)
}

/// Publish a SENT outbox event again: SENT → PENDING with `sent_at` cleared. An event in another
/// state is left alone and reported in [`ActionReport::skipped`].
pub async fn resend(
    db: &DatabaseConnection,
    event_id: Uuid,
    actor: &Actor,
) -> Result<ActionReport, AdminError> {
    let now = Utc::now();
    let txn = sql::begin(db)
        .await
        .map_err(db_error("beginning the resend"))?;
    let mut report = ActionReport::new(ActionKind::Resend);
    let found = sql::lock_by_event_ids(&txn, &[event_id])
        .await
        .map_err(db_error("looking the event up"))?;
    let target = format!("outbox event {event_id}");
    match found.get(&event_id) {
        Some((id, status)) if status == outbox_status::SENT => {
            report.outbox = sql::resend_outbox(&txn, &[*id])
                .await
                .map_err(db_error("resending the event"))?;
        }
        other => report.skipped.push(Skipped {
            target: target.clone(),
            status: other.map(|(_, status)| status.clone()),
            expected: outbox_status::SENT,
        }),
    }
    finish(txn, &mut report, &target, actor, now).await?;
    Ok(report)
}

/// One row of the audit table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct AdminAction {
    /// Row id.
    pub id: i64,
    /// `replay`, `ignore`, `resend` or `purge`.
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

/// The newest `limit` admin actions, newest first.
pub async fn audit_log(
    db: &DatabaseConnection,
    limit: u32,
) -> Result<Vec<AdminAction>, AdminError> {
    sql::audit_log(db, u64::from(limit.max(1)))
        .await
        .map_err(db_error("reading outbox_admin_action"))
}

/// A [`Duration`] written and read the way operators type them: `7d`, `36h`, `1h30m`, `90s`,
/// `250ms`, `2w`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct HumanDuration(pub Duration);

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.is_zero() {
            return f.write_str("0s");
        }
        if d < Duration::from_secs(1) {
            return write!(f, "{}ms", d.as_millis());
        }
        let mut secs = d.as_secs();
        let mut parts = Vec::new();
        for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
            if secs >= size {
                parts.push(format!("{}{unit}", secs / size));
                secs %= size;
            }
            if parts.len() == 2 {
                break;
            }
        }
        f.write_str(&parts.join(" "))
    }
}

impl FromStr for HumanDuration {
    type Err = AdminError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || AdminError::BadDuration(s.to_owned());
        let text: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        if text.is_empty() {
            return Err(bad());
        }
        let mut total = Duration::ZERO;
        let mut rest = text.as_str();
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            if digits == 0 {
                return Err(bad());
            }
            let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            let unit = &rest[..unit_len];
            rest = &rest[unit_len..];
            let part = match unit {
                "ms" => Duration::from_millis(n),
                "s" | "" => Duration::from_secs(n),
                "m" | "min" => Duration::from_secs(n.saturating_mul(60)),
                "h" => Duration::from_secs(n.saturating_mul(3_600)),
                "d" => Duration::from_secs(n.saturating_mul(86_400)),
                "w" => Duration::from_secs(n.saturating_mul(604_800)),
                _ => return Err(bad()),
            };
            total = total.saturating_add(part);
        }
        Ok(HumanDuration(total))
    }
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
    fn durations_parse_and_print() {
        let d = |s: &str| s.parse::<HumanDuration>().unwrap().0;
        assert_eq!(d("7d"), Duration::from_secs(7 * 86_400));
        assert_eq!(d("1h30m"), Duration::from_secs(5_400));
        assert_eq!(d("250ms"), Duration::from_millis(250));
        assert_eq!(d("2w"), Duration::from_secs(14 * 86_400));
        assert_eq!(d("45"), Duration::from_secs(45));
        assert!("".parse::<HumanDuration>().is_err());
        assert!("7 days".parse::<HumanDuration>().is_err());
        assert!("d7".parse::<HumanDuration>().is_err());
        assert_eq!(
            HumanDuration(Duration::from_secs(14 * 86_400)).to_string(),
            "14d"
        );
        assert_eq!(
            HumanDuration(Duration::from_secs(5_430)).to_string(),
            "1h 30m"
        );
        assert_eq!(HumanDuration(Duration::from_millis(50)).to_string(), "50ms");
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
