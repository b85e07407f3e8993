//! The multi-node fault harness (SPEC §13, issue 17 §3, issue 18 on MariaDB): three
//! `redrive serve` nodes on one PostgreSQL schema (or one MariaDB database) under publish /
//! lease / ack-on-another-node / nack load, with faults on a schedule, then a checker that
//! reads what every client saw.
//!
//! `REDRIVE_CLUSTER_FAULT_STORE` picks the database: `postgres` (the default: the local
//! cluster, `postgres://root@127.0.0.1:5432/test`) or `mysql` (the local MariaDB,
//! `mysql://root@127.0.0.1:3306`, no password).
//!
//! **Like `pg_faults.rs`, this binary restarts the local PostgreSQL (`pg_ctlcluster`, as
//! root) and terminates backends: nothing else may use that PostgreSQL while it runs.** On
//! MariaDB, like `mysql_faults.rs`, it stops and starts the local MariaDB (`mysqladmin
//! shutdown`, `start-stop-daemon --start --exec /usr/sbin/mariadbd`, as root) and kills
//! connections, holding the file lock `/tmp/mariadb-faults.lock` for its whole run (run
//! other MariaDB tests beside it under the same lock: `flock /tmp/mariadb-faults.lock cargo
//! test …`); MariaDB is up again when it ends, failed or not.
//!
//! - **Nodes**: `n0`, `n1`, `n2`, one schema `redrive_cluster_<random>` (on MariaDB a
//!   database of that name; dropped at the end), heartbeat 200 ms, leadership lease 2 s.
//!   `n2` runs with Debian's libfaketime preloaded (`FAKETIME=+5m`, package `faketime`): its
//!   clock is five minutes ahead for the whole run (both stores take every transition's
//!   time from the database's clock, PostgreSQL's `now()`, MySQL's `NOW(3)`).
//! - **Load** (every request to a node picked at random, the down ones included): producers
//!   publish to a plain queue (batches of 5) and to a queue with `ordering = "key"` (one
//!   message per request; each producer owns its keys and numbers their messages, so the
//!   order of a key's acknowledged publishes is known). Consumers lease up to 10 for 2 s,
//!   then ack 70 % and nack 30 % **on another node** than the one that leased; a settle
//!   with no answer is tried again on the third node. One lease batch in 50 is held past its
//!   expiry before it is settled (a slow consumer: the server must refuse those settles).
//! - **Faults**, one after another with a few seconds of load between: `kill -9` a node and
//!   start it again; `SIGSTOP` a node for the lease + 1 s, then `SIGCONT`; restart
//!   PostgreSQL (`pg_ctlcluster restart`; MariaDB: stopped and started); terminate every
//!   connection of the nodes (`pg_terminate_backend`; MariaDB: `KILL <id>` of every
//!   connection on the database in `information_schema.processlist`). The skewed node takes
//!   its turn like the others.
//! - **Then** the load stops, every node is up, and a drain acks every message (leased on
//!   one node, acked on another) until every message of both queues is `done`.
//! - **The checker** ([`check`]) counts, from the clients' own records (times are this
//!   process's wall clock, the machine's, which is also the database's; a node's skewed
//!   clock never enters):
//!   - acknowledged publishes lost (a 2xx publish whose message is not in the final export);
//!   - acks answered 200 whose message is not `done` at the end;
//!   - deliveries after a successful ack (a lease requested after an ack of that message
//!     was answered 200);
//!   - messages acked 200 under two different leases;
//!   - two leases of one message that overlapped while both unexpired and unsettled (each
//!     lease lasts from its answer until its expiry or the first settle sent for it);
//!   - settles answered 200 whose lease had expired when the first settle of it was sent
//!     (a retry of a settle that committed unanswered is answered 200 as a repeat), and
//!     settles refused
//!     `lease_expired` or `lease_mismatch` that were sent and answered before it expired;
//!   - per-key order broken: a message of a key leased before an earlier message of that
//!     key (both publishes acknowledged, the earlier one answered before the later was
//!     sent) was acked;
//!   - answers that are none of: a 2xx, 503 `store_unavailable`, 409 `lease_*`, no answer;
//!   - messages not `done` when the drain gave up (nothing moved for 30 s).
//!
//!   Every count must be 0. The checker's own tests (below) feed it histories with each
//!   violation planted and check that it counts them.
//! - **A planted bug**: built with the feature `planted-bug-early-expiry` (the scheduler's
//!   tick hands the store this node's clock a second ahead, so leases expire a second
//!   early: the class of bug the harness found on its first run), it must find violations
//!   instead:
//!   `cargo test -p redrive --features planted-bug-early-expiry --test cluster_faults --
//!   --nocapture`. docs/DURABILITY.md has what it found.
//!
//! `REDRIVE_CLUSTER_FAULT_SECS` sets how long faults go on (default 45; the long run in
//! docs/DURABILITY.md used 1800). The figures go to stdout (`-- --nocapture`): `cluster fault
//! test: store=postgres` (or `store=mysql`).

mod common;

use common::mysql::{self as my, ensure_mysql_up, MysqlUp};
use common::pg::{ensure_pg_up, pg_ctl, psql, PgUp, Schema, PG_URL};
use common::{cluster_view, free_port, start_wrapped, wait_ready, Node};
use redrive_client::{
    BatchItem, BatchResult, Client, Error, ExportFormat, Filter, LeaseRequest, NackError, Publish,
};
use redrive_core::{ErrorClass, SplitMix64, Timestamp};
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NODES: usize = 3;
/// The node run with its clock five minutes ahead.
const SKEWED: usize = 2;
const SKEW: &str = "+5m";
/// Debian's libfaketime (package `faketime`).
const FAKETIME_LIB: &str = "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
/// Every lease of the load and the drain.
const LEASE_MS: i64 = 2_000;
/// Slack for comparing this process's clock with the database's (the same machine clock;
/// the server rounds to milliseconds).
const MARGIN_MS: i64 = 5;
const PLAIN: &str = "plain";
const ORDERED: &str = "ordered";
const SCHEMA_PREFIX: &str = "redrive_cluster";
/// Whether this build carries the planted bug: then the checker must find violations.
const PLANTED: bool = cfg!(feature = "planted-bug-early-expiry");

/// This process's wall clock, ms since the epoch.
fn wall() -> i64 {
    Timestamp::now().as_millis()
}

/// The database the three nodes share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Postgres,
    Mysql,
}

impl Backend {
    /// `REDRIVE_CLUSTER_FAULT_STORE`: `postgres` (or unset) or `mysql`.
    fn from_env() -> Backend {
        match std::env::var("REDRIVE_CLUSTER_FAULT_STORE").as_deref() {
            Err(_) | Ok("" | "postgres") => Backend::Postgres,
            Ok("mysql") => Backend::Mysql,
            Ok(other) => panic!("REDRIVE_CLUSTER_FAULT_STORE={other}: postgres or mysql"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::Mysql => "mysql",
        }
    }

    /// The database up, and what the test holds until it ends: a guard that starts the
    /// database again (also when the test fails half-way) and, on MariaDB, the fault
    /// tests' file lock (released after the guard has run).
    async fn hold(self) -> Held {
        match self {
            Backend::Postgres => {
                ensure_pg_up();
                Held::Postgres(PgUp)
            }
            Backend::Mysql => {
                let lock = tokio::task::spawn_blocking(my::lock).await.unwrap();
                ensure_mysql_up();
                Held::Mysql(
                    MysqlUp {
                        prefix: SCHEMA_PREFIX,
                    },
                    lock,
                )
            }
        }
    }
}

/// See [`Backend::hold`] (fields drop in order: the database up, then the lock released).
#[allow(dead_code)]
enum Held {
    Postgres(PgUp),
    Mysql(MysqlUp, std::fs::File),
}

/// Where the nodes keep their store: a PostgreSQL schema, or a MariaDB database.
enum Place {
    Postgres(Schema),
    Mysql(my::Database),
}

// ---------------------------------------------------------------------------------------
// What the clients saw.

/// How a request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// A 2xx (for a batch item: 200).
    Ok,
    /// A non-2xx answer with this error code.
    Refused(String),
    /// No answer (refused connection, cut short, timed out).
    Unknown,
}

/// One message handed to a consumer.
#[derive(Debug, Clone)]
struct Delivery {
    id: String,
    token: String,
    /// The node that leased it.
    node: usize,
    /// `(key, seq)` of a message of the ordered queue.
    ordered: Option<(String, u64)>,
    /// When the lease request was sent and answered, and the lease's expiry (the server's).
    sent: i64,
    answered: i64,
    expires: i64,
}

/// One settle (ack or nack) of one leased message, on one node.
#[derive(Debug, Clone)]
struct Settle {
    id: String,
    token: String,
    /// The node it was sent to.
    node: usize,
    ack: bool,
    sent: i64,
    answered: i64,
    outcome: Outcome,
}

#[derive(Debug, Default)]
struct History {
    /// Publishes answered 2xx: id → queue.
    published: HashMap<String, String>,
    /// The ordered queue's publishes answered 2xx: `(key, seq)` → answered at.
    ordered_published: HashMap<(String, u64), i64>,
    /// `(key, seq)` → when its publish was sent (whatever the answer).
    ordered_sent: HashMap<(String, u64), i64>,
    deliveries: Vec<Delivery>,
    settles: Vec<Settle>,
    /// Answers that are none of those a fault may cause: (what, status, code).
    unexpected: Vec<String>,
    /// Requests, and how many got no answer / 503 / 409.
    requests: u64,
    no_answer: u64,
    unavailable: u64,
    conflicts: u64,
}

impl History {
    /// Count a failed request; note it if a fault cannot explain it.
    fn failed(&mut self, what: &str, e: &Error) -> Outcome {
        self.requests += 1;
        match e {
            Error::Api { status, code, .. } => {
                if *status == 503 && code == "store_unavailable" {
                    self.unavailable += 1;
                } else if *status == 409 && code.starts_with("lease_") {
                    self.conflicts += 1;
                } else {
                    self.unexpected.push(format!("{what}: {status} {code}"));
                }
                Outcome::Refused(code.clone())
            }
            Error::Decode { url, source } => {
                self.unexpected.push(format!("{what}: {url}: {source}"));
                Outcome::Unknown
            }
            _ => {
                self.no_answer += 1;
                Outcome::Unknown
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The checker.

/// What the checker counted: every field must be 0.
#[derive(Debug, Default)]
struct Violations {
    /// A few of each kind, for the reader of a failed run (not counted).
    examples: Vec<String>,
    lost: usize,
    acked_not_done: usize,
    redelivered_after_ack: usize,
    acked_twice: usize,
    overlapping_leases: usize,
    late_settles_accepted: usize,
    valid_settles_refused: usize,
    order_broken: usize,
    unexpected_answers: usize,
    /// Messages not `done` when the drain gave up.
    stuck: usize,
}

impl Violations {
    /// Keep `what` as an example, at most 5 of each kind.
    fn example(&mut self, kind: &str, what: String) {
        if self.examples.iter().filter(|e| e.starts_with(kind)).count() < 5 {
            self.examples.push(format!("{kind}: {what}"));
        }
    }

    /// Every count, on one line.
    fn counts(&self) -> String {
        format!(
            "lost={} acked_not_done={} redelivered_after_ack={} acked_twice={} \
             overlapping_leases={} late_settles_accepted={} valid_settles_refused={} \
             order_broken={} unexpected_answers={} stuck={}",
            self.lost,
            self.acked_not_done,
            self.redelivered_after_ack,
            self.acked_twice,
            self.overlapping_leases,
            self.late_settles_accepted,
            self.valid_settles_refused,
            self.order_broken,
            self.unexpected_answers,
            self.stuck
        )
    }

    fn total(&self) -> usize {
        self.lost
            + self.acked_not_done
            + self.redelivered_after_ack
            + self.acked_twice
            + self.overlapping_leases
            + self.late_settles_accepted
            + self.valid_settles_refused
            + self.order_broken
            + self.unexpected_answers
            + self.stuck
    }
}

/// Count the violations in `h`, given the final state of every message (`final_state`: id →
/// state).
fn check(h: &History, final_state: &HashMap<String, String>) -> Violations {
    let mut v = Violations {
        lost: h
            .published
            .keys()
            .filter(|id| !final_state.contains_key(*id))
            .count(),
        unexpected_answers: h.unexpected.len(),
        stuck: final_state.values().filter(|s| *s != "done").count(),
        ..Violations::default()
    };
    // Settles by (id, token); successful acks by id.
    let mut settles: HashMap<(&str, &str), Vec<&Settle>> = HashMap::new();
    let mut acks_ok: HashMap<&str, Vec<&Settle>> = HashMap::new();
    for s in &h.settles {
        settles.entry((&s.id, &s.token)).or_default().push(s);
        if s.ack && s.outcome == Outcome::Ok {
            acks_ok.entry(&s.id).or_default().push(s);
        }
    }
    for (id, acks) in &acks_ok {
        if final_state.get(*id).map(String::as_str) != Some("done") {
            v.acked_not_done += 1;
        }
        let tokens: HashSet<&str> = acks.iter().map(|a| a.token.as_str()).collect();
        if tokens.len() > 1 {
            v.acked_twice += 1;
            v.example("acked_twice", format!("{acks:?}"));
        }
    }
    let mut deliveries: HashMap<&str, Vec<&Delivery>> = HashMap::new();
    for d in &h.deliveries {
        deliveries.entry(&d.id).or_default().push(d);
        // A lease asked for after an ack of the message was answered 200.
        let first_ack_answered = acks_ok
            .get(d.id.as_str())
            .and_then(|acks| acks.iter().map(|a| a.answered).min());
        if first_ack_answered.is_some_and(|at| at < d.sent) {
            v.redelivered_after_ack += 1;
            v.example("redelivered_after_ack", format!("{d:?}"));
        }
        // Settles answered 200 whose lease had expired before the first settle of it was
        // sent (a retry of a settle that committed without an answer is answered 200 as a
        // repeat: only the first sending counts).
        let attempts = settles.get(&(&*d.id, &*d.token));
        let first_sent = attempts.into_iter().flatten().map(|s| s.sent).min();
        for s in attempts.into_iter().flatten() {
            let late = first_sent.is_some_and(|f| f > d.expires + MARGIN_MS);
            if s.outcome == Outcome::Ok && late {
                v.late_settles_accepted += 1;
                v.example("late_settle_accepted", format!("{d:?} {s:?}"));
            }
            // Sent and answered while the lease was valid, yet told it had none.
            let lost_lease = matches!(&s.outcome,
                Outcome::Refused(c) if c == "lease_expired" || c == "lease_mismatch");
            if lost_lease && s.answered + MARGIN_MS < d.expires {
                v.valid_settles_refused += 1;
                v.example("valid_settle_refused", format!("{d:?} {s:?}"));
            }
        }
    }
    // Two leases of one message, both unexpired and unsettled at once: lease a lasts at
    // least from its answer until the earlier of its expiry and its first settle's sending.
    let end = |d: &Delivery| -> i64 {
        let first_settle = settles
            .get(&(&*d.id, &*d.token))
            .into_iter()
            .flatten()
            .map(|s| s.sent)
            .min();
        first_settle.map_or(d.expires, |s| s.min(d.expires))
    };
    for ds in deliveries.values() {
        for (i, a) in ds.iter().enumerate() {
            for b in &ds[i + 1..] {
                if a.token != b.token
                    && a.answered + MARGIN_MS < end(b)
                    && b.answered + MARGIN_MS < end(a)
                {
                    v.overlapping_leases += 1;
                    v.example("overlapping_leases", format!("{a:?} {b:?}"));
                }
            }
        }
    }
    // Per-key order: a delivery of (key, s) while an earlier acknowledged (key, s') was
    // not acked yet (its successful ack was sent after this delivery was answered). Only
    // pairs whose order is known: s' answered 2xx before s was sent.
    // When (key, seq) was acked at the earliest: the first ack sent under a lease one of
    // whose acks was answered 200 (an ack with no answer may have committed before the
    // retry that answered).
    let mut acked_at: HashMap<(&str, u64), i64> = HashMap::new();
    for d in &h.deliveries {
        let Some((key, seq)) = &d.ordered else {
            continue;
        };
        let attempts = settles.get(&(&*d.id, &*d.token));
        let acks = attempts.into_iter().flatten().filter(|s| s.ack);
        if acks.clone().any(|s| s.outcome == Outcome::Ok) {
            if let Some(first) = acks.map(|s| s.sent).min() {
                let at = acked_at.entry((key.as_str(), *seq)).or_insert(first);
                *at = (*at).min(first);
            }
        }
    }
    for d in &h.deliveries {
        let Some((key, seq)) = &d.ordered else {
            continue;
        };
        let Some(sent) = h.ordered_sent.get(&(key.clone(), *seq)) else {
            continue;
        };
        for earlier in 0..*seq {
            let known_before = h
                .ordered_published
                .get(&(key.clone(), earlier))
                .is_some_and(|answered| answered < sent);
            if !known_before {
                continue;
            }
            if acked_at
                .get(&(key.as_str(), earlier))
                .is_some_and(|acked| *acked > d.answered)
            {
                v.order_broken += 1;
                v.example(
                    "order_broken",
                    format!("{d:?} before ({key}, {earlier}) was acked"),
                );
                break;
            }
        }
    }
    v
}

// ---------------------------------------------------------------------------------------
// The cluster.

/// Three nodes on one schema (or database), on fixed ports (a restarted node comes back on
/// its own).
struct Cluster {
    /// First: the nodes are killed before their schema is dropped.
    nodes: Vec<Option<Node>>,
    place: Place,
    dirs: Vec<tempfile::TempDir>,
    ports: Vec<u16>,
}

impl Cluster {
    fn new(backend: Backend) -> Cluster {
        Cluster {
            nodes: (0..NODES).map(|_| None).collect(),
            place: match backend {
                Backend::Postgres => Place::Postgres(Schema::fresh(SCHEMA_PREFIX)),
                Backend::Mysql => Place::Mysql(my::Database::fresh(SCHEMA_PREFIX)),
            },
            dirs: (0..NODES).map(|_| tempfile::tempdir().unwrap()).collect(),
            ports: (0..NODES).map(|_| free_port()).collect(),
        }
    }

    fn base(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[i])
    }

    /// Start node `i` (the skewed one under `faketime`) and wait until it is ready.
    async fn start(&mut self, i: usize, client: &reqwest::Client) {
        let (storage, url) = match &self.place {
            // Its connections carry the schema's name, for `pg_terminate_backend`.
            Place::Postgres(schema) => (
                format!("storage_schema = \"{}\"\n", schema.0),
                format!("{PG_URL}?application_name={}", schema.0),
            ),
            // Its connections are those on its database, for `KILL`.
            Place::Mysql(db) => (String::new(), db.url()),
        };
        let config = format!(
            "{storage}\
             [cluster]\nnode = \"n{i}\"\nheartbeat_interval = \"200ms\"\nleader_lease = \"2s\"\n\
             [queues.{PLAIN}.retry]\nbackoff = \"fixed\"\ninitial_delay = \"0s\"\njitter = \"none\"\nmax_attempts = 1000000\n\
             [queues.{ORDERED}]\nordering = \"key\"\n\
             [queues.{ORDERED}.retry]\nbackoff = \"fixed\"\ninitial_delay = \"0s\"\njitter = \"none\"\nmax_attempts = 1000000\n"
        );
        // libfaketime preloaded by `env`, which execs the binary: the node's pid is the
        // server's own (the `faketime` front end forks, and a signal to it would miss).
        let preload = format!("FAKETIME={SKEW}");
        let wrapper: &[&str] = if i == SKEWED {
            &["env", FAKETIME_LIB, &preload]
        } else {
            &[]
        };
        let dir = self.dirs[i].path();
        let mut node = start_wrapped(
            wrapper,
            dir,
            &dir.join("data"),
            self.ports[i],
            &config,
            &["--storage-url", &url],
            Some(&dir.join("node.log")),
        );
        assert!(
            wait_ready(client, &mut node).await,
            "node n{i} did not start"
        );
        self.nodes[i] = Some(node);
    }

    /// What every node's log says, read once: the lines no fault explains, each prefixed
    /// with its node (a store error answered 500, `storage backend error`; a panic, of a
    /// request or of a background service; errors a fault causes, such as a failed tick
    /// while the database is down, are not among them), and how many transactions the store
    /// gave up after conflicts (answered 503: not a violation, a sign of contention).
    fn read_logs(&self) -> (Vec<String>, usize) {
        let (mut unexplained, mut give_ups) = (Vec::new(), 0);
        for (i, dir) in self.dirs.iter().enumerate() {
            let text = std::fs::read_to_string(dir.path().join("node.log")).unwrap_or_default();
            for l in text.lines() {
                if l.contains("storage backend error") || l.contains("panicked") {
                    unexplained.push(format!("n{i}: {l}"));
                }
                give_ups += usize::from(l.contains("kept conflicting"));
            }
        }
        (unexplained, give_ups)
    }

    fn pid(&self, i: usize) -> u32 {
        self.nodes[i].as_ref().expect("node running").child.id()
    }

    fn kill_9(&mut self, i: usize) {
        if let Some(mut node) = self.nodes[i].take() {
            node.child.kill().unwrap();
            node.child.wait().unwrap();
        }
    }

    fn signal(&self, i: usize, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([sig, &self.pid(i).to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} n{i}");
    }
}

// ---------------------------------------------------------------------------------------
// The load.

/// What every load task shares.
#[derive(Clone)]
struct Load {
    http: reqwest::Client,
    bases: Arc<Vec<String>>,
    history: Arc<Mutex<History>>,
    /// Set: every task of this load ends after its current request.
    stop: Arc<AtomicBool>,
}

impl Load {
    fn going(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
    }

    fn api(&self, node: usize) -> Client {
        Client::with_http(&self.bases[node], self.http.clone()).expect("a server URL")
    }

    /// A producer of the plain queue: batches of 5, payload `{"p": producer, "n": n}`.
    async fn plain_producer(self, me: u64) {
        let mut rng = SplitMix64::new(0x9e37 ^ me);
        let mut n = 0u64;
        while self.going() {
            let node = rng.between(0, NODES as u64 - 1) as usize;
            let batch: Vec<Publish> = (0..5)
                .map(|i| Publish {
                    idempotency_key: Some(format!("p{me}-{}", n + i)),
                    ..Publish::new(json!({"p": me, "n": n + i}))
                })
                .collect();
            n += 5;
            let r = self.api(node).publish_batch(PLAIN, &batch).await;
            let failed = {
                let mut h = self.history.lock().unwrap();
                match r {
                    Ok(p) => {
                        h.requests += 1;
                        for m in p.message {
                            h.published.insert(m.id.to_string(), PLAIN.into());
                        }
                        false
                    }
                    Err(e) => {
                        h.failed("publish", &e);
                        true
                    }
                }
            };
            if failed {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// A producer of the ordered queue: it owns keys `o<me>-0` … `o<me>-3` and publishes
    /// one message at a time, numbering each key's messages 0, 1, 2 …
    async fn ordered_producer(self, me: u64) {
        let mut rng = SplitMix64::new(0x7f4a ^ me);
        let mut next = [0u64; 4];
        while self.going() {
            let node = rng.between(0, NODES as u64 - 1) as usize;
            let k = rng.between(0, 3) as usize;
            let (key, seq) = (format!("o{me}-{k}"), next[k]);
            next[k] += 1;
            let message = Publish {
                key: Some(key.clone()),
                idempotency_key: Some(format!("{key}-{seq}")),
                ..Publish::new(json!({"k": key, "s": seq}))
            };
            let sent = wall();
            self.history
                .lock()
                .unwrap()
                .ordered_sent
                .insert((key.clone(), seq), sent);
            let r = self.api(node).publish(ORDERED, &message).await;
            let answered = wall();
            let failed = {
                let mut h = self.history.lock().unwrap();
                match r {
                    Ok(p) => {
                        h.requests += 1;
                        h.published.insert(p.message.id.to_string(), ORDERED.into());
                        h.ordered_published.insert((key, seq), answered);
                        false
                    }
                    Err(e) => {
                        h.failed("publish", &e);
                        true
                    }
                }
            };
            if failed {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    /// Lease from one node, settle on another: ack `ack_percent` %, nack the rest; one
    /// batch in `slow_one_in` (0: none) held past its lease first.
    async fn consumer(self, queue: &'static str, seed: u64, ack_percent: u64, slow_one_in: u64) {
        let mut rng = SplitMix64::new(seed);
        let failure = NackError::new(ErrorClass::Transient, "cluster fault test");
        let request = LeaseRequest {
            max: Some(10),
            lease: Some(format!("{LEASE_MS}ms")),
            wait: Some("300ms".into()),
        };
        while self.going() {
            let node = rng.between(0, NODES as u64 - 1) as usize;
            let sent = wall();
            let r = self.api(node).lease(queue, &request).await;
            let answered = wall();
            let leased = match r {
                Ok(m) => m,
                Err(e) => {
                    self.history.lock().unwrap().failed("lease", &e);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            };
            let mut acks = Vec::new();
            let mut nacks = Vec::new();
            {
                let mut h = self.history.lock().unwrap();
                h.requests += 1;
                for m in leased {
                    let ordered = (queue == ORDERED).then(|| {
                        let key = m.payload["k"].as_str().expect("a key").to_owned();
                        (key, m.payload["s"].as_u64().expect("a seq"))
                    });
                    h.deliveries.push(Delivery {
                        id: m.id.to_string(),
                        token: m.lease.clone(),
                        node,
                        ordered,
                        sent,
                        answered,
                        expires: m.lease_expires_at.as_millis(),
                    });
                    let item = BatchItem::new(m.id.to_string(), m.lease);
                    if rng.between(0, 99) < ack_percent {
                        acks.push(item);
                    } else {
                        nacks.push(BatchItem {
                            error: Some(failure.clone()),
                            ..item
                        });
                    }
                }
            }
            if slow_one_in > 0 && rng.between(1, slow_one_in) == 1 {
                tokio::time::sleep(Duration::from_millis(LEASE_MS as u64 + 150)).await;
            }
            // Settle on the other two nodes, in a random order: the second only when the
            // first gave no answer.
            let first = (node + 1 + rng.between(0, 1) as usize) % NODES;
            let second = (0..NODES).find(|n| *n != node && *n != first).unwrap();
            for (items, ack) in [(nacks, false), (acks, true)] {
                if !items.is_empty() {
                    self.settle_items(&items, ack, &[first, second]).await;
                }
            }
        }
    }

    /// Settle `items` on the first of `nodes`, and again on the next while there is no
    /// answer; every attempt recorded per item.
    async fn settle_items(&self, items: &[BatchItem], ack: bool, nodes: &[usize]) {
        for node in nodes {
            let api = self.api(*node);
            let sent = wall();
            let r = if ack {
                api.ack_batch(items).await
            } else {
                api.nack_batch(items).await
            };
            let answered = wall();
            let mut h = self.history.lock().unwrap();
            let what = if ack { "ack" } else { "nack" };
            let record = |h: &mut History, item: &BatchItem, outcome: Outcome| {
                h.settles.push(Settle {
                    id: item.id.clone(),
                    token: item.lease.clone(),
                    node: *node,
                    ack,
                    sent,
                    answered,
                    outcome,
                });
            };
            match r {
                Ok(results) => {
                    h.requests += 1;
                    let by_id: HashMap<&str, &BatchResult> =
                        results.iter().map(|r| (r.id.as_str(), r)).collect();
                    for item in items {
                        let result = by_id.get(item.id.as_str()).expect("an answer per item");
                        let outcome = if result.is_ok() {
                            Outcome::Ok
                        } else {
                            let code = result.error.as_ref().map_or("", |e| e.code.as_str());
                            if code.starts_with("lease_") {
                                h.conflicts += 1;
                            } else {
                                h.unexpected
                                    .push(format!("{what} item: {} {code}", result.status));
                            }
                            Outcome::Refused(code.to_owned())
                        };
                        record(&mut h, item, outcome);
                    }
                    return;
                }
                Err(e) => {
                    let outcome = h.failed(what, &e);
                    for item in items {
                        record(&mut h, item, outcome.clone());
                    }
                    if outcome != Outcome::Unknown {
                        return;
                    }
                }
            }
        }
    }

    /// Messages of both queues that are not `done` (their counts on node `node`).
    async fn not_done(&self, node: usize) -> Result<u64, Error> {
        let mut n = 0;
        for queue in [PLAIN, ORDERED] {
            let q = self.api(node).queue(queue).await?;
            n += q
                .counts
                .iter()
                .filter(|(state, _)| *state != "done")
                .map(|(_, c)| c)
                .sum::<u64>();
        }
        Ok(n)
    }

    /// Every message of both queues: id → state (the export of node `node`; a long run's
    /// export takes longer than the load's request timeout, so it has a client of its own).
    async fn snapshot(&self, node: usize) -> Result<HashMap<String, String>, Error> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(600))
            .build()
            .expect("an HTTP client");
        let api = Client::with_http(&self.bases[node], http).expect("a server URL");
        let mut all = HashMap::new();
        for queue in [PLAIN, ORDERED] {
            let filter = Filter {
                queue: Some(queue.into()),
                ..Filter::default()
            };
            let mut export = api.export(&filter, ExportFormat::Jsonl).await?;
            while let Some(m) = export.next_message().await? {
                all.insert(m.id.to_string(), m.state.as_str().to_owned());
            }
        }
        Ok(all)
    }
}

// ---------------------------------------------------------------------------------------
// The faults.

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// `kill -9` node i, start it again.
    Kill(usize),
    /// `SIGSTOP` node i for the lease + 1 s, then `SIGCONT`.
    Stop(usize),
    /// `pg_ctlcluster restart` (MariaDB: `mysqladmin shutdown`, then started again).
    DbRestart,
    /// `pg_terminate_backend` on every connection of the nodes (MariaDB: `KILL <id>`).
    Terminate,
}

/// The n-th fault of the schedule: kill, stop, database restart, terminate, with the
/// node of each kill and stop moving on every round.
fn fault(n: usize) -> Fault {
    let round = n / 4;
    match n % 4 {
        0 => Fault::Kill(round % NODES),
        1 => Fault::Stop((round + 1) % NODES),
        2 => Fault::DbRestart,
        _ => Fault::Terminate,
    }
}

/// Inject `f`; back to a whole cluster when this returns. Its kind and what it took, for
/// the figures.
async fn inject(
    f: Fault,
    cluster: &mut Cluster,
    client: &reqwest::Client,
) -> (&'static str, String) {
    let kind = match (f, &cluster.place) {
        (Fault::Kill(_), _) => "kill",
        (Fault::Stop(_), _) => "stop",
        (Fault::DbRestart, Place::Postgres(_)) => "postgres",
        (Fault::DbRestart, Place::Mysql(_)) => "mariadb",
        (Fault::Terminate, Place::Postgres(_)) => "terminate",
        (Fault::Terminate, Place::Mysql(_)) => "kill_connections",
    };
    (kind, inject_fault(f, cluster, client).await)
}

async fn inject_fault(f: Fault, cluster: &mut Cluster, client: &reqwest::Client) -> String {
    let t = Instant::now();
    match f {
        Fault::Kill(i) => {
            cluster.kill_9(i);
            tokio::time::sleep(Duration::from_millis(300)).await;
            let up = Instant::now();
            cluster.start(i, client).await;
            format!("kill n{i} (ready again in {} ms)", up.elapsed().as_millis())
        }
        Fault::Stop(i) => {
            cluster.signal(i, "-STOP");
            tokio::time::sleep(Duration::from_millis(LEASE_MS as u64 + 1_000)).await;
            cluster.signal(i, "-CONT");
            format!("stop n{i} for {} ms", t.elapsed().as_millis())
        }
        Fault::DbRestart => match &cluster.place {
            Place::Postgres(_) => {
                let ok = tokio::task::spawn_blocking(|| pg_ctl("restart"))
                    .await
                    .unwrap();
                assert!(ok, "pg_ctlcluster restart");
                format!("postgres restart ({} ms)", t.elapsed().as_millis())
            }
            Place::Mysql(_) => {
                let ok = tokio::task::spawn_blocking(my::mysql_restart)
                    .await
                    .unwrap();
                assert!(ok, "MariaDB stopped and started again");
                format!("mariadb restart ({} ms)", t.elapsed().as_millis())
            }
        },
        Fault::Terminate => match &cluster.place {
            Place::Postgres(schema) => {
                let sql = format!(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE application_name = '{}'",
                    schema.0
                );
                let n = tokio::task::spawn_blocking(move || psql(&[&sql]))
                    .await
                    .unwrap()
                    .expect("pg_terminate_backend");
                format!("{n} connections terminated")
            }
            Place::Mysql(db) => {
                let n = db.kill_connections();
                format!("{n} connections killed")
            }
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_under_faults_lose_nothing() {
    let backend = Backend::from_env();
    let _held = backend.hold().await;
    let secs: u64 = std::env::var("REDRIVE_CLUSTER_FAULT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(45);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let mut cluster = Cluster::new(backend);
    for i in 0..NODES {
        cluster.start(i, &client).await;
    }
    // One cluster: every node sees the three, and the same leader.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut views = Vec::new();
        for i in 0..NODES {
            views.push(cluster_view(&client, &cluster.base(i)).await);
        }
        let agreed = views.iter().all(|v| {
            v.as_ref().is_some_and(|(live, leader)| {
                live.len() == NODES && Some(leader) == views[0].as_ref().map(|v| &v.1)
            })
        });
        if agreed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no 3-node cluster with one leader: {views:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let history = Arc::new(Mutex::new(History::default()));
    let load = Load {
        http: client.clone(),
        bases: Arc::new((0..NODES).map(|i| cluster.base(i)).collect()),
        history: history.clone(),
        stop: Arc::new(AtomicBool::new(false)),
    };
    let mut tasks = Vec::new();
    for i in 0..2u64 {
        tasks.push(tokio::spawn(load.clone().plain_producer(i)));
        tasks.push(tokio::spawn(load.clone().ordered_producer(i)));
        tasks.push(tokio::spawn(load.clone().consumer(
            PLAIN,
            0x1000 + i,
            70,
            50,
        )));
        tasks.push(tokio::spawn(load.clone().consumer(
            ORDERED,
            0x2000 + i,
            70,
            50,
        )));
    }
    // Faults, a random 1.5–3 s of load between them, until `secs` are up.
    let mut rng = SplitMix64::new(0xfa17);
    let started = Instant::now();
    let mut done = Vec::new();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    while started.elapsed() < Duration::from_secs(secs) {
        let f = fault(done.len());
        done.push(inject(f, &mut cluster, &client).await);
        tokio::time::sleep(Duration::from_millis(rng.between(1_500, 3_000))).await;
    }
    load.stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let faulted_ms = started.elapsed().as_millis();

    // Drain: lease on one node, ack on another, until every message is done.
    let drain = Load {
        stop: Arc::new(AtomicBool::new(false)),
        ..load.clone()
    };
    let mut drainers = Vec::new();
    // Four for the ordered queue: it moves one message per key at a time.
    for i in 2..4u64 {
        drainers.push(tokio::spawn(drain.clone().consumer(
            ORDERED,
            0x4000 + i,
            100,
            0,
        )));
    }
    for i in 0..2u64 {
        drainers.push(tokio::spawn(drain.clone().consumer(
            PLAIN,
            0x3000 + i,
            100,
            0,
        )));
        drainers.push(tokio::spawn(drain.clone().consumer(
            ORDERED,
            0x4000 + i,
            100,
            0,
        )));
    }
    let drained = Instant::now();
    // Until every message is done, or nothing moved for 30 s (then what is left is stuck).
    let (mut least, mut moved) = (u64::MAX, Instant::now());
    while moved.elapsed() < Duration::from_secs(30) {
        match drain.not_done(0).await {
            Ok(0) => break,
            Ok(n) if n < least => (least, moved) = (n, Instant::now()),
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drain.stop.store(true, Ordering::Relaxed);
    for t in drainers {
        t.await.unwrap();
    }
    let drain_ms = drained.elapsed().as_millis();
    let final_state = drain.snapshot(0).await.expect("export");
    // Still one cluster of three with one leader.
    let views: Vec<_> = {
        let mut v = Vec::new();
        for i in 0..NODES {
            v.push(cluster_view(&client, &cluster.base(i)).await);
        }
        v
    };

    let h = history.lock().unwrap();
    let v = check(&h, &final_state);
    let acks_ok = h
        .settles
        .iter()
        .filter(|s| s.ack && s.outcome == Outcome::Ok)
        .count();
    // Every node leased and settled its share.
    let mut by_node = [(0usize, 0usize); NODES];
    for d in &h.deliveries {
        by_node[d.node].0 += 1;
    }
    for s in h.settles.iter().filter(|s| s.outcome == Outcome::Ok) {
        by_node[s.node].1 += 1;
    }
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for (kind, _) in &done {
        *kinds.entry(kind).or_default() += 1;
    }
    println!(
        "cluster fault test: store={} nodes={NODES} (n{SKEWED} at {SKEW}) faulted_ms={faulted_ms} faults={} {kinds:?} \
         requests={} published={} deliveries={} acks_ok={acks_ok} no_answer={} unavailable_503={} \
         lease_conflicts_409={} (delivered, settled) by node={by_node:?} drain_ms={drain_ms} messages={} planted_bug={PLANTED} violations: {}",
        backend.name(),
        done.len(),
        h.requests,
        h.published.len(),
        h.deliveries.len(),
        h.no_answer,
        h.unavailable,
        h.conflicts,
        final_state.len(),
        v.counts(),
    );
    for (_, f) in &done {
        println!("  fault: {f}");
    }
    for e in &v.examples {
        println!("  violation: {e}");
    }
    for u in h.unexpected.iter().take(20) {
        println!("  unexpected answer: {u}");
    }
    let (errors, give_ups) = cluster.read_logs();
    println!(
        "  node log lines no fault explains: {}; transactions given up after conflicts (503): {}",
        errors.len(),
        give_ups
    );
    for e in errors.iter().take(20) {
        println!("  node log: {e}");
    }
    assert!(done.len() >= 4, "every kind of fault ran at least once");
    assert!(acks_ok > 100, "the load did work: {acks_ok} acks");
    assert!(
        by_node.iter().all(|(d, s)| *d > 0 && *s > 0),
        "every node leased and settled: {by_node:?}"
    );
    if PLANTED {
        assert!(v.total() > 0, "the planted bug went unnoticed");
    } else {
        assert_eq!(
            v.total(),
            0,
            "the cluster broke a guarantee: {}",
            v.counts()
        );
        assert!(
            errors.is_empty(),
            "a node logged what no fault explains: {errors:?}"
        );
        for view in &views {
            let (live, _) = view.as_ref().expect("/v1/cluster answers at the end");
            assert_eq!(live.len(), NODES, "three live nodes at the end: {views:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// The checker's own tests: each violation planted in a history is counted.

#[cfg(test)]
mod checker {
    use super::*;

    /// One message published, leased at 1,000 until 3,000, acked at 1,500: no violation.
    fn clean() -> (History, HashMap<String, String>) {
        let mut h = History::default();
        h.published.insert("m".into(), PLAIN.into());
        h.deliveries.push(delivery("m", "t1", 1_000));
        h.settles.push(settle("m", "t1", true, 1_500, Outcome::Ok));
        (h, HashMap::from([("m".into(), "done".into())]))
    }

    fn delivery(id: &str, token: &str, at: i64) -> Delivery {
        Delivery {
            id: id.into(),
            token: token.into(),
            node: 0,
            ordered: None,
            sent: at - 10,
            answered: at,
            expires: at + LEASE_MS,
        }
    }

    fn settle(id: &str, token: &str, ack: bool, at: i64, outcome: Outcome) -> Settle {
        Settle {
            id: id.into(),
            token: token.into(),
            node: 1,
            ack,
            sent: at,
            answered: at + 10,
            outcome,
        }
    }

    #[test]
    fn a_clean_history_has_no_violation() {
        let (h, f) = clean();
        assert_eq!(check(&h, &f).total(), 0);
    }

    #[test]
    fn each_planted_violation_is_counted() {
        let (h, mut f) = clean();
        f.remove("m");
        let v = check(&h, &f);
        assert_eq!((v.lost, v.acked_not_done), (1, 1));

        let (h, mut f) = clean();
        f.insert("m".into(), "ready".into());
        let v = check(&h, &f);
        assert_eq!((v.acked_not_done, v.stuck), (1, 1));

        // Delivered again after the ack was answered.
        let (mut h, f) = clean();
        h.deliveries.push(delivery("m", "t2", 1_600));
        assert_eq!(check(&h, &f).redelivered_after_ack, 1);

        // Acked under two leases (the second leased after the first expired).
        let (mut h, f) = clean();
        h.settles[0].outcome = Outcome::Refused("lease_expired".into());
        h.settles[0].sent = 3_100;
        h.settles[0].answered = 3_110;
        h.deliveries.push(delivery("m", "t2", 3_200));
        h.settles.push(settle("m", "t2", true, 3_300, Outcome::Ok));
        assert_eq!(check(&h, &f).total(), 0, "a lawful redelivery");
        h.settles[0].outcome = Outcome::Ok;
        let v = check(&h, &f);
        assert_eq!((v.acked_twice, v.late_settles_accepted), (1, 1));

        // A retry answered 200 after the expiry, of an ack first sent in time (no answer):
        // a repeat, not a late settle.
        let (mut h, f) = clean();
        h.settles[0].outcome = Outcome::Unknown;
        h.settles.push(settle("m", "t1", true, 3_500, Outcome::Ok));
        assert_eq!(check(&h, &f).total(), 0, "a repeated ack");
        h.settles.remove(0);
        assert_eq!(check(&h, &f).late_settles_accepted, 1, "first sent late");

        // A second lease while the first was unexpired and unsettled.
        let (mut h, f) = clean();
        h.settles[0].sent = 2_500;
        h.settles[0].answered = 2_510;
        h.deliveries.push(delivery("m", "t2", 2_000));
        h.settles.push(settle("m", "t2", false, 2_100, Outcome::Ok));
        assert_eq!(check(&h, &f).overlapping_leases, 1);

        // A settle refused as expired while its lease was valid.
        let (mut h, f) = clean();
        h.settles[0].outcome = Outcome::Refused("lease_expired".into());
        h.settles.push(settle("m", "t1", true, 1_700, Outcome::Ok));
        assert_eq!(check(&h, &f).valid_settles_refused, 1);

        // Per-key order: (k, 1) leased while (k, 0) was not yet acked.
        let mut h = History::default();
        for (id, seq, at) in [("a", 0u64, 100i64), ("b", 1, 200)] {
            h.published.insert(id.into(), ORDERED.into());
            h.ordered_sent.insert(("k".into(), seq), at - 5);
            h.ordered_published.insert(("k".into(), seq), at);
        }
        let mut b = delivery("b", "tb", 1_000);
        b.ordered = Some(("k".into(), 1));
        let mut a = delivery("a", "ta", 1_050);
        a.ordered = Some(("k".into(), 0));
        h.deliveries.extend([b, a]);
        h.settles.push(settle("b", "tb", true, 1_100, Outcome::Ok));
        h.settles.push(settle("a", "ta", true, 1_200, Outcome::Ok));
        let f = HashMap::from([("a".into(), "done".into()), ("b".into(), "done".into())]);
        assert_eq!(check(&h, &f).order_broken, 1);
        // In order (a leased and acked before b was leased): none.
        h.deliveries[0].answered = 1_300;
        h.settles[0].sent = 1_400;
        assert_eq!(check(&h, &f).total(), 0);

        let (mut h, f) = clean();
        h.unexpected.push("publish: 500 internal".into());
        assert_eq!(check(&h, &f).unexpected_answers, 1);
    }
}
