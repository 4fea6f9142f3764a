//! SQLite: `?` placeholders, `TEXT` UUIDs and fixed-width RFC 3339 timestamps.

use chrono::{DateTime, Utc};
use sea_orm::DbErr;

/// Targets the unique index on `(event_type, dedup_key)`; rows without a key never conflict.
pub(crate) const INSERT_ON_CONFLICT: &str = "ON CONFLICT (event_type, dedup_key) DO NOTHING";

/// `2026-11-30T12:00:00.000000Z`: every timestamp the SDK writes has this width, so comparing
/// the text compares the instants.
pub(crate) fn timestamp_text(t: &DateTime<Utc>) -> String {
    crate::envelope::format_time(t)
}

pub(crate) fn parse_timestamp(text: &str, column: &str) -> Result<DateTime<Utc>, DbErr> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .or_else(|_| {
            chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f").map(|t| t.and_utc())
        })
        .map_err(|e| {
            DbErr::Type(format!(
                "column {column} holds `{text}`, not a timestamp: {e}"
            ))
        })
}
