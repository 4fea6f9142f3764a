//! MySQL 8 / MariaDB 10.6+: `?` placeholders, `CHAR(36)` UUIDs, `DATETIME(6)` in UTC.

/// A no-op update on a duplicate key: unlike `INSERT IGNORE`, it does not turn other errors
/// (a value too long, a bad date) into silent warnings.
pub(crate) const INSERT_ON_CONFLICT: &str = "ON DUPLICATE KEY UPDATE id = id";
