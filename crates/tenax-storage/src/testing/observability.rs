//! Conformance cases for what the metrics sampler reads.
use std::time::Duration;

use chrono::{DateTime, Utc};
use tenax_core::TaskStatus;

use super::{Harness, TaskOpts};
use crate::{
    FailNext, Lease, QueueStatsParams, RunAt, TaskActionParams, TaskCompleteParams, TaskFailParams,
    TaskListFinishedParams, TaskRef,
};

/// Counts by queue and status; the backlog counts only due, unclaimed tasks, and the
/// oldest due age is measured from the oldest due `run_at` to the clock given.
pub async fn queue_stats_count_backlog_and_oldest_age_per_queue(h: &Harness) {
    let now = h.storage.now().await.unwrap();
    // A whole second an hour ago, so ages are exact on every backend's precision.
    let t0 = DateTime::<Utc>::from_timestamp(now.timestamp() - 3600, 0).unwrap();
    let at = |secs: i64| Some(t0 + chrono::Duration::seconds(secs));
    let due_default = h
        .task(TaskOpts {
            now: at(0),
            ..Default::default()
        })
        .await;
    h.task(TaskOpts {
        now: at(0),
        run_at: RunAt::In(Duration::from_secs(7200)),
        ..Default::default()
    })
    .await;
    let urgent = h
        .task(TaskOpts {
            now: at(10),
            priority: 9,
            ..Default::default()
        })
        .await;
    h.task(TaskOpts {
        now: at(30),
        queue: "mail".into(),
        ..Default::default()
    })
    .await;
    let claimed = h.claim("w1", 1, at(40)).await;
    assert_eq!(
        claimed.iter().map(|t| t.id).collect::<Vec<_>>(),
        vec![urgent.id]
    );

    let stats = h
        .storage
        .queue_stats(&QueueStatsParams { now: at(90) })
        .await
        .unwrap();
    assert_eq!(
        stats.iter().map(|q| q.queue.as_str()).collect::<Vec<_>>(),
        vec!["default", "mail"],
        "{stats:#?}"
    );
    let default = &stats[0];
    assert_eq!(default.count(TaskStatus::Pending), 2, "{default:#?}");
    assert_eq!(default.count(TaskStatus::Running), 1, "{default:#?}");
    assert_eq!(default.count(TaskStatus::Succeeded), 0, "{default:#?}");
    assert_eq!(
        default.backlog, 1,
        "only the due pending task: {default:#?}"
    );
    assert_eq!(
        default.oldest_due_age,
        Some(Duration::from_secs(90)),
        "due since t0 ({}), read at t0 + 90 s",
        due_default.run_at
    );
    let mail = &stats[1];
    assert_eq!(mail.by_status, vec![(TaskStatus::Pending, 1)]);
    assert_eq!(mail.backlog, 1);
    assert_eq!(mail.oldest_due_age, Some(Duration::from_secs(60)));

    // Before anything was due, nothing is backlog.
    let early = h
        .storage
        .queue_stats(&QueueStatsParams {
            now: Some(t0 - chrono::Duration::seconds(1)),
        })
        .await
        .unwrap();
    assert!(
        early
            .iter()
            .all(|q| q.backlog == 0 && q.oldest_due_age.is_none()),
        "{early:#?}"
    );

    // On the database clock, the due task has waited about an hour.
    let live = h
        .storage
        .queue_stats(&QueueStatsParams::default())
        .await
        .unwrap();
    let age = live[0].oldest_due_age.expect("a due task");
    assert!(
        age >= Duration::from_secs(3590) && age < Duration::from_secs(3700),
        "{age:?}"
    );
}

/// Succeeded and dead tasks since an instant, the latest to finish first; waiting and
/// cancelled tasks are left out, and the limit holds.
pub async fn finished_tasks_are_listed_latest_first_since_an_instant(h: &Harness) {
    let now = h.storage.now().await.unwrap();
    // Whole seconds, so the order is exact on every backend's precision.
    let t0 = DateTime::<Utc>::from_timestamp(now.timestamp() - 600, 0).unwrap();
    let at = |secs: i64| Some(t0 + chrono::Duration::seconds(secs));
    for n in 0..4 {
        h.task(TaskOpts {
            task_no: Some(format!("finished-{n}")),
            now: at(0),
            ..Default::default()
        })
        .await;
    }
    let claimed = h.claim("w", 2, at(1)).await;
    assert_eq!(claimed.len(), 2);
    let lease = |i: usize| Lease {
        id: claimed[i].id,
        epoch: claimed[i].lease_epoch,
    };
    assert!(h
        .storage
        .task_complete_if_leased(&TaskCompleteParams {
            lease: lease(0),
            result: None,
            compensation: tenax_core::CompensationState::None,
            now: at(2),
        })
        .await
        .unwrap());
    assert!(h
        .storage
        .task_fail_if_leased(&TaskFailParams {
            lease: lease(1),
            error: "permanent".into(),
            next: FailNext::Dead,
            now: at(3),
        })
        .await
        .unwrap());
    let waiting = h
        .storage
        .task_get(&TaskRef::No(tenax_core::TaskNo::new("finished-2").unwrap()))
        .await
        .unwrap()
        .unwrap();
    h.storage
        .task_cancel(&TaskActionParams {
            task: TaskRef::Id(waiting.id),
            now: at(4),
        })
        .await
        .unwrap();
    let list = |since: i64, limit: u32| {
        let storage = h.storage.clone();
        async move {
            storage
                .task_list_finished(&TaskListFinishedParams {
                    since: t0 + chrono::Duration::seconds(since),
                    limit,
                })
                .await
                .unwrap()
                .into_iter()
                .map(|t| (t.id, t.status))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        list(0, 10).await,
        [
            (claimed[1].id, TaskStatus::Dead),
            (claimed[0].id, TaskStatus::Succeeded)
        ]
    );
    assert_eq!(list(0, 1).await, [(claimed[1].id, TaskStatus::Dead)]);
    assert_eq!(list(3, 10).await, [(claimed[1].id, TaskStatus::Dead)]);
    assert!(list(5, 10).await.is_empty());
}
