//! [`RedisAcker`]: settles one delivered entry, with `XACK` or, for a nack, a backdated
//! `XCLAIM` that a later claim sweep picks up.

use std::{sync::Arc, time::Duration};

use ::redis::{Cmd, Value};

use super::{
    RedisTransport, TRANSPORT,
    held::{Held, Ids},
};
use crate::transport::{Acker, TransportError};

/// Settles one entry: `XACK`, or a backdated `XCLAIM` for a nack.
pub(super) struct RedisAcker {
    pub(super) transport: RedisTransport,
    pub(super) ids: Arc<Ids>,
    pub(super) entry_id: String,
    pub(super) claim_idle: Duration,
    pub(super) timeout: Duration,
    pub(super) held: Arc<Held>,
}

impl RedisAcker {
    async fn run(&self, cmd: Cmd, what: &str) -> Result<Value, TransportError> {
        let error = |message: String| {
            TransportError::new(
                TRANSPORT,
                format!(
                    "{what} of entry `{}` (stream `{}`, group `{}`) failed: {message}",
                    self.entry_id, self.ids.key, self.ids.group
                ),
            )
        };
        let reply = self
            .transport
            .on_shared(self.timeout, |mut conn| async move {
                cmd.query_async::<Value>(&mut conn).await
            })
            .await;
        match reply {
            Some(Ok(value)) => Ok(value),
            Some(Err(err)) => Err(error(err.to_string())),
            None => Err(error(format!("no reply within {:?}", self.timeout))),
        }
    }
}

#[async_trait::async_trait]
impl Acker for RedisAcker {
    /// `XACK`; returns once Redis replied. An entry that was no longer pending (acknowledged
    /// through a redelivered copy) is fine.
    async fn ack(&self) -> Result<(), TransportError> {
        let mut cmd = ::redis::cmd("XACK");
        cmd.arg(&self.ids.key)
            .arg(&self.ids.group)
            .arg(&self.entry_id);
        let acked = self.run(cmd, "ack").await?;
        if matches!(acked, Value::Int(0)) {
            tracing::debug!(
                entry = %self.entry_id,
                group = %self.ids.group,
                "acked an entry that was no longer pending"
            );
        }
        self.held.release(&self.entry_id);
        Ok(())
    }

    /// Keeps the entry pending and backdates its last delivery to `claim_idle - delay` ago
    /// (`XCLAIM … IDLE … JUSTID`, which leaves the delivery count alone), so a claim sweep
    /// delivers it again once `delay` has passed; at most `claim_idle`.
    async fn nack(&self, delay: Option<Duration>) -> Result<(), TransportError> {
        // Released first: this subscription's own sweep must not skip the entry as held.
        self.held.release(&self.entry_id);
        let idle = self.claim_idle.saturating_sub(delay.unwrap_or_default());
        let mut cmd = ::redis::cmd("XCLAIM");
        cmd.arg(&self.ids.key)
            .arg(&self.ids.group)
            .arg(&self.ids.consumer)
            .arg(0)
            .arg(&self.entry_id)
            .arg("IDLE")
            .arg(idle.as_millis() as u64)
            .arg("JUSTID");
        self.run(cmd, "nack").await.map(|_| ())
    }
}

impl Drop for RedisAcker {
    fn drop(&mut self) {
        // Settled or dropped unsettled: either way no longer held (a dropped one is claimed
        // again after `claim_idle`).
        self.held.release(&self.entry_id);
    }
}
