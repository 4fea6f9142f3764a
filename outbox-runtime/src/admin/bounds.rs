//! What every backend can store, checked before any SQL runs: the instants a filter may name and
//! the ages a retention window may span.
//!
//! PostgreSQL's `timestamptz` spans 4713 BC to 294276 AD, MySQL's and MariaDB's `DATETIME(6)`
//! the years 1000 to 9999, and SQLite compares the text of an instant, which sorts by time only
//! with four-digit years. So an instant is accepted from 1000-01-01 to 9999-12-31 (UTC), and an
//! age, counted back from the database's clock, up to 100 years.

use std::time::Duration;

use chrono::{DateTime, Datelike, Utc};

use super::{AdminError, HumanDuration};

/// The instants accepted, for messages.
pub const INSTANT_RANGE: &str = "1000-01-01T00:00:00Z to 9999-12-31T23:59:59Z";

/// The longest age accepted: 36,500 days.
pub const MAX_AGE: Duration = Duration::from_secs(36_500 * 86_400);

/// The ages accepted, for messages.
pub const AGE_RANGE: &str = "0s to 36500d (100 years)";

/// Whether every backend stores `at` and compares it by time.
pub fn instant_in_range(at: &DateTime<Utc>) -> bool {
    (1_000..=9_999).contains(&at.year())
}

/// `Ok` when every backend stores `at`; else the error naming `field` and the accepted range.
pub fn check_instant(field: &str, at: &DateTime<Utc>) -> Result<(), AdminError> {
    if instant_in_range(at) {
        return Ok(());
    }
    Err(AdminError::OutOfRange {
        field: field.to_owned(),
        value: at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
        accepted: INSTANT_RANGE,
    })
}

/// `Ok` when `age` is at most [`MAX_AGE`]; else the error naming `field` and the accepted range.
pub fn check_age(field: &str, age: Duration) -> Result<(), AdminError> {
    if age <= MAX_AGE {
        return Ok(());
    }
    Err(AdminError::OutOfRange {
        field: field.to_owned(),
        value: HumanDuration(age).to_string(),
        accepted: AGE_RANGE,
    })
}

impl crate::operations::SentFilter {
    /// `Ok` when both instants are within what every backend stores (see this module); else
    /// [`AdminError::OutOfRange`] naming `sent_after` or `sent_before`.
    pub fn check(&self) -> Result<(), AdminError> {
        for (field, at) in [
            ("sent_after", &self.sent_after),
            ("sent_before", &self.sent_before),
        ] {
            if let Some(at) = at {
                check_instant(field, at)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text).unwrap().to_utc()
    }

    #[test]
    fn instants_every_backend_stores() {
        for ok in [
            "1000-01-01T00:00:00Z",
            "1970-01-01T00:00:00Z",
            "2026-12-03T10:00:00.123456Z",
            "9999-12-31T23:59:59.999999Z",
        ] {
            assert!(check_instant("sent_after", &at(ok)).is_ok(), "{ok}");
        }
        use chrono::TimeZone;
        let before = Utc.with_ymd_and_hms(999, 12, 31, 23, 59, 59).unwrap();
        let after = Utc.with_ymd_and_hms(10_000, 1, 1, 0, 0, 0).unwrap();
        for bad in [before, after] {
            let error = check_instant("sent_after", &bad).unwrap_err();
            let text = error.to_string();
            assert!(text.contains("`sent_after`"), "{text}");
            assert!(text.contains(INSTANT_RANGE), "{text}");
        }
        let ancient = DateTime::<Utc>::MIN_UTC;
        let text = check_instant("before", &ancient).unwrap_err().to_string();
        assert!(
            text.contains("`before`") && text.contains("1000-01-01"),
            "{text}"
        );
    }

    #[test]
    fn ages_up_to_a_hundred_years() {
        assert!(check_age("sent_after", Duration::ZERO).is_ok());
        assert!(check_age("sent_after", MAX_AGE).is_ok());
        let text = check_age("done_after", MAX_AGE + Duration::from_secs(1))
            .unwrap_err()
            .to_string();
        assert!(text.contains("`done_after` = 36500d 1s"), "{text}");
        assert!(text.contains(AGE_RANGE), "{text}");
        let huge = "3000000d".parse::<HumanDuration>().unwrap().0;
        assert!(check_age("sent_after", huge).is_err());
    }
}
