//! Wall-clock instants as milliseconds since the Unix epoch.
//!
//! Everything redrive stores and compares is a [`Timestamp`]: an `i64` of
//! milliseconds, UTC. It renders as RFC 3339 with millisecond precision and
//! parses RFC 3339 with any offset (converted to UTC).

use std::fmt;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Milliseconds since 1970-01-01T00:00:00Z.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(i64);

/// A timestamp that is not RFC 3339.
#[derive(Debug, thiserror::Error)]
#[error("not an RFC 3339 timestamp (e.g. 2026-01-31T12:00:00Z): {0:?}")]
pub struct TimestampError(pub String);

impl Timestamp {
    /// From milliseconds since the epoch.
    pub const fn from_millis(ms: i64) -> Self {
        Self(ms)
    }

    /// Milliseconds since the epoch.
    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// The current wall-clock time.
    pub fn now() -> Self {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Self(d.as_millis() as i64)
    }

    /// This instant plus `ms` milliseconds (saturating).
    pub const fn plus_ms(self, ms: u64) -> Self {
        let ms = if ms > i64::MAX as u64 {
            i64::MAX
        } else {
            ms as i64
        };
        Self(self.0.saturating_add(ms))
    }

    /// Milliseconds from `earlier` to `self` (negative if `earlier` is later).
    pub const fn millis_since(self, earlier: Timestamp) -> i64 {
        self.0.saturating_sub(earlier.0)
    }

    /// Parse RFC 3339 (any offset; stored as UTC).
    pub fn parse(s: &str) -> Result<Self, TimestampError> {
        let dt = OffsetDateTime::parse(s, &Rfc3339).map_err(|_| TimestampError(s.to_owned()))?;
        Ok(Self((dt.unix_timestamp_nanos() / 1_000_000) as i64))
    }

    /// RFC 3339, UTC, millisecond precision: `2026-01-31T12:00:00.000Z`.
    pub fn to_rfc3339(self) -> String {
        let secs = self.0.div_euclid(1000);
        let ms = self.0.rem_euclid(1000);
        match OffsetDateTime::from_unix_timestamp(secs) {
            Ok(dt) => format!(
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
                dt.year(),
                u8::from(dt.month()),
                dt.day(),
                dt.hour(),
                dt.minute(),
                dt.second(),
                ms
            ),
            Err(_) => format!("{}ms", self.0),
        }
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

impl serde::Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> serde::Deserialize<'de> for Timestamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Timestamp::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_rfc3339() {
        let t = Timestamp::parse("2026-01-31T12:34:56.789Z").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-01-31T12:34:56.789Z");
        assert_eq!(Timestamp::parse(&t.to_rfc3339()).unwrap(), t);
    }

    #[test]
    fn offsets_become_utc() {
        let t = Timestamp::parse("2026-01-31T20:00:00+08:00").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-01-31T12:00:00.000Z");
    }

    #[test]
    fn rejects_garbage() {
        assert!(Timestamp::parse("tomorrow").is_err());
        assert!(Timestamp::parse("2026-01-31").is_err());
    }
}
