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
use outbox::sea_orm::{
    ActiveModelTrait, ConnectionTrait, Database, ExprTrait, Schema, Set,
    sea_query::{Asterisk, Expr, Query},
};
use outbox::transport::{SubscribeOptions, Transport, nats::NatsTransport};
use serde::{Deserialize, Serialize};

/// The order service's orders.
mod example_order {
    use outbox::sea_orm; // the derives below expand to `sea_orm::…` paths
    use outbox::sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "example_orders")]
    pub(crate) struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: i64,
        pub customer: String,
        pub total_cents: i64,
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
    let mut create_orders =
        Schema::new(db.get_database_backend()).create_table_from_entity(example_order::Entity);
    db.execute(create_orders.if_not_exists()).await?;
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
        let total_cents = 1_000 * (i as i64 + 1);
        example_order::ActiveModel {
            id: Set(order_id),
            customer: Set(customer.into()),
            total_cents: Set(total_cents),
        }
        .insert(&tx)
        .await?;
        let event_id = tx.enqueue(&OrderPlaced {
            order_id,
            customer: customer.into(),
            total_cents,
        })?;
        let _ = tx.commit().await?;
        expected.insert(event_id.to_string());
        ids.push(event_id);
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
    // SELECT COUNT(*) AS n FROM outbox_event WHERE status = 'SENT' AND event_id IN ($1, $2, ...)
    let sent = Query::select()
        .expr_as(Expr::col(Asterisk).count(), "n")
        .from("outbox_event")
        .and_where(Expr::col("status").eq("SENT"))
        .and_where(Expr::col("event_id").is_in(ids))
        .to_owned();
    let sent = db
        .query_one(&sent)
        .await?
        .ok_or("no row")?
        .try_get::<i64>("", "n")?;
    println!("{sent} of 5 events published, confirmed by JetStream and marked SENT");
    if sent != 5 {
        return Err("some events are not SENT".into());
    }
    Ok(())
}
