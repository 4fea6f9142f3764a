//! The WAL relay (feature `postgres-wal`, PostgreSQL only): read committed events from the
//! database's write-ahead log by logical replication instead of polling the table.
//!
//! A publication carries the outbox table's inserts (`publish = 'insert'`); a logical slot with
//! `pgoutput` keeps the server's WAL until the relay confirms a position. The relay streams the
//! committed transactions in commit order on a task of its own, which holds the replication
//! connection and hands each batch to the relay's one loop (`relay/run.rs`); batch by batch:
//!
//! 1. checks the batch against the table in one statement ([`store::wal::check`]): a row that
//!    is no longer PENDING (replayed after a restart and SENT already, or claimed by a polling
//!    relay) is skipped; an event behind an unsent earlier event of its aggregate that is not in
//!    the batch (a RETRY, a DEAD, a backlog from before the slot) is left to the table, with the
//!    rest of its aggregate;
//! 2. publishes the others wave by wave per aggregate, exactly as the claim loop does (the
//!    same outage detection, the same RETRY and DEAD decisions);
//! 3. marks the confirmed ones SENT in bulk and writes failures, each only where the row is
//!    still PENDING (no claim, no PROCESSING write, no lease);
//! 4. then confirms the batch's end position to the slot. A crash between the broker's
//!    confirmation and this point replays the batch: the check skips what was marked SENT, and
//!    what was published but not marked goes again (the consumers' inboxes drop the copy).
//!
//! The rows stay the source of truth. The relay's claim loop keeps running beside the stream,
//! taking only PENDING rows older than [`WalConfig::table_grace`] and due retries: what the
//! stream left to the table, and anything the stream missed. When the slot is missing or
//! invalidated (its WAL is gone), the relay logs an error and becomes a polling relay, which
//! publishes every unsent row from the table; nothing is lost.

mod pgoutput;

use std::{
    collections::HashMap,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use futures_util::FutureExt;
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent, TlsConfig};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use self::pgoutput::{Message, Relations};
use super::{Relay, RoundReport, Source, WalReader};
use crate::{
    store::{
        self, OUTBOX_TABLE,
        relay::{Claim, ClaimedEvent},
    },
    transport::Transport,
};

/// How the WAL relay connects and where it keeps its position.
#[derive(Clone)]
#[non_exhaustive]
pub struct WalConfig {
    /// The database as a `postgres://user:password@host:port/database` URL (the same database
    /// the relay's connection uses); `sslmode=require`, `verify-ca` or `verify-full` in its
    /// query turn TLS on. The user needs the `REPLICATION` attribute (or to be a superuser)
    /// and the server `wal_level = logical`.
    pub(crate) url: String,
    /// The logical replication slot (created with `pgoutput` if missing). Its name starts with
    /// `outbox` (so that `outbox status` and `outbox doctor` report it) and is at most 63
    /// lowercase letters, digits and underscores. One relay streams from a slot at a time; a
    /// second one with the same slot waits as a standby and polls the table meanwhile.
    pub(crate) slot: String,
    /// The publication of the outbox table's inserts (created if missing).
    pub(crate) publication: String,
    /// The claim loop beside the stream takes PENDING rows only once they are this old (by the
    /// database's clock): younger ones are the stream's. Events the stream leaves to the table
    /// (behind a failed event of their aggregate) wait this long.
    pub(crate) table_grace: Duration,
    /// How often the relay reports its confirmed position to the server.
    pub(crate) feedback_interval: Duration,
}

impl std::fmt::Debug for WalConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry a password.
        f.debug_struct("WalConfig")
            .field("slot", &self.slot)
            .field("publication", &self.publication)
            .field("table_grace", &self.table_grace)
            .field("feedback_interval", &self.feedback_interval)
            .finish_non_exhaustive()
    }
}

impl WalConfig {
    /// Stream from `url` with the default slot `outbox_relay` and publication `outbox_events`.
    pub fn new(url: impl Into<String>) -> Self {
        WalConfig {
            url: url.into(),
            slot: "outbox_relay".into(),
            publication: "outbox_events".into(),
            table_grace: Duration::from_secs(5),
            feedback_interval: Duration::from_secs(1),
        }
    }

    /// Use slot `slot`.
    pub fn slot(mut self, slot: impl Into<String>) -> Self {
        self.slot = slot.into();
        self
    }

    /// Use publication `publication`.
    pub fn publication(mut self, publication: impl Into<String>) -> Self {
        self.publication = publication.into();
        self
    }

    /// How old a PENDING row must be before the claim loop beside the stream takes it.
    /// Default 5 s.
    pub fn table_grace(mut self, grace: Duration) -> Self {
        self.table_grace = grace;
        self
    }

    /// How often the relay reports its confirmed position to the server. Default 1 s.
    pub fn feedback_interval(mut self, interval: Duration) -> Self {
        self.feedback_interval = interval;
        self
    }

    /// The slot streamed from.
    pub fn slot_name(&self) -> &str {
        &self.slot
    }

    /// The publication streamed.
    pub fn publication_name(&self) -> &str {
        &self.publication
    }

    /// The replication connection's settings.
    fn replication(&self) -> Result<ReplicationConfig, String> {
        let url = url::Url::parse(&self.url).map_err(|e| format!("invalid WAL relay URL: {e}"))?;
        if !matches!(url.scheme(), "postgres" | "postgresql") {
            return Err("the WAL relay URL must start with postgres://".into());
        }
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| "the WAL relay URL is not valid UTF-8 once percent-decoded")
        };
        let mut config = ReplicationConfig::new(
            url.host_str().unwrap_or("localhost"),
            decode(url.username())?,
            decode(url.password().unwrap_or(""))?,
            decode(url.path().trim_start_matches('/'))?,
            self.slot.clone(),
            self.publication.as_str(),
        );
        config.port = url.port().unwrap_or(5432);
        config.tls = TlsConfig::disabled();
        for (key, value) in url.query_pairs() {
            if key == "sslmode" {
                config.tls = match value.as_ref() {
                    "disable" | "allow" | "prefer" => TlsConfig::disabled(),
                    "require" => TlsConfig::require(),
                    "verify-ca" => TlsConfig::verify_ca(None),
                    "verify-full" => TlsConfig::verify_full(None),
                    other => return Err(format!("unknown sslmode {other:?}")),
                };
            }
        }
        // Timestamps in UTC, in ISO format, whatever the server's defaults.
        config.options = Some("-c TimeZone=UTC -c DateStyle=ISO".into());
        config.status_interval = self.feedback_interval;
        config.idle_wakeup_interval = Duration::from_secs(10);
        config.application_name = Some(format!("outbox-wal-{}", self.slot));
        // Makes the client track positions confirmed but not yet reported (see `stream`).
        config.feedback_observer = Some(pgwire_replication::FeedbackObserver::new(|_| {}));
        Ok(config)
    }
}

/// A relay's WAL mode: its settings and whether it fell back to polling.
#[derive(Debug)]
pub(crate) struct WalMode {
    pub(crate) config: WalConfig,
    /// The slot is gone or cannot be streamed from: the relay polls the table.
    fallen_back: AtomicBool,
    /// The server's timeline when the slot was last made or found (see
    /// [`store::wal::timeline`]).
    timeline: std::sync::Mutex<Option<String>>,
}

impl WalMode {
    pub(crate) fn new(config: WalConfig) -> Self {
        WalMode {
            config,
            fallen_back: AtomicBool::new(false),
            timeline: std::sync::Mutex::new(None),
        }
    }

    /// The claim loop's minimum age of PENDING rows while the stream runs.
    pub(crate) fn pending_age(&self) -> Option<Duration> {
        (!self.fallen_back.load(Ordering::Relaxed)).then_some(self.config.table_grace)
    }

    /// Whether the relay polls the table instead of streaming.
    pub(crate) fn fallen_back(&self) -> bool {
        self.fallen_back.load(Ordering::Relaxed)
    }

    fn fall_back(&self, relay_id: &str, reason: &str) {
        self.fallen_back.store(true, Ordering::Relaxed);
        crate::metrics::wal_fallback(&self.config.slot);
        tracing::error!(
            relay = %relay_id, slot = %self.config.slot, reason,
            "the WAL relay cannot stream: it polls the outbox table from now on (every unsent \
             event is published from the table; nothing is lost). Fix the cause, drop the slot if \
             it is invalidated, and restart the relay to stream again"
        );
    }
}

/// Why a stream ended.
enum StreamEnd {
    /// Shutdown.
    Shutdown,
    /// The broker is unavailable: nothing confirmed past the last batch; stream again once it
    /// answers.
    Outage,
    /// The replication connection failed.
    Failed(String),
}

/// A committed transaction's outbox rows and the position after its commit.
struct Committed {
    events: Vec<ClaimedEvent>,
    end: Lsn,
}

/// What one replication session has read and not yet handed to the loop.
#[derive(Default)]
struct Reading {
    relations: Relations,
    /// The outbox rows of the transaction being read.
    open: Option<Vec<ClaimedEvent>>,
    /// Committed transactions not yet handed over, and their events.
    ready: Vec<Committed>,
    ready_events: usize,
}

impl Reading {
    /// Take in one message of the stream; `Ok(Some(position))` when everything up to it is
    /// done and may be confirmed now (nothing of the outbox is open or waiting).
    fn read(&mut self, event: ReplicationEvent, relay_id: &str) -> Result<Option<Lsn>, String> {
        match event {
            ReplicationEvent::Begin { .. } => self.open = Some(Vec::new()),
            ReplicationEvent::XLogData { data, .. } => {
                match pgoutput::decode(&data).map_err(|e| e.to_string())? {
                    Message::Relation { id, relation } => {
                        self.relations.insert(id, relation);
                    }
                    Message::Insert { relation, values } => {
                        let Some(relation) = self.relations.get(&relation) else {
                            return Err("an insert into a table the stream did not describe".into());
                        };
                        if relation.name != OUTBOX_TABLE {
                            return Ok(None);
                        }
                        match event_of(&relation.columns, values) {
                            Ok(event) => self.open.get_or_insert_with(Vec::new).push(event),
                            // The claim loop reads it from the table and decides.
                            Err(e) => tracing::warn!(
                                relay = %relay_id, error = %e,
                                "an outbox row read from the WAL cannot be decoded; it is left to the table"
                            ),
                        }
                    }
                    Message::Other => {}
                }
            }
            ReplicationEvent::Commit { end_lsn, .. } => {
                let events = self.open.take().unwrap_or_default();
                if events.is_empty() && self.ready.is_empty() {
                    return Ok(Some(end_lsn));
                }
                self.ready_events += events.len();
                self.ready.push(Committed {
                    events,
                    end: end_lsn,
                });
            }
            // Between transactions with nothing unpublished, everything up to the server's
            // position is done: confirm it, so that the slot does not hold WAL back while the
            // outbox is idle.
            ReplicationEvent::KeepAlive { wal_end, .. }
                if self.open.is_none() && self.ready.is_empty() && !wal_end.is_zero() =>
            {
                return Ok(Some(wal_end));
            }
            _ => {}
        }
        Ok(None)
    }
}

/// A batch the WAL reader hands to the relay's loop, and where the loop answers: `Ok(true)`
/// when the batch's end may be confirmed (see `Relay::publish_wal_batch`).
pub(super) struct WalBatch {
    batch: Vec<Committed>,
    done: oneshot::Sender<Result<bool, String>>,
}

/// The WAL relay as a source of the relay's loop: the task that reads the slot, and the batches
/// it hands over.
pub(super) struct WalSource {
    reader: tokio::task::JoinHandle<()>,
    batches: mpsc::Receiver<WalBatch>,
}

impl WalSource {
    /// The next batch read; `None` once the reader has stopped.
    pub(super) async fn next(&mut self) -> Option<WalBatch> {
        self.batches.recv().await
    }

    /// Wait for the reader to stop (at shutdown, after its last batch is answered).
    pub(super) async fn join(self) {
        let _ = self.reader.await;
    }
}

/// Hand `batch` to the relay's loop and wait for its answer; a loop that has stopped answers as
/// at shutdown (read the batch again).
async fn hand_over(
    batches: &mpsc::Sender<WalBatch>,
    batch: Vec<Committed>,
) -> Result<bool, String> {
    let (done, answer) = oneshot::channel();
    if batches.send(WalBatch { batch, done }).await.is_err() {
        return Ok(false);
    }
    answer.await.unwrap_or(Ok(false))
}

impl Relay {
    /// Start reading the slot until `shutdown`: its batches become a source of the loop.
    /// `None` without a WAL mode.
    pub(super) fn start_wal(&self, shutdown: &CancellationToken) -> Option<WalSource> {
        let mode = self.wal.clone()?;
        let relay = self.clone();
        let shutdown = shutdown.clone();
        let (sender, batches) = mpsc::channel(1);
        let reader = tokio::spawn(async move {
            relay.run_wal(&mode, &sender, &shutdown).await;
        });
        Some(WalSource { reader, batches })
    }

    /// The round that publishes and settles a batch the reader handed over, and answers it.
    pub(super) async fn wal_round(
        &self,
        transport: &dyn Transport,
        batch: WalBatch,
        shutdown: &CancellationToken,
    ) {
        let outcome = self
            .publish_wal_batch(transport, batch.batch, shutdown)
            .await;
        let _ = batch.done.send(outcome);
    }

    async fn run_wal(
        &self,
        mode: &WalMode,
        batches: &mpsc::Sender<WalBatch>,
        shutdown: &CancellationToken,
    ) {
        let relay_id = self.config.relay_id.as_str();
        self.stats.set_wal(WalReader::Starting);
        let replication = match mode.config.replication() {
            Ok(config) => config,
            Err(e) => return self.fall_back(mode, &e),
        };
        if let Err(e) = self.prepare_slot(mode).await {
            return self.fall_back(mode, &e);
        }
        let mut failures = 0u32;
        while !shutdown.is_cancelled() {
            if self.broker.is_down() {
                // The claim loop probes the broker; stream again when it answers.
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                }
            }
            let end = self.stream(&replication, batches, shutdown).await;
            if !matches!(end, StreamEnd::Shutdown) {
                self.stats.set_wal(WalReader::Reconnecting);
            }
            match end {
                StreamEnd::Shutdown => break,
                StreamEnd::Outage => failures = 0,
                StreamEnd::Failed(error) => {
                    // A missing or invalidated slot cannot be streamed from again.
                    let state = store::wal::slot(&self.db, &mode.config.slot).await;
                    match &state {
                        Ok(None) if self.promoted_since(mode).await => {
                            tracing::warn!(
                                relay = %relay_id, slot = %mode.config.slot, error = %error,
                                "the server was promoted since the slot was made (a failover): \
                                 making the slot anew on it; the claim loop publishes what the \
                                 old slot had not"
                            );
                            if let Err(e) = self.prepare_slot(mode).await {
                                return self.fall_back(mode, &e);
                            }
                            failures = 0;
                            continue;
                        }
                        Ok(None) => {
                            return self.fall_back(
                                mode,
                                &format!("the replication slot was dropped ({error})"),
                            );
                        }
                        Ok(Some(slot)) if slot.lost() => {
                            return self.fall_back(
                                mode,
                                &format!(
                                    "the replication slot is invalidated: the WAL it needs was removed ({error})"
                                ),
                            );
                        }
                        _ => {}
                    }
                    failures = failures.saturating_add(1);
                    let delay = self.config.probe.delay(failures);
                    if matches!(&state, Ok(Some(slot)) if slot.active) {
                        // Another relay streams from the slot: stand by (the claim loop polls)
                        // and take over when it goes.
                        tracing::debug!(
                            relay = %relay_id, slot = %mode.config.slot, retry_in = ?delay,
                            "another relay streams from the slot; standing by"
                        );
                    } else {
                        tracing::warn!(
                            relay = %relay_id, slot = %mode.config.slot, error = %error, retry_in = ?delay,
                            "the WAL stream ended; streaming again from the slot's confirmed position"
                        );
                    }
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    /// Poll the table from now on (see `WalMode::fall_back`), and say so in the stats.
    fn fall_back(&self, mode: &WalMode, reason: &str) {
        self.stats.set_wal(WalReader::Polling);
        mode.fall_back(&self.config.relay_id, reason);
    }

    /// Whether the server's timeline moved on since the slot was made or found: a standby
    /// was promoted, and the slot stayed behind on the old primary.
    async fn promoted_since(&self, mode: &WalMode) -> bool {
        let known = mode
            .timeline
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match (known, store::wal::timeline(&self.db).await) {
            (Some(known), Ok(now)) => known != now,
            _ => false,
        }
    }

    /// The publication and the slot, created where missing.
    async fn prepare_slot(&self, mode: &WalMode) -> Result<(), String> {
        let slot = &mode.config.slot;
        if !store::wal::valid_name(slot) || !slot.starts_with(store::wal::SLOT_PREFIX) {
            return Err(format!(
                "invalid slot name {slot:?}: it must start with {:?} and hold only lowercase \
                 letters, digits and underscores (at most 63)",
                store::wal::SLOT_PREFIX
            ));
        }
        let level = store::wal::wal_level(&self.db)
            .await
            .map_err(|e| e.to_string())?;
        if level != "logical" {
            return Err(format!(
                "the server runs with wal_level = {level}; the WAL relay needs wal_level = logical"
            ));
        }
        let timeline = store::wal::timeline(&self.db)
            .await
            .map_err(|e| e.to_string())?;
        *mode.timeline.lock().unwrap_or_else(|p| p.into_inner()) = Some(timeline);
        store::wal::ensure_publication(&self.db, &mode.config.publication)
            .await
            .map_err(|e| e.to_string())?;
        match store::wal::slot(&self.db, slot)
            .await
            .map_err(|e| e.to_string())?
        {
            Some(state) if state.lost() => Err(format!(
                "the replication slot {slot} is invalidated (wal_status = lost)"
            )),
            Some(state) => {
                tracing::info!(
                    relay = %self.config.relay_id, slot = %slot,
                    confirmed = state.confirmed_lsn.as_deref().unwrap_or("-"),
                    "the WAL relay streams from its existing slot"
                );
                Ok(())
            }
            None => {
                store::wal::create_slot(&self.db, slot)
                    .await
                    .map_err(|e| e.to_string())?;
                tracing::info!(relay = %self.config.relay_id, slot = %slot, "created the WAL relay's replication slot");
                Ok(())
            }
        }
    }

    /// One replication session: stream from the slot's confirmed position, hand batch by batch
    /// to the relay's loop, confirm each batch's end once the loop has settled it.
    async fn stream(
        &self,
        replication: &ReplicationConfig,
        batches: &mpsc::Sender<WalBatch>,
        shutdown: &CancellationToken,
    ) -> StreamEnd {
        let mut client = match ReplicationClient::connect(replication.clone()).await {
            Ok(client) => client,
            Err(e) => return StreamEnd::Failed(e.to_string()),
        };
        // Streaming once the server accepted START_REPLICATION (a standby relay is refused
        // here while another holds the slot).
        let started = tokio::select! {
            _ = shutdown.cancelled() => {
                client.abort();
                return StreamEnd::Shutdown;
            }
            started = client.wait_started() => started,
        };
        if let Err(e) = started {
            client.abort();
            return StreamEnd::Failed(e.to_string());
        }
        self.stats.set_wal(WalReader::Streaming);
        let batch_size = self.config.batch_size.max(1);
        let mut reading = Reading::default();
        let end = loop {
            // Take what arrived without waiting; wait only when nothing is ready to publish.
            let next = if reading.ready.is_empty() {
                tokio::select! {
                    _ = shutdown.cancelled() => break StreamEnd::Shutdown,
                    next = client.recv() => Some(next),
                }
            } else {
                client.recv().now_or_never()
            };
            let arrived = next.is_some();
            match next {
                Some(Ok(Some(event))) => match reading.read(event, &self.config.relay_id) {
                    Ok(Some(done)) => client.update_applied_lsn(done),
                    Ok(None) => {}
                    Err(e) => break StreamEnd::Failed(e),
                },
                Some(Ok(None)) => break StreamEnd::Failed("the server ended the stream".into()),
                Some(Err(e)) => break StreamEnd::Failed(e.to_string()),
                None => {}
            }
            // Hand over a full batch, or what is ready once nothing more has arrived.
            if reading.ready.is_empty() || (arrived && reading.ready_events < batch_size) {
                continue;
            }
            let batch = std::mem::take(&mut reading.ready);
            reading.ready_events = 0;
            let end = batch.last().map(|c| c.end).unwrap_or_default();
            match hand_over(batches, batch).await {
                Ok(true) => {
                    #[cfg(feature = "failpoints")]
                    if fail::eval(crate::failpoints::WAL_BEFORE_CONFIRM, |_| ()).is_some() {
                        // As if the process died here: the position is never confirmed.
                        client.abort();
                        return StreamEnd::Failed(
                            "failpoint: the WAL relay stopped before confirming".into(),
                        );
                    }
                    client.update_applied_lsn(end);
                }
                Ok(false) if shutdown.is_cancelled() => break StreamEnd::Shutdown,
                Ok(false) => break StreamEnd::Outage,
                Err(e) => break StreamEnd::Failed(e),
            }
        };
        // Report the confirmed position before leaving: the worker reports it within its status
        // interval, and its stop does not.
        let reported = async {
            while client.feedback_pending_since().is_some() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let _ = tokio::time::timeout(replication.status_interval * 2, reported).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), client.shutdown()).await;
        client.abort();
        end
    }

    /// Check, publish and settle one batch of committed transactions. `Ok(true)`: every event is
    /// published or left to the table, and the batch's end may be confirmed; `Ok(false)`: the
    /// broker is unavailable or the relay is stopping, and the batch must be read again.
    async fn publish_wal_batch(
        &self,
        transport: &dyn Transport,
        batch: Vec<Committed>,
        shutdown: &CancellationToken,
    ) -> Result<bool, String> {
        let mut events: Vec<ClaimedEvent> = batch.into_iter().flat_map(|c| c.events).collect();
        // A large transaction goes in chunks of a batch, in order: each chunk's check sees what
        // the chunks before it settled (a failure there holds its aggregate back here).
        let chunk = self.config.batch_size.max(1);
        while !events.is_empty() {
            let rest = events.split_off(chunk.min(events.len()));
            if !self.publish_wal_chunk(transport, events, shutdown).await? {
                return Ok(false);
            }
            events = rest;
        }
        Ok(true)
    }

    /// [`store::wal::check`] of rows read from the WAL. The server may stream a transaction a
    /// moment before other sessions see it committed: rows the check does not find are asked
    /// for again for a while (1, 2, 4 … ms, 250 ms in all). Rows still missing then were deleted
    /// (retention purges only SENT rows, an operator only finished ones).
    async fn check_visible(&self, ids: &[i64]) -> Result<Vec<store::wal::RowCheck>, String> {
        let check = |ids: Vec<i64>| async move {
            super::publish::with_transient_retries(|| store::wal::check(&self.db, &ids))
                .await
                .map_err(|e| e.to_string())
        };
        let mut checks = check(ids.to_vec()).await?;
        let mut delay = Duration::from_millis(1);
        let mut waited = Duration::ZERO;
        while checks.len() < ids.len() && waited < Duration::from_millis(250) {
            tokio::time::sleep(delay).await;
            waited += delay;
            delay = (delay * 2).min(Duration::from_millis(50));
            let found: std::collections::HashSet<i64> = checks.iter().map(|c| c.id).collect();
            let missing: Vec<i64> = ids
                .iter()
                .copied()
                .filter(|id| !found.contains(id))
                .collect();
            checks.extend(check(missing).await?);
        }
        Ok(checks)
    }

    /// One chunk of [`publish_wal_batch`](Self::publish_wal_batch): check, publish, settle.
    async fn publish_wal_chunk(
        &self,
        transport: &dyn Transport,
        events: Vec<ClaimedEvent>,
        shutdown: &CancellationToken,
    ) -> Result<bool, String> {
        let read = Instant::now();
        let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
        // Before the table is read: a promotion after this is seen by the standby wait.
        let before = self.timeline.seen();
        let checks = self.check_visible(&ids).await?;
        let (publish, left) = store::wal::choose(events, &checks, self.config.ordering);
        if left > 0 {
            crate::metrics::wal_left_to_table(transport.name(), left);
        }
        if publish.is_empty() {
            return Ok(true);
        }
        let claim = Claim {
            token: Uuid::nil(),
            claimed_at: publish.iter().map(|e| e.created_at).max(),
            events: publish,
            dead: Vec::new(),
            unreadable: 0,
            before,
        };
        let report = RoundReport {
            claimed: claim.events.len(),
            ..RoundReport::default()
        };
        let round = self
            .publish_step(transport, claim, report, read, shutdown, Source::Wal)
            .await
            .map_err(|e| e.to_string())?;
        Ok(round.outage.is_none() && !(shutdown.is_cancelled() && round.report.released > 0))
    }
}

/// An outbox row from an Insert's column values.
fn event_of(columns: &[String], values: Vec<Option<String>>) -> Result<ClaimedEvent, String> {
    let mut row = Row(columns
        .iter()
        .map(String::as_str)
        .zip(values)
        .collect::<HashMap<&str, Option<String>>>());
    let id = row.number("id")?;
    let event_id = row.required("event_id")?;
    let aggregate_version = match row.take("aggregate_version")? {
        Some(v) => Some(parse_number("aggregate_version", &v)?),
        None => None,
    };
    Ok(ClaimedEvent {
        id,
        event_id: Uuid::parse_str(&event_id).map_err(|e| format!("event_id: {e}"))?,
        source: row.required("source")?,
        event_type: row.required("event_type")?,
        schema_version: u32::try_from(row.number("schema_version")?).unwrap_or(0),
        aggregate_type: row.required("aggregate_type")?,
        aggregate_id: row.required("aggregate_id")?,
        aggregate_version,
        payload: row.json("payload")?,
        headers: row.json("headers")?,
        attempts: u32::try_from(row.number("attempts")?).unwrap_or(0),
        created_at: timestamp(&row.required("created_at")?)?,
        reclaimed: false,
    })
}

/// An Insert's values by column name.
struct Row<'a>(HashMap<&'a str, Option<String>>);

impl Row<'_> {
    fn take(&mut self, name: &str) -> Result<Option<String>, String> {
        self.0
            .remove(name)
            .ok_or_else(|| format!("the stream has no column {name}"))
    }

    fn required(&mut self, name: &str) -> Result<String, String> {
        self.take(name)?
            .ok_or_else(|| format!("column {name} is NULL"))
    }

    fn number(&mut self, name: &str) -> Result<i64, String> {
        parse_number(name, &self.required(name)?)
    }

    /// The claim loop reads JSONB as a value and writes it out again: the same bytes here.
    fn json(&mut self, name: &str) -> Result<String, String> {
        serde_json::from_str::<serde_json::Value>(&self.required(name)?)
            .map(|v| v.to_string())
            .map_err(|e| format!("column {name} is not JSON: {e}"))
    }
}

fn parse_number(name: &str, text: &str) -> Result<i64, String> {
    text.parse()
        .map_err(|_| format!("column {name} is not a number: {text:?}"))
}

/// A `timestamptz` in PostgreSQL's ISO output (the session runs in UTC): `2026-12-02
/// 10:00:00.123456+00`.
fn timestamp(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f%#z")
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("created_at {text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_timestamps_as_the_session_writes_them() {
        let t = timestamp("2026-12-02 10:00:00.123456+00").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-12-02T10:00:00.123456+00:00");
        assert!(timestamp("2026-12-02 10:00:00+00").is_ok());
        assert!(timestamp("yesterday").is_err());
    }

    #[test]
    fn reads_the_connection_from_a_url() {
        let config = WalConfig::new("postgres://app:p%40ss@db.internal:5433/shop?sslmode=require")
            .replication()
            .unwrap();
        assert_eq!(
            (config.host.as_str(), config.port, config.user.as_str()),
            ("db.internal", 5433, "app")
        );
        assert_eq!(
            (config.password.as_str(), config.database.as_str()),
            ("p@ss", "shop")
        );
        assert!(config.tls.mode.requires_tls());
        assert!(WalConfig::new("mysql://x/y").replication().is_err());
        assert!(
            format!("{:?}", WalConfig::new("postgres://a:secret@h/d"))
                .find("secret")
                .is_none()
        );
    }
}
