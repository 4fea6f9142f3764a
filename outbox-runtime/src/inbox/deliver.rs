//! One broker delivery, handled inline: decode the CloudEvent; in one transaction insert
//! `(consumer, message_id)` (a duplicate is acked and counted, nothing else runs), run the
//! handler, commit; then ack. If the handler fails, the transaction rolls back, the message is
//! stored as RETRY (or DEAD) with its payload in a new transaction, and only then is the broker
//! acked: the worker is the one retry mechanism. A message that cannot be decoded, or that no
//! handler of this consumer takes, is stored DEAD with the raw bytes and a clear error, then
//! acked. A message behind an unfinished one of its aggregate, or for a handler in stored mode,
//! is stored PENDING for the worker. If even storing fails, the delivery is tried again in its
//! lane (later messages of its aggregate keep waiting behind it) and finally nacked, for the
//! broker to redeliver.
//!
//! **Duplicates and conflicts.** When `(consumer, message_id)` is already recorded, the stored
//! payload is compared with the delivered bytes: the same bytes are a duplicate (acked and
//! counted); different bytes are a conflict, kept as a DEAD row under
//! `{message_id}#conflict-{digest of the bytes}` for an operator, counted, logged and acked. A
//! redelivery of the same conflicting bytes finds that row and is a duplicate.

use std::time::Duration;

use sea_orm::DbErr;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{
    HandlerMode,
    consumer::{Consumer, inbox_row},
    digest::{digest, legacy_digest},
    settle::{Place, Via},
    stats::Counter,
};
use crate::{
    envelope::Envelope,
    error::OutboxError,
    store::{
        self, Failure,
        inbox::{InboxState, MAX_MESSAGE_ID_CHARS, NewInboxRow, Recorded},
    },
    telemetry::{self, Road},
    transport::Delivery,
    util::text::truncate,
};

/// First pause before recording a delivery again after a database error; doubled up to
/// [`RECORD_RETRY_CAP`].
const RECORD_RETRY_FIRST: Duration = Duration::from_millis(50);
const RECORD_RETRY_CAP: Duration = Duration::from_secs(5);
/// Attempts to record a delivery when the error is neither a lost connection nor a deadlock.
const RECORD_ATTEMPTS_ON_OTHER_ERRORS: u32 = 3;

impl Consumer {
    /// The consumer span of recording `delivery` (`envelope`: decoded, when it could be).
    pub(super) fn receive_span(
        &self,
        delivery: &Delivery,
        envelope: Option<&Envelope>,
    ) -> tracing::Span {
        let broker_id = delivery.message_id.as_deref().unwrap_or("");
        let span = telemetry::receive_span(&telemetry::Consume {
            road: Road::Consumer,
            system: self.system,
            consumer: self.name,
            destination: &delivery.subject,
            message_id: &envelope.map_or(broker_id, |e| e.id.as_str()),
            event_type: envelope.map_or("", |e| e.event_type.as_str()),
            aggregate_id: envelope.and_then(|e| e.subject.as_deref()).unwrap_or(""),
        });
        span.record("outbox.delivery_count", delivery.delivery_count);
        if envelope.is_none() {
            telemetry::failed(&span, "undecodable");
        }
        span
    }

    /// Record and handle one delivery, then ack it. When recording fails on the database, try
    /// again here, in the delivery's lane, so that later messages of its aggregate keep waiting
    /// behind it: while the database is unreachable (or the error is a deadlock) until it
    /// answers again or the runtime shuts down, otherwise a few times. Only then nack it for
    /// the broker to redeliver.
    pub(crate) async fn deliver(
        &self,
        delivery: Delivery,
        decoded: Result<Envelope, String>,
        shutdown: &CancellationToken,
    ) {
        telemetry::consumed(self.system, self.name, 1);
        let span = self.receive_span(&delivery, decoded.as_ref().ok());
        let before = self.learn_timeline().await;
        let mut delay = RECORD_RETRY_FIRST;
        let mut other_errors = 0;
        let settle = loop {
            let error = match self
                .process_delivery(&delivery, &decoded)
                .instrument(span.clone())
                .await
            {
                Ok(()) => {
                    failpoint!(crate::failpoints::INBOX_AFTER_COMMIT, ());
                    if let Some(why) = self.standbys_lag(before).await {
                        tracing::warn!(consumer = self.name, reason = %why, "a handled delivery is not acked yet; the broker redelivers it");
                        break delivery.nack(Some(Duration::from_secs(1))).await;
                    }
                    break delivery.ack().await;
                }
                Err(e) => e,
            };
            #[cfg(feature = "failpoints")]
            if crate::failpoints::is_injected(&error) {
                return; // the process "died" here: neither ack nor nack
            }
            self.count(Counter::unrecorded);
            let retry_here = store::is_transient(&error) || store::is_connection_error(&error);
            if !retry_here {
                other_errors += 1;
            }
            if shutdown.is_cancelled() || other_errors >= RECORD_ATTEMPTS_ON_OTHER_ERRORS {
                tracing::warn!(consumer = self.name, error = %error, "could not record a delivery; the broker will redeliver it");
                break delivery.nack(Some(Duration::from_secs(1))).await;
            }
            tracing::warn!(
                consumer = self.name, error = %error, retry_in = ?delay,
                "could not record a delivery; trying again (later messages of its aggregate wait)"
            );
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(RECORD_RETRY_CAP);
        };
        if let Err(e) = settle {
            tracing::warn!(consumer = self.name, error = %e, "could not settle a delivery with the broker");
        }
    }

    /// Before recording what [`standbys_lag`](Self::standbys_lag) will wait for: what is known
    /// of the server's timeline (learnt first if nothing is), so that a promotion in between is
    /// seen.
    pub(super) async fn learn_timeline(&self) -> store::standby::Seen {
        if self.config.wait_for_standbys > 0
            && self.timeline.seen() == store::standby::Seen::UNKNOWN
            && let Err(e) = self.timeline.learn(&self.db).await
        {
            tracing::debug!(consumer = self.name, error = %e, "could not ask the primary for its timeline");
        }
        self.timeline.seen()
    }

    /// With [`InboxConfig::wait_for_standbys`](super::InboxConfig::wait_for_standbys), why
    /// what was just committed, having known `before` of the timeline beforehand, must not be
    /// acked (it may not be on enough standbys); `None` to ack.
    pub(super) async fn standbys_lag(&self, before: store::standby::Seen) -> Option<String> {
        store::standby::not_held(
            &self.db,
            self.config.wait_for_standbys,
            &self.timeline,
            before,
        )
        .await
    }

    async fn process_delivery(
        &self,
        delivery: &Delivery,
        decoded: &Result<Envelope, String>,
    ) -> Result<(), DbErr> {
        let envelope = match decoded {
            Ok(envelope) => envelope,
            Err(error) => return self.store_undecodable(delivery, error).await,
        };
        let row = inbox_row(self.name, envelope, &delivery.body);

        let reg = match self.handler(envelope) {
            Ok(reg) => reg,
            Err(error) => {
                let failure = Failure::Dead {
                    attempts: 0,
                    error: error.clone(),
                };
                if self.store(&row, &InboxState::Failed(failure)).await? {
                    tracing::error!(consumer = self.name, message_id = %envelope.id, %error, "message stored as DEAD");
                    self.count(Counter::dead);
                }
                return Ok(());
            }
        };

        if self.mode == HandlerMode::Stored {
            if self.store(&row, &InboxState::Pending).await? {
                self.count(Counter::stored);
                self.wake.notify_one();
            }
            return Ok(());
        }

        // Inline: record and handle in one transaction. The row is recorded PENDING instead
        // when an unfinished message of its aggregate waits (one statement where the dialect
        // can: the look-up is part of the INSERT).
        let tx = self
            .outbox
            .begin(&self.db)
            .await
            .map_err(OutboxError::into_db_err)?;
        let recorded = store::inbox::record_batch_seen(
            &tx,
            std::slice::from_ref(&row),
            self.ordering,
            &self.rotation,
        )
        .await?
        .pop();
        match recorded {
            Some(Recorded::Done) => {}
            Some(Recorded::Pending) => {
                let _ = tx.commit().await.map_err(OutboxError::into_db_err)?;
                self.count(Counter::stored);
                self.wake.notify_one();
                return Ok(());
            }
            Some(Recorded::Duplicate) | None => {
                tx.rollback().await.map_err(OutboxError::into_db_err)?;
                return self.recorded_already(&row).await;
            }
        }
        let itx = self.attempt_tx(tx, &envelope.id, 1);
        let via = Via {
            road: Road::Consumer,
            destination: &delivery.subject,
        };
        let Err(error) = self.handle_and_commit(reg, itx, envelope, via).await? else {
            return Ok(());
        };
        let failure = self.failure(Some(reg), &error, 1);
        self.record_failure(Place::Delivered(&row), &envelope.id, &failure)
            .await
    }

    /// A delivery that is not a CloudEvent: stored DEAD with its bytes, under the broker's
    /// message id when the table can hold it as it is, else `undecodable-{digest}`.
    async fn store_undecodable(&self, delivery: &Delivery, error: &str) -> Result<(), DbErr> {
        let broker_id = delivery.message_id.clone().filter(|id| {
            !id.is_empty() && !id.contains('\0') && id.chars().count() <= MAX_MESSAGE_ID_CHARS
        });
        let message_id = match broker_id {
            Some(id) => id,
            None => {
                // A redelivery of a body recorded under the earlier digest is that message.
                let legacy = format!("undecodable-{:016x}", legacy_digest(&delivery.body));
                if store::inbox::recorded(&self.db, self.name, "", &legacy)
                    .await?
                    .is_some()
                {
                    legacy
                } else {
                    format!("undecodable-{:016x}", digest(&delivery.body))
                }
            }
        };
        let row = NewInboxRow {
            consumer: self.name,
            message_id: &message_id,
            payload: &delivery.body,
            ..NewInboxRow::default()
        };
        let failure = Failure::Dead {
            attempts: 0,
            error: format!("undecodable message: {error}"),
        };
        if self.store(&row, &InboxState::Failed(failure)).await? {
            tracing::error!(consumer = self.name, message_id = %message_id, %error, "undecodable message stored as DEAD");
            self.count(Counter::dead);
        }
        Ok(())
    }

    /// `(consumer, message_id)` of `row` is recorded already. With the same payload this is a
    /// duplicate: counted, nothing else happens. With a different one, the delivery is kept as a
    /// DEAD row under `{message_id}#conflict-{digest of the bytes}` for an operator, counted as a
    /// conflict and logged; a redelivery of the same conflicting bytes finds that row and is a
    /// duplicate.
    pub(super) async fn recorded_already(&self, row: &NewInboxRow<'_>) -> Result<(), DbErr> {
        let first =
            store::inbox::recorded(&self.db, row.consumer, row.origin, row.message_id).await?;
        let first_status = match first {
            // Gone meanwhile (purged): nothing to compare with.
            None => None,
            Some(first) if first.payload == row.payload => None,
            Some(first) => Some(first.status),
        };
        let Some(first_status) = first_status else {
            self.count(Counter::duplicates);
            tracing::debug!(consumer = self.name, message_id = %row.message_id, "duplicate delivery suppressed");
            return Ok(());
        };
        let legacy = conflict_id(row.message_id, legacy_digest(row.payload));
        if store::inbox::recorded(&self.db, row.consumer, row.origin, &legacy)
            .await?
            .is_some()
        {
            self.count(Counter::duplicates);
            tracing::debug!(consumer = self.name, message_id = %row.message_id, kept_as = %legacy, "conflicting delivery seen before; suppressed");
            return Ok(());
        }
        let kept_as = conflict_id(row.message_id, digest(row.payload));
        let error = format!(
            "message id `{}` was already delivered with a different payload (the first delivery \
             is {first_status}); this one was not handled and is kept for an operator",
            row.message_id
        );
        // Without its aggregate: the kept copy must not hold later messages of it back.
        let conflict = NewInboxRow {
            message_id: &kept_as,
            aggregate_type: None,
            aggregate_id: None,
            aggregate_version: None,
            ..row.clone()
        };
        let state = InboxState::Failed(Failure::Dead {
            attempts: 0,
            error: error.clone(),
        });
        if store::inbox::insert(&self.db, &conflict, &state).await? {
            self.count(Counter::conflicts);
            tracing::error!(consumer = self.name, message_id = %row.message_id, kept_as = %kept_as, %error, "conflicting delivery stored as DEAD");
        } else {
            self.count(Counter::duplicates);
            tracing::debug!(consumer = self.name, message_id = %row.message_id, kept_as = %kept_as, "conflicting delivery seen before; suppressed");
        }
        Ok(())
    }
}

/// The message id a conflicting delivery is kept under: `{message_id}#conflict-{digest}`, the
/// id cut so that the digest always fits the column.
pub(super) fn conflict_id(message_id: &str, digest: u64) -> String {
    const SUFFIX_CHARS: usize = "#conflict-".len() + 16;
    let prefix = truncate(message_id, MAX_MESSAGE_ID_CHARS - SUFFIX_CHARS);
    format!("{prefix}#conflict-{digest:016x}")
}
