use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[event(name = "order.placed", aggregate = "order")]
struct OrderPlaced<T> {
    #[event(aggregate_id)]
    order_id: T,
}

fn main() {}
