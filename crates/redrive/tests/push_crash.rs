//! Crash test of push delivery (SPEC §10) with the real binary.
//!
//! `kill_9_with_pushes_in_flight_loses_nothing`: a queue with `delivery = "push"` is pushed
//! to a mock endpoint in this test process (127.0.0.1, an ephemeral port) that answers 200
//! to ~70 % of the requests and 500 to the rest (a deterministic choice per webhook-id and
//! attempt), after a random 0–20 ms, so pushes are in flight when the kill lands. Each
//! cycle starts the server, publishes continuously, and `kill -9`s it after 200–800 ms;
//! then a last start drains the queue without publishing. Counted at the end:
//!
//! - lost: acknowledged publishes not in the store (must be 0);
//! - not_done: acknowledged publishes not `done` by the deadline (must be 0);
//! - done_without_2xx: `done` messages the endpoint never answered 2xx (must be 0: a push
//!   message is done only after a 2xx);
//! - and, for information, pushes, 2xx answers, and messages answered 2xx more than once
//!   (at least once: a 2xx whose ack the kill cut off is delivered again).
//!
//! A push attempt's lease is its timeout plus `LEASE_MARGIN_MS` (5 s), so a message whose
//! push was in flight at the last kill is delivered again only ~6 s later: the final drain
//! waits up to [`DRAIN_DEADLINE`]. `PUSH_CRASH_CYCLES` sets the number of cycles (default
//! 8; no `REDRIVE_` prefix: the server refuses unknown `REDRIVE_*` variables).

mod common;

use common::{free_port, start, wait_ready};
use futures_util::stream::{self, StreamExt};
use redrive_client::{Client, Publish};
use redrive_core::{fnv1a, SplitMix64};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const QUEUE: &str = "pc";
/// How long the final run may take to drain every acknowledged publish.
const DRAIN_DEADLINE: Duration = Duration::from_secs(50);
/// Publishing tasks per cycle.
const PRODUCERS: u64 = 2;

fn config(mock_port: u16) -> String {
    format!(
        r#"
[push]
allow_cidrs = ["127.0.0.1/32"]

[queues.pc]
delivery = "push"

[queues.pc.push]
url = "http://127.0.0.1:{mock_port}/hook"
timeout = "1s"
connect_timeout = "500ms"
concurrency = 16
breaker = false
retry_budget = 0

[queues.pc.retry]
backoff = "fixed"
initial_delay = "10ms"
jitter = "none"
max_attempts = 1000000
"#
    )
}

/// One request the mock endpoint got.
#[derive(Debug, Clone)]
struct Push {
    id: String,
    attempt: u32,
    /// The status it chose to answer.
    status: u16,
    /// Whether writing the answer succeeded (a kill during the delay makes it fail, or not:
    /// a write into a closed socket's buffer may still succeed).
    written: bool,
}

/// The mock endpoint: a minimal HTTP/1.1 server (Content-Length bodies, keep-alive).
#[derive(Clone, Default)]
struct Mock {
    got: Arc<Mutex<Vec<Push>>>,
}

impl Mock {
    async fn start() -> (Mock, u16) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mock = Mock::default();
        let m = mock.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(m.clone().connection(s));
            }
        });
        (mock, port)
    }

    fn pushes(&self) -> Vec<Push> {
        self.got.lock().unwrap().clone()
    }

    /// Answer requests on one connection until it closes.
    async fn connection(self, mut s: TcpStream) {
        let mut buf: Vec<u8> = Vec::new();
        let mut chunk = [0u8; 8192];
        loop {
            let head_end = loop {
                if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break p + 4;
                }
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
            let headers: HashMap<String, String> = head
                .split("\r\n")
                .skip(1)
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
                .collect();
            assert!(
                !headers.contains_key("transfer-encoding"),
                "the mock reads Content-Length bodies only: {head}"
            );
            let len: usize = headers
                .get("content-length")
                .map_or(0, |v| v.parse().expect("a Content-Length"));
            while buf.len() < head_end + len {
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            buf.drain(..head_end + len);
            let id = headers.get("webhook-id").cloned().unwrap_or_default();
            let attempt: u32 = headers
                .get("redrive-attempt")
                .and_then(|a| a.parse().ok())
                .unwrap_or(0);
            let mut rng = SplitMix64::new(fnv1a(id.as_bytes()) ^ u64::from(attempt));
            let status = if rng.between(0, 99) < 70 { 200 } else { 500 };
            tokio::time::sleep(Duration::from_millis(rng.between(0, 20))).await;
            let answer: &[u8] = if status == 200 {
                b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
            } else {
                b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n"
            };
            let written = s.write_all(answer).await.is_ok();
            self.got.lock().unwrap().push(Push {
                id,
                attempt,
                status,
                written,
            });
            if !written {
                return;
            }
        }
    }
}

/// Publish small batches (1–5 messages) until `stop` or the first failed request (the
/// server was killed); record the ids of every publish answered 2xx.
async fn producer(
    api: Client,
    seed: u64,
    next: Arc<Mutex<u64>>,
    ledger: Arc<Mutex<HashSet<String>>>,
    stop: Instant,
) {
    let mut rng = SplitMix64::new(seed);
    while Instant::now() < stop {
        let size = rng.between(1, 5);
        let messages: Vec<Publish> = {
            let mut n = next.lock().unwrap();
            let b = (*n..*n + size)
                .map(|n| Publish::new(json!({"n": n})))
                .collect();
            *n += size;
            b
        };
        match api.publish_batch(QUEUE, &messages).await {
            Ok(p) => {
                let mut l = ledger.lock().unwrap();
                for m in p.message {
                    l.insert(m.id.to_string());
                }
            }
            Err(_) => return,
        }
    }
}

/// Every message of the queue: id → state (via the streamed export).
async fn snapshot(api: &Client) -> HashMap<String, String> {
    let filter = redrive_client::Filter {
        queue: Some(QUEUE.into()),
        ..redrive_client::Filter::default()
    };
    let mut export = api
        .export(&filter, redrive_client::ExportFormat::Jsonl)
        .await
        .expect("export");
    let mut snap = HashMap::new();
    while let Some(m) = export.next_message().await.expect("export line") {
        snap.insert(m.id.to_string(), m.state.as_str().to_owned());
    }
    snap
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_with_pushes_in_flight_loses_nothing() {
    let began = Instant::now();
    let cycles: u32 = std::env::var("PUSH_CRASH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let (mock, mock_port) = Mock::start().await;
    let config = config(mock_port);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let ledger: Arc<Mutex<HashSet<String>>> = Arc::default();
    let next = Arc::new(Mutex::new(0u64));
    let mut rng = SplitMix64::new(0x9005_c4a5);
    for cycle in 0..cycles {
        let mut node = start(dir.path(), port, &config);
        assert!(
            wait_ready(&client, &mut node).await,
            "cycle {cycle}: store did not open"
        );
        let api = Client::with_http(&node.base, client.clone()).unwrap();
        // Every publish acknowledged before the last kill is here.
        let snap = snapshot(&api).await;
        let lost = ledger
            .lock()
            .unwrap()
            .iter()
            .filter(|id| !snap.contains_key(*id))
            .count();
        assert_eq!(lost, 0, "cycle {cycle}: acknowledged publishes lost");
        let run_ms = rng.between(200, 800);
        let stop = Instant::now() + Duration::from_millis(run_ms + 5_000);
        let tasks: Vec<_> = (0..PRODUCERS)
            .map(|i| {
                tokio::spawn(producer(
                    api.clone(),
                    rng.next_u64() ^ i,
                    next.clone(),
                    ledger.clone(),
                    stop,
                ))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(run_ms)).await;
        node.child.kill().unwrap(); // SIGKILL, publishes and pushes in flight
        node.child.wait().unwrap();
        for t in tasks {
            let _ = t.await;
        }
    }
    let cycles_took = began.elapsed();

    // Final start: no more publishing; wait until every acknowledged publish is done.
    let mut node = start(dir.path(), port, &config);
    assert!(
        wait_ready(&client, &mut node).await,
        "final: store did not open"
    );
    let api = Client::with_http(&node.base, client.clone()).unwrap();
    let ids: Vec<String> = ledger.lock().unwrap().iter().cloned().collect();
    let drain_started = Instant::now();
    let mut snap;
    loop {
        snap = snapshot(&api).await;
        let all_done = ids
            .iter()
            .all(|id| snap.get(id).map(String::as_str) == Some("done"));
        if all_done || drain_started.elapsed() > DRAIN_DEADLINE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let drain_took = drain_started.elapsed();
    // Nothing is pushed once everything is done.
    let pushes_at_done = mock.pushes().len();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let pushes_after_done = mock.pushes().len() - pushes_at_done;

    // The history of every done message ends with the endpoint's 200.
    let base = node.base.clone();
    let histories: Vec<(String, Value)> = stream::iter(ids.iter().cloned())
        .map(|id| {
            let (client, base) = (client.clone(), base.clone());
            async move {
                let m: Value = client
                    .get(format!("{base}/v1/messages/{id}"))
                    .send()
                    .await
                    .expect("GET message")
                    .json()
                    .await
                    .expect("a message");
                (id, m)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    node.child.kill().unwrap();
    node.child.wait().unwrap();

    let pushes = mock.pushes();
    let mut ok_by_id: HashMap<&str, u32> = HashMap::new();
    for p in pushes.iter().filter(|p| p.status == 200 && p.written) {
        *ok_by_id.entry(p.id.as_str()).or_default() += 1;
    }
    let answered_2xx = pushes.iter().filter(|p| p.status == 200).count();
    let answered_2xx_written: u32 = ok_by_id.values().sum();
    let max_attempt = pushes.iter().map(|p| p.attempt).max().unwrap_or(0);
    let lost = ids.iter().filter(|id| !snap.contains_key(*id)).count();
    let not_done = ids
        .iter()
        .filter(|id| snap.get(*id).map(String::as_str) != Some("done"))
        .count();
    let done: Vec<&String> = ids
        .iter()
        .filter(|id| snap.get(*id).map(String::as_str) == Some("done"))
        .collect();
    let done_without_2xx: Vec<&String> = done
        .iter()
        .copied()
        .filter(|id| !ok_by_id.contains_key(id.as_str()))
        .collect();
    let duplicates = ok_by_id.values().filter(|n| **n > 1).count();
    let mut last_not_200 = Vec::new();
    for (id, m) in &histories {
        if m["state"] != "done" {
            continue;
        }
        let last = m["history"]
            .as_array()
            .and_then(|h| h.last())
            .cloned()
            .unwrap_or(Value::Null);
        if last["response"]["status"] != 200 {
            last_not_200.push((id.clone(), last));
        }
    }
    println!(
        "push crash test: cycles={cycles} ({:.1}s) drain={:.1}s acknowledged_publishes={} \
         lost={lost} not_done={not_done} done_without_2xx={} pushes={} answered_2xx={answered_2xx} \
         (written {answered_2xx_written}) delivered_2xx_more_than_once={duplicates} \
         max_attempt={max_attempt} pushes_after_all_done={pushes_after_done} \
         done_last_history_not_200={} total={:.1}s",
        cycles_took.as_secs_f64(),
        drain_took.as_secs_f64(),
        ids.len(),
        done_without_2xx.len(),
        pushes.len(),
        last_not_200.len(),
        began.elapsed().as_secs_f64(),
    );
    assert!(
        ids.len() > 100,
        "the publishers did too little to prove anything"
    );
    assert_eq!(lost, 0, "acknowledged publishes lost");
    assert_eq!(
        not_done, 0,
        "acknowledged publishes not done within {DRAIN_DEADLINE:?}"
    );
    assert!(
        done_without_2xx.is_empty(),
        "done without a 2xx from the endpoint: {done_without_2xx:?}"
    );
    assert!(
        last_not_200.is_empty(),
        "done messages whose last history entry is not the endpoint's 200: {:?}",
        &last_not_200[..last_not_200.len().min(3)]
    );
}
