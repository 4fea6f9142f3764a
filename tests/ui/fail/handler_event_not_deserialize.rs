use outbox::prelude::*;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[event(name = "order.placed", aggregate = "order")]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: i64,
}

#[inbox_handler(consumer = "inventory")]
async fn reserve_stock(tx: &InboxTransaction, event: Event<OrderPlaced>) -> Result<(), HandlerError> {
    let _ = (tx, event.order_id);
    Ok(())
}

fn main() {}
