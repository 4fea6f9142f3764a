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
        // Both settings in one round trip below.
        DbBackend::Postgres => TransactionOptions::default(),
        _ => TransactionOptions {
            isolation_level: Some(IsolationLevel::ReadCommitted),
            ..TransactionOptions::default()
        },
    };
    let txn = db.begin_with_options(options).await?;
    if backend == DbBackend::Postgres {
        txn.execute_unprepared(
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = off",
        )
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

    /// The backend the SQL is for.
    pub(crate) fn backend(&self) -> DbBackend {
        self.dialect.backend()
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
///
/// Heads are looked for in a window: the first [`window_size`] unfinished rows of the queue that
/// are not in flight (PROCESSING rows are passed over). A backlog concentrated in a few
/// aggregates then costs one window, not a walk over every unsent row, and the runs behind the
/// heads fill the batch. When the window is full and holds fewer heads than `limit` (say a DEAD
/// event with a long tail of its aggregate fills it), the heads of the aggregates that start
/// after the window are found by a loose index scan over the aggregate index, so that they do
/// not starve behind it.
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
    let window = window_size(limit);
    // On PostgreSQL and SQLite the heads query computes the window's bound itself and returns
    // it with every row (one round trip less per claim); MySQL asks first.
    let heads_bound = match (ordering, backend) {
        (false, _) => HeadsBound::Unbounded,
        (true, DbBackend::MySql) => match window_bound(txn, queue, window).await? {
            Some(bound) => HeadsBound::At(bound),
            None => HeadsBound::Unbounded,
        },
        (true, _) => HeadsBound::Window(window),
    };
    let mut rows = Vec::new();
    for row in txn
        .query_all_raw(heads_query(
            dialect,
            queue,
            now,
            limit,
            ordering,
            heads_bound,
        ))
        .await?
    {
        rows.push(Candidate {
            id: row.try_get("", "id")?,
            row,
        });
    }
    let bound = match heads_bound {
        HeadsBound::Unbounded => None,
        HeadsBound::At(bound) => Some(bound),
        HeadsBound::Window(_) => match rows.first() {
            Some(c) => c.row.try_get::<Option<i64>>("", "window_bound")?,
            // No head in the window: whether it is full decides whether to look beyond it.
            None => window_bound(txn, queue, window).await?,
        },
    };
    if let Some(bound) = bound
        && rows.len() < limit
    {
        let seen: std::collections::HashSet<i64> = rows.iter().map(|c| c.id).collect();
        let beyond = heads_beyond_window_query(
            dialect,
            queue,
            now,
            limit - rows.len(),
            bound,
            window + 2 * limit,
        );
        for row in txn.query_all_raw(beyond).await? {
            let id: i64 = row.try_get("", "id")?;
            if !seen.contains(&id) {
                rows.push(Candidate { id, row });
            }
        }
        rows.sort_by_key(|c| c.id);
    }
    if !ordering || rows.is_empty() || rows.len() >= limit {
        return Ok(rows);
    }
    // The heads query says which heads have a later unfinished row; the beyond-window query
    // does not, so its heads count as having one.
    if !rows.iter().any(|c| has_next(&c.row)) {
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
    // The other heads are among these rows too: room for them on top of the run rows.
    sql.push(&format!(
        ") ORDER BY id LIMIT {}",
        limit - rows.len() + heads.len()
    ));
    sql.push(lock_clause(backend, false));
    let mut open: std::collections::HashSet<(String, String)> = aggregates.into_iter().collect();
    for row in txn.query_all_raw(sql.build()).await? {
        if rows.len() >= limit {
            break;
        }
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

/// Whether a candidate may have a run behind it: the heads query's `has_next` column; `true`
/// when the row does not carry it.
fn has_next(row: &QueryResult) -> bool {
    if let Ok(flag) = row.try_get::<i64>("", "has_next") {
        return flag != 0;
    }
    if let Ok(flag) = row.try_get::<i32>("", "has_next") {
        return flag != 0;
    }
    true
}

/// `, CASE WHEN EXISTS (a later unfinished row of this row's aggregate) THEN 1 ELSE 0 END AS
/// has_next`: whether the runs step has anything to look for behind this head.
fn push_has_next(sql: &mut Sql, queue: &Queue<'_>) {
    let later = unfinished_in_aggregate(sql.dialect.backend(), queue, ">");
    sql.push(&format!(
        ", CASE WHEN EXISTS ({later}) THEN 1 ELSE 0 END AS has_next"
    ));
}

/// "No earlier row of this row's aggregate is unfinished."
fn push_no_unfinished_predecessor(sql: &mut Sql, queue: &Queue<'_>) {
    let earlier = unfinished_in_aggregate(sql.dialect.backend(), queue, "<");
    sql.push(&format!(" AND NOT EXISTS ({earlier})"));
}

/// The unfinished rows `e` of row `o`'s aggregate (and scope) whose id is `order` (`<`, `>`)
/// its id.
fn unfinished_in_aggregate(backend: DbBackend, queue: &Queue<'_>, order: &str) -> String {
    let unfinished = (queue.unfinished)(backend, "e.");
    let scope = match queue.scope {
        Some((column, _)) => format!(" AND e.{column} = o.{column}"),
        None => String::new(),
    };
    format!(
        "SELECT 1 FROM {} e WHERE e.aggregate_type = o.aggregate_type \
         AND e.aggregate_id = o.aggregate_id{scope} AND e.id {order} o.id AND {unfinished}",
        queue.table
    )
}

/// ` AND {alias}{scope column} = ?` (`alias` with its dot, or empty), when the queue has a scope.
fn push_scope_of(sql: &mut Sql, queue: &Queue<'_>, alias: &str) {
    if let Some((column, value)) = queue.scope {
        sql.push(&format!(" AND {alias}{column} = "))
            .bind(value.to_owned().into());
    }
}

fn push_scope(sql: &mut Sql, queue: &Queue<'_>) {
    push_scope_of(sql, queue, "o.");
}

/// "This row can be claimed now": PENDING, RETRY that is due, PROCESSING whose lease expired.
fn push_claimable(sql: &mut Sql, now: &Value) {
    sql.push(" AND (o.status = 'PENDING' OR (o.status = 'RETRY' AND o.next_attempt_at <= ")
        .bind(now.clone())
        .push(") OR (o.status = 'PROCESSING' AND o.locked_until < ")
        .bind(now.clone())
        .push("))");
}

pub(crate) fn prefixed_columns(columns: &str, alias: &str) -> String {
    columns
        .split(',')
        .map(|c| format!("{alias}.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How many unfinished rows that are not in flight, from the front of the queue, the heads query
/// looks at: enough that a backlog spread over many aggregates fills a batch with heads from the
/// window alone.
fn window_size(limit: usize) -> usize {
    (8 * limit).max(1024)
}

/// The statuses the window counts: unfinished, but not PROCESSING. The batches that other
/// claims (other relays or workers, or the same relay's previous batch) are still publishing
/// would otherwise fill the window with rows that cannot be heads, and every claim would fall
/// back to the scan beyond it. MySQL has no partial indexes: its window reads one `(status, id)`
/// range per status.
const WINDOW_STATUSES: [&str; 3] = ["PENDING", "RETRY", "DEAD"];

/// The id of the `window`-th unfinished row of the queue that is not PROCESSING, in id order;
/// `None` when the queue holds fewer (the heads query then reads all of them anyway). Served by
/// the unsent/unfinished partial index on PostgreSQL and SQLite, by one `(status, id)` range per
/// status on MySQL.
async fn window_bound(
    txn: &DatabaseTransaction,
    queue: &Queue<'_>,
    window: usize,
) -> Result<Option<i64>, DbErr> {
    let mut sql = Sql::new(Dialect::of(txn));
    push_window_bound(&mut sql, queue, window);
    match txn.query_one_raw(sql.build()).await? {
        Some(row) => Ok(Some(row.try_get("", "id")?)),
        None => Ok(None),
    }
}

/// The query of [`window_bound`], also used as a scalar subquery.
fn push_window_bound(sql: &mut Sql, queue: &Queue<'_>, window: usize) {
    let backend = sql.dialect.backend();
    if backend == DbBackend::MySql {
        sql.push("SELECT id FROM (");
        for (i, status) in WINDOW_STATUSES.into_iter().enumerate() {
            if i > 0 {
                sql.push(" UNION ALL ");
            }
            sql.push(&format!(
                "(SELECT id FROM {} WHERE status = '{status}' AND {}",
                queue.table,
                (queue.unfinished)(backend, "")
            ));
            push_scope_of(sql, queue, "");
            sql.push(&format!(" ORDER BY id LIMIT {window})"));
        }
        sql.push(") w");
    } else {
        sql.push(&format!(
            "SELECT id FROM {} WHERE {} AND status <> 'PROCESSING'",
            queue.table,
            (queue.unfinished)(backend, "")
        ));
        push_scope_of(sql, queue, "");
    }
    sql.push(&format!(" ORDER BY id LIMIT 1 OFFSET {}", window - 1));
}

/// The heads query's upper bound on ids.
#[derive(Clone, Copy)]
enum HeadsBound {
    /// None: without ordering, or with fewer unfinished rows than the window holds.
    Unbounded,
    /// Already known (MySQL asks for it first).
    At(i64),
    /// The bound of a window of this size, computed inside the query and returned with each
    /// row as `window_bound`.
    Window(usize),
}

/// The first claimable rows in id order; with ordering, only those with no unfinished
/// predecessor in their aggregate, and only up to `bound` (the window) when given. Locked with
/// `SKIP LOCKED`, so concurrent claimers take disjoint rows without waiting on each other.
fn heads_query(
    dialect: Dialect,
    queue: &Queue<'_>,
    now: DateTime<Utc>,
    limit: usize,
    ordering: bool,
    bound: HeadsBound,
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
            sql.push(&format!("(SELECT {columns}"));
            if ordering {
                push_has_next(&mut sql, queue);
            }
            sql.push(&format!(
                " FROM {} o WHERE o.status = '{status}'",
                queue.table
            ));
            push_scope(&mut sql, queue);
            if let Some(due) = due {
                sql.push(" AND ").push(due).bind(now.clone());
            }
            if let HeadsBound::At(bound) = bound {
                sql.push(" AND o.id <= ").bind(bound.into());
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
    if let HeadsBound::Window(window) = bound {
        sql.push("WITH w AS (");
        push_window_bound(&mut sql, queue, window);
        sql.push(") ");
    }
    sql.push(&format!("SELECT {columns}"));
    if ordering {
        push_has_next(&mut sql, queue);
    }
    if let HeadsBound::Window(_) = bound {
        sql.push(", (SELECT id FROM w) AS window_bound");
    }
    sql.push(&format!(
        " FROM {} o WHERE {}",
        queue.table,
        (queue.unfinished)(dialect.backend(), "o.")
    ));
    push_scope(&mut sql, queue);
    if let HeadsBound::At(bound) = bound {
        sql.push(" AND o.id <= ").bind(bound.into());
    }
    if let HeadsBound::Window(_) = bound {
        sql.push(&format!(
            " AND o.id <= COALESCE((SELECT id FROM w), {})",
            i64::MAX
        ));
    }
    // From the first unfinished row: otherwise the planner may walk the primary key from the
    // table's first row through every finished row (their number only grows until retention).
    sql.push(&format!(
        " AND o.id >= (SELECT MIN(x.id) FROM {} x WHERE {}",
        queue.table,
        (queue.unfinished)(dialect.backend(), "x.")
    ));
    push_scope_of(&mut sql, queue, "x.");
    sql.push(")");
    push_claimable(&mut sql, &now);
    if ordering {
        push_no_unfinished_predecessor(&mut sql, queue);
    }
    sql.push(&format!(" ORDER BY o.id LIMIT {limit}"));
    sql.push(lock_clause(dialect.backend(), true));
    sql.build()
}

/// The heads after the window (ids above `bound`), at most `room`, in id order, locked with
/// `SKIP LOCKED`: for when the window is full of rows that cannot be heads.
///
/// Candidates are each aggregate's first unfinished row, found by a loose index scan over the
/// aggregate index that jumps from one `(aggregate_type, aggregate_id)` to the next (a recursive
/// CTE on PostgreSQL and SQLite; on MySQL, whose dependent subqueries cannot seek on an outer
/// value, a `GROUP BY` that MySQL runs as a loose index scan, one per claimable status). The scan
/// visits at most `budget` aggregates in key order: more than the window can hold, so that it
/// always reaches aggregates beyond it (with more aggregates than that, the first in key order,
/// not in id order). Rows without an aggregate type (inbox messages from other producers) are each
/// their own aggregate and are read from their own index range; an inbox row with a type but no
/// aggregate id is reached only once the window gets to it. The final statement checks
/// claimability and the "no unfinished predecessor" predicate again, as the heads query does,
/// so a stale candidate is never taken.
fn heads_beyond_window_query(
    dialect: Dialect,
    queue: &Queue<'_>,
    now: DateTime<Utc>,
    room: usize,
    bound: i64,
    budget: usize,
) -> Statement {
    let backend = dialect.backend();
    let table = queue.table;
    let unfinished = |prefix: &str| (queue.unfinished)(backend, prefix);
    let mut sql = Sql::new(dialect);
    // The index column before the aggregate when the queue is scoped (the inbox's consumer).
    let lead = match queue.scope {
        Some((column, _)) => format!("{column}, "),
        None => String::new(),
    };
    if backend != DbBackend::MySql {
        // agg: one row per aggregate in key order, with the id of its first unfinished row.
        sql.push(&format!(
            "WITH RECURSIVE agg (n, id, t, i) AS (SELECT 1, s.id, s.aggregate_type, s.aggregate_id \
             FROM (SELECT e.id, e.aggregate_type, e.aggregate_id FROM {table} e WHERE {}",
            unfinished("e.")
        ));
        push_scope_of(&mut sql, queue, "e.");
        sql.push(
            " AND e.aggregate_type IS NOT NULL AND e.aggregate_id IS NOT NULL \
             ORDER BY e.aggregate_type, e.aggregate_id, e.id LIMIT 1) s \
             UNION ALL SELECT a.n + 1, f.id, f.aggregate_type, f.aggregate_id FROM agg a ",
        );
        if backend == DbBackend::Postgres {
            sql.push(&format!(
                "CROSS JOIN LATERAL (SELECT e.id, e.aggregate_type, e.aggregate_id \
                 FROM {table} e WHERE {}",
                unfinished("e.")
            ));
            push_scope_of(&mut sql, queue, "e.");
            sql.push(
                " AND (e.aggregate_type, e.aggregate_id) > (a.t, a.i) AND e.aggregate_id IS NOT NULL \
                 ORDER BY e.aggregate_type, e.aggregate_id, e.id LIMIT 1) f",
            );
        } else {
            // SQLite sorts NULLs first, and with the `aggregate_id IS NOT NULL` that skipping
            // them needs it no longer seeks on the row value: two seeks instead, the next id
            // of the same type, else the first aggregate of a later type.
            sql.push(&format!(
                "JOIN {table} f ON f.id = COALESCE((SELECT e.id FROM {table} e WHERE {}",
                unfinished("e.")
            ));
            push_scope_of(&mut sql, queue, "e.");
            sql.push(&format!(
                " AND e.aggregate_type = a.t AND e.aggregate_id > a.i \
                 ORDER BY e.aggregate_type, e.aggregate_id, e.id LIMIT 1), \
                 (SELECT e.id FROM {table} e WHERE {}",
                unfinished("e.")
            ));
            push_scope_of(&mut sql, queue, "e.");
            sql.push(
                " AND e.aggregate_type > a.t AND e.aggregate_id IS NOT NULL \
                 ORDER BY e.aggregate_type, e.aggregate_id, e.id LIMIT 1))",
            );
        }
        sql.push(&format!(" WHERE a.n < {budget}) "));
    }
    sql.push(&format!(
        "SELECT {} FROM {table} o WHERE o.id IN (SELECT c.id FROM (",
        prefixed_columns(queue.columns, "o")
    ));
    if backend == DbBackend::MySql {
        // A head is also the first row of its status in its aggregate: one loose index scan of
        // `(aggregate_type, aggregate_id, status, id)` per claimable status.
        for status in ["PENDING", "RETRY", "PROCESSING"] {
            sql.push(&format!(
                "(SELECT MIN(id) AS id FROM {table} WHERE status = '{status}'"
            ));
            push_scope_of(&mut sql, queue, "");
            sql.push(&format!(
                " GROUP BY {lead}aggregate_type, aggregate_id \
                 ORDER BY {lead}aggregate_type, aggregate_id LIMIT {budget}) UNION ALL "
            ));
        }
    } else {
        sql.push("SELECT id FROM agg UNION ALL ");
    }
    // Rows without an aggregate type: each is a head of its own. `+id` keeps the id bound,
    // which the planners push into this branch, from being read as an id range (SQLite would
    // then walk every row after the window instead of the aggregate index's NULL range).
    sql.push(&format!(
        "SELECT +id AS id FROM {table} WHERE {} AND aggregate_type IS NULL",
        unfinished("")
    ));
    push_scope_of(&mut sql, queue, "");
    sql.push(") c WHERE c.id > ")
        .bind(bound.into())
        .push(&format!(") AND {}", unfinished("o.")));
    push_scope(&mut sql, queue);
    push_claimable(&mut sql, &dialect.timestamp(now));
    push_no_unfinished_predecessor(&mut sql, queue);
    sql.push(&format!(" ORDER BY o.id LIMIT {room}"));
    sql.push(lock_clause(backend, true));
    sql.build()
}
