//! The conformance cases: what every [`Storage`](crate::Storage) method means, checked the same way on
//! every backend. Each case takes a fresh, migrated [`Harness`].
use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tenax_core::state::is_legal;
use tenax_core::{AttemptOutcome, CompensationState, TaskId, TaskKind, TaskNo, TaskStatus};

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
pub use super::completions::*;
pub use super::due::*;
pub use super::events::*;
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
pub use super::rates::*;
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
    TaskFailParams, TaskListParams, TaskPruneParams, TaskReapParams, TaskRef,
};

fn lease(task: &tenax_core::TaskRecord) -> Lease {
    Lease {
        id: task.id,
        epoch: task.lease_epoch,
    }
}

fn later(h: DateTime<Utc>, secs: i64) -> Option<DateTime<Utc>> {
    Some(h + chrono::Duration::seconds(secs))
}

async fn status_of(h: &Harness, id: TaskId) -> TaskStatus {
    h.storage
        .task_get(&TaskRef::Id(id))
        .await
        .unwrap()
        .expect("task exists")
        .status
}

async fn count(h: &Harness) -> u64 {
    h.storage.stats().await.unwrap().total()
}

async fn complete(h: &Harness, lease: Lease) -> bool {
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

async fn fail(h: &Harness, lease: Lease, next: FailNext, now: Option<DateTime<Utc>>) -> bool {
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

async fn reap(h: &Harness, now: Option<DateTime<Utc>>) -> Vec<crate::ReapedTask> {
    h.storage
        .task_reap_expired(&TaskReapParams {
            limit: 100,
            now,
            expires_beyond: None,
        })
        .await
        .unwrap()
}

pub async fn insert_returns_a_pending_task(h: &Harness) {
    let before = h.storage.now().await.unwrap();
    let task = h
        .task(TaskOpts {
            task_no: Some("ACC-1".into()),
            payload: r#"{"customer":"ada"}"#.into(),
            ..Default::default()
        })
        .await;
    assert_eq!(task.task_no.as_str(), "ACC-1");
    assert_eq!(task.status, TaskStatus::Pending);
    assert_eq!(task.kind, TaskKind::Execute);
    assert_eq!(task.attempt, 0);
    assert_eq!(task.lease_epoch, 0);
    assert_eq!(task.priority.get(), 5);
    assert!(task.run_at >= before - chrono::Duration::seconds(1));
    let fetched = h
        .storage
        .task_get(&TaskRef::No(TaskNo::new("ACC-1").unwrap()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(fetched, task);
    assert!(h
        .storage
        .task_get(&TaskRef::Id(TaskId(999_999)))
        .await
        .unwrap()
        .is_none());
}

pub async fn same_task_no_returns_the_existing_task(h: &Harness) {
    let opts = TaskOpts {
        task_no: Some("SAME".into()),
        payload: r#"{"a":1,"b":[1,2]}"#.into(),
        ..Default::default()
    };
    let first = h.storage.task_insert(&opts.params()).await.unwrap();
    assert!(first.created);
    // The same JSON value with another key order is the same payload.
    let again = TaskOpts {
        payload: r#"{"b":[1,2],"a":1}"#.into(),
        ..opts
    };
    let second = h.storage.task_insert(&again.params()).await.unwrap();
    assert!(!second.created);
    assert_eq!(second.task.id, first.task.id);
    assert_eq!(count(h).await, 1);
}

pub async fn same_task_no_with_another_payload_or_type_conflicts(h: &Harness) {
    let opts = TaskOpts {
        task_no: Some("X".into()),
        payload: r#"{"amount":1}"#.into(),
        ..Default::default()
    };
    h.task(opts.clone()).await;
    let other_payload = TaskOpts {
        payload: r#"{"amount":2}"#.into(),
        ..opts.clone()
    };
    let err = h
        .storage
        .task_insert(&other_payload.params())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StorageError::TaskNoConflict {
                field: "payload",
                ..
            }
        ),
        "{err}"
    );
    let other_type = TaskOpts {
        command_type: "OTHER".into(),
        ..opts
    };
    let err = h
        .storage
        .task_insert(&other_type.params())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StorageError::TaskNoConflict {
                field: "command type",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(count(h).await, 1);
}

pub async fn concurrent_enqueues_of_one_task_no_make_one_task(h: &Harness) {
    let params = TaskOpts {
        task_no: Some("RACE".into()),
        ..Default::default()
    }
    .params();
    let mut joins = Vec::new();
    for _ in 0..50 {
        let storage = h.storage.clone();
        let params = params.clone();
        joins.push(tokio::spawn(
            async move { storage.task_insert(&params).await },
        ));
    }
    let mut ids = Vec::new();
    let mut created = 0;
    for join in joins {
        let inserted = join.await.unwrap().expect("every enqueue succeeds");
        created += usize::from(inserted.created);
        ids.push(inserted.task.id);
    }
    assert_eq!(created, 1, "exactly one enqueue creates the task");
    ids.dedup();
    assert_eq!(ids.len(), 1, "every enqueue returns the same task");
    assert_eq!(count(h).await, 1);
}

pub async fn invalid_insert_changes_nothing(h: &Harness) {
    let cases = [
        TaskOpts {
            payload: "{not json".into(),
            ..Default::default()
        },
        TaskOpts {
            max_attempts: 0,
            ..Default::default()
        },
        TaskOpts {
            payload_version: 0,
            ..Default::default()
        },
        TaskOpts {
            queue: "has space".into(),
            ..Default::default()
        },
        TaskOpts {
            command_type: String::new(),
            ..Default::default()
        },
        TaskOpts {
            payload: format!("\"{}\"", "x".repeat(crate::PAYLOAD_MAX_BYTES)),
            ..Default::default()
        },
    ];
    for opts in cases {
        let err = h.storage.task_insert(&opts.params()).await.unwrap_err();
        assert!(matches!(err, StorageError::Invalid(_)), "{err}");
    }
    assert_eq!(count(h).await, 0);
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

async fn compensation_of(h: &Harness, parent: TaskId) -> Vec<tenax_core::TaskRecord> {
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

/// Random sequences of every operation, including stale writes and clock jumps; after
/// each step every task's status change must be a legal transition, and no two tasks
/// may share a `task_no`.
pub async fn random_operations_follow_the_state_machine(h: &Harness) {
    let seed: u64 = std::env::var("TENAX_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    eprintln!(
        "random_operations_follow_the_state_machine: seed {seed} (replay with TENAX_SEED={seed})"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let mut now = h.storage.now().await.unwrap();
    let mut leases: Vec<Lease> = Vec::new();
    let mut seen: HashMap<TaskId, TaskStatus> = HashMap::new();
    for step in 0..300 {
        let op = rng.random_range(0..9);
        match op {
            0 => {
                let n = rng.random_range(0..6);
                let _ = h
                    .storage
                    .task_insert(
                        &TaskOpts {
                            task_no: Some(format!("T{n}")),
                            max_attempts: rng.random_range(1..4),
                            now: Some(now),
                            ..Default::default()
                        }
                        .params(),
                    )
                    .await;
            }
            1 => leases.extend(
                h.claim("w", rng.random_range(1..3), Some(now))
                    .await
                    .iter()
                    .map(lease),
            ),
            2 | 3 if !leases.is_empty() => {
                // Possibly stale: leases are never forgotten.
                let l = leases[rng.random_range(0..leases.len())];
                if op == 2 {
                    let _ = h
                        .storage
                        .task_complete_if_leased(&TaskCompleteParams {
                            lease: l,
                            result: None,
                            compensation: CompensationState::Succeeded,
                            now: Some(now),
                        })
                        .await
                        .unwrap();
                } else {
                    let next = if rng.random_bool(0.5) {
                        FailNext::Dead
                    } else {
                        FailNext::Retry(Duration::from_secs(rng.random_range(0..5)))
                    };
                    fail(h, l, next, Some(now)).await;
                }
            }
            4 => {
                reap(h, Some(now)).await;
            }
            5 => now += chrono::Duration::seconds(rng.random_range(0..40)),
            6 | 7 => {
                let id = TaskId(rng.random_range(1..12));
                let params = TaskActionParams {
                    task: TaskRef::Id(id),
                    now: Some(now),
                };
                let result = if op == 6 {
                    h.storage.task_cancel(&params).await
                } else {
                    h.storage.task_retry(&params).await
                };
                if let Err(e) = result {
                    assert!(
                        matches!(
                            e,
                            StorageError::NotFound(_) | StorageError::InvalidState { .. }
                        ),
                        "seed {seed}: {e}"
                    );
                }
            }
            _ => {
                let renewed = h
                    .storage
                    .lease_extend(&LeaseExtendParams {
                        leases: leases.clone(),
                        lease_ttl: Duration::from_secs(30),
                        now: Some(now),
                    })
                    .await
                    .unwrap();
                for id in renewed {
                    assert_eq!(seen.get(&id.id), Some(&TaskStatus::Running), "seed {seed}");
                }
            }
        }
        let tasks = h
            .storage
            .task_list(&TaskListParams {
                limit: 1000,
                ..Default::default()
            })
            .await
            .unwrap();
        let mut numbers: Vec<_> = tasks.iter().map(|t| t.task_no.clone()).collect();
        numbers.sort();
        numbers.dedup();
        assert_eq!(numbers.len(), tasks.len(), "seed {seed}: duplicate task_no");
        for task in &tasks {
            if let Some(before) = seen.insert(task.id, task.status) {
                assert!(
                    before == task.status || is_legal(before, task.status),
                    "seed {seed} step {step} op {op}: task {} moved {before} -> {} (replay with TENAX_SEED={seed})",
                    task.id,
                    task.status
                );
            }
            if task.status == TaskStatus::Running {
                assert!(
                    task.attempt <= task.max_attempts,
                    "seed {seed}: attempts over budget"
                );
            }
        }
    }
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

pub async fn migrations_apply_once_however_many_nodes_start_together(h: &Harness) {
    let task = h.task(TaskOpts::default()).await;
    // Four nodes start at once on the migrated database, and migrate again.
    let mut joins = Vec::new();
    for _ in 0..4 {
        let url = h.url.clone();
        joins.push(tokio::spawn(async move {
            let storage = crate::connect(&url).await?;
            storage.migrate().await?;
            Ok::<_, StorageError>(storage)
        }));
    }
    for join in joins {
        let storage = join.await.unwrap().expect("every node migrates");
        let seen = storage.task_get(&TaskRef::Id(task.id)).await.unwrap();
        assert_eq!(
            seen.map(|t| t.id),
            Some(task.id),
            "migrating again keeps the data"
        );
    }
    h.storage
        .migrate()
        .await
        .expect("migrating twice is a no-op");
}

pub async fn cancel_racing_a_claim_exactly_one_wins(h: &Harness) {
    let other = h.reopen().await;
    for round in 0..20 {
        let task = h.task(TaskOpts::default()).await;
        let claimer = h.storage.clone();
        let claim =
            tokio::spawn(
                async move { claimer.task_claim_batch(&claim_params("w1", 1, None)).await },
            );
        let cancel = other
            .task_cancel(&TaskActionParams {
                task: TaskRef::Id(task.id),
                now: None,
            })
            .await;
        let claimed = claim.await.unwrap().unwrap();
        let won_claim = claimed.iter().any(|t| t.id == task.id);
        // Either the cancel came first (cancelled, never claimed) or the claim did (the
        // cancel becomes a request the running attempt obeys): never both, never lost.
        let cancel = cancel.unwrap();
        if won_claim {
            assert_eq!(cancel.status, TaskStatus::Running, "round {round}");
            let held = lease(&claimed[0]);
            assert_eq!(super::runtime::requested(h, &[held]).await, vec![held]);
            assert!(fail(h, held, FailNext::Retry(Duration::ZERO), None).await);
        } else {
            assert_eq!(cancel.status, TaskStatus::Cancelled, "round {round}");
        }
        assert_eq!(status_of(h, task.id).await, TaskStatus::Cancelled);
    }
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

pub async fn concurrent_claimers_take_each_task_once(h: &Harness) {
    let mut expected = Vec::new();
    for _ in 0..200 {
        expected.push(h.task(TaskOpts::default()).await.id);
    }
    let mut joins = Vec::new();
    for claimer in 0..4 {
        let storage = h.reopen().await;
        joins.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let batch = storage
                    .task_claim_batch(&claim_params(&format!("w{claimer}"), 7, None))
                    .await
                    .unwrap();
                if batch.is_empty() {
                    return mine;
                }
                mine.extend(batch.iter().map(|t| t.id));
            }
        }));
    }
    let mut claimed = Vec::new();
    for join in joins {
        claimed.extend(join.await.unwrap());
    }
    claimed.sort();
    expected.sort();
    assert_eq!(claimed, expected, "every task claimed exactly once");
}

pub async fn wakeups_reach_other_processes(h: &Harness) {
    let other = h.reopen().await;
    // Every backend carries wake-ups across processes by default (PostgreSQL's LISTEN,
    // the probe of SQLite and MariaDB): a backend that stops doing so fails here.
    assert!(
        other.capabilities().cross_process_wakeups,
        "{} has no cross-process wake-ups",
        other.backend()
    );
    let mut wakeups = other.wakeups();
    // The listener (or probe) starts in the background: keep enqueueing until a
    // wake-up arrives.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        h.task(TaskOpts::default()).await;
        if tokio::time::timeout(Duration::from_millis(200), wakeups.changed())
            .await
            .is_ok()
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no wake-up reached the other process"
        );
    }
}

/// Claim as `worker` offering exactly `commands` (type, highest payload version).
async fn claim_offering(h: &Harness, worker: &str, commands: &[(&str, u32)]) -> Vec<TaskId> {
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

pub async fn times_out_of_range_are_refused_or_clamped(h: &Harness) {
    for run_at in [
        RunAt::In(Duration::MAX),
        RunAt::At(DateTime::<Utc>::MAX_UTC),
        RunAt::At(DateTime::from_timestamp(-1, 0).unwrap()),
    ] {
        let err = h
            .storage
            .task_insert(
                &TaskOpts {
                    run_at,
                    ..Default::default()
                }
                .params(),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::Invalid(_)), "{run_at:?}: {err}");
    }
    assert_eq!(count(h).await, 0);
    // A retry policy capped at Duration::MAX is clamped, not an overflow.
    h.task(TaskOpts::default()).await;
    let task = h.claim("w1", 1, None).await.remove(0);
    assert!(fail(h, lease(&task), FailNext::Retry(Duration::MAX), None).await);
    let retrying = h
        .storage
        .task_get(&TaskRef::Id(task.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(retrying.status, TaskStatus::Retrying);
    let now = h.storage.now().await.unwrap();
    assert!(retrying.run_at > now + chrono::Duration::days(36_000));
    assert!(retrying.run_at < now + chrono::Duration::days(36_600));
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

pub use super::schedules::*;

/// The name an API token enqueued a task under: stored on every way in, kept by a
/// repeat of the number (it is not part of the task's identity), carried to the
/// task's compensation, and refused when empty or too long.
pub async fn the_enqueuers_name_is_stored_kept_and_carried_to_the_compensation(h: &Harness) {
    let named = |no: &str, name: Option<&str>| TaskOpts {
        task_no: Some(no.into()),
        created_by: name.map(str::to_owned),
        ..Default::default()
    };
    let shop = h.task(named("BY-SHOP", Some("shop"))).await;
    assert_eq!(shop.created_by.as_deref(), Some("shop"));
    let library = h.task(named("BY-LIBRARY", None)).await;
    assert_eq!(library.created_by, None);
    let repeat = h
        .storage
        .task_insert(&named("BY-SHOP", Some("till")).params())
        .await
        .unwrap();
    assert!(!repeat.created);
    assert_eq!(repeat.task.created_by.as_deref(), Some("shop"));
    let many = h
        .storage
        .task_insert_many(&crate::TaskInsertManyParams {
            tasks: vec![named("BY-TILL", Some("till")).params()],
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(many[0].task().created_by.as_deref(), Some("till"));
    let listed = h
        .storage
        .task_list(&TaskListParams {
            limit: 10,
            ..TaskListParams::default()
        })
        .await
        .unwrap();
    let names: Vec<(&str, Option<&str>)> = listed
        .iter()
        .map(|t| (t.task_no.as_str(), t.created_by.as_deref()))
        .collect();
    assert_eq!(
        names,
        [
            ("BY-TILL", Some("till")),
            ("BY-LIBRARY", None),
            ("BY-SHOP", Some("shop"))
        ]
    );
    let workflow = h
        .storage
        .workflow_insert(&crate::WorkflowInsertParams {
            name: "flow".into(),
            kind: crate::WorkflowKind::Dag,
            policy: crate::WorkflowPolicy::CancelDependents,
            tasks: vec![crate::WorkflowTaskParams {
                key: "a".into(),
                task: named("FLOW-A", Some("shop")).params(),
                after: Vec::new(),
            }],
            now: None,
        })
        .await
        .unwrap();
    let stored = h.storage.workflow_get(workflow.workflow.id).await.unwrap();
    assert_eq!(
        stored.unwrap().tasks[0].task.created_by.as_deref(),
        Some("shop")
    );
    // A compensation belongs to whoever enqueued the task it compensates.
    let mut claimed = h.claim("w1", 10, None).await;
    claimed.retain(|t| t.id == shop.id);
    assert!(fail(h, lease(&claimed[0]), FailNext::Dead, None).await);
    let comp = compensation_of(h, shop.id).await;
    assert_eq!(comp[0].created_by.as_deref(), Some("shop"));
    // Refused, and nothing inserted.
    let before = count(h).await;
    for bad in [String::new(), "n".repeat(crate::CREATED_BY_MAX_BYTES + 1)] {
        let err = h
            .storage
            .task_insert(&named("BAD-NAME", Some(&bad)).params())
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::Invalid(_)), "{err}");
    }
    let longest = "n".repeat(crate::CREATED_BY_MAX_BYTES);
    assert_eq!(count(h).await, before);
    let kept = h.task(named("LONG-NAME", Some(&longest))).await;
    assert_eq!(kept.created_by, Some(longest));
}

/// A list that bounds each value leaves a longer payload or result out (the empty
/// string) and gives the others whole; a single read still gives every value whole.
pub async fn a_list_can_leave_large_values_out(h: &Harness) {
    let big = format!(r#"{{"blob":"{}"}}"#, "x".repeat(2000));
    let small = r#"{"n":1}"#.to_owned();
    let mut ids = Vec::new();
    for (no, payload) in [("BIG", &big), ("SMALL", &small)] {
        let task = h
            .task(TaskOpts {
                task_no: Some(no.into()),
                payload: payload.clone(),
                ..Default::default()
            })
            .await;
        ids.push(task.id);
    }
    // Both succeed: the big one with a big result, the small one with a small one.
    for task in h.claim("w1", 10, None).await {
        let result = if task.id == ids[0] {
            big.clone()
        } else {
            small.clone()
        };
        assert!(h
            .storage
            .task_complete_if_leased(&TaskCompleteParams {
                lease: lease(&task),
                result: Some(result),
                compensation: CompensationState::Succeeded,
                now: None,
            })
            .await
            .unwrap());
    }
    let list = |max: Option<u32>| {
        let storage = h.storage.clone();
        async move {
            storage
                .task_list(&TaskListParams {
                    limit: 10,
                    value_max_bytes: max,
                    ..TaskListParams::default()
                })
                .await
                .unwrap()
                .into_iter()
                .map(|t| (t.payload, t.result))
                .collect::<Vec<_>>()
        }
    };
    let whole = vec![
        (small.clone(), Some(small.clone())),
        (big.clone(), Some(big.clone())),
    ];
    assert_eq!(list(None).await, whole);
    let bound = u32::try_from(small.len()).unwrap();
    assert_eq!(
        list(Some(bound + 100)).await,
        [
            (small.clone(), Some(small.clone())),
            (String::new(), Some(String::new())),
        ]
    );
    // The bound counts bytes, and a value of exactly the bound is kept.
    assert_eq!(
        list(Some(bound)).await[0],
        (small.clone(), Some(small.clone()))
    );
    assert_eq!(
        list(Some(bound - 1)).await[0],
        (String::new(), Some(String::new()))
    );
    let got = h
        .storage
        .task_get(&TaskRef::Id(ids[0]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((got.payload, got.result), (big.clone(), Some(big)));
    // The finished-task list of a chart carries neither.
    let finished = h
        .storage
        .task_list_finished(&crate::TaskListFinishedParams {
            since: h.storage.now().await.unwrap() - chrono::Duration::hours(1),
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(finished.len(), 2);
    for task in finished {
        assert_eq!(
            (task.payload, task.result),
            (String::new(), Some(String::new()))
        );
    }
}
