//! The crash tests' load and its bookkeeping: producers publish batches with idempotency
//! keys, consumers lease and ack (70 %) or nack (30 %), and a [`Ledger`] records only what
//! the server answered with a 2xx — the promises a restart must keep. A worker stops at
//! the first failed request (the server was killed, or refused), recording a refusal.

use redrive_core::SplitMix64;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Messages per publish request.
const PUBLISH_BATCH: u64 = 10;
/// Messages per lease request.
const LEASE_MAX: u64 = 20;

/// What the clients saw acknowledged with a 2xx.
#[derive(Default)]
pub struct Ledger {
    /// Published and answered 2xx: id → payload n.
    pub published: HashMap<String, u64>,
    /// Acked and answered 200.
    pub acked: HashSet<String>,
    /// Deliveries of messages that were already acked (must stay 0).
    pub acked_redelivered: u64,
    pub deliveries: u64,
    /// Answers that were not 2xx (and not 200 items of a batch ack): (status, body).
    pub refused: Vec<(u16, Value)>,
}

/// One load generator's view of the server.
#[derive(Clone)]
pub struct Load {
    pub client: reqwest::Client,
    pub base: String,
    pub queue: String,
    pub ledger: Arc<Mutex<Ledger>>,
    /// Next payload number (shared by producers, unique across restarts).
    pub next: Arc<Mutex<u64>>,
}

impl Load {
    /// Record a non-2xx answer.
    async fn refuse(&self, r: reqwest::Response) {
        let status = r.status().as_u16();
        let body = r.json::<Value>().await.unwrap_or(Value::Null);
        self.ledger.lock().unwrap().refused.push((status, body));
    }

    /// Publish batches until `stop` or the first failure.
    pub async fn producer(self, stop: Instant) {
        while Instant::now() < stop {
            let batch: Vec<u64> = {
                let mut n = self.next.lock().unwrap();
                let b = (*n..*n + PUBLISH_BATCH).collect();
                *n += PUBLISH_BATCH;
                b
            };
            let body = json!({"messages": batch.iter().map(|n| json!({"payload": {"n": n}, "idempotency_key": format!("k{n}")})).collect::<Vec<_>>()});
            let Ok(r) = self
                .client
                .post(format!("{}/v1/queues/{}/messages", self.base, self.queue))
                .json(&body)
                .send()
                .await
            else {
                return;
            };
            if !r.status().is_success() {
                return self.refuse(r).await;
            }
            let Ok(v) = r.json::<Value>().await else {
                return;
            };
            let mut l = self.ledger.lock().unwrap();
            for m in v["messages"].as_array().unwrap() {
                l.published.insert(
                    m["id"].as_str().unwrap().to_owned(),
                    m["payload"]["n"].as_u64().unwrap(),
                );
            }
        }
    }

    /// Lease, then ack or nack, until `stop` or the first failure.
    pub async fn consumer(self, seed: u64, stop: Instant) {
        let mut rng = SplitMix64::new(seed);
        while Instant::now() < stop {
            let Ok(r) = self
                .client
                .post(format!("{}/v1/queues/{}/leases", self.base, self.queue))
                .json(&json!({"max": LEASE_MAX, "lease": "2s", "wait": "200ms"}))
                .send()
                .await
            else {
                return;
            };
            if !r.status().is_success() {
                return self.refuse(r).await;
            }
            let Ok(v) = r.json::<Value>().await else {
                return;
            };
            let Some(msgs) = v["messages"].as_array() else {
                return;
            };
            let mut acks = Vec::new();
            let mut nacks = Vec::new();
            {
                let mut l = self.ledger.lock().unwrap();
                for m in msgs {
                    let id = m["id"].as_str().unwrap().to_owned();
                    l.deliveries += 1;
                    if l.acked.contains(&id) {
                        l.acked_redelivered += 1;
                    }
                    let item = json!({"id": id, "lease": m["lease"]});
                    if rng.between(0, 9) < 7 {
                        acks.push(item);
                    } else {
                        nacks.push(json!({"id": item["id"], "lease": item["lease"], "error": {"class": "transient", "message": "crash test"}}));
                    }
                }
            }
            if !nacks.is_empty() {
                let Ok(r) = self
                    .client
                    .post(format!("{}/v1/messages/nack", self.base))
                    .json(&json!({"items": nacks}))
                    .send()
                    .await
                else {
                    return;
                };
                if !r.status().is_success() {
                    return self.refuse(r).await;
                }
            }
            if !acks.is_empty() {
                let Ok(r) = self
                    .client
                    .post(format!("{}/v1/messages/ack", self.base))
                    .json(&json!({"items": acks}))
                    .send()
                    .await
                else {
                    return;
                };
                if !r.status().is_success() {
                    return self.refuse(r).await;
                }
                let Ok(v) = r.json::<Value>().await else {
                    return;
                };
                let mut l = self.ledger.lock().unwrap();
                for item in v["items"].as_array().unwrap() {
                    if item["status"] == 200 {
                        l.acked.insert(item["id"].as_str().unwrap().to_owned());
                    }
                }
            }
        }
    }

    /// Every message of the queue: id → state (via the streamed export).
    pub async fn snapshot(&self) -> HashMap<String, String> {
        let text = self
            .client
            .get(format!(
                "{}/v1/messages/export?queue={}&format=jsonl",
                self.base, self.queue
            ))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                (
                    v["id"].as_str().unwrap().to_owned(),
                    v["state"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }
}

/// (acknowledged publishes missing, acked messages not `done`) in `snap`.
pub fn check(ledger: &Ledger, snap: &HashMap<String, String>) -> (usize, usize) {
    let lost = ledger
        .published
        .keys()
        .filter(|id| !snap.contains_key(*id))
        .count();
    let acked_not_done = ledger
        .acked
        .iter()
        .filter(|id| snap.get(*id).map(String::as_str) != Some("done"))
        .count();
    (lost, acked_not_done)
}
