// Every mistake is reported at once, each on the token to change.
use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[event(name = "", aggregate = "order", version = 0, topic = "orders")]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: i64,
    #[event(aggregate_id)]
    customer_id: i64,
    #[event(dedup_key = true)]
    request_id: String,
}

fn main() {}
