//! Quickstart: an order service on a SQLite file. Each order and its `order.placed` event commit
//! in one transaction; an order whose payment is declined rolls back and leaves no event behind.
//!
//! ```sh
//! cargo run --example quickstart
//! ```

use outbox::prelude::*;
use outbox::sea_orm::{
    ActiveModelTrait, ConnectionTrait, Database, DatabaseConnection, Schema, Set, Statement,
    entity::prelude::*,
};
use serde::{Deserialize, Serialize};

/// The business table: orders.
#[allow(unreachable_pub)] // SeaORM entities are declared `pub`.
mod order {
    use outbox::sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "orders")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: i64,
        pub customer: String,
        pub total_cents: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// The event other services learn about.
#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", aggregate = "order", version = 1)]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: i64,
    customer: String,
    total_cents: i64,
}

async fn place_order(
    outbox: &Outbox,
    db: &DatabaseConnection,
    id: i64,
    customer: &str,
    total_cents: i64,
) -> Result<(), TransactionError<String>> {
    let customer = customer.to_owned();
    outbox
        .transaction(db, |tx| {
            Box::pin(async move {
                order::ActiveModel {
                    id: Set(id),
                    customer: Set(customer.clone()),
                    total_cents: Set(total_cents),
                }
                .insert(tx)
                .await
                .map_err(|e| e.to_string())?;
                tx.enqueue(&OrderPlaced {
                    order_id: id,
                    customer,
                    total_cents,
                })
                .map_err(|e| e.to_string())?;
                if total_cents > 100_000 {
                    return Err(format!("payment declined for order {id}"));
                }
                Ok(())
            })
        })
        .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join("outbox-quickstart.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let db = Database::connect(format!("sqlite://{}?mode=rwc", path.display())).await?;
    outbox::migrate(&db).await?;
    let backend = db.get_database_backend();
    db.execute(&Schema::new(backend).create_table_from_entity(order::Entity))
        .await?;

    let outbox = Outbox::new("order-service");
    println!("database: {}", path.display());
    for (id, customer, total) in [(1, "ada", 4_200), (2, "grace", 250_000), (3, "linus", 990)] {
        match place_order(&outbox, &db, id, customer, total).await {
            Ok(()) => println!("placed order {id} for {customer}"),
            Err(e) => println!("order {id} rolled back: {e}"),
        }
    }

    let orders = order::Entity::find().all(&db).await?;
    println!("\n{} orders committed", orders.len());
    let rows = db
        .query_all_raw(Statement::from_string(
            backend,
            "SELECT id, event_id, event_type, aggregate_id, status, payload FROM outbox_event ORDER BY id",
        ))
        .await?;
    println!(
        "{} events in the outbox, written in the same transactions:",
        rows.len()
    );
    println!(
        "{:<4} {:<38} {:<14} {:<10} {:<8} payload",
        "id", "event_id", "type", "aggregate", "status"
    );
    for row in &rows {
        println!(
            "{:<4} {:<38} {:<14} {:<10} {:<8} {}",
            row.try_get::<i64>("", "id")?,
            row.try_get::<String>("", "event_id")?,
            row.try_get::<String>("", "event_type")?,
            row.try_get::<String>("", "aggregate_id")?,
            row.try_get::<String>("", "status")?,
            row.try_get::<String>("", "payload")?,
        );
    }
    assert_eq!(
        orders.len(),
        rows.len(),
        "every committed order has its event, and only those"
    );
    Ok(())
}
