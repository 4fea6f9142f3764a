//! Claiming rows of a work queue table (`outbox_event`, `inbox_event`) in id order, with
//! optional per-aggregate order. The statements take the shape the dialect's planner reads
//! fast ([`QueueScan`]): over a partial index of the open rows (PostgreSQL, SQLite), or
//! one `(status, id)` range per status (MySQL/MariaDB); both shapes are here, side by side.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, QueryResult, Statement, Value};

use super::{
    DbTime, Dialect,
    backend::{NextAggregate, QueueScan},
    floor::{Bound, push_low},
    sql::Sql,
    status::WorkStatus,
};

/// How to claim from a work queue: the relay's claim of outbox events, the worker's claim of
/// inbox messages, the database-local transport's move.
#[derive(Debug, Clone, Copy)]
pub struct ClaimParams<'a> {
    /// Who claims (stored in `locked_by`): a relay id or a worker id.
    pub owner: &'a str,
    /// At most this many rows.
    pub batch_size: usize,
    /// The lease: it ends this long after the database's current time.
    pub lease: Duration,
    /// Keep per-aggregate order: claim a row only when every earlier row of its aggregate is
    /// finished or claimed in this same batch.
    pub ordering: bool,
    /// Reclaiming an expired lease that brings attempts to this many marks the row DEAD.
    pub max_attempts: u32,
}

/// A table of work claimed in id order.
#[derive(Debug, Clone, Copy)]
pub struct Queue<'a> {
    /// The connection's dialect.
    pub dialect: Dialect,
    /// The table.
    pub table: &'static str,
    /// Columns to read, comma-separated, unqualified.
    pub columns: &'static str,
    /// An equality every row must satisfy (the inbox's consumer).
    pub scope: Option<(&'static str, &'a str)>,
    /// The predicate "this row still holds its aggregate back", for a column prefix.
    pub predicate: fn(&Dialect, &str) -> String,
    /// PENDING rows younger than this (by the database's clock) are not claimable: beside the
    /// WAL relay, which publishes them, the claim loop only picks up what it left.
    pub pending_age: Option<Duration>,
    /// Where the scans of unfinished rows start (see `floor.rs`); `None`: at the first.
    pub floor: Option<Bound>,
    /// Event types held back (their destination is paused): not claimable, and with ordering
    /// the later rows of their aggregates wait behind them.
    pub held: &'a [String],
}

impl Queue<'_> {
    /// "This row still holds its aggregate back", on columns with `prefix` (`o.`, or empty).
    pub fn unfinished(&self, prefix: &str) -> String {
        (self.predicate)(&self.dialect, prefix)
    }

    /// "A claim can take this row or has it in flight" (PENDING, PROCESSING, RETRY), on columns
    /// with `prefix`: the predicate of the queue's id index, written as the index is, so that
    /// every scan by id is served by it. The per-aggregate checks say [`Queue::unfinished`],
    /// which this index cannot serve: they must see DEAD rows, and only the aggregate indexes
    /// give them (a planner that misjudged the id index's size read them from it, walking every
    /// retained entry).
    pub fn open(&self, prefix: &str) -> String {
        WorkStatus::in_list(prefix, &WorkStatus::OPEN)
    }
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
        "UPDATE {table} SET status = {pending}, locked_by = NULL, locked_until = NULL \
         WHERE status = {processing} AND id IN ",
        pending = WorkStatus::Pending.literal(),
        processing = WorkStatus::Processing.literal(),
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

/// The rows a claim may take, and the database's time when it found them (`None` when it found
/// none).
pub(crate) struct Claimable {
    pub(crate) rows: Vec<Candidate>,
    pub(crate) now: Option<DateTime<Utc>>,
}

/// The column every heads query returns the database's current time in.
const NOW_COLUMN: &str = "db_now";

/// `, <the database's current time> AS db_now`.
pub(crate) fn push_now_column(sql: &mut Sql) {
    sql.push(", ")
        .time(DbTime::NOW)
        .push(" AS ")
        .push(NOW_COLUMN);
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
    limit: usize,
    ordering: bool,
) -> Result<Claimable, DbErr> {
    let limit = limit.max(1);
    let window = window_size(limit);
    let bound = heads_bound(txn, queue, window, ordering).await?;
    let heads = HeadsQuery {
        queue,
        limit,
        ordering,
        bound,
    };
    let mut rows = select_heads(txn, &heads).await?;
    if let Some(bound) = full_window_bound(txn, queue, window, bound, &rows).await?
        && rows.len() < limit
    {
        add_heads_beyond_window(txn, queue, limit, window, bound, &mut rows).await?;
    }
    let Some(first) = rows.first() else {
        return Ok(Claimable { rows, now: None });
    };
    let now = queue.dialect.get_timestamp(&first.row, NOW_COLUMN)?;
    // The heads query says which heads have a later unfinished row; the beyond-window query
    // does not, so its heads count as having one.
    if ordering && rows.len() < limit && rows.iter().any(|c| has_next(&c.row)) {
        add_runs(txn, queue, limit, now, &mut rows).await?;
    }
    Ok(Claimable {
        rows,
        now: Some(now),
    })
}

/// The heads query's bound on ids. It computes the window's bound itself and returns it with
/// every row where the dialect can (one round trip less per claim); otherwise it is asked for
/// first.
async fn heads_bound(
    txn: &DatabaseTransaction,
    queue: &Queue<'_>,
    window: usize,
    ordering: bool,
) -> Result<HeadsBound, DbErr> {
    if !ordering {
        return Ok(HeadsBound::Unbounded);
    }
    if window_in_heads_query(queue) {
        return Ok(HeadsBound::Window(window));
    }
    Ok(match window_bound(txn, queue, window).await? {
        Some(bound) => HeadsBound::At(bound),
        None => HeadsBound::Unbounded,
    })
}

/// The rows of the heads query, in id order.
async fn select_heads(
    txn: &DatabaseTransaction,
    heads: &HeadsQuery<'_>,
) -> Result<Vec<Candidate>, DbErr> {
    let mut rows = Vec::new();
    for row in txn.query_all_raw(heads_query(heads)).await? {
        rows.push(Candidate {
            id: row.try_get("", "id")?,
            row,
        });
    }
    Ok(rows)
}

/// The window's bound when the window is full (`None`: the heads query read every unfinished
/// row): as asked for first, or as the heads query returned it.
async fn full_window_bound(
    txn: &DatabaseTransaction,
    queue: &Queue<'_>,
    window: usize,
    bound: HeadsBound,
    heads: &[Candidate],
) -> Result<Option<i64>, DbErr> {
    match bound {
        HeadsBound::Unbounded => Ok(None),
        HeadsBound::At(bound) => Ok(Some(bound)),
        HeadsBound::Window(_) => match heads.first() {
            Some(c) => c.row.try_get::<Option<i64>>("", "window_bound"),
            // No head in the window: whether it is full decides whether to look beyond it.
            None => window_bound(txn, queue, window).await,
        },
    }
}

/// Add the heads after the window's `bound` (see [`BeyondWindow`]) that are not among `rows`
/// yet, while there is room; `rows` stay in id order.
async fn add_heads_beyond_window(
    txn: &DatabaseTransaction,
    queue: &Queue<'_>,
    limit: usize,
    window: usize,
    bound: i64,
    rows: &mut Vec<Candidate>,
) -> Result<(), DbErr> {
    let seen: std::collections::HashSet<i64> = rows.iter().map(|c| c.id).collect();
    let beyond = BeyondWindow {
        queue,
        room: limit - rows.len(),
        bound,
        budget: window + 2 * limit,
    };
    for row in txn.query_all_raw(heads_beyond_window(&beyond)).await? {
        let id: i64 = row.try_get("", "id")?;
        if !seen.contains(&id) {
            rows.push(Candidate { id, row });
        }
    }
    rows.sort_by_key(|c| c.id);
    Ok(())
}

/// Add the runs behind the heads in `rows`: each aggregate's claimable rows right after its
/// head, up to the first that is not claimable (leases judged by `now`, the database's time the
/// heads query read), while there is room; `rows` stay in id order.
async fn add_runs(
    txn: &DatabaseTransaction,
    queue: &Queue<'_>,
    limit: usize,
    now: DateTime<Utc>,
    rows: &mut Vec<Candidate>,
) -> Result<(), DbErr> {
    let heads: std::collections::HashSet<i64> = rows.iter().map(|c| c.id).collect();
    let min_head = rows.iter().map(|c| c.id).min().unwrap_or(0);
    let mut aggregates = Vec::new();
    for c in rows.iter() {
        if let (Some(t), Some(i)) = aggregate_of(&c.row)? {
            aggregates.push((t, i));
        }
    }
    aggregates.sort_unstable();
    aggregates.dedup();
    if aggregates.is_empty() {
        return Ok(());
    }
    // The other heads are among these rows too: room for them on top of the run rows.
    let room = limit - rows.len() + heads.len();
    let statement = runs_query(queue, &aggregates, min_head, room);
    let mut open: std::collections::HashSet<(String, String)> = aggregates.into_iter().collect();
    for row in txn.query_all_raw(statement).await? {
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
        let held = !queue.held.is_empty() && {
            let event_type: String = row.try_get("", "event_type")?;
            queue.held.contains(&event_type)
        };
        if !held && run_row_claimable(queue.dialect, &row, now)? {
            rows.push(Candidate { id, row });
        } else {
            open.remove(&key);
        }
    }
    rows.sort_by_key(|c| c.id);
    Ok(())
}

/// The unfinished rows after `min_head` of `aggregates`, in id order, at most `limit`, locked.
fn runs_query(
    queue: &Queue<'_>,
    aggregates: &[(String, String)],
    min_head: i64,
    limit: usize,
) -> Statement {
    let mut sql = Sql::new(queue.dialect);
    sql.push(&format!(
        "SELECT {} FROM {} WHERE {} AND id > {min_head}",
        queue.columns,
        queue.table,
        queue.unfinished("")
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
    sql.push(&format!(") ORDER BY id LIMIT {limit}"));
    sql.push(queue.dialect.lock_rows(false));
    sql.build()
}

/// Whether a row of a run can be claimed now: PENDING, or PROCESSING with its lease expired by
/// `now`.
fn run_row_claimable(
    dialect: Dialect,
    row: &QueryResult,
    now: DateTime<Utc>,
) -> Result<bool, DbErr> {
    let status = WorkStatus::parse(&row.try_get::<String>("", "status")?);
    let locked_until = dialect.get_opt_timestamp(row, "locked_until")?;
    Ok(status == Some(WorkStatus::Pending)
        || (status == Some(WorkStatus::Processing) && locked_until.is_some_and(|t| t < now)))
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
pub(crate) fn push_has_next(sql: &mut Sql, queue: &Queue<'_>) {
    let later = unfinished_in_aggregate(queue, ">");
    sql.push(&format!(
        ", CASE WHEN EXISTS ({later}) THEN 1 ELSE 0 END AS has_next"
    ));
}

/// "No earlier row of this row's aggregate is unfinished." With a floor, the unfinished rows
/// are looked for from the floor up, and the DEAD ones (which stay below it) in their own
/// partial index.
pub(crate) fn push_no_unfinished_predecessor(sql: &mut Sql, queue: &Queue<'_>) {
    let earlier = unfinished_in_aggregate(queue, "<");
    sql.push(&format!(" AND NOT EXISTS ({earlier})"));
    if queue.floor.is_some() {
        let scope = match queue.scope {
            Some((column, _)) => format!(" AND d.{column} = o.{column}"),
            None => String::new(),
        };
        sql.push(&format!(
            " AND NOT EXISTS (SELECT 1 FROM {} d WHERE d.aggregate_type = o.aggregate_type \
             AND d.aggregate_id = o.aggregate_id{scope} AND d.id < o.id AND d.status = {})",
            queue.table,
            WorkStatus::Dead.literal()
        ));
    }
}

/// `f AS (SELECT <the floor> AS low)` in a statement's `WITH` list, followed by `, ` when more
/// follow, if the queue has a floor: the statement's other parts read it as [`FLOOR`].
fn push_floor_cte(sql: &mut Sql, queue: &Queue<'_>, more: bool) {
    if let Some(bound) = queue.floor {
        sql.push("f AS (SELECT ");
        push_low(sql, bound);
        sql.push(if more { " AS low), " } else { " AS low) " });
    }
}

/// The floor, where a statement has [`push_floor_cte`]'s `f`.
const FLOOR: &str = "(SELECT low FROM f)";

/// ` AND {alias}id >= <the floor>`, when the queue has one.
fn floor_predicate(queue: &Queue<'_>, alias: &str) -> String {
    match queue.floor {
        Some(_) => format!(" AND {alias}id >= {FLOOR}"),
        None => String::new(),
    }
}

/// The unfinished rows `e` of row `o`'s aggregate (and scope) whose id is `order` (`<`, `>`)
/// its id.
fn unfinished_in_aggregate(queue: &Queue<'_>, order: &str) -> String {
    let unfinished = queue.unfinished("e.");
    let scope = match queue.scope {
        Some((column, _)) => format!(" AND e.{column} = o.{column}"),
        None => String::new(),
    };
    // Later rows are above the row itself, so above the floor.
    let floor = if order == "<" {
        floor_predicate(queue, "e.")
    } else {
        String::new()
    };
    format!(
        "SELECT 1 FROM {} e WHERE e.aggregate_type = o.aggregate_type \
         AND e.aggregate_id = o.aggregate_id{scope} AND e.id {order} o.id{floor} AND {unfinished}",
        queue.table
    )
}

/// ` AND {alias}{scope column} = ?` (`alias` with its dot, or empty), when the queue has a scope.
pub(crate) fn push_scope_of(sql: &mut Sql, queue: &Queue<'_>, alias: &str) {
    if let Some((column, value)) = queue.scope {
        sql.push(&format!(" AND {alias}{column} = "))
            .bind(value.to_owned().into());
    }
}

/// "This row can be claimed now", by the database's clock: PENDING (old enough, with a
/// `pending_age`), RETRY that is due, PROCESSING whose lease expired.
fn push_claimable(sql: &mut Sql, queue: &Queue<'_>) {
    sql.push(&format!(
        " AND ((o.status = {}",
        WorkStatus::Pending.literal()
    ));
    push_pending_age(sql, queue, "o.");
    sql.push(&format!(
        ") OR (o.status = {} AND o.next_attempt_at <= ",
        WorkStatus::Retry.literal()
    ))
    .time(DbTime::NOW)
    .push(&format!(
        ") OR (o.status = {} AND o.locked_until < ",
        WorkStatus::Processing.literal()
    ))
    .time(DbTime::NOW)
    .push("))");
    if !queue.held.is_empty() {
        sql.push(" AND o.event_type NOT IN ")
            .bind_list(queue.held.iter().map(|t| Value::from(t.clone())));
    }
}

/// ` AND {alias}created_at <= <now - pending_age>`, when the queue has a `pending_age`.
pub(crate) fn push_pending_age(sql: &mut Sql, queue: &Queue<'_>, alias: &str) {
    if let Some(age) = queue.pending_age {
        sql.push(&format!(" AND {alias}created_at <= "))
            .time(DbTime::before(age));
    }
}

pub(crate) fn prefixed_columns(columns: &str, alias: &str) -> String {
    columns
        .split(',')
        .map(|c| format!("{alias}.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How many open rows that are not in flight (PENDING, RETRY), from the front of the queue, the
/// heads query looks at: enough that a backlog spread over many aggregates fills a batch with
/// heads from the window alone.
fn window_size(limit: usize) -> usize {
    (8 * limit).max(1024)
}

/// The statuses the window counts: open, but not PROCESSING. The batches that other claims
/// (other relays or workers, or the same relay's previous batch) are still publishing, and the
/// dead letters waiting for an operator, would otherwise fill the window with rows that cannot
/// be heads, and every claim would fall back to the scan beyond it. MySQL has no partial
/// indexes: its window reads one `(status, id)` range per status.
pub(crate) const WINDOW_STATUSES: [WorkStatus; 2] = [WorkStatus::Pending, WorkStatus::Retry];

/// The id of the `window`-th PENDING or RETRY row of the queue, in id order; `None` when the
/// queue holds fewer (the heads query then reads all of them anyway). Served by the open rows'
/// partial index on PostgreSQL and SQLite, by one `(status, id)` range per status on MySQL.
async fn window_bound(
    txn: &DatabaseTransaction,
    queue: &Queue<'_>,
    window: usize,
) -> Result<Option<i64>, DbErr> {
    let mut sql = Sql::new(queue.dialect);
    if queue.floor.is_some() {
        sql.push("WITH ");
        push_floor_cte(&mut sql, queue, false);
    }
    push_window_bound(&mut sql, queue, window);
    match txn.query_one_raw(sql.build()).await? {
        Some(row) => Ok(Some(row.try_get("", "id")?)),
        None => Ok(None),
    }
}

/// The query of [`window_bound`], also used as a scalar subquery: served by the open rows'
/// partial index.
fn push_window_bound_filtered(sql: &mut Sql, queue: &Queue<'_>, window: usize) {
    sql.push(&format!(
        "SELECT id FROM {} WHERE {} AND status <> {}{}",
        queue.table,
        queue.open(""),
        WorkStatus::Processing.literal(),
        floor_predicate(queue, "")
    ));
    push_scope_of(sql, queue, "");
    sql.push(&format!(" ORDER BY id LIMIT 1 OFFSET {}", window - 1));
}

/// The heads query's upper bound on ids.
#[derive(Debug, Clone, Copy)]
pub enum HeadsBound {
    /// None: without ordering, or with fewer unfinished rows than the window holds.
    Unbounded,
    /// Already known (asked for first, where the heads query cannot compute it).
    At(i64),
    /// The bound of a window of this size, computed inside the query and returned with each
    /// row as `window_bound`.
    Window(usize),
}

/// The first claimable rows in id order; with ordering, only those with no unfinished
/// predecessor in their aggregate, and only up to `bound` (the window) when given. Locked with
/// `SKIP LOCKED`, so concurrent claimers take disjoint rows without waiting on each other.
#[derive(Debug)]
pub struct HeadsQuery<'a> {
    /// The queue.
    pub queue: &'a Queue<'a>,
    /// At most this many rows.
    pub limit: usize,
    /// Only rows with no unfinished predecessor in their aggregate.
    pub ordering: bool,
    /// The upper bound on ids.
    pub bound: HeadsBound,
}

/// [`HeadsQuery`] over the partial index of open rows, from the first of them.
fn heads_query_ranged(query: &HeadsQuery<'_>) -> Statement {
    let HeadsQuery {
        queue,
        limit,
        ordering,
        bound,
    } = query;
    let dialect = queue.dialect;
    let mut sql = Sql::new(dialect);
    let columns = prefixed_columns(queue.columns, "o");
    match bound {
        HeadsBound::Window(window) => {
            sql.push("WITH ");
            push_floor_cte(&mut sql, queue, true);
            sql.push("w AS (");
            push_window_bound(&mut sql, queue, *window);
            sql.push(") ");
        }
        _ if queue.floor.is_some() => {
            sql.push("WITH ");
            push_floor_cte(&mut sql, queue, false);
        }
        _ => {}
    }
    sql.push(&format!("SELECT {columns}"));
    push_now_column(&mut sql);
    if *ordering {
        push_has_next(&mut sql, queue);
    }
    if let HeadsBound::Window(_) = bound {
        sql.push(", (SELECT id FROM w) AS window_bound");
    }
    sql.push(&format!(
        " FROM {} o WHERE {}",
        queue.table,
        queue.open("o.")
    ));
    push_scope_of(&mut sql, queue, "o.");
    match bound {
        HeadsBound::Unbounded => {}
        HeadsBound::At(bound) => {
            sql.push(" AND o.id <= ").bind((*bound).into());
        }
        HeadsBound::Window(_) => {
            sql.push(&format!(
                " AND o.id <= COALESCE((SELECT id FROM w), {})",
                i64::MAX
            ));
        }
    }
    // From the first open row (no claimable row is below it): otherwise the planner may walk
    // the primary key from the table's first row through every finished row (their number only
    // grows until retention).
    sql.push(&format!(
        " AND o.id >= (SELECT MIN(x.id) FROM {} x WHERE {}{}",
        queue.table,
        queue.open("x."),
        floor_predicate(queue, "x.")
    ));
    push_scope_of(&mut sql, queue, "x.");
    sql.push(")");
    push_claimable(&mut sql, queue);
    if *ordering {
        push_no_unfinished_predecessor(&mut sql, queue);
    }
    sql.push(&format!(" ORDER BY o.id LIMIT {limit}"));
    sql.push(dialect.lock_rows(true));
    sql.build()
}

/// The heads after the window (ids above `bound`), at most `room`, in id order, locked with
/// `SKIP LOCKED`: for when the window is full of rows that cannot be heads.
///
/// Candidates are each aggregate's first unfinished row, found by a loose index scan over the
/// aggregate index that jumps from one `(aggregate_type, aggregate_id)` to the next (a recursive
/// CTE over a partial index, each step a [`NextAggregate`] seek). The scan visits at
/// most `budget` aggregates in key order: more than the window can hold, so that it always
/// reaches aggregates beyond it (with more aggregates than that, the first in key order, not in
/// id order). Rows without an aggregate type (inbox messages from other producers) are each
/// their own aggregate and are read from their own index range; an inbox row with a type but no
/// aggregate id is reached only once the window gets to it. The final statement checks
/// claimability and the "no unfinished predecessor" predicate again, as the heads query does,
/// so a stale candidate is never taken.
#[derive(Debug)]
pub struct BeyondWindow<'a> {
    /// The queue.
    pub queue: &'a Queue<'a>,
    /// At most this many rows.
    pub room: usize,
    /// Only ids above this one.
    pub bound: i64,
    /// Aggregates the loose index scan visits at most.
    pub budget: usize,
}

/// [`BeyondWindow`] with a recursive CTE walking the aggregate index.
fn beyond_window_recursive(query: &BeyondWindow<'_>, next: NextAggregate) -> Statement {
    let queue = query.queue;
    let table = queue.table;
    let mut sql = Sql::new(queue.dialect);
    // agg: one row per aggregate in key order, with the id of its first unfinished row.
    sql.push("WITH RECURSIVE ");
    push_floor_cte(&mut sql, queue, true);
    sql.push(&format!(
        "agg (n, id, t, i) AS (SELECT 1, s.id, s.aggregate_type, s.aggregate_id \
         FROM (SELECT e.id, e.aggregate_type, e.aggregate_id FROM {table} e WHERE {}{}",
        queue.unfinished("e."),
        floor_predicate(queue, "e.")
    ));
    push_scope_of(&mut sql, queue, "e.");
    sql.push(
        " AND e.aggregate_type IS NOT NULL AND e.aggregate_id IS NOT NULL \
         ORDER BY e.aggregate_type, e.aggregate_id, e.id LIMIT 1) s \
         UNION ALL SELECT a.n + 1, f.id, f.aggregate_type, f.aggregate_id FROM agg a ",
    );
    push_next_aggregate(&mut sql, queue, next);
    sql.push(&format!(" WHERE a.n < {}) ", query.budget));
    push_beyond_window_select(&mut sql, queue);
    sql.push("SELECT id FROM agg UNION ALL ");
    push_beyond_window_rest(&mut sql, query);
    sql.build()
}

/// The head of [`BeyondWindow`]'s final statement, up to the candidates' union.
pub(crate) fn push_beyond_window_select(sql: &mut Sql, queue: &Queue<'_>) {
    sql.push(&format!("SELECT {}", prefixed_columns(queue.columns, "o")));
    push_now_column(sql);
    sql.push(&format!(
        " FROM {} o WHERE o.id IN (SELECT c.id FROM (",
        queue.table
    ));
}

/// The rest of [`BeyondWindow`]'s final statement, after the aggregates' candidates: the rows
/// without an aggregate type, the bound, and the claimability checks.
pub(crate) fn push_beyond_window_rest(sql: &mut Sql, query: &BeyondWindow<'_>) {
    let queue = query.queue;
    // Rows without an aggregate type: each is a head of its own. `+id` keeps the id bound,
    // which the planners push into this branch, from being read as an id range (SQLite would
    // then walk every row after the window instead of the aggregate index's NULL range).
    sql.push(&format!(
        "SELECT +id AS id FROM {} WHERE {} AND aggregate_type IS NULL{}",
        queue.table,
        queue.unfinished(""),
        floor_predicate(queue, "")
    ));
    push_scope_of(sql, queue, "");
    sql.push(") c WHERE c.id > ")
        .bind(query.bound.into())
        .push(&format!(") AND {}", queue.open("o.")));
    push_scope_of(sql, queue, "o.");
    push_claimable(sql, queue);
    push_no_unfinished_predecessor(sql, queue);
    sql.push(&format!(" ORDER BY o.id LIMIT {}", query.room));
    sql.push(queue.dialect.lock_rows(true));
}

/// Whether the heads query computes the window's bound itself (one round trip less per claim)
/// rather than asking for it first.
fn window_in_heads_query(queue: &Queue<'_>) -> bool {
    matches!(queue.dialect.queue_scan(), QueueScan::PartialIndex { .. })
}

/// The query of [`window_bound`], in the dialect's shape.
fn push_window_bound(sql: &mut Sql, queue: &Queue<'_>, window: usize) {
    match queue.dialect.queue_scan() {
        QueueScan::PartialIndex { .. } => push_window_bound_filtered(sql, queue, window),
        QueueScan::StatusRanges => push_window_bound_by_status(sql, queue, window),
    }
}

/// The claim's [`HeadsQuery`], in the dialect's shape.
fn heads_query(query: &HeadsQuery<'_>) -> Statement {
    match query.queue.dialect.queue_scan() {
        QueueScan::PartialIndex { .. } => heads_query_ranged(query),
        QueueScan::StatusRanges => heads_query_by_status(query),
    }
}

/// The claim's query of the heads [`BeyondWindow`], in the dialect's shape.
fn heads_beyond_window(query: &BeyondWindow<'_>) -> Statement {
    match query.queue.dialect.queue_scan() {
        QueueScan::PartialIndex { next } => beyond_window_recursive(query, next),
        QueueScan::StatusRanges => beyond_window_grouped(query),
    }
}

/// In the loose index scan of [`beyond_window_recursive`]: the join from aggregate `a` to the
/// next one in key order, `f`.
fn push_next_aggregate(sql: &mut Sql, queue: &Queue<'_>, next: NextAggregate) {
    match next {
        NextAggregate::RowValue => push_next_aggregate_by_row_value(sql, queue),
        NextAggregate::SameTypeThenLater => push_next_aggregate_in_two_seeks(sql, queue),
    }
}

/// The query of [`window_bound`] without partial indexes: one `(status, id)` range per status
/// the window counts.
fn push_window_bound_by_status(sql: &mut Sql, queue: &Queue<'_>, window: usize) {
    sql.push("SELECT id FROM (");
    for (i, status) in WINDOW_STATUSES.into_iter().enumerate() {
        if i > 0 {
            sql.push(" UNION ALL ");
        }
        sql.push(&format!(
            "(SELECT id FROM {} WHERE status = {} AND {}",
            queue.table,
            status.literal(),
            queue.unfinished("")
        ));
        push_scope_of(sql, queue, "");
        sql.push(&format!(" ORDER BY id LIMIT {window})"));
    }
    sql.push(") w");
    sql.push(&format!(" ORDER BY id LIMIT 1 OFFSET {}", window - 1));
}

/// [`HeadsQuery`] without partial indexes: one range scan of `(status, id)` per claimable status, each
/// stopping after `limit` rows, beats filtering every unfinished row then sorting.
fn heads_query_by_status(query: &HeadsQuery<'_>) -> Statement {
    let HeadsQuery {
        queue,
        limit,
        ordering,
        bound,
    } = query;
    let mut sql = Sql::new(queue.dialect);
    let columns = prefixed_columns(queue.columns, "o");
    let branches: [(WorkStatus, Option<&str>); 3] = [
        (WorkStatus::Pending, None),
        (WorkStatus::Retry, Some("o.next_attempt_at <= ")),
        (WorkStatus::Processing, Some("o.locked_until < ")),
    ];
    for (i, (status, due)) in branches.into_iter().enumerate() {
        if i > 0 {
            sql.push(" UNION ALL ");
        }
        sql.push(&format!("(SELECT {columns}"));
        push_now_column(&mut sql);
        if *ordering {
            push_has_next(&mut sql, queue);
        }
        sql.push(&format!(
            " FROM {} o WHERE o.status = {}",
            queue.table,
            status.literal()
        ));
        push_scope_of(&mut sql, queue, "o.");
        if let Some(due) = due {
            sql.push(" AND ").push(due).time(DbTime::NOW);
        } else {
            push_pending_age(&mut sql, queue, "o.");
        }
        if let HeadsBound::At(bound) = bound {
            sql.push(" AND o.id <= ").bind((*bound).into());
        }
        if *ordering {
            push_no_unfinished_predecessor(&mut sql, queue);
        }
        sql.push(&format!(
            " ORDER BY o.id LIMIT {limit} FOR UPDATE SKIP LOCKED)"
        ));
    }
    sql.push(&format!(" ORDER BY id LIMIT {limit}"));
    sql.build()
}

/// [`BeyondWindow`] without partial indexes. MySQL's dependent subqueries cannot seek on an outer value: a head is also the first row
/// of its status in its aggregate, found by a `GROUP BY` that MySQL runs as a loose index
/// scan of `(aggregate_type, aggregate_id, status, id)`, one per claimable status.
fn beyond_window_grouped(query: &BeyondWindow<'_>) -> Statement {
    let queue = query.queue;
    let table = queue.table;
    // The index column before the aggregate when the queue is scoped (the inbox's consumer).
    let lead = match queue.scope {
        Some((column, _)) => format!("{column}, "),
        None => String::new(),
    };
    let mut sql = Sql::new(queue.dialect);
    push_beyond_window_select(&mut sql, queue);
    for status in [
        WorkStatus::Pending,
        WorkStatus::Retry,
        WorkStatus::Processing,
    ] {
        sql.push(&format!(
            "(SELECT MIN(id) AS id FROM {table} WHERE status = {}",
            status.literal()
        ));
        push_scope_of(&mut sql, queue, "");
        sql.push(&format!(
            " GROUP BY {lead}aggregate_type, aggregate_id \
             ORDER BY {lead}aggregate_type, aggregate_id LIMIT {}) UNION ALL ",
            query.budget
        ));
    }
    push_beyond_window_rest(&mut sql, query);
    sql.build()
}

/// [`NextAggregate::RowValue`]: a lateral subquery seeking the aggregate index past `(a.t, a.i)`.
fn push_next_aggregate_by_row_value(sql: &mut Sql, queue: &Queue<'_>) {
    sql.push(&format!(
        "CROSS JOIN LATERAL (SELECT e.id, e.aggregate_type, e.aggregate_id \
         FROM {} e WHERE {}{}",
        queue.table,
        queue.unfinished("e."),
        floor_predicate(queue, "e.")
    ));
    push_scope_of(sql, queue, "e.");
    sql.push(
        " AND (e.aggregate_type, e.aggregate_id) > (a.t, a.i) AND e.aggregate_id IS NOT NULL \
         ORDER BY e.aggregate_type, e.aggregate_id, e.id LIMIT 1) f",
    );
}

/// [`NextAggregate::SameTypeThenLater`]. SQLite sorts NULLs first, and with the `aggregate_id IS NOT NULL` that skipping them
/// needs it no longer seeks on the row value: two seeks instead, the next id of the same
/// type, else the first aggregate of a later type.
fn push_next_aggregate_in_two_seeks(sql: &mut Sql, queue: &Queue<'_>) {
    let table = queue.table;
    sql.push(&format!(
        "JOIN {table} f ON f.id = COALESCE((SELECT e.id FROM {table} e WHERE {}",
        queue.unfinished("e.")
    ));
    push_scope_of(sql, queue, "e.");
    sql.push(&format!(
        " AND e.aggregate_type = a.t AND e.aggregate_id > a.i \
         ORDER BY e.aggregate_type, e.aggregate_id, e.id LIMIT 1), \
         (SELECT e.id FROM {table} e WHERE {}",
        queue.unfinished("e.")
    ));
    push_scope_of(sql, queue, "e.");
    sql.push(
        " AND e.aggregate_type > a.t AND e.aggregate_id IS NOT NULL \
         ORDER BY e.aggregate_type, e.aggregate_id, e.id LIMIT 1))",
    );
}
