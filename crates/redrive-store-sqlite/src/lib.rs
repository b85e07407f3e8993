//! redrive's embedded store: SQLite (WAL) behind one group-committing writer thread,
//! implementing the storage contract of `redrive-storage` ([`redrive_storage::Store`]) and
//! passing its conformance suite (`tests/conformance_sqlite.rs`). The state machine's
//! rules are the contract crate's ([`redrive_storage::rules`]); this crate reads rows,
//! calls them and writes what they changed (`transitions.rs`).
//!
//! Layout: `DATA_DIR/redrive.db` (+ `-wal`, `-shm`), and `DATA_DIR/redrive.lock`, the lock
//! that keeps a second store out of the directory (`dir_lock`). Recovery is SQLite's own
//! WAL replay on open. Reads run on a small pool of read-only connections via
//! `spawn_blocking`; WAL lets them proceed while the writer commits.
//!
//! Memory: SQLite's page cache is bounded ([`SqliteOptions::cache_mib`]);
//! scheduled messages live on disk, and the scheduler only ever asks for the
//! *earliest* due time (an index seek), so a million scheduled messages cost
//! disk, not RAM.

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod backup;
mod busy;
mod checkpoint;
mod dir_lock;
mod group_commit;
mod history;
mod hot;
mod idempotency;
mod key_order;
mod ops;
mod promotion;
mod reads;
mod row;
mod row_cache;
mod schema;
mod sessions;
mod sql_error;
mod transitions;

use group_commit::{Command, Job, Shared};
use redrive_core::{Message, MessageId, NewMessage, Timestamp};
use redrive_storage::cluster::LocalCluster;
use redrive_storage::{
    Ack, Acked, AuditRecord, Beat, ClusterView, CommitStats, FailureOutcome, Health, Heartbeat,
    LeaseRef, LeaseRequest, Leased, MessageFilter, MetricKind, Nack, NewAudit, NewSession,
    Notifier, Page, Published, PurgeOutcome, QueueStats, ReadyNotice, Release, Released, Returned,
    SessionLookup, SessionRecord, Store, StoreError, StoreMetric, StoreOptions, TaskRecord,
    TaskState, TaskStep, TaskStepOutcome, TaskTransition, TickOutcome,
};
use rusqlite::{Connection, OpenFlags};
use sql_error::SqlResultExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use transitions::{Counts, WriterState};

pub use backup::{BackupError, BackupReport};
pub use dir_lock::LOCK_FILE;
pub use group_commit::WalStats;

/// When a write counts as done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// Every commit fsyncs the WAL before any of its writers is answered
    /// (`PRAGMA synchronous = FULL`). A 2xx survives a crash of the process, the OS
    /// or the machine. The default.
    #[default]
    Fsync,
    /// Commits reach the OS but are not fsync'd (`synchronous = NORMAL`): they survive
    /// `kill -9` of redrive, but an OS crash or power loss can lose the last
    /// commits. Named so because it breaks SPEC §4's durable acknowledgement.
    UnsafeBuffered,
}

/// How to open a [`SqliteStore`].
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// Directory of the database (created if missing).
    pub data_dir: PathBuf,
    /// Commit durability.
    pub durability: Durability,
    /// What every backend is opened with: the queue catalog, the idempotency window, the
    /// generator's seed, the commit observer.
    pub store: StoreOptions,
    /// SQLite page cache of each reading connection, MiB.
    pub cache_mib: u32,
    /// SQLite page cache of the writing connections (the writer's and the checkpointer's),
    /// MiB: smaller than a reader's, because every commit in which a B-tree page split or
    /// merge reordered pages ends with a scan of the writer's whole page cache. (SQLite swaps
    /// such pages through a spare page number at 1 GiB, which leaves the cache's highest
    /// page number there, so the commit's truncation of the cache to the database's size
    /// walks every cached page: with 32 MiB of 1 KiB pages, 18 % of the writer's time at
    /// 64 consumers × 1. The writer's working set, the ends of the indexes, is small.)
    /// Measured in docs/PERFORMANCE.md: 8 MiB against 32 was +21 % at 8 × 10.
    pub writer_cache_mib: u32,
    /// Bound on the write-ahead log file, bytes (see `group_commit::bound_log`): when the
    /// log passes half of it, the writer rewinds it after its next commit. The file can
    /// exceed the bound only by what one commit writes.
    pub max_wal_bytes: u64,
}

impl SqliteOptions {
    /// Defaults for `data_dir`: fsync, default queue settings, 24 h idempotency window.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            durability: Durability::Fsync,
            store: StoreOptions::default(),
            cache_mib: 32,
            writer_cache_mib: 8,
            max_wal_bytes: DEFAULT_MAX_WAL_BYTES,
        }
    }
}

/// Default bound on the write-ahead log: 64 MiB. Rewinding it costs the writer one
/// checkpoint of what the background checkpointer has not copied yet (measured in
/// docs/ARCHITECTURE.md); a larger bound rewinds less often, a smaller one keeps less disk.
pub const DEFAULT_MAX_WAL_BYTES: u64 = 64 << 20;

/// Smallest accepted [`SqliteOptions::max_wal_bytes`]: 1 MiB (below that the writer would
/// rewind the log after almost every commit).
pub const MIN_MAX_WAL_BYTES: u64 = 1 << 20;

/// Page size of a new database (an existing one keeps its own); see `schema` for why 1 KiB.
const PAGE_SIZE: u32 = 1024;

/// Depth of the writer's job queue: bounded, so a flood of requests waits in
/// their handlers (back-pressure) rather than in an unbounded buffer.
const WRITER_QUEUE_DEPTH: usize = 8_192;

/// The embedded store. Cheap to share behind an `Arc`.
pub struct SqliteStore {
    jobs: mpsc::Sender<Command>,
    shared: Arc<Shared>,
    wake_rx: watch::Receiver<Option<Timestamp>>,
    /// [`Notifier::ready`]'s sender, never sent on (no other process shares the store).
    ready: broadcast::Sender<ReadyNotice>,
    counts: Arc<Mutex<Counts>>,
    /// The leases held in memory as readers see them (`hot.rs`).
    held: hot::Views,
    readers: Arc<reads::ReaderPool>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    checkpointer: Mutex<Option<checkpoint::Checkpointer>>,
    /// The data directory's lock: taken first thing in [`SqliteStore::open`], released by
    /// [`Store::close`] once the writer has finished (or when the store is dropped).
    dir_lock: Mutex<Option<dir_lock::DirLock>>,
    /// Membership and leadership: in memory, the one process of a data directory leads.
    cluster: LocalCluster,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

fn open_connection(
    path: &Path,
    opts: &SqliteOptions,
    write: bool,
) -> Result<Connection, StoreError> {
    let flags = if write {
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
    } else {
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
    };
    let conn = Connection::open_with_flags(path, flags).db()?;
    conn.busy_handler(Some(busy::wait_5s)).db()?;
    let sync = match opts.durability {
        Durability::Fsync => "FULL",
        Durability::UnsafeBuffered => "NORMAL",
    };
    conn.execute_batch(&format!(
        "PRAGMA page_size = {PAGE_SIZE}; PRAGMA journal_mode = WAL; PRAGMA synchronous = {sync}; PRAGMA cache_size = -{}; \
         PRAGMA temp_store = MEMORY; PRAGMA journal_size_limit = {};",
        u64::from(if write {
            opts.writer_cache_mib
        } else {
            opts.cache_mib
        }) * 1024,
        wal_restart_bytes(opts)
    ))
    .db()?;
    conn.set_prepared_statement_cache_capacity(64);
    reads::register_functions(&conn)?;
    if write {
        history::register(&conn)?;
    }
    Ok(conn)
}

/// The log size past which the writer rewinds the WAL: half the bound, so that the commits
/// written while a rewind waits for its turn stay under it. SQLite truncates the file back to
/// this size (`journal_size_limit`) on the first commit after a rewind.
fn wal_restart_bytes(opts: &SqliteOptions) -> u64 {
    opts.max_wal_bytes.max(MIN_MAX_WAL_BYTES) / 2
}

impl SqliteStore {
    /// Open (creating if needed) the store in `opts.data_dir`, recovering from any crash.
    ///
    /// Refused with [`StoreError::DataDirLocked`] while another store holds the directory
    /// (another process, or another open in this one), before the database is touched.
    pub fn open(opts: SqliteOptions) -> Result<Self, StoreError> {
        std::fs::create_dir_all(&opts.data_dir).map_err(|e| {
            StoreError::Backend(format!("cannot create {}: {e}", opts.data_dir.display()))
        })?;
        let dir_lock = dir_lock::DirLock::acquire(&opts.data_dir)?;
        let path = opts.data_dir.join("redrive.db");
        let conn = open_connection(&path, &opts, true)?;
        // Checkpoints run on their own thread (see `checkpoint`), not inside commits.
        conn.execute_batch("PRAGMA wal_autocheckpoint = 0").db()?;
        schema::migrate(&conn)?;
        key_order::reconcile(&conn, &opts.store.catalog)?;
        let counts = Arc::new(Mutex::new(reads::load_counts(&conn)?));
        let seed = opts.store.seed.unwrap_or_else(random_seed);
        let mut state = WriterState::new(
            conn,
            seed,
            opts.store.catalog.clone(),
            opts.store.idempotency_window_ms,
            counts.clone(),
        );
        let next_wake = state.next_wake()?.map(Timestamp::from_millis);
        let held = state.hot.views();
        let (tx, rx) = mpsc::channel(WRITER_QUEUE_DEPTH);
        let (wake_tx, wake_rx) = watch::channel(next_wake);
        let shared = Arc::new(Shared {
            poisoned: Mutex::new(None),
            stats: Mutex::new(CommitStats::default()),
            committed: std::sync::Condvar::new(),
            checkpointer_stop: std::sync::atomic::AtomicBool::new(false),
            wal: Mutex::new(WalStats::default()),
            observer: opts.store.commit_observer.clone(),
            wal_path: wal_path(&path),
            wal_restart_bytes: wal_restart_bytes(&opts),
            checkpoint_lock: Mutex::new(()),
            unsynced: AtomicU64::new(0),
            settled: watch::Sender::new(0),
        });
        let writer_shared = shared.clone();
        let writer = std::thread::Builder::new()
            .name("redrive-writer".into())
            .spawn(move || group_commit::run(state, rx, writer_shared, wake_tx))
            .map_err(|e| StoreError::Backend(format!("cannot start writer thread: {e}")))?;
        let checkpointer =
            checkpoint::Checkpointer::start(path.clone(), opts.clone(), shared.clone())
                .map_err(|e| StoreError::Backend(format!("cannot start checkpoint thread: {e}")))?;
        let readers = Arc::new(reads::ReaderPool::new(path, opts));
        Ok(Self {
            jobs: tx,
            shared,
            wake_rx,
            ready: broadcast::Sender::new(1),
            counts,
            held,
            readers,
            writer: Mutex::new(Some(writer)),
            checkpointer: Mutex::new(Some(checkpointer)),
            dir_lock: Mutex::new(Some(dir_lock)),
            cluster: LocalCluster::default(),
        })
    }

    /// Copy the store in `data_dir` into `out` (a new or empty directory) while a server may
    /// be running on it: a consistent snapshot, taken without the directory's lock (see
    /// `backup`). `redrive serve --data-dir OUT` starts on the copy.
    pub fn backup(data_dir: &Path, out: &Path) -> Result<BackupReport, BackupError> {
        backup::backup(data_dir, out)
    }

    /// Run `f` in the writer's next transaction and wait for its commit.
    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut WriterState) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.submit(f, true).await
    }

    /// Run `f` in the writer like [`Self::write`], but answer as soon as it has run, without
    /// waiting for its batch to commit: for a change that need not be durable before it is
    /// answered (a lease: SPEC §4 makes only publish, ack, nack and operator actions wait
    /// for the disk). Its changes still commit with the batch, in order with every other job,
    /// so a later ack of the same message sees them. If that commit fails, or the process
    /// dies before it, the change is lost: a lost lease leaves its message ready, to be
    /// delivered again with the same attempt number (docs/ARCHITECTURE.md).
    async fn write_unsynced<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut WriterState) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.submit(f, false).await
    }

    /// Queue `f` for the writer; answer after its commit (`synced`) or as soon as it ran.
    async fn submit<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut WriterState) -> Result<T, StoreError> + Send + 'static,
        synced: bool,
    ) -> Result<T, StoreError> {
        if let Some(reason) = self
            .shared
            .poisoned
            .lock()
            .map(|p| p.clone())
            .unwrap_or(None)
        {
            return Err(StoreError::Poisoned(reason));
        }
        let (tx, rx) = oneshot::channel();
        let shared = self.shared.clone();
        let job: Job = Box::new(move |w: &mut WriterState| {
            if w.refusing {
                // Answered with the refusal's error by `group_commit::refuse`.
                let reply: group_commit::Reply = Box::new(move |commit: Result<(), StoreError>| {
                    let _ = tx.send(commit.and(Err(StoreError::Closed)));
                });
                return (false, reply);
            }
            let r = f(w);
            let ok = r.is_ok();
            if !synced {
                // Before the answer: a read the caller makes after it waits for this batch.
                shared.unsynced.fetch_max(w.batch, Ordering::SeqCst);
                let _ = tx.send(r);
                return (ok, Box::new(|_| {}));
            }
            let reply: group_commit::Reply = Box::new(move |commit: Result<(), StoreError>| {
                let _ = tx.send(commit.and(r));
            });
            (ok, reply)
        });
        self.jobs
            .send(Command::Job(job))
            .await
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Wait until every answered unsynced write (a lease) has committed, so that a read
    /// sees what its caller was already told: read-your-writes, as if leases were synced.
    /// Waits at most one commit, and only while leases are being answered.
    async fn settle(&self) {
        let need = self.shared.unsynced.load(Ordering::SeqCst);
        if *self.shared.settled.borrow() >= need {
            return;
        }
        let mut settled = self.shared.settled.subscribe();
        // The writer gone (its sender dropped with it): nothing more will commit.
        let _ = settled.wait_for(|done| *done >= need).await;
    }

    /// [`Self::read`] with the leases held in memory as readers see them, taken before the
    /// rows are read (`reads::Held`).
    async fn read_held<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection, &reads::Held) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let views = self.held.clone();
        self.read(move |c| f(c, &reads::Held::of(&views))).await
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.settle().await;
        let pool = self.readers.clone();
        tokio::task::spawn_blocking(move || pool.with(f))
            .await
            .map_err(|e| StoreError::Backend(format!("reader task failed: {e}")))?
    }
}

/// The WAL file of the database at `db`.
fn wal_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}

/// A random number (the OS-seeded hasher of the standard library, and the clock): the
/// generator's seed when none is given, and the lease tokens' per-open epoch.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Timestamp::now().as_millis() as u128);
    h.finish()
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn publish(
        &self,
        items: Vec<NewMessage>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Published>, StoreError> {
        let now = now.unwrap_or_else(Timestamp::now);
        self.write(move |w| w.publish(items, now)).await
    }

    async fn lease(
        &self,
        req: LeaseRequest,
        now: Option<Timestamp>,
    ) -> Result<Vec<Leased>, StoreError> {
        let now = now.unwrap_or_else(Timestamp::now);
        let rows = self.write_unsynced(move |w| w.lease(&req, now)).await?;
        rows.into_iter()
            .map(transitions::LeasedRow::into_leased)
            .collect()
    }

    async fn ack(
        &self,
        items: Vec<Ack>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<Acked, StoreError>>, StoreError> {
        let now = now.unwrap_or_else(Timestamp::now);
        let rows: Vec<_> = self
            .write(move |w| Ok(items.iter().map(|l| w.ack(l, now)).collect()))
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| r.and_then(transitions::AckedRow::into_acked))
            .collect())
    }

    async fn nack(
        &self,
        items: Vec<Nack>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<FailureOutcome, StoreError>>, StoreError> {
        let now = now.unwrap_or_else(Timestamp::now);
        let rows: Vec<_> = self
            .write(move |w| Ok(items.iter().map(|n| w.nack(n, now)).collect()))
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| r.and_then(transitions::FailedRow::into_outcome))
            .collect())
    }

    async fn release(
        &self,
        items: Vec<Release>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<Released, StoreError>>, StoreError> {
        let now = now.unwrap_or_else(Timestamp::now);
        // Synced like a nack: a release lost in a crash would leave the lease to expire and
        // charge the attempt it was meant to take back.
        let rows: Vec<_> = self
            .write(move |w| Ok(items.iter().map(|r| w.release(r, now)).collect()))
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| r.and_then(transitions::ReleasedRow::into_released))
            .collect())
    }

    async fn returned(
        &self,
        items: Vec<Returned>,
        now: Option<Timestamp>,
    ) -> Result<Vec<Result<Option<FailureOutcome>, StoreError>>, StoreError> {
        let now = now.unwrap_or_else(Timestamp::now);
        let rows: Vec<_> = self
            .write(move |w| Ok(items.iter().map(|r| w.returned(r, now)).collect()))
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| r.and_then(|o| o.map(transitions::FailedRow::into_outcome).transpose()))
            .collect())
    }

    async fn extend(
        &self,
        lease: LeaseRef,
        by_ms: u64,
        now: Option<Timestamp>,
    ) -> Result<Timestamp, StoreError> {
        let now = now.unwrap_or_else(Timestamp::now);
        self.write(move |w| w.extend(&lease, by_ms, now)).await
    }

    async fn redrive_with(
        &self,
        id: MessageId,
        payload: Option<serde_json::Value>,
        now: Option<Timestamp>,
    ) -> Result<Message, StoreError> {
        let now = now.unwrap_or_else(Timestamp::now);
        self.write(move |w| w.redrive(&id, payload.as_ref(), None, now))
            .await
    }

    async fn kill(
        &self,
        id: MessageId,
        reason: Option<String>,
        now: Option<Timestamp>,
    ) -> Result<Message, StoreError> {
        let now = now.unwrap_or_else(Timestamp::now);
        self.write(move |w| w.kill(&id, reason, now)).await
    }

    async fn delete(&self, id: MessageId) -> Result<Message, StoreError> {
        self.write(move |w| w.delete(&id)).await
    }

    async fn idempotency_keys(
        &self,
        queue: String,
        prefix: String,
        limit: u32,
        now: Option<Timestamp>,
    ) -> Result<Vec<(String, MessageId)>, StoreError> {
        let now = now.unwrap_or_else(Timestamp::now);
        self.read(move |c| reads::idempotency_keys(c, &queue, &prefix, limit, now))
            .await
    }

    async fn forget_idempotency_keys(
        &self,
        queue: String,
        keys: Vec<String>,
    ) -> Result<u64, StoreError> {
        if keys.is_empty() {
            return Ok(0);
        }
        self.write(move |w| w.forget_idempotency_keys(&queue, &keys))
            .await
    }

    async fn tick(&self, now: Option<Timestamp>) -> Result<TickOutcome, StoreError> {
        let now = now.unwrap_or_else(Timestamp::now);
        // Unsynced, like a lease: a promotion or an expired lease is nobody's acknowledged
        // write (a crash before its commit leaves the message scheduled with a past due time,
        // or leased with an expired lease, and the first tick after the restart does it
        // again), and the consumers it wakes must not wait for the disk to lease.
        self.write_unsynced(move |w| w.tick(now)).await
    }

    async fn purge(
        &self,
        now: Option<Timestamp>,
        done_retention_ms: u64,
    ) -> Result<PurgeOutcome, StoreError> {
        let now = now.unwrap_or_else(Timestamp::now);
        self.write(move |w| w.purge(now, done_retention_ms)).await
    }

    async fn get(&self, id: MessageId) -> Result<Option<Message>, StoreError> {
        let views = self.held.clone();
        self.read(move |c| reads::get(c, &id, &reads::Held::one(&views, &id.to_string())))
            .await
    }

    async fn search(
        &self,
        filter: MessageFilter,
        limit: u32,
        cursor: Option<String>,
    ) -> Result<Page, StoreError> {
        self.read_held(move |c, held| reads::search(c, &filter, limit, cursor.as_deref(), held))
            .await
    }

    async fn count(&self, filter: MessageFilter) -> Result<u64, StoreError> {
        self.read_held(move |c, held| reads::count(c, &filter, held))
            .await
    }

    async fn task_create(&self, task: TaskRecord, audit: NewAudit) -> Result<(), StoreError> {
        self.write(move |w| w.task_create(&task, &audit)).await
    }

    async fn task_transition(
        &self,
        t: TaskTransition,
        now: Option<Timestamp>,
    ) -> Result<TaskRecord, StoreError> {
        let now = now.unwrap_or_else(Timestamp::now);
        self.write(move |w| w.task_transition(&t, now)).await
    }

    async fn task_step(
        &self,
        step: TaskStep,
        now: Option<Timestamp>,
    ) -> Result<TaskStepOutcome, StoreError> {
        let now = now.unwrap_or_else(Timestamp::now);
        // One process: its leadership changes only by its own beats, so a check before the
        // write is as good as one inside it.
        if let Some(f) = step.fence.as_ref().filter(|f| !self.cluster.holds(f, now)) {
            return Err(StoreError::Fenced { epoch: f.epoch });
        }
        self.write(move |w| w.task_step(&step, now)).await
    }

    async fn task(&self, id: String) -> Result<Option<TaskRecord>, StoreError> {
        self.read(move |c| ops::task(c, &id)).await
    }

    async fn tasks(
        &self,
        state: Option<TaskState>,
        limit: u32,
    ) -> Result<Vec<TaskRecord>, StoreError> {
        self.read(move |c| ops::tasks(c, state, limit)).await
    }

    async fn audit(&self, entry: NewAudit, now: Option<Timestamp>) -> Result<u64, StoreError> {
        let now = now.unwrap_or_else(Timestamp::now);
        self.write(move |w| w.audit_insert(&entry, now)).await
    }

    async fn audit_list(
        &self,
        before: Option<u64>,
        limit: u32,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        self.read(move |c| ops::audit_list(c, before, limit)).await
    }

    async fn session_create(
        &self,
        s: NewSession,
        now: Option<Timestamp>,
    ) -> Result<SessionRecord, StoreError> {
        let now = now.unwrap_or_else(Timestamp::now);
        self.write(move |w| w.session_create(&s, now)).await
    }

    async fn session_get(
        &self,
        q: SessionLookup,
        now: Option<Timestamp>,
    ) -> Result<Option<SessionRecord>, StoreError> {
        let now = now.unwrap_or_else(Timestamp::now);
        let id = q.id.clone();
        let Some(mut found) = self.read(move |c| sessions::session(c, &id)).await? else {
            return Ok(None);
        };
        if found.expired(now, q.idle_ms) {
            return Ok(None);
        }
        if found.due_for_touch(now, q.touch_after_ms) {
            let id = q.id;
            if !self.write(move |w| w.session_touch(&id, now)).await? {
                return Ok(None); // ended meanwhile
            }
            found.last_seen = found.last_seen.max(now);
        }
        Ok(Some(found))
    }

    async fn session_delete(&self, id: String) -> Result<bool, StoreError> {
        self.write(move |w| w.session_delete(&id)).await
    }

    async fn shared_secret(&self, name: String, candidate: String) -> Result<String, StoreError> {
        self.write(move |w| w.shared_secret(&name, &candidate))
            .await
    }

    async fn queue_stats(&self) -> Result<Vec<QueueStats>, StoreError> {
        self.settle().await;
        let counts: Vec<(String, [i64; 5])> = self
            .counts
            .lock()
            .map(|c| c.iter().map(|(k, v)| (k.clone(), *v)).collect())
            .unwrap_or_default();
        self.read_held(move |c, held| reads::queue_stats(c, counts, held))
            .await
    }

    async fn heartbeat(&self, beat: Heartbeat, now: Option<Timestamp>) -> Result<Beat, StoreError> {
        Ok(self
            .cluster
            .heartbeat(&beat, now.unwrap_or_else(Timestamp::now)))
    }

    async fn leave(&self, incarnation: String, now: Option<Timestamp>) -> Result<(), StoreError> {
        self.cluster
            .leave(&incarnation, now.unwrap_or_else(Timestamp::now));
        Ok(())
    }

    async fn cluster(&self, now: Option<Timestamp>) -> Result<ClusterView, StoreError> {
        Ok(self.cluster.view(now.unwrap_or_else(Timestamp::now)))
    }

    /// In memory, not durable: this store is one process's, so its trips are that
    /// process's own (its breaker already holds them); a restart forgets them.
    async fn endpoint_trip(
        &self,
        endpoint: String,
        incarnation: String,
        open_ms: u64,
        now: Option<Timestamp>,
    ) -> Result<(), StoreError> {
        self.cluster.endpoint_trip(
            &endpoint,
            &incarnation,
            open_ms,
            now.unwrap_or_else(Timestamp::now),
        );
        Ok(())
    }

    async fn endpoint_trips(
        &self,
        now: Option<Timestamp>,
    ) -> Result<redrive_storage::EndpointTrips, StoreError> {
        Ok(self
            .cluster
            .endpoint_trips(now.unwrap_or_else(Timestamp::now)))
    }

    fn notifier(&self) -> Notifier {
        // No other process shares the directory (its lock): nothing is ever sent on `ready`.
        Notifier::new(self.wake_rx.clone(), self.ready.clone())
    }

    fn health(&self) -> Health {
        match self.failed() {
            Some(reason) => Health::Failed(reason),
            None => Health::Ok,
        }
    }

    fn metrics(&self) -> Vec<StoreMetric> {
        let wal = self.wal_stats();
        vec![
            StoreMetric {
                name: "redrive_wal_bytes",
                help: "Size of the store's write-ahead log file on disk (bounded by max_wal_bytes)",
                kind: MetricKind::Gauge,
                value: wal.bytes as f64,
            },
            StoreMetric {
                name: "redrive_wal_rewinds",
                help: "Times the writer rewound the WAL to keep it under max_wal_bytes (since start)",
                kind: MetricKind::Gauge,
                value: wal.rewinds as f64,
            },
            StoreMetric {
                name: "redrive_wal_rewind_seconds",
                help: "Seconds the writer spent rewinding the WAL (since start): the latency cost of the bound",
                kind: MetricKind::Gauge,
                value: wal.rewind_seconds,
            },
        ]
    }
    async fn close(&self) {
        let (tx, rx) = oneshot::channel();
        if self.jobs.send(Command::Close(tx)).await.is_ok() {
            let _ = rx.await;
        }
        let checkpointer = self.checkpointer.lock().ok().and_then(|mut c| c.take());
        if let Some(mut c) = checkpointer {
            let _ = tokio::task::spawn_blocking(move || c.stop()).await;
        }
        let handle = self.writer.lock().ok().and_then(|mut w| w.take());
        if let Some(h) = handle {
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
        // Nothing writes any more: the directory is free for the next store.
        drop(self.dir_lock.lock().ok().and_then(|mut l| l.take()));
    }

    fn commit_stats(&self) -> CommitStats {
        self.shared.stats.lock().map(|s| *s).unwrap_or_default()
    }
}

impl SqliteStore {
    /// The write-ahead log's figures now.
    pub fn wal_stats(&self) -> WalStats {
        self.shared.wal.lock().map(|s| *s).unwrap_or_default()
    }

    /// Why the store takes no more writes: a failed write poisoned it, or its writer
    /// stopped (closed, or died).
    fn failed(&self) -> Option<String> {
        let poisoned = self
            .shared
            .poisoned
            .lock()
            .map(|p| p.clone())
            .unwrap_or(None);
        poisoned.or_else(|| {
            // The writer thread is gone (closed, or died): no write can succeed any more.
            self.jobs
                .is_closed()
                .then(|| "the store's writer has stopped".to_owned())
        })
    }
}
