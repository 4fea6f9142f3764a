//! The worker: claims PENDING and due RETRY messages of the consumer (and PROCESSING ones whose
//! lease expired) with the same lease, fencing and per-aggregate rules as the relay, and handles
//! them: per aggregate in order, aggregates in parallel. It marks each DONE inside the handler's
//! transaction, fenced by its claim token, so a worker that lost its claim commits nothing.

use std::{collections::HashMap, sync::Arc};

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::{HandlerError, consumer::Consumer, settle::Place, stats::Counter};
use crate::{
    envelope::Envelope,
    health::LoopHealth,
    store::{self, claim::ClaimParams, inbox::ClaimedMessage},
};

/// Whether the worker goes on with the rest of a message's aggregate.
enum Outcome {
    Done,
    Failed,
}

impl Consumer {
    /// Claim and handle stored, retried and locally delivered messages until shutdown.
    pub(crate) async fn run_worker(
        self: Arc<Self>,
        shutdown: CancellationToken,
        health: Arc<LoopHealth>,
    ) {
        // Rounds in a row that found nothing since the last wake-up: the sleep backs off.
        let mut empty_claims = 0u32;
        let idle_max = self
            .config
            .idle_poll_interval
            .unwrap_or(self.config.poll_interval.saturating_mul(5));
        while !shutdown.is_cancelled() {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            self.pauses.refresh_if_due(&self.db).await;
            if self.pauses.consumer_paused(self.name) {
                // Paused: nothing claimed; the loop is alive and says so.
                health.success();
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(self.config.poll_interval) => {}
                }
                continue;
            }
            match self.work_once(&shutdown).await {
                Ok(claimed) => {
                    health.success();
                    if claimed >= self.config.batch_size {
                        empty_claims = 0;
                        continue;
                    }
                    empty_claims = match claimed {
                        0 => empty_claims.saturating_add(1),
                        _ => 0,
                    };
                }
                Err(e) => {
                    empty_claims = 0;
                    health.failure(&e.to_string());
                    tracing::warn!(consumer = self.name, error = %e, "inbox worker round failed; retrying");
                }
            }
            let sleep = self.idle_sleep(idle_max, empty_claims).await;
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = &mut notified => empty_claims = 0,
                _ = tokio::time::sleep(sleep) => {}
            }
        }
    }

    /// The sleep before the next round ([`idle_sleep`](crate::util::backoff::idle_sleep));
    /// when it would be longer than the poll interval, it ends by the earliest retry's due time
    /// (one statement; unknown on error).
    async fn idle_sleep(
        &self,
        idle_max: std::time::Duration,
        empty_claims: u32,
    ) -> std::time::Duration {
        use crate::util::backoff::idle_sleep;
        let poll = self.config.poll_interval;
        let backed_off = idle_sleep(poll, idle_max, empty_claims, None);
        if backed_off <= poll {
            return backed_off;
        }
        let next_due = store::inbox::next_retry_in(&self.db, self.name)
            .await
            .unwrap_or_default();
        idle_sleep(poll, idle_max, empty_claims, next_due)
    }

    /// One worker round: claim, handle per aggregate in order, aggregates in parallel.
    pub(crate) async fn work_once(
        &self,
        shutdown: &CancellationToken,
    ) -> Result<usize, sea_orm::DbErr> {
        let params = ClaimParams {
            owner: &self.worker_id,
            batch_size: self.config.batch_size,
            lease: self.config.lease,
            ordering: self.ordering,
            max_attempts: self.max_attempts(None),
        };
        // Where the claim's scans start (see `store/floor.rs`).
        let floor = store::floor::refresh(&self.floor, |from| {
            store::inbox::sample_floor(&self.db, self.name, from)
        })
        .await;
        let claim = store::inbox::claim_from(&self.db, self.name, &params, floor).await?;
        for _ in 0..claim.dead {
            self.count(Counter::dead);
        }
        let claimed = claim.messages.len() + claim.dead;
        if claim.messages.is_empty() {
            return Ok(claimed);
        }
        // Group by aggregate, keeping arrival order inside each group.
        let mut groups: Vec<Vec<ClaimedMessage>> = Vec::new();
        let mut index: HashMap<(String, String), usize> = HashMap::new();
        for message in claim.messages {
            match (&message.aggregate_type, &message.aggregate_id) {
                (Some(t), Some(id)) if self.ordering => {
                    let slot = *index.entry((t.clone(), id.clone())).or_insert_with(|| {
                        groups.push(Vec::new());
                        groups.len() - 1
                    });
                    groups[slot].push(message);
                }
                _ => groups.push(vec![message]),
            }
        }
        let token = claim.token;
        let released = futures_util::stream::iter(groups)
            .map(|group| async move {
                let mut rest = group.into_iter();
                let mut released = Vec::new();
                for message in rest.by_ref() {
                    if shutdown.is_cancelled() {
                        released.push(message);
                        break;
                    }
                    match self.handle_claimed(&message, token).await {
                        Outcome::Done => {}
                        Outcome::Failed => break,
                    }
                }
                released.extend(rest);
                released
            })
            .buffer_unordered(self.config.concurrency.max(1))
            .collect::<Vec<_>>()
            .await;
        let released: Vec<ClaimedMessage> = released.into_iter().flatten().collect();
        if !released.is_empty() {
            let ids: Vec<i64> = released.iter().map(|m| m.id).collect();
            let reclaimed: Vec<i64> = released
                .iter()
                .filter(|m| m.reclaimed)
                .map(|m| m.id)
                .collect();
            store::inbox::release(&self.db, token, &ids, &reclaimed).await?;
        }
        Ok(claimed)
    }

    async fn handle_claimed(&self, message: &ClaimedMessage, token: uuid::Uuid) -> Outcome {
        let attempt = message.attempts + 1;
        let (envelope, reg) = match self.claimed_handler(message) {
            Ok(found) => found,
            Err(error) => {
                self.fail_claimed(message, token, None, HandlerError::permanent(error))
                    .await;
                return Outcome::Failed;
            }
        };
        let tx = match self.outbox.begin(&self.db).await {
            Ok(tx) => tx,
            Err(e) => {
                self.fail_claimed(message, token, Some(reg), HandlerError::retry(e))
                    .await;
                return Outcome::Failed;
            }
        };
        // Fence first: the row stays locked by this transaction while the handler runs.
        match store::inbox::mark_done_seen(&tx, message.id, token, &self.rotation).await {
            Ok(true) => {}
            Ok(false) => {
                self.count(Counter::stale);
                tracing::warn!(consumer = self.name, message_id = %message.message_id, "message taken over by another worker; skipped");
                return Outcome::Failed;
            }
            Err(e) => {
                drop(tx);
                self.fail_claimed(message, token, Some(reg), HandlerError::retry(e))
                    .await;
                return Outcome::Failed;
            }
        }
        let itx = self.attempt_tx(tx, &message.message_id, attempt);
        let via = super::settle::Via {
            road: crate::telemetry::Road::Worker,
            destination: &envelope.event_type,
        };
        match self.handle_and_commit(reg, itx, &envelope, via).await {
            Ok(Ok(())) => Outcome::Done,
            Ok(Err(error)) => {
                self.fail_claimed(message, token, Some(reg), error).await;
                Outcome::Failed
            }
            // A fault injected after the handler: the process "died" there.
            Err(_) => Outcome::Failed,
        }
    }

    /// The envelope of a claimed message and the handler that takes it, or why it cannot be
    /// handled (its DEAD reason).
    fn claimed_handler(
        &self,
        message: &ClaimedMessage,
    ) -> Result<(Envelope, &'static super::HandlerRegistration), String> {
        if !message.origin.is_empty() {
            let envelope = external_envelope(message)?;
            let reg = self.external_handler(&message.origin, &envelope.event_type)?;
            return Ok((envelope, reg));
        }
        let envelope = Envelope::from_json(&message.payload)
            .map_err(|e| format!("undecodable message: {e}"))?;
        let reg = self.handler(&envelope)?;
        Ok((envelope, reg))
    }

    async fn fail_claimed(
        &self,
        message: &ClaimedMessage,
        token: uuid::Uuid,
        reg: Option<&super::HandlerRegistration>,
        error: HandlerError,
    ) {
        let failure = self.failure(reg, &error, message.attempts + 1);
        let place = Place::Claimed {
            id: message.id,
            token,
        };
        if let Err(e) = self
            .record_failure(place, &message.message_id, &failure)
            .await
        {
            #[cfg(feature = "failpoints")]
            if crate::failpoints::is_injected(&e) {
                return; // the process "died" here
            }
            tracing::warn!(consumer = self.name, error = %e, "could not record a handler failure; the lease will expire and the message be retried");
        }
    }
}

/// The envelope a handler of external messages gets: the stored body as its data, the message's
/// source, id and type, its ordering key as the subject, and its business key and kept headers
/// where [`EventMeta`](super::EventMeta) finds them. A body that is not JSON cannot be handed to
/// a handler: that is its DEAD reason, and the bytes stay for an operator.
fn external_envelope(message: &ClaimedMessage) -> Result<Envelope, String> {
    let message_type = message.event_type.clone().unwrap_or_default();
    let data = std::str::from_utf8(&message.payload)
        .map_err(|e| e.to_string())
        .and_then(|text| {
            serde_json::value::RawValue::from_string(text.to_owned()).map_err(|e| e.to_string())
        })
        .map_err(|e| {
            format!(
                "payload of `{message_type}` from `{}` is not JSON ({e}); kept with its bytes \
                 for an operator",
                message.origin
            )
        })?;
    let headers: serde_json::Map<String, serde_json::Value> = message
        .headers
        .as_deref()
        .and_then(|h| serde_json::from_str(h).ok())
        .unwrap_or_default();
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    };
    let (data_content_type, traceparent, tracestate) = (
        header("content-type"),
        header("traceparent"),
        header("tracestate"),
    );
    let mut extensions = std::collections::BTreeMap::new();
    if let Some(key) = &message.biz_key {
        extensions.insert(
            super::BUSINESS_KEY_EXTENSION.to_owned(),
            serde_json::Value::from(key.clone()),
        );
    }
    if !headers.is_empty() {
        extensions.insert(
            super::HEADERS_EXTENSION.to_owned(),
            serde_json::Value::Object(headers),
        );
    }
    Ok(Envelope {
        id: message.message_id.clone(),
        source: message
            .source
            .clone()
            .unwrap_or_else(|| message.origin.clone()),
        event_type: message_type,
        subject: message.aggregate_id.clone(),
        time: None,
        data_content_type,
        data_schema: None,
        data: Some(data),
        aggregate_type: None,
        aggregate_version: None,
        schema_version: None,
        traceparent,
        tracestate,
        extensions,
    })
}
