// Every derive submits an `EventRegistration` with its names and where it was written.
use outbox::DomainEvent;
use outbox::registry::EventRegistration;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[event(name = "order.placed", aggregate = "order", version = 2)]
struct OrderPlaced {
    #[event(aggregate_id)]
    order_id: i64,
}

mod shipping {
    #[derive(serde::Serialize, outbox::DomainEvent)]
    #[event(name = "order.shipped", aggregate = "order")]
    pub struct OrderShipped {
        #[event(aggregate_id)]
        pub order_id: i64,
    }
}

fn find(event_type: &str) -> &'static EventRegistration {
    let found: Vec<_> = outbox::__private01::inventory::iter::<EventRegistration>
        .into_iter()
        .filter(|registration| registration.event_type == event_type)
        .collect();
    assert_eq!(found.len(), 1, "{event_type}: {found:?}");
    found[0]
}

fn main() {
    let placed = find("order.placed");
    assert_eq!(placed.aggregate_type, "order");
    assert_eq!(placed.schema_version, 2);
    assert_eq!(placed.rust_type, "OrderPlaced");
    assert_eq!(placed.module_path, module_path!());
    assert_eq!(placed.file, file!());
    assert_eq!(placed.line, 6);

    let shipped = find("order.shipped");
    assert_eq!(shipped.aggregate_type, "order");
    assert_eq!(shipped.schema_version, 1);
    assert_eq!(shipped.rust_type, "OrderShipped");
    assert_eq!(shipped.module_path, concat!(module_path!(), "::shipping"));
    assert_eq!(shipped.file, file!());
    assert_eq!(shipped.line, 14);

    let _ = (OrderPlaced { order_id: 1 }.aggregate_id(), shipping::OrderShipped { order_id: 2 });
}
