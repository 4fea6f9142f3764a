//! Sent events leave the work queue: marking an event SENT moves its row from `outbox_event`
//! into `outbox_sent`, fenced as the mark was, so `outbox_event` holds the unfinished rows only
//! and its size is the backlog. `outbox_sent` rotates through a fixed set of slots (see
//! `rotation.rs`): a row goes to the slot of the time it was sent, by the database's clock.
//!
//! On PostgreSQL the move is one statement (`DELETE … RETURNING` feeding an `INSERT`); elsewhere
//! it is a copy and a delete in the caller's transaction, both under the same rule, and a row the
//! delete no longer found (another relay took it over in between) has its copy taken back.

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbErr, Value};

use super::{DbTime, Dialect, OUTBOX_TABLE, sql::Sql};

/// `outbox_sent`: the events sent, kept for the retention window.
pub const SENT_TABLE: &str = "outbox_sent";

/// The columns an event keeps once sent, besides its slot and `sent_at`: what it is, and who
/// sent it under which claim.
pub(crate) const KEPT_COLUMNS: &str = "id, event_id, source, event_type, schema_version, \
     aggregate_type, aggregate_id, aggregate_version, dedup_key, payload, headers, attempts, \
     locked_by, claim_token, created_at";

/// How the rows to move are chosen: a `WHERE` clause on `outbox_event` (without the ids).
pub(crate) trait MoveRule: Sync {
    /// ` WHERE <the rule>`.
    fn push_where(&self, sql: &mut Sql);

    /// Who sent the rows, when their `locked_by` does not say (the database-local transport
    /// claims without writing one).
    fn sent_by(&self) -> Option<&str> {
        None
    }
}

/// The kept columns as a select list, `locked_by` replaced by `rule`'s sender if it names one.
fn push_kept(sql: &mut Sql, rule: &dyn MoveRule) {
    match rule.sent_by() {
        None => {
            sql.push(KEPT_COLUMNS);
        }
        Some(owner) => {
            let (before, after) = KEPT_COLUMNS
                .split_once("locked_by")
                .unwrap_or((KEPT_COLUMNS, ""));
            sql.push(before).bind(owner.to_owned().into()).push(after);
        }
    }
}

/// Move the rows of `ids` that `rule` still selects from `outbox_event` to `outbox_sent`, sent
/// now; returns how many moved.
pub(crate) async fn move_sent(
    txn: &DatabaseTransaction,
    rule: &dyn MoveRule,
    ids: &[i64],
) -> Result<u64, DbErr> {
    if ids.is_empty() {
        return Ok(0);
    }
    let dialect = Dialect::of(txn);
    if dialect.moves_in_one_statement() {
        let statement = move_statement(dialect, rule, "", |sql| {
            sql.push(" AND id IN ")
                .bind_list(ids.iter().map(|id| Value::from(*id)));
        });
        return Ok(txn.execute_raw(statement).await?.rows_affected());
    }

    let mut copy = Sql::new(dialect);
    push_insert_head(&mut copy);
    copy.push(" ");
    push_kept(&mut copy, rule);
    copy.push(", ")
        .time(DbTime::NOW)
        .push(&format!(" FROM {OUTBOX_TABLE}"));
    rule.push_where(&mut copy);
    copy.push(" AND id IN ")
        .bind_list(ids.iter().map(|id| Value::from(*id)));
    let copied = txn.execute_raw(copy.build()).await?.rows_affected();

    let mut delete = Sql::new(dialect);
    delete.push(&format!("DELETE FROM {OUTBOX_TABLE}"));
    rule.push_where(&mut delete);
    delete
        .push(" AND id IN ")
        .bind_list(ids.iter().map(|id| Value::from(*id)));
    let deleted = txn.execute_raw(delete.build()).await?.rows_affected();

    if deleted != copied {
        // A row changed hands between the copy and the delete: it is still unfinished, and
        // its copy goes.
        let mut undo = Sql::new(dialect);
        undo.push(&format!("DELETE FROM {SENT_TABLE} WHERE id IN "))
            .bind_list(ids.iter().map(|id| Value::from(*id)))
            .push(&format!(
                " AND id IN (SELECT id FROM {OUTBOX_TABLE} WHERE id IN "
            ))
            .bind_list(ids.iter().map(|id| Value::from(*id)))
            .push(")");
        txn.execute_raw(undo.build()).await?;
    }
    Ok(deleted)
}

/// `INSERT INTO outbox_sent (slot, <kept>, sent_at) SELECT <the slot of now>,`.
fn push_insert_head(sql: &mut Sql) {
    let slot = super::rotation::slot_now(sql.dialect(), SENT_TABLE, false);
    sql.push(&format!(
        "INSERT INTO {SENT_TABLE} (slot, {KEPT_COLUMNS}, sent_at) SELECT {slot},"
    ));
}

/// [`move_sent`] outside a transaction, as one bound statement whose text is the same for any
/// number of ids (they travel as one array parameter, so the server plans it once per
/// connection and reuses the plan), which turns off the wait for the WAL flush of its own
/// transaction as it moves each row (a lost mark only causes a republish; nothing moved,
/// nothing to commit). `None` where the backend cannot.
pub(crate) fn move_sent_at_once(
    dialect: Dialect,
    rule: &dyn MoveRule,
    ids: &[i64],
) -> Option<sea_orm::Statement> {
    let each_row = dialect.lazy_commit_condition()?;
    let ids = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    let tail = format!(" WHERE {each_row}");
    Some(move_statement(dialect, rule, &tail, |sql| {
        sql.push(" AND id = ANY(CAST(")
            .bind(format!("{{{ids}}}").into())
            .push(" AS BIGINT[]))");
    }))
}

/// `WITH moved AS (DELETE … <rule> <ids> RETURNING …) INSERT INTO outbox_sent … FROM moved<tail>`:
/// the move in one statement, the ids' condition written by `push_ids`.
fn move_statement(
    dialect: Dialect,
    rule: &dyn MoveRule,
    tail: &str,
    push_ids: impl FnOnce(&mut Sql),
) -> sea_orm::Statement {
    let mut sql = Sql::new(dialect);
    sql.push(&format!("WITH moved AS (DELETE FROM {OUTBOX_TABLE}"));
    rule.push_where(&mut sql);
    push_ids(&mut sql);
    sql.push(&format!(" RETURNING {KEPT_COLUMNS}) "));
    push_insert_head(&mut sql);
    sql.push(" ");
    push_kept(&mut sql, rule);
    sql.push(", ")
        .time(DbTime::NOW)
        .push(&format!(" FROM moved{tail}"));
    sql.build()
}
