//! Conformance cases for compensation: a death schedules its compensation once, a
//! compensation's own life (no handler, no cancel, retries), and what it carries.
use tenax_core::{CompensationState, TaskId, TaskKind, TaskStatus};

use super::conformance::{claim_offering, complete, fail, later, lease, reap, status_of};
use super::{claim_params, Harness, TaskOpts};
use crate::{
    FailNext, StorageError, TaskActionParams, TaskCompleteParams, TaskListParams, TaskRef,
};

pub(super) async fn compensation_of(h: &Harness, parent: TaskId) -> Vec<tenax_core::TaskRecord> {
    let all = h
        .storage
        .task_list(&TaskListParams {
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    all.into_iter()
        .filter(|t| t.parent_id == Some(parent))
        .collect()
}

pub async fn death_schedules_compensation_recorded_once(h: &Harness) {
    h.task(TaskOpts {
        task_no: Some("DIES".into()),
        payload: r#"{"id":7}"#.into(),
        ..Default::default()
    })
    .await;
    let task = h.claim("w1", 1, None).await.remove(0);
    assert!(fail(h, lease(&task), FailNext::Dead, None).await);
    let dead = h
        .storage
        .task_get(&TaskRef::Id(task.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(dead.status, TaskStatus::Dead);
    assert!(dead.finished_at.is_some());
    assert_eq!(dead.compensation, Some(CompensationState::Pending));
    let comp = compensation_of(h, task.id).await;
    assert_eq!(comp.len(), 1);
    assert_eq!(comp[0].kind, TaskKind::Compensate);
    assert_eq!(comp[0].payload, r#"{"id":7}"#);
    assert_eq!(comp[0].command_type, TaskOpts::TYPE);
    // A dead task with a running compensation is neither retried nor pruned.
    let err = h
        .storage
        .task_retry(&TaskActionParams {
            task: TaskRef::Id(task.id),
            now: None,
        })
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::InvalidState { .. }), "{err}");
    // The compensation runs like any task; a first attempt's worker is lost.
    let c1 = h.claim("w1", 1, None).await.remove(0);
    assert_eq!(c1.id, comp[0].id);
    let now = h.storage.now().await.unwrap();
    reap(h, later(now, 60)).await;
    let c2 = h.claim("w2", 1, later(now, 61)).await.remove(0);
    assert!(
        !complete(h, lease(&c1)).await,
        "the stale compensation cannot finish"
    );
    assert!(complete(h, lease(&c2)).await);
    assert!(!complete(h, lease(&c2)).await, "finished exactly once");
    let parent = h
        .storage
        .task_get(&TaskRef::Id(task.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parent.compensation, Some(CompensationState::Succeeded));
    // A compensation that dies leaves no compensation of its own.
    assert_eq!(compensation_of(h, comp[0].id).await.len(), 0);
}

pub async fn compensation_without_handler_is_recorded_as_none(h: &Harness) {
    h.task(TaskOpts::default()).await;
    let task = h.claim("w1", 1, None).await.remove(0);
    assert!(fail(h, lease(&task), FailNext::Dead, None).await);
    let comp = h.claim("w1", 1, None).await.remove(0);
    assert_eq!(comp.kind, TaskKind::Compensate);
    assert!(h
        .storage
        .task_complete_if_leased(&TaskCompleteParams {
            lease: lease(&comp),
            result: None,
            compensation: CompensationState::None,
            now: None,
        })
        .await
        .unwrap());
    let parent = h
        .storage
        .task_get(&TaskRef::Id(task.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parent.compensation, Some(CompensationState::None));
    // A failing compensation is recorded as failed, not compensated again.
    h.task(TaskOpts::default()).await;
    let other = h.claim("w1", 1, None).await.remove(0);
    assert!(fail(h, lease(&other), FailNext::Dead, None).await);
    let comp = h.claim("w1", 1, None).await.remove(0);
    assert!(fail(h, lease(&comp), FailNext::Dead, None).await);
    let parent = h
        .storage
        .task_get(&TaskRef::Id(other.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parent.compensation, Some(CompensationState::Failed));
    assert!(compensation_of(h, comp.id).await.is_empty());
}

pub async fn a_compensation_cannot_be_cancelled_and_its_retry_reopens_the_parent(h: &Harness) {
    h.task(TaskOpts::default()).await;
    let task = h.claim("w1", 1, None).await.remove(0);
    assert!(fail(h, lease(&task), FailNext::Dead, None).await);
    let comp = compensation_of(h, task.id).await.remove(0);
    let err = h
        .storage
        .task_cancel(&TaskActionParams {
            task: TaskRef::Id(comp.id),
            now: None,
        })
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::InvalidState { .. }), "{err}");
    let running = h.claim("w1", 1, None).await.remove(0);
    assert!(fail(h, lease(&running), FailNext::Dead, None).await);
    let parent = h
        .storage
        .task_get(&TaskRef::Id(task.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parent.compensation, Some(CompensationState::Failed));
    // An operator retries the dead compensation: the parent waits for it again.
    h.storage
        .task_retry(&TaskActionParams {
            task: TaskRef::Id(comp.id),
            now: None,
        })
        .await
        .unwrap();
    let parent = h
        .storage
        .task_get(&TaskRef::Id(task.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parent.compensation, Some(CompensationState::Pending));
    let again = h.claim("w1", 1, None).await.remove(0);
    assert!(complete(h, lease(&again)).await);
    let parent = h
        .storage
        .task_get(&TaskRef::Id(task.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parent.compensation, Some(CompensationState::Succeeded));
}

pub async fn payload_version_is_stored_and_copied_to_the_compensation(h: &Harness) {
    assert_eq!(h.task(TaskOpts::default()).await.payload_version, 1);
    let opts = TaskOpts {
        task_no: Some("V3".into()),
        payload: r#"{"first":"Ada","last":"Lovelace"}"#.into(),
        payload_version: 3,
        ..Default::default()
    };
    let task = h.task(opts.clone()).await;
    assert_eq!(task.payload_version, 3);
    let fetched = h
        .storage
        .task_get(&TaskRef::Id(task.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(fetched.payload_version, 3);
    // The same task_no, type and payload under another version is the same task; it
    // keeps the version it was stored with.
    let again = h
        .storage
        .task_insert(
            &TaskOpts {
                payload_version: 1,
                ..opts
            }
            .params(),
        )
        .await
        .unwrap();
    assert!(!again.created);
    assert_eq!(again.task.id, task.id);
    assert_eq!(again.task.payload_version, 3);

    let mut params = claim_params("w1", 10, None);
    params.commands = vec![(TaskOpts::TYPE.to_owned(), 3)];
    let claimed = h.storage.task_claim_batch(&params).await.unwrap();
    let running = claimed.iter().find(|t| t.id == task.id).unwrap();
    assert_eq!(running.payload_version, 3);
    assert!(fail(h, lease(running), FailNext::Dead, None).await);
    let comp = compensation_of(h, task.id).await;
    assert_eq!(comp.len(), 1);
    assert_eq!(comp[0].payload, task.payload);
    assert_eq!(comp[0].payload_version, 3);
    // The compensation waits for a worker that knows version 3, like its parent.
    assert!(claim_offering(h, "w2", &[(TaskOpts::TYPE, 2)])
        .await
        .is_empty());
    assert_eq!(
        claim_offering(h, "w3", &[(TaskOpts::TYPE, 3)]).await,
        vec![comp[0].id]
    );
}

pub async fn retrying_a_stale_compensation_is_refused(h: &Harness) {
    // The task dies and so does its compensation; an operator retries the task, which
    // then succeeds. Retrying the old compensation now would undo a task that succeeded.
    h.task(TaskOpts {
        task_no: Some("STALE".into()),
        ..Default::default()
    })
    .await;
    let task = h.claim("w1", 1, None).await.remove(0);
    assert!(fail(h, lease(&task), FailNext::Dead, None).await);
    let comp = h.claim("w1", 1, None).await.remove(0);
    assert_eq!(comp.kind, TaskKind::Compensate);
    assert!(comp.task_no.as_str().starts_with("STALE:compensate:"));
    assert!(fail(h, lease(&comp), FailNext::Dead, None).await);
    let retry = |id| TaskActionParams {
        task: TaskRef::Id(id),
        now: None,
    };
    h.storage.task_retry(&retry(task.id)).await.unwrap();
    let again = h.claim("w1", 1, None).await.remove(0);
    assert_eq!(again.id, task.id);
    assert!(complete(h, lease(&again)).await);
    let err = h.storage.task_retry(&retry(comp.id)).await.unwrap_err();
    assert!(matches!(err, StorageError::InvalidState { .. }), "{err}");
    assert_eq!(
        status_of(h, comp.id).await,
        TaskStatus::Dead,
        "nothing changed"
    );
    assert_eq!(status_of(h, task.id).await, TaskStatus::Succeeded);
}
