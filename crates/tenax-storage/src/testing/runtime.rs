//! Conformance cases for runtime support: the next run time workers arm their timers
//! for, queue backlogs, cancel requests for running tasks, and the start-time filter.
use std::time::Duration;

use chrono::{DateTime, Utc};
use tenax_core::{CompensationState, TaskStatus};

use super::{Harness, TaskOpts};
use crate::{
    CancelRequestedParams, FailNext, Lease, QueueBacklog, QueueBacklogParams, RunAt,
    TaskActionParams, TaskCompleteParams, TaskFailParams, TaskListParams, TaskNextRunParams,
    TaskRef,
};

fn at(base: DateTime<Utc>, secs: i64) -> DateTime<Utc> {
    base + chrono::Duration::seconds(secs)
}

fn lease(task: &tenax_core::TaskRecord) -> Lease {
    Lease {
        id: task.id,
        epoch: task.lease_epoch,
    }
}

/// The leases among `leases` whose task has a cancel request.
pub(super) async fn requested(h: &Harness, leases: &[Lease]) -> Vec<Lease> {
    h.storage
        .task_cancel_requested(&CancelRequestedParams {
            leases: leases.to_vec(),
        })
        .await
        .unwrap()
}

async fn cancel(h: &Harness, task: &tenax_core::TaskRecord) -> tenax_core::TaskRecord {
    h.storage
        .task_cancel(&TaskActionParams {
            task: TaskRef::Id(task.id),
            now: None,
        })
        .await
        .unwrap()
}

async fn fail(h: &Harness, lease: Lease, next: FailNext) -> bool {
    h.storage
        .task_fail_if_leased(&TaskFailParams {
            lease,
            error: "stopped".into(),
            next,
            now: None,
        })
        .await
        .unwrap()
}

async fn get(h: &Harness, task: &tenax_core::TaskRecord) -> tenax_core::TaskRecord {
    h.storage
        .task_get(&TaskRef::Id(task.id))
        .await
        .unwrap()
        .unwrap()
}

pub async fn next_run_at_is_the_earliest_future_task_the_worker_could_claim(h: &Harness) {
    let now = h.storage.now().await.unwrap();
    let params = |queues: &[&str], version: u32| TaskNextRunParams {
        queues: queues.iter().map(|q| (*q).to_owned()).collect(),
        commands: vec![(TaskOpts::TYPE.to_owned(), version)],
        since: Duration::ZERO,
        now: Some(now),
    };
    let next = |p: TaskNextRunParams| async move {
        let found = h.storage.task_next_run_at(&p).await.unwrap();
        if let (Some(found), Some(now)) = (found, p.now) {
            assert_eq!(found.now, now, "the clock the answer was read at");
        }
        found.map(|n| n.run_at)
    };
    assert_eq!(next(params(&["default"], 1)).await, None);
    // Due tasks are the claim's business, not the timer's.
    h.task(TaskOpts {
        run_at: RunAt::At(at(now, -1)),
        ..Default::default()
    })
    .await;
    let later = |secs: i64| TaskOpts {
        run_at: RunAt::At(at(now, secs)),
        ..Default::default()
    };
    h.task(later(60)).await;
    h.task(TaskOpts {
        priority: 9,
        ..later(40)
    })
    .await;
    h.task(TaskOpts {
        queue: "other".into(),
        ..later(10)
    })
    .await;
    h.task(TaskOpts {
        command_type: "UNKNOWN".into(),
        ..later(5)
    })
    .await;
    h.task(TaskOpts {
        payload_version: 2,
        ..later(20)
    })
    .await;
    let cancelled = h.task(later(30)).await;
    cancel(h, &cancelled).await;
    assert_eq!(
        next(params(&["default"], 1)).await,
        Some(at(now, 40)),
        "the earliest future run of a known type and version in the worker's queues, any priority"
    );
    assert_eq!(next(params(&["default"], 2)).await, Some(at(now, 20)));
    assert_eq!(
        next(params(&["default", "other"], 1)).await,
        Some(at(now, 10))
    );
    assert_eq!(next(params(&[], 1)).await, None);
    let mut nothing = params(&["default"], 1);
    nothing.commands.clear();
    assert_eq!(next(nothing).await, None);
    // Once that time has come, the next one is reported...
    let mut moved = params(&["default"], 1);
    moved.now = Some(at(now, 40));
    assert_eq!(next(moved.clone()).await, Some(at(now, 60)));
    // ...unless it fell due since the caller's last claim: then it is reported, due.
    moved.since = Duration::from_millis(1500);
    assert_eq!(next(moved.clone()).await, Some(at(now, 40)));
    moved.now = Some(at(now, 42));
    assert_eq!(next(moved).await, Some(at(now, 60)));
}

pub async fn queue_backlog_counts_due_tasks_per_queue(h: &Harness) {
    let now = h.storage.now().await.unwrap();
    for (queue, secs) in [
        ("default", -30),
        ("default", -10),
        ("default", 60),
        ("bulk", -5),
    ] {
        h.task(TaskOpts {
            queue: queue.into(),
            run_at: RunAt::At(at(now, secs)),
            ..Default::default()
        })
        .await;
    }
    // A claimed task is not backlog.
    h.task(TaskOpts {
        queue: "bulk".into(),
        run_at: RunAt::At(at(now, -100)),
        ..Default::default()
    })
    .await;
    let mut claim = super::claim_params("w1", 1, Some(now));
    claim.queues = vec!["bulk".into()];
    assert_eq!(h.storage.task_claim_batch(&claim).await.unwrap().len(), 1);
    let backlog = h
        .storage
        .queue_backlog(&QueueBacklogParams {
            queues: vec!["default".into(), "empty".into(), "bulk".into()],
            now: Some(now),
        })
        .await
        .unwrap();
    assert_eq!(
        backlog,
        vec![
            QueueBacklog {
                queue: "default".into(),
                due: 2,
                oldest_due_at: Some(at(now, -30)),
            },
            QueueBacklog {
                queue: "empty".into(),
                due: 0,
                oldest_due_at: None,
            },
            QueueBacklog {
                queue: "bulk".into(),
                due: 1,
                oldest_due_at: Some(at(now, -5)),
            },
        ]
    );
}

pub async fn a_cancel_request_on_a_running_task_ends_it_cancelled(h: &Harness) {
    for next in [
        FailNext::Retry(Duration::from_secs(60)),
        FailNext::HandBack,
        FailNext::Cancelled,
    ] {
        let task = h.task(TaskOpts::default()).await;
        let running = h.claim("w1", 1, None).await.remove(0);
        assert_eq!(running.id, task.id);
        let other = {
            h.task(TaskOpts::default()).await;
            h.claim("w1", 1, None).await.remove(0)
        };
        assert!(requested(h, &[lease(&running), lease(&other)])
            .await
            .is_empty());
        let answer = cancel(h, &running).await;
        assert_eq!(answer.status, TaskStatus::Running, "{next:?}");
        // Asking twice is harmless.
        cancel(h, &running).await;
        assert_eq!(
            requested(h, &[lease(&running), lease(&other)]).await,
            vec![lease(&running)],
            "only the cancelled task, under its current epoch"
        );
        let stale = Lease {
            epoch: running.lease_epoch - 1,
            ..lease(&running)
        };
        assert!(requested(h, &[stale]).await.is_empty());
        assert!(fail(h, lease(&running), next).await, "{next:?}");
        let done = get(h, &running).await;
        assert_eq!(done.status, TaskStatus::Cancelled, "{next:?}");
        assert!(done.finished_at.is_some());
        assert_eq!((done.lease_owner, done.lease_expires_at), (None, None));
        assert!(tenax_core::state::is_legal(
            TaskStatus::Running,
            TaskStatus::Cancelled
        ));
        // Never claimed again, and the other task is untouched.
        assert!(h
            .claim("w2", 10, Some(at(done.updated_at, 3600)))
            .await
            .is_empty());
        assert_eq!(get(h, &other).await.status, TaskStatus::Running);
        assert!(h
            .storage
            .task_complete_if_leased(&TaskCompleteParams {
                lease: lease(&other),
                result: None,
                compensation: CompensationState::Succeeded,
                now: None,
            })
            .await
            .unwrap());
    }
    // A stale worker's write after the cancel changes nothing.
    let task = h.task(TaskOpts::default()).await;
    let running = h.claim("w1", 1, None).await.remove(0);
    assert_eq!(running.id, task.id);
    cancel(h, &running).await;
    assert!(fail(h, lease(&running), FailNext::Cancelled).await);
    assert!(!fail(h, lease(&running), FailNext::Cancelled).await);
}

pub async fn a_cancel_request_does_not_undo_a_success_or_a_permanent_failure(h: &Harness) {
    h.task(TaskOpts::default()).await;
    let running = h.claim("w1", 1, None).await.remove(0);
    cancel(h, &running).await;
    // The handler finished its work before it noticed: the truth is that it succeeded.
    assert!(h
        .storage
        .task_complete_if_leased(&TaskCompleteParams {
            lease: lease(&running),
            result: Some("1".into()),
            compensation: CompensationState::Succeeded,
            now: None,
        })
        .await
        .unwrap());
    assert_eq!(get(h, &running).await.status, TaskStatus::Succeeded);
    // A permanent failure is a failure: the task dies and its compensation is scheduled.
    h.task(TaskOpts::default()).await;
    let running = h.claim("w1", 1, None).await.remove(0);
    cancel(h, &running).await;
    assert!(fail(h, lease(&running), FailNext::Dead).await);
    let dead = get(h, &running).await;
    assert_eq!(dead.status, TaskStatus::Dead);
    assert_eq!(dead.compensation, Some(CompensationState::Pending));
}

pub async fn list_filters_tasks_started_before_an_instant(h: &Harness) {
    let t0 = h.storage.now().await.unwrap();
    h.task(TaskOpts::default()).await;
    let old = h.claim("w1", 1, Some(at(t0, 1))).await.remove(0);
    h.task(TaskOpts::default()).await;
    let recent = h.claim("w1", 1, Some(at(t0, 600))).await.remove(0);
    let waiting = h.task(TaskOpts::default()).await;
    let list = |started_before: Option<DateTime<Utc>>| async move {
        h.storage
            .task_list(&TaskListParams {
                status: Some(TaskStatus::Running),
                started_before,
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.id)
            .collect::<Vec<_>>()
    };
    // Running longer than 10 minutes at t0 + 11 min: only the one started at t0 + 1 s.
    assert_eq!(list(Some(at(t0, 60))).await, vec![old.id]);
    assert_eq!(list(Some(at(t0, 3600))).await, vec![recent.id, old.id]);
    assert_eq!(list(None).await, vec![recent.id, old.id]);
    let all = h
        .storage
        .task_list(&TaskListParams {
            started_before: Some(at(t0, 3600)),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(all.iter().all(|t| t.id != waiting.id), "never started");
}

pub async fn an_expired_lease_with_a_cancel_request_is_reaped_cancelled(h: &Harness) {
    // Two tasks whose workers died: one with a cancel request, one without.
    for max_attempts in [1, 5] {
        h.task(TaskOpts {
            max_attempts,
            ..Default::default()
        })
        .await;
    }
    let claimed = h.claim("w1", 2, None).await;
    assert_eq!(claimed.len(), 2);
    for task in &claimed {
        cancel(h, task).await;
    }
    h.task(TaskOpts::default()).await;
    let other = h.claim("w1", 1, None).await.remove(0);
    let far = Some(at(h.storage.now().await.unwrap(), 3600));
    let reaped = h
        .storage
        .task_reap_expired(&crate::TaskReapParams {
            limit: 10,
            now: far,
            expires_beyond: None,
        })
        .await
        .unwrap();
    assert_eq!(reaped.len(), 3);
    for task in &claimed {
        // Cancelled, not retried and (on its last attempt) not dead: no compensation.
        let done = get(h, task).await;
        assert_eq!(
            done.status,
            TaskStatus::Cancelled,
            "max {}",
            done.max_attempts
        );
        assert!(done.finished_at.is_some());
        assert_eq!(done.compensation, None);
        assert!(reaped
            .iter()
            .any(|r| r.id == task.id && r.status == TaskStatus::Cancelled));
    }
    assert_eq!(get(h, &other).await.status, TaskStatus::Retrying);
    assert_eq!(
        h.claim("w2", 10, far).await.len(),
        1,
        "only the other task runs again"
    );
}
