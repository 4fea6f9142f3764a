use outbox::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", aggregate = "order", version = 3)]
pub struct OrderPlaced {
    #[event(aggregate_id)]
    pub order_id: i64,
    #[event(dedup_key)]
    pub request_id: Option<String>,
    #[event(aggregate_version)]
    pub version: u64,
    pub order_no: String,
}

fn main() {
    assert_eq!(<OrderPlaced as DomainEvent>::EVENT_TYPE, "order.placed");
    assert_eq!(<OrderPlaced as DomainEvent>::AGGREGATE_TYPE, "order");
    assert_eq!(<OrderPlaced as DomainEvent>::SCHEMA_VERSION, 3);

    let event = OrderPlaced {
        order_id: 42,
        request_id: Some("req-7".to_owned()),
        version: 5,
        order_no: "A-1".to_owned(),
    };
    assert_eq!(event.aggregate_id(), "42");
    assert_eq!(event.dedup_key(), Some("req-7".to_owned()));
    assert_eq!(event.aggregate_version(), Some(5));
}
