use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[event(name = "order.placed", aggregate = "order")]
struct OrderPlaced {
    #[event(id)]
    order_id: i64,
}

fn main() {}
