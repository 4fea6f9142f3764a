use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[event(name = "", aggregate = "order")]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: i64,
}

fn main() {}
