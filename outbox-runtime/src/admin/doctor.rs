//! `doctor`: is the database ready for the SDK, and is anything stuck?

use std::collections::{BTreeMap, BTreeSet};

use sea_orm::{DatabaseConnection, DbBackend};
use serde::Serialize;

use super::{AdminError, HumanDuration, Source, db_error};
use crate::store::{InboxStatus, OutboxStatus, admin as sql, schema};

/// How serious a [`Finding`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// A check passed.
    Ok,
    /// Worth knowing; nothing to fix.
    Info,
    /// Something an operator should look at.
    Warning,
    /// The SDK cannot work correctly until this is fixed.
    Error,
}

impl std::fmt::Display for Severity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            Severity::Ok => "ok",
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
        })
    }
}

/// One result of [`doctor`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct Finding {
    /// How serious.
    pub severity: Severity,
    /// Which check: `tables`, `indexes`, `migrations`, `handlers`, `stuck` or `dead`.
    #[cfg_attr(feature = "console", schema(value_type = String))]
    pub check: &'static str,
    /// What was found, and what to do about it.
    pub message: String,
}

/// Everything [`doctor`] found, in check order.
#[derive(Debug, Clone, Default, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct DoctorReport {
    /// The findings.
    pub findings: Vec<Finding>,
}

impl DoctorReport {
    /// The findings of a severity.
    pub fn with_severity(&self, severity: Severity) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(move |f| f.severity == severity)
    }

    /// Whether nothing is at [`Severity::Error`].
    pub fn is_healthy(&self) -> bool {
        self.with_severity(Severity::Error).next().is_none()
    }

    /// The most serious severity found.
    pub fn worst(&self) -> Severity {
        self.findings
            .iter()
            .map(|f| f.severity)
            .max()
            .unwrap_or(Severity::Ok)
    }

    pub(super) fn push(
        &mut self,
        severity: Severity,
        check: &'static str,
        message: impl Into<String>,
    ) {
        self.findings.push(Finding {
            severity,
            check,
            message: message.into(),
        });
    }
}

/// What [`doctor`] compares the database against.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DoctorOptions {
    /// The names of every SDK migration this binary knows, in order: with the `outbox` crate,
    /// `outbox::migrations().iter().map(|m| m.name().to_owned())`. Empty skips the check.
    pub(crate) migrations: Vec<String>,
    /// Compare the `#[inbox_handler]`s linked into this binary with the consumers seen in
    /// `inbox_event` (default on; off for a tool such as the CLI, which links no handlers).
    pub(crate) check_linked_handlers: bool,
    /// Consumers this binary must have handlers for (an error when one has none), like
    /// `RuntimeBuilder::expect_consumers`.
    pub(crate) expected_consumers: Vec<String>,
    /// A session, prepared transaction or slot holding the xmin horizon this long is flagged.
    pub(crate) horizon_age: std::time::Duration,
    /// A WAL relay's slot this many bytes behind is flagged.
    pub(crate) slot_lag: u64,
    /// A table whose dead row versions are this share of all its row versions is flagged.
    pub(crate) dead_ratio: f64,
}

impl Default for DoctorOptions {
    /// No migration check, no handler check, and the default thresholds.
    fn default() -> Self {
        DoctorOptions {
            migrations: Vec::new(),
            check_linked_handlers: false,
            expected_consumers: Vec::new(),
            horizon_age: std::time::Duration::from_secs(300),
            slot_lag: 1 << 30,
            dead_ratio: 0.2,
        }
    }
}

impl DoctorOptions {
    /// Check against these SDK migration names, and the handlers linked in.
    pub fn new<I, S>(migrations: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        DoctorOptions {
            migrations: migrations.into_iter().map(Into::into).collect(),
            check_linked_handlers: true,
            ..DoctorOptions::default()
        }
    }

    /// Flag a session, prepared transaction or replication slot that has held back the xmin
    /// horizon (the oldest row versions vacuum may remove) this long. Default 5 minutes.
    pub fn horizon_age(mut self, age: std::time::Duration) -> Self {
        self.horizon_age = age;
        self
    }

    /// Flag a WAL relay's replication slot this many bytes of WAL behind. Default 1 GiB.
    pub fn slot_lag(mut self, bytes: u64) -> Self {
        self.slot_lag = bytes;
        self
    }

    /// Flag one of the SDK's tables whose dead row versions are at least this share of all its
    /// row versions (and at least 10,000). Default 0.2.
    pub fn dead_ratio(mut self, ratio: f64) -> Self {
        self.dead_ratio = ratio;
        self
    }

    /// Skip comparing linked handlers with consumers seen (for tools that link none).
    pub fn without_handler_check(mut self) -> Self {
        self.check_linked_handlers = false;
        self
    }

    /// Require handlers for these consumers.
    pub fn expect_consumers<I, S>(mut self, consumers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.expected_consumers
            .extend(consumers.into_iter().map(Into::into));
        self
    }
}

/// One SDK table and its columns (the indexes its migrations create by name on each backend
/// are the dialect's, [`schema::expected_indexes`]).
struct TableSpec {
    name: &'static str,
    columns: &'static [&'static str],
}

/// What migrations `outbox_0001` to `outbox_0014` create on every backend. Keep in step with `migrations/`.
const TABLES: &[TableSpec] = &[
    TableSpec {
        name: "outbox_event",
        columns: &[
            "id",
            "event_id",
            "source",
            "event_type",
            "schema_version",
            "aggregate_type",
            "aggregate_id",
            "aggregate_version",
            "dedup_key",
            "payload",
            "headers",
            "status",
            "attempts",
            "next_attempt_at",
            "locked_by",
            "locked_until",
            "claim_token",
            "created_at",
            "sent_at",
            "last_error",
            "failure_class",
        ],
    },
    TableSpec {
        name: "inbox_event",
        columns: &[
            "id",
            "consumer",
            "message_id",
            "event_type",
            "source",
            "aggregate_type",
            "aggregate_id",
            "aggregate_version",
            "schema_version",
            "payload",
            "status",
            "attempts",
            "next_attempt_at",
            "locked_by",
            "locked_until",
            "claim_token",
            "received_at",
            "processed_at",
            "last_error",
            "origin",
            "biz_key",
            "headers",
        ],
    },
    TableSpec {
        name: "inbox_aggregate_version",
        columns: &[
            "consumer",
            "aggregate_type",
            "aggregate_id",
            "version",
            "updated_at",
        ],
    },
    TableSpec {
        name: "outbox_admin_action",
        columns: &[
            "id",
            "action",
            "target",
            "rows_affected",
            "actor",
            "reason",
            "at",
        ],
    },
    TableSpec {
        name: "outbox_lease",
        columns: &["name", "holder", "acquired_at", "locked_until"],
    },
    TableSpec {
        name: "outbox_relay",
        columns: &[
            "relay_id",
            "transport",
            "broker_state",
            "broker_seen_at",
            "unavailable_since",
            "outages",
            "held_back",
            "last_error",
            "started_at",
            "heartbeat_at",
            "expires_at",
        ],
    },
    TableSpec {
        name: "outbox_failure",
        columns: &[
            "id",
            "queue",
            "row_id",
            "attempt",
            "status",
            "error",
            "failed_at",
        ],
    },
    TableSpec {
        name: "outbox_scheduled",
        columns: &[
            "id",
            "event_id",
            "source",
            "event_type",
            "schema_version",
            "aggregate_type",
            "aggregate_id",
            "aggregate_version",
            "dedup_key",
            "payload",
            "headers",
            "due_at",
            "created_at",
        ],
    },
    TableSpec {
        name: "outbox_rescan",
        columns: &["id", "generation"],
    },
    TableSpec {
        name: "outbox_rotation",
        columns: &["table_name", "slot_seconds", "slots"],
    },
    TableSpec {
        name: "outbox_sent",
        columns: &[
            "slot",
            "id",
            "event_id",
            "source",
            "event_type",
            "schema_version",
            "aggregate_type",
            "aggregate_id",
            "aggregate_version",
            "dedup_key",
            "payload",
            "headers",
            "attempts",
            "locked_by",
            "claim_token",
            "created_at",
            "sent_at",
        ],
    },
    TableSpec {
        name: "outbox_key",
        columns: &["slot", "bucket", "event_type", "dedup_key", "event_id"],
    },
];

/// What `outbox_0014` creates on PostgreSQL only.
const POSTGRES_TABLES: &[TableSpec] = &[
    TableSpec {
        name: "inbox_done",
        columns: &[
            "slot",
            "id",
            "consumer",
            "message_id",
            "origin",
            "biz_key",
            "headers",
            "event_type",
            "source",
            "aggregate_type",
            "aggregate_id",
            "aggregate_version",
            "schema_version",
            "payload",
            "status",
            "attempts",
            "locked_by",
            "claim_token",
            "received_at",
            "processed_at",
        ],
    },
    TableSpec {
        name: "inbox_key",
        columns: &["slot", "bucket", "consumer", "scope", "name"],
    },
];

const MIGRATION_TABLES: [&str; 2] = ["outbox_migrations", "seaql_migrations"];

/// Check that the SDK's tables, columns and indexes exist, that every migration this binary
/// knows is applied, that the handlers linked in match the consumers seen in the inbox, and
/// report rows stuck in PROCESSING behind an expired lease and dead letters waiting.
///
/// Only a failing database call is an `Err`; everything found is a [`Finding`].
pub async fn doctor(
    db: &DatabaseConnection,
    options: &DoctorOptions,
) -> Result<DoctorReport, AdminError> {
    let mut report = DoctorReport::default();

    // Tables and columns.
    let mut columns: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for schema::TableItem {
        table,
        name: column,
    } in schema::columns(db)
        .await
        .map_err(db_error("reading the schema's columns"))?
    {
        columns
            .entry(table.to_lowercase())
            .or_default()
            .insert(column.to_lowercase());
    }
    let mut tables_ok = true;
    let mut core_tables = true;
    let postgres_only: &[TableSpec] = if db.get_database_backend() == DbBackend::Postgres {
        POSTGRES_TABLES
    } else {
        &[]
    };
    for spec in TABLES.iter().chain(postgres_only) {
        let Some(present) = columns.get(spec.name) else {
            tables_ok = false;
            if matches!(spec.name, "outbox_event" | "inbox_event") {
                core_tables = false;
            }
            report.push(
                Severity::Error,
                "tables",
                format!(
                    "table `{}` is missing: apply the SDK migrations (`outbox migrate`, \
                     `outbox::migrate(&db)` or your Migrator with `outbox::migrations()`)",
                    spec.name
                ),
            );
            continue;
        };
        let missing: Vec<&str> = spec
            .columns
            .iter()
            .copied()
            .filter(|c| !present.contains(*c))
            .collect();
        if !missing.is_empty() {
            tables_ok = false;
            report.push(
                Severity::Error,
                "tables",
                format!(
                    "table `{}` lacks column(s) {}: it was not created by the SDK's migrations, \
                     or was altered since",
                    spec.name,
                    missing.join(", ")
                ),
            );
        }
    }
    if tables_ok {
        report.push(
            Severity::Ok,
            "tables",
            format!(
                "{} tables with all their columns: {}",
                TABLES.len() + postgres_only.len(),
                TABLES
                    .iter()
                    .chain(postgres_only)
                    .map(|t| t.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }

    // Indexes.
    let mut indexes: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for schema::TableItem { table, name: index } in schema::indexes(db)
        .await
        .map_err(db_error("reading the schema's indexes"))?
    {
        indexes
            .entry(table.to_lowercase())
            .or_default()
            .insert(index.to_lowercase());
    }
    let mut indexes_ok = true;
    let mut expected_indexes = 0;
    for spec in TABLES.iter().chain(postgres_only) {
        if !columns.contains_key(spec.name) {
            continue;
        }
        let expected = schema::expected_indexes(db, spec.name);
        expected_indexes += expected.len();
        let present = indexes.get(spec.name);
        for index in expected {
            if !present.is_some_and(|p| p.contains(*index)) {
                indexes_ok = false;
                report.push(
                    Severity::Error,
                    "indexes",
                    format!(
                        "index `{index}` on `{}` is missing: claims, ordering checks or retention \
                         scan the whole table without it (and a missing unique index loses \
                         deduplication); recreate it as the SDK migration defines it",
                        spec.name
                    ),
                );
            }
        }
    }
    if indexes_ok && expected_indexes > 0 {
        report.push(
            Severity::Ok,
            "indexes",
            format!("all {expected_indexes} named SDK indexes present"),
        );
    }

    // Migration version.
    check_migrations(db, options, &columns, &mut report).await?;

    if !core_tables {
        return Ok(report);
    }

    // Handlers linked vs consumers seen.
    check_handlers(db, options, &mut report).await?;

    // Rows stuck in PROCESSING.
    let now = crate::store::database_now(db)
        .await
        .map_err(db_error("reading the database's clock"))?;
    let mut stuck_any = false;
    for source in [Source::Outbox, Source::Inbox] {
        for sql::Stuck {
            consumer,
            count: n,
            since,
        } in sql::stuck(db, source)
            .await
            .map_err(db_error("looking for stuck rows"))?
        {
            stuck_any = true;
            let ago = since
                .map(|t| {
                    format!(
                        " (leases expired up to {} ago)",
                        HumanDuration(std::time::Duration::from_secs(
                            (now - t).to_std().unwrap_or_default().as_secs()
                        ))
                    )
                })
                .unwrap_or_default();
            let message = match consumer {
                None => format!(
                    "{n} outbox event(s) stuck in PROCESSING{ago}: the relay that claimed them \
                     stopped; a running relay reclaims them, counting an attempt"
                ),
                Some(consumer) => format!(
                    "{n} inbox message(s) of consumer `{consumer}` stuck in PROCESSING{ago}: the \
                     worker that claimed them stopped; a running worker reclaims them, counting \
                     an attempt"
                ),
            };
            report.push(Severity::Warning, "stuck", message);
        }
    }
    if !stuck_any {
        report.push(
            Severity::Ok,
            "stuck",
            "no row stuck in PROCESSING behind an expired lease",
        );
    }

    // Dead letters waiting.
    let outbox_dead: i64 = sql::outbox_counts(db)
        .await
        .map_err(db_error("counting outbox events"))?
        .iter()
        .filter(|r| r.status == OutboxStatus::Dead.as_str())
        .map(|r| r.count)
        .sum();
    let inbox_dead: i64 = sql::inbox_counts(db)
        .await
        .map_err(db_error("counting inbox messages"))?
        .iter()
        .filter(|r| r.status == InboxStatus::Dead.as_str())
        .map(|r| r.count)
        .sum();
    if outbox_dead + inbox_dead > 0 {
        report.push(
            Severity::Warning,
            "dead",
            format!(
                "{outbox_dead} dead outbox event(s) and {inbox_dead} dead inbox message(s) wait \
                 for an operator: `outbox dead list`, then `outbox replay` or `outbox ignore`"
            ),
        );
    } else {
        report.push(Severity::Ok, "dead", "no dead letters");
    }

    // The tables' health and what holds vacuum back.
    super::storage::check(db, options, &mut report).await?;

    // The WAL relays' slots (PostgreSQL).
    for slot in crate::store::wal::slots(db)
        .await
        .map_err(db_error("reading the replication slots"))?
    {
        let lag = slot.lag_bytes.unwrap_or(0).max(0);
        let retained = slot.retained_bytes.unwrap_or(0).max(0);
        let name = &slot.name;
        if slot.lost() {
            report.push(
                Severity::Error,
                "wal",
                format!(
                    "replication slot `{name}` is invalidated (the WAL it needs was removed): its \
                     WAL relay polls the table instead of streaming. Drop the slot \
                     (SELECT pg_drop_replication_slot('{name}')) and restart the relay, which \
                     creates it again"
                ),
            );
        } else if lag as u64 >= options.slot_lag {
            let streamed = match slot.active {
                true => {
                    "its WAL relay does not keep up; look at the relay's publish errors and \
                         the broker"
                }
                false => {
                    "no WAL relay streams from it; start one, or drop the slot if none \
                          will"
                }
            };
            report.push(
                Severity::Warning,
                "wal",
                format!(
                    "replication slot `{name}` is {lag} bytes behind (flagged from {} bytes) and \
                     keeps {retained} bytes of WAL on the server: {streamed}",
                    options.slot_lag
                ),
            );
        } else if !slot.active {
            report.push(
                Severity::Warning,
                "wal",
                format!(
                    "replication slot `{name}` has no WAL relay streaming from it: it is \
                     {lag} bytes behind and keeps {retained} bytes of WAL on the server, growing \
                     until a relay streams again or the slot is dropped"
                ),
            );
        } else {
            report.push(
                Severity::Ok,
                "wal",
                format!("replication slot `{name}` is streamed from ({lag} bytes behind)"),
            );
        }
    }
    Ok(report)
}

async fn check_migrations(
    db: &DatabaseConnection,
    options: &DoctorOptions,
    columns: &BTreeMap<String, BTreeSet<String>>,
    report: &mut DoctorReport,
) -> Result<(), AdminError> {
    if options.migrations.is_empty() {
        report.push(
            Severity::Info,
            "migrations",
            "migration check skipped: no expected migration names given",
        );
        return Ok(());
    }
    let mut applied: BTreeMap<String, &'static str> = BTreeMap::new();
    for table in MIGRATION_TABLES {
        if !columns.contains_key(table) {
            continue;
        }
        for name in schema::applied_migrations(db, table)
            .await
            .map_err(db_error("reading the migration table"))?
        {
            applied.entry(name).or_insert(table);
        }
    }
    let missing: Vec<&str> = options
        .migrations
        .iter()
        .filter(|m| !applied.contains_key(*m))
        .map(String::as_str)
        .collect();
    let known: BTreeSet<&str> = options.migrations.iter().map(String::as_str).collect();
    let unknown: Vec<&str> = applied
        .keys()
        .map(String::as_str)
        .filter(|name| name.starts_with("outbox_") && !known.contains(name))
        .collect();
    if !missing.is_empty() {
        report.push(
            Severity::Error,
            "migrations",
            format!(
                "migration(s) not applied: {}; apply them (`outbox migrate`, `outbox::migrate(&db)` \
                 or your Migrator with `outbox::migrations()`)",
                missing.join(", ")
            ),
        );
    }
    if !unknown.is_empty() {
        report.push(
            Severity::Warning,
            "migrations",
            format!(
                "the database has SDK migration(s) this binary does not know: {}; the schema is \
                 newer than this binary, upgrade it",
                unknown.join(", ")
            ),
        );
    }
    if missing.is_empty() && unknown.is_empty() {
        let latest = options.migrations.last().map(String::as_str).unwrap_or("");
        let tables: BTreeSet<&str> = applied.values().copied().collect();
        report.push(
            Severity::Ok,
            "migrations",
            format!(
                "all {} SDK migrations applied (latest `{latest}`), recorded in {}",
                options.migrations.len(),
                tables.into_iter().collect::<Vec<_>>().join(" and ")
            ),
        );
    }
    Ok(())
}

async fn check_handlers(
    db: &DatabaseConnection,
    options: &DoctorOptions,
    report: &mut DoctorReport,
) -> Result<(), AdminError> {
    let seen = schema::consumers_seen(db)
        .await
        .map_err(db_error("listing the consumers in inbox_event"))?;
    if !options.check_linked_handlers {
        let names: Vec<&str> = seen.iter().map(|c| c.consumer.as_str()).collect();
        report.push(
            Severity::Info,
            "handlers",
            format!(
                "linked handlers not compared (run doctor from the service to compare); consumers \
                 seen in the inbox: {}",
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            ),
        );
        return Ok(());
    }
    let linked = match crate::inbox::linked_handlers() {
        Ok(linked) => linked,
        Err(e) => {
            report.push(Severity::Error, "handlers", e.to_string());
            return Ok(());
        }
    };
    let mut fine = true;
    for expected in &options.expected_consumers {
        if !linked.contains_key(expected.as_str()) {
            fine = false;
            report.push(
                Severity::Error,
                "handlers",
                format!(
                    "expected consumer `{expected}` has no #[inbox_handler] linked into this \
                     binary: is the crate declaring it referenced from main?"
                ),
            );
        }
    }
    for schema::ConsumerSeen {
        consumer,
        open: unfinished,
    } in &seen
    {
        if linked.contains_key(consumer.as_str()) {
            continue;
        }
        if *unfinished > 0 {
            fine = false;
            report.push(
                Severity::Warning,
                "handlers",
                format!(
                    "consumer `{consumer}` has {unfinished} unfinished inbox message(s) but no \
                     #[inbox_handler] for it is linked into this binary: if this service should \
                     handle them, reference the crate declaring its handlers from main"
                ),
            );
        } else {
            report.push(
                Severity::Info,
                "handlers",
                format!(
                    "consumer `{consumer}` has inbox rows but no handler in this binary (handled \
                     by another service?)"
                ),
            );
        }
    }
    for consumer in linked.keys() {
        if !seen.iter().any(|c| &c.consumer == consumer) {
            report.push(
                Severity::Info,
                "handlers",
                format!("consumer `{consumer}` has handlers linked but no inbox rows yet"),
            );
        }
    }
    if fine {
        report.push(
            Severity::Ok,
            "handlers",
            format!(
                "{} consumer(s) with handlers linked: {}",
                linked.len(),
                linked.keys().copied().collect::<Vec<_>>().join(", ")
            ),
        );
    }
    Ok(())
}
