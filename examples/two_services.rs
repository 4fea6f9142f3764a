//! Two services as two processes: an order service producing to a broker, and an inventory
//! service consuming from it, each with its own PostgreSQL connection.
//!
//! ```sh
//! F=postgres,nats,rabbitmq,redis
//! cargo run --example two_services --features $F -- consumer &   # waits for orders
//! cargo run --example two_services --features $F -- producer     # places 5 orders
//! BROKER=rabbitmq cargo run --example two_services --features $F -- consumer   # or redis
//! BROKER=kafka cargo run --example two_services --features $F,kafka -- consumer
//! ```
//!
//! `BROKER` picks the transport: `nats` (default, `NATS_URL`, default `nats://127.0.0.1:4222`),
//! `rabbitmq` (`RABBITMQ_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`), `redis`
//! (`REDIS_URL`, default `redis://127.0.0.1:6379/`) or, with the `kafka` feature, `kafka`
//! (`KAFKA_BROKERS`, default `127.0.0.1:9092`; `scripts/kafka-broker start` runs one). `DATABASE_URL` defaults to
//! `postgres://postgres@127.0.0.1:5432/test`. The producer's relay publishes each committed event
//! and marks it SENT once the broker confirmed it; the consumer records each message in its inbox
//! in the same transaction as its effect, so a redelivery is suppressed. The consumer exits after
//! handling 5 orders (or `-- consumer N`). With RabbitMQ start the consumer first: a broker only
//! keeps messages for queues that exist, and the consumer declares its queue.

use std::{sync::Arc, time::Duration};

use outbox::prelude::*;
use outbox::sea_orm::{
    ActiveModelTrait, ConnectionTrait, Database, DatabaseConnection, DbErr, EntityTrait, ExprTrait,
    Schema, Set,
    sea_query::{Asterisk, Expr, Query},
};
use outbox::transport::{
    Transport, nats::NatsTransport, rabbitmq::RabbitMqTransport, redis::RedisTransport,
};
use serde::{Deserialize, Serialize};

/// The order service's orders.
mod example_order {
    use outbox::sea_orm; // the derives below expand to `sea_orm::…` paths
    use outbox::sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "example_order")]
    pub(crate) struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: i64,
        pub sku: String,
        pub quantity: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub(crate) enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

/// The inventory service's reservations, one per order.
mod example_reservation {
    use outbox::sea_orm;
    use outbox::sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "example_reservation")]
    pub(crate) struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub order_id: i64,
        pub sku: String,
        pub quantity: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub(crate) enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", aggregate = "order", version = 1)]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: i64,
    sku: String,
    quantity: i64,
}

#[inbox_handler(consumer = "inventory-example")]
async fn reserve(tx: &InboxTransaction, event: Event<OrderPlaced>) -> Result<(), HandlerError> {
    example_reservation::ActiveModel {
        order_id: Set(event.order_id),
        sku: Set(event.sku.clone()),
        quantity: Set(event.quantity),
    }
    .insert(tx)
    .await?;
    println!(
        "inventory: reserved {} x {} for order {} (event {}, attempt {})",
        event.quantity,
        event.sku,
        event.order_id,
        event.id(),
        event.meta().attempt
    );
    Ok(())
}

/// Creates an entity's table unless it exists.
async fn create_table<E: EntityTrait>(db: &DatabaseConnection, entity: E) -> Result<(), DbErr> {
    let mut create = Schema::new(db.get_database_backend()).create_table_from_entity(entity);
    db.execute(create.if_not_exists()).await?;
    Ok(())
}

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

async fn connect() -> Result<(DatabaseConnection, Arc<dyn Transport>), Box<dyn std::error::Error>> {
    let db = Database::connect(env(
        "DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    ))
    .await?;
    outbox::migrate(&db).await?;
    let broker = env("BROKER", "nats");
    let transport: Arc<dyn Transport> = match broker.as_str() {
        "nats" => Arc::new(
            NatsTransport::builder(env("NATS_URL", "nats://127.0.0.1:4222"))
                .namespace("two_services")
                .connect()
                .await?,
        ),
        "rabbitmq" => Arc::new(
            RabbitMqTransport::builder(env(
                "RABBITMQ_URL",
                "amqp://guest:guest@127.0.0.1:5672/%2f",
            ))
            .namespace("two_services")
            .connect()
            .await?,
        ),
        "redis" => Arc::new(
            RedisTransport::builder(env("REDIS_URL", "redis://127.0.0.1:6379/"))
                .namespace("two_services")
                .connect()
                .await?,
        ),
        #[cfg(feature = "kafka")]
        "kafka" => Arc::new(
            outbox::transport::kafka::KafkaTransport::builder(env(
                "KAFKA_BROKERS",
                "127.0.0.1:9092",
            ))
            .namespace("two_services")
            .connect()
            .await?,
        ),
        #[cfg(not(feature = "kafka"))]
        "kafka" => {
            return Err("BROKER=kafka needs the `kafka` feature (--features …,kafka)".into());
        }
        other => {
            return Err(format!("unknown BROKER `{other}`: nats, rabbitmq, redis or kafka").into());
        }
    };
    println!("using {broker}");
    Ok((db, transport))
}

async fn producer() -> Result<(), Box<dyn std::error::Error>> {
    let (db, transport) = connect().await?;
    create_table(&db, example_order::Entity).await?;
    let runtime = Runtime::builder(db.clone())
        .source("order-service")
        .transport(transport)
        .consumers(Vec::<String>::new()) // this process only produces
        .start()
        .await?;
    let first = chrono::Utc::now().timestamp_millis();
    let mut ids = Vec::new();
    for i in 0..5 {
        let order_id = first + i;
        let tx = runtime.outbox().begin(&db).await?;
        example_order::ActiveModel {
            id: Set(order_id),
            sku: Set("kettle".into()),
            quantity: Set(i + 1),
        }
        .insert(&tx)
        .await?;
        let id = tx.enqueue(&OrderPlaced {
            order_id,
            sku: "kettle".into(),
            quantity: i + 1,
        })?;
        let _ = tx.commit().await?;
        ids.push(id);
        println!("order-service: placed order {order_id} (event {id})");
    }
    // SELECT COUNT(*) FROM outbox_event WHERE status = 'SENT' AND event_id IN ($1, $2, ...)
    let sent = Query::select()
        .expr(Expr::col(Asterisk).count())
        .from("outbox_event")
        .and_where(Expr::col("status").eq("SENT"))
        .and_where(Expr::col("event_id").is_in(ids))
        .to_owned();
    for _ in 0..200 {
        let row = db.query_one(&sent).await?.ok_or("no row")?;
        if row.try_get_by_index::<i64>(0)? == 5 {
            println!("order-service: all 5 events confirmed by the broker and marked SENT");
            runtime.shutdown().await;
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    runtime.shutdown().await;
    Err("events were not published within 10 s".into())
}

async fn consumer(wanted: u64) -> Result<(), Box<dyn std::error::Error>> {
    let (db, transport) = connect().await?;
    create_table(&db, example_reservation::Entity).await?;
    let runtime = Runtime::builder(db)
        .source("inventory-service")
        .transport(transport)
        .without_relay() // this process only consumes
        .expect_consumers(["inventory-example"])
        .start()
        .await?;
    println!("inventory: waiting for {wanted} orders (start the producer)");
    loop {
        let handled = runtime
            .consumer_stats("inventory-example")
            .map_or(0, |s| s.handled);
        if handled >= wanted {
            break;
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
    runtime.shutdown().await;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("producer") => producer().await,
        Some("consumer") => {
            let wanted = args.next().map(|n| n.parse()).transpose()?.unwrap_or(5);
            consumer(wanted).await
        }
        _ => Err("usage: two_services producer | consumer [N]".into()),
    }
}
