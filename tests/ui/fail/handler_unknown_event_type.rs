use outbox::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", aggregate = "order")]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: i64,
}

#[inbox_handler(consumer = "inventory")]
async fn reserve_stock(tx: &InboxTransaction, event: Event<OrderPlacd>) -> Result<(), HandlerError> {
    let _ = (tx, event.order_id);
    Ok(())
}

fn main() {}
