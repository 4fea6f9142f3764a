use outbox::prelude::*;

struct PaymentSucceeded {
    amount: i64,
}

#[inbox_handler(consumer = "billing", source = "acme-pay", message_type = "payment.succeeded")]
async fn settle(tx: &InboxTransaction, message: Event<PaymentSucceeded>) -> Result<(), HandlerError> {
    let _ = (tx, message.amount);
    Ok(())
}

fn main() {}
