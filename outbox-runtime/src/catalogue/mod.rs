//! The event catalogue: every event type linked into a binary, with its schema and the
//! consumers that handle it, as JSON and as an AsyncAPI 3.0 document, and the compatibility
//! check between a committed catalogue and the code.
//!
//! # What it holds
//!
//! [`Catalogue::linked`] reads what the macros registered at compile time: each
//! `#[derive(DomainEvent)]` type (event type, schema version, aggregate type, Rust type), each
//! `#[inbox_handler]` (which consumer takes which event type and version) and each
//! `#[upcaster]`. With the feature `catalogue`, the derive also records the JSON Schema
//! (draft-07) of every event type that implements `schemars::JsonSchema` (schemars 1.x): add
//! `#[derive(schemars::JsonSchema)]` beside `DomainEvent`. Without it, an event's `schema` is
//! `null` and the check cannot guard its shape.
//!
//! For each event version the catalogue lists the consumers linked into the binary that take
//! it, directly or through upcasters (`upcast_to`: the version their handler receives).
//! Handlers of external messages (webhooks, other systems' messages) are not events of this
//! SDK and are left out.
//!
//! Like every registry of this SDK, the catalogue sees only what is linked into the binary
//! that builds it: print it from the service's own binary ([`cli::run`]), not from the
//! `outbox` CLI, which links no events of yours (it renders and checks catalogue files).
//!
//! # The compatibility check
//!
//! Consumers decode an event by its type and schema version. A change to the shape of an
//! event type under a version already published breaks consumers that still decode the old
//! shape; a new shape needs a new version (and an upcaster from the old one). Commit the
//! catalogue (`catalogue write FILE`) and check the code against it in CI
//! (`catalogue check FILE`, or [`check`]): a schema that changed under the same version, or
//! an event type that moved to another aggregate, fails the check; titles, descriptions and
//! examples are not part of the shape. A version missing from the committed catalogue fails
//! too, so that every published shape is guarded from its first release: write the catalogue
//! again to record it. So does a committed schema the code no longer records (a catalogue
//! built without the feature `catalogue` guards nothing, and must not pass as if it did).
//!
//! ```no_run
//! use outbox_runtime::catalogue::{Catalogue, check};
//!
//! let committed = Catalogue::from_json(&std::fs::read_to_string("events.catalogue.json")?)?;
//! let failures: Vec<String> = check(&committed, &Catalogue::linked())
//!     .into_iter()
//!     .filter(|finding| finding.is_failure())
//!     .map(|finding| finding.to_string())
//!     .collect();
//! assert!(failures.is_empty(), "{failures:#?}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::EventRegistration;
use crate::inbox::HandlerRegistration;
use crate::inbox::linked::{ByEventType, by_event_type};
use crate::upcast::{UpcasterRegistration, Upcasters};
use crate::util::text::item_path;

mod asyncapi;
pub mod cli;
pub(crate) mod schema;

pub use asyncapi::AsyncApi;
#[doc(hidden)]
pub use schema::{SchemaFn, SchemaProbe, ViaJsonSchema, WithoutSchema};

/// The catalogue file's format, written in its `format` field.
pub const FORMAT: &str = "outbox-catalogue/1";

/// Every event type and version of a binary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Catalogue {
    /// [`FORMAT`].
    pub format: String,
    /// By event type, then version.
    pub events: Vec<CatalogueEvent>,
}

/// One event type in one schema version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CatalogueEvent {
    /// The event type (CloudEvents `type`), e.g. `order.placed`.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The schema version (the envelope's `schemaversion`).
    pub version: u32,
    /// The aggregate type (the envelope's `aggregatetype`).
    pub aggregate: String,
    /// The Rust type, with its module path.
    pub rust_type: String,
    /// The payload's JSON Schema (draft-07), when the feature `catalogue` recorded one.
    pub schema: Option<Value>,
    /// The consumers linked into the binary that take this version.
    #[serde(default)]
    pub consumers: Vec<ConsumerEntry>,
    /// The upcaster from this version to the next, if one is linked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upcaster: Option<UpcasterEntry>,
}

/// A consumer that takes an event version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerEntry {
    /// The consumer's name.
    pub consumer: String,
    /// Its handler function, with its module path.
    pub handler: String,
    /// The version the handler receives: this version, or a later one the upcasters reach.
    pub handles_version: u32,
}

/// An upcaster from one version to the next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpcasterEntry {
    /// The version it writes.
    pub to_version: u32,
    /// Its function, with its module path.
    pub function: String,
}

impl Catalogue {
    /// The catalogue of everything linked into this binary.
    pub fn linked() -> Catalogue {
        Catalogue::from_registrations(
            crate::registry::events(),
            inventory::iter::<HandlerRegistration>,
            Upcasters::linked().all().iter().copied(),
        )
    }

    /// The catalogue of given registrations.
    pub fn from_registrations(
        events: impl IntoIterator<Item = &'static EventRegistration>,
        handlers: impl IntoIterator<Item = &'static HandlerRegistration>,
        upcasters: impl IntoIterator<Item = &'static UpcasterRegistration>,
    ) -> Catalogue {
        let upcasters = Upcasters::from_registrations(upcasters);
        let mut by_consumer: BTreeMap<&str, Vec<&'static HandlerRegistration>> = BTreeMap::new();
        for handler in handlers {
            by_consumer
                .entry(handler.consumer)
                .or_default()
                .push(handler);
        }
        let handled: BTreeMap<&str, ByEventType> = by_consumer
            .into_iter()
            .map(|(consumer, handlers)| (consumer, by_event_type(&handlers)))
            .collect();
        let mut seen = BTreeSet::new();
        let mut events: Vec<&EventRegistration> = events
            .into_iter()
            .filter(|e| seen.insert((e.event_type, e.schema_version)))
            .collect();
        events.sort_by_key(|e| (e.event_type, e.schema_version));
        let events = events
            .into_iter()
            .map(|event| {
                let consumers = handled
                    .iter()
                    .filter_map(|(consumer, types)| {
                        let versions = types.get(event.event_type)?;
                        let version = upcasters.handled_version(
                            event.event_type,
                            event.schema_version,
                            versions,
                        )?;
                        let handler = versions[&version];
                        Some(ConsumerEntry {
                            consumer: (*consumer).to_owned(),
                            handler: item_path(handler.module_path, handler.function),
                            handles_version: version,
                        })
                    })
                    .collect();
                let upcaster = upcasters
                    .all()
                    .iter()
                    .find(|u| {
                        u.event_type == event.event_type && u.from_version == event.schema_version
                    })
                    .map(|u| UpcasterEntry {
                        to_version: u.to_version,
                        function: item_path(u.module_path, u.function),
                    });
                CatalogueEvent {
                    event_type: event.event_type.to_owned(),
                    version: event.schema_version,
                    aggregate: event.aggregate_type.to_owned(),
                    rust_type: item_path(event.module_path, event.rust_type),
                    schema: (event.schema)(),
                    consumers,
                    upcaster,
                }
            })
            .collect();
        Catalogue {
            format: FORMAT.to_owned(),
            events,
        }
    }

    /// The catalogue as pretty JSON, ending in a newline (as committed).
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("a catalogue serializes");
        text.push('\n');
        text
    }

    /// Read a catalogue file's text; the error names what is wrong.
    pub fn from_json(text: &str) -> Result<Catalogue, String> {
        let catalogue: Catalogue = serde_json::from_str(text)
            .map_err(|e| format!("not an outbox event catalogue: {e}"))?;
        if catalogue.format != FORMAT {
            return Err(format!(
                "catalogue format `{}` is not `{FORMAT}`: write it again with this version",
                catalogue.format
            ));
        }
        Ok(catalogue)
    }

    /// The entry of an event type and version.
    pub fn event(&self, event_type: &str, version: u32) -> Option<&CatalogueEvent> {
        self.events
            .iter()
            .find(|e| e.event_type == event_type && e.version == version)
    }
}

/// What the compatibility check found about one event version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// Its schema changed under the same version: a failure.
    SchemaChanged {
        /// The event type.
        event_type: String,
        /// The version.
        version: u32,
        /// Where the schemas first differ (a JSON pointer into the schema).
        at: String,
        /// The committed value there (`None`: absent).
        before: Option<String>,
        /// The current value there (`None`: absent).
        after: Option<String>,
    },
    /// It moved to another aggregate type under the same version: a failure.
    AggregateChanged {
        /// The event type.
        event_type: String,
        /// The version.
        version: u32,
        /// The committed aggregate type.
        before: String,
        /// The current one.
        after: String,
    },
    /// It is in the code but not in the committed catalogue: a failure until it is recorded.
    NotCommitted {
        /// The event type.
        event_type: String,
        /// The version.
        version: u32,
    },
    /// It is committed but no longer in the code: reported, not a failure (old messages of it
    /// may still arrive; keep an upcaster or a handler for them).
    Removed {
        /// The event type.
        event_type: String,
        /// The version.
        version: u32,
    },
    /// The committed catalogue has its schema, the code has none (built without the feature
    /// `catalogue`, or the type no longer derives `JsonSchema`): a failure, as its shape could
    /// no longer be checked.
    SchemaMissing {
        /// The event type.
        event_type: String,
        /// The version.
        version: u32,
    },
    /// The code has its schema, the committed catalogue none: reported, not a failure; write
    /// the catalogue again so that its shape is guarded.
    SchemaUnknown {
        /// The event type.
        event_type: String,
        /// The version.
        version: u32,
    },
}

impl Finding {
    /// Whether it fails the check.
    pub fn is_failure(&self) -> bool {
        matches!(
            self,
            Finding::SchemaChanged { .. }
                | Finding::AggregateChanged { .. }
                | Finding::NotCommitted { .. }
                | Finding::SchemaMissing { .. }
        )
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(absent)".to_owned());
        match self {
            Finding::SchemaChanged {
                event_type,
                version,
                at,
                before,
                after,
            } => write!(
                f,
                "`{event_type}` version {version} changed its schema without a version bump \
                 (at `{at}`: {} before, {} now): consumers decoding version {version} break. \
                 Keep version {version} as it was and declare the new shape as version {} \
                 (`#[event(version = {})]`, with an `#[upcaster]` from {version}), or revert \
                 the change",
                show(before),
                show(after),
                version + 1,
                version + 1
            ),
            Finding::AggregateChanged {
                event_type,
                version,
                before,
                after,
            } => write!(
                f,
                "`{event_type}` version {version} moved from aggregate `{before}` to `{after}` \
                 without a version bump: its events now route and order by another aggregate"
            ),
            Finding::NotCommitted {
                event_type,
                version,
            } => write!(
                f,
                "`{event_type}` version {version} is not in the committed catalogue: write the \
                 catalogue again (`catalogue write FILE`) and commit it, so its shape is guarded"
            ),
            Finding::Removed {
                event_type,
                version,
            } => write!(
                f,
                "`{event_type}` version {version} is in the committed catalogue but no longer \
                 in the code (messages of it may still arrive: keep an upcaster or a handler)"
            ),
            Finding::SchemaMissing {
                event_type,
                version,
            } => write!(
                f,
                "`{event_type}` version {version} has no schema in the code, though the \
                 committed catalogue has one, so its shape cannot be checked: build the \
                 catalogue with the feature `catalogue`, and keep `#[derive(schemars::JsonSchema)]` \
                 on the type"
            ),
            Finding::SchemaUnknown {
                event_type,
                version,
            } => write!(
                f,
                "`{event_type}` version {version} has a schema the committed catalogue lacks: \
                 write the catalogue again (`catalogue write FILE`) so that its shape is guarded"
            ),
        }
    }
}

/// Compare the `current` catalogue (the code) with the `committed` one: every finding, failures
/// first. The check passes when none [is a failure](Finding::is_failure).
pub fn check(committed: &Catalogue, current: &Catalogue) -> Vec<Finding> {
    let mut findings = Vec::new();
    for now in &current.events {
        let (event_type, version) = (now.event_type.clone(), now.version);
        let Some(before) = committed.event(&now.event_type, now.version) else {
            findings.push(Finding::NotCommitted {
                event_type,
                version,
            });
            continue;
        };
        if before.aggregate != now.aggregate {
            findings.push(Finding::AggregateChanged {
                event_type: event_type.clone(),
                version,
                before: before.aggregate.clone(),
                after: now.aggregate.clone(),
            });
        }
        match (&before.schema, &now.schema) {
            (Some(a), Some(b)) => {
                if let Some((at, was, is)) =
                    schema::first_difference(&schema::shape(a), &schema::shape(b))
                {
                    findings.push(Finding::SchemaChanged {
                        event_type,
                        version,
                        at,
                        before: was.map(|v| v.to_string()),
                        after: is.map(|v| v.to_string()),
                    });
                }
            }
            (Some(_), None) => findings.push(Finding::SchemaMissing {
                event_type,
                version,
            }),
            (None, Some(_)) => findings.push(Finding::SchemaUnknown {
                event_type,
                version,
            }),
            (None, None) => {}
        }
    }
    for old in &committed.events {
        if current.event(&old.event_type, old.version).is_none() {
            findings.push(Finding::Removed {
                event_type: old.event_type.clone(),
                version: old.version,
            });
        }
    }
    findings.sort_by_key(|f| !f.is_failure());
    findings
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(event_type: &str, version: u32, schema: Option<Value>) -> CatalogueEvent {
        CatalogueEvent {
            event_type: event_type.to_owned(),
            version,
            aggregate: "order".to_owned(),
            rust_type: "shop::Placed".to_owned(),
            schema,
            consumers: Vec::new(),
            upcaster: None,
        }
    }

    fn catalogue(events: Vec<CatalogueEvent>) -> Catalogue {
        Catalogue {
            format: FORMAT.to_owned(),
            events,
        }
    }

    fn placed(total: &str) -> Value {
        json!({"type": "object", "properties": {"total": {"type": total}}, "required": ["total"]})
    }

    #[test]
    fn a_changed_schema_under_the_same_version_fails() {
        let committed = catalogue(vec![event("order.placed", 1, Some(placed("integer")))]);
        let same = catalogue(vec![event("order.placed", 1, Some(placed("integer")))]);
        assert!(check(&committed, &same).is_empty());

        let changed = catalogue(vec![event("order.placed", 1, Some(placed("number")))]);
        let findings = check(&committed, &changed);
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert!(findings[0].is_failure());
        let text = findings[0].to_string();
        assert!(
            text.contains("`order.placed` version 1 changed its schema"),
            "{text}"
        );
        assert!(text.contains("/properties/total/type"), "{text}");
        assert!(
            text.contains("\"integer\" before, \"number\" now"),
            "{text}"
        );
        assert!(text.contains("version = 2"), "{text}");
    }

    #[test]
    fn a_new_version_passes_once_committed() {
        let committed = catalogue(vec![event("order.placed", 1, Some(placed("integer")))]);
        let bumped = catalogue(vec![
            event("order.placed", 1, Some(placed("integer"))),
            event("order.placed", 2, Some(placed("number"))),
        ]);
        let findings = check(&committed, &bumped);
        assert_eq!(
            findings,
            vec![Finding::NotCommitted {
                event_type: "order.placed".into(),
                version: 2
            }]
        );
        assert!(check(&bumped, &bumped).is_empty());
    }

    #[test]
    fn removals_and_new_schemas_are_reported_not_failed() {
        let committed = catalogue(vec![
            event("order.placed", 1, None),
            event("order.paid", 1, None),
        ]);
        let current = catalogue(vec![event("order.placed", 1, Some(placed("integer")))]);
        let findings = check(&committed, &current);
        assert_eq!(findings.len(), 2, "{findings:?}");
        assert!(findings.iter().all(|f| !f.is_failure()), "{findings:?}");
    }

    #[test]
    fn a_schema_lost_from_the_code_fails() {
        let committed = catalogue(vec![event("order.placed", 1, Some(placed("integer")))]);
        let current = catalogue(vec![event("order.placed", 1, None)]);
        let findings = check(&committed, &current);
        assert!(
            matches!(&findings[..], [f @ Finding::SchemaMissing { version: 1, .. }] if f.is_failure()),
            "{findings:?}"
        );
        assert!(findings[0].to_string().contains("feature `catalogue`"));
    }

    #[test]
    fn another_aggregate_fails() {
        let committed = catalogue(vec![event("order.placed", 1, None)]);
        let mut moved = event("order.placed", 1, None);
        moved.aggregate = "cart".into();
        let findings = check(&committed, &catalogue(vec![moved]));
        assert!(matches!(findings[..], [Finding::AggregateChanged { .. }]));
    }

    #[test]
    fn the_file_round_trips_and_names_a_wrong_format() {
        let c = catalogue(vec![event("order.placed", 1, Some(placed("integer")))]);
        assert_eq!(Catalogue::from_json(&c.to_json()).unwrap(), c);
        let err = Catalogue::from_json(r#"{"format": "x/9", "events": []}"#).unwrap_err();
        assert!(err.contains("`x/9`"), "{err}");
        let err = Catalogue::from_json("[]").unwrap_err();
        assert!(err.contains("not an outbox event catalogue"), "{err}");
    }
}
