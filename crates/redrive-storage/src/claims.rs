//! Claims of a shared-database backend, gated and combined per queue.
//!
//! Concurrent claims of one queue all start at the head of its ready set and walk past each
//! other's locked rows (`SKIP LOCKED` skips them, but still visits them), so a node runs
//! at most [`CLAIMS_PER_QUEUE`] claims of a queue at once. The leases that wait for a turn
//! are not run one after another: the claim that gets the turn takes the rows of every
//! lease of that queue waiting with the same lease length (at most [`MAX_COMBINED`] rows in
//! all) in one statement, and hands each its share in claim order, so eight consumers
//! leasing ten each cost one claim of eighty instead of eight claims queued behind each
//! other. A lease with a byte bound (`max_bytes`) is claimed alone.
//!
//! Each waiting lease keeps its own answer channel; a lease whose caller went away before
//! its turn is left out. One whose caller goes away after the claim took its rows leaves
//! them leased to nobody until the lease expires (as a caller that goes away during its own
//! claim would): the messages come back then, an attempt later.

use crate::{LeaseRequest, Leased, StoreError};
use redrive_core::Timestamp;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{oneshot, Semaphore};

/// Claims of one queue that one node runs at once. Measured on PostgreSQL
/// (docs/PERFORMANCE.md): one at a time was best at 16 × 100 and worst at 8 × 10 (a lease
/// is a round trip, and one at a time they queued); two were a balance.
pub const CLAIMS_PER_QUEUE: usize = 2;

/// At most this many rows in one combined claim.
pub const MAX_COMBINED: u32 = 1_000;

type Answer = Result<Vec<Leased>, StoreError>;

/// A lease waiting for its queue's turn.
struct Waiter {
    id: u64,
    max: u32,
    lease_ms: u64,
    now: Option<Timestamp>,
    reply: oneshot::Sender<Answer>,
}

/// One queue's gate and waiting leases.
struct Queue {
    gate: Semaphore,
    waiting: Mutex<Vec<Waiter>>,
}

impl Queue {
    fn is_waiting(&self, id: u64) -> bool {
        let waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        waiting.iter().any(|w| w.id == id)
    }
}

/// The per-queue gates and waiting leases of a store (see the module docs).
#[derive(Default)]
pub struct Claims {
    queues: Mutex<HashMap<String, Arc<Queue>>>,
    next_id: AtomicU64,
}

impl Claims {
    fn queue(&self, name: &str) -> Arc<Queue> {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues
            .entry(name.to_owned())
            .or_insert_with(|| {
                Arc::new(Queue {
                    gate: Semaphore::new(CLAIMS_PER_QUEUE),
                    waiting: Mutex::new(Vec::new()),
                })
            })
            .clone()
    }

    /// Lease `req` at `now` (`None`: the store's clock) through its queue's gate: `claim`
    /// runs one claim (a request for up to `max` rows of `queue` for `lease_ms`, at a
    /// `now`) and answers the rows it leased in claim order. Only leases of one lease length
    /// and one `now` are claimed together.
    pub async fn lease<F, Fut>(&self, req: LeaseRequest, now: Option<Timestamp>, claim: F) -> Answer
    where
        F: Fn(LeaseRequest, Option<Timestamp>) -> Fut,
        Fut: Future<Output = Answer>,
    {
        let q = self.queue(&req.queue);
        if req.max_bytes.is_some() {
            let _turn = q.gate.acquire().await.map_err(|_| StoreError::Closed)?;
            return claim(req, now).await;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, mut answer) = oneshot::channel();
        q.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Waiter {
                id,
                max: req.max.max(1),
                lease_ms: req.lease_ms,
                now,
                reply,
            });
        // Take turns until some turn (ours or another's) has taken our lease, then wait for
        // its answer.
        loop {
            tokio::select! {
                biased;
                a = &mut answer => return a.unwrap_or(Err(StoreError::Closed)),
                turn = q.gate.acquire() => {
                    let _turn = turn.map_err(|_| StoreError::Closed)?;
                    if !q.is_waiting(id) {
                        // Another turn took our lease: its answer is on the way.
                        break;
                    }
                    serve(&q, &req.queue, &claim).await;
                }
            }
        }
        answer.await.unwrap_or(Err(StoreError::Closed))
    }
}

/// Take the waiting leases of one lease length and one `now` (the first waiter's) and claim
/// for them.
async fn serve<F, Fut>(q: &Queue, queue: &str, claim: &F)
where
    F: Fn(LeaseRequest, Option<Timestamp>) -> Fut,
    Fut: Future<Output = Answer>,
{
    let (group, total) = {
        let mut waiting = q.waiting.lock().unwrap_or_else(|p| p.into_inner());
        waiting.retain(|w| !w.reply.is_closed());
        let Some((lease_ms, now)) = waiting.first().map(|w| (w.lease_ms, w.now)) else {
            return;
        };
        // The first waiter and those alike that fit, in their order; the rest wait on.
        let mut total = 0u32;
        let (group, rest): (Vec<Waiter>, Vec<Waiter>) =
            std::mem::take(&mut *waiting).into_iter().partition(|w| {
                let take = w.lease_ms == lease_ms
                    && w.now == now
                    && (total == 0 || total + w.max <= MAX_COMBINED);
                if take {
                    total += w.max;
                }
                take
            });
        *waiting = rest;
        (group, total)
    };
    let req = LeaseRequest {
        queue: queue.to_owned(),
        max: total,
        lease_ms: group[0].lease_ms,
        max_bytes: None,
    };
    match claim(req, group[0].now).await {
        Ok(rows) => {
            let mut rows = rows.into_iter();
            for w in group {
                let share: Vec<Leased> = rows.by_ref().take(w.max as usize).collect();
                let _ = w.reply.send(Ok(share));
            }
        }
        Err(e) => {
            for w in group {
                let _ = w.reply.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redrive_core::{MessageId, NewMessage, Timestamp};
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    fn leased(i: u64) -> Leased {
        let item = NewMessage::new("q", serde_json::json!(i));
        let message = crate::stored::purged_message(MessageId::new(), &item, None, 1_000, 0)
            .expect("a message");
        Leased {
            message,
            token: format!("1-{i}"),
            attempt: 1,
            max_attempts: 5,
            expires_at: Timestamp::from_millis(60_000),
            lateness_ms: 0,
        }
    }

    fn req(max: u32, lease_ms: u64) -> LeaseRequest {
        LeaseRequest {
            queue: "q".into(),
            max,
            lease_ms,
            max_bytes: None,
        }
    }

    /// A queue of `supply` rows; each claim takes a while, so leases pile up behind the gate.
    struct Supply {
        left: Mutex<u64>,
        claims: AtomicUsize,
        largest: AtomicUsize,
    }

    impl Supply {
        async fn claim(&self, req: LeaseRequest, _now: Option<Timestamp>) -> Answer {
            self.claims.fetch_add(1, Ordering::Relaxed);
            self.largest.fetch_max(req.max as usize, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(5)).await;
            let mut left = self.left.lock().unwrap();
            let n = u64::from(req.max).min(*left);
            *left -= n;
            Ok((0..n).map(leased).collect())
        }
    }

    /// 32 leases of 10 at once: each gets at most its 10, together all 200 rows there are,
    /// and in far fewer claims than leases.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn waiting_leases_are_claimed_together_and_each_gets_its_share() {
        let claims = Arc::new(Claims::default());
        let supply = Arc::new(Supply {
            left: Mutex::new(200),
            claims: AtomicUsize::new(0),
            largest: AtomicUsize::new(0),
        });
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let (claims, supply) = (claims.clone(), supply.clone());
                tokio::spawn(async move {
                    claims
                        .lease(req(10, 30_000), None, |r, now| supply.claim(r, now))
                        .await
                        .expect("lease")
                })
            })
            .collect();
        let mut total = 0;
        for t in tasks {
            let got = t.await.unwrap();
            assert!(got.len() <= 10, "{} rows for a lease of 10", got.len());
            total += got.len();
        }
        assert_eq!(total, 200);
        let n = supply.claims.load(Ordering::Relaxed);
        assert!(n < 32, "{n} claims for 32 leases");
        assert!(supply.largest.load(Ordering::Relaxed) > 10);
    }

    /// Leases of another length or another `now` are not merged into a claim of this one, a
    /// byte-bounded one is claimed alone, and an error reaches every lease of its claim.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn lease_lengths_byte_bounds_and_errors_stay_apart() {
        let claims = Arc::new(Claims::default());
        let seen: Arc<Mutex<Vec<(u32, u64, bool)>>> = Arc::default();
        let run = |r: LeaseRequest, now: Option<Timestamp>| {
            let (claims, seen) = (claims.clone(), seen.clone());
            tokio::spawn(async move {
                claims
                    .lease(r, now, |r, now| {
                        let seen = seen.clone();
                        async move {
                            seen.lock()
                                .unwrap()
                                .push((r.max, r.lease_ms, r.max_bytes.is_some()));
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            if r.lease_ms == 666 {
                                return Err(StoreError::Unavailable("down".into()));
                            }
                            if now.is_some() {
                                return Err(StoreError::Backend("a test clock".into()));
                            }
                            Ok((0..u64::from(r.max)).map(leased).collect())
                        }
                    })
                    .await
            })
        };
        let mut tasks = Vec::new();
        for i in 0..16u64 {
            let mut r = req(3, [1_000, 2_000, 666][(i % 3) as usize]);
            if i == 4 {
                r.max_bytes = Some(1);
            }
            // A test's own clock: claimed apart from the leases on the store's clock.
            let now = (i >= 12 && r.lease_ms != 666).then(|| Timestamp::from_millis(7));
            tasks.push((r.lease_ms, r.max_bytes.is_some(), now, run(r, now)));
        }
        for (lease_ms, bounded, now, t) in tasks {
            let got = t.await.unwrap();
            if now.is_some() {
                assert!(matches!(got, Err(StoreError::Backend(_))), "{got:?}");
            } else if lease_ms == 666 {
                assert!(matches!(got, Err(StoreError::Unavailable(_))), "{got:?}");
            } else {
                let got = got.expect("lease");
                assert_eq!(got.len(), 3, "lease_ms {lease_ms} bounded {bounded}");
            }
        }
        let seen = seen.lock().unwrap();
        // Every claim is for one lease length, a multiple of 3 rows; the bounded one alone.
        assert!(seen.iter().all(|(max, _, _)| max % 3 == 0), "{seen:?}");
        assert_eq!(seen.iter().filter(|s| s.2).count(), 1, "{seen:?}");
        assert!(seen.iter().filter(|s| s.2).all(|s| s.0 == 3), "{seen:?}");
    }
}
