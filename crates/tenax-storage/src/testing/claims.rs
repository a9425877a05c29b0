//! Conformance cases for the claim controls: priority aging.
use chrono::{DateTime, Utc};
use tenax_core::{CompensationState, Priority, TaskRecord, PRIORITY_AGING_STEP};

use super::{Harness, TaskOpts};
use crate::{Lease, RunAt, TaskCompleteParams};

fn step() -> chrono::Duration {
    chrono::Duration::from_std(PRIORITY_AGING_STEP).unwrap()
}

async fn finish(h: &Harness, task: &TaskRecord) {
    let done = h
        .storage
        .task_complete_if_leased(&TaskCompleteParams {
            lease: Lease {
                id: task.id,
                epoch: task.lease_epoch,
            },
            result: None,
            compensation: CompensationState::Succeeded,
            now: None,
        })
        .await
        .unwrap();
    assert!(done);
}

async fn due_at(h: &Harness, priority: u8, at: DateTime<Utc>) -> TaskRecord {
    h.task(TaskOpts {
        priority,
        run_at: RunAt::At(at),
        ..Default::default()
    })
    .await
}

/// One priority level is worth exactly one `PRIORITY_AGING_STEP` of waiting: a task one
/// level more urgent goes first if it became due less than a step later, and after
/// otherwise.
pub async fn priority_is_worth_one_aging_step_per_level(h: &Harness) {
    let t0 = h.storage.now().await.unwrap();
    let second = chrono::Duration::seconds(1);
    let older = due_at(h, 4, t0).await;
    let just_inside = due_at(h, 5, t0 + step() - second).await;
    let just_outside = due_at(h, 5, t0 + step() + second).await;
    let claimed = h.claim("w1", 10, Some(t0 + step() * 2)).await;
    let ids: Vec<_> = claimed.iter().map(|t| t.id).collect();
    assert_eq!(ids, vec![just_inside.id, older.id, just_outside.id]);
    // One at a time, the order is the same.
    for task in &claimed {
        finish(h, task).await;
    }
    let a = due_at(h, 4, t0).await;
    let b = due_at(h, 5, t0 + step() - second).await;
    let c = due_at(h, 5, t0 + step() + second).await;
    let mut one_by_one = Vec::new();
    for _ in 0..3 {
        let got = h.claim("w1", 1, Some(t0 + step() * 2)).await;
        assert_eq!(got.len(), 1);
        one_by_one.push(got[0].id);
    }
    assert_eq!(one_by_one, vec![b.id, a.id, c.id]);
    // A task not yet due is never claimed, however urgent.
    let later = due_at(h, 9, t0 + step() * 3).await;
    assert!(h.claim("w1", 10, Some(t0 + step() * 2)).await.is_empty());
    let got = h.claim("w1", 10, Some(t0 + step() * 3)).await;
    assert_eq!(got.iter().map(|t| t.id).collect::<Vec<_>>(), vec![later.id]);
}

/// Starvation: workers that serve one task per tick while one priority-9 task arrives
/// per tick (a backlog that never shrinks) still start a priority-0 task within
/// `Priority::aging_bound()` (9 × STEP) plus the time to drain the backlog that was ahead
/// of it. Time is injected through the `now` overrides.
pub async fn a_low_priority_task_starts_within_the_aging_bound_under_a_flood(h: &Harness) {
    let tick = chrono::Duration::seconds(30);
    let backlog = 5;
    let t0 = h.storage.now().await.unwrap();
    for _ in 0..backlog {
        due_at(h, 9, t0 - tick).await;
    }
    let low = due_at(h, 0, t0).await;
    let bound = t0
        + chrono::Duration::from_std(Priority::MIN.aging_bound()).unwrap()
        + tick * (backlog + 1);
    let mut now = t0;
    let mut urgent_started = 0;
    let started = loop {
        assert!(
            now <= bound,
            "the priority-0 task has not started {}s after it was due (bound {}s); \
             {urgent_started} urgent tasks ran meanwhile",
            (now - t0).num_seconds(),
            (bound - t0).num_seconds()
        );
        due_at(h, 9, now).await;
        let claimed = h.claim("w1", 1, Some(now)).await;
        assert_eq!(claimed.len(), 1, "a task is due at every tick");
        finish(h, &claimed[0]).await;
        if claimed[0].id == low.id {
            break now;
        }
        assert_eq!(claimed[0].priority.get(), 9);
        urgent_started += 1;
        now += tick;
    };
    // It had to wait for the flood at first: aging, not an empty queue, let it in.
    assert!(
        started >= t0 + chrono::Duration::from_std(Priority::MIN.aging_bound()).unwrap(),
        "started after {}s, before the urgent tasks stopped overtaking it",
        (started - t0).num_seconds()
    );
    assert!(urgent_started > backlog);
}
