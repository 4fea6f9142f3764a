//! [`RabbitMqAcker`]: settles one delivery with `basic.ack` or a requeuing `basic.nack`, the
//! latter after a delay from a timer task.

use std::time::Duration;

use lapin::options::{BasicAckOptions, BasicNackOptions};

use super::TRANSPORT;
use crate::transport::{Acker, TransportError};

/// Settles one delivery. `basic.ack` and `basic.nack` have no reply in AMQP 0-9-1: the calls
/// return once the frame is handed to the connection.
pub(super) struct RabbitMqAcker {
    pub(super) acker: lapin::Acker,
    pub(super) queue: String,
}

impl RabbitMqAcker {
    fn settled(&self, what: &str, result: lapin::Result<bool>) -> Result<(), TransportError> {
        match result {
            Ok(true) => Ok(()),
            Ok(false) => Err(TransportError::new(
                TRANSPORT,
                format!(
                    "cannot {what} a delivery from queue `{}`: it was already settled, or its \
                     channel closed (then the broker redelivers it)",
                    self.queue
                ),
            )),
            Err(err) => Err(TransportError::new(
                TRANSPORT,
                format!(
                    "{what} of a delivery from queue `{}` failed: {err}",
                    self.queue
                ),
            )),
        }
    }
}

const REQUEUE: BasicNackOptions = BasicNackOptions {
    multiple: false,
    requeue: true,
};

#[async_trait::async_trait]
impl Acker for RabbitMqAcker {
    async fn ack(&self) -> Result<(), TransportError> {
        let result = self.acker.ack(BasicAckOptions::default()).await;
        self.settled("ack", result)
    }

    /// Requeues the message at once, or after `delay` from a timer task (the call then returns
    /// at once; the delivery keeps its prefetch slot until the nack is sent).
    async fn nack(&self, delay: Option<Duration>) -> Result<(), TransportError> {
        let Some(delay) = delay.filter(|delay| !delay.is_zero()) else {
            let result = self.acker.nack(REQUEUE).await;
            return self.settled("nack", result);
        };
        if !self.acker.usable() {
            return self.settled("nack", Ok(false));
        }
        let acker = self.acker.clone();
        let queue = self.queue.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            match acker.nack(REQUEUE).await {
                Ok(true) => {}
                Ok(false) => tracing::debug!(
                    queue = %queue,
                    "delayed nack skipped: the channel closed, so the broker redelivers anyway"
                ),
                Err(err) => tracing::warn!(queue = %queue, error = %err, "delayed nack failed"),
            }
        });
        Ok(())
    }
}
