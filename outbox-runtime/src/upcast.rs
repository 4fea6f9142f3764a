//! Upcasters: how version N of an event's payload becomes version N+1, declared with
//! `#[upcaster]` and registered at compile time like handlers.
//!
//! A consumer whose handler takes version 3 of an event then handles versions 1 and 2 too: the
//! payload goes through the chain 1 → 2 → 3 right before the handler runs, on every path (a
//! delivery handled inline, the worker's retries, an operator's replay of an old dead letter).
//! The inbox keeps the message as received; the handler's [`EventMeta`] says which version was
//! received ([`EventMeta::received_schema_version`]). An upcaster that fails leaves the message
//! DEAD with its error, like an undecodable one, for an operator to replay after a fix.
//!
//! At start-up the runtime refuses two upcasters for the same step, an upcaster that does not
//! take exactly one step of one event type, and a chain with a gap below a handled version
//! (naming the event, the missing step and the handler it keeps versions from).
//!
//! [`EventMeta`]: crate::inbox::EventMeta
//! [`EventMeta::received_schema_version`]: crate::inbox::EventMeta::received_schema_version

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::OnceLock,
};

use serde_json::value::RawValue;

use crate::envelope::Envelope;

/// Where an upcast envelope carries the version it was received in (a name no CloudEvents
/// extension can have).
pub(crate) const RECEIVED_VERSION_EXTENSION: &str = "outbox:receivedversion";

/// The generated wrapper of an upcaster: the payload of one version in, of the next out, or why
/// not.
pub type UpcastFn = fn(serde_json::Value) -> Result<serde_json::Value, String>;

/// One step of an event type's schema, as `#[upcaster]` registers it.
#[derive(Debug, Clone, Copy)]
pub struct UpcasterRegistration {
    /// The event type it reads.
    pub event_type: &'static str,
    /// The version it reads.
    pub from_version: u32,
    /// The event type it writes (the same, for a valid upcaster).
    pub to_event_type: &'static str,
    /// The version it writes (`from_version + 1`, for a valid upcaster).
    pub to_version: u32,
    /// The generated wrapper.
    pub upcast: UpcastFn,
    /// The function's name.
    pub function: &'static str,
    /// Its module.
    pub module_path: &'static str,
    /// Source file.
    pub file: &'static str,
    /// Source line.
    pub line: u32,
}

impl UpcasterRegistration {
    /// `path/to/file.rs:12 (crate::module::function)`, for messages.
    pub fn location(&self) -> String {
        crate::util::text::location(self.file, self.line, self.module_path, self.function)
    }
}

inventory::collect!(UpcasterRegistration);

/// A problem with the upcasters linked into this binary, found at start-up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UpcastError {
    /// Two upcasters for the same step.
    #[error("two upcasters take `{event_type}` from version {from_version}: {first} and {second}")]
    Duplicate {
        /// The event type.
        event_type: String,
        /// The version both read.
        from_version: u32,
        /// Where the first is.
        first: String,
        /// Where the second is.
        second: String,
    },
    /// An upcaster that does not take one step of one event type.
    #[error(
        "upcaster {location} turns `{event_type}` version {from_version} into `{to_event_type}` \
         version {to_version}: an upcaster takes an event type from one version to the next"
    )]
    NotOneStep {
        /// Where it is.
        location: String,
        /// What it reads.
        event_type: String,
        /// The version it reads.
        from_version: u32,
        /// What it writes.
        to_event_type: String,
        /// The version it writes.
        to_version: u32,
    },
    /// A gap in a chain below a handled version.
    #[error(
        "`{event_type}` has upcasters from version {first_from} but none from version {missing} \
         to {next}: consumer `{consumer}` could not take versions {first_from} to {missing} with \
         its handler for version {handled} at {handler}; add an upcaster from {missing} to {next}"
    )]
    MissingStep {
        /// The consumer.
        consumer: String,
        /// The event type.
        event_type: String,
        /// The lowest version an upcaster reads.
        first_from: u32,
        /// The version no upcaster reads.
        missing: u32,
        /// `missing + 1`.
        next: u32,
        /// The version the handler takes.
        handled: u32,
        /// Where the handler is.
        handler: String,
    },
}

/// The upcasters linked into this binary, by `(event type, version read)`.
#[derive(Debug, Default)]
pub struct Upcasters {
    steps: HashMap<(&'static str, u32), &'static UpcasterRegistration>,
    all: Vec<&'static UpcasterRegistration>,
}

impl Upcasters {
    /// The upcasters linked into this binary (the first of two for one step).
    pub fn linked() -> &'static Upcasters {
        static LINKED: OnceLock<Upcasters> = OnceLock::new();
        LINKED
            .get_or_init(|| Upcasters::from_registrations(inventory::iter::<UpcasterRegistration>))
    }

    /// Upcasters from a given set of registrations.
    pub fn from_registrations(
        registrations: impl IntoIterator<Item = &'static UpcasterRegistration>,
    ) -> Self {
        let mut all: Vec<&'static UpcasterRegistration> = registrations.into_iter().collect();
        all.sort_by_key(|r| (r.event_type, r.from_version, r.file, r.line));
        let mut steps = HashMap::new();
        for reg in &all {
            steps
                .entry((reg.event_type, reg.from_version))
                .or_insert(*reg);
        }
        Upcasters { steps, all }
    }

    /// Every registration, by event type and version.
    pub fn all(&self) -> &[&'static UpcasterRegistration] {
        &self.all
    }

    /// Problems with the upcasters themselves: duplicates, and steps that are not one step.
    pub fn check(&self) -> Vec<UpcastError> {
        let mut errors = Vec::new();
        let mut seen: BTreeMap<(&str, u32), &UpcasterRegistration> = BTreeMap::new();
        for reg in &self.all {
            if reg.to_event_type != reg.event_type || reg.to_version != reg.from_version + 1 {
                errors.push(UpcastError::NotOneStep {
                    location: reg.location(),
                    event_type: reg.event_type.to_owned(),
                    from_version: reg.from_version,
                    to_event_type: reg.to_event_type.to_owned(),
                    to_version: reg.to_version,
                });
            }
            if let Some(first) = seen.insert((reg.event_type, reg.from_version), reg) {
                errors.push(UpcastError::Duplicate {
                    event_type: reg.event_type.to_owned(),
                    from_version: reg.from_version,
                    first: first.location(),
                    second: reg.location(),
                });
            }
        }
        errors
    }

    /// The first gap in the chains from the versions upcasters read of `event_type` to the
    /// versions a consumer handles (`handled`, each with where its handler is): every version
    /// an upcaster reads below the highest handled one must reach a handled version.
    pub(crate) fn missing_step<T>(
        &self,
        consumer: &str,
        event_type: &str,
        handled: &BTreeMap<u32, T>,
        location: impl Fn(&T) -> String,
    ) -> Option<UpcastError> {
        let froms: BTreeSet<u32> = self
            .steps
            .keys()
            .filter(|(t, _)| *t == event_type)
            .map(|(_, v)| *v)
            .collect();
        let &top = handled.keys().next_back()?;
        let from = froms
            .into_iter()
            .filter(|v| *v < top)
            .find(|from| self.handled_version(event_type, *from, handled).is_none())?;
        let mut missing = from;
        while self.steps.contains_key(&(event_type, missing)) {
            missing += 1;
        }
        let (handled_version, handler) = handled
            .range(missing + 1..)
            .next()
            .map(|(v, r)| (*v, location(r)))
            .unwrap_or((top, location(&handled[&top])));
        Some(UpcastError::MissingStep {
            consumer: consumer.to_owned(),
            event_type: event_type.to_owned(),
            first_from: from,
            missing,
            next: missing + 1,
            handled: handled_version,
            handler,
        })
    }

    /// The version of `handled` a message of `version` goes to: its own, or else the lowest
    /// later one the steps from it reach.
    pub(crate) fn handled_version<T>(
        &self,
        event_type: &str,
        version: u32,
        handled: &BTreeMap<u32, T>,
    ) -> Option<u32> {
        match handled.contains_key(&version) {
            true => Some(version),
            false => self.target(event_type, version, handled),
        }
    }

    /// The lowest of `handled` versions above `from` that the steps from `from` reach.
    pub(crate) fn target<T>(
        &self,
        event_type: &str,
        from: u32,
        handled: &BTreeMap<u32, T>,
    ) -> Option<u32> {
        let mut version = from;
        loop {
            if version > from && handled.contains_key(&version) {
                return Some(version);
            }
            if !self.steps.contains_key(&(event_type, version)) {
                return None;
            }
            version += 1;
        }
    }

    /// Whether any upcaster reads `event_type`.
    pub(crate) fn has_any(&self, event_type: &str) -> bool {
        self.all.iter().any(|r| r.event_type == event_type)
    }

    /// `envelope` with its payload taken through the steps from its version to `to`, its version
    /// set to `to`, and the version it was received in recorded; or why a step failed.
    pub fn upcast(&self, envelope: &Envelope, to: u32) -> Result<Envelope, String> {
        let from = envelope.schema_version.unwrap_or(1);
        let mut payload: serde_json::Value = match &envelope.data {
            Some(raw) => serde_json::from_str(raw.get())
                .map_err(|e| format!("the payload is not JSON: {e}"))?,
            None => serde_json::Value::Null,
        };
        for version in from..to {
            let step = self
                .steps
                .get(&(envelope.event_type.as_str(), version))
                .ok_or_else(|| {
                    format!(
                        "no upcaster takes `{}` from version {version} to {}",
                        envelope.event_type,
                        version + 1
                    )
                })?;
            payload = (step.upcast)(payload).map_err(|e| {
                format!(
                    "upcasting `{}` from version {version} to {} failed ({}): {e}",
                    envelope.event_type,
                    version + 1,
                    step.location()
                )
            })?;
        }
        let mut out = envelope.clone();
        out.data = Some(
            RawValue::from_string(payload.to_string())
                .map_err(|e| format!("an upcaster returned a payload that is not JSON: {e}"))?,
        );
        out.schema_version = Some(to);
        out.extensions
            .entry(RECEIVED_VERSION_EXTENSION.to_owned())
            .or_insert_with(|| from.into());
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(payload: serde_json::Value) -> Result<serde_json::Value, String> {
        Ok(payload)
    }

    const fn step(
        event_type: &'static str,
        from_version: u32,
        to_version: u32,
        line: u32,
    ) -> UpcasterRegistration {
        UpcasterRegistration {
            event_type,
            from_version,
            to_event_type: event_type,
            to_version,
            upcast: same,
            function: "same",
            module_path: "tests",
            file: "upcast.rs",
            line,
        }
    }

    static ONE_TWO: UpcasterRegistration = step("t.order", 1, 2, 1);
    static ONE_TWO_AGAIN: UpcasterRegistration = step("t.order", 1, 2, 2);
    static TWO_FOUR: UpcasterRegistration = step("t.order", 2, 4, 3);
    static OTHER_TYPE: UpcasterRegistration = UpcasterRegistration {
        to_event_type: "t.invoice",
        ..step("t.order", 3, 4, 4)
    };

    #[test]
    fn duplicates_and_steps_that_are_not_one_step_are_found() {
        let upcasters =
            Upcasters::from_registrations([&ONE_TWO, &ONE_TWO_AGAIN, &TWO_FOUR, &OTHER_TYPE]);
        let errors = upcasters.check();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors.iter().any(|e| matches!(
            e,
            UpcastError::Duplicate { from_version: 1, first, second, .. }
                if first.contains("upcast.rs:1") && second.contains("upcast.rs:2")
        )));
        assert!(errors.iter().any(|e| matches!(
            e,
            UpcastError::NotOneStep {
                from_version: 2,
                to_version: 4,
                ..
            }
        )));
        assert!(errors.iter().any(|e| matches!(
            e,
            UpcastError::NotOneStep { to_event_type, .. } if to_event_type == "t.invoice"
        )));
        let text = errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            text.contains("takes an event type from one version to the next"),
            "{text}"
        );
        assert!(Upcasters::from_registrations([&ONE_TWO]).check().is_empty());
    }

    #[test]
    fn the_chain_is_applied_step_by_step_and_the_received_version_kept() {
        let upcasters = Upcasters::from_registrations([&ONE_TWO]);
        let envelope = Envelope::from_json(
            br#"{"specversion":"1.0","id":"e1","source":"s","type":"t.order","schemaversion":1,"data":{"a":1}}"#,
        )
        .unwrap();
        let up = upcasters.upcast(&envelope, 2).unwrap();
        assert_eq!(up.schema_version, Some(2));
        assert_eq!(up.data.as_ref().unwrap().get(), r#"{"a":1}"#);
        assert_eq!(up.extensions[RECEIVED_VERSION_EXTENSION], 1);
        let missing = upcasters.upcast(&envelope, 3).unwrap_err();
        assert!(missing.contains("from version 2 to 3"), "{missing}");
        let handled = BTreeMap::from([(2, ()), (5, ())]);
        assert_eq!(upcasters.target("t.order", 1, &handled), Some(2));
        assert_eq!(upcasters.target("t.order", 2, &handled), None);
    }
}
