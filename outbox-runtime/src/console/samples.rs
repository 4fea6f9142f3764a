//! Backlog and lag over time, for the console's charts: a sampler takes [`admin::status`] on an
//! interval and keeps the last hours in memory (nothing is written to the database; a restart
//! starts the history again).

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{Mutex, Weak},
    time::Duration,
};

use chrono::{DateTime, Utc};
use sea_orm::DatabaseConnection;
use serde::Serialize;
use utoipa::ToSchema;

use crate::admin::{self, Status};

/// One consumer at one instant.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(super) struct ConsumerSample {
    /// Messages not finished yet (PENDING, PROCESSING, RETRY).
    backlog: u64,
    /// Age of its oldest unfinished message, in seconds.
    lag_secs: Option<f64>,
    /// DEAD messages.
    dead: u64,
}

/// The outbox and every consumer at one instant.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(super) struct Sample {
    /// When, by the database's clock.
    at: DateTime<Utc>,
    /// Events not sent yet.
    outbox_backlog: u64,
    /// Age of the oldest unsent event, in seconds.
    outbox_oldest_unsent_secs: Option<f64>,
    /// DEAD outbox events.
    outbox_dead: u64,
    /// Per consumer.
    consumers: BTreeMap<String, ConsumerSample>,
}

impl Sample {
    fn of(status: &Status) -> Self {
        Sample {
            at: status.at,
            outbox_backlog: status.outbox.backlog,
            outbox_oldest_unsent_secs: status.outbox.oldest_unsent_age.map(|d| d.as_secs_f64()),
            outbox_dead: status.outbox.dead,
            consumers: status
                .consumers
                .iter()
                .map(|c| {
                    (
                        c.consumer.clone(),
                        ConsumerSample {
                            backlog: c.backlog,
                            lag_secs: c.lag.map(|d| d.as_secs_f64()),
                            dead: c.dead,
                        },
                    )
                })
                .collect(),
        }
    }
}

/// The samples kept, oldest first.
#[derive(Debug)]
pub(super) struct History {
    samples: Mutex<VecDeque<Sample>>,
    keep: usize,
    /// How often the sampler samples.
    pub(super) interval: Duration,
}

impl History {
    /// A history of `span` at one sample per `interval`.
    pub(super) fn new(interval: Duration, span: Duration) -> Self {
        let interval = interval.max(Duration::from_secs(1));
        let keep = (span.as_secs() / interval.as_secs()).clamp(1, 100_000) as usize;
        History {
            samples: Mutex::new(VecDeque::with_capacity(keep.min(4_096))),
            keep,
            interval,
        }
    }

    /// Record a status (also the one a status request just read, so the charts end at "now").
    pub(super) fn record(&self, status: &Status) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        // Two samples closer than half the interval: the newer replaces the older.
        if let Some(last) = samples.back()
            && (status.at - last.at).to_std().unwrap_or_default() < self.interval / 2
        {
            samples.pop_back();
        }
        samples.push_back(Sample::of(status));
        while samples.len() > self.keep {
            samples.pop_front();
        }
    }

    /// Every sample taken since `since`, oldest first.
    pub(super) fn since(&self, since: Option<DateTime<Utc>>) -> Vec<Sample> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples
            .iter()
            .filter(|s| since.is_none_or(|t| s.at >= t))
            .cloned()
            .collect()
    }
}

/// Sample until the history is dropped (the router and every clone of it are gone).
pub(super) async fn run(db: DatabaseConnection, history: Weak<History>) {
    loop {
        let Some(interval) = history.upgrade().map(|h| h.interval) else {
            return;
        };
        match admin::status(&db).await {
            Ok(status) => match history.upgrade() {
                Some(history) => history.record(&status),
                None => return,
            },
            Err(e) => tracing::debug!(error = %e, "console: could not sample the status"),
        }
        tokio::time::sleep(interval).await;
    }
}
