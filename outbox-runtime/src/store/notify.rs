//! The cross-process wake-up: a notification sent after a commit, and the listener that wakes a
//! relay in another process, where the dialect has them (`LISTEN`/`NOTIFY` on PostgreSQL).

use std::sync::Arc;

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

/// Listen on `channel` until shutdown and call `hint.notify_one()` for every notification (and
/// after every reconnect, since notifications may have been missed meanwhile). `None` where the
/// dialect has no notifications.
pub(crate) fn spawn_listener(
    db: &DatabaseConnection,
    channel: String,
    hint: Arc<Notify>,
    shutdown: CancellationToken,
    owner: String,
) -> Option<tokio::task::JoinHandle<()>> {
    if !available(db) {
        return None;
    }
    #[cfg(feature = "postgres")]
    {
        let pool = db.get_postgres_connection_pool().clone();
        Some(tokio::spawn(listen(pool, channel, hint, shutdown, owner)))
    }
    #[cfg(not(feature = "postgres"))]
    {
        let _ = (channel, hint, shutdown, owner);
        None
    }
}

#[cfg(feature = "postgres")]
async fn listen(
    pool: sea_orm::sqlx::PgPool,
    channel: String,
    hint: Arc<Notify>,
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
        hint.notify_one();
        loop {
            match listener.try_recv().await {
                Ok(Some(_)) => hint.notify_one(),
                Ok(None) => {
                    hint.notify_one(); // reconnected: notifications may be lost
                }
                Err(e) => {
                    tracing::debug!(relay = %owner, error = %e, "LISTEN connection lost");
                    break;
                }
            }
        }
    }
}
