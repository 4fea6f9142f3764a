//! The inbox worker's side: claim due messages, and write back DONE (moved to `inbox_done`
//! where handled messages rotate), RETRY/DEAD, or a release, each fenced by the claim's token.

use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Value};
use uuid::Uuid;

use super::{COLUMNS, unfinished};
use crate::operations::Source;
use crate::store::{
    DbTime, Dialect, INBOX_TABLE,
    claim::{ClaimParams, Queue, hand_back, select_claimable},
    failures::{self, Failed},
    inbox_done,
    sql::{Arg, Sql},
    status::{Failure, InboxStatus},
    tx::begin_work,
};
use crate::util::text::truncate;

/// A message claimed by a consumer's worker.
#[derive(Debug, Clone)]
pub struct ClaimedMessage {
    /// Row id (arrival order).
    pub id: i64,
    /// Message id.
    pub message_id: String,
    /// Who assigned the message id: empty for messages of this SDK's producers, the sender's
    /// source for an external message.
    pub origin: String,
    /// Event (or external message) type, when known.
    pub event_type: Option<String>,
    /// Source, when known.
    pub source: Option<String>,
    /// Business key of an external message.
    pub biz_key: Option<String>,
    /// Headers kept with an external message (a JSON object).
    pub headers: Option<String>,
    /// Aggregate type, when known.
    pub aggregate_type: Option<String>,
    /// Aggregate id, when known.
    pub aggregate_id: Option<String>,
    /// The message as received.
    pub payload: Vec<u8>,
    /// Failed attempts so far (counting this claim if it took over an expired lease).
    pub attempts: u32,
    /// Whether this claim took over an expired lease.
    pub reclaimed: bool,
}

/// Messages claimed under one token.
#[derive(Debug, Clone)]
pub struct InboxClaim {
    /// The fencing token written into each claimed row.
    pub token: Uuid,
    /// Messages to handle, in arrival order.
    pub messages: Vec<ClaimedMessage>,
    /// Messages whose lease expired once too often: marked DEAD by this claim.
    pub dead: usize,
}

/// Claim due messages of `consumer`: PENDING, RETRY that are due, PROCESSING whose lease
/// expired. With ordering, only the first unfinished message of each aggregate and the PENDING
/// run behind it.
///
/// `params.owner` names the worker in `locked_by`.
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
pub async fn claim(
    db: &DatabaseConnection,
    consumer: &str,
    params: &ClaimParams<'_>,
) -> Result<InboxClaim, DbErr> {
    claim_from(db, consumer, params, None).await
}

/// How long until the earliest RETRY of `consumer` is due, by the database's clock (zero when
/// one is due already); `None` when none waits. One statement: what an idle worker asks before it
/// sleeps longer than its poll interval, so that its sleep ends by then.
pub async fn next_retry_in(
    db: &DatabaseConnection,
    consumer: &str,
) -> Result<Option<std::time::Duration>, DbErr> {
    let dialect = Dialect::of(db);
    let mut sql = Sql::new(dialect);
    sql.push("SELECT MIN(next_attempt_at) AS next_due, ")
        .time(DbTime::NOW)
        .push(&format!(" AS now FROM {INBOX_TABLE} WHERE consumer = "))
        .bind(consumer.into())
        // A literal: the partial index on unfinished rows serves it.
        .push(&format!(" AND status = {}", InboxStatus::Retry.literal()));
    let Some(row) = db.query_one_raw(sql.build()).await? else {
        return Ok(None);
    };
    let Some(due) = dialect.get_opt_timestamp(&row, "next_due")? else {
        return Ok(None);
    };
    let now = dialect.get_timestamp(&row, "now")?;
    Ok(Some((due - now).to_std().unwrap_or_default()))
}

/// A consumer's unfinished messages as a work queue.
fn inbox_queue(dialect: Dialect, consumer: &str) -> Queue<'_> {
    Queue {
        dialect,
        table: INBOX_TABLE,
        columns: COLUMNS,
        scope: Some(("consumer", consumer)),
        predicate: unfinished,
        pending_age: None,
        floor: None,
        held: &[],
    }
}

/// Sample `consumer`'s floor from `from` up (see `floor.rs`): `None` where the dialect keeps
/// none.
pub async fn sample_floor(
    db: &DatabaseConnection,
    consumer: &str,
    from: i64,
) -> Result<Option<crate::store::floor::Sample>, DbErr> {
    crate::store::floor::sample(db, &inbox_queue(Dialect::of(db), consumer), from).await
}

/// [`claim`], its scans starting at `floor` (see `floor.rs`).
pub async fn claim_from(
    db: &DatabaseConnection,
    consumer: &str,
    params: &ClaimParams<'_>,
    floor: Option<crate::store::floor::Bound>,
) -> Result<InboxClaim, DbErr> {
    let ClaimParams {
        owner: worker_id,
        batch_size,
        lease,
        ordering,
        max_attempts,
    } = *params;
    let txn = begin_work(db).await?;
    let dialect = Dialect::of(&txn);
    let queue = Queue {
        floor,
        ..inbox_queue(dialect, consumer)
    };
    let mut messages = Vec::new();
    let mut expired_dead = Vec::new();
    let mut blocked = std::collections::HashSet::new();
    // Expired claims behind a message this claim makes DEAD: handed back (see `hand_back`).
    let mut stranded = Vec::new();
    for candidate in select_claimable(&txn, &queue, batch_size, ordering)
        .await?
        .rows
    {
        let reclaim =
            candidate.row.try_get::<String>("", "status")? == InboxStatus::Processing.as_str();
        let mut message = read_message(dialect, candidate.id, &candidate.row)?;
        let key = (message.aggregate_type.clone(), message.aggregate_id.clone());
        if ordering && key.0.is_some() && blocked.contains(&key) {
            if reclaim {
                stranded.push(message.id);
            }
            continue;
        }
        if reclaim {
            message.attempts += 1;
            message.reclaimed = true;
            if message.attempts >= max_attempts {
                blocked.insert(key);
                expired_dead.push(message);
                continue;
            }
        }
        messages.push(message);
    }
    let token = Uuid::new_v4();
    mark_claimed(&txn, &messages, worker_id, lease, token).await?;
    mark_lease_expired(&txn, &expired_dead).await?;
    let dead_ids: Vec<i64> = expired_dead.iter().map(|message| message.id).collect();
    failures::append(&txn, Source::Inbox, Failed::Ids(&dead_ids)).await?;
    hand_back(&txn, INBOX_TABLE, stranded).await?;
    txn.commit().await?;
    Ok(InboxClaim {
        token,
        messages,
        dead: expired_dead.len(),
    })
}

/// A claimable row as the worker handles it.
fn read_message(
    dialect: Dialect,
    id: i64,
    row: &sea_orm::QueryResult,
) -> Result<ClaimedMessage, DbErr> {
    let attempts = dialect.get_int(row, "attempts")?;
    Ok(ClaimedMessage {
        id,
        message_id: row.try_get("", "message_id")?,
        origin: row.try_get("", "origin")?,
        event_type: row.try_get("", "event_type")?,
        source: row.try_get("", "source")?,
        biz_key: row.try_get("", "biz_key")?,
        headers: row.try_get("", "headers")?,
        aggregate_type: row.try_get("", "aggregate_type")?,
        aggregate_id: row.try_get("", "aggregate_id")?,
        payload: row.try_get("", "payload")?,
        attempts: u32::try_from(attempts).unwrap_or(0),
        reclaimed: false,
    })
}

/// Claim `messages` for `worker_id` under `token` for `lease`; a reclaim counts an attempt.
async fn mark_claimed(
    txn: &sea_orm::DatabaseTransaction,
    messages: &[ClaimedMessage],
    worker_id: &str,
    lease: std::time::Duration,
    token: Uuid,
) -> Result<(), DbErr> {
    if messages.is_empty() {
        return Ok(());
    }
    let dialect = Dialect::of(txn);
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "UPDATE {INBOX_TABLE} SET attempts = CASE WHEN status = {processing} THEN attempts + 1 \
         ELSE attempts END, status = {processing}, locked_by = ",
        processing = InboxStatus::Processing.literal(),
    ))
    .bind(worker_id.to_owned().into())
    .push(", locked_until = ")
    .time(DbTime::after(lease))
    .push(", claim_token = ")
    .bind(dialect.uuid(token))
    .push(" WHERE id IN ")
    .bind_list(messages.iter().map(|m| Value::from(m.id)));
    txn.execute_raw(sql.build()).await?;
    Ok(())
}

/// Mark DEAD the messages whose lease expired once too often: a worker crashed or hung on each.
async fn mark_lease_expired(
    txn: &sea_orm::DatabaseTransaction,
    expired: &[ClaimedMessage],
) -> Result<(), DbErr> {
    for message in expired {
        let mut sql = Sql::new(Dialect::of(txn));
        sql.push(&format!(
            "UPDATE {INBOX_TABLE} SET attempts = attempts + 1, status = {}, locked_until = NULL, \
             last_error = ",
            InboxStatus::Dead.literal()
        ))
        .bind(
            format!(
                "lease expired {} times: a worker crashed or hung while handling this message",
                message.attempts
            )
            .into(),
        )
        .push(" WHERE id = ")
        .bind(message.id.into());
        txn.execute_raw(sql.build()).await?;
    }
    Ok(())
}

/// Inside the handler's transaction: mark the claimed message DONE, fenced by the claim token.
/// `false` means another worker owns it now: roll the handler's work back.
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
pub async fn mark_done<C: ConnectionTrait>(conn: &C, id: i64, token: Uuid) -> Result<bool, DbErr> {
    mark_done_seen(conn, id, token, &inbox_done::RotationSeen::default()).await
}

/// [`mark_done`] by a consumer that keeps what it saw of the inbox's rotation in `seen`.
pub(crate) async fn mark_done_seen<C: ConnectionTrait>(
    conn: &C,
    id: i64,
    token: Uuid,
    seen: &inbox_done::RotationSeen,
) -> Result<bool, DbErr> {
    if seen.rotates(conn).await? {
        let moved = inbox_done::mark_done(conn, id, token).await;
        if moved.is_err() {
            // Perhaps the rotation's row is gone (the slot would be NULL): ask again next time.
            seen.forget();
        }
        return moved;
    }
    let dialect = Dialect::of(conn);
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "UPDATE {INBOX_TABLE} SET status = {}, processed_at = ",
        InboxStatus::Done.literal()
    ))
    .time(DbTime::NOW)
    .push(", attempts = attempts + 1, locked_until = NULL, last_error = NULL WHERE id = ")
    .bind(id.into())
    .push(&format!(
        " AND status = {} AND claim_token = ",
        InboxStatus::Processing.literal()
    ))
    .bind(dialect.uuid(token));
    Ok(conn.execute_raw(sql.build()).await?.rows_affected() == 1)
}

/// After a failed attempt: RETRY at its due time, or DEAD, fenced by the claim token, with the
/// failure appended to the history. `false` means another worker owns the message now.
pub async fn mark_failed(
    db: &DatabaseConnection,
    id: i64,
    token: Uuid,
    failure: &Failure,
) -> Result<bool, DbErr> {
    let txn = begin_work(db).await?;
    let dialect = Dialect::of(db);
    let mut sql = Sql::new(dialect);
    sql.push(&format!(
        "UPDATE {INBOX_TABLE} SET status = {}, attempts = ",
        failure.inbox_status().literal()
    ))
    .bind(i64::from(failure.attempts()).into())
    .push(", next_attempt_at = ")
    .arg(Arg::time_or_null(dialect, failure.due()))
    .push(", last_error = ")
    .bind(truncate(failure.error(), 4000).into())
    .push(", locked_until = NULL WHERE id = ")
    .bind(id.into())
    .push(&format!(
        " AND status = {} AND claim_token = ",
        InboxStatus::Processing.literal()
    ))
    .bind(dialect.uuid(token));
    let marked = txn.execute_raw(sql.build()).await?.rows_affected() == 1;
    if marked {
        failures::append(&txn, Source::Inbox, Failed::Ids(&[id])).await?;
    }
    txn.commit().await?;
    Ok(marked)
}

/// Hand claimed messages back unhandled (behind a failure of their aggregate, or at shutdown),
/// giving back the attempt a reclaim counted.
pub async fn release(
    db: &DatabaseConnection,
    token: Uuid,
    ids: &[i64],
    reclaimed: &[i64],
) -> Result<u64, DbErr> {
    let dialect = Dialect::of(db);
    let mut released = 0;
    let (given_back, plain): (Vec<i64>, Vec<i64>) =
        ids.iter().copied().partition(|id| reclaimed.contains(id));
    for (ids, refund) in [(plain, 0), (given_back, 1)] {
        if ids.is_empty() {
            continue;
        }
        let mut sql = Sql::new(dialect);
        sql.push(&format!(
            "UPDATE {INBOX_TABLE} SET attempts = attempts - {refund}, status = {}, \
             locked_until = NULL WHERE status = {} AND claim_token = ",
            InboxStatus::Pending.literal(),
            InboxStatus::Processing.literal()
        ))
        .bind(dialect.uuid(token))
        .push(" AND id IN ")
        .bind_list(ids.iter().map(|id| Value::from(*id)));
        released += db.execute_raw(sql.build()).await?.rows_affected();
    }
    Ok(released)
}
