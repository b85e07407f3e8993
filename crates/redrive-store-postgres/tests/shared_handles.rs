//! Two stores on one schema (two nodes of a cluster): competing claims never lease a
//! message twice nor more than asked, two ticks at once fail each expired lease once,
//! and per-key ordering holds across both.

mod common;

use redrive_core::{MessageId, NewMessage, State};
use redrive_storage::conformance::{at, Setup, ORDERED, Q};
use redrive_storage::{LeaseRequest, Store};
use redrive_store_postgres::PostgresStore;
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

const PREFIX: &str = "redrive_t_shared";

async fn two_stores() -> (Arc<PostgresStore>, Arc<PostgresStore>, common::SchemaGuard) {
    let (a, guard) = common::open(PREFIX, Setup::default()).await;
    let mut opts = common::options(&guard.0, &Setup::default());
    opts.store.seed = Some(7); // the same seed: the per-open epoch still keeps tokens apart
    let b = PostgresStore::open(opts)
        .await
        .expect("open the second store");
    (Arc::new(a), Arc::new(b), guard)
}

async fn publish_n(
    s: &PostgresStore,
    queue: &str,
    n: usize,
    key: impl Fn(usize) -> Option<String>,
) {
    let items: Vec<NewMessage> = (0..n)
        .map(|i| NewMessage {
            key: key(i),
            ..NewMessage::new(queue, json!({ "i": i }))
        })
        .collect();
    s.publish(items, Some(at(0))).await.expect("publish");
}

fn req(queue: &str, max: u32) -> LeaseRequest {
    LeaseRequest {
        queue: queue.to_owned(),
        max,
        lease_ms: 600_000,
        max_bytes: None,
    }
}

/// Claimers on two stores lease concurrently until the queue is empty: every message is
/// leased exactly once, no answer is longer than its `max`, and the database holds
/// exactly the leases that were answered, each at attempt 1 (a claim that touched more
/// rows than its LIMIT would leave leases nobody was told of, or attempts past 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn competing_claims_are_disjoint_and_bounded() {
    let (a, b, _guard) = two_stores().await;
    const N: usize = 600;
    publish_n(&a, Q, N, |_| None).await;
    let mut tasks = Vec::new();
    for worker in 0..8u32 {
        let s = if worker % 2 == 0 {
            a.clone()
        } else {
            b.clone()
        };
        tasks.push(tokio::spawn(async move {
            let max = 1 + worker % 5;
            let mut got: Vec<(MessageId, String, u32)> = Vec::new();
            loop {
                let leased = s.lease(req(Q, max), Some(at(1))).await.expect("lease");
                assert!(
                    leased.len() <= max as usize,
                    "asked {max}, got {}",
                    leased.len()
                );
                if leased.is_empty() {
                    return got;
                }
                got.extend(
                    leased
                        .into_iter()
                        .map(|l| (l.message.id, l.token, l.attempt)),
                );
            }
        }));
    }
    let mut seen: HashMap<MessageId, String> = HashMap::new();
    for t in tasks {
        for (id, token, attempt) in t.await.expect("claimer") {
            assert_eq!(attempt, 1, "message {id} leased at attempt {attempt}");
            if let Some(other) = seen.insert(id, token) {
                panic!("message {id} leased twice (first with {other})");
            }
        }
    }
    assert_eq!(seen.len(), N, "every message leased once");
    let stats = a.queue_stats().await.expect("stats");
    let q = stats.iter().find(|s| s.queue == Q).expect("queue stats");
    assert_eq!(q.count(State::Leased), N as u64);
    assert_eq!(q.count(State::Ready), 0);
    // Every answered lease acks on the other store.
    let acks = seen
        .iter()
        .map(|(id, token)| {
            redrive_storage::LeaseRef {
                id: *id,
                token: token.clone(),
            }
            .into()
        })
        .collect();
    for r in b.ack(acks, Some(at(2))).await.expect("ack") {
        r.expect("ack of an answered lease");
    }
}

/// Two stores tick at once: each expired lease is failed by exactly one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_ticks_expire_each_lease_once() {
    let (a, b, _guard) = two_stores().await;
    const N: usize = 200;
    publish_n(&a, Q, N, |_| None).await;
    let leased = a
        .lease(
            LeaseRequest {
                lease_ms: 1_000,
                ..req(Q, N as u32)
            },
            Some(at(0)),
        )
        .await
        .expect("lease");
    assert_eq!(leased.len(), N);
    let now = at(5_000);
    let (ta, tb) = tokio::join!(a.tick(Some(now)), b.tick(Some(now)));
    let (ta, tb) = (ta.expect("tick a"), tb.expect("tick b"));
    let mut ids: Vec<MessageId> = ta
        .expired
        .iter()
        .chain(&tb.expired)
        .map(|o| o.message.id)
        .collect();
    ids.sort();
    let before = ids.len();
    ids.dedup();
    assert_eq!(before, ids.len(), "a lease was expired by both ticks");
    assert_eq!(ids.len(), N, "every expired lease was failed");
    for l in leased.iter().take(5) {
        let m = a.get(l.message.id).await.expect("get").expect("message");
        assert_eq!(m.attempts, 1);
        assert_eq!(
            m.history.len(),
            1,
            "one failed attempt in the history: {:?}",
            m.history
        );
    }
}

/// Per-key ordering across two stores claiming at once: at most one message of a key is
/// leased at any time, and each key's messages are leased in publish order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn key_order_holds_across_competing_claims() {
    let (a, b, _guard) = two_stores().await;
    const KEYS: usize = 6;
    const PER_KEY: usize = 8;
    publish_n(&a, ORDERED, KEYS * PER_KEY, |i| {
        Some(format!("k{}", i % KEYS))
    })
    .await;
    let mut order: HashMap<String, Vec<i64>> = HashMap::new();
    let mut t = 1;
    loop {
        let now = at(t);
        let (la, lb) = tokio::join!(
            a.lease(req(ORDERED, 4), Some(now)),
            b.lease(req(ORDERED, 4), Some(now))
        );
        let leased: Vec<_> = la
            .expect("lease a")
            .into_iter()
            .chain(lb.expect("lease b"))
            .collect();
        if leased.is_empty() {
            break;
        }
        let mut keys = HashSet::new();
        for l in &leased {
            let key = l.message.key.clone().expect("keyed");
            assert!(keys.insert(key.clone()), "two leases of key {key} at once");
            order
                .entry(key)
                .or_default()
                .push(l.message.payload["i"].as_i64().expect("i"));
        }
        // Ack half on the other store, so both settle keys.
        let (even, odd): (Vec<_>, Vec<_>) = leased
            .into_iter()
            .enumerate()
            .partition(|(i, _)| i % 2 == 0);
        let refs = |v: Vec<(usize, redrive_storage::Leased)>| -> Vec<redrive_storage::Ack> {
            v.into_iter()
                .map(|(_, l)| {
                    redrive_storage::LeaseRef {
                        id: l.message.id,
                        token: l.token,
                    }
                    .into()
                })
                .collect()
        };
        let (ra, rb) = tokio::join!(a.ack(refs(even), Some(now)), b.ack(refs(odd), Some(now)));
        for r in ra.expect("ack a").into_iter().chain(rb.expect("ack b")) {
            r.expect("ack");
        }
        t += 1;
        assert!(t < 1_000, "the keys never drained");
    }
    assert_eq!(order.len(), KEYS);
    for (key, seen) in order {
        let mut sorted = seen.clone();
        sorted.sort();
        assert_eq!(seen, sorted, "key {key} leased out of order");
        assert_eq!(seen.len(), PER_KEY, "key {key}");
    }
}

/// Workers on both stores lease one message of a key-ordered queue and ack it at once,
/// concurrently, until it drains: no key is ever held by two workers, and every key's
/// messages are acked in publish order. (A worker lets go of its key just before its ack,
/// so a lease of the key's next message during that ack is not counted against it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn key_order_holds_while_settles_and_claims_race() {
    let (a, b, _guard) = two_stores().await;
    const KEYS: usize = 3;
    const PER_KEY: usize = 30;
    publish_n(&a, ORDERED, KEYS * PER_KEY, |i| {
        Some(format!("k{}", i % KEYS))
    })
    .await;
    let held = Arc::new(std::sync::Mutex::new(HashSet::<String>::new()));
    let acked = Arc::new(std::sync::Mutex::new(HashMap::<String, Vec<i64>>::new()));
    let mut workers = Vec::new();
    for w in 0..6 {
        let s = if w % 2 == 0 { a.clone() } else { b.clone() };
        let (held, acked) = (held.clone(), acked.clone());
        workers.push(tokio::spawn(async move {
            let mut idle = 0;
            while idle < 50 {
                let leased = s.lease(req(ORDERED, 1), Some(at(1))).await.expect("lease");
                let Some(l) = leased.into_iter().next() else {
                    idle += 1;
                    tokio::task::yield_now().await;
                    continue;
                };
                idle = 0;
                let key = l.message.key.clone().expect("keyed");
                assert!(
                    held.lock().expect("held").insert(key.clone()),
                    "key {key} leased while another worker holds it"
                );
                let lease = redrive_storage::LeaseRef {
                    id: l.message.id,
                    token: l.token,
                };
                let i = l.message.payload["i"].as_i64().expect("i");
                // Record before the ack commits: the next of the key can be leased only
                // after it, so the order recorded is the order leased.
                acked
                    .lock()
                    .expect("acked")
                    .entry(key.clone())
                    .or_default()
                    .push(i);
                tokio::task::yield_now().await;
                held.lock().expect("held").remove(&key);
                for r in s.ack(vec![lease.into()], Some(at(2))).await.expect("ack") {
                    r.expect("ack of a live lease");
                }
            }
        }));
    }
    for w in workers {
        w.await.expect("worker");
    }
    let acked = acked.lock().expect("acked").clone();
    assert_eq!(acked.len(), KEYS);
    for (key, seen) in acked {
        let mut sorted = seen.clone();
        sorted.sort();
        assert_eq!(seen, sorted, "key {key} out of order");
        assert_eq!(seen.len(), PER_KEY, "key {key}: {seen:?}");
    }
}

/// Workers on both stores lease, ack, nack or abandon messages while tickers on both
/// stores advance a shared fake clock, expiring abandoned leases: no attempt of a message
/// is ever delivered twice (two claimers of one ready message would both get its next
/// attempt number), an acked message is never delivered again, and after draining every
/// message is done or dead with one history entry per attempt that ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_claims_settles_and_ticks_keep_at_least_once() {
    use redrive_core::{ErrorClass, Failure, SplitMix64};
    use redrive_storage::conformance::T0;
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    let (a, b, _guard) = two_stores().await;
    publish_n(&a, Q, 200, |_| None).await;
    publish_n(&b, ORDERED, 60, |i| Some(format!("k{}", i % 6))).await;
    let clock = Arc::new(AtomicI64::new(10));
    let stop = Arc::new(AtomicBool::new(false));
    type Seen = std::sync::Mutex<HashMap<MessageId, Vec<u32>>>;
    let delivered: Arc<Seen> = Arc::default();
    let acked = Arc::new(std::sync::Mutex::new(HashSet::<MessageId>::new()));
    let now = |c: &AtomicI64| redrive_core::Timestamp::from_millis(T0 + c.load(Ordering::SeqCst));
    let mut tasks = Vec::new();
    for t in 0..2 {
        let s = if t == 0 { a.clone() } else { b.clone() };
        let (clock, stop) = (clock.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                clock.fetch_add(40, Ordering::SeqCst);
                s.tick(Some(now(&clock))).await.expect("tick");
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
        }));
    }
    let mut workers = Vec::new();
    for w in 0..6u64 {
        let s = if w % 2 == 0 { a.clone() } else { b.clone() };
        let (clock, delivered, acked) = (clock.clone(), delivered.clone(), acked.clone());
        workers.push(tokio::spawn(async move {
            let mut rng = SplitMix64::new(w + 1);
            for round in 0..150 {
                let queue = if round % 3 == 0 { ORDERED } else { Q };
                let t = now(&clock);
                let leased = s
                    .lease(
                        LeaseRequest {
                            lease_ms: 300,
                            ..req(queue, 1 + (rng.next_u64() % 4) as u32)
                        },
                        Some(t),
                    )
                    .await
                    .expect("lease");
                for l in leased {
                    let id = l.message.id;
                    assert!(
                        !acked.lock().expect("acked").contains(&id),
                        "acked message {id} delivered again (attempt {})",
                        l.attempt
                    );
                    {
                        let mut d = delivered.lock().expect("delivered");
                        let attempts = d.entry(id).or_default();
                        assert!(
                            !attempts.contains(&l.attempt),
                            "attempt {} of {id} delivered twice",
                            l.attempt
                        );
                        attempts.push(l.attempt);
                    }
                    let lease = redrive_storage::LeaseRef { id, token: l.token };
                    let t = now(&clock);
                    match rng.next_u64() % 20 {
                        0..=11 => {
                            for r in s.ack(vec![lease.into()], Some(t)).await.expect("ack") {
                                if r.is_ok() {
                                    acked.lock().expect("acked").insert(id);
                                }
                            }
                        }
                        12..=16 => {
                            let n = redrive_storage::Nack {
                                lease,
                                failure: Failure::new(ErrorClass::Transient, "flaky"),
                                response: None,
                                waited: Vec::new(),
                            };
                            let _ = s.nack(vec![n], Some(t)).await.expect("nack");
                        }
                        _ => {} // abandoned: the lease expires
                    }
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    for w in workers {
        w.await.expect("worker");
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("ticker");
    }
    // Drain: far in the future, everything due, every lease expired; ack what is left.
    let mut far = clock.load(Ordering::SeqCst) + 100_000;
    loop {
        let t = redrive_core::Timestamp::from_millis(T0 + far);
        while a.tick(Some(t)).await.expect("tick").more {}
        let mut any = false;
        for queue in [Q, ORDERED] {
            let leased = a.lease(req(queue, 100), Some(t)).await.expect("lease");
            any |= !leased.is_empty();
            for l in leased {
                assert!(
                    !acked.lock().expect("acked").contains(&l.message.id),
                    "acked message delivered again while draining"
                );
                let lease = redrive_storage::LeaseRef {
                    id: l.message.id,
                    token: l.token,
                };
                for r in a.ack(vec![lease.into()], Some(t)).await.expect("ack") {
                    r.expect("ack while draining");
                }
            }
        }
        if !any {
            break;
        }
        far += 100_000;
    }
    let stats = a.queue_stats().await.expect("stats");
    let mut total = 0;
    for q in &stats {
        assert_eq!(
            q.count(State::Ready) + q.count(State::Leased) + q.count(State::Scheduled),
            0,
            "{q:?}"
        );
        total += q.count(State::Done) + q.count(State::Dead);
    }
    assert_eq!(total, 260, "every message done or dead: {stats:?}");
    let page = a
        .search(Default::default(), 300, None)
        .await
        .expect("search");
    for m in page.messages {
        let m = a.get(m.id).await.expect("get").expect("message");
        let ended = m
            .history
            .iter()
            .filter(|h| {
                matches!(
                    h.event,
                    redrive_core::HistoryEvent::Acked | redrive_core::HistoryEvent::Failed { .. }
                )
            })
            .count();
        assert_eq!(
            ended as u32, m.attempts,
            "message {}: {} attempts, history {:?}",
            m.id, m.attempts, m.history
        );
    }
}
