//! Claiming rows of a work queue table (`outbox_event`, `inbox_event`) in id order, with
//! optional per-aggregate order, and the short transactions claims and write-backs run in.

use chrono::{DateTime, Utc};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, IsolationLevel,
    QueryResult, SqliteTransactionMode, Statement, TransactionOptions, TransactionTrait, Value,
};

use super::Dialect;

/// Begin a short claim or write-back transaction: read committed (no gap locks on MySQL), immediate on
/// SQLite (claims serialize), and on PostgreSQL without waiting for the WAL flush: a lost claim
/// or mark only causes a republish that broker deduplication and the inbox absorb.
pub(crate) async fn begin(db: &DatabaseConnection) -> Result<DatabaseTransaction, DbErr> {
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
pub(crate) struct Sql {
    dialect: Dialect,
    text: String,
    values: Vec<Value>,
}

impl Sql {
    pub(crate) fn new(dialect: Dialect) -> Self {
        Sql {
            dialect,
            text: String::with_capacity(256),
            values: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, sql: &str) -> &mut Self {
        self.text.push_str(sql);
        self
    }

    pub(crate) fn bind(&mut self, value: Value) -> &mut Self {
        self.values.push(value);
        let placeholder = self.dialect.placeholder(self.values.len());
        self.text.push_str(&placeholder);
        self
    }

    pub(crate) fn bind_list(&mut self, values: impl IntoIterator<Item = Value>) -> &mut Self {
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

    pub(crate) fn build(self) -> Statement {
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

/// A table of work claimed in id order.
pub(crate) struct Queue<'a> {
    /// The table.
    pub(crate) table: &'static str,
    /// Columns to read, comma-separated, unqualified.
    pub(crate) columns: &'static str,
    /// An equality every row must satisfy (the inbox's consumer).
    pub(crate) scope: Option<(&'static str, &'a str)>,
    /// The predicate "this row still holds its aggregate back", for a column prefix.
    pub(crate) unfinished: fn(DbBackend, &str) -> String,
}

/// Hand expired claims back as PENDING, with no attempt counted: the rows behind an event or
/// message the same claim just made DEAD, so that they wait visibly behind it instead of
/// looking stuck in PROCESSING.
pub(crate) async fn hand_back(
    txn: &DatabaseTransaction,
    table: &str,
    ids: Vec<i64>,
) -> Result<(), DbErr> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut sql = Sql::new(Dialect::of(txn));
    sql.push(&format!(
        "UPDATE {table} SET status = 'PENDING', locked_by = NULL, locked_until = NULL \
         WHERE status = 'PROCESSING' AND id IN "
    ))
    .bind_list(ids.into_iter().map(Value::from));
    txn.execute_raw(sql.build()).await?;
    Ok(())
}

/// A claimable row, with what ordering decisions need and the full row for the caller.
pub(crate) struct Candidate {
    pub(crate) id: i64,
    pub(crate) row: QueryResult,
}

fn aggregate_of(row: &QueryResult) -> Result<(Option<String>, Option<String>), DbErr> {
    Ok((
        row.try_get("", "aggregate_type")?,
        row.try_get("", "aggregate_id")?,
    ))
}

/// Select (and lock, where the backend can) the rows to claim: PENDING, RETRY that are due, and
/// PROCESSING whose lease expired, in id order, at most `limit`.
///
/// With ordering, a row is taken only when no earlier row of its aggregate is unfinished
/// ("heads", locked with `SKIP LOCKED` so claimers never wait on each other), plus the PENDING
/// rows right behind each head while there is room, so one claimer owns an aggregate's run.
pub(crate) async fn select_claimable(
    txn: &DatabaseTransaction,
    queue: &Queue<'_>,
    now: DateTime<Utc>,
    limit: usize,
    ordering: bool,
) -> Result<Vec<Candidate>, DbErr> {
    let dialect = Dialect::of(txn);
    let backend = dialect.backend();
    let limit = limit.max(1);
    let mut rows = Vec::new();
    for row in txn
        .query_all_raw(heads_query(dialect, queue, now, limit, ordering))
        .await?
    {
        rows.push(Candidate {
            id: row.try_get("", "id")?,
            row,
        });
    }
    if !ordering || rows.is_empty() || rows.len() >= limit {
        return Ok(rows);
    }

    // The runs behind each head.
    let heads: std::collections::HashSet<i64> = rows.iter().map(|c| c.id).collect();
    let min_head = rows.iter().map(|c| c.id).min().unwrap_or(0);
    let mut aggregates = Vec::new();
    for c in &rows {
        if let (Some(t), Some(i)) = aggregate_of(&c.row)? {
            aggregates.push((t, i));
        }
    }
    aggregates.sort_unstable();
    aggregates.dedup();
    if aggregates.is_empty() {
        return Ok(rows);
    }
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "SELECT {} FROM {} WHERE {} AND id > {min_head}",
        queue.columns,
        queue.table,
        (queue.unfinished)(backend, "")
    ));
    if let Some((column, value)) = queue.scope {
        sql.push(&format!(" AND {column} = "))
            .bind(value.to_owned().into());
    }
    sql.push(" AND (");
    for (i, (aggregate_type, aggregate_id)) in aggregates.iter().enumerate() {
        if i > 0 {
            sql.push(" OR ");
        }
        sql.push("(aggregate_type = ")
            .bind(aggregate_type.clone().into())
            .push(" AND aggregate_id = ")
            .bind(aggregate_id.clone().into())
            .push(")");
    }
    sql.push(&format!(") ORDER BY id LIMIT {}", limit - rows.len()));
    sql.push(lock_clause(backend, false));
    let mut open: std::collections::HashSet<(String, String)> = aggregates.into_iter().collect();
    for row in txn.query_all_raw(sql.build()).await? {
        let id: i64 = row.try_get("", "id")?;
        if heads.contains(&id) {
            continue;
        }
        let (Some(t), Some(i)) = aggregate_of(&row)? else {
            continue;
        };
        let key = (t, i);
        if !open.contains(&key) {
            continue;
        }
        let status: String = row.try_get("", "status")?;
        let locked_until = dialect.get_opt_timestamp(&row, "locked_until")?;
        let claimable = status == "PENDING"
            || (status == "PROCESSING" && locked_until.is_some_and(|t| t < now));
        if claimable {
            rows.push(Candidate { id, row });
        } else {
            open.remove(&key);
        }
    }
    rows.sort_by_key(|c| c.id);
    Ok(rows)
}

/// "No earlier row of this row's aggregate is unfinished."
fn push_no_unfinished_predecessor(sql: &mut Sql, queue: &Queue<'_>) {
    let unfinished = (queue.unfinished)(sql.dialect.backend(), "e.");
    let scope = match queue.scope {
        Some((column, _)) => format!(" AND e.{column} = o.{column}"),
        None => String::new(),
    };
    sql.push(&format!(
        " AND NOT EXISTS (SELECT 1 FROM {} e WHERE e.aggregate_type = o.aggregate_type \
         AND e.aggregate_id = o.aggregate_id{scope} AND e.id < o.id AND {unfinished})",
        queue.table
    ));
}

fn push_scope(sql: &mut Sql, queue: &Queue<'_>) {
    if let Some((column, value)) = queue.scope {
        sql.push(&format!(" AND o.{column} = "))
            .bind(value.to_owned().into());
    }
}

pub(crate) fn prefixed_columns(columns: &str, alias: &str) -> String {
    columns
        .split(',')
        .map(|c| format!("{alias}.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The first claimable rows in id order; with ordering, only those with no unfinished
/// predecessor in their aggregate. Locked with `SKIP LOCKED`, so concurrent claimers take
/// disjoint rows without waiting on each other.
fn heads_query(
    dialect: Dialect,
    queue: &Queue<'_>,
    now: DateTime<Utc>,
    limit: usize,
    ordering: bool,
) -> Statement {
    let mut sql = Sql::new(dialect);
    let columns = prefixed_columns(queue.columns, "o");
    let now = dialect.timestamp(now);
    if dialect.backend() == DbBackend::MySql {
        // Without partial indexes, one range scan of (status, id) per claimable status, each
        // stopping after `limit` rows, beats filtering every unfinished row then sorting.
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
                "(SELECT {columns} FROM {} o WHERE o.status = '{status}'",
                queue.table
            ));
            push_scope(&mut sql, queue);
            if let Some(due) = due {
                sql.push(" AND ").push(due).bind(now.clone());
            }
            if ordering {
                push_no_unfinished_predecessor(&mut sql, queue);
            }
            sql.push(&format!(
                " ORDER BY o.id LIMIT {limit} FOR UPDATE SKIP LOCKED)"
            ));
        }
        sql.push(&format!(" ORDER BY id LIMIT {limit}"));
        return sql.build();
    }
    sql.push(&format!(
        "SELECT {columns} FROM {} o WHERE {}",
        queue.table,
        (queue.unfinished)(dialect.backend(), "o.")
    ));
    push_scope(&mut sql, queue);
    sql.push(" AND (o.status = 'PENDING' OR (o.status = 'RETRY' AND o.next_attempt_at <= ")
        .bind(now.clone())
        .push(") OR (o.status = 'PROCESSING' AND o.locked_until < ")
        .bind(now)
        .push("))");
    if ordering {
        push_no_unfinished_predecessor(&mut sql, queue);
    }
    sql.push(&format!(" ORDER BY o.id LIMIT {limit}"));
    sql.push(lock_clause(dialect.backend(), true));
    sql.build()
}
