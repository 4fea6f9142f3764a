//! The CloudEvents 1.0 envelope (structured JSON mode) every event travels in.
//!
//! Any CloudEvents SDK in any language reads what the relay publishes. Besides the required
//! attributes (`specversion`, `id`, `source`, `type`) an envelope carries `subject` (the aggregate
//! id), `time`, `datacontenttype` and `data`, and these extension attributes:
//!
//! | attribute | meaning |
//! |---|---|
//! | `aggregatetype` | the aggregate kind, e.g. `order` |
//! | `aggregateversion` | the aggregate's version after the event, when it has one |
//! | `schemaversion` | the payload's schema version |
//! | `traceparent`, `tracestate` | the W3C trace context current at enqueue |
//!
//! plus any user headers given at enqueue (CloudEvents extension names: `a-z0-9`, at most 20).

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, SecondsFormat, Utc};
use serde_json::value::RawValue;

/// The CloudEvents spec version this SDK writes and reads.
pub const SPEC_VERSION: &str = "1.0";
/// The `datacontenttype` of every event the SDK writes.
pub const JSON_CONTENT_TYPE: &str = "application/json";

/// Attribute names with a meaning of their own; they cannot be used as user headers.
pub const RESERVED_ATTRIBUTES: &[&str] = &[
    "specversion",
    "id",
    "source",
    "type",
    "subject",
    "time",
    "datacontenttype",
    "dataschema",
    "data",
    "data_base64",
    "aggregatetype",
    "aggregateversion",
    "schemaversion",
    "traceparent",
    "tracestate",
];

/// The CloudEvents extension naming the database (tenant or shard) an event comes from, when a
/// runtime serves a set of databases (see [`fleet`](crate::fleet)).
pub const DATABASE_EXTENSION: &str = "tenant";

/// One event as it travels between services: a CloudEvents 1.0 structured-mode JSON document.
#[derive(Debug, Clone)]
pub struct Envelope {
    /// `id`: unique per event; for events of this SDK the outbox `event_id` (a UUIDv7).
    pub id: String,
    /// `source`: the producing service, as configured on its [`Outbox`](crate::Outbox).
    pub source: String,
    /// `type`: the event type, e.g. `order.placed`.
    pub event_type: String,
    /// `subject`: the aggregate id.
    pub subject: Option<String>,
    /// `time`: when the event was enqueued.
    pub time: Option<DateTime<Utc>>,
    /// `datacontenttype`; `application/json` for events of this SDK.
    pub data_content_type: Option<String>,
    /// `dataschema`, when the producer set one.
    pub data_schema: Option<String>,
    /// `data`: the payload, kept as the JSON text it arrived as.
    pub data: Option<Box<RawValue>>,
    /// `aggregatetype` extension.
    pub aggregate_type: Option<String>,
    /// `aggregateversion` extension.
    pub aggregate_version: Option<i64>,
    /// `schemaversion` extension.
    pub schema_version: Option<u32>,
    /// `traceparent` extension (W3C trace context).
    pub traceparent: Option<String>,
    /// `tracestate` extension (W3C trace context).
    pub tracestate: Option<String>,
    /// Every other extension attribute, e.g. user headers.
    pub extensions: BTreeMap<String, serde_json::Value>,
}

impl PartialEq for Envelope {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
            && self.source == other.source
            && self.event_type == other.event_type
            && self.subject == other.subject
            && self.time == other.time
            && self.data_content_type == other.data_content_type
            && self.data_schema == other.data_schema
            && self.data.as_ref().map(|d| d.get()) == other.data.as_ref().map(|d| d.get())
            && self.aggregate_type == other.aggregate_type
            && self.aggregate_version == other.aggregate_version
            && self.schema_version == other.schema_version
            && self.traceparent == other.traceparent
            && self.tracestate == other.tracestate
            && self.extensions == other.extensions
    }
}

/// Why bytes could not be read as a CloudEvents 1.0 JSON envelope. Each variant names the attribute.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// The bytes are not JSON (or not UTF-8).
    #[error("message is not valid JSON: {0}")]
    NotJson(String),
    /// The JSON is not an object.
    #[error("message is JSON but not a CloudEvents object (found {0})")]
    NotAnObject(&'static str),
    /// A required attribute is absent.
    #[error("CloudEvents attribute `{0}` is missing")]
    MissingAttribute(&'static str),
    /// An attribute is present but its value is wrong.
    #[error("CloudEvents attribute `{attribute}` is invalid: {reason}")]
    InvalidAttribute {
        /// The attribute's name.
        attribute: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The `specversion` is not 1.0.
    #[error("unsupported CloudEvents specversion `{0}`: this SDK reads 1.0")]
    UnsupportedSpecVersion(String),
}

impl EnvelopeError {
    fn invalid(attribute: &str, reason: impl Into<String>) -> Self {
        EnvelopeError::InvalidAttribute {
            attribute: attribute.to_owned(),
            reason: reason.into(),
        }
    }
}

impl Envelope {
    /// The trace context and the other extension attributes (user headers) as name and text,
    /// for transports that carry headers beside the body; a non-string value is its JSON text.
    pub fn transport_headers(&self) -> Vec<(String, String)> {
        let trace = [
            ("traceparent", &self.traceparent),
            ("tracestate", &self.tracestate),
        ];
        trace
            .into_iter()
            .filter_map(|(name, value)| Some((name.to_owned(), value.clone()?)))
            .chain(self.extensions.iter().map(|(name, value)| {
                let text = match value {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (name.clone(), text)
            }))
            .collect()
    }

    /// Encode as CloudEvents structured-mode JSON.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 + self.data.as_ref().map_or(0, |d| d.get().len()));
        self.write_json(&mut out);
        out
    }

    /// Append the CloudEvents JSON encoding to `out`.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let mut w = ObjectWriter::new(out);
        w.string("specversion", SPEC_VERSION);
        w.string("id", &self.id);
        w.string("source", &self.source);
        w.string("type", &self.event_type);
        if let Some(subject) = &self.subject {
            w.string("subject", subject);
        }
        if let Some(time) = &self.time {
            w.string("time", &envelope_time(time));
        }
        if let Some(ct) = &self.data_content_type {
            w.string("datacontenttype", ct);
        }
        if let Some(schema) = &self.data_schema {
            w.string("dataschema", schema);
        }
        if let Some(t) = &self.aggregate_type {
            w.string("aggregatetype", t);
        }
        if let Some(v) = self.aggregate_version {
            // CloudEvents integers are 32-bit; larger versions travel as strings.
            match i32::try_from(v) {
                Ok(small) => w.raw("aggregateversion", &small.to_string()),
                Err(_) => w.string("aggregateversion", &v.to_string()),
            }
        }
        if let Some(v) = self.schema_version {
            match i32::try_from(v) {
                Ok(small) => w.raw("schemaversion", &small.to_string()),
                Err(_) => w.string("schemaversion", &v.to_string()),
            }
        }
        if let Some(tp) = &self.traceparent {
            w.string("traceparent", tp);
        }
        if let Some(ts) = &self.tracestate {
            w.string("tracestate", ts);
        }
        for (name, value) in &self.extensions {
            w.raw(name, &value.to_string());
        }
        if let Some(data) = &self.data {
            w.raw("data", data.get());
        }
        w.finish();
    }

    /// Decode CloudEvents structured-mode JSON. The error names the attribute that is wrong.
    pub fn from_json(bytes: &[u8]) -> Result<Envelope, EnvelopeError> {
        let text = std::str::from_utf8(bytes)
            .map_err(|e| EnvelopeError::NotJson(format!("not UTF-8: {e}")))?;
        let value: &RawValue =
            serde_json::from_str(text).map_err(|e| EnvelopeError::NotJson(e.to_string()))?;
        let raw = value.get().trim_start();
        if !raw.starts_with('{') {
            return Err(EnvelopeError::NotAnObject(json_kind(raw)));
        }
        let attrs: BTreeMap<String, &RawValue> =
            serde_json::from_str(value.get()).map_err(|e| EnvelopeError::NotJson(e.to_string()))?;

        let spec = required_string(&attrs, "specversion")?;
        if spec != SPEC_VERSION {
            return Err(EnvelopeError::UnsupportedSpecVersion(spec));
        }
        let id = required_string(&attrs, "id")?;
        let source = required_string(&attrs, "source")?;
        let event_type = required_string(&attrs, "type")?;
        let subject = optional_string(&attrs, "subject")?;
        let time = optional_time(&attrs, "time")?;
        let data_content_type = optional_string(&attrs, "datacontenttype")?;
        check_data_is_json(&attrs, data_content_type.as_deref())?;
        let data_schema = optional_string(&attrs, "dataschema")?;
        let data = attrs.get("data").map(|raw| (*raw).to_owned());
        let aggregate_type = optional_string(&attrs, "aggregatetype")?;
        let aggregate_version = optional_integer(&attrs, "aggregateversion")?;
        let schema_version = match optional_integer(&attrs, "schemaversion")? {
            None => None,
            Some(v) => Some(u32::try_from(v).map_err(|_| {
                EnvelopeError::invalid("schemaversion", format!("{v} is not a version number"))
            })?),
        };
        let traceparent = optional_string(&attrs, "traceparent")?;
        let tracestate = optional_string(&attrs, "tracestate")?;

        let extensions = extensions(&attrs)?;

        Ok(Envelope {
            id,
            source,
            event_type,
            subject,
            time,
            data_content_type,
            data_schema,
            data,
            aggregate_type,
            aggregate_version,
            schema_version,
            traceparent,
            tracestate,
            extensions,
        })
    }

    /// The payload deserialized as `T`.
    pub fn data_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        match &self.data {
            Some(raw) => serde_json::from_str(raw.get()),
            None => serde_json::from_str("null"),
        }
    }
}

/// `time` as this SDK writes it: RFC 3339, UTC, microseconds.
pub fn format_time(time: &DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// `time` in an envelope: like [`format_time`], with all nine fraction digits when the instant
/// has sub-microsecond precision (a foreign event's), so that nothing is lost in a round trip.
fn envelope_time(time: &DateTime<Utc>) -> String {
    if time.timestamp_subsec_nanos().is_multiple_of(1_000) {
        format_time(time)
    } else {
        time.to_rfc3339_opts(SecondsFormat::Nanos, true)
    }
}

/// Whether a CloudEvents extension attribute name is valid: `a-z0-9`, 1 to 20 characters.
pub fn is_valid_extension_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 20
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

fn is_json_content_type(ct: &str) -> bool {
    let base = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    base == "application/json" || base == "text/json" || base.ends_with("+json")
}

fn json_kind(raw: &str) -> &'static str {
    match raw.as_bytes().first() {
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

fn optional_string(
    attrs: &BTreeMap<String, &RawValue>,
    name: &'static str,
) -> Result<Option<String>, EnvelopeError> {
    match attrs.get(name) {
        None => Ok(None),
        Some(raw) if raw.get() == "null" => Ok(None),
        Some(raw) if !raw.get().starts_with('"') => Err(EnvelopeError::invalid(
            name,
            format!("expected a string, found {}", json_kind(raw.get())),
        )),
        Some(raw) => {
            let value = serde_json::from_str::<String>(raw.get())
                .map_err(|e| EnvelopeError::invalid(name, format!("not a valid string: {e}")))?;
            if value.contains('\0') {
                return Err(EnvelopeError::invalid(
                    name,
                    "contains the NUL character (U+0000), which CloudEvents does not allow \
                     in attributes and databases cannot store in text columns",
                ));
            }
            Ok(Some(value))
        }
    }
}

/// An optional RFC 3339 `time`, within the four-digit years RFC 3339 has (in UTC).
fn optional_time(
    attrs: &BTreeMap<String, &RawValue>,
    name: &'static str,
) -> Result<Option<DateTime<Utc>>, EnvelopeError> {
    let Some(t) = optional_string(attrs, name)? else {
        return Ok(None);
    };
    let time = DateTime::parse_from_rfc3339(&t)
        .map_err(|e| EnvelopeError::invalid(name, format!("`{t}` is not RFC 3339: {e}")))?
        .with_timezone(&Utc);
    // RFC 3339 has four-digit years: an offset must not push the instant out of them.
    if !(0..=9999).contains(&time.year()) {
        return Err(EnvelopeError::invalid(
            name,
            format!("`{t}` is outside the years 0000 to 9999 in UTC"),
        ));
    }
    Ok(Some(time))
}

/// This SDK reads JSON data only: `data` of a JSON content type, never `data_base64`.
fn check_data_is_json(
    attrs: &BTreeMap<String, &RawValue>,
    content_type: Option<&str>,
) -> Result<(), EnvelopeError> {
    if let Some(ct) = content_type
        && !is_json_content_type(ct)
        && attrs.contains_key("data")
    {
        return Err(EnvelopeError::invalid(
            "datacontenttype",
            format!("`{ct}` is not JSON; this SDK reads JSON data only"),
        ));
    }
    if attrs.contains_key("data_base64") {
        return Err(EnvelopeError::invalid(
            "data_base64",
            "binary data is not supported; send JSON in `data`",
        ));
    }
    Ok(())
}

/// Every attribute the CloudEvents spec and this SDK do not name, as an extension.
fn extensions(
    attrs: &BTreeMap<String, &RawValue>,
) -> Result<BTreeMap<String, serde_json::Value>, EnvelopeError> {
    let mut extensions = BTreeMap::new();
    for (name, raw) in attrs {
        if RESERVED_ATTRIBUTES.contains(&name.as_str()) {
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(raw.get())
            .map_err(|e| EnvelopeError::invalid(name, e.to_string()))?;
        extensions.insert(name.clone(), value);
    }
    Ok(extensions)
}

fn required_string(
    attrs: &BTreeMap<String, &RawValue>,
    name: &'static str,
) -> Result<String, EnvelopeError> {
    match optional_string(attrs, name)? {
        None => Err(EnvelopeError::MissingAttribute(name)),
        Some(s) if s.is_empty() => Err(EnvelopeError::invalid(name, "must not be empty")),
        Some(s) => Ok(s),
    }
}

fn optional_integer(
    attrs: &BTreeMap<String, &RawValue>,
    name: &'static str,
) -> Result<Option<i64>, EnvelopeError> {
    let Some(raw) = attrs.get(name) else {
        return Ok(None);
    };
    let text = raw.get();
    if text == "null" {
        return Ok(None);
    }
    if let Ok(n) = serde_json::from_str::<i64>(text) {
        return Ok(Some(n));
    }
    if let Ok(s) = serde_json::from_str::<String>(text)
        && let Ok(n) = s.parse::<i64>()
    {
        return Ok(Some(n));
    }
    Err(EnvelopeError::invalid(
        name,
        format!("expected an integer, found `{text}`"),
    ))
}

/// Writes a JSON object member by member without building a tree.
struct ObjectWriter<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> ObjectWriter<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        ObjectWriter { out, first: true }
    }

    fn key(&mut self, name: &str) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        write_json_string(self.out, name);
        self.out.push(b':');
    }

    fn string(&mut self, name: &str, value: &str) {
        self.key(name);
        write_json_string(self.out, value);
    }

    fn raw(&mut self, name: &str, json: &str) {
        self.key(name);
        self.out.extend_from_slice(json.as_bytes());
    }

    fn finish(self) {
        self.out.push(b'}');
    }
}

fn write_json_string(out: &mut Vec<u8>, s: &str) {
    // serde_json's string escaping cannot fail when writing to a Vec.
    serde_json::to_writer(&mut *out, s).expect("writing a JSON string to a Vec cannot fail");
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn sample() -> Envelope {
        Envelope {
            id: "0190f6b2-7c1e-7000-8000-000000000001".into(),
            source: "order-service".into(),
            event_type: "order.placed".into(),
            subject: Some("42".into()),
            time: Some(Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap()),
            data_content_type: Some(JSON_CONTENT_TYPE.into()),
            data_schema: None,
            data: Some(RawValue::from_string(r#"{"order_id":42}"#.into()).unwrap()),
            aggregate_type: Some("order".into()),
            aggregate_version: Some(3),
            schema_version: Some(1),
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
            tracestate: None,
            extensions: BTreeMap::new(),
        }
    }

    #[test]
    fn encodes_cloudevents_attributes() {
        let json: serde_json::Value = serde_json::from_slice(&sample().to_json()).unwrap();
        assert_eq!(json["specversion"], "1.0");
        assert_eq!(json["id"], "0190f6b2-7c1e-7000-8000-000000000001");
        assert_eq!(json["type"], "order.placed");
        assert_eq!(json["subject"], "42");
        assert_eq!(json["time"], "2026-11-30T12:00:00.000000Z");
        assert_eq!(json["datacontenttype"], "application/json");
        assert_eq!(json["aggregatetype"], "order");
        assert_eq!(json["aggregateversion"], 3);
        assert_eq!(json["schemaversion"], 1);
        assert_eq!(json["data"]["order_id"], 42);
        assert!(json.get("tracestate").is_none());
    }

    #[test]
    fn big_aggregate_versions_travel_as_strings() {
        let mut e = sample();
        e.aggregate_version = Some(i64::from(i32::MAX) + 1);
        let json: serde_json::Value = serde_json::from_slice(&e.to_json()).unwrap();
        assert_eq!(json["aggregateversion"], "2147483648");
        assert_eq!(Envelope::from_json(&e.to_json()).unwrap(), e);
    }

    #[test]
    fn decode_errors_name_the_attribute() {
        let cases: &[(&str, EnvelopeError)] = &[
            (
                "{\"specversion\":\"1.0\"",
                EnvelopeError::NotJson(String::new()),
            ),
            ("[1]", EnvelopeError::NotAnObject("an array")),
            (
                r#"{"id":"1","source":"s","type":"t"}"#,
                EnvelopeError::MissingAttribute("specversion"),
            ),
            (
                r#"{"specversion":"0.3","id":"1","source":"s","type":"t"}"#,
                EnvelopeError::UnsupportedSpecVersion("0.3".into()),
            ),
            (
                r#"{"specversion":"1.0","source":"s","type":"t"}"#,
                EnvelopeError::MissingAttribute("id"),
            ),
            (
                r#"{"specversion":"1.0","id":"1","source":"s"}"#,
                EnvelopeError::MissingAttribute("type"),
            ),
            (
                r#"{"specversion":"1.0","id":7,"source":"s","type":"t"}"#,
                EnvelopeError::invalid("id", "expected a string, found a number"),
            ),
            (
                r#"{"specversion":"1.0","id":"","source":"s","type":"t"}"#,
                EnvelopeError::invalid("id", "must not be empty"),
            ),
            (
                r#"{"specversion":"1.0","id":"1","source":"s","type":"t","schemaversion":"x"}"#,
                EnvelopeError::invalid("schemaversion", "expected an integer, found `\"x\"`"),
            ),
            (
                r#"{"specversion":"1.0","id":"a\u0000b","source":"s","type":"t"}"#,
                EnvelopeError::invalid(
                    "id",
                    "contains the NUL character (U+0000), which CloudEvents does not allow \
                     in attributes and databases cannot store in text columns",
                ),
            ),
        ];
        for (input, expected) in cases {
            let err = Envelope::from_json(input.as_bytes()).unwrap_err();
            match (expected, &err) {
                (EnvelopeError::NotJson(_), EnvelopeError::NotJson(_)) => {}
                _ => assert_eq!(&err, expected, "input {input}"),
            }
        }
        let err = Envelope::from_json(
            br#"{"specversion":"1.0","id":"1","source":"s","type":"t","time":"yesterday"}"#,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("CloudEvents attribute `time` is invalid"),
            "{err}"
        );
        let err =
            Envelope::from_json(br#"{"specversion":"1.0","id":"\ud800","source":"s","type":"t"}"#)
                .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("CloudEvents attribute `id` is invalid: not a valid string: "),
            "{err}"
        );
        let err = Envelope::from_json(b"\xff\xfe").unwrap_err();
        assert!(matches!(err, EnvelopeError::NotJson(_)), "{err}");
    }

    #[test]
    fn reads_foreign_cloudevents() {
        let input = br#"{"specversion":"1.0","id":"A234-1234-1234","source":"/mycontext","type":"com.example.someevent","comexampleextension1":"value","data":{"appinfoA":"abc"}}"#;
        let e = Envelope::from_json(input).unwrap();
        assert_eq!(e.id, "A234-1234-1234");
        assert_eq!(e.extensions["comexampleextension1"], "value");
        assert_eq!(e.data.unwrap().get(), r#"{"appinfoA":"abc"}"#);
        assert_eq!(e.time, None);
    }

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(serde_json::Value::from),
            ".*".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(serde_json::Value::from),
                prop::collection::btree_map(".*", inner, 0..8)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    const ATTR: &str = "[^\\x00\\n]+";
    const ATTR_OR_EMPTY: &str = "[^\\x00\\n]*";

    fn envelope() -> impl Strategy<Value = Envelope> {
        (
            // Attributes never hold NUL (see `optional_string`); data and extensions may.
            (ATTR, ATTR, ATTR, proptest::option::of(ATTR_OR_EMPTY)),
            (
                0i64..4_102_444_800_000_000,
                proptest::option::of(any::<i64>()),
                proptest::option::of(any::<u32>()),
            ),
            (
                proptest::option::of(ATTR_OR_EMPTY),
                proptest::option::of(ATTR_OR_EMPTY),
                json_value(),
            ),
            prop::collection::btree_map(
                "[a-z0-9]{1,20}",
                ".*".prop_map(serde_json::Value::from),
                0..3,
            ),
        )
            .prop_map(
                |((id, source, ty, subject), (micros, av, sv), (tp, ts, data), ext)| {
                    let extensions = ext
                        .into_iter()
                        .filter(|(k, _)| !RESERVED_ATTRIBUTES.contains(&k.as_str()))
                        .collect();
                    Envelope {
                        id,
                        source,
                        event_type: ty,
                        subject,
                        time: Some(DateTime::from_timestamp_micros(micros).unwrap()),
                        data_content_type: Some(JSON_CONTENT_TYPE.into()),
                        data_schema: None,
                        data: Some(serde_json::value::to_raw_value(&data).unwrap()),
                        aggregate_type: Some("order".into()),
                        aggregate_version: av,
                        schema_version: sv,
                        traceparent: tp,
                        tracestate: ts,
                        extensions,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn encode_decode_round_trips(e in envelope()) {
            let decoded = Envelope::from_json(&e.to_json()).unwrap();
            prop_assert_eq!(&decoded, &e);
            let data: serde_json::Value = decoded.data_as().unwrap();
            let original: serde_json::Value = e.data_as().unwrap();
            prop_assert_eq!(data, original);
        }
    }
}
