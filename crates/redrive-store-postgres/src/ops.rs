//! Bulk tasks and the audit log (tables `tasks` and `audit`), as the SQLite store keeps
//! them: a task step acts on its batch of messages and advances the task's cursor and
//! counters in the same transaction, so a task resumed after a crash starts exactly after
//! the last batch that committed.

use crate::error::E;
use crate::sql::{execute, query, query_one, query_opt};
use crate::{transitions, Ctx, Inner};
use deadpool_postgres::{GenericClient, Transaction};
use redrive_core::Timestamp;
use redrive_storage::{
    AuditRecord, NewAudit, StoreError, TaskAction, TaskRecord, TaskState, TaskStep,
    TaskStepOutcome, TaskTransition,
};

const TASK_COLUMNS: &str = "id, action, spec, state, total, done, failed, cursor, created_by, \
                            created_at, updated_at, stop_reason";

fn count(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}

fn parse_task(r: &tokio_postgres::Row) -> Result<TaskRecord, E> {
    let id: String = r.try_get(0)?;
    let action: String = r.try_get(1)?;
    let state: String = r.try_get(3)?;
    let spec: String = r.try_get(2)?;
    let bad = |what: &str, v: &str| {
        E::Db(StoreError::Backend(format!(
            "task {id}: unknown {what} {v:?}"
        )))
    };
    let (total, done, failed): (i64, i64, i64) = (r.try_get(4)?, r.try_get(5)?, r.try_get(6)?);
    Ok(TaskRecord {
        action: TaskAction::parse(&action).ok_or_else(|| bad("action", &action))?,
        state: TaskState::parse(&state).ok_or_else(|| bad("state", &state))?,
        spec: serde_json::from_str(&spec)?,
        total: total.max(0) as u64,
        done: done.max(0) as u64,
        failed: failed.max(0) as u64,
        cursor: r.try_get(7)?,
        created_by: r.try_get(8)?,
        created_at: Timestamp::from_millis(r.try_get(9)?),
        updated_at: Timestamp::from_millis(r.try_get(10)?),
        stop_reason: r.try_get(11)?,
        id,
    })
}

/// One task.
pub async fn task<C: GenericClient>(c: &C, id: &str) -> Result<Option<TaskRecord>, E> {
    let sql = format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1");
    query_opt(c, &sql, &[&id])
        .await?
        .as_ref()
        .map(parse_task)
        .transpose()
}

/// The newest `limit` tasks (in `state`, when given).
pub async fn tasks<C: GenericClient>(
    c: &C,
    state: Option<TaskState>,
    limit: u32,
) -> Result<Vec<TaskRecord>, E> {
    let sql = format!(
        "SELECT {TASK_COLUMNS} FROM tasks WHERE $1::text IS NULL OR state = $1 \
         ORDER BY id DESC LIMIT $2"
    );
    let state = state.map(TaskState::as_str);
    let rows = query(c, &sql, &[&state, &i64::from(limit.max(1))]).await?;
    rows.iter().map(parse_task).collect()
}

/// The audit log, newest first.
pub async fn audit_list<C: GenericClient>(
    c: &C,
    before: Option<u64>,
    limit: u32,
) -> Result<Vec<AuditRecord>, E> {
    let before = before.map_or(i64::MAX, count);
    let rows = query(
        c,
        "SELECT seq, at, actor, action, target, filter, count, detail, node FROM audit \
         WHERE seq < $1 ORDER BY seq DESC LIMIT $2",
        &[&before, &i64::from(limit.max(1))],
    )
    .await?;
    rows.iter()
        .map(|r| {
            let seq: i64 = r.try_get(0)?;
            let n: i64 = r.try_get(6)?;
            let filter: Option<String> = r.try_get(5)?;
            Ok(AuditRecord {
                seq: seq.max(0) as u64,
                at: Timestamp::from_millis(r.try_get(1)?),
                entry: NewAudit {
                    actor: r.try_get(2)?,
                    action: r.try_get(3)?,
                    target: r.try_get(4)?,
                    filter: filter.map(|f| serde_json::from_str(&f)).transpose()?,
                    count: n.max(0) as u64,
                    detail: r.try_get(7)?,
                    node: r.try_get(8)?,
                },
            })
        })
        .collect()
}

/// Record an operator action; its `seq`.
pub async fn audit_insert(
    tx: &Transaction<'_>,
    entry: &NewAudit,
    now: Timestamp,
) -> Result<u64, E> {
    let filter = entry
        .filter
        .as_ref()
        .map(serde_json::to_string)
        .transpose()?;
    let r = query_one(
        tx,
        "INSERT INTO audit (at, actor, action, target, filter, count, detail, node) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING seq",
        &[
            &now.as_millis(),
            &entry.actor,
            &entry.action,
            &entry.target,
            &filter,
            &count(entry.count),
            &entry.detail,
            &entry.node,
        ],
    )
    .await?;
    let seq: i64 = r.try_get(0)?;
    Ok(seq.max(0) as u64)
}

/// Store a new task and its audit entry.
pub async fn task_create(tx: &Transaction<'_>, t: &TaskRecord, audit: &NewAudit) -> Result<(), E> {
    execute(
        tx,
        "INSERT INTO tasks (id, action, spec, state, total, done, failed, cursor, created_by, \
         created_at, updated_at, stop_reason) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        &[
            &t.id,
            &t.action.as_str(),
            &serde_json::to_string(&t.spec)?,
            &t.state.as_str(),
            &count(t.total),
            &count(t.done),
            &count(t.failed),
            &t.cursor,
            &t.created_by,
            &t.created_at.as_millis(),
            &t.updated_at.as_millis(),
            &t.stop_reason,
        ],
    )
    .await?;
    audit_insert(tx, audit, t.created_at).await?;
    Ok(())
}

async fn task_or_404(tx: &Transaction<'_>, id: &str) -> Result<TaskRecord, E> {
    // Locked: a step and a pause of one task run one after the other.
    let sql = format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1 FOR UPDATE");
    match query_opt(tx, &sql, &[&id]).await? {
        Some(r) => parse_task(&r),
        None => Err(E::Logic(StoreError::TaskNotFound(id.to_owned()))),
    }
}

/// Move a task between states (pause, resume, cancel, stop).
pub async fn task_transition(
    tx: &Transaction<'_>,
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
        "UPDATE tasks SET state = $2, updated_at = $3, stop_reason = coalesce($4, stop_reason) \
         WHERE id = $1",
        &[&t.id, &t.to.as_str(), &now.as_millis(), &t.reason],
    )
    .await?;
    if let Some(a) = &t.audit {
        audit_insert(tx, a, now).await?;
    }
    task_or_404(tx, &t.id).await
}

/// Act on a batch and advance the task, in this transaction.
pub async fn task_step(
    st: &Inner,
    tx: &Transaction<'_>,
    cx: &mut Ctx,
    step: &TaskStep,
    now: Timestamp,
) -> Result<TaskStepOutcome, E> {
    if let Some(f) = &step.fence {
        // FOR SHARE: a takeover (an UPDATE of this row) waits until this step committed,
        // so the step is done under the leadership it names or not at all.
        let holds = query_opt(
            tx,
            "SELECT 1 FROM leader WHERE one AND incarnation = $1 AND epoch = $2 \
             AND expires_at > $3 FOR SHARE",
            &[&f.incarnation, &(f.epoch as i64), &now.as_millis()],
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
    let mut applied = Vec::with_capacity(step.ids.len());
    let mut failed = 0i64;
    let mut last_refusal = None;
    for id in &step.ids {
        // Each transition checks before it writes: a refusal leaves no trace.
        let r = match t.action {
            TaskAction::Redrive => transitions::redrive(st, tx, cx, id, None, Some(&t.id), now)
                .await
                .map(|_| ()),
            TaskAction::Kill => transitions::kill(st, tx, cx, id, step.kill_reason.clone(), now)
                .await
                .map(|_| ()),
            TaskAction::Delete => transitions::delete(st, tx, cx, id).await.map(|_| ()),
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
        "UPDATE tasks SET done = done + $2, failed = failed + $3, cursor = $4, state = $5, \
         updated_at = $6, stop_reason = coalesce($7, stop_reason) WHERE id = $1",
        &[
            &t.id,
            &(applied.len() as i64),
            &failed,
            &cursor,
            &state.as_str(),
            &now.as_millis(),
            &last_refusal,
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
