//! The shop's tests, written with outbox's test kit. Each runs on SQLite in memory and on a
//! fresh PostgreSQL schema (`OUTBOX_TEST_POSTGRES_URL`, default the local server); the broker
//! tests on NATS JetStream (`NATS_URL`, default the local server). A server that does not
//! answer is skipped with a message, or fails the test with `OUTBOX_REQUIRE_SERVICES=1`.

use std::time::Duration;

use outbox::prelude::*;
use outbox::testing::{
    self, EventState, HandlerFaults, MemoryTransport, MessageState, Session, TestConsumer, TestDb,
};
use outbox::transport::{Transport, nats::NatsTransport};
use shop::{OrderPlaced, ReviewDue, StockReserved};

fn order(order_id: i64, sku: &str, quantity: i64) -> OrderPlaced {
    OrderPlaced {
        order_id,
        customer: "ada".into(),
        sku: sku.into(),
        quantity,
    }
}

fn require_services() -> bool {
    std::env::var("OUTBOX_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

/// The databases a test runs on, each with the shop's tables and ten kettles in stock.
async fn databases() -> Vec<TestDb> {
    let mut dbs = vec![TestDb::sqlite().await.expect("SQLite in memory")];
    let url = std::env::var("OUTBOX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    match TestDb::postgres(&url).await {
        Ok(db) => dbs.push(db),
        Err(e) if require_services() => panic!("PostgreSQL at {url}: {e}"),
        Err(e) => eprintln!("SKIPPED on PostgreSQL: no server at {url} ({e})"),
    }
    for db in &dbs {
        shop::create_tables(db).await.unwrap();
        shop::add_stock(db, "kettle", 10).await.unwrap();
    }
    dbs
}

/// The shop's runtime on `db`, polling every few milliseconds.
async fn runtime(
    db: &TestDb,
    transport: Option<std::sync::Arc<dyn outbox::transport::Transport>>,
) -> Runtime {
    let mut builder = Runtime::builder(db.conn().clone())
        .source("shop")
        .expect_consumers(["inventory", "notification"])
        .relay_config(testing::relay_config())
        .inbox_config(testing::inbox_config());
    if let Some(transport) = transport {
        builder = builder.transport(transport);
    }
    builder.start().await.expect("the runtime starts")
}

// 1. What a transaction enqueued, before and after its commit.
#[tokio::test]
async fn placing_an_order_enqueues_order_placed_once_and_a_reminder_for_tomorrow() {
    for db in databases().await {
        let outbox = Outbox::new("shop");
        let start = testing::Mark::now(&db).await.unwrap();
        let tx = outbox.begin(&db).await.unwrap();
        shop::place_order_in(&tx, &order(42, "kettle", 2))
            .await
            .unwrap();
        let enqueued = testing::enqueued(&tx);
        assert_eq!(enqueued.one::<OrderPlaced>(), order(42, "kettle", 2));
        let reminders = enqueued.filter(|e| e.is::<ReviewDue>());
        // Due a day after the commit: its instant is known once committed.
        assert_eq!(reminders.all()[0].state, EventState::Scheduled(None));
        let report = tx.commit().await.unwrap();
        assert_eq!((report.written, report.scheduled), (1, 1));

        let committed = testing::events(&db, &start).await.unwrap();
        let for_order = committed.for_aggregate(42);
        assert_eq!(for_order.one::<OrderPlaced>(), order(42, "kettle", 2));
        assert_eq!(for_order.all()[0].state, EventState::Pending); // no relay runs here
        assert!(matches!(
            for_order.filter(|e| e.is::<ReviewDue>()).all()[0].state,
            EventState::Scheduled(Some(_))
        ));
        for_order.none::<StockReserved>();
    }
}

// 2. A handler run directly, through the inbox, with what it enqueued in turn.
#[tokio::test]
async fn the_inventory_reserves_stock_and_emits_stock_reserved() {
    for db in databases().await {
        let inventory = TestConsumer::new("inventory", &db).unwrap();
        let outcome = inventory.deliver(&order(7, "kettle", 3)).await.unwrap();
        assert!(outcome.is_done(), "{outcome:?}");
        assert_eq!(outcome.attempts, 1);
        assert!(outcome.acked);
        assert_eq!(shop::available(&db, "kettle").await.unwrap(), 7);
        let reserved = outcome.enqueued.one::<StockReserved>();
        assert_eq!(reserved.order_id, 7);
    }
}

#[tokio::test]
async fn a_duplicate_delivery_has_no_second_effect() {
    for db in databases().await {
        let inventory = TestConsumer::new("inventory", &db).unwrap();
        let first = inventory.deliver(&order(8, "kettle", 4)).await.unwrap();
        assert!(first.is_done());
        let again = inventory.redeliver(&first).await.unwrap();
        assert!(again.duplicate, "{again:?}");
        assert!(again.acked);
        assert!(again.enqueued.is_empty());
        assert_eq!(again.counted.handled, 0);
        assert_eq!(shop::available(&db, "kettle").await.unwrap(), 6);
    }
}

#[tokio::test]
async fn an_order_for_more_than_is_in_stock_is_dead_at_once() {
    for db in databases().await {
        let inventory = TestConsumer::new("inventory", &db).unwrap();
        let outcome = inventory.deliver(&order(9, "kettle", 11)).await.unwrap();
        assert!(outcome.is_dead(), "{outcome:?}");
        assert!(
            outcome
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("not enough kettle in stock for order 9")),
            "{outcome:?}"
        );
        assert!(outcome.enqueued.is_empty());
        assert_eq!(shop::available(&db, "kettle").await.unwrap(), 10);
    }
}

// 4. Deterministic faults: a handler that fails, retried with its backoff skipped.
#[tokio::test]
async fn after_three_failures_the_message_is_dead_and_nothing_was_reserved() {
    for db in databases().await {
        let faults = HandlerFaults::new();
        faults.fail_after_running("inventory", "order.placed", 3);
        let inventory = TestConsumer::new("inventory", &db).unwrap().faults(&faults);
        let first = inventory.deliver(&order(10, "kettle", 1)).await.unwrap();
        assert!(first.is_retry(), "{first:?}");
        assert_eq!(first.attempts, 1);
        let settled = inventory.settle(&first).await.unwrap();
        assert!(settled.is_dead(), "{settled:?}");
        assert_eq!(settled.attempts, 3); // the handler's max_attempts
        assert_eq!(faults.injected(), 3);
        assert!(settled.enqueued.is_empty()); // each attempt's StockReserved rolled back
        assert_eq!(shop::available(&db, "kettle").await.unwrap(), 10);
    }
}

#[tokio::test]
async fn a_handler_that_fails_twice_succeeds_on_its_third_attempt() {
    for db in databases().await {
        let faults = HandlerFaults::new();
        faults.fail("inventory", "order.placed", 2);
        let inventory = TestConsumer::new("inventory", &db).unwrap().faults(&faults);
        let first = inventory.deliver(&order(11, "kettle", 2)).await.unwrap();
        let second = inventory.retry(&first).await.unwrap();
        assert!(second.is_retry());
        let third = inventory.retry(&second).await.unwrap();
        assert!(third.is_done(), "{third:?}");
        assert_eq!(third.attempts, 3);
        assert_eq!(third.enqueued.count::<StockReserved>(), 1);
        assert_eq!(shop::available(&db, "kettle").await.unwrap(), 8);
    }
}

// 3. A tracked session: the order, the reservation and the confirmation it cascades into.
#[tokio::test]
async fn a_placed_order_is_reserved_and_confirmed() {
    for db in databases().await {
        let runtime = runtime(&db, None).await;
        let session = Session::start(&db).await.unwrap().runtime(&runtime);
        shop::place_order(runtime.outbox(), &db, &order(42, "kettle", 2))
            .await
            .unwrap();
        let quiet = session.quiet(Duration::from_secs(30)).await.unwrap();
        assert_eq!(
            quiet.handled::<OrderPlaced>("inventory"),
            [order(42, "kettle", 2)]
        );
        let confirmed = quiet.handled::<StockReserved>("notification");
        assert_eq!(confirmed.len(), 1);
        assert!(quiet.dead().is_empty());
        assert_eq!(quiet.events.count::<StockReserved>(), 1);
        let notices = shop::notices(&db).await.unwrap();
        assert_eq!(notices.len(), 1, "{notices:?}");
        assert_eq!(notices[0].id, "confirmation:42");
        assert_eq!(shop::available(&db, "kettle").await.unwrap(), 8);
        runtime.shutdown().await;
    }
}

// 5. Time: the reminder a day later, without waiting a day.
#[tokio::test]
async fn the_review_reminder_is_sent_a_day_after_the_order() {
    for db in databases().await {
        let runtime = runtime(&db, None).await;
        let session = Session::start(&db).await.unwrap().runtime(&runtime);
        shop::place_order(runtime.outbox(), &db, &order(43, "kettle", 1))
            .await
            .unwrap();
        let quiet = session.quiet(Duration::from_secs(30)).await.unwrap();
        assert_eq!(quiet.handled::<ReviewDue>("notification").len(), 0);

        let moved = testing::advance(&db, Duration::from_secs(23 * 3600))
            .await
            .unwrap();
        assert_eq!(moved.scheduled, 0); // an hour to go
        let quiet = session.quiet(Duration::from_secs(30)).await.unwrap();
        assert_eq!(quiet.handled::<ReviewDue>("notification").len(), 0);

        let moved = testing::advance(&db, Duration::from_secs(3600))
            .await
            .unwrap();
        assert_eq!(moved.scheduled, 1);
        let quiet = session.quiet(Duration::from_secs(30)).await.unwrap();
        let reminded = quiet.handled::<ReviewDue>("notification");
        assert_eq!(reminded.len(), 1);
        assert_eq!(reminded[0].order_id, 43);
        runtime.shutdown().await;
    }
}

// 4. Faults on the broker: publishes refused, the broker stopped, a delivery made twice.
#[tokio::test]
async fn the_order_goes_through_a_broker_that_fails_and_stops() {
    for db in databases().await {
        let broker = MemoryTransport::new();
        broker.fail_next_publishes(2);
        let runtime = runtime(&db, Some(std::sync::Arc::new(broker.clone()))).await;
        let session = Session::start(&db)
            .await
            .unwrap()
            .runtime(&runtime)
            .skip_backoff(true);
        shop::place_order(runtime.outbox(), &db, &order(44, "kettle", 1))
            .await
            .unwrap();
        let quiet = session.quiet(Duration::from_secs(30)).await.unwrap();
        assert_eq!(quiet.handled::<StockReserved>("notification").len(), 1);

        // While the broker is down, the next order waits in the outbox, and the session says so.
        broker.set_unavailable(true);
        shop::place_order(runtime.outbox(), &db, &order(45, "kettle", 1))
            .await
            .unwrap();
        let error = session.quiet(Duration::from_millis(300)).await.unwrap_err();
        let listing = error.to_string();
        assert!(listing.contains("to publish"), "{listing}");
        assert!(listing.contains("order.placed order/45"), "{listing}");
        broker.set_unavailable(false);
        let quiet = session.quiet(Duration::from_secs(30)).await.unwrap();
        assert_eq!(quiet.handled::<OrderPlaced>("inventory").len(), 2);

        // A delivery whose ack the broker lost is delivered a second time, and recognised:
        // nothing is reserved twice.
        broker.lose_next_acks(1);
        shop::place_order(runtime.outbox(), &db, &order(46, "kettle", 1))
            .await
            .unwrap();
        session.quiet(Duration::from_secs(30)).await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while runtime
            .consumer_stats("inventory")
            .unwrap_or_default()
            .duplicates
            == 0
        {
            assert!(
                std::time::Instant::now() < deadline,
                "no redelivery was suppressed"
            );
            // Now rather than after the ack wait (the lost ack may still be on its way).
            broker.redeliver("inventory");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let quiet = session.quiet(Duration::from_secs(30)).await.unwrap();
        assert_eq!(quiet.handled::<OrderPlaced>("inventory").len(), 3);
        assert_eq!(shop::available(&db, "kettle").await.unwrap(), 7);
        runtime.shutdown().await;
    }
}

// On NATS JetStream, as in production.
#[tokio::test]
async fn a_placed_order_is_reserved_and_confirmed_through_nats() {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    for db in databases().await {
        // A namespace (and so a stream) of this test's own.
        let namespace = format!("shop_{}", uuid_suffix());
        let nats = match NatsTransport::builder(&url)
            .namespace(&namespace)
            .connect()
            .await
        {
            Ok(nats) => nats,
            Err(e) if require_services() => panic!("NATS at {url}: {e}"),
            Err(e) => {
                eprintln!("SKIPPED on NATS: no server at {url} ({e})");
                return;
            }
        };
        nats.setup().await.unwrap();
        let runtime = runtime(&db, Some(std::sync::Arc::new(nats.clone()))).await;
        let session = Session::start(&db).await.unwrap().runtime(&runtime);
        for id in [50, 51] {
            shop::place_order(runtime.outbox(), &db, &order(id, "kettle", 1))
                .await
                .unwrap();
        }
        let quiet = session.quiet(Duration::from_secs(30)).await.unwrap();
        assert_eq!(quiet.handled::<OrderPlaced>("inventory").len(), 2);
        assert_eq!(quiet.handled::<StockReserved>("notification").len(), 2);
        assert_eq!(shop::available(&db, "kettle").await.unwrap(), 8);
        runtime.shutdown().await;
        nats.jetstream()
            .delete_stream(nats.stream_name())
            .await
            .ok();
    }
}

// 6. Isolation: each test's database is its own.
#[tokio::test]
async fn two_test_databases_do_not_see_each_others_rows() {
    let (a, b) = (databases().await, databases().await);
    for (a, b) in a.iter().zip(&b) {
        shop::place_order(&Outbox::new("shop"), a, &order(60, "kettle", 1))
            .await
            .unwrap();
        let in_b = testing::events(b.conn(), &testing::Mark::start())
            .await
            .unwrap();
        assert!(in_b.is_empty(), "{in_b}");
        let in_a = testing::events(a.conn(), &testing::Mark::start())
            .await
            .unwrap();
        assert_eq!(in_a.count::<OrderPlaced>(), 1);
    }
    for db in a.into_iter().chain(b) {
        db.cleanup().await.unwrap();
    }
}

fn uuid_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{}_{nanos}", std::process::id())
}

#[tokio::test]
async fn the_message_states_a_test_sees() {
    for db in databases().await {
        let notification = TestConsumer::new("notification", &db).unwrap();
        let outcome = notification
            .deliver(&StockReserved {
                order_id: 70,
                customer: "grace".into(),
            })
            .await
            .unwrap();
        assert_eq!(outcome.state, Some(MessageState::Done));
        assert_eq!(outcome.consumer, "notification");
    }
}

// 2. A foreign or broken body: kept DEAD, with its bytes and the reason, for an operator.
#[tokio::test]
async fn a_broken_message_is_kept_dead_for_an_operator() {
    for db in databases().await {
        let inventory = TestConsumer::new("inventory", &db).unwrap();
        let outcome = inventory
            .deliver_bytes(b"{\"not\": \"a CloudEvent\"")
            .await
            .unwrap();
        assert!(outcome.is_dead(), "{outcome:?}");
        assert!(
            outcome
                .last_error
                .as_deref()
                .is_some_and(|e| e.starts_with("undecodable message")),
            "{outcome:?}"
        );
        assert!(outcome.acked); // kept in the inbox, so the broker need not keep it
        assert_eq!(outcome.counted.dead, 1);
        assert_eq!(shop::available(&db, "kettle").await.unwrap(), 10);
    }
}
