//! Conformance cases for bulk actions by filter, the creation-time filter of the task
//! list, and the audit log of operator actions.
use std::time::Duration;

use chrono::{DateTime, Utc};
use tenax_core::{CompensationState, Priority, TaskId, TaskKind, TaskRecord, TaskStatus};

use super::{Harness, TaskOpts};
use crate::{
    AuditAppendParams, AuditListParams, BulkAction, CancelRequestedParams, FailNext, Lease,
    Storage, StorageError, TaskBulkOutcome, TaskBulkParams, TaskClaimParams, TaskCompleteParams,
    TaskFailParams, TaskFilter, TaskListParams, TaskRef, BULK_IDS_MAX, BULK_LIMIT_MAX,
};

fn lease(task: &TaskRecord) -> Lease {
    Lease {
        id: task.id,
        epoch: task.lease_epoch,
    }
}

async fn task_of(h: &Harness, command_type: &str) -> TaskRecord {
    h.task(TaskOpts {
        command_type: command_type.into(),
        ..Default::default()
    })
    .await
}

/// Claim the one due task of `command_type` (of any kind).
async fn claim_one(h: &Harness, command_type: &str) -> TaskRecord {
    let mut claimed = h
        .storage
        .task_claim_batch(&TaskClaimParams {
            worker: "w1".into(),
            queues: vec!["default".into()],
            commands: vec![(command_type.into(), 1)],
            limit: 1,
            lease_ttl: Duration::from_secs(60),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "one due {command_type} task");
    claimed.remove(0)
}

async fn fail(h: &Harness, task: &TaskRecord, next: FailNext) {
    assert!(h
        .storage
        .task_fail_if_leased(&TaskFailParams {
            lease: lease(task),
            error: "boom".into(),
            next,
            now: None,
        })
        .await
        .unwrap());
}

async fn complete(h: &Harness, task: &TaskRecord) {
    assert!(h
        .storage
        .task_complete_if_leased(&TaskCompleteParams {
            lease: lease(task),
            result: None,
            compensation: CompensationState::Succeeded,
            now: None,
        })
        .await
        .unwrap());
}

async fn get(h: &Harness, id: TaskId) -> TaskRecord {
    h.storage
        .task_get(&TaskRef::Id(id))
        .await
        .unwrap()
        .expect("task exists")
}

/// A task of `command_type` in each state a bulk action meets: pending, retrying,
/// running, succeeded, and dead with its compensation task still pending.
struct Mixed {
    pending: TaskRecord,
    retrying: TaskRecord,
    running: TaskRecord,
    succeeded: TaskRecord,
    dead: TaskRecord,
    compensation: TaskRecord,
}

impl Mixed {
    fn all(&self) -> [&TaskRecord; 6] {
        [
            &self.pending,
            &self.retrying,
            &self.running,
            &self.succeeded,
            &self.dead,
            &self.compensation,
        ]
    }
}

async fn mixed(h: &Harness) -> Mixed {
    let pending = task_of(h, "PENDING").await;
    task_of(h, "RETRYING").await;
    let retrying = claim_one(h, "RETRYING").await;
    fail(h, &retrying, FailNext::Retry(Duration::from_secs(3600))).await;
    task_of(h, "RUNNING").await;
    let running = claim_one(h, "RUNNING").await;
    task_of(h, "SUCCEEDED").await;
    let succeeded = claim_one(h, "SUCCEEDED").await;
    complete(h, &succeeded).await;
    task_of(h, "DEAD").await;
    let dead = claim_one(h, "DEAD").await;
    fail(h, &dead, FailNext::Dead).await;
    let compensation = h
        .storage
        .task_list(&TaskListParams {
            command_type: Some("DEAD".into()),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.kind == TaskKind::Compensate)
        .expect("the dead task's compensation");
    let m = Mixed {
        pending: get(h, pending.id).await,
        retrying: get(h, retrying.id).await,
        running: get(h, running.id).await,
        succeeded: get(h, succeeded.id).await,
        dead: get(h, dead.id).await,
        compensation: get(h, compensation.id).await,
    };
    assert_eq!(m.retrying.status, TaskStatus::Retrying);
    assert_eq!(m.compensation.status, TaskStatus::Pending);
    m
}

async fn bulk(h: &Harness, filter: TaskFilter, action: BulkAction, limit: u32) -> TaskBulkOutcome {
    h.storage
        .task_bulk(&TaskBulkParams {
            filter,
            action,
            limit,
            now: None,
        })
        .await
        .unwrap()
}

async fn has_cancel_request(h: &Harness, task: &TaskRecord) -> bool {
    !h.storage
        .task_cancel_requested(&CancelRequestedParams {
            leases: vec![lease(task)],
        })
        .await
        .unwrap()
        .is_empty()
}

pub async fn bulk_cancel_changes_only_what_a_cancel_may(h: &Harness) {
    let m = mixed(h).await;
    let outcome = bulk(h, TaskFilter::default(), BulkAction::Cancel, 100).await;
    assert_eq!(
        outcome,
        TaskBulkOutcome {
            changed: 2,
            cancel_requested: 1
        }
    );
    let pending = get(h, m.pending.id).await;
    assert_eq!(pending.status, TaskStatus::Cancelled);
    assert!(pending.finished_at.is_some());
    assert_eq!(get(h, m.retrying.id).await.status, TaskStatus::Cancelled);
    let running = get(h, m.running.id).await;
    assert_eq!(
        running.status,
        TaskStatus::Running,
        "a running task is asked"
    );
    assert!(has_cancel_request(h, &running).await);
    assert_eq!(get(h, m.succeeded.id).await.status, TaskStatus::Succeeded);
    assert_eq!(get(h, m.dead.id).await.status, TaskStatus::Dead);
    assert_eq!(
        get(h, m.compensation.id).await.status,
        TaskStatus::Pending,
        "a compensation is never cancelled"
    );
    // Again: nothing left to cancel, and the running task was asked already.
    let again = bulk(h, TaskFilter::default(), BulkAction::Cancel, 100).await;
    assert_eq!(again, TaskBulkOutcome::default());
}

pub async fn bulk_retry_returns_only_dead_tasks_to_pending(h: &Harness) {
    let m = mixed(h).await;
    // The dead task's compensation has not run: undoing and redoing would race.
    let outcome = bulk(h, TaskFilter::default(), BulkAction::Retry, 100).await;
    assert_eq!(outcome, TaskBulkOutcome::default());
    let compensation = claim_one(h, "DEAD").await;
    complete(h, &compensation).await;
    let before = h.storage.now().await.unwrap();
    let outcome = bulk(h, TaskFilter::default(), BulkAction::Retry, 100).await;
    assert_eq!(
        outcome,
        TaskBulkOutcome {
            changed: 1,
            cancel_requested: 0
        }
    );
    let retried = get(h, m.dead.id).await;
    assert_eq!(retried.status, TaskStatus::Pending);
    assert_eq!(retried.attempt, 0, "a fresh attempt budget");
    assert_eq!(retried.compensation, None);
    assert!(retried.finished_at.is_none());
    assert!(retried.run_at >= before - chrono::Duration::seconds(1));
    for task in [&m.pending, &m.retrying, &m.running, &m.succeeded] {
        assert_eq!(
            get(h, task.id).await.status,
            task.status,
            "{}",
            task.command_type
        );
    }
    assert_eq!(
        get(h, m.compensation.id).await.status,
        TaskStatus::Succeeded
    );
    // The retried task runs again.
    let again = claim_one(h, "DEAD").await;
    assert_eq!(again.id, m.dead.id);
}

pub async fn bulk_reprioritise_changes_only_waiting_tasks(h: &Harness) {
    let m = mixed(h).await;
    let nine = Priority::new(9).unwrap();
    let outcome = bulk(
        h,
        TaskFilter::default(),
        BulkAction::Reprioritise(nine),
        100,
    )
    .await;
    // The pending and retrying tasks, and the pending compensation.
    assert_eq!(outcome.changed, 3);
    assert_eq!(outcome.cancel_requested, 0);
    for task in m.all() {
        let now = get(h, task.id).await;
        let waiting = matches!(task.status, TaskStatus::Pending | TaskStatus::Retrying);
        let expected = if waiting { 9 } else { task.priority.get() };
        assert_eq!(
            now.priority.get(),
            expected,
            "{} {:?}",
            task.command_type,
            task.kind
        );
        assert_eq!(now.status, task.status);
    }
    // Already at that priority: nothing changes.
    let again = bulk(
        h,
        TaskFilter::default(),
        BulkAction::Reprioritise(nine),
        100,
    )
    .await;
    assert_eq!(again.changed, 0);
}

pub async fn each_bulk_filter_field_narrows_the_tasks(h: &Harness) {
    let t0 = h.storage.now().await.unwrap();
    let at = |hours: i64| t0 + chrono::Duration::hours(hours);
    let insert = |command_type: &'static str, queue: &'static str, hours: i64| TaskOpts {
        command_type: command_type.into(),
        queue: queue.into(),
        now: Some(at(hours)),
        run_at: crate::RunAt::At(at(hours)),
        ..Default::default()
    };
    let a = h.task(insert("A", "q1", 1)).await;
    let b = h.task(insert("B", "q1", 2)).await;
    let c = h.task(insert("A", "q2", 3)).await;
    let d = h.task(insert("A", "q1", 4)).await;
    let nine = Priority::new(9).unwrap();
    let tasks = [&a, &b, &c, &d];
    let reprioritised = |filter: TaskFilter| async move {
        // Each probe reprioritises what the filter picks, reads it, and puts it back.
        bulk(h, filter.clone(), BulkAction::Reprioritise(nine), 100).await;
        let mut picked = Vec::new();
        for task in tasks {
            if get(h, task.id).await.priority.get() == 9 {
                picked.push(task.id);
            }
        }
        bulk(
            h,
            TaskFilter::default(),
            BulkAction::Reprioritise(Priority::new(5).unwrap()),
            100,
        )
        .await;
        picked
    };
    assert_eq!(
        reprioritised(TaskFilter::default()).await,
        vec![a.id, b.id, c.id, d.id]
    );
    assert_eq!(
        reprioritised(TaskFilter {
            command_type: Some("A".into()),
            ..Default::default()
        })
        .await,
        vec![a.id, c.id, d.id]
    );
    assert_eq!(
        reprioritised(TaskFilter {
            command_type: Some("A".into()),
            queue: Some("q1".into()),
            ..Default::default()
        })
        .await,
        vec![a.id, d.id]
    );
    assert_eq!(
        reprioritised(TaskFilter {
            created_after: Some(at(2)),
            created_before: Some(at(4)),
            ..Default::default()
        })
        .await,
        vec![b.id, c.id],
        "created at or after, and before"
    );
    assert_eq!(
        reprioritised(TaskFilter {
            ids: Some(vec![b.id, d.id, TaskId(987_654_321)]),
            ..Default::default()
        })
        .await,
        vec![b.id, d.id]
    );
    assert_eq!(
        reprioritised(TaskFilter {
            ids: Some(Vec::new()),
            ..Default::default()
        })
        .await,
        Vec::<TaskId>::new(),
        "an empty id list matches nothing"
    );
    assert_eq!(
        reprioritised(TaskFilter {
            statuses: vec![TaskStatus::Retrying],
            ..Default::default()
        })
        .await,
        Vec::<TaskId>::new()
    );
    assert_eq!(
        reprioritised(TaskFilter {
            statuses: vec![TaskStatus::Pending, TaskStatus::Succeeded],
            queue: Some("q2".into()),
            ..Default::default()
        })
        .await,
        vec![c.id]
    );
}

pub async fn bulk_limit_is_respected_and_invalid_bounds_change_nothing(h: &Harness) {
    let mut tasks = Vec::new();
    for _ in 0..5 {
        tasks.push(h.task(TaskOpts::default()).await);
    }
    let outcome = bulk(h, TaskFilter::default(), BulkAction::Cancel, 3).await;
    assert_eq!(outcome.changed, 3);
    let statuses: Vec<TaskStatus> = {
        let mut s = Vec::new();
        for t in &tasks {
            s.push(get(h, t.id).await.status);
        }
        s
    };
    assert_eq!(
        statuses,
        [
            TaskStatus::Cancelled,
            TaskStatus::Cancelled,
            TaskStatus::Cancelled,
            TaskStatus::Pending,
            TaskStatus::Pending
        ],
        "lowest ids first"
    );
    // The limit covers cancels and cancel requests together.
    let running = h.claim("w1", 1, None).await.remove(0);
    assert_eq!(running.id, tasks[3].id);
    let outcome = bulk(h, TaskFilter::default(), BulkAction::Cancel, 1).await;
    assert_eq!(outcome.changed + outcome.cancel_requested, 1);
    assert_eq!(get(h, tasks[4].id).await.status, TaskStatus::Cancelled);
    assert!(!has_cancel_request(h, &running).await);

    let waiting = h.task(TaskOpts::default()).await;
    for (limit, ids) in [
        (0, None),
        (BULK_LIMIT_MAX + 1, None),
        (
            10,
            Some(
                (0..=BULK_IDS_MAX as i64)
                    .map(|i| TaskId(waiting.id.0 + i))
                    .collect::<Vec<_>>(),
            ),
        ),
    ] {
        let err = h
            .storage
            .task_bulk(&TaskBulkParams {
                filter: TaskFilter {
                    ids,
                    ..Default::default()
                },
                action: BulkAction::Cancel,
                limit,
                now: None,
            })
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::Invalid(_)), "{err}");
    }
    assert_eq!(get(h, waiting.id).await.status, TaskStatus::Pending);
    assert!(!has_cancel_request(h, &running).await);
    // The largest limit and id list are accepted.
    let outcome = h
        .storage
        .task_bulk(&TaskBulkParams {
            filter: TaskFilter {
                ids: Some(
                    (0..BULK_IDS_MAX as i64)
                        .map(|i| TaskId(waiting.id.0 + i))
                        .collect(),
                ),
                ..Default::default()
            },
            action: BulkAction::Cancel,
            limit: BULK_LIMIT_MAX,
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(outcome.changed, 1);
}

pub async fn a_bulk_filter_value_is_data_not_sql(h: &Harness) {
    let task = h.task(TaskOpts::default()).await;
    for filter in [
        TaskFilter {
            command_type: Some("x' OR '1'='1".into()),
            ..Default::default()
        },
        TaskFilter {
            queue: Some("x' OR '1'='1".into()),
            ..Default::default()
        },
        TaskFilter {
            queue: Some("default\" OR \"1\"=\"1".into()),
            ..Default::default()
        },
    ] {
        let outcome = bulk(h, filter, BulkAction::Cancel, 100).await;
        assert_eq!(outcome, TaskBulkOutcome::default());
    }
    assert_eq!(get(h, task.id).await.status, TaskStatus::Pending);
}

pub async fn list_filters_tasks_by_creation_time(h: &Harness) {
    let t0 = h.storage.now().await.unwrap();
    let at = |hours: i64| t0 + chrono::Duration::hours(hours);
    let mut ids = Vec::new();
    for hours in 1..=3 {
        ids.push(
            h.task(TaskOpts {
                now: Some(at(hours)),
                ..Default::default()
            })
            .await
            .id,
        );
    }
    let list = |created_after: Option<DateTime<Utc>>, created_before: Option<DateTime<Utc>>| async move {
        h.storage
            .task_list(&TaskListParams {
                created_after,
                created_before,
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.id)
            .collect::<Vec<_>>()
    };
    assert_eq!(list(None, None).await, vec![ids[2], ids[1], ids[0]]);
    assert_eq!(list(Some(at(2)), None).await, vec![ids[2], ids[1]]);
    assert_eq!(list(None, Some(at(2))).await, vec![ids[0]]);
    assert_eq!(list(Some(at(2)), Some(at(3))).await, vec![ids[1]]);
    assert!(list(Some(at(4)), None).await.is_empty());
}

pub async fn audit_entries_list_newest_first_with_cursor_and_filters(h: &Harness) {
    let before = h.storage.now().await.unwrap();
    let mut entries = Vec::new();
    for (actor, action, target) in [
        ("cli:alice", "task.cancel", "#1"),
        ("ops-token", "tasks.bulk_retry", "type=A"),
        ("cli:alice", "queue.pause", "mail"),
        ("cli:bob", "task.cancel", "#2"),
    ] {
        let record = h
            .storage
            .audit_append(&AuditAppendParams {
                actor: actor.into(),
                action: action.into(),
                target: target.into(),
                details: serde_json::json!({"filter": {"queue": "x' OR '1'='1"}, "changed": 3}),
                now: None,
            })
            .await
            .unwrap();
        assert_eq!(record.actor, actor);
        assert_eq!(record.action, action);
        assert_eq!(record.target, target);
        assert_eq!(record.details["changed"], 3);
        assert!(record.at >= before - chrono::Duration::seconds(1));
        entries.push(record);
    }
    assert!(entries.windows(2).all(|w| w[0].id < w[1].id));
    let list = |params: AuditListParams| async move {
        h.storage
            .audit_list(&params)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect::<Vec<_>>()
    };
    let ids: Vec<i64> = entries.iter().map(|e| e.id).collect();
    let all = h
        .storage
        .audit_list(&AuditListParams {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut newest_first = entries.clone();
    newest_first.reverse();
    assert_eq!(all, newest_first, "stored as appended, newest first");
    let page = list(AuditListParams {
        limit: 2,
        ..Default::default()
    })
    .await;
    assert_eq!(page, vec![ids[3], ids[2]]);
    let next = list(AuditListParams {
        limit: 2,
        before_id: page.last().copied(),
        ..Default::default()
    })
    .await;
    assert_eq!(next, vec![ids[1], ids[0]]);
    assert_eq!(
        list(AuditListParams {
            limit: 10,
            actor: Some("cli:alice".into()),
            ..Default::default()
        })
        .await,
        vec![ids[2], ids[0]]
    );
    assert_eq!(
        list(AuditListParams {
            limit: 10,
            action: Some("task.cancel".into()),
            actor: Some("cli:bob".into()),
            ..Default::default()
        })
        .await,
        vec![ids[3]]
    );
    assert!(list(AuditListParams {
        limit: 10,
        actor: Some("x' OR '1'='1".into()),
        ..Default::default()
    })
    .await
    .is_empty());
    // The clock override is stored as given.
    let then = before + chrono::Duration::days(1);
    let record = h
        .storage
        .audit_append(&AuditAppendParams {
            actor: "cli:alice".into(),
            action: "schedule.pause".into(),
            target: "nightly".into(),
            details: serde_json::Value::Null,
            now: Some(then),
        })
        .await
        .unwrap();
    assert_eq!(record.at.timestamp_millis(), then.timestamp_millis());
    for limit in [0, crate::AUDIT_LIST_MAX + 1] {
        let err = h
            .storage
            .audit_list(&AuditListParams {
                limit,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::Invalid(_)), "{err}");
    }
    let err = h
        .storage
        .audit_append(&AuditAppendParams {
            actor: String::new(),
            action: "task.cancel".into(),
            target: "#1".into(),
            details: serde_json::Value::Null,
            now: None,
        })
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::Invalid(_)), "{err}");
    assert_eq!(
        list(AuditListParams {
            limit: 1000,
            ..Default::default()
        })
        .await
        .len(),
        5,
        "a refused entry is not stored"
    );
}

pub async fn a_faulty_storage_forwards_bulk_actions_and_the_audit_log(h: &Harness) {
    let faulty = super::FaultyStorage::new(h.storage.clone());
    let task = h.task(TaskOpts::default()).await;
    let outcome = faulty
        .task_bulk(&TaskBulkParams {
            filter: TaskFilter {
                ids: Some(vec![task.id]),
                ..Default::default()
            },
            action: BulkAction::Cancel,
            limit: 1,
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(outcome.changed, 1);
    assert_eq!(get(h, task.id).await.status, TaskStatus::Cancelled);
    let record = faulty
        .audit_append(&AuditAppendParams {
            actor: "cli:alice".into(),
            action: "tasks.bulk_cancel".into(),
            target: format!("ids={}", task.id),
            details: serde_json::json!({"changed": 1}),
            now: None,
        })
        .await
        .unwrap();
    let listed = faulty
        .audit_list(&AuditListParams {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(listed, vec![record]);
}
