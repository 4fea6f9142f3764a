//! One database of the set: its outbox handle, its consumers (for the dispatchers to route to),
//! and the loops this instance runs for it, owner's or not.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use sea_orm::DatabaseConnection;
use tokio::sync::Notify;

use super::{FleetDatabase, Shared};
use crate::{
    health::LoopReport,
    inbox::{ExternalInbox, consumer::Consumer},
    outbox::Outbox,
    pause::Pauses,
    runtime::{Loops, RelayRole},
};

/// The loops running for a database.
enum Running {
    Nothing,
    /// The fast path only: another instance owns the database.
    FastPath(Loops),
    /// Everything the owner runs.
    Owner(Loops),
}

pub(crate) struct Tenant {
    pub(super) name: String,
    pub(super) db: DatabaseConnection,
    pub(super) outbox: Outbox,
    /// Its server and pool size, where it has a server (see [`budget`](super::budget)).
    pub(super) footprint: Option<super::budget::Footprint>,
    consumers: BTreeMap<&'static str, Arc<Consumer>>,
    wakes: BTreeMap<&'static str, Arc<Notify>>,
    pauses: Arc<Pauses>,
    running: Mutex<Running>,
    /// The owner's WAL relay settings, if the database streams its WAL.
    #[cfg(feature = "postgres-wal")]
    wal: Option<crate::relay::WalConfig>,
}

impl Tenant {
    pub(super) fn new(
        shared: &Shared,
        database: FleetDatabase,
        footprint: Option<super::budget::Footprint>,
    ) -> Tenant {
        let outbox = match &shared.base.outbox {
            Some(outbox) => outbox.sibling(),
            None => Outbox::new(shared.source_name.clone()),
        };
        let pauses = Arc::new(Pauses::default());
        let mut consumers = BTreeMap::new();
        let mut wakes = BTreeMap::new();
        for (name, regs) in &shared.by_consumer {
            let wake = Arc::new(Notify::new());
            let mut consumer = Consumer::new(
                name,
                regs,
                shared.base.inbox.clone(),
                database.db.clone(),
                outbox.clone(),
                wake.clone(),
                format!("{}/{name}", shared.instance),
            );
            consumer.database = database.name.clone();
            consumer.pauses = pauses.clone();
            if let Some(transport) = &shared.base.transport {
                consumer.system = transport.name();
            }
            consumers.insert(*name, Arc::new(consumer));
            wakes.insert(*name, wake);
        }
        Tenant {
            #[cfg(feature = "postgres-wal")]
            wal: database.wal,
            name: database.name,
            db: database.db,
            outbox,
            footprint,
            consumers,
            wakes,
            pauses,
            running: Mutex::new(Running::Nothing),
        }
    }

    pub(super) fn consumer(&self, name: &str) -> Option<Arc<Consumer>> {
        self.consumers.get(name).cloned()
    }

    pub(super) fn external_inbox(&self) -> ExternalInbox {
        ExternalInbox::with_wakes(self.db.clone(), self.wakes.clone())
    }

    pub(super) fn is_owner(&self) -> bool {
        matches!(
            *self.running.lock().unwrap_or_else(|p| p.into_inner()),
            Running::Owner(_)
        )
    }

    /// The health of its loops running here.
    pub(super) fn health(&self) -> Vec<LoopReport> {
        match &*self.running.lock().unwrap_or_else(|p| p.into_inner()) {
            Running::Nothing => Vec::new(),
            Running::FastPath(loops) | Running::Owner(loops) => {
                loops.tasks.iter().map(|(h, _)| h.report()).collect()
            }
        }
    }

    fn take(&self) -> Running {
        std::mem::replace(
            &mut *self.running.lock().unwrap_or_else(|p| p.into_inner()),
            Running::Nothing,
        )
    }

    fn put(&self, running: Running) {
        *self.running.lock().unwrap_or_else(|p| p.into_inner()) = running;
    }

    /// Run what the owner runs (after the fast-path-only relay has stopped).
    pub(super) async fn own(&self, shared: &Shared) {
        let running = match self.take() {
            owner @ Running::Owner(_) => owner,
            other => {
                stop(other).await;
                tracing::info!(database = %self.name, instance = %shared.instance, "owning the database's background work");
                Running::Owner(self.start_owner(shared))
            }
        };
        self.put(running);
    }

    /// Run the fast path only (after the owner's loops have stopped: claims handed back).
    pub(super) async fn disown(&self, shared: &Shared) {
        let running = match self.take() {
            fast @ Running::FastPath(_) => fast,
            other => {
                if matches!(other, Running::Owner(_)) {
                    tracing::info!(database = %self.name, instance = %shared.instance, "handing the database's background work over");
                }
                stop(other).await;
                Running::FastPath(self.start_fast_path(shared))
            }
        };
        self.put(running);
    }

    /// Stop every loop of the database.
    pub(super) async fn stop(&self) {
        stop(self.take()).await;
    }

    fn loops(&self, shared: &Shared) -> Loops {
        Loops::child(&shared.shutdown, self.pauses.clone(), &self.name)
    }

    fn builder(&self, shared: &Shared) -> crate::runtime::RuntimeBuilder {
        let mut builder = shared.base.clone();
        builder.db = self.db.clone();
        builder.outbox = Some(self.outbox.clone());
        builder
    }

    fn start_fast_path(&self, shared: &Shared) -> Loops {
        let mut loops = self.loops(shared);
        self.builder(shared).start_relay(
            &shared.by_consumer,
            &self.outbox,
            &shared.instance,
            &self.wakes,
            &mut loops,
            RelayRole::FastPath(&self.name),
        );
        loops
    }

    fn start_owner(&self, shared: &Shared) -> Loops {
        let mut loops = self.loops(shared);
        for (name, consumer) in &self.consumers {
            let consumer = consumer.clone();
            loops.spawn(
                format!("worker:{name}"),
                Some(consumer.config.poll_interval),
                |shutdown, health| async move {
                    consumer.run_worker(shutdown, health).await;
                },
            );
        }
        #[allow(unused_mut)]
        let mut builder = self.builder(shared);
        // The owner streams the WAL where the database has its settings; the fast path on
        // every instance (`builder` without them) publishes that instance's commits.
        #[cfg(feature = "postgres-wal")]
        {
            builder.wal = self.wal.clone();
        }
        builder.start_relay(
            &shared.by_consumer,
            &self.outbox,
            &shared.instance,
            &self.wakes,
            &mut loops,
            RelayRole::Owner(&self.name),
        );
        builder.start_janitor(&shared.instance, &mut loops);
        builder.start_sampler(&mut loops);
        loops
    }
}

async fn stop(running: Running) {
    match running {
        Running::Nothing => {}
        Running::FastPath(loops) | Running::Owner(loops) => loops.stop().await,
    }
}
