//! Conformance cases for what the metrics sampler reads.
use std::time::Duration;

use chrono::{DateTime, Utc};
use tenax_core::TaskStatus;

use super::{Harness, TaskOpts};
use crate::{QueueStatsParams, RunAt};

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
