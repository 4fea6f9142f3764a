use outbox::prelude::*;
use outbox::inbox::{HandlerMode, HandlerRegistration};
use serde::Deserialize;

// A payment provider's JSON: no `DomainEvent`, only `Deserialize`.
#[derive(Deserialize)]
struct PaymentSucceeded {
    id: String,
    amount: i64,
}

#[inbox_handler(
    consumer = "billing",
    source = "acme-pay",
    message_type = "payment.succeeded",
    max_attempts = 4,
    ordering = false
)]
async fn settle(tx: &InboxTransaction, message: Event<PaymentSucceeded>) -> Result<(), HandlerError> {
    let _ = (tx, &message.id, message.amount, message.meta().business_key.as_deref());
    Ok(())
}

fn main() {
    let found: Vec<&HandlerRegistration> = outbox::__private01::inventory::iter::<HandlerRegistration>
        .into_iter()
        .filter(|r| r.consumer == "billing")
        .collect();
    assert_eq!(found.len(), 1);
    let billing = found[0];
    assert_eq!(billing.source, Some("acme-pay"));
    assert_eq!(billing.event_type, "payment.succeeded");
    assert_eq!(billing.schema_version, 0);
    assert_eq!(billing.mode, HandlerMode::Stored);
    assert_eq!(billing.max_attempts, Some(4));
    assert_eq!(billing.ordering, Some(false));
    assert_eq!(billing.function, "settle");
}
