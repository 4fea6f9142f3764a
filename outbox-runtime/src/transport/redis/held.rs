//! What a subscription shares with the ackers of its deliveries: which stream, group and
//! consumer it reads, and the entries it holds unsettled.

use std::{
    collections::HashSet,
    sync::{Mutex, PoisonError},
};

use tokio::sync::Notify;

/// Stream, group and Redis consumer of one subscription.
#[derive(Debug)]
pub(super) struct Ids {
    pub(super) key: String,
    pub(super) group: String,
    pub(super) consumer: String,
}

/// Entry ids a subscription read and has not settled yet (buffered or handed out).
#[derive(Debug, Default)]
pub(super) struct Held {
    ids: Mutex<HashSet<String>>,
    /// Signalled when an entry is settled or dropped: there is room for another.
    pub(super) settled: Notify,
}

impl Held {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.ids.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    pub(super) fn contains(&self, id: &str) -> bool {
        self.lock().contains(id)
    }

    pub(super) fn insert(&self, id: &str) {
        self.lock().insert(id.to_owned());
    }

    pub(super) fn release(&self, id: &str) {
        let removed = self.lock().remove(id);
        if removed {
            self.settled.notify_one();
        }
    }
}
