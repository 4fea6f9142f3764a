//! Orders on PostgreSQL, relayed to NATS JetStream.
//!
//! ```sh
//! cargo run --example relay_nats --features postgres,nats
//! ```
//!
//! Uses `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`) and `NATS_URL`
//! (default `nats://127.0.0.1:4222`). Each order commits with its `order.placed` event; the relay,
//! woken by the commit, publishes the events to the stream `EXAMPLE` (subjects `example.>`) and
//! marks them SENT once JetStream confirmed them; a durable consumer then reads them back.

use std::{collections::HashSet, sync::Arc, time::Duration};

use outbox::prelude::*;
use outbox::relay::Relay;
use outbox::sea_orm::{ConnectionTrait, Database};
use outbox::transport::{SubscribeOptions, Transport, nats::NatsTransport};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", aggregate = "order", version = 1)]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: i64,
    customer: String,
    total_cents: i64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let nats_url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());

    let db = Database::connect(&database_url).await?;
    outbox::migrate(&db).await?;
    db.execute_unprepared(
        "CREATE TABLE IF NOT EXISTS example_orders (id BIGINT PRIMARY KEY, customer TEXT NOT NULL, total_cents BIGINT NOT NULL)",
    )
    .await?;
    let outbox = Outbox::new("order-service");
    let nats = NatsTransport::builder(&nats_url)
        .namespace("example")
        .connect()
        .await?;
    nats.setup().await?;
    let relay = Relay::new(db.clone(), Arc::new(nats.clone()))
        .with_outbox(&outbox)
        .spawn();

    // Read back what the relay publishes, as another service would.
    let mut subscription = nats
        .subscribe(
            "relay-example",
            &["order.placed".into()],
            &SubscribeOptions::default(),
        )
        .await?;

    let first_id: i64 = chrono::Utc::now().timestamp_micros();
    let mut expected = HashSet::new();
    let mut ids = Vec::new();
    for (i, customer) in ["ada", "grace", "linus", "barbara", "ken"]
        .into_iter()
        .enumerate()
    {
        let order_id = first_id + i as i64;
        let tx = outbox.begin(&db).await?;
        tx.execute_unprepared(&format!(
            "INSERT INTO example_orders (id, customer, total_cents) VALUES ({order_id}, '{customer}', {})",
            1_000 * (i + 1)
        ))
        .await?;
        let event_id = tx.enqueue(&OrderPlaced {
            order_id,
            customer: customer.into(),
            total_cents: 1_000 * (i as i64 + 1),
        })?;
        let _ = tx.commit().await?;
        expected.insert(event_id.to_string());
        ids.push(format!("'{event_id}'"));
        println!("committed order {order_id} for {customer} with event {event_id}");
    }

    while !expected.is_empty() {
        let delivery = tokio::time::timeout(Duration::from_secs(10), subscription.next())
            .await
            .map_err(|_| "no message from NATS within 10 s")?
            .ok_or("subscription closed")??;
        let envelope = Envelope::from_json(&delivery.body)?;
        if expected.remove(&envelope.id) {
            println!(
                "received {} {} subject={} data={}",
                envelope.event_type,
                envelope.id,
                delivery.subject,
                envelope.data.as_ref().map_or("null", |d| d.get())
            );
        }
        delivery.ack().await?;
    }
    relay.shutdown().await?; // finishes the round in flight: its events are marked by now
    let sent = db
        .query_one_raw(outbox::sea_orm::Statement::from_string(
            db.get_database_backend(),
            format!(
                "SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'SENT' AND event_id IN ({})",
                ids.join(", ")
            ),
        ))
        .await?
        .ok_or("no row")?
        .try_get::<i64>("", "n")?;
    println!("{sent} of 5 events published, confirmed by JetStream and marked SENT");
    if sent != 5 {
        return Err("some events are not SENT".into());
    }
    Ok(())
}
