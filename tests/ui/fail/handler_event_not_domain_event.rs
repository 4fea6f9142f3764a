use outbox::prelude::*;
use serde::Deserialize;

#[derive(Deserialize)]
struct OrderPlaced {
    order_id: i64,
}

#[inbox_handler(consumer = "inventory")]
async fn reserve_stock(tx: &InboxTransaction, event: Event<OrderPlaced>) -> Result<(), HandlerError> {
    let _ = (tx, event.order_id);
    Ok(())
}

fn main() {}
