//! SPEC §13, push delivery in a cluster: an endpoint's `concurrency` and `rate_limit` hold
//! for the whole cluster (each node takes its share), measured at the endpoint with three
//! servers on one PostgreSQL store. Skipped on the embedded store (one process).

use crate::harness::*;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A heartbeat every 100 ms, so that the nodes learn each other quickly.
const QUICK: &str = "[cluster]\nheartbeat_interval = \"100ms\"\nleader_lease = \"1s\"\n";

/// A loopback endpoint that answers 200 after `delay`, and records when each call started
/// and the most calls it had in flight at once.
#[derive(Clone)]
struct Counting {
    addr: SocketAddr,
    starts: Arc<Mutex<Vec<Instant>>>,
    in_flight: Arc<AtomicU32>,
    max_in_flight: Arc<AtomicU32>,
}

impl Counting {
    async fn start(delay: Duration) -> Counting {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = Counting {
            addr: listener.local_addr().unwrap(),
            starts: Arc::default(),
            in_flight: Arc::default(),
            max_in_flight: Arc::default(),
        };
        let state = c.clone();
        let app = axum::Router::new().fallback(move || {
            let c = state.clone();
            async move {
                c.starts.lock().unwrap().push(Instant::now());
                let now = c.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                c.max_in_flight.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                c.in_flight.fetch_sub(1, Ordering::SeqCst);
                "ok"
            }
        });
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        c
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    fn starts(&self) -> Vec<Instant> {
        self.starts.lock().unwrap().clone()
    }
}

fn queue(name: &str, url: &str, limits: &str) -> String {
    format!(
        r#"
[queues.{name}]
delivery = "push"
[queues.{name}.push]
url = "{url}"
timeout = "5s"
{limits}
"#
    )
}

/// The share of `queue`'s endpoint that `s` shows once it counts `nodes` live nodes.
async fn share_when(s: &TestServer, nodes: u64) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, list) = s.get("/v1/endpoints").await;
        let eps = list["endpoints"].as_array().cloned().unwrap_or_default();
        if !eps.is_empty() && eps.iter().all(|e| e["share"]["nodes"] == nodes) {
            return eps;
        }
        assert!(
            Instant::now() < deadline,
            "not {nodes} nodes within 10 s: {list}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Three nodes push to two endpoints: a slow one (300 ms a call) with `concurrency = 3`,
/// and a quick one with `concurrency = 3` and `rate_limit = "24/s"`. Each node takes a
/// third: the slow endpoint never has more than 3 calls in flight (9 if each node took the
/// whole limit), and the quick one gets 24 calls/s, at most 10 % over (not 72).
#[tokio::test]
async fn three_nodes_share_an_endpoints_concurrency_and_rate_limit() {
    if !on_shared_store() {
        eprintln!(
            "skipped: a cluster needs a shared store (set REDRIVE_TEST_STORAGE_URL=postgres://…)"
        );
        return;
    }
    let slow = Counting::start(Duration::from_millis(300)).await;
    let quick = Counting::start(Duration::from_millis(20)).await;
    let config = format!(
        "[push]\nallow_cidrs = [\"127.0.0.1/32\"]\n{QUICK}{}{}",
        queue("slow", &slow.url(), "concurrency = 3"),
        queue(
            "paced",
            &quick.url(),
            "concurrency = 3\nrate_limit = \"24/s\""
        ),
    );
    let a = TestServer::start_shared(&config).await;
    let b = a.start_beside(&config).await;
    let c = a.start_beside(&config).await;
    let mut shares = Vec::new();
    for s in [&a, &b, &c] {
        shares.push(share_when(s, 3).await);
    }
    // The ranks are 0, 1, 2; each takes 1 call in flight and 8/s.
    let mut ranks: Vec<u64> = shares
        .iter()
        .map(|eps| eps[0]["share"]["rank"].as_u64().unwrap())
        .collect();
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 1, 2], "{shares:?}");
    for eps in &shares {
        for e in eps {
            assert_eq!(e["concurrency"], 3, "{e}");
            assert_eq!(e["share"]["concurrency"], 1, "{e}");
        }
        let paced = eps
            .iter()
            .find(|e| e["queues"] == json!(["paced"]))
            .unwrap();
        assert_eq!(paced["rate_limit_per_second"], 24.0, "{paced}");
        assert_eq!(paced["share"]["rate_limit_per_second"], 8.0, "{paced}");
    }

    let published = Instant::now();
    // A backlog for longer than the measurement: 300 for the rate (12 s at 24/s), 60 for the
    // slow endpoint (6 s at 3 × 1 / 300 ms).
    for chunk in 0..3 {
        let items: Vec<Value> = (0..100)
            .map(|i| json!({"payload": {"n": chunk * 100 + i}}))
            .collect();
        let (st, body) = a
            .post("/v1/queues/paced/messages", json!({"messages": items}))
            .await;
        assert_eq!(st, 201, "{body}");
    }
    let items: Vec<Value> = (0..60).map(|i| json!({"payload": {"n": i}})).collect();
    let (st, body) = a
        .post("/v1/queues/slow/messages", json!({"messages": items}))
        .await;
    assert_eq!(st, 201, "{body}");

    let window = Duration::from_secs(5);
    tokio::time::sleep(window + Duration::from_millis(800)).await;
    let starts = quick.starts();
    let first = *starts.first().expect("the paced endpoint got calls");
    let in_window = starts.iter().filter(|t| **t - first < window).count();
    let rate = in_window as f64 / window.as_secs_f64();
    let slow_calls = slow.starts().len();
    let slow_max = slow.max_in_flight.load(Ordering::SeqCst);
    let quick_max = quick.max_in_flight.load(Ordering::SeqCst);
    eprintln!(
        "push cluster test: 3 nodes, rate_limit 24/s: {in_window} calls in the first {:?} after the first one = {rate:.2}/s (first call {:?} after the publish); \
         concurrency 3 at 300 ms a call: at most {slow_max} in flight, {slow_calls} calls in {:?}; the quick endpoint had at most {quick_max} in flight",
        window,
        first.saturating_duration_since(published),
        published.elapsed()
    );
    assert!(slow_max <= 3, "{slow_max} calls in flight at once, limit 3");
    assert!(
        slow_max >= 2,
        "the nodes barely used the slow endpoint: {slow_max}"
    );
    assert!(
        quick_max <= 3,
        "{quick_max} calls in flight at once, limit 3"
    );
    // Over the limit is what the shares prevent: at most 10 % over. Under it is capacity,
    // which a loaded machine lacks (a CI run saw the rate miss the ± 10 % band): at least
    // three quarters of the limit, still far from one node's third of it.
    assert!(
        rate <= 24.0 * 1.1,
        "observed {rate:.2}/s, over the limit of 24/s (+ 10 %)"
    );
    assert!(
        rate >= 24.0 * 0.75,
        "observed {rate:.2}/s, the nodes used under three quarters of the limit of 24/s"
    );
    b.stop().await;
    c.stop().await;
    a.stop().await;
}

/// The state of `s`'s only endpoint.
async fn endpoint_state(s: &TestServer) -> Value {
    let (_, list) = s.get("/v1/endpoints").await;
    list["endpoints"][0].clone()
}

/// Two nodes push to one endpoint, each its own queue (node A's to `/a`, node B's to `/b`):
/// `/a` fails, `/b` answers 200. A's breaker opens on its own failures; B, whose calls all
/// succeed, holds its breaker for the same endpoint open within a second (it reads the
/// trip), and stops calling it: its messages wait.
#[tokio::test]
async fn a_breaker_opened_on_one_node_opens_on_the_other_within_a_second() {
    if !on_shared_store() {
        eprintln!(
            "skipped: a cluster needs a shared store (set REDRIVE_TEST_STORAGE_URL=postgres://…)"
        );
        return;
    }
    let ok_calls = Arc::new(AtomicU32::new(0));
    let calls = ok_calls.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new()
        .route(
            "/a",
            axum::routing::post(|| async {
                (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "down")
            }),
        )
        .route(
            "/b",
            axum::routing::post(move || {
                let calls = calls.clone();
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    "ok"
                }
            }),
        );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let node = |q: &str, path: &str, limits: &str| {
        format!(
            "[push]\nallow_cidrs = [\"127.0.0.1/32\"]\n{QUICK}{}\n[queues.{q}.retry]\nmax_attempts = 1000\nbackoff = \"fixed\"\ninitial_delay = \"50ms\"\njitter = \"none\"\n",
            queue(q, &format!("http://{addr}{path}"), limits)
        )
    };
    let a = TestServer::start_shared(&node("hooks_a", "/a", "concurrency = 4")).await;
    let b = a
        .start_beside(&node(
            "hooks_b",
            "/b",
            "concurrency = 4\nrate_limit = \"40/s\"",
        ))
        .await;
    share_when(&a, 2).await;
    share_when(&b, 2).await;

    // B delivers steadily (20/s, its share of 40/s).
    let items: Vec<Value> = (0..400).map(|i| json!({"payload": {"n": i}})).collect();
    let (st, body) = b
        .post("/v1/queues/hooks_b/messages", json!({"messages": items}))
        .await;
    assert_eq!(st, 201, "{body}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while ok_calls.load(Ordering::SeqCst) < 10 {
        assert!(Instant::now() < deadline, "B does not deliver");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A's endpoint starts failing: A's messages fail until its breaker opens.
    let items: Vec<Value> = (0..40).map(|i| json!({"payload": {"n": i}})).collect();
    let (st, body) = a
        .post("/v1/queues/hooks_a/messages", json!({"messages": items}))
        .await;
    assert_eq!(st, 201, "{body}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let a_opened = loop {
        if endpoint_state(&a).await["state"] == "open" {
            break Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "A's breaker never opened: {}",
            endpoint_state(&a).await
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let b_before = endpoint_state(&b).await;
    let b_opened = loop {
        let e = endpoint_state(&b).await;
        if e["state"] == "open" {
            break Instant::now();
        }
        assert!(
            a_opened.elapsed() < Duration::from_secs(3),
            "B's breaker not open 3 s after A's: {e}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let took = b_opened - a_opened;
    let b_open = endpoint_state(&b).await;
    // B's own calls all succeeded: it opened because A's did.
    assert_eq!(b_open["window_failures"], 0, "{b_open}");
    // Then B calls nothing (calls in flight at most) for the rest of A's open period.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let calls_then = ok_calls.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let calls_later = ok_calls.load(Ordering::SeqCst);
    let (_, q) = b.get("/v1/queues/hooks_b").await;
    eprintln!(
        "push cluster test: B's breaker (all of B's calls good) opened {took:?} after A's (trip poll {} ms); B before: state {} opened_total {}; \
         B's calls to the endpoint in the 2 s after: {}; hooks_b {}",
        redrive_server::engine::push::TRIP_POLL_MS,
        b_before["state"],
        b_before["opened_total"],
        calls_later - calls_then,
        q["counts"]
    );
    assert!(
        took < Duration::from_secs(1),
        "B's breaker opened {took:?} after A's"
    );
    assert!(
        calls_later - calls_then <= 2,
        "B kept calling the endpoint while its breaker was open: {} calls",
        calls_later - calls_then
    );
    // After A's period B probes by itself, and its endpoint (`/b`) answers: it delivers again.
    let deadline = Instant::now() + Duration::from_secs(15);
    while ok_calls.load(Ordering::SeqCst) <= calls_later + 5 {
        assert!(
            Instant::now() < deadline,
            "B never delivered again: {}",
            endpoint_state(&b).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    b.stop().await;
    a.stop().await;
}
