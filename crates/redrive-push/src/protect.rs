//! The protection of one downstream endpoint (SPEC §10, "Downstream protection"): a circuit
//! breaker, an AIMD pace, a hard rate limit, a concurrency limit and a retry budget.
//!
//! Pure logic: no I/O, no clock of its own. Every method takes `now_ms`, a monotonic
//! millisecond clock the caller owns (a reading earlier than one already seen is taken as
//! the latest one seen, so time never runs backwards in here). The server keeps one
//! [`Protection`] per endpoint behind a mutex and calls it around each HTTP call:
//! [`Protection::try_acquire`] before, [`Protection::record`] after (or
//! [`Protection::cancel`] when nothing was sent). A refusal is a [`Wait`]: ask again no
//! earlier than `until_ms`; a refused message is **parked, never charged an attempt**.
//! The design and its numbers are in `shared/design/downstream-protection.md`.
//!
//! # The rules
//!
//! **Outcomes.** The caller maps an attempt to an [`Outcome`] ([`Outcome::from_class`]):
//! delivered, a permanent 4xx and 410 are [`Outcome::Success`] (the endpoint is up and
//! answering); transient failures (5xx, timeouts, connection errors) and `rate_limited` are
//! [`Outcome::Failure`].
//!
//! **Breaker** (when [`ProtectionConfig::breaker`] is set; the defaults are
//! [`BreakerConfig`]'s). Outcomes are counted in a sliding window of `window_ms` (default
//! 5 s) made of 1 s buckets (the current second and the `ceil(window_ms / 1 s) - 1` before
//! it).
//! - *Closed → Open* when the window holds at least `min_calls` (default 20) outcomes and
//!   `failures / calls > failure_ratio` (default 0.5), **or when the last `min_calls`
//!   outcomes all failed** (an addition to the note: an endpoint that goes down right after
//!   a busy stretch would otherwise keep being called until the window's earlier successes
//!   roll off, a few seconds at full rate; `min_calls` failures in a row do not happen to a
//!   healthy endpoint that fails a few percent, and overload answers interleave successes).
//! - *Open*: nothing is admitted ([`WaitReason::Breaker`], until the end of the open
//!   period). The period is `open_ms` (default 5 s) when opened from Closed or
//!   Recovering; **after a failed probe it is a tenth of the outage so far**
//!   ([`PROBE_FRACTION`]; the outage began when the breaker opened from Closed), at least
//!   `open_ms` and at most `max(open_ms, 30 s)`: a recovery is seen within 5 s during the
//!   first 50 s, within a tenth of the outage after, and a downstream down for long is
//!   probed once per 30 s. (Until issue 15 each failed probe doubled it: 5, 10, 20, 30 s,
//!   so a 30 s outage was seen 5 s late, a 60 s one 5 s late and a 100 s one 25 s late.)
//! - *Open → HalfOpen* when the period ends (checked lazily by every method).
//! - *HalfOpen*: exactly one call (the probe) is admitted at a time; others wait
//!   ([`WaitReason::Breaker`], polled every 50 ms; the caller also wakes on `record`).
//!   The first outcome recorded while the probe is out decides: Success → *Recovering*,
//!   Failure → *Open* again. The server cannot tell a late call (made before the
//!   breaker opened) from the probe; either tells how the endpoint is now. Outcomes recorded
//!   while no probe is out, or while Open, do not move the breaker.
//! - *Recovering*: calls are admitted at the AIMD pace (starting where the endpoint was
//!   before the outage, see below). After
//!   `trickle_calls` (default 20) outcomes recorded in Recovering with `failures / calls <=
//!   failure_ratio` → *Closed* (window emptied); as soon as the ratio is above it with at
//!   least `min(min_calls, trickle_calls)` outcomes → *Open* (period `open_ms`).
//! - `opened_total` counts every entry into Open.
//! - *Failures in a row, in a cluster*: each of `N` nodes sees about `1/N` of an
//!   endpoint's calls, so a node opens after `ceil(min_calls / N)` failures in a row, at
//!   least [`MIN_IN_A_ROW`] ([`Protection::set_nodes`]): the cluster spends about the same
//!   failed calls as one node before its breakers open, not `N` times as many. (Measured on
//!   3 nodes: 71 outage calls with 20 in a row per node, the storm's 2 % target at 60.)
//! - *Shared in a cluster*: an opening from Closed by the outcomes recorded here is a *trip*
//!   ([`Protection::take_trip`]), which the server records for the other nodes; a node told
//!   of another's trip holds its own breaker open for the rest of that period
//!   ([`Protection::force_open`]) and then probes like after any open period.
//!
//! **AIMD pace** (only with a breaker; without one, "protection off": no breaker, no pace).
//! `None` means unpaced, the initial state, so a fresh endpoint is never throttled.
//! - **entering Recovering sets the pace to what the endpoint accepted before the outage**:
//!   the most successes of one second in the [`ACCEPTED_MEMORY_S`] (10) seconds before the
//!   breaker opened from Closed (remembered through failed probes and reopenings), or 5/s
//!   when it accepted nothing;
//! - **slow start**: from there until the first failure, each success adds
//!   [`SLOW_START_STEP`] (ln 2) to the pace while the pace is what holds calls back (a call
//!   waited for a pace token in this second or the one before), so the pace doubles about
//!   every second while the endpoint takes everything, like TCP's window per round trip;
//!   the first failure ends it at once: pace × [`PACE_DECREASE`];
//!
//! Then, after the slow start (and for an endpoint paced under overload), the outcomes
//! recorded in each whole second (by `now_ms / 1000`) are looked at when that second is over:
//! - a second with outcomes and no failure: pace += 10/s (when paced);
//! - a second in which more than 1 % of the outcomes failed: pace × [`PACE_DECREASE`] (0.8;
//!   the design note's 0.5 is tuned, see below), or [`NEAR_CAPACITY`] (0.95) × the successes
//!   of that second if that is more (the pace just passed the capacity: back to just under
//!   it, not a fifth below); when unpaced, it takes at least 5
//!   outcomes and more than the breaker's `failure_ratio` of failures in a second, and the
//!   pace starts at half the outcomes of that second per second; **and never above the successes of that second**
//!   (what the endpoint accepted; an addition to the note, see below); never below 1/s;
//! - the pace is never above `rate_limit_per_s`;
//! - back to unpaced: when Closed, after 10 consecutive seconds without failure in each of
//!   which the pace was more than twice the outcomes recorded (seconds without outcomes
//!   count: an idle endpoint returns to unpaced after 10 s).
//!
//! The pace is enforced by a token bucket of `pace` tokens per second holding at most
//! `max(1, pace / 10)` (a tenth of a second of burst); a call beyond it waits
//! ([`WaitReason::Rate`], until the next token).
//!
//! *Tuning* (the storm simulation in the tests: capacity 250/s, excess answered 503 at
//! once, 60 s outage, 200 messages/s for 300 s, failed messages retried after 1 s):
//! - *Capped by the accepted rate.* With the note's rules alone the breaker took ~3 s to
//!   open: its 5 s window still held the ~1,000 successes of the seconds before the outage,
//!   and the outage got 384 calls (3.2 % of its 12,000 messages, above the 2 % goal).
//!   Capping a decreased pace at the successes of the failing second paces an endpoint that
//!   accepts nothing at 1/s after the first second of an outage: 206 calls (1.7 %).
//!   Under overload it changes nothing (the successes are then the capacity).
//! - *`min_calls` failures in a row open the breaker.* The real storm benchmark
//!   (`scripts/bench_storm.sh`) still measured 2.6 % outage calls with the two rules above:
//!   the first second of an outage, connections refused at once, is ~200 calls before the
//!   pace reacts. Opening on 20 failures in a row stops it after ~20: the simulation's
//!   outage calls fell from 206 to 23 (0.19 %), its drain from 218 s to 215 s.
//! - *× 0.8 instead of × 0.5.* The pace saw-tooths between β × capacity and the capacity
//!   (~75 % of it on average for 0.5, ~90 % for 0.8). The outage's backlog drained 254 s
//!   after the outage with 0.5, 218 s with 0.8 (212 s with 0.9; no design that keeps
//!   serving new messages can do better than 192 s). Peaks are the same (1.1 × capacity).
//! - The +10/s step, the 1 % threshold and the 5/s start are the note's.
//! - *Issue 15: a short outage drains as fast as a long one.* Restarting at 5/s and adding
//!   10/s per second takes 25 s to reach 250/s whatever the outage, so a short outage's
//!   drain was mostly ramp: 100 msg/s into the 250/s endpoint, a 30 s outage drained in
//!   1.75× the bound in the benchmark, and the simulation's 15 s outage in 3.1×. The
//!   remembered rate, the per-success slow start, [`NEAR_CAPACITY`] and the probe period
//!   of a tenth of the outage bring the simulated 15 s, 30 s and 60 s outages (at 100/s and
//!   200/s) to at most 1.10× (test `short_outages_drain_within_1_3_times_the_bound`), the
//!   note's storm to 1.01× its bound, with peaks at most 1.16× the capacity. A slow start
//!   per second instead of per success (× 1.3 or × 1.5 at each second's end) still drained
//!   the 15 s outage in 1.34×, or peaked at 1.63× the capacity: a second at the pace is
//!   too long a round trip.
//!
//! *Flaky endpoints*: an unpaced endpoint starts being paced only when a second fails as
//! much as would open the breaker (`failure_ratio`), not at 1 %: an endpoint that keeps
//! failing a few percent of calls for reasons unrelated to load (a flaky backend behind a
//! load balancer) is then not throttled while its breaker stays closed. Once paced (after
//! an outage, or under overload), 1 % is the threshold, as in the note. A paced endpoint
//! that keeps failing a few percent stays paced near what it accepts.
//!
//! **Rate limit** (`rate_limit_per_s`): a token bucket of `rate` tokens per second holding
//! at most `max(1, rate / 10)` tokens (burst), full at start. So the call starts in any 1 s
//! window never exceed `rate + max(1, rate / 10)` (property-tested). Refusal:
//! [`WaitReason::Rate`], until the next token.
//!
//! **Concurrency**: at most `concurrency` calls in flight (at least 1); else
//! [`WaitReason::Concurrency`] until `now + 5 ms` (a fallback poll: the caller also wakes
//! when a call ends).
//!
//! **Limits changed in place** ([`Protection::set_limits`]): a node of a cluster holds a
//! share of the endpoint's cluster-wide limits ([`crate::share`]), which changes when nodes
//! come and go. The new concurrency and rate apply from then on; the calls in flight, the
//! breaker, the pace (lowered to a lower rate limit) and the budget are kept, and the rate
//! bucket keeps its tokens (at most the new burst). A concurrency of **0** (a node whose
//! share is nothing, `concurrency < nodes`) admits no call: [`WaitReason::Concurrency`]
//! until `now +` [`NO_SHARE_POLL_MS`], longer than a caller should hold a leased message,
//! so it waits before leasing instead.
//!
//! **Retry budget** (`retry_budget` > 0): first attempts and retries admitted are counted in
//! a sliding 10 s window of 1 s buckets. **While the endpoint is failing** (its breaker is
//! not closed, or its window holds a failure) a retry is admitted while `retries <
//! floor(retry_budget × first_attempts) + 10` in the window: the floor of
//! [`BUDGET_FLOOR`] (10) retries per window lets a quiet endpoint still retry. A refused
//! retry gets [`WaitReason::Budget`] until the next 1 s boundary (when a bucket rolls off)
//! and nothing is consumed. A first attempt is never refused by the budget. While the
//! endpoint fails nothing (breaker closed, no failure in the window) retries are counted but
//! not refused: a retry then adds no load to a failing downstream, which is what the budget
//! is for, and a backlog of retries left after the first attempts stopped (leases that
//! expired on a stalled node, say) would otherwise drain at 10 per 10 s, leased and parked
//! again every second meanwhile. The first failure brings the budget back; the concurrency
//! limit, the pace and the breaker hold a burst of retries as they hold any call.
//!
//! Order of the checks: breaker, concurrency, budget (retries only), rate and pace. Only
//! when all pass is anything consumed.

use redrive_core::ErrorClass;
use std::collections::VecDeque;

/// Multiplicative decrease of the AIMD pace (the design note has 0.5; see the module docs).
pub const PACE_DECREASE: f64 = 0.8;
/// A failing second in which the endpoint still accepted most calls (the pace just passed its
/// capacity) sets the pace to this share of what it accepted, if that is above
/// `pace × PACE_DECREASE`.
pub const NEAR_CAPACITY: f64 = 0.95;
/// Additive increase of the AIMD pace per second without failures, calls/s.
pub const PACE_INCREASE: f64 = 10.0;
/// The pace on entering Recovering when nothing is remembered of the endpoint (it never
/// accepted a call in the [`ACCEPTED_MEMORY_S`] seconds before the outage), calls/s.
pub const PACE_START: f64 = 5.0;
/// Slow start: from entering Recovering until the first failure, each success adds this to
/// the pace (calls/s) while the pace is what holds the calls back (a call waited for a pace
/// token in this second or the one before): the pace doubles about every second, as TCP's
/// window does per round trip, and stops growing at the first failure instead of at the end
/// of a second. Then [`PACE_INCREASE`] per good second (AIMD).
pub const SLOW_START_STEP: f64 = std::f64::consts::LN_2;
/// The pace after an outage starts from the most calls the endpoint accepted in one second
/// over this many seconds before its breaker opened.
pub const ACCEPTED_MEMORY_S: u64 = 10;
/// After a failed probe the breaker stays open this share of the outage so far (at least
/// `open_ms`, at most `max(open_ms, MAX_OPEN_MS)`): the recovery is seen at most ~10 % of the
/// outage late, so a short outage drains about as fast, relative to its length, as a long one.
pub const PROBE_FRACTION: f64 = 0.1;
/// Retries every budget window admits whatever the first attempts.
pub const BUDGET_FLOOR: u64 = 10;
/// The retry budget's sliding window, ms.
pub const BUDGET_WINDOW_MS: u64 = 10_000;
/// The longest open period after failed probes (unless `open_ms` is longer).
pub const MAX_OPEN_MS: u64 = 30_000;

/// Outcomes a second needs before its failures start pacing an unpaced endpoint.
const PACE_START_MIN_CALLS: u32 = 5;
/// A second's outcomes fail "too much" for the pace above this fraction.
const PACE_FAILURE_THRESHOLD: f64 = 0.01;
/// Seconds of slack (pace above twice the calls, no failure) before going unpaced again.
const UNPACE_AFTER_S: u32 = 10;
/// Fallback poll while the half-open probe is out, ms.
const PROBE_POLL_MS: u64 = 50;
/// Fallback poll while the concurrency limit is reached, ms.
const CONCURRENCY_POLL_MS: u64 = 5;
/// The wait while the concurrency limit is 0 ([`Protection::set_limits`]: a node with no
/// share of the endpoint), ms; the caller also wakes when the limits change.
pub const NO_SHARE_POLL_MS: u64 = 2_000;

/// The breaker's thresholds (the design note's values by default).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerConfig {
    /// The sliding window of outcomes, ms (1 s buckets).
    pub window_ms: u64,
    /// Outcomes the window needs before it may open the breaker.
    pub min_calls: u32,
    /// Opens when failures / calls is above this.
    pub failure_ratio: f64,
    /// How long it stays open before the probe, ms (after a failed probe: a tenth of the
    /// outage so far, at least this; see the module docs).
    pub open_ms: u64,
    /// Outcomes recorded in Recovering before it closes.
    pub trickle_calls: u32,
}

impl Default for BreakerConfig {
    /// 5 s window, 20 calls, 50 %, open 5 s, 20 trickle calls.
    fn default() -> Self {
        Self {
            window_ms: 5_000,
            min_calls: 20,
            failure_ratio: 0.5,
            open_ms: 5_000,
            trickle_calls: 20,
        }
    }
}

/// A node of a cluster opens its breaker after at least this many failures in a row,
/// however many nodes share the endpoint ([`Protection::set_nodes`]): below it, an
/// endpoint failing a third of its calls would open a node's breaker every few minutes.
pub const MIN_IN_A_ROW: u32 = 10;

/// How one endpoint is protected.
#[derive(Debug, Clone, PartialEq)]
pub struct ProtectionConfig {
    /// Most calls in flight (values below 1 are taken as 1).
    pub concurrency: u32,
    /// Hard cap on call starts per second, never exceeded (a value that is not a positive
    /// finite number is taken as no limit; [`ProtectionConfig::validate`] refuses it).
    pub rate_limit_per_s: Option<f64>,
    /// The breaker; `None`: no breaker and no AIMD pacing ("protection off").
    pub breaker: Option<BreakerConfig>,
    /// Retries ≤ this × first attempts in the window, plus [`BUDGET_FLOOR`]; 0 = off.
    pub retry_budget: f64,
}

impl Default for ProtectionConfig {
    /// SPEC §10 defaults: 16 in flight, no rate limit, breaker on, retry budget 0.1.
    fn default() -> Self {
        Self {
            concurrency: 16,
            rate_limit_per_s: None,
            breaker: Some(BreakerConfig::default()),
            retry_budget: 0.1,
        }
    }
}

impl ProtectionConfig {
    /// Check ranges; the error names the field. [`Protection::new`] accepts anything
    /// (clamping as documented on the fields); call this where a configuration is read.
    pub fn validate(&self) -> Result<(), String> {
        if self.concurrency == 0 {
            return Err("concurrency: must be at least 1".into());
        }
        if let Some(r) = self.rate_limit_per_s {
            if !(r.is_finite() && r > 0.0) {
                return Err(format!("rate_limit: must be a positive rate, not {r}"));
            }
        }
        if !(self.retry_budget.is_finite() && self.retry_budget >= 0.0) {
            return Err(format!(
                "retry_budget: must be a ratio ≥ 0, not {}",
                self.retry_budget
            ));
        }
        if let Some(b) = &self.breaker {
            if !(b.failure_ratio.is_finite() && (0.0..1.0).contains(&b.failure_ratio)) {
                return Err(format!(
                    "breaker.failure_ratio: must be in [0, 1), not {}",
                    b.failure_ratio
                ));
            }
            if b.window_ms == 0 || b.open_ms == 0 {
                return Err("breaker: window and open time must be greater than 0".into());
            }
            if b.min_calls == 0 || b.trickle_calls == 0 {
                return Err("breaker: min_calls and trickle_calls must be at least 1".into());
            }
        }
        Ok(())
    }
}

/// Where the breaker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Calls flow (at the pace, if paced).
    Closed,
    /// Nothing is admitted until the open period ends.
    Open,
    /// One probe call at a time.
    HalfOpen,
    /// After a good probe: calls at the AIMD pace until `trickle_calls` outcomes are good.
    Recovering,
}

impl BreakerState {
    /// `"closed"`, `"open"`, `"half_open"` or `"recovering"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
            Self::Recovering => "recovering",
        }
    }
}

/// What a finished call says about the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The endpoint answered and is up: 2xx, a permanent 4xx, 410.
    Success,
    /// The endpoint is failing or shedding load: transient (5xx, timeout, connection
    /// error) or `rate_limited`.
    Failure,
}

impl Outcome {
    /// The outcome of an attempt that was delivered (`None`) or failed with `class`.
    pub fn from_class(class: Option<ErrorClass>) -> Self {
        match class {
            None | Some(ErrorClass::Permanent) => Self::Success,
            Some(ErrorClass::Transient | ErrorClass::RateLimited) => Self::Failure,
        }
    }
}

/// Why a call may not start now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WaitReason {
    /// The breaker is open, or the half-open probe is out.
    Breaker,
    /// `concurrency` calls are in flight.
    Concurrency,
    /// The rate limit or the AIMD pace has no token.
    Rate,
    /// The retry budget refuses this retry.
    Budget,
}

impl WaitReason {
    /// `"breaker"`, `"concurrency"`, `"rate"` or `"budget"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Breaker => "breaker",
            Self::Concurrency => "concurrency",
            Self::Rate => "rate",
            Self::Budget => "budget",
        }
    }
}

/// A refusal: ask again no earlier than `until_ms` (same clock as `now_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// When to ask again.
    pub until_ms: u64,
    /// Why.
    pub reason: WaitReason,
}

/// What an endpoint's protection looks like now (for `GET /v1/endpoints` and metrics).
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// The breaker's state (`Closed` when there is no breaker).
    pub state: BreakerState,
    /// Since when (the caller's clock), ms.
    pub state_since_ms: u64,
    /// Calls in flight.
    pub in_flight: u32,
    /// The concurrency limit.
    pub concurrency: u32,
    /// The configured rate limit.
    pub rate_limit_per_s: Option<f64>,
    /// The AIMD pace; `None` = unpaced.
    pub pace_per_s: Option<f64>,
    /// Outcomes in the breaker's window (Recovering: outcomes since it began recovering).
    pub window_calls: u32,
    /// Failures among them.
    pub window_failures: u32,
    /// Outcomes recorded in the last whole second.
    pub calls_per_s: f64,
    /// The retry budget's ratio (0 = off).
    pub budget_ratio: f64,
    /// First attempts admitted in the budget's window.
    pub budget_first_attempts: u64,
    /// Retries admitted in the budget's window.
    pub budget_retries: u64,
    /// Retries the budget would admit now (`u64::MAX` when the budget is off).
    pub budget_available: u64,
    /// Times the breaker opened.
    pub opened_total: u64,
}

/// A token bucket: `rate` tokens per second, at most `burst = max(1, rate / 10)`.
#[derive(Debug, Clone)]
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at_ms: u64,
}

/// Slack for float rounding when asking for a whole token.
const TOKEN_EPS: f64 = 1e-9;

impl Bucket {
    fn new(rate: f64, now_ms: u64) -> Self {
        let burst = (rate / 10.0).max(1.0);
        Self {
            rate,
            burst,
            tokens: burst,
            at_ms: now_ms,
        }
    }

    fn refill(&mut self, now_ms: u64) {
        if now_ms > self.at_ms {
            let add = self.rate * (now_ms - self.at_ms) as f64 / 1000.0;
            self.tokens = (self.tokens + add).min(self.burst);
            self.at_ms = now_ms;
        }
    }

    /// Ok if a token is there, else when the next one is.
    fn ready(&self) -> Result<(), u64> {
        if self.tokens >= 1.0 - TOKEN_EPS {
            return Ok(());
        }
        // Less a hair, so that rounding does not push the wait a millisecond later.
        let ms = ((1.0 - self.tokens) * 1000.0 / self.rate - 1e-6)
            .ceil()
            .max(1.0);
        Err(self.at_ms.saturating_add(ms as u64))
    }

    fn take(&mut self) {
        self.tokens -= 1.0;
    }

    fn give_back(&mut self) {
        self.tokens = (self.tokens + 1.0).min(self.burst);
    }

    fn set_rate(&mut self, rate: f64) {
        self.rate = rate;
        self.burst = (rate / 10.0).max(1.0);
        self.tokens = self.tokens.min(self.burst);
    }
}

/// Counts of one second.
#[derive(Debug, Clone, Copy, Default)]
struct SecondCounts {
    sec: u64,
    calls: u32,
    failures: u32,
}

/// Budget counts of one second.
#[derive(Debug, Clone, Copy, Default)]
struct BudgetCounts {
    sec: u64,
    first: u64,
    retries: u64,
}

/// The protection of one endpoint. See the module docs for the rules.
#[derive(Debug, Clone)]
pub struct Protection {
    config: ProtectionConfig,
    /// Latest clock reading seen.
    now_ms: u64,
    state: BreakerState,
    state_since_ms: u64,
    in_flight: u32,
    opened_total: u64,
    /// Open: when the period ends.
    open_until_ms: u64,
    /// HalfOpen: the probe is out.
    probe_out: bool,
    /// Closed: the breaker's sliding window.
    window: VecDeque<SecondCounts>,
    /// Recovering: outcomes and failures since it began.
    recovering_calls: u32,
    recovering_failures: u32,
    /// Failures recorded in a row (reset by a success).
    consecutive_failures: u32,
    /// Live nodes of the cluster sharing the endpoint (1 alone): sets the failures in a row
    /// that open the breaker.
    nodes: u32,
    /// The second being counted for the AIMD pace.
    second: SecondCounts,
    /// Outcomes of the last whole second (0 if it had none).
    last_second_calls: u32,
    /// Consecutive slack seconds (for going unpaced again).
    slack_seconds: u32,
    pace: Option<f64>,
    pace_bucket: Option<Bucket>,
    rate_bucket: Option<Bucket>,
    budget: VecDeque<BudgetCounts>,
    /// The kind of the latest acquisition (for `cancel`).
    last_acquired_retry: bool,
    /// Successes of each of the last [`ACCEPTED_MEMORY_S`] whole seconds that had any.
    accepted: VecDeque<(u64, u32)>,
    /// What the endpoint accepted before the outage, calls/s (0: nothing known); set when
    /// the breaker opens from Closed, kept through the outage, the ramp's start.
    remembered_per_s: f64,
    /// The pace grows by [`SLOW_START_STEP`] per success (from entering Recovering until the
    /// first failure), else by [`PACE_INCREASE`] per good second.
    slow_start: bool,
    /// The last second (`now / 1000`) in which the pace refused a call: the pace, not the
    /// demand, was what held calls back.
    pace_limited_sec: Option<u64>,
    /// When the breaker first opened in this outage (opened from Closed).
    down_since_ms: u64,
    /// The open period of the latest opening from Closed by this protection's own outcomes,
    /// until taken ([`Protection::take_trip`]).
    trip: Option<u64>,
}

impl Protection {
    /// A protection with `config`, Closed and unpaced, at `now_ms`.
    pub fn new(config: ProtectionConfig, now_ms: u64) -> Self {
        let mut config = config;
        config.concurrency = config.concurrency.max(1);
        config.rate_limit_per_s = config
            .rate_limit_per_s
            .filter(|r| r.is_finite() && *r > 0.0);
        if !(config.retry_budget.is_finite() && config.retry_budget > 0.0) {
            config.retry_budget = 0.0;
        }
        if let Some(b) = &mut config.breaker {
            b.window_ms = b.window_ms.max(1);
            b.open_ms = b.open_ms.max(1);
            b.min_calls = b.min_calls.max(1);
            b.trickle_calls = b.trickle_calls.max(1);
        }
        let rate_bucket = config.rate_limit_per_s.map(|r| Bucket::new(r, now_ms));
        Self {
            config,
            now_ms,
            state: BreakerState::Closed,
            state_since_ms: now_ms,
            in_flight: 0,
            opened_total: 0,
            open_until_ms: 0,
            probe_out: false,
            window: VecDeque::new(),
            recovering_calls: 0,
            recovering_failures: 0,
            consecutive_failures: 0,
            nodes: 1,
            second: SecondCounts {
                sec: now_ms / 1000,
                ..SecondCounts::default()
            },
            last_second_calls: 0,
            slack_seconds: 0,
            pace: None,
            pace_bucket: None,
            rate_bucket,
            budget: VecDeque::new(),
            last_acquired_retry: false,
            accepted: VecDeque::new(),
            remembered_per_s: 0.0,
            slow_start: false,
            pace_limited_sec: None,
            down_since_ms: now_ms,
            trip: None,
        }
    }

    /// The configuration in force (after the clamping [`Protection::new`] does, and the
    /// limits of the latest [`Protection::set_limits`]).
    pub fn config(&self) -> &ProtectionConfig {
        &self.config
    }

    /// Change the concurrency and rate limits in force, at `now_ms`; everything else is
    /// kept: the calls in flight (above a lowered concurrency they finish, and no call
    /// starts until fewer are out), the breaker's state and window, the budget, and the
    /// pace (at most a lowered rate limit). The rate bucket keeps its tokens, at most the new
    /// burst; a rate limit set where there was none starts with a full burst. `concurrency`
    /// 0 admits no call ([`NO_SHARE_POLL_MS`]); a rate that is not a positive finite number
    /// is no limit.
    pub fn set_limits(&mut self, now_ms: u64, concurrency: u32, rate_limit_per_s: Option<f64>) {
        let now = self.tick(now_ms);
        let rate = rate_limit_per_s.filter(|r| r.is_finite() && *r > 0.0);
        self.config.concurrency = concurrency;
        self.config.rate_limit_per_s = rate;
        match (rate, &mut self.rate_bucket) {
            (None, _) => self.rate_bucket = None,
            (Some(r), Some(b)) => b.set_rate(r),
            (Some(r), None) => self.rate_bucket = Some(Bucket::new(r, now)),
        }
        if let (Some(p), Some(r)) = (self.pace, rate) {
            if p > r {
                self.set_pace(Some(r), now);
            }
        }
    }

    /// The endpoint is shared by `nodes` live nodes (at least 1): the breaker opens after
    /// `ceil(min_calls / nodes)` failures in a row, at least [`MIN_IN_A_ROW`] (and never
    /// more than `min_calls`). Nothing else changes.
    pub fn set_nodes(&mut self, nodes: u32) {
        self.nodes = nodes.max(1);
    }

    /// Failures in a row that open the breaker from Closed.
    fn in_a_row(&self, min_calls: u32) -> u32 {
        min_calls
            .div_ceil(self.nodes)
            .max(MIN_IN_A_ROW)
            .min(min_calls)
            .max(1)
    }

    /// The breaker's state (`Closed` when there is no breaker), as of the last call that
    /// passed a clock reading (an elapsed open period shows once a method with `now_ms` ran).
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// The AIMD pace, calls/s; `None` = unpaced.
    pub fn pace_per_s(&self) -> Option<f64> {
        self.pace
    }

    /// Calls in flight.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// May a call start now? On `Ok` the call is counted: in flight + 1, a rate and a pace
    /// token consumed, the half-open probe slot taken, the budget charged. `is_retry`: the
    /// message was attempted before; a retry the budget refuses gets
    /// `Err(Wait { reason: Budget, .. })` and nothing is consumed. A first attempt is never
    /// refused by the budget.
    pub fn try_acquire(&mut self, now_ms: u64, is_retry: bool) -> Result<(), Wait> {
        let now = self.tick(now_ms);
        self.checked(now, is_retry)?;
        self.in_flight += 1;
        if let Some(b) = &mut self.rate_bucket {
            b.take();
        }
        if let Some(b) = &mut self.pace_bucket {
            b.take();
        }
        if self.state == BreakerState::HalfOpen {
            self.probe_out = true;
        }
        // Counted even when the budget is off, for the snapshot.
        let bucket = self.budget_bucket(now / 1000);
        if is_retry {
            bucket.retries += 1;
        } else {
            bucket.first += 1;
        }
        self.last_acquired_retry = is_retry;
        Ok(())
    }

    /// Would a first attempt be admitted now (the checks of [`Protection::try_acquire`],
    /// nothing consumed)? Lets the caller wait before leasing.
    pub fn admissible(&mut self, now_ms: u64) -> Result<(), Wait> {
        self.check(now_ms, false)
    }

    /// [`Protection::admissible`] for a first attempt (`is_retry = false`) or a retry.
    pub fn check(&mut self, now_ms: u64, is_retry: bool) -> Result<(), Wait> {
        let now = self.tick(now_ms);
        self.checked(now, is_retry)
    }

    /// [`Protection::check_at`], remembering when the pace (not the rate limit) refused.
    fn checked(&mut self, now: u64, is_retry: bool) -> Result<(), Wait> {
        let r = self.check_at(now, is_retry);
        if let Err(w) = r {
            let pace_empty = self
                .pace_bucket
                .as_ref()
                .is_some_and(|b| b.ready().is_err());
            if w.reason == WaitReason::Rate && pace_empty {
                self.pace_limited_sec = Some(now / 1000);
            }
        }
        r
    }

    /// An acquired call that was not made after all: in flight − 1, the rate and pace
    /// tokens and the probe slot given back, the budget's count of the latest acquisition
    /// undone (its kind, first attempt or retry, is the latest acquisition's: the server
    /// cancels under the same lock it acquired with; see [`Protection::cancel_as`]). No
    /// outcome is recorded.
    pub fn cancel(&mut self, now_ms: u64) {
        let is_retry = self.last_acquired_retry;
        self.cancel_as(now_ms, is_retry);
    }

    /// [`Protection::cancel`] of an acquisition of the given kind.
    pub fn cancel_as(&mut self, now_ms: u64, is_retry: bool) {
        let _ = self.tick(now_ms);
        if self.in_flight == 0 {
            return;
        }
        self.in_flight -= 1;
        if let Some(b) = &mut self.rate_bucket {
            b.give_back();
        }
        if let Some(b) = &mut self.pace_bucket {
            b.give_back();
        }
        if self.state == BreakerState::HalfOpen {
            self.probe_out = false;
        }
        if let Some(b) =
            self.budget
                .iter_mut()
                .rev()
                .find(|b| if is_retry { b.retries > 0 } else { b.first > 0 })
        {
            if is_retry {
                b.retries -= 1;
            } else {
                b.first -= 1;
            }
        }
    }

    /// An acquired call finished: in flight − 1; the outcome feeds the breaker, the AIMD
    /// pace and the rate shown in the snapshot.
    pub fn record(&mut self, now_ms: u64, outcome: Outcome) {
        let now = self.tick(now_ms);
        self.in_flight = self.in_flight.saturating_sub(1);
        let failed = outcome == Outcome::Failure;
        self.second.calls += 1;
        self.second.failures += u32::from(failed);
        self.consecutive_failures = if failed {
            self.consecutive_failures.saturating_add(1)
        } else {
            0
        };
        if self.slow_start {
            if let Some(p) = self.pace {
                if failed {
                    // The capacity is found: back off now, AIMD from here.
                    self.slow_start = false;
                    self.set_pace(Some(p * PACE_DECREASE), now);
                } else if self.pace_limited_sec.is_some_and(|s| s + 1 >= now / 1000) {
                    self.set_pace(Some(p + SLOW_START_STEP), now);
                }
            }
        }
        let Some(cfg) = self.config.breaker else {
            self.count_in_window(now, failed);
            return;
        };
        match self.state {
            BreakerState::Closed => {
                self.count_in_window(now, failed);
                let (calls, failures) = self.window_counts();
                let ratio_over = calls >= cfg.min_calls
                    && f64::from(failures) / f64::from(calls) > cfg.failure_ratio;
                if ratio_over || self.consecutive_failures >= self.in_a_row(cfg.min_calls) {
                    self.open_from_closed(now, cfg.open_ms);
                    self.trip = Some(cfg.open_ms);
                }
            }
            BreakerState::Open => {}
            BreakerState::HalfOpen => {
                if self.probe_out {
                    self.probe_out = false;
                    if failed {
                        let cap = cfg.open_ms.max(MAX_OPEN_MS);
                        let down_for = now.saturating_sub(self.down_since_ms);
                        let period =
                            ((down_for as f64 * PROBE_FRACTION) as u64).clamp(cfg.open_ms, cap);
                        self.open(now, period);
                    } else {
                        self.enter(BreakerState::Recovering, now);
                        self.recovering_calls = 0;
                        self.recovering_failures = 0;
                        // The ramp starts where the endpoint was before the outage, and
                        // grows fast until a second fails (slow start).
                        self.set_pace(Some(self.remembered_per_s.max(PACE_START)), now);
                        self.slow_start = true;
                    }
                }
            }
            BreakerState::Recovering => {
                self.recovering_calls += 1;
                self.recovering_failures += u32::from(failed);
                let (calls, failures) = (self.recovering_calls, self.recovering_failures);
                let ratio = f64::from(failures) / f64::from(calls);
                if ratio > cfg.failure_ratio && calls >= cfg.min_calls.min(cfg.trickle_calls) {
                    self.open(now, cfg.open_ms);
                } else if calls >= cfg.trickle_calls {
                    self.enter(BreakerState::Closed, now);
                    self.window.clear();
                    self.slack_seconds = 0;
                }
            }
        }
    }

    /// The open period (ms) of the latest time the breaker opened from Closed by the
    /// outcomes recorded here (not by [`Protection::force_open`]), once: the server records
    /// it as a trip for the other nodes of its cluster.
    pub fn take_trip(&mut self) -> Option<u64> {
        self.trip.take()
    }

    /// Another node's breaker for this endpoint opened (SPEC §13: the breaker is shared):
    /// hold this one open until `now_ms + for_ms`, then probe as after any open period.
    /// Closed: opens as if by its own outcomes (a new outage: the rate accepted before it
    /// is remembered for the ramp, `opened_total` + 1) but is no trip of its own
    /// ([`Protection::take_trip`] stays empty). Open: its period ends at the later of the
    /// two ends. HalfOpen or Recovering: open again for `for_ms` (the outage goes on; a
    /// probe out is answered into an open breaker and moves nothing). Without a breaker,
    /// nothing. Answers whether the state changed.
    pub fn force_open(&mut self, now_ms: u64, for_ms: u64) -> bool {
        let now = self.tick(now_ms);
        if self.config.breaker.is_none() || for_ms == 0 {
            return false;
        }
        match self.state {
            BreakerState::Closed => {
                self.open_from_closed(now, for_ms);
                true
            }
            BreakerState::Open => {
                self.open_until_ms = self.open_until_ms.max(now.saturating_add(for_ms));
                false
            }
            BreakerState::HalfOpen | BreakerState::Recovering => {
                self.open(now, for_ms);
                true
            }
        }
    }

    /// The state of the protection at `now_ms`, for the API and metrics.
    pub fn snapshot(&self, now_ms: u64) -> Snapshot {
        let now = now_ms.max(self.now_ms);
        let (window_calls, window_failures) = if self.state == BreakerState::Recovering {
            (self.recovering_calls, self.recovering_failures)
        } else {
            self.window_counts_at(now)
        };
        let (first, retries) = self.budget_counts_at(now);
        let calls_per_s = if now / 1000 == self.second.sec {
            self.last_second_calls
        } else if now / 1000 == self.second.sec + 1 {
            self.second.calls
        } else {
            0
        };
        let mut state = self.state;
        if state == BreakerState::Open && now >= self.open_until_ms {
            state = BreakerState::HalfOpen;
        }
        Snapshot {
            state,
            state_since_ms: if state == self.state {
                self.state_since_ms
            } else {
                self.open_until_ms
            },
            in_flight: self.in_flight,
            concurrency: self.config.concurrency,
            rate_limit_per_s: self.config.rate_limit_per_s,
            pace_per_s: self.pace,
            window_calls,
            window_failures,
            calls_per_s: f64::from(calls_per_s),
            budget_ratio: self.config.retry_budget,
            budget_first_attempts: first,
            budget_retries: retries,
            budget_available: self.budget_available(first, retries),
            opened_total: self.opened_total,
        }
    }

    // --- internals ---

    /// Bring everything time-driven up to `now_ms` (never backwards); return the clock.
    fn tick(&mut self, now_ms: u64) -> u64 {
        let now = now_ms.max(self.now_ms);
        self.now_ms = now;
        // Whole seconds that ended: the AIMD pace looks at them.
        let sec = now / 1000;
        if sec > self.second.sec {
            let ended = self.second;
            let empty_after = sec - ended.sec - 1;
            self.end_second(ended, empty_after, now);
            self.last_second_calls = if empty_after == 0 { ended.calls } else { 0 };
            self.second = SecondCounts {
                sec,
                ..SecondCounts::default()
            };
        }
        // Open → HalfOpen.
        if self.state == BreakerState::Open && now >= self.open_until_ms {
            let since = self.open_until_ms;
            self.enter(BreakerState::HalfOpen, since);
            self.probe_out = false;
        }
        if let Some(b) = &mut self.rate_bucket {
            b.refill(now);
        }
        if let Some(b) = &mut self.pace_bucket {
            b.refill(now);
        }
        // Roll the windows.
        let keep = self.window_seconds();
        while self.window.front().is_some_and(|b| b.sec + keep <= sec) {
            self.window.pop_front();
        }
        let keep = BUDGET_WINDOW_MS / 1000;
        while self.budget.front().is_some_and(|b| b.sec + keep <= sec) {
            self.budget.pop_front();
        }
        now
    }

    /// The AIMD rules for the second `ended`, followed by `empty_after` seconds without outcomes.
    fn end_second(&mut self, ended: SecondCounts, empty_after: u64, now: u64) {
        if self.config.breaker.is_none() {
            return;
        }
        let calls = f64::from(ended.calls);
        let failures = f64::from(ended.failures);
        if ended.calls > ended.failures {
            self.accepted
                .push_back((ended.sec, ended.calls - ended.failures));
        }
        while self
            .accepted
            .front()
            .is_some_and(|(sec, _)| sec + ACCEPTED_MEMORY_S <= ended.sec)
        {
            self.accepted.pop_front();
        }
        // Paced, the endpoint is recovering or overloaded: 1 % failures slow it down.
        // Unpaced, it takes as many failures as would open the breaker to start pacing, so
        // a closed endpoint that fails a few percent of calls for other reasons (a flaky
        // backend) is not throttled; an outage (all calls failing) still is at once.
        let threshold = match (&self.pace, &self.config.breaker) {
            (None, Some(b)) => b.failure_ratio,
            _ => PACE_FAILURE_THRESHOLD,
        };
        // A second of a handful of calls says little: one failed call out of one does not
        // start pacing a quiet endpoint.
        let enough = self.pace.is_some() || ended.calls >= PACE_START_MIN_CALLS;
        if enough && ended.calls > 0 && failures > threshold * calls {
            let accepted = calls - failures;
            let pace = match self.pace {
                // Just over what the endpoint takes (it accepted most calls): back to just
                // under that, not a fifth below the pace.
                Some(p) => (p * PACE_DECREASE).max(accepted * NEAR_CAPACITY),
                None => calls / 2.0,
            };
            // Never more than the endpoint accepted in that second, and never up.
            let pace = pace.min(accepted).min(self.pace.unwrap_or(f64::INFINITY));
            self.set_pace(Some(pace), now);
            self.slow_start = false;
            self.slack_seconds = 0;
            return;
        }
        if ended.calls > 0 && ended.failures == 0 {
            if let Some(p) = self.pace {
                // In slow start the pace grew with each success already.
                if !self.slow_start {
                    self.set_pace(Some(p + PACE_INCREASE), now);
                }
            }
        }
        // Slack: the seconds ending now, when Closed and paced.
        let Some(p) = self.pace else {
            self.slack_seconds = 0;
            return;
        };
        if self.state != BreakerState::Closed {
            self.slack_seconds = 0;
            return;
        }
        if ended.failures == 0 && p > 2.0 * calls {
            self.slack_seconds += 1;
        } else {
            self.slack_seconds = 0;
        }
        let empty = u32::try_from(empty_after).unwrap_or(u32::MAX);
        self.slack_seconds = self.slack_seconds.saturating_add(empty);
        if self.slack_seconds >= UNPACE_AFTER_S {
            self.set_pace(None, now);
            self.slow_start = false;
            self.slack_seconds = 0;
        }
    }

    /// Set the pace (bounded to `[1, rate_limit]`), keeping the bucket's tokens.
    fn set_pace(&mut self, pace: Option<f64>, now: u64) {
        let bounded = pace.map(|p| {
            let p = p.max(1.0);
            match self.config.rate_limit_per_s {
                Some(r) => p.min(r),
                None => p,
            }
        });
        self.pace = bounded;
        match (bounded, &mut self.pace_bucket) {
            (None, _) => self.pace_bucket = None,
            (Some(p), Some(b)) => b.set_rate(p),
            (Some(p), None) => {
                // A fresh pace starts with one token, not a full burst.
                let mut b = Bucket::new(p, now);
                b.tokens = b.tokens.min(1.0);
                self.pace_bucket = Some(b);
            }
        }
    }

    /// A new outage: remember what the endpoint took before it, open for `period_ms`.
    fn open_from_closed(&mut self, now: u64, period_ms: u64) {
        let this_second = self.second.calls - self.second.failures;
        self.remembered_per_s = f64::from(
            self.accepted
                .iter()
                .filter(|(sec, _)| sec + ACCEPTED_MEMORY_S > now / 1000)
                .map(|(_, n)| *n)
                .chain([this_second])
                .max()
                .unwrap_or(0),
        );
        self.down_since_ms = now;
        self.open(now, period_ms);
    }

    fn enter(&mut self, state: BreakerState, at: u64) {
        self.state = state;
        self.state_since_ms = at;
    }

    fn open(&mut self, now: u64, period_ms: u64) {
        self.enter(BreakerState::Open, now);
        self.open_until_ms = now.saturating_add(period_ms);
        self.opened_total += 1;
        self.probe_out = false;
        self.window.clear();
        self.consecutive_failures = 0;
    }

    fn window_seconds(&self) -> u64 {
        let ms = self.config.breaker.map_or(5_000, |b| b.window_ms);
        ms.div_ceil(1000).max(1)
    }

    fn count_in_window(&mut self, now: u64, failed: bool) {
        let sec = now / 1000;
        if self.window.back().is_none_or(|b| b.sec != sec) {
            self.window.push_back(SecondCounts {
                sec,
                ..SecondCounts::default()
            });
        }
        if let Some(b) = self.window.back_mut() {
            b.calls += 1;
            b.failures += u32::from(failed);
        }
    }

    fn window_counts(&self) -> (u32, u32) {
        self.window_counts_at(self.now_ms)
    }

    fn window_counts_at(&self, now: u64) -> (u32, u32) {
        let keep = self.window_seconds();
        let sec = now / 1000;
        self.window
            .iter()
            .filter(|b| b.sec + keep > sec)
            .fold((0, 0), |(c, f), b| (c + b.calls, f + b.failures))
    }

    /// Whether the endpoint is failing now, for the retry budget: its breaker is not
    /// closed, or a failure is in its window.
    fn failing_at(&self, now: u64) -> bool {
        self.state != BreakerState::Closed || self.window_counts_at(now).1 > 0
    }

    fn budget_bucket(&mut self, sec: u64) -> &mut BudgetCounts {
        if self.budget.back().is_none_or(|b| b.sec != sec) {
            self.budget.push_back(BudgetCounts {
                sec,
                ..BudgetCounts::default()
            });
        }
        let len = self.budget.len();
        // Cannot fail: a bucket was pushed above if there was none.
        &mut self.budget[len - 1]
    }

    fn budget_counts_at(&self, now: u64) -> (u64, u64) {
        let keep = BUDGET_WINDOW_MS / 1000;
        let sec = now / 1000;
        self.budget
            .iter()
            .filter(|b| b.sec + keep > sec)
            .fold((0, 0), |(f, r), b| (f + b.first, r + b.retries))
    }

    fn budget_available(&self, first: u64, retries: u64) -> u64 {
        if self.config.retry_budget <= 0.0 {
            return u64::MAX;
        }
        let allowed = (self.config.retry_budget * first as f64).floor() as u64 + BUDGET_FLOOR;
        allowed.saturating_sub(retries)
    }

    fn check_at(&self, now: u64, is_retry: bool) -> Result<(), Wait> {
        match self.state {
            BreakerState::Open => {
                return Err(Wait {
                    until_ms: self.open_until_ms.max(now + 1),
                    reason: WaitReason::Breaker,
                })
            }
            BreakerState::HalfOpen if self.probe_out => {
                return Err(Wait {
                    until_ms: now + PROBE_POLL_MS,
                    reason: WaitReason::Breaker,
                })
            }
            _ => {}
        }
        if self.config.concurrency == 0 {
            return Err(Wait {
                until_ms: now + NO_SHARE_POLL_MS,
                reason: WaitReason::Concurrency,
            });
        }
        if self.in_flight >= self.config.concurrency {
            return Err(Wait {
                until_ms: now + CONCURRENCY_POLL_MS,
                reason: WaitReason::Concurrency,
            });
        }
        if is_retry && self.config.retry_budget > 0.0 && self.failing_at(now) {
            let (first, retries) = self.budget_counts_at(now);
            if self.budget_available(first, retries) == 0 {
                return Err(Wait {
                    until_ms: (now / 1000 + 1) * 1000,
                    reason: WaitReason::Budget,
                });
            }
        }
        let until = [&self.rate_bucket, &self.pace_bucket]
            .into_iter()
            .flatten()
            .filter_map(|b| b.ready().err())
            .max();
        if let Some(until) = until {
            return Err(Wait {
                until_ms: until.max(now + 1),
                reason: WaitReason::Rate,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use BreakerState::{Closed, HalfOpen, Open, Recovering};

    fn config() -> ProtectionConfig {
        ProtectionConfig {
            concurrency: 1_000,
            rate_limit_per_s: None,
            breaker: Some(BreakerConfig::default()),
            retry_budget: 0.0,
        }
    }

    /// `n` calls acquired and recorded at `t`.
    fn calls(p: &mut Protection, t: u64, n: u32, outcome: Outcome) {
        for i in 0..n {
            p.try_acquire(t, false)
                .unwrap_or_else(|w| panic!("call {i} at {t}: {w:?}"));
            p.record(t, outcome);
        }
    }

    /// `n` outcomes fed at `t` (calls admitted earlier, or not the point of the test).
    fn fed(p: &mut Protection, t: u64, n: u32, outcome: Outcome) {
        for _ in 0..n {
            p.record(t, outcome);
        }
    }

    /// One call made at `t` or, if the rate or pace has no token then, when it has one;
    /// returns when it was made.
    fn paced_call(p: &mut Protection, t: u64, outcome: Outcome) -> u64 {
        let mut t = t;
        loop {
            match p.try_acquire(t, false) {
                Ok(()) => {
                    p.record(t, outcome);
                    return t;
                }
                Err(w) if w.reason == WaitReason::Rate => t = w.until_ms,
                Err(w) => panic!("at {t}: {w:?}"),
            }
        }
    }

    /// A protection opened at `t` by 20 failures.
    fn opened_at(t: u64) -> Protection {
        let mut p = Protection::new(config(), 0);
        calls(&mut p, t, 20, Outcome::Failure);
        assert_eq!(p.state(), Open);
        p
    }

    fn wait(until_ms: u64, reason: WaitReason) -> Result<(), Wait> {
        Err(Wait { until_ms, reason })
    }

    #[test]
    fn names() {
        let states = [Closed, Open, HalfOpen, Recovering].map(BreakerState::as_str);
        assert_eq!(states, ["closed", "open", "half_open", "recovering"]);
        let reasons = [
            WaitReason::Breaker,
            WaitReason::Concurrency,
            WaitReason::Rate,
            WaitReason::Budget,
        ]
        .map(WaitReason::as_str);
        assert_eq!(reasons, ["breaker", "concurrency", "rate", "budget"]);
        assert_eq!(Outcome::from_class(None), Outcome::Success);
        assert_eq!(
            Outcome::from_class(Some(ErrorClass::Permanent)),
            Outcome::Success
        );
        assert_eq!(
            Outcome::from_class(Some(ErrorClass::RateLimited)),
            Outcome::Failure
        );
        assert_eq!(
            Outcome::from_class(Some(ErrorClass::Transient)),
            Outcome::Failure
        );
    }

    #[test]
    fn a_fresh_endpoint_is_not_throttled() {
        let mut p = Protection::new(config(), 0);
        for _ in 0..1_000 {
            p.try_acquire(0, false).unwrap();
        }
        assert_eq!(p.in_flight(), 1_000);
        assert_eq!(p.pace_per_s(), None);
        assert_eq!(p.try_acquire(0, false), wait(5, WaitReason::Concurrency));
    }

    #[test]
    fn closed_opens_with_min_calls_above_the_ratio() {
        let mut p = Protection::new(config(), 0);
        calls(&mut p, 100, 19, Outcome::Failure);
        assert_eq!(p.state(), Closed, "19 < min_calls");
        calls(&mut p, 100, 1, Outcome::Failure);
        assert_eq!(p.state(), Open);
        let s = p.snapshot(100);
        assert_eq!((s.opened_total, s.state_since_ms), (1, 100));

        // Exactly 50 % is not above the ratio.
        let mut p = Protection::new(config(), 0);
        calls(&mut p, 100, 10, Outcome::Success);
        calls(&mut p, 200, 10, Outcome::Failure);
        assert_eq!(p.state(), Closed);
        calls(&mut p, 300, 1, Outcome::Failure);
        assert_eq!(p.state(), Open, "11 of 21");
    }

    #[test]
    fn the_window_slides() {
        let mut p = Protection::new(config(), 0);
        fed(&mut p, 0, 15, Outcome::Failure);
        fed(&mut p, 1, 1, Outcome::Success); // no 20 failures in a row
                                             // 5 s later the first second has left the 5 s window.
        fed(&mut p, 5_000, 15, Outcome::Failure);
        assert_eq!(p.state(), Closed);
        let s = p.snapshot(5_000);
        assert_eq!((s.window_calls, s.window_failures), (15, 15));
        fed(&mut p, 5_999, 5, Outcome::Failure);
        assert_eq!(p.state(), Open);
    }

    #[test]
    fn while_open_nothing_is_admitted() {
        let mut p = opened_at(1_000);
        for t in [1_000, 1_001, 3_000, 5_999] {
            assert_eq!(
                p.try_acquire(t, false),
                wait(6_000, WaitReason::Breaker),
                "{t}"
            );
            assert_eq!(p.admissible(t), wait(6_000, WaitReason::Breaker));
        }
        // Late outcomes of calls made before it opened do not move it.
        p.record(2_000, Outcome::Success);
        p.record(2_000, Outcome::Failure);
        assert_eq!(p.state(), Open);
        assert_eq!(
            p.snapshot(6_000).state,
            HalfOpen,
            "the snapshot sees the period end"
        );
        assert_eq!(p.admissible(6_000), Ok(()));
        assert_eq!(p.state(), HalfOpen);
        assert_eq!(p.snapshot(6_000).state_since_ms, 6_000);
    }

    #[test]
    fn half_open_admits_one_probe_and_a_good_probe_recovers() {
        let mut p = opened_at(1_000);
        assert_eq!(p.try_acquire(6_000, false), Ok(()));
        assert_eq!(
            p.try_acquire(6_000, false),
            wait(6_050, WaitReason::Breaker)
        );
        assert_eq!(p.try_acquire(6_040, true), wait(6_090, WaitReason::Breaker));
        p.record(6_100, Outcome::Success);
        assert_eq!(p.state(), Recovering);
        assert_eq!(p.pace_per_s(), Some(PACE_START));
        assert_eq!(p.snapshot(6_100).state_since_ms, 6_100);
    }

    #[test]
    fn failed_probes_reopen_for_a_tenth_of_the_outage_between_open_ms_and_30_s() {
        let mut p = opened_at(0);
        let mut t = 5_000;
        let mut periods = vec![];
        while periods.last() != Some(&30_000) {
            assert_eq!(p.try_acquire(t, false), Ok(()), "probe at {t}");
            p.record(t + 10, Outcome::Failure);
            assert_eq!(p.state(), Open);
            // The outage began at 0, when the breaker first opened.
            let period = ((t + 10) / 10).clamp(5_000, 30_000);
            let until = t + 10 + period;
            assert_eq!(
                p.try_acquire(until - 1, false),
                wait(until, WaitReason::Breaker)
            );
            periods.push(period);
            t = until;
        }
        // 5 s while the outage is under 50 s (a recovery is seen within 5 s), then growing
        // with it (a recovery is seen within a tenth of the outage), then one probe per 30 s.
        assert!(periods[..9].iter().all(|&p| p == 5_000), "{periods:?}");
        assert!(periods.windows(2).all(|w| w[0] <= w[1]), "{periods:?}");
        assert!(
            t > 300_000 && t < 340_000,
            "30 s probes from a 300 s outage on: {t}"
        );
        assert_eq!(p.snapshot(t).opened_total, 1 + periods.len() as u64);
        // A good probe, then the next opening is back to open_ms.
        p.try_acquire(t, false).unwrap();
        p.record(t, Outcome::Success);
        assert_eq!(p.state(), Recovering);
        let mut at = paced_call(&mut p, t, Outcome::Failure);
        assert_eq!(
            p.state(),
            Recovering,
            "1 of 1 failed: fewer than min(20, 20) calls"
        );
        for _ in 0..19 {
            at = paced_call(&mut p, at, Outcome::Failure);
        }
        assert_eq!(p.state(), Open);
        assert_eq!(p.admissible(at + 4_999).unwrap_err().until_ms, at + 5_000);
    }

    /// Recovering → Closed after `trickle_calls` good outcomes, at the pace.
    #[test]
    fn the_trickle_closes_at_the_pace() {
        let mut p = opened_at(0);
        p.try_acquire(5_000, false).unwrap();
        p.record(5_000, Outcome::Success);
        assert_eq!(p.state(), Recovering);
        // Pace 5/s, one token at the start: one call, then the next token 200 ms later.
        let mut t = 5_000;
        let mut made = 0;
        let mut waits = vec![];
        while p.state() == Recovering {
            match p.try_acquire(t, false) {
                Ok(()) => {
                    made += 1;
                    p.record(t, Outcome::Success);
                }
                Err(w) => {
                    assert_eq!(w.reason, WaitReason::Rate);
                    waits.push(w.until_ms - t);
                    t = w.until_ms;
                }
            }
        }
        assert_eq!(made, 20);
        assert_eq!(p.state(), Closed);
        assert_eq!(waits[0], 200, "the first second is paced at 5/s");
        // 5 calls in [5 s, 6 s), then the pace is 15/s.
        assert_eq!(p.snapshot(t).window_calls, 0, "the window starts empty");
        assert!(t < 7_000, "20 calls at 5/s then 15/s end before 7 s: {t}");
        assert_eq!(p.snapshot(t).opened_total, 1);
    }

    #[test]
    fn recovering_reopens_when_the_trickle_fails() {
        let mut p = opened_at(0);
        p.try_acquire(5_000, false).unwrap();
        p.record(5_000, Outcome::Success);
        let small = BreakerConfig {
            trickle_calls: 4,
            ..BreakerConfig::default()
        };
        let mut q = Protection::new(
            ProtectionConfig {
                breaker: Some(small),
                ..config()
            },
            0,
        );
        calls(&mut q, 0, 20, Outcome::Failure);
        q.try_acquire(5_000, false).unwrap();
        q.record(5_000, Outcome::Success);
        assert_eq!(q.state(), Recovering);
        // min(min_calls, trickle_calls) = 4 outcomes, 3 failed.
        for (i, o) in [Outcome::Failure, Outcome::Success, Outcome::Failure]
            .into_iter()
            .enumerate()
        {
            let at = 6_000 + 1_000 * i as u64;
            q.try_acquire(at, false).unwrap();
            q.record(at, o);
            assert_eq!(q.state(), Recovering);
        }
        q.try_acquire(9_000, false).unwrap();
        q.record(9_000, Outcome::Failure);
        assert_eq!(q.state(), Open);
        assert_eq!(q.snapshot(9_000).opened_total, 2);
    }

    #[test]
    fn one_failed_call_out_of_one_does_not_pace_a_quiet_endpoint() {
        let mut p = Protection::new(config(), 0);
        calls(&mut p, 100, 1, Outcome::Failure);
        p.admissible(1_000).unwrap();
        assert_eq!(p.pace_per_s(), None);
        // Five calls, all failing, do.
        calls(&mut p, 1_100, 5, Outcome::Failure);
        p.admissible(2_000).ok();
        assert_eq!(p.pace_per_s(), Some(1.0));
    }

    #[test]
    fn failures_in_a_row_open_the_breaker_despite_earlier_successes() {
        let mut p = Protection::new(config(), 0);
        calls(&mut p, 100, 500, Outcome::Success);
        // 19 failures, a success, 19 failures: the window is mostly good, and no 20 in a row.
        calls(&mut p, 200, 19, Outcome::Failure);
        calls(&mut p, 200, 1, Outcome::Success);
        calls(&mut p, 200, 19, Outcome::Failure);
        assert_eq!(p.state(), Closed);
        // The 20th in a row opens it, although the window holds 501 successes.
        calls(&mut p, 200, 1, Outcome::Failure);
        assert_eq!(p.state(), Open);
        assert_eq!(p.snapshot(200).opened_total, 1);
    }

    /// On 3 nodes each sees a third of the calls: 10 failures in a row open a node's
    /// breaker (not 20), and never fewer than [`MIN_IN_A_ROW`] however many nodes.
    #[test]
    fn a_node_of_a_cluster_opens_after_its_share_of_the_failures_in_a_row() {
        let mut p = Protection::new(config(), 0);
        p.set_nodes(3);
        calls(&mut p, 100, 500, Outcome::Success);
        calls(&mut p, 200, 9, Outcome::Failure);
        assert_eq!(p.state(), Closed);
        calls(&mut p, 200, 1, Outcome::Failure);
        assert_eq!(p.state(), Open, "ceil(20 / 3) = 7, at least 10");
        let mut p = Protection::new(config(), 0);
        p.set_nodes(100);
        calls(&mut p, 100, 500, Outcome::Success);
        calls(&mut p, 200, MIN_IN_A_ROW - 1, Outcome::Failure);
        assert_eq!(
            p.state(),
            Closed,
            "100 nodes: still {MIN_IN_A_ROW} in a row"
        );
        calls(&mut p, 200, 1, Outcome::Failure);
        assert_eq!(p.state(), Open);
        let mut p = Protection::new(config(), 0);
        p.set_nodes(1);
        calls(&mut p, 100, 500, Outcome::Success);
        calls(&mut p, 200, 19, Outcome::Failure);
        assert_eq!(p.state(), Closed, "alone: 20 in a row");
    }

    /// A protection that recovered at 5 s (nothing remembered: pace 5/s) and whose slow
    /// start ended with a failure at 5.5 s (× 0.8 = 4/s).
    fn past_slow_start() -> Protection {
        let mut p = opened_at(0);
        p.try_acquire(5_000, false).unwrap();
        p.record(5_000, Outcome::Success);
        assert_eq!(p.pace_per_s(), Some(PACE_START));
        paced_call(&mut p, 5_500, Outcome::Failure);
        assert_eq!(p.pace_per_s(), Some(PACE_START * PACE_DECREASE));
        p
    }

    /// Issue 15 §3: the pace restarted at 5/s and added 10/s per second, so a 30 s outage
    /// drained in 1.75× the bound. It starts from what the endpoint accepted before the
    /// outage and doubles about every second while calls succeed, until the first failure.
    #[test]
    fn the_ramp_starts_at_the_rate_accepted_before_the_outage_and_grows_until_a_failure() {
        let mut p = Protection::new(config(), 0);
        // 10 s at 80 accepted per second, then the endpoint fails everything.
        for s in 0..10 {
            calls(&mut p, s * 1_000 + 500, 80, Outcome::Success);
        }
        calls(&mut p, 10_100, 20, Outcome::Failure);
        assert_eq!(p.state(), Open);
        // Down for a while; the probe at 15.1 s succeeds.
        p.try_acquire(15_100, false).unwrap();
        p.record(15_100, Outcome::Success);
        assert_eq!(p.state(), Recovering);
        assert_eq!(p.pace_per_s(), Some(80.0), "the rate accepted before");
        // Calls as fast as the pace lets them (a backlog), all succeeding: it grows with
        // each success, about ×2 per second, not +10/s.
        let mut t = 15_100;
        let mut at_16 = None;
        while t < 17_100 {
            t = paced_call(&mut p, t, Outcome::Success);
            if t >= 16_100 && at_16.is_none() {
                at_16 = p.pace_per_s();
            }
        }
        let at_16 = at_16.unwrap();
        assert!((140.0..=180.0).contains(&at_16), "{at_16} one second in");
        let at_17 = p.pace_per_s().unwrap();
        assert!(
            at_17 >= 1.8 * at_16 && at_17 <= 2.2 * at_16,
            "{at_16} → {at_17}"
        );
        assert_eq!(p.state(), Closed, "the trickle closed it on the way");
        // The first failure ends the slow start at once: × 0.8, then +10/s per good second.
        let t = paced_call(&mut p, t, Outcome::Failure);
        assert_eq!(p.pace_per_s(), Some(at_17 * PACE_DECREASE));
        let after = p.pace_per_s().unwrap();
        let mut t = t;
        while t < 18_000 {
            t = paced_call(&mut p, t, Outcome::Success);
        }
        assert_eq!(
            p.pace_per_s(),
            Some(after),
            "no growth per success any more"
        );
        p.admissible(19_000).ok();
        assert_eq!(p.pace_per_s(), Some(after + PACE_INCREASE));
    }

    /// Slow start grows only a pace that holds calls back: successes that never waited for
    /// a pace token (the backlog is gone) leave it.
    #[test]
    fn slow_start_does_not_inflate_a_pace_nobody_uses() {
        let mut p = opened_at(0);
        p.try_acquire(5_000, false).unwrap();
        p.record(5_000, Outcome::Success);
        for i in 0..5 {
            let t = 5_300 + i * 300;
            p.try_acquire(t, false).unwrap();
            p.record(t, Outcome::Success);
        }
        assert_eq!(p.pace_per_s(), Some(PACE_START), "never waited for a token");
    }

    /// A pace back off just over the capacity lands just under what the endpoint accepted,
    /// not a fifth below the pace.
    #[test]
    fn a_pace_just_over_capacity_backs_off_to_just_under_what_was_accepted() {
        let mut p = Protection::new(config(), 0);
        calls(&mut p, 500, 100, Outcome::Success);
        calls(&mut p, 1_100, 20, Outcome::Failure);
        p.try_acquire(6_100, false).unwrap();
        p.record(6_100, Outcome::Success);
        assert_eq!(p.pace_per_s(), Some(100.0));
        // At the pace for the rest of the second; the last call fails (the slow start ends,
        // × 0.8 at once).
        let mut t = 6_100;
        while t < 6_990 {
            t = paced_call(&mut p, t, Outcome::Success);
        }
        paced_call(&mut p, t, Outcome::Failure);
        assert!(!p.slow_start);
        // A whole second at the pace (AIMD now), its last calls failing: just over capacity.
        let mut t = 7_000;
        p.admissible(t).ok();
        let paced = p.pace_per_s().unwrap();
        while t < 7_970 {
            t = paced_call(&mut p, t, Outcome::Success);
        }
        for _ in 0..3 {
            t = paced_call(&mut p, t, Outcome::Failure);
        }
        assert!(t < 8_000);
        let (calls, failures) = (p.second.calls, p.second.failures);
        assert_eq!(failures, 3);
        p.admissible(8_000).ok();
        // More than 1 % failed: not × 0.8, but just under what was accepted.
        let accepted = f64::from(calls - failures);
        assert!(
            accepted * NEAR_CAPACITY > paced * PACE_DECREASE,
            "{paced} {accepted}"
        );
        assert_eq!(p.pace_per_s(), Some((accepted * NEAR_CAPACITY).min(paced)));
    }

    #[test]
    fn aimd_increases_and_decreases() {
        let mut p = past_slow_start();
        // The second of the failure (5 s: 1 of 2 failed, 1 accepted) cuts it to what was
        // accepted.
        p.admissible(6_000).ok();
        assert_eq!(p.pace_per_s(), Some(1.0));
        // A second with outcomes and no failure: +10/s (seen when the next one begins).
        p.try_acquire(6_500, false).unwrap();
        p.record(6_500, Outcome::Success);
        p.admissible(7_000).ok();
        assert_eq!(p.pace_per_s(), Some(11.0));
        fed(&mut p, 7_500, 1, Outcome::Success);
        p.admissible(8_000).ok();
        assert_eq!(p.pace_per_s(), Some(21.0));
        // An empty second: no change.
        p.admissible(9_500).ok();
        assert_eq!(p.pace_per_s(), Some(21.0));
        // 1 failure in 21 (> 1 %): × 0.8, or just under what was accepted if that is more.
        fed(&mut p, 10_000, 20, Outcome::Success);
        fed(&mut p, 10_500, 1, Outcome::Failure);
        p.admissible(11_000).ok();
        assert_eq!(p.pace_per_s(), Some(20.0 * NEAR_CAPACITY));
        // ... and never above what the endpoint accepted in that second.
        fed(&mut p, 11_000, 3, Outcome::Success);
        fed(&mut p, 11_000, 1, Outcome::Failure);
        p.admissible(12_000).ok();
        assert_eq!(p.pace_per_s(), Some(3.0));
        // Nothing accepted: the floor of 1/s.
        fed(&mut p, 12_000, 1, Outcome::Failure);
        p.admissible(13_000).ok();
        assert_eq!(p.pace_per_s(), Some(1.0));
    }

    #[test]
    fn aimd_starts_pacing_an_unpaced_endpoint_at_half_its_rate_and_unpaces_when_idle() {
        let mut p = Protection::new(config(), 0);
        calls(&mut p, 100, 198, Outcome::Success);
        calls(&mut p, 200, 2, Outcome::Failure); // 1 %: not more than 1 %
        p.admissible(1_000).unwrap();
        assert_eq!(p.pace_per_s(), None);
        // A flaky endpoint (3 % failing) is not throttled while unpaced.
        calls(&mut p, 1_100, 97, Outcome::Success);
        calls(&mut p, 1_100, 3, Outcome::Failure);
        p.admissible(2_000).unwrap();
        assert_eq!(p.pace_per_s(), None);
        // A second failing more than the breaker's ratio starts the pace at half the calls.
        for _ in 0..5 {
            calls(&mut p, 2_100, 9, Outcome::Success);
            calls(&mut p, 2_100, 11, Outcome::Failure);
        }
        assert_eq!(p.state(), Closed);
        p.admissible(3_000).ok();
        assert_eq!(
            p.pace_per_s(),
            Some(45.0),
            "half of 100, capped at the 45 accepted"
        );
        assert_eq!(p.snapshot(3_000).calls_per_s, 100.0);
        // Idle: 10 slack seconds later, unpaced again.
        p.admissible(12_000).ok();
        assert_eq!(p.pace_per_s(), Some(45.0));
        p.admissible(13_000).ok();
        assert_eq!(p.pace_per_s(), None);
    }

    #[test]
    fn the_pace_never_exceeds_the_rate_limit() {
        let mut p = Protection::new(
            ProtectionConfig {
                rate_limit_per_s: Some(12.0),
                ..config()
            },
            0,
        );
        fed(&mut p, 0, 20, Outcome::Failure);
        assert_eq!(p.state(), Open);
        p.try_acquire(5_000, false).unwrap();
        p.record(5_000, Outcome::Success);
        assert_eq!(p.pace_per_s(), Some(PACE_START));
        // Slow start, calls as fast as allowed: it grows to the rate limit and stays there.
        let mut t = 5_000;
        let mut max: f64 = 0.0;
        while t < 9_000 {
            t = paced_call(&mut p, t, Outcome::Success);
            max = max.max(p.pace_per_s().unwrap());
        }
        assert_eq!(max, 12.0);
        assert_eq!(p.pace_per_s(), Some(12.0));
        // An endpoint that accepted 50/s before the outage restarts at the limit, not at 50.
        let mut p = Protection::new(
            ProtectionConfig {
                rate_limit_per_s: Some(12.0),
                ..config()
            },
            0,
        );
        fed(&mut p, 500, 50, Outcome::Success);
        fed(&mut p, 1_100, 20, Outcome::Failure);
        assert_eq!(p.state(), Open);
        p.try_acquire(6_100, false).unwrap();
        p.record(6_100, Outcome::Success);
        assert_eq!(p.pace_per_s(), Some(12.0));
    }

    #[test]
    fn the_rate_limit_is_a_token_bucket() {
        let mut p = Protection::new(
            ProtectionConfig {
                rate_limit_per_s: Some(10.0),
                ..config()
            },
            0,
        );
        assert_eq!(p.try_acquire(0, false), Ok(()));
        assert_eq!(p.try_acquire(0, false), wait(100, WaitReason::Rate));
        assert_eq!(p.try_acquire(99, false), wait(100, WaitReason::Rate));
        assert_eq!(p.try_acquire(100, false), Ok(()));
        // 100/s: a burst of 10.
        let mut p = Protection::new(
            ProtectionConfig {
                rate_limit_per_s: Some(100.0),
                ..config()
            },
            0,
        );
        for _ in 0..10 {
            p.try_acquire(0, false).unwrap();
        }
        assert_eq!(p.try_acquire(0, false), wait(10, WaitReason::Rate));
    }

    #[test]
    fn the_budget_refuses_retries_beyond_ratio_and_floor_never_first_attempts() {
        let mut p = Protection::new(
            ProtectionConfig {
                retry_budget: 0.1,
                ..config()
            },
            0,
        );
        assert_eq!(p.snapshot(0).budget_available, 10, "the floor");
        calls(&mut p, 0, 99, Outcome::Success);
        // One failure: the endpoint is failing, the budget applies (the breaker stays closed).
        calls(&mut p, 0, 1, Outcome::Failure);
        assert_eq!(p.snapshot(0).budget_available, 20);
        for i in 0..20 {
            p.try_acquire(500, true)
                .unwrap_or_else(|w| panic!("retry {i}: {w:?}"));
            p.record(500, Outcome::Success);
        }
        assert_eq!(p.try_acquire(500, true), wait(1_000, WaitReason::Budget));
        assert_eq!(p.check(500, true), wait(1_000, WaitReason::Budget));
        let before = p.snapshot(500);
        assert_eq!(
            (
                before.budget_first_attempts,
                before.budget_retries,
                before.budget_available,
                before.in_flight
            ),
            (100, 20, 0, 0),
            "the refusal consumed nothing"
        );
        // First attempts are never refused by the budget; 10 more allow one more retry.
        for _ in 0..10 {
            assert_eq!(p.try_acquire(600, false), Ok(()));
            p.record(600, Outcome::Success);
        }
        assert_eq!(p.try_acquire(600, true), Ok(()));
        p.record(600, Outcome::Success);
        assert_eq!(
            p.try_acquire(600, true).unwrap_err().reason,
            WaitReason::Budget
        );
        // Ten seconds later the window has rolled over: the floor again.
        assert_eq!(p.snapshot(10_000).budget_available, 10);
        assert_eq!(p.try_acquire(10_000, true), Ok(()));
    }

    #[test]
    fn retries_to_an_endpoint_that_fails_nothing_are_not_refused_until_a_failure() {
        let mut p = Protection::new(
            ProtectionConfig {
                retry_budget: 0.1,
                ..config()
            },
            0,
        );
        // No first attempts at all (they stopped), a backlog of retries, every call
        // succeeding: far past the floor of 10, nothing refused.
        for i in 0..200 {
            p.try_acquire(1_000, true)
                .unwrap_or_else(|w| panic!("retry {i}: {w:?}"));
            p.record(1_000, Outcome::Success);
        }
        assert_eq!(
            p.snapshot(1_000).budget_retries,
            200,
            "counted all the same"
        );
        // A failure: the budget is back at once (200 retries ≥ 0 + 10).
        p.try_acquire(1_000, true).unwrap();
        p.record(1_000, Outcome::Failure);
        assert_eq!(p.try_acquire(1_000, true), wait(2_000, WaitReason::Budget));
        assert_eq!(p.try_acquire(1_000, false), Ok(()), "never a first attempt");
        p.record(1_000, Outcome::Success);
        // The failure leaves the breaker's 5 s window, the retries the budget's 10 s one:
        // at 6 s the endpoint fails nothing again, though the budget would still refuse.
        assert_eq!(p.snapshot(6_000).budget_available, 0);
        assert_eq!(p.try_acquire(6_000, true), Ok(()));
    }

    #[test]
    fn no_budget_no_refusal() {
        let mut p = Protection::new(config(), 0);
        for _ in 0..500 {
            p.try_acquire(0, true).unwrap();
        }
        assert_eq!(p.snapshot(0).budget_available, u64::MAX);
        assert_eq!(p.snapshot(0).budget_retries, 500);
    }

    #[test]
    fn cancel_undoes_an_acquisition() {
        let mut p = Protection::new(
            ProtectionConfig {
                concurrency: 1,
                rate_limit_per_s: Some(1.0),
                retry_budget: 0.5,
                ..config()
            },
            0,
        );
        let fresh = p.snapshot(0);
        p.try_acquire(0, true).unwrap();
        assert_eq!(
            p.try_acquire(0, false).unwrap_err().reason,
            WaitReason::Concurrency
        );
        p.cancel(0);
        assert_eq!(p.snapshot(0), fresh);
        assert_eq!(p.try_acquire(0, false), Ok(()), "token and slot given back");
        // In half-open, the probe slot comes back too.
        let mut p = opened_at(0);
        p.try_acquire(5_000, false).unwrap();
        assert_eq!(p.admissible(5_000).unwrap_err().reason, WaitReason::Breaker);
        p.cancel(5_000);
        assert_eq!(p.state(), HalfOpen);
        assert_eq!(p.admissible(5_000), Ok(()));
        assert_eq!(p.snapshot(5_000).in_flight, 0);
    }

    #[test]
    fn without_a_breaker_nothing_opens_or_paces() {
        let mut p = Protection::new(
            ProtectionConfig {
                breaker: None,
                ..config()
            },
            0,
        );
        for s in 0..20 {
            calls(&mut p, s * 1_000, 100, Outcome::Failure);
        }
        assert_eq!(p.state(), Closed);
        assert_eq!(p.pace_per_s(), None);
        let s = p.snapshot(19_000);
        assert_eq!((s.window_calls, s.window_failures), (500, 500));
        assert_eq!(s.opened_total, 0);
    }

    #[test]
    fn set_limits_changes_the_limits_in_place_keeping_calls_in_flight_and_the_breaker() {
        let mut p = Protection::new(
            ProtectionConfig {
                concurrency: 4,
                rate_limit_per_s: Some(100.0),
                ..config()
            },
            0,
        );
        for _ in 0..3 {
            p.try_acquire(0, false).unwrap();
        }
        // A smaller share: the three calls stay in flight, none more starts until fewer
        // than the new limit are out.
        p.set_limits(0, 2, Some(50.0));
        assert_eq!(p.in_flight(), 3);
        assert_eq!(p.config().concurrency, 2);
        assert_eq!(p.config().rate_limit_per_s, Some(50.0));
        assert_eq!(p.try_acquire(0, false), wait(5, WaitReason::Concurrency));
        p.record(1, Outcome::Success);
        p.record(1, Outcome::Success);
        assert_eq!(p.in_flight(), 1);
        // The bucket kept its tokens (7 of a burst of 10), at most the new burst (5): five
        // calls now, then one every 20 ms (50/s).
        for _ in 0..4 {
            p.try_acquire(1, false).unwrap();
            p.record(1, Outcome::Success);
        }
        p.try_acquire(1, false).unwrap();
        p.record(1, Outcome::Success);
        assert_eq!(p.try_acquire(1, false), wait(21, WaitReason::Rate));
        assert_eq!(p.try_acquire(21, false), Ok(()));
        p.record(21, Outcome::Success);
        // A share of nothing admits no call, and says to ask again after a long wait.
        p.set_limits(30, 0, Some(1.0));
        assert_eq!(
            p.try_acquire(30, false),
            wait(30 + NO_SHARE_POLL_MS, WaitReason::Concurrency)
        );
        assert_eq!(p.snapshot(30).concurrency, 0);
        // No rate limit, then one set again (a full burst).
        p.set_limits(40, 4, None);
        assert_eq!(p.snapshot(40).rate_limit_per_s, None);
        for _ in 0..3 {
            p.try_acquire(40, false).unwrap();
        }
        p.set_limits(40, 8, Some(20.0));
        p.try_acquire(40, false).unwrap();
        p.try_acquire(40, false).unwrap();
        assert_eq!(p.try_acquire(40, false), wait(90, WaitReason::Rate));
        assert_eq!(p.in_flight(), 6);

        // The breaker's state is kept: open stays open until its period ends.
        let mut p = opened_at(10_000);
        let before = p.snapshot(10_000);
        p.set_limits(10_001, 1, Some(5.0));
        let after = p.snapshot(10_001);
        assert_eq!(after.state, Open);
        assert_eq!(after.opened_total, before.opened_total);
        assert_eq!(after.state_since_ms, before.state_since_ms);
        assert_eq!(
            p.try_acquire(10_001, false),
            wait(15_000, WaitReason::Breaker)
        );
        // And a pace above a lowered rate limit comes down to it.
        let mut p = opened_at(0);
        assert_eq!(p.try_acquire(5_000, false), Ok(()));
        p.record(5_000, Outcome::Success);
        assert_eq!(p.state(), Recovering);
        let pace = p.pace_per_s().unwrap();
        p.set_limits(5_000, 4, Some(pace / 2.0));
        assert_eq!(p.pace_per_s(), Some(pace / 2.0));
    }

    #[test]
    fn force_open_holds_the_breaker_open_for_the_period_then_probes() {
        // Closed: opens for the period given, counted, remembering the accepted rate; no
        // trip of its own.
        let mut p = Protection::new(config(), 0);
        calls(&mut p, 0, 30, Outcome::Success);
        assert!(p.force_open(500, 2_000));
        assert_eq!(p.state(), Open);
        assert_eq!(p.snapshot(500).opened_total, 1);
        assert_eq!(
            p.take_trip(),
            None,
            "a forced opening is no trip of its own"
        );
        assert_eq!(p.try_acquire(500, false), wait(2_500, WaitReason::Breaker));
        // Open: a later end extends it, an earlier one does not shorten it.
        assert!(!p.force_open(600, 1_000));
        assert_eq!(p.try_acquire(600, false), wait(2_500, WaitReason::Breaker));
        assert!(!p.force_open(700, 3_000));
        assert_eq!(
            p.try_acquire(3_699, false),
            wait(3_700, WaitReason::Breaker)
        );
        // Then one probe; a good one recovers at the rate accepted before (30/s).
        assert_eq!(p.try_acquire(3_700, false), Ok(()));
        assert_eq!(p.state(), HalfOpen);
        assert_eq!(
            p.try_acquire(3_700, false),
            wait(3_750, WaitReason::Breaker)
        );
        p.record(3_710, Outcome::Success);
        assert_eq!(p.state(), Recovering);
        assert_eq!(p.pace_per_s(), Some(30.0));
        // Recovering (or HalfOpen): open again for the period.
        assert!(p.force_open(4_000, 1_000));
        assert_eq!(p.state(), Open);
        assert_eq!(p.snapshot(4_000).opened_total, 2);
        assert_eq!(
            p.try_acquire(4_000, false),
            wait(5_000, WaitReason::Breaker)
        );
        // A probe answered while open moves nothing.
        p.record(4_100, Outcome::Success);
        assert_eq!(p.state(), Open);

        // Its own outcomes opening it from Closed are a trip, taken once.
        let mut p = opened_at(1_000);
        assert_eq!(p.take_trip(), Some(5_000));
        assert_eq!(p.take_trip(), None);
        // A failed probe reopens it: no new trip.
        assert_eq!(p.try_acquire(6_000, false), Ok(()));
        p.record(6_000, Outcome::Failure);
        assert_eq!(p.state(), Open);
        assert_eq!(p.take_trip(), None);

        // Without a breaker nothing opens.
        let mut p = Protection::new(
            ProtectionConfig {
                breaker: None,
                ..config()
            },
            0,
        );
        assert!(!p.force_open(0, 5_000));
        assert_eq!(p.try_acquire(0, false), Ok(()));
    }

    #[test]
    fn the_clock_never_runs_backwards() {
        let mut p = opened_at(10_000);
        assert_eq!(p.try_acquire(0, false), wait(15_000, WaitReason::Breaker));
    }

    #[test]
    fn config_validation_names_the_field() {
        assert_eq!(ProtectionConfig::default().validate(), Ok(()));
        let bad = |c: ProtectionConfig| c.validate().unwrap_err();
        assert!(bad(ProtectionConfig {
            concurrency: 0,
            ..config()
        })
        .starts_with("concurrency"));
        assert!(bad(ProtectionConfig {
            rate_limit_per_s: Some(0.0),
            ..config()
        })
        .starts_with("rate_limit"));
        assert!(bad(ProtectionConfig {
            retry_budget: f64::NAN,
            ..config()
        })
        .starts_with("retry_budget"));
        assert!(bad(ProtectionConfig {
            breaker: Some(BreakerConfig {
                failure_ratio: 1.5,
                ..BreakerConfig::default()
            }),
            ..config()
        })
        .starts_with("breaker.failure_ratio"));
        // new() clamps instead.
        let p = Protection::new(
            ProtectionConfig {
                concurrency: 0,
                rate_limit_per_s: Some(-1.0),
                ..config()
            },
            0,
        );
        assert_eq!(p.config().concurrency, 1);
        assert_eq!(p.config().rate_limit_per_s, None);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            Advance(u64),
            Acquire { retry: bool },
            Record { failed: bool },
            Cancel,
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                3 => (0u64..400).prop_map(Op::Advance),
                4 => any::<bool>().prop_map(|retry| Op::Acquire { retry }),
                3 => any::<bool>().prop_map(|failed| Op::Record { failed }),
                1 => Just(Op::Cancel),
            ]
        }

        fn breaker() -> impl Strategy<Value = Option<BreakerConfig>> {
            prop::option::of(
                (
                    500u64..5_000,
                    2u32..12,
                    0.2f64..0.8,
                    100u64..3_000,
                    1u32..12,
                )
                    .prop_map(
                        |(window_ms, min_calls, failure_ratio, open_ms, trickle_calls)| {
                            BreakerConfig {
                                window_ms,
                                min_calls,
                                failure_ratio,
                                open_ms,
                                trickle_calls,
                            }
                        },
                    ),
            )
        }

        fn allowed(from: BreakerState, to: BreakerState) -> bool {
            from == to
                || matches!(
                    (from, to),
                    (Closed, Open)
                        | (Open, HalfOpen)
                        | (HalfOpen, Open)
                        | (HalfOpen, Recovering)
                        | (Recovering, Closed)
                        | (Recovering, Open)
                )
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(300))]

            /// Random acquire / record / cancel sequences over simulated time: starts in
            /// any 1 s window ≤ rate + burst, in flight ≤ concurrency, the breaker moves
            /// only along its edges, nothing starts while Open, the budget never refuses a
            /// first attempt.
            #[test]
            fn invariants(
                rate in prop::option::of(0.5f64..300.0),
                concurrency in 1u32..12,
                breaker in breaker(),
                retry_budget in prop_oneof![Just(0.0), 0.0f64..0.5],
                ops in prop::collection::vec(op(), 1..800),
            ) {
                let config = ProtectionConfig {
                    concurrency,
                    rate_limit_per_s: rate,
                    breaker,
                    retry_budget,
                };
                let mut p = Protection::new(config, 0);
                let mut now = 0u64;
                let mut starts: Vec<u64> = vec![];
                let mut in_flight = 0u32;
                let mut state = p.state();
                for op in ops {
                    match op {
                        Op::Advance(ms) => now += ms,
                        Op::Acquire { retry } => {
                            let open_before = p.snapshot(now).state == Open;
                            match p.try_acquire(now, retry) {
                                Ok(()) => {
                                    prop_assert!(!open_before, "admitted while open at {}", now);
                                    starts.push(now);
                                    in_flight += 1;
                                }
                                Err(w) => {
                                    prop_assert!(w.until_ms > now, "{:?} at {}", w, now);
                                    prop_assert!(retry || w.reason != WaitReason::Budget);
                                }
                            }
                        }
                        Op::Record { failed } => {
                            if in_flight > 0 {
                                in_flight -= 1;
                                let o = if failed { Outcome::Failure } else { Outcome::Success };
                                p.record(now, o);
                            }
                        }
                        Op::Cancel => {
                            if in_flight > 0 {
                                in_flight -= 1;
                                starts.pop();
                                p.cancel(now);
                            }
                        }
                    }
                    prop_assert_eq!(p.in_flight(), in_flight);
                    prop_assert!(in_flight <= p.config().concurrency);
                    let next = p.state();
                    prop_assert!(allowed(state, next), "{:?} -> {:?} at {}", state, next, now);
                    if breaker.is_none() {
                        prop_assert_eq!(next, Closed);
                        prop_assert_eq!(p.pace_per_s(), None);
                    }
                    if let (Some(pace), Some(r)) = (p.pace_per_s(), rate) {
                        prop_assert!(pace <= r + 1e-9 && pace >= 1.0_f64.min(r));
                    }
                    state = next;
                }
                if let Some(r) = rate {
                    let bound = r + (r / 10.0).max(1.0) + 1e-6;
                    for (i, &t) in starts.iter().enumerate() {
                        let n = starts[i..].iter().take_while(|&&u| u < t + 1_000).count();
                        prop_assert!(
                            n as f64 <= bound,
                            "{} starts in [{}, {}+1s), rate {}", n, t, t, r
                        );
                    }
                }
            }
        }
    }

    mod ramp_props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(200))]

            /// After an outage the ramp, whatever the endpoint answers: never above
            /// `rate_limit`, never up on a failure, down at once (× 0.8 at least) on the
            /// first failure of the slow start, and never more than doubling in a second.
            #[test]
            fn the_ramp_stays_under_the_rate_limit_and_backs_off_on_failure(
                before_per_s in 0u32..400,
                rate in prop::option::of(1.0f64..500.0),
                outcomes in prop::collection::vec(prop::bool::weighted(0.9), 1..1_500),
                gaps in prop::collection::vec(0u64..30, 1_500),
            ) {
                let mut p = Protection::new(
                    ProtectionConfig { rate_limit_per_s: rate, ..config() },
                    0,
                );
                fed(&mut p, 500, before_per_s, Outcome::Success);
                fed(&mut p, 1_100, 20, Outcome::Failure);
                prop_assert_eq!(p.state(), Open);
                p.try_acquire(6_100, false).unwrap();
                p.record(6_100, Outcome::Success);
                let start = p.pace_per_s().unwrap();
                let want = f64::from(before_per_s).max(PACE_START);
                prop_assert_eq!(start, rate.map_or(want, |r| want.min(r)));
                let mut t = 6_100;
                let mut second = (t / 1000, start);
                for (ok, gap) in outcomes.into_iter().zip(gaps) {
                    t += gap;
                    let Ok(()) = p.try_acquire(t, false) else { continue };
                    let before = p.pace_per_s();
                    let slow = p.slow_start;
                    let o = if ok { Outcome::Success } else { Outcome::Failure };
                    p.record(t, o);
                    let after = p.pace_per_s();
                    if let (Some(r), Some(a)) = (rate, after) {
                        prop_assert!(a <= r + 1e-9, "pace {} over the limit {}", a, r);
                    }
                    if let (Some(b), Some(a), false) = (before, after, ok) {
                        prop_assert!(a <= b + 1e-9, "a failure raised the pace {} → {}", b, a);
                        if slow {
                            prop_assert!(!p.slow_start);
                            prop_assert!(a <= (b * PACE_DECREASE).max(1.0) + 1e-9, "{} → {}", b, a);
                        }
                    }
                    if let Some(a) = after {
                        if t / 1000 != second.0 {
                            second = (t / 1000, a);
                        }
                        prop_assert!(
                            a <= 2.0 * second.1 + PACE_INCREASE + 1.0,
                            "more than doubled within a second: {} → {}", second.1, a
                        );
                    }
                }
            }
        }
    }

    /// The design note's storm, simulated deterministically in 10 ms steps, and the shorter
    /// outages of issue 15 (§3).
    mod storm {
        use super::*;
        use std::cmp::Reverse;
        use std::collections::{BTreeMap, BinaryHeap};

        const STEP_MS: u64 = 10;
        const CAPACITY_PER_S: f64 = 250.0;
        const RETRY_AFTER_MS: u64 = 1_000;
        const MAX_ATTEMPTS: u32 = 8;
        const END_MS: u64 = 1_200_000;

        /// One storm: messages per second, until when they arrive, and the outage.
        #[derive(Debug, Clone, Copy)]
        pub(super) struct Shape {
            pub rate_per_s: f64,
            pub publish_until_ms: u64,
            pub outage: (u64, u64),
        }

        /// The design note's: 200/s for 300 s, down from 60 s to 120 s.
        pub(super) const NOTE: Shape = Shape {
            rate_per_s: 200.0,
            publish_until_ms: 300_000,
            outage: (60_000, 120_000),
        };

        #[derive(Debug, Default)]
        pub(super) struct Figures {
            pub published: u64,
            pub calls: u64,
            pub published_in_outage: u64,
            pub outage_calls: u64,
            pub peak_after_recovery: u64,
            pub drained_after_ms: Option<u64>,
            /// The first time after recovery at which the capacity could have delivered the
            /// backlog at recovery and everything published since.
            pub bound_ms: Option<u64>,
            pub dead: u64,
            pub delivered: u64,
            pub opened: u64,
        }

        impl Figures {
            pub fn drain_over_bound(&self) -> f64 {
                match (self.drained_after_ms, self.bound_ms) {
                    (Some(d), Some(b)) => d as f64 / b.max(1) as f64,
                    _ => f64::MAX,
                }
            }
        }

        #[derive(Debug, Clone, Copy)]
        struct Msg {
            id: u64,
            attempts: u32,
        }

        /// Messages are taken as the server leases them: earliest due first (a fresh message
        /// is due when published, a retry when its delay ends), so both maps are keyed by
        /// (due time, id).
        pub(super) fn run(config: ProtectionConfig, shape: Shape) -> Figures {
            let (outage_start, outage_end) = shape.outage;
            let in_outage = |t: u64| (outage_start..outage_end).contains(&t);
            let mut p = Protection::new(config, 0);
            let mut f = Figures::default();
            let mut fresh: BTreeMap<(u64, u64), Msg> = BTreeMap::new();
            let mut retries: BTreeMap<(u64, u64), Msg> = BTreeMap::new();
            let mut scheduled: BinaryHeap<Reverse<(u64, u64, u32)>> = BinaryHeap::new();
            // The endpoint: a token bucket of 250/s holding a tenth of a second.
            let mut capacity = Bucket::new(CAPACITY_PER_S, 0);
            let mut per_second: Vec<u64> = vec![0; (END_MS / 1_000) as usize + 1];
            let per_step = shape.rate_per_s * STEP_MS as f64 / 1000.0;
            let drained_at = per_step.ceil() as usize;
            let mut due_arrivals = 0.0;
            let mut next_id = 0u64;
            let mut backlog_at_recovery = None;
            let mut published_since_recovery = 0u64;
            let mut now = 0u64;
            while now < END_MS {
                if now < shape.publish_until_ms {
                    due_arrivals += per_step;
                    while due_arrivals >= 1.0 - 1e-9 {
                        due_arrivals -= 1.0;
                        fresh.insert(
                            (now, next_id),
                            Msg {
                                id: next_id,
                                attempts: 0,
                            },
                        );
                        next_id += 1;
                        f.published += 1;
                        if in_outage(now) {
                            f.published_in_outage += 1;
                        }
                        if now >= outage_end {
                            published_since_recovery += 1;
                        }
                    }
                }
                while let Some(&Reverse((due, id, attempts))) = scheduled.peek() {
                    if due > now {
                        break;
                    }
                    scheduled.pop();
                    retries.insert((due, id), Msg { id, attempts });
                }
                capacity.refill(now);
                let mut retries_refused = false;
                loop {
                    let oldest_fresh = fresh.keys().next().copied();
                    let oldest_retry = if retries_refused {
                        None
                    } else {
                        retries.keys().next().copied()
                    };
                    let (key, is_retry) = match (oldest_fresh, oldest_retry) {
                        (None, None) => break,
                        (Some(a), Some(b)) if b < a => (b, true),
                        (Some(a), _) => (a, false),
                        (None, Some(b)) => (b, true),
                    };
                    match p.try_acquire(now, is_retry) {
                        Ok(()) => {}
                        Err(w) if w.reason == WaitReason::Budget => {
                            retries_refused = true;
                            continue;
                        }
                        Err(_) => break,
                    }
                    let msg = if is_retry {
                        retries.remove(&key)
                    } else {
                        fresh.remove(&key)
                    };
                    let Some(mut msg) = msg else {
                        unreachable!("the id was a key")
                    };
                    f.calls += 1;
                    per_second[(now / 1_000) as usize] += 1;
                    if in_outage(now) {
                        f.outage_calls += 1;
                    }
                    let up = !in_outage(now) && capacity.ready().is_ok();
                    if up {
                        capacity.take();
                        p.record(now, Outcome::Success);
                        f.delivered += 1;
                    } else {
                        p.record(now, Outcome::Failure);
                        msg.attempts += 1;
                        if msg.attempts >= MAX_ATTEMPTS {
                            f.dead += 1;
                        } else {
                            scheduled.push(Reverse((now + RETRY_AFTER_MS, msg.id, msg.attempts)));
                        }
                    }
                }
                now += STEP_MS;
                let backlog = fresh.len() + retries.len() + scheduled.len();
                if now == outage_end {
                    backlog_at_recovery = Some(backlog as u64);
                }
                if let (Some(b), None) = (backlog_at_recovery, f.bound_ms) {
                    let t = now - outage_end;
                    if CAPACITY_PER_S * t as f64 / 1000.0 >= (b + published_since_recovery) as f64 {
                        f.bound_ms = Some(t);
                    }
                }
                if now > outage_end && f.drained_after_ms.is_none() && backlog <= drained_at {
                    f.drained_after_ms = Some(now - outage_end);
                }
                if now >= shape.publish_until_ms && backlog == 0 {
                    break;
                }
            }
            f.peak_after_recovery = per_second[(outage_end / 1_000) as usize..]
                .iter()
                .copied()
                .max()
                .unwrap_or(0);
            f.opened = p.snapshot(now).opened_total;
            f
        }

        fn show(name: &str, f: &Figures) {
            let secs = |ms: Option<u64>| {
                ms.map_or("never".to_owned(), |ms| {
                    format!("{:.1} s", ms as f64 / 1000.0)
                })
            };
            println!(
                "{name}: {} published, {} calls ({:.3} per message); \
                 outage: {} published, {} calls ({:.2} %); \
                 peak after recovery {} calls/s ({:.2} × capacity); \
                 drained {} after the outage (bound {}: {:.2}×); {} dead, {} delivered, opened {} times",
                f.published,
                f.calls,
                f.calls as f64 / f.published as f64,
                f.published_in_outage,
                f.outage_calls,
                100.0 * f.outage_calls as f64 / f.published_in_outage.max(1) as f64,
                f.peak_after_recovery,
                f.peak_after_recovery as f64 / CAPACITY_PER_S,
                secs(f.drained_after_ms),
                secs(f.bound_ms),
                f.drain_over_bound(),
                f.dead,
                f.delivered,
                f.opened,
            );
        }

        fn on() -> ProtectionConfig {
            ProtectionConfig {
                concurrency: 1_000,
                ..ProtectionConfig::default()
            }
        }

        #[test]
        fn the_storm_is_contained() {
            let off = run(
                ProtectionConfig {
                    concurrency: 1_000,
                    rate_limit_per_s: None,
                    breaker: None,
                    retry_budget: 0.0,
                },
                NOTE,
            );
            show("protection off", &off);
            let on = run(on(), NOTE);
            show("protection on ", &on);
            assert_eq!(on.published, 60_000);
            assert!(
                on.outage_calls as f64 <= 0.02 * on.published_in_outage as f64,
                "{on:?}"
            );
            assert!(
                on.peak_after_recovery as f64 <= 1.5 * CAPACITY_PER_S,
                "{on:?}"
            );
            assert_eq!(on.dead, 0, "{on:?}");
            assert!(on.drain_over_bound() <= 1.3, "{on:?}");
            assert_eq!(on.delivered, on.published);
            assert!(off.outage_calls > 10 * on.outage_calls);
        }

        /// Issue 15 §3: a short outage drained in 1.66× (15 s) and 1.75× (30 s) the bound,
        /// the ramp from 5/s (+10/s per second) dominating; SPEC §10 asks ≤ 1.3× for 15 s,
        /// 30 s and 60 s outages, the other storm targets kept.
        #[test]
        fn short_outages_drain_within_1_3_times_the_bound() {
            for rate_per_s in [100.0, 200.0] {
                for outage_s in [15, 30, 60] {
                    let start = 30_000;
                    let shape = Shape {
                        rate_per_s,
                        publish_until_ms: start + outage_s * 1_000 + 120_000,
                        outage: (start, start + outage_s * 1_000),
                    };
                    let on = run(on(), shape);
                    show(&format!("{rate_per_s}/s, {outage_s} s outage"), &on);
                    let ratio = on.drain_over_bound();
                    assert!(
                        ratio <= 1.3,
                        "{rate_per_s}/s, {outage_s} s: {ratio:.2}× {on:?}"
                    );
                    assert_eq!(on.dead, 0, "{on:?}");
                    assert_eq!(on.delivered, on.published, "{on:?}");
                    assert!(
                        on.calls as f64 <= 1.05 * on.published as f64,
                        "calls per message {on:?}"
                    );
                    assert!(
                        on.peak_after_recovery as f64 <= 1.5 * CAPACITY_PER_S,
                        "{on:?}"
                    );
                    assert!(
                        on.outage_calls as f64 <= 0.02 * on.published_in_outage as f64,
                        "{on:?}"
                    );
                }
            }
        }
    }
}
