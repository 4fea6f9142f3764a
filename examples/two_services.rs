//! Two services as two processes: an order service producing to a broker, and an inventory
//! service consuming from it, each with its own PostgreSQL connection.
//!
//! ```sh
//! F=postgres,nats,rabbitmq,redis
//! cargo run --example two_services --features $F -- consumer &   # waits for orders
//! cargo run --example two_services --features $F -- producer     # places 5 orders
//! BROKER=rabbitmq cargo run --example two_services --features $F -- consumer   # or redis
//! ```
//!
//! `BROKER` picks the transport: `nats` (default, `NATS_URL`, default `nats://127.0.0.1:4222`),
//! `rabbitmq` (`RABBITMQ_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`) or `redis`
//! (`REDIS_URL`, default `redis://127.0.0.1:6379/`). `DATABASE_URL` defaults to
//! `postgres://postgres@127.0.0.1:5432/test`. The producer's relay publishes each committed event
//! and marks it SENT once the broker confirmed it; the consumer records each message in its inbox
//! in the same transaction as its effect, so a redelivery is suppressed. The consumer exits after
//! handling 5 orders (or `-- consumer N`). With RabbitMQ start the consumer first: a broker only
//! keeps messages for queues that exist, and the consumer declares its queue.

use std::{sync::Arc, time::Duration};

use outbox::prelude::*;
use outbox::sea_orm::{ConnectionTrait, Database, DatabaseConnection};
use outbox::transport::{
    Transport, nats::NatsTransport, rabbitmq::RabbitMqTransport, redis::RedisTransport,
};
use serde::{Deserialize, Serialize};

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
    tx.execute_unprepared(&format!(
        "INSERT INTO example_reservation (order_id, sku, quantity) VALUES ({}, '{}', {})",
        event.order_id, event.sku, event.quantity
    ))
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
        other => return Err(format!("unknown BROKER `{other}`: nats, rabbitmq or redis").into()),
    };
    println!("using {broker}");
    Ok((db, transport))
}

async fn producer() -> Result<(), Box<dyn std::error::Error>> {
    let (db, transport) = connect().await?;
    db.execute_unprepared(
        "CREATE TABLE IF NOT EXISTS example_order (id BIGINT PRIMARY KEY, sku TEXT NOT NULL, quantity BIGINT NOT NULL)",
    )
    .await?;
    let runtime = Runtime::builder(db.clone())
        .source("order-service")
        .transport_arc(transport)
        .consumers(Vec::<String>::new()) // this process only produces
        .start()
        .await?;
    let first = chrono::Utc::now().timestamp_millis();
    let mut ids = Vec::new();
    for i in 0..5 {
        let order_id = first + i;
        let tx = runtime.outbox().begin(&db).await?;
        tx.execute_unprepared(&format!(
            "INSERT INTO example_order (id, sku, quantity) VALUES ({order_id}, 'kettle', {})",
            i + 1
        ))
        .await?;
        let id = tx.enqueue(&OrderPlaced {
            order_id,
            sku: "kettle".into(),
            quantity: i + 1,
        })?;
        let _ = tx.commit().await?;
        ids.push(format!("'{id}'"));
        println!("order-service: placed order {order_id} (event {id})");
    }
    let sql = format!(
        "SELECT COUNT(*) FROM outbox_event WHERE status = 'SENT' AND event_id IN ({})",
        ids.join(", ")
    );
    for _ in 0..200 {
        let row = db
            .query_one_raw(outbox::sea_orm::Statement::from_string(
                db.get_database_backend(),
                sql.clone(),
            ))
            .await?
            .ok_or("no row")?;
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
    db.execute_unprepared(
        "CREATE TABLE IF NOT EXISTS example_reservation (order_id BIGINT NOT NULL, sku TEXT NOT NULL, quantity BIGINT NOT NULL)",
    )
    .await?;
    let runtime = Runtime::builder(db)
        .source("inventory-service")
        .transport_arc(transport)
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
