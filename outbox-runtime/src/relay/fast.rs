//! The fast path: publish a commit's events right after it, with the relay's claim loop as the
//! safety net.
//!
//! While a relay runs with an [`Outbox`] handle and a broker, it installs its fast path in the
//! handle. A commit through the handle then writes each event already claimed by the fast path
//! (PROCESSING, leased to the relay for [`RelayConfig::fast_path_lease`], under the fast path's
//! fencing token) unless an earlier event of its aggregate is still unsent, which the INSERT
//! itself checks; such an event is written PENDING and waits for the claim loop, so the
//! aggregate's order holds. After COMMIT the commit hands the rows it owns over, and the fast
//! path publishes them as a claim of its own: wave by wave per aggregate, SENT only on the
//! broker's confirmation, fenced by the token, failures to RETRY or DEAD exactly as the claim
//! loop decides them.
//!
//! The fast path is a source of the relay's one loop (`relay/run.rs`): the loop takes the
//! hand-overs up one batch at a time, beside its own claims, and publishes them through the same
//! `publish_step`.
//!
//! What the fast path does not finish is the claim loop's: a process that dies after COMMIT
//! leaves its rows leased until the lease ends, then the loop reclaims them like any expired
//! claim; rows released at shutdown or during a broker outage are PENDING again. While the
//! breaker is open, or when more events wait to be published than a few batches, commits write
//! PENDING. When the fast path marks events SENT that later events of their aggregates wait
//! behind, it wakes the relays.
//!
//! Whether such later events wait is a query after the mark, asked only when one may: a later
//! event of the aggregate is written PENDING by a commit that came after the published one's,
//! and such a commit wakes the relays (in this process through the handle, in another by
//! `NOTIFY`, which the relay's listener counts), as does the move of due delayed events. When
//! nothing woke them between the published commit and its mark, every later event is yet to
//! announce itself, and its wake-up finds the mark done: the query is not asked. Where another
//! process's commits cannot be heard (no listener, or it is reconnecting), it always is.
//!
//! [`RelayConfig::fast_path_lease`]: super::RelayConfig::fast_path_lease

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use sea_orm::DatabaseConnection;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{Relay, RoundReport, Source};
use crate::{
    outbox::{BeforeCommit, Handover, Outbox, WakeReceiver},
    store::{
        self,
        outbox::FastClaim,
        relay::{Claim, ClaimedEvent, Fence, Settlement},
    },
    transport::Transport,
};

/// A relay's fast path: commits through its outbox handle write their events already claimed
/// by it (see `store::outbox::FastClaim`) and, after COMMIT, hand the rows they own over to it
/// (the [`Handover`] the handle holds).
#[derive(Debug)]
pub(super) struct FastPath {
    /// Stored in `locked_by`.
    owner: String,
    /// The fencing token of every row the fast path owns.
    token: Uuid,
    /// How long a commit's rows stay leased to it.
    lease: Duration,
    /// The relay keeps per-aggregate order.
    ordering: bool,
    handoff: mpsc::UnboundedSender<Handoff>,
    /// The relay's breaker is open: commits write their events PENDING.
    broker_down: Arc<AtomicBool>,
    /// Events handed over and not yet taken up.
    queued: AtomicUsize,
    /// Above this many queued events, commits write PENDING and leave them to the relay.
    max_queued: usize,
    /// The relay's claim floor, which the INSERT's check for an unsent earlier event of the
    /// aggregate starts at.
    floor: Arc<std::sync::Mutex<store::floor::Floor>>,
    /// Wake-ups through the outbox handle (commits that wrote PENDING events).
    commits: WakeReceiver,
    /// What the relay's listener heard of other processes' commits.
    heard: Arc<store::notify::Heard>,
    /// The relay's knowledge of the server's timeline, for its standby wait.
    timeline: Arc<store::standby::Timeline>,
}

/// Events a commit owns, handed to the fast path.
#[derive(Debug)]
pub(super) struct Handoff {
    /// In id order.
    events: Vec<ClaimedEvent>,
    /// When the transaction committed, by this process's monotonic clock.
    committed: Instant,
    /// What the fast path knew before the commit.
    before: BeforeCommit,
}

impl FastPath {
    /// A fast path and the receiving end of its handoffs.
    fn new(
        relay: &Relay,
        outbox: &Outbox,
        max_queued: usize,
    ) -> (Arc<FastPath>, mpsc::UnboundedReceiver<Handoff>) {
        let (handoff, receiver) = mpsc::unbounded_channel();
        let fast = FastPath {
            owner: relay.config.relay_id.clone(),
            token: Uuid::new_v4(),
            lease: relay.config.fast_path_lease,
            ordering: relay.config.ordering,
            handoff,
            broker_down: relay.broker.down_flag(),
            queued: AtomicUsize::new(0),
            max_queued,
            floor: relay.floor.clone(),
            commits: outbox.subscribe(),
            heard: relay.heard.clone(),
            timeline: relay.timeline.clone(),
        };
        (Arc::new(fast), receiver)
    }

    /// The fast path took `n` handed-over events up.
    fn taken(&self, n: usize) {
        self.queued.fetch_sub(n, Ordering::Relaxed);
    }

    /// Every wake-up so far that may announce events written PENDING: commits through the
    /// handle, and what the listener heard; `None` while other processes' commits go unheard.
    fn signals(&self) -> Option<u64> {
        let heard = self.heard.count()?;
        Some(heard.wrapping_add(self.commits.count()))
    }
}

impl Handover for FastPath {
    fn available(&self) -> bool {
        !self.broker_down.load(Ordering::Relaxed)
            && self.queued.load(Ordering::Relaxed) < self.max_queued
            && !self.handoff.is_closed()
    }

    fn claim(&self) -> FastClaim<'_> {
        FastClaim {
            owner: &self.owner,
            token: self.token,
            lease: self.lease,
            ordering: self.ordering,
            floor: self.floor.lock().unwrap_or_else(|p| p.into_inner()).bound(),
        }
    }

    fn before_commit(&self) -> BeforeCommit {
        BeforeCommit {
            signals: self.signals(),
            timeline: self.timeline.seen(),
        }
    }

    fn hand_over(
        &self,
        db: &DatabaseConnection,
        events: Vec<ClaimedEvent>,
        before: BeforeCommit,
    ) -> bool {
        let n = events.len();
        self.queued.fetch_add(n, Ordering::Relaxed);
        let handoff = Handoff {
            events,
            committed: Instant::now(),
            before,
        };
        match self.handoff.send(handoff) {
            Ok(()) => true,
            Err(stopped) => {
                self.queued.fetch_sub(n, Ordering::Relaxed);
                release_stopped(db.clone(), self.token, stopped.0);
                false
            }
        }
    }
}

/// Hand rows a stopped fast path owns back as PENDING (fenced by its token), on a task of their
/// own. If this fails too, the relay takes them over when their lease ends.
fn release_stopped(db: DatabaseConnection, token: Uuid, handoff: Handoff) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let settlement = Settlement {
        released: handoff.events.iter().map(|e| e.id).collect(),
        ..Default::default()
    };
    runtime.spawn(async move {
        if let Err(e) = store::relay::settle(&db, Fence::Claim(token), &settlement).await {
            tracing::debug!(error = %e, "handing fast-path events back failed; the relay takes them over after their lease");
        }
    });
}

/// Events that may wait for the fast path, in batches: beyond, commits leave theirs to the
/// claim loop.
const QUEUED_BATCHES: usize = 8;

/// The fast path as a source of the relay's loop: what it publishes under (the [`FastPath`]
/// installed in the outbox handle, and the handle) and the commits' hand-overs.
pub(super) struct FastSource {
    fast: Arc<FastPath>,
    outbox: Outbox,
    receiver: mpsc::UnboundedReceiver<Handoff>,
}

impl FastSource {
    /// The next hand-over; `None` once every commit's hand-over is taken up after
    /// [`close`](Self::close).
    pub(super) async fn next(&mut self) -> Option<Handoff> {
        self.receiver.recv().await
    }

    /// Commits write PENDING again: the fast path leaves the handle, and what was handed over
    /// is still taken up (with the relay stopping, it is handed back).
    pub(super) fn close(&mut self) {
        self.outbox.remove_fast_path(self.fast.token);
        self.receiver.close();
    }
}

impl Relay {
    /// Install the fast path on the relay's outbox handle: its hand-overs become a source of
    /// the loop. `None` when it is off, there is no handle, or another relay's runs on it.
    pub(super) fn start_fast_path(&self) -> Option<FastSource> {
        if !self.config.fast_path {
            return None;
        }
        let outbox = self.outbox.clone()?;
        let (fast, receiver) = FastPath::new(
            self,
            &outbox,
            self.config.batch_size.max(1) * QUEUED_BATCHES,
        );
        if !outbox.install_fast_path(fast.clone() as Arc<dyn Handover>) {
            tracing::info!(
                relay = %self.config.relay_id,
                "another relay's fast path runs on this outbox handle; this relay only claims"
            );
            return None;
        }
        Some(FastSource {
            fast,
            outbox,
            receiver,
        })
    }

    /// Take `first` and whatever else waits up as one batch: the round that publishes and
    /// settles it.
    pub(super) fn take_up<'a>(
        &'a self,
        source: &mut FastSource,
        transport: &'a dyn Transport,
        first: Handoff,
        shutdown: &'a CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'a {
        let batch = gather(first, &mut source.receiver, self.config.batch_size);
        source.fast.taken(batch.events.len());
        let (fast, outbox) = (source.fast.clone(), source.outbox.clone());
        async move {
            self.publish_owned(&outbox, transport, &fast, batch, shutdown)
                .await
        }
    }

    /// Publish and settle the rows commits handed over, as one claim under the fast path's
    /// token; then wake the relays if events wait behind the ones marked SENT (asked only when
    /// something woke the relays since the commits, see the module docs), or if some were
    /// handed back.
    async fn publish_owned(
        &self,
        outbox: &Outbox,
        transport: &dyn Transport,
        fast: &FastPath,
        batch: Handoff,
        shutdown: &CancellationToken,
    ) {
        let ids: Vec<i64> = batch.events.iter().map(|e| e.id).collect();
        let signals = batch.before.signals;
        // Where each event stands in its aggregate, to ask afterwards what waits behind it.
        let places: Vec<store::relay::Place> = batch
            .events
            .iter()
            .map(|e| store::relay::Place {
                id: e.id,
                aggregate_type: e.aggregate_type.clone(),
                aggregate_id: e.aggregate_id.clone(),
            })
            .collect();
        let claim = Claim {
            token: fast.token,
            claimed_at: batch.events.iter().map(|e| e.created_at).max(),
            events: batch.events,
            dead: Vec::new(),
            unreadable: 0,
            before: batch.before.timeline,
        };
        let report = RoundReport {
            claimed: ids.len(),
            ..RoundReport::default()
        };
        crate::metrics::fast_path_events(transport.name(), self.database.as_deref(), ids.len());
        match self
            .publish_step(
                transport,
                claim,
                report,
                batch.committed,
                shutdown,
                Source::FastPath,
            )
            .await
        {
            Ok(round) => {
                let report = round.report;
                // Read after the mark: a wake-up from now on finds it done.
                let quiet = signals.is_some() && fast.signals() == signals;
                let wake = report.released + report.retried + report.dead > 0
                    || (report.sent > 0 && !quiet && self.followed(&places).await);
                if wake {
                    outbox.committed(&self.db);
                }
            }
            Err(e) if is_injected(&e) => {}
            Err(e) => {
                tracing::warn!(
                    relay = %self.config.relay_id, error = %e, events = ids.len(),
                    "the fast path could not settle its events; the relay takes them over after their lease"
                );
            }
        }
    }

    /// Whether events wait behind `places` in their aggregates (on error: assume so).
    async fn followed(&self, places: &[store::relay::Place]) -> bool {
        store::relay::followed(&self.db, places)
            .await
            .unwrap_or(true)
    }
}

/// `first` and whatever else is waiting, up to `limit` events, as one batch in id order.
fn gather(
    first: Handoff,
    receiver: &mut mpsc::UnboundedReceiver<Handoff>,
    limit: usize,
) -> Handoff {
    let mut batch = first;
    while batch.events.len() < limit {
        match receiver.try_recv() {
            Ok(more) => {
                batch.committed = batch.committed.min(more.committed);
                batch.before = batch.before.and(more.before);
                batch.events.extend(more.events);
            }
            Err(_) => break,
        }
    }
    batch.events.sort_by_key(|e| e.id);
    batch
}

/// Whether a round "died" at a failpoint: nothing more is written, as after a crash.
fn is_injected(error: &super::RelayError) -> bool {
    #[cfg(feature = "failpoints")]
    if let super::RelayError::Database(e) = error {
        return crate::failpoints::is_injected(e);
    }
    let _ = error;
    false
}
