//! MySQL 8 / MariaDB 10.6+: `?` placeholders, `CHAR(36)` UUIDs, `DATETIME(6)` in UTC, and no
//! partial indexes: every "unsent"/"unfinished" predicate and every claim or purge statement
//! reads one `(status, …)` index range per status instead.

use sea_orm::{DbBackend, Statement};

use super::{
    DbTime,
    claim::{self, BeyondWindow, HeadsBound, HeadsQuery, Queue},
    dialect::{Backend, sealed::Sealed},
    retention::Purge,
    sql::Sql,
    status::{OutboxStatus, WorkStatus},
};

/// The MySQL/MariaDB dialect.
#[derive(Debug, Clone, Copy)]
pub struct MySql;

impl Sealed for MySql {}

impl Backend for MySql {
    fn db_backend(&self) -> DbBackend {
        DbBackend::MySql
    }

    /// `UTC_TIMESTAMP(6)`: the `DATETIME(6)` columns hold UTC, whatever the session's time zone.
    fn time_expression(&self, offset: Option<&str>) -> String {
        match offset {
            None => "UTC_TIMESTAMP(6)".to_owned(),
            Some(micros) => format!("(UTC_TIMESTAMP(6) + INTERVAL {micros} MICROSECOND)"),
        }
    }

    /// A no-op update on a duplicate key: unlike `INSERT IGNORE`, it does not turn other errors
    /// (a value too long, a bad date) into silent warnings. It covers every unique key, so it
    /// stays even when no event carries a deduplication key.
    fn outbox_insert_conflict(&self, _any_dedup_key: bool) -> Option<&'static str> {
        Some("ON DUPLICATE KEY UPDATE id = id")
    }

    /// Values are validated before they get here, so `IGNORE` only skips the duplicate key.
    fn insert_skipping(&self, _key: &str) -> (&'static str, Option<String>) {
        ("INSERT IGNORE INTO ", None)
    }

    fn insert_skipping_any(&self) -> (&'static str, Option<&'static str>) {
        ("INSERT IGNORE INTO ", None)
    }

    fn insert_returning(&self) -> bool {
        false
    }

    /// InnoDB reads an `INSERT`'s subquery on its own table with shared next-key locks.
    fn insert_check_locks_gaps(&self) -> bool {
        true
    }

    /// Status ranges of `(aggregate_type, aggregate_id, status, id)`.
    fn unsent(&self, prefix: &str) -> String {
        OutboxStatus::in_list(prefix, &OutboxStatus::UNSENT)
    }

    fn columns_query(&self) -> &'static str {
        "SELECT table_name AS t, column_name AS c FROM information_schema.columns \
         WHERE table_schema = DATABASE()"
    }

    fn indexes_query(&self) -> &'static str {
        "SELECT DISTINCT table_name AS t, index_name AS c FROM information_schema.statistics \
         WHERE table_schema = DATABASE()"
    }

    fn expected_indexes(&self, table: &str) -> &'static [&'static str] {
        match table {
            "outbox_event" => &[
                "outbox_event_event_id_key",
                "outbox_event_dedup_key_idx",
                "outbox_event_status_idx",
                "outbox_event_aggregate_idx",
                "outbox_event_sent_at_idx",
            ],
            "inbox_event" => &super::schema::INBOX_EVENT_INDEXES,
            "outbox_failure" => &super::schema::FAILURE_INDEXES,
            "outbox_scheduled" => &super::schema::SCHEDULED_INDEXES,
            _ => &[],
        }
    }

    fn window_in_heads_query(&self) -> bool {
        false
    }

    /// One `(status, id)` range per status the window counts.
    fn push_window_bound(&self, sql: &mut Sql, queue: &Queue<'_>, window: usize) {
        sql.push("SELECT id FROM (");
        for (i, status) in claim::WINDOW_STATUSES.into_iter().enumerate() {
            if i > 0 {
                sql.push(" UNION ALL ");
            }
            sql.push(&format!(
                "(SELECT id FROM {} WHERE status = {} AND {}",
                queue.table,
                status.literal(),
                queue.unfinished("")
            ));
            claim::push_scope_of(sql, queue, "");
            sql.push(&format!(" ORDER BY id LIMIT {window})"));
        }
        sql.push(") w");
        sql.push(&format!(" ORDER BY id LIMIT 1 OFFSET {}", window - 1));
    }

    /// Without partial indexes, one range scan of `(status, id)` per claimable status, each
    /// stopping after `limit` rows, beats filtering every unfinished row then sorting.
    fn heads_query(&self, query: &HeadsQuery<'_>) -> Statement {
        let HeadsQuery {
            queue,
            limit,
            ordering,
            bound,
        } = query;
        let mut sql = Sql::new(queue.dialect);
        let columns = claim::prefixed_columns(queue.columns, "o");
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
            claim::push_now_column(&mut sql);
            if *ordering {
                claim::push_has_next(&mut sql, queue);
            }
            sql.push(&format!(
                " FROM {} o WHERE o.status = {}",
                queue.table,
                status.literal()
            ));
            claim::push_scope_of(&mut sql, queue, "o.");
            if let Some(due) = due {
                sql.push(" AND ").push(due).time(DbTime::NOW);
            } else {
                claim::push_pending_age(&mut sql, queue, "o.");
            }
            if let HeadsBound::At(bound) = bound {
                sql.push(" AND o.id <= ").bind((*bound).into());
            }
            if *ordering {
                claim::push_no_unfinished_predecessor(&mut sql, queue);
            }
            sql.push(&format!(
                " ORDER BY o.id LIMIT {limit} FOR UPDATE SKIP LOCKED)"
            ));
        }
        sql.push(&format!(" ORDER BY id LIMIT {limit}"));
        sql.build()
    }

    /// MySQL's dependent subqueries cannot seek on an outer value: a head is also the first row
    /// of its status in its aggregate, found by a `GROUP BY` that MySQL runs as a loose index
    /// scan of `(aggregate_type, aggregate_id, status, id)`, one per claimable status.
    fn heads_beyond_window(&self, query: &BeyondWindow<'_>) -> Statement {
        let queue = query.queue;
        let table = queue.table;
        // The index column before the aggregate when the queue is scoped (the inbox's consumer).
        let lead = match queue.scope {
            Some((column, _)) => format!("{column}, "),
            None => String::new(),
        };
        let mut sql = Sql::new(queue.dialect);
        claim::push_beyond_window_select(&mut sql, queue);
        for status in [
            WorkStatus::Pending,
            WorkStatus::Retry,
            WorkStatus::Processing,
        ] {
            sql.push(&format!(
                "(SELECT MIN(id) AS id FROM {table} WHERE status = {}",
                status.literal()
            ));
            claim::push_scope_of(&mut sql, queue, "");
            sql.push(&format!(
                " GROUP BY {lead}aggregate_type, aggregate_id \
                 ORDER BY {lead}aggregate_type, aggregate_id LIMIT {}) UNION ALL ",
                query.budget
            ));
        }
        claim::push_beyond_window_rest(&mut sql, query);
        sql.build()
    }

    fn purge_by_status(&self) -> bool {
        true
    }

    /// MySQL does not allow `LIMIT` in an `IN` subquery, and a derived table can turn the outer
    /// delete into a scan: `DELETE … ORDER BY <column>, id LIMIT n` on the `(status, <column>)`
    /// index instead, one status at a time.
    fn purge_statement(&self, purge: &Purge, statuses: &[&'static str], limit: usize) -> Statement {
        let mut sql = Sql::new(purge.dialect);
        sql.push(&format!(
            "DELETE FROM {} WHERE {} AND {} < ",
            purge.table,
            super::status::in_literals("", statuses),
            purge.column
        ))
        .bind(purge.cutoff.clone())
        .push(&format!(" ORDER BY {}, id LIMIT {limit}", purge.column));
        sql.build()
    }
}
