//! Long-polling consumers wait here for their queue to get ready messages.
//!
//! One [`Notify`] per queue. A consumer *enables* its notification before it
//! asks the store for messages, so a publish that commits between the empty
//! answer and the wait still wakes it (no lost wake-up). Entries are never
//! removed: there is one small `Notify` per queue name ever polled.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

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

    /// Wake every consumer waiting on `queue`.
    pub fn wake(&self, queue: &str) {
        let n = self
            .queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(queue)
            .cloned();
        if let Some(n) = n {
            n.notify_waiters();
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
