use outbox::prelude::*;
use serde::Deserialize;

#[derive(Deserialize)]
struct PaymentSucceeded {}

#[inbox_handler(consumer = "billing", source = "acme-pay")]
async fn settle(_tx: &InboxTransaction, _message: Event<PaymentSucceeded>) -> Result<(), HandlerError> {
    Ok(())
}

#[inbox_handler(consumer = "billing", message_type = "payment.failed")]
async fn fail(_tx: &InboxTransaction, _message: Event<PaymentSucceeded>) -> Result<(), HandlerError> {
    Ok(())
}

#[inbox_handler(consumer = "billing", source = "", message_type = "payment.refunded", mode = "inline")]
async fn refund(_tx: &InboxTransaction, _message: Event<PaymentSucceeded>) -> Result<(), HandlerError> {
    Ok(())
}

fn main() {}
