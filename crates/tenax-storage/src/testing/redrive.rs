//! Conformance cases for retrying what died in a workflow: the dependents its death
//! cancelled come back, a saga resumes its chain, and a bulk retry does both and
//! includes dead compensations.
use tenax_core::{CompensationState, TaskKind, TaskStatus};

use super::compensation::compensation_of;
use super::conformance::{fail, lease};
use super::workflows::{complete, keys, kill, state, status_of, step, workflow};
use super::{Harness, TaskOpts};
use crate::{
    BulkAction, FailNext, StorageError, TaskActionParams, TaskBulkParams, TaskFilter, TaskRef,
    WorkflowDetail, WorkflowKind, WorkflowPolicy, WorkflowState,
};

fn id_of(detail: &WorkflowDetail, key: &str) -> tenax_core::TaskId {
    detail
        .tasks
        .iter()
        .find(|t| t.key == key)
        .map(|t| t.task.id)
        .expect("the workflow has this key")
}

async fn retry(
    h: &Harness,
    id: tenax_core::TaskId,
) -> Result<tenax_core::TaskRecord, StorageError> {
    h.storage
        .task_retry(&TaskActionParams {
            task: TaskRef::Id(id),
            now: None,
        })
        .await
}

pub async fn retrying_a_dead_workflow_step_brings_back_the_dependents_its_death_cancelled(
    h: &Harness,
) {
    // a → b → c, a → d; a → e → f, where e is cancelled by hand while it waits.
    let detail = h
        .storage
        .workflow_insert(&workflow(
            "redrive",
            WorkflowKind::Dag,
            WorkflowPolicy::CancelDependents,
            &[
                ("a", &[]),
                ("b", &["a"]),
                ("c", &["b"]),
                ("d", &["a"]),
                ("e", &["a"]),
                ("f", &["e"]),
            ],
        ))
        .await
        .unwrap();
    h.storage
        .task_cancel(&TaskActionParams {
            task: TaskRef::Id(id_of(&detail, "e")),
            now: None,
        })
        .await
        .unwrap();
    let a = h.claim("w", 10, None).await.remove(0);
    kill(h, &a).await;
    for key in ["b", "c", "d", "e", "f"] {
        assert_eq!(
            status_of(h, &detail, key).await,
            TaskStatus::Cancelled,
            "{key}"
        );
    }
    // Its compensation runs first: a retry meanwhile is refused and changes nothing.
    let refused = retry(h, a.id).await.unwrap_err();
    assert!(
        matches!(refused, StorageError::InvalidState { .. }),
        "{refused}"
    );
    assert_eq!(status_of(h, &detail, "b").await, TaskStatus::Cancelled);
    step(h, "a~", true).await;
    assert_eq!(state(h, &detail).await, WorkflowState::Failed);

    let again = retry(h, a.id).await.unwrap();
    assert_eq!(again.status, TaskStatus::Pending);
    for key in ["b", "c", "d"] {
        assert_eq!(
            status_of(h, &detail, key).await,
            TaskStatus::Blocked,
            "{key} comes back behind a"
        );
    }
    for key in ["e", "f"] {
        assert_eq!(
            status_of(h, &detail, key).await,
            TaskStatus::Cancelled,
            "{key}: cancelled by hand, and what waits for it"
        );
    }
    assert_eq!(state(h, &detail).await, WorkflowState::Running);
    let b = h
        .storage
        .task_get(&TaskRef::Id(id_of(&detail, "b")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        b.last_error, None,
        "a restored task no longer says it was cancelled"
    );
    assert_eq!(b.finished_at, None);
    // The flow runs on as if a had never died.
    let claimed = h.claim("w", 10, None).await;
    assert_eq!(keys(&claimed), ["a"]);
    complete(h, &claimed[0], "{}").await;
    let claimed = h.claim("w", 10, None).await;
    assert_eq!(keys(&claimed), ["b", "d"]);
    for task in &claimed {
        complete(h, task, "{}").await;
    }
    let claimed = h.claim("w", 10, None).await;
    assert_eq!(keys(&claimed), ["c"]);
    complete(h, &claimed[0], "{}").await;
    assert!(h.claim("w", 10, None).await.is_empty());
    // e was cancelled by hand: the workflow ends as failed, not completed.
    assert_eq!(state(h, &detail).await, WorkflowState::Failed);
}

pub async fn retrying_a_dead_saga_step_runs_its_undone_steps_again_and_resumes_the_chain(
    h: &Harness,
) {
    let detail = h
        .storage
        .workflow_insert(&workflow(
            "resume",
            WorkflowKind::Saga,
            WorkflowPolicy::CancelDependents,
            &[
                ("s1", &[]),
                ("s2", &["s1"]),
                ("s3", &["s2"]),
                ("s4", &["s3"]),
            ],
        ))
        .await
        .unwrap();
    step(h, "s1", true).await;
    step(h, "s2", true).await;
    step(h, "s3", false).await;
    step(h, "s3~", true).await;
    // s2's compensation is running: the saga compensates, and a retry would race it.
    let refused = retry(h, id_of(&detail, "s3")).await.unwrap_err();
    assert!(
        matches!(refused, StorageError::InvalidState { .. }),
        "{refused}"
    );
    assert_eq!(state(h, &detail).await, WorkflowState::Compensating);
    step(h, "s2~", true).await;
    step(h, "s1~", true).await;
    assert_eq!(state(h, &detail).await, WorkflowState::Compensated);

    // Everything before s3 was undone: the saga runs again from s1, then goes on.
    retry(h, id_of(&detail, "s3")).await.unwrap();
    assert_eq!(state(h, &detail).await, WorkflowState::Running);
    for (key, status) in [
        ("s1", TaskStatus::Pending),
        ("s2", TaskStatus::Blocked),
        ("s3", TaskStatus::Blocked),
        ("s4", TaskStatus::Blocked),
    ] {
        assert_eq!(status_of(h, &detail, key).await, status, "{key}");
    }
    for key in ["s1", "s2", "s3", "s4"] {
        step(h, key, true).await;
    }
    let done = h
        .storage
        .workflow_get(detail.workflow.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.workflow.state, WorkflowState::Completed);
    for t in &done.tasks {
        assert_eq!(t.task.compensation, None, "{} is not undone", t.key);
    }

    // A compensation that died stops the undo at s2; s1 was never undone. A retry of
    // the dead step runs s2 (whose undo may be half done) and s3 again, not s1.
    let failed = h
        .storage
        .workflow_insert(&workflow(
            "halfway",
            WorkflowKind::Saga,
            WorkflowPolicy::CancelDependents,
            &[("s1", &[]), ("s2", &["s1"]), ("s3", &["s2"])],
        ))
        .await
        .unwrap();
    step(h, "s1", true).await;
    step(h, "s2", true).await;
    step(h, "s3", false).await;
    step(h, "s3~", true).await;
    step(h, "s2~", false).await;
    assert_eq!(state(h, &failed).await, WorkflowState::CompensationFailed);
    retry(h, id_of(&failed, "s3")).await.unwrap();
    assert_eq!(state(h, &failed).await, WorkflowState::Running);
    step(h, "s2", true).await;
    step(h, "s3", true).await;
    assert_eq!(state(h, &failed).await, WorkflowState::Completed);
    assert!(h.claim("w", 10, None).await.is_empty());
}

pub async fn bulk_retry_redrives_workflows_and_includes_dead_compensations(h: &Harness) {
    // A dead compensation of a task outside any workflow.
    h.task(TaskOpts::default()).await;
    let task = h.claim("w1", 1, None).await.remove(0);
    assert!(fail(h, lease(&task), FailNext::Dead, None).await);
    let compensation = h.claim("w1", 1, None).await.remove(0);
    assert_eq!(compensation.kind, TaskKind::Compensate);
    assert!(fail(h, lease(&compensation), FailNext::Dead, None).await);
    // A workflow whose first task died and whose compensation ran.
    let detail = h
        .storage
        .workflow_insert(&workflow(
            "bulk",
            WorkflowKind::Dag,
            WorkflowPolicy::CancelDependents,
            &[("a", &[]), ("b", &["a"])],
        ))
        .await
        .unwrap();
    step(h, "a", false).await;
    step(h, "a~", true).await;
    assert_eq!(status_of(h, &detail, "b").await, TaskStatus::Cancelled);

    // The dead task itself is left out: retrying it and its compensation at once would
    // redo and undo together (by id, the task would win and the compensation be stale).
    let outcome = h
        .storage
        .task_bulk(&TaskBulkParams {
            filter: TaskFilter {
                ids: Some(vec![compensation.id, id_of(&detail, "a")]),
                ..Default::default()
            },
            action: BulkAction::Retry,
            limit: 100,
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(outcome.changed, 2, "the compensation and the workflow task");
    let parent = h
        .storage
        .task_get(&TaskRef::Id(task.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parent.compensation, Some(CompensationState::Pending));
    let comps = compensation_of(h, task.id).await;
    assert_eq!(comps.len(), 1);
    assert_eq!(comps[0].status, TaskStatus::Pending);
    assert_eq!(status_of(h, &detail, "a").await, TaskStatus::Pending);
    assert_eq!(status_of(h, &detail, "b").await, TaskStatus::Blocked);
    // The parent of the compensation stays dead; nothing else is dead to retry.
    let again = h
        .storage
        .task_bulk(&TaskBulkParams {
            filter: TaskFilter::default(),
            action: BulkAction::Retry,
            limit: 100,
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(
        again.changed, 0,
        "a dead task whose compensation runs waits"
    );
}
