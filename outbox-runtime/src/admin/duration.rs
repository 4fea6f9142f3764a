//! [`HumanDuration`]: durations as operators write them (`7d`, `1h30m`, `500ms`), and
//! [`HumanBytes`]: sizes as operators read them (`1.5 GiB`).

use std::{fmt, str::FromStr, time::Duration};

use super::AdminError;

/// A [`Duration`] written and read the way operators type them: `7d`, `36h`, `1h30m`, `90s`,
/// `250ms`, `2w`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct HumanDuration(pub Duration);

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.is_zero() {
            return f.write_str("0s");
        }
        if d < Duration::from_secs(1) {
            return write!(f, "{}ms", d.as_millis());
        }
        let mut secs = d.as_secs();
        let mut parts = Vec::new();
        for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
            if secs >= size {
                parts.push(format!("{}{unit}", secs / size));
                secs %= size;
            }
            if parts.len() == 2 {
                break;
            }
        }
        f.write_str(&parts.join(" "))
    }
}

/// A number of bytes as operators read it: `12 B`, `3.5 KiB`, `1.2 MiB`, `2.0 GiB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct HumanBytes(pub u64);

impl fmt::Display for HumanBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            n if n >= 1 << 30 => write!(f, "{:.1} GiB", n as f64 / f64::from(1u32 << 30)),
            n if n >= 1 << 20 => write!(f, "{:.1} MiB", n as f64 / f64::from(1u32 << 20)),
            n if n >= 1 << 10 => write!(f, "{:.1} KiB", n as f64 / 1024.0),
            n => write!(f, "{n} B"),
        }
    }
}

impl FromStr for HumanDuration {
    type Err = AdminError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || AdminError::BadDuration(s.to_owned());
        let text: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        if text.is_empty() {
            return Err(bad());
        }
        let mut total = Duration::ZERO;
        let mut rest = text.as_str();
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            if digits == 0 {
                return Err(bad());
            }
            let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            let unit = &rest[..unit_len];
            rest = &rest[unit_len..];
            let part = match unit {
                "ms" => Duration::from_millis(n),
                "s" | "" => Duration::from_secs(n),
                "m" | "min" => Duration::from_secs(n.saturating_mul(60)),
                "h" => Duration::from_secs(n.saturating_mul(3_600)),
                "d" => Duration::from_secs(n.saturating_mul(86_400)),
                "w" => Duration::from_secs(n.saturating_mul(604_800)),
                _ => return Err(bad()),
            };
            total = total.saturating_add(part);
        }
        Ok(HumanDuration(total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_and_print() {
        let d = |s: &str| s.parse::<HumanDuration>().unwrap().0;
        assert_eq!(d("7d"), Duration::from_secs(7 * 86_400));
        assert_eq!(d("1h30m"), Duration::from_secs(5_400));
        assert_eq!(d("250ms"), Duration::from_millis(250));
        assert_eq!(d("2w"), Duration::from_secs(14 * 86_400));
        assert_eq!(d("45"), Duration::from_secs(45));
        assert!("".parse::<HumanDuration>().is_err());
        assert!("7 days".parse::<HumanDuration>().is_err());
        assert!("d7".parse::<HumanDuration>().is_err());
        assert_eq!(
            HumanDuration(Duration::from_secs(14 * 86_400)).to_string(),
            "14d"
        );
        assert_eq!(
            HumanDuration(Duration::from_secs(5_430)).to_string(),
            "1h 30m"
        );
        assert_eq!(HumanDuration(Duration::from_millis(50)).to_string(), "50ms");
    }
}
