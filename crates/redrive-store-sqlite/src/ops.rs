//! Bulk tasks and the audit log in SQLite (schema v6: tables `tasks` and `audit`; v8:
//! `audit.node`).
//!
//! Writes run in the writer like every transition; [`WriterState::task_step`] acts on a
//! batch of messages and writes the task's new cursor and counters in the same job, so
//! they commit together or not at all.

use crate::sql_error::SqlResultExt;
use crate::transitions::WriterState;
use redrive_core::Timestamp;
use redrive_storage::{
    AuditRecord, NewAudit, StoreError, TaskAction, TaskRecord, TaskState, TaskStep,
    TaskStepOutcome, TaskTransition,
};
use rusqlite::{params, Connection, OptionalExtension};

const TASK_COLUMNS: &str = "id, action, spec, state, total, done, failed, cursor, created_by, \
                            created_at, updated_at, stop_reason";

fn task_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(TaskRecordRaw, String)> {
    Ok((
        TaskRecordRaw {
            id: r.get(0)?,
            total: r.get(4)?,
            done: r.get(5)?,
            failed: r.get(6)?,
            cursor: r.get(7)?,
            created_by: r.get(8)?,
            created_at: r.get(9)?,
            updated_at: r.get(10)?,
            stop_reason: r.get(11)?,
            action: r.get(1)?,
            spec: r.get(2)?,
        },
        r.get(3)?,
    ))
}

/// A `tasks` row before its text columns are parsed.
struct TaskRecordRaw {
    id: String,
    action: String,
    spec: String,
    total: i64,
    done: i64,
    failed: i64,
    cursor: Option<String>,
    created_by: String,
    created_at: i64,
    updated_at: i64,
    stop_reason: Option<String>,
}

fn parse_task((raw, state): (TaskRecordRaw, String)) -> Result<TaskRecord, StoreError> {
    let bad =
        |what: &str, v: &str| StoreError::Backend(format!("task {}: unknown {what} {v:?}", raw.id));
    Ok(TaskRecord {
        action: TaskAction::parse(&raw.action).ok_or_else(|| bad("action", &raw.action))?,
        state: TaskState::parse(&state).ok_or_else(|| bad("state", &state))?,
        spec: serde_json::from_str(&raw.spec)?,
        total: raw.total.max(0) as u64,
        done: raw.done.max(0) as u64,
        failed: raw.failed.max(0) as u64,
        cursor: raw.cursor,
        created_by: raw.created_by,
        created_at: Timestamp::from_millis(raw.created_at),
        updated_at: Timestamp::from_millis(raw.updated_at),
        stop_reason: raw.stop_reason,
        id: raw.id,
    })
}

/// One task, read on `conn` (the writer's or a reader's).
pub fn task(conn: &Connection, id: &str) -> Result<Option<TaskRecord>, StoreError> {
    let sql = format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?1");
    let raw = conn
        .prepare_cached(&sql)
        .db()?
        .query_row([id], task_from_row)
        .optional()
        .db()?;
    raw.map(parse_task).transpose()
}

/// The newest `limit` tasks (in `state`, when given).
pub fn tasks(
    conn: &Connection,
    state: Option<TaskState>,
    limit: u32,
) -> Result<Vec<TaskRecord>, StoreError> {
    let sql = format!(
        "SELECT {TASK_COLUMNS} FROM tasks WHERE ?1 IS NULL OR state = ?1 ORDER BY id DESC LIMIT ?2"
    );
    let raws: Vec<_> = conn
        .prepare_cached(&sql)
        .db()?
        .query_map(
            params![state.map(TaskState::as_str), i64::from(limit.max(1))],
            task_from_row,
        )
        .db()?
        .collect::<Result<_, _>>()
        .db()?;
    raws.into_iter().map(parse_task).collect()
}

/// The audit log, newest first.
pub fn audit_list(
    conn: &Connection,
    before: Option<u64>,
    limit: u32,
) -> Result<Vec<AuditRecord>, StoreError> {
    let before = before.map_or(i64::MAX, |b| b.min(i64::MAX as u64) as i64);
    let rows: Vec<(AuditRecord, Option<String>)> = conn
        .prepare_cached(
            "SELECT seq, at, actor, action, target, filter, count, detail, node FROM audit \
             WHERE seq < ?1 ORDER BY seq DESC LIMIT ?2",
        )
        .db()?
        .query_map(params![before, limit.max(1)], |r| {
            let record = AuditRecord {
                seq: r.get::<_, i64>(0)?.max(0) as u64,
                at: Timestamp::from_millis(r.get(1)?),
                entry: NewAudit {
                    actor: r.get(2)?,
                    action: r.get(3)?,
                    target: r.get(4)?,
                    filter: None,
                    count: r.get::<_, i64>(6)?.max(0) as u64,
                    detail: r.get(7)?,
                    node: r.get(8)?,
                },
            };
            Ok((record, r.get(5)?))
        })
        .db()?
        .collect::<Result<_, _>>()
        .db()?;
    rows.into_iter()
        .map(|(mut record, filter)| {
            record.entry.filter = filter.map(|f| serde_json::from_str(&f)).transpose()?;
            Ok(record)
        })
        .collect()
}

impl WriterState {
    /// Record an operator action.
    pub fn audit_insert(&self, entry: &NewAudit, now: Timestamp) -> Result<u64, StoreError> {
        let filter = entry
            .filter
            .as_ref()
            .map(serde_json::to_string)
            .transpose()?;
        self.conn
            .prepare_cached(
                "INSERT INTO audit (at, actor, action, target, filter, count, detail, node) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .db()?
            .execute(params![
                now.as_millis(),
                entry.actor,
                entry.action,
                entry.target,
                filter,
                entry.count.min(i64::MAX as u64) as i64,
                entry.detail,
                entry.node
            ])
            .db()?;
        Ok(self.conn.last_insert_rowid().max(0) as u64)
    }

    /// Store a new task and its audit entry.
    pub fn task_create(&self, t: &TaskRecord, audit: &NewAudit) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO tasks (id, action, spec, state, total, done, failed, cursor, \
                 created_by, created_at, updated_at, stop_reason) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            )
            .db()?
            .execute(params![
                t.id,
                t.action.as_str(),
                serde_json::to_string(&t.spec)?,
                t.state.as_str(),
                t.total.min(i64::MAX as u64) as i64,
                t.done.min(i64::MAX as u64) as i64,
                t.failed.min(i64::MAX as u64) as i64,
                t.cursor,
                t.created_by,
                t.created_at.as_millis(),
                t.updated_at.as_millis(),
                t.stop_reason
            ])
            .db()?;
        self.audit_insert(audit, t.created_at)?;
        Ok(())
    }

    fn task_or_404(&self, id: &str) -> Result<TaskRecord, StoreError> {
        task(&self.conn, id)?.ok_or_else(|| StoreError::TaskNotFound(id.to_owned()))
    }

    /// Move a task between states (pause, resume, cancel, stop).
    pub fn task_transition(
        &self,
        t: &TaskTransition,
        now: Timestamp,
    ) -> Result<TaskRecord, StoreError> {
        let task = self.task_or_404(&t.id)?;
        if !t.from.contains(&task.state) {
            return Err(StoreError::InvalidTaskState {
                state: task.state,
                action: t.action,
                allowed: TaskState::allowed_text(t.from),
            });
        }
        self.conn
            .prepare_cached(
                "UPDATE tasks SET state = ?2, updated_at = ?3, \
                 stop_reason = COALESCE(?4, stop_reason) WHERE id = ?1",
            )
            .db()?
            .execute(params![t.id, t.to.as_str(), now.as_millis(), t.reason])
            .db()?;
        if let Some(a) = &t.audit {
            self.audit_insert(a, now)?;
        }
        self.task_or_404(&t.id)
    }

    /// Act on a batch and advance the task, in this job.
    pub fn task_step(
        &mut self,
        step: &TaskStep,
        now: Timestamp,
    ) -> Result<TaskStepOutcome, StoreError> {
        let t = self.task_or_404(&step.task)?;
        if t.state != TaskState::Running {
            return Ok(TaskStepOutcome {
                task: t,
                applied: Vec::new(),
                ran: false,
            });
        }
        let mut applied = Vec::with_capacity(step.ids.len());
        let mut failed = 0u64;
        let mut last_refusal = None;
        for id in &step.ids {
            // Each transition checks before it writes: a refusal leaves no trace.
            let r = match t.action {
                TaskAction::Redrive => self.redrive(id, None, Some(&t.id), now).map(|_| ()),
                TaskAction::Kill => self.kill(id, step.kill_reason.clone(), now).map(|_| ()),
                TaskAction::Delete => self.delete(id).map(|_| ()),
            };
            match r {
                Ok(()) => applied.push(*id),
                Err(e @ (StoreError::NotFound(_) | StoreError::InvalidState { .. })) => {
                    failed += 1;
                    last_refusal = Some(format!("{id}: {e}"));
                }
                Err(e) => return Err(e),
            }
        }
        let state = step.next_state();
        let finished = state == TaskState::Done;
        self.conn
            .prepare_cached(
                "UPDATE tasks SET done = done + ?2, failed = failed + ?3, cursor = ?4, \
                 state = ?5, updated_at = ?6, stop_reason = COALESCE(?7, stop_reason) \
                 WHERE id = ?1",
            )
            .db()?
            .execute(params![
                t.id,
                applied.len() as i64,
                failed as i64,
                step.next_cursor.as_deref().or(t.cursor.as_deref()),
                state.as_str(),
                now.as_millis(),
                last_refusal
            ])
            .db()?;
        let task = self.task_or_404(&t.id)?;
        if finished {
            self.audit_insert(&NewAudit::task_done(&task, step.node.clone()), now)?;
        }
        Ok(TaskStepOutcome {
            task,
            applied,
            ran: true,
        })
    }
}
