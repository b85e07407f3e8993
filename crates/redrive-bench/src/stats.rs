//! Samples and percentiles for the bench.
//!
//! Every task records into its own [`Samples`] (no locks on the hot path); the
//! runner merges them when the tasks end and sorts once. Values are `i64`
//! microseconds so that a lateness can be negative (a delivery before its due
//! time would be a bug worth seeing, not a value to clamp away).

use serde::Serialize;

/// Recorded values (µs), unsorted until [`Samples::summary`].
#[derive(Debug, Clone, Default)]
pub struct Samples {
    values: Vec<i64>,
}

/// Percentiles of a set of samples, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    /// Number of samples.
    pub count: u64,
    /// Smallest.
    pub min_ms: f64,
    /// Arithmetic mean.
    pub mean_ms: f64,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

impl Samples {
    /// No samples.
    pub fn new() -> Self {
        Self::default()
    }

    /// Record one value in microseconds.
    pub fn push_us(&mut self, us: i64) {
        self.values.push(us);
    }

    /// Record the time elapsed since `start`.
    pub fn push_since(&mut self, start: std::time::Instant) {
        self.push_us(start.elapsed().as_micros().min(i64::MAX as u128) as i64);
    }

    /// Add another task's samples.
    pub fn merge(&mut self, other: Samples) {
        if self.values.is_empty() {
            self.values = other.values;
        } else {
            self.values.extend(other.values);
        }
    }

    /// Percentiles (nearest-rank), or `None` without samples.
    pub fn summary(&mut self) -> Option<Summary> {
        if self.values.is_empty() {
            return None;
        }
        self.values.sort_unstable();
        let v = &self.values;
        let ms = |us: i64| us as f64 / 1000.0;
        let sum: i128 = v.iter().map(|&x| x as i128).sum();
        Some(Summary {
            count: v.len() as u64,
            min_ms: ms(v[0]),
            mean_ms: (sum as f64 / v.len() as f64) / 1000.0,
            p50_ms: ms(percentile(v, 50.0)),
            p90_ms: ms(percentile(v, 90.0)),
            p99_ms: ms(percentile(v, 99.0)),
            p999_ms: ms(percentile(v, 99.9)),
            max_ms: ms(v[v.len() - 1]),
        })
    }
}

/// Nearest-rank percentile of sorted, non-empty `v`: the smallest value such that
/// at least `p` % of the values are ≤ it.
pub fn percentile(v: &[i64], p: f64) -> i64 {
    debug_assert!(!v.is_empty());
    let n = v.len();
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    v[rank.clamp(1, n) - 1]
}

impl Summary {
    /// `p50 1.23 ms, p90 …, p99 …, max …` for the terminal.
    pub fn line(&self) -> String {
        format!(
            "p50 {} ms, p90 {} ms, p99 {} ms, p99.9 {} ms, max {} ms (n = {})",
            fmt_ms(self.p50_ms),
            fmt_ms(self.p90_ms),
            fmt_ms(self.p99_ms),
            fmt_ms(self.p999_ms),
            fmt_ms(self.max_ms),
            self.count
        )
    }
}

/// Milliseconds with precision that suits their size.
pub fn fmt_ms(ms: f64) -> String {
    if ms.abs() >= 100.0 {
        format!("{ms:.0}")
    } else if ms.abs() >= 10.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<i64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 90.0), 90);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&v, 99.9), 100);
        assert_eq!(percentile(&v, 100.0), 100);
        assert_eq!(percentile(&v, 0.0), 1);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[1, 2], 50.0), 1);
    }

    #[test]
    fn summary_in_ms() {
        let mut s = Samples::new();
        for us in [3_000, 1_000, 2_000, -500] {
            s.push_us(us);
        }
        let mut other = Samples::new();
        other.push_us(10_000);
        s.merge(other);
        let sum = s.summary().unwrap();
        assert_eq!(sum.count, 5);
        assert_eq!(sum.min_ms, -0.5);
        assert_eq!(sum.p50_ms, 2.0);
        assert_eq!(sum.max_ms, 10.0);
        assert!((sum.mean_ms - 3.1).abs() < 1e-9);
        assert!(Samples::new().summary().is_none());
    }

    #[test]
    fn ms_formatting() {
        assert_eq!(fmt_ms(0.123), "0.12");
        assert_eq!(fmt_ms(12.34), "12.3");
        assert_eq!(fmt_ms(1234.5), "1234");
    }
}
