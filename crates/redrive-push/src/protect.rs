//! TEMPORARY scaffold with the agreed API, replaced by the real module from branch `protect`.
#![allow(missing_docs, dead_code)]

#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    pub window_ms: u64,
    pub min_calls: u32,
    pub failure_ratio: f64,
    pub open_ms: u64,
    pub trickle_calls: u32,
}
impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            window_ms: 5000,
            min_calls: 20,
            failure_ratio: 0.5,
            open_ms: 5000,
            trickle_calls: 20,
        }
    }
}
#[derive(Debug, Clone, PartialEq)]
pub struct ProtectionConfig {
    pub concurrency: u32,
    pub rate_limit_per_s: Option<f64>,
    pub breaker: Option<BreakerConfig>,
    pub retry_budget: f64,
}
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
    Recovering,
}
impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
            Self::Recovering => "recovering",
        }
    }
}
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
}
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitReason {
    Breaker,
    Concurrency,
    Rate,
    Budget,
}
impl WaitReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Breaker => "breaker",
            Self::Concurrency => "concurrency",
            Self::Rate => "rate",
            Self::Budget => "budget",
        }
    }
}
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    pub until_ms: u64,
    pub reason: WaitReason,
}
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub state: BreakerState,
    pub state_since_ms: u64,
    pub in_flight: u32,
    pub concurrency: u32,
    pub rate_limit_per_s: Option<f64>,
    pub pace_per_s: Option<f64>,
    pub window_calls: u32,
    pub window_failures: u32,
    pub calls_per_s: f64,
    pub budget_ratio: f64,
    pub budget_first_attempts: u64,
    pub budget_retries: u64,
    pub budget_available: u64,
    pub opened_total: u64,
}
#[derive(Debug)]
pub struct Protection {
    config: ProtectionConfig,
    in_flight: u32,
}
impl Protection {
    pub fn new(config: ProtectionConfig, _now_ms: u64) -> Self {
        Self {
            config,
            in_flight: 0,
        }
    }
    pub fn try_acquire(&mut self, now_ms: u64, _is_retry: bool) -> Result<(), Wait> {
        self.admissible(now_ms)?;
        self.in_flight += 1;
        Ok(())
    }
    pub fn admissible(&mut self, now_ms: u64) -> Result<(), Wait> {
        if self.in_flight >= self.config.concurrency {
            return Err(Wait {
                until_ms: now_ms + 5,
                reason: WaitReason::Concurrency,
            });
        }
        Ok(())
    }
    pub fn cancel(&mut self, _now_ms: u64) {
        self.in_flight -= 1;
    }
    pub fn record(&mut self, _now_ms: u64, _outcome: Outcome) {
        self.in_flight -= 1;
    }
    pub fn state(&self) -> BreakerState {
        BreakerState::Closed
    }
    pub fn snapshot(&self, _now_ms: u64) -> Snapshot {
        Snapshot {
            state: BreakerState::Closed,
            state_since_ms: 0,
            in_flight: self.in_flight,
            concurrency: self.config.concurrency,
            rate_limit_per_s: self.config.rate_limit_per_s,
            pace_per_s: None,
            window_calls: 0,
            window_failures: 0,
            calls_per_s: 0.0,
            budget_ratio: self.config.retry_budget,
            budget_first_attempts: 0,
            budget_retries: 0,
            budget_available: 0,
            opened_total: 0,
        }
    }
}
