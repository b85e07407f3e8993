//! Retry policies (SPEC §3) and the decision after a failed attempt.
//!
//! A [`RetryPolicy`] is resolved from a [`RetryPolicyConfig`] (the TOML
//! section, every key optional, layered over a base) and then answers one
//! question, purely: given this failure of this message, retry when, or dead
//! why? ([`RetryPolicy::decide`]). The answer depends only on its inputs —
//! the policy, the attempt number, the failure, the previous delay, the clock
//! reading and a seeded RNG — so it is reproducible and property-tested.
//!
//! Invariants (property-tested in `tests/retry_policy_props.rs`):
//! - a retry delay never exceeds `max_delay` (after jitter);
//! - no retry is scheduled past `window_start + max_age` (the window starts at the
//!   publish and again at each redrive);
//! - the same seed yields the same schedule;
//! - jitter stays within the range [`RetryPolicy::explain`] prints;
//! - a `rate_limited` failure never waits less than the policy's floor for the
//!   attempt ([`RetryPolicy::rate_limited_floor_ms`]), whatever its `retry_after`;
//! - after `max_rate_limited` uncharged rate-limited attempts, they are charged.
//!
//! # Rate limits
//!
//! A `rate_limited` failure (HTTP 429 and the like) waits the consumer's `retry_after`
//! (at most `max_retry_after`), or the backoff's delay when it gives none, and does
//! not count against `max_attempts`. Two bounds keep that from becoming a hot loop
//! (issue 5: `retry_after: "0s"` on a fixed 1 s policy gave 680 deliveries in 2 s):
//!
//! - **A floor.** The wait is never shorter than the policy's own delay for the
//!   attempt *before jitter* (capped at `max_delay`; for the random backoffs,
//!   `decorrelated` and `sidekiq`, the shortest delay they can draw). Jitter is not
//!   applied to the floor: it exists to spread retries apart, and a floor that full
//!   jitter could pull down to zero would not stop the loop. So `retry_after: "0s"`
//!   on a fixed 1 s policy waits 1 s; on the default policy (exponential from 1 s),
//!   at least 1 s, then 2 s, 4 s … as charged attempts accumulate. A `retry_after`
//!   above `max_retry_after` is cut to it, but never below the floor.
//! - **A budget of uncharged attempts.** After `max_rate_limited` uncharged
//!   rate-limited attempts (default [`DEFAULT_MAX_RATE_LIMITED`], counted since the
//!   publish or the last redrive), further ones count against `max_attempts` like any
//!   failure, so a consumer that is rate limited for ever ends in the dead-letter
//!   queue rather than redelivering until `max_age`.

use crate::{
    format_duration_ms, DeadReason, DurationMs, ErrorClass, Failure, SplitMix64, Timestamp,
};
use serde::{Deserialize, Serialize};

/// How the base delay grows with the attempt number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backoff {
    /// `initial_delay` every time.
    Fixed,
    /// `initial_delay × n` for the n-th retry.
    Linear,
    /// `initial_delay × multiplier^(n-1)` for the n-th retry.
    Exponential,
    /// AWS "decorrelated jitter": random between `initial_delay` and 3 × the previous delay.
    Decorrelated,
    /// The explicit `schedule` list; its last entry repeats if attempts remain.
    Schedule,
    /// Sidekiq's formula `n⁴ + 15 + rand(10)·(n+1)` seconds, n counting retries from 0.
    Sidekiq,
}

/// How randomness spreads a delay `d` (after the `max_delay` cap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Jitter {
    /// Exactly `d`.
    None,
    /// Uniform in `[0, d]`.
    Full,
    /// Uniform in `[d/2, d]`.
    Equal,
    /// Uniform in `[initial_delay, max(initial_delay, 3 × previous delay)]`; the previous
    /// delay is `d` on the first retry.
    Decorrelated,
}

/// A policy that cannot be used, naming the key at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// `preset` names no known preset.
    #[error("retry.preset: unknown preset {0:?} (known: rocketmq, sidekiq, svix)")]
    UnknownPreset(String),
    /// A key has a value outside its range.
    #[error("retry.{key}: {reason}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// The `retry` section as written: every key optional, so sections layer
/// (built-in defaults ← `[queues.default.retry]` ← `[queues.NAME.retry]`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicyConfig {
    /// Deliveries in all, the first included.
    pub max_attempts: Option<u32>,
    /// Backoff shape.
    pub backoff: Option<Backoff>,
    /// First retry delay (base of fixed / linear / exponential / decorrelated).
    pub initial_delay: Option<DurationMs>,
    /// Growth factor of `exponential`.
    pub multiplier: Option<f64>,
    /// Cap on one delay, after jitter.
    pub max_delay: Option<DurationMs>,
    /// Jitter.
    pub jitter: Option<Jitter>,
    /// No retry is scheduled past `max_age` after the publish, or after the last redrive.
    pub max_age: Option<DurationMs>,
    /// Delays of `backoff = "schedule"`.
    pub schedule: Option<Vec<DurationMs>>,
    /// A named schedule: `rocketmq`, `sidekiq`, `svix`.
    pub preset: Option<String>,
    /// Upper bound on a consumer's `retry_after` for `rate_limited` failures.
    pub max_retry_after: Option<DurationMs>,
    /// Whether `rate_limited` attempts count against `max_attempts`.
    pub rate_limited_counts: Option<bool>,
    /// Rate-limited attempts left uncharged before they count against `max_attempts`.
    pub max_rate_limited: Option<u32>,
}

impl RetryPolicyConfig {
    /// `self`'s keys where set, `base`'s otherwise.
    pub fn over(&self, base: &RetryPolicyConfig) -> RetryPolicyConfig {
        RetryPolicyConfig {
            max_attempts: self.max_attempts.or(base.max_attempts),
            backoff: self.backoff.or(base.backoff),
            initial_delay: self.initial_delay.or(base.initial_delay),
            multiplier: self.multiplier.or(base.multiplier),
            max_delay: self.max_delay.or(base.max_delay),
            jitter: self.jitter.or(base.jitter),
            max_age: self.max_age.or(base.max_age),
            schedule: self.schedule.clone().or_else(|| base.schedule.clone()),
            preset: self.preset.clone().or_else(|| base.preset.clone()),
            max_retry_after: self.max_retry_after.or(base.max_retry_after),
            rate_limited_counts: self.rate_limited_counts.or(base.rate_limited_counts),
            max_rate_limited: self.max_rate_limited.or(base.max_rate_limited),
        }
    }

    /// Resolve into a usable policy: preset defaults under explicit keys, built-in
    /// defaults under both, then validation.
    pub fn resolve(&self) -> Result<RetryPolicy, PolicyError> {
        let mut p = RetryPolicy::default();
        if let Some(name) = &self.preset {
            p = RetryPolicy::preset(name)
                .ok_or_else(|| PolicyError::UnknownPreset(name.clone()))?;
        }
        if let Some(v) = self.max_attempts {
            p.max_attempts = v;
        }
        if let Some(v) = self.backoff {
            p.backoff = v;
        }
        if let Some(v) = self.initial_delay {
            p.initial_delay_ms = v.ms();
        }
        if let Some(v) = self.multiplier {
            p.multiplier = v;
        }
        if let Some(v) = self.max_delay {
            p.max_delay_ms = v.ms();
        }
        if let Some(v) = self.jitter {
            p.jitter = v;
        }
        if let Some(v) = self.max_age {
            p.max_age_ms = v.ms();
        }
        if let Some(v) = &self.schedule {
            p.schedule_ms = v.iter().map(|d| d.ms()).collect();
            if self.backoff.is_none() && self.preset.is_none() {
                p.backoff = Backoff::Schedule;
            }
        }
        if let Some(v) = self.max_retry_after {
            p.max_retry_after_ms = v.ms();
        }
        if let Some(v) = self.rate_limited_counts {
            p.rate_limited_counts = v;
        }
        if let Some(v) = self.max_rate_limited {
            p.max_rate_limited = v;
        }
        p.validate()?;
        Ok(p)
    }
}

/// A resolved retry policy. Build one with [`RetryPolicyConfig::resolve`],
/// [`RetryPolicy::preset`] or [`Default`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    /// Deliveries in all, the first included (≥ 1).
    pub max_attempts: u32,
    /// Backoff shape.
    pub backoff: Backoff,
    /// Base delay, ms.
    pub initial_delay_ms: u64,
    /// Exponential growth factor (≥ 1).
    pub multiplier: f64,
    /// Cap on one delay after jitter, ms.
    pub max_delay_ms: u64,
    /// Jitter.
    pub jitter: Jitter,
    /// Retry window from the publish (or the last redrive), ms.
    pub max_age_ms: u64,
    /// Delays of `Backoff::Schedule`, ms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schedule_ms: Vec<u64>,
    /// Bound on a `rate_limited` failure's `retry_after`, ms.
    pub max_retry_after_ms: u64,
    /// Whether `rate_limited` attempts count against `max_attempts`.
    pub rate_limited_counts: bool,
    /// Rate-limited attempts left uncharged (since the publish or the last redrive)
    /// before further ones count against `max_attempts`; see the module docs.
    pub max_rate_limited: u32,
}

/// Default of `max_rate_limited`: 20 uncharged rate-limited attempts. With the floor,
/// that is at least 20 × the first delay (20 s on the default policy) and, with a
/// server's typical `retry_after` of a minute, about 20 minutes of waiting out a rate
/// limit before the attempts count; long enough for a limit window (per second, per
/// minute) to reset many times, short enough that a consumer rate limited for ever
/// reaches the dead-letter queue after `max_attempts` more tries instead of
/// redelivering for the whole `max_age` (7 days by default).
pub const DEFAULT_MAX_RATE_LIMITED: u32 = 20;

/// RocketMQ's 18 delay levels.
const ROCKETMQ_LEVELS: &[&str] = &[
    "1s", "5s", "10s", "30s", "1m", "2m", "3m", "4m", "5m", "6m", "7m", "8m", "9m", "10m", "20m",
    "30m", "1h", "2h",
];
/// Svix's webhook retry schedule.
const SVIX_LEVELS: &[&str] = &["5s", "5m", "30m", "2h", "5h", "10h", "10h"];

const SECOND: u64 = 1_000;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

fn levels(list: &[&str]) -> Vec<u64> {
    list.iter()
        .map(|s| crate::parse_duration_ms(s).unwrap_or(0))
        .collect()
}

impl Default for RetryPolicy {
    /// SPEC §3 defaults: 20 attempts, exponential from 1 s ×2, capped at 1 h, equal
    /// jitter, 7 d window, `retry_after` bounded at 1 h, rate limits not counted for
    /// the first [`DEFAULT_MAX_RATE_LIMITED`].
    ///
    /// **The default outlives an outage.** The 19 retries wait 1 s, 2 s, 4 s … 2048 s
    /// (4095 s in all), then 7 × 1 h: 29,295 s ≈ 8 h 8 min without jitter. Equal jitter
    /// draws each wait in `[d/2, d]`, so whatever it draws a message on this policy keeps
    /// being retried for at least half that, 14,647.5 s ≈ 4 h 4 min
    /// ([`DEFAULT_MIN_RETRY_SPAN_MS`], property-tested), and a database failover or a
    /// partner's afternoon outage does not become dead letters. (Until issue 15 the
    /// default was 8 attempts with full jitter, capped at 15 min: dead within 2 min 7 s at
    /// most, as early as the first seconds when the jitter drew low.) Equal rather than
    /// full jitter because full jitter can draw every wait near 0: it spreads retries
    /// apart as well, but guarantees no span at all.
    fn default() -> Self {
        Self {
            max_attempts: 20,
            backoff: Backoff::Exponential,
            initial_delay_ms: SECOND,
            multiplier: 2.0,
            max_delay_ms: HOUR,
            jitter: Jitter::Equal,
            max_age_ms: 7 * DAY,
            schedule_ms: Vec::new(),
            max_retry_after_ms: HOUR,
            rate_limited_counts: false,
            max_rate_limited: DEFAULT_MAX_RATE_LIMITED,
        }
    }
}

/// The shortest time from the first attempt to the last one under the default policy,
/// whatever its jitter draws: at least 4 hours (half of the un-jittered 29,295 s, see
/// [`RetryPolicy::default`]). SPEC §3: "the default outlives an outage".
pub const DEFAULT_MIN_RETRY_SPAN_MS: u64 = 4 * HOUR;

/// What the policy needs to know about the message whose attempt just failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureContext {
    /// Attempts counted against `max_attempts` so far, the failed one included
    /// (≥ 1). Rate-limited attempts are included only if the policy counts them.
    pub counted_attempts: u32,
    /// Start of the `max_age` window: the message's publish time, or its last redrive
    /// (a redrive gives a fresh window as well as a fresh attempt budget, SPEC §2).
    pub window_start: Timestamp,
    /// Now.
    pub now: Timestamp,
    /// The delay chosen before the previous attempt, if any (decorrelated jitter).
    pub prev_delay_ms: Option<u64>,
    /// Rate-limited attempts left uncharged so far (since the publish or the last
    /// redrive), the failed one excluded; compared with `max_rate_limited`.
    pub uncharged_rate_limited: u32,
}

/// What happens after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Deliver again at `due_at` (= now + `delay_ms`).
    Retry {
        /// The chosen delay.
        delay_ms: u64,
        /// When the next attempt becomes deliverable.
        due_at: Timestamp,
        /// Whether this attempt counts against `max_attempts`.
        counted: bool,
    },
    /// No more retries.
    Dead {
        /// Why.
        reason: DeadReason,
    },
}

/// One row of [`RetryPolicy::explain`]: the wait before `attempt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ExplainRow {
    /// The attempt that follows the wait (2 = first retry).
    pub attempt: u32,
    /// Shortest possible wait, ms.
    pub delay_min_ms: u64,
    /// Longest possible wait, ms.
    pub delay_max_ms: u64,
    /// Shortest time from the first attempt to this one, ms.
    pub cumulative_min_ms: u64,
    /// Longest time from the first attempt to this one, ms.
    pub cumulative_max_ms: u64,
    /// Whether this attempt may fall past `max_age` (then the message is dead instead).
    pub may_exceed_max_age: bool,
}

impl RetryPolicy {
    /// A named preset with its defaults: `rocketmq`, `sidekiq` or `svix`.
    pub fn preset(name: &str) -> Option<Self> {
        let base = Self {
            jitter: Jitter::None,
            ..Self::default()
        };
        match name {
            "rocketmq" => Some(Self {
                max_attempts: ROCKETMQ_LEVELS.len() as u32 + 1,
                backoff: Backoff::Schedule,
                schedule_ms: levels(ROCKETMQ_LEVELS),
                max_delay_ms: 2 * HOUR,
                ..base
            }),
            "sidekiq" => Some(Self {
                // Sidekiq's default: 25 retries after the first attempt, ~20 days.
                max_attempts: 26,
                backoff: Backoff::Sidekiq,
                max_delay_ms: 4 * DAY,
                max_age_ms: 30 * DAY,
                ..base
            }),
            "svix" => Some(Self {
                max_attempts: SVIX_LEVELS.len() as u32 + 1,
                backoff: Backoff::Schedule,
                schedule_ms: levels(SVIX_LEVELS),
                max_delay_ms: 10 * HOUR,
                ..base
            }),
            _ => None,
        }
    }

    /// Check ranges; the error names the key.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let bad = |key, reason: &str| {
            Err(PolicyError::Invalid {
                key,
                reason: reason.to_owned(),
            })
        };
        if self.max_attempts == 0 {
            return bad(
                "max_attempts",
                "must be at least 1 (the first delivery counts)",
            );
        }
        if !(self.multiplier.is_finite() && self.multiplier >= 1.0) {
            return bad("multiplier", "must be a finite number ≥ 1.0");
        }
        if self.max_delay_ms == 0 && self.backoff != Backoff::Fixed && self.initial_delay_ms > 0 {
            return bad("max_delay", "must be greater than 0s");
        }
        if self.backoff == Backoff::Schedule && self.schedule_ms.is_empty() {
            return bad(
                "schedule",
                "backoff = \"schedule\" needs a non-empty schedule list",
            );
        }
        if self.max_age_ms == 0 {
            return bad("max_age", "must be greater than 0s");
        }
        Ok(())
    }

    /// The base delay before the retry that follows the `n`-th counted failure (n ≥ 1),
    /// before the cap and jitter.
    fn base_delay_ms(&self, n: u32, prev_delay_ms: Option<u64>, rng: &mut SplitMix64) -> u64 {
        let n = n.max(1);
        match self.backoff {
            Backoff::Fixed => self.initial_delay_ms,
            Backoff::Linear => self.initial_delay_ms.saturating_mul(n as u64),
            Backoff::Exponential => {
                let f = self.multiplier.powi((n - 1).min(1024) as i32);
                let d = self.initial_delay_ms as f64 * f;
                if d.is_finite() && d < u64::MAX as f64 {
                    d as u64
                } else {
                    u64::MAX
                }
            }
            Backoff::Decorrelated => {
                let prev = prev_delay_ms.unwrap_or(self.initial_delay_ms);
                let hi = prev.saturating_mul(3).max(self.initial_delay_ms);
                rng.between(self.initial_delay_ms, hi)
            }
            Backoff::Schedule => {
                let i = (n as usize - 1).min(self.schedule_ms.len().saturating_sub(1));
                self.schedule_ms
                    .get(i)
                    .copied()
                    .unwrap_or(self.initial_delay_ms)
            }
            Backoff::Sidekiq => {
                let c = (n - 1) as u64;
                // Saturating: c⁴ alone saturates from c = 65536 on.
                let secs = c
                    .saturating_pow(4)
                    .saturating_add(15)
                    .saturating_add(rng.between(0, 9) * (c + 1));
                secs.saturating_mul(SECOND)
            }
        }
    }

    /// Apply the cap and the jitter to a base delay.
    fn jittered_ms(&self, base: u64, prev_delay_ms: Option<u64>, rng: &mut SplitMix64) -> u64 {
        let d = base.min(self.max_delay_ms);
        let j = match self.jitter {
            Jitter::None => d,
            Jitter::Full => rng.between(0, d),
            Jitter::Equal => rng.between(d / 2, d),
            Jitter::Decorrelated => {
                let prev = prev_delay_ms.unwrap_or(d);
                let hi = prev.saturating_mul(3).max(self.initial_delay_ms);
                rng.between(self.initial_delay_ms.min(hi), hi)
            }
        };
        j.min(self.max_delay_ms)
    }

    /// The decision after a failed attempt: retry when, or dead why.
    pub fn decide(
        &self,
        ctx: &FailureContext,
        failure: &Failure,
        rng: &mut SplitMix64,
    ) -> Decision {
        let counted = match self.ends(ctx, failure) {
            Ok(counted) => counted,
            Err(reason) => return Decision::Dead { reason },
        };
        let rate_limited = failure.class == ErrorClass::RateLimited;
        let delay_ms = match (failure.class, failure.retry_after_ms) {
            (ErrorClass::RateLimited, Some(after)) => after.min(self.max_retry_after_ms),
            _ => {
                let base = self.base_delay_ms(ctx.counted_attempts, ctx.prev_delay_ms, rng);
                self.jittered_ms(base, ctx.prev_delay_ms, rng)
            }
        };
        let delay_ms = if rate_limited {
            delay_ms.max(self.rate_limited_floor_ms(ctx.counted_attempts))
        } else {
            delay_ms
        };
        let due_at = ctx.now.plus_ms(delay_ms);
        let deadline = ctx.window_start.plus_ms(self.max_age_ms);
        if due_at > deadline {
            return Decision::Dead {
                reason: DeadReason::MaxAge,
            };
        }
        Decision::Retry {
            delay_ms,
            due_at,
            counted,
        }
    }

    /// The decision after a failed attempt whose next try the caller has already timed
    /// (a publish with `failed` and `deliver_at`: an import of a retry table's
    /// `next_retry_at`): the policy decides whether there is one — dead when the failure is
    /// permanent, the budget is spent, or `at` falls past the `max_age` window, exactly as
    /// [`decide`](Self::decide) would — but not when: the retry is due at `at`, or now when
    /// `at` is past. Draws nothing from a generator.
    pub fn decide_at(&self, ctx: &FailureContext, failure: &Failure, at: Timestamp) -> Decision {
        let counted = match self.ends(ctx, failure) {
            Ok(counted) => counted,
            Err(reason) => return Decision::Dead { reason },
        };
        let due_at = at.max(ctx.now);
        if due_at > ctx.window_start.plus_ms(self.max_age_ms) {
            return Decision::Dead {
                reason: DeadReason::MaxAge,
            };
        }
        Decision::Retry {
            delay_ms: due_at.millis_since(ctx.now).max(0) as u64,
            due_at,
            counted,
        }
    }

    /// Whether a failure ends the message whatever its next try's time: `Err` with the
    /// reason when it is permanent or the budget is spent, else `Ok` with whether the
    /// attempt counts against `max_attempts` (a rate limit may not).
    fn ends(&self, ctx: &FailureContext, failure: &Failure) -> Result<bool, DeadReason> {
        let rate_limited = failure.class == ErrorClass::RateLimited;
        let counted = !rate_limited
            || self.rate_limited_counts
            || ctx.uncharged_rate_limited >= self.max_rate_limited;
        if failure.class == ErrorClass::Permanent {
            return Err(if failure.is_endpoint_gone() {
                DeadReason::EndpointGone
            } else {
                DeadReason::PermanentError
            });
        }
        if counted && ctx.counted_attempts >= self.max_attempts {
            return Err(DeadReason::MaxAttempts);
        }
        Ok(counted)
    }

    /// `decision` held to "no earlier than `later`" (a release's `delay` past its bound):
    /// a retry due before `later` is moved to it, or dead (`max_age`) when `later` is past
    /// the window; any other decision is kept.
    pub fn not_before(
        &self,
        decision: Decision,
        ctx: &FailureContext,
        later: Timestamp,
    ) -> Decision {
        match decision {
            Decision::Retry {
                due_at, counted, ..
            } if later > due_at => {
                if later > ctx.window_start.plus_ms(self.max_age_ms) {
                    Decision::Dead {
                        reason: DeadReason::MaxAge,
                    }
                } else {
                    Decision::Retry {
                        delay_ms: (later.as_millis() - ctx.now.as_millis()).max(0) as u64,
                        due_at: later,
                        counted,
                    }
                }
            }
            other => other,
        }
    }

    /// The shortest wait after a `rate_limited` failure when `counted_attempts` attempts
    /// are counted (≥ 1): the backoff's delay for that attempt before jitter, capped at
    /// `max_delay` (for `decorrelated` and `sidekiq`, the shortest they can draw).
    /// See the module docs, "Rate limits".
    pub fn rate_limited_floor_ms(&self, counted_attempts: u32) -> u64 {
        let n = counted_attempts.max(1);
        let base = match self.backoff {
            Backoff::Decorrelated => self.initial_delay_ms,
            Backoff::Sidekiq => {
                let c = (n - 1) as u64;
                c.saturating_pow(4)
                    .saturating_add(15)
                    .saturating_mul(SECOND)
            }
            _ => self.base_delay_ms(n, None, &mut SplitMix64::new(0)),
        };
        base.min(self.max_delay_ms)
    }

    /// The schedule as a table: for each retry, the range of its wait and of the
    /// cumulative time since the first attempt, assuming transient failures.
    pub fn explain(&self) -> Vec<ExplainRow> {
        let mut rows = Vec::new();
        let (mut cum_min, mut cum_max) = (0u64, 0u64);
        let mut prev_max: Option<u64> = None;
        for n in 1..self.max_attempts {
            let (bmin, bmax) = match self.backoff {
                Backoff::Decorrelated => {
                    let prev = prev_max.unwrap_or(self.initial_delay_ms);
                    (
                        self.initial_delay_ms,
                        prev.saturating_mul(3).max(self.initial_delay_ms),
                    )
                }
                Backoff::Sidekiq => {
                    let c = (n - 1) as u64;
                    let lo = c
                        .saturating_pow(4)
                        .saturating_add(15)
                        .saturating_mul(SECOND);
                    (lo, lo.saturating_add(9 * (c + 1) * SECOND))
                }
                _ => {
                    let d = self.base_delay_ms(n, None, &mut SplitMix64::new(0));
                    (d, d)
                }
            };
            let (bmin, bmax) = (bmin.min(self.max_delay_ms), bmax.min(self.max_delay_ms));
            let (dmin, dmax) = match self.jitter {
                Jitter::None => (bmin, bmax),
                Jitter::Full => (0, bmax),
                Jitter::Equal => (bmin / 2, bmax),
                Jitter::Decorrelated => {
                    let prev = prev_max.unwrap_or(bmax);
                    let hi = prev.saturating_mul(3).max(self.initial_delay_ms);
                    (self.initial_delay_ms.min(hi), hi)
                }
            };
            let (dmin, dmax) = (dmin.min(self.max_delay_ms), dmax.min(self.max_delay_ms));
            prev_max = Some(dmax);
            cum_min = cum_min.saturating_add(dmin);
            cum_max = cum_max.saturating_add(dmax);
            rows.push(ExplainRow {
                attempt: n + 1,
                delay_min_ms: dmin,
                delay_max_ms: dmax,
                cumulative_min_ms: cum_min,
                cumulative_max_ms: cum_max,
                may_exceed_max_age: cum_max > self.max_age_ms,
            });
        }
        rows
    }

    /// A one-line human summary, e.g. for `GET /v1/queues/{queue}`.
    pub fn summary(&self) -> String {
        format!(
            "{:?} backoff from {}, max {} attempts, cap {}, jitter {:?}, max age {}",
            self.backoff,
            format_duration_ms(self.initial_delay_ms),
            self.max_attempts,
            format_duration_ms(self.max_delay_ms),
            self.jitter,
            format_duration_ms(self.max_age_ms)
        )
        .to_lowercase()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(n: u32) -> FailureContext {
        let t = Timestamp::from_millis(1_000_000);
        FailureContext {
            counted_attempts: n,
            window_start: t,
            now: t,
            prev_delay_ms: None,
            uncharged_rate_limited: 0,
        }
    }

    fn transient() -> Failure {
        Failure::new(ErrorClass::Transient, "boom")
    }

    #[test]
    fn rocketmq_preset_has_eighteen_levels() {
        let p = RetryPolicy::preset("rocketmq").unwrap();
        assert_eq!(p.schedule_ms.len(), 18);
        assert_eq!(p.max_attempts, 19);
        let rows = p.explain();
        assert_eq!(rows.len(), 18);
        assert_eq!(rows[0].delay_min_ms, 1_000);
        assert_eq!(rows[17].delay_max_ms, 2 * HOUR);
    }

    #[test]
    fn svix_preset_matches_its_schedule() {
        let p = RetryPolicy::preset("svix").unwrap();
        let mut rng = SplitMix64::new(1);
        let mut delays = vec![];
        for n in 1..p.max_attempts {
            match p.decide(&ctx(n), &transient(), &mut rng) {
                Decision::Retry { delay_ms, .. } => delays.push(delay_ms),
                d => panic!("{d:?}"),
            }
        }
        assert_eq!(delays, levels(SVIX_LEVELS));
        assert_eq!(
            p.decide(&ctx(p.max_attempts), &transient(), &mut rng),
            Decision::Dead {
                reason: DeadReason::MaxAttempts
            }
        );
    }

    #[test]
    fn sidekiq_formula() {
        let p = RetryPolicy::preset("sidekiq").unwrap();
        let mut rng = SplitMix64::new(3);
        for n in 1..10u32 {
            let c = (n - 1) as u64;
            match p.decide(&ctx(n), &transient(), &mut rng) {
                Decision::Retry { delay_ms, .. } => {
                    let lo = (c.pow(4) + 15) * 1000;
                    assert!(
                        delay_ms >= lo && delay_ms <= lo + 9 * (c + 1) * 1000,
                        "{n}: {delay_ms}"
                    );
                    assert_eq!((delay_ms - lo) % ((c + 1) * 1000), 0);
                }
                d => panic!("{d:?}"),
            }
        }
    }

    #[test]
    fn explain_default_policy() {
        // Exponential from 1 s ×2, capped at 1 h, equal jitter, 20 attempts: attempt n+1
        // waits [d/2, d] with d = min(2^(n-1) s, 1 h).
        let p = RetryPolicy::default();
        let rows = p.explain();
        assert_eq!(rows.len(), 19);
        assert_eq!(
            rows[0],
            ExplainRow {
                attempt: 2,
                delay_min_ms: SECOND / 2,
                delay_max_ms: SECOND,
                cumulative_min_ms: SECOND / 2,
                cumulative_max_ms: SECOND,
                may_exceed_max_age: false,
            }
        );
        let maxima: Vec<u64> = rows.iter().map(|r| r.delay_max_ms).collect();
        let want: Vec<u64> = (0..19).map(|i| (SECOND << i).min(HOUR)).collect();
        assert_eq!(maxima, want);
        assert_eq!(rows[10].delay_max_ms, 1024 * SECOND); // attempt 12
        assert_eq!(rows[11].delay_max_ms, 2048 * SECOND); // attempt 13
        assert_eq!(rows[12].delay_max_ms, HOUR); // attempt 14: 4096 s, capped
        assert!(rows.iter().all(|r| r.delay_min_ms * 2 == r.delay_max_ms));
        // 1 + 2 + … + 2048 s, then 7 hours: about 8 h without jitter, half with the
        // lowest draws.
        assert_eq!(rows[18].cumulative_max_ms, 4_095 * SECOND + 7 * HOUR);
        assert_eq!(rows[18].cumulative_max_ms, 29_295 * SECOND);
        assert_eq!(rows[18].cumulative_min_ms, 29_295 * SECOND / 2);
        assert!(rows[18].cumulative_min_ms >= DEFAULT_MIN_RETRY_SPAN_MS);
        assert!(rows.iter().all(|r| !r.may_exceed_max_age));
    }

    /// Issue 15: the old default (8 attempts, full jitter, cap 15 min) dead-lettered
    /// everything in a five-minute outage — at most 2 min 7 s of retries, and as little as
    /// nothing when the jitter drew low. The new one keeps retrying at least 4 h.
    #[test]
    fn default_policy_retries_for_at_least_four_hours() {
        let rows = RetryPolicy::default().explain();
        let last = rows.last().expect("the default retries");
        assert!(
            last.cumulative_min_ms >= 4 * HOUR,
            "the default gives up after {} ms at the least",
            last.cumulative_min_ms
        );
        assert!(last.cumulative_max_ms >= 8 * HOUR);
    }

    #[test]
    fn not_before_moves_an_earlier_retry_and_kills_past_the_window() {
        let p = RetryPolicy::default();
        let c = ctx(1);
        let retry = |due_ms: i64| Decision::Retry {
            delay_ms: 10,
            due_at: c.now.plus_ms(due_ms as u64),
            counted: true,
        };
        let later = c.now.plus_ms(60_000);
        assert_eq!(
            p.not_before(retry(10), &c, later),
            Decision::Retry {
                delay_ms: 60_000,
                due_at: later,
                counted: true
            }
        );
        assert_eq!(
            p.not_before(retry(90_000), &c, later),
            retry(90_000),
            "already later"
        );
        let past = c.window_start.plus_ms(p.max_age_ms + 1);
        assert_eq!(
            p.not_before(retry(10), &c, past),
            Decision::Dead {
                reason: DeadReason::MaxAge
            }
        );
        let dead = Decision::Dead {
            reason: DeadReason::MaxAttempts,
        };
        assert_eq!(p.not_before(dead, &c, later), dead);
    }

    #[test]
    fn explain_full_jitter_starts_at_zero() {
        let p = RetryPolicy {
            jitter: Jitter::Full,
            max_attempts: 8,
            max_delay_ms: 15 * MINUTE,
            ..RetryPolicy::default()
        };
        let rows = p.explain();
        assert_eq!(rows.len(), 7);
        let maxima: Vec<u64> = rows.iter().map(|r| r.delay_max_ms).collect();
        assert_eq!(maxima, [1, 2, 4, 8, 16, 32, 64].map(|s| s * SECOND));
        assert!(rows
            .iter()
            .all(|r| r.delay_min_ms == 0 && r.cumulative_min_ms == 0));
        assert_eq!(rows[6].cumulative_max_ms, 127 * SECOND);
    }

    #[test]
    fn explain_default_policy_without_jitter_is_exact() {
        let p = RetryPolicy {
            jitter: Jitter::None,
            ..RetryPolicy::default()
        };
        let delays: Vec<(u64, u64)> = p
            .explain()
            .iter()
            .map(|r| (r.delay_min_ms, r.delay_max_ms))
            .collect();
        let want: Vec<(u64, u64)> = (0..19)
            .map(|i| (SECOND << i).min(HOUR))
            .map(|d| (d, d))
            .collect();
        assert_eq!(delays, want);
    }

    #[test]
    fn permanent_is_dead_now() {
        let p = RetryPolicy::default();
        let f = Failure::new(ErrorClass::Permanent, "400");
        assert_eq!(
            p.decide(&ctx(1), &f, &mut SplitMix64::new(0)),
            Decision::Dead {
                reason: DeadReason::PermanentError
            }
        );
    }

    #[test]
    fn rate_limited_honours_and_bounds_retry_after() {
        let p = RetryPolicy::default();
        let mut f = Failure::new(ErrorClass::RateLimited, "429");
        f.retry_after_ms = Some(10_000);
        match p.decide(&ctx(1), &f, &mut SplitMix64::new(0)) {
            Decision::Retry {
                delay_ms, counted, ..
            } => {
                assert_eq!(delay_ms, 10_000);
                assert!(!counted);
            }
            d => panic!("{d:?}"),
        }
        f.retry_after_ms = Some(86_400_000);
        match p.decide(&ctx(1), &f, &mut SplitMix64::new(0)) {
            Decision::Retry { delay_ms, .. } => assert_eq!(delay_ms, p.max_retry_after_ms),
            d => panic!("{d:?}"),
        }
        // Not counted: past max_attempts, a rate-limited failure still retries.
        assert!(matches!(
            p.decide(&ctx(p.max_attempts), &f, &mut SplitMix64::new(0)),
            Decision::Retry { .. }
        ));
    }

    /// Issue 5's scenario: a fixed 1 s policy, a consumer nacking `rate_limited` with
    /// `retry_after: "0s"` over and over. Each retry waits the policy's 1 s (not 0), the
    /// first `max_rate_limited` are not charged, the next ones are, until `max_attempts`.
    #[test]
    fn rate_limited_retry_after_zero_waits_the_policy_delay_and_is_charged_after_max_rate_limited()
    {
        let p = RetryPolicy {
            max_attempts: 3,
            backoff: Backoff::Fixed,
            initial_delay_ms: SECOND,
            jitter: Jitter::Full,
            max_rate_limited: 4,
            ..RetryPolicy::default()
        };
        let mut f = Failure::new(ErrorClass::RateLimited, "429");
        f.retry_after_ms = Some(0);
        let mut rng = SplitMix64::new(9);
        let start = Timestamp::from_millis(1_000_000);
        let (mut now, mut attempts, mut uncharged) = (start, 0u32, 0u32);
        let mut charged = 0;
        loop {
            attempts += 1;
            let ctx = FailureContext {
                counted_attempts: (attempts - uncharged).max(1),
                window_start: start,
                now,
                prev_delay_ms: None,
                uncharged_rate_limited: uncharged,
            };
            match p.decide(&ctx, &f, &mut rng) {
                Decision::Retry {
                    delay_ms,
                    due_at,
                    counted,
                } => {
                    assert!(delay_ms >= SECOND, "attempt {attempts}: {delay_ms} ms");
                    assert!(due_at >= now.plus_ms(SECOND));
                    assert_eq!(counted, attempts > 4, "attempt {attempts}");
                    if counted {
                        charged += 1;
                    } else {
                        uncharged += 1;
                    }
                    now = due_at;
                }
                Decision::Dead { reason } => {
                    assert_eq!(reason, DeadReason::MaxAttempts);
                    break;
                }
            }
        }
        assert_eq!((uncharged, charged, attempts), (4, 2, 7));
    }

    #[test]
    fn config_layers_and_names_bad_keys() {
        let base = RetryPolicyConfig {
            max_attempts: Some(3),
            ..Default::default()
        };
        let q = RetryPolicyConfig {
            preset: Some("svix".into()),
            ..Default::default()
        };
        let p = q.over(&base).resolve().unwrap();
        assert_eq!(p.max_attempts, 3);
        assert_eq!(p.backoff, Backoff::Schedule);
        let bad = RetryPolicyConfig {
            multiplier: Some(0.5),
            ..Default::default()
        };
        assert!(bad
            .resolve()
            .unwrap_err()
            .to_string()
            .contains("retry.multiplier"));
        let bad = RetryPolicyConfig {
            preset: Some("kafka".into()),
            ..Default::default()
        };
        assert!(bad
            .resolve()
            .unwrap_err()
            .to_string()
            .contains("retry.preset"));
    }
}
