//! [`OutboxTransaction`]: a SeaORM transaction that writes its buffered events right before
//! `COMMIT` and wakes the relay right after.

use std::{
    borrow::Cow,
    collections::BTreeMap,
    fmt,
    future::Future,
    mem,
    pin::Pin,
    sync::{Arc, Mutex},
};

use sea_orm::{
    AccessMode, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr, IsolationLevel,
    Statement, TransactionOptions, TransactionSession, TransactionTrait,
};
use uuid::Uuid;

use crate::{
    envelope::{RESERVED_ATTRIBUTES, is_valid_extension_name},
    error::{EnqueueError, OutboxError, TransactionError},
    event::{DomainEvent, EventId},
    outbox::Outbox,
    store,
    trace::TraceContext,
};

/// User headers given at enqueue. They travel as CloudEvents extension attributes, so names are
/// `a-z0-9`, at most 20 characters, and not one of the SDK's own attributes.
pub type Headers = BTreeMap<String, String>;

/// Longest aggregate id, dedup key or source the tables hold.
const MAX_KEY_CHARS: usize = 255;

pub use crate::event::SkippedEvent;
pub(crate) use crate::store::outbox::PendingEvent;
use crate::store::scheduled::{Due, ScheduledEvent};

/// What a commit wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use]
pub struct CommitReport {
    /// Event rows written to the outbox.
    pub written: usize,
    /// Events skipped as duplicates of an existing `(event_type, dedup_key)`.
    pub skipped: Vec<SkippedEvent>,
    /// For a savepoint: events handed to the enclosing transaction, written when it commits.
    pub carried_to_parent: usize,
    /// Delayed events written to `outbox_scheduled` (`enqueue_at`, `enqueue_after`).
    pub scheduled: usize,
}

/// How much a transaction level had buffered at some point (see `OutboxTransaction::rewind`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BufferMark {
    events: usize,
    scheduled: usize,
    after_commit: usize,
}

/// A delayed event as buffered, with its instant when it has one (the test kit's view).
#[cfg(feature = "testing")]
pub(crate) type BufferedScheduled = (PendingEvent, Option<chrono::DateTime<chrono::Utc>>);

/// A callback run once the outermost transaction committed.
type AfterCommit = Box<dyn FnOnce() + Send + 'static>;

/// Events and after-commit callbacks buffered by one transaction level.
#[derive(Default)]
struct Buffer {
    events: Vec<PendingEvent>,
    /// Delayed events, written to `outbox_scheduled`.
    scheduled: Vec<ScheduledEvent>,
    after_commit: Vec<AfterCommit>,
    /// Committed or rolled back: a savepoint releasing into it now has nowhere to go.
    closed: bool,
    /// A statement of this level (or of a savepoint released into it) failed, or its rows were
    /// streamed: the transaction may be aborted (see `OutboxTransaction::surface_an_abort`).
    may_be_aborted: bool,
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("events", &self.events)
            .field("scheduled", &self.scheduled)
            .field("after_commit", &self.after_commit.len())
            .field("closed", &self.closed)
            .field("may_be_aborted", &self.may_be_aborted)
            .finish()
    }
}

/// A database transaction that commits business rows and their events together.
///
/// Begun with [`Outbox::begin`]. It implements SeaORM's [`ConnectionTrait`] and
/// [`TransactionTrait`], so every SeaORM API accepts `&tx`. [`enqueue`](Self::enqueue) serializes
/// an event at once and buffers it; [`commit`](Self::commit) writes the buffer with multi-row
/// `INSERT`s, commits, then wakes the relay. Dropping the transaction, or
/// [`rollback`](Self::rollback), discards rows and events alike. There is no way to commit without
/// writing the buffered events.
///
/// [`savepoint`](Self::savepoint) (or `TransactionTrait::begin`) opens a nested transaction:
/// events enqueued in it join the enclosing transaction when it commits (releases) and vanish
/// when it rolls back.
pub struct OutboxTransaction {
    outbox: Outbox,
    db: DatabaseConnection,
    txn: DatabaseTransaction,
    buffer: Arc<Mutex<Buffer>>,
    parent: Option<Arc<Mutex<Buffer>>>,
    /// Begun at READ COMMITTED or below: its locking reads take no gap locks.
    read_committed: bool,
}

impl fmt::Debug for OutboxTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutboxTransaction")
            .field("source", &self.outbox.source())
            .field("backend", &self.txn.get_database_backend())
            .field("buffered", &self.buffered())
            .field("savepoint", &self.parent.is_some())
            .finish()
    }
}

fn lock(buffer: &Mutex<Buffer>) -> std::sync::MutexGuard<'_, Buffer> {
    // A panic while holding this lock cannot leave the buffer half-written: pushes are atomic.
    buffer
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Beginning transactions: here, beside the transaction they begin, so that the handle does not
/// depend on the transaction's module.
impl Outbox {
    /// Begin a transaction whose events are written right before it commits.
    pub async fn begin(&self, db: &DatabaseConnection) -> Result<OutboxTransaction, OutboxError> {
        let options = if self.inner.sqlite_immediate {
            store::Dialect::of(db).immediate_transaction()
        } else {
            TransactionOptions::default()
        };
        self.begin_with_options(db, options).await
    }

    /// Begin with an isolation level, access mode or SQLite mode of your choice.
    pub async fn begin_with_options(
        &self,
        db: &DatabaseConnection,
        options: TransactionOptions,
    ) -> Result<OutboxTransaction, OutboxError> {
        let read_committed = matches!(
            options.isolation_level,
            Some(IsolationLevel::ReadCommitted | IsolationLevel::ReadUncommitted)
        );
        let txn = db.begin_with_options(options).await?;
        Ok(OutboxTransaction::root(
            self.clone(),
            db.clone(),
            txn,
            read_committed,
        ))
    }

    /// Run `f` in a transaction: commit its rows and events on `Ok`, roll back both on `Err`.
    ///
    /// ```no_run
    /// # async fn demo(outbox: outbox_runtime::Outbox, db: sea_orm::DatabaseConnection) {
    /// let n: Result<u64, outbox_runtime::TransactionError<sea_orm::DbErr>> = outbox
    ///     .transaction(&db, |tx| Box::pin(async move {
    ///         // insert rows with `tx`, `tx.enqueue(&event)`…
    ///         Ok(1)
    ///     }))
    ///     .await;
    /// # }
    /// ```
    pub async fn transaction<F, T, E>(
        &self,
        db: &DatabaseConnection,
        f: F,
    ) -> Result<T, TransactionError<E>>
    where
        F: for<'c> FnOnce(
                &'c OutboxTransaction,
            ) -> Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'c>>
            + Send,
        T: Send,
        E: Send,
    {
        let tx = self.begin(db).await?;
        match f(&tx).await {
            Ok(value) => {
                let _report = tx.commit().await?;
                Ok(value)
            }
            Err(e) => {
                tx.rollback().await?;
                Err(TransactionError::Callback(e))
            }
        }
    }
}

impl OutboxTransaction {
    pub(crate) fn root(
        outbox: Outbox,
        db: DatabaseConnection,
        txn: DatabaseTransaction,
        read_committed: bool,
    ) -> Self {
        OutboxTransaction {
            outbox,
            db,
            txn,
            buffer: Arc::default(),
            parent: None,
            read_committed,
        }
    }

    /// Buffer `event` to be written when this transaction commits. Returns its id.
    ///
    /// The event is serialized now: an error here leaves the transaction usable and nothing
    /// buffered. The W3C trace context current at this call ([`TraceContext::current`]) travels
    /// with the event.
    pub fn enqueue<E: DomainEvent>(&self, event: &E) -> Result<EventId, EnqueueError> {
        self.enqueue_with_headers(event, Headers::new())
    }

    /// [`enqueue`](Self::enqueue) with user headers, carried as CloudEvents extension attributes.
    pub fn enqueue_with_headers<E: DomainEvent>(
        &self,
        event: &E,
        headers: Headers,
    ) -> Result<EventId, EnqueueError> {
        let span = tracing::debug_span!("outbox.enqueue", event_type = E::EVENT_TYPE);
        let _entered = span.enter();
        let pending = self.prepare(event, headers)?;
        let id = pending.event_id;
        tracing::debug!(
            event_id = %id, event_type = E::EVENT_TYPE, aggregate_id = %pending.aggregate_id,
            traced = pending.headers.contains("traceparent"), "outbox event enqueued"
        );
        lock(&self.buffer).events.push(pending);
        Ok(id)
    }

    /// Buffer `event` to be published at `when`, not before: it is committed with this
    /// transaction and kept apart (in `outbox_scheduled`) until due, when a relay moves it into
    /// the outbox as if it were committed then. Returns its id.
    ///
    /// **Order.** A delayed event takes its place in its aggregate's order when it becomes due:
    /// the aggregate's events sent before then go before it, those committed after then go after
    /// it, and it holds nothing back while it waits. A time in the past is due at once.
    ///
    /// It is published within about the relay's `poll_interval` of `when` (the relay looks for
    /// due events at most that often), then retried like any event if the publish fails. An event
    /// with an aggregate version is refused: consumers' version guard would drop it as stale once
    /// later versions were handled. A dedup key is checked against the delayed events waiting at
    /// commit, and against the outbox when the event becomes due (a duplicate then is dropped,
    /// with a warning).
    pub fn enqueue_at<E: DomainEvent>(
        &self,
        event: &E,
        when: chrono::DateTime<chrono::Utc>,
    ) -> Result<EventId, EnqueueError> {
        self.schedule(event, Due::At(when))
    }

    /// [`enqueue_at`](Self::enqueue_at) `delay` after the commit, by the database's clock.
    pub fn enqueue_after<E: DomainEvent>(
        &self,
        event: &E,
        delay: std::time::Duration,
    ) -> Result<EventId, EnqueueError> {
        self.schedule(event, Due::After(delay))
    }

    fn schedule<E: DomainEvent>(&self, event: &E, due: Due) -> Result<EventId, EnqueueError> {
        let pending = self.prepare(event, Headers::new())?;
        if pending.aggregate_version.is_some() {
            return Err(EnqueueError::InvalidField {
                event_type: E::EVENT_TYPE,
                field: "aggregate version",
                reason: "a delayed event cannot carry one: it joins its aggregate's order when \
                         due, and consumers' version guard would drop it as stale"
                    .into(),
            });
        }
        let id = pending.event_id;
        tracing::debug!(event_id = %id, event_type = E::EVENT_TYPE, ?due, "outbox event scheduled");
        lock(&self.buffer).scheduled.push(ScheduledEvent {
            event: pending,
            due,
        });
        Ok(id)
    }

    fn prepare<E: DomainEvent>(
        &self,
        event: &E,
        user_headers: Headers,
    ) -> Result<PendingEvent, EnqueueError> {
        let event_type = E::EVENT_TYPE;
        let invalid = |field: &'static str, reason: String| EnqueueError::InvalidField {
            event_type,
            field,
            reason,
        };
        let payload = serde_json::to_string(event)
            .map_err(|error| EnqueueError::Serialize { event_type, error })?;
        let limit = self.outbox.inner.max_payload_bytes;
        if payload.len() > limit {
            return Err(EnqueueError::PayloadTooLarge {
                event_type,
                size: payload.len(),
                limit,
            });
        }
        if store::Dialect::of(&self.txn).json_rejects_nul() && has_escaped_nul(&payload) {
            return Err(invalid(
                "payload",
                "a string holds a NUL character (\\u0000), which PostgreSQL's jsonb cannot store"
                    .into(),
            ));
        }
        let aggregate_id = event.aggregate_id();
        check_key(&aggregate_id).map_err(|r| invalid("aggregate id", r))?;
        let dedup_key = event.dedup_key();
        if let Some(key) = &dedup_key {
            check_key(key).map_err(|r| invalid("dedup key", r))?;
        }

        let mut headers = serde_json::Map::new();
        for (name, value) in user_headers {
            if !is_valid_extension_name(&name) {
                return Err(invalid(
                    "header name",
                    format!(
                        "`{name}` must be 1 to 20 characters of a-z and 0-9 (a CloudEvents extension name)"
                    ),
                ));
            }
            if RESERVED_ATTRIBUTES.contains(&name.as_str()) {
                return Err(invalid(
                    "header name",
                    format!("`{name}` is a CloudEvents or outbox attribute; choose another name"),
                ));
            }
            if value.contains('\0') {
                return Err(invalid(
                    "header value",
                    format!("`{name}` holds a NUL character, which CloudEvents attributes may not"),
                ));
            }
            headers.insert(name, value.into());
        }
        if let Some(trace) = TraceContext::current() {
            headers.insert("traceparent".into(), trace.traceparent().into());
            if let Some(state) = trace.tracestate() {
                headers.insert("tracestate".into(), state.into());
            }
        }

        Ok(PendingEvent {
            event_id: Uuid::now_v7(),
            source: self.outbox.source().to_owned(),
            event_type: Cow::Borrowed(event_type),
            schema_version: E::SCHEMA_VERSION,
            aggregate_type: Cow::Borrowed(E::AGGREGATE_TYPE),
            aggregate_id,
            aggregate_version: event.aggregate_version(),
            dedup_key,
            payload,
            headers: serde_json::Value::Object(headers).to_string(),
        })
    }

    /// Run `f` right after the outermost transaction committed: never for a change that did not
    /// commit. It is dropped unrun when this transaction (or the savepoint it was registered in)
    /// rolls back or is dropped, or when the commit fails. Registered in a savepoint, it joins
    /// the enclosing transaction when the savepoint is released.
    ///
    /// For side effects that must follow the commit, not precede it: an in-process
    /// notification, a cache invalidation, a measurement. It runs on the committing task after
    /// the relays were woken, in registration order, and must not block.
    ///
    /// ```ignore
    /// let order_id = 42;
    /// tx.after_commit(move || println!("order {order_id} committed"));
    /// ```
    pub fn after_commit(&self, f: impl FnOnce() + Send + 'static) {
        lock(&self.buffer).after_commit.push(Box::new(f));
    }

    /// How much this level has buffered: what [`Self::rewind`] goes back to.
    pub(crate) fn mark(&self) -> BufferMark {
        let buffer = lock(&self.buffer);
        BufferMark {
            events: buffer.events.len(),
            scheduled: buffer.scheduled.len(),
            after_commit: buffer.after_commit.len(),
        }
    }

    /// Drop the events and callbacks buffered since `mark`: for work rolled back to a savepoint
    /// taken at that mark with plain SQL.
    pub(crate) fn rewind(&self, mark: BufferMark) {
        let mut buffer = lock(&self.buffer);
        buffer.events.truncate(mark.events);
        buffer.scheduled.truncate(mark.scheduled);
        buffer.after_commit.truncate(mark.after_commit);
    }

    /// How many events are buffered at this level.
    pub fn buffered(&self) -> usize {
        lock(&self.buffer).events.len()
    }

    /// Copies of the events and delayed events buffered at this level (the test kit's view;
    /// a delayed event with its instant when it has one).
    #[cfg(feature = "testing")]
    pub(crate) fn buffered_events(&self) -> (Vec<PendingEvent>, Vec<BufferedScheduled>) {
        let buffer = lock(&self.buffer);
        let scheduled = buffer
            .scheduled
            .iter()
            .map(|s| {
                let at = match s.due {
                    Due::At(at) => Some(at),
                    Due::After(_) => None,
                };
                (s.event.clone(), at)
            })
            .collect();
        (buffer.events.clone(), scheduled)
    }

    /// The outbox handle this transaction belongs to.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// Whether this is a savepoint inside another transaction.
    pub fn is_savepoint(&self) -> bool {
        self.parent.is_some()
    }

    /// Open a savepoint: a nested transaction whose events join this one when it commits.
    pub async fn savepoint(&self) -> Result<OutboxTransaction, OutboxError> {
        let txn = TransactionTrait::begin(&self.txn).await?;
        Ok(OutboxTransaction {
            outbox: self.outbox.clone(),
            db: self.db.clone(),
            txn,
            buffer: Arc::default(),
            parent: Some(self.buffer.clone()),
            read_committed: self.read_committed,
        })
    }

    /// Write the buffered events, commit, then wake the relays.
    ///
    /// For a savepoint: release it and hand its events to the enclosing transaction.
    /// If writing the events fails, nothing is committed: rows and events roll back together.
    pub async fn commit(self) -> Result<CommitReport, OutboxError> {
        // The relay's fast path, when one runs on this handle: the INSERT writes the events
        // already claimed by it, and they are handed over after COMMIT. Where its check of the
        // aggregate's earlier events is a locking read (MySQL), only at READ COMMITTED: at
        // REPEATABLE READ it would take gap locks that deadlock concurrent producers.
        let gap_locks =
            !self.read_committed && store::Dialect::of(&self.txn).insert_check_locks_gaps();
        let fast = if self.parent.is_none() && self.buffered() > 0 && !gap_locks {
            self.outbox.fast_path()
        } else {
            None
        };
        let (outbox, db) = (self.outbox.clone(), self.db.clone());
        let before = fast.as_ref().map(|f| f.before_commit());
        let Committed {
            report,
            owned,
            after_commit,
        } = self.commit_with(fast.as_ref().map(|f| f.claim())).await?;
        if let Some((fast, before)) = fast.zip(before)
            && !owned.is_empty()
            && !fast.hand_over(&db, owned, before)
        {
            // The relay stopped meanwhile and hands the rows back to PENDING: wake the next.
            outbox.committed(&db);
        }
        for f in after_commit {
            f();
        }
        Ok(report)
    }

    /// Commit as a relay's fast path sees it: each event is written claimed by `owner` under
    /// `token` for `lease`, unless an earlier event of its aggregate is unsent; returns the
    /// report and the events written claimed, in id order, as the fast path publishes them.
    /// Nothing publishes them: for the SDK's tests of the state machine.
    #[cfg(feature = "test-util")]
    pub async fn commit_claimed(
        self,
        owner: &str,
        token: Uuid,
        lease: std::time::Duration,
    ) -> Result<(CommitReport, Vec<store::relay::ClaimedEvent>), OutboxError> {
        let claim = store::outbox::FastClaim {
            owner,
            token,
            lease,
            ordering: true,
            floor: None,
        };
        let committed = self.commit_with(Some(claim)).await?;
        for f in committed.after_commit {
            f();
        }
        Ok((committed.report, committed.owned))
    }

    /// Write the buffered events (claimed by `fast`, where they may be), commit, wake the
    /// relays if any event is left to them; the callbacks are the caller's to run.
    async fn commit_with(
        self,
        fast: Option<store::outbox::FastClaim<'_>>,
    ) -> Result<Committed, OutboxError> {
        let (events, scheduled, after_commit) = {
            let mut buffer = lock(&self.buffer);
            buffer.closed = true;
            (
                mem::take(&mut buffer.events),
                mem::take(&mut buffer.scheduled),
                mem::take(&mut buffer.after_commit),
            )
        };
        if let Some(parent) = self.parent.clone() {
            return self
                .commit_into_parent(&parent, events, scheduled, after_commit)
                .await;
        }
        let outcome = if events.is_empty() {
            if !after_commit.is_empty() && scheduled.is_empty() {
                self.surface_an_abort().await?;
            }
            store::InsertOutcome::default()
        } else {
            store::insert_events(
                &self.txn,
                &events,
                self.outbox.inner.insert_batch_rows,
                fast,
            )
            .await?
        };
        let delayed = if scheduled.is_empty() {
            store::scheduled::Scheduled::default()
        } else {
            store::scheduled::insert(&self.txn, &scheduled).await?
        };
        self.txn.commit().await?;
        if outcome.written > 0 {
            crate::metrics::events_written(outcome.written);
            // Rows the fast path owns need no relay.
            if outcome.pending() > 0 {
                self.outbox.committed(&self.db);
            }
        }
        let mut events: Vec<Option<PendingEvent>> = events.into_iter().map(Some).collect();
        let owned = outcome
            .owned
            .into_iter()
            .filter_map(|row| events[row.index].take().map(|e| e.into_claimed(row)))
            .collect();
        let mut skipped = outcome.skipped;
        skipped.extend(delayed.skipped);
        Ok(Committed {
            report: CommitReport {
                written: outcome.written,
                skipped,
                carried_to_parent: 0,
                scheduled: delayed.written,
            },
            owned,
            after_commit,
        })
    }

    /// A savepoint's commit: release it and carry its events and callbacks to the enclosing
    /// transaction, which writes them when it commits.
    async fn commit_into_parent(
        self,
        parent: &Arc<Mutex<Buffer>>,
        events: Vec<PendingEvent>,
        scheduled: Vec<ScheduledEvent>,
        after_commit: Vec<AfterCommit>,
    ) -> Result<Committed, OutboxError> {
        if lock(parent).closed {
            return Err(OutboxError::Database(DbErr::Custom(
                "savepoint committed after its enclosing transaction ended; its events are discarded"
                    .into(),
            )));
        }
        let aborted = lock(&self.buffer).may_be_aborted;
        if let Err(e) = self.txn.commit().await {
            // The release failed: the enclosing transaction is aborted until it rolls back.
            lock(parent).may_be_aborted = true;
            return Err(e.into());
        }
        let carried = events.len() + scheduled.len();
        let mut parent = lock(parent);
        parent.may_be_aborted |= aborted;
        parent.events.extend(events);
        parent.scheduled.extend(scheduled);
        parent.after_commit.extend(after_commit);
        Ok(Committed {
            report: CommitReport {
                carried_to_parent: carried,
                ..CommitReport::default()
            },
            owned: Vec::new(),
            after_commit: Vec::new(),
        })
    }

    /// PostgreSQL answers COMMIT of a transaction aborted by a failed statement with a
    /// rollback, not an error; callbacks must not run for it, so a transaction without events
    /// (whose INSERT would surface the abort) asks once before committing, unless every
    /// statement it ran through this handle answered without an error (only an error aborts a
    /// transaction).
    async fn surface_an_abort(&self) -> Result<(), OutboxError> {
        if store::Dialect::of(&self.txn).commit_hides_abort() && lock(&self.buffer).may_be_aborted {
            let backend = self.txn.get_database_backend();
            self.txn
                .execute_raw(Statement::from_string(backend, "SELECT 1"))
                .await?;
        }
        Ok(())
    }

    /// Run one statement of the caller's, noting in the buffer when it fails. (One whose future
    /// is dropped before its answer needs no note: the driver reports its error at the next
    /// statement on the connection, the commit at the latest.)
    async fn watched<T>(
        &self,
        statement: impl Future<Output = Result<T, DbErr>>,
    ) -> Result<T, DbErr> {
        let result = statement.await;
        if result.is_err() {
            lock(&self.buffer).may_be_aborted = true;
        }
        result
    }

    /// Roll back rows and events.
    pub async fn rollback(self) -> Result<(), OutboxError> {
        {
            let mut buffer = lock(&self.buffer);
            buffer.closed = true;
            buffer.events.clear();
            buffer.scheduled.clear();
            buffer.after_commit.clear();
        }
        self.txn.rollback().await?;
        Ok(())
    }
}

/// What a commit did, and what is left to do after it.
struct Committed {
    report: CommitReport,
    /// The events written claimed by the fast path, in id order.
    owned: Vec<store::relay::ClaimedEvent>,
    after_commit: Vec<AfterCommit>,
}

fn check_key(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("it is empty".into());
    }
    if value.contains('\0') {
        return Err(
            "it holds a NUL character, which PostgreSQL cannot store and CloudEvents attributes \
             may not"
                .into(),
        );
    }
    let chars = value.chars().count();
    if chars > MAX_KEY_CHARS {
        return Err(format!(
            "it is {chars} characters, over the limit of {MAX_KEY_CHARS}"
        ));
    }
    Ok(())
}

/// Whether serialized JSON holds `\u0000` as an escape (not a literal backslash before `u0000`).
fn has_escaped_nul(json: &str) -> bool {
    let bytes = json.as_bytes();
    let mut from = 0;
    while let Some(at) = json[from..].find("\\u0000").map(|i| i + from) {
        let backslashes = bytes[..at]
            .iter()
            .rev()
            .take_while(|&&b| b == b'\\')
            .count();
        if backslashes % 2 == 0 {
            return true;
        }
        from = at + 1;
    }
    false
}

/// Implements SeaORM's `ConnectionTrait` for a wrapper by forwarding every call to one field;
/// with `|this, statement| …`, each statement's future is passed through that expression.
macro_rules! forward_connection_trait {
    ($ty:ty, $field:ident) => {
        $crate::transaction::forward_connection_trait!($ty, $field, |_this, statement| statement);
    };
    ($ty:ty, $field:ident, |$this:ident, $statement:ident| $wrap:expr) => {
        #[async_trait::async_trait]
        impl sea_orm::ConnectionTrait for $ty {
            fn get_database_backend(&self) -> sea_orm::DbBackend {
                sea_orm::ConnectionTrait::get_database_backend(&self.$field)
            }

            async fn execute_raw(
                &self,
                stmt: sea_orm::Statement,
            ) -> Result<sea_orm::ExecResult, sea_orm::DbErr> {
                let $this = self;
                let $statement = sea_orm::ConnectionTrait::execute_raw(&$this.$field, stmt);
                $wrap.await
            }

            async fn execute_unprepared(
                &self,
                sql: &str,
            ) -> Result<sea_orm::ExecResult, sea_orm::DbErr> {
                let $this = self;
                let $statement = sea_orm::ConnectionTrait::execute_unprepared(&$this.$field, sql);
                $wrap.await
            }

            async fn query_one_raw(
                &self,
                stmt: sea_orm::Statement,
            ) -> Result<Option<sea_orm::QueryResult>, sea_orm::DbErr> {
                let $this = self;
                let $statement = sea_orm::ConnectionTrait::query_one_raw(&$this.$field, stmt);
                $wrap.await
            }

            async fn query_all_raw(
                &self,
                stmt: sea_orm::Statement,
            ) -> Result<Vec<sea_orm::QueryResult>, sea_orm::DbErr> {
                let $this = self;
                let $statement = sea_orm::ConnectionTrait::query_all_raw(&$this.$field, stmt);
                $wrap.await
            }

            fn support_returning(&self) -> bool {
                sea_orm::ConnectionTrait::support_returning(&self.$field)
            }
        }
    };
}
pub(crate) use forward_connection_trait;

forward_connection_trait!(OutboxTransaction, txn, |tx, statement| tx
    .watched(statement));

#[cfg(feature = "stream")]
impl sea_orm::StreamTrait for OutboxTransaction {
    type Stream<'a> = <DatabaseTransaction as sea_orm::StreamTrait>::Stream<'a>;

    fn get_database_backend(&self) -> sea_orm::DbBackend {
        ConnectionTrait::get_database_backend(&self.txn)
    }

    fn stream_raw<'a>(
        &'a self,
        stmt: sea_orm::Statement,
    ) -> Pin<Box<dyn Future<Output = Result<Self::Stream<'a>, DbErr>> + 'a + Send>> {
        // A row of the stream may fail where this handle does not see it.
        lock(&self.buffer).may_be_aborted = true;
        self.txn.stream_raw(stmt)
    }
}

#[async_trait::async_trait]
impl TransactionSession for OutboxTransaction {
    /// Same as the inherent [`OutboxTransaction::commit`]: events are written first.
    async fn commit(self) -> Result<(), DbErr> {
        OutboxTransaction::commit(self)
            .await
            .map(drop)
            .map_err(OutboxError::into_db_err)
    }

    async fn rollback(self) -> Result<(), DbErr> {
        OutboxTransaction::rollback(self)
            .await
            .map_err(OutboxError::into_db_err)
    }
}

/// Nested transactions are savepoints; isolation level and access mode apply to the outermost
/// transaction only and are ignored here.
#[async_trait::async_trait]
impl TransactionTrait for OutboxTransaction {
    type Transaction = OutboxTransaction;

    async fn begin(&self) -> Result<OutboxTransaction, DbErr> {
        self.savepoint().await.map_err(OutboxError::into_db_err)
    }

    async fn begin_with_config(
        &self,
        _isolation_level: Option<IsolationLevel>,
        _access_mode: Option<AccessMode>,
    ) -> Result<OutboxTransaction, DbErr> {
        self.savepoint().await.map_err(OutboxError::into_db_err)
    }

    async fn begin_with_options(
        &self,
        _options: TransactionOptions,
    ) -> Result<OutboxTransaction, DbErr> {
        self.savepoint().await.map_err(OutboxError::into_db_err)
    }

    async fn transaction<F, T, E>(&self, callback: F) -> Result<T, sea_orm::TransactionError<E>>
    where
        F: for<'c> FnOnce(
                &'c OutboxTransaction,
            ) -> Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'c>>
            + Send,
        T: Send,
        E: fmt::Display + fmt::Debug + Send,
    {
        let savepoint = self
            .savepoint()
            .await
            .map_err(|e| sea_orm::TransactionError::Connection(OutboxError::into_db_err(e)))?;
        match callback(&savepoint).await {
            Ok(value) => {
                TransactionSession::commit(savepoint)
                    .await
                    .map_err(sea_orm::TransactionError::Connection)?;
                Ok(value)
            }
            Err(e) => {
                TransactionSession::rollback(savepoint)
                    .await
                    .map_err(sea_orm::TransactionError::Connection)?;
                Err(sea_orm::TransactionError::Transaction(e))
            }
        }
    }

    async fn transaction_with_config<F, T, E>(
        &self,
        callback: F,
        _isolation_level: Option<IsolationLevel>,
        _access_mode: Option<AccessMode>,
    ) -> Result<T, sea_orm::TransactionError<E>>
    where
        F: for<'c> FnOnce(
                &'c OutboxTransaction,
            ) -> Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'c>>
            + Send,
        T: Send,
        E: fmt::Display + fmt::Debug + Send,
    {
        TransactionTrait::transaction(self, callback).await
    }
}

#[cfg(test)]
mod tests {
    use super::has_escaped_nul;

    #[test]
    fn escaped_nul_is_found_and_a_literal_backslash_is_not() {
        assert!(has_escaped_nul(r#"{"a":"x\u0000y"}"#));
        assert!(has_escaped_nul(r#"{"a":"\\\u0000"}"#));
        assert!(!has_escaped_nul(r#"{"a":"\\u0000"}"#));
        assert!(!has_escaped_nul(r#"{"a":"u0000"}"#));
    }
}
