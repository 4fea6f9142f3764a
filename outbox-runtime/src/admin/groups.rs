//! Dead letters grouped by what went wrong: each error is normalised (quoted values, UUIDs, long
//! hexadecimal strings and numbers replaced by placeholders, spaces collapsed), and the dead
//! letters whose normalised errors are equal form a group, named by a fingerprint of that text.
//! An operator sees one line per cause (with counts, when it was first and last seen, and the
//! consumers and event types involved) and replays or ignores a whole group in one audited
//! action.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use sea_orm::DatabaseConnection;
use serde::Serialize;

use super::{
    ActionReport, Actor, AdminError, DeadLetterFilter, Selector, Source, Target, db_error,
};
use crate::store::admin as sql;

/// Dead letters read per source to form the groups, newest first: beyond this many the oldest
/// are not counted (a group's `first_seen` is then the oldest of those read).
pub const GROUP_SCAN_LIMIT: u64 = 100_000;

/// Longest normalised error kept, in characters: errors that differ only past it share a group.
const MAX_PATTERN_CHARS: usize = 300;

/// `error` with what varies between occurrences of the same failure replaced: quoted values by
/// `'?'`, UUIDs by `<uuid>`, hexadecimal strings of 8 or more characters by `<hex>`, runs of
/// digits (with a decimal part) by `<n>`; spaces collapsed, cut at 300 characters.
///
/// ```
/// use outbox_runtime::admin::normalise_error;
/// assert_eq!(
///     normalise_error("not enough 'kettle' in stock for order 42 (3 wanted)"),
///     "not enough '?' in stock for order <n> (<n> wanted)"
/// );
/// ```
pub fn normalise_error(error: &str) -> String {
    let chars: Vec<char> = error.chars().collect();
    let mut out = String::with_capacity(error.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if matches!(c, '\'' | '"' | '`')
            && let Some(end) = chars[i + 1..].iter().position(|&d| d == c)
        {
            out.push(c);
            out.push('?');
            out.push(c);
            i += end + 2;
        } else if c.is_alphanumeric() || c == '_' || c == '-' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '-')
            {
                i += 1;
            }
            // A decimal part belongs to the number before it.
            while i + 1 < chars.len()
                && chars[i] == '.'
                && chars[i - 1].is_ascii_digit()
                && chars[i + 1].is_ascii_digit()
            {
                i += 1;
                while i < chars.len() && chars[i].is_ascii_alphanumeric() {
                    i += 1;
                }
            }
            push_word(&mut out, &chars[start..i].iter().collect::<String>());
        } else if c.is_whitespace() {
            if !out.ends_with(' ') && !out.is_empty() {
                out.push(' ');
            }
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out.trim_end().chars().take(MAX_PATTERN_CHARS).collect()
}

/// One word of an error, its variable parts replaced.
fn push_word(out: &mut String, word: &str) {
    if is_uuid(word) {
        out.push_str("<uuid>");
    } else if word.len() >= 8
        && word.chars().all(|c| c.is_ascii_hexdigit())
        && word.chars().any(|c| c.is_ascii_digit())
    {
        out.push_str("<hex>");
    } else {
        let mut digits = false;
        for c in word.chars() {
            if c.is_ascii_digit() || (digits && c == '.') {
                if !digits {
                    out.push_str("<n>");
                    digits = true;
                }
            } else {
                digits = false;
                out.push(c);
            }
        }
    }
}

fn is_uuid(word: &str) -> bool {
    let groups: Vec<&str> = word.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// The fingerprint of a group: 16 hexadecimal digits of a hash (FNV-1a, 64 bits) of the side
/// and the normalised error, the same in every process and release.
pub fn error_fingerprint(source: Source, error: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let side = match source {
        Source::Outbox => "outbox\n",
        Source::Inbox => "inbox\n",
    };
    for byte in side.bytes().chain(normalise_error(error).bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// Dead letters that failed the same way.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "console", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct FailureGroup {
    /// The group's name: see [`error_fingerprint`].
    pub fingerprint: String,
    /// Outbox events or inbox messages.
    pub source: Source,
    /// The normalised error every member shares.
    pub pattern: String,
    /// One member's error as it was recorded (the newest).
    pub example: String,
    /// How many dead letters it holds.
    pub count: u64,
    /// When its oldest member arrived (enqueued or received).
    pub first_seen: DateTime<Utc>,
    /// When its newest member arrived.
    pub last_seen: DateTime<Utc>,
    /// The consumers involved (inbox).
    pub consumers: Vec<String>,
    /// The event or message types involved.
    pub event_types: Vec<String>,
    /// Its members, newest first.
    #[serde(skip)]
    pub members: Vec<Target>,
}

/// The dead letters matching `filter`, grouped by error, the largest group first (then the most
/// recent). Reads at most [`GROUP_SCAN_LIMIT`] per source.
pub async fn failure_groups(
    db: &DatabaseConnection,
    filter: &DeadLetterFilter,
) -> Result<Vec<FailureGroup>, AdminError> {
    let mut groups: BTreeMap<String, FailureGroup> = BTreeMap::new();
    let mut consumers: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut types: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for source in filter.sources()? {
        let dead = sql::dead_letters(db, source, filter, GROUP_SCAN_LIMIT)
            .await
            .map_err(db_error("grouping dead letters"))?;
        for letter in dead {
            let error = letter.last_error.clone().unwrap_or_default();
            let fingerprint = error_fingerprint(source, &error);
            let group = groups
                .entry(fingerprint.clone())
                .or_insert_with(|| FailureGroup {
                    fingerprint: fingerprint.clone(),
                    source,
                    pattern: normalise_error(&error),
                    example: error.clone(),
                    count: 0,
                    first_seen: letter.arrived_at,
                    last_seen: letter.arrived_at,
                    consumers: Vec::new(),
                    event_types: Vec::new(),
                    members: Vec::new(),
                });
            group.count += 1;
            if letter.arrived_at > group.last_seen {
                group.last_seen = letter.arrived_at;
                group.example = error;
            }
            group.first_seen = group.first_seen.min(letter.arrived_at);
            group.members.push(letter.target);
            if let Some(consumer) = letter.consumer {
                consumers
                    .entry(fingerprint.clone())
                    .or_default()
                    .insert(consumer);
            }
            if let Some(event_type) = letter.event_type {
                types.entry(fingerprint).or_default().insert(event_type);
            }
        }
    }
    let mut groups: Vec<FailureGroup> = groups
        .into_values()
        .map(|mut g| {
            g.consumers = consumers
                .remove(&g.fingerprint)
                .unwrap_or_default()
                .into_iter()
                .collect();
            g.event_types = types
                .remove(&g.fingerprint)
                .unwrap_or_default()
                .into_iter()
                .collect();
            g
        })
        .collect();
    groups.sort_by(|a, b| b.count.cmp(&a.count).then(b.last_seen.cmp(&a.last_seen)));
    Ok(groups)
}

/// The group named `fingerprint` among the dead letters matching `filter`.
async fn group(
    db: &DatabaseConnection,
    filter: &DeadLetterFilter,
    fingerprint: &str,
) -> Result<FailureGroup, AdminError> {
    failure_groups(db, filter)
        .await?
        .into_iter()
        .find(|g| g.fingerprint == fingerprint)
        .ok_or_else(|| AdminError::NotFound(format!("failure group {fingerprint}")))
}

/// The actor, its reason naming the group.
fn for_group(actor: &Actor, group: &FailureGroup) -> Actor {
    let about = format!("failure group {} ({})", group.fingerprint, group.pattern);
    let reason = match &actor.reason {
        Some(reason) => format!("{reason}; {about}"),
        None => about,
    };
    actor.clone().reason(reason)
}

/// Replay every member of the group `fingerprint` (see [`replay`](super::replay)), in one
/// audited action whose reason names the group.
pub async fn replay_group(
    db: &DatabaseConnection,
    fingerprint: &str,
    actor: &Actor,
) -> Result<ActionReport, AdminError> {
    let (members, actor) = members_of(db, fingerprint, actor).await?;
    super::replay(db, &members, &actor).await
}

/// Ignore every member of the inbox group `fingerprint` (see [`ignore`](super::ignore)), in one
/// audited action whose reason names the group.
pub async fn ignore_group(
    db: &DatabaseConnection,
    fingerprint: &str,
    actor: &Actor,
) -> Result<ActionReport, AdminError> {
    let (members, actor) = members_of(db, fingerprint, actor).await?;
    super::ignore(db, &members, &actor).await
}

/// The members of group `fingerprint` as a selector, and the actor whose reason names the group.
async fn members_of(
    db: &DatabaseConnection,
    fingerprint: &str,
    actor: &Actor,
) -> Result<(Selector, Actor), AdminError> {
    let group = group(db, &DeadLetterFilter::default(), fingerprint).await?;
    let actor = for_group(actor, &group);
    Ok((Selector::Ids(group.members), actor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_varies_is_replaced() {
        for (error, pattern) in [
            (
                "handler `reserve` panicked: order 42",
                "handler `?` panicked: order <n>",
            ),
            (
                "row 7f9c1e2a-0b1d-4c3e-9f00-1234567890ab not found",
                "row <uuid> not found",
            ),
            ("digest deadbeef01 differs", "digest <hex> differs"),
            (
                "total -1.25 has no version 3",
                "total -<n> has no version <n>",
            ),
            ("evt_123   timed\tout\n", "evt_<n> timed out"),
            ("connection refused", "connection refused"),
            ("unclosed 'quote", "unclosed 'quote"),
            ("", ""),
        ] {
            assert_eq!(normalise_error(error), pattern, "{error:?}");
        }
    }

    #[test]
    fn the_same_failure_has_one_fingerprint_per_side() {
        let a = error_fingerprint(Source::Inbox, "not enough 'kettle' for order 1");
        let b = error_fingerprint(Source::Inbox, "not enough 'teapot' for order 22");
        let c = error_fingerprint(Source::Outbox, "not enough 'kettle' for order 1");
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.len(), 16);
        assert_ne!(a, error_fingerprint(Source::Inbox, "mail server timed out"));
    }

    #[test]
    fn a_long_error_is_cut() {
        let long = "x".repeat(2_000);
        assert_eq!(normalise_error(&long).chars().count(), MAX_PATTERN_CHARS);
    }
}
