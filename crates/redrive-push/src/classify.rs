//! What an answer of a push endpoint means (SPEC §10): a table of rules, first match wins.
//!
//! Defaults: 2xx → done; 410 → dead (`endpoint_gone`); 429 → `rate_limited`; 503 with a
//! `Retry-After` → `rate_limited`; 408, 425, 5xx, timeouts and connection errors →
//! `transient`; 400, 401, 403, 404, 405, 422 → `permanent`; 3xx → `permanent` (redirects are
//! not followed: a moved endpoint is a configuration to fix, not an outage to wait out); any
//! other status → `transient` (a misjudged answer then costs retries, never a message).
//! `Retry-After` is read in seconds or as an HTTP date; the caller bounds it
//! (`max_retry_after`).

use redrive_core::ErrorClass;
use std::str::FromStr;

/// What one push attempt got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt<'a> {
    /// An HTTP answer.
    Answered {
        /// Its status code.
        status: u16,
        /// Its `Retry-After` header, if any.
        retry_after: Option<&'a str>,
    },
    /// No answer within the timeout.
    TimedOut,
    /// No connection (refused, reset, DNS, TLS).
    ConnectFailed,
}

/// What the attempt means for the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Delivered: the message is done.
    Delivered,
    /// Failed with this class; retry no earlier than `retry_after_ms` if given.
    Failed {
        /// The failure's class.
        class: ErrorClass,
        /// From `Retry-After`, ms (unbounded here).
        retry_after_ms: Option<u64>,
    },
    /// The endpoint says it is gone for good (410): dead, `endpoint_gone`.
    Gone,
}

/// Statuses a rule matches: one code (`"404"`), a class (`"5xx"`) or a range (`"500-599"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Statuses {
    low: u16,
    high: u16,
}

/// A status set that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a status, a status class or a range (e.g. \"404\", \"5xx\", \"500-599\")")]
pub struct BadStatuses(String);

impl FromStr for Statuses {
    type Err = BadStatuses;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadStatuses(s.to_owned());
        let code = |t: &str| {
            t.parse::<u16>()
                .ok()
                .filter(|c| (100..=599).contains(c))
                .ok_or_else(bad)
        };
        let (low, high) = if let Some((a, b)) = s.split_once('-') {
            (code(a)?, code(b)?)
        } else if let Some(d) = s.strip_suffix("xx") {
            let d: u16 = d
                .parse()
                .ok()
                .filter(|d| (1..=5).contains(d))
                .ok_or_else(bad)?;
            (d * 100, d * 100 + 99)
        } else {
            let c = code(s)?;
            (c, c)
        };
        if low > high {
            return Err(bad());
        }
        Ok(Self { low, high })
    }
}

impl Statuses {
    fn contains(self, status: u16) -> bool {
        (self.low..=self.high).contains(&status)
    }
}

/// What a matching rule decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Delivered.
    Done,
    /// Failed with this class.
    Class(ErrorClass),
    /// Dead, `endpoint_gone`.
    Gone,
}

/// One rule of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// The statuses it matches.
    pub statuses: Statuses,
    /// Only when the answer has a usable `Retry-After`.
    pub with_retry_after: bool,
    /// What it decides.
    pub decision: Decision,
}

/// The rules, first match wins; a status no rule matches is `transient`. Timeouts and
/// connection errors have a decision of their own (`transient` unless configured).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    rules: Vec<Rule>,
    on_timeout: ErrorClass,
    on_connect_error: ErrorClass,
}

impl Default for Rules {
    fn default() -> Self {
        use Decision::{Class, Done, Gone};
        use ErrorClass::{Permanent, RateLimited, Transient};
        let rule = |s: &str, with_retry_after, decision| Rule {
            statuses: s.parse().unwrap_or_else(|e| panic!("built-in rule: {e}")),
            with_retry_after,
            decision,
        };
        Self {
            rules: vec![
                rule("2xx", false, Done),
                rule("410", false, Gone),
                rule("429", false, Class(RateLimited)),
                rule("503", true, Class(RateLimited)),
                rule("408", false, Class(Transient)),
                rule("425", false, Class(Transient)),
                rule("5xx", false, Class(Transient)),
                rule("400", false, Class(Permanent)),
                rule("401", false, Class(Permanent)),
                rule("403", false, Class(Permanent)),
                rule("404", false, Class(Permanent)),
                rule("405", false, Class(Permanent)),
                rule("422", false, Class(Permanent)),
                rule("3xx", false, Class(Permanent)),
            ],
            on_timeout: Transient,
            on_connect_error: Transient,
        }
    }
}

impl Rules {
    /// A table of `rules` (first match wins) in front of the defaults.
    pub fn with_overrides(rules: Vec<Rule>) -> Self {
        let mut all = rules;
        let defaults = Self::default();
        all.extend(defaults.rules);
        Self {
            rules: all,
            ..defaults
        }
    }

    /// The class of an attempt that got no answer within the timeout.
    pub fn on_timeout(mut self, class: ErrorClass) -> Self {
        self.on_timeout = class;
        self
    }

    /// The class of an attempt that got no connection (refused, reset, DNS, TLS).
    pub fn on_connect_error(mut self, class: ErrorClass) -> Self {
        self.on_connect_error = class;
        self
    }

    /// Classify one attempt; `now_s` (Unix seconds) turns an HTTP-date `Retry-After` into a delay.
    pub fn classify(&self, attempt: Attempt<'_>, now_s: i64) -> Verdict {
        let (status, retry_after) = match attempt {
            Attempt::TimedOut | Attempt::ConnectFailed => {
                let class = if attempt == Attempt::TimedOut {
                    self.on_timeout
                } else {
                    self.on_connect_error
                };
                return Verdict::Failed {
                    class,
                    retry_after_ms: None,
                };
            }
            Attempt::Answered {
                status,
                retry_after,
            } => (status, retry_after.and_then(|v| retry_after_ms(v, now_s))),
        };
        let decision = self
            .rules
            .iter()
            .find(|r| r.statuses.contains(status) && (!r.with_retry_after || retry_after.is_some()))
            .map_or(Decision::Class(ErrorClass::Transient), |r| r.decision);
        match decision {
            Decision::Done => Verdict::Delivered,
            Decision::Gone => Verdict::Gone,
            Decision::Class(class) => Verdict::Failed {
                class,
                retry_after_ms: retry_after,
            },
        }
    }
}

/// A `Retry-After` value as a delay from `now_s`, ms: whole seconds, or an HTTP date
/// (`Sun, 06 Nov 1994 08:49:37 GMT`; a date in the past is 0). `None` if it is neither.
pub fn retry_after_ms(value: &str, now_s: i64) -> Option<u64> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return value.parse::<u64>().ok().map(|s| s.saturating_mul(1_000));
    }
    let at = time::OffsetDateTime::parse(value, &time::format_description::well_known::Rfc2822)
        .ok()?
        .unix_timestamp();
    Some((at - now_s).max(0) as u64 * 1_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ErrorClass::{Permanent, RateLimited, Transient};

    const NOW: i64 = 784_111_777; // Sun, 06 Nov 1994 08:49:37 GMT

    fn answered(status: u16, retry_after: Option<&str>) -> Verdict {
        Rules::default().classify(
            Attempt::Answered {
                status,
                retry_after,
            },
            NOW,
        )
    }

    fn failed(class: ErrorClass, retry_after_ms: Option<u64>) -> Verdict {
        Verdict::Failed {
            class,
            retry_after_ms,
        }
    }

    #[test]
    fn the_spec_defaults() {
        for s in [200, 201, 204, 299] {
            assert_eq!(answered(s, None), Verdict::Delivered, "{s}");
        }
        assert_eq!(answered(410, None), Verdict::Gone);
        for s in [408, 425, 500, 502, 503, 504, 599] {
            assert_eq!(answered(s, None), failed(Transient, None), "{s}");
        }
        for s in [400, 401, 403, 404, 405, 422, 301, 302, 307] {
            assert_eq!(answered(s, None), failed(Permanent, None), "{s}");
        }
        for s in [409, 412, 418, 451] {
            assert_eq!(answered(s, None), failed(Transient, None), "unlisted {s}");
        }
        assert_eq!(answered(429, None), failed(RateLimited, None));
        assert_eq!(answered(429, Some("7")), failed(RateLimited, Some(7_000)));
        assert_eq!(
            answered(503, Some("120")),
            failed(RateLimited, Some(120_000))
        );
        assert_eq!(
            answered(503, Some("soon")),
            failed(Transient, None),
            "unusable Retry-After"
        );
        let none = Rules::default();
        assert_eq!(
            none.classify(Attempt::TimedOut, NOW),
            failed(Transient, None)
        );
        assert_eq!(
            none.classify(Attempt::ConnectFailed, NOW),
            failed(Transient, None)
        );
    }

    #[test]
    fn retry_after_in_both_forms() {
        assert_eq!(retry_after_ms("0", NOW), Some(0));
        assert_eq!(retry_after_ms(" 30 ", NOW), Some(30_000));
        assert_eq!(
            retry_after_ms("Sun, 06 Nov 1994 08:50:37 GMT", NOW),
            Some(60_000)
        );
        assert_eq!(
            retry_after_ms("Sun, 06 Nov 1994 08:48:37 GMT", NOW),
            Some(0),
            "past"
        );
        for bad in ["", "-5", "1.5", "tomorrow", "Sun, 06 Nov 1994"] {
            assert_eq!(retry_after_ms(bad, NOW), None, "{bad:?}");
        }
    }

    #[test]
    fn overrides_come_first() {
        let rules = Rules::with_overrides(vec![Rule {
            statuses: "404".parse().unwrap(),
            with_retry_after: false,
            decision: Decision::Class(Transient),
        }]);
        let got = rules.classify(
            Attempt::Answered {
                status: 404,
                retry_after: None,
            },
            NOW,
        );
        assert_eq!(got, failed(Transient, None));
        let rules = Rules::default()
            .on_timeout(Permanent)
            .on_connect_error(RateLimited);
        assert_eq!(
            rules.classify(Attempt::TimedOut, NOW),
            failed(Permanent, None)
        );
        assert_eq!(
            rules.classify(Attempt::ConnectFailed, NOW),
            failed(RateLimited, None)
        );
    }

    #[test]
    fn status_sets_parse_strictly() {
        assert!("5xx".parse::<Statuses>().unwrap().contains(503));
        assert!("500-502".parse::<Statuses>().unwrap().contains(502));
        assert!(!"500-502".parse::<Statuses>().unwrap().contains(503));
        for bad in ["6xx", "0xx", "99", "600", "502-500", "abc", "", "5x"] {
            assert!(bad.parse::<Statuses>().is_err(), "{bad:?}");
        }
    }
}
