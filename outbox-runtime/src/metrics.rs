//! Metrics, recorded through the [`metrics`](https://docs.rs/metrics) crate: install any recorder
//! (e.g. `metrics-exporter-prometheus`) and these series appear. Names follow Prometheus
//! conventions; durations are in seconds.
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `outbox_events_written_total` | counter | | event rows written at commit |
//! | `outbox_events_published_total` | counter | `transport` | events the broker confirmed (marked SENT) |
//! | `outbox_fast_path_events_total` | counter | `transport` | events a commit handed to the relay's fast path (published right after commit; the rest go through the claim loop) |
//! | `outbox_publish_failures_total` | counter | `transport` | failed publishes (RETRY or DEAD) |
//! | `outbox_events_dead_total` | counter | | outbox events that went DEAD |
//! | `outbox_stale_claims_total` | counter | | relay writes fenced off (lease taken over) |
//! | `outbox_relay_errors_total` | counter | | relay rounds that failed (database, transport) |
//! | `outbox_broker_available` | gauge | `transport` | 1 while the relay sees the broker, 0 while its breaker is open (the broker is unavailable: nothing is claimed, no attempt is counted) |
//! | `outbox_broker_outages_total` | counter | `transport` | times the relay found the broker unavailable and stopped claiming |
//! | `outbox_broker_last_seen_seconds` | gauge | `transport` | time since the broker last confirmed a publish or answered a health check, as of the relay's last heartbeat (`RelayConfig::heartbeat`) or breaker change |
//! | `outbox_events_held_back_total` | counter | `transport` | claimed events handed back without an attempt because the broker was unavailable |
//! | `outbox_publish_lag_seconds` | histogram | `transport` | enqueue (commit) to broker confirmation |
//! | `outbox_relay_claim_duration_seconds` | histogram | `transport` | one claim of the claim loop (its statement, with the retries of a deadlock), whether it found events or not |
//! | `outbox_wal_left_to_table_total` | counter | `transport` | events the WAL relay left to the claim loop (behind an unsent earlier event of their aggregate) |
//! | `outbox_wal_fallbacks_total` | counter | `slot` | times a WAL relay could not stream (slot dropped or invalidated, `wal_level` not `logical`) and fell back to polling |
//! | `outbox_wal_slot_lag_bytes` | gauge | `slot` | WAL written after the position a WAL relay's slot confirmed: how far the relay is behind (grows while it is stopped) |
//! | `outbox_wal_slot_retained_bytes` | gauge | `slot` | WAL the server keeps on disk for the slot |
//! | `outbox_backlog_events` | gauge | `status` | unsent outbox rows per status |
//! | `outbox_oldest_pending_age_seconds` | gauge | | age of the oldest unsent, not dead event |
//! | `outbox_table_bytes` | gauge | `table` | bytes of a queue table with its indexes (PostgreSQL, MySQL) |
//! | `outbox_table_live_rows` | gauge | `table` | rows of a queue table (the server's estimate) |
//! | `outbox_table_dead_rows` | gauge | `table` | dead row versions vacuum has not removed yet (PostgreSQL) |
//! | `outbox_xmin_horizon_age_seconds` | gauge | | how long the oldest session or prepared transaction has held its snapshot (0 without one): while it does, vacuum removes nothing newer |
//! | `inbox_messages_total` | counter | `consumer`, `outcome` | `handled`, `retried`, `dead`, `duplicate`, `stored`, `stale`, `conflict`, `unrecorded` (a database error while recording a delivery; it is tried again) |
//! | `inbox_handler_duration_seconds` | histogram | `consumer`, `event_type` | handler run time |
//! | `inbox_backlog_messages` | gauge | `consumer`, `status` | unfinished inbox rows per status (the retry backlog is `RETRY`) |
//! | `outbox_paused` | gauge | `kind`, `name` | 1 while an operator has paused the consumer or destination (`outbox pause`), 0 once resumed |
//! | `inbox_end_to_end_seconds` | histogram | `consumer` | from the producer's commit (the event's enqueue time, by the producer database's clock) to the commit of the handler's transaction (by this process's clock): the figure to page on |
//! | `outbox_fleet_database_owned` | gauge | `database` | over a set of databases (`fleet`): 1 while an instance holds the database's lease, 0 while nobody does (set by every instance) |
//! | `outbox_fleet_owned_databases` | gauge | | over a set: how many databases this instance owns |
//! | `outbox_fleet_database_refused` | gauge | `database` | over a set with a connection budget: 1 while the database is refused (its server's connections would exceed the budget), 0 once it joins |
//! | `outbox_fleet_server_connection_ceiling` | gauge | `server` | over a set: the most connections the service's live instances can hold on the database server (instances × its databases' pool sizes) |
//! | `outbox_fleet_server_connection_limit` | gauge | `server` | over a set: the connection budget per server, or the server's own `max_connections` without one |
//!
//! **Over a set of databases** (`fleet`) the series of a database's loops also carry
//! `database`, the database's name: the relay's (`outbox_events_published_total`,
//! `outbox_fast_path_events_total`, `outbox_publish_failures_total`, `outbox_events_dead_total`,
//! `outbox_stale_claims_total`, `outbox_events_held_back_total`, `outbox_publish_lag_seconds`),
//! the consumers' (`inbox_messages_total`, `inbox_handler_duration_seconds`,
//! `inbox_end_to_end_seconds`) and the sampler's gauges; `outbox_fleet_database_owned` has
//! `database` alone. A runtime over one database writes no `database` label, so its series and
//! the queries over them stay as they were.
//!
//! Beside these, the OpenTelemetry messaging conventions' own metrics are recorded under their
//! names (`messaging.client.sent.messages`, `messaging.client.operation.duration`,
//! `messaging.client.consumed.messages`, `messaging.process.duration`; see
//! [`telemetry`](crate::telemetry)). Where a series of the SDK has a counterpart there:
//!
//! | SDK series | OpenTelemetry messaging metric (unit) |
//! |---|---|
//! | `outbox_events_published_total` + `outbox_publish_failures_total` | `messaging.client.sent.messages` (`{message}`; failures carry `error.type`) |
//! | `inbox_messages_total` | `messaging.client.consumed.messages` (`{message}`) counts each delivery received; the outcome stays the SDK's |
//! | `inbox_handler_duration_seconds` | `messaging.process.duration` (`s`) |
//! | `outbox_publish_lag_seconds`, `inbox_end_to_end_seconds` | none (the conventions time single operations; these are the pipeline's ages) |

use std::time::Duration;

use metrics::{
    Label, Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
};

/// Event rows written at commit.
pub const EVENTS_WRITTEN: &str = "outbox_events_written_total";
/// Events confirmed by the broker.
pub const EVENTS_PUBLISHED: &str = "outbox_events_published_total";
/// Events handed to the fast path at commit.
pub const FAST_PATH_EVENTS: &str = "outbox_fast_path_events_total";
/// Failed publishes.
pub const PUBLISH_FAILURES: &str = "outbox_publish_failures_total";
/// Outbox events that went DEAD.
pub const EVENTS_DEAD: &str = "outbox_events_dead_total";
/// Fenced-off relay writes.
pub const STALE_CLAIMS: &str = "outbox_stale_claims_total";
/// Failed relay rounds.
pub const RELAY_ERRORS: &str = "outbox_relay_errors_total";
/// 1 while the relay sees the broker, 0 while it is unavailable.
pub const BROKER_AVAILABLE: &str = "outbox_broker_available";
/// Times the relay found the broker unavailable.
pub const BROKER_OUTAGES: &str = "outbox_broker_outages_total";
/// Time since the broker was last seen.
pub const BROKER_LAST_SEEN: &str = "outbox_broker_last_seen_seconds";
/// Events handed back without an attempt during outages.
pub const EVENTS_HELD_BACK: &str = "outbox_events_held_back_total";
/// Commit to confirmation.
pub const PUBLISH_LAG: &str = "outbox_publish_lag_seconds";
/// One claim of the claim loop.
pub const RELAY_CLAIM_DURATION: &str = "outbox_relay_claim_duration_seconds";
/// Events the WAL relay left to the claim loop.
pub const WAL_LEFT_TO_TABLE: &str = "outbox_wal_left_to_table_total";
/// Times a WAL relay fell back to polling.
pub const WAL_FALLBACKS: &str = "outbox_wal_fallbacks_total";
/// WAL written after a slot's confirmed position.
pub const WAL_SLOT_LAG: &str = "outbox_wal_slot_lag_bytes";
/// WAL the server keeps for a slot.
pub const WAL_SLOT_RETAINED: &str = "outbox_wal_slot_retained_bytes";
/// Unsent outbox rows per status.
pub const BACKLOG: &str = "outbox_backlog_events";
/// Age of the oldest unsent event.
pub const OLDEST_PENDING_AGE: &str = "outbox_oldest_pending_age_seconds";
/// Bytes of a queue table with its indexes.
pub const TABLE_BYTES: &str = "outbox_table_bytes";
/// Rows of a queue table.
pub const TABLE_LIVE_ROWS: &str = "outbox_table_live_rows";
/// Dead row versions of a queue table.
pub const TABLE_DEAD_ROWS: &str = "outbox_table_dead_rows";
/// How long the oldest snapshot has been held.
pub const XMIN_HORIZON_AGE: &str = "outbox_xmin_horizon_age_seconds";
/// Inbox outcomes per consumer.
pub const INBOX_MESSAGES: &str = "inbox_messages_total";
/// Handler run time.
pub const HANDLER_DURATION: &str = "inbox_handler_duration_seconds";
/// Unfinished inbox rows per consumer and status.
pub const INBOX_BACKLOG: &str = "inbox_backlog_messages";
/// 1 while a consumer or destination is paused.
pub const PAUSED: &str = "outbox_paused";
/// From the producer's commit to the handler's commit, per consumer.
pub const END_TO_END: &str = "inbox_end_to_end_seconds";
/// Per database of a set (`fleet`): 1 while some instance holds its lease, 0 while nobody owns
/// it (its claims, retries and retention wait). Every instance reports every database.
pub const FLEET_DATABASE_OWNED: &str = "outbox_fleet_database_owned";
/// How many databases of a set this instance owns.
pub const FLEET_OWNED_HERE: &str = "outbox_fleet_owned_databases";
/// Per database of a set with a connection budget: 1 while it is refused for its server's budget.
pub const FLEET_DATABASE_REFUSED: &str = "outbox_fleet_database_refused";
/// Per database server of a set: live instances × the pool sizes of its databases.
pub const FLEET_SERVER_CEILING: &str = "outbox_fleet_server_connection_ceiling";
/// Per database server of a set: the budget, or the server's own `max_connections`.
pub const FLEET_SERVER_LIMIT: &str = "outbox_fleet_server_connection_limit";

/// Inbox backlog series reported so far, so an emptied one can be set back to 0.
#[allow(clippy::type_complexity)]
static REPORTED_INBOX: std::sync::Mutex<
    std::collections::BTreeSet<(String, String, &'static str)>,
> = std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Register descriptions and units with the recorder in effect (the runtime calls it at every
/// start, so a recorder installed after another runtime started gets them too).
pub fn describe() {
    describe_counter!(
        EVENTS_WRITTEN,
        Unit::Count,
        "Outbox event rows written at commit"
    );
    describe_counter!(
        FAST_PATH_EVENTS,
        Unit::Count,
        "Events a commit handed to the relay's fast path"
    );
    describe_counter!(
        EVENTS_PUBLISHED,
        Unit::Count,
        "Events confirmed by the broker and marked SENT"
    );
    describe_counter!(
        PUBLISH_FAILURES,
        Unit::Count,
        "Publishes that failed (RETRY or DEAD)"
    );
    describe_counter!(EVENTS_DEAD, Unit::Count, "Outbox events that went DEAD");
    describe_counter!(
        STALE_CLAIMS,
        Unit::Count,
        "Relay writes fenced off because another relay took the claim over"
    );
    describe_counter!(RELAY_ERRORS, Unit::Count, "Relay rounds that failed");
    describe_gauge!(
        BROKER_AVAILABLE,
        Unit::Count,
        "1 while the relay sees the broker, 0 while it is unavailable and nothing is claimed"
    );
    describe_counter!(
        BROKER_OUTAGES,
        Unit::Count,
        "Times the relay found the broker unavailable and stopped claiming"
    );
    describe_gauge!(
        BROKER_LAST_SEEN,
        Unit::Seconds,
        "Time since the broker last confirmed a publish or answered a health check"
    );
    describe_counter!(
        EVENTS_HELD_BACK,
        Unit::Count,
        "Claimed events handed back without an attempt because the broker was unavailable"
    );
    describe_histogram!(
        PUBLISH_LAG,
        Unit::Seconds,
        "Time from enqueue to broker confirmation"
    );
    describe_histogram!(
        RELAY_CLAIM_DURATION,
        Unit::Seconds,
        "Time one claim of the claim loop took, found events or not"
    );
    describe_counter!(
        WAL_LEFT_TO_TABLE,
        Unit::Count,
        "Events the WAL relay left to the claim loop, behind an unsent earlier event of their aggregate"
    );
    describe_counter!(
        WAL_FALLBACKS,
        Unit::Count,
        "Times a WAL relay could not stream from its slot and fell back to polling the table"
    );
    describe_gauge!(
        WAL_SLOT_LAG,
        Unit::Bytes,
        "WAL written after the position the WAL relay's slot confirmed"
    );
    describe_gauge!(
        WAL_SLOT_RETAINED,
        Unit::Bytes,
        "WAL the server keeps on disk for the WAL relay's slot"
    );
    describe_gauge!(BACKLOG, Unit::Count, "Unsent outbox rows per status");
    describe_gauge!(
        OLDEST_PENDING_AGE,
        Unit::Seconds,
        "Age of the oldest unsent, not dead, outbox event"
    );
    describe_gauge!(
        TABLE_BYTES,
        Unit::Bytes,
        "Bytes of a queue table with its indexes"
    );
    describe_gauge!(TABLE_LIVE_ROWS, Unit::Count, "Rows of a queue table");
    describe_gauge!(
        TABLE_DEAD_ROWS,
        Unit::Count,
        "Dead row versions of a queue table not yet removed by vacuum"
    );
    describe_gauge!(
        XMIN_HORIZON_AGE,
        Unit::Seconds,
        "How long the oldest session or prepared transaction has held its snapshot"
    );
    describe_counter!(
        INBOX_MESSAGES,
        Unit::Count,
        "Inbox messages per consumer and outcome"
    );
    describe_histogram!(HANDLER_DURATION, Unit::Seconds, "Handler run time");
    describe_histogram!(
        END_TO_END,
        Unit::Seconds,
        "From the producer's commit to the handler's commit, per consumer"
    );
    describe_gauge!(
        PAUSED,
        Unit::Count,
        "1 while an operator has paused the consumer or destination"
    );
    describe_gauge!(
        FLEET_DATABASE_OWNED,
        Unit::Count,
        "1 while an instance owns the database of the set, 0 while nobody does"
    );
    describe_gauge!(
        FLEET_OWNED_HERE,
        Unit::Count,
        "Databases of the set this instance owns"
    );
    describe_gauge!(
        FLEET_DATABASE_REFUSED,
        Unit::Count,
        "1 while the database is refused: its server's connections would exceed the budget"
    );
    describe_gauge!(
        FLEET_SERVER_CEILING,
        Unit::Count,
        "The most connections the service's live instances can hold on the database server"
    );
    describe_gauge!(
        FLEET_SERVER_LIMIT,
        Unit::Count,
        "The connection budget per server, or the server's own max_connections"
    );
    crate::telemetry::describe();
    describe_gauge!(
        INBOX_BACKLOG,
        Unit::Count,
        "Unfinished inbox rows per consumer and status"
    );
}

pub(crate) fn events_written(n: usize) {
    counter!(EVENTS_WRITTEN).increment(n as u64);
}

/// A series' labels, with `database` when the loop serves one database of a set (`fleet`);
/// without it for a runtime over one database, whose series stay as they were.
fn with_database(mut labels: Vec<Label>, database: Option<&str>) -> Vec<Label> {
    if let Some(database) = database.filter(|d| !d.is_empty()) {
        labels.push(Label::new("database", database.to_owned()));
    }
    labels
}

fn by_transport(transport: &'static str, database: Option<&str>) -> Vec<Label> {
    with_database(
        vec![Label::from_static_parts("transport", transport)],
        database,
    )
}

pub(crate) fn fast_path_events(transport: &'static str, database: Option<&str>, events: usize) {
    counter!(FAST_PATH_EVENTS, by_transport(transport, database)).increment(events as u64);
}

/// What a relay round did; `database`: the relay's database in a set.
pub(crate) fn relay_round(
    transport: &'static str,
    database: Option<&str>,
    sent: usize,
    failed: usize,
    dead: usize,
    stale: usize,
) {
    if sent > 0 {
        counter!(EVENTS_PUBLISHED, by_transport(transport, database)).increment(sent as u64);
    }
    if failed > 0 {
        counter!(PUBLISH_FAILURES, by_transport(transport, database)).increment(failed as u64);
    }
    if dead > 0 {
        counter!(EVENTS_DEAD, with_database(Vec::new(), database)).increment(dead as u64);
    }
    if stale > 0 {
        counter!(STALE_CLAIMS, with_database(Vec::new(), database)).increment(stale as u64);
    }
}

/// The broker became unavailable (`false`: counted as an outage) or answers again.
pub(crate) fn broker_available(transport: &'static str, available: bool) {
    gauge!(BROKER_AVAILABLE, "transport" => transport).set(if available { 1.0 } else { 0.0 });
    if !available {
        counter!(BROKER_OUTAGES, "transport" => transport).increment(1);
    }
}

/// Time since the broker was last seen (nothing while it never was).
pub(crate) fn broker_seen(transport: &'static str, ago: Option<Duration>) {
    if let Some(ago) = ago {
        gauge!(BROKER_LAST_SEEN, "transport" => transport).set(ago.as_secs_f64());
    }
}

/// `n` claimed events were handed back without an attempt: the broker is unavailable.
pub(crate) fn held_back(transport: &'static str, database: Option<&str>, n: usize) {
    if n > 0 {
        counter!(EVENTS_HELD_BACK, by_transport(transport, database)).increment(n as u64);
    }
}

#[cfg_attr(not(feature = "postgres-wal"), allow(dead_code))]
pub(crate) fn wal_left_to_table(transport: &'static str, n: usize) {
    counter!(WAL_LEFT_TO_TABLE, "transport" => transport).increment(n as u64);
}

#[cfg_attr(not(feature = "postgres-wal"), allow(dead_code))]
pub(crate) fn wal_fallback(slot: &str) {
    counter!(WAL_FALLBACKS, "slot" => slot.to_owned()).increment(1);
}

pub(crate) fn publish_lag(transport: &'static str, database: Option<&str>, lag: Duration) {
    histogram!(PUBLISH_LAG, by_transport(transport, database)).record(lag.as_secs_f64());
}

pub(crate) fn claim_duration(transport: &'static str, took: Duration) {
    histogram!(RELAY_CLAIM_DURATION, "transport" => transport).record(took.as_secs_f64());
}

pub(crate) fn relay_error() {
    counter!(RELAY_ERRORS).increment(1);
}

/// One message of `consumer` counted; `database`: the consumer's database in a set (empty for
/// a runtime over one).
pub(crate) fn inbox(consumer: &'static str, database: &str, outcome: &'static str) {
    let labels = vec![
        Label::from_static_parts("consumer", consumer),
        Label::from_static_parts("outcome", outcome),
    ];
    counter!(INBOX_MESSAGES, with_database(labels, Some(database))).increment(1);
}

/// An external message received for `consumer`, counted under the same metric as every inbox
/// message (`outcome`: `received_new`, `received_duplicate`, …).
pub(crate) fn inbox_received(consumer: &str, outcome: &'static str) {
    counter!(INBOX_MESSAGES, "consumer" => consumer.to_owned(), "outcome" => outcome).increment(1);
}

pub(crate) fn paused(kind: &'static str, name: &str, paused: bool) {
    gauge!(PAUSED, "kind" => kind, "name" => name.to_owned()).set(if paused { 1.0 } else { 0.0 });
}

pub(crate) fn end_to_end(consumer: &'static str, database: &str, age: Duration) {
    let labels = vec![Label::from_static_parts("consumer", consumer)];
    histogram!(END_TO_END, with_database(labels, Some(database))).record(age.as_secs_f64());
}

pub(crate) fn handler_duration(
    consumer: &'static str,
    database: &str,
    event_type: &str,
    elapsed: Duration,
) {
    let labels = vec![
        Label::from_static_parts("consumer", consumer),
        Label::new("event_type", event_type.to_owned()),
    ];
    histogram!(HANDLER_DURATION, with_database(labels, Some(database)))
        .record(elapsed.as_secs_f64());
}

pub(crate) fn fleet_database_owned(database: &str, owned: bool) {
    gauge!(FLEET_DATABASE_OWNED, "database" => database.to_owned()).set(if owned {
        1.0
    } else {
        0.0
    });
}

pub(crate) fn fleet_owned_here(count: usize) {
    gauge!(FLEET_OWNED_HERE).set(count as f64);
}

pub(crate) fn fleet_database_refused(database: &str, refused: bool) {
    gauge!(FLEET_DATABASE_REFUSED, "database" => database.to_owned()).set(if refused {
        1.0
    } else {
        0.0
    });
}

pub(crate) fn fleet_server_connections(server: &str, ceiling: u64, limit: Option<u64>) {
    gauge!(FLEET_SERVER_CEILING, "server" => server.to_owned()).set(ceiling as f64);
    if let Some(limit) = limit {
        gauge!(FLEET_SERVER_LIMIT, "server" => server.to_owned()).set(limit as f64);
    }
}

/// `pairs`, and the `database` label when sampling a database of a set (`fleet`).
fn labels(database: Option<&str>, pairs: &[(&'static str, &str)]) -> Vec<metrics::Label> {
    let mut labels: Vec<metrics::Label> = pairs
        .iter()
        .map(|(k, v)| metrics::Label::new(*k, (*v).to_owned()))
        .collect();
    if let Some(database) = database {
        labels.push(metrics::Label::new("database", database.to_owned()));
    }
    labels
}

/// Sample the backlog gauges: unsent outbox rows per status, the oldest unsent event's age, and
/// unfinished inbox rows per consumer and status. Reads only unsent/unfinished rows, which the
/// partial indexes keep small however many rows are SENT or DONE.
pub async fn sample(db: &sea_orm::DatabaseConnection) -> Result<(), sea_orm::DbErr> {
    sample_database(db, None).await
}

/// [`sample`] for the database `database` of a set (`fleet`): every gauge carries a `database`
/// label with its name.
pub async fn sample_database(
    db: &sea_orm::DatabaseConnection,
    database: Option<&str>,
) -> Result<(), sea_orm::DbErr> {
    use crate::store::{InboxStatus, OutboxStatus, stats};

    let mut oldest: Option<chrono::DateTime<chrono::Utc>> = None;
    let mut seen = std::collections::HashMap::new();
    for row in stats::outbox_backlog(db).await? {
        seen.insert(row.status, row.count);
        if row.status != OutboxStatus::Dead
            && let Some(t) = row.oldest
        {
            oldest = Some(oldest.map_or(t, |o| o.min(t)));
        }
    }
    for status in OutboxStatus::UNSENT {
        let count = seen.get(&status).copied().unwrap_or(0);
        gauge!(BACKLOG, labels(database, &[("status", status.as_str())])).set(count as f64);
    }
    // The age by the database's clock, which `created_at` was written by.
    let age = match oldest {
        Some(t) => (crate::store::database_now(db).await? - t)
            .to_std()
            .unwrap_or(Duration::ZERO),
        None => Duration::ZERO,
    };
    gauge!(OLDEST_PENDING_AGE, labels(database, &[])).set(age.as_secs_f64());

    let database_key = database.unwrap_or("").to_owned();
    let mut counts: std::collections::BTreeMap<(String, String, &'static str), i64> =
        Default::default();
    for row in stats::inbox_backlog(db).await? {
        let status: InboxStatus = row.status;
        *counts
            .entry((database_key.clone(), row.consumer, status.as_str()))
            .or_default() += row.count;
    }
    {
        // A consumer whose backlog emptied reports 0, not its last non-zero value.
        let mut reported = REPORTED_INBOX.lock().unwrap_or_else(|p| p.into_inner());
        for key in reported.iter().filter(|k| k.0 == database_key) {
            if !counts.contains_key(key) {
                gauge!(
                    INBOX_BACKLOG,
                    labels(database, &[("consumer", &key.1), ("status", key.2)])
                )
                .set(0.0);
            }
        }
        for ((_, consumer, status), n) in &counts {
            gauge!(
                INBOX_BACKLOG,
                labels(database, &[("consumer", consumer), ("status", status)])
            )
            .set(*n as f64);
        }
        reported.extend(counts.into_keys());
    }

    // The WAL relays' slots (PostgreSQL): a stopped relay's slot lags and holds WAL back.
    for slot in crate::store::wal::slots(db).await? {
        let lag = slot.lag_bytes.unwrap_or(0).max(0) as f64;
        let retained = slot.retained_bytes.unwrap_or(0).max(0) as f64;
        gauge!(WAL_SLOT_LAG, labels(database, &[("slot", &slot.name)])).set(lag);
        gauge!(WAL_SLOT_RETAINED, labels(database, &[("slot", &slot.name)])).set(retained);
    }

    // The queue tables and the horizon (PostgreSQL, MySQL).
    for table in crate::store::health::tables(db).await? {
        let by_table = labels(database, &[("table", &table.table)]);
        gauge!(TABLE_BYTES, by_table.clone()).set(table.bytes() as f64);
        if let Some(live) = table.live_rows {
            gauge!(TABLE_LIVE_ROWS, by_table.clone()).set(live as f64);
        }
        if let Some(dead) = table.dead_rows {
            gauge!(TABLE_DEAD_ROWS, by_table).set(dead as f64);
        }
    }
    if db.get_database_backend() != sea_orm::DbBackend::Sqlite {
        // Without the right to see other sessions (MySQL's PROCESS), the gauge stays unset.
        if let Ok(holders) = crate::store::health::holders(db).await {
            let held = holders
                .iter()
                .filter(|h| h.kind != crate::store::health::HolderKind::Slot)
                .filter_map(|h| h.age)
                .max()
                .unwrap_or(Duration::ZERO);
            gauge!(XMIN_HORIZON_AGE, labels(database, &[])).set(held.as_secs_f64());
        }
    }
    Ok(())
}
