//! Power-cut tests of the real binary on [`lazyfs`], a FUSE filesystem that keeps every
//! write in memory until it is fsync'd and drops what was not on a simulated power cut.
//! `kill -9` alone cannot see a missing fsync (the OS page cache survives it); these can.
//!
//! - `power_cut_under_load_loses_nothing`: under publish / lease / ack / nack load,
//!   `kill -9` the server at a random moment, cut the power, restart on the same mount,
//!   count: acknowledged publishes lost 0, acked messages not done 0, acked messages
//!   delivered again 0. `REDRIVE_POWER_CUT_CYCLES` sets the cycles (default 5; a long run:
//!   `REDRIVE_POWER_CUT_CYCLES=30 cargo test -p redrive --test power_cut -- --nocapture`).
//! - `power_cut_catches_a_store_that_skips_fsync`: the same with
//!   `durability = "unsafe-buffered"` (no fsync per commit) must lose acknowledged
//!   writes — proof that the first test can fail.
//! - `fsync_eio_poisons_the_store_and_a_restart_recovers`: fsync of the WAL fails with
//!   `EIO` under load: the requests answer 503 `store_poisoned`, `/readyz` answers 503,
//!   every later write is refused, and after a power cut and a restart on a healthy disk
//!   everything answered 2xx is there and the server is ready and serves.
//!
//! Without `/dev/fuse` (or the right to mount) the tests print why and pass, except in CI
//! (`CI=true`), where that is a failure.

mod common;

use common::load::{check, Ledger, Load};
use common::{free_port, start_in, wait_ready, Node};
use lazyfs::{FsyncFault, LazyFs};
use redrive_core::SplitMix64;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const QUEUE: &str = "power";
/// Nacked messages come straight back and never die, so every message keeps circulating
/// until acked.
const CONFIG: &str = r#"
[queues.power.retry]
backoff = "fixed"
initial_delay = "0s"
jitter = "none"
max_attempts = 1000000
"#;
/// Producers and consumers each.
const WORKERS: u64 = 4;
/// Longest a load task may run; the tests kill the server or poison the store well before.
const LOAD_LIMIT: Duration = Duration::from_secs(30);

/// A lazyfs mount with the data directory on it and the config file off it (a config
/// written without fsync would itself be lost at the first power cut).
struct Rig {
    fs: LazyFs,
    data_dir: PathBuf,
    config_dir: tempfile::TempDir,
    port: u16,
    client: reqwest::Client,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

impl Rig {
    /// Mount, or `None` (test skipped, reason printed) where FUSE is unavailable off CI.
    fn new() -> Option<Self> {
        let backing = tempfile::tempdir().unwrap();
        let mnt = tempfile::tempdir().unwrap();
        let fs = match LazyFs::mount(backing.path(), mnt.path()) {
            Ok(fs) => fs,
            Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
                println!("power cut test skipped: cannot mount FUSE ({e}); CI=true makes this a failure");
                return None;
            }
            Err(e) => panic!(
                "cannot mount FUSE in CI: {e} (needs /dev/fuse, and fusermount3 from the fuse3 package unless root)"
            ),
        };
        Some(Self {
            fs,
            data_dir: mnt.path().join("data"),
            config_dir: tempfile::tempdir().unwrap(),
            port: free_port(),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
            _dirs: (mnt, backing),
        })
    }

    /// Start `redrive serve` on the mount and wait until it is ready.
    async fn start(&self, config: &str) -> Node {
        let mut node = start_in(self.config_dir.path(), &self.data_dir, self.port, config);
        assert!(
            wait_ready(&self.client, &mut node).await,
            "store did not open"
        );
        node
    }

    /// The load on `node`; `delayed` as [`Load::delayed`].
    fn load(
        &self,
        node: &Node,
        ledger: &Arc<Mutex<Ledger>>,
        next: &Arc<Mutex<u64>>,
        delayed: bool,
    ) -> Load {
        Load {
            client: self.client.clone(),
            base: node.base.clone(),
            queue: QUEUE.into(),
            ledger: ledger.clone(),
            next: next.clone(),
            delayed,
        }
    }
}

/// Start the producers and consumers.
fn spawn_load(load: &Load, rng: &mut SplitMix64) -> Vec<tokio::task::JoinHandle<()>> {
    let stop = Instant::now() + LOAD_LIMIT;
    let mut tasks = Vec::new();
    for _ in 0..WORKERS {
        tasks.push(tokio::spawn(load.clone().producer(stop)));
        tasks.push(tokio::spawn(load.clone().consumer(rng.next_u64(), stop)));
    }
    tasks
}

/// Until the load has had `n` publishes acknowledged (the client's own count: no server
/// state is waited on).
async fn until_published(ledger: &Arc<Mutex<Ledger>>, n: usize) {
    let deadline = Instant::now() + LOAD_LIMIT;
    while ledger.lock().unwrap().published.len() < n {
        assert!(
            Instant::now() < deadline,
            "the load did not reach {n} publishes"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `kill -9`, wait for the process to be gone (its files closed), then for the load.
async fn kill(mut node: Node, tasks: Vec<tokio::task::JoinHandle<()>>) {
    node.child.kill().unwrap();
    node.child.wait().unwrap();
    for t in tasks {
        let _ = t.await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn power_cut_under_load_loses_nothing() {
    let Some(rig) = Rig::new() else { return };
    let cycles: u32 = std::env::var("REDRIVE_POWER_CUT_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let next = Arc::new(Mutex::new(0u64));
    let mut rng = SplitMix64::new(0x90_4e6c);
    let (mut opened, mut cut_files, mut cut_bytes) = (0, 0, 0);
    for cycle in 0..cycles {
        let node = rig.start(CONFIG).await;
        opened += 1;
        let load = rig.load(&node, &ledger, &next, true);
        // Everything acknowledged before this power cut must be here, acked ones done.
        let snap = load.snapshot().await;
        let (lost, acked_not_done) = check(&ledger.lock().unwrap(), &snap);
        assert_eq!(lost, 0, "cycle {cycle}: acknowledged publishes lost");
        assert_eq!(acked_not_done, 0, "cycle {cycle}: acked messages not done");
        // Load, then kill -9 and cut the power at a random moment.
        let tasks = spawn_load(&load, &mut rng);
        tokio::time::sleep(Duration::from_millis(rng.between(150, 1200))).await;
        kill(node, tasks).await;
        let cut = rig.fs.power_cut();
        cut_files += cut.files;
        cut_bytes += cut.bytes;
    }
    // Final restart: count once more.
    let node = rig.start(CONFIG).await;
    opened += 1;
    let snap = rig.load(&node, &ledger, &next, true).snapshot().await;
    kill(node, Vec::new()).await;
    let l = ledger.lock().unwrap();
    let (lost, acked_not_done) = check(&l, &snap);
    println!(
        "power cut test: cycles={cycles} store_opened={opened}/{} acknowledged_publishes={} acked={} deliveries={} \
         fsyncs={} unsynced_dropped_files={cut_files} unsynced_dropped_bytes={cut_bytes} \
         lost={lost} acked_not_done={acked_not_done} acked_delivered_again={}",
        cycles + 1,
        l.published.len(),
        l.acked.len(),
        l.deliveries,
        rig.fs.stats().fsyncs,
        l.acked_redelivered
    );
    assert!(
        l.published.len() > 100,
        "the load generator did too little to prove anything"
    );
    assert!(!l.acked.is_empty());
    assert!(
        cut_bytes > 0,
        "no power cut dropped anything: nothing was tested"
    );
    assert_eq!(lost, 0, "acknowledged publishes lost");
    assert_eq!(acked_not_done, 0, "acked messages not done");
    assert_eq!(l.acked_redelivered, 0, "acked messages delivered again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn power_cut_catches_a_store_that_skips_fsync() {
    /// Cuts to try. Under continuous load the WAL is fsync'd only by a checkpoint pass, every
    /// 10 ms or so in this mode (`redrive_store_sqlite::checkpoint`), so a cut loses what was
    /// acknowledged since the last pass began, and misses when nothing was: on this 2-core
    /// machine 6 of 9 cuts missed in one run of three tests, and CI once saw five misses in a
    /// row. Each try takes a fraction of a second and the test stops at the first loss, so
    /// it tries until a miss of every one is negligible (0.7^30 ≈ 2e-5).
    /// Without the load's delayed share ([`Load::delayed`]): with it, on a loaded machine
    /// (the whole suite running) all five cuts once missed.
    const ATTEMPTS: u32 = 30;
    let Some(rig) = Rig::new() else { return };
    let config = format!("durability = \"unsafe-buffered\"\n{CONFIG}");
    let mut rng = SplitMix64::new(0xb0f_fe12);
    for attempt in 1..=ATTEMPTS {
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let next = Arc::new(Mutex::new(u64::from(attempt) * 1_000_000_000));
        let node = rig.start(&config).await;
        let load = rig.load(&node, &ledger, &next, false);
        let tasks = spawn_load(&load, &mut rng);
        // Cut in the middle of acknowledged traffic, after a burst of 2xx answers.
        until_published(&ledger, 500).await;
        kill(node, tasks).await;
        let cut = rig.fs.power_cut();
        let node = rig.start(&config).await;
        let snap = load.snapshot().await;
        kill(node, Vec::new()).await;
        let l = ledger.lock().unwrap();
        let (lost, acked_not_done) = check(&l, &snap);
        println!(
            "power cut test (unsafe-buffered): attempt={attempt} acknowledged_publishes={} acked={} \
             unsynced_dropped_bytes={} lost={lost} acked_not_done={acked_not_done}",
            l.published.len(),
            l.acked.len(),
            cut.bytes
        );
        if lost > 0 || acked_not_done > 0 {
            return;
        }
    }
    panic!("{ATTEMPTS} power cuts of a store that skips fsync lost nothing: the power cut test cannot fail");
}

/// `(status, code)` of an error answer, checking it is the JSON error shape.
fn error_code(status: u16, body: &Value) -> (u16, String) {
    let code = body["error"]["code"].as_str();
    assert!(
        code.is_some() && body["error"]["message"].is_string(),
        "not a JSON error: {status} {body}"
    );
    (status, code.unwrap_or_default().to_owned())
}

async fn answer(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fsync_eio_poisons_the_store_and_a_restart_recovers() {
    let Some(rig) = Rig::new() else { return };
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let next = Arc::new(Mutex::new(0u64));
    let mut rng = SplitMix64::new(0xe10);
    let node = rig.start(CONFIG).await;
    let c = &rig.client;
    // A message leased before the fault, to ack after it.
    let held = c
        .post(format!("{}/v1/queues/held/messages", node.base))
        .json(&json!({"payload": "held"}))
        .send()
        .await
        .unwrap();
    assert_eq!(held.status(), 201);
    let leased: Value = c
        .post(format!("{}/v1/queues/held/leases", node.base))
        .json(&json!({"max": 1, "lease": "5m"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let held = leased["messages"][0].clone();
    assert!(held["lease"].is_string(), "{leased}");

    // Load, then every fsync of the WAL fails while requests are in flight.
    let load = rig.load(&node, &ledger, &next, false);
    let tasks = spawn_load(&load, &mut rng);
    until_published(&ledger, 200).await;
    rig.fs
        .set_fsync_fault(FsyncFault::PathSuffix("redrive.db-wal".into()));
    // Every worker stops at its first refused request.
    for t in tasks {
        t.await.unwrap();
    }
    let failed_fsyncs = rig.fs.stats().failed_fsyncs;
    assert!(failed_fsyncs > 0, "no fsync was failed");
    let refused = ledger.lock().unwrap().refused.clone();
    assert_eq!(
        refused.len() as u64,
        2 * WORKERS,
        "every worker was refused"
    );
    for (status, body) in &refused {
        assert_eq!(
            error_code(*status, body),
            (503, "store_poisoned".into()),
            "in-flight request under EIO"
        );
    }
    // Poisoned: not ready, and every write is refused.
    let (status, body) = answer(c.get(format!("{}/readyz", node.base)).send().await.unwrap()).await;
    assert_eq!(error_code(status, &body), (503, "store_poisoned".into()));
    let writes = [
        (
            format!("{}/v1/queues/{QUEUE}/messages", node.base),
            json!({"payload": "after"}),
        ),
        (
            format!("{}/v1/queues/{QUEUE}/leases", node.base),
            json!({"max": 1}),
        ),
        (
            format!(
                "{}/v1/messages/{}/ack",
                node.base,
                held["id"].as_str().unwrap()
            ),
            json!({"lease": held["lease"]}),
        ),
    ];
    for (url, body) in &writes {
        let (status, answer) = answer(c.post(url).json(body).send().await.unwrap()).await;
        assert_eq!(
            error_code(status, &answer),
            (503, "store_poisoned".into()),
            "write after the fault: {url}"
        );
    }

    // Power cut, a healthy disk, a restart: everything answered 2xx is there.
    kill(node, Vec::new()).await;
    let cut = rig.fs.power_cut();
    rig.fs.set_fsync_fault(FsyncFault::Off);
    let node = rig.start(CONFIG).await;
    let load = rig.load(&node, &ledger, &next, false);
    let snap = load.snapshot().await;
    let (lost, acked_not_done) = check(&ledger.lock().unwrap(), &snap);
    let ready = c
        .get(format!("{}/readyz", node.base))
        .send()
        .await
        .unwrap()
        .status();
    // … and it serves: publish, lease, ack.
    let published = c
        .post(format!("{}/v1/queues/after/messages", node.base))
        .json(&json!({"payload": "after restart"}))
        .send()
        .await
        .unwrap();
    assert_eq!(published.status(), 201);
    let leased: Value = c
        .post(format!("{}/v1/queues/after/leases", node.base))
        .json(&json!({"max": 1}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let m = &leased["messages"][0];
    assert_eq!(m["payload"], "after restart", "{leased}");
    let acked = c
        .post(format!(
            "{}/v1/messages/{}/ack",
            node.base,
            m["id"].as_str().unwrap()
        ))
        .json(&json!({"lease": m["lease"]}))
        .send()
        .await
        .unwrap()
        .status();
    kill(node, Vec::new()).await;
    let l = ledger.lock().unwrap();
    println!(
        "fsync EIO test: acknowledged_publishes={} acked={} failed_fsyncs={failed_fsyncs} refused={} (all 503 store_poisoned) \
         unsynced_dropped_bytes={} lost={lost} acked_not_done={acked_not_done} ready_after_restart={} ack_after_restart={}",
        l.published.len(),
        l.acked.len(),
        refused.len(),
        cut.bytes,
        ready.as_u16(),
        acked.as_u16()
    );
    assert_eq!(lost, 0, "acknowledged publishes lost");
    assert_eq!(acked_not_done, 0, "acked messages not done");
    assert_eq!(ready, 200);
    assert_eq!(acked, 200);
}
