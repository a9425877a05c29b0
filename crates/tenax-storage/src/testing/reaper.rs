//! Conformance cases for the reaper: expired leases are retried or killed on the
//! database clock, across clock steps, and never against a completion.
use std::collections::HashMap;
use std::time::Duration;

use tenax_core::{AttemptOutcome, TaskStatus};

use super::compensation::compensation_of;
use super::conformance::{complete, later, lease, reap, status_of};
use super::{Harness, TaskOpts};
use crate::{LeaseExtendParams, TaskActionParams, TaskReapParams, TaskRef};

pub async fn reaper_retries_or_kills_expired_leases(h: &Harness) {
    h.task(TaskOpts {
        max_attempts: 1,
        task_no: Some("LAST".into()),
        ..Default::default()
    })
    .await;
    h.task(TaskOpts {
        max_attempts: 3,
        task_no: Some("MORE".into()),
        ..Default::default()
    })
    .await;
    let claimed = h.claim("w1", 2, None).await;
    assert_eq!(claimed.len(), 2);
    let now = h.storage.now().await.unwrap();
    // Not yet expired: nothing happens.
    assert!(reap(h, later(now, 29)).await.is_empty());
    let mut reaped = reap(h, later(now, 31)).await;
    reaped.sort_by_key(|r| r.id);
    let by_no: HashMap<_, _> = claimed
        .iter()
        .map(|t| (t.id, t.task_no.as_str().to_owned()))
        .collect();
    for r in &reaped {
        match by_no[&r.id].as_str() {
            "LAST" => assert_eq!(r.status, TaskStatus::Dead),
            _ => assert_eq!(r.status, TaskStatus::Retrying),
        }
    }
    assert_eq!(reaped.len(), 2);
    let last = claimed
        .iter()
        .find(|t| t.task_no.as_str() == "LAST")
        .unwrap();
    let dead = h
        .storage
        .task_get(&TaskRef::Id(last.id))
        .await
        .unwrap()
        .unwrap();
    assert!(dead.last_error.unwrap().contains("lease expired"));
    assert_eq!(compensation_of(h, last.id).await.len(), 1);
    let attempts = h.storage.task_attempts(last.id).await.unwrap();
    assert_eq!(attempts[0].outcome, AttemptOutcome::LeaseExpired);
    // Reaping again finds nothing.
    assert!(reap(h, later(now, 32)).await.is_empty());
}

/// After the database clock steps back, a lease granted before the step expires the
/// step too late. The reaper names such leases with `expires_beyond`; a lease renewed
/// since the step expires within a TTL and is left alone, and so is one granted after
/// the reaper read the clock (it read it, then waited 5 s for its connection).
pub async fn reaper_takes_leases_granted_before_a_clock_step_back(h: &Harness) {
    for task_no in ["BEFORE", "RENEWED", "AFTER"] {
        h.task(TaskOpts {
            max_attempts: 3,
            task_no: Some(task_no.into()),
            ..Default::default()
        })
        .await;
    }
    // Leases of 30 s, granted while the database's clock was an hour ahead.
    let ahead = h.storage.now().await.unwrap() + chrono::Duration::hours(1);
    let claimed = h.claim("w1", 2, Some(ahead)).await;
    assert_eq!(claimed.len(), 2);
    let by_no = |no: &str| {
        claimed
            .iter()
            .find(|t| t.task_no.as_str() == no)
            .unwrap()
            .clone()
    };
    let (before, renewed) = (by_no("BEFORE"), by_no("RENEWED"));
    // The clock steps back to the right time. The reaper reads it (5 s before its
    // statement runs); then one worker renews its lease and another claims a task.
    let read = h.storage.now().await.unwrap() - chrono::Duration::seconds(5);
    let extended = h
        .storage
        .lease_extend(&LeaseExtendParams {
            leases: vec![lease(&renewed)],
            lease_ttl: Duration::from_secs(30),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(extended, vec![lease(&renewed)]);
    let after = h.claim("w2", 1, None).await.remove(0);
    assert_eq!(after.task_no.as_str(), "AFTER");
    // By the stepped clock no lease has expired.
    assert!(reap(h, Some(read)).await.is_empty());
    let reaped = h
        .storage
        .task_reap_expired(&TaskReapParams {
            limit: 100,
            now: Some(read),
            expires_beyond: later(read, 31),
        })
        .await
        .unwrap();
    assert_eq!(
        reaped,
        vec![crate::ReapedTask {
            id: before.id,
            status: TaskStatus::Retrying,
        }]
    );
    for left in [renewed.id, after.id] {
        assert_eq!(status_of(h, left).await, TaskStatus::Running);
    }
}

pub async fn reaper_never_undoes_a_completion(h: &Harness) {
    // river#1302: a reaper that read a stuck task must not move it after the worker
    // completed it. The expiry is re-checked inside the write.
    h.task(TaskOpts::default()).await;
    let task = h.claim("w1", 1, None).await.remove(0);
    assert!(complete(h, lease(&task)).await);
    let now = h.storage.now().await.unwrap();
    assert!(reap(h, later(now, 3600)).await.is_empty());
    assert_eq!(status_of(h, task.id).await, TaskStatus::Succeeded);
}

pub async fn reaper_racing_a_completion_never_both_win(h: &Harness) {
    let other = h.reopen().await;
    for round in 0..20 {
        h.task(TaskOpts::default()).await;
        let task = h.claim("w1", 1, None).await.remove(0);
        let far = later(h.storage.now().await.unwrap(), 3600);
        let reaper = other.clone();
        let reap = tokio::spawn(async move {
            reaper
                .task_reap_expired(&TaskReapParams {
                    limit: 10,
                    now: far,
                    expires_beyond: None,
                })
                .await
        });
        let completed = complete(h, lease(&task)).await;
        let reaped = reap.await.unwrap().unwrap();
        let was_reaped = reaped.iter().any(|r| r.id == task.id);
        assert!(
            completed != was_reaped,
            "round {round}: completed {completed}, reaped {was_reaped}"
        );
        let expected = if completed {
            TaskStatus::Succeeded
        } else {
            TaskStatus::Retrying
        };
        assert_eq!(status_of(h, task.id).await, expected, "round {round}");
        if !completed {
            // Leave nothing claimable for the next round.
            h.storage
                .task_cancel(&TaskActionParams {
                    task: TaskRef::Id(task.id),
                    now: None,
                })
                .await
                .unwrap();
        }
    }
}
