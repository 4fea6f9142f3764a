//! Starting the runtime: check the settings and the catalogues, then spawn each loop (a
//! dispatcher and a worker per consumer, the relay, the janitor, the metrics sampler) under one
//! cancellation token.

use super::*;

/// Which relay a runtime starts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RelayRole<'a> {
    /// The relay of a runtime over one database.
    Whole,
    /// The relay of this database of a set, whose claims this instance owns.
    Owner(&'a str),
    /// The fast path of this database of a set, whose claims another instance owns.
    FastPath(&'a str),
}

/// The consumers to run, each with its handlers.
pub(crate) type ByConsumer = BTreeMap<&'static str, Vec<&'static HandlerRegistration>>;

/// The loops being started, each with its health.
pub(crate) struct Loops {
    pub(crate) shutdown: CancellationToken,
    pub(crate) tasks: Vec<(Arc<LoopHealth>, JoinHandle<()>)>,
    /// The pauses every loop of this runtime honours, read once per interval for all of them.
    pub(crate) pauses: Arc<crate::pause::Pauses>,
    /// Appended to each loop's name (`relay@tenant-1`): the database, in a set of databases.
    pub(crate) label: Option<String>,
}

impl Loops {
    /// Loops that stop with `parent` or on their own, for the database `label`.
    pub(crate) fn child(
        parent: &CancellationToken,
        pauses: Arc<crate::pause::Pauses>,
        label: &str,
    ) -> Self {
        Loops {
            shutdown: parent.child_token(),
            tasks: Vec::new(),
            pauses,
            label: Some(label.to_owned()),
        }
    }

    /// Stop them and wait until every one has ended.
    pub(crate) async fn stop(self) {
        self.shutdown.cancel();
        join(self.tasks).await;
    }

    /// Spawn the loop `name`, which reports to its health and is marked stopped when it ends.
    /// `cadence`: how often the loop ends a round, when it is periodic (see `health::Probes`).
    pub(crate) fn spawn<F, Fut>(
        &mut self,
        name: String,
        cadence: Option<std::time::Duration>,
        run: F,
    ) where
        F: FnOnce(CancellationToken, Arc<LoopHealth>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let name = match &self.label {
            Some(label) => format!("{name}@{label}"),
            None => name,
        };
        let health = Arc::new(match cadence {
            Some(cadence) => LoopHealth::periodic(name, cadence),
            None => LoopHealth::new(name),
        });
        let task = run(self.shutdown.clone(), health.clone());
        let stopped = health.clone();
        let task = tokio::spawn(async move {
            task.await;
            stopped.stopped();
        });
        self.tasks.push((health, task));
    }
}

/// Wait until every loop has ended (their shutdown asked for), logging those that panicked.
pub(crate) async fn join(tasks: Vec<(Arc<LoopHealth>, JoinHandle<()>)>) {
    for (health, task) in tasks {
        if let Err(e) = task.await
            && e.is_panic()
        {
            tracing::error!(task = %health.report().name, "outbox loop panicked");
        }
    }
}

impl RuntimeBuilder {
    /// Check the settings and the catalogues, set up the transport, and start every loop.
    pub async fn start(self) -> Result<Runtime, RuntimeError> {
        crate::metrics::describe();
        self.check_settings()?;
        let by_consumer = self.consumers_to_run()?;
        let outbox = match (&self.outbox, &self.source) {
            (Some(outbox), _) => outbox.clone(),
            (None, source) => Outbox::new(source.clone().unwrap_or_else(|| "outbox".to_owned())),
        };
        if let Some(transport) = &self.transport {
            transport.setup().await?;
        }
        let mut loops = Loops {
            shutdown: CancellationToken::new(),
            tasks: Vec::new(),
            pauses: Default::default(),
            label: None,
        };
        let owner = self.owner_name();
        let (consumers, wakes) = self.start_consumers(&by_consumer, &outbox, &owner, &mut loops);
        let relay_stats = self.start_relay(
            &by_consumer,
            &outbox,
            &owner,
            &wakes,
            &mut loops,
            RelayRole::Whole,
        );
        self.start_janitor(&owner, &mut loops);
        self.start_sampler(&mut loops);
        tracing::info!(
            consumers = by_consumer.len(),
            transport = self
                .transport
                .as_ref()
                .map_or("database-local", |t| t.name()),
            "outbox runtime started"
        );
        Ok(Runtime {
            external: ExternalInbox::with_wakes(self.db.clone(), wakes),
            outbox,
            shutdown: loops.shutdown,
            tasks: loops.tasks,
            consumers,
            relay_stats,
        })
    }

    /// What this runtime's loops record as their owner (see [`RuntimeBuilder::instance_id`]).
    pub(crate) fn owner_name(&self) -> String {
        match (&self.instance, &self.relay) {
            (Some(id), _) => id.clone(),
            (None, Some(relay)) => relay.relay_id.clone(),
            (None, None) => crate::util::instance_id(),
        }
    }

    /// Settings that cannot apply together, and a retention policy that would purge inbox rows
    /// a redelivery could still need.
    pub(crate) fn check_settings(&self) -> Result<(), RuntimeError> {
        if let (Some(outbox), Some(source)) = (&self.outbox, &self.source) {
            return Err(RuntimeError::Settings(format!(
                "`source(\"{source}\")` cannot apply: the outbox handle given with `outbox()` has \
                 its own source (`{}`); set the source where the handle is built",
                outbox.source()
            )));
        }
        #[cfg(feature = "postgres-wal")]
        if self.wal.is_some() {
            if self.relay.is_none() {
                return Err(RuntimeError::Settings(
                    "`wal()` cannot apply: this runtime runs no relay (`without_relay()`)".into(),
                ));
            }
            if self.transport.is_none() {
                return Err(RuntimeError::Settings(
                    "`wal()` cannot apply without a broker: the database-local relay moves \
                     events into the local inboxes in one transaction; give `transport()`"
                        .into(),
                ));
            }
        }
        if let Some(janitor) = &self.retention {
            let relay = self.relay.clone().unwrap_or_default();
            let horizon = crate::retention::redelivery_horizon(
                janitor.broker_window,
                &relay,
                janitor.manual_window,
            );
            janitor
                .policy
                .validate(horizon)
                .map_err(RuntimeError::Retention)?;
        }
        Ok(())
    }

    /// The handlers linked in, by consumer, checked (the event catalogue, the consumers
    /// expected, the upcasters) and narrowed to the consumers this process runs.
    pub(crate) fn consumers_to_run(&self) -> Result<ByConsumer, RuntimeError> {
        let catalogue = EventCatalogue::load().map_err(RuntimeError::Registry)?;
        catalogue.log();
        let mut by_consumer = handlers()?;
        let found = by_consumer.keys().copied().collect::<Vec<_>>().join(", ");
        for name in &self.expected {
            if !by_consumer.contains_key(name.as_str()) {
                return Err(RuntimeError::MissingConsumer(name.clone(), found));
            }
        }
        if let Some(only) = &self.consumers {
            by_consumer.retain(|name, _| only.iter().any(|o| o == name));
        }
        check_upcasters(&by_consumer)?;
        for (consumer, regs) in &by_consumer {
            for reg in regs {
                tracing::info!(
                    consumer, event_type = reg.event_type, version = reg.schema_version,
                    source = reg.source.unwrap_or(""), handler = %reg.location(), "inbox handler"
                );
            }
        }
        Ok(by_consumer)
    }

    /// A worker per consumer, and a dispatcher for each that takes events from the broker.
    /// Returns the consumers' counters and the signals that wake their workers.
    #[allow(clippy::type_complexity)]
    fn start_consumers(
        &self,
        by_consumer: &ByConsumer,
        outbox: &Outbox,
        worker_id: &str,
        loops: &mut Loops,
    ) -> (
        BTreeMap<&'static str, Arc<ConsumerStats>>,
        BTreeMap<&'static str, Arc<Notify>>,
    ) {
        let mut consumers = BTreeMap::new();
        let mut wakes = BTreeMap::new();
        for (name, regs) in by_consumer {
            let wake = Arc::new(Notify::new());
            wakes.insert(*name, wake.clone());
            let mut consumer = Consumer::new(
                name,
                regs,
                self.inbox.clone(),
                self.db.clone(),
                outbox.clone(),
                wake,
                format!("{worker_id}/{name}"),
            );
            if let Some(transport) = &self.transport {
                consumer.system = transport.name();
            }
            consumer.pauses = loops.pauses.clone();
            let consumer = Arc::new(consumer);
            consumers.insert(*name, consumer.stats.clone());
            if let Some(transport) = self.transport.as_ref().filter(|_| consumer.takes_events()) {
                let (consumer, transport) = (consumer.clone(), transport.clone());
                loops.spawn(
                    format!("dispatch:{name}"),
                    None,
                    |shutdown, health| async move {
                        consumer
                            .run_dispatcher(transport, shutdown, health, None)
                            .await;
                    },
                );
            }
            let cadence = Some(consumer.config.poll_interval);
            loops.spawn(
                format!("worker:{name}"),
                cadence,
                |shutdown, health| async move {
                    consumer.run_worker(shutdown, health).await;
                },
            );
        }
        (consumers, wakes)
    }

    /// The relay, unless this process runs none: to the broker, or without one to the local
    /// consumers' inbox rows (with the fan-out that wakes their workers). In a set of
    /// databases, `role` names the database and whether this instance owns its claims.
    pub(crate) fn start_relay(
        &self,
        by_consumer: &ByConsumer,
        outbox: &Outbox,
        owner: &str,
        wakes: &BTreeMap<&'static str, Arc<Notify>>,
        loops: &mut Loops,
        role: RelayRole<'_>,
    ) -> Option<Arc<RelayStats>> {
        let config = self.relay.clone()?.relay_id(owner);
        if let RelayRole::FastPath(_) = role
            && (self.transport.is_none() || self.streams_wal())
        {
            // Neither the database-local relay nor the WAL relay has a fast path.
            return None;
        }
        let poll_interval = config.poll_interval;
        let relay = match &self.transport {
            Some(transport) => Relay::new(self.db.clone(), transport.clone()),
            None => {
                let delivery = LocalDelivery::for_subscriptions(by_consumer.iter().flat_map(
                    |(name, regs)| {
                        regs.iter()
                            .filter(|reg| reg.source.is_none())
                            .map(|reg| (*name, reg.event_type))
                    },
                ));
                loops.tasks.push(
                    delivery
                        .spawn_fan_out(wakes.values().cloned().collect(), loops.shutdown.clone()),
                );
                Relay::local(self.db.clone(), delivery)
            }
        }
        .with_config(config)
        .with_outbox(outbox)
        .with_pauses(loops.pauses.clone());
        let relay = match role {
            RelayRole::Whole => relay,
            RelayRole::Owner(database) => relay.for_database(database),
            RelayRole::FastPath(database) => relay.for_database(database).fast_path_only(),
        };
        #[cfg(feature = "postgres-wal")]
        let relay = match self.wal.clone() {
            Some(wal) => relay.with_wal(wal),
            None => relay,
        };
        let stats = relay.stats_handle();
        // A WAL relay waits on its stream; a claim loop ends a round every poll interval.
        let cadence = match role {
            RelayRole::FastPath(_) => None,
            _ => (!self.streams_wal()).then_some(poll_interval),
        };
        loops.spawn("relay".into(), cadence, |shutdown, health| async move {
            if let Err(e) = relay.run_with_health(shutdown, &health).await {
                health.failure(&e.to_string());
                tracing::error!(error = %e, "outbox relay stopped with an error");
            }
        });
        Some(stats)
    }

    /// Whether the relay reads the WAL (feature `postgres-wal`, `wal()` given).
    fn streams_wal(&self) -> bool {
        #[cfg(feature = "postgres-wal")]
        if self.wal.is_some() {
            return true;
        }
        false
    }

    /// The retention janitor, when retention is on.
    pub(crate) fn start_janitor(&self, worker_id: &str, loops: &mut Loops) {
        let Some(janitor) = self.retention.clone() else {
            return;
        };
        let (db, instance) = (self.db.clone(), format!("{worker_id}/janitor"));
        let cadence = Some(janitor.interval);
        loops.spawn("janitor".into(), cadence, |shutdown, health| async move {
            run_janitor(db, janitor, instance, shutdown, &health).await;
        });
    }

    /// The loop that samples the backlog's gauges, when metrics are on.
    pub(crate) fn start_sampler(&self, loops: &mut Loops) {
        let Some(interval) = self.metrics_interval else {
            return;
        };
        let db = self.db.clone();
        let database = loops.label.clone();
        loops.spawn(
            "metrics".into(),
            Some(interval),
            |shutdown, health| async move {
                let mut failures = 0;
                loop {
                    match crate::metrics::sample_database(&db, database.as_deref()).await {
                        Ok(()) => {
                            failures = 0;
                            health.success();
                        }
                        Err(e) => {
                            failures += 1;
                            health.failure(&e.to_string());
                        }
                    }
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(pause_after(interval, failures)) => {}
                    }
                }
            },
        );
    }
}
