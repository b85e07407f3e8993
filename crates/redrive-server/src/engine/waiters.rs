//! Long-polling consumers wait here for their queue to get ready messages.
//!
//! One [`Notify`] per queue. A write that makes `n` messages ready wakes at most
//! `n` waiting consumers (capped at [`MAX_WAKE`]), not all of them: waking every
//! idle consumer for one message would send a burst of empty lease requests to
//! the single writer (a thundering herd). A consumer that leases a full batch
//! wakes one more, so a backlog still drains in parallel. A notification taken
//! by a consumer that then returns without waiting is passed on by tokio. A consumer *enables* its notification before it
//! asks the store for messages, so a publish that commits between the empty
//! answer and the wait still wakes it (no lost wake-up). An entry lives while
//! some consumer holds it ([`Waiter`]): the last one to leave removes it, so
//! lease requests on ever new queue names cost no memory once they returned.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Most consumers one write wakes on one queue.
pub const MAX_WAKE: usize = 16;

/// The per-queue wake-up points.
#[derive(Debug, Default)]
pub struct Waiters {
    queues: Mutex<HashMap<String, Arc<Notify>>>,
}

/// A consumer's hold on the wake-up point of its queue; the entry is removed when the last
/// holder drops it.
#[derive(Debug)]
pub struct Waiter<'a> {
    waiters: &'a Waiters,
    queue: &'a str,
    notify: Arc<Notify>,
}

impl std::ops::Deref for Waiter<'_> {
    type Target = Notify;
    fn deref(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut q = self.waiters.lock();
        // Under the lock nobody can take a new hold, so "the map's and ours" means no other
        // consumer holds it: nobody can be waiting on it, and nobody will.
        if Arc::strong_count(&self.notify) == 2 {
            q.remove(self.queue);
        }
    }
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Notify>>> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hold the wake-up point of `queue` (created if nobody holds it).
    pub fn of<'a>(&'a self, queue: &'a str) -> Waiter<'a> {
        let notify = self
            .lock()
            .entry(queue.to_owned())
            .or_insert_with(|| Arc::new(Notify::new()))
            .clone();
        Waiter {
            waiters: self,
            queue,
            notify,
        }
    }

    /// Queues with a wake-up point now (some consumer holds it).
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.lock().len()
    }

    /// Wake up to `n` consumers waiting on `queue` (at most [`MAX_WAKE`]).
    pub fn wake(&self, queue: &str, n: usize) {
        let notify = self.lock().get(queue).cloned();
        let count = n.min(MAX_WAKE);
        if let Some(notify) = notify {
            for _ in 0..count {
                notify.notify_one();
            }
        }
    }

    /// Wake every waiting consumer (shutdown).
    pub fn wake_all(&self) {
        let all: Vec<Arc<Notify>> = self.lock().values().cloned().collect();
        for n in all {
            n.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_requests_on_many_queue_names_leave_no_entries() {
        let w = Waiters::default();
        for i in 0..60_000 {
            let name = format!("q-{i}");
            let _held = w.of(&name);
        }
        assert_eq!(w.held(), 0);
    }

    #[test]
    fn an_entry_lives_while_any_consumer_holds_it() {
        let w = Waiters::default();
        let a = w.of("q");
        let b = w.of("q");
        assert!(
            Arc::ptr_eq(&a.notify, &b.notify),
            "one wake-up point per queue"
        );
        drop(a);
        assert_eq!(w.held(), 1, "b still waits on it");
        drop(b);
        assert_eq!(w.held(), 0);
    }
}
