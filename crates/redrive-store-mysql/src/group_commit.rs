//! Group commit: concurrent publish, ack and nack calls share one transaction and one
//! commit, as in the PostgreSQL store.
//!
//! A store with group commit runs one batcher task. Each of those calls becomes a [`Job`]
//! sent to it; the batcher takes every job queued (at most [`MAX_BATCH_JOBS`]), runs them in
//! one transaction, commits once, and only then answers each job, so an answer still means
//! committed. There is no artificial wait: jobs that arrive while a batch commits form the
//! next batch, so a lone call costs one commit as before and `n` concurrent calls about one.
//!
//! Before any job runs, the batch locks what all its jobs will change in the one order
//! every writer follows (`transitions::lock_rows`, `key_order::lock_keys`: ordered keys
//! sorted, then message rows by `seq`), so that putting calls together adds no lock-order
//! deadlock. Each job then runs in a savepoint of its own: a job refused as a whole (an
//! idempotency conflict) is rolled back to its savepoint and answered with its error, and
//! the batch goes on. Anything else (a deadlock, which InnoDB answers by rolling back the
//! whole transaction; a lock wait timeout; a failed statement; a lost connection) rolls the
//! batch back, and its jobs run again one by one, each as a transaction of its own with the
//! store's usual retries, so one job's trouble is still its own. If the commit fails, every
//! job of the batch fails with it (a connection lost during a commit is `Unavailable`: its
//! outcome is unknown, as for any single commit).
//!
//! Jobs of one kind (publishes, acks or nacks, with one `now`) are merged into one call, as
//! in the PostgreSQL store; a merged call refused as a whole runs its jobs one by one. Acks
//! and nacks are set-based within a call (`transitions::ack_many`, `nack_many`, as the
//! PostgreSQL store's; the rules of each item are `redrive_storage::settle`'s): a job of 100
//! acks reads its rows in one statement and writes them in one, with its history in two,
//! instead of about seven statements per item. A publish inserts its new messages that take
//! no part in a key's order with one multi-row insert (`transitions::insert_rows`).

use crate::error::E;
use crate::sql::resolve_now;
use crate::{key_order, transitions, Ctx, Inner, MAX_RETRIES};
use mysql_async::prelude::Queryable;
use redrive_core::MessageId;
use redrive_storage::{batch, StoreError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};

/// At most this many jobs share one transaction.
pub const MAX_BATCH_JOBS: usize = 64;

/// Depth of the batcher's queue: bounded, so a flood waits in its callers (back-pressure).
const QUEUE_DEPTH: usize = 4_096;

pub use redrive_storage::batch::{Done, Work};

/// Run `work` in `tx` (the same code with or without group commit): lock what it changes,
/// then run it.
pub async fn run_work(
    inner: &Inner,
    tx: &mut mysql_async::Transaction<'_>,
    cx: &mut Ctx,
    work: &Work,
) -> Result<Done, E> {
    lock_work(inner, tx, &[work]).await?;
    run_locked(inner, tx, cx, work).await
}

/// Run `work` in `tx`, whose locks [`lock_work`] took.
async fn run_locked(
    inner: &Inner,
    tx: &mut mysql_async::Transaction<'_>,
    cx: &mut Ctx,
    work: &Work,
) -> Result<Done, E> {
    Ok(match work {
        Work::Publish(items, now) => {
            let now = resolve_now(tx, *now).await?;
            Done::Publish(transitions::publish(inner, tx, cx, items, now).await?)
        }
        Work::Ack(items, now) => {
            let now = resolve_now(tx, *now).await?;
            Done::Ack(transitions::ack_many(inner, &mut *tx, cx, items, now).await?)
        }
        Work::Nack(items, now) => {
            let now = resolve_now(tx, *now).await?;
            Done::Nack(transitions::nack_many(inner, &mut *tx, cx, items, now).await?)
        }
    })
}

/// Lock what `works` will change, in the one order every writer follows: the ordered keys
/// of all of them (sorted), then the message rows of the acks and nacks (by `seq`).
async fn lock_work(
    inner: &Inner,
    tx: &mut mysql_async::Transaction<'_>,
    works: &[&Work],
) -> Result<(), E> {
    let mut keys = Vec::new();
    let mut ids: Vec<MessageId> = Vec::new();
    for w in works {
        match w {
            Work::Publish(items, _) => {
                keys.extend(items.iter().map(|i| (i.queue.clone(), i.key.clone())));
            }
            Work::Ack(items, _) => ids.extend(items.iter().map(|a| a.lease.id)),
            Work::Nack(items, _) => ids.extend(items.iter().map(|n| n.lease.id)),
        }
    }
    keys.extend(transitions::keys_of(tx, &ids).await?);
    key_order::lock_keys(inner, tx, keys).await?;
    transitions::lock_rows(inner, tx, &ids).await
}

/// A call waiting for its batch.
struct Job {
    work: Work,
    reply: oneshot::Sender<Result<Done, StoreError>>,
}

/// The batcher: its queue and its task.
pub struct Batcher {
    queue: std::sync::Mutex<Option<mpsc::Sender<Job>>>,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    stopped: Arc<AtomicBool>,
}

impl Batcher {
    /// Start the batcher task over `inner`.
    pub fn start(inner: Arc<Inner>) -> Self {
        let (queue, rx) = mpsc::channel(QUEUE_DEPTH);
        let stopped = Arc::new(AtomicBool::new(false));
        let flag = stopped.clone();
        let task = tokio::spawn(async move {
            run(inner, rx).await;
            flag.store(true, Ordering::SeqCst);
        });
        Self {
            queue: std::sync::Mutex::new(Some(queue)),
            task: std::sync::Mutex::new(Some(task)),
            stopped,
        }
    }

    /// Run `work` in the next batch; its answer once that batch committed.
    pub async fn submit(&self, work: Work) -> Result<Done, StoreError> {
        let queue = self
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or(StoreError::Closed)?;
        let (reply, answer) = oneshot::channel();
        queue
            .send(Job { work, reply })
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Whether the batcher task has stopped while the store is open (it never should).
    pub fn stopped(&self) -> bool {
        let open = self.queue.lock().map(|q| q.is_some()).unwrap_or(false);
        open && self.stopped.load(Ordering::SeqCst)
    }

    /// Stop taking jobs and wait (at most 10 s) for the jobs queued to be run.
    pub async fn close(&self) {
        drop(self.queue.lock().unwrap_or_else(|p| p.into_inner()).take());
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let abort = task.abort_handle();
            if tokio::time::timeout(std::time::Duration::from_secs(10), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().unwrap_or_else(|p| p.into_inner()).take() {
            t.abort();
        }
    }
}

/// The batcher's loop: take what is queued, run it as one transaction, answer.
async fn run(inner: Arc<Inner>, mut rx: mpsc::Receiver<Job>) {
    while let Some(first) = rx.recv().await {
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH_JOBS {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        if jobs.len() == 1 {
            let Some(job) = jobs.pop() else { continue };
            let answer = run_alone(&inner, &job.work).await;
            let _ = job.reply.send(answer);
            continue;
        }
        match run_batch(&inner, &jobs).await {
            Ok(answers) => {
                for (job, answer) in jobs.into_iter().zip(answers) {
                    let _ = job.reply.send(answer);
                }
            }
            Err(Fallback::OneByOne(why)) => {
                tracing::debug!(%why, jobs = jobs.len(), "MySQL batch rolled back; its jobs run one by one");
                for job in jobs {
                    let answer = run_alone(&inner, &job.work).await;
                    let _ = job.reply.send(answer);
                }
            }
            Err(Fallback::Failed(e)) => {
                for job in jobs {
                    let _ = job.reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// Why a batch did not answer its jobs.
enum Fallback {
    /// Rolled back before its commit: run the jobs one by one.
    OneByOne(String),
    /// Its commit failed: every job fails with it.
    Failed(StoreError),
}

/// The items of `works` (of one kind, one `now`: [`Work::merges_with`]) as one work: the
/// jobs of a batch are borrowed, so their items are cloned.
fn merged(works: &[&Work]) -> Work {
    macro_rules! all {
        ($kind:ident, $now:expr) => {
            Work::$kind(
                works
                    .iter()
                    .flat_map(|w| match w {
                        Work::$kind(v, _) => v.clone(),
                        _ => Vec::new(),
                    })
                    .collect(),
                $now,
            )
        };
    }
    match works[0] {
        Work::Publish(_, now) => all!(Publish, *now),
        Work::Ack(_, now) => all!(Ack, *now),
        Work::Nack(_, now) => all!(Nack, *now),
    }
}

/// Run `jobs` in one transaction; one answer per job. Jobs of one kind are merged into one
/// call in a savepoint ([`merged`]: 8 acks of 10 cost the statements of one ack of 80);
/// if that call is refused as a whole (an idempotency conflict of one publish), it is rolled
/// back to its savepoint and its jobs run one by one, a savepoint each, so that one job's
/// refusal is still its own.
async fn run_batch(inner: &Inner, jobs: &[Job]) -> Result<Vec<Result<Done, StoreError>>, Fallback> {
    let again = |e: E| Fallback::OneByOne(format!("{e:?}"));
    let mut conn = inner.conn().await.map_err(again)?;
    let mut tx = conn
        .start_transaction(mysql_async::TxOpts::default())
        .await
        .map_err(|e| again(E::from(e)))?;
    let works: Vec<&Work> = jobs.iter().map(|j| &j.work).collect();
    let r: Result<(Vec<Result<Done, StoreError>>, Ctx), E> = async {
        lock_work(inner, &mut tx, &works).await?;
        let mut answers: Vec<Option<Result<Done, StoreError>>> =
            (0..jobs.len()).map(|_| None).collect();
        let mut ctx = Ctx::default();
        for group in batch::groups(&works) {
            tx.query_drop("SAVEPOINT job").await?;
            if group.len() > 1 {
                let parts: Vec<&Work> = group.iter().map(|&i| works[i]).collect();
                let lens: Vec<usize> = parts.iter().map(|w| w.len()).collect();
                let mut job_ctx = Ctx::default();
                match run_locked(inner, &mut tx, &mut job_ctx, &merged(&parts)).await {
                    Ok(done) => {
                        let Some(each) = done.split(&lens) else {
                            return Err(E::Db(StoreError::Backend(
                                "a merged call answered a different number of items".into(),
                            )));
                        };
                        tx.query_drop("RELEASE SAVEPOINT job").await?;
                        ctx.absorb(job_ctx);
                        for (&i, d) in group.iter().zip(each) {
                            answers[i] = Some(Ok(d));
                        }
                        continue;
                    }
                    Err(E::Logic(_)) => {
                        tx.query_drop("ROLLBACK TO SAVEPOINT job").await?;
                    }
                    Err(e) => return Err(e),
                }
            }
            for (n, &i) in group.iter().enumerate() {
                if n > 0 || group.len() > 1 {
                    tx.query_drop("SAVEPOINT job").await?;
                }
                let mut job_ctx = Ctx::default();
                match run_locked(inner, &mut tx, &mut job_ctx, works[i]).await {
                    Ok(done) => {
                        tx.query_drop("RELEASE SAVEPOINT job").await?;
                        ctx.absorb(job_ctx);
                        answers[i] = Some(Ok(done));
                    }
                    Err(E::Logic(e)) => {
                        tx.query_drop("ROLLBACK TO SAVEPOINT job").await?;
                        answers[i] = Some(Err(e));
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        let answers = answers
            .into_iter()
            .map(|a| {
                a.unwrap_or(Err(StoreError::Backend(
                    "a job of a batch did not run".into(),
                )))
            })
            .collect();
        Ok((answers, ctx))
    }
    .await;
    let (answers, ctx) = match r {
        Ok(v) => v,
        Err(e) => {
            let _ = tx.rollback().await;
            if let E::Retry(kind, _) = &e {
                // Its jobs run again (one by one): a retry like any other.
                inner.count_conflict(*kind);
            }
            return Err(again(e));
        }
    };
    let started = Instant::now();
    if let Err(e) = tx.commit().await {
        return Err(Fallback::Failed(E::from(e).into_store()));
    }
    inner.committed(ctx, started.elapsed());
    Ok(answers)
}

/// Run one job as a transaction of its own, with the store's retries: a deadlock or lock
/// wait timeout runs it again after a pause, so does a connection found dead before the
/// commit was sent.
pub async fn run_alone(inner: &Inner, work: &Work) -> Result<Done, StoreError> {
    let mut tries = 0u32;
    loop {
        let r: Result<(Done, Ctx, std::time::Duration), (E, bool)> = async {
            let mut conn = inner.conn().await.map_err(|e| (e, false))?;
            let mut tx = conn
                .start_transaction(mysql_async::TxOpts::default())
                .await
                .map_err(|e| (E::from(e), false))?;
            let mut ctx = Ctx::default();
            match run_work(inner, &mut tx, &mut ctx, work).await {
                Ok(done) => {
                    let started = Instant::now();
                    tx.commit().await.map_err(|e| (E::from(e), true))?;
                    Ok((done, ctx, started.elapsed()))
                }
                Err(e) => {
                    let _ = tx.rollback().await;
                    Err((e, false))
                }
            }
        }
        .await;
        match r {
            Ok((done, ctx, took)) => {
                inner.committed(ctx, took);
                return Ok(done);
            }
            Err((E::Retry(kind, why), _)) if tries < MAX_RETRIES => {
                tries += 1;
                tracing::debug!(?kind, %why, tries, "MySQL transaction conflicted; again");
                inner.before_retry(kind, tries).await;
            }
            Err((e, false)) if e.lost_connection() && tries < MAX_RETRIES => tries += 1,
            Err((e, _)) => {
                if matches!(e, E::Retry(..)) {
                    inner.gave_up();
                }
                return Err(e.into_store());
            }
        }
    }
}
