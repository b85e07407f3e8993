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
    /// The Unix epoch. As a due time it is past on every clock: due at once by whichever
    /// clock decides (the store's, which on a shared database is not this machine's).
    pub const EPOCH: Timestamp = Timestamp(0);

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
        self.with_text(str::to_owned)
    }

    /// `f` of this instant's text: [`Self::to_rfc3339`]'s, or its milliseconds (`…ms`)
    /// outside years 0000–9999; without allocating in the usual case.
    fn with_text<R>(self, f: impl FnOnce(&str) -> R) -> R {
        let mut buf = [0u8; RFC3339_LEN];
        match self.rfc3339_in(&mut buf) {
            Some(s) => f(s),
            None => f(&format!("{}ms", self.0)),
        }
    }

    /// [`Self::to_rfc3339`] written into `buf`, digit by digit (every history entry, and so
    /// every settle, renders a few: `format!` was 8 % of the embedded writer's time); `None`
    /// outside years 0000–9999, which RFC 3339 cannot write.
    fn rfc3339_in(self, buf: &mut [u8; RFC3339_LEN]) -> Option<&str> {
        let dt = OffsetDateTime::from_unix_timestamp(self.0.div_euclid(1000)).ok()?;
        let year = u32::try_from(dt.year()).ok().filter(|y| *y <= 9999)?;
        let ms = self.0.rem_euclid(1000) as u32;
        fn put(buf: &mut [u8], at: usize, digits: usize, mut v: u32) {
            for i in (0..digits).rev() {
                buf[at + i] = b'0' + (v % 10) as u8;
                v /= 10;
            }
        }
        buf.copy_from_slice(b"0000-00-00T00:00:00.000Z");
        put(buf, 0, 4, year);
        put(buf, 5, 2, u32::from(u8::from(dt.month())));
        put(buf, 8, 2, u32::from(dt.day()));
        put(buf, 11, 2, u32::from(dt.hour()));
        put(buf, 14, 2, u32::from(dt.minute()));
        put(buf, 17, 2, u32::from(dt.second()));
        put(buf, 20, 3, ms);
        std::str::from_utf8(buf).ok()
    }
}

/// Length of [`Timestamp::to_rfc3339`]'s text for years 0000–9999.
const RFC3339_LEN: usize = 24;

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with_text(|s| f.write_str(s))
    }
}

impl serde::Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.with_text(|text| s.serialize_str(text))
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

    /// The digit-by-digit text is what `format!` over `time`'s fields wrote (the old code)
    /// for years 0000–9999, and the millisecond form outside them (before year 0 the old
    /// code wrote a negative year, which no RFC 3339 parser reads back either).
    mod prop {
        use super::*;
        use proptest::prelude::*;

        fn by_format(t: Timestamp) -> String {
            let ms = t.0.rem_euclid(1000);
            match OffsetDateTime::from_unix_timestamp(t.0.div_euclid(1000)) {
                Ok(dt) if (0..=9999).contains(&dt.year()) => format!(
                    "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
                    dt.year(),
                    u8::from(dt.month()),
                    dt.day(),
                    dt.hour(),
                    dt.minute(),
                    dt.second(),
                    ms
                ),
                _ => format!("{}ms", t.0),
            }
        }

        proptest! {
            #[test]
            fn renders_as_format_did(ms in -62_200_000_000_000i64..253_500_000_000_000i64) {
                let t = Timestamp::from_millis(ms);
                let text = t.to_rfc3339();
                prop_assert_eq!(&text, &by_format(t));
                prop_assert_eq!(t.to_string(), text.clone());
                prop_assert_eq!(serde_json::to_string(&t).unwrap(), format!("\"{text}\""));
                if !text.ends_with("ms") {
                    prop_assert_eq!(Timestamp::parse(&text).unwrap(), t);
                }
            }
        }

        #[test]
        fn the_ends() {
            assert_eq!(
                Timestamp::from_millis(0).to_rfc3339(),
                "1970-01-01T00:00:00.000Z"
            );
            assert_eq!(
                Timestamp::from_millis(-1).to_rfc3339(),
                "1969-12-31T23:59:59.999Z"
            );
            let first = Timestamp::parse("0000-01-01T00:00:00Z").unwrap();
            assert_eq!(first.to_rfc3339(), "0000-01-01T00:00:00.000Z");
            let before = Timestamp::from_millis(first.0 - 1);
            assert_eq!(before.to_rfc3339(), format!("{}ms", first.0 - 1));
            let last = Timestamp::parse("9999-12-31T23:59:59.999Z").unwrap();
            assert_eq!(last.to_rfc3339(), "9999-12-31T23:59:59.999Z");
            let after = Timestamp::from_millis(last.0 + 1);
            assert_eq!(after.to_rfc3339(), format!("{}ms", last.0 + 1));
            assert_eq!(
                Timestamp::from_millis(i64::MIN).to_string(),
                format!("{}ms", i64::MIN)
            );
            assert_eq!(
                Timestamp::from_millis(i64::MAX).to_string(),
                format!("{}ms", i64::MAX)
            );
        }
    }
}
