//! The handlers linked into this binary: what `#[inbox_handler]` registered, grouped by
//! consumer, with duplicates refused.

use std::collections::BTreeMap;

use super::HandlerRegistration;

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
