//! Bulk tasks and the audit log (tables `tasks` and `audit`), as the other stores keep
//! them: a task step acts on its batch of messages and advances the task's cursor and
//! counters in the same transaction, so a task resumed after a crash starts exactly after
//! the last batch that committed.

use crate::error::E;
use crate::sql::{args, col, execute, query, query_opt, Db};
use crate::{transitions, Ctx, Inner};
use redrive_core::Timestamp;
use redrive_storage::{
    AuditRecord, NewAudit, StoreError, TaskAction, TaskRecord, TaskState, TaskStep,
    TaskStepOutcome, TaskTransition,
};

const TASK_COLUMNS: &str = "id, action, spec, state, total, done, failed, cursor_at, created_by, \
                            created_at, updated_at, stop_reason";

fn count(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}

fn parse_task(r: &mysql_async::Row) -> Result<TaskRecord, E> {
    let id: String = col(r, 0)?;
    let action: String = col(r, 1)?;
    let spec: String = col(r, 2)?;
    let state: String = col(r, 3)?;
    let bad = |what: &str, v: &str| {
        E::Db(StoreError::Backend(format!(
            "task {id}: unknown {what} {v:?}"
        )))
    };
    let (total, done, failed): (i64, i64, i64) = (col(r, 4)?, col(r, 5)?, col(r, 6)?);
    Ok(TaskRecord {
        action: TaskAction::parse(&action).ok_or_else(|| bad("action", &action))?,
        state: TaskState::parse(&state).ok_or_else(|| bad("state", &state))?,
        spec: serde_json::from_str(&spec)?,
        total: total.max(0) as u64,
        done: done.max(0) as u64,
        failed: failed.max(0) as u64,
        cursor: col(r, 7)?,
        created_by: col(r, 8)?,
        created_at: Timestamp::from_millis(col(r, 9)?),
        updated_at: Timestamp::from_millis(col(r, 10)?),
        stop_reason: col(r, 11)?,
        id,
    })
}

/// One task.
pub async fn task<C: Db>(c: &mut C, id: &str) -> Result<Option<TaskRecord>, E> {
    let sql = format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?");
    query_opt(c, &sql, args![id])
        .await?
        .as_ref()
        .map(parse_task)
        .transpose()
}

/// The newest `limit` tasks (in `state`, when given).
pub async fn tasks<C: Db>(
    c: &mut C,
    state: Option<TaskState>,
    limit: u32,
) -> Result<Vec<TaskRecord>, E> {
    let state = state.map(TaskState::as_str);
    let sql = format!(
        "SELECT {TASK_COLUMNS} FROM tasks WHERE ? IS NULL OR state = ? ORDER BY id DESC LIMIT ?"
    );
    let rows = query(c, &sql, args![state, state, i64::from(limit.max(1))]).await?;
    rows.iter().map(parse_task).collect()
}

/// The audit log, newest first.
pub async fn audit_list<C: Db>(
    c: &mut C,
    before: Option<u64>,
    limit: u32,
) -> Result<Vec<AuditRecord>, E> {
    let before = before.map_or(i64::MAX, count);
    let rows = query(
        c,
        "SELECT seq, `at`, actor, `action`, target, `filter`, `count`, detail, node FROM audit \
         WHERE seq < ? ORDER BY seq DESC LIMIT ?",
        args![before, i64::from(limit.max(1))],
    )
    .await?;
    rows.iter()
        .map(|r| {
            let seq: i64 = col(r, 0)?;
            let n: i64 = col(r, 6)?;
            let filter: Option<String> = col(r, 5)?;
            Ok(AuditRecord {
                seq: seq.max(0) as u64,
                at: Timestamp::from_millis(col(r, 1)?),
                entry: NewAudit {
                    actor: col(r, 2)?,
                    action: col(r, 3)?,
                    target: col(r, 4)?,
                    filter: filter.map(|f| serde_json::from_str(&f)).transpose()?,
                    count: n.max(0) as u64,
                    detail: col(r, 7)?,
                    node: col(r, 8)?,
                },
            })
        })
        .collect()
}

/// Record an operator action; its `seq`.
pub async fn audit_insert<C: Db>(tx: &mut C, entry: &NewAudit, now: Timestamp) -> Result<u64, E> {
    let filter = entry
        .filter
        .as_ref()
        .map(serde_json::to_string)
        .transpose()?;
    execute(
        tx,
        "INSERT INTO audit (`at`, actor, `action`, target, `filter`, `count`, detail, node) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        args![
            now.as_millis(),
            entry.actor.as_str(),
            entry.action.as_str(),
            entry.target.as_deref(),
            filter,
            count(entry.count),
            entry.detail.as_deref(),
            entry.node.as_deref(),
        ],
    )
    .await?;
    tx.inserted_id().ok_or_else(|| {
        E::Db(StoreError::Backend(
            "an audit insert answered no seq".to_owned(),
        ))
    })
}

/// Store a new task and its audit entry.
pub async fn task_create<C: Db>(tx: &mut C, t: &TaskRecord, audit: &NewAudit) -> Result<(), E> {
    execute(
        tx,
        &format!("INSERT INTO tasks ({TASK_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
        args![
            t.id.as_str(),
            t.action.as_str(),
            serde_json::to_string(&t.spec)?,
            t.state.as_str(),
            count(t.total),
            count(t.done),
            count(t.failed),
            t.cursor.as_deref(),
            t.created_by.as_str(),
            t.created_at.as_millis(),
            t.updated_at.as_millis(),
            t.stop_reason.as_deref(),
        ],
    )
    .await?;
    audit_insert(tx, audit, t.created_at).await?;
    Ok(())
}

async fn task_or_404<C: Db>(tx: &mut C, id: &str) -> Result<TaskRecord, E> {
    // Locked: a step and a pause of one task run one after the other.
    let sql = format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ? FOR UPDATE");
    match query_opt(tx, &sql, args![id]).await? {
        Some(r) => parse_task(&r),
        None => Err(E::Logic(StoreError::TaskNotFound(id.to_owned()))),
    }
}

/// Move a task between states (pause, resume, cancel, stop).
pub async fn task_transition<C: Db>(
    tx: &mut C,
    t: &TaskTransition,
    now: Timestamp,
) -> Result<TaskRecord, E> {
    let task = task_or_404(tx, &t.id).await?;
    if !t.from.contains(&task.state) {
        return Err(E::Logic(StoreError::InvalidTaskState {
            state: task.state,
            action: t.action,
            allowed: TaskState::allowed_text(t.from),
        }));
    }
    execute(
        tx,
        "UPDATE tasks SET state = ?, updated_at = ?, stop_reason = COALESCE(?, stop_reason) \
         WHERE id = ?",
        args![
            t.to.as_str(),
            now.as_millis(),
            t.reason.as_deref(),
            t.id.as_str()
        ],
    )
    .await?;
    if let Some(a) = &t.audit {
        audit_insert(tx, a, now).await?;
    }
    task_or_404(tx, &t.id).await
}

/// Act on a batch and advance the task, in this transaction.
pub async fn task_step<C: Db>(
    st: &Inner,
    tx: &mut C,
    cx: &mut Ctx,
    step: &TaskStep,
    now: Timestamp,
) -> Result<TaskStepOutcome, E> {
    if let Some(f) = &step.fence {
        // A shared lock: a takeover (an UPDATE of this row) waits until this step
        // committed, so the step is done under the leadership it names or not at all.
        let holds = query_opt(
            tx,
            "SELECT one FROM leader WHERE one = 1 AND incarnation = ? AND epoch = ? \
             AND expires_at > ? LOCK IN SHARE MODE",
            args![f.incarnation.as_str(), f.epoch as i64, now.as_millis()],
        )
        .await?;
        if holds.is_none() {
            return Err(E::Logic(StoreError::Fenced { epoch: f.epoch }));
        }
    }
    let t = task_or_404(tx, &step.task).await?;
    if t.state != TaskState::Running {
        return Ok(TaskStepOutcome {
            task: t,
            applied: Vec::new(),
            ran: false,
        });
    }
    transitions::lock_rows(st, tx, &step.ids).await?;
    let mut applied = Vec::with_capacity(step.ids.len());
    let mut failed = 0i64;
    let mut last_refusal = None;
    for id in &step.ids {
        // Each transition checks before it writes: a refusal leaves no trace.
        let r = match t.action {
            TaskAction::Redrive => {
                transitions::redrive(st, &mut *tx, &mut *cx, id, None, Some(&t.id), now)
                    .await
                    .map(|_| ())
            }
            TaskAction::Kill => {
                transitions::kill(st, &mut *tx, &mut *cx, id, step.kill_reason.clone(), now)
                    .await
                    .map(|_| ())
            }
            TaskAction::Delete => transitions::delete(st, &mut *tx, &mut *cx, id)
                .await
                .map(|_| ()),
        };
        match r {
            Ok(()) => applied.push(*id),
            Err(E::Logic(e @ (StoreError::NotFound(_) | StoreError::InvalidState { .. }))) => {
                failed += 1;
                last_refusal = Some(format!("{id}: {e}"));
            }
            Err(e) => return Err(e),
        }
    }
    let state = step.next_state();
    let finished = state == TaskState::Done;
    let cursor = step.next_cursor.as_deref().or(t.cursor.as_deref());
    execute(
        tx,
        "UPDATE tasks SET done = done + ?, failed = failed + ?, cursor_at = ?, state = ?, \
         updated_at = ?, stop_reason = COALESCE(?, stop_reason) WHERE id = ?",
        args![
            applied.len() as i64,
            failed,
            cursor,
            state.as_str(),
            now.as_millis(),
            last_refusal,
            t.id.as_str(),
        ],
    )
    .await?;
    let task = task_or_404(tx, &t.id).await?;
    if finished {
        audit_insert(tx, &NewAudit::task_done(&task, step.node.clone()), now).await?;
    }
    Ok(TaskStepOutcome {
        task,
        applied,
        ran: true,
    })
}
