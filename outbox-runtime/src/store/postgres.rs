//! PostgreSQL: `$n` placeholders, native `uuid`/`timestamptz`/`jsonb`, `ON CONFLICT DO NOTHING`.

pub(crate) fn placeholder(n: usize) -> String {
    format!("${n}")
}

/// JSON travels as text and is cast once, server-side.
pub(crate) fn json_placeholder(n: usize) -> String {
    format!("CAST(${n} AS jsonb)")
}

/// Targets the unique index on `(event_type, dedup_key)`; rows without a key never conflict.
pub(crate) const INSERT_ON_CONFLICT: &str = "ON CONFLICT (event_type, dedup_key) DO NOTHING";
