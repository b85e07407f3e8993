//! Durations in humantime form (`"250ms"`, `"30s"`, `"5m"`, `"2h"`, `"7d"`).
//!
//! Durations cross every boundary of redrive (config, API, CLI) as strings and
//! are held inside as whole milliseconds.

use std::fmt;

/// A duration string that could not be parsed.
#[derive(Debug, thiserror::Error)]
#[error("not a duration (use e.g. \"250ms\", \"30s\", \"5m\", \"2h\", \"7d\"): {0:?}")]
pub struct DurationError(pub String);

/// Parse `"1m 30s"`, `"250ms"`, `"0s"` … into milliseconds. A bare `"0"` is zero.
pub fn parse_duration_ms(s: &str) -> Result<u64, DurationError> {
    let t = s.trim();
    if t == "0" {
        return Ok(0);
    }
    humantime::parse_duration(t)
        .map(|d| d.as_millis().min(u64::MAX as u128) as u64)
        .map_err(|_| DurationError(s.to_owned()))
}

/// Render milliseconds the way a person writes them: `7d`, `1h 30m`, `250ms`, `0s`
/// (parseable by [`parse_duration_ms`]).
pub fn format_duration_ms(ms: u64) -> String {
    if ms == 0 {
        return "0s".to_owned();
    }
    const UNITS: [(u64, &str); 5] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
        (1, "ms"),
    ];
    let mut rest = ms;
    let mut parts = Vec::new();
    for (size, unit) in UNITS {
        if rest >= size {
            parts.push(format!("{}{unit}", rest / size));
            rest %= size;
        }
    }
    parts.join(" ")
}

/// A duration held as milliseconds that (de)serializes as a humantime string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct DurationMs(pub u64);

impl DurationMs {
    /// Whole milliseconds.
    pub const fn ms(self) -> u64 {
        self.0
    }
}

impl fmt::Display for DurationMs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_duration_ms(self.0))
    }
}

impl std::str::FromStr for DurationMs {
    type Err = DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_duration_ms(s).map(DurationMs)
    }
}

impl serde::Serialize for DurationMs {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration_ms(self.0))
    }
}

impl<'de> serde::Deserialize<'de> for DurationMs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration_ms(&s)
            .map(DurationMs)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_forms() {
        assert_eq!(parse_duration_ms("250ms").unwrap(), 250);
        assert_eq!(parse_duration_ms("30s").unwrap(), 30_000);
        assert_eq!(parse_duration_ms("5m").unwrap(), 300_000);
        assert_eq!(parse_duration_ms("2h").unwrap(), 7_200_000);
        assert_eq!(parse_duration_ms("7d").unwrap(), 604_800_000);
        assert_eq!(parse_duration_ms("1m 30s").unwrap(), 90_000);
        assert_eq!(parse_duration_ms("0s").unwrap(), 0);
        assert_eq!(parse_duration_ms("0").unwrap(), 0);
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_duration_ms("soon").is_err());
        assert!(parse_duration_ms("-5s").is_err());
        assert!(parse_duration_ms("").is_err());
    }

    #[test]
    fn formats_round_trip() {
        assert_eq!(format_duration_ms(604_800_000), "7d");
        assert_eq!(format_duration_ms(90_061_001), "1d 1h 1m 1s 1ms");
        assert_eq!(format_duration_ms(250), "250ms");
        for ms in [0, 1, 250, 1000, 90_000, 7_200_000, 604_800_000, 90_061_001] {
            assert_eq!(parse_duration_ms(&format_duration_ms(ms)).unwrap(), ms);
        }
    }
}
