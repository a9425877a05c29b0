//! The conformance cases: what every [`Storage`](crate::Storage) method means, checked the same way on
//! every backend. Each case takes a fresh, migrated [`Harness`].
use std::time::Duration;

use chrono::{DateTime, Utc};
use tenax_core::{AttemptOutcome, CompensationState, TaskId, TaskStatus};

pub use super::alert_state::*;
pub use super::bulk::*;
pub use super::bulk_insert::{
    a_bulk_insert_of_ten_thousand_reports_new_existing_and_conflicts,
    an_all_or_nothing_bulk_insert_commits_only_what_its_decision_accepts,
    an_invalid_task_in_a_bulk_insert_inserts_nothing,
    concurrent_bulk_inserts_of_the_same_numbers_make_each_task_once,
    the_record_an_insert_answers_is_the_stored_record,
};
pub use super::claims::*;
pub use super::compensation::*;
pub use super::completions::*;
pub use super::due::*;
pub use super::events::*;
pub use super::inserts::*;
pub use super::keys::*;
pub use super::observability::*;
pub use super::outbox::*;
pub use super::outcomes::*;
pub use super::prune::{
    a_prune_keeps_the_side_rows_live_tasks_need,
    keyed_claims_racing_the_side_prune_never_pass_a_key_limit,
    pruned_tasks_leave_no_side_rows_behind,
};
pub use super::queues::*;
pub use super::races::*;
pub use super::rates::*;
pub use super::reaper::*;
pub use super::redrive::*;
pub use super::runtime::*;
pub use super::workflows::{
    a_child_waits_blocked_until_all_its_parents_succeeded,
    a_dead_or_cancelled_parent_cancels_its_dependents_transitively,
    a_saga_compensates_the_steps_before_a_dead_step_in_reverse_order, a_task_names_its_workflow,
    bulk_cancel_of_a_workflow_task_cancels_its_dependents,
    cycles_and_unknown_references_are_refused_and_insert_nothing,
    fan_out_and_fan_in_with_a_thousand_children_stay_efficient,
    with_run_anyway_dependents_run_once_every_parent_finished,
};
use super::{claim_params, Harness, TaskOpts};
use crate::{
    FailNext, Lease, LeaseExtendParams, RunAt, StorageError, TaskActionParams, TaskCompleteParams,
    TaskFailParams, TaskPruneParams, TaskReapParams, TaskRef,
};

pub(super) fn lease(task: &tenax_core::TaskRecord) -> Lease {
    Lease {
        id: task.id,
        epoch: task.lease_epoch,
    }
}

pub(super) fn later(h: DateTime<Utc>, secs: i64) -> Option<DateTime<Utc>> {
    Some(h + chrono::Duration::seconds(secs))
}

pub(super) async fn status_of(h: &Harness, id: TaskId) -> TaskStatus {
    h.storage
        .task_get(&TaskRef::Id(id))
        .await
        .unwrap()
        .expect("task exists")
        .status
}

pub(super) async fn count(h: &Harness) -> u64 {
    h.storage.stats().await.unwrap().total()
}

pub(super) async fn complete(h: &Harness, lease: Lease) -> bool {
    h.storage
        .task_complete_if_leased(&TaskCompleteParams {
            lease,
            result: Some("\"ok\"".into()),
            compensation: CompensationState::Succeeded,
            now: None,
        })
        .await
        .unwrap()
}

pub(super) async fn fail(
    h: &Harness,
    lease: Lease,
    next: FailNext,
    now: Option<DateTime<Utc>>,
) -> bool {
    h.storage
        .task_fail_if_leased(&TaskFailParams {
            lease,
            error: "boom".into(),
            next,
            now,
        })
        .await
        .unwrap()
}

pub(super) async fn reap(h: &Harness, now: Option<DateTime<Utc>>) -> Vec<crate::ReapedTask> {
    h.storage
        .task_reap_expired(&TaskReapParams {
            limit: 100,
            now,
            expires_beyond: None,
        })
        .await
        .unwrap()
}

pub async fn claim_orders_by_priority_then_run_time(h: &Harness) {
    let now = h.storage.now().await.unwrap();
    let low = h
        .task(TaskOpts {
            priority: 1,
            run_at: RunAt::At(now - chrono::Duration::seconds(100)),
            ..Default::default()
        })
        .await;
    let urgent_late = h
        .task(TaskOpts {
            priority: 9,
            run_at: RunAt::At(now - chrono::Duration::seconds(1)),
            ..Default::default()
        })
        .await;
    let urgent_early = h
        .task(TaskOpts {
            priority: 9,
            run_at: RunAt::At(now - chrono::Duration::seconds(50)),
            ..Default::default()
        })
        .await;
    let claimed = h.claim("w1", 2, None).await;
    let ids: Vec<_> = claimed.iter().map(|t| t.id).collect();
    assert_eq!(ids, vec![urgent_early.id, urgent_late.id]);
    let rest = h.claim("w1", 10, None).await;
    assert_eq!(rest.iter().map(|t| t.id).collect::<Vec<_>>(), vec![low.id]);
}

pub async fn claim_takes_only_registered_types_and_due_tasks(h: &Harness) {
    let unknown = h
        .task(TaskOpts {
            command_type: "NEWER_TYPE".into(),
            ..Default::default()
        })
        .await;
    let future = h
        .task(TaskOpts {
            run_at: RunAt::In(Duration::from_secs(3600)),
            ..Default::default()
        })
        .await;
    let other_queue = h
        .task(TaskOpts {
            queue: "elsewhere".into(),
            ..Default::default()
        })
        .await;
    assert!(h.claim("w1", 10, None).await.is_empty());
    assert_eq!(status_of(h, unknown.id).await, TaskStatus::Pending);
    // A worker that knows the type claims it.
    let mut params = claim_params("w2", 10, None);
    params.commands.push(("NEWER_TYPE".into(), 1));
    let claimed = h.storage.task_claim_batch(&params).await.unwrap();
    assert_eq!(
        claimed.iter().map(|t| t.id).collect::<Vec<_>>(),
        vec![unknown.id]
    );
    // Time passes (clock override): the delayed task becomes due.
    let now = h.storage.now().await.unwrap();
    let claimed = h.claim("w1", 10, later(now, 3601)).await;
    assert_eq!(
        claimed.iter().map(|t| t.id).collect::<Vec<_>>(),
        vec![future.id]
    );
    assert_eq!(status_of(h, other_queue.id).await, TaskStatus::Pending);
}

pub async fn claim_counts_the_attempt_and_bumps_the_epoch(h: &Harness) {
    let task = h.task(TaskOpts::default()).await;
    let claimed = h.claim("w1", 1, None).await.remove(0);
    assert_eq!(claimed.id, task.id);
    assert_eq!(claimed.status, TaskStatus::Running);
    assert_eq!(claimed.attempt, 1);
    assert_eq!(claimed.lease_epoch, 1);
    assert_eq!(claimed.lease_owner.as_deref(), Some("w1"));
    let expires = claimed.lease_expires_at.expect("lease expiry set");
    let now = h.storage.now().await.unwrap();
    assert!(
        expires > now + chrono::Duration::seconds(25),
        "{expires} vs {now}"
    );
    let attempts = h.storage.task_attempts(task.id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].outcome, AttemptOutcome::Running);
    assert_eq!((attempts[0].attempt, attempts[0].epoch), (1, 1));
    // A running task is not claimed twice.
    assert!(h.claim("w2", 10, None).await.is_empty());
}

pub async fn complete_under_a_stale_epoch_is_rejected(h: &Harness) {
    h.task(TaskOpts::default()).await;
    let first = h.claim("w1", 1, None).await.remove(0);
    let now = h.storage.now().await.unwrap();
    // w1's lease expires; the reaper returns the task; w2 claims it under epoch 2.
    let reaped = reap(h, later(now, 60)).await;
    assert_eq!(reaped.len(), 1);
    let second = h.claim("w2", 1, later(now, 61)).await.remove(0);
    assert_eq!(second.lease_epoch, first.lease_epoch + 1);
    // w1 wakes up and tries to write its outcome: nothing is written.
    assert!(!complete(h, lease(&first)).await);
    assert!(!fail(h, lease(&first), FailNext::Dead, None).await);
    let ext = h
        .storage
        .lease_extend(&LeaseExtendParams {
            leases: vec![lease(&first)],
            lease_ttl: Duration::from_secs(30),
            now: None,
        })
        .await
        .unwrap();
    assert!(ext.is_empty());
    let current = h
        .storage
        .task_get(&TaskRef::Id(first.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(current.status, TaskStatus::Running);
    assert_eq!(current.lease_owner.as_deref(), Some("w2"));
    // The current holder completes.
    assert!(complete(h, lease(&second)).await);
    assert_eq!(status_of(h, first.id).await, TaskStatus::Succeeded);
    // And a repeat of its own completion is a no-op.
    assert!(!complete(h, lease(&second)).await);
}

pub async fn lease_extend_renews_only_held_leases(h: &Harness) {
    h.task(TaskOpts::default()).await;
    h.task(TaskOpts::default()).await;
    let claimed = h.claim("w1", 2, None).await;
    let now = h.storage.now().await.unwrap();
    assert!(complete(h, lease(&claimed[1])).await);
    let renewed = h
        .storage
        .lease_extend(&LeaseExtendParams {
            leases: claimed.iter().map(lease).collect(),
            lease_ttl: Duration::from_secs(600),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(renewed, vec![lease(&claimed[0])]);
    let task = h
        .storage
        .task_get(&TaskRef::Id(claimed[0].id))
        .await
        .unwrap()
        .unwrap();
    assert!(task.lease_expires_at.unwrap() > now + chrono::Duration::seconds(500));
    // The renewed lease outlives the reaper's horizon at +60 s.
    assert!(reap(h, later(now, 60)).await.is_empty());
}

pub async fn fail_schedules_the_retry_on_the_database_clock(h: &Harness) {
    h.task(TaskOpts::default()).await;
    let task = h.claim("w1", 1, None).await.remove(0);
    let t0 = DateTime::from_timestamp_millis(2_000_000_000_000).unwrap();
    assert!(
        fail(
            h,
            lease(&task),
            FailNext::Retry(Duration::from_millis(1500)),
            Some(t0)
        )
        .await
    );
    let after = h
        .storage
        .task_get(&TaskRef::Id(task.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after.status, TaskStatus::Retrying);
    assert_eq!(after.run_at, t0 + chrono::Duration::milliseconds(1500));
    assert_eq!(after.last_error.as_deref(), Some("boom"));
    assert!(after.lease_owner.is_none());
    // Not due before its time, due after.
    assert!(h
        .claim("w1", 1, Some(t0 + chrono::Duration::milliseconds(1499)))
        .await
        .is_empty());
    let again = h
        .claim("w1", 1, Some(t0 + chrono::Duration::milliseconds(1500)))
        .await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempt, 2);
    let attempts = h.storage.task_attempts(task.id).await.unwrap();
    assert_eq!(
        attempts.iter().map(|a| a.outcome).collect::<Vec<_>>(),
        vec![AttemptOutcome::Failed, AttemptOutcome::Running]
    );
    assert_eq!(attempts[0].error.as_deref(), Some("boom"));
}

pub async fn cancel_only_waiting_tasks(h: &Harness) {
    let waiting = h.task(TaskOpts::default()).await;
    let cancelled = h
        .storage
        .task_cancel(&TaskActionParams {
            task: TaskRef::No(waiting.task_no.clone()),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(cancelled.status, TaskStatus::Cancelled);
    assert!(cancelled.finished_at.is_some());
    assert!(h.claim("w1", 10, None).await.is_empty());
    h.task(TaskOpts::default()).await;
    let running = h.claim("w1", 1, None).await.remove(0);
    // A running task cannot be stopped from the database: the cancel is recorded as a
    // request (see the cancel-request cases) and the task stays running.
    let requested = h
        .storage
        .task_cancel(&TaskActionParams {
            task: TaskRef::Id(running.id),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(requested.status, TaskStatus::Running);
    assert!(complete(h, lease(&running)).await);
    let err = h
        .storage
        .task_cancel(&TaskActionParams {
            task: TaskRef::Id(running.id),
            now: None,
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StorageError::InvalidState {
                status: TaskStatus::Succeeded,
                ..
            }
        ),
        "{err}"
    );
    let err = h
        .storage
        .task_cancel(&TaskActionParams {
            task: TaskRef::Id(TaskId(424_242)),
            now: None,
        })
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::NotFound(_)), "{err}");
    assert_eq!(status_of(h, running.id).await, TaskStatus::Succeeded);
}

pub async fn manual_retry_resets_the_budget_and_keeps_history(h: &Harness) {
    h.task(TaskOpts {
        max_attempts: 2,
        ..Default::default()
    })
    .await;
    let mut now = h.storage.now().await.unwrap();
    let t1 = h.claim("w1", 1, Some(now)).await.remove(0);
    assert!(fail(h, lease(&t1), FailNext::Retry(Duration::ZERO), Some(now)).await);
    let t2 = h.claim("w1", 1, Some(now)).await.remove(0);
    assert!(fail(h, lease(&t2), FailNext::Dead, Some(now)).await);
    let comp = h.claim("w1", 1, Some(now)).await.remove(0);
    assert!(complete(h, lease(&comp)).await);
    let err = h
        .storage
        .task_retry(&TaskActionParams {
            task: TaskRef::Id(comp.id),
            now: None,
        })
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::InvalidState { .. }), "{err}");
    let retried = h
        .storage
        .task_retry(&TaskActionParams {
            task: TaskRef::Id(t1.id),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(retried.status, TaskStatus::Pending);
    assert_eq!(retried.attempt, 0);
    assert_eq!(retried.compensation, None);
    now = h.storage.now().await.unwrap();
    let t3 = h.claim("w1", 1, later(now, 1)).await.remove(0);
    assert_eq!((t3.attempt, t3.lease_epoch), (1, 3));
    let history = h.storage.task_attempts(t1.id).await.unwrap();
    assert_eq!(
        history.iter().map(|a| a.epoch).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
}

pub async fn prune_deletes_old_finished_tasks_only(h: &Harness) {
    let t0 = DateTime::from_timestamp_millis(2_000_000_000_000).unwrap();
    h.task(TaskOpts::default()).await;
    h.task(TaskOpts::default()).await;
    let waiting = h
        .task(TaskOpts {
            run_at: RunAt::In(Duration::from_secs(1_000_000_000)),
            ..Default::default()
        })
        .await;
    let claimed = h.claim("w1", 2, Some(t0)).await;
    assert!(h
        .storage
        .task_complete_if_leased(&TaskCompleteParams {
            lease: lease(&claimed[0]),
            result: None,
            compensation: CompensationState::Succeeded,
            now: Some(t0),
        })
        .await
        .unwrap());
    assert!(fail(h, lease(&claimed[1]), FailNext::Dead, Some(t0)).await);
    let prune = |retention_days: u64, now| TaskPruneParams {
        retention: Duration::from_secs(retention_days * 86_400),
        limit: 100,
        now,
    };
    // Within retention: nothing goes.
    assert_eq!(
        h.storage
            .task_prune(&prune(7, later(t0, 6 * 86_400)))
            .await
            .unwrap(),
        0
    );
    // Past retention: the succeeded task goes; the dead one stays while its
    // compensation is pending; the waiting one stays.
    assert_eq!(
        h.storage
            .task_prune(&prune(7, later(t0, 8 * 86_400)))
            .await
            .unwrap(),
        1
    );
    assert!(h
        .storage
        .task_get(&TaskRef::Id(claimed[0].id))
        .await
        .unwrap()
        .is_none());
    assert!(h
        .storage
        .task_attempts(claimed[0].id)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(status_of(h, claimed[1].id).await, TaskStatus::Dead);
    assert_eq!(status_of(h, waiting.id).await, TaskStatus::Pending);
}

pub async fn attempt_history_is_bounded(h: &Harness) {
    h.task(TaskOpts {
        max_attempts: 100,
        ..Default::default()
    })
    .await;
    let now = h.storage.now().await.unwrap();
    let mut id = None;
    for _ in 0..25 {
        let task = h.claim("w1", 1, Some(now)).await.remove(0);
        id = Some(task.id);
        let long = "e".repeat(10_000);
        assert!(h
            .storage
            .task_fail_if_leased(&TaskFailParams {
                lease: lease(&task),
                error: long,
                next: FailNext::Retry(Duration::ZERO),
                now: Some(now),
            })
            .await
            .unwrap());
    }
    let history = h.storage.task_attempts(id.unwrap()).await.unwrap();
    assert_eq!(history.len(), crate::ATTEMPT_HISTORY_LEN as usize);
    assert_eq!(history.last().unwrap().epoch, 25);
    assert!(history
        .iter()
        .all(|a| a.error.as_ref().unwrap().len() <= crate::ERROR_MAX_BYTES + 4));
}

pub async fn stats_count_by_status_and_type(h: &Harness) {
    h.task(TaskOpts::default()).await;
    h.task(TaskOpts::default()).await;
    h.task(TaskOpts {
        command_type: "OTHER".into(),
        ..Default::default()
    })
    .await;
    let claimed = h.claim("w1", 1, None).await;
    assert!(complete(h, lease(&claimed[0])).await);
    let stats = h.storage.stats().await.unwrap();
    assert_eq!(stats.count(TaskStatus::Pending), 2);
    assert_eq!(stats.count(TaskStatus::Succeeded), 1);
    assert_eq!(stats.total(), 3);
    assert!(stats
        .by_type
        .contains(&("OTHER".to_owned(), TaskStatus::Pending, 1)));
    assert!(stats.oldest_due_age.is_some());
}

pub async fn a_retry_asked_on_the_last_attempt_dies(h: &Harness) {
    h.task(TaskOpts {
        max_attempts: 1,
        ..Default::default()
    })
    .await;
    let task = h.claim("w1", 1, None).await.remove(0);
    // The worker asks for a retry although the budget is spent: storage refuses.
    assert!(fail(h, lease(&task), FailNext::Retry(Duration::ZERO), None).await);
    let dead = h
        .storage
        .task_get(&TaskRef::Id(task.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(dead.status, TaskStatus::Dead);
    assert_eq!(dead.compensation, Some(CompensationState::Pending));
}

pub async fn a_hand_back_refunds_the_attempt(h: &Harness) {
    h.task(TaskOpts {
        max_attempts: 1,
        ..Default::default()
    })
    .await;
    let task = h.claim("w1", 1, None).await.remove(0);
    assert!(fail(h, lease(&task), FailNext::HandBack, None).await);
    let back = h
        .storage
        .task_get(&TaskRef::Id(task.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back.status, TaskStatus::Retrying);
    assert_eq!(back.attempt, 0);
    // The lease is cleared in the same write, and the task is due at once: another
    // worker takes it now, not after the lease would have expired.
    assert_eq!((back.lease_owner, back.lease_expires_at), (None, None));
    assert!(back.run_at <= h.storage.now().await.unwrap());
    let again = h.claim("w2", 1, None).await.remove(0);
    assert_eq!((again.attempt, again.lease_epoch), (1, 2));
}

/// Claim as `worker` offering exactly `commands` (type, highest payload version).
pub(super) async fn claim_offering(
    h: &Harness,
    worker: &str,
    commands: &[(&str, u32)],
) -> Vec<TaskId> {
    let mut params = claim_params(worker, 10, None);
    params.commands = commands
        .iter()
        .map(|(t, v)| ((*t).to_owned(), *v))
        .collect();
    h.storage
        .task_claim_batch(&params)
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect()
}

pub async fn a_newer_payload_version_waits_for_a_worker_that_knows_it(h: &Harness) {
    let newer = h
        .task(TaskOpts {
            payload_version: 2,
            ..Default::default()
        })
        .await;
    assert_eq!(newer.payload_version, 2);
    let known = h.task(TaskOpts::default()).await;
    // A worker of the previous version knows the type at version 1 (and another type
    // at a higher version, which does not count for this one): it takes the task it
    // understands and leaves the newer one pending, untouched.
    let claimed = claim_offering(h, "old", &[(TaskOpts::TYPE, 1), ("OTHER_TYPE", 5)]).await;
    assert_eq!(claimed, vec![known.id]);
    assert!(claim_offering(h, "old", &[(TaskOpts::TYPE, 1)])
        .await
        .is_empty());
    let waiting = h
        .storage
        .task_get(&TaskRef::Id(newer.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(waiting.status, TaskStatus::Pending);
    assert_eq!((waiting.attempt, waiting.lease_epoch), (0, 0));
    // Visible as waiting in the stats.
    let stats = h.storage.stats().await.unwrap();
    assert!(
        stats
            .by_type
            .contains(&(TaskOpts::TYPE.to_owned(), TaskStatus::Pending, 1)),
        "{stats:?}"
    );
    // A worker that knows version 2 takes it.
    let claimed = claim_offering(h, "new", &[(TaskOpts::TYPE, 2)]).await;
    assert_eq!(claimed, vec![newer.id]);
    // A worker takes every version up to its own, not only its own.
    let old_task = h.task(TaskOpts::default()).await;
    let claimed = claim_offering(h, "newest", &[(TaskOpts::TYPE, 3)]).await;
    assert_eq!(claimed, vec![old_task.id]);
}

pub use super::schedules::*;
