//! The Grafana dashboard and the Prometheus alerting rules in `deploy/` query only metrics the SDK
//! registers (`outbox::metrics::describe`), so a renamed metric cannot leave a panel or an alert
//! silently empty. (`promtool check rules` and `promtool test rules` run in CI beside this.)

use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

/// Records the names metrics are described under.
#[derive(Default)]
struct Described(Arc<Mutex<BTreeSet<String>>>);

impl Recorder for Described {
    fn describe_counter(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.0.lock().unwrap().insert(key.as_str().to_owned());
    }
    fn describe_gauge(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.0.lock().unwrap().insert(key.as_str().to_owned());
    }
    fn describe_histogram(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.0.lock().unwrap().insert(key.as_str().to_owned());
    }
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn registered() -> BTreeSet<String> {
    let recorder = Described::default();
    let names = recorder.0.clone();
    metrics::with_local_recorder(&recorder, outbox::metrics::describe);
    let names = names.lock().unwrap().clone();
    assert!(names.len() > 20, "{names:?}");
    names
}

/// The metric names in a PromQL expression: identifiers starting `outbox_` or `inbox_`.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let starts_word = i == 0 || !(chars[i - 1].is_ascii_alphanumeric() || chars[i - 1] == '_');
        if starts_word && chars[i].is_ascii_lowercase() {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if word.starts_with("outbox_") || word.starts_with("inbox_") {
                names.push(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// `name` as registered: a summary's or histogram's `_sum`, `_count` and `_bucket` series are
/// its own.
fn base<'a>(name: &'a str, registered: &BTreeSet<String>) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(stem) = name.strip_suffix(suffix)
            && registered.contains(stem)
        {
            return stem;
        }
    }
    name
}

fn repository_file(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn collect_exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr", serde_json::Value::String(expr)) => out.push(expr.clone()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

fn assert_all_registered(what: &str, exprs: &[String], registered: &BTreeSet<String>) {
    let mut unknown = Vec::new();
    for expr in exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{what}: `{expr}` queries no SDK metric");
        for name in names {
            if !registered.contains(base(&name, registered)) {
                unknown.push(format!("{name} (in `{expr}`)"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "{what} queries metrics the SDK does not register:\n{}",
        unknown.join("\n")
    );
}

#[test]
fn the_dashboard_queries_only_registered_metrics() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&repository_file("deploy/grafana/outbox-dashboard.json"))
            .expect("the dashboard is JSON");
    assert_eq!(dashboard["uid"], "outbox-sdk");
    let mut exprs = Vec::new();
    collect_exprs(&dashboard["panels"], &mut exprs);
    assert!(exprs.len() >= 15, "{exprs:?}");
    assert_all_registered("the dashboard", &exprs, &registered());
}

#[test]
fn the_alerting_rules_query_only_registered_metrics() {
    let rules = repository_file("deploy/prometheus/outbox-alerts.yml");
    let exprs: Vec<String> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr:"))
        .map(|e| e.trim().to_owned())
        .collect();
    assert_eq!(exprs.len(), 15, "{exprs:?}");
    assert_all_registered("the alerting rules", &exprs, &registered());
}

#[test]
fn an_unknown_metric_is_caught() {
    let registered = registered();
    assert_eq!(
        metric_names("sum(rate(outbox_events_published_total[5m])) / max(inbox_gone)"),
        ["outbox_events_published_total", "inbox_gone"]
    );
    assert_eq!(
        base("inbox_handler_duration_seconds_count", &registered),
        "inbox_handler_duration_seconds"
    );
    let result = std::panic::catch_unwind(|| {
        assert_all_registered(
            "a test",
            &["max(outbox_renamed_gauge)".to_owned()],
            &registered,
        )
    });
    assert!(result.is_err());
}
