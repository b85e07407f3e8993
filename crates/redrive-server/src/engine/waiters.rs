//! Long-polling consumers wait here for their queue to get ready messages.
//!
//! One [`Notify`] per queue. A write that makes `n` messages ready wakes at most
//! `n` waiting consumers (capped at [`MAX_WAKE`]), not all of them: waking every
//! idle consumer for one message would send a burst of empty lease requests to
//! the single writer (a thundering herd). A consumer that leases a full batch
//! wakes one more, so a backlog still drains in parallel. A notification taken
//! by a consumer that then returns without waiting is passed on by tokio. A consumer *enables* its notification before it
//! asks the store for messages, so a publish that commits between the empty
//! answer and the wait still wakes it (no lost wake-up). Entries are never
//! removed: there is one small `Notify` per queue name ever polled.

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

impl Waiters {
    /// The wake-up point of `queue`.
    pub fn of(&self, queue: &str) -> Arc<Notify> {
        let mut q = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = q.get(queue) {
            return n.clone();
        }
        let n = Arc::new(Notify::new());
        q.insert(queue.to_owned(), n.clone());
        n
    }

    /// Wake up to `n` consumers waiting on `queue` (at most [`MAX_WAKE`]).
    pub fn wake(&self, queue: &str, n: usize) {
        let notify = self
            .queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(queue)
            .cloned();
        let count = n.min(MAX_WAKE);
        if let Some(notify) = notify {
            for _ in 0..count {
                notify.notify_one();
            }
        }
    }

    /// Wake every waiting consumer (shutdown).
    pub fn wake_all(&self) {
        let all: Vec<Arc<Notify>> = self
            .queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        for n in all {
            n.notify_waiters();
        }
    }
}
