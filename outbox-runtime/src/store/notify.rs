//! The cross-process wake-up: a notification sent after a commit, and the listener that wakes a
//! relay in another process, where the dialect has them (`LISTEN`/`NOTIFY` on PostgreSQL).

use std::sync::{
    Arc,
    atomic::{AtomicBool, AtomicU64, Ordering},
};

use sea_orm::DatabaseConnection;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::Dialect;

/// The statement that wakes the listeners of `channel` (a validated SQL identifier). Its own
/// transaction need not wait for the WAL flush: a hint lost in a crash costs a poll interval,
/// and it does not queue behind the business transactions' flushes.
pub(crate) fn notify_statement(channel: &str) -> String {
    format!(
        "SELECT pg_notify('{channel}', '') WHERE {}",
        super::postgres::LAZY_COMMIT
    )
}

/// Whether commits on `db` can wake other processes.
pub(crate) fn available(db: &DatabaseConnection) -> bool {
    Dialect::of(db).notifications()
}

/// What a relay's listener heard: it wakes the relay's loop, and counts every notification (and
/// every reconnect or loss, after which some may have been missed), so that the fast path can
/// tell whether another process may have committed events since a moment.
#[derive(Debug, Default)]
pub(crate) struct Heard {
    /// Wakes the relay's loop.
    pub(crate) notify: Notify,
    count: AtomicU64,
    /// The listener is connected and listening: nothing another process announces goes unheard.
    listening: AtomicBool,
}

impl Heard {
    /// Something was heard (or may have been missed): count it and wake the loop.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn heard(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_one();
    }

    /// Events were written PENDING here outside a commit (due delayed events moved into the
    /// outbox): counted like a notification, without waking the loop (which is claiming).
    pub(crate) fn bump(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    /// The count of what was heard, while the listener listens; `None` when no listener runs or
    /// it is not connected (another process's commits would go unheard).
    pub(crate) fn count(&self) -> Option<u64> {
        let count = self.count.load(Ordering::SeqCst);
        self.listening.load(Ordering::SeqCst).then_some(count)
    }

    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn listening(&self, on: bool) {
        self.listening.store(on, Ordering::SeqCst);
        // A change either way may hide a notification: count it.
        self.heard();
    }
}

/// Listen on `channel` until shutdown and call `hint.heard()` for every notification (and
/// after every reconnect, since notifications may have been missed meanwhile). `None` where the
/// dialect has no notifications, and where PostgreSQL is reached through a pooler that shares
/// server sessions between clients (PgBouncer, Supavisor or pgcat in transaction mode): there a
/// `LISTEN` stays on a server connection other clients go on to use, and the notifications it
/// receives would reach them in the middle of their statements.
pub(crate) async fn spawn_listener(
    db: &DatabaseConnection,
    channel: String,
    hint: Arc<Heard>,
    shutdown: CancellationToken,
    owner: String,
) -> Option<tokio::task::JoinHandle<()>> {
    if !available(db) {
        return None;
    }
    #[cfg(feature = "postgres")]
    {
        let pool = db.get_postgres_connection_pool().clone();
        match sessions_shared(&pool).await {
            Ok(true) => {
                tracing::warn!(
                    relay = %owner,
                    "PostgreSQL is reached through a pooler that shares server sessions between \
                     clients (one server session answered two client connections): the relay \
                     does not LISTEN there and polls every poll_interval instead; \
                     `RelayConfig::listen(false)` says so without this check"
                );
                return None;
            }
            Ok(false) => {}
            Err(e) => {
                tracing::debug!(relay = %owner, error = %e, "could not tell whether sessions are pooled; listening");
            }
        }
        Some(tokio::spawn(listen(pool, channel, hint, shutdown, owner)))
    }
    #[cfg(not(feature = "postgres"))]
    {
        let _ = (channel, hint, shutdown, owner);
        None
    }
}

/// Whether the server sessions behind `pool` are shared between client connections. A session
/// of its own answers a connection's every statement and no other connection's while it is
/// open, so either sign proves a pooler in transaction (or statement) mode: one connection's
/// statements answered by two backends (likely when the pooler is busy), or a second
/// connection answered by the first one's backend (likely when it is quiet: poolers hand the
/// session just released out again first). A few rounds make a miss unlikely; a direct
/// connection can never look pooled.
#[cfg(feature = "postgres")]
pub async fn sessions_shared(pool: &sea_orm::sqlx::PgPool) -> Result<bool, sea_orm::sqlx::Error> {
    use sea_orm::sqlx::{Connection, postgres::PgConnection};
    const PID: &str = "SELECT pg_backend_pid()";
    let options = pool.connect_options();
    let mut first = PgConnection::connect_with(&options).await?;
    let mine: i32 = sea_orm::sqlx::query_scalar(PID)
        .fetch_one(&mut first)
        .await?;
    let mut shared = false;
    for _ in 0..8 {
        let mut second = PgConnection::connect_with(&options).await?;
        let theirs: i32 = sea_orm::sqlx::query_scalar(PID)
            .fetch_one(&mut second)
            .await?;
        let _ = second.close().await;
        let again: i32 = sea_orm::sqlx::query_scalar(PID)
            .fetch_one(&mut first)
            .await?;
        if theirs == mine || again != mine {
            shared = true;
            break;
        }
    }
    let _ = first.close().await;
    Ok(shared)
}

#[cfg(feature = "postgres")]
async fn listen(
    pool: sea_orm::sqlx::PgPool,
    channel: String,
    hint: Arc<Heard>,
    shutdown: CancellationToken,
    owner: String,
) {
    use sea_orm::sqlx::postgres::PgListener;
    use std::time::Duration;
    let mut delay = Duration::from_millis(100);
    while !shutdown.is_cancelled() {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(relay = %owner, error = %e, "LISTEN connection failed");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        if let Err(e) = listener.listen(&channel).await {
            tracing::debug!(relay = %owner, error = %e, "LISTEN failed");
            tokio::time::sleep(delay).await;
            continue;
        }
        delay = Duration::from_millis(100);
        // After (re)connecting, look once: a hint may have been missed meanwhile.
        hint.listening(true);
        loop {
            match listener.try_recv().await {
                Ok(Some(_)) => hint.heard(),
                Ok(None) => {
                    // The connection was lost: listen again on a new one (notifications sent
                    // meanwhile are lost; the new one's `listening` looks once).
                    hint.listening(false);
                    break;
                }
                Err(e) => {
                    hint.listening(false);
                    tracing::debug!(relay = %owner, error = %e, "LISTEN connection lost");
                    break;
                }
            }
        }
    }
}
