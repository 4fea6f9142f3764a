//! The event catalogue (feature `catalogue`): what this binary links, the AsyncAPI document
//! checked by the official AsyncAPI parser, and the compatibility check between a committed
//! catalogue and the code, through the API, the `outbox` CLI and the quickstart's binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use outbox::__private01::{SchemaProbe, ViaJsonSchema as _};
use outbox::catalogue::{AsyncApi, Catalogue, Finding, check};
use outbox::transport::{KafkaTopics, Routing};
use serde_json::{Value, json};

use crate::common::missing_tool;

/// `upcast.order_placed` version 1 (tests/it/upcast.rs) after an edit that adds a field but
/// keeps the version: the change the check exists for.
#[derive(schemars::JsonSchema)]
#[allow(dead_code)]
struct OrderPlacedV1Edited {
    order: String,
    total: f64,
    note: String,
}

/// The same version with only documentation added: not a change of shape.
/// An order was placed.
#[derive(schemars::JsonSchema)]
#[allow(dead_code)]
struct OrderPlacedV1Documented {
    /// The order's id.
    order: String,
    /// Its total, in euros.
    total: f64,
}

/// A type's schema as the derive records it.
fn schema_of<T: schemars::JsonSchema>() -> Value {
    SchemaProbe::<T>::new()
        .outbox_schema()
        .expect("the feature `catalogue` records schemas")
}

/// The linked catalogue with `upcast.order_placed` v1's schema replaced.
fn with_v1_schema(schema: Value) -> Catalogue {
    let mut catalogue = Catalogue::linked();
    let v1 = catalogue
        .events
        .iter_mut()
        .find(|e| e.event_type == "upcast.order_placed" && e.version == 1)
        .expect("v1 is linked");
    v1.schema = Some(schema);
    catalogue
}

#[test]
fn the_linked_catalogue_lists_versions_schemas_consumers_and_upcasters() {
    let catalogue = Catalogue::linked();

    let v1 = catalogue.event("upcast.order_placed", 1).expect("v1");
    assert_eq!(v1.aggregate, "order");
    assert!(
        v1.rust_type.ends_with("upcast::OrderPlacedV1"),
        "{}",
        v1.rust_type
    );
    let schema = v1.schema.as_ref().expect("v1 derives JsonSchema");
    assert_eq!(schema["type"], "object");
    assert_eq!(schema["properties"]["total"]["type"], "number");
    assert_eq!(schema["properties"]["order"]["type"], "string");
    assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#");
    // The consumer's handler takes version 3; versions 1 and 2 reach it through the upcasters.
    let takes = |version: u32| {
        catalogue
            .event("upcast.order_placed", version)
            .unwrap()
            .consumers
            .iter()
            .find(|c| c.consumer == "t-upcast")
            .map(|c| (c.handles_version, c.handler.clone()))
    };
    for version in 1..=3 {
        let (handles, handler) = takes(version).expect("t-upcast takes every version");
        assert_eq!(handles, 3, "version {version}");
        assert!(handler.ends_with("upcast::take_v3"), "{handler}");
    }
    assert_eq!(
        v1.upcaster
            .as_ref()
            .map(|u| (u.to_version, u.function.as_str())),
        Some((2, "it::upcast::order_placed_v1_to_v2"))
    );
    let v3 = catalogue.event("upcast.order_placed", 3).unwrap();
    assert!(v3.upcaster.is_none());
    assert_eq!(
        v3.schema.as_ref().unwrap()["properties"]["total_cents"]["type"],
        "integer"
    );

    // A chain with a gap (1 → 2, no 2 → 3) leaves versions 1 and 2 to no one.
    for version in 1..=2 {
        let gap = catalogue.event("upcast.gap", version).expect("gap listed");
        assert!(
            !gap.consumers.iter().any(|c| c.consumer == "t-upcast-gap"),
            "version {version}: {:?}",
            gap.consumers
        );
    }
    let gap3 = catalogue.event("upcast.gap", 3).unwrap();
    assert!(gap3.consumers.iter().any(|c| c.consumer == "t-upcast-gap"));
    // An event type without `JsonSchema` is listed without a schema.
    assert_eq!(
        catalogue.event("line.added", 1).expect("listed").schema,
        None
    );
    // Sorted by type and version, and the file reads back as written.
    let keys: Vec<(&str, u32)> = catalogue
        .events
        .iter()
        .map(|e| (e.event_type.as_str(), e.version))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    assert_eq!(
        Catalogue::from_json(&catalogue.to_json()).unwrap(),
        catalogue
    );
}

#[test]
fn a_schema_change_without_a_version_bump_is_flagged() {
    let committed = Catalogue::linked();
    assert!(check(&committed, &Catalogue::linked()).is_empty());

    // A field added under the same version: a failure naming the event, the version and where.
    let edited = with_v1_schema(schema_of::<OrderPlacedV1Edited>());
    let findings = check(&committed, &edited);
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert!(
        matches!(&findings[0], Finding::SchemaChanged { event_type, version: 1, at, before: None, .. }
            if event_type == "upcast.order_placed" && at == "/properties/note"),
        "{findings:?}"
    );
    let text = findings[0].to_string();
    assert!(
        text.contains("`upcast.order_placed` version 1 changed its schema without a version bump"),
        "{text}"
    );
    assert!(text.contains("version = 2"), "{text}");

    // Documentation and the type's name are not the shape.
    let documented = with_v1_schema(schema_of::<OrderPlacedV1Documented>());
    assert_ne!(
        documented.event("upcast.order_placed", 1).unwrap().schema,
        committed.event("upcast.order_placed", 1).unwrap().schema,
        "the schemas differ in text"
    );
    assert!(check(&committed, &documented).is_empty());

    // The new shape as a new version passes once that version is committed.
    let mut bumped = committed.clone();
    let mut v4 = committed.event("upcast.order_placed", 3).unwrap().clone();
    v4.version = 4;
    v4.schema = Some(schema_of::<OrderPlacedV1Edited>());
    bumped.events.push(v4);
    let findings = check(&committed, &bumped);
    assert_eq!(
        findings,
        vec![Finding::NotCommitted {
            event_type: "upcast.order_placed".into(),
            version: 4
        }]
    );
    assert!(findings[0].is_failure());
    assert!(check(&bumped, &bumped).is_empty());
}

#[cfg(feature = "cli")]
#[test]
fn the_outbox_cli_checks_and_renders_catalogue_files() {
    let dir = scratch("cli");
    let committed = dir.join("committed.json");
    let current = dir.join("current.json");
    std::fs::write(&committed, Catalogue::linked().to_json()).unwrap();
    std::fs::write(
        &current,
        with_v1_schema(schema_of::<OrderPlacedV1Edited>()).to_json(),
    )
    .unwrap();
    let outbox = |args: &[&str]| run(Command::new(env!("CARGO_BIN_EXE_outbox")).args(args));

    let failed = outbox(&[
        "catalogue",
        "--from",
        current.to_str().unwrap(),
        "check",
        committed.to_str().unwrap(),
    ]);
    assert_eq!(failed.status.code(), Some(1), "{}", text(&failed));
    let out = String::from_utf8_lossy(&failed.stdout);
    assert!(
        out.contains(
            "error: `upcast.order_placed` version 1 changed its schema without a version bump"
        ),
        "{out}"
    );
    assert!(
        out.contains("catalogue check failed: 1 incompatible change"),
        "{out}"
    );

    let passed = outbox(&[
        "catalogue",
        "--from",
        committed.to_str().unwrap(),
        "check",
        committed.to_str().unwrap(),
    ]);
    assert_eq!(passed.status.code(), Some(0), "{}", text(&passed));
    assert!(String::from_utf8_lossy(&passed.stdout).contains("catalogue check passed"));

    let rendered = outbox(&[
        "catalogue",
        "--from",
        committed.to_str().unwrap(),
        "asyncapi",
        "--transport",
        "rabbitmq",
        "--namespace",
        "shop",
    ]);
    assert_eq!(rendered.status.code(), Some(0), "{}", text(&rendered));
    let document: Value = serde_json::from_slice(&rendered.stdout).unwrap();
    let channel = &document["channels"]["upcast.order_placed"];
    assert_eq!(channel["address"], "upcast.order_placed");
    assert_eq!(channel["bindings"]["amqp"]["exchange"]["name"], "shop");

    let bad = outbox(&[
        "catalogue",
        "--from",
        committed.to_str().unwrap(),
        "asyncapi",
        "--transport",
        "smtp",
    ]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--transport `smtp`"));
    let missing = outbox(&["catalogue", "--from", "/nonexistent/catalogue.json"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&missing.stderr)
            .contains("cannot read /nonexistent/catalogue.json")
    );
}

#[test]
fn the_asyncapi_document_passes_the_official_parser() {
    let Some(validator) = validator() else {
        return;
    };
    let catalogue = Catalogue::linked();
    let routings = [
        Routing::Nats {
            namespace: "shop".into(),
        },
        Routing::RabbitMq {
            exchange: "shop".into(),
        },
        Routing::Redis {
            stream_key: "shop:events".into(),
        },
        Routing::Kafka {
            namespace: "shop".into(),
            topics: KafkaTopics::AggregateType,
        },
        Routing::Kafka {
            namespace: "shop".into(),
            topics: KafkaTopics::Topic("shop.all".into()),
        },
    ];
    let mut last = Value::Null;
    for routing in routings {
        let document = AsyncApi::new("it", "1.0.0", routing.clone()).document(&catalogue);
        let address = routing.address("upcast.order_placed", "order");
        let (channel, found) = document["channels"]
            .as_object()
            .unwrap()
            .iter()
            .find(|(_, c)| c["address"] == address.as_str())
            .unwrap_or_else(|| panic!("{routing:?}: a channel at {address}"));
        assert!(
            found["messages"]["upcast.order_placed.v1"]["$ref"]
                == "#/components/messages/upcast.order_placed.v1",
            "{routing:?}: {found}"
        );
        let message = &document["components"]["messages"]["upcast.order_placed.v1"];
        assert_eq!(message["contentType"], "application/cloudevents+json");
        let envelope = &document["components"]["schemas"]["upcast.order_placed.v1.envelope"];
        assert_eq!(
            envelope["properties"]["type"]["const"],
            "upcast.order_placed"
        );
        assert_eq!(envelope["properties"]["schemaversion"]["const"], 1);
        assert_eq!(
            envelope["properties"]["data"]["$ref"],
            "#/components/schemas/upcast.order_placed.v1"
        );
        assert_eq!(
            document["components"]["schemas"]["upcast.order_placed.v1"]["properties"]["total"]["type"],
            "number"
        );
        let headers = &document["components"]["schemas"]["outbox.headers"]["required"];
        assert!(
            headers.as_array().is_some_and(|h| !h.is_empty()),
            "{routing:?}"
        );
        let receive = &document["operations"][format!("t-upcast.receive.{channel}")];
        assert_eq!(receive["action"], "receive", "{routing:?}");
        let taken: Vec<&str> = receive["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["$ref"].as_str())
            .filter(|r| r.contains("upcast.order_placed"))
            .collect();
        assert_eq!(taken.len(), 3, "v1, v2 and v3 reach t-upcast: {taken:?}");

        let (valid, report) = validator.check(&document);
        assert!(
            valid,
            "{routing:?}: the parser refused the document:\n{report}"
        );
        last = document;
    }

    // The parser does refuse a broken document: an operation without its action.
    let operation = last["operations"]
        .as_object_mut()
        .unwrap()
        .values_mut()
        .next()
        .unwrap();
    operation.as_object_mut().unwrap().remove("action");
    let (valid, report) = validator.check(&last);
    assert!(!valid, "{report}");
    assert!(
        report.contains("must have required property") && report.contains("action"),
        "{report}"
    );
}

#[test]
fn the_quickstart_binary_matches_its_committed_catalogue() {
    let example = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("examples/quickstart");
    if !example.exists() {
        missing_tool::<()>(
            "the quickstart's catalogue check",
            &format!(
                "{} (`cargo test --workspace --all-features` builds the examples)",
                example.display()
            ),
        );
        return;
    }
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/catalogue/quickstart.json");
    let checked = run(Command::new(&example)
        .args(["catalogue", "check"])
        .arg(&committed));
    assert_eq!(checked.status.code(), Some(0), "{}", text(&checked));

    let printed = run(Command::new(&example).arg("catalogue"));
    assert_eq!(printed.status.code(), Some(0), "{}", text(&printed));
    let catalogue = Catalogue::from_json(&String::from_utf8_lossy(&printed.stdout)).unwrap();
    let placed = catalogue
        .event("order.placed", 1)
        .expect("the quickstart's event");
    let consumers: Vec<&str> = placed
        .consumers
        .iter()
        .map(|c| c.consumer.as_str())
        .collect();
    assert_eq!(consumers, ["inventory", "notification"]);
    assert_eq!(
        placed.schema.as_ref().unwrap()["required"],
        json!(["order_id", "customer", "sku", "quantity"])
    );

    // The committed AsyncAPI document the guide points to is the binary's, and the parser
    // accepts it.
    let rendered = run(Command::new(&example).args([
        "catalogue",
        "asyncapi",
        "--transport",
        "kafka",
        "--namespace",
        "shop",
        "--title",
        "order service",
    ]));
    assert_eq!(rendered.status.code(), Some(0), "{}", text(&rendered));
    let document: Value = serde_json::from_slice(&rendered.stdout).unwrap();
    let committed: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/catalogue/quickstart.asyncapi.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        document, committed,
        "docs/catalogue/quickstart.asyncapi.json is out of date: write it again"
    );
    assert_eq!(document["channels"]["shop.order"]["address"], "shop.order");
    if let Some(validator) = validator() {
        let (valid, report) = validator.check(&document);
        assert!(valid, "{report}");
    }
}

/// Where the official AsyncAPI parser runs (`.ci/run` installs it beside playwright-core).
struct Validator {
    script: PathBuf,
    dir: PathBuf,
}

fn validator() -> Option<Validator> {
    let modules = std::env::var_os("OUTBOX_NODE_MODULES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(&std::env::var("HOME").unwrap_or_default())
                .join(".cache/outbox/node/node_modules")
        });
    let node = Command::new("node").arg("--version").output();
    if !node.is_ok_and(|o| o.status.success()) {
        return missing_tool("the AsyncAPI test", "node");
    }
    if !modules.join("@asyncapi/parser/package.json").exists() {
        return missing_tool(
            "the AsyncAPI test",
            &format!(
                "{} (npm's @asyncapi/parser)",
                modules.join("@asyncapi/parser").display()
            ),
        );
    }
    Some(Validator {
        script: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/asyncapi/validate.mjs"),
        dir: scratch("asyncapi"),
    })
}

impl Validator {
    /// Whether the parser accepts `document`, and what it printed.
    fn check(&self, document: &Value) -> (bool, String) {
        let file = self.dir.join(format!("{}.json", fastrand::u64(..)));
        std::fs::write(&file, serde_json::to_vec_pretty(document).unwrap()).unwrap();
        let output = run(Command::new("node").arg(&self.script).arg(&file));
        let report = text(&output);
        let valid =
            output.status.success() && report.lines().any(|l| l.starts_with("{\"valid\":true"));
        (valid, report)
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "outbox-catalogue-{name}-{}-{}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(command: &mut Command) -> Output {
    command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"))
}

fn text(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
