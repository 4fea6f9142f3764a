//! The WAL relay's SQL (PostgreSQL only): its publication and replication slot, the check of a
//! batch read from the WAL against the rows, and the slots' retention for `outbox status`.
//! Only the last is used without the `postgres-wal` feature.
#![cfg_attr(
    not(any(feature = "postgres-wal", feature = "test-util")),
    allow(dead_code)
)]

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Value};

use super::{Dialect, OUTBOX_TABLE, OutboxStatus, relay::ClaimedEvent, sql::Sql};

/// Slot names the SDK's WAL relays use start with this; `outbox status` reports those slots.
pub const SLOT_PREFIX: &str = "outbox";

/// Whether `name` can be a slot or publication name as the SDK writes them: 1 to 63 lowercase
/// ASCII letters, digits and underscores, starting with a letter (so that it never needs
/// quoting where PostgreSQL takes it as an identifier).
pub fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The server's `wal_level`.
pub async fn wal_level(db: &DatabaseConnection) -> Result<String, DbErr> {
    let mut sql = Sql::new(Dialect::of(db));
    sql.push("SHOW wal_level");
    let row = db
        .query_one_raw(sql.build())
        .await?
        .ok_or_else(|| DbErr::Custom("SHOW wal_level returned nothing".into()))?;
    row.try_get("", "wal_level")
}

/// The server's timeline, which moves on at every promotion of a standby: the first eight hex
/// digits of the current log segment's name. A slot made before a failover is not on the new
/// primary (PostgreSQL 15 and 16 do not carry logical slots over), and a new timeline tells that
/// apart from a slot an operator dropped.
pub async fn timeline(db: &DatabaseConnection) -> Result<String, DbErr> {
    super::standby::timeline(db).await
}

/// Create the publication of the outbox's inserts unless it exists. `name` must be
/// [`valid_name`] (it is an identifier: PostgreSQL cannot take it as a parameter).
pub async fn ensure_publication(db: &DatabaseConnection, name: &str) -> Result<(), DbErr> {
    if !valid_name(name) {
        return Err(DbErr::Custom(format!("invalid publication name {name:?}")));
    }
    let dialect = Dialect::of(db);
    let mut exists = Sql::new(dialect);
    exists
        .push("SELECT 1 AS found FROM pg_publication WHERE pubname = ")
        .bind(name.to_owned().into());
    if db.query_one_raw(exists.build()).await?.is_some() {
        return Ok(());
    }
    let mut create = Sql::new(dialect);
    create.push(&format!(
        "CREATE PUBLICATION {name} FOR TABLE {OUTBOX_TABLE} WITH (publish = 'insert')"
    ));
    match db.execute_raw(create.build()).await {
        Ok(_) => Ok(()),
        // Another relay created it meanwhile.
        Err(e) if e.to_string().contains("already exists") => Ok(()),
        Err(e) => Err(e),
    }
}

/// A replication slot as `pg_replication_slots` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotState {
    /// The slot's name.
    pub name: String,
    /// Whether a relay is streaming from it now.
    pub active: bool,
    /// `reserved`, `extended`, `unreserved` or `lost` (`lost`: the WAL it needs is gone, and it
    /// can never be streamed from again).
    pub wal_status: Option<String>,
    /// WAL bytes the server keeps for the slot (from its restart position to the current end).
    pub retained_bytes: Option<i64>,
    /// WAL bytes written after the position the slot's relay confirmed: how far it is behind.
    pub lag_bytes: Option<i64>,
    /// The position the relay confirmed last (`X/Y`).
    pub confirmed_lsn: Option<String>,
}

impl SlotState {
    /// Whether the slot can no longer be streamed from.
    pub fn lost(&self) -> bool {
        self.wal_status.as_deref() == Some("lost")
    }
}

fn push_slot_select(sql: &mut Sql) {
    sql.push(
        "SELECT slot_name, active, wal_status::text AS wal_status, \
         pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint AS retained_bytes, \
         pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint AS lag_bytes, \
         confirmed_flush_lsn::text AS confirmed_lsn \
         FROM pg_replication_slots WHERE slot_type = 'logical' AND database = current_database()",
    );
}

fn slot_of(row: &sea_orm::QueryResult) -> Result<SlotState, DbErr> {
    Ok(SlotState {
        name: row.try_get("", "slot_name")?,
        active: row.try_get("", "active")?,
        wal_status: row.try_get("", "wal_status")?,
        retained_bytes: row.try_get("", "retained_bytes")?,
        lag_bytes: row.try_get("", "lag_bytes")?,
        confirmed_lsn: row.try_get("", "confirmed_lsn")?,
    })
}

/// The slot named `name` in this database, if it exists.
pub async fn slot(db: &DatabaseConnection, name: &str) -> Result<Option<SlotState>, DbErr> {
    let mut sql = Sql::new(Dialect::of(db));
    push_slot_select(&mut sql);
    sql.push(" AND slot_name = ").bind(name.to_owned().into());
    db.query_one_raw(sql.build())
        .await?
        .map(|row| slot_of(&row))
        .transpose()
}

/// The WAL relays' slots in this database (names starting with [`SLOT_PREFIX`]); empty on
/// backends other than PostgreSQL.
pub async fn slots(db: &DatabaseConnection) -> Result<Vec<SlotState>, DbErr> {
    if db.get_database_backend() != sea_orm::DbBackend::Postgres {
        return Ok(Vec::new());
    }
    let mut sql = Sql::new(Dialect::of(db));
    push_slot_select(&mut sql);
    sql.push(" AND slot_name LIKE ")
        .bind(format!("{SLOT_PREFIX}%").into())
        .push(" ORDER BY slot_name");
    db.query_all_raw(sql.build())
        .await?
        .iter()
        .map(slot_of)
        .collect()
}

/// Create a logical slot with `pgoutput`; `false` when one of that name exists already.
pub async fn create_slot(db: &DatabaseConnection, name: &str) -> Result<bool, DbErr> {
    let mut sql = Sql::new(Dialect::of(db));
    sql.push("SELECT slot_name FROM pg_create_logical_replication_slot(")
        .bind(name.to_owned().into())
        .push(", 'pgoutput')");
    match db.query_one_raw(sql.build()).await {
        Ok(_) => Ok(true),
        Err(e) if e.to_string().contains("already exists") => Ok(false),
        Err(e) => Err(e),
    }
}

/// Drop a slot (an operator's `outbox wal drop-slot`, and tests). A slot a relay streams from
/// cannot be dropped: its session is ended first when `force`.
#[cfg_attr(
    all(feature = "postgres-wal", not(feature = "test-util")),
    allow(dead_code)
)]
pub async fn drop_slot(db: &DatabaseConnection, name: &str, force: bool) -> Result<bool, DbErr> {
    let dialect = Dialect::of(db);
    if force {
        let mut end = Sql::new(dialect);
        end.push(
            "SELECT pg_terminate_backend(active_pid) AS ended FROM pg_replication_slots \
             WHERE active_pid IS NOT NULL AND slot_name = ",
        )
        .bind(name.to_owned().into());
        db.query_all_raw(end.build()).await?;
    }
    let mut sql = Sql::new(dialect);
    sql.push(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = ",
    )
    .bind(name.to_owned().into());
    let statement = sql.build();
    // The ended session lets go of the slot a moment later.
    for _ in 0..50 {
        match db.query_all_raw(statement.clone()).await {
            Ok(rows) => return Ok(!rows.is_empty()),
            Err(e) if force && e.to_string().contains("is active") => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
    Err(DbErr::Custom(format!("slot {name} stays active")))
}

/// One row of a batch read from the WAL, as the table holds it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowCheck {
    /// Row id.
    pub id: i64,
    /// Its status now.
    pub status: Option<OutboxStatus>,
    /// Its failed attempts now (the stream's image of the row is as it was inserted).
    pub attempts: u32,
    /// An unsent event of its aggregate, earlier than it and not in the batch, holds it back.
    pub blocked: bool,
}

/// Check a batch read from the WAL against the table, in one statement: each row's status now
/// (a replayed event may be SENT already, or claimed by the polling relay) and whether an unsent
/// earlier event of its aggregate that is not in the batch holds it back. Served by the primary
/// key and the unsent-per-aggregate partial index.
pub async fn check(db: &DatabaseConnection, ids: &[i64]) -> Result<Vec<RowCheck>, DbErr> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let dialect = Dialect::of(db);
    let mut sql = Sql::new(dialect);
    let list = || ids.iter().map(|id| Value::from(*id));
    sql.push(&format!(
        "SELECT o.id, o.status, o.attempts, CASE WHEN EXISTS (SELECT 1 FROM {OUTBOX_TABLE} e \
         WHERE e.aggregate_type = o.aggregate_type AND e.aggregate_id = o.aggregate_id \
         AND e.id < o.id AND {} AND e.id NOT IN ",
        dialect.unsent("e.")
    ))
    .bind_list(list())
    .push(&format!(
        ") THEN 1 ELSE 0 END AS blocked FROM {OUTBOX_TABLE} o WHERE o.id IN "
    ))
    .bind_list(list());
    db.query_all_raw(sql.build())
        .await?
        .iter()
        .map(|row| {
            Ok(RowCheck {
                id: row.try_get("", "id")?,
                status: OutboxStatus::parse(&row.try_get::<String>("", "status")?),
                attempts: u32::try_from(dialect.get_int(row, "attempts")?).unwrap_or(0),
                blocked: row.try_get::<i32>("", "blocked")? != 0,
            })
        })
        .collect()
}

/// Which events of a batch read from the WAL (in commit order) the stream publishes, given
/// their [`check`]; and how many it leaves to the table. A row no longer PENDING is skipped:
/// SENT is done; PROCESSING, RETRY or DEAD belongs to the claim loop, and with `ordering` holds
/// the rest of its aggregate back too. A row behind an unsent event outside the batch is left
/// to the table with the rest of its aggregate. A row the check did not find (purged
/// meanwhile) is nobody's to publish.
pub fn choose(
    events: Vec<ClaimedEvent>,
    checks: &[RowCheck],
    ordering: bool,
) -> (Vec<ClaimedEvent>, usize) {
    let checks: std::collections::HashMap<i64, &RowCheck> =
        checks.iter().map(|c| (c.id, c)).collect();
    let mut held: std::collections::HashSet<(String, String)> = Default::default();
    let mut publish = Vec::with_capacity(events.len());
    let mut left = 0;
    for event in events {
        let Some(check) = checks.get(&event.id) else {
            continue;
        };
        let key = (event.aggregate_type.clone(), event.aggregate_id.clone());
        match check.status {
            Some(OutboxStatus::Sent) => continue,
            Some(OutboxStatus::Pending) => {}
            _ => {
                if ordering {
                    held.insert(key);
                }
                continue;
            }
        }
        if ordering && (check.blocked || held.contains(&key)) {
            held.insert(key);
            left += 1;
            continue;
        }
        // A failure counts on top of the attempts the row has now.
        publish.push(ClaimedEvent {
            attempts: check.attempts,
            ..event
        });
    }
    (publish, left)
}
