//! Handled messages leave `inbox_event` on PostgreSQL (`outbox_0014`): a message handled in its
//! delivery's transaction is written straight into `inbox_done`, one a worker handles moves there
//! under its claim, and what a redelivery is recognised by stays in `inbox_key` after the row is
//! gone; retention empties both tables' slots whole; an inbox that held messages when the
//! migration ran keeps the earlier layout until the rotation is switched on.

use std::time::Duration;

use crate::common::*;
use outbox::inbox::{ExternalInbox, IncomingMessage, Receipt};
use outbox::retention::{self as janitor, RetentionPolicy};
use outbox::store::claim::ClaimParams;
use outbox::store::inbox::{self as inbox_store, InboxState, NewInboxRow, Recorded};
use sea_orm::{ConnectionTrait, TransactionTrait};
use sea_orm_migration::MigratorTrait;

fn row<'a>(consumer: &'a str, message_id: &'a str) -> NewInboxRow<'a> {
    NewInboxRow {
        consumer,
        message_id,
        event_type: Some("payment.succeeded"),
        source: Some("tests"),
        aggregate_type: Some("order"),
        aggregate_id: Some(message_id),
        payload: b"{\"amount\":42}",
        ..NewInboxRow::default()
    }
}

/// Record `billing`'s message `id` as handled at once; whether it was new.
async fn record_done(t: &TestDb, id: &str) -> bool {
    inbox_store::insert(&t.db, &row("billing", id), &InboxState::Done)
        .await
        .unwrap()
}

async fn count(t: &TestDb, sql: &str) -> i64 {
    scalar_i64(&t.db, sql).await
}

fn claim_params() -> ClaimParams<'static> {
    ClaimParams {
        owner: "rotation-worker",
        batch_size: 10,
        lease: Duration::from_secs(30),
        ordering: true,
        max_attempts: 5,
    }
}

/// Claim `consumer`'s due messages and mark each DONE under the claim, as a worker does.
async fn handle_all(t: &TestDb, consumer: &str) -> Vec<i64> {
    let claim = inbox_store::claim(&t.db, consumer, &claim_params())
        .await
        .unwrap();
    let mut ids = Vec::new();
    for message in &claim.messages {
        let tx = t.db.begin().await.unwrap();
        assert!(
            inbox_store::mark_done(&tx, message.id, claim.token)
                .await
                .unwrap()
        );
        tx.commit().await.unwrap();
        // The claim's token moved with the row: a second mark under it finds nothing.
        assert!(
            !inbox_store::mark_done(&t.db, message.id, claim.token)
                .await
                .unwrap()
        );
        ids.push(message.id);
    }
    ids
}

fn policy() -> RetentionPolicy {
    RetentionPolicy::default()
        .sent_after(Duration::from_secs(3600))
        .done_after(Duration::from_secs(3600))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handled_messages_leave_the_queue_table() {
    let Some(t) = test_db(Backend::Postgres, "inbox_rotation_leave").await else {
        return;
    };
    // Handled in the delivery's transaction: straight into `inbox_done`, in one statement with
    // the keys; of two copies in one batch, the second is a duplicate.
    let tx = t.db.begin().await.unwrap();
    let recorded = inbox_store::record_batch(
        &tx,
        &[
            row("billing", "m-1"),
            row("billing", "m-2"),
            row("billing", "m-1"),
        ],
        true,
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        recorded,
        [Recorded::Done, Recorded::Done, Recorded::Duplicate]
    );
    assert_eq!(count(&t, "SELECT COUNT(*) FROM inbox_event").await, 0);
    assert_eq!(
        count(&t, "SELECT COUNT(*) FROM inbox_done WHERE status = 'DONE'").await,
        2
    );
    assert_eq!(
        count(&t, "SELECT COUNT(*) FROM inbox_key").await,
        4,
        "each message key for this period and the next"
    );
    // A redelivery in a later transaction is a duplicate, and leaves nothing behind.
    let tx = t.db.begin().await.unwrap();
    let again = inbox_store::record_batch(&tx, &[row("billing", "m-2")], true)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(again, [Recorded::Duplicate]);
    assert_eq!(count(&t, "SELECT COUNT(*) FROM inbox_done").await, 2);

    // Handled by the worker: recorded PENDING in `inbox_event`, moved DONE under its claim.
    assert!(
        inbox_store::insert(&t.db, &row("billing", "m-3"), &InboxState::Pending)
            .await
            .unwrap()
    );
    assert_eq!(count(&t, "SELECT COUNT(*) FROM inbox_event").await, 1);
    let handled = handle_all(&t, "billing").await;
    assert_eq!(handled.len(), 1);
    assert_eq!(count(&t, "SELECT COUNT(*) FROM inbox_event").await, 0);
    let rows = inbox_rows(&t.db, "billing").await;
    let summary: Vec<(&str, &str, i64)> = rows
        .iter()
        .map(|r| (r.message_id.as_str(), r.status.as_str(), r.attempts))
        .collect();
    assert_eq!(
        summary,
        [("m-1", "DONE", 1), ("m-2", "DONE", 1), ("m-3", "DONE", 1)],
        "in arrival order (the ids are shared by both tables)"
    );
    assert_eq!(
        count(
            &t,
            &format!(
                "SELECT COUNT(*) FROM inbox_done WHERE id = {} AND locked_by = 'rotation-worker' \
                 AND claim_token IS NOT NULL",
                handled[0]
            )
        )
        .await,
        1,
        "the moved row keeps its id and who handled it"
    );
    assert!(
        !inbox_store::insert(&t.db, &row("billing", "m-3"), &InboxState::Pending)
            .await
            .unwrap(),
        "a redelivery of a message the worker handled"
    );
    // The operator's view counts both tables.
    let status = outbox::admin::status(&t.db).await.unwrap();
    let billing = status
        .consumers
        .iter()
        .find(|c| c.consumer == "billing")
        .unwrap();
    assert_eq!(billing.counts.get("DONE"), Some(&3));
    assert_eq!(billing.backlog, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_is_recognised_after_its_row_is_gone() {
    let Some(t) = test_db(Backend::Postgres, "inbox_rotation_keys").await else {
        return;
    };
    assert!(record_done(&t, "m-1").await);
    let inbox = ExternalInbox::new(t.db.clone());
    let payment = |id: &str| {
        IncomingMessage::new("payments", "psp", id, "payment.succeeded", b"{}".to_vec())
            .business_key("order-7")
    };
    assert_eq!(
        inbox.receive(&payment("evt_1")).await.unwrap(),
        Receipt::New
    );
    assert_eq!(handle_all(&t, "payments").await.len(), 1);
    assert_eq!(count(&t, "SELECT COUNT(*) FROM inbox_done").await, 2);

    // Retention empties the slot the rows are in; their keys stay for their period.
    age_all_done(&t).await;
    let report = janitor::purge(&t.db, &policy()).await.unwrap();
    assert!(report.slots_emptied >= 1, "{report:?}");
    assert_eq!(count(&t, "SELECT COUNT(*) FROM inbox_done").await, 0);
    assert!(
        !record_done(&t, "m-1").await,
        "the key still refuses a redelivery"
    );
    assert_eq!(
        inbox.receive(&payment("evt_1")).await.unwrap(),
        Receipt::Duplicate {
            status: "DONE".to_owned()
        }
    );
    assert!(matches!(
        inbox.receive(&payment("evt_2")).await.unwrap(),
        Receipt::SameBusinessFact { .. }
    ));
    assert_eq!(count(&t, "SELECT COUNT(*) FROM inbox_done").await, 0);
    assert_eq!(count(&t, "SELECT COUNT(*) FROM inbox_event").await, 0);

    // Once its periods are over, a key is free again (a row a late retention left in its slot
    // is not taken for a live key).
    t.db.execute_unprepared("UPDATE inbox_key SET bucket = bucket - 10")
        .await
        .unwrap();
    assert!(record_done(&t, "m-1").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_empties_the_inbox_slots_whole() {
    let Some(t) = test_db(Backend::Postgres, "inbox_rotation_retention").await else {
        return;
    };
    for n in 0..20 {
        let id = format!("old-{n}");
        assert!(record_done(&t, &id).await);
    }
    age_all_done(&t).await;
    for n in 0..5 {
        let id = format!("new-{n}");
        assert!(record_done(&t, &id).await);
    }
    let report = janitor::purge(&t.db, &policy()).await.unwrap();
    assert_eq!(report.slots_emptied, 1, "{report:?}");
    assert_eq!(report.inbox_deleted, 0, "no row deleted one by one");
    let left: Vec<String> = inbox_rows(&t.db, "billing")
        .await
        .into_iter()
        .map(|r| r.message_id)
        .collect();
    assert_eq!(left, ["new-0", "new-1", "new-2", "new-3", "new-4"]);
    // A key slot whose period is over is emptied too (the keys' own period, not the window).
    let (current, rotation) = outbox::store::rotation::now(&t.db, "inbox_key")
        .await
        .unwrap()
        .unwrap();
    let stale = rotation.slot(current - 2);
    // The old keys' rows of this period go back to a period long over.
    t.db.execute_unprepared(&format!(
        "UPDATE inbox_key SET slot = {stale}, bucket = {} WHERE name LIKE 'old-%' \
         AND bucket = {current}",
        current - 2
    ))
    .await
    .unwrap();
    let report = janitor::purge(&t.db, &policy()).await.unwrap();
    assert_eq!(report.slots_emptied, 1, "{report:?}");
    assert_eq!(
        count(&t, "SELECT COUNT(*) FROM inbox_key WHERE name LIKE 'old-%'").await,
        20,
        "the next period's rows stay"
    );
    assert_eq!(
        count(&t, "SELECT COUNT(*) FROM inbox_key WHERE name LIKE 'new-%'").await,
        10
    );
    let audit = outbox::admin::audit_log(&t.db, 1).await.unwrap();
    assert!(
        audit[0]
            .target
            .contains("slot(s) of outbox_sent, outbox_key, inbox_done and inbox_key"),
        "{audit:?}"
    );
}

/// An inbox that held messages when `outbox_0014` ran keeps recording as the previous release
/// (its consumers may still run) until the rotation is switched on; afterwards the messages
/// recorded before are still recognised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_populated_inbox_rotates_once_switched_on() {
    let Some(t) = test_db(Backend::Postgres, "inbox_rotation_upgrade").await else {
        return;
    };
    outbox::Migrator::down(&t.db, Some(2)).await.unwrap();
    assert!(record_done(&t, "before").await);
    outbox::Migrator::up(&t.db, None).await.unwrap();
    assert_eq!(
        count(
            &t,
            "SELECT COUNT(*) FROM outbox_rotation WHERE table_name LIKE 'inbox_%'"
        )
        .await,
        0,
        "the migration leaves the rotation off"
    );
    assert!(record_done(&t, "during").await);
    assert_eq!(count(&t, "SELECT COUNT(*) FROM inbox_event").await, 2);
    assert_eq!(count(&t, "SELECT COUNT(*) FROM inbox_done").await, 0);

    assert!(outbox::admin::rotate_inbox(&t.db).await.unwrap());
    assert!(
        !outbox::admin::rotate_inbox(&t.db).await.unwrap(),
        "on already"
    );
    assert!(record_done(&t, "after").await);
    assert_eq!(count(&t, "SELECT COUNT(*) FROM inbox_done").await, 1);
    for earlier in ["before", "during"] {
        assert!(
            !record_done(&t, earlier).await,
            "{earlier}: recorded in inbox_event before the switch, still a duplicate"
        );
    }
    let ids: Vec<String> = inbox_rows(&t.db, "billing")
        .await
        .into_iter()
        .map(|r| r.message_id)
        .collect();
    assert_eq!(ids, ["before", "during", "after"]);
}

/// Every handled message of `t` made 30 days old, in a slot a one-hour window empties.
async fn age_all_done(t: &TestDb) {
    age_done(
        &t.db,
        "1 = 1",
        Duration::from_secs(3600),
        "now() - interval '30 days'",
    )
    .await;
}

#[outbox::inbox_handler(consumer = "t-rotation-gone")]
async fn handle_line(
    _tx: &outbox::inbox::InboxTransaction,
    _event: outbox::inbox::Event<crate::common::carts::LineAdded>,
) -> Result<(), outbox::inbox::HandlerError> {
    Ok(())
}

/// The consumer's handled messages in `inbox_done` and in `inbox_event`.
async fn handled_by(t: &TestDb, table: &str) -> i64 {
    count(
        t,
        &format!("SELECT COUNT(*) AS n FROM {table} WHERE consumer = 't-rotation-gone' AND status = 'DONE'"),
    )
    .await
}

/// A consumer remembers that the inbox rotates and stops asking; should the rotation's row go
/// (an operator's mistake), its next recording sees that in its own statement, writes nothing
/// there, and records the message the earlier way: handled, not taken for a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_records_the_earlier_way_once_the_rotation_is_gone() {
    let Some(t) = test_db(Backend::Postgres, "inbox_rotation_gone").await else {
        return;
    };
    // Through a broker, so the consumer records each message in its handler's transaction.
    let runtime = outbox::runtime::Runtime::builder(t.db.clone())
        .transport(outbox::transport::memory::MemoryTransport::new())
        .consumers(["t-rotation-gone"])
        .relay_config(
            outbox::relay::RelayConfig::default().poll_interval(Duration::from_millis(50)),
        )
        .retention(None, Duration::ZERO)
        .start()
        .await
        .unwrap();
    let outbox = runtime.outbox().clone();
    crate::common::carts::commit_lines(outbox.begin(&t.db).await.unwrap(), &[("c-1", 0)]).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            handled_by(&t, "inbox_done").await == 1
        })
        .await
    );
    t.db.execute_unprepared("DELETE FROM outbox_rotation WHERE table_name = 'inbox_key'")
        .await
        .unwrap();
    crate::common::carts::commit_lines(outbox.begin(&t.db).await.unwrap(), &[("c-2", 0)]).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            handled_by(&t, "inbox_event").await == 1
        })
        .await,
        "the second message was not handled: {:?} in inbox_event, {:?} in inbox_done",
        table_status_counts(&t.db, "inbox_event").await,
        count(&t, "SELECT COUNT(*) AS n FROM inbox_done").await,
    );
    runtime.shutdown().await;
    assert_eq!(handled_by(&t, "inbox_done").await, 1);
}
