use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[event(name = "order.placed", aggregate = "order", version = 0)]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: i64,
}

fn main() {}
