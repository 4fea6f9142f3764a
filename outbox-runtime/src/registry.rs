//! Start-up checks over everything the macros registered at compile time.
//!
//! `#[derive(DomainEvent)]` submits an [`EventRegistration`] with the `inventory` crate. A
//! registration is seen only if the crate holding it is linked into the binary: a crate whose items
//! are never used may be dropped by the linker, so reference it (e.g. `use other_crate as _;`)
//! and check the catalogue at start-up with [`EventCatalogue::require`].

use std::collections::BTreeMap;

pub use crate::event::{EventRegistration, SchemaFn};

/// Every event type linked into this binary, in a stable order (event type, then version).
pub fn events() -> Vec<&'static EventRegistration> {
    let mut all: Vec<&'static EventRegistration> =
        inventory::iter::<EventRegistration>.into_iter().collect();
    all.sort_by(|a, b| {
        (a.event_type, a.schema_version, a.file, a.line).cmp(&(
            b.event_type,
            b.schema_version,
            b.file,
            b.line,
        ))
    });
    all
}

/// The checked catalogue of event types: one Rust type per `(event type, schema version)`.
#[derive(Debug, Clone)]
pub struct EventCatalogue {
    by_type: BTreeMap<(&'static str, u32), &'static EventRegistration>,
}

/// A problem with the registered event types.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// Two Rust types claim the same event type and schema version.
    #[error(
        "event type `{event_type}` version {schema_version} is declared twice: at {first} and at {second}; \
         give one of them another name or version"
    )]
    DuplicateEvent {
        /// The event type.
        event_type: &'static str,
        /// The schema version.
        schema_version: u32,
        /// Where the first declaration is.
        first: String,
        /// Where the second declaration is.
        second: String,
    },
    /// One event type belongs to two aggregate types.
    #[error(
        "event type `{event_type}` is declared for aggregate `{first_aggregate}` at {first} and for \
         aggregate `{second_aggregate}` at {second}"
    )]
    AggregateMismatch {
        /// The event type.
        event_type: &'static str,
        /// The first aggregate type.
        first_aggregate: &'static str,
        /// Where it is declared.
        first: String,
        /// The second aggregate type.
        second_aggregate: &'static str,
        /// Where it is declared.
        second: String,
    },
    /// An event type the application requires is not linked in.
    #[error(
        "event type `{0}` is not registered: is the crate declaring it linked into this binary?"
    )]
    Missing(String),
}

impl EventCatalogue {
    /// Collect and check the registrations linked into this binary; every problem is reported.
    pub fn load() -> Result<Self, Vec<RegistryError>> {
        Self::from_registrations(events())
    }

    /// Check a given set of registrations.
    pub fn from_registrations(
        registrations: impl IntoIterator<Item = &'static EventRegistration>,
    ) -> Result<Self, Vec<RegistryError>> {
        let mut by_type: BTreeMap<(&'static str, u32), &'static EventRegistration> =
            BTreeMap::new();
        let mut aggregate_of: BTreeMap<&'static str, &'static EventRegistration> = BTreeMap::new();
        let mut errors = Vec::new();
        for reg in registrations {
            if let Some(first) = by_type.get(&(reg.event_type, reg.schema_version)) {
                if *first != reg {
                    errors.push(RegistryError::DuplicateEvent {
                        event_type: reg.event_type,
                        schema_version: reg.schema_version,
                        first: first.location(),
                        second: reg.location(),
                    });
                }
                continue;
            }
            if let Some(first) = aggregate_of.get(reg.event_type) {
                if first.aggregate_type != reg.aggregate_type {
                    errors.push(RegistryError::AggregateMismatch {
                        event_type: reg.event_type,
                        first_aggregate: first.aggregate_type,
                        first: first.location(),
                        second_aggregate: reg.aggregate_type,
                        second: reg.location(),
                    });
                }
            } else {
                aggregate_of.insert(reg.event_type, reg);
            }
            by_type.insert((reg.event_type, reg.schema_version), reg);
        }
        if errors.is_empty() {
            Ok(EventCatalogue { by_type })
        } else {
            Err(errors)
        }
    }

    /// Fail unless every listed event type is registered (in any version).
    pub fn require<'a>(
        &self,
        event_types: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), Vec<RegistryError>> {
        let missing: Vec<RegistryError> = event_types
            .into_iter()
            .filter(|t| !self.by_type.keys().any(|(known, _)| known == t))
            .map(|t| RegistryError::Missing(t.to_owned()))
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing)
        }
    }

    /// The registration of an event type and version.
    pub fn get(&self, event_type: &str, schema_version: u32) -> Option<&'static EventRegistration> {
        self.by_type
            .iter()
            .find(|((t, v), _)| *t == event_type && *v == schema_version)
            .map(|(_, r)| *r)
    }

    /// Every registration, ordered by event type and version.
    pub fn iter(&self) -> impl Iterator<Item = &'static EventRegistration> + '_ {
        self.by_type.values().copied()
    }

    /// How many `(event type, version)` pairs are registered.
    pub fn len(&self) -> usize {
        self.by_type.len()
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.by_type.is_empty()
    }

    /// Log what was found, one line per event type.
    pub fn log(&self) {
        tracing::info!(count = self.len(), "outbox event types registered");
        for reg in self.iter() {
            tracing::info!(
                event_type = reg.event_type,
                version = reg.schema_version,
                aggregate = reg.aggregate_type,
                at = %reg.location(),
                "outbox event type"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static A: EventRegistration = EventRegistration {
        event_type: "order.placed",
        aggregate_type: "order",
        schema_version: 1,
        rust_type: "OrderPlaced",
        module_path: "shop::orders",
        file: "src/orders.rs",
        line: 10,
        schema: || None,
    };
    static B: EventRegistration = EventRegistration {
        rust_type: "OrderPlacedAgain",
        file: "src/legacy.rs",
        line: 99,
        ..A
    };
    static C: EventRegistration = EventRegistration {
        schema_version: 2,
        aggregate_type: "cart",
        file: "src/cart.rs",
        line: 5,
        ..A
    };

    #[test]
    fn duplicates_name_both_locations() {
        let errors = EventCatalogue::from_registrations([&A, &B]).unwrap_err();
        let text = errors[0].to_string();
        assert!(
            text.contains("src/orders.rs:10 (shop::orders::OrderPlaced)"),
            "{text}"
        );
        assert!(
            text.contains("src/legacy.rs:99 (shop::orders::OrderPlacedAgain)"),
            "{text}"
        );
    }

    #[test]
    fn aggregate_mismatch_and_require() {
        let errors = EventCatalogue::from_registrations([&A, &C]).unwrap_err();
        assert!(matches!(errors[0], RegistryError::AggregateMismatch { .. }));
        let cat = EventCatalogue::from_registrations([&A]).unwrap();
        assert!(cat.require(["order.placed"]).is_ok());
        assert_eq!(
            cat.require(["order.placed", "order.shipped"]).unwrap_err(),
            vec![RegistryError::Missing("order.shipped".into())]
        );
        assert_eq!(cat.get("order.placed", 1), Some(&A));
    }
}
