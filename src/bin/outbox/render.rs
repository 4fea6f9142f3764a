//! What the human-readable output looks like: tables, the detail of one row, and the escaping of
//! text that came from the database.

use std::{fmt::Write as _, time::Duration};

use outbox::{
    admin::{
        self, AdminAction, DeadLetter, DeadLetterDetail, DoctorReport, FailureGroup, HumanBytes,
        HumanDuration, Severity, Source, Status,
    },
    retention::PurgeReport,
};
use serde_json::Value;

/// Print human-readable output, every control character but newline and tab escaped (the
/// renderers escape what they put in one line already; this catches the rest).
pub(crate) fn show(text: &str) {
    print!("{}", printable(text, true));
}

/// `text` safe to print on a terminal: control characters (C0 but, with `multi_line`, newline
/// and tab; DEL; C1, whose U+009B starts an escape sequence on some terminals) and the
/// bidirectional formatting characters, which can make text read other than it is, escaped as
/// `\n`, `\x1b`, `\u{202e}`.
pub(crate) fn printable(text: &str, multi_line: bool) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| {
        !(multi_line && matches!(c, '\n' | '\t'))
            && (c.is_control()
                || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'))
    };
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if !unsafe_char(c) {
            out.push(c);
            continue;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A left-aligned text table with a header row; every cell printed on one line, escaped.
pub(crate) fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|row| {
            row.into_iter()
                .map(|cell| printable(&cell, false).into_owned())
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                text.push_str(cell);
                text.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(headers.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// The first line of `text`, escaped and cut to `max` characters; `…` says there is more.
pub(crate) fn clip(text: &str, max: usize) -> String {
    let mut lines = text.trim_start().lines();
    let first = printable(lines.next().unwrap_or_default().trim_end(), false);
    let more = lines.next().is_some();
    if first.chars().count() <= max && !more {
        return first.into_owned();
    }
    let mut cut: String = first.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

pub(crate) fn age(d: Option<Duration>) -> String {
    d.map(|d| HumanDuration(Duration::from_secs(d.as_secs())).to_string())
        .unwrap_or_else(|| "-".into())
}

pub(crate) fn render_status(status: &Status) -> String {
    let o = &status.outbox;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "OUTBOX  total {}  backlog {}  oldest unsent {}  dead {}  stuck {}",
        o.total,
        o.backlog,
        age(o.oldest_unsent_age),
        o.dead,
        o.stuck
    );
    let statuses = ["PENDING", "PROCESSING", "RETRY", "DEAD", "SENT"];
    let row = statuses
        .iter()
        .map(|s| o.counts.get(*s).copied().unwrap_or(0).to_string())
        .collect();
    out.push_str(&table(&statuses, vec![row]));
    if o.scheduled > 0 {
        let _ = writeln!(
            out,
            "        {} delayed events scheduled (not in the backlog), the next due {}",
            o.scheduled,
            o.next_due_at
                .map_or_else(|| "-".to_owned(), |at| at.to_rfc3339())
        );
    }
    if o.delayed_by_outage > 0 {
        let _ = writeln!(
            out,
            "        {} backlog events wait for the broker: a relay reports it unavailable \
             (no attempt is counted while it is)",
            o.delayed_by_outage
        );
    }
    out.push('\n');
    if !status.paused.is_empty() {
        out.push_str(&render_pauses(&status.paused));
        out.push('\n');
    }
    out.push_str(&render_relays(status));
    out.push('\n');
    if !status.wal_slots.is_empty() {
        out.push_str(&render_wal_slots(status));
        out.push('\n');
    }
    if !status.storage.tables.is_empty() {
        out.push_str(&render_storage(status));
        out.push('\n');
    }
    if status.consumers.is_empty() {
        out.push_str("INBOX   no consumer has received anything yet\n");
        return out;
    }
    out.push_str("INBOX\n");
    let statuses = ["PENDING", "PROCESSING", "RETRY", "DEAD", "DONE", "IGNORED"];
    let mut headers = vec!["CONSUMER"];
    headers.extend(statuses);
    headers.extend(["LAG", "STUCK"]);
    let rows = status
        .consumers
        .iter()
        .map(|c| {
            let mut row = vec![c.consumer.clone()];
            row.extend(
                statuses
                    .iter()
                    .map(|s| c.counts.get(*s).copied().unwrap_or(0).to_string()),
            );
            row.push(age(c.lag));
            row.push(c.stuck.to_string());
            row
        })
        .collect();
    out.push_str(&table(&headers, rows));
    out
}

pub(crate) fn render_relays(status: &Status) -> String {
    if status.relays.is_empty() {
        return "RELAYS  none running with a broker\n".to_owned();
    }
    let mut out = String::from("RELAYS\n");
    let headers = [
        "RELAY",
        "TRANSPORT",
        "BROKER",
        "LAST SEEN",
        "UNAVAILABLE FOR",
        "HELD BACK",
        "OUTAGES",
        "LAST ERROR",
    ];
    let rows = status
        .relays
        .iter()
        .map(|r| {
            let broker = match (r.current, r.broker_available) {
                (false, _) => "stopped?",
                (true, true) => "available",
                (true, false) => "UNAVAILABLE",
            };
            vec![
                r.relay_id.clone(),
                r.transport.clone(),
                broker.to_owned(),
                r.broker_seen_ago
                    .map(|d| format!("{} ago", age(Some(d))))
                    .unwrap_or_else(|| "never".into()),
                age(r.unavailable_for),
                r.held_back.to_string(),
                r.outages.to_string(),
                clip(r.last_error.as_deref().unwrap_or("-"), 60),
            ]
        })
        .collect();
    out.push_str(&table(&headers, rows));
    if status.relays.iter().any(|r| !r.current) {
        out.push_str(
            "        stopped?: no report for three heartbeats (the relay was killed, or cannot \
             write to the database)\n",
        );
    }
    out
}

pub(crate) fn render_wal_slots(status: &Status) -> String {
    let mut out = String::from("WAL SLOTS\n");
    let rows = status
        .wal_slots
        .iter()
        .map(|w| {
            vec![
                w.slot.clone(),
                if w.active {
                    "streaming"
                } else {
                    "NOT STREAMING"
                }
                .to_owned(),
                w.wal_status.clone().unwrap_or_else(|| "-".into()),
                bytes(w.lag_bytes),
                bytes(w.retained_bytes),
            ]
        })
        .collect();
    out.push_str(&table(
        &["SLOT", "RELAY", "WAL STATUS", "LAG", "RETAINED"],
        rows,
    ));
    if status.wal_slots.iter().any(|w| !w.active) {
        out.push_str(
            "        NOT STREAMING: no WAL relay reads the slot; the server keeps its WAL until one \
             does (or the slot is dropped)\n",
        );
    }
    out
}

/// The queue tables and the oldest holder of the xmin horizon.
pub(crate) fn render_storage(status: &Status) -> String {
    let storage = &status.storage;
    let mut out = String::from("STORAGE\n");
    let count = |n: Option<i64>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
    let rows = storage
        .tables
        .iter()
        .map(|t| {
            vec![
                t.table.clone(),
                count(t.live_rows),
                match t.dead_rows {
                    Some(dead) => format!("{dead} ({:.0}%)", t.dead_ratio * 100.0),
                    None => "-".to_owned(),
                },
                t.bytes
                    .map_or_else(|| "-".to_owned(), |b| bytes(u64::try_from(b).unwrap_or(0))),
                match (t.autovacuum_enabled, t.vacuumed_secs_ago) {
                    (false, _) => "AUTOVACUUM OFF".to_owned(),
                    (true, Some(secs)) => {
                        format!("{} ago", HumanDuration(Duration::from_secs(secs)))
                    }
                    (true, None) => "never".to_owned(),
                },
            ]
        })
        .collect();
    out.push_str(&table(&["TABLE", "ROWS", "DEAD", "SIZE", "VACUUMED"], rows));
    if storage.autovacuum == Some(false) {
        out.push_str(
            "        AUTOVACUUM IS OFF on this server: dead row versions are never removed \
             (`outbox doctor` says what to do)\n",
        );
    }
    if let Some(h) = &storage.oldest_holder {
        let who = match (h.pid, h.name.as_str()) {
            (Some(pid), "") => format!("{} {pid}", h.kind),
            (Some(pid), name) => format!("{} {pid} ({})", h.kind, name),
            (None, name) => format!("{} {}", h.kind, name),
        };
        let held = h.age_secs.map_or_else(String::new, |secs| {
            format!(" for {}", HumanDuration(Duration::from_secs(secs)))
        });
        let state = h
            .state
            .as_deref()
            .map_or_else(String::new, |s| format!(", {}", s));
        let _ = writeln!(out, "        oldest snapshot held: {who}{held}{state}");
    }
    out
}

pub(crate) fn bytes(n: u64) -> String {
    HumanBytes(n).to_string()
}

pub(crate) fn render_dead_list(items: &[DeadLetter], page: u64, limit: u32) -> String {
    if items.is_empty() {
        return if page > 1 {
            format!("no dead letters on page {page}\n")
        } else {
            "no dead letters\n".to_owned()
        };
    }
    let rows = items
        .iter()
        .map(|d| {
            vec![
                d.target.to_string(),
                clip(d.consumer.as_deref().unwrap_or("-"), 32),
                clip(d.event_type.as_deref().unwrap_or("-"), 40),
                clip(d.aggregate_id.as_deref().unwrap_or("-"), 40),
                d.attempts.to_string(),
                d.arrived_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                clip(d.last_error.as_deref().unwrap_or("-"), 80),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "ID",
            "CONSUMER",
            "TYPE",
            "AGGREGATE",
            "ATTEMPTS",
            "ARRIVED (UTC)",
            "LAST ERROR",
        ],
        rows,
    );
    if items.len() as u64 == u64::from(limit) {
        let _ = writeln!(out, "(page {page}; more may follow: --page {})", page + 1);
    }
    out
}

pub(crate) fn render_groups(groups: &[FailureGroup]) -> String {
    if groups.is_empty() {
        return "no dead letters\n".to_owned();
    }
    let rows = groups
        .iter()
        .map(|g| {
            let who = if g.consumers.is_empty() {
                g.event_types.join(", ")
            } else {
                format!("{} ({})", g.consumers.join(", "), g.event_types.join(", "))
            };
            vec![
                g.fingerprint.clone(),
                g.count.to_string(),
                format!("{:?}", g.source).to_lowercase(),
                g.first_seen.format("%Y-%m-%d %H:%M:%S").to_string(),
                g.last_seen.format("%Y-%m-%d %H:%M:%S").to_string(),
                clip(&who, 40),
                clip(&g.pattern, 80),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "GROUP",
            "COUNT",
            "SOURCE",
            "FIRST SEEN (UTC)",
            "LAST SEEN (UTC)",
            "CONSUMERS (TYPES)",
            "ERROR",
        ],
        rows,
    );
    out.push_str(
        "(replay or ignore a group: outbox replay --group GROUP, outbox ignore --group GROUP)\n",
    );
    out
}

pub(crate) fn render_detail(d: &DeadLetterDetail) -> String {
    let s = &d.summary;
    let mut out = String::new();
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let ts = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let (id_label, arrived_label) = match s.target.source {
        Source::Outbox => ("event id", "created at"),
        Source::Inbox => ("message id", "received at"),
    };
    let fields: Vec<(&str, String)> = vec![
        ("id", s.target.to_string()),
        ("status", d.status.clone()),
        ("consumer", opt(&s.consumer)),
        (id_label, s.message_id.clone()),
        ("event type", opt(&s.event_type)),
        ("source", opt(&d.source)),
        (
            "schema version",
            d.schema_version.map_or("-".into(), |v| v.to_string()),
        ),
        ("aggregate type", opt(&s.aggregate_type)),
        ("aggregate id", opt(&s.aggregate_id)),
        (
            "aggregate version",
            d.aggregate_version.map_or("-".into(), |v| v.to_string()),
        ),
        ("dedup key", opt(&d.dedup_key)),
        ("attempts", s.attempts.to_string()),
        ("last error", opt(&s.last_error)),
        (arrived_label, s.arrived_at.to_rfc3339()),
        (
            "next attempt at",
            ts(d.next_attempt_at.map(|t| t.to_rfc3339())),
        ),
        ("locked by", opt(&d.locked_by)),
        ("locked until", ts(d.locked_until.map(|t| t.to_rfc3339()))),
        ("sent at", ts(d.sent_at.map(|t| t.to_rfc3339()))),
        ("processed at", ts(d.processed_at.map(|t| t.to_rfc3339()))),
    ];
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    // A multi-line value (an error with its causes) continues under its first line.
    let continued = format!("\n{:width$}  ", "");
    for (key, value) in fields {
        let value = printable(&value, true).replace('\n', &continued);
        let _ = writeln!(out, "{key:<width$}  {value}");
    }
    if !d.failures.is_empty() {
        let _ = writeln!(out, "\nfailures (oldest first):");
        for failure in &d.failures {
            let _ = writeln!(
                out,
                "  {}  attempt {:<3} {:<5}  {}",
                failure.at.to_rfc3339(),
                failure.attempt,
                printable(&failure.status, false),
                printable(&failure.error, true).replace('\n', "\n      ")
            );
        }
    }
    if let Some(headers) = &d.headers {
        let _ = writeln!(out, "\nheaders:\n{}", pretty(headers));
    }
    match (&d.envelope, &d.envelope_error) {
        (Some(envelope), _) => {
            let _ = writeln!(out, "\nenvelope:\n{}", pretty(envelope));
        }
        (None, Some(error)) => {
            let _ = writeln!(out, "\nenvelope: cannot be built: {error}");
        }
        (None, None) => {}
    }
    if d.envelope.is_none() || s.target.source == Source::Outbox {
        let _ = writeln!(out, "\npayload:\n{}", d.payload);
    }
    out
}

pub(crate) fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

pub(crate) fn render_purge(r: &PurgeReport) -> String {
    format!(
        "purged {} outbox event(s) sent before {} and {} inbox message(s) processed before {} \
         in {} batch(es), emptied {} slot(s) of outbox_sent and outbox_key, {:.1}s{}\n",
        r.outbox_deleted,
        r.sent_before.format("%Y-%m-%d %H:%M:%S UTC"),
        r.inbox_deleted,
        r.done_before.format("%Y-%m-%d %H:%M:%S UTC"),
        r.batches,
        r.slots_emptied,
        r.elapsed.as_secs_f64(),
        r.audit_id
            .map(|id| format!(" (audit #{id})"))
            .unwrap_or_default()
    )
}

pub(crate) fn render_doctor(report: &DoctorReport) -> String {
    let mut out = String::new();
    for f in &report.findings {
        let _ = writeln!(out, "{:<8} {:<11} {}", f.severity, f.check, f.message);
    }
    let errors = report.with_severity(Severity::Error).count();
    let warnings = report.with_severity(Severity::Warning).count();
    let _ = writeln!(
        out,
        "\n{}: {errors} error(s), {warnings} warning(s)",
        if errors == 0 { "healthy" } else { "unhealthy" }
    );
    out
}

/// The audit log, newest first.
pub(crate) fn render_audit(actions: &[AdminAction]) -> String {
    let rows = actions
        .iter()
        .map(|a| {
            vec![
                a.id.to_string(),
                a.at.format("%Y-%m-%d %H:%M:%S").to_string(),
                a.action.clone(),
                a.rows_affected.to_string(),
                clip(a.actor.as_deref().unwrap_or("-"), 32),
                clip(a.reason.as_deref().unwrap_or("-"), 60),
                clip(&a.target, 80),
            ]
        })
        .collect();
    table(
        &[
            "ID", "AT (UTC)", "ACTION", "ROWS", "ACTOR", "REASON", "TARGET",
        ],
        rows,
    )
}

/// The pauses in force, or that there are none.
pub(crate) fn render_pauses(paused: &[admin::Paused]) -> String {
    if paused.is_empty() {
        return "PAUSED  nothing\n".to_owned();
    }
    let mut out = String::from("PAUSED\n");
    let rows = paused
        .iter()
        .map(|p| {
            vec![
                p.kind.to_string(),
                p.name.clone(),
                p.since.to_rfc3339(),
                p.by.clone().unwrap_or_else(|| "-".into()),
                clip(p.reason.as_deref().unwrap_or("-"), 60),
            ]
        })
        .collect();
    out.push_str(&table(&["KIND", "NAME", "SINCE", "BY", "REASON"], rows));
    out.push_str(
        "        a paused consumer takes no message; a paused destination's events wait PENDING \
         (outbox resume KIND NAME)\n",
    );
    out
}

/// What `pause` or `resume` did.
pub(crate) fn render_pause(report: &admin::PauseReport) -> String {
    let what = format!("{} {}", report.kind, printable(&report.name, false));
    let done = match (report.action, report.changed) {
        (admin::ActionKind::Pause, true) => {
            format!("paused {what}: every instance honours it within seconds")
        }
        (admin::ActionKind::Pause, false) => format!("{what} was paused already"),
        (_, true) => format!("resumed {what}: every instance takes it up within seconds"),
        (_, false) => format!("{what} was not paused"),
    };
    format!("{done} (audit #{})\n", report.audit_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_print_escaped() {
        let hostile = "a\u{1b}[2Jb\u{1b}]0;t\u{7}\u{9b}1m\u{7f}\u{202e}x\r\n\ty";
        assert_eq!(
            printable(hostile, false),
            "a\\x1b[2Jb\\x1b]0;t\\x07\\x9b1m\\x7f\\u{202e}x\\r\\n\\ty"
        );
        assert_eq!(
            printable(hostile, true),
            "a\\x1b[2Jb\\x1b]0;t\\x07\\x9b1m\\x7f\\u{202e}x\\r\n\ty"
        );
        assert!(matches!(
            printable("plain text, ünïcødé", false),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn lists_show_the_first_line_cut() {
        assert_eq!(clip("timeout", 10), "timeout");
        assert_eq!(clip("timeout\ncaused by: reset", 10), "timeout…");
        assert_eq!(clip("  \nsecond", 10), "second");
        assert_eq!(clip(&"x".repeat(100_000), 10), "xxxxxxxxx…");
        assert_eq!(clip("\u{1b}[2J", 80), "\\x1b[2J");
    }

    #[test]
    fn table_cells_stay_on_their_line() {
        let text = table(&["A", "B"], vec![vec!["1\n2".into(), "\u{1b}c".into()]]);
        assert_eq!(text, "A     B\n1\\n2  \\x1bc\n");
    }
}
