// Defaults: `version` is 1; without `dedup_key`/`aggregate_version` fields both methods return
// `None`; an `Option` dedup key that is `None` means "no key".
use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[event(name = "customer.renamed", aggregate = "customer")]
struct CustomerRenamed {
    #[event(aggregate_id)]
    customer_id: String,
    new_name: String,
}

#[derive(Serialize, DomainEvent)]
#[event(name = "payment.captured", aggregate = "payment", version = 2)]
struct PaymentCaptured {
    #[event(aggregate_id)]
    payment_id: u128,
    #[event(dedup_key)]
    idempotency_key: Option<String>,
    #[event(aggregate_version)]
    revision: Option<i32>,
}

fn main() {
    assert_eq!(<CustomerRenamed as DomainEvent>::SCHEMA_VERSION, 1);
    let renamed = CustomerRenamed {
        customer_id: "c-1".to_owned(),
        new_name: "Ada".to_owned(),
    };
    assert_eq!(renamed.aggregate_id(), "c-1");
    assert_eq!(renamed.dedup_key(), None);
    assert_eq!(renamed.aggregate_version(), None);
    let _ = renamed.new_name;

    assert_eq!(<PaymentCaptured as DomainEvent>::SCHEMA_VERSION, 2);
    let captured = PaymentCaptured {
        payment_id: 7,
        idempotency_key: None,
        revision: None,
    };
    assert_eq!(captured.aggregate_id(), "7");
    assert_eq!(captured.dedup_key(), None);
    assert_eq!(captured.aggregate_version(), None);

    let captured = PaymentCaptured {
        payment_id: 7,
        idempotency_key: Some("k".to_owned()),
        revision: Some(9),
    };
    assert_eq!(captured.dedup_key(), Some("k".to_owned()));
    assert_eq!(captured.aggregate_version(), Some(9));
}
