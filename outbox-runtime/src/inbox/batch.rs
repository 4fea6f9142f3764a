//! Deliveries that have already arrived in a lane (up to [`InboxConfig::commit_batch`]),
//! recorded and handled in one transaction, each handler isolated as if in a savepoint of its
//! own: a failing handler rolls back only its own work, and its message is stored as RETRY (or
//! DEAD) in the same commit. One commit for several messages is what lets a consumer handle more
//! messages per second than the database commits transactions. The acks follow the commit.
//!
//! The whole batch is recorded before the first handler runs, by one statement where the
//! dialect allows: each message as DONE, or as PENDING behind an unfinished message of its
//! aggregate recorded before the batch; duplicates are told apart there. The batch first runs
//! without savepoints (a round trip per message saved); when a handler fails there, the
//! transaction rolls back and the batch runs again with a savepoint per handler, the failed
//! handler's failure recorded without running it again. After such a batch the next
//! [`CAREFUL_BATCHES`] take savepoints from the start, so a run of failures (a downstream
//! outage) costs no work twice. If the batch cannot be recorded, each of its deliveries goes the
//! single way ([`Consumer::deliver`]), which retries and finds what a commit that did happen
//! recorded.
//!
//! [`InboxConfig::commit_batch`]: super::InboxConfig::commit_batch

use std::{collections::HashSet, sync::atomic::Ordering};

use sea_orm::{ConnectionTrait, DbErr};
use tokio_util::sync::CancellationToken;

use super::{
    HandlerError, HandlerRegistration,
    consumer::{Consumer, inbox_row},
    stats::Counter,
};
use crate::{
    envelope::Envelope,
    error::OutboxError,
    store::{
        self, Failure,
        inbox::{InboxState, NewInboxRow, Recorded},
    },
    transport::Delivery,
};

/// Batches that take a savepoint per handler from the start after a batch whose pass without
/// savepoints met a failing handler.
const CAREFUL_BATCHES: u32 = 8;

/// A delivery a handler of this consumer runs inline: decoded, its handler found.
pub(super) struct Inline {
    pub(super) delivery: Delivery,
    pub(super) envelope: Envelope,
    pub(super) reg: &'static HandlerRegistration,
}

/// How a batch runs.
enum Pass {
    /// Without savepoints: stops at the first failing handler, rolls everything back and
    /// returns its index and error.
    Optimistic,
    /// A savepoint per handler; the failure the optimistic pass met (if any) is recorded without
    /// running that handler again.
    Savepoints(Option<(usize, HandlerError)>),
}

/// What became of one message of a committed batch.
enum Outcome {
    Handled,
    /// Stored PENDING behind an unfinished message of its aggregate.
    Stored,
    Failed(Failure),
    /// Recorded before this batch: a duplicate or a conflict, told apart after the commit.
    SeenBefore,
}

impl Consumer {
    /// Record and handle several deliveries in one transaction, then ack them all.
    pub(super) async fn deliver_batch(&self, run: Vec<Inline>, shutdown: &CancellationToken) {
        let spans: Vec<tracing::Span> = run
            .iter()
            .map(|inline| self.receive_span(&inline.delivery, Some(&inline.envelope)))
            .collect();
        let before = self.learn_timeline().await;
        match self.process_batch(&run).await {
            Ok(()) => {
                crate::telemetry::consumed(self.system, self.name, run.len());
                drop(spans);
                failpoint!(crate::failpoints::INBOX_AFTER_COMMIT, ());
                if let Some(why) = self.standbys_lag(before).await {
                    tracing::warn!(consumer = self.name, reason = %why, deliveries = run.len(), "handled deliveries are not acked yet; the broker redelivers them");
                    let nacks = run.into_iter().map(|inline| {
                        inline
                            .delivery
                            .nack(Some(std::time::Duration::from_secs(1)))
                    });
                    for settled in futures_util::future::join_all(nacks).await {
                        if let Err(e) = settled {
                            tracing::warn!(consumer = self.name, error = %e, "could not settle a delivery with the broker");
                        }
                    }
                    return;
                }
                let acks = run.into_iter().map(|inline| inline.delivery.ack());
                for settled in futures_util::future::join_all(acks).await {
                    if let Err(e) = settled {
                        tracing::warn!(consumer = self.name, error = %e, "could not settle a delivery with the broker");
                    }
                }
            }
            Err(error) => {
                #[cfg(feature = "failpoints")]
                if crate::failpoints::is_injected(&error) {
                    return; // the process "died" here: neither ack nor nack
                }
                // Each delivery is recorded again on its own, in a span of its own.
                for span in spans {
                    crate::telemetry::failed(&span, "database");
                }
                tracing::debug!(consumer = self.name, error = %error, deliveries = run.len(), "could not record a batch; recording its deliveries one by one");
                for inline in run {
                    self.deliver(inline.delivery, Ok(inline.envelope), shutdown)
                        .await;
                }
            }
        }
    }

    /// The batch's passes (see the module docs), counted once committed.
    async fn process_batch(&self, run: &[Inline]) -> Result<(), DbErr> {
        let careful = self
            .careful
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok();
        let failed = if careful {
            None
        } else {
            match self.handle_batch(run, Pass::Optimistic).await? {
                None => return Ok(()),
                Some(failed) => {
                    self.careful.store(CAREFUL_BATCHES, Ordering::Relaxed);
                    self.stats.batch_rerun();
                    Some(failed)
                }
            }
        };
        // With savepoints the pass never stops early.
        self.handle_batch(run, Pass::Savepoints(failed)).await?;
        Ok(())
    }

    /// One pass: `None` once committed, or the first failure of a pass without savepoints
    /// (everything rolled back).
    async fn handle_batch(
        &self,
        run: &[Inline],
        pass: Pass,
    ) -> Result<Option<(usize, HandlerError)>, DbErr> {
        let (savepoints, mut failed_before) = match pass {
            Pass::Optimistic => (false, None),
            Pass::Savepoints(failed) => (true, failed),
        };
        let mut tx = self
            .outbox
            .begin(&self.db)
            .await
            .map_err(OutboxError::into_db_err)?;
        let rows: Vec<NewInboxRow<'_>> = run
            .iter()
            .map(|inline| inbox_row(self.name, &inline.envelope, &inline.delivery.body))
            .collect();
        let recorded =
            store::inbox::record_batch_seen(&tx, &rows, self.ordering, &self.rotation).await?;
        // Aggregates whose later messages wait: recorded PENDING, or failed in this batch.
        let mut blocked = self.recorded_pending(run, &recorded);
        let mut outcomes = Vec::with_capacity(run.len());
        for (i, (inline, recorded)) in run.iter().zip(&recorded).enumerate() {
            let envelope = &inline.envelope;
            let aggregate = self.ordered_aggregate(envelope);
            match recorded {
                Recorded::Duplicate => {
                    outcomes.push(Outcome::SeenBefore);
                    continue;
                }
                Recorded::Pending => {
                    outcomes.push(Outcome::Stored);
                    continue;
                }
                Recorded::Done => {}
            }
            if aggregate.as_ref().is_some_and(|a| blocked.contains(a)) {
                // An earlier message of its aggregate failed in this batch.
                let state = InboxState::Pending;
                store::inbox::restate(&tx, self.name, &envelope.id, &state).await?;
                outcomes.push(Outcome::Stored);
                continue;
            }
            let error = match failed_before.take_if(|(at, _)| *at == i) {
                // Failed in the pass without savepoints: recorded as it failed, not run again.
                Some((_, error)) => error,
                None => {
                    let (back, result) = self.run_in_batch(tx, i, inline, savepoints).await?;
                    tx = back;
                    match result {
                        Ok(()) => {
                            failpoint!(error crate::failpoints::INBOX_AFTER_HANDLER);
                            outcomes.push(Outcome::Handled);
                            continue;
                        }
                        Err(error) if !savepoints => {
                            // Everything goes; the batch runs again with savepoints.
                            tx.rollback().await.map_err(OutboxError::into_db_err)?;
                            return Ok(Some((i, error)));
                        }
                        Err(error) => error,
                    }
                }
            };
            let failure = self.failure(Some(inline.reg), &error, 1);
            failpoint!(error crate::failpoints::INBOX_STORE_RETRY);
            // Recorded before the savepoint: still there, as DONE.
            let state = InboxState::Failed(failure.clone());
            store::inbox::restate(&tx, self.name, &envelope.id, &state).await?;
            outcomes.push(Outcome::Failed(failure));
            if let Some(aggregate) = aggregate {
                blocked.insert(aggregate); // later messages of it wait behind this one
            }
        }
        let _ = tx.commit().await.map_err(OutboxError::into_db_err)?;
        self.settle_batch(run, &rows, outcomes).await?;
        Ok(None)
    }

    /// The aggregates (with ordering) of the batch's messages recorded PENDING: their later
    /// messages in the batch wait behind them.
    fn recorded_pending(&self, run: &[Inline], recorded: &[Recorded]) -> HashSet<(String, String)> {
        run.iter()
            .zip(recorded)
            .filter(|(_, recorded)| **recorded == Recorded::Pending)
            .filter_map(|(inline, _)| self.ordered_aggregate(&inline.envelope))
            .collect()
    }

    /// Run the handler of the batch's message `at` in the batch's transaction. With
    /// `savepoints`, a failed handler's writes, events and after-commit callbacks are rolled
    /// back to its savepoint, and the batch's stay.
    async fn run_in_batch(
        &self,
        tx: crate::transaction::OutboxTransaction,
        at: usize,
        inline: &Inline,
        savepoints: bool,
    ) -> Result<
        (
            crate::transaction::OutboxTransaction,
            Result<(), HandlerError>,
        ),
        DbErr,
    > {
        // A savepoint per handler, never released: RELEASE would cost a round trip per
        // message, and the stack stays as deep as the batch is long.
        if savepoints {
            tx.execute_unprepared(&format!("SAVEPOINT outbox_inbox_{at}"))
                .await?;
        }
        let mark = tx.mark();
        let itx = self.attempt_tx(tx, &inline.envelope.id, 1);
        let result = self
            .run_handler(
                inline.reg,
                &itx,
                &inline.envelope,
                1,
                super::settle::Via {
                    road: crate::telemetry::Road::Consumer,
                    destination: &inline.delivery.subject,
                },
            )
            .await;
        let tx = itx.into_inner();
        if result.is_err() && savepoints {
            tx.execute_unprepared(&format!("ROLLBACK TO SAVEPOINT outbox_inbox_{at}"))
                .await?;
            tx.rewind(mark);
        }
        Ok((tx, result))
    }

    /// After a batch's commit: count what became of each message, wake the worker for what it
    /// must handle, and tell the duplicates from the conflicts.
    async fn settle_batch(
        &self,
        run: &[Inline],
        rows: &[NewInboxRow<'_>],
        outcomes: Vec<Outcome>,
    ) -> Result<(), DbErr> {
        let mut wake = false;
        let mut seen_before = Vec::new();
        for ((inline, row), outcome) in run.iter().zip(rows).zip(outcomes) {
            match outcome {
                Outcome::Handled => self.count_handled(inline.reg, &inline.envelope),
                Outcome::Stored => {
                    self.count(Counter::stored);
                    wake = true;
                }
                Outcome::Failed(failure) => {
                    self.log_failure(&inline.envelope.id, &failure);
                    self.count_failure(&failure);
                    wake = true;
                }
                Outcome::SeenBefore => seen_before.push(row),
            }
        }
        if wake {
            self.wake.notify_one();
        }
        for row in seen_before {
            self.recorded_already(row).await?;
        }
        Ok(())
    }
}
