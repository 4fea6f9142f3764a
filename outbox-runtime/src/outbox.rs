//! The [`Outbox`] handle: configuration, transactions, and the wake-up signals for relays.

use std::{
    fmt,
    sync::{Arc, Mutex, RwLock},
    time::{Duration, Instant},
};

use sea_orm::{ConnectionTrait, DatabaseConnection};
use tokio::sync::watch;
use uuid::Uuid;

use crate::store::{outbox::FastClaim, relay::ClaimedEvent};

/// Default PostgreSQL channel relays `LISTEN` on.
pub const DEFAULT_NOTIFY_CHANNEL: &str = "outbox_event";

/// Handle to the outbox of one service: begins [`OutboxTransaction`](crate::OutboxTransaction)s
/// (see `transaction.rs`) and wakes relays.
///
/// Cheap to clone; clones share configuration and wake-up signals.
///
/// ```no_run
/// # async fn demo(db: sea_orm::DatabaseConnection) -> Result<(), outbox_runtime::OutboxError> {
/// use outbox_runtime::Outbox;
/// let outbox = Outbox::builder("order-service").build();
/// let tx = outbox.begin(&db).await?;
/// // ... insert rows with `&tx`, `tx.enqueue(&event)?` ...
/// let report = tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Outbox {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) source: String,
    pub(crate) max_payload_bytes: usize,
    pub(crate) insert_batch_rows: usize,
    pub(crate) sqlite_immediate: bool,
    wake: watch::Sender<u64>,
    notify: Option<CrossProcessHint>,
    /// The fast path of the relay running on this handle, if one does.
    fast: RwLock<Option<Arc<dyn Handover>>>,
}

impl fmt::Debug for Outbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox")
            .field("source", &self.inner.source)
            .field("max_payload_bytes", &self.inner.max_payload_bytes)
            .field("insert_batch_rows", &self.inner.insert_batch_rows)
            .field(
                "notify_channel",
                &self.inner.notify.as_ref().map(|n| &n.channel),
            )
            .finish()
    }
}

/// Builder for [`Outbox`].
#[derive(Debug, Clone)]
pub struct OutboxBuilder {
    source: String,
    max_payload_bytes: usize,
    insert_batch_rows: usize,
    notify_channel: Option<String>,
    notify_interval: Duration,
    sqlite_immediate: bool,
}

impl OutboxBuilder {
    /// Largest serialized payload `enqueue` accepts. Default 1 MiB (NATS' default `max_payload`).
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// Rows per multi-row `INSERT` at commit (1 to 2,000; each backend's bind-parameter limit
    /// allows more). Default 500.
    pub fn insert_batch_rows(mut self, rows: usize) -> Self {
        self.insert_batch_rows = rows.clamp(1, 2_000);
        self
    }

    /// The PostgreSQL channel for the cross-process wake-up hint, `None` to send none.
    /// Default [`DEFAULT_NOTIFY_CHANNEL`]. Ignored on other backends.
    pub fn notify_channel(mut self, channel: Option<&str>) -> Self {
        self.notify_channel = channel.map(str::to_owned);
        self
    }

    /// At most one cross-process hint per this interval per process. Default 5 ms.
    ///
    /// A `NOTIFY` inside every transaction serializes commits; the hint is sent after commit, on
    /// its own connection, and coalesced.
    pub fn notify_interval(mut self, interval: Duration) -> Self {
        self.notify_interval = interval;
        self
    }

    /// Begin SQLite transactions with `BEGIN IMMEDIATE` (default `true`), so a transaction that
    /// reads before it writes cannot fail with `SQLITE_BUSY` on its first write.
    pub fn sqlite_immediate(mut self, immediate: bool) -> Self {
        self.sqlite_immediate = immediate;
        self
    }

    /// Build the handle.
    pub fn build(self) -> Outbox {
        let (wake, _) = watch::channel(0);
        let notify = self.notify_channel.and_then(|channel| {
            is_valid_channel(&channel).then(|| CrossProcessHint {
                sql: crate::store::notify::notify_statement(&channel),
                channel,
                interval: self.notify_interval,
                last: Mutex::new(None),
            })
        });
        Outbox {
            inner: Arc::new(Inner {
                source: self.source,
                max_payload_bytes: self.max_payload_bytes,
                insert_batch_rows: self.insert_batch_rows,
                sqlite_immediate: self.sqlite_immediate,
                wake,
                notify,
                fast: RwLock::new(None),
            }),
        }
    }
}

fn is_valid_channel(channel: &str) -> bool {
    let ok = !channel.is_empty()
        && channel.len() < 64
        && channel
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !channel.as_bytes()[0].is_ascii_digit();
    if !ok {
        tracing::warn!(
            channel,
            "outbox notify channel must be a lowercase SQL identifier; cross-process hints are off"
        );
    }
    ok
}

impl Outbox {
    /// A handle for the service `source` (the CloudEvents `source` of every event it enqueues,
    /// e.g. `order-service` or `/orders`) with default settings.
    pub fn new(source: impl Into<String>) -> Self {
        Self::builder(source).build()
    }

    /// Configure a handle for the service `source`.
    pub fn builder(source: impl Into<String>) -> OutboxBuilder {
        OutboxBuilder {
            source: source.into(),
            max_payload_bytes: 1024 * 1024,
            insert_batch_rows: 500,
            notify_channel: Some(DEFAULT_NOTIFY_CHANNEL.to_owned()),
            notify_interval: Duration::from_millis(5),
            sqlite_immediate: true,
        }
    }

    /// A handle with this one's settings, and its own wake-ups and fast path: one per
    /// database of a set (`fleet`).
    pub(crate) fn sibling(&self) -> Outbox {
        let inner = &self.inner;
        let mut builder = Outbox::builder(inner.source.clone())
            .max_payload_bytes(inner.max_payload_bytes)
            .insert_batch_rows(inner.insert_batch_rows)
            .sqlite_immediate(inner.sqlite_immediate)
            .notify_channel(inner.notify.as_ref().map(|n| n.channel.as_str()));
        if let Some(notify) = &inner.notify {
            builder = builder.notify_interval(notify.interval);
        }
        builder.build()
    }

    /// The CloudEvents `source` of this service's events.
    pub fn source(&self) -> &str {
        &self.inner.source
    }

    /// The PostgreSQL channel of the cross-process hint, if on.
    pub fn notify_channel(&self) -> Option<&str> {
        self.inner.notify.as_ref().map(|n| n.channel.as_str())
    }

    /// A receiver that changes whenever a transaction of this handle (or a clone) commits events.
    pub fn subscribe(&self) -> WakeReceiver {
        WakeReceiver {
            rx: self.inner.wake.subscribe(),
        }
    }

    /// Whether a relay's fast path runs on this handle: its commits are then published right
    /// after COMMIT by that relay (see [`RelayConfig::fast_path`]).
    ///
    /// [`RelayConfig::fast_path`]: crate::relay::RelayConfig::fast_path
    pub fn fast_path_running(&self) -> bool {
        let slot = self.inner.fast.read().unwrap_or_else(|p| p.into_inner());
        slot.is_some()
    }

    /// The relay's fast path, when one runs on this handle and takes events now.
    pub(crate) fn fast_path(&self) -> Option<Arc<dyn Handover>> {
        let slot = self.inner.fast.read().unwrap_or_else(|p| p.into_inner());
        slot.as_ref().filter(|f| f.available()).cloned()
    }

    /// Let commits hand their events to `fast`; `false` when another relay's fast path already
    /// runs on this handle.
    pub(crate) fn install_fast_path(&self, fast: Arc<dyn Handover>) -> bool {
        let mut slot = self.inner.fast.write().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return false;
        }
        *slot = Some(fast);
        true
    }

    /// Commits stop handing events to the fast path with `token`.
    pub(crate) fn remove_fast_path(&self, token: Uuid) {
        let mut slot = self.inner.fast.write().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_some_and(|f| f.claim().token == token) {
            *slot = None;
        }
    }

    /// Tell local relays that events were committed, and (PostgreSQL) relays of other processes.
    pub(crate) fn committed(&self, db: &DatabaseConnection) {
        self.inner.wake.send_modify(|n| *n = n.wrapping_add(1));
        if crate::store::notify::available(db)
            && let Some(hint) = &self.inner.notify
        {
            hint.request(db);
        }
    }
}

/// Wakes a relay when events were committed in this process. Obtained from [`Outbox::subscribe`].
#[derive(Debug, Clone)]
pub struct WakeReceiver {
    rx: watch::Receiver<u64>,
}

impl WakeReceiver {
    /// Wait until events are committed after the last call (returns at once if some already were).
    pub async fn woken(&mut self) {
        if self.rx.changed().await.is_err() {
            // Every sender is gone: nothing will commit through this handle any more.
            std::future::pending::<()>().await;
        }
    }

    /// Whether events were committed since the last [`woken`](Self::woken).
    pub fn has_changed(&self) -> bool {
        self.rx.has_changed().unwrap_or(false)
    }

    /// How many times relays were woken through the handle so far.
    pub(crate) fn count(&self) -> u64 {
        *self.rx.borrow()
    }
}

/// The coalesced cross-process wake-up: at most one `NOTIFY` per interval, sent after commit on a
/// pool connection, never inside the business transaction.
struct CrossProcessHint {
    channel: String,
    sql: String,
    interval: Duration,
    /// When the latest hint was (or is scheduled to be) sent.
    last: Mutex<Option<Instant>>,
}

impl CrossProcessHint {
    fn request(&self, db: &DatabaseConnection) {
        let now = Instant::now();
        let delay = {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            let delay = match *last {
                // A hint scheduled after this commit covers it.
                Some(at) if at > now => return,
                Some(at) if now.duration_since(at) < self.interval => {
                    self.interval - now.duration_since(at)
                }
                _ => Duration::ZERO,
            };
            *last = Some(now + delay);
            delay
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(send_hint(db.clone(), self.sql.clone(), delay));
    }
}

async fn send_hint(db: DatabaseConnection, sql: String, delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Err(e) = db.execute_unprepared(&sql).await {
        tracing::debug!(error = %e, "outbox wake-up hint (NOTIFY) failed; relays fall back to polling");
    }
}

/// Where commits hand over the events they wrote claimed: a relay's fast path (`relay/fast.rs`
/// owns its state, its lease and its publishing). The producer only asks whether it takes
/// events now, writes them under its claim, and hands them over after COMMIT.
pub(crate) trait Handover: Send + Sync {
    /// Whether it takes a commit's events now; else the commit writes them PENDING, for the
    /// claim loop.
    fn available(&self) -> bool;

    /// The claim a commit's INSERT writes its events under.
    fn claim(&self) -> FastClaim<'_>;

    /// What it knows before a commit, to hand over with the commit's events.
    fn before_commit(&self) -> BeforeCommit;

    /// Take the events a commit wrote claimed, in id order, right after COMMIT, with what
    /// [`before_commit`](Self::before_commit) said before it. `false` when it stopped
    /// meanwhile: it hands the rows back to PENDING itself.
    fn hand_over(
        &self,
        db: &DatabaseConnection,
        events: Vec<ClaimedEvent>,
        before: BeforeCommit,
    ) -> bool;
}

/// What a fast path knew before a commit (see [`Handover::before_commit`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BeforeCommit {
    /// What signals events written PENDING so far (see `FastPath::signals`); `None` when some
    /// would go unseen.
    pub(crate) signals: Option<u64>,
    /// The server's timeline as its relay knew it, for the standby wait: a promotion between
    /// this and the wait is seen.
    pub(crate) timeline: crate::store::standby::Seen,
}

impl BeforeCommit {
    /// What two commits handled together knew: the earlier of each (counts only grow, and
    /// so do timelines).
    pub(crate) fn and(self, other: BeforeCommit) -> BeforeCommit {
        BeforeCommit {
            signals: self.signals.zip(other.signals).map(|(a, b)| a.min(b)),
            timeline: self.timeline.and(other.timeline),
        }
    }
}
