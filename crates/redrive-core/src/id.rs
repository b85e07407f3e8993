//! Message identifiers: UUIDv7, so ids sort by creation time.

use std::fmt;
use std::str::FromStr;

/// A message id. Sortable by creation time (UUIDv7), rendered hyphenated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MessageId(uuid::Uuid);

/// A string that is not a message id.
#[derive(Debug, thiserror::Error)]
#[error("not a message id (a UUID such as 0190b5c2-7d1e-7c3a-9f00-1a2b3c4d5e6f): {0:?}")]
pub struct IdError(pub String);

impl MessageId {
    /// A fresh, time-ordered id.
    pub fn new() -> Self {
        Self(uuid::Uuid::now_v7())
    }
}

impl Default for MessageId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

impl FromStr for MessageId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        uuid::Uuid::parse_str(s)
            .map(Self)
            .map_err(|_| IdError(s.to_owned()))
    }
}

impl serde::Serialize for MessageId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for MessageId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_sort_by_creation() {
        let a = MessageId::new();
        let b = MessageId::new();
        assert!(a < b);
        assert!(a.to_string() < b.to_string());
    }

    #[test]
    fn parses_its_own_rendering() {
        let a = MessageId::new();
        assert_eq!(a.to_string().parse::<MessageId>().unwrap(), a);
        assert!("nope".parse::<MessageId>().is_err());
    }
}
