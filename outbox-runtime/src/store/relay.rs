//! The relay's SQL: claim a batch under a lease, then mark it sent, retried, dead or released.
//!
//! Every write after the claim is fenced by the batch's `claim_token`: a relay whose lease
//! expired and whose rows were reclaimed by another relay updates zero rows.

use chrono::{DateTime, Utc};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, IsolationLevel,
    QueryResult, SqliteTransactionMode, Statement, TransactionOptions, TransactionTrait, Value,
};
use uuid::Uuid;

use super::{Dialect, OUTBOX_TABLE, outbox_status as status};

/// Columns the relay reads for each claimed event.
const CLAIM_COLUMNS: &str = "id, event_id, source, event_type, schema_version, aggregate_type, \
     aggregate_id, aggregate_version, payload, headers, status, attempts, locked_until, created_at";

/// One event claimed by a relay.
#[derive(Debug, Clone)]
pub struct ClaimedEvent {
    /// Row id (insertion order).
    pub id: i64,
    /// Event id.
    pub event_id: Uuid,
    /// CloudEvents source.
    pub source: String,
    /// Event type.
    pub event_type: String,
    /// Schema version.
    pub schema_version: u32,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Aggregate version.
    pub aggregate_version: Option<i64>,
    /// Payload JSON text.
    pub payload: String,
    /// Headers JSON object text.
    pub headers: String,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// Failed attempts so far, counting this claim if it reclaimed an expired lease.
    pub attempts: u32,
    /// Whether this claim took over an expired lease of another relay.
    pub reclaimed: bool,
}

/// A batch claimed under one lease and fencing token.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The fencing token written into every claimed row.
    pub token: Uuid,
    /// Events to publish, in id order.
    pub events: Vec<ClaimedEvent>,
    /// Events whose lease expired once too often: marked DEAD by this claim, not to publish.
    pub dead: Vec<ClaimedEvent>,
}

/// How to claim.
#[derive(Debug, Clone)]
pub struct ClaimParams<'a> {
    /// Who claims (stored in `locked_by`).
    pub relay_id: &'a str,
    /// At most this many rows.
    pub batch_size: usize,
    /// The lease ends at this instant.
    pub locked_until: DateTime<Utc>,
    /// The current time.
    pub now: DateTime<Utc>,
    /// Keep per-aggregate order: claim an event only when every earlier event of its aggregate
    /// is SENT or claimed in this same batch.
    pub ordering: bool,
    /// Reclaiming an expired lease that brings attempts to this many marks the event DEAD.
    pub max_attempts: u32,
}

/// Begin a short relay transaction: read committed (no gap locks on MySQL), immediate on
/// SQLite (claims serialize), and on PostgreSQL without waiting for the WAL flush: a lost claim
/// or mark only causes a republish that broker deduplication and the inbox absorb.
async fn begin(db: &DatabaseConnection) -> Result<DatabaseTransaction, DbErr> {
    let backend = db.get_database_backend();
    let options = match backend {
        DbBackend::Sqlite => TransactionOptions {
            sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
            ..TransactionOptions::default()
        },
        _ => TransactionOptions {
            isolation_level: Some(IsolationLevel::ReadCommitted),
            ..TransactionOptions::default()
        },
    };
    let txn = db.begin_with_options(options).await?;
    if backend == DbBackend::Postgres {
        txn.execute_unprepared("SET LOCAL synchronous_commit = off")
            .await?;
    }
    Ok(txn)
}

/// Builds SQL with backend placeholders, numbering them as they are added.
struct Sql {
    dialect: Dialect,
    text: String,
    values: Vec<Value>,
}

impl Sql {
    fn new(dialect: Dialect) -> Self {
        Sql {
            dialect,
            text: String::with_capacity(256),
            values: Vec::new(),
        }
    }

    fn push(&mut self, sql: &str) -> &mut Self {
        self.text.push_str(sql);
        self
    }

    fn bind(&mut self, value: Value) -> &mut Self {
        self.values.push(value);
        let placeholder = self.dialect.placeholder(self.values.len());
        self.text.push_str(&placeholder);
        self
    }

    fn bind_list(&mut self, values: impl IntoIterator<Item = Value>) -> &mut Self {
        self.text.push('(');
        for (i, value) in values.into_iter().enumerate() {
            if i > 0 {
                self.text.push_str(", ");
            }
            self.bind(value);
        }
        self.text.push(')');
        self
    }

    fn build(self) -> Statement {
        Statement::from_sql_and_values(self.dialect.backend(), self.text, self.values)
    }
}

fn lock_clause(backend: DbBackend, skip_locked: bool) -> &'static str {
    match (backend, skip_locked) {
        (DbBackend::Sqlite, _) => "",
        (_, true) => " FOR UPDATE SKIP LOCKED",
        (_, false) => " FOR UPDATE",
    }
}

/// "This row is not SENT", in the form each backend's indexes serve: the partial index predicate
/// on PostgreSQL and SQLite, status ranges of `(aggregate_type, aggregate_id, status, id)` on
/// MySQL, which has no partial indexes.
fn unsent_predicate(backend: DbBackend, prefix: &str) -> String {
    match backend {
        DbBackend::MySql => {
            format!("{prefix}status IN ('PENDING', 'PROCESSING', 'RETRY', 'DEAD')")
        }
        _ => format!("{prefix}status <> 'SENT'"),
    }
}

/// "No earlier event of this row's aggregate is unsent."
fn push_no_unsent_predecessor(sql: &mut Sql) {
    let unsent = unsent_predicate(sql.dialect.backend(), "e.");
    sql.push(&format!(
        " AND NOT EXISTS (SELECT 1 FROM {OUTBOX_TABLE} e WHERE e.aggregate_type = o.aggregate_type \
         AND e.aggregate_id = o.aggregate_id AND e.id < o.id AND {unsent})"
    ));
}

/// The first claimable rows in id order: new, due for retry, or leased by a relay whose lease
/// expired; with ordering, only those with no unsent predecessor in their aggregate. Locked with
/// `SKIP LOCKED`, so concurrent relays take disjoint rows without waiting on each other.
fn heads_query(dialect: Dialect, params: &ClaimParams<'_>, limit: usize) -> Statement {
    let mut sql = Sql::new(dialect);
    let columns = prefixed_columns("o");
    let now = dialect.timestamp(params.now);
    if dialect.backend() == DbBackend::MySql {
        // Without partial indexes, one range scan of (status, id) per claimable status, each
        // stopping after `limit` rows, beats filtering every unsent row then sorting.
        let branches: [(&str, Option<&str>); 3] = [
            ("PENDING", None),
            ("RETRY", Some("o.next_attempt_at <= ")),
            ("PROCESSING", Some("o.locked_until < ")),
        ];
        for (i, (status, due)) in branches.into_iter().enumerate() {
            if i > 0 {
                sql.push(" UNION ALL ");
            }
            sql.push(&format!(
                "(SELECT {columns} FROM {OUTBOX_TABLE} o WHERE o.status = '{status}'"
            ));
            if let Some(due) = due {
                sql.push(" AND ").push(due).bind(now.clone());
            }
            if params.ordering {
                push_no_unsent_predecessor(&mut sql);
            }
            sql.push(&format!(
                " ORDER BY o.id LIMIT {limit} FOR UPDATE SKIP LOCKED)"
            ));
        }
        sql.push(&format!(" ORDER BY id LIMIT {limit}"));
        return sql.build();
    }
    sql.push(&format!(
        "SELECT {columns} FROM {OUTBOX_TABLE} o WHERE o.status <> 'SENT' AND (o.status = 'PENDING' \
         OR (o.status = 'RETRY' AND o.next_attempt_at <= "
    ))
    .bind(now.clone())
    .push(") OR (o.status = 'PROCESSING' AND o.locked_until < ")
    .bind(now)
    .push("))");
    if params.ordering {
        push_no_unsent_predecessor(&mut sql);
    }
    sql.push(&format!(" ORDER BY o.id LIMIT {limit}"));
    sql.push(lock_clause(dialect.backend(), true));
    sql.build()
}

fn decode(
    dialect: &Dialect,
    row: &QueryResult,
) -> Result<(ClaimedEvent, String, Option<DateTime<Utc>>), DbErr> {
    let schema_version: i64 = match dialect.backend() {
        DbBackend::Postgres | DbBackend::MySql => {
            i64::from(row.try_get::<i32>("", "schema_version")?)
        }
        _ => row.try_get("", "schema_version")?,
    };
    let attempts: i64 = match dialect.backend() {
        DbBackend::Postgres | DbBackend::MySql => i64::from(row.try_get::<i32>("", "attempts")?),
        _ => row.try_get("", "attempts")?,
    };
    let status: String = row.try_get("", "status")?;
    let locked_until = dialect.get_opt_timestamp(row, "locked_until")?;
    Ok((
        ClaimedEvent {
            id: row.try_get("", "id")?,
            event_id: dialect.get_uuid(row, "event_id")?,
            source: row.try_get("", "source")?,
            event_type: row.try_get("", "event_type")?,
            schema_version: u32::try_from(schema_version).unwrap_or(0),
            aggregate_type: row.try_get("", "aggregate_type")?,
            aggregate_id: row.try_get("", "aggregate_id")?,
            aggregate_version: row.try_get("", "aggregate_version")?,
            payload: dialect.get_json_text(row, "payload")?,
            headers: dialect.get_json_text(row, "headers")?,
            created_at: dialect.get_timestamp(row, "created_at")?,
            attempts: u32::try_from(attempts).unwrap_or(0),
            reclaimed: false,
        },
        status,
        locked_until,
    ))
}

/// Claim a batch: PENDING rows, RETRY rows that are due, and PROCESSING rows whose lease expired.
///
/// With ordering, the claim takes the first unsent event of each aggregate whose predecessors
/// are all SENT ("heads", locked with `SKIP LOCKED` so relays never wait on each other), then
/// the events that follow each head while they are claimable, so one relay owns an aggregate's
/// run and publishes it in order.
pub async fn claim(db: &DatabaseConnection, params: &ClaimParams<'_>) -> Result<Claim, DbErr> {
    let txn = begin(db).await?;
    let dialect = Dialect::of(&txn);
    let backend = dialect.backend();
    let limit = params.batch_size.max(1);

    // 1. Heads (or, without ordering, simply the first claimable rows).
    let sql = heads_query(dialect, params, limit);
    let mut rows = Vec::new();
    for row in txn.query_all_raw(sql).await? {
        rows.push(decode(&dialect, &row)?);
    }

    // 2. The runs behind each head, while there is room in the batch.
    if params.ordering && !rows.is_empty() && rows.len() < limit {
        let heads: std::collections::HashSet<i64> = rows.iter().map(|(e, _, _)| e.id).collect();
        let min_head = rows.iter().map(|(e, _, _)| e.id).min().unwrap_or(0);
        let mut sql = Sql::new(dialect);
        sql.push(&format!(
            "SELECT {CLAIM_COLUMNS} FROM {OUTBOX_TABLE} WHERE {} AND id > {min_head} AND (",
            unsent_predicate(backend, "")
        ));
        let mut aggregates: Vec<(&str, &str)> = rows
            .iter()
            .map(|(e, _, _)| (e.aggregate_type.as_str(), e.aggregate_id.as_str()))
            .collect();
        aggregates.sort_unstable();
        aggregates.dedup();
        for (i, (aggregate_type, aggregate_id)) in aggregates.iter().enumerate() {
            if i > 0 {
                sql.push(" OR ");
            }
            sql.push("(aggregate_type = ")
                .bind((*aggregate_type).to_owned().into())
                .push(" AND aggregate_id = ")
                .bind((*aggregate_id).to_owned().into())
                .push(")");
        }
        sql.push(&format!(") ORDER BY id LIMIT {}", limit - rows.len()));
        sql.push(lock_clause(backend, false));
        let successors = txn.query_all_raw(sql.build()).await?;
        // Per aggregate, take the contiguous claimable run right behind the head.
        let mut open: std::collections::HashSet<(String, String)> = rows
            .iter()
            .map(|(e, _, _)| (e.aggregate_type.clone(), e.aggregate_id.clone()))
            .collect();
        for row in &successors {
            let (event, status, locked_until) = decode(&dialect, row)?;
            if heads.contains(&event.id) {
                continue;
            }
            let key = (event.aggregate_type.clone(), event.aggregate_id.clone());
            if !open.contains(&key) {
                continue;
            }
            let claimable = status == status::PENDING
                || (status == status::PROCESSING && locked_until.is_some_and(|t| t < params.now));
            if claimable {
                rows.push((event, status, locked_until));
            } else {
                open.remove(&key);
            }
        }
        rows.sort_by_key(|(e, _, _)| e.id);
    }

    if rows.is_empty() {
        txn.commit().await?;
        return Ok(Claim {
            token: Uuid::nil(),
            events: Vec::new(),
            dead: Vec::new(),
        });
    }

    // 3. Reclaimed leases count an attempt; one reclaim too many makes the event DEAD, and (with
    //    ordering) keeps the rest of its aggregate back.
    let mut events = Vec::with_capacity(rows.len());
    let mut dead = Vec::new();
    let mut blocked: std::collections::HashSet<(String, String)> = Default::default();
    for (mut event, status, _) in rows {
        let key = (event.aggregate_type.clone(), event.aggregate_id.clone());
        if params.ordering && blocked.contains(&key) {
            continue;
        }
        if status == status::PROCESSING {
            event.attempts += 1;
            event.reclaimed = true;
            if event.attempts >= params.max_attempts {
                if params.ordering {
                    blocked.insert(key);
                }
                dead.push(event);
                continue;
            }
        }
        events.push(event);
    }

    let token = Uuid::new_v4();
    if !events.is_empty() {
        let mut sql = Sql::new(dialect);
        // `attempts` first: MySQL evaluates assignments left to right.
        sql.push(&format!(
            "UPDATE {OUTBOX_TABLE} SET attempts = CASE WHEN status = 'PROCESSING' THEN attempts + 1 ELSE attempts END, \
             status = 'PROCESSING', locked_by = "
        ))
        .bind(params.relay_id.to_owned().into())
        .push(", locked_until = ")
        .bind(dialect.timestamp(params.locked_until))
        .push(", claim_token = ")
        .bind(dialect.uuid(token))
        .push(" WHERE id IN ")
        .bind_list(events.iter().map(|e| Value::from(e.id)));
        txn.execute_raw(sql.build()).await?;
    }
    for event in &dead {
        let mut sql = Sql::new(dialect);
        sql.push(&format!(
            "UPDATE {OUTBOX_TABLE} SET attempts = attempts + 1, status = 'DEAD', locked_by = NULL, locked_until = NULL, last_error = "
        ))
        .bind(
            format!(
                "lease expired {} times: a relay crashed or hung while publishing this event",
                event.attempts
            )
            .into(),
        )
        .push(" WHERE id = ")
        .bind(event.id.into())
        .push(" AND status = 'PROCESSING'");
        txn.execute_raw(sql.build()).await?;
    }
    txn.commit().await?;
    Ok(Claim {
        token,
        events,
        dead,
    })
}

fn prefixed_columns(alias: &str) -> String {
    CLAIM_COLUMNS
        .split(", ")
        .map(|c| format!("{alias}.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A failed publish to record.
#[derive(Debug, Clone)]
pub struct Failure {
    /// Row id.
    pub id: i64,
    /// The new attempt count.
    pub attempts: u32,
    /// RETRY or DEAD.
    pub dead: bool,
    /// When to try again (RETRY).
    pub next_attempt_at: DateTime<Utc>,
    /// Why it failed.
    pub error: String,
}

/// What to write back after publishing a claim.
#[derive(Debug, Clone, Default)]
pub struct Settlement {
    /// Confirmed by the broker.
    pub sent: Vec<i64>,
    /// Failed.
    pub failed: Vec<Failure>,
    /// Never published (behind a failure in their aggregate, or at shutdown): back to PENDING.
    pub released: Vec<i64>,
    /// Of `released`, those whose claim counted a reclaim attempt, which is given back.
    pub released_reclaimed: Vec<i64>,
}

/// Rows actually updated per kind; fewer than asked means another relay owns them now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settled {
    /// Rows marked SENT.
    pub sent: u64,
    /// Rows marked RETRY or DEAD.
    pub failed: u64,
    /// Rows released.
    pub released: u64,
}

/// Write back a claim's outcome in one short transaction, fenced by its token.
pub async fn settle(
    db: &DatabaseConnection,
    token: Uuid,
    settlement: &Settlement,
    now: DateTime<Utc>,
) -> Result<Settled, DbErr> {
    let txn = begin(db).await?;
    let dialect = Dialect::of(&txn);
    let mut settled = Settled::default();

    for chunk in settlement.sent.chunks(1000) {
        let mut sql = Sql::new(dialect);
        sql.push(&format!(
            "UPDATE {OUTBOX_TABLE} SET status = 'SENT', sent_at = "
        ))
        .bind(dialect.timestamp(now))
        .push(", locked_until = NULL, last_error = NULL WHERE status = 'PROCESSING' AND claim_token = ")
        .bind(dialect.uuid(token))
        .push(" AND id IN ")
        .bind_list(chunk.iter().map(|id| Value::from(*id)));
        settled.sent += txn.execute_raw(sql.build()).await?.rows_affected();
    }

    for failure in &settlement.failed {
        let mut sql = Sql::new(dialect);
        sql.push(&format!("UPDATE {OUTBOX_TABLE} SET status = "))
            .bind(
                if failure.dead {
                    status::DEAD
                } else {
                    status::RETRY
                }
                .to_owned()
                .into(),
            )
            .push(", attempts = ")
            .bind(i64::from(failure.attempts).into())
            .push(", next_attempt_at = ")
            .bind(dialect.timestamp(failure.next_attempt_at))
            .push(", last_error = ")
            .bind(truncate(&failure.error, 4000).into())
            .push(", locked_until = NULL WHERE status = 'PROCESSING' AND claim_token = ")
            .bind(dialect.uuid(token))
            .push(" AND id = ")
            .bind(failure.id.into());
        settled.failed += txn.execute_raw(sql.build()).await?.rows_affected();
    }

    let reclaimed: std::collections::HashSet<i64> =
        settlement.released_reclaimed.iter().copied().collect();
    let (given_back, plain): (Vec<i64>, Vec<i64>) = settlement
        .released
        .iter()
        .copied()
        .partition(|id| reclaimed.contains(id));
    for (ids, refund) in [(plain, 0i64), (given_back, 1i64)] {
        for chunk in ids.chunks(1000) {
            let mut sql = Sql::new(dialect);
            sql.push(&format!(
                "UPDATE {OUTBOX_TABLE} SET attempts = attempts - {refund}, status = 'PENDING', \
                 locked_by = NULL, locked_until = NULL WHERE status = 'PROCESSING' AND claim_token = "
            ))
            .bind(dialect.uuid(token))
            .push(" AND id IN ")
            .bind_list(chunk.iter().map(|id| Value::from(*id)));
            settled.released += txn.execute_raw(sql.build()).await?.rows_affected();
        }
    }
    txn.commit().await?;
    Ok(settled)
}

fn truncate(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((i, _)) => s[..i].to_owned(),
        None => s.to_owned(),
    }
}
