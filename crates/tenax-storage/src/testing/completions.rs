//! Conformance cases for batched completions
//! ([`Storage::task_complete_many_if_leased`](crate::Storage::task_complete_many_if_leased)).
use chrono::{DateTime, Utc};
use tenax_core::{AttemptOutcome, CompensationState, TaskId, TaskKind, TaskRecord, TaskStatus};

use super::workflows::workflow;
use super::{Harness, TaskOpts};
use crate::{
    BatchCompletion, FailNext, Lease, StorageError, TaskCompleteParams, TaskFailParams,
    TaskListParams, TaskReapParams, TaskRef, WorkflowKind, WorkflowPolicy,
};

fn lease(task: &TaskRecord) -> Lease {
    Lease {
        id: task.id,
        epoch: task.lease_epoch,
    }
}

fn done(lease: Lease, result: &str) -> TaskCompleteParams {
    TaskCompleteParams {
        lease,
        result: Some(result.to_owned()),
        compensation: CompensationState::Succeeded,
        now: None,
    }
}

async fn get(h: &Harness, id: TaskId) -> TaskRecord {
    h.storage
        .task_get(&TaskRef::Id(id))
        .await
        .unwrap()
        .expect("task exists")
}

async fn last_attempt(h: &Harness, id: TaskId) -> (i64, AttemptOutcome) {
    let attempts = h.storage.task_attempts(id).await.unwrap();
    let last = attempts.last().expect("an attempt");
    (last.epoch, last.outcome)
}

fn later(now: DateTime<Utc>, secs: i64) -> Option<DateTime<Utc>> {
    Some(now + chrono::Duration::seconds(secs))
}

/// A mixed batch: valid leases land with their results and closed attempts; a stale
/// epoch, a cancelled task, an already finished task and a lease named twice change
/// nothing and are answered `false`, in the order given.
pub async fn a_completion_batch_lands_exactly_where_the_lease_holds(h: &Harness) {
    for _ in 0..5 {
        h.task(TaskOpts::default()).await;
    }
    let claimed = h.claim("w1", 5, None).await;
    assert_eq!(claimed.len(), 5);
    let (a, b, stale, cancelled, finished) = (
        &claimed[0],
        &claimed[1],
        &claimed[2],
        &claimed[3],
        &claimed[4],
    );
    // `stale` is reaped and claimed again: its first lease is stale.
    let now = h.storage.now().await.unwrap();
    let expired = TaskReapParams {
        limit: 100,
        now: later(now, 60),
        expires_beyond: None,
    };
    h.storage.task_reap_expired(&expired).await.unwrap();
    // Every lease expired at that instant: keep only `stale`'s new claim running; the
    // others are claimed again too, under new epochs.
    let reclaimed = h.claim("w2", 5, later(now, 61)).await;
    assert_eq!(reclaimed.len(), 5);
    let current = |t: &TaskRecord| {
        reclaimed
            .iter()
            .find(|r| r.id == t.id)
            .expect("claimed again")
            .clone()
    };
    let (a, b, cancelled, finished) = (
        current(a),
        current(b),
        current(cancelled),
        current(finished),
    );
    let stale_now = current(stale);
    assert_eq!(stale_now.lease_epoch, stale.lease_epoch + 1);
    assert!(h
        .storage
        .task_fail_if_leased(&TaskFailParams {
            lease: lease(&cancelled),
            error: "stopped".into(),
            next: FailNext::Cancelled,
            now: None,
        })
        .await
        .unwrap());
    assert!(h
        .storage
        .task_complete_if_leased(&done(lease(&finished), "\"first\""))
        .await
        .unwrap());

    let batch = [
        done(lease(&a), "\"a\""),
        done(lease(stale), "\"stale\""),
        done(lease(&cancelled), "\"cancelled\""),
        done(lease(&b), "\"b\""),
        done(lease(&finished), "\"again\""),
        done(lease(&a), "\"a twice\""),
    ];
    let landed = h
        .storage
        .task_complete_many_if_leased(&batch)
        .await
        .unwrap();
    use BatchCompletion::{Landed, Lost};
    assert_eq!(landed, [Landed, Lost, Lost, Landed, Lost, Lost]);

    for (task, result) in [(&a, "\"a\""), (&b, "\"b\"")] {
        let got = get(h, task.id).await;
        assert_eq!(got.status, TaskStatus::Succeeded);
        assert_eq!(got.result.as_deref(), Some(result));
        assert!(got.finished_at.is_some());
        assert!(got.lease_owner.is_none() && got.lease_expires_at.is_none());
        assert_eq!(
            last_attempt(h, task.id).await,
            (task.lease_epoch, AttemptOutcome::Succeeded)
        );
    }
    // The stale completion changed nothing: the new lease still runs, its attempt open.
    let got = get(h, stale.id).await;
    assert_eq!(got.status, TaskStatus::Running);
    assert_eq!(got.lease_epoch, stale_now.lease_epoch);
    assert!(got.result.is_none());
    assert_eq!(
        last_attempt(h, stale.id).await,
        (stale_now.lease_epoch, AttemptOutcome::Running)
    );
    let got = get(h, cancelled.id).await;
    assert_eq!(got.status, TaskStatus::Cancelled);
    assert!(got.result.is_none());
    let got = get(h, finished.id).await;
    assert_eq!(got.result.as_deref(), Some("\"first\""));

    // The stale task's current lease still completes, alone in a batch.
    let landed = h
        .storage
        .task_complete_many_if_leased(&[done(lease(&stale_now), "\"late\"")])
        .await
        .unwrap();
    assert_eq!(landed, [Landed]);
    assert_eq!(get(h, stale.id).await.status, TaskStatus::Succeeded);
}

/// An empty batch writes nothing; one over the bound is refused before any write.
pub async fn an_empty_or_oversized_completion_batch_writes_nothing(h: &Harness) {
    assert!(h
        .storage
        .task_complete_many_if_leased(&[])
        .await
        .unwrap()
        .is_empty());
    let task = h.task(TaskOpts::default()).await;
    let claimed = h.claim("w1", 1, None).await.remove(0);
    assert_eq!(claimed.id, task.id);
    let batch = vec![done(lease(&claimed), "1"); crate::COMPLETE_MANY_MAX + 1];
    let err = h
        .storage
        .task_complete_many_if_leased(&batch)
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::Invalid(_)), "{err}");
    assert_eq!(get(h, task.id).await.status, TaskStatus::Running);
}

/// Workflow tasks and compensations in a batch next to plain tasks are either
/// completed with it, moving their dependents and recording their compensation as
/// one-task completions do, or left alone for the one-task completion; the plain task
/// lands either way, and the end state is the same.
pub async fn a_completion_batch_runs_workflow_and_compensation_effects(h: &Harness) {
    // A compensation: its task dies first, and the compensation is claimed.
    h.task(TaskOpts {
        task_no: Some("BATCH-DIES".into()),
        ..Default::default()
    })
    .await;
    let dying = h.claim("w1", 1, None).await.remove(0);
    assert!(h
        .storage
        .task_fail_if_leased(&TaskFailParams {
            lease: lease(&dying),
            error: "permanent".into(),
            next: FailNext::Dead,
            now: None,
        })
        .await
        .unwrap());
    let compensation = h.claim("w1", 1, None).await.remove(0);
    assert_eq!(compensation.kind, TaskKind::Compensate);

    let flow = workflow(
        "batch",
        WorkflowKind::Dag,
        WorkflowPolicy::CancelDependents,
        &[("a", &[]), ("b", &[]), ("c", &["a", "b"])],
    );
    let detail = h.storage.workflow_insert(&flow).await.unwrap();
    let plain = h.task(TaskOpts::default()).await;
    let claimed = h.claim("w1", 10, None).await;
    assert_eq!(claimed.len(), 3, "a, b and the plain task");
    let batch: Vec<TaskCompleteParams> = claimed.iter().map(|t| done(lease(t), "{}")).collect();
    let batch: Vec<TaskCompleteParams> = std::iter::once(TaskCompleteParams {
        lease: lease(&compensation),
        result: None,
        compensation: CompensationState::None,
        now: None,
    })
    .chain(batch)
    .collect();
    let landed = h
        .storage
        .task_complete_many_if_leased(&batch)
        .await
        .unwrap();
    assert_eq!(landed.len(), batch.len());
    for (item, answer) in batch.iter().zip(&landed) {
        let task = get(h, item.lease.id).await;
        match answer {
            BatchCompletion::Landed => assert_eq!(task.status, TaskStatus::Succeeded),
            BatchCompletion::Alone => {
                assert_ne!(task.id, plain.id, "a plain task is never left alone");
                assert_eq!(
                    task.status,
                    TaskStatus::Running,
                    "left alone: nothing written"
                );
                assert!(h.storage.task_complete_if_leased(item).await.unwrap());
            }
            BatchCompletion::Lost => panic!("every lease holds: {item:?}"),
        }
    }

    assert_eq!(get(h, plain.id).await.status, TaskStatus::Succeeded);
    let child = detail.tasks.iter().find(|t| t.key == "c").unwrap().task.id;
    assert_eq!(
        get(h, child).await.status,
        TaskStatus::Pending,
        "both parents finished in the batch: the child is due"
    );
    let parent = get(h, dying.id).await;
    assert_eq!(parent.compensation, Some(CompensationState::None));
    assert_eq!(get(h, compensation.id).await.status, TaskStatus::Succeeded);
    let waiting = h
        .storage
        .task_list(&TaskListParams {
            status: Some(TaskStatus::Pending),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(waiting.len(), 1);
    assert_eq!(waiting[0].id, child);
}

/// Each item of a batch stores its own result byte for byte (none, quotes, escapes,
/// non-ASCII, text that is not JSON) and finishes at its own time, task and attempt
/// alike.
pub async fn a_completion_batch_stores_each_result_exactly_at_each_items_time(h: &Harness) {
    let results: [Option<&str>; 5] = [
        None,
        Some(r#""quote \" backslash \\ tab \t é 😀""#),
        Some(r#"{"big":12345678901234567890,"nested":{"list":[1,2.5e300,-0.0,null]}}"#),
        Some("not json at all: ' \" \\ [1,"),
        Some(""),
    ];
    for _ in &results {
        h.task(TaskOpts::default()).await;
    }
    let claimed = h.claim("w1", 10, None).await;
    assert_eq!(claimed.len(), results.len());
    let now = h.storage.now().await.unwrap();
    let batch: Vec<TaskCompleteParams> = claimed
        .iter()
        .zip(results)
        .enumerate()
        .map(|(i, (task, result))| TaskCompleteParams {
            lease: lease(task),
            result: result.map(str::to_owned),
            compensation: CompensationState::Succeeded,
            // The first at the database's clock, the others each at its own time.
            now: (i > 0).then(|| now + chrono::Duration::seconds(i as i64 * 7)),
        })
        .collect();
    let landed = h
        .storage
        .task_complete_many_if_leased(&batch)
        .await
        .unwrap();
    assert_eq!(landed, vec![BatchCompletion::Landed; batch.len()]);
    for item in &batch {
        let task = get(h, item.lease.id).await;
        assert_eq!(task.status, TaskStatus::Succeeded);
        assert_eq!(task.result, item.result, "stored exactly");
        let finished = task.finished_at.expect("finished").timestamp_millis();
        let attempts = h.storage.task_attempts(item.lease.id).await.unwrap();
        let attempt = attempts.last().expect("an attempt");
        assert_eq!(attempt.outcome, AttemptOutcome::Succeeded);
        assert_eq!(
            attempt.finished_at.map(|at| at.timestamp_millis()),
            Some(finished),
            "the attempt closes when its task finished"
        );
        match item.now {
            Some(at) => assert_eq!(finished, at.timestamp_millis()),
            None => assert!((finished - now.timestamp_millis()).abs() < 60_000),
        }
    }
}
