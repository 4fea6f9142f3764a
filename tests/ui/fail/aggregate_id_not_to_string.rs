use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize)]
struct OrderId {
    value: i64,
}

#[derive(Serialize, DomainEvent)]
#[event(name = "order.placed", aggregate = "order")]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: OrderId,
}

fn main() {}
