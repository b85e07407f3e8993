//! `redrive-bench --workload storm`: the retry-storm benchmark of push delivery (issue 7,
//! `../shared/design/downstream-protection.md`).
//!
//! Two mock endpoints run in this process, each with a fixed capacity (`--storm-capacity`
//! requests/s, a token bucket with a tenth of a second of burst; beyond it, 503 at once).
//! The server pushes queue `storm-on` to the first (protection on: the defaults) and
//! `storm-off` to the second (`breaker = false`, `retry_budget = 0`: plain backoff with
//! full jitter). Both queues get `--storm-rate` messages/s for `--storm-arrivals`. After
//! `--storm-before`, both endpoints go down for `--storm-outage`: first connections are
//! refused (`--storm-refused`), then every request is answered 503; then they recover.
//! The run ends when both queues have nothing left to deliver.
//!
//! Reported per queue: calls per message (every attempt redrive made, from its
//! `redrive_push_attempts_total`, refused connections included), calls during the outage
//! as a share of the messages published in it, the peak of requests/s the endpoint got
//! after recovery against its capacity, the time from recovery until the backlog is gone
//! (no message published before the recovery, or more than 2 s earlier, still undelivered;
//! messages that ended dead are not waited for) against the bound
//! (the first time capacity × elapsed covers the backlog at recovery plus what was
//! published since), and the dead letters.
//!
//! The server must be started with the two queues configured; `scripts/bench_storm.sh`
//! does it and prints the config.

use super::Ctx;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use redrive_client::cli::usage;
use redrive_core::format_duration_ms;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The queue with protection on.
pub const QUEUE_ON: &str = "storm-on";
/// The queue with protection off.
pub const QUEUE_OFF: &str = "storm-off";

/// Ids of the messages a publisher got a 2xx for, with the ms since the start it got it.
type PublishLog = Arc<Mutex<Vec<(String, u64)>>>;

/// The storm's shape, from the `--storm-*` flags.
#[derive(Debug, Clone)]
pub struct Shape {
    /// Messages per second per queue.
    pub rate: f64,
    /// Endpoint capacity, requests/s.
    pub capacity: f64,
    /// Time before the outage.
    pub before: Duration,
    /// The outage.
    pub outage: Duration,
    /// Its first part, with connections refused.
    pub refused: Duration,
    /// How long messages arrive.
    pub arrivals: Duration,
    /// Where the endpoint of `storm-on` listens.
    pub on: SocketAddr,
    /// Where the endpoint of `storm-off` listens.
    pub off: SocketAddr,
    /// Longest wait for the queues to drain after the arrivals.
    pub drain_timeout: Duration,
    /// The cluster's other nodes (`--also-server`): every node pushes, so the attempts are
    /// summed over all of them.
    pub other_nodes: Vec<redrive_client::Client>,
}

const UP: u8 = 0;
const REFUSED: u8 = 1;
const UNAVAILABLE: u8 = 2;

/// One mock endpoint's state and records (also the healthy endpoint of the `push`
/// workload, with an infinite capacity).
#[derive(Debug)]
pub(super) struct Mock {
    t0: Instant,
    phase: AtomicU8,
    capacity: f64,
    bucket: Mutex<(f64, Instant)>,
    /// Requests per second of the run: (accepted, answered 503).
    per_second: Mutex<Vec<(u32, u32)>>,
    /// Message id → ms since t0 of its first 2xx.
    first_ok: Mutex<HashMap<String, u64>>,
    pub(super) requests: AtomicU64,
    /// Publish → first 2xx, from the bench payload's `"t"` (µs since the epoch at send).
    latency: Mutex<super::stats::Samples>,
}

impl Mock {
    pub(super) fn new(t0: Instant, capacity: f64) -> Self {
        Self {
            t0,
            phase: AtomicU8::new(UP),
            capacity,
            bucket: Mutex::new((capacity / 10.0, t0)),
            per_second: Mutex::new(Vec::new()),
            first_ok: Mutex::new(HashMap::new()),
            requests: AtomicU64::new(0),
            latency: Mutex::new(super::stats::Samples::new()),
        }
    }

    /// Messages answered 2xx at least once.
    pub(super) fn delivered(&self) -> usize {
        self.first_ok
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// The latest first 2xx, ms since the start.
    pub(super) fn last_delivery_ms(&self) -> Option<u64> {
        let ok = self.first_ok.lock().unwrap_or_else(|e| e.into_inner());
        ok.values().max().copied()
    }

    /// Publish → first 2xx of every message delivered.
    pub(super) fn take_latency(&self) -> super::stats::Samples {
        std::mem::take(&mut *self.latency.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Take a token of the capacity bucket.
    fn admit(&self) -> bool {
        let mut b = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let burst = (self.capacity / 10.0).max(1.0);
        b.0 = (b.0 + now.duration_since(b.1).as_secs_f64() * self.capacity).min(burst);
        b.1 = now;
        if b.0 >= 1.0 {
            b.0 -= 1.0;
            true
        } else {
            false
        }
    }

    fn count(&self, accepted: bool) {
        let sec = self.t0.elapsed().as_secs() as usize;
        let mut v = self.per_second.lock().unwrap_or_else(|e| e.into_inner());
        if v.len() <= sec {
            v.resize(sec + 1, (0, 0));
        }
        if accepted {
            v[sec].0 += 1;
        } else {
            v[sec].1 += 1;
        }
    }
}

async fn answer(
    State(mock): State<Arc<Mock>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    mock.requests.fetch_add(1, Ordering::Relaxed);
    let phase = mock.phase.load(Ordering::Relaxed);
    if phase != UP || !mock.admit() {
        mock.count(false);
        let mut r = (StatusCode::SERVICE_UNAVAILABLE, "over capacity").into_response();
        if phase == REFUSED {
            // Going down: this connection closes after the answer.
            r.headers_mut()
                .insert("connection", axum::http::HeaderValue::from_static("close"));
        }
        return r;
    }
    mock.count(true);
    if let Some(id) = headers.get("webhook-id").and_then(|v| v.to_str().ok()) {
        let at = mock.t0.elapsed().as_millis() as u64;
        let first = {
            let mut ok = mock.first_ok.lock().unwrap_or_else(|e| e.into_inner());
            let first = !ok.contains_key(id);
            ok.entry(id.to_owned()).or_insert(at);
            first
        };
        let sent_us = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v["t"].as_i64());
        if let (true, Some(t)) = (first, sent_us) {
            let us = super::now_us() - t;
            mock.latency
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_us(us);
        }
    }
    StatusCode::OK.into_response()
}

/// Serve `mock` on `addr` until `down` turns true; then close every connection.
pub(super) async fn serve(
    addr: SocketAddr,
    mock: Arc<Mock>,
    mut down: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket
        .bind(addr)
        .map_err(|e| anyhow::anyhow!("storm endpoint cannot listen on {addr}: {e}"))?;
    let listener = socket.listen(1024)?;
    let app = axum::Router::new().fallback(answer).with_state(mock);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = down.wait_for(|d| *d).await;
        })
        .await?;
    Ok(())
}

/// Fail (a usage error naming `script`) unless the server pushes `queue` to `addr`.
pub(super) async fn expect_pushed(
    ctx: &Ctx,
    queue: &str,
    addr: SocketAddr,
    script: &str,
) -> anyhow::Result<()> {
    let endpoints: Value = serde_json::from_slice(
        &ctx.api
            .get_raw(&ctx.url(&["v1", "endpoints"]))
            .await
            .map_err(|e| anyhow::anyhow!("GET /v1/endpoints: {e}"))?,
    )?;
    let want = format!("http://{addr}");
    let found = endpoints["endpoints"].as_array().is_some_and(|list| {
        list.iter().any(|e| {
            e["endpoint"] == want.as_str()
                && e["queues"]
                    .as_array()
                    .is_some_and(|q| q.iter().any(|q| q == queue))
        })
    });
    if found {
        return Ok(());
    }
    Err(usage(format!(
        "the server does not push queue {queue} to {want}: start it with the config \
         {script} writes (GET /v1/endpoints said {endpoints})"
    )))
}

/// What one queue's run measured.
#[derive(Debug)]
struct Figures {
    published: u64,
    calls: f64,
    outage_published: u64,
    outage_calls: f64,
    peak_after: u32,
    drain_s: Option<f64>,
    bound_s: Option<f64>,
    dead: u64,
    done: u64,
}

impl Figures {
    /// Drain ÷ bound (SPEC §10: at most 1.3 for 15 s, 30 s and 60 s outages).
    fn drain_over_bound(&self) -> Option<f64> {
        match (self.drain_s, self.bound_s) {
            (Some(d), Some(b)) if b > 0.0 => Some(d / b),
            _ => None,
        }
    }
}

/// Run the storm and print its report.
pub async fn run(ctx: Arc<Ctx>, shape: Shape, json_out: bool) -> anyhow::Result<()> {
    // The server must push the two queues to our two endpoints.
    for (queue, addr) in [(QUEUE_ON, shape.on), (QUEUE_OFF, shape.off)] {
        expect_pushed(&ctx, queue, addr, "scripts/bench_storm.sh").await?;
    }
    let t0 = Instant::now();
    let mocks = [
        Arc::new(Mock::new(t0, shape.capacity)),
        Arc::new(Mock::new(t0, shape.capacity)),
    ];
    let addrs = [shape.on, shape.off];
    let queues = [QUEUE_ON, QUEUE_OFF];
    let mut downs = Vec::new();
    for i in 0..2 {
        let (tx, rx) = watch::channel(false);
        tokio::spawn(serve(addrs[i], mocks[i].clone(), rx));
        downs.push(tx);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let attempts_start = attempts(&ctx, &shape.other_nodes, &addrs).await?;
    // Publishers: one per queue, `rate` messages/s, ids and publish times recorded.
    let published: [PublishLog; 2] = Default::default();
    let mut publishers = Vec::new();
    for i in 0..2 {
        let (ctx, log, queue) = (ctx.clone(), published[i].clone(), queues[i]);
        let (rate, arrivals) = (shape.rate, shape.arrivals);
        publishers.push(tokio::spawn(async move {
            let url = ctx.url(&["v1", "queues", queue, "messages"]);
            let every = Duration::from_secs_f64(1.0 / rate);
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut n = 0u64;
            while t0.elapsed() < arrivals {
                tick.tick().await;
                let body = json!({"payload": {"n": n}}).to_string();
                n += 1;
                let (ctx, log) = (ctx.clone(), log.clone());
                let url = url.clone();
                tokio::spawn(async move {
                    if let Some(b) = ctx.post(&url, body).await {
                        if let Ok(v) = serde_json::from_slice::<Value>(&b) {
                            if let Some(id) = v["id"].as_str() {
                                let at = t0.elapsed().as_millis() as u64;
                                log.lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .push((id.to_owned(), at));
                            }
                        }
                    }
                });
            }
        }));
    }
    // The outage.
    let outage_start = shape.before;
    let outage_end = shape.before + shape.outage;
    tokio::time::sleep_until((t0 + outage_start).into()).await;
    let attempts_outage_start = attempts(&ctx, &shape.other_nodes, &addrs).await?;
    eprintln!(
        "storm: endpoints down (connections refused for {})",
        format_duration_ms(shape.refused.as_millis() as u64)
    );
    for i in 0..2 {
        mocks[i].phase.store(REFUSED, Ordering::SeqCst);
        let _ = downs[i].send(true);
    }
    tokio::time::sleep(shape.refused.min(shape.outage)).await;
    eprintln!("storm: endpoints answer 503");
    let mut ups = Vec::new();
    for i in 0..2 {
        mocks[i].phase.store(UNAVAILABLE, Ordering::SeqCst);
        let (tx, rx) = watch::channel(false);
        tokio::spawn(serve(addrs[i], mocks[i].clone(), rx));
        ups.push(tx);
    }
    tokio::time::sleep_until((t0 + outage_end).into()).await;
    let attempts_outage_end = attempts(&ctx, &shape.other_nodes, &addrs).await?;
    eprintln!("storm: endpoints recovered");
    for m in &mocks {
        m.phase.store(UP, Ordering::SeqCst);
    }
    for p in publishers {
        let _ = p.await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await; // the last publishes' answers
    eprintln!("storm: arrivals over; waiting for both queues to drain");
    let deadline = Instant::now() + shape.drain_timeout;
    loop {
        let mut pending = 0;
        for q in queues {
            let v: Value = serde_json::from_slice(
                &ctx.api
                    .get_raw(&ctx.url(&["v1", "queues", q]))
                    .await
                    .map_err(|e| anyhow::anyhow!("GET /v1/queues/{q}: {e}"))?,
            )?;
            for st in ["scheduled", "ready", "leased"] {
                pending += v["counts"][st].as_u64().unwrap_or(0);
            }
        }
        if pending == 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let attempts_end = attempts(&ctx, &shape.other_nodes, &addrs).await?;
    let mut figures = Vec::new();
    for i in 0..2 {
        let v: Value = serde_json::from_slice(
            &ctx.api
                .get_raw(&ctx.url(&["v1", "queues", queues[i]]))
                .await
                .map_err(|e| anyhow::anyhow!("GET /v1/queues: {e}"))?,
        )?;
        let log = published[i]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let first_ok = mocks[i]
            .first_ok
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let per_second = mocks[i]
            .per_second
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let rec_ms = outage_end.as_millis() as u64;
        let (drain_s, bound_s) = drain(&log, &first_ok, rec_ms, shape.capacity);
        figures.push(Figures {
            published: log.len() as u64,
            calls: attempts_end[i] - attempts_start[i],
            outage_published: log
                .iter()
                .filter(|(_, at)| (outage_start.as_millis() as u64..rec_ms).contains(at))
                .count() as u64,
            outage_calls: attempts_outage_end[i] - attempts_outage_start[i],
            peak_after: per_second
                .iter()
                .skip(outage_end.as_secs() as usize)
                .map(|(a, r)| a + r)
                .max()
                .unwrap_or(0),
            drain_s,
            bound_s,
            dead: v["counts"]["dead"].as_u64().unwrap_or(0),
            done: v["counts"]["done"].as_u64().unwrap_or(0),
        });
    }
    print(&shape, &figures, json_out);
    Ok(())
}

/// `redrive_push_attempts_total` of each endpoint (every result), summed over the server
/// and `others` (the other nodes of its cluster).
async fn attempts(
    ctx: &Ctx,
    others: &[redrive_client::Client],
    addrs: &[SocketAddr; 2],
) -> anyhow::Result<[f64; 2]> {
    let mut out = [0.0; 2];
    for api in std::iter::once(&ctx.api).chain(others) {
        let text = api
            .metrics_text()
            .await
            .map_err(|e| anyhow::anyhow!("GET /metrics: {e}"))?;
        for (i, addr) in addrs.iter().enumerate() {
            let label = format!("endpoint=\"http://{addr}\"");
            out[i] += text
                .lines()
                .filter(|l| l.starts_with("redrive_push_attempts_total{") && l.contains(&label))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>();
        }
    }
    Ok(out)
}

/// Seconds from recovery until the backlog is gone (every message published before the
/// recovery, or more than 2 s earlier, delivered), and the bound: the first time `capacity` × elapsed covers the
/// messages undelivered at recovery plus those published since (up to 2 s before).
fn drain(
    log: &[(String, u64)],
    first_ok: &HashMap<String, u64>,
    rec_ms: u64,
    capacity: f64,
) -> (Option<f64>, Option<f64>) {
    const LAG_MS: u64 = 2_000;
    // A message never delivered is dead by the end of the run (it waits for nothing
    // pending): it holds no backlog, and is counted as dead instead.
    let mut by_publish: Vec<(u64, Option<u64>)> = log
        .iter()
        .filter_map(|(id, at)| first_ok.get(id).map(|d| (*at, Some(*d))))
        .collect();
    by_publish.sort_unstable();
    let end = by_publish
        .iter()
        .filter_map(|(_, d)| *d)
        .max()
        .unwrap_or(rec_ms)
        .max(rec_ms);
    let undelivered_at_rec = by_publish
        .iter()
        .filter(|(p, d)| *p < rec_ms && d.is_none_or(|d| d >= rec_ms))
        .count() as f64;
    let mut drain = None;
    let mut bound = None;
    let mut t = rec_ms;
    while t <= end + 1_000 {
        // Everything published before recovery counts; after it, what is older than the lag.
        let cutoff = t.saturating_sub(LAG_MS).max(rec_ms.saturating_sub(1));
        if drain.is_none()
            && by_publish
                .iter()
                .take_while(|(p, _)| *p <= cutoff)
                .all(|(_, d)| d.is_some_and(|d| d <= t))
        {
            drain = Some((t - rec_ms) as f64 / 1000.0);
        }
        if bound.is_none() {
            let since = by_publish
                .iter()
                .filter(|(p, _)| *p >= rec_ms && *p <= cutoff)
                .count() as f64;
            if capacity * (t - rec_ms) as f64 / 1000.0 >= undelivered_at_rec + since {
                bound = Some((t - rec_ms) as f64 / 1000.0);
            }
        }
        if drain.is_some() && bound.is_some() {
            break;
        }
        t += 100;
    }
    (drain, bound)
}

fn print(shape: &Shape, figures: &[Figures], json_out: bool) {
    let names = ["on (defaults)", "off (backoff + full jitter only)"];
    if json_out {
        let rows: Vec<Value> = figures
            .iter()
            .zip(names)
            .map(|(f, n)| {
                json!({
                    "protection": n,
                    "published": f.published,
                    "calls": f.calls,
                    "calls_per_message": f.calls / f.published.max(1) as f64,
                    "outage_published": f.outage_published,
                    "outage_calls": f.outage_calls,
                    "outage_calls_share": f.outage_calls / f.outage_published.max(1) as f64,
                    "peak_calls_per_s_after_recovery": f.peak_after,
                    "peak_over_capacity": f64::from(f.peak_after) / shape.capacity,
                    "drain_s": f.drain_s,
                    "drain_bound_s": f.bound_s,
                    "drain_over_bound": f.drain_over_bound(),
                    "dead": f.dead,
                    "done": f.done,
                })
            })
            .collect();
        super::print_json(
            &json!({"workload": "storm", "capacity": shape.capacity, "rate": shape.rate, "outage_s": shape.outage.as_secs_f64(), "runs": rows}),
        );
        return;
    }
    println!(
        "storm: {} msg/s per queue for {}, endpoint capacity {}/s, down for {} after {} ({} refused, then 503)",
        shape.rate,
        format_duration_ms(shape.arrivals.as_millis() as u64),
        shape.capacity,
        format_duration_ms(shape.outage.as_millis() as u64),
        format_duration_ms(shape.before.as_millis() as u64),
        format_duration_ms(shape.refused.as_millis() as u64),
    );
    println!("| protection | published | calls per message | outage calls / outage messages | peak calls/s after recovery (÷ capacity) | drain after recovery (bound: ×) | dead | done |");
    println!("|---|---|---|---|---|---|---|---|");
    let secs = |s: Option<f64>| s.map_or("not drained".to_owned(), |s| format!("{s:.1} s"));
    for (f, n) in figures.iter().zip(names) {
        let ratio = f
            .drain_over_bound()
            .map_or(String::new(), |r| format!(": {r:.2}×"));
        println!(
            "| {n} | {} | {:.3} | {:.0} / {} ({:.2} %) | {} ({:.2}×) | {} ({}{ratio}) | {} | {} |",
            f.published,
            f.calls / f.published.max(1) as f64,
            f.outage_calls,
            f.outage_published,
            100.0 * f.outage_calls / f.outage_published.max(1) as f64,
            f.peak_after,
            f64::from(f.peak_after) / shape.capacity,
            secs(f.drain_s),
            secs(f.bound_s),
            f.dead,
            f.done,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_and_bound_follow_the_definitions() {
        // 10 messages published 0..900 ms, undelivered until recovery at 1 s; delivered
        // at 1.0 s … 1.9 s; capacity 10/s: the bound is 1 s after recovery.
        let log: Vec<(String, u64)> = (0..10).map(|i| (format!("m{i}"), i * 100)).collect();
        let ok: HashMap<String, u64> = (0..10)
            .map(|i| (format!("m{i}"), 1_000 + i * 100))
            .collect();
        let (d, b) = drain(&log, &ok, 1_000, 10.0);
        assert_eq!(b, Some(1.0));
        assert_eq!(d, Some(0.9));
        // One never delivered (dead): it holds no backlog.
        let mut ok2 = ok.clone();
        ok2.remove("m9");
        assert_eq!(drain(&log, &ok2, 1_000, 10.0).0, Some(0.8));
    }
}
