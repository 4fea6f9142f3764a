//! The quickstart's shop as a crate of its own, the way a service lays it out: its tables, its
//! events, the code that places an order, and two consumers. Its tests (`tests/shop.rs`) are
//! written with outbox's test kit (`outbox::testing`):
//!
//! ```sh
//! cargo test -p shop
//! ```
//!
//! - `order.placed` commits with the order;
//! - `inventory` reserves the stock and emits `stock.reserved` (an order for more than is in
//!   stock fails for good);
//! - `notification` sends the confirmation when the stock is reserved, and a reminder a day
//!   after the order (a delayed event).

use std::time::Duration;

use outbox::prelude::*;
use outbox::sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait,
    ExprTrait, QueryFilter, Schema, Set, sea_query::Expr,
};
use serde::{Deserialize, Serialize};

/// The orders.
pub mod order {
    use outbox::sea_orm; // the derives below expand to `sea_orm::…` paths
    use outbox::sea_orm::entity::prelude::*;

    /// An order.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "orders")]
    pub struct Model {
        /// Its id.
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: i64,
        /// Who placed it.
        pub customer: String,
        /// The article.
        pub sku: String,
        /// How many.
        pub quantity: i64,
    }

    /// No relations.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// The inventory's stock, one row per article.
pub mod stock {
    use outbox::sea_orm;
    use outbox::sea_orm::entity::prelude::*;

    /// An article's stock.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "stock")]
    pub struct Model {
        /// The article.
        #[sea_orm(primary_key, auto_increment = false)]
        pub sku: String,
        /// How many are available.
        pub available: i64,
    }

    /// No relations.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// What the notification consumer sent: confirmations and reminders.
pub mod notice {
    use outbox::sea_orm;
    use outbox::sea_orm::entity::prelude::*;

    /// One notice to a customer.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "notice")]
    pub struct Model {
        /// `confirmation:{order}` or `reminder:{order}`.
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        /// To whom.
        pub customer: String,
        /// The handler's attempt that sent it.
        pub attempt: i64,
    }

    /// No relations.
    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// An order was placed (its stock is not reserved yet).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", aggregate = "order", version = 1)]
pub struct OrderPlaced {
    /// The order's id.
    #[event(aggregate_id)]
    pub order_id: i64,
    /// Who placed it.
    pub customer: String,
    /// The article ordered.
    pub sku: String,
    /// How many.
    pub quantity: i64,
}

/// The inventory reserved an order's stock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, DomainEvent)]
#[event(name = "stock.reserved", aggregate = "order", version = 1)]
pub struct StockReserved {
    /// The order's id.
    #[event(aggregate_id)]
    pub order_id: i64,
    /// Who placed it.
    pub customer: String,
}

/// A day after an order: remind the customer to review it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.review_due", aggregate = "order", version = 1)]
pub struct ReviewDue {
    /// The order's id.
    #[event(aggregate_id)]
    pub order_id: i64,
    /// Who placed it.
    pub customer: String,
}

/// How long after an order its review reminder is due.
pub const REVIEW_AFTER: Duration = Duration::from_secs(24 * 3600);

/// The shop's tables.
pub async fn create_tables(db: &DatabaseConnection) -> Result<(), DbErr> {
    let schema = Schema::new(db.get_database_backend());
    db.execute(&schema.create_table_from_entity(order::Entity))
        .await?;
    db.execute(&schema.create_table_from_entity(stock::Entity))
        .await?;
    db.execute(&schema.create_table_from_entity(notice::Entity))
        .await?;
    Ok(())
}

/// Put `available` of `sku` in stock.
pub async fn add_stock(db: &DatabaseConnection, sku: &str, available: i64) -> Result<(), DbErr> {
    stock::ActiveModel {
        sku: Set(sku.to_owned()),
        available: Set(available),
    }
    .insert(db)
    .await?;
    Ok(())
}

/// How many of `sku` are available.
pub async fn available(db: &DatabaseConnection, sku: &str) -> Result<i64, DbErr> {
    Ok(stock::Entity::find_by_id(sku)
        .one(db)
        .await?
        .map_or(0, |s| s.available))
}

/// Place `order` in `tx`: the order's row, its `order.placed` event, and its review reminder a
/// day later. Committed (or not) with `tx`.
pub async fn place_order_in(tx: &OutboxTransaction, order: &OrderPlaced) -> Result<(), ShopError> {
    order::ActiveModel {
        id: Set(order.order_id),
        customer: Set(order.customer.clone()),
        sku: Set(order.sku.clone()),
        quantity: Set(order.quantity),
    }
    .insert(tx)
    .await?;
    tx.enqueue(order)?;
    tx.enqueue_after(
        &ReviewDue {
            order_id: order.order_id,
            customer: order.customer.clone(),
        },
        REVIEW_AFTER,
    )?;
    Ok(())
}

/// Place `order` in a transaction of its own.
pub async fn place_order(
    outbox: &Outbox,
    db: &DatabaseConnection,
    order: &OrderPlaced,
) -> Result<(), ShopError> {
    let tx = outbox.begin(db).await?;
    place_order_in(&tx, order).await?;
    let _report = tx.commit().await?;
    Ok(())
}

/// What placing an order can fail with.
#[derive(Debug)]
pub enum ShopError {
    /// The database refused.
    Db(DbErr),
    /// The outbox refused.
    Outbox(String),
}

impl std::fmt::Display for ShopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShopError::Db(e) => write!(f, "database: {e}"),
            ShopError::Outbox(e) => write!(f, "outbox: {e}"),
        }
    }
}

impl std::error::Error for ShopError {}

impl From<DbErr> for ShopError {
    fn from(e: DbErr) -> Self {
        ShopError::Db(e)
    }
}

impl From<OutboxError> for ShopError {
    fn from(e: OutboxError) -> Self {
        ShopError::Outbox(e.to_string())
    }
}

impl From<EnqueueError> for ShopError {
    fn from(e: EnqueueError) -> Self {
        ShopError::Outbox(e.to_string())
    }
}

/// Reserve the order's stock and say so; an order for more than is available fails for good
/// (its message goes DEAD, where an operator sees it).
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
    tx.enqueue(&StockReserved {
        order_id: event.order_id,
        customer: event.customer.clone(),
    })?;
    Ok(())
}

/// Confirm an order once its stock is reserved.
#[inbox_handler(consumer = "notification", backoff = "200ms")]
async fn send_confirmation(
    tx: &InboxTransaction,
    event: Event<StockReserved>,
) -> Result<(), HandlerError> {
    notice::ActiveModel {
        id: Set(format!("confirmation:{}", event.order_id)),
        customer: Set(event.customer.clone()),
        attempt: Set(event.meta().attempt.into()),
    }
    .insert(tx)
    .await?;
    Ok(())
}

/// Remind the customer to review the order.
#[inbox_handler(consumer = "notification", backoff = "200ms")]
async fn send_review_reminder(
    tx: &InboxTransaction,
    event: Event<ReviewDue>,
) -> Result<(), HandlerError> {
    notice::ActiveModel {
        id: Set(format!("reminder:{}", event.order_id)),
        customer: Set(event.customer.clone()),
        attempt: Set(event.meta().attempt.into()),
    }
    .insert(tx)
    .await?;
    Ok(())
}

/// The notices sent, by id.
pub async fn notices(db: &DatabaseConnection) -> Result<Vec<notice::Model>, DbErr> {
    notice::Entity::find().all(db).await
}
