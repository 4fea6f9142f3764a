use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[event(name = "order.placed", aggregate = "order")]
struct OrderPlaced {
    order_id: i64,
}

// The stub impl keeps uses of the type quiet: this is the only error.
fn enqueue<E: DomainEvent>(event: &E) -> String {
    event.aggregate_id()
}

fn main() {
    enqueue(&OrderPlaced { order_id: 1 });
}
