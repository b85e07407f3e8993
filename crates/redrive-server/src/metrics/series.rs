//! Per-minute counts for the console's charts (SPEC §12: "retry / dead / done rates over
//! time"): published, retried, dead and done per minute, per queue and in total, over the
//! last day.
//!
//! In memory only: the series start empty when the process starts (the overview says
//! so); Prometheus keeps the long history. Each queue gets a ring of [`MINUTES`] slots the
//! first time it counts something (about 29 KiB), up to [`MAX_QUEUES`] queues; the
//! queues after that are counted together under [`OTHER`], so memory stays bounded
//! whatever names clients publish to. The hot path (one call per publish batch, ack,
//! failed attempt, dead letter) takes one mutex for a few nanoseconds: a hash lookup
//! with the borrowed name (no allocation once the queue is known) and two additions.
//! The minute is passed in, so tests choose it.

use std::collections::HashMap;
use std::sync::Mutex;

/// Minutes kept: one day.
pub const MINUTES: usize = 1_440;
/// Queues with their own series; the rest are counted under [`OTHER`].
pub const MAX_QUEUES: usize = 200;
/// The name of the series that counts the queues past [`MAX_QUEUES`].
pub const OTHER: &str = "(other queues)";

/// What a series counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Messages published.
    Published = 0,
    /// Retries scheduled (failed attempts that will be tried again).
    Retried = 1,
    /// Messages that became dead.
    Dead = 2,
    /// Messages acked (done).
    Done = 3,
}

impl Kind {
    /// Every kind, in the order the charts draw them.
    pub const ALL: [Kind; 4] = [Kind::Published, Kind::Retried, Kind::Dead, Kind::Done];

    /// Its name in the legend.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Published => "published",
            Kind::Retried => "retried",
            Kind::Dead => "dead",
            Kind::Done => "done",
        }
    }
}

/// One minute's counts; `minute` says which minute the slot holds now (a slot is reused
/// every [`MINUTES`] minutes, and a slot holding an older minute reads as zero).
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    minute: u32,
    counts: [u32; 4],
}

#[derive(Debug)]
struct Ring(Box<[Slot]>);

impl Ring {
    fn new() -> Self {
        Ring(vec![Slot::default(); MINUTES].into_boxed_slice())
    }

    fn add(&mut self, minute: u32, kind: Kind, n: u32) {
        let slot = &mut self.0[minute as usize % MINUTES];
        if slot.minute != minute {
            *slot = Slot {
                minute,
                counts: [0; 4],
            };
        }
        slot.counts[kind as usize] = slot.counts[kind as usize].saturating_add(n);
    }

    fn get(&self, minute: u32) -> [u32; 4] {
        let slot = &self.0[minute as usize % MINUTES];
        if slot.minute == minute {
            slot.counts
        } else {
            [0; 4]
        }
    }
}

#[derive(Debug)]
struct Inner {
    total: Ring,
    queues: HashMap<String, Ring>,
}

/// The per-minute series of every queue and their total.
#[derive(Debug)]
pub struct Series {
    inner: Mutex<Inner>,
}

impl Default for Series {
    fn default() -> Self {
        Self::new()
    }
}

/// The counts of one series over a window, oldest minute first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// The first minute (minutes since the Unix epoch).
    pub first_minute: u32,
    /// One vector per [`Kind`], in [`Kind::ALL`] order, one entry per minute.
    pub counts: [Vec<u64>; 4],
}

impl Series {
    /// Empty series.
    pub fn new() -> Self {
        Series {
            inner: Mutex::new(Inner {
                total: Ring::new(),
                queues: HashMap::new(),
            }),
        }
    }

    /// Count `n` events of `kind` in `queue` during `minute` (minutes since the epoch).
    pub fn add(&self, queue: &str, kind: Kind, n: u64, minute: u32) {
        let n = n.min(u32::MAX as u64) as u32;
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.total.add(minute, kind, n);
        if let Some(r) = g.queues.get_mut(queue) {
            r.add(minute, kind, n);
            return;
        }
        let name = if g.queues.len() < MAX_QUEUES {
            queue
        } else {
            OTHER
        };
        g.queues
            .entry(name.to_owned())
            .or_insert_with(Ring::new)
            .add(minute, kind, n);
    }

    /// The last `minutes` minutes up to and including `now_minute`, of `queue` (a queue
    /// past [`MAX_QUEUES`] reads as zeros: see [`OTHER`]) or of every queue (`None`).
    pub fn window(&self, queue: Option<&str>, now_minute: u32, minutes: usize) -> Window {
        let minutes = minutes.clamp(1, MINUTES);
        let first = now_minute.saturating_sub(minutes as u32 - 1);
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let ring = match queue {
            None => Some(&g.total),
            Some(q) => g.queues.get(q),
        };
        let mut counts: [Vec<u64>; 4] = Default::default();
        for m in first..=now_minute {
            let c = ring.map_or([0; 4], |r| r.get(m));
            for (i, v) in c.iter().enumerate() {
                counts[i].push(*v as u64);
            }
        }
        Window {
            first_minute: first,
            counts,
        }
    }
}

/// Minutes since the Unix epoch of `ms` (milliseconds since the epoch).
pub fn minute_of(ms: i64) -> u32 {
    (ms.max(0) / 60_000).min(u32::MAX as i64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_land_in_their_minute_and_old_slots_read_zero() {
        let s = Series::new();
        s.add("a", Kind::Published, 3, 100);
        s.add("a", Kind::Dead, 1, 101);
        s.add("b", Kind::Published, 2, 101);
        let w = s.window(Some("a"), 101, 3);
        assert_eq!(w.first_minute, 99);
        assert_eq!(w.counts[Kind::Published as usize], vec![0, 3, 0]);
        assert_eq!(w.counts[Kind::Dead as usize], vec![0, 0, 1]);
        let t = s.window(None, 101, 2);
        assert_eq!(t.counts[Kind::Published as usize], vec![3, 2]);
        // A day later the slot of minute 100 is reused: minute 100 + MINUTES reads fresh.
        let later = 100 + MINUTES as u32;
        s.add("a", Kind::Done, 5, later);
        let w = s.window(Some("a"), later, 1);
        assert_eq!(w.counts[Kind::Published as usize], vec![0]);
        assert_eq!(w.counts[Kind::Done as usize], vec![5]);
    }

    #[test]
    fn queues_past_the_bound_are_counted_together() {
        let s = Series::new();
        for i in 0..MAX_QUEUES + 10 {
            s.add(&format!("q{i}"), Kind::Published, 1, 7);
        }
        assert_eq!(s.window(Some(OTHER), 7, 1).counts[0], vec![10]);
        assert_eq!(s.window(Some("q0"), 7, 1).counts[0], vec![1]);
        assert_eq!(
            s.window(None, 7, 1).counts[0],
            vec![(MAX_QUEUES + 10) as u64]
        );
    }
}
