// A handler may return its own error type: anything `std::error::Error + Send + Sync + 'static`
// converts into `HandlerError` (retried with backoff). `?` works on SeaORM calls with `tx`.
use outbox::prelude::*;
use outbox::sea_orm::ConnectionTrait;
use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Serialize, Deserialize, DomainEvent)]
#[event(name = "parcel.shipped", aggregate = "parcel")]
struct ParcelShipped {
    #[event(aggregate_id)]
    parcel_id: String,
    weight_grams: u32,
}

#[derive(Debug)]
enum ShippingError {
    Database(outbox::sea_orm::DbErr),
    TooHeavy(u32),
}

impl fmt::Display for ShippingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShippingError::Database(error) => write!(f, "database: {error}"),
            ShippingError::TooHeavy(grams) => write!(f, "{grams} g is too heavy"),
        }
    }
}

impl std::error::Error for ShippingError {}

impl From<outbox::sea_orm::DbErr> for ShippingError {
    fn from(error: outbox::sea_orm::DbErr) -> Self {
        ShippingError::Database(error)
    }
}

#[inbox_handler(consumer = "labels")]
async fn print_label(
    tx: &InboxTransaction,
    event: Event<ParcelShipped>,
) -> Result<(), ShippingError> {
    if event.weight_grams > 30_000 {
        return Err(ShippingError::TooHeavy(event.weight_grams));
    }
    tx.execute_unprepared("INSERT INTO label (parcel_id) VALUES ('x')")
        .await?;
    Ok(())
}

/// Through a type alias, and an error from the standard library.
type Outcome = Result<(), std::io::Error>;

#[inbox_handler(consumer = "archive")]
async fn archive(_tx: &InboxTransaction, event: Event<ParcelShipped>) -> Outcome {
    if event.parcel_id.is_empty() {
        return Err(std::io::Error::other("no parcel id"));
    }
    Ok(())
}

fn main() {
    let consumers: Vec<_> = outbox::__private01::inventory::iter::<outbox::inbox::HandlerRegistration>
        .into_iter()
        .map(|registration| (registration.consumer, registration.event_type))
        .collect();
    assert!(
        consumers.contains(&("labels", "parcel.shipped")),
        "{consumers:?}"
    );
    assert!(
        consumers.contains(&("archive", "parcel.shipped")),
        "{consumers:?}"
    );

    let error = HandlerError::from(ShippingError::TooHeavy(40_000));
    assert_eq!(error.to_string(), "40000 g is too heavy");
    assert!(!error.is_permanent());
    let _ = (print_label, archive);
}
