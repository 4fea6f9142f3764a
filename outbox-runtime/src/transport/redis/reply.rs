//! Parsing of Redis replies: stream entries (`XREADGROUP`, `XAUTOCLAIM`), pending entries
//! (`XPENDING`) and a group's consumers (`XINFO CONSUMERS`), in RESP2 and RESP3 shapes.

use std::{collections::HashMap, time::Duration};

use ::redis::Value;
use bytes::Bytes;

/// A stream entry as read.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) id: String,
    /// `None` when the entry is still pending but no longer in the stream (trimmed or deleted).
    pub(super) fields: Option<Fields>,
}

#[derive(Debug)]
pub(super) struct Fields {
    pub(super) event_id: Option<String>,
    pub(super) event_type: Option<String>,
    pub(super) body: Bytes,
}

/// A bulk or simple string reply as text.
pub(super) fn value_to_string(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Okay => Some("OK".to_owned()),
        _ => None,
    }
}

fn value_to_u64(value: &Value) -> Option<u64> {
    match value {
        Value::Int(n) => u64::try_from(*n).ok(),
        other => value_to_string(other)?.parse().ok(),
    }
}

/// `[id, [field, value, …] | nil]`.
fn parse_entry(value: Value) -> Result<Entry, String> {
    let Value::Array(mut parts) = value else {
        return Err(format!("a stream entry is not an array: {value:?}"));
    };
    if parts.len() < 2 {
        return Err(format!("a stream entry has {} parts, not 2", parts.len()));
    }
    let raw_fields = parts.swap_remove(1);
    let id = value_to_string(&parts[0])
        .ok_or_else(|| format!("a stream entry id is not a string: {:?}", parts[0]))?;
    let pairs: Vec<(Value, Value)> = match raw_fields {
        Value::Nil => return Ok(Entry { id, fields: None }),
        Value::Array(items) => {
            let mut pairs = Vec::with_capacity(items.len() / 2);
            let mut items = items.into_iter();
            while let (Some(field), Some(value)) = (items.next(), items.next()) {
                pairs.push((field, value));
            }
            pairs
        }
        Value::Map(pairs) => pairs,
        other => {
            return Err(format!(
                "the fields of entry `{id}` are not an array: {other:?}"
            ));
        }
    };
    let mut fields = Fields {
        event_id: None,
        event_type: None,
        body: Bytes::new(),
    };
    for (field, value) in pairs {
        match value_to_string(&field).as_deref() {
            Some("id") => fields.event_id = value_to_string(&value),
            Some("type") => fields.event_type = value_to_string(&value),
            Some("body") => {
                fields.body = match value {
                    Value::BulkString(bytes) => Bytes::from(bytes),
                    Value::SimpleString(text) => Bytes::from(text),
                    _ => Bytes::new(),
                }
            }
            _ => {}
        }
    }
    Ok(Entry {
        id,
        fields: Some(fields),
    })
}

fn parse_entries(value: Value) -> Result<Vec<Entry>, String> {
    match value {
        Value::Nil => Ok(Vec::new()),
        Value::Array(items) => items
            .into_iter()
            // Redis 6.2 reports claimed entries that no longer exist as nil.
            .filter(|item| !matches!(item, Value::Nil))
            .map(parse_entry)
            .collect(),
        other => Err(format!("stream entries are not an array: {other:?}")),
    }
}

/// `XREADGROUP` reply: nil on timeout, else `[[key, entries]]` (RESP2) or `{key: entries}`
/// (RESP3), for our single key.
pub(super) fn parse_read_reply(value: Value) -> Result<Vec<Entry>, String> {
    match value {
        Value::Nil => Ok(Vec::new()),
        Value::Array(streams) => {
            let mut entries = Vec::new();
            for stream in streams {
                let Value::Array(mut pair) = stream else {
                    return Err(format!("unexpected XREADGROUP reply: {stream:?}"));
                };
                if pair.len() != 2 {
                    return Err(format!("unexpected XREADGROUP reply: {pair:?}"));
                }
                entries.extend(parse_entries(pair.swap_remove(1))?);
            }
            Ok(entries)
        }
        Value::Map(streams) => {
            let mut entries = Vec::new();
            for (_key, value) in streams {
                entries.extend(parse_entries(value)?);
            }
            Ok(entries)
        }
        other => Err(format!("unexpected XREADGROUP reply: {other:?}")),
    }
}

/// `XAUTOCLAIM` reply: `[next cursor, entries, deleted ids]` (no deleted ids before Redis 7).
pub(super) fn parse_autoclaim_reply(
    value: Value,
) -> Result<(String, Vec<Entry>, Vec<String>), String> {
    let Value::Array(parts) = value else {
        return Err(format!("unexpected XAUTOCLAIM reply: {value:?}"));
    };
    let mut parts = parts.into_iter();
    let (Some(cursor), Some(entries)) = (parts.next(), parts.next()) else {
        return Err("XAUTOCLAIM reply has fewer than 2 parts".to_owned());
    };
    let cursor =
        value_to_string(&cursor).ok_or_else(|| format!("XAUTOCLAIM cursor: {cursor:?}"))?;
    let entries = parse_entries(entries)?;
    let deleted = match parts.next() {
        Some(Value::Array(ids)) => ids.iter().filter_map(value_to_string).collect(),
        _ => Vec::new(),
    };
    Ok((cursor, entries, deleted))
}

/// `XPENDING key group id id 1` reply: `[[id, consumer, idle, count]]`, empty when the entry is
/// not pending. Returns the owner and the delivery count.
pub(super) fn parse_pending_entry(value: Value) -> Option<(String, u32)> {
    let Value::Array(mut rows) = value else {
        return None;
    };
    if rows.is_empty() {
        return None;
    }
    let Value::Array(row) = rows.swap_remove(0) else {
        return None;
    };
    let owner = value_to_string(row.get(1)?)?;
    let count = value_to_u64(row.get(3)?)?;
    Some((owner, u32::try_from(count).unwrap_or(u32::MAX)))
}

/// `XINFO CONSUMERS` reply: name, pending count and idle time of each consumer.
pub(super) fn parse_consumers(value: Value) -> Vec<(String, u64, Duration)> {
    let Value::Array(consumers) = value else {
        return Vec::new();
    };
    let mut parsed = Vec::new();
    for consumer in consumers {
        let pairs: Vec<(Value, Value)> = match consumer {
            Value::Map(pairs) => pairs,
            Value::Array(items) => {
                let mut pairs = Vec::with_capacity(items.len() / 2);
                let mut items = items.into_iter();
                while let (Some(field), Some(value)) = (items.next(), items.next()) {
                    pairs.push((field, value));
                }
                pairs
            }
            _ => continue,
        };
        let info: HashMap<String, Value> = pairs
            .into_iter()
            .filter_map(|(field, value)| Some((value_to_string(&field)?, value)))
            .collect();
        let (Some(name), Some(pending), Some(idle)) = (
            info.get("name").and_then(value_to_string),
            info.get("pending").and_then(value_to_u64),
            info.get("idle").and_then(value_to_u64),
        ) else {
            continue;
        };
        parsed.push((name, pending, Duration::from_millis(idle)));
    }
    parsed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn entry(id: &str, event_type: &str, body: &str) -> Value {
        Value::Array(vec![
            bulk(id),
            Value::Array(vec![
                bulk("id"),
                bulk("e-1"),
                bulk("type"),
                bulk(event_type),
                bulk("body"),
                bulk(body),
            ]),
        ])
    }

    #[test]
    fn read_replies_are_parsed() {
        assert!(parse_read_reply(Value::Nil).expect("nil").is_empty());
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("ns:events"),
            Value::Array(vec![
                entry("1-0", "order.placed", "{}"),
                Value::Array(vec![bulk("2-0"), Value::Nil]),
            ]),
        ])]);
        let entries = parse_read_reply(reply).expect("parsed");
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].id, "1-0");
        let fields = entries[0].fields.as_ref().expect("fields");
        assert_eq!(fields.event_type.as_deref(), Some("order.placed"));
        assert_eq!(fields.event_id.as_deref(), Some("e-1"));
        assert_eq!(fields.body, Bytes::from_static(b"{}"));
        assert!(entries[1].fields.is_none(), "a deleted entry has no fields");
    }

    #[test]
    fn autoclaim_and_pending_replies_are_parsed() {
        let reply = Value::Array(vec![
            bulk("0-0"),
            Value::Array(vec![entry("3-0", "t", "x"), Value::Nil]),
            Value::Array(vec![bulk("1-0")]),
        ]);
        let (cursor, entries, deleted) = parse_autoclaim_reply(reply).expect("parsed");
        assert_eq!(cursor, "0-0");
        assert_eq!(entries.len(), 1);
        assert_eq!(deleted, vec!["1-0".to_owned()]);

        let pending = Value::Array(vec![Value::Array(vec![
            bulk("3-0"),
            bulk("host-1-ab"),
            Value::Int(1200),
            Value::Int(3),
        ])]);
        assert_eq!(
            parse_pending_entry(pending),
            Some(("host-1-ab".to_owned(), 3))
        );
        assert_eq!(parse_pending_entry(Value::Array(Vec::new())), None);

        let consumers = Value::Array(vec![Value::Array(vec![
            bulk("name"),
            bulk("host-1-ab"),
            bulk("pending"),
            Value::Int(0),
            bulk("idle"),
            Value::Int(5_000),
        ])]);
        assert_eq!(
            parse_consumers(consumers),
            vec![("host-1-ab".to_owned(), 0, Duration::from_secs(5))]
        );
    }
}
