//! Dead letters grouped by error (`admin::failure_groups`), and a whole group replayed or
//! ignored in one audited action. The dead letters are made with the test kit.

use crate::common::*;
use outbox::admin::{self, Actor, DeadLetterFilter, Source};
use outbox::prelude::*;
use outbox::testing::{TestConsumer, TestDb as KitDb};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, DomainEvent)]
#[event(name = "groups.parcel_booked", aggregate = "parcel")]
pub(crate) struct ParcelBooked {
    #[event(aggregate_id)]
    pub(crate) parcel: i64,
    pub(crate) kilos: i64,
    pub(crate) address: String,
}

/// Refuses heavy parcels and unknown addresses, for good.
#[inbox_handler(consumer = "t-groups")]
async fn book(_tx: &InboxTransaction, event: Event<ParcelBooked>) -> Result<(), HandlerError> {
    if event.kilos > 30 {
        return Err(HandlerError::permanent(format!(
            "parcel {} weighs {} kg, over the 30 kg limit",
            event.parcel, event.kilos
        )));
    }
    Err(HandlerError::permanent(format!(
        "address '{}' is unknown (parcel {})",
        event.address, event.parcel
    )))
}

/// Deliver a parcel booking of each `(parcel, kilos)` to Atlantis: each ends DEAD (too heavy, or
/// an unknown address).
pub(crate) async fn dead_parcels(db: &outbox::sea_orm::DatabaseConnection, parcels: &[(i64, i64)]) {
    let consumer = TestConsumer::new("t-groups", db).unwrap();
    for &(parcel, kilos) in parcels {
        let booked = ParcelBooked {
            parcel,
            kilos,
            address: "Atlantis".into(),
        };
        let outcome = consumer.deliver(&booked).await.unwrap();
        assert!(outcome.is_dead(), "{outcome:?}");
    }
}

/// An audited replay of a failure group, its reason "limit raised".
pub(crate) fn assert_replayed_a_group(action: &admin::AdminAction) {
    assert_eq!(action.action, "replay");
    assert!(
        action
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with("limit raised; failure group ")),
        "{action:?}"
    );
}

async fn grouped_and_settled_as_one(db: KitDb) {
    let consumer = TestConsumer::new("t-groups", &db).unwrap();
    for (parcel, kilos, address) in [
        (1, 40, "1 Main St"),
        (2, 55, "2 Main St"),
        (3, 31, "3 Main St"),
        (4, 5, "Nowhere 9"),
        (5, 2, "Atlantis"),
    ] {
        let outcome = consumer
            .deliver(&ParcelBooked {
                parcel,
                kilos,
                address: address.into(),
            })
            .await
            .unwrap();
        assert!(outcome.is_dead(), "{outcome:?}");
    }
    let groups = admin::failure_groups(&db, &DeadLetterFilter::default())
        .await
        .unwrap();
    assert_eq!(groups.len(), 2, "{groups:#?}");
    let (heavy, unknown) = (&groups[0], &groups[1]);
    assert_eq!(heavy.count, 3);
    assert_eq!(
        heavy.pattern,
        "parcel <n> weighs <n> kg, over the <n> kg limit"
    );
    assert_eq!(heavy.example, "parcel 3 weighs 31 kg, over the 30 kg limit");
    assert_eq!(heavy.source, Source::Inbox);
    assert_eq!(heavy.consumers, ["t-groups"]);
    assert_eq!(heavy.event_types, ["groups.parcel_booked"]);
    assert!(heavy.first_seen <= heavy.last_seen);
    assert_eq!(unknown.count, 2);
    assert_eq!(unknown.pattern, "address '?' is unknown (parcel <n>)");

    let replayed = admin::replay_group(
        &db,
        &heavy.fingerprint,
        &Actor::new("ops").reason("limit raised"),
    )
    .await
    .unwrap();
    assert_eq!((replayed.outbox, replayed.inbox), (0, 3));
    let ignored = admin::ignore_group(&db, &unknown.fingerprint, &Actor::new("ops"))
        .await
        .unwrap();
    assert_eq!(ignored.inbox, 2);
    let audit = admin::audit_log(&db, 2).await.unwrap();
    assert_eq!(audit[0].action, "ignore");
    assert_eq!(
        audit[0].reason.as_deref(),
        Some(
            format!(
                "failure group {} (address '?' is unknown (parcel <n>))",
                unknown.fingerprint
            )
            .as_str()
        )
    );
    assert_replayed_a_group(&audit[1]);
    // Nothing is dead any more; an unknown group is an error that names it.
    assert!(
        admin::failure_groups(&db, &DeadLetterFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
    let missing = admin::replay_group(&db, &heavy.fingerprint, &Actor::new("ops")).await;
    assert!(
        missing
            .unwrap_err()
            .to_string()
            .contains(&heavy.fingerprint)
    );
}

#[tokio::test]
async fn dead_letters_are_grouped_by_error_and_settled_as_one_on_sqlite() {
    grouped_and_settled_as_one(KitDb::sqlite().await.unwrap()).await;
}

#[tokio::test]
async fn dead_letters_are_grouped_by_error_and_settled_as_one_on_postgres() {
    match KitDb::postgres(&postgres_admin_url()).await {
        Ok(db) => grouped_and_settled_as_one(db).await,
        Err(e) => assert!(!services_required(), "PostgreSQL: {e}"),
    }
}

/// `outbox dead groups` lists the groups; `outbox replay --group` and `outbox ignore --group`
/// settle one each.
#[cfg(feature = "cli")]
async fn the_cli_lists_and_settles_groups(backend: Backend, test: &str) {
    use crate::cli::{cli, run, run_json, stderr};
    let Some(t) = test_db(backend, test).await else {
        return;
    };
    let db = t.db.clone();
    dead_parcels(&db, &[(1, 40), (2, 50), (3, 1)]).await;
    let groups = run_json(&t.url, &["dead", "groups"]).await;
    let groups = groups.as_array().unwrap();
    assert_eq!(groups.len(), 2, "{groups:?}");
    assert_eq!(groups[0]["count"], 2);
    assert_eq!(groups[0]["consumers"][0], "t-groups");
    let heavy = groups[0]["fingerprint"].as_str().unwrap().to_owned();
    let unknown = groups[1]["fingerprint"].as_str().unwrap().to_owned();
    let table = run(&t.url, &["dead", "groups"], 0).await;
    assert!(table.contains("GROUP") && table.contains(&heavy), "{table}");
    assert!(
        table.contains("parcel <n> weighs <n> kg, over the <n> kg limit"),
        "{table}"
    );

    let both = cli(Some(&t.url), &["ignore", "--group", &unknown, "--all"]).await;
    assert_ne!(both.status.code(), Some(0));
    assert!(
        stderr(&both).contains("choose one way to select"),
        "{}",
        stderr(&both)
    );
    run(
        &t.url,
        &["replay", "--group", &heavy, "--reason", "limit raised"],
        0,
    )
    .await;
    run(&t.url, &["ignore", "--group", &unknown], 0).await;
    let left = run_json(&t.url, &["dead", "groups"]).await;
    assert_eq!(left.as_array().map(Vec::len), Some(0), "{left}");
    let audit = admin::audit_log(&db, 2).await.unwrap();
    assert_eq!(
        (audit[0].action.as_str(), audit[0].rows_affected),
        ("ignore", 1)
    );
    assert_eq!(
        (audit[1].action.as_str(), audit[1].rows_affected),
        ("replay", 2)
    );
}

#[cfg(feature = "cli")]
#[tokio::test]
async fn the_cli_lists_and_settles_groups_on_sqlite_file() {
    the_cli_lists_and_settles_groups(Backend::SqliteFile, "cli_groups_sqlite").await;
}

#[cfg(feature = "cli")]
#[tokio::test]
async fn the_cli_lists_and_settles_groups_on_postgres() {
    the_cli_lists_and_settles_groups(Backend::Postgres, "cli_groups_pg").await;
}
