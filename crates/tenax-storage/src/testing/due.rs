//! Conformance case for [`Storage::task_due_count`](crate::Storage::task_due_count).
use std::time::Duration;

use chrono::TimeDelta;

use super::{Harness, TaskOpts};
use crate::{RunAt, TaskDueCountParams};

fn params(limit: u32, version: u32) -> TaskDueCountParams {
    TaskDueCountParams {
        queues: vec!["default".to_owned()],
        command_type: TaskOpts::TYPE.to_owned(),
        version,
        limit,
        now: None,
    }
}

/// Only due waiting tasks of the type, queue and known versions count, at most the
/// limit; the oldest due run time is reported with the database's now.
pub async fn due_count_counts_due_tasks_of_one_type_up_to_a_limit(h: &Harness) {
    let empty = h.storage.task_due_count(&params(10, 1)).await.unwrap();
    assert_eq!((empty.due, empty.oldest_due_at), (0, None));
    let now = h.storage.now().await.unwrap();
    assert!((empty.now - now).num_seconds().abs() < 5, "{empty:?}");

    let oldest = now - TimeDelta::seconds(30);
    for age in [30, 20, 10] {
        h.task(TaskOpts {
            run_at: RunAt::At(now - TimeDelta::seconds(age)),
            ..Default::default()
        })
        .await;
    }
    // Not counted: another type, another queue, a newer payload version, not yet due,
    // running.
    h.task(TaskOpts {
        command_type: "OTHER_TYPE".into(),
        run_at: RunAt::At(now - TimeDelta::seconds(60)),
        ..Default::default()
    })
    .await;
    h.task(TaskOpts {
        queue: "elsewhere".into(),
        run_at: RunAt::At(now - TimeDelta::seconds(60)),
        ..Default::default()
    })
    .await;
    h.task(TaskOpts {
        payload_version: 2,
        run_at: RunAt::At(now - TimeDelta::seconds(60)),
        ..Default::default()
    })
    .await;
    h.task(TaskOpts {
        run_at: RunAt::In(Duration::from_secs(3600)),
        ..Default::default()
    })
    .await;

    let found = h.storage.task_due_count(&params(10, 1)).await.unwrap();
    assert_eq!(found.due, 3, "{found:?}");
    let at = found.oldest_due_at.expect("an oldest due task");
    assert!(
        (at - oldest).num_milliseconds().abs() <= 1,
        "{at} vs {oldest}"
    );
    // The limit caps the count, not the oldest.
    let capped = h.storage.task_due_count(&params(2, 1)).await.unwrap();
    assert_eq!(capped.due, 2);
    assert_eq!(capped.oldest_due_at, found.oldest_due_at);
    // A worker that knows version 2 counts the newer task too (the oldest, at -60 s).
    let newer = h.storage.task_due_count(&params(10, 2)).await.unwrap();
    assert_eq!(newer.due, 4);
    // A claimed task is running, not due.
    let claimed = h.claim("w1", 1, None).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(
        h.storage.task_due_count(&params(10, 1)).await.unwrap().due,
        2
    );
    // With the clock moved an hour on, the delayed task is due as well.
    let mut later = params(10, 1);
    later.now = Some(now + TimeDelta::seconds(3601));
    let found = h.storage.task_due_count(&later).await.unwrap();
    assert_eq!(found.due, 3);
    assert_eq!(found.now, now + TimeDelta::seconds(3601));
    // No queue: nothing counted.
    let mut none = params(10, 1);
    none.queues.clear();
    assert_eq!(h.storage.task_due_count(&none).await.unwrap().due, 0);
}
