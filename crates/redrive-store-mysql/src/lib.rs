//! The MySQL / MariaDB backend of redrive's storage contract ([`redrive_storage::Store`]).
//!
//! [`MysqlStore`] keeps every message of every queue in the tables it creates and migrates
//! itself at open ([`MysqlStore::open`]) in the database the URL names, so that several
//! redrive processes can share one MySQL 8.0+ or MariaDB 10.6+ (SPEC §7, §13). It passes the
//! same conformance suite as the embedded SQLite store and the PostgreSQL store
//! (`tests/conformance_mysql.rs`), the shared-handles area included.
//!
//! ```no_run
//! use redrive_store_mysql::{MysqlOptions, MysqlStore};
//! use redrive_storage::Store;
//!
//! # async fn run() -> Result<(), redrive_storage::StoreError> {
//! let store = MysqlStore::open(MysqlOptions::new("mysql://redrive@db.internal:3306/app")).await?;
//! if let Some(why) = store.durability_weakened() {
//!     eprintln!("warning: acknowledged writes may be lost: {why}");
//! }
//! store.close().await;
//! # Ok(())
//! # }
//! ```
//!
//! # Shape
//!
//! See `schema.rs`: `messages`, `history`, the claim's narrow `ready` table, `idempotency`,
//! `key_heads`, `tasks`, `audit`, `sessions`, `nodes`, `leader`, `endpoint_trips`, `meta`,
//! `schema_migrations`.
//!
//! # How a transition runs
//!
//! Every call runs in a transaction on a pooled connection (`mysql_async`, no TLS), and
//! every pooled connection runs at `READ COMMITTED` (set on each new connection). A
//! transition locks the message's row (`SELECT … FOR UPDATE`), reads its
//! [`Lifecycle`](redrive_storage::rules::Lifecycle), lets `redrive_storage::rules` decide,
//! writes the row back by primary key and appends its history entries; the `ready` row
//! follows the message's state (`transitions::sync_ready`). A claim selects `ready` rows
//! `FOR UPDATE SKIP LOCKED`, locks their messages by primary key `SKIP LOCKED` too, updates
//! them with one `UPDATE … WHERE seq IN (…)` and deletes the `ready` rows, in one short
//! transaction (MySQL has no `UPDATE … RETURNING`): a claim never waits for a lock, so it
//! never deadlocks, and never takes more than `n`.
//!
//! Before it changes anything, a transaction locks in the one order every writer follows:
//! the lock points of the ordered keys it touches (`key_heads`, sorted), then the message
//! rows (by `seq`) (`transitions::lock_rows`). Publish, ack and nack go through group
//! commit (`group_commit.rs`): the calls that arrive while a batch commits share the next
//! transaction (a savepoint each) and its one commit; a batch that deadlocks is rolled back
//! and its calls run one by one.
//!
//! A transaction that InnoDB picks as a deadlock victim (1213) or whose lock wait timed
//! out (1205) is rolled back and run again after a random pause growing with each try, at
//! most [`MAX_RETRIES`] times; those retries are counted ([`MysqlStore::conflict_stats`],
//! and `/metrics` through [`Store::metrics`]). A pooled connection found dead before the
//! `COMMIT` was sent is also run again on a new one. A database that cannot be reached is
//! [`StoreError::Unavailable`], never a poisoned store.
//!
//! Times are the caller's (`Some(now)`) or, given `None`, the database's clock
//! (`NOW(3)`), read once at the start of the transaction.
//!
//! MySQL has no LISTEN: other stores on the database learn of messages made ready by
//! polling `ready` for rows written by another store (`poll.rs`, every
//! [`MysqlOptions::poll_every`], at most 1 s); a store's own writes wake its own waiters
//! at once (answered to its caller, and its due time through [`Notifier::due`]).
//!
//! # Transactional enqueue
//!
//! An application publishes inside its own transaction with the stored procedure
//! `redrive_publish(queue, payload, key, idempotency_key, delay_ms, priority, headers)`
//! (`sql_publish.rs`; created by schema step 4, checked with the limits in
//! [`MysqlOptions::sql_publish`]): the message exists if and only if that transaction
//! commits, and the stores' pollers tell their long polls within a poll.
//!
//! # Not yet
//!
//! - Group commit covers publish, ack and nack, without merging them into set-based
//!   statements; release, return, extend, operator actions, leases and ticks commit alone.
//! - Queue statistics are counted with `GROUP BY` on each call.
//! - TLS: a URL asking for it is refused.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

/// The per-item answers of a batch: `$body` (using the item `$it`) is run for each item;
/// a refused item answers its error and the others go on, a failed statement fails the
/// whole batch.
macro_rules! per_item {
    ($items:expr, |$it:ident| $body:expr) => {{
        let mut out = Vec::new();
        let mut failed = None;
        for $it in $items {
            match $body {
                Ok(v) => out.push(Ok(v)),
                Err(E::Logic(e)) => out.push(Err(e)),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }};
}

mod cluster;
mod error;
mod group_commit;
mod key_order;
mod ops;
mod poll;
mod reads;
mod row;
mod schema;
mod sessions;
mod sql;
mod sql_publish;
mod transitions;

pub use redrive_storage::SqlPublishLimits;
pub use schema::SCHEMA_VERSION;

use error::{Conflict, E};
use mysql_async::prelude::Queryable;
use redrive_core::{Message, MessageId, NewMessage, QueueCatalog, SplitMix64, Timestamp};
use redrive_storage::{
    Ack, Acked, AuditRecord, Beat, ClusterView, CommitStats, FailureOutcome, Health, Heartbeat,
    LeaseRef, LeaseRequest, Leased, MessageFilter, MetricKind, Nack, NewAudit, NewSession,
    Notifier, Page, Published, PurgeOutcome, QueueStats, ReadyNotice, Release, Released, Returned,
    SessionLookup, SessionRecord, Store, StoreError, StoreMetric, StoreOptions, TaskRecord,
    TaskState, TaskStep, TaskStepOutcome, TaskTransition, TickOutcome,
};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How to open a [`MysqlStore`].
#[derive(Clone)]
pub struct MysqlOptions {
    /// `mysql://user:password@host:port/database`: redrive's tables live in that database
    /// (it must exist). No TLS.
    pub url: String,
    /// Connections in the pool.
    pub pool_size: usize,
    /// What every backend is opened with: the queue catalog, the idempotency window, the
    /// generator's seed, the commit observer.
    pub store: StoreOptions,
    /// How often this store looks for messages other stores on the database made ready
    /// (there is no LISTEN on MySQL), and asks whether the database answers (at most 1 s).
    pub poll_every: Duration,
    /// Group commit: concurrent publish, ack and nack calls share one transaction and one
    /// commit (`group_commit.rs`). On by default.
    pub group_commit: bool,
    /// What the procedure `redrive_publish(…)` checks (transactional enqueue,
    /// `sql_publish.rs`): the server's limits, recorded in the database at open.
    pub sql_publish: SqlPublishLimits,
}

impl std::fmt::Debug for MysqlOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the URL: it may carry a password.
        f.debug_struct("MysqlOptions")
            .field("pool_size", &self.pool_size)
            .field("store", &self.store)
            .field("poll_every", &self.poll_every)
            .field("group_commit", &self.group_commit)
            .field("sql_publish", &self.sql_publish)
            .finish_non_exhaustive()
    }
}

impl MysqlOptions {
    /// Defaults for `url`: 16 connections, default queue settings, 24 h idempotency window,
    /// polling every 250 ms, the server's default limits for `redrive_publish(…)`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            pool_size: 16,
            store: StoreOptions::default(),
            poll_every: Duration::from_millis(250),
            group_commit: true,
            sql_publish: SqlPublishLimits::default(),
        }
    }
}

/// What one transaction wrote that matters after its commit: wake-ups and counts.
#[derive(Debug, Default)]
pub(crate) struct Ctx {
    /// Earliest due time or lease expiry written, ms.
    pub wake: Option<i64>,
    /// A tick's exact next wake-up (replaces the hint).
    pub exact_wake: Option<Option<i64>>,
    /// Message transitions written.
    pub changes: u64,
}

impl Ctx {
    /// Take in what a piece of a transaction did (a job of a batch).
    pub fn absorb(&mut self, other: Ctx) {
        self.changes += other.changes;
        if let Some(w) = other.wake {
            self.wake_at(w);
        }
    }

    pub fn wake_at(&mut self, at: i64) {
        self.wake = Some(self.wake.map_or(at, |w| w.min(at)));
    }

    /// A scheduled message wakes the scheduler at its due time.
    pub fn wake_if_scheduled(&mut self, life: &redrive_storage::rules::Lifecycle) {
        if life.state == redrive_core::State::Scheduled {
            if let Some(d) = life.due_at {
                self.wake_at(d.as_millis());
            }
        }
    }
}

/// A transaction that conflicts (deadlock, lock wait timeout, a race on an idempotency
/// key) or whose pooled connection was found dead before its commit is run again at most
/// this many times.
pub const MAX_RETRIES: u32 = 8;

/// How long a call waits for a pooled connection, or for a new one to be made, before it
/// fails as [`StoreError::Unavailable`].
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// The oldest servers this store runs on: `SKIP LOCKED` (MySQL 8.0.1, MariaDB 10.6).
const MIN_MYSQL: (u32, u32) = (8, 0);
const MIN_MARIADB: (u32, u32) = (10, 6);

/// Retries of conflicting transactions since open ([`MysqlStore::conflict_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConflictStats {
    /// Transactions run again after InnoDB chose them as a deadlock victim (1213).
    pub deadlock_retries: u64,
    /// Transactions run again after a lock wait timed out (1205).
    pub lock_wait_retries: u64,
    /// Transactions run again after a race the store found (an idempotency key taken by a
    /// concurrent publish).
    pub race_retries: u64,
    /// Calls that kept conflicting past [`MAX_RETRIES`] and were answered `Unavailable`.
    pub gave_up: u64,
}

#[derive(Debug, Default)]
struct Conflicts {
    deadlocks: AtomicU64,
    lock_waits: AtomicU64,
    races: AtomicU64,
    gave_up: AtomicU64,
}

/// What every transaction of a store shares.
pub(crate) struct Inner {
    pool: mysql_async::Pool,
    pub catalog: Arc<QueueCatalog>,
    pub idempotency_window_ms: u64,
    /// How the database fingerprints payloads for idempotency (`meta.payload_fingerprint`).
    pub canon: sql_publish::Canon,
    rng: Mutex<SplitMix64>,
    /// Random at every open, whatever the seed: mixed into every lease nonce, and written
    /// as `ready.node` so that the poller of a store skips what it made ready itself.
    pub epoch: u64,
    /// Where the tick's promotion starts when more queues are due than it serves.
    pub rotation: AtomicUsize,
    wake_tx: watch::Sender<Option<Timestamp>>,
    /// [`Notifier::ready`]'s sender: messages other stores made ready, fed by `poll.rs`.
    ready_tx: tokio::sync::broadcast::Sender<ReadyNotice>,
    stats: Mutex<CommitStats>,
    observer: Option<Arc<dyn Fn(usize, f64) + Send + Sync>>,
    /// Why the database cannot be reached now, as the last poll found.
    unavailable: Mutex<Option<String>>,
    /// Set by the poller once a newer redrive has migrated the database past this build's
    /// [`SCHEMA_VERSION`]: every call is refused from then on.
    superseded: redrive_storage::Supersession,
    /// The database the store keeps its tables in.
    database: String,
    /// Claims gated and combined per queue on this node ([`MysqlStore::lease_at`]).
    claims: redrive_storage::claims::Claims,
    conflicts: Conflicts,
}

impl Inner {
    /// Run `f` on the store's generator.
    pub fn with_rng<T>(&self, f: impl FnOnce(&mut SplitMix64) -> T) -> T {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut rng)
    }

    /// The database the store keeps its tables in.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// This store, as `ready.node`.
    pub fn node(&self) -> i64 {
        self.epoch as i64
    }

    /// A pooled connection, or `Unavailable` after [`CONNECTION_TIMEOUT`].
    pub async fn conn(&self) -> Result<mysql_async::Conn, E> {
        match tokio::time::timeout(CONNECTION_TIMEOUT, self.pool.get_conn()).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(E::Db(match error::store_error(&e) {
                StoreError::Backend(why) => StoreError::Unavailable(why),
                other => other,
            })),
            Err(_) => Err(E::Db(StoreError::Unavailable(format!(
                "MySQL: no connection within {} s",
                CONNECTION_TIMEOUT.as_secs()
            )))),
        }
    }

    /// After a commit: count it, and move the wake hint earlier (or where a tick put it).
    pub fn committed(&self, ctx: Ctx, took: Duration) {
        if let Ok(mut s) = self.stats.lock() {
            s.commits += 1;
            s.changes += ctx.changes;
            s.commit_seconds += took.as_secs_f64();
        }
        if let Some(observe) = &self.observer {
            observe(ctx.changes as usize, took.as_secs_f64());
        }
        if ctx.exact_wake.is_none() && ctx.wake.is_none() {
            return;
        }
        self.wake_tx.send_if_modified(|hint| {
            let mut next = match ctx.exact_wake {
                Some(exact) => exact,
                None => hint.map(Timestamp::as_millis),
            };
            if let Some(w) = ctx.wake {
                next = Some(next.map_or(w, |n| n.min(w)));
            }
            let next = next.map(Timestamp::from_millis);
            let changed = *hint != next;
            *hint = next;
            changed
        });
    }

    /// Another process may have written something due at `at` (ms): wake the scheduler
    /// then at the latest.
    pub fn due_elsewhere(&self, at: i64) {
        self.wake_tx.send_if_modified(|hint| {
            let earlier = hint.is_none_or(|h| h.as_millis() > at);
            if earlier {
                *hint = Some(Timestamp::from_millis(at));
            }
            earlier
        });
    }

    /// A lease call's nonce: random per call, mixed with the open's epoch.
    pub fn nonce(&self) -> String {
        let n = self.with_rng(|r| r.next_u64());
        format!("{:016x}", n ^ self.epoch)
    }

    /// Count a retry of `kind`, and wait a random pause that grows with `tries` (1 ms to
    /// 5·2^tries ms): two transactions that deadlocked do not meet again at once.
    pub(crate) async fn before_retry(&self, kind: Conflict, tries: u32) {
        self.count_conflict(kind);
        let span = 5u64 << tries.min(8);
        let ms = 1 + self.with_rng(|r| r.next_u64()) % span;
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    /// Count a transaction run again after a conflict of `kind`.
    pub fn count_conflict(&self, kind: Conflict) {
        let counter = match kind {
            Conflict::Deadlock => &self.conflicts.deadlocks,
            Conflict::LockWait => &self.conflicts.lock_waits,
            Conflict::Race => &self.conflicts.races,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Count a call that kept conflicting past [`MAX_RETRIES`].
    pub fn gave_up(&self) {
        self.conflicts.gave_up.fetch_add(1, Ordering::Relaxed);
    }

    fn set_unavailable(&self, why: Option<String>) {
        if let Ok(mut u) = self.unavailable.lock() {
            if u.is_none() && why.is_some() {
                tracing::warn!(reason = ?why, "the store is unavailable");
            } else if u.is_some() && why.is_none() {
                tracing::info!("the store is available again");
            }
            *u = why;
        }
    }
}

/// The MySQL / MariaDB store. Cheap to share behind an `Arc`.
pub struct MysqlStore {
    inner: Arc<Inner>,
    /// The group-commit batcher of publish, ack and nack (`None`: each call commits alone).
    batcher: Option<group_commit::Batcher>,
    closed: AtomicBool,
    /// The poller (`poll::run`): other stores' ready messages, the health probe.
    poller: tokio::task::JoinHandle<()>,
    durability: Option<String>,
    server: String,
}

impl std::fmt::Debug for MysqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlStore")
            .field("database", &self.inner.database)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// A batcher's answer of another kind than its job (a bug).
fn mixed_up(done: group_commit::Done) -> StoreError {
    StoreError::Backend(format!(
        "group commit answered another kind of call: {done:?}"
    ))
}

/// A random number: the generator's seed when none is given, and the per-open epoch.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Timestamp::now().as_millis() as u128);
    h.write_u32(std::process::id());
    h.finish()
}

/// Run one transaction on `$store`: `$body` (an expression using the transaction `$tx:
/// &mut mysql_async::Transaction` and the context `$cx: &mut Ctx`, returning `Result<T,
/// E>`) is run, then committed; a conflict runs it all again. Answers `Result<T,
/// StoreError>` after the commit.
macro_rules! write_tx {
    ($store:expr, |$tx:ident, $cx:ident| $body:expr) => {{
        let store: &MysqlStore = $store;
        async {
            store.check_open()?;
            let mut tries = 0u32;
            loop {
                // The error, and whether COMMIT had been sent when it happened.
                let r: Result<_, (E, bool)> = async {
                    let mut conn = store.inner.conn().await.map_err(|e| (e, false))?;
                    let mut txn = conn
                        .start_transaction(mysql_async::TxOpts::default())
                        .await
                        .map_err(|e| (E::from(e), false))?;
                    let mut ctx = Ctx::default();
                    let v = {
                        let $tx = &mut txn;
                        let $cx = &mut ctx;
                        let r: Result<_, E> = async { $body }.await;
                        r
                    };
                    let v = match v {
                        Ok(v) => v,
                        Err(e) => {
                            let _ = txn.rollback().await;
                            return Err((e, false));
                        }
                    };
                    let started = Instant::now();
                    txn.commit().await.map_err(|e| (E::from(e), true))?;
                    Ok((v, ctx, started.elapsed()))
                }
                .await;
                match r {
                    Ok((v, ctx, took)) => {
                        store.inner.committed(ctx, took);
                        break Ok(v);
                    }
                    Err((E::Retry(kind, why), _)) if tries < MAX_RETRIES => {
                        tries += 1;
                        tracing::debug!(?kind, %why, tries, "MySQL transaction conflicted; again");
                        store.inner.before_retry(kind, tries).await;
                    }
                    // A pooled connection found dead before COMMIT was sent: nothing
                    // committed, so run it again on a new one.
                    Err((e, false)) if e.lost_connection() && tries < MAX_RETRIES => {
                        tries += 1;
                        tracing::debug!(?e, tries, "MySQL connection lost; again");
                    }
                    Err((e, _)) => {
                        if matches!(e, E::Retry(..)) {
                            store.inner.gave_up();
                        }
                        break Err(e.into_store());
                    }
                }
            }
        }
        .await
    }};
}

/// Run `$body` (using the pooled connection `$c: &mut mysql_async::Conn`) outside any
/// transaction of ours: a read. A read on a connection found dead runs again on a new one.
macro_rules! read {
    ($store:expr, |$c:ident| $body:expr) => {{
        let store: &MysqlStore = $store;
        async {
            store.check_open()?;
            let mut tries = 0u32;
            loop {
                let r: Result<_, E> = async {
                    let mut conn = store.inner.conn().await?;
                    let $c = &mut conn;
                    $body
                }
                .await;
                match r {
                    Err(e) if e.lost_connection() && tries < MAX_RETRIES => tries += 1,
                    r => break r.map_err(E::into_store),
                }
            }
        }
        .await
    }};
}

/// `(major, minor)` of a `VERSION()` answer, and whether it is MariaDB.
fn parse_version(v: &str) -> (bool, (u32, u32)) {
    let mariadb = v.to_ascii_lowercase().contains("mariadb");
    // MariaDB before 11 may report itself as "5.5.5-10.6.12-MariaDB" to old clients.
    let v = if mariadb {
        v.strip_prefix("5.5.5-").unwrap_or(v)
    } else {
        v
    };
    let mut nums = v
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u32>().unwrap_or(0));
    let major = nums.next().unwrap_or(0);
    let minor = nums.next().unwrap_or(0);
    (mariadb, (major, minor))
}

/// Statements run on every new pooled connection (before it is used): the isolation level
/// the store is written for, UTC (so that `NOW(3)` to epoch ms is exact), a known SQL mode
/// (strict; backslash escapes on, which LIKE patterns use), and a lock wait short enough
/// that a stuck lock becomes a retried 1205 rather than a hung request.
const SESSION_SETUP: &[&str] = &[
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    "SET SESSION time_zone = '+00:00'",
    "SET SESSION sql_mode = 'STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'",
    "SET SESSION innodb_lock_wait_timeout = 10",
];

impl MysqlStore {
    /// Connect, create redrive's tables if missing and migrate them (refusing a schema newer
    /// than this build knows), check the server's durability settings, and read the next
    /// wake-up.
    pub async fn open(opts: MysqlOptions) -> Result<Self, StoreError> {
        let parsed = mysql_async::Opts::from_url(&opts.url).map_err(|e| {
            StoreError::Backend(format!(
                "invalid MySQL URL ({e}): expected mysql://user[:password]@host[:port]/database"
            ))
        })?;
        let Some(database) = parsed.db_name().map(str::to_owned) else {
            return Err(StoreError::Backend(
                "the MySQL URL names no database: give it as mysql://user@host:port/DATABASE \
                 (redrive keeps its tables there; create it first)"
                    .to_owned(),
            ));
        };
        if parsed.ssl_opts().is_some() {
            return Err(StoreError::Backend(
                "the MySQL URL asks for TLS (require_ssl): TLS is not supported yet by redrive's \
                 MySQL store; connect without it, or through a TLS proxy"
                    .to_owned(),
            ));
        }
        let size = opts.pool_size.max(1);
        // Idle connections stay in the pool (up to `size`, for a minute): with
        // `inactive_connection_ttl` 0, mysql_async's default, it keeps at most `min` (here 0)
        // and closes every connection handed back, so each transaction connected anew.
        let pool_opts = mysql_async::PoolOpts::default()
            .with_constraints(mysql_async::PoolConstraints::new(0, size).unwrap_or_default())
            .with_inactive_connection_ttl(Duration::from_secs(60))
            .with_reset_connection(false);
        let builder = mysql_async::OptsBuilder::from_opts(parsed)
            .pool_opts(pool_opts)
            .setup(SESSION_SETUP.to_vec())
            .stmt_cache_size(256)
            .client_found_rows(false);
        let pool = mysql_async::Pool::new(builder);
        let setup: Result<_, E> = async {
            let mut conn = match tokio::time::timeout(CONNECTION_TIMEOUT, pool.get_conn()).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    return Err(E::Db(StoreError::Unavailable(format!(
                        "cannot connect to MySQL at the configured URL: {}",
                        error::store_error(&e)
                    ))))
                }
                Err(_) => {
                    return Err(E::Db(StoreError::Unavailable(format!(
                        "MySQL did not accept a connection within {} s",
                        CONNECTION_TIMEOUT.as_secs()
                    ))))
                }
            };
            let server: String = conn
                .query_first("SELECT VERSION()")
                .await?
                .unwrap_or_default();
            let (mariadb, version) = parse_version(&server);
            let (min, name) = if mariadb {
                (MIN_MARIADB, "MariaDB")
            } else {
                (MIN_MYSQL, "MySQL")
            };
            if version < min {
                return Err(E::Logic(StoreError::Backend(format!(
                    "{name} {server} is too old for redrive (it needs FOR UPDATE SKIP LOCKED): \
                     use {name} {}.{} or later",
                    min.0, min.1
                ))));
            }
            schema::migrate(&mut conn, &database, mariadb).await?;
            key_order::reconcile(&mut conn, &database, &opts.store.catalog).await?;
            let canon = sql_publish::canon_of(&mut conn).await?.ok_or_else(|| {
                E::Db(StoreError::Backend(format!(
                    "MySQL database {database} is at schema version {SCHEMA_VERSION} but records \
                     no {} in meta",
                    sql_publish::Canon::META_KEY
                )))
            })?;
            sql_publish::record(
                &mut conn,
                opts.sql_publish,
                opts.store.idempotency_window_ms,
            )
            .await?;
            let durability = durability_check(&mut conn, mariadb).await?;
            let wake = reads::next_wake(&mut conn).await?;
            let rid = poll::newest_rid(&mut conn).await?;
            Ok((durability, wake, rid, server, canon))
        }
        .await;
        let (durability, wake, rid, server, canon) = match setup {
            Ok(v) => v,
            Err(e) => {
                let _ = pool.disconnect().await;
                return Err(e.into_store());
            }
        };
        if let Some(why) = &durability {
            tracing::warn!(%why, "MySQL durability is weakened");
        }
        let seed = opts.store.seed.unwrap_or_else(random_seed);
        let inner = Arc::new(Inner {
            pool,
            catalog: opts.store.catalog,
            idempotency_window_ms: opts.store.idempotency_window_ms,
            canon,
            rng: Mutex::new(SplitMix64::new(seed)),
            epoch: random_seed() | 1,
            rotation: AtomicUsize::new(0),
            wake_tx: watch::Sender::new(wake.map(Timestamp::from_millis)),
            ready_tx: tokio::sync::broadcast::Sender::new(1024),
            stats: Mutex::new(CommitStats::default()),
            observer: opts.store.commit_observer.clone(),
            unavailable: Mutex::new(None),
            superseded: redrive_storage::Supersession::default(),
            database,
            claims: redrive_storage::claims::Claims::default(),
            conflicts: Conflicts::default(),
        });
        let every = opts
            .poll_every
            .clamp(Duration::from_millis(10), Duration::from_secs(1));
        let poller = tokio::spawn(poll::run(inner.clone(), every, rid));
        let batcher = opts
            .group_commit
            .then(|| group_commit::Batcher::start(inner.clone()));
        Ok(Self {
            inner,
            batcher,
            closed: AtomicBool::new(false),
            poller,
            durability,
            server,
        })
    }

    /// What weakens durability on this server, in plain words (seen at open), or `None`
    /// when a commit is on disk when it is answered (`innodb_flush_log_at_trx_commit = 1`,
    /// and `sync_binlog = 1` where binary logs are on). When `Some`, an acknowledged write
    /// may be lost in a crash of the database host, which breaks SPEC §4's durable
    /// acknowledgement; the server names it in a start-up warning.
    pub fn durability_weakened(&self) -> Option<&str> {
        self.durability.as_deref()
    }

    /// The database this store keeps its tables in.
    pub fn database(&self) -> &str {
        self.inner.database()
    }

    /// The server's `VERSION()`.
    pub fn server_version(&self) -> &str {
        &self.server
    }

    /// Transactions run again after a deadlock (1213), a lock wait timeout (1205) or a race,
    /// since open.
    pub fn conflict_stats(&self) -> ConflictStats {
        let c = &self.inner.conflicts;
        ConflictStats {
            deadlock_retries: c.deadlocks.load(Ordering::Relaxed),
            lock_wait_retries: c.lock_waits.load(Ordering::Relaxed),
            race_retries: c.races.load(Ordering::Relaxed),
            gave_up: c.gave_up.load(Ordering::Relaxed),
        }
    }

    /// The isolation level a pooled connection of this store runs at, as the server says
    /// (`READ-COMMITTED`, set on every new connection): a check for operators and tests.
    pub async fn session_isolation(&self) -> Result<String, StoreError> {
        read!(self, |c| {
            // MySQL 8 names it transaction_isolation; MariaDB before 11.1 only tx_isolation.
            let v: Option<String> = match c
                .query_first::<String, _>("SELECT @@SESSION.transaction_isolation")
                .await
            {
                Ok(v) => v,
                Err(_) => c.query_first("SELECT @@SESSION.tx_isolation").await?,
            };
            Ok(v.unwrap_or_default())
        })
    }

    fn check_open(&self) -> Result<(), StoreError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(StoreError::Closed);
        }
        self.inner.superseded.check()
    }

    /// Run a publish, ack or nack: in the batcher's next batch, or alone.
    async fn batched(&self, work: group_commit::Work) -> Result<group_commit::Done, StoreError> {
        self.check_open()?;
        match &self.batcher {
            Some(b) => b.submit(work).await,
            None => group_commit::run_alone(&self.inner, &work).await,
        }
    }

    /// [`Store::publish`] at `now` (`None`: the database's clock).
    pub async fn publish_at(
        &self,
        items: Vec<NewMessage>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Published>, StoreError> {
        match self
            .batched(group_commit::Work::Publish(items, now))
            .await?
        {
            group_commit::Done::Publish(v) => Ok(v),
            other => Err(mixed_up(other)),
        }
    }

    /// [`Store::lease`] at `now` (`None`: the database's clock).
    pub async fn lease_at(
        &self,
        req: LeaseRequest,
        now: Option<Timestamp>,
    ) -> Result<Vec<Leased>, StoreError> {
        let inner = &*self.inner;
        // Gated and combined per queue (`redrive_storage::claims`).
        inner
            .claims
            .lease(req, now, |req, now| async move {
                write_tx!(self, |tx, cx| transitions::lease(inner, tx, cx, &req, now)
                    .await)
            })
            .await
    }

    /// [`Store::ack`] at `now` (`None`: the database's clock).
    pub async fn ack_at(
        &self,
        items: Vec<Ack>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<Acked, StoreError>>, StoreError> {
        match self.batched(group_commit::Work::Ack(items, now)).await? {
            group_commit::Done::Ack(v) => Ok(v),
            other => Err(mixed_up(other)),
        }
    }

    /// [`Store::nack`] at `now` (`None`: the database's clock).
    pub async fn nack_at(
        &self,
        items: Vec<Nack>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<FailureOutcome, StoreError>>, StoreError> {
        match self.batched(group_commit::Work::Nack(items, now)).await? {
            group_commit::Done::Nack(v) => Ok(v),
            other => Err(mixed_up(other)),
        }
    }

    /// [`Store::release`] at `now` (`None`: the database's clock).
    pub async fn release_at(
        &self,
        items: Vec<Release>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<Released, StoreError>>, StoreError> {
        let inner = &*self.inner;
        write_tx!(self, |tx, cx| {
            let now = sql::resolve_now(tx, now).await?;
            let ids: Vec<MessageId> = items.iter().map(|r| r.lease.id).collect();
            transitions::lock_rows(inner, tx, &ids).await?;
            per_item!(&items, |r| transitions::release(
                inner, tx, &mut *cx, r, now
            )
            .await)
        })
    }

    /// [`Store::returned`] at `now` (`None`: the database's clock).
    pub async fn returned_at(
        &self,
        items: Vec<Returned>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<Option<FailureOutcome>, StoreError>>, StoreError> {
        let inner = &*self.inner;
        write_tx!(self, |tx, cx| {
            let now = sql::resolve_now(tx, now).await?;
            let ids: Vec<MessageId> = items.iter().map(|r| r.id).collect();
            transitions::lock_rows(inner, tx, &ids).await?;
            per_item!(&items, |r| transitions::returned(
                inner, tx, &mut *cx, r, now
            )
            .await)
        })
    }

    /// [`Store::extend`] at `now` (`None`: the database's clock).
    pub async fn extend_at(
        &self,
        lease: LeaseRef,
        by_ms: u64,
        now: Option<Timestamp>,
    ) -> Result<Timestamp, StoreError> {
        let inner = &*self.inner;
        write_tx!(self, |tx, cx| transitions::extend(
            inner, tx, cx, &lease, by_ms, now
        )
        .await)
    }

    /// [`Store::redrive_with`] at `now` (`None`: the database's clock).
    pub async fn redrive_at(
        &self,
        id: MessageId,
        payload: Option<serde_json::Value>,
        now: Option<Timestamp>,
    ) -> Result<Message, StoreError> {
        let inner = &*self.inner;
        write_tx!(self, |tx, cx| {
            let now = sql::resolve_now(tx, now).await?;
            transitions::redrive(inner, tx, cx, &id, payload.as_ref(), None, now).await
        })
    }

    /// [`Store::kill`] at `now` (`None`: the database's clock).
    pub async fn kill_at(
        &self,
        id: MessageId,
        reason: Option<String>,
        now: Option<Timestamp>,
    ) -> Result<Message, StoreError> {
        let inner = &*self.inner;
        write_tx!(self, |tx, cx| {
            let now = sql::resolve_now(tx, now).await?;
            transitions::kill(inner, tx, cx, &id, reason.clone(), now).await
        })
    }

    /// [`Store::tick`] at `now` (`None`: the database's clock).
    pub async fn tick_at(&self, now: Option<Timestamp>) -> Result<TickOutcome, StoreError> {
        let inner = &*self.inner;
        write_tx!(self, |tx, cx| transitions::tick(inner, tx, cx, now).await)
    }

    /// [`Store::purge`] at `now` (`None`: the database's clock).
    pub async fn purge_at(
        &self,
        now: Option<Timestamp>,
        done_retention_ms: u64,
    ) -> Result<PurgeOutcome, StoreError> {
        write_tx!(self, |tx, cx| transitions::purge(
            tx,
            cx,
            now,
            done_retention_ms
        )
        .await)
    }
}

/// What weakens the durability of a commit on this server, if anything.
async fn durability_check(c: &mut mysql_async::Conn, mariadb: bool) -> Result<Option<String>, E> {
    let r = sql::query_one(
        c,
        "SELECT CAST(@@innodb_flush_log_at_trx_commit AS SIGNED), CAST(@@log_bin AS SIGNED), \
         CAST(@@sync_binlog AS SIGNED), @@binlog_format",
        mysql_async::Params::Empty,
    )
    .await?;
    let flush: Option<i64> = sql::col(&r, 0)?;
    let log_bin: Option<i64> = sql::col(&r, 1)?;
    let sync_binlog: Option<i64> = sql::col(&r, 2)?;
    let format: Option<String> = sql::col(&r, 3)?;
    let mut why = Vec::new();
    if flush != Some(1) {
        why.push(format!(
            "innodb_flush_log_at_trx_commit = {} (not 1): InnoDB does not flush its log at each \
             commit, so the last second of acknowledged writes can be lost when the database host \
             crashes",
            flush.map_or("?".to_owned(), |v| v.to_string())
        ));
    }
    if log_bin == Some(1) && sync_binlog != Some(1) {
        why.push(format!(
            "binary logging is on with sync_binlog = {} (not 1): a crash can lose acknowledged \
             writes from the binary log (replicas and point-in-time recovery)",
            sync_binlog.map_or("?".to_owned(), |v| v.to_string())
        ));
    }
    if mariadb && log_bin == Some(1) && format.as_deref() != Some("ROW") {
        why.push(format!(
            "binary logging is on with binlog_format = {}: MariaDB replicates SKIP LOCKED \
             claims safely only with binlog_format = ROW",
            format.unwrap_or_default()
        ));
    }
    Ok((!why.is_empty()).then(|| why.join("; ")))
}

#[async_trait::async_trait]
impl Store for MysqlStore {
    async fn publish(
        &self,
        items: Vec<NewMessage>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Published>, StoreError> {
        self.publish_at(items, now).await
    }

    async fn lease(
        &self,
        req: LeaseRequest,
        now: Option<Timestamp>,
    ) -> Result<Vec<Leased>, StoreError> {
        self.lease_at(req, now).await
    }

    async fn ack(
        &self,
        items: Vec<Ack>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<Acked, StoreError>>, StoreError> {
        self.ack_at(items, now).await
    }

    async fn nack(
        &self,
        items: Vec<Nack>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<FailureOutcome, StoreError>>, StoreError> {
        self.nack_at(items, now).await
    }

    async fn release(
        &self,
        items: Vec<Release>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<Released, StoreError>>, StoreError> {
        self.release_at(items, now).await
    }

    async fn returned(
        &self,
        items: Vec<Returned>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<Option<FailureOutcome>, StoreError>>, StoreError> {
        self.returned_at(items, now).await
    }

    async fn extend(
        &self,
        lease: LeaseRef,
        by_ms: u64,
        now: Option<Timestamp>,
    ) -> Result<Timestamp, StoreError> {
        self.extend_at(lease, by_ms, now).await
    }

    async fn redrive_with(
        &self,
        id: MessageId,
        payload: Option<serde_json::Value>,
        now: Option<Timestamp>,
    ) -> Result<Message, StoreError> {
        self.redrive_at(id, payload, now).await
    }

    async fn kill(
        &self,
        id: MessageId,
        reason: Option<String>,
        now: Option<Timestamp>,
    ) -> Result<Message, StoreError> {
        self.kill_at(id, reason, now).await
    }

    async fn delete(&self, id: MessageId) -> Result<Message, StoreError> {
        let inner = &*self.inner;
        write_tx!(self, |tx, cx| transitions::delete(inner, tx, cx, &id).await)
    }

    async fn idempotency_keys(
        &self,
        queue: String,
        prefix: String,
        limit: u32,
        now: Option<Timestamp>,
    ) -> Result<Vec<(String, MessageId)>, StoreError> {
        read!(self, |c| {
            let now = sql::resolve_now(c, now).await?;
            reads::idempotency_keys(c, &queue, &prefix, limit, now).await
        })
    }

    async fn forget_idempotency_keys(
        &self,
        queue: String,
        keys: Vec<String>,
    ) -> Result<u64, StoreError> {
        if keys.is_empty() {
            return Ok(0);
        }
        write_tx!(self, |tx, _cx| transitions::forget_idempotency_keys(
            tx, &queue, &keys
        )
        .await)
    }

    async fn tick(&self, now: Option<Timestamp>) -> Result<TickOutcome, StoreError> {
        self.tick_at(now).await
    }

    async fn purge(
        &self,
        now: Option<Timestamp>,
        done_retention_ms: u64,
    ) -> Result<PurgeOutcome, StoreError> {
        self.purge_at(now, done_retention_ms).await
    }

    async fn get(&self, id: MessageId) -> Result<Option<Message>, StoreError> {
        read!(self, |c| reads::get(c, &id).await)
    }

    async fn search(
        &self,
        filter: MessageFilter,
        limit: u32,
        cursor: Option<String>,
    ) -> Result<Page, StoreError> {
        read!(self, |c| reads::search(
            c,
            &filter,
            limit,
            cursor.as_deref()
        )
        .await)
    }

    async fn count(&self, filter: MessageFilter) -> Result<u64, StoreError> {
        read!(self, |c| reads::count(c, &filter).await)
    }

    async fn task_create(&self, task: TaskRecord, audit: NewAudit) -> Result<(), StoreError> {
        write_tx!(self, |tx, _cx| ops::task_create(tx, &task, &audit).await)
    }

    async fn task_transition(
        &self,
        t: TaskTransition,
        now: Option<Timestamp>,
    ) -> Result<TaskRecord, StoreError> {
        write_tx!(self, |tx, _cx| {
            let now = sql::resolve_now(tx, now).await?;
            ops::task_transition(tx, &t, now).await
        })
    }

    async fn task_step(
        &self,
        step: TaskStep,
        now: Option<Timestamp>,
    ) -> Result<TaskStepOutcome, StoreError> {
        let inner = &*self.inner;
        write_tx!(self, |tx, cx| {
            let now = sql::resolve_now(tx, now).await?;
            ops::task_step(inner, tx, cx, &step, now).await
        })
    }

    async fn task(&self, id: String) -> Result<Option<TaskRecord>, StoreError> {
        read!(self, |c| ops::task(c, &id).await)
    }

    async fn tasks(
        &self,
        state: Option<TaskState>,
        limit: u32,
    ) -> Result<Vec<TaskRecord>, StoreError> {
        read!(self, |c| ops::tasks(c, state, limit).await)
    }

    async fn audit(&self, entry: NewAudit, now: Option<Timestamp>) -> Result<u64, StoreError> {
        write_tx!(self, |tx, _cx| {
            let now = sql::resolve_now(tx, now).await?;
            ops::audit_insert(tx, &entry, now).await
        })
    }

    async fn audit_list(
        &self,
        before: Option<u64>,
        limit: u32,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        read!(self, |c| ops::audit_list(c, before, limit).await)
    }

    async fn session_create(
        &self,
        s: NewSession,
        now: Option<Timestamp>,
    ) -> Result<SessionRecord, StoreError> {
        write_tx!(self, |tx, _cx| {
            let now = sql::resolve_now(tx, now).await?;
            sessions::create(tx, &s, now).await
        })
    }

    async fn session_get(
        &self,
        q: SessionLookup,
        now: Option<Timestamp>,
    ) -> Result<Option<SessionRecord>, StoreError> {
        let (found, now) = read!(self, |c| {
            let now = sql::resolve_now(c, now).await?;
            Ok((sessions::get(c, &q.id).await?, now))
        })?;
        let Some(mut found) = found.filter(|s| !s.expired(now, q.idle_ms)) else {
            return Ok(None);
        };
        if found.due_for_touch(now, q.touch_after_ms) {
            let id = &q.id;
            if !write_tx!(self, |tx, _cx| sessions::touch(tx, id, now).await)? {
                return Ok(None); // ended meanwhile
            }
            found.last_seen = found.last_seen.max(now);
        }
        Ok(Some(found))
    }

    async fn session_delete(&self, id: String) -> Result<bool, StoreError> {
        write_tx!(self, |tx, _cx| sessions::delete(tx, &id).await)
    }

    async fn shared_secret(&self, name: String, candidate: String) -> Result<String, StoreError> {
        write_tx!(self, |tx, _cx| sessions::shared_secret(
            tx, &name, &candidate
        )
        .await)
    }

    async fn queue_stats(&self) -> Result<Vec<QueueStats>, StoreError> {
        read!(self, |c| reads::queue_stats(c).await)
    }

    async fn heartbeat(&self, beat: Heartbeat, now: Option<Timestamp>) -> Result<Beat, StoreError> {
        write_tx!(self, |tx, _cx| cluster::heartbeat(tx, &beat, now).await)
    }

    async fn leave(&self, incarnation: String, now: Option<Timestamp>) -> Result<(), StoreError> {
        write_tx!(self, |tx, _cx| cluster::leave(tx, &incarnation, now).await)
    }

    async fn cluster(&self, now: Option<Timestamp>) -> Result<ClusterView, StoreError> {
        read!(self, |c| cluster::view(c, now).await)
    }

    async fn endpoint_trip(
        &self,
        endpoint: String,
        incarnation: String,
        open_ms: u64,
        now: Option<Timestamp>,
    ) -> Result<(), StoreError> {
        write_tx!(self, |tx, _cx| cluster::endpoint_trip(
            tx,
            &endpoint,
            &incarnation,
            open_ms,
            now
        )
        .await)
    }

    async fn endpoint_trips(
        &self,
        now: Option<Timestamp>,
    ) -> Result<redrive_storage::EndpointTrips, StoreError> {
        read!(self, |c| cluster::endpoint_trips(c, now).await)
    }

    fn notifier(&self) -> Notifier {
        Notifier::new(self.inner.wake_tx.subscribe(), self.inner.ready_tx.clone())
            .shared(Duration::from_secs(1))
    }

    fn health(&self) -> Health {
        if self.closed.load(Ordering::SeqCst) {
            return Health::Failed("the store is closed".to_owned());
        }
        if self
            .batcher
            .as_ref()
            .is_some_and(group_commit::Batcher::stopped)
        {
            return Health::Failed("the store's group-commit task has stopped".to_owned());
        }
        if let Some(why) = self.inner.superseded.why() {
            return Health::Superseded(why);
        }
        match self.inner.unavailable.lock().map(|u| u.clone()) {
            Ok(Some(why)) => Health::Unavailable(why),
            _ => Health::Ok,
        }
    }

    async fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        self.poller.abort();
        if let Some(b) = &self.batcher {
            b.close().await;
        }
        let _ = self.inner.pool.clone().disconnect().await;
    }

    fn commit_stats(&self) -> CommitStats {
        self.inner.stats.lock().map(|s| *s).unwrap_or_default()
    }

    fn metrics(&self) -> Vec<StoreMetric> {
        let c = self.conflict_stats();
        vec![
            StoreMetric {
                name: "redrive_mysql_deadlock_retries_total",
                help: "Transactions run again after InnoDB chose them as a deadlock victim (error 1213).",
                kind: MetricKind::Counter,
                value: c.deadlock_retries as f64,
            },
            StoreMetric {
                name: "redrive_mysql_lock_wait_retries_total",
                help: "Transactions run again after a lock wait timed out (error 1205).",
                kind: MetricKind::Counter,
                value: c.lock_wait_retries as f64,
            },
            StoreMetric {
                name: "redrive_mysql_conflicts_gave_up_total",
                help: "Calls that kept conflicting and were answered unavailable.",
                kind: MetricKind::Counter,
                value: c.gave_up as f64,
            },
        ]
    }
}

impl Drop for MysqlStore {
    fn drop(&mut self) {
        self.poller.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::parse_version;

    #[test]
    fn versions_are_read_from_both_servers() {
        assert_eq!(
            parse_version("10.11.19-MariaDB-0+deb12u1"),
            (true, (10, 11))
        );
        assert_eq!(parse_version("8.0.36"), (false, (8, 0)));
        assert_eq!(parse_version("5.5.5-10.6.12-MariaDB"), (true, (10, 6)));
    }
}
