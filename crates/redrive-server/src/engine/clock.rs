//! The engine's clock, injected so that tests drive time instead of sleeping.
//!
//! Every timestamp the engine hands the store (`now` of a publish, a lease, a tick …) and
//! every wait of the scheduler comes from a [`Clock`]; with the system clock the engine
//! hands the store no time at all ([`Clock::for_store`]), so a store with a clock of its
//! own (a database) uses that. Production uses [`SystemClock`];
//! tests use [`ManualClock`], which stands still until the test moves it, and wakes the
//! scheduler when it does. Long-poll deadlines (`wait`) are request timeouts, not message
//! times: they stay on tokio's timer (which `tokio::time::pause` controls).

use redrive_core::Timestamp;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

/// A future returned by [`Clock::sleep_until`].
pub type Sleep<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Where the engine reads the time.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// The time now.
    fn now(&self) -> Timestamp;

    /// Resolves once [`Clock::now`] has reached `at` (or later).
    fn sleep_until(&self, at: Timestamp) -> Sleep<'_>;

    /// The `now` to hand the store's transitions: `None`, the store's own clock (the
    /// database's on a shared store, so that every node of a cluster agrees, SPEC §13),
    /// unless this clock is one a test drives, whose reading the store must use.
    fn for_store(&self) -> Option<Timestamp> {
        Some(self.now())
    }

    /// A heartbeat sent at `sent` and answered at `received` (this machine's clock, not
    /// corrected) found the store's clock at `store_at`: a clock that follows the store's
    /// corrects itself by the difference. The default ignores it.
    fn observe_store(&self, store_at: Timestamp, sent: Timestamp, received: Timestamp) {
        let _ = (store_at, sent, received);
    }
}

/// The system's wall clock, following the store's: on a store with a clock of its own (a
/// database shared by a cluster) each heartbeat tells the engine how far this machine's
/// clock is from the store's ([`Clock::observe_store`]), and every reading is corrected by
/// that, so that a time the engine computes itself (a publish's `delay`, a release's, a
/// search's `since=12h`, the scheduler's sleep until a due time the store gave) means the
/// same on every node even when this machine's clock is minutes off. On the embedded store
/// the two clocks are one and the correction stays 0.
#[derive(Debug, Default)]
pub struct SystemClock {
    /// The store's clock minus this machine's, ms (as last measured).
    offset_ms: AtomicI64,
    /// The measurement the offset was last taken from.
    taken_from: std::sync::Mutex<Option<Measurement>>,
}

/// A measurement of the store's clock: its round trip, and when it was received (this
/// machine's clock, ms).
#[derive(Debug, Clone, Copy)]
struct Measurement {
    round_trip_ms: i64,
    received_ms: i64,
}

/// A measured offset that moved by less than this is not applied (a beat's round trip
/// makes each measurement a little different; the clock should not jitter with them).
const OFFSET_HYSTERESIS_MS: i64 = 2;
/// Measurements whose round trip took longer than this are too imprecise to use.
const OFFSET_MAX_ROUND_TRIP_MS: i64 = 200;
/// A measurement is taken as the store's offset only if its round trip was no longer than
/// the one the offset came from, unless that one is older than this: a measurement is off
/// by up to half its round trip (the beat reads the store's clock early in its
/// transaction, not at the middle), and under load the round trips grow, so the quickest
/// recent one is the truest (NTP's filter, in small).
const OFFSET_KEPT_MS: i64 = 60_000;

impl SystemClock {
    /// The store's clock minus this machine's, ms, as last measured (0 before a measure).
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(Timestamp::now().as_millis() + self.offset_ms())
    }

    fn for_store(&self) -> Option<Timestamp> {
        None
    }

    fn sleep_until(&self, at: Timestamp) -> Sleep<'_> {
        let wait = at.millis_since(self.now()).max(0) as u64;
        Box::pin(tokio::time::sleep(Duration::from_millis(wait)))
    }

    fn observe_store(&self, store_at: Timestamp, sent: Timestamp, received: Timestamp) {
        let round_trip = received.millis_since(sent);
        if !(0..=OFFSET_MAX_ROUND_TRIP_MS).contains(&round_trip) {
            return;
        }
        {
            let mut taken = self.taken_from.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(t) = *taken {
                let fresh = received.as_millis().saturating_sub(t.received_ms) < OFFSET_KEPT_MS;
                if fresh && t.round_trip_ms < round_trip {
                    return;
                }
            }
            *taken = Some(Measurement {
                round_trip_ms: round_trip,
                received_ms: received.as_millis(),
            });
        }
        let local = sent.as_millis() + round_trip / 2;
        let offset = store_at.as_millis() - local;
        let before = self.offset_ms();
        if (offset - before).abs() >= OFFSET_HYSTERESIS_MS {
            self.offset_ms.store(offset, Ordering::Relaxed);
            if (offset - before).abs() >= 1_000 {
                tracing::warn!(
                    offset_ms = offset,
                    "this machine's clock differs from the store's by a second or more; \
                     redrive follows the store's clock (check NTP on this machine)"
                );
            }
        }
    }
}

/// A clock that moves only when told to ([`ManualClock::advance`], [`ManualClock::set`]).
#[derive(Debug)]
pub struct ManualClock {
    now_ms: AtomicI64,
    moved: Notify,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self {
            now_ms: AtomicI64::new(start.as_millis()),
            moved: Notify::new(),
        }
    }

    /// Move the clock forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.now_ms
            .fetch_add(ms.min(i64::MAX as u64) as i64, Ordering::SeqCst);
        self.moved.notify_waiters();
    }

    /// Set the clock to `at` (never backwards: an earlier `at` is ignored).
    pub fn set(&self, at: Timestamp) {
        self.now_ms.fetch_max(at.as_millis(), Ordering::SeqCst);
        self.moved.notify_waiters();
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.now_ms.load(Ordering::SeqCst))
    }

    fn sleep_until(&self, at: Timestamp) -> Sleep<'_> {
        Box::pin(async move {
            loop {
                let moved = self.moved.notified();
                tokio::pin!(moved);
                moved.as_mut().enable();
                if self.now() >= at {
                    return;
                }
                moved.await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn manual_clock_sleep_ends_when_the_clock_reaches_the_time() {
        let clock = std::sync::Arc::new(ManualClock::new(Timestamp::from_millis(1_000)));
        let sleeper = {
            let clock = clock.clone();
            tokio::spawn(async move { clock.sleep_until(Timestamp::from_millis(1_500)).await })
        };
        tokio::task::yield_now().await;
        clock.advance(499);
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished(), "woke before its time");
        clock.advance(1);
        sleeper.await.unwrap();
        assert_eq!(clock.now(), Timestamp::from_millis(1_500));
        clock.set(Timestamp::from_millis(10)); // never backwards
        assert_eq!(clock.now(), Timestamp::from_millis(1_500));
    }

    fn t(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    /// The offset comes from the quickest recent round trip: a slower measurement does not
    /// move it (however far off it says the store is) until the quick one is a minute old;
    /// a measurement as quick or quicker always does.
    #[test]
    fn the_offset_follows_the_quickest_recent_round_trip() {
        let c = SystemClock::default();
        // Store 30 ms ahead, measured with a 4 ms round trip.
        c.observe_store(t(1_032), t(1_000), t(1_004));
        assert_eq!(c.offset_ms(), 30);
        // A 90 ms round trip under load says 10 ms behind: not taken.
        c.observe_store(t(2_000), t(1_965), t(2_055));
        assert_eq!(c.offset_ms(), 30);
        // As quick (4 ms) and 40 ms ahead: taken.
        c.observe_store(t(3_042), t(3_000), t(3_004));
        assert_eq!(c.offset_ms(), 40);
        // A minute after the quick one, a slow one is taken: the clocks may have moved.
        c.observe_store(t(63_125), t(63_040), t(63_090));
        assert_eq!(c.offset_ms(), 60);
        // Beyond the bound on round trips, nothing is taken at all.
        c.observe_store(t(70_000), t(69_000), t(69_500));
        assert_eq!(c.offset_ms(), 60);
    }
}
