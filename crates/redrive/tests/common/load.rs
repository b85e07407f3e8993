//! The crash tests' load and its bookkeeping: producers publish batches with idempotency
//! keys, consumers lease and ack (70 %) or nack (30 %), and a [`Ledger`] records only what
//! the server answered with a 2xx — the promises a restart must keep. A worker stops at
//! the first failed request (the server was killed, or refused), recording a refusal.
//! Requests go through the typed [`redrive_client::Client`].

use redrive_client::{BatchItem, Client, Error, LeaseRequest, NackError, Publish};
use redrive_client::{ExportFormat, Filter};
use redrive_core::{ErrorClass, SplitMix64};
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
    /// A third of the publishes due 20 ms later: scheduled, then promoted by the tick (on
    /// the embedded store in memory, the row still `scheduled`) while consumers lease them,
    /// so a kill also finds messages in those states.
    pub delayed: bool,
}

impl Load {
    /// The typed client over this load's HTTP client (its timeout applies).
    fn api(&self) -> Client {
        Client::with_http(&self.base, self.client.clone()).expect("a server URL")
    }

    /// What a worker does with a failed call: record a refusal (a non-2xx answer) and
    /// stop. No answer, or an answer cut short, is the server being killed: stop without
    /// a record. A 2xx answer that is not what the API says is a bug: panic.
    fn fail(&self, e: Error) {
        match e {
            Error::Api {
                status,
                code,
                message,
                ..
            } => {
                // The body as the server sent it: its JSON error, or (code `http_<status>`,
                // a body that was not one) no JSON error at all.
                let body = if code.starts_with("http_") {
                    Value::Null
                } else {
                    json!({"error": {"code": code, "message": message}})
                };
                self.ledger.lock().unwrap().refused.push((status, body));
            }
            Error::Decode { url, source } => {
                panic!("the answer to {url} is not what API v1 says: {source}")
            }
            _ => {}
        }
    }

    /// Publish batches until `stop` or the first failure.
    pub async fn producer(self, stop: Instant) {
        let api = self.api();
        while Instant::now() < stop {
            let batch: Vec<u64> = {
                let mut n = self.next.lock().unwrap();
                let b = (*n..*n + PUBLISH_BATCH).collect();
                *n += PUBLISH_BATCH;
                b
            };
            let messages: Vec<Publish> = batch
                .iter()
                .map(|n| Publish {
                    idempotency_key: Some(format!("k{n}")),
                    delay: (self.delayed && n % 3 == 0).then(|| "20ms".to_owned()),
                    ..Publish::new(json!({"n": n}))
                })
                .collect();
            let published = match api.publish_batch(&self.queue, &messages).await {
                Ok(p) => p.message,
                Err(e) => return self.fail(e),
            };
            let mut l = self.ledger.lock().unwrap();
            for m in published {
                let n = m.payload["n"].as_u64().expect("the payload this load sent");
                l.published.insert(m.id.to_string(), n);
            }
        }
    }

    /// Lease, then ack or nack, until `stop` or the first failure.
    pub async fn consumer(self, seed: u64, stop: Instant) {
        let api = self.api();
        let mut rng = SplitMix64::new(seed);
        let request = LeaseRequest {
            max: Some(LEASE_MAX as u32),
            lease: Some("2s".into()),
            wait: Some("200ms".into()),
        };
        let failure = NackError::new(ErrorClass::Transient, "crash test");
        while Instant::now() < stop {
            let msgs = match api.lease(&self.queue, &request).await {
                Ok(m) => m,
                Err(e) => return self.fail(e),
            };
            let mut acks = Vec::new();
            let mut nacks = Vec::new();
            {
                let mut l = self.ledger.lock().unwrap();
                for m in msgs {
                    let id = m.id.to_string();
                    l.deliveries += 1;
                    if l.acked.contains(&id) {
                        l.acked_redelivered += 1;
                    }
                    let item = BatchItem::new(id, m.lease);
                    if rng.between(0, 9) < 7 {
                        acks.push(item);
                    } else {
                        nacks.push(BatchItem {
                            error: Some(failure.clone()),
                            ..item
                        });
                    }
                }
            }
            if !nacks.is_empty() {
                if let Err(e) = api.nack_batch(&nacks).await {
                    return self.fail(e);
                }
            }
            if !acks.is_empty() {
                let items = match api.ack_batch(&acks).await {
                    Ok(items) => items,
                    Err(e) => return self.fail(e),
                };
                let mut l = self.ledger.lock().unwrap();
                for item in items {
                    if item.status == 200 {
                        l.acked.insert(item.id);
                    }
                }
            }
        }
    }

    /// Every message of the queue: id → state (via the streamed export). The load's
    /// timeout bounds a whole request, and an export of tens of thousands of messages on a
    /// loaded machine may take longer (CI: over 10 s on PostgreSQL, beside four other fault
    /// tests); here a stream that sends nothing for 30 s is no answer instead.
    pub async fn snapshot(&self) -> HashMap<String, String> {
        let filter = Filter {
            queue: Some(self.queue.clone()),
            ..Filter::default()
        };
        let streaming = reqwest::Client::builder()
            .read_timeout(std::time::Duration::from_secs(30))
            .build()
            .expect("an HTTP client");
        let mut export = Client::with_http(&self.base, streaming)
            .expect("a server URL")
            .export(&filter, ExportFormat::Jsonl)
            .await
            .expect("export");
        let mut snap = HashMap::new();
        while let Some(m) = export.next_message().await.expect("export line") {
            snap.insert(m.id.to_string(), m.state.as_str().to_owned());
        }
        snap
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

/// What [`kill_9_cycles`] leaves: the node started after the last kill (ready), the load
/// aimed at it, and how many times the store opened.
pub struct Survivor {
    pub node: super::Node,
    pub load: Load,
    pub opened: u32,
}

/// The crash tests' loop, `cycles` times: start a node (`start`), check that every publish
/// acknowledged so far is there and every acked message done, then run 4 producers and 4
/// consumers of `queue` for a random 150–1,200 ms and kill -9 the node. Then start it once
/// more, for the caller's final count.
pub async fn kill_9_cycles(
    cycles: u32,
    client: &reqwest::Client,
    queue: &str,
    ledger: &Arc<Mutex<Ledger>>,
    mut start: impl FnMut() -> super::Node,
) -> Survivor {
    let next = Arc::new(Mutex::new(0u64));
    let load_for = |node: &super::Node| Load {
        client: client.clone(),
        base: node.base.clone(),
        queue: queue.into(),
        ledger: ledger.clone(),
        next: next.clone(),
        delayed: true,
    };
    let mut rng = SplitMix64::new(0x5eed);
    let mut opened = 0;
    for cycle in 0..cycles {
        let mut node = start();
        assert!(
            super::wait_ready(client, &mut node).await,
            "cycle {cycle}: store did not open"
        );
        opened += 1;
        let load = load_for(&node);
        // Everything acknowledged before this crash must be here, acked ones done.
        let snap = load.snapshot().await;
        let (lost, acked_not_done) = check(&ledger.lock().unwrap(), &snap);
        assert_eq!(lost, 0, "cycle {cycle}: acknowledged publishes lost");
        assert_eq!(acked_not_done, 0, "cycle {cycle}: acked messages not done");
        // Load, then kill -9 at a random moment.
        let run_ms = rng.between(150, 1200);
        let stop = Instant::now() + std::time::Duration::from_millis(run_ms + 5_000);
        let mut tasks = Vec::new();
        for i in 0..4 {
            tasks.push(tokio::spawn(load.clone().producer(stop)));
            tasks.push(tokio::spawn(
                load.clone().consumer(rng.next_u64() ^ i, stop),
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(run_ms)).await;
        node.child.kill().unwrap(); // SIGKILL
        node.child.wait().unwrap();
        for t in tasks {
            let _ = t.await;
        }
    }
    // Final restart: the caller counts once more.
    let mut node = start();
    assert!(
        super::wait_ready(client, &mut node).await,
        "final: store did not open"
    );
    opened += 1;
    let load = load_for(&node);
    Survivor { node, load, opened }
}
