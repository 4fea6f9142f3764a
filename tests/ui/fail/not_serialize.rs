use outbox::DomainEvent;

#[derive(Debug, DomainEvent)]
#[event(name = "order.placed", aggregate = "order")]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: i64,
}

fn main() {}
