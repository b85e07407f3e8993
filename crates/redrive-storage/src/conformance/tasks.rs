//! Bulk tasks and the audit log: a step acts and advances together, a task that is not
//! running is left alone, states move only along allowed edges, the log keeps its order.

use super::helpers::*;
use super::*;
use crate::{NewAudit, TaskAction, TaskRecord, TaskState, TaskStep, TaskTransition};

fn task(id: &str, action: TaskAction, total: u64) -> TaskRecord {
    TaskRecord {
        id: id.to_owned(),
        action,
        spec: json!({"filter": {"queue": Q, "state": "dead"}}),
        state: TaskState::Running,
        total,
        done: 0,
        failed: 0,
        cursor: None,
        created_by: "ops".to_owned(),
        created_at: at(0),
        updated_at: at(0),
        stop_reason: None,
    }
}

fn audit(action: &str, count: u64) -> NewAudit {
    NewAudit {
        actor: "ops".to_owned(),
        action: action.to_owned(),
        target: None,
        filter: None,
        count,
        detail: None,
        node: Some("node-a".to_owned()),
    }
}

/// `n` dead messages of [`Q`].
async fn dead<S: Store>(s: &S, n: usize) -> Vec<MessageId> {
    let mut ids = Vec::new();
    for i in 0..n {
        let m = publish(s, msg(Q, json!({ "n": i })), at(0)).await;
        lease_and_nack(s, Q, m.id, failure(ErrorClass::Permanent, "bad"), at(0)).await;
        ids.push(m.id);
    }
    ids
}

pub async fn task_step_acts_and_advances_together<S: Store>(s: Arc<S>) {
    let ids = dead(&*s, 3).await;
    s.task_create(task("t1", TaskAction::Redrive, 3), audit("task.create", 3))
        .await
        .expect("create");
    // One message is no longer dead when the step reaches it: refused, counted failed.
    s.redrive(ids[2], Some(at(1))).await.expect("redrive");
    let out = s
        .task_step(
            TaskStep {
                task: "t1".into(),
                ids: ids.clone(),
                next_cursor: Some("c1".into()),
                kill_reason: None,
                node: Some("node-b".into()),
                fence: None,
            },
            Some(at(2)),
        )
        .await
        .expect("step");
    assert!(out.ran);
    assert_eq!(out.applied, ids[..2].to_vec());
    assert_eq!((out.task.done, out.task.failed), (2, 1));
    assert_eq!(out.task.cursor.as_deref(), Some("c1"));
    assert_eq!(out.task.state, TaskState::Running);
    let redriven = get(&*s, ids[0]).await;
    assert_eq!(redriven.state, State::Ready);
    assert!(
        redriven.history.iter().any(|h| h.event
            == HistoryEvent::Redriven {
                edited: false,
                task: Some("t1".into())
            }),
        "the history names the task: {:?}",
        redriven.history
    );
    // The last step ends the task and records it in the audit log.
    let out = s
        .task_step(
            TaskStep {
                task: "t1".into(),
                ids: vec![],
                next_cursor: None,
                kill_reason: None,
                node: Some("node-b".into()),
                fence: None,
            },
            Some(at(3)),
        )
        .await
        .expect("last step");
    assert_eq!(out.task.state, TaskState::Done);
    assert_eq!(out.task.cursor.as_deref(), Some("c1"), "the cursor is kept");
    let log = s.audit_list(None, 10).await.expect("audit");
    let actions: Vec<_> = log.iter().map(|a| a.entry.action.as_str()).collect();
    assert_eq!(actions, ["task.done", "task.create"], "newest first");
    assert_eq!(log[0].entry.count, 2);
    // Each entry names the node that wrote it: the creating node, the one that ran the
    // last step.
    assert_eq!(log[0].entry.node.as_deref(), Some("node-b"));
    assert_eq!(log[1].entry.node.as_deref(), Some("node-a"));
    assert!(log[0].seq > log[1].seq);
}

pub async fn task_step_of_paused_task_changes_nothing<S: Store>(s: Arc<S>) {
    let ids = dead(&*s, 2).await;
    s.task_create(task("t2", TaskAction::Kill, 2), audit("task.create", 2))
        .await
        .expect("create");
    let paused = s
        .task_transition(
            TaskTransition {
                id: "t2".into(),
                from: &[TaskState::Running],
                to: TaskState::Paused,
                action: "pause",
                reason: None,
                audit: Some(audit("task.pause", 0)),
            },
            Some(at(1)),
        )
        .await
        .expect("pause");
    assert_eq!(paused.state, TaskState::Paused);
    let out = s
        .task_step(
            TaskStep {
                task: "t2".into(),
                ids: ids.clone(),
                next_cursor: None,
                kill_reason: None,
                node: Some("node-b".into()),
                fence: None,
            },
            Some(at(2)),
        )
        .await
        .expect("step");
    assert!(!out.ran);
    assert!(out.applied.is_empty());
    assert_eq!(out.task.state, TaskState::Paused);
    assert_eq!(get(&*s, ids[0]).await.state, State::Dead);
    // Pausing again is refused and names the state; resume and cancel are allowed edges.
    let again = s
        .task_transition(
            TaskTransition {
                id: "t2".into(),
                from: &[TaskState::Running],
                to: TaskState::Paused,
                action: "pause",
                reason: None,
                audit: None,
            },
            Some(at(3)),
        )
        .await;
    assert!(
        matches!(
            again,
            Err(StoreError::InvalidTaskState {
                state: TaskState::Paused,
                ..
            })
        ),
        "{again:?}"
    );
    let cancelled = s
        .task_transition(
            TaskTransition {
                id: "t2".into(),
                from: &[TaskState::Running, TaskState::Paused],
                to: TaskState::Cancelled,
                action: "cancel",
                reason: Some("not needed".into()),
                audit: None,
            },
            Some(at(4)),
        )
        .await
        .expect("cancel");
    assert_eq!(cancelled.state, TaskState::Cancelled);
    assert_eq!(cancelled.stop_reason.as_deref(), Some("not needed"));
    let missing = s
        .task_transition(
            TaskTransition {
                id: "nope".into(),
                from: &[TaskState::Running],
                to: TaskState::Paused,
                action: "pause",
                reason: None,
                audit: None,
            },
            Some(at(5)),
        )
        .await;
    assert!(
        matches!(missing, Err(StoreError::TaskNotFound(_))),
        "{missing:?}"
    );
}

pub async fn tasks_are_listed_newest_first<S: Store>(s: Arc<S>) {
    for id in ["0001", "0003", "0002"] {
        s.task_create(task(id, TaskAction::Delete, 0), audit("task.create", 0))
            .await
            .expect("create");
    }
    let ids: Vec<_> = s
        .tasks(None, 10)
        .await
        .expect("tasks")
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(ids, ["0003", "0002", "0001"]);
    s.task_transition(
        TaskTransition {
            id: "0002".into(),
            from: &[TaskState::Running],
            to: TaskState::Paused,
            action: "pause",
            reason: None,
            audit: None,
        },
        Some(at(1)),
    )
    .await
    .expect("pause");
    let running: Vec<_> = s
        .tasks(Some(TaskState::Running), 10)
        .await
        .expect("running tasks")
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(running, ["0003", "0001"], "only the running ones");
    let one = s.task("0002".into()).await.expect("task").expect("found");
    assert_eq!(one.action, TaskAction::Delete);
    assert_eq!(one.spec["filter"]["state"], "dead");
    assert!(s.task("none".into()).await.expect("task").is_none());
}

pub async fn audit_log_pages_newest_first<S: Store>(s: Arc<S>) {
    for i in 0..5 {
        let mut a = audit("message.redrive", 1);
        a.target = Some(format!("m{i}"));
        a.filter = Some(json!({"i": i}));
        s.audit(a, Some(at(i))).await.expect("audit");
    }
    let mut nameless = audit("message.kill", 1);
    nameless.node = None;
    s.audit(nameless, Some(at(4))).await.expect("audit");
    let newest = s.audit_list(None, 1).await.expect("newest");
    assert_eq!(
        newest[0].entry.node, None,
        "an entry without a node keeps none"
    );
    let first = s.audit_list(Some(newest[0].seq), 2).await.expect("page 1");
    assert_eq!(first.len(), 2);
    assert_eq!(first[0].entry.node.as_deref(), Some("node-a"));
    assert_eq!(first[0].entry.target.as_deref(), Some("m4"));
    assert_eq!(first[0].entry.filter, Some(json!({"i": 4})));
    assert_eq!(first[0].at, at(4));
    let rest = s.audit_list(Some(first[1].seq), 10).await.expect("page 2");
    let targets: Vec<_> = rest.iter().filter_map(|a| a.entry.target.clone()).collect();
    assert_eq!(targets, ["m2", "m1", "m0"]);
}

pub async fn redrive_with_payload_replaces_it<S: Store>(s: Arc<S>) {
    let ids = dead(&*s, 1).await;
    let m = s
        .redrive_with(ids[0], Some(json!({"fixed": true})), Some(at(5)))
        .await
        .expect("redrive with payload");
    assert_eq!(m.state, State::Ready);
    assert_eq!(m.payload, json!({"fixed": true}));
    assert_eq!(
        m.history.last().map(|h| h.event.clone()),
        Some(HistoryEvent::Redriven {
            edited: true,
            task: None
        })
    );
    // Refused (not dead any more): the payload is not touched either.
    let again = s
        .redrive_with(ids[0], Some(json!("other")), Some(at(6)))
        .await;
    assert!(
        matches!(again, Err(StoreError::InvalidState { .. })),
        "{again:?}"
    );
    assert_eq!(get(&*s, ids[0]).await.payload, json!({"fixed": true}));
}

pub async fn count_matches_search<S: Store>(s: Arc<S>) {
    dead(&*s, 3).await;
    publish(&*s, msg(Q, json!("live")), at(0)).await;
    let f = MessageFilter {
        queue: Some(Q.into()),
        state: Some(State::Dead),
        ..MessageFilter::default()
    };
    assert_eq!(s.count(f).await.expect("count"), 3);
    assert_eq!(
        s.count(MessageFilter::default()).await.expect("count all"),
        4
    );
    let text = MessageFilter {
        text: Some("live".into()),
        ..MessageFilter::default()
    };
    assert_eq!(s.count(text).await.expect("count text"), 1);
}

/// A step fenced by a leadership runs while that leadership holds at the store's clock,
/// and is refused ([`StoreError::Fenced`], nothing changed) once it lapsed, and under an
/// epoch or incarnation that is not the holder's.
pub async fn task_step_runs_only_under_its_fence<S: Store>(s: Arc<S>) {
    let ids = dead(&*s, 2).await;
    s.task_create(task("t1", TaskAction::Redrive, 2), audit("task.create", 2))
        .await
        .expect("create");
    let beat = crate::Heartbeat {
        node: "a".into(),
        incarnation: "a-1".into(),
        address: String::new(),
        version: "test".into(),
        lead: true,
        lead_ms: 10_000,
    };
    let b = s.heartbeat(beat, Some(at(1_000))).await.expect("beat");
    let epoch = b.leader.expect("a leads").epoch;
    let step = |id: MessageId, fence: crate::Fence| TaskStep {
        task: "t1".into(),
        ids: vec![id],
        next_cursor: Some(format!("after-{id}")),
        kill_reason: None,
        node: Some("a".into()),
        fence: Some(fence),
    };
    let fence = |incarnation: &str, epoch: u64| crate::Fence {
        incarnation: incarnation.into(),
        epoch,
    };
    for wrong in [fence("a-1", epoch + 1), fence("b-1", epoch)] {
        let r = s.task_step(step(ids[0], wrong), Some(at(2_000))).await;
        assert!(
            matches!(r, Err(StoreError::Fenced { .. })),
            "a fence that is not the holder's: {r:?}"
        );
    }
    let t = s.task("t1".into()).await.expect("task").expect("t1");
    assert_eq!(
        (t.done, t.cursor.as_deref()),
        (0, None),
        "a refused step changed nothing"
    );
    let out = s
        .task_step(step(ids[0], fence("a-1", epoch)), Some(at(2_000)))
        .await
        .expect("the holder's step");
    assert_eq!(out.applied, vec![ids[0]]);
    // The leadership lapsed at 11 s: the same fence is refused.
    let r = s
        .task_step(step(ids[1], fence("a-1", epoch)), Some(at(11_000)))
        .await;
    assert!(
        matches!(r, Err(StoreError::Fenced { .. })),
        "a lapsed fence: {r:?}"
    );
    let m = s.get(ids[1]).await.expect("get").expect("message");
    assert_eq!(m.state, State::Dead, "the refused step did not redrive it");
}
