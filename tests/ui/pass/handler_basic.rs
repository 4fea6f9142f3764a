// Every `#[inbox_handler]` submits a `HandlerRegistration`: the consumer, the event type and
// schema version taken from the event's `DomainEvent` impl, the options (`None` when not given),
// the wrapper the runtime calls, and where the handler was written.
use outbox::prelude::*;
use outbox::inbox::{HandlerMode, HandlerRegistration};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[event(name = "order.placed", aggregate = "order", version = 3)]
pub struct OrderPlaced {
    #[event(aggregate_id)]
    pub order_id: i64,
}

#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[event(name = "stock.reserved", aggregate = "order")]
pub struct StockReserved {
    #[event(aggregate_id)]
    pub order_id: i64,
}

#[inbox_handler(
    consumer = "inventory",
    max_attempts = 7,
    backoff = "250ms",
    backoff_cap = "2m",
    ordering = false,
    mode = "stored",
    crate = "outbox"
)]
async fn reserve_stock(
    tx: &InboxTransaction,
    event: Event<OrderPlaced>,
) -> Result<(), HandlerError> {
    // A follow-up event commits with the consumption.
    tx.enqueue(&StockReserved {
        order_id: event.order_id,
    })?;
    Ok(())
}

mod billing {
    use outbox::{inbox::{Event, HandlerError, InboxTransaction}, inbox_handler};

    /// Defaults: only the consumer is given.
    #[inbox_handler(consumer = "billing")]
    pub async fn charge(
        _tx: &InboxTransaction,
        event: Event<super::OrderPlaced>,
    ) -> Result<(), HandlerError> {
        if event.order_id < 0 {
            return Err(HandlerError::permanent("negative order id"));
        }
        Ok(())
    }
}

fn find(consumer: &str) -> &'static HandlerRegistration {
    let found: Vec<_> = outbox::__private01::inventory::iter::<HandlerRegistration>
        .into_iter()
        .filter(|registration| registration.consumer == consumer)
        .collect();
    assert_eq!(found.len(), 1, "{consumer}: {found:?}");
    found[0]
}

fn main() {
    let inventory = find("inventory");
    assert_eq!(inventory.event_type, "order.placed");
    assert_eq!(inventory.schema_version, 3);
    assert_eq!(inventory.max_attempts, Some(7));
    assert_eq!(inventory.backoff_base_ms, Some(250));
    assert_eq!(inventory.backoff_cap_ms, Some(120_000));
    assert_eq!(inventory.ordering, Some(false));
    assert_eq!(inventory.mode, HandlerMode::Stored);
    assert_eq!(inventory.function, "reserve_stock");
    assert_eq!(inventory.module_path, module_path!());
    assert_eq!(inventory.file, file!());
    assert_eq!(inventory.line, 22);

    let billing = find("billing");
    assert_eq!(billing.event_type, "order.placed");
    assert_eq!(billing.schema_version, 3);
    assert_eq!(billing.max_attempts, None);
    assert_eq!(billing.backoff_base_ms, None);
    assert_eq!(billing.backoff_cap_ms, None);
    assert_eq!(billing.ordering, None);
    assert_eq!(billing.mode, HandlerMode::Inline);
    assert_eq!(billing.function, "charge");
    assert_eq!(billing.module_path, concat!(module_path!(), "::billing"));
    assert_eq!(billing.line, 46);

    // The wrapper has the runtime's handler type, and the functions stay callable as written.
    let _: outbox::inbox::HandlerFn = inventory.handler;
    let _ = (reserve_stock, billing::charge);
}
