//! [`NatsAcker`]: settles one delivery; an ack is flushed to the connection without awaiting
//! the server, a nack awaits the server's answer.

use std::time::Duration;

use async_nats::{
    Client,
    jetstream::{self, AckKind},
};

use super::TRANSPORT;
use crate::transport::{Acker, TransportError};

/// Settles a delivery. An ack returns once it is written to the connection, not once the
/// server answered: a double ack would cost a round trip per message, and an ack lost on the way
/// only means a redelivery after `ack_wait`, which the inbox takes as a duplicate. The acks of a
/// batch settled together share one write. A nack waits for the server's answer.
pub(super) struct NatsAcker {
    pub(super) acker: jetstream::message::Acker,
    pub(super) client: Client,
}

#[async_trait::async_trait]
impl Acker for NatsAcker {
    async fn ack(&self) -> Result<(), TransportError> {
        self.acker
            .ack()
            .await
            .map_err(|err| TransportError::new(TRANSPORT, format!("ack failed: {err}")))?;
        self.client
            .flush()
            .await
            .map_err(|err| TransportError::new(TRANSPORT, format!("ack not written: {err}")))
    }

    async fn nack(&self, delay: Option<Duration>) -> Result<(), TransportError> {
        self.acker
            .double_ack_with(AckKind::Nak(delay))
            .await
            .map_err(|err| TransportError::new(TRANSPORT, format!("nack failed: {err}")))
    }
}
