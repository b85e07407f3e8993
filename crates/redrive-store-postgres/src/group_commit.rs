//! Group commit: concurrent publish, ack and nack calls share one transaction and one
//! commit.
//!
//! A store with group commit runs one batcher task. Each of those calls becomes a [`Job`]
//! sent to it; the batcher takes every job queued (at most [`MAX_BATCH_JOBS`]), runs them
//! in one transaction, commits once, and only then answers each job, so a 2xx still means
//! committed. There is no artificial wait: jobs that arrive while a batch commits form the
//! next batch (the SQLite writer's shape), so a lone call costs one commit as before, and
//! `n` concurrent calls cost about one.
//!
//! Jobs of one kind (publishes, acks or nacks, with the same `now`) are merged: their items
//! run as one set-based call inside one savepoint, so 100 single acks (each push call
//! settles alone) cost the statements of one ack of 100 and not 500 round trips in a row,
//! which on a loaded node made a settle wait longer than its lease. If the merged call
//! fails, it is rolled back to its savepoint and its jobs run one by one, each in a
//! savepoint of its own, so one job's error is still its own.
//!
//! A job that fails is rolled back to its savepoint and answered with its error, and the
//! batch goes on; a job that conflicts (deadlock, serialization failure, a racing
//! idempotency key) is rolled back and queued again for the next batch, at most
//! `MAX_RETRIES` times, and so is every job of a batch whose connection was lost before
//! its commit was sent (nothing of it committed). If the commit fails, every job of the batch fails with it (the
//! connection lost during a commit is `Unavailable`: its outcome is unknown, as for any
//! single commit). Locks taken by a batch are held until its commit, for a few
//! milliseconds longer than a lone call's.

use crate::error::E;
use crate::sql::resolve_now;
use crate::{transitions, Ctx, Inner, MAX_RETRIES};
use deadpool_postgres::Transaction;
use redrive_storage::{batch, StoreError};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};

/// At most this many jobs share one transaction.
pub const MAX_BATCH_JOBS: usize = 128;

/// Depth of the batcher's queue: bounded, so a flood waits in its callers (back-pressure).
const QUEUE_DEPTH: usize = 4_096;

pub use redrive_storage::batch::{Done, Work};

/// Run `work` in `tx` (the same code with or without group commit).
pub async fn run_work(
    inner: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    work: &Work,
) -> Result<Done, E> {
    Ok(match work {
        Work::Publish(items, now) => {
            Done::Publish(transitions::publish(inner, tx, cx, items, *now).await?)
        }
        Work::Ack(items, now) => {
            let now = resolve_now(tx, *now).await?;
            Done::Ack(transitions::ack_many(inner, tx, cx, items, now).await?)
        }
        Work::Nack(items, now) => {
            let now = resolve_now(tx, *now).await?;
            Done::Nack(transitions::nack_many(inner, tx, cx, items, now).await?)
        }
    })
}

/// Run the work of `jobs` (two or more, of one kind) as one call; one answer per job. The
/// jobs get their items back whatever the outcome (a job may run again).
async fn run_merged(
    inner: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    jobs: &mut [Job],
) -> Result<Vec<Done>, E> {
    let lens: Vec<usize> = jobs.iter().map(|j| j.work.len()).collect();
    let (first, rest) = jobs.split_first_mut().expect("two or more jobs");
    let mut all = first.work.split_off_last(first.work.len());
    for j in rest.iter_mut() {
        all.append(&mut j.work);
    }
    let r = run_work(inner, tx, cx, &all).await;
    // Hand the items back, last job first.
    for (j, &n) in jobs.iter_mut().zip(&lens).rev() {
        j.work = all.split_off_last(n);
    }
    r?.split(&lens).ok_or_else(|| {
        E::Logic(StoreError::Backend(
            "a merged call answered a different number of items".into(),
        ))
    })
}

/// The jobs of a batch in groups that may run as one call ([`batch::groups`]).
fn groups(batch: Vec<Job>) -> Vec<Vec<Job>> {
    let works: Vec<&Work> = batch.iter().map(|j| &j.work).collect();
    let groups = batch::groups(&works);
    let mut jobs: Vec<Option<Job>> = batch.into_iter().map(Some).collect();
    groups
        .into_iter()
        .map(|g| g.into_iter().filter_map(|i| jobs[i].take()).collect())
        .collect()
}

/// A call waiting for its batch's commit.
#[derive(Debug)]
pub struct Job {
    work: Work,
    reply: oneshot::Sender<Result<Done, StoreError>>,
    tries: u32,
}

enum Command {
    Job(Job),
    /// Finish the queued jobs, then stop.
    Close(oneshot::Sender<()>),
}

/// The handle of a store's batcher task.
pub struct Batcher {
    tx: mpsc::Sender<Command>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Batcher {
    /// Start the batcher of `inner` on the current runtime.
    pub fn start(inner: Arc<Inner>) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        let task = tokio::spawn(run(inner, rx));
        Self {
            tx,
            task: Mutex::new(Some(task)),
        }
    }

    /// Run `work` in the next batch; its answer after the batch committed.
    pub async fn submit(&self, work: Work) -> Result<Done, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Job(Job {
                work,
                reply,
                tries: 0,
            }))
            .await
            .map_err(|_| StoreError::Closed)?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// Whether the batcher task is gone.
    pub fn stopped(&self) -> bool {
        self.tx.is_closed()
    }

    /// Answer the queued jobs, then stop the task.
    pub async fn close(&self) {
        let (done, wait) = oneshot::channel();
        if self.tx.send(Command::Close(done)).await.is_ok() {
            let _ = wait.await;
        }
        let task = self.task.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = task {
            let _ = t.await;
        }
    }
}

/// Batches one node runs at once. One at a time, a node on a quiet database waits on each
/// commit's round trip and fsync with both cores mostly idle (8 consumers × 10: about a third
/// of the machine busy); a second batch in flight takes the jobs that arrived meanwhile.
const BATCHES_IN_FLIGHT: usize = 2;

async fn run(inner: Arc<Inner>, mut rx: mpsc::Receiver<Command>) {
    let mut pending: VecDeque<Job> = VecDeque::new();
    let mut closing: Option<oneshot::Sender<()>> = None;
    let mut running: tokio::task::JoinSet<Vec<Job>> = tokio::task::JoinSet::new();
    let mut open = true;
    loop {
        // Conflicted jobs of a finished batch go first in the next one.
        while let Some(r) = running.try_join_next() {
            for j in r.unwrap_or_default().into_iter().rev() {
                pending.push_front(j);
            }
        }
        if pending.is_empty() || running.len() >= BATCHES_IN_FLIGHT {
            if pending.is_empty() && running.is_empty() && (closing.is_some() || !open) {
                if let Some(done) = closing.take() {
                    let _ = done.send(());
                }
                return;
            }
            tokio::select! {
                cmd = rx.recv(), if open && closing.is_none() && running.len() < BATCHES_IN_FLIGHT => match cmd {
                    Some(Command::Job(j)) => pending.push_back(j),
                    Some(Command::Close(done)) => closing = Some(done),
                    None => open = false,
                },
                Some(r) = running.join_next(), if !running.is_empty() => {
                    for j in r.unwrap_or_default().into_iter().rev() {
                        pending.push_front(j);
                    }
                }
            }
            continue;
        }
        while open && closing.is_none() && pending.len() < MAX_BATCH_JOBS {
            match rx.try_recv() {
                Ok(Command::Job(j)) => pending.push_back(j),
                Ok(Command::Close(done)) => closing = Some(done),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => open = false,
            }
        }
        let n = pending.len().min(MAX_BATCH_JOBS);
        let batch: Vec<Job> = pending.drain(..n).collect();
        let inner = inner.clone();
        running.spawn(async move { run_batch(&inner, batch).await });
    }
}

/// Answer `job` with `e` (or hand it back to run again, when it conflicted, or lost its
/// connection before the commit, and may).
fn fail(job: Job, e: E, again: &mut Vec<Job>) {
    match e {
        E::Retry(_) | E::Db(StoreError::Unavailable(_)) if job.tries < MAX_RETRIES => {
            tracing::debug!(
                ?e,
                tries = job.tries,
                "a batched call failed before its commit; again"
            );
            again.push(Job {
                tries: job.tries + 1,
                ..job
            });
        }
        e => {
            let _ = job.reply.send(Err(e.into_store()));
        }
    }
}

/// Open the savepoint `job` for the next piece of a batch (releasing the last one in the
/// same round trip).
async fn savepoint(tx: &Transaction<'_>, open: &mut bool) -> Result<(), E> {
    if *open {
        tx.batch_execute("RELEASE SAVEPOINT job; SAVEPOINT job")
            .await?;
    } else {
        tx.batch_execute("SAVEPOINT job").await?;
        *open = true;
    }
    Ok(())
}

/// Run one batch in one transaction; the jobs to run again.
async fn run_batch(inner: &Inner, batch: Vec<Job>) -> Vec<Job> {
    let mut again = Vec::new();
    let mut client = match inner.pool.get().await {
        Ok(c) => c,
        Err(e) => {
            let e = crate::error::pool_error(&e);
            for job in batch {
                let _ = job.reply.send(Err(e.clone()));
            }
            return again;
        }
    };
    let tx = match client.transaction().await {
        Ok(tx) => tx,
        Err(e) => {
            let e = crate::error::store_error(&e);
            for job in batch {
                fail(job, E::Db(e.clone()), &mut again);
            }
            return again;
        }
    };
    let alone = batch.len() == 1;
    let mut ctx = Ctx::default();
    let mut done: Vec<(Job, Done)> = Vec::with_capacity(batch.len());
    let mut broken: Option<StoreError> = None;
    // Whether the savepoint `job` is open: the next job releases it and opens its own in
    // one round trip, and the commit releases the last.
    let mut open = false;
    let mut singles: Vec<Job> = Vec::new();
    for mut group in groups(batch) {
        if group.len() > 1 && broken.is_none() {
            let mut jcx = Ctx::default();
            let r = async {
                savepoint(&tx, &mut open).await?;
                run_merged(inner, &tx, &mut jcx, &mut group).await
            }
            .await;
            match r {
                Ok(answers) => {
                    ctx.absorb(jcx);
                    done.extend(group.into_iter().zip(answers));
                    continue;
                }
                Err(e) => {
                    tracing::debug!(
                        ?e,
                        jobs = group.len(),
                        "a merged call failed; its jobs one by one"
                    );
                    if let Err(rb) = tx.batch_execute("ROLLBACK TO SAVEPOINT job").await {
                        broken = Some(crate::error::store_error(&rb));
                    }
                }
            }
        }
        singles.extend(group);
    }
    for job in singles {
        if let Some(e) = &broken {
            fail(job, E::Db(e.clone()), &mut again);
            continue;
        }
        let mut jcx = Ctx::default();
        let r = async {
            if !alone {
                savepoint(&tx, &mut open).await?;
            }
            run_work(inner, &tx, &mut jcx, &job.work).await
        }
        .await;
        match r {
            Ok(d) => {
                ctx.absorb(jcx);
                done.push((job, d));
            }
            Err(e) if alone => {
                drop(tx);
                fail(job, e, &mut again);
                return again;
            }
            Err(e) => {
                if let Err(rb) = tx.batch_execute("ROLLBACK TO SAVEPOINT job").await {
                    // The connection is gone: nothing of this transaction will commit.
                    let rb = crate::error::store_error(&rb);
                    broken = Some(rb.clone());
                    fail(job, E::Db(rb), &mut again);
                    continue;
                }
                fail(job, e, &mut again);
            }
        }
    }
    if let Some(e) = broken {
        // Nothing of this transaction committed: the jobs that had run go again too.
        for (job, _) in done {
            fail(job, E::Db(e.clone()), &mut again);
        }
        return again;
    }
    if done.is_empty() {
        drop(tx);
        return again;
    }
    if let Err(e) =
        crate::notify::send(&tx, inner.channel.as_deref(), inner.epoch, &ctx.ready).await
    {
        // Nothing committed: every job of the batch fails like a broken statement (and goes
        // again when the connection was lost).
        let e = match e {
            E::Db(e) | E::Logic(e) => e,
            E::Retry(why) => StoreError::Unavailable(why),
        };
        for (job, _) in done {
            fail(job, E::Db(e.clone()), &mut again);
        }
        return again;
    }
    let started = Instant::now();
    match tx.commit().await {
        Ok(()) => {
            inner.committed(ctx, started.elapsed());
            for (job, d) in done {
                let _ = job.reply.send(Ok(d));
            }
        }
        Err(e) => {
            let e = E::from(e);
            let retry = matches!(e, E::Retry(_));
            let err = e.into_store();
            for (job, _) in done {
                if retry && job.tries < MAX_RETRIES {
                    again.push(Job {
                        tries: job.tries + 1,
                        ..job
                    });
                } else {
                    let _ = job.reply.send(Err(err.clone()));
                }
            }
        }
    }
    again
}
