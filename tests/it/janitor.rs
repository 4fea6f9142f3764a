//! The runtime's retention janitor: old SENT outbox rows and old DONE inbox rows go, recent and
//! unfinished ones stay; a window shorter than the redelivery horizon is refused at start-up.

use std::time::Duration;

use crate::common::carts::*;
use crate::common::*;
use outbox::prelude::*;
use outbox::relay::{Backoff, RelayConfig};
use outbox::retention::RetentionPolicy;
use outbox::runtime::Runtime;
use sea_orm::ConnectionTrait;

#[inbox_handler(consumer = "t-janitor")]
async fn handle(_tx: &InboxTransaction, _event: Event<LineAdded>) -> Result<(), HandlerError> {
    Ok(())
}

fn relay() -> RelayConfig {
    RelayConfig::default()
        .poll_interval(Duration::from_millis(50))
        .max_attempts(2)
        .backoff(
            Backoff::default()
                .base(Duration::from_millis(10))
                .cap(Duration::from_millis(10))
                .jitter(0.0),
        )
}

fn policy() -> RetentionPolicy {
    RetentionPolicy::default()
        .sent_after(Duration::from_secs(3600))
        .done_after(Duration::from_secs(2 * 3600))
}

async fn janitor_purges_old_rows_only(t: TestDb) {
    // A first runtime delivers 40 events locally; then the rows are aged by hand.
    let first = Runtime::builder(t.db.clone())
        .consumers(["t-janitor"])
        .relay_config(relay())
        .retention(None, Duration::ZERO)
        .start()
        .await
        .unwrap();
    let outbox = first.outbox().clone();
    produce(&t, &outbox, 4, 10, 10).await;
    assert!(
        eventually(Duration::from_secs(30), || async {
            inbox_rows(&t.db, "t-janitor")
                .await
                .iter()
                .filter(|r| r.status == "DONE")
                .count()
                == 40
        })
        .await
    );
    first.shutdown().await;
    let old = match t.db.get_database_backend() {
        sea_orm::DbBackend::Sqlite => "'2020-01-01T00:00:00.000000Z'",
        _ => "'2020-01-01 00:00:00'",
    };
    // The first 30 of each become old (the sent events: in a slot retention may empty); 10
    // stay recent; one old PENDING event must survive.
    let first_id = scalar_i64(&t.db, "SELECT MIN(id) AS n FROM outbox_sent").await;
    unsend(&t.db, first_id, old).await;
    age_sent(
        &t.db,
        &format!("id <= {}", first_id + 29),
        Duration::from_secs(3600),
    )
    .await;
    t.db.execute_unprepared(&format!(
        "UPDATE inbox_event SET processed_at = {old} WHERE id <= (SELECT m FROM (SELECT MIN(id) + 29 AS m FROM inbox_event) x)"
    ))
    .await
    .unwrap();
    if t.db.get_database_backend() == sea_orm::DbBackend::Postgres {
        // Handled messages in `inbox_done`: the first 30 go to a slot retention may empty.
        age_done(
            &t.db,
            "id <= (SELECT MIN(id) + 29 FROM inbox_done)",
            Duration::from_secs(2 * 3600),
            old,
        )
        .await;
    }

    let second = Runtime::builder(t.db.clone())
        .consumers(Vec::<String>::new())
        .without_relay()
        .retention(Some(policy()), Duration::from_millis(100))
        .redelivery_windows(Duration::ZERO, Duration::ZERO)
        .start()
        .await
        .unwrap();
    // One purge run deletes outbox rows first, then inbox rows: wait for both.
    let purged = eventually(Duration::from_secs(30), || async {
        count_events(&t.db).await == 11 && inbox_rows(&t.db, "t-janitor").await.len() == 10
    })
    .await;
    let health = second.health();
    second.shutdown().await;
    assert!(
        purged,
        "old SENT rows purged: {} left",
        count_events(&t.db).await
    );
    assert!(
        health
            .loops
            .iter()
            .any(|l| l.name == "janitor" && l.healthy),
        "{health:?}"
    );
    let counts = status_counts(&t.db).await;
    assert_eq!(
        counts.get("PENDING"),
        Some(&1),
        "an unsent event is never purged, however old: {counts:?}"
    );
    assert_eq!(counts.get("SENT"), Some(&10), "recent SENT rows stay");
    let inbox = inbox_rows(&t.db, "t-janitor").await;
    assert_eq!(
        inbox.len(),
        10,
        "old DONE inbox rows purged, recent ones kept"
    );
}

backend_tests! {
    janitor => janitor_purges_old_rows_only;
}

#[tokio::test]
async fn a_window_shorter_than_the_redelivery_horizon_is_refused() {
    let db = sea_orm::Database::connect("sqlite::memory:").await.unwrap();
    let short = RetentionPolicy::default().done_after(Duration::from_secs(3600));
    let err = Runtime::builder(db)
        .consumers(Vec::<String>::new())
        .retention(Some(short), Duration::from_secs(60))
        .start()
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("retention:"), "{text}");
}
