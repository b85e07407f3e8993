//! Operator records the store keeps beside messages: bulk tasks and the audit log (SPEC §12).
//!
//! A task's *spec* (its filter, rate, stop rule) is the server's business, kept as opaque
//! JSON; the store owns what must stay consistent with the messages: the task's state and
//! its progress (`cursor`, `done`, `failed`). [`crate::Store::task_step`] acts on a batch of
//! messages and advances the task in the same transaction, so a task resumed after a crash
//! starts exactly after the last batch that committed: no message is acted on twice.

use redrive_core::{MessageId, Timestamp};
use serde::{Deserialize, Serialize};

/// What a bulk task does to each message it selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskAction {
    /// Make a dead or scheduled message ready now (a fresh attempt budget).
    Redrive,
    /// Make a pending message dead (`killed`).
    Kill,
    /// Delete the message.
    Delete,
}

impl TaskAction {
    /// The name in the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskAction::Redrive => "redrive",
            TaskAction::Kill => "kill",
            TaskAction::Delete => "delete",
        }
    }

    /// What it did to a message, in the past tense (`redriven`), as a task's counts say it.
    pub fn past_tense(self) -> &'static str {
        match self {
            TaskAction::Redrive => "redriven",
            TaskAction::Kill => "killed",
            TaskAction::Delete => "deleted",
        }
    }

    /// [`TaskAction::past_tense`] of the action named `name` ("acted on" for a name it
    /// does not know).
    pub fn past_tense_of(name: &str) -> &'static str {
        Self::parse(name).map_or("acted on", Self::past_tense)
    }

    /// The action named `s`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "redrive" => Some(TaskAction::Redrive),
            "kill" => Some(TaskAction::Kill),
            "delete" => Some(TaskAction::Delete),
            _ => None,
        }
    }
}

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// Being worked on.
    Running,
    /// Paused by an operator; resumes where it stopped.
    Paused,
    /// Every selected message was acted on.
    Done,
    /// Cancelled by an operator (what was done stays done).
    Cancelled,
    /// Stopped by itself (a redrive whose messages keep failing); `stop_reason` says why.
    Stopped,
}

impl TaskState {
    /// The states a task transition needs, in words (for `InvalidTaskState::allowed`).
    pub fn allowed_text(from: &[TaskState]) -> &'static str {
        match from {
            [TaskState::Running] => "running",
            [TaskState::Paused] => "paused",
            [TaskState::Running, TaskState::Paused] | [TaskState::Paused, TaskState::Running] => {
                "running or paused"
            }
            _ => "another state",
        }
    }

    /// The name in the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Running => "running",
            TaskState::Paused => "paused",
            TaskState::Done => "done",
            TaskState::Cancelled => "cancelled",
            TaskState::Stopped => "stopped",
        }
    }

    /// The state named `s`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "running" => Some(TaskState::Running),
            "paused" => Some(TaskState::Paused),
            "done" => Some(TaskState::Done),
            "cancelled" => Some(TaskState::Cancelled),
            "stopped" => Some(TaskState::Stopped),
            _ => None,
        }
    }

    /// Whether the task can never run again.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            TaskState::Done | TaskState::Cancelled | TaskState::Stopped
        )
    }
}

/// A bulk task as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRecord {
    /// Its id (a UUID v7, so ids sort by creation).
    pub id: String,
    /// What it does to each message.
    pub action: TaskAction,
    /// The server's description of the task (filter, rate, stop rule), opaque here.
    pub spec: serde_json::Value,
    /// Its state.
    pub state: TaskState,
    /// Messages selected when it was created.
    pub total: u64,
    /// Messages acted on.
    pub done: u64,
    /// Messages the action was refused for (e.g. no longer dead).
    pub failed: u64,
    /// Where the selection continues (a search cursor); `None` before the first step.
    pub cursor: Option<String>,
    /// Who created it (a token's name).
    pub created_by: String,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
    /// Why it stopped, was cancelled, or the last refusal's reason.
    pub stop_reason: Option<String>,
}

/// One step of a task: act on `ids`, then advance the task to `next_cursor`.
#[derive(Debug, Clone)]
pub struct TaskStep {
    /// The task.
    pub task: String,
    /// The messages to act on (already selected by the task's filter).
    pub ids: Vec<MessageId>,
    /// The cursor after this batch; `None`: the selection is exhausted and the task is done.
    pub next_cursor: Option<String>,
    /// For a kill: the reason written in each message's history.
    pub kill_reason: Option<String>,
    /// The node running the step (its name), recorded in the `task.done` entry of the
    /// last step ([`NewAudit::node`]).
    pub node: Option<String>,
    /// Run the step only while this leadership holds ([`crate::cluster::Fence`]); else
    /// [`crate::StoreError::Fenced`] and nothing changed. `None`: no check (one process).
    pub fence: Option<crate::cluster::Fence>,
}

impl TaskStep {
    /// The task's state after this step: done when no batch follows it.
    pub fn next_state(&self) -> TaskState {
        if self.next_cursor.is_none() {
            TaskState::Done
        } else {
            TaskState::Running
        }
    }
}

/// A move of a task between states (pause, resume, cancel, stop).
#[derive(Debug, Clone)]
pub struct TaskTransition {
    /// The task.
    pub id: String,
    /// The states it may be in; else [`crate::StoreError::InvalidTaskState`] naming `action`.
    pub from: &'static [TaskState],
    /// The state it moves to.
    pub to: TaskState,
    /// The verb, for the error (`pause`, `resume`, `cancel`, `stop`).
    pub action: &'static str,
    /// Written as the task's `stop_reason` when given.
    pub reason: Option<String>,
    /// Recorded in the audit log in the same transaction.
    pub audit: Option<NewAudit>,
}

/// What a step did.
#[derive(Debug, Clone)]
pub struct TaskStepOutcome {
    /// The task after the step.
    pub task: TaskRecord,
    /// The messages the action was applied to (a redrive task watches how they fare).
    pub applied: Vec<MessageId>,
    /// Whether the step ran at all: `false` when the task was no longer running (paused or
    /// cancelled meanwhile): then nothing was changed.
    pub ran: bool,
}

/// An operator action to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewAudit {
    /// Who (a token's name, `anonymous` without tokens).
    pub actor: String,
    /// What: `message.redrive`, `message.kill`, `message.delete`, `message.edit_redrive`,
    /// `task.create`, `task.pause`, `task.resume`, `task.cancel`, `task.finish` …
    pub action: String,
    /// On what: a message id, a task id.
    pub target: Option<String>,
    /// The selection, for a task.
    pub filter: Option<serde_json::Value>,
    /// How many messages it concerned.
    pub count: u64,
    /// Anything else worth keeping (a kill reason, a stop reason).
    pub detail: Option<String>,
    /// The node that did it (its name, `[cluster] node`; SPEC §13). `None` in entries
    /// recorded before the stores kept it (SQLite schema v8, PostgreSQL schema v6).
    pub node: Option<String>,
}

impl NewAudit {
    /// The record of `task` (as its last step left it) running to its end, written with
    /// that step, which node `node` ran.
    pub fn task_done(task: &TaskRecord, node: Option<String>) -> Self {
        Self {
            actor: task.created_by.clone(),
            action: "task.done".to_owned(),
            target: Some(task.id.clone()),
            filter: task.spec.get("filter").cloned(),
            count: task.done,
            detail: Some(format!(
                "{} {} messages, {} refused",
                task.action.as_str(),
                task.done,
                task.failed
            )),
            node,
        }
    }
}

/// An operator action as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditRecord {
    /// Its place in the log (1, 2, …), increasing.
    pub seq: u64,
    /// When.
    pub at: Timestamp,
    /// The action.
    pub entry: NewAudit,
}
