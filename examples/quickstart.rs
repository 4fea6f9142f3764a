//! Quickstart: an order service and two consumers on one SQLite file, no broker.
//!
//! ```sh
//! cargo run --example quickstart
//! ```
//!
//! Each order commits with its `order.placed` event. The runtime's relay moves every event into
//! the inbox of each consumer in the same database (the database-local transport), and the
//! consumers handle them effectively once:
//!
//! - `inventory` reserves stock; an order for more than is in stock fails for good and its message
//!   ends DEAD, where an operator sees it;
//! - `notification` records a confirmation; its "mail server" times out once, and the message is
//!   retried with backoff and recovers.
//!
//! Finally one event is sent again, as an operator's `resend` would: the inbox suppresses the
//! duplicate, so nothing is handled twice.
//!
//! The same binary prints its event catalogue (see "The event catalogue" in the guide,
//! book/src/evolving.md):
//!
//! ```sh
//! cargo run --example quickstart --features catalogue -- catalogue
//! cargo run --example quickstart --features catalogue -- catalogue asyncapi --transport kafka --namespace shop
//! cargo run --example quickstart --features catalogue -- catalogue check docs/catalogue/quickstart.json
//! ```

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use outbox::inbox::InboxConfig;
use outbox::prelude::*;
use outbox::relay::{Backoff, RelayConfig};
use outbox::sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, Database, DatabaseConnection, EntityTrait,
    ExprTrait, PaginatorTrait, QueryFilter, Schema, Set, Statement, sea_query::Expr,
};
use serde::{Deserialize, Serialize};

/// The order service's orders.
mod order {
    use outbox::sea_orm; // the derives below expand to `sea_orm::…` paths
    use outbox::sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "orders")]
    pub(crate) struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: i64,
        pub customer: String,
        pub sku: String,
        pub quantity: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub(crate) enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// The inventory's stock, one row per article.
mod stock {
    use outbox::sea_orm;
    use outbox::sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "stock")]
    pub(crate) struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub sku: String,
        pub available: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub(crate) enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// The confirmations the notification consumer sent, one per order.
mod confirmation {
    use outbox::sea_orm;
    use outbox::sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "confirmation")]
    pub(crate) struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub order_id: i64,
        pub customer: String,
        pub attempt: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub(crate) enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// An order was placed (its stock is not reserved yet).
#[derive(Debug, Serialize, Deserialize, DomainEvent, schemars::JsonSchema)]
#[event(name = "order.placed", aggregate = "order", version = 1)]
struct OrderPlaced {
    /// The order's id.
    #[event(aggregate_id)]
    order_id: i64,
    /// Who placed it.
    customer: String,
    /// The item ordered.
    sku: String,
    /// How many.
    quantity: i64,
}

#[inbox_handler(consumer = "inventory", max_attempts = 3, backoff = "100ms")]
async fn reserve_stock(
    tx: &InboxTransaction,
    event: Event<OrderPlaced>,
) -> Result<(), HandlerError> {
    // `available - quantity` where at least `quantity` is available; no row otherwise.
    let reserved = stock::Entity::update_many()
        .col_expr(
            stock::Column::Available,
            Expr::col(stock::Column::Available).sub(event.quantity),
        )
        .filter(stock::Column::Sku.eq(event.sku.as_str()))
        .filter(stock::Column::Available.gte(event.quantity))
        .exec(tx)
        .await?;
    if reserved.rows_affected == 0 {
        return Err(HandlerError::permanent(format!(
            "not enough {} in stock for order {} ({} wanted)",
            event.sku, event.order_id, event.quantity
        )));
    }
    Ok(())
}

static MAIL_SERVER_DOWN_ONCE: AtomicBool = AtomicBool::new(true);

#[inbox_handler(consumer = "notification", backoff = "200ms")]
async fn send_confirmation(
    tx: &InboxTransaction,
    event: Event<OrderPlaced>,
) -> Result<(), HandlerError> {
    if event.order_id == 2 && MAIL_SERVER_DOWN_ONCE.swap(false, Ordering::SeqCst) {
        return Err(HandlerError::retry("mail server timed out"));
    }
    confirmation::ActiveModel {
        order_id: Set(event.order_id),
        customer: Set(event.customer.clone()),
        attempt: Set(event.meta().attempt.into()),
    }
    .insert(tx)
    .await?;
    Ok(())
}

/// A count from the SDK's own tables: a fixed statement, with no values in it.
async fn count(
    db: &DatabaseConnection,
    sql: &'static str,
) -> Result<i64, Box<dyn std::error::Error>> {
    let row = db
        .query_one_raw(Statement::from_string(db.get_database_backend(), sql))
        .await?
        .ok_or("no row")?;
    Ok(row.try_get_by_index::<i64>(0)?)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `quickstart catalogue …`: the event catalogue of this binary (its events, consumers and
    // their schemas), as a service's own binary prints it.
    if std::env::args().nth(1).as_deref() == Some("catalogue") {
        outbox::catalogue::cli::exit(std::env::args().skip(2));
    }
    let path = std::env::temp_dir().join("outbox-quickstart.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let db = Database::connect(format!("sqlite://{}?mode=rwc", path.display())).await?;
    outbox::migrate(&db).await?;
    let schema = Schema::new(db.get_database_backend());
    db.execute(&schema.create_table_from_entity(order::Entity))
        .await?;
    db.execute(&schema.create_table_from_entity(stock::Entity))
        .await?;
    db.execute(&schema.create_table_from_entity(confirmation::Entity))
        .await?;
    for (sku, available) in [("kettle", 10), ("teapot", 1)] {
        stock::ActiveModel {
            sku: Set(sku.into()),
            available: Set(available),
        }
        .insert(&db)
        .await?;
    }
    println!("database: {}", path.display());

    let runtime = Runtime::builder(db.clone())
        .source("order-service")
        .expect_consumers(["inventory", "notification"])
        .relay_config(RelayConfig::default().poll_interval(Duration::from_millis(100)))
        .inbox_config(
            InboxConfig::default()
                .poll_interval(Duration::from_millis(100))
                .backoff(
                    Backoff::default()
                        .base(Duration::from_millis(200))
                        .cap(Duration::from_secs(2))
                        .jitter(0.2),
                ),
        )
        .start()
        .await?;
    let outbox = runtime.outbox().clone();

    let orders = [
        (1, "ada", "kettle", 2),
        (2, "grace", "kettle", 1),
        (3, "linus", "teapot", 5), // more teapots than in stock
        (4, "barbara", "kettle", 3),
    ];
    for (id, customer, sku, quantity) in orders {
        let tx = outbox.begin(&db).await?;
        order::ActiveModel {
            id: Set(id),
            customer: Set(customer.into()),
            sku: Set(sku.into()),
            quantity: Set(quantity),
        }
        .insert(&tx)
        .await?;
        tx.enqueue(&OrderPlaced {
            order_id: id,
            customer: customer.into(),
            sku: sku.into(),
            quantity,
        })?;
        let _ = tx.commit().await?;
        println!("placed order {id}: {quantity} x {sku} for {customer}");
    }

    // Wait until both consumers settled every message (DONE or DEAD).
    let settled = "SELECT COUNT(*) FROM inbox_event WHERE status IN ('DONE', 'DEAD')";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while count(&db, settled).await? < 2 * orders.len() as i64 {
        if tokio::time::Instant::now() > deadline {
            return Err("consumers did not settle within 20 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // An operator resends order 1's event (`outbox resend <event id>`): delivered again, and
    // suppressed by both inboxes as a duplicate. Sent events are kept in `outbox_sent`.
    let sent = db
        .query_one_raw(Statement::from_sql_and_values(
            db.get_database_backend(),
            "SELECT event_id FROM outbox_sent WHERE aggregate_id = ?",
            ["1".into()],
        ))
        .await?
        .ok_or("order 1's event is not among the sent events")?;
    let event_id = uuid::Uuid::parse_str(&sent.try_get::<String>("", "event_id")?)?;
    outbox::admin::resend(
        &db,
        &outbox::admin::Resend::Events(vec![event_id]),
        &outbox::admin::Actor::new("quickstart").reason("show a resend"),
    )
    .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while runtime.relay_stats().map_or(0, |s| s.duplicates) < 2 {
        if tokio::time::Instant::now() > deadline {
            return Err("the resent event was not delivered again".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let relay = runtime.relay_stats().unwrap_or_default();
    println!();
    println!(
        "events placed: {}, delivered to consumers: {}, suppressed as duplicate on resend: {}",
        count(
            &db,
            "SELECT (SELECT COUNT(*) FROM outbox_event) + (SELECT COUNT(*) FROM outbox_sent)"
        )
        .await?,
        count(&db, "SELECT COUNT(*) FROM inbox_event").await?,
        relay.duplicates,
    );
    println!(
        "{:<14} {:>8} {:>8} {:>6}",
        "consumer", "handled", "retried", "dead"
    );
    for consumer in runtime.consumers() {
        let s = runtime.consumer_stats(consumer).unwrap_or_default();
        println!(
            "{consumer:<14} {:>8} {:>8} {:>6}",
            s.handled, s.retried, s.dead
        );
    }
    let dead = db
        .query_all_raw(Statement::from_string(
            db.get_database_backend(),
            "SELECT consumer, message_id, last_error FROM inbox_event WHERE status = 'DEAD'",
        ))
        .await?;
    for row in &dead {
        println!(
            "DEAD {}/{}: {}",
            row.try_get::<String>("", "consumer")?,
            row.try_get::<String>("", "message_id")?,
            row.try_get::<String>("", "last_error")?
        );
    }
    let kettles_left = stock::Entity::find_by_id("kettle")
        .one(&db)
        .await?
        .ok_or("no kettle row")?
        .available;
    let confirmations = confirmation::Entity::find().count(&db).await?;
    let order_2 = confirmation::Entity::find_by_id(2)
        .one(&db)
        .await?
        .ok_or("no confirmation for order 2")?;
    println!(
        "kettles left: {kettles_left}, confirmations sent: {confirmations} (order 2 on attempt {})",
        order_2.attempt,
    );
    runtime.shutdown().await;

    // What the run must show, checked so that the example fails loudly if it ever stops working.
    assert_eq!(kettles_left, 4);
    assert_eq!(confirmations, 4);
    assert_eq!(dead.len(), 1);
    Ok(())
}
