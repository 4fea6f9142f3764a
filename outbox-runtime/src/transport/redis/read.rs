//! How a subscription fetches entries: new ones (`XREADGROUP … >`), its own pending ones after
//! a reconnection, idle ones claimed from the group (`XAUTOCLAIM`) with their delivery counts;
//! entries of other event types are acknowledged.

use std::time::Duration;

use ::redis::Value;
use tokio::time::Instant;

use super::{
    connection::Failure,
    reply::{Entry, Fields, parse_autoclaim_reply, parse_pending_entry, parse_read_reply},
    subscription::{Ready, RedisSubscription},
};

impl RedisSubscription {
    /// Acknowledges the entries of other event types.
    pub(super) async fn flush_skipped(&mut self) -> Result<(), Failure> {
        if self.to_ack.is_empty() {
            return Ok(());
        }
        let mut cmd = ::redis::cmd("XACK");
        cmd.arg(&self.ids.key)
            .arg(&self.ids.group)
            .arg(&self.to_ack);
        self.query(&cmd, self.command_timeout()).await?;
        self.to_ack.clear();
        Ok(())
    }

    /// `XREADGROUP … >`: entries never delivered to the group.
    pub(super) async fn read_new(&mut self, count: usize) -> Result<(), Failure> {
        let block = self
            .transport
            .inner
            .config
            .block
            .min(self.next_sweep.saturating_duration_since(Instant::now()))
            .max(Duration::from_millis(1));
        let mut cmd = ::redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.ids.group)
            .arg(&self.ids.consumer)
            .arg("COUNT")
            .arg(count)
            .arg("BLOCK")
            .arg(block.as_millis().max(1) as u64)
            .arg("STREAMS")
            .arg(&self.ids.key)
            .arg(">");
        let reply = self.query(&cmd, block + self.command_timeout()).await?;
        let entries = parse_read_reply(reply).map_err(Failure::Other)?;
        let ready = entries
            .into_iter()
            .filter_map(|entry| self.triage(entry))
            .map(|(id, fields)| Ready {
                id,
                fields,
                delivery_count: 1,
            })
            .collect();
        self.accept(ready);
        self.flush_skipped().await
    }

    /// `XREADGROUP … <from>`: this consumer's own pending entries, after a reconnection.
    pub(super) async fn reread(&mut self, from: &str, count: usize) -> Result<(), Failure> {
        let mut cmd = ::redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.ids.group)
            .arg(&self.ids.consumer)
            .arg("COUNT")
            .arg(count)
            .arg("STREAMS")
            .arg(&self.ids.key)
            .arg(from);
        let reply = self.query(&cmd, self.command_timeout()).await?;
        let entries = parse_read_reply(reply).map_err(Failure::Other)?;
        self.reread_from = match entries.last() {
            Some(last) if entries.len() >= count => Some(last.id.clone()),
            _ => None,
        };
        let mut lost = Vec::new();
        let mut wanted = Vec::new();
        for entry in entries {
            if self.held.contains(&entry.id) {
                // Handed out before the connection failed and not settled yet.
                continue;
            }
            if entry.fields.is_none() {
                lost.push(entry.id.clone());
            }
            if let Some(item) = self.triage(entry) {
                wanted.push(item);
            }
        }
        if !lost.is_empty() {
            tracing::warn!(
                stream = %self.ids.key,
                group = %self.ids.group,
                count = lost.len(),
                "pending entries were trimmed or deleted from the stream before being \
                 acknowledged: they are lost for this group (raise `max_len`?)"
            );
        }
        let ready = self.with_delivery_counts(wanted).await?;
        self.accept(ready);
        self.flush_skipped().await
    }

    /// `XAUTOCLAIM`: entries pending longer than `claim_idle`, in this group, for any consumer.
    pub(super) async fn sweep(&mut self, count: usize) -> Result<(), Failure> {
        let mut cmd = ::redis::cmd("XAUTOCLAIM");
        cmd.arg(&self.ids.key)
            .arg(&self.ids.group)
            .arg(&self.ids.consumer)
            .arg(self.claim_idle.as_millis().max(1) as u64)
            .arg(&self.claim_cursor)
            .arg("COUNT")
            .arg(count);
        let reply = self.query(&cmd, self.command_timeout()).await?;
        let (cursor, entries, deleted) = parse_autoclaim_reply(reply).map_err(Failure::Other)?;
        self.claim_cursor = cursor;
        if !deleted.is_empty() {
            tracing::warn!(
                stream = %self.ids.key,
                group = %self.ids.group,
                count = deleted.len(),
                "pending entries were trimmed or deleted from the stream before being \
                 acknowledged: they are lost for this group (raise `max_len`?)"
            );
        }
        let mut wanted = Vec::new();
        for entry in entries {
            if self.held.contains(&entry.id) {
                // Still held by this subscription: the claim just renewed it.
                continue;
            }
            if let Some(item) = self.triage(entry) {
                wanted.push(item);
            }
        }
        if !wanted.is_empty() {
            tracing::debug!(
                stream = %self.ids.key,
                group = %self.ids.group,
                consumer = %self.ids.consumer,
                count = wanted.len(),
                "claimed pending entries for redelivery"
            );
        }
        let ready = self.with_delivery_counts(wanted).await?;
        self.accept(ready);
        self.flush_skipped().await
    }

    /// Keeps entries of subscribed types (or without a type, which cannot be filtered), queues
    /// the others for acknowledgement.
    fn triage(&mut self, entry: Entry) -> Option<(String, Fields)> {
        let Some(fields) = entry.fields else {
            // Pending but gone from the stream: nothing to deliver, settle it.
            self.to_ack.push(entry.id);
            return None;
        };
        match &fields.event_type {
            Some(event_type) if !self.types.contains(event_type) => {
                self.to_ack.push(entry.id);
                None
            }
            _ => Some((entry.id, fields)),
        }
    }

    /// Looks up how often each entry was delivered (`XPENDING key group id id 1`, pipelined);
    /// entries no longer pending for this consumer (acknowledged or claimed by another one
    /// meanwhile) are left out.
    async fn with_delivery_counts(
        &mut self,
        entries: Vec<(String, Fields)>,
    ) -> Result<Vec<Ready>, Failure> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = ::redis::pipe();
        for (id, _) in &entries {
            pipe.cmd("XPENDING")
                .arg(&self.ids.key)
                .arg(&self.ids.group)
                .arg(id)
                .arg(id)
                .arg(1);
        }
        let timeout = self.command_timeout();
        let Some(conn) = self.conn.as_mut() else {
            return Err(Failure::Connection("not connected".to_owned()));
        };
        let replies =
            match tokio::time::timeout(timeout, pipe.query_async::<Vec<Value>>(conn)).await {
                Ok(Ok(replies)) => replies,
                Ok(Err(err)) => return Err(Failure::from_redis(err)),
                Err(_elapsed) => {
                    return Err(Failure::Connection(format!("no reply within {timeout:?}")));
                }
            };
        let mut ready = Vec::with_capacity(entries.len());
        for ((id, fields), reply) in entries.into_iter().zip(replies) {
            match parse_pending_entry(reply) {
                Some((owner, count)) if owner == self.ids.consumer => ready.push(Ready {
                    id,
                    fields,
                    delivery_count: count.max(1),
                }),
                _ => {}
            }
        }
        Ok(ready)
    }

    fn accept(&mut self, ready: Vec<Ready>) {
        for item in ready {
            self.held.insert(&item.id);
            self.buffer.push_back(item);
        }
    }
}
