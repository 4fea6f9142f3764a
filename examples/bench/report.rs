//! Measures of every run, their medians, and the table of figures against baselines and targets.

use std::{collections::BTreeMap, time::Duration};

use serde::Serialize;

use crate::support::{BoxError, Ctx, Machine};

/// One value measured in one run.
#[derive(Debug, Clone)]
pub(crate) struct Measure {
    pub(crate) key: String,
    pub(crate) value: f64,
    pub(crate) unit: &'static str,
}

pub(crate) fn m(key: impl Into<String>, value: f64, unit: &'static str) -> Measure {
    Measure {
        key: key.into(),
        value,
        unit,
    }
}

/// Every measure of every run, by key.
#[derive(Debug, Default)]
pub(crate) struct Measures {
    values: BTreeMap<String, (Vec<f64>, &'static str)>,
}

impl Measures {
    pub(crate) fn extend(&mut self, measures: Vec<Measure>) {
        for measure in measures {
            let entry = self
                .values
                .entry(measure.key)
                .or_insert_with(|| (Vec::new(), measure.unit));
            entry.0.push(measure.value);
        }
    }

    pub(crate) fn median(&self, key: &str) -> Option<f64> {
        let (values, _) = self.values.get(key)?;
        median(values)
    }

    fn unit(&self, key: &str) -> &'static str {
        self.values.get(key).map_or("", |(_, unit)| unit)
    }
}

fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    Some(if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    })
}

/// What a figure must reach.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target {
    /// The ratio to the baseline is at most this.
    RatioAtMost(f64),
    /// The ratio to the baseline is at least this.
    RatioAtLeast(f64),
    /// The value itself is at most this.
    AtMost(f64),
}

impl Target {
    fn describe(self, unit: &str) -> String {
        match self {
            Target::RatioAtMost(x) => format!("ratio <= {x}"),
            Target::RatioAtLeast(x) => format!("ratio >= {x}"),
            Target::AtMost(x) => format!("<= {x} {unit}"),
        }
    }

    fn met(self, value: f64, ratio: Option<f64>) -> Option<bool> {
        match self {
            Target::RatioAtMost(x) => ratio.map(|r| r <= x),
            Target::RatioAtLeast(x) => ratio.map(|r| r >= x),
            Target::AtMost(x) => Some(value <= x),
        }
    }
}

/// A row of the table: a measure, what it is compared with, and its target.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) scenario: &'static str,
    pub(crate) label: String,
    pub(crate) key: String,
    pub(crate) baseline: Option<(String, String)>,
    pub(crate) target: Option<Target>,
}

pub(crate) fn spec(
    scenario: &'static str,
    label: impl Into<String>,
    key: impl Into<String>,
) -> Spec {
    Spec {
        scenario,
        label: label.into(),
        key: key.into(),
        baseline: None,
        target: None,
    }
}

impl Spec {
    pub(crate) fn against(mut self, label: impl Into<String>, key: impl Into<String>) -> Self {
        self.baseline = Some((label.into(), key.into()));
        self
    }

    pub(crate) fn target(mut self, target: Target) -> Self {
        self.target = Some(target);
        self
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct Row {
    scenario: &'static str,
    figure: String,
    value: f64,
    unit: &'static str,
    baseline: Option<String>,
    baseline_value: Option<f64>,
    ratio: Option<f64>,
    target: Option<String>,
    met: Option<bool>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Report {
    machine: Machine,
    runs: usize,
    scenarios: Vec<String>,
    seconds: f64,
    rows: Vec<Row>,
    /// Every measure: its unit, the value of each run, and the median.
    measures: BTreeMap<String, MeasureSummary>,
}

#[derive(Debug, Serialize)]
struct MeasureSummary {
    unit: &'static str,
    runs: Vec<f64>,
    median: f64,
}

pub(crate) fn build(
    ctx: &Ctx,
    scenarios: &[String],
    measures: &Measures,
    runs: usize,
    elapsed: Duration,
) -> Report {
    let mut specs = Vec::new();
    for scenario in scenarios {
        specs.extend(match scenario.as_str() {
            "p1" => crate::p1::specs(),
            "p2" => crate::p2::specs(ctx),
            "p3" => crate::p3::specs(ctx),
            "p4" => crate::p4::specs(),
            "p5" => crate::p5::specs(),
            "p6" => crate::p6::specs(),
            "p7" => crate::p7::specs(),
            "p8" => crate::p8::specs(),
            "p9" => crate::p9::specs(),
            "p10" => crate::p10::specs(ctx),
            "p11" => crate::p11::specs(),
            "p12" => crate::p12::specs(ctx),
            "p13" => crate::p13::specs(),
            _ => Vec::new(),
        });
    }
    let mut rows = Vec::new();
    for spec in specs {
        let Some(value) = measures.median(&spec.key) else {
            continue;
        };
        let baseline_value = spec
            .baseline
            .as_ref()
            .and_then(|(_, key)| measures.median(key));
        let ratio = baseline_value.filter(|b| *b != 0.0).map(|b| value / b);
        let unit = measures.unit(&spec.key);
        rows.push(Row {
            scenario: spec.scenario,
            figure: spec.label,
            value,
            unit,
            baseline: spec.baseline.map(|(label, _)| label),
            baseline_value,
            ratio,
            target: spec.target.map(|t| t.describe(unit)),
            met: spec
                .target
                .filter(|_| !ctx.smoke)
                .and_then(|t| t.met(value, ratio)),
        });
    }
    Report {
        machine: ctx.machine.clone(),
        runs,
        scenarios: scenarios.to_vec(),
        seconds: elapsed.as_secs_f64(),
        rows,
        measures: measures
            .values
            .iter()
            .map(|(key, (values, unit))| {
                (
                    key.clone(),
                    MeasureSummary {
                        unit,
                        runs: values.clone(),
                        median: median(values).unwrap_or(0.0),
                    },
                )
            })
            .collect(),
    }
}

fn fmt_value(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

impl Report {
    pub(crate) fn print(&self) {
        println!();
        println!(
            "medians of {} run(s) on {} ({:.0} s)",
            self.runs,
            self.machine.summary(),
            self.seconds
        );
        println!(
            "{:<3} {:<46} {:>12} {:<40} {:>12} {:>7} {:<14} met",
            "", "figure", "value", "baseline", "base value", "ratio", "target"
        );
        for row in &self.rows {
            println!(
                "{:<3} {:<46} {:>12} {:<40} {:>12} {:>7} {:<14} {}",
                row.scenario,
                row.figure,
                format!("{} {}", fmt_value(row.value), row.unit),
                row.baseline.as_deref().unwrap_or("-"),
                row.baseline_value.map_or("-".into(), fmt_value),
                row.ratio.map_or("-".into(), |r| format!("{r:.2}")),
                row.target.as_deref().unwrap_or("-"),
                match row.met {
                    Some(true) => "yes",
                    Some(false) => "NO",
                    None => "-",
                }
            );
        }
    }

    pub(crate) fn write(&self, path: &str) -> Result<(), BoxError> {
        if let Some(dir) = std::path::Path::new(path).parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, serde_json::to_string_pretty(self)?)?;
        Ok(())
    }
}
