//! The catalogue as an AsyncAPI 3.0 document: one channel per address the transport routes
//! events to, one message per event type and version (a CloudEvents structured-mode JSON
//! body, with the headers the transport sets), a `send` operation per channel, and a `receive`
//! operation per consumer and channel.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::{Catalogue, CatalogueEvent};
use crate::transport::{CONTENT_TYPE, Routing};

impl Routing {
    fn channel_description(&self) -> String {
        match self {
            Routing::Nats { .. } => {
                "NATS subject, stored in the namespace's JetStream stream.".to_owned()
            }
            Routing::RabbitMq { exchange } => format!(
                "Routing key on the durable topic exchange `{exchange}`; each consumer group \
                 reads its own durable queue bound with the event types it handles."
            ),
            Routing::Redis { .. } => "Redis stream holding every event type of the namespace, \
                 in publish order; each consumer is a consumer group."
                .to_owned(),
            Routing::Kafka { .. } => "Kafka topic; records are keyed by aggregate id, so an \
                 aggregate's events share a partition and keep their order."
                .to_owned(),
        }
    }

    fn channel_bindings(&self, address: &str) -> Option<Value> {
        match self {
            Routing::RabbitMq { exchange } => Some(json!({"amqp": {
                "is": "routingKey",
                "exchange": {"name": exchange, "type": "topic", "durable": true, "autoDelete": false},
                "bindingVersion": "0.3.0"
            }})),
            Routing::Kafka { .. } => Some(json!({"kafka": {
                "topic": address,
                "bindingVersion": "0.5.0"
            }})),
            Routing::Nats { .. } | Routing::Redis { .. } => None,
        }
    }

    fn message_bindings(&self) -> Option<Value> {
        match self {
            Routing::Kafka { .. } => Some(json!({"kafka": {
                "key": {"type": "string", "description": "The aggregate id."},
                "bindingVersion": "0.5.0"
            }})),
            _ => None,
        }
    }

    /// The schema of what the transport sets beside the body (headers; a Redis entry's fields).
    fn headers(&self) -> Value {
        let string = |description: &str| json!({"type": "string", "description": description});
        let (properties, required): (Vec<(&str, Value)>, Vec<&str>) = match self {
            Routing::Nats { .. } => (
                vec![
                    (
                        "Nats-Msg-Id",
                        string("The event id: JetStream's deduplication key."),
                    ),
                    ("Content-Type", json!({"const": CONTENT_TYPE})),
                    ("ce-specversion", json!({"const": "1.0"})),
                    ("ce-id", string("The event id.")),
                    ("ce-type", string("The event type.")),
                ],
                vec!["Nats-Msg-Id", "ce-specversion", "ce-id", "ce-type"],
            ),
            Routing::RabbitMq { .. } => (
                vec![
                    ("ce-specversion", json!({"const": "1.0"})),
                    ("ce-id", string("The event id (also the AMQP message-id).")),
                    ("ce-type", string("The event type (also the AMQP type).")),
                ],
                vec!["ce-specversion", "ce-id", "ce-type"],
            ),
            Routing::Redis { .. } => (
                vec![
                    ("id", string("The event id.")),
                    ("type", string("The event type.")),
                    ("aggregate", string("`{aggregate type}/{aggregate id}`.")),
                    ("content-type", json!({"const": CONTENT_TYPE})),
                ],
                vec!["id", "type", "aggregate", "content-type"],
            ),
            Routing::Kafka { .. } => (
                vec![
                    ("content-type", json!({"const": CONTENT_TYPE})),
                    ("outbox-event-id", string("The event id.")),
                    ("outbox-event-type", string("The event type.")),
                    (
                        "traceparent",
                        string("W3C trace context, when the producer had one."),
                    ),
                    (
                        "tracestate",
                        string("W3C trace state, when the producer had one."),
                    ),
                ],
                vec!["content-type", "outbox-event-id", "outbox-event-type"],
            ),
        };
        json!({
            "type": "object",
            "properties": properties
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect::<Map<String, Value>>(),
            "required": required,
        })
    }
}

/// Options of the AsyncAPI document.
#[derive(Debug, Clone)]
pub struct AsyncApi {
    /// `info.title`.
    pub title: String,
    /// `info.version`: the version of the service's API.
    pub version: String,
    /// The transport's routing.
    pub routing: Routing,
}

impl AsyncApi {
    /// A document titled `title`, version `version`, for `routing`.
    pub fn new(title: impl Into<String>, version: impl Into<String>, routing: Routing) -> Self {
        AsyncApi {
            title: title.into(),
            version: version.into(),
            routing,
        }
    }

    /// The document for `catalogue`.
    pub fn document(&self, catalogue: &Catalogue) -> Value {
        let routing = &self.routing;
        let mut schemas = Map::new();
        let mut messages = Map::new();
        schemas.insert(HEADERS.to_owned(), routing.headers());
        // Channel key → (address, message keys).
        let mut channels: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
        // Consumer → channel key → message keys.
        let mut receives: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
        for event in &catalogue.events {
            let key = message_key(event);
            let data = match &event.schema {
                Some(schema) => {
                    hoist(&key, schema, &mut schemas);
                    json!({"$ref": schema_ref(&key)})
                }
                None => json!({"description": "No schema was recorded for this version."}),
            };
            let envelope = format!("{key}.envelope");
            schemas.insert(envelope.clone(), envelope_schema(event, data));
            let mut message = json!({
                "name": event.event_type,
                "title": format!("{} v{}", event.event_type, event.version),
                "summary": format!(
                    "`{}` version {}, an event of aggregate `{}` (Rust type `{}`), as a \
                     CloudEvents 1.0 structured-mode JSON document.",
                    event.event_type, event.version, event.aggregate, event.rust_type
                ),
                "contentType": CONTENT_TYPE,
                "headers": {"$ref": schema_ref(HEADERS)},
                "payload": {"$ref": schema_ref(&envelope)},
            });
            if let Some(bindings) = routing.message_bindings() {
                message["bindings"] = bindings;
            }
            messages.insert(key.clone(), message);

            let address = routing.address(&event.event_type, &event.aggregate);
            let channel = component_key(&address);
            let entry = channels
                .entry(channel.clone())
                .or_insert_with(|| (address, Vec::new()));
            entry.1.push(key.clone());
            for consumer in &event.consumers {
                receives
                    .entry(consumer.consumer.clone())
                    .or_default()
                    .entry(channel.clone())
                    .or_default()
                    .push(key.clone());
            }
        }

        let mut channel_objects = Map::new();
        let mut operations = Map::new();
        for (channel, (address, keys)) in &channels {
            let mut object = json!({
                "address": address,
                "description": routing.channel_description(),
                "messages": keys
                    .iter()
                    .map(|k| (k.clone(), json!({"$ref": format!("#/components/messages/{k}")})))
                    .collect::<Map<String, Value>>(),
            });
            if let Some(bindings) = routing.channel_bindings(address) {
                object["bindings"] = bindings;
            }
            channel_objects.insert(channel.clone(), object);
            operations.insert(
                format!("send.{channel}"),
                operation("send", channel, keys, "The outbox relay publishes"),
            );
        }
        for (consumer, by_channel) in &receives {
            for (channel, keys) in by_channel {
                operations.insert(
                    format!("{}.receive.{channel}", component_key(consumer)),
                    operation(
                        "receive",
                        channel,
                        keys,
                        &format!("Consumer `{consumer}` receives"),
                    ),
                );
            }
        }

        json!({
            "asyncapi": "3.0.0",
            "info": {
                "title": self.title,
                "version": self.version,
                "description": "The events this service publishes through its transactional \
                    outbox, generated from the event catalogue. Every message is delivered at \
                    least once: consumers deduplicate on the CloudEvents `id`.",
            },
            "defaultContentType": CONTENT_TYPE,
            "channels": channel_objects,
            "operations": operations,
            "components": {
                "messages": messages,
                "schemas": schemas,
            },
        })
    }
}

/// The headers' schema component.
const HEADERS: &str = "outbox.headers";

fn operation(action: &str, channel: &str, keys: &[String], what: &str) -> Value {
    json!({
        "action": action,
        "summary": format!("{what} {}.", keys.join(", ")),
        "channel": {"$ref": format!("#/channels/{channel}")},
        "messages": keys
            .iter()
            .map(|k| json!({"$ref": format!("#/channels/{channel}/messages/{k}")}))
            .collect::<Vec<Value>>(),
    })
}

/// `order.placed.v1`.
fn message_key(event: &CatalogueEvent) -> String {
    component_key(&format!("{}.v{}", event.event_type, event.version))
}

/// A name usable as an AsyncAPI component or map key (`[A-Za-z0-9._-]`; anything else
/// becomes `_`).
fn component_key(name: &str) -> String {
    name.chars()
        .map(
            |c| match c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                true => c,
                false => '_',
            },
        )
        .collect()
}

fn schema_ref(key: &str) -> String {
    format!("#/components/schemas/{key}")
}

/// Put an event's self-contained schema into `schemas` as `{key}` and its definitions as
/// `{key}.{name}`, with the references between them rewritten.
fn hoist(key: &str, schema: &Value, schemas: &mut Map<String, Value>) {
    let mut root = schema.clone();
    let definitions = root.as_object_mut().and_then(|object| {
        object.remove("$schema");
        object.remove("definitions")
    });
    if let Some(Value::Object(definitions)) = definitions {
        for (name, mut definition) in definitions {
            rewrite_refs(key, &mut definition);
            schemas.insert(format!("{key}.{}", component_key(&name)), definition);
        }
    }
    rewrite_refs(key, &mut root);
    schemas.insert(key.to_owned(), root);
}

/// `#/definitions/X` → `#/components/schemas/{key}.X`; `#` → the root (the catalogue's
/// schemas are draft-07, as the derive records them).
fn rewrite_refs(key: &str, schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            for (name, value) in object.iter_mut() {
                if name == "$ref"
                    && let Value::String(target) = value
                {
                    *target = match target.strip_prefix("#/definitions/") {
                        Some(name) => schema_ref(&format!(
                            "{key}.{}",
                            component_key(&name.replace("~1", "/").replace("~0", "~"))
                        )),
                        None if target == "#" => schema_ref(key),
                        None => continue,
                    };
                } else {
                    rewrite_refs(key, value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rewrite_refs(key, v)),
        _ => {}
    }
}

/// The CloudEvents envelope of one event version, its `data` described by `data`.
fn envelope_schema(event: &CatalogueEvent, data: Value) -> Value {
    json!({
        "type": "object",
        "description": format!(
            "CloudEvents 1.0 envelope of `{}` version {}.", event.event_type, event.version
        ),
        "required": ["specversion", "id", "source", "type", "schemaversion", "aggregatetype", "data"],
        "properties": {
            "specversion": {"const": "1.0"},
            "id": {"type": "string", "description": "The event id (a UUIDv7): deduplicate on it."},
            "source": {"type": "string", "description": "The producing service."},
            "type": {"const": event.event_type},
            "subject": {"type": "string", "description": "The aggregate id."},
            "time": {"type": "string", "format": "date-time", "description": "When the event was enqueued."},
            "datacontenttype": {"const": "application/json"},
            "schemaversion": {"const": event.version},
            "aggregatetype": {"const": event.aggregate},
            "aggregateversion": {"type": "integer", "description": "The aggregate's version, when the producer sets one."},
            "traceparent": {"type": "string", "description": "W3C trace context."},
            "tracestate": {"type": "string", "description": "W3C trace state."},
            "data": data,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::KafkaTopics;

    #[test]
    fn definitions_move_to_components_with_their_references() {
        let schema = json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "title": "Placed",
            "type": "object",
            "properties": {"lines": {"type": "array", "items": {"$ref": "#/definitions/Line"}}},
            "definitions": {"Line": {"type": "object", "properties": {"next": {"$ref": "#/definitions/Line"}}}}
        });
        let mut schemas = Map::new();
        hoist("order.placed.v1", &schema, &mut schemas);
        assert_eq!(
            schemas["order.placed.v1"]["properties"]["lines"]["items"]["$ref"],
            "#/components/schemas/order.placed.v1.Line"
        );
        assert_eq!(
            schemas["order.placed.v1.Line"]["properties"]["next"]["$ref"],
            "#/components/schemas/order.placed.v1.Line"
        );
        assert!(schemas["order.placed.v1"].get("$schema").is_none());
        assert!(schemas["order.placed.v1"].get("definitions").is_none());
    }

    #[test]
    fn addresses_follow_the_transports_routing() {
        let kafka = Routing::Kafka {
            namespace: "shop".into(),
            topics: KafkaTopics::AggregateType,
        };
        assert_eq!(kafka.address("order.placed", "order"), "shop.order");
        let nats = Routing::Nats {
            namespace: "shop".into(),
        };
        assert_eq!(nats.address("order.placed", "order"), "shop.order.placed");
        assert_eq!(component_key("shop:events"), "shop_events");
    }
}
