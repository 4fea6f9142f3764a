//! The database-local transport, the embedded default: no broker. The relay moves each committed
//! event into an inbox row of every local consumer subscribed to its type and marks it SENT, in
//! one transaction ([`crate::store::local::move_to_inbox`]), then wakes the consumers' workers,
//! which handle the rows as they handle stored messages. Exactly once, since the inbox rows and
//! the SENT mark commit together.

use std::{collections::BTreeMap, sync::Arc};

use sea_orm::{DatabaseConnection, DbErr};
use tokio::{sync::Notify, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::{
    health::LoopHealth,
    store::{claim::ClaimParams, local::Moved},
};

/// The consumers subscribed to an event type.
pub type Routes = Arc<dyn Fn(&str) -> Vec<&'static str> + Send + Sync>;

/// Where the relay delivers when there is no broker: the local consumers' inbox rows.
#[derive(Clone)]
pub struct LocalDelivery {
    routes: Routes,
    delivered: Arc<Notify>,
}

impl std::fmt::Debug for LocalDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalDelivery").finish_non_exhaustive()
    }
}

impl LocalDelivery {
    /// Deliver by `routes`, notifying `delivered` after a round that inserted inbox rows.
    pub fn new(routes: Routes, delivered: Arc<Notify>) -> Self {
        LocalDelivery { routes, delivered }
    }

    /// Routes each event type to every consumer of `subscriptions` (a consumer and one event
    /// type it handles) that handles it.
    pub(crate) fn for_subscriptions(
        subscriptions: impl IntoIterator<Item = (&'static str, &'static str)>,
    ) -> Self {
        let mut routes: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
        for (consumer, event_type) in subscriptions {
            let list = routes.entry(event_type.to_owned()).or_default();
            if !list.contains(&consumer) {
                list.push(consumer);
            }
        }
        let routes = Arc::new(routes);
        LocalDelivery::new(
            Arc::new(move |event_type: &str| routes.get(event_type).cloned().unwrap_or_default()),
            Arc::new(Notify::new()),
        )
    }

    /// One round: move a batch into the inbox, then wake the workers if rows were delivered.
    pub(crate) async fn deliver(
        &self,
        db: &DatabaseConnection,
        params: &ClaimParams<'_>,
        held: &[String],
    ) -> Result<Moved, DbErr> {
        let moved =
            crate::store::local::move_to_inbox(db, params, self.routes.as_ref(), held).await?;
        if moved.inbox_rows > 0 {
            self.delivered.notify_waiters();
        }
        Ok(moved)
    }

    /// Until shutdown, pass each delivery notification on to every consumer's worker wake-up:
    /// one notification from the relay wakes every local consumer.
    pub(crate) fn spawn_fan_out(
        &self,
        wakes: Vec<Arc<Notify>>,
        shutdown: CancellationToken,
    ) -> (Arc<LoopHealth>, JoinHandle<()>) {
        let health = Arc::new(LoopHealth::new("local-fan-out".into()));
        let delivered = self.delivered.clone();
        let task = tokio::spawn({
            let health = health.clone();
            async move {
                loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = delivered.notified() => {
                            for wake in &wakes {
                                wake.notify_one();
                            }
                            health.success();
                        }
                    }
                }
                health.stopped();
            }
        });
        (health, task)
    }
}
