//! Domain events: the [`DomainEvent`] trait and the compile-time event catalogue.

use serde::Serialize;

/// Identifier of one event: a UUIDv7, so ids sort by creation time.
///
/// It is the outbox row's `event_id`, the CloudEvents `id` and the inbox `message_id`.
pub type EventId = uuid::Uuid;

/// A fact that happened to one aggregate, recorded in the outbox with the change that caused it.
///
/// Implement it with `#[derive(DomainEvent)]`:
///
/// ```ignore
/// #[derive(Debug, Serialize, Deserialize, DomainEvent)]
/// #[event(name = "order.placed", aggregate = "order", version = 1)]
/// pub struct OrderPlaced {
///     #[event(aggregate_id)]
///     pub order_id: i64,
///     pub order_no: String,
/// }
/// ```
///
/// The names are stored in the database and sent on the wire: change them only together with every
/// consumer, never by renaming a Rust type or module.
pub trait DomainEvent: Serialize + Send + Sync + 'static {
    /// The event type (`type` in CloudEvents, `event_type` in the outbox), e.g. `order.placed`.
    const EVENT_TYPE: &'static str;
    /// The kind of aggregate the event belongs to, e.g. `order`.
    const AGGREGATE_TYPE: &'static str;
    /// The version of the payload's schema; bump it on an incompatible change.
    const SCHEMA_VERSION: u32;

    /// The id of the aggregate this event belongs to (the CloudEvents `subject`).
    ///
    /// Events of one aggregate are published and handled in the order they were enqueued.
    fn aggregate_id(&self) -> String;

    /// The aggregate's version after this event, when the aggregate tracks one.
    fn aggregate_version(&self) -> Option<i64> {
        None
    }

    /// A producer-side idempotency key: a second event with the same type and key is skipped.
    fn dedup_key(&self) -> Option<String> {
        None
    }
}

/// One event type known at compile time, registered by `#[derive(DomainEvent)]`.
///
/// Registrations are collected with the `inventory` crate: a registration counts only when the crate
/// that holds it is linked into the final binary.
#[derive(Debug, Clone, Copy)]
pub struct EventRegistration {
    /// The event type, e.g. `order.placed`.
    pub event_type: &'static str,
    /// The aggregate type, e.g. `order`.
    pub aggregate_type: &'static str,
    /// The payload's schema version.
    pub schema_version: u32,
    /// The Rust type's name as written (`OrderPlaced`).
    pub rust_type: &'static str,
    /// The module holding the Rust type.
    pub module_path: &'static str,
    /// Source file of the derive.
    pub file: &'static str,
    /// Source line of the derive.
    pub line: u32,
    /// The payload's JSON Schema (draft-07), when the feature `catalogue` is on and the type
    /// implements `schemars::JsonSchema`; see [`catalogue`](crate::catalogue).
    pub schema: SchemaFn,
}

/// What an [`EventRegistration`] calls for its type's JSON Schema (see
/// [`catalogue`](crate::catalogue)).
pub type SchemaFn = fn() -> Option<serde_json::Value>;

/// Equal when they name the same declaration (the schema function follows from it).
impl PartialEq for EventRegistration {
    fn eq(&self, other: &Self) -> bool {
        (
            self.event_type,
            self.aggregate_type,
            self.schema_version,
            self.rust_type,
            self.module_path,
            self.file,
            self.line,
        ) == (
            other.event_type,
            other.aggregate_type,
            other.schema_version,
            other.rust_type,
            other.module_path,
            other.file,
            other.line,
        )
    }
}

impl Eq for EventRegistration {}

impl EventRegistration {
    /// `path/to/file.rs:12 (crate::module::Type)`, for messages.
    pub fn location(&self) -> String {
        crate::util::text::location(self.file, self.line, self.module_path, self.rust_type)
    }
}

inventory::collect!(EventRegistration);

/// An event not written because its `(event_type, dedup_key)` was already in the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedEvent {
    /// The id `enqueue` returned for it (no row has it).
    pub event_id: EventId,
    /// Its type.
    pub event_type: String,
    /// The key that was already present.
    pub dedup_key: String,
}

/// Values usable as `#[event(aggregate_version)]`: integers and `Option`s of them.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be an aggregate version",
    label = "#[event(aggregate_version)] needs an integer or an Option of one",
    note = "aggregate versions are stored as BIGINT: use i64, u32, Option<i64>, …"
)]
pub trait AggregateVersionValue {
    /// The version as an `i64`, `None` when absent or out of range.
    fn to_aggregate_version(&self) -> Option<i64>;
}

macro_rules! impl_aggregate_version {
    ($($t:ty),*) => {$(
        impl AggregateVersionValue for $t {
            fn to_aggregate_version(&self) -> Option<i64> {
                i64::try_from(*self).ok()
            }
        }
    )*};
}
impl_aggregate_version!(i8, i16, i32, i64, u8, u16, u32, u64, usize, isize);

impl<T: AggregateVersionValue> AggregateVersionValue for Option<T> {
    fn to_aggregate_version(&self) -> Option<i64> {
        self.as_ref().and_then(T::to_aggregate_version)
    }
}

impl<T: AggregateVersionValue + ?Sized> AggregateVersionValue for &T {
    fn to_aggregate_version(&self) -> Option<i64> {
        (**self).to_aggregate_version()
    }
}

/// Values usable as `#[event(dedup_key)]`: anything `Display`-like, and `Option`s of those
/// (`None` means "no key").
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a dedup key",
    label = "#[event(dedup_key)] needs a String, an integer, a Uuid, or an Option of one",
    note = "dedup keys are stored as text: convert the field, or derive the key into a String field"
)]
pub trait DedupKeyValue {
    /// The key, `None` for no key.
    fn to_dedup_key(&self) -> Option<String>;
}

macro_rules! impl_dedup_key {
    ($($t:ty),*) => {$(
        impl DedupKeyValue for $t {
            fn to_dedup_key(&self) -> Option<String> {
                Some(self.to_string())
            }
        }
    )*};
}
impl_dedup_key!(
    String,
    str,
    i8,
    i16,
    i32,
    i64,
    i128,
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    isize,
    uuid::Uuid,
    char
);

impl<T: DedupKeyValue> DedupKeyValue for Option<T> {
    fn to_dedup_key(&self) -> Option<String> {
        self.as_ref().and_then(T::to_dedup_key)
    }
}

impl<T: DedupKeyValue + ?Sized> DedupKeyValue for &T {
    fn to_dedup_key(&self) -> Option<String> {
        (**self).to_dedup_key()
    }
}

impl<T: DedupKeyValue + ?Sized> DedupKeyValue for Box<T> {
    fn to_dedup_key(&self) -> Option<String> {
        (**self).to_dedup_key()
    }
}
