//! [`status`]: how far behind each side is, per status and consumer.

use std::{collections::BTreeMap, time::Duration};

use chrono::{DateTime, Utc};
use sea_orm::DatabaseConnection;
use serde::Serialize;

use super::{AdminError, Source, db_error, opt_secs};
use crate::store::{
    admin as sql, broker_state,
    status::{InboxStatus, OutboxStatus as RowStatus},
};

/// Counts per status; every status the table knows is listed, with 0 when it has none.
pub type StatusCounts = BTreeMap<String, u64>;

/// What [`status`] found.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct Status {
    /// When it was taken, by the database's clock (ages are measured from here).
    pub at: DateTime<Utc>,
    /// The outbox.
    pub outbox: OutboxStatus,
    /// Each consumer seen in the inbox, by name.
    pub consumers: Vec<ConsumerStatus>,
    /// Each relay that reported what it sees of its broker, by relay id (relays that stopped
    /// cleanly removed theirs).
    pub relays: Vec<RelayStatus>,
    /// The WAL relays' replication slots (PostgreSQL; names starting with `outbox`). A slot
    /// whose relay stopped keeps the server's WAL from being recycled: its lag grows.
    pub wal_slots: Vec<WalSlotStatus>,
    /// The queue tables (rows, dead row versions, bytes, vacuum) and the oldest holder of the
    /// xmin horizon; empty on SQLite.
    pub storage: super::StorageStatus,
    /// The consumers and destinations an operator paused (`outbox pause`), with who and why.
    pub paused: Vec<super::Paused>,
}

/// A WAL relay's replication slot in [`Status`].
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct WalSlotStatus {
    /// The slot's name (`WalConfig::slot`).
    pub slot: String,
    /// A relay streams from it now.
    pub active: bool,
    /// `reserved`, `extended`, `unreserved`, or `lost`: the WAL the slot needs is gone and it
    /// can never be streamed from again (its relay polls the table; drop the slot).
    pub wal_status: Option<String>,
    /// WAL written after the position its relay confirmed: how far the relay is behind.
    pub lag_bytes: u64,
    /// WAL the server keeps on disk for the slot.
    pub retained_bytes: u64,
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

    /// A running relay reports its broker unavailable (its circuit breaker is open).
    pub fn broker_unavailable(&self) -> bool {
        self.relays.iter().any(|r| r.current && !r.broker_available)
    }
}

/// The outbox side of [`Status`].
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
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
    #[cfg_attr(feature = "console", schema(value_type = Option<f64>))]
    pub oldest_unsent_age: Option<Duration>,
    /// DEAD events, waiting for an operator (they hold back their aggregate's later events).
    pub dead: u64,
    /// PROCESSING events whose lease expired: their relay stopped. A running relay reclaims them.
    pub stuck: u64,
    /// The earliest expired lease among them.
    pub stuck_since: Option<DateTime<Utc>>,
    /// Backlog events delayed by a broker outage: the whole backlog while a running relay
    /// reports its broker unavailable (nothing is published then), otherwise 0.
    pub delayed_by_outage: u64,
    /// Delayed events waiting in `outbox_scheduled` (`enqueue_at`, `enqueue_after`): not part
    /// of the backlog until due.
    pub scheduled: u64,
    /// When the earliest of them is due.
    pub next_due_at: Option<DateTime<Utc>>,
}

/// One relay's view of its broker in [`Status`], from the row the relay keeps in
/// `outbox_relay` (written when it starts, when its circuit breaker opens or closes, and every
/// `RelayConfig::heartbeat`).
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct RelayStatus {
    /// The relay's id (`RelayConfig::relay_id`).
    pub relay_id: String,
    /// Its transport (`nats`, `rabbitmq`, `redis`, …).
    pub transport: String,
    /// The row is current: the relay reported within three heartbeats. A row that is not
    /// belongs to a relay that stopped without removing it (killed, or its database writes
    /// failing); what it says is as of `heartbeat_at`.
    pub current: bool,
    /// The broker answers (the breaker is closed). `false`: the relay claims nothing and
    /// counts no attempt until a health check answers.
    pub broker_available: bool,
    /// When the broker last confirmed a publish or answered a health check.
    pub broker_seen_at: Option<DateTime<Utc>>,
    /// How long ago that was (seconds in JSON).
    #[serde(rename = "broker_seen_secs_ago", serialize_with = "opt_secs")]
    #[cfg_attr(feature = "console", schema(value_type = Option<f64>))]
    pub broker_seen_ago: Option<Duration>,
    /// While the broker is unavailable: since when.
    pub unavailable_since: Option<DateTime<Utc>>,
    /// For how long (seconds in JSON).
    #[serde(rename = "unavailable_secs", serialize_with = "opt_secs")]
    #[cfg_attr(feature = "console", schema(value_type = Option<f64>))]
    pub unavailable_for: Option<Duration>,
    /// Claimed events this relay handed back without an attempt during the current outage.
    pub held_back: u64,
    /// Outages since the relay started.
    pub outages: u64,
    /// Why the broker is (or was last) unavailable.
    pub last_error: Option<String>,
    /// When the relay started.
    pub started_at: DateTime<Utc>,
    /// Its last report.
    pub heartbeat_at: DateTime<Utc>,
}

/// One consumer's side of [`Status`].
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
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
    #[cfg_attr(feature = "console", schema(value_type = Option<f64>))]
    pub lag: Option<Duration>,
    /// DEAD messages, waiting for an operator.
    pub dead: u64,
    /// PROCESSING messages whose lease expired: their worker stopped.
    pub stuck: u64,
    /// The earliest expired lease among them.
    pub stuck_since: Option<DateTime<Utc>>,
}

/// The outbox rows that still move without an operator: what the oldest unsent age is
/// measured on.
fn moving(status: &str) -> bool {
    matches!(
        RowStatus::parse(status),
        Some(RowStatus::Pending | RowStatus::Processing | RowStatus::Retry)
    )
}

fn age(now: DateTime<Utc>, then: Option<DateTime<Utc>>) -> Option<Duration> {
    then.map(|t| (now - t).to_std().unwrap_or_default())
}

/// Counts per status, backlog, oldest backlog age and dead count of the outbox and of each
/// consumer, and rows stuck in PROCESSING behind an expired lease.
///
/// Counts are exact (`COUNT(*)` per status), so on tables with many millions of rows this takes
/// as long as scanning the status index.
pub async fn status(db: &DatabaseConnection) -> Result<Status, AdminError> {
    // Ages by the database's clock, which every timestamp was written by.
    let now = crate::store::database_now(db)
        .await
        .map_err(db_error("reading the database's clock"))?;
    let mut outbox = OutboxStatus {
        counts: RowStatus::ALL
            .iter()
            .map(|s| (s.as_str().to_owned(), 0))
            .collect(),
        total: 0,
        backlog: 0,
        oldest_unsent_at: None,
        oldest_unsent_age: None,
        dead: 0,
        stuck: 0,
        stuck_since: None,
        delayed_by_outage: 0,
        scheduled: 0,
        next_due_at: None,
    };
    for row in sql::outbox_counts(db)
        .await
        .map_err(db_error("counting outbox events"))?
    {
        let n = u64::try_from(row.count).unwrap_or(0);
        *outbox.counts.entry(row.status.clone()).or_default() += n;
        outbox.total += n;
        if moving(&row.status) {
            outbox.backlog += n;
            outbox.oldest_unsent_at = min_time(outbox.oldest_unsent_at, row.oldest);
        }
    }
    outbox.dead = outbox.counts[RowStatus::Dead.as_str()];
    let waiting = crate::store::scheduled::waiting(db)
        .await
        .map_err(db_error("counting delayed events"))?;
    outbox.scheduled = u64::try_from(waiting.count).unwrap_or(0);
    outbox.next_due_at = waiting.next_due;
    outbox.oldest_unsent_age = age(now, outbox.oldest_unsent_at);
    for sql::Stuck {
        count: n, since, ..
    } in sql::stuck(db, Source::Outbox)
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
        if InboxStatus::parse(&row.status).is_some_and(|s| InboxStatus::OPEN.contains(&s)) {
            c.backlog += n;
            c.oldest_unfinished_at = min_time(c.oldest_unfinished_at, row.oldest);
        }
    }
    for sql::Stuck {
        consumer,
        count: n,
        since,
    } in sql::stuck(db, Source::Inbox)
        .await
        .map_err(db_error("looking for stuck inbox messages"))?
    {
        let c = consumer_entry(&mut consumers, consumer.as_deref().unwrap_or_default());
        c.stuck = u64::try_from(n).unwrap_or(0);
        c.stuck_since = since;
    }
    for c in consumers.values_mut() {
        c.dead = c.counts[InboxStatus::Dead.as_str()];
        c.lag = age(now, c.oldest_unfinished_at);
    }
    let relays: Vec<RelayStatus> = broker_state::relays(db)
        .await
        .map_err(db_error("reading the relays' broker state"))?
        .into_iter()
        .map(|r| relay_status(now, r))
        .collect();
    let wal_slots = crate::store::wal::slots(db)
        .await
        .map_err(db_error("reading the replication slots"))?
        .into_iter()
        .map(|slot| WalSlotStatus {
            lag_bytes: u64::try_from(slot.lag_bytes.unwrap_or(0)).unwrap_or(0),
            retained_bytes: u64::try_from(slot.retained_bytes.unwrap_or(0)).unwrap_or(0),
            slot: slot.name,
            active: slot.active,
            wal_status: slot.wal_status,
        })
        .collect();
    let mut status = Status {
        at: now,
        outbox,
        consumers: consumers.into_values().collect(),
        relays,
        wal_slots,
        storage: super::storage_status(db).await?,
        paused: match super::pauses(db).await {
            // Before migration outbox_0015 nothing can be paused.
            Err(AdminError::NotMigrated(_)) => Vec::new(),
            other => other?,
        },
    };
    if status.broker_unavailable() {
        status.outbox.delayed_by_outage = status.outbox.backlog;
    }
    Ok(status)
}

fn relay_status(now: DateTime<Utc>, row: broker_state::RelayRow) -> RelayStatus {
    let available = row.broker_state != broker_state::UNAVAILABLE;
    RelayStatus {
        current: row.expires_at >= now,
        broker_available: available,
        broker_seen_ago: age(now, row.broker_seen_at),
        broker_seen_at: row.broker_seen_at,
        unavailable_for: age(now, row.unavailable_since).filter(|_| !available),
        unavailable_since: row.unavailable_since.filter(|_| !available),
        held_back: u64::try_from(row.held_back).unwrap_or(0),
        outages: u64::try_from(row.outages).unwrap_or(0),
        last_error: row.last_error,
        started_at: row.started_at,
        heartbeat_at: row.heartbeat_at,
        relay_id: row.relay_id,
        transport: row.transport,
    }
}

fn consumer_entry<'a>(
    consumers: &'a mut BTreeMap<String, ConsumerStatus>,
    name: &str,
) -> &'a mut ConsumerStatus {
    consumers
        .entry(name.to_owned())
        .or_insert_with(|| ConsumerStatus {
            consumer: name.to_owned(),
            counts: InboxStatus::ALL
                .iter()
                .map(|s| (s.as_str().to_owned(), 0))
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
