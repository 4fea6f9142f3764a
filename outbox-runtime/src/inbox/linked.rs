//! The handlers linked into this binary: what `#[inbox_handler]` registered, grouped by
//! consumer, with duplicates refused.

use std::collections::BTreeMap;

use super::HandlerRegistration;
use crate::upcast::{UpcastError, Upcasters};

/// Two handlers claim the same consumer, event type and version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "consumer `{consumer}` has two handlers for `{event_type}` version {schema_version}: {first} and {second}"
)]
pub struct DuplicateHandler {
    /// Consumer.
    pub consumer: String,
    /// Event type.
    pub event_type: String,
    /// Schema version.
    pub schema_version: u32,
    /// Where the first one is.
    pub first: String,
    /// Where the second one is.
    pub second: String,
}

/// One consumer's handlers of this SDK's events (not of external messages), by event type and
/// schema version.
pub(crate) type ByEventType = BTreeMap<&'static str, BTreeMap<u32, &'static HandlerRegistration>>;

/// Index one consumer's `handlers` by event type and version (the first of two for one
/// version; the runtime refuses such duplicates at start).
pub(crate) fn by_event_type<'a>(
    handlers: impl IntoIterator<Item = &'a &'static HandlerRegistration>,
) -> ByEventType {
    let mut index = ByEventType::new();
    for reg in handlers.into_iter().filter(|r| r.source.is_none()) {
        index
            .entry(reg.event_type)
            .or_default()
            .entry(reg.schema_version)
            .or_insert(*reg);
    }
    index
}

/// Every handler linked into this binary, grouped by consumer, checked for duplicates.
pub(crate) fn linked_handlers()
-> Result<BTreeMap<&'static str, Vec<&'static HandlerRegistration>>, DuplicateHandler> {
    handlers_from(inventory::iter::<HandlerRegistration>.into_iter())
}

fn handlers_from(
    registrations: impl Iterator<Item = &'static HandlerRegistration>,
) -> Result<BTreeMap<&'static str, Vec<&'static HandlerRegistration>>, DuplicateHandler> {
    let mut by_consumer: BTreeMap<&'static str, Vec<&'static HandlerRegistration>> =
        BTreeMap::new();
    let mut all: Vec<&'static HandlerRegistration> = registrations.collect();
    all.sort_by_key(|r| {
        (
            r.consumer,
            r.source,
            r.event_type,
            r.schema_version,
            r.file,
            r.line,
        )
    });
    for reg in all {
        let list = by_consumer.entry(reg.consumer).or_default();
        if let Some(first) = list.iter().find(|r| {
            r.source == reg.source
                && r.event_type == reg.event_type
                && r.schema_version == reg.schema_version
        }) {
            return Err(DuplicateHandler {
                consumer: reg.consumer.to_owned(),
                event_type: match reg.source {
                    Some(source) => format!("{} from {source}", reg.event_type),
                    None => reg.event_type.to_owned(),
                },
                schema_version: reg.schema_version,
                first: first.location(),
                second: reg.location(),
            });
        }
        list.push(reg);
    }
    Ok(by_consumer)
}

impl Upcasters {
    /// Gaps in the chains that lead to a consumer's handlers: for each event type it handles,
    /// every version an upcaster reads below a handled version must reach a handled version.
    pub fn check_consumer(
        &self,
        consumer: &str,
        handlers: &[&'static HandlerRegistration],
    ) -> Vec<UpcastError> {
        by_event_type(handlers)
            .iter()
            .filter_map(|(event_type, versions)| {
                self.missing_step(consumer, event_type, versions, |reg| reg.location())
            })
            .collect()
    }
}
