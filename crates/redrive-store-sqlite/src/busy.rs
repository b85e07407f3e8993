//! Busy handlers: how a connection waits for a lock another connection holds.
//!
//! SQLite's own `busy_timeout` sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100 ms
//! between tries: a writer that finds the log held by a checkpoint for 2 ms sleeps 3 ms, one
//! held for 9 ms sleeps 18. Under load every request queued behind the writer waits as long
//! (measured: the delayed-delivery benchmark's lateness p99 was set by these sleeps around
//! the WAL rewinds). These handlers try again every [`STEP`] until their limit.

use std::time::Duration;

/// Time between two tries.
const STEP: Duration = Duration::from_micros(100);

/// Tries in `limit` (the handler is called with the number of tries so far).
const fn tries(limit: Duration) -> i32 {
    (limit.as_micros() / STEP.as_micros()) as i32
}

fn wait(tries_so_far: i32, limit: i32) -> bool {
    if tries_so_far >= limit {
        return false;
    }
    std::thread::sleep(STEP);
    true
}

/// Every connection's default: give up after 5 s.
pub fn wait_5s(n: i32) -> bool {
    wait(n, tries(Duration::from_secs(5)))
}

/// The writer's rewind of the log waits this long for readers (`group_commit::bound_log`).
pub fn wait_50ms(n: i32) -> bool {
    wait(n, tries(Duration::from_millis(50)))
}

/// The checkpointer waits this long for the writer or readers.
pub fn wait_100ms(n: i32) -> bool {
    wait(n, tries(Duration::from_millis(100)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_count_tries_of_one_step() {
        assert_eq!(tries(Duration::from_secs(5)), 50_000);
        assert!(!wait(500, tries(Duration::from_millis(50))));
        assert!(wait_50ms(0), "the first try waits and asks for another");
    }
}
