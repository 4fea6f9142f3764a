use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[event(name = "order.changed", aggregate = "order")]
enum OrderChanged {
    Placed { order_id: i64 },
    Cancelled { order_id: i64 },
}

fn main() {}
