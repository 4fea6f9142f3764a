//! The one path every delivery mode shares: run the handler in the transaction that records its
//! message, commit, or record the failure where the message lives (a new row for a delivery, a
//! fenced update for a claimed message), then count and log what happened.

use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use sea_orm::DbErr;
use tracing::Instrument;
use uuid::Uuid;

use super::{
    HandlerContext, HandlerError, HandlerRegistration, InboxTransaction, consumer::Consumer,
    stats::Counter,
};
use crate::{
    envelope::Envelope,
    store::{
        self, Failure,
        inbox::{InboxState, NewInboxRow},
    },
    telemetry::{self, Road},
    trace::TraceContext,
    transaction::OutboxTransaction,
};

/// Where a handler's run comes from: the road and destination its `process` span names.
#[derive(Debug, Clone, Copy)]
pub(super) struct Via<'a> {
    pub(super) road: Road,
    /// The subject, topic or stream it was delivered from; the event type for the worker.
    pub(super) destination: &'a str,
}

/// Where a failed message is recorded.
pub(super) enum Place<'a> {
    /// A delivery whose transaction rolled back: recorded as a new row.
    Delivered(&'a NewInboxRow<'a>),
    /// A message the worker claimed: its row, fenced by the claim token.
    Claimed {
        /// Row id.
        id: i64,
        /// The claim's token.
        token: Uuid,
    },
}

impl Consumer {
    /// The transaction a handler's attempt runs in.
    pub(super) fn attempt_tx(
        &self,
        tx: OutboxTransaction,
        message_id: &str,
        attempt: u32,
    ) -> InboxTransaction {
        InboxTransaction::new(
            tx,
            HandlerContext {
                consumer: self.name,
                message_id: message_id.to_owned(),
                attempt,
            },
        )
    }

    /// Run a handler inside `itx`, in a span carrying the event's identity and in the child of
    /// the producer's trace context (so events it enqueues continue the trace); a panic is
    /// turned into an error.
    pub(super) async fn run_handler(
        &self,
        reg: &HandlerRegistration,
        itx: &InboxTransaction,
        envelope: &Envelope,
        attempt: u32,
        via: Via<'_>,
    ) -> Result<(), HandlerError> {
        // A payload of an earlier version goes through the upcasters to the handler's.
        let upcast;
        let envelope =
            if reg.source.is_none() && envelope.schema_version.unwrap_or(1) != reg.schema_version {
                upcast = crate::upcast::Upcasters::linked()
                    .upcast(envelope, reg.schema_version)
                    .map_err(HandlerError::permanent)?;
                &upcast
            } else {
                envelope
            };
        // Over a set of databases, the handler learns which one it runs in (`EventMeta::database`).
        let named;
        let envelope = if !self.database.is_empty()
            && !envelope
                .extensions
                .contains_key(crate::envelope::DATABASE_EXTENSION)
        {
            let mut with_name = envelope.clone();
            with_name.extensions.insert(
                crate::envelope::DATABASE_EXTENSION.to_owned(),
                self.database.clone().into(),
            );
            named = with_name;
            &named
        } else {
            envelope
        };
        // External messages come from a webhook or `ExternalInbox::receive`.
        let system = if reg.source.is_some() {
            "webhook"
        } else {
            self.system
        };
        let span = telemetry::process_span(
            &telemetry::Consume {
                road: via.road,
                system,
                consumer: self.name,
                destination: via.destination,
                message_id: &envelope.id,
                event_type: &envelope.event_type,
                aggregate_id: envelope.subject.as_deref().unwrap_or(""),
            },
            attempt,
        );
        #[cfg(feature = "testing")]
        let injected = self
            .config
            .faults
            .as_ref()
            .and_then(|faults| faults.take(self.name, &envelope.event_type));
        #[cfg(feature = "testing")]
        let injected = match injected {
            Some(fault) if !fault.after_running => {
                telemetry::failed(&span, "retry");
                return Err(fault.error);
            }
            other => other,
        };
        let handler = AssertUnwindSafe((reg.handler)(itx, envelope, attempt)).catch_unwind();
        let parent = envelope
            .traceparent
            .as_deref()
            .and_then(|tp| TraceContext::new(tp, envelope.tracestate.clone()).ok());
        let span_handle = span.clone();
        let started = std::time::Instant::now();
        let outcome = match parent {
            // With OpenTelemetry the handler's own span is the child, and `enqueue` reads it.
            #[cfg(feature = "opentelemetry")]
            Some(parent) if crate::trace::otel::installed() => {
                crate::trace::otel::set_parent(&span, &parent);
                handler.instrument(span).await
            }
            Some(parent) => parent.child().scope(handler.instrument(span)).await,
            None => handler.instrument(span).await,
        };
        let took = started.elapsed();
        crate::metrics::handler_duration(self.name, &self.database, &envelope.event_type, took);
        #[cfg(feature = "testing")]
        let outcome = match (injected, outcome) {
            (Some(fault), Ok(Ok(()))) => Ok(Err(fault.error)),
            (_, outcome) => outcome,
        };
        let error_type = match &outcome {
            Ok(Ok(())) => None,
            Ok(Err(e)) if e.is_permanent() => Some("permanent"),
            Ok(Err(_)) => Some("retry"),
            Err(_) => Some("panic"),
        };
        if let Some(error_type) = error_type {
            telemetry::failed(&span_handle, error_type);
        }
        telemetry::processed(system, self.name, took, error_type);
        match outcome {
            Ok(result) => result,
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a non-string panic payload".to_owned());
                Err(HandlerError::retry(format!(
                    "handler `{}` panicked: {message}",
                    reg.function
                )))
            }
        }
    }

    /// Run the handler in `itx` and commit it. `Ok(Ok(()))` once committed (counted as
    /// handled); `Ok(Err(error))` when the handler or the commit failed and everything rolled
    /// back; `Err` only when a fault injected after the handler stops the process there.
    pub(super) async fn handle_and_commit(
        &self,
        reg: &HandlerRegistration,
        itx: InboxTransaction,
        envelope: &Envelope,
        via: Via<'_>,
    ) -> Result<Result<(), HandlerError>, DbErr> {
        let attempt = itx.context().attempt;
        let result = self.run_handler(reg, &itx, envelope, attempt, via).await;
        if result.is_ok() {
            failpoint!(error crate::failpoints::INBOX_AFTER_HANDLER);
        }
        let error = match result {
            Ok(()) => match itx.into_inner().commit().await {
                Ok(_) => {
                    self.count_handled(reg, envelope);
                    return Ok(Ok(()));
                }
                Err(e) => HandlerError::retry(format!("commit failed: {e}")),
            },
            Err(error) => {
                drop(itx); // roll back the handler's work and the inbox record
                error
            }
        };
        Ok(Err(error))
    }

    /// Count a message handled and committed, with the time from its producer's commit (its
    /// envelope's `time`) to now: the end-to-end figure per consumer. External messages carry
    /// their sender's time, not a commit's: they are counted without it.
    pub(super) fn count_handled(&self, reg: &HandlerRegistration, envelope: &Envelope) {
        self.count(Counter::handled);
        if reg.source.is_none()
            && let Some(time) = envelope.time
        {
            let age = (chrono::Utc::now() - time).to_std().unwrap_or_default();
            crate::metrics::end_to_end(self.name, &self.database, age);
        }
    }

    /// Record a failed attempt at `message_id` where it lives, then count it (a claimed message
    /// another worker took over meanwhile counts as stale) and, for a delivery, wake the worker
    /// that will retry it.
    pub(super) async fn record_failure(
        &self,
        place: Place<'_>,
        message_id: &str,
        failure: &Failure,
    ) -> Result<(), DbErr> {
        self.log_failure(message_id, failure);
        failpoint!(error crate::failpoints::INBOX_STORE_RETRY);
        match place {
            Place::Delivered(row) => {
                if self
                    .store(row, &InboxState::Failed(failure.clone()))
                    .await?
                {
                    self.count_failure(failure);
                    self.wake.notify_one();
                }
            }
            Place::Claimed { id, token } => {
                if store::inbox::mark_failed(&self.db, id, token, failure).await? {
                    self.count_failure(failure);
                } else {
                    self.count(Counter::stale);
                }
            }
        }
        Ok(())
    }

    /// Record a message as `state` in its own transaction. `false`: it was recorded already,
    /// and is counted as a duplicate or kept as a conflict (see `deliver::recorded_already`).
    pub(super) async fn store(
        &self,
        row: &NewInboxRow<'_>,
        state: &InboxState,
    ) -> Result<bool, DbErr> {
        if store::inbox::insert(&self.db, row, state).await? {
            return Ok(true);
        }
        self.recorded_already(row).await?;
        Ok(false)
    }

    pub(super) fn log_failure(&self, message_id: &str, failure: &Failure) {
        match failure {
            Failure::Dead { attempts, error } => tracing::error!(
                consumer = self.name, message_id, attempts, error = %error, "message is DEAD"
            ),
            Failure::Retry {
                attempts,
                delay,
                error,
            } => tracing::warn!(
                consumer = self.name, message_id, attempts, error = %error,
                retry_in = ?delay, "handler failed; will retry"
            ),
        }
    }

    pub(super) fn count_failure(&self, failure: &Failure) {
        self.count(if failure.is_dead() {
            Counter::dead
        } else {
            Counter::retried
        });
    }
}
