use outbox::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", aggregate = "order")]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: i64,
}

#[inbox_handler(consumer = "inventory")]
async fn reserve_stock<E: DomainEvent>(tx: &InboxTransaction, event: Event<E>) -> Result<(), HandlerError> {
    let _ = (tx, event.aggregate_id());
    Ok(())
}

fn main() {}
