use outbox::DomainEvent;

#[derive(DomainEvent)]
#[event(name = "order.placed", aggregate = "order")]
union OrderPlaced {
    order_id: i64,
    order_no: u64,
}

fn main() {}
