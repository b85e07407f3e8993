//! The PostgreSQL backend of redrive's storage contract ([`redrive_storage::Store`]).
//!
//! [`PostgresStore`] keeps every message of every queue in one PostgreSQL schema (default
//! `redrive`) that it creates and migrates itself at open ([`PostgresStore::open`]), so that
//! several redrive processes can share one database (SPEC §7, §13). It passes the same
//! conformance suite as the embedded SQLite store (`tests/conformance_postgres.rs`).
//!
//! ```no_run
//! use redrive_store_postgres::{PostgresOptions, PostgresStore};
//! use redrive_storage::Store;
//!
//! # async fn run() -> Result<(), redrive_storage::StoreError> {
//! let mut opts = PostgresOptions::new("postgres://redrive@db.internal:5432/app");
//! opts.schema = "redrive".into();
//! let store = PostgresStore::open(opts).await?;
//! if store.synchronous_commit_off() {
//!     eprintln!("warning: synchronous_commit is off: acknowledged writes may be lost");
//! }
//! let next = *store.notifier().due().borrow();
//! # let _ = next;
//! store.close().await;
//! # Ok(())
//! # }
//! ```
//!
//! # Shape
//!
//! `messages` (identity, content, lifecycle), `message_ids` (each message's id and queue,
//! written once: the indexes every row needs whatever its state), `history` (appended entries), `idempotency`
//! (keys outliving their purged messages), `key_heads` (per-key ordering's lock point),
//! `tasks`, `audit`, `sessions` (the console's), `nodes` and `leader` (the cluster's), `meta`
//! and `schema_migrations`; the ready set, the scheduled set and
//! the leased set are partial indexes of `messages`, so a claim, a promotion and the reaper
//! are each an index range scan over only the rows they can take. `schema.rs` says why this
//! shape and not another. The dead entries every transition leaves in those indexes are
//! vacuumed by the store itself when autovacuum lags behind (`vacuum.rs`): a claim would
//! otherwise walk all of them at the head of the ready set.
//!
//! # How a transition runs
//!
//! Every call runs in a transaction on a pooled connection (`deadpool-postgres`, no TLS).
//! A transition locks the message's row (`SELECT … FOR UPDATE`), reads its
//! [`Lifecycle`](redrive_storage::rules::Lifecycle), lets `redrive_storage::rules` decide
//! (the same rules the SQLite store calls: none is restated here), writes the changed row
//! in one `UPDATE` and appends its history entries. A claim is one statement (`UPDATE …
//! WHERE seq = ANY(ARRAY(SELECT … LIMIT n FOR UPDATE SKIP LOCKED))`, see
//! `transitions::LEASE_SQL`), so competing claimers on any number of nodes never lease one
//! message twice and never more than `n`.
//!
//! Publish, ack and nack go through group commit (`group_commit.rs`): the calls that
//! arrive while a batch commits share the next transaction (a savepoint each) and its one
//! commit. A call of several items is set-based (`transitions::publish_many`,
//! `ack_many`, `nack_many`): one statement reads (and locks) what the items need, the rules
//! decide per item, one statement writes the rows and one their history. Every other write is a transaction of its own. A serialization failure or a
//! deadlock rolls a call back and runs it again; so does a pooled connection found dead
//! before the call's `COMMIT` was sent (nothing of it committed). A database that cannot
//! be reached is [`StoreError::Unavailable`], never a poisoned store.
//!
//! A publish, ack, nack, release, return or operator action answers only after its commit,
//! durable under the server's `synchronous_commit` ([`PostgresStore::synchronous_commit_off`]
//! tells the server to warn when it is off); a lease and a tick commit with
//! `synchronous_commit = off`, like the SQLite store's unsynced leases: nobody was promised
//! their durability, a lost one is redone, and any later synchronous commit makes them
//! durable too (the WAL is flushed in order).
//!
//! Times are the caller's (`Some(now)`) or, given `None`, the database's clock, read once
//! at the start of the transaction.
//!
//! Other stores on the schema hear of messages made ready through LISTEN/NOTIFY
//! (`notify.rs`, [`Notifier::ready`]); `health` says `Unavailable` while a probe of the
//! database (every second) gets no answer, and `Ok` again once it does.
//!
//! # Not yet
//!
//! - Group commit covers publish, ack and nack; release, return, extend, operator
//!   actions, leases and ticks commit alone.
//! - Queue statistics are counted with `GROUP BY` on each call (no counters table yet).
//! - A queue's `ordering` or `on_dead` changed while nodes run: the rows are rewritten
//!   at the next open (`key_order::reconcile`), and nodes still running the old
//!   configuration keep writing under it until they restart.
//! - A leader or lease row for once-only work; ticks are safe on every node at once
//!   (they lock what they change with `SKIP LOCKED`), purges too.
//! - Two transitions of one ordered key whose messages are already locked can deadlock
//!   (`key_order.rs`); PostgreSQL breaks it after `deadlock_timeout` and the call runs
//!   again, so it costs latency, not correctness.
//! - TLS: a URL asking for it (`sslmode=require`, `verify-ca`, `verify-full`) is refused.
//! - No figures of its own on `/metrics` (pool, WAL position).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

/// The per-item answers of a batch: `$body` (using the item `$it`) is run for each item;
/// a refused item answers its error and the others go on, a failed statement fails the
/// whole batch (its transaction is aborted).
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
mod key_order;
mod notify;
mod ops;
mod reads;
mod row;
mod schema;
mod sessions;
mod sql;
mod sql_publish;
mod transitions;
mod vacuum;

pub use schema::{valid_schema_name, SCHEMA_VERSION};
pub use sql_publish::SqlPublishLimits;

use error::E;
use redrive_core::{Message, MessageId, NewMessage, QueueCatalog, SplitMix64, State, Timestamp};
use redrive_storage::{
    Ack, Acked, AuditRecord, Beat, ClusterView, CommitStats, FailureOutcome, Health, Heartbeat,
    LeaseRef, LeaseRequest, Leased, MessageFilter, Nack, NewAudit, NewSession, Notifier, Page,
    Published, PurgeOutcome, QueueStats, ReadyNotice, Release, Released, Returned, SessionLookup,
    SessionRecord, Store, StoreError, StoreOptions, TaskRecord, TaskState, TaskStep,
    TaskStepOutcome, TaskTransition, TickOutcome,
};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_postgres::NoTls;

/// How to open a [`PostgresStore`].
#[derive(Clone)]
pub struct PostgresOptions {
    /// `postgres://user@host:port/database?…` (or a `key=value` connection string). No TLS:
    /// `sslmode` may be `disable`, `prefer` (connects without) or absent.
    pub url: String,
    /// The schema holding redrive's tables (created if missing): lower-case letters, digits
    /// and `_`.
    pub schema: String,
    /// Connections in the pool.
    pub pool_size: usize,
    /// What every backend is opened with: the queue catalog, the idempotency window, the
    /// generator's seed, the commit observer.
    pub store: StoreOptions,
    /// Group commit: concurrent publish, ack and nack calls share one transaction and one
    /// commit (`group_commit.rs`). On by default.
    pub group_commit: bool,
    /// What the SQL function `publish(…)` checks (transactional enqueue,
    /// `sql_publish.rs`): the server's limits, recorded in the schema at open.
    pub sql_publish: SqlPublishLimits,
    /// Tell the other nodes of messages made ready (NOTIFY) and listen for theirs (LISTEN),
    /// on by default. Off for a connection pooler in transaction mode (PgBouncer), which
    /// cannot keep a LISTEN: other nodes then see a publish within a second (every
    /// long poll looks again that often on a shared store, `Notifier::recheck`).
    pub notify: bool,
}

impl std::fmt::Debug for PostgresOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the URL: it may carry a password.
        f.debug_struct("PostgresOptions")
            .field("schema", &self.schema)
            .field("pool_size", &self.pool_size)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl PostgresOptions {
    /// Defaults for `url`: schema `redrive`, 16 connections, default queue settings, 24 h
    /// idempotency window.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            schema: "redrive".to_owned(),
            pool_size: 16,
            store: StoreOptions::default(),
            group_commit: true,
            sql_publish: SqlPublishLimits::default(),
            notify: true,
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
    /// Queues in which messages became ready, and how many: told to the other stores on
    /// the schema in the transaction (`notify.rs`).
    pub ready: Vec<(String, u32)>,
}

impl Ctx {
    /// Take in what a piece of a transaction did (a job of a batch).
    pub fn absorb(&mut self, other: Ctx) {
        self.changes += other.changes;
        if let Some(w) = other.wake {
            self.wake_at(w);
        }
        for (q, n) in &other.ready {
            self.made_ready(q, *n);
        }
    }

    pub fn wake_at(&mut self, at: i64) {
        self.wake = Some(self.wake.map_or(at, |w| w.min(at)));
    }

    /// A message of `queue` now in `life`'s state: a scheduled one wakes the scheduler at
    /// its due time, a ready one is told to the other stores.
    pub fn moved(&mut self, queue: &str, life: &redrive_storage::rules::Lifecycle) {
        self.wake_if_scheduled(life);
        if life.state == State::Ready {
            self.made_ready(queue, 1);
        }
    }

    /// `n` messages of `queue` became ready.
    pub fn made_ready(&mut self, queue: &str, n: u32) {
        match self.ready.iter_mut().find(|(q, _)| q == queue) {
            Some((_, c)) => *c = c.saturating_add(n),
            None => self.ready.push((queue.to_owned(), n)),
        }
    }

    /// A scheduled message wakes the scheduler at its due time.
    pub fn wake_if_scheduled(&mut self, life: &redrive_storage::rules::Lifecycle) {
        if life.state == State::Scheduled {
            if let Some(d) = life.due_at {
                self.wake_at(d.as_millis());
            }
        }
    }
}

/// How often the health probe asks the database, and how long it waits for an answer.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// Ask the database `SELECT 1` every [`PROBE_EVERY`], and record whether it answered, so
/// that [`Store::health`] (and `/readyz`) says `Unavailable` while it is down or unreachable
/// and `Ok` again, by itself, once it is back.
///
/// It also keeps the wake hint at most [`PROBE_EVERY`] ahead: leases taken on another node
/// send no notice (a NOTIFY per claim would cost every claim's commit), so without it a
/// node that died would leave its leases unexpired until some write here woke the
/// scheduler. With it, every node ticks at least once a second, and a dead node's leases
/// are failed within a second of their expiry (SPEC §13: polling of at most 1 s). That
/// second is counted on the database's clock, which the probe reads: the wake hint is a
/// time of the store's clock, and a node whose own clock is minutes ahead would otherwise
/// put it minutes away (and never expire a killed node's leases).
///
/// And it reads the schema's version: a newer redrive (a node upgraded while this one ran)
/// that migrated the schema past [`SCHEMA_VERSION`] makes this store refuse every call from
/// then on ([`StoreError::Superseded`]), within a second, rather than go on writing rows the
/// newer schema may need written otherwise.
async fn probe(inner: Arc<Inner>, schema: String) {
    loop {
        let answer = tokio::time::timeout(PROBE_EVERY * 2, async {
            let client = inner.pool.get().await.map_err(|e| e.to_string())?;
            let now = sql::resolve_now(&client, None)
                .await
                .map(|t| t.as_millis())
                .map_err(|e| e.into_store().to_string())?;
            let version = schema::version(&client)
                .await
                .map_err(|e| e.into_store().to_string())?;
            Ok::<_, String>((now, version))
        })
        .await;
        if let Ok(Ok((db_now, version))) = answer {
            inner.due_elsewhere(db_now + PROBE_EVERY.as_millis() as i64);
            if version > SCHEMA_VERSION {
                let why = schema::superseded(&schema, version);
                if inner.superseded.set(why.clone()) {
                    tracing::error!(reason = %why, "refusing every request: stop this node and start the newer redrive");
                }
            }
        }
        let why = match answer {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("PostgreSQL does not answer: {e}")),
            Err(_) => Some("PostgreSQL did not answer within 2 s".to_owned()),
        };
        if let Ok(mut u) = inner.unavailable.lock() {
            if u.is_none() && why.is_some() {
                tracing::warn!(reason = ?why, "the store is unavailable");
            } else if u.is_some() && why.is_none() {
                tracing::info!("the store is available again");
            }
            *u = why;
        }
        tokio::time::sleep(PROBE_EVERY).await;
    }
}

/// What every transaction of a store shares.
pub(crate) struct Inner {
    pool: deadpool_postgres::Pool,
    pub catalog: Arc<QueueCatalog>,
    pub idempotency_window_ms: u64,
    rng: Mutex<SplitMix64>,
    /// Random at every open, whatever the seed: mixed into every lease nonce, so that two
    /// stores (two nodes, or one restarted with a fixed seed) never hand out one token.
    pub epoch: u64,
    /// Where the tick's promotion starts when more queues are due than it serves.
    pub rotation: AtomicUsize,
    wake_tx: watch::Sender<Option<Timestamp>>,
    /// [`Notifier::ready`]'s sender: messages other stores on the schema made ready, fed by
    /// the listener (`notify::listen`).
    ready_tx: tokio::sync::broadcast::Sender<ReadyNotice>,
    /// The schema's LISTEN/NOTIFY channel (`notify.rs`); notices carry `epoch` as the
    /// sender, so a store skips its own. `None` with [`PostgresOptions::notify`] off.
    pub channel: Option<String>,
    stats: Mutex<CommitStats>,
    observer: Option<Arc<dyn Fn(usize, f64) + Send + Sync>>,
    /// Why the database cannot be reached now, as the last probe found (`probe`).
    unavailable: Mutex<Option<String>>,
    /// Set by the probe once a newer redrive has migrated the schema past this build's
    /// [`SCHEMA_VERSION`]: every call is refused from then on.
    superseded: redrive_storage::Supersession,
    /// Claims gated and combined per queue on this node ([`PostgresStore::lease_at`]).
    claims: redrive_storage::claims::Claims,
}

impl Inner {
    /// Run `f` on the store's generator.
    pub fn with_rng<T>(&self, f: impl FnOnce(&mut SplitMix64) -> T) -> T {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut rng)
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

    /// Another process wrote a message due at `at` (ms): wake the scheduler then at the
    /// latest.
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
}

/// The PostgreSQL store. Cheap to share behind an `Arc`.
pub struct PostgresStore {
    inner: Arc<Inner>,
    /// The group-commit batcher of publish, ack and nack (`None`: each call commits alone).
    batcher: Option<group_commit::Batcher>,
    closed: AtomicBool,
    /// The LISTEN task (`notify::listen`), stopped by `close` and on drop.
    listener: tokio::task::JoinHandle<()>,
    /// The health probe (`probe`), stopped by `close`.
    prober: tokio::task::JoinHandle<()>,
    /// The hot tables' vacuum when autovacuum lags (`vacuum::keep_clean`), stopped by `close`.
    vacuumer: tokio::task::JoinHandle<()>,
    synchronous_commit_off: bool,
    schema: String,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

/// A transaction that conflicts (serialization failure, deadlock, a race on an
/// idempotency key) is run again at most this many times.
pub(crate) const MAX_RETRIES: u32 = 5;

/// How long a call waits for a pooled connection, or for a new one to be made, before it
/// fails as [`StoreError::Unavailable`].
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// A batcher's answer of another kind than its job (a bug).
fn mixed_up(done: group_commit::Done) -> StoreError {
    StoreError::Backend(format!(
        "group commit answered another kind of call: {done:?}"
    ))
}

/// Refuse a URL that asks for TLS: this build connects without (`NoTls`).
fn refuse_tls(url: &str) -> Result<(), StoreError> {
    let lower = url.to_ascii_lowercase();
    for (i, _) in lower.match_indices("sslmode") {
        let rest = lower[i + "sslmode".len()..].trim_start();
        let Some(value) = rest.strip_prefix('=') else {
            continue;
        };
        let value: String = value
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if matches!(value.as_str(), "require" | "verify-ca" | "verify-full") {
            return Err(StoreError::Backend(format!(
                "PostgreSQL URL asks for sslmode={value}: TLS is not supported yet by redrive's \
                 PostgreSQL store; use sslmode=disable or prefer (or no sslmode), or a TLS proxy"
            )));
        }
    }
    Ok(())
}

/// A random number: the generator's seed when none is given, and the per-open epoch.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Timestamp::now().as_millis() as u128);
    h.write_u32(std::process::id());
    h.finish()
}

/// Run one transaction on `$store`: `$body` (an expression using the transaction `$tx`
/// and the context `$cx: &mut Ctx`, returning `Result<T, E>`) is run, then committed; a
/// conflict runs it all again. Answers `Result<T, StoreError>` after the commit.
macro_rules! write_tx {
    ($store:expr, |$tx:ident, $cx:ident| $body:expr) => {{
        let store: &PostgresStore = $store;
        async {
            store.check_open()?;
            let mut tries = 0u32;
            loop {
                // The error, and whether COMMIT had been sent when it happened.
                let r: Result<_, (E, bool)> = async {
                    let mut client = store.inner.pool.get().await.map_err(|e| (E::from(e), true))?;
                    let $tx = client.transaction().await.map_err(|e| (E::from(e), false))?;
                    let mut ctx = Ctx::default();
                    let v = {
                        let $cx = &mut ctx;
                        let r: Result<_, E> = async { $body }.await;
                        r
                    }
                    .map_err(|e| (e, false))?;
                    notify::send(&$tx, store.inner.channel.as_deref(), store.inner.epoch, &ctx.ready)
                        .await
                        .map_err(|e| (e, false))?;
                    let started = Instant::now();
                    $tx.commit().await.map_err(|e| (E::from(e), true))?;
                    Ok((v, ctx, started.elapsed()))
                }
                .await;
                match r {
                    Ok((v, ctx, took)) => {
                        store.inner.committed(ctx, took);
                        break Ok(v);
                    }
                    Err((E::Retry(why), _)) if tries < MAX_RETRIES => {
                        tries += 1;
                        tracing::debug!(%why, tries, "PostgreSQL transaction conflicted; again");
                    }
                    // A pooled connection found dead before COMMIT was sent: nothing
                    // committed, so run it again on a new one (the pool drops the dead one).
                    Err((e, false)) if e.lost_connection() && tries < MAX_RETRIES => {
                        tries += 1;
                        tracing::debug!(?e, tries, "PostgreSQL connection lost; again");
                    }
                    Err((e, _)) => break Err(e.into_store()),
                }
            }
        }
        .await
    }};
}

/// Run `$body` (using the pooled connection `$c`) outside any transaction of ours: a read.
/// A read on a connection found dead runs again on a new one.
macro_rules! read {
    ($store:expr, |$c:ident| $body:expr) => {{
        let store: &PostgresStore = $store;
        async {
            store.check_open()?;
            let mut tries = 0u32;
            loop {
                let r: Result<_, E> = async {
                    let $c = store.inner.pool.get().await?;
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

mod group_commit;

impl PostgresStore {
    /// Connect, create the schema if missing and migrate it (refusing one newer than this
    /// build knows), and read the next wake-up.
    pub async fn open(opts: PostgresOptions) -> Result<Self, StoreError> {
        if !schema::valid_schema_name(&opts.schema) {
            return Err(StoreError::Backend(format!(
                "PostgreSQL schema name {:?}: use lower-case ASCII letters, digits and _ (at most 63, \
                 not starting with a digit)",
                opts.schema
            )));
        }
        refuse_tls(&opts.url)?;
        let mut cfg: tokio_postgres::Config = opts
            .url
            .parse()
            .map_err(|e| StoreError::Backend(format!("invalid PostgreSQL URL: {e}")))?;
        if cfg.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
            return Err(StoreError::Backend(
                "PostgreSQL URL requires TLS: TLS is not supported yet by redrive's PostgreSQL store"
                    .to_owned(),
            ));
        }
        // Plans are made for each execution's arguments, never cached generic ones: a generic
        // plan is fixed on a connection after its first executions, and one made while a
        // table was empty (a new schema, a drained queue) joins `messages` by a sequential
        // scan for as long as the connection lives (measured: a retry cycle at 1/5 of its
        // speed, the statements reading the whole table thousands of times). Planning costs
        // far less than that, and batches make it rare per message.
        let ours = format!(
            "-c search_path={} -c plan_cache_mode=force_custom_plan",
            opts.schema
        );
        let options = match cfg.get_options() {
            Some(o) if !o.trim().is_empty() => format!("{o} {ours}"),
            _ => ours,
        };
        cfg.options(&options);
        if cfg.get_application_name().is_none() {
            cfg.application_name("redrive");
        }
        let listen_cfg = cfg.clone();
        let manager = deadpool_postgres::Manager::from_config(
            cfg,
            NoTls,
            deadpool_postgres::ManagerConfig {
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(opts.pool_size.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(CONNECTION_TIMEOUT))
            .create_timeout(Some(CONNECTION_TIMEOUT))
            .build()
            .map_err(|e| StoreError::Backend(format!("PostgreSQL pool: {e}")))?;
        let setup: Result<(bool, Option<i64>), E> = async {
            let mut client = pool.get().await?;
            schema::migrate(&mut client, &opts.schema).await?;
            key_order::reconcile(&mut client, &opts.schema, &opts.store.catalog).await?;
            sql_publish::record(&client, opts.sql_publish, opts.store.idempotency_window_ms)
                .await?;
            let sync: String = client
                .query_one("SHOW synchronous_commit", &[])
                .await?
                .try_get(0)?;
            let wake = reads::next_wake(&client).await?;
            Ok((sync.eq_ignore_ascii_case("off"), wake))
        }
        .await;
        let (synchronous_commit_off, wake) = setup.map_err(E::into_store)?;
        let seed = opts.store.seed.unwrap_or_else(random_seed);
        let inner = Arc::new(Inner {
            pool,
            catalog: opts.store.catalog,
            idempotency_window_ms: opts.store.idempotency_window_ms,
            rng: Mutex::new(SplitMix64::new(seed)),
            // Never 0: notices from 0 are the SQL function's (`sql_publish.rs`).
            epoch: random_seed() | 1,
            rotation: AtomicUsize::new(0),
            wake_tx: watch::Sender::new(wake.map(Timestamp::from_millis)),
            ready_tx: tokio::sync::broadcast::Sender::new(1024),
            channel: opts.notify.then(|| notify::channel(&opts.schema)),
            stats: Mutex::new(CommitStats::default()),
            observer: opts.store.commit_observer.clone(),
            unavailable: Mutex::new(None),
            superseded: redrive_storage::Supersession::default(),
            claims: redrive_storage::claims::Claims::default(),
        });
        let prober = tokio::spawn(probe(inner.clone(), opts.schema.clone()));
        let vacuumer = tokio::spawn(vacuum::keep_clean(inner.clone(), opts.schema.clone()));
        let (listening_tx, mut listening) = watch::channel(false);
        let listener = if opts.notify {
            tokio::spawn(notify::listen(listen_cfg, inner.clone(), listening_tx))
        } else {
            let _ = listening_tx.send(true);
            tokio::spawn(async {})
        };
        // Listening before the store is handed out: a notice sent right after the open (by
        // another node) reaches it. Not a condition of opening: notices are hints.
        if tokio::time::timeout(CONNECTION_TIMEOUT, listening.wait_for(|l| *l))
            .await
            .is_err()
        {
            tracing::warn!("PostgreSQL LISTEN not ready yet: notices from other nodes may be late");
        }
        let batcher = opts
            .group_commit
            .then(|| group_commit::Batcher::start(inner.clone()));
        Ok(Self {
            inner,
            batcher,
            closed: AtomicBool::new(false),
            listener,
            prober,
            vacuumer,
            synchronous_commit_off,
            schema: opts.schema,
        })
    }

    /// Whether the server runs with `synchronous_commit = off` (seen at open): then a
    /// commit is not durable when it is answered, which breaks SPEC §4's durable
    /// acknowledgement; the server names it in a start-up warning.
    pub fn synchronous_commit_off(&self) -> bool {
        self.synchronous_commit_off
    }

    /// The schema this store keeps its tables in.
    pub fn schema(&self) -> &str {
        &self.schema
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
            None => {
                let inner = &*self.inner;
                write_tx!(self, |tx, cx| group_commit::run_work(inner, &tx, cx, &work)
                    .await)
            }
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
        // At most `claims::CLAIMS_PER_QUEUE` claims of one queue from one node at once, and
        // the leases waiting for a turn claimed together (`redrive_storage::claims`).
        // Measured with the gate alone (retry cycles/s, docs/PERFORMANCE.md): unbounded 4,892
        // at 16 × 100; one at a time 8,419 but 2,354 at 8 × 10 (a lease is a round trip, and
        // one at a time they queue); two 7,847 and 2,744; four 7,232 and 2,791.
        inner
            .claims
            .lease(req, now, |req, now| self.claim(req, now))
            .await
    }

    /// One claim of `req` (its turn taken).
    async fn claim(
        &self,
        req: LeaseRequest,
        now: Option<Timestamp>,
    ) -> Result<Vec<Leased>, StoreError> {
        let inner = &*self.inner;
        self.check_open()?;
        let mut ctx = Ctx::default();
        let started = Instant::now();
        let r: Result<_, E> = async {
            let client = inner.pool.get().await?;
            transitions::lease(inner, &client, &mut ctx, &req, now).await
        }
        .await;
        let leased = r.map_err(E::into_store)?;
        inner.committed(ctx, started.elapsed());
        Ok(leased)
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
            let now = sql::resolve_now(&tx, now).await?;
            per_item!(&items, |r| transitions::release(
                inner, &tx, &mut *cx, r, now
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
            let now = sql::resolve_now(&tx, now).await?;
            per_item!(&items, |r| transitions::returned(
                inner, &tx, &mut *cx, r, now
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
        write_tx!(self, |tx, _cx| transitions::extend(&tx, &lease, by_ms, now)
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
            let now = sql::resolve_now(&tx, now).await?;
            transitions::redrive(inner, &tx, cx, &id, payload.as_ref(), None, now).await
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
            let now = sql::resolve_now(&tx, now).await?;
            transitions::kill(inner, &tx, cx, &id, reason.clone(), now).await
        })
    }

    /// [`Store::tick`] at `now` (`None`: the database's clock).
    pub async fn tick_at(&self, now: Option<Timestamp>) -> Result<TickOutcome, StoreError> {
        let inner = &*self.inner;
        write_tx!(self, |tx, cx| transitions::tick(inner, &tx, cx, now).await)
    }

    /// [`Store::purge`] at `now` (`None`: the database's clock).
    pub async fn purge_at(
        &self,
        now: Option<Timestamp>,
        done_retention_ms: u64,
    ) -> Result<PurgeOutcome, StoreError> {
        write_tx!(self, |tx, cx| transitions::purge(
            &tx,
            cx,
            now,
            done_retention_ms
        )
        .await)
    }

    /// [`Store::idempotency_keys`] at `now` (`None`: the database's clock).
    pub async fn idempotency_keys_at(
        &self,
        queue: String,
        prefix: String,
        limit: u32,
        now: Option<Timestamp>,
    ) -> Result<Vec<(String, MessageId)>, StoreError> {
        read!(self, |c| {
            let now = sql::resolve_now(&c, now).await?;
            reads::idempotency_keys(&c, &queue, &prefix, limit, now).await
        })
    }

    /// [`Store::task_transition`] at `now` (`None`: the database's clock).
    pub async fn task_transition_at(
        &self,
        t: TaskTransition,
        now: Option<Timestamp>,
    ) -> Result<TaskRecord, StoreError> {
        write_tx!(self, |tx, _cx| {
            let now = sql::resolve_now(&tx, now).await?;
            ops::task_transition(&tx, &t, now).await
        })
    }

    /// [`Store::task_step`] at `now` (`None`: the database's clock).
    pub async fn task_step_at(
        &self,
        step: TaskStep,
        now: Option<Timestamp>,
    ) -> Result<TaskStepOutcome, StoreError> {
        let inner = &*self.inner;
        write_tx!(self, |tx, cx| {
            let now = sql::resolve_now(&tx, now).await?;
            ops::task_step(inner, &tx, cx, &step, now).await
        })
    }

    /// [`Store::audit`] at `now` (`None`: the database's clock).
    pub async fn audit_at(
        &self,
        entry: NewAudit,
        now: Option<Timestamp>,
    ) -> Result<u64, StoreError> {
        write_tx!(self, |tx, _cx| {
            let now = sql::resolve_now(&tx, now).await?;
            ops::audit_insert(&tx, &entry, now).await
        })
    }
}

#[async_trait::async_trait]
impl Store for PostgresStore {
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
        write_tx!(self, |tx, cx| transitions::delete(inner, &tx, cx, &id)
            .await)
    }

    async fn idempotency_keys(
        &self,
        queue: String,
        prefix: String,
        limit: u32,
        now: Option<Timestamp>,
    ) -> Result<Vec<(String, MessageId)>, StoreError> {
        self.idempotency_keys_at(queue, prefix, limit, now).await
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
            &tx, &queue, &keys
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
        read!(self, |c| reads::get(&c, &id).await)
    }

    async fn search(
        &self,
        filter: MessageFilter,
        limit: u32,
        cursor: Option<String>,
    ) -> Result<Page, StoreError> {
        read!(self, |c| reads::search(
            &c,
            &filter,
            limit,
            cursor.as_deref()
        )
        .await)
    }

    async fn count(&self, filter: MessageFilter) -> Result<u64, StoreError> {
        read!(self, |c| reads::count(&c, &filter).await)
    }

    async fn task_create(&self, task: TaskRecord, audit: NewAudit) -> Result<(), StoreError> {
        write_tx!(self, |tx, _cx| ops::task_create(&tx, &task, &audit).await)
    }

    async fn task_transition(
        &self,
        t: TaskTransition,
        now: Option<Timestamp>,
    ) -> Result<TaskRecord, StoreError> {
        self.task_transition_at(t, now).await
    }

    async fn task_step(
        &self,
        step: TaskStep,
        now: Option<Timestamp>,
    ) -> Result<TaskStepOutcome, StoreError> {
        self.task_step_at(step, now).await
    }

    async fn task(&self, id: String) -> Result<Option<TaskRecord>, StoreError> {
        read!(self, |c| ops::task(&c, &id).await)
    }

    async fn tasks(
        &self,
        state: Option<TaskState>,
        limit: u32,
    ) -> Result<Vec<TaskRecord>, StoreError> {
        read!(self, |c| ops::tasks(&c, state, limit).await)
    }

    async fn audit(&self, entry: NewAudit, now: Option<Timestamp>) -> Result<u64, StoreError> {
        self.audit_at(entry, now).await
    }

    async fn audit_list(
        &self,
        before: Option<u64>,
        limit: u32,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        read!(self, |c| ops::audit_list(&c, before, limit).await)
    }

    async fn session_create(
        &self,
        s: NewSession,
        now: Option<Timestamp>,
    ) -> Result<SessionRecord, StoreError> {
        let schema = &self.schema;
        write_tx!(self, |tx, _cx| {
            let now = sql::resolve_now(&tx, now).await?;
            sessions::create(&tx, schema, &s, now).await
        })
    }

    async fn session_get(
        &self,
        q: SessionLookup,
        now: Option<Timestamp>,
    ) -> Result<Option<SessionRecord>, StoreError> {
        let (found, now) = read!(self, |c| {
            let now = sql::resolve_now(&c, now).await?;
            Ok((sessions::get(&c, &q.id).await?, now))
        })?;
        let Some(mut found) = found.filter(|s| !s.expired(now, q.idle_ms)) else {
            return Ok(None);
        };
        if found.due_for_touch(now, q.touch_after_ms) {
            let id = &q.id;
            if !write_tx!(self, |tx, _cx| sessions::touch(&tx, id, now).await)? {
                return Ok(None); // ended meanwhile
            }
            found.last_seen = found.last_seen.max(now);
        }
        Ok(Some(found))
    }

    async fn session_delete(&self, id: String) -> Result<bool, StoreError> {
        write_tx!(self, |tx, _cx| sessions::delete(&tx, &id).await)
    }

    async fn shared_secret(&self, name: String, candidate: String) -> Result<String, StoreError> {
        write_tx!(self, |tx, _cx| sessions::shared_secret(
            &tx, &name, &candidate
        )
        .await)
    }

    async fn queue_stats(&self) -> Result<Vec<QueueStats>, StoreError> {
        read!(self, |c| reads::queue_stats(&c).await)
    }

    async fn heartbeat(&self, beat: Heartbeat, now: Option<Timestamp>) -> Result<Beat, StoreError> {
        write_tx!(self, |tx, _cx| cluster::heartbeat(&tx, &beat, now).await)
    }

    async fn leave(&self, incarnation: String, now: Option<Timestamp>) -> Result<(), StoreError> {
        write_tx!(self, |tx, _cx| cluster::leave(&tx, &incarnation, now).await)
    }

    async fn cluster(&self, now: Option<Timestamp>) -> Result<ClusterView, StoreError> {
        read!(self, |c| {
            let mut c = c;
            cluster::view(&mut c, now).await
        })
    }

    async fn endpoint_trip(
        &self,
        endpoint: String,
        incarnation: String,
        open_ms: u64,
        now: Option<Timestamp>,
    ) -> Result<(), StoreError> {
        write_tx!(self, |tx, _cx| cluster::endpoint_trip(
            &tx,
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
        read!(self, |c| cluster::endpoint_trips(&c, now).await)
    }

    fn notifier(&self) -> Notifier {
        Notifier::new(self.inner.wake_tx.subscribe(), self.inner.ready_tx.clone())
            .shared(PROBE_EVERY)
    }

    fn health(&self) -> Health {
        // A database that is down is not a poisoned store: its calls fail `Unavailable`
        // and succeed again once it is back.
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
        self.closed.store(true, Ordering::SeqCst);
        self.listener.abort();
        self.prober.abort();
        self.vacuumer.abort();
        if let Some(b) = &self.batcher {
            b.close().await;
        }
        self.inner.pool.close();
    }

    fn commit_stats(&self) -> CommitStats {
        self.inner.stats.lock().map(|s| *s).unwrap_or_default()
    }
}
