use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[event(name = "order.placed", aggregate = "order")]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: i64,
    #[event(dedup_key)]
    request_id: String,
    #[event(dedup_key)]
    idempotency_key: String,
}

fn main() {}
