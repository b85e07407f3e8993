//! Bulk tasks (SPEC §12): redrive, kill or delete every message a filter selects, as a
//! durable task that survives restarts, at a rate, with pause / resume / cancel, and a
//! redrive that stops by itself when the messages it redrove keep failing.
//!
//! The selection is the store's search, newest first, page by page; each page is one
//! [`redrive_storage::Store::task_step`], which acts on the page's messages and writes the task's cursor
//! and counters in the same transaction. After a crash the task resumes after the last
//! committed page, so no message is acted on twice. The selection is bounded by the
//! task's creation time (`until`): messages published later are not selected.
//!
//! One runner loop serves every running task, one step each in turn, each at its own pace.
//! How a redrive fares is watched in memory: the runner reads back messages it redrove;
//! one that failed again (a `failed` history entry after the task's redrive, or dead) is
//! a failure, one that is `done` a success. When at least `stop_min_outcomes` are known
//! and more than `stop_failure_ratio` of the last 100 known failed, the task is `stopped`
//! with the figures in `stop_reason`. The watch restarts empty after a restart.

use super::Engine;
use redrive_core::{HistoryEvent, MessageId, State};
use redrive_storage::{
    Fence, MessageFilter, NewAudit, StoreError, TaskAction, TaskRecord, TaskState, TaskStep,
    TaskTransition,
};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};

/// Messages acted on in one step when the task has no rate.
pub const MAX_STEP: u32 = 200;
/// Steps per second a rate-limited task aims at (its batch is rate / this).
const STEPS_PER_SECOND: f64 = 5.0;
/// Default stop rule of a redrive task.
pub const DEFAULT_STOP_FAILURE_RATIO: f64 = 0.5;
/// See [`DEFAULT_STOP_FAILURE_RATIO`].
pub const DEFAULT_STOP_MIN_OUTCOMES: u32 = 20;
/// Known outcomes the stop rule looks at (the most recent).
pub const OUTCOME_WINDOW: usize = 100;
/// Redriven messages watched per task at most (older ones are forgotten).
const MAX_WATCHED: usize = 2_000;
/// Redriven messages read back per step.
const CHECKS_PER_STEP: usize = 20;
/// A redriven message is read back at the earliest this long after its redrive.
const CHECK_AFTER: Duration = Duration::from_millis(200);
/// After a failed step (store error) wait this long before trying again.
const RETRY_DELAY: Duration = Duration::from_secs(1);

/// What a task selects and how it runs: stored as the task's spec, read back after a
/// restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskPlan {
    /// The filter as the operator gave it (shown back; not re-parsed).
    pub filter: serde_json::Value,
    /// The selection, parsed (relative times resolved at creation); its `until` is at most
    /// the task's creation. Its `fingerprint` (a failure group's) is the spec's top-level
    /// `fingerprint`, as stored before the store could filter on it.
    #[serde(flatten)]
    pub selection: MessageFilter,
    /// The rate as given (`"100/s"`).
    pub rate: Option<String>,
    /// Messages per second; `None`: as fast as the store goes.
    pub rate_per_second: Option<f64>,
    /// A kill's reason, for each message's history.
    pub kill_reason: Option<String>,
    /// Stop a redrive when more than this share of its known outcomes failed.
    pub stop_failure_ratio: f64,
    /// … once at least this many outcomes are known.
    pub stop_min_outcomes: u32,
}

impl TaskPlan {
    /// The plan of a stored task.
    pub fn of(task: &TaskRecord) -> Result<TaskPlan, StoreError> {
        Ok(serde_json::from_value(task.spec.clone())?)
    }

    /// Messages per step and the pause after a step of `n` messages.
    fn pace(&self) -> (u32, impl Fn(usize) -> Duration) {
        let rate = self.rate_per_second;
        let batch = rate.map_or(MAX_STEP, |r| {
            ((r / STEPS_PER_SECOND).floor() as u32).clamp(1, MAX_STEP)
        });
        (batch, move |n: usize| {
            rate.map_or(Duration::ZERO, |r| Duration::from_secs_f64(n as f64 / r))
        })
    }
}

/// The tasks' runner and its wake-up.
#[derive(Debug, Default)]
pub struct Tasks {
    wake: Notify,
}

impl Tasks {
    /// Tell the runner that a task was created or resumed.
    pub fn wake(&self) {
        self.wake.notify_one();
    }
}

/// How the messages a redrive task redrove fare.
#[derive(Debug, Default)]
struct Watch {
    pending: VecDeque<(MessageId, Instant)>,
    outcomes: VecDeque<bool>,
    known: u64,
}

impl Watch {
    fn failed_share(&self) -> (usize, usize) {
        let failed = self.outcomes.iter().filter(|f| **f).count();
        (failed, self.outcomes.len())
    }

    fn record(&mut self, failed: bool) {
        self.known += 1;
        self.outcomes.push_back(failed);
        if self.outcomes.len() > OUTCOME_WINDOW {
            self.outcomes.pop_front();
        }
    }
}

/// The runner's memory of one running task.
#[derive(Debug)]
struct Running {
    next_at: Instant,
    watch: Watch,
}

/// Count what `plan` selects now (a dry run, or a new task's `total`).
pub async fn count(engine: &Engine, plan: &TaskPlan) -> Result<u64, StoreError> {
    engine.store().count(plan.selection.clone()).await
}

/// Run every running task until `stop`, while this node leads its cluster (one node runs
/// the tasks; each step commits its page and cursor together, so the next leader goes on
/// from the last committed page).
pub async fn run(engine: Arc<Engine>, mut stop: watch::Receiver<bool>) {
    let mut running: HashMap<String, Running> = HashMap::new();
    loop {
        if *stop.borrow() {
            return;
        }
        if !engine.membership().leads() {
            // Another node runs them meanwhile: start afresh (the pacing state is this
            // node's) once this one leads again.
            running.clear();
            if !engine.membership().wait_to_lead(&mut stop).await {
                return;
            }
            continue;
        }
        let live = match engine
            .store()
            .tasks(Some(TaskState::Running), u32::MAX)
            .await
        {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the tasks");
                tokio::select! {
                    _ = tokio::time::sleep(RETRY_DELAY) => continue,
                    _ = stop.changed() => return,
                }
            }
        };
        running.retain(|id, _| live.iter().any(|t| &t.id == id));
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for task in &live {
            let r = running.entry(task.id.clone()).or_insert_with(|| Running {
                next_at: now,
                watch: Watch::default(),
            });
            if r.next_at <= Instant::now() && engine.membership().leads() {
                match step(&engine, task, &mut r.watch).await {
                    Ok(pause) => r.next_at = Instant::now() + pause,
                    Err(e @ StoreError::Fenced { .. }) => {
                        // Another node leads now (this one was paused or cut off): it goes
                        // on from the last committed page; this node stops stepping.
                        tracing::warn!(task = %task.id, error = %e, "task step refused: this node no longer leads");
                        running.clear();
                        break;
                    }
                    Err(e) => {
                        tracing::error!(task = %task.id, error = %e, "task step failed");
                        r.next_at = Instant::now() + RETRY_DELAY;
                    }
                }
            }
            next = Some(next.map_or(r.next_at, |n| n.min(r.next_at)));
        }
        // A task created on another node of the cluster wakes nobody here: on a shared
        // store look again at least every `recheck` (1 s).
        let idle = engine.recheck().unwrap_or(Duration::from_secs(3_600));
        let sleep = match next {
            Some(at) => at.saturating_duration_since(Instant::now()).min(idle),
            None => idle,
        };
        if sleep.is_zero() {
            tokio::task::yield_now().await;
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = engine.tasks().wake.notified() => {}
            _ = stop.changed() => return,
        }
    }
}

/// One step of `task`: the next page of its selection, acted on. Returns the pause before
/// its next step.
async fn step(
    engine: &Engine,
    task: &TaskRecord,
    watch: &mut Watch,
) -> Result<Duration, StoreError> {
    let plan = TaskPlan::of(task)?;
    // The step is done only under this node's leadership, checked by the store in the
    // step's own transaction (a node paused past its lease is refused there).
    let Some(epoch) = engine.membership().epoch() else {
        return Ok(Duration::ZERO);
    };
    let fence = Fence {
        incarnation: engine.membership().incarnation().to_owned(),
        epoch,
    };
    let (batch, pause) = plan.pace();
    let store = engine.store();
    let page = store
        .search(plan.selection.clone(), batch, task.cursor.clone())
        .await?;
    let out = store
        .task_step(
            TaskStep {
                task: task.id.clone(),
                ids: page.messages.iter().map(|m| m.id).collect(),
                next_cursor: page.next_cursor.clone(),
                kill_reason: plan.kill_reason.clone(),
                node: Some(engine.node().to_owned()),
                fence: Some(fence),
            },
            engine.clock().for_store(),
        )
        .await?;
    if !out.ran {
        return Ok(Duration::ZERO);
    }
    for m in page.messages.iter().filter(|m| out.applied.contains(&m.id)) {
        engine.acted(task.action, &m.queue, m.key.is_some());
    }
    if out.task.state == TaskState::Done {
        tracing::info!(task = %task.id, done = out.task.done, failed = out.task.failed, "task done");
        return Ok(Duration::ZERO);
    }
    if task.action == TaskAction::Redrive {
        let at = Instant::now();
        watch.pending.extend(out.applied.iter().map(|id| (*id, at)));
        while watch.pending.len() > MAX_WATCHED {
            watch.pending.pop_front();
        }
        check_outcomes(engine, &plan, &out.task, watch).await?;
    }
    Ok(pause(page.messages.len().max(1)))
}

/// Read back a few redriven messages; stop the task when too many failed again.
async fn check_outcomes(
    engine: &Engine,
    plan: &TaskPlan,
    task: &TaskRecord,
    watch: &mut Watch,
) -> Result<(), StoreError> {
    for _ in 0..CHECKS_PER_STEP.min(watch.pending.len()) {
        let Some((id, at)) = watch.pending.front().copied() else {
            break;
        };
        if at.elapsed() < CHECK_AFTER {
            break;
        }
        watch.pending.pop_front();
        let Some(m) = engine.store().get(id).await? else {
            continue; // deleted meanwhile: no outcome
        };
        let since_redrive = m
            .history
            .iter()
            .rposition(|h| matches!(&h.event, HistoryEvent::Redriven { task: Some(t), .. } if *t == task.id))
            .map_or(&m.history[..], |i| &m.history[i + 1..]);
        let failed_again = since_redrive
            .iter()
            .any(|h| matches!(h.event, HistoryEvent::Failed { .. }));
        match m.state {
            _ if failed_again => watch.record(true),
            State::Dead => watch.record(true),
            State::Done => watch.record(false),
            _ => watch.pending.push_back((id, at)),
        }
    }
    let (failed, known) = watch.failed_share();
    if watch.known >= u64::from(plan.stop_min_outcomes)
        && known > 0
        && failed as f64 / known as f64 > plan.stop_failure_ratio
    {
        // Says which count is which (issue 15): `done` is what the task redrove, `failed`
        // what the store refused, and these figures are the redriven messages that failed
        // again, which only this rule counts.
        let reason = format!(
            "stopped by its stop rule: {failed} of the last {known} redriven messages whose \
             outcome is known failed again (more than {:.0} %; the rule looks at the last \
             {OUTCOME_WINDOW} once {} are known); {} of {} redriven before it stopped, {} \
             refused; fix the cause, then start a new task",
            plan.stop_failure_ratio * 100.0,
            plan.stop_min_outcomes,
            task.done,
            task.total,
            task.failed
        );
        tracing::warn!(task = %task.id, %reason, "task stopped by itself");
        let audit = NewAudit {
            actor: task.created_by.clone(),
            action: "task.stopped".to_owned(),
            target: Some(task.id.clone()),
            filter: Some(plan.filter.clone()),
            count: task.done,
            detail: Some(reason.clone()),
            node: Some(engine.node().to_owned()),
        };
        match engine
            .store()
            .task_transition(
                TaskTransition {
                    id: task.id.clone(),
                    from: &[TaskState::Running],
                    to: TaskState::Stopped,
                    action: "stop",
                    reason: Some(reason),
                    audit: Some(audit),
                },
                engine.clock().for_store(),
            )
            .await
        {
            Ok(_) | Err(StoreError::InvalidTaskState { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A task stored before the store filtered on fingerprints (every selection field
    /// written, `null` when unset, the fingerprint beside them) reads with its fingerprint in
    /// the selection, and a plan written now has the same shape.
    #[test]
    fn a_stored_spec_of_an_older_version_reads_with_its_fingerprint() {
        let fp = "permanent: order <n> not found";
        let old = json!({
            "filter": {"queue": "bulk", "state": "dead", "fingerprint": fp},
            "queue": "bulk", "state": "dead", "key": null, "error_class": null, "text": null,
            "since": null, "until": "2026-01-31T12:00:00.001Z", "fingerprint": fp,
            "rate": "100/s", "rate_per_second": 100.0, "kill_reason": null,
            "stop_failure_ratio": 0.5, "stop_min_outcomes": 20
        });
        let plan: TaskPlan = serde_json::from_value(old).unwrap();
        assert_eq!(plan.selection.fingerprint.as_deref(), Some(fp));
        assert_eq!(plan.selection.queue.as_deref(), Some("bulk"));
        assert_eq!(plan.selection.state, Some(State::Dead));
        assert_eq!(plan.selection.finished_since, None);
        let now = serde_json::to_value(&plan).unwrap();
        assert_eq!(now["fingerprint"], fp, "{now}");
        assert_eq!(serde_json::from_value::<TaskPlan>(now).unwrap(), plan);
        let without: TaskPlan = serde_json::from_value(json!({
            "filter": {"queue": "bulk"}, "queue": "bulk", "fingerprint": null,
            "rate": null, "rate_per_second": null, "kill_reason": null,
            "stop_failure_ratio": 0.5, "stop_min_outcomes": 20
        }))
        .unwrap();
        assert_eq!(without.selection.fingerprint, None);
    }
}
