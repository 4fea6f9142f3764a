//! The JSON Schema of an event type: captured by `#[derive(DomainEvent)]` when the feature
//! `catalogue` is on and the type implements `schemars::JsonSchema`, and compared between two
//! catalogues.

use std::marker::PhantomData;

use serde_json::{Map, Value};

pub use crate::event::SchemaFn;

/// The schema source of one event type, chosen by method resolution in the derive's generated
/// code: [`ViaJsonSchema`] when the type implements `schemars::JsonSchema` (and the feature
/// `catalogue` is on), else [`WithoutSchema`].
#[doc(hidden)]
#[derive(Debug)]
pub struct SchemaProbe<T: ?Sized>(PhantomData<fn() -> Box<T>>);

impl<T: ?Sized> SchemaProbe<T> {
    /// A probe for `T`.
    pub const fn new() -> Self {
        SchemaProbe(PhantomData)
    }
}

impl<T: ?Sized> Default for SchemaProbe<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Taken first: the type has a schema.
#[doc(hidden)]
pub trait ViaJsonSchema {
    /// The type's schema (JSON Schema draft-07, self-contained).
    fn outbox_schema(&self) -> Option<Value>;
}

/// Taken otherwise: no schema.
#[doc(hidden)]
pub trait WithoutSchema {
    /// `None`.
    fn outbox_schema(&self) -> Option<Value>;
}

#[cfg(feature = "catalogue")]
impl<T: schemars::JsonSchema> ViaJsonSchema for SchemaProbe<T> {
    fn outbox_schema(&self) -> Option<Value> {
        // Draft-07, the dialect AsyncAPI documents embed; definitions under `#/definitions`.
        let schema = schemars::generate::SchemaSettings::draft07()
            .into_generator()
            .into_root_schema_for::<T>();
        Some(schema.to_value())
    }
}

impl<T: ?Sized> WithoutSchema for &SchemaProbe<T> {
    fn outbox_schema(&self) -> Option<Value> {
        None
    }
}

/// Keywords that describe a schema without constraining its instances: a change to them is not
/// a change of the event's shape.
const ANNOTATIONS: [&str; 5] = ["title", "description", "examples", "$comment", "$schema"];

/// Keywords whose value maps names to schemas.
const SCHEMA_MAPS: [&str; 5] = [
    "properties",
    "patternProperties",
    "definitions",
    "$defs",
    "dependentSchemas",
];

/// Keywords whose value is data, not a schema.
const DATA: [&str; 4] = ["enum", "const", "default", "required"];

/// `schema` without its annotations (titles, descriptions, examples, comments): what the
/// compatibility check compares.
pub(crate) fn shape(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, value) in map {
                let key_str = key.as_str();
                if ANNOTATIONS.contains(&key_str) {
                    continue;
                }
                let value = if DATA.contains(&key_str) {
                    value.clone()
                } else if SCHEMA_MAPS.contains(&key_str) {
                    match value {
                        Value::Object(named) => Value::Object(
                            named.iter().map(|(n, s)| (n.clone(), shape(s))).collect(),
                        ),
                        other => other.clone(),
                    }
                } else {
                    shape(value)
                };
                out.insert(key.clone(), value);
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(shape).collect()),
        other => other.clone(),
    }
}

/// The first place where `before` and `after` differ, as a JSON pointer with both values
/// (`None` where one side has nothing); `None` when they are equal.
pub(crate) fn first_difference(
    before: &Value,
    after: &Value,
) -> Option<(String, Option<Value>, Option<Value>)> {
    fn walk(
        path: &mut String,
        before: &Value,
        after: &Value,
    ) -> Option<(String, Option<Value>, Option<Value>)> {
        match (before, after) {
            (Value::Object(a), Value::Object(b)) => {
                let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
                keys.sort();
                keys.dedup();
                for key in keys {
                    let len = path.len();
                    path.push('/');
                    path.push_str(&key.replace('~', "~0").replace('/', "~1"));
                    let found = match (a.get(key), b.get(key)) {
                        (Some(x), Some(y)) => walk(path, x, y),
                        (x, y) => Some((path.clone(), x.cloned(), y.cloned())),
                    };
                    if found.is_some() {
                        return found;
                    }
                    path.truncate(len);
                }
                None
            }
            (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    let len = path.len();
                    path.push_str(&format!("/{i}"));
                    if let found @ Some(_) = walk(path, x, y) {
                        return found;
                    }
                    path.truncate(len);
                }
                None
            }
            (x, y) if x == y => None,
            (x, y) => Some((path.clone(), Some(x.clone()), Some(y.clone()))),
        }
    }
    walk(&mut String::new(), before, after)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn annotations_are_not_the_shape_but_property_names_are() {
        let a = json!({
            "title": "Placed", "description": "an order",
            "type": "object",
            "properties": {"description": {"type": "string", "description": "free text"}},
            "required": ["description"]
        });
        let b = json!({
            "title": "OrderPlaced",
            "type": "object",
            "properties": {"description": {"type": "string"}},
            "required": ["description"]
        });
        assert_eq!(shape(&a), shape(&b));
        assert_eq!(first_difference(&shape(&a), &shape(&b)), None);
        let c = json!({"type": "object", "properties": {}, "required": ["description"]});
        assert_eq!(
            first_difference(&shape(&a), &shape(&c)),
            Some((
                "/properties/description".to_owned(),
                Some(json!({"type": "string"})),
                None
            ))
        );
    }

    #[test]
    fn enum_values_are_data() {
        let a = json!({"enum": [{"title": "x"}]});
        assert_eq!(shape(&a), a);
    }

    #[test]
    fn the_first_difference_names_its_path() {
        let a = json!({"properties": {"total": {"type": "integer"}}});
        let b = json!({"properties": {"total": {"type": "number"}}});
        assert_eq!(
            first_difference(&a, &b),
            Some((
                "/properties/total/type".to_owned(),
                Some(json!("integer")),
                Some(json!("number"))
            ))
        );
    }
}
