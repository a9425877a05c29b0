//! Conformance cases for workflows: dependencies, propagation and sagas.
use std::time::{Duration, Instant};

use tenax_core::{CompensationState, TaskKind, TaskRecord, TaskStatus};

use super::bulk_insert::numbered;
use super::Harness;
use crate::{
    FailNext, Lease, StorageError, TaskActionParams, TaskCompleteParams, TaskFailParams,
    TaskListParams, TaskRef, WorkflowDetail, WorkflowInsertParams, WorkflowKind,
    WorkflowListParams, WorkflowPolicy, WorkflowState, WorkflowTaskParams,
};

/// A workflow of factory tasks: `(key, parents)`, numbered `<prefix>-<key>`.
pub fn workflow(
    prefix: &str,
    kind: WorkflowKind,
    policy: WorkflowPolicy,
    tasks: &[(&str, &[&str])],
) -> WorkflowInsertParams {
    WorkflowInsertParams {
        name: format!("{prefix} flow"),
        kind,
        policy,
        tasks: tasks
            .iter()
            .enumerate()
            .map(|(i, (key, after))| WorkflowTaskParams {
                key: (*key).to_owned(),
                task: numbered(&format!("{prefix}-{key}"), i),
                after: after.iter().map(|a| (*a).to_owned()).collect(),
            })
            .collect(),
        now: None,
    }
}

fn lease(task: &TaskRecord) -> Lease {
    Lease {
        id: task.id,
        epoch: task.lease_epoch,
    }
}

pub(super) async fn complete(h: &Harness, task: &TaskRecord, result: &str) {
    assert!(h
        .storage
        .task_complete_if_leased(&TaskCompleteParams {
            lease: lease(task),
            result: Some(result.to_owned()),
            compensation: CompensationState::Succeeded,
            now: None,
        })
        .await
        .unwrap());
}

pub(super) async fn kill(h: &Harness, task: &TaskRecord) {
    assert!(h
        .storage
        .task_fail_if_leased(&TaskFailParams {
            lease: lease(task),
            error: "permanent".to_owned(),
            next: FailNext::Dead,
            now: None,
        })
        .await
        .unwrap());
}

pub(super) async fn status_of(h: &Harness, detail: &WorkflowDetail, key: &str) -> TaskStatus {
    let id = detail.tasks.iter().find(|t| t.key == key).unwrap().task.id;
    h.storage
        .task_get(&TaskRef::Id(id))
        .await
        .unwrap()
        .unwrap()
        .status
}

pub(super) fn keys(claimed: &[TaskRecord]) -> Vec<String> {
    let mut keys: Vec<String> = claimed
        .iter()
        .map(|t| {
            t.task_no
                .as_str()
                .split_once('-')
                .map_or("", |(_, k)| k)
                .to_owned()
        })
        .collect();
    keys.sort();
    keys
}

pub(super) async fn state(h: &Harness, detail: &WorkflowDetail) -> WorkflowState {
    h.storage
        .workflow_get(detail.workflow.id)
        .await
        .unwrap()
        .unwrap()
        .workflow
        .state
}

pub async fn a_child_waits_blocked_until_all_its_parents_succeeded(h: &Harness) {
    let flow = workflow(
        "fanin",
        WorkflowKind::Dag,
        WorkflowPolicy::CancelDependents,
        &[("a", &[]), ("b", &[]), ("c", &["a", "b"])],
    );
    let detail = h.storage.workflow_insert(&flow).await.unwrap();
    assert_eq!(detail.tasks.len(), 3);
    assert_eq!(detail.tasks[2].parents, ["a", "b"]);
    assert_eq!(detail.tasks[2].task.status, TaskStatus::Blocked);
    assert_eq!(detail.workflow.state, WorkflowState::Running);
    let claimed = h.claim("w", 10, None).await;
    assert_eq!(keys(&claimed), ["a", "b"]);
    complete(h, &claimed[0], r#"{"from":"first"}"#).await;
    assert_eq!(status_of(h, &detail, "c").await, TaskStatus::Blocked);
    assert!(h.claim("w", 10, None).await.is_empty());
    complete(h, &claimed[1], r#"{"from":"second"}"#).await;
    assert_eq!(status_of(h, &detail, "c").await, TaskStatus::Pending);
    let c = h.claim("w", 10, None).await;
    assert_eq!(keys(&c), ["c"]);
    // The child reads its parents' results.
    let parents = h.storage.task_parent_results(c[0].id).await.unwrap();
    let mut seen: Vec<(String, Option<String>)> = parents
        .into_iter()
        .map(|p| {
            assert_eq!(p.status, TaskStatus::Succeeded);
            (p.key, p.result)
        })
        .collect();
    seen.sort();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].0, "a");
    assert_eq!(seen[1].0, "b");
    assert!(seen.iter().all(|(_, r)| r.is_some()));
    assert!(h
        .storage
        .task_parent_results(claimed[0].id)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(state(h, &detail).await, WorkflowState::Running);
    complete(h, &c[0], "{}").await;
    let done = h
        .storage
        .workflow_get(detail.workflow.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.workflow.state, WorkflowState::Succeeded);
    assert!(done.workflow.finished_at.is_some());
    let listed = h
        .storage
        .workflow_list(&WorkflowListParams {
            before_id: None,
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, WorkflowState::Succeeded);
    assert_eq!(listed[0].tasks(), 3);
}

pub async fn fan_out_and_fan_in_with_a_thousand_children_stay_efficient(h: &Harness) {
    let children: Vec<String> = (0..1000).map(|i| format!("c{i}")).collect();
    let mut tasks: Vec<(&str, Vec<&str>)> = vec![("root", vec![])];
    tasks.extend(children.iter().map(|c| (c.as_str(), vec!["root"])));
    tasks.push(("sink", children.iter().map(String::as_str).collect()));
    let spec: Vec<(&str, &[&str])> = tasks.iter().map(|(k, a)| (*k, a.as_slice())).collect();
    let started = Instant::now();
    let detail = h
        .storage
        .workflow_insert(&workflow(
            "fan",
            WorkflowKind::Dag,
            WorkflowPolicy::CancelDependents,
            &spec,
        ))
        .await
        .unwrap();
    let insert_took = started.elapsed();
    assert_eq!(detail.tasks.len(), 1002);
    let root = h.claim("w", 10, None).await;
    assert_eq!(keys(&root), ["root"]);
    // One transaction moves the thousand children to pending.
    let started = Instant::now();
    complete(h, &root[0], "{}").await;
    let unblock_took = started.elapsed();
    let waiting = |status| TaskListParams {
        status: Some(status),
        limit: 5000,
        ..Default::default()
    };
    let pending = h
        .storage
        .task_list(&waiting(TaskStatus::Pending))
        .await
        .unwrap();
    assert_eq!(pending.len(), 1000);
    let blocked = h
        .storage
        .task_list(&waiting(TaskStatus::Blocked))
        .await
        .unwrap();
    assert_eq!(keys(&blocked), ["sink"]);
    let mut done = 0;
    while done < 1000 {
        let batch = h.claim("w", 200, None).await;
        assert!(!batch.is_empty(), "children left unclaimable after {done}");
        for task in &batch {
            assert_ne!(
                task.task_no.as_str(),
                "fan-sink",
                "the sink ran before its parents"
            );
            complete(h, task, "{}").await;
            done += 1;
            let sink = status_of(h, &detail, "sink").await;
            if done < 1000 {
                assert_eq!(sink, TaskStatus::Blocked, "after {done} children");
            } else {
                assert_eq!(sink, TaskStatus::Pending);
            }
        }
    }
    assert_eq!(done, 1000);
    let sink = h.claim("w", 10, None).await;
    assert_eq!(keys(&sink), ["sink"]);
    assert!(
        insert_took < Duration::from_secs(20) && unblock_took < Duration::from_secs(5),
        "insert {insert_took:?}, unblock {unblock_took:?}"
    );
}

pub async fn a_dead_or_cancelled_parent_cancels_its_dependents_transitively(h: &Harness) {
    let spec: &[(&str, &[&str])] = &[
        ("a", &[]),
        ("b", &["a"]),
        ("c", &["b"]),
        ("d", &["a"]),
        ("e", &[]),
    ];
    let detail = h
        .storage
        .workflow_insert(&workflow(
            "prop",
            WorkflowKind::Dag,
            WorkflowPolicy::CancelDependents,
            spec,
        ))
        .await
        .unwrap();
    let claimed = h.claim("w", 10, None).await;
    assert_eq!(keys(&claimed), ["a", "e"]);
    let a = claimed
        .iter()
        .find(|t| t.task_no.as_str() == "prop-a")
        .unwrap();
    kill(h, a).await;
    for key in ["b", "c", "d"] {
        assert_eq!(
            status_of(h, &detail, key).await,
            TaskStatus::Cancelled,
            "{key}"
        );
    }
    assert_eq!(state(h, &detail).await, WorkflowState::Running);
    let e = claimed
        .iter()
        .find(|t| t.task_no.as_str() == "prop-e")
        .unwrap();
    complete(h, e, "{}").await;
    assert_eq!(state(h, &detail).await, WorkflowState::Failed);

    // Cancelling a waiting task cancels its dependents too.
    let detail = h
        .storage
        .workflow_insert(&workflow(
            "cancel",
            WorkflowKind::Dag,
            WorkflowPolicy::CancelDependents,
            &[("x", &[]), ("y", &["x"]), ("z", &["y"])],
        ))
        .await
        .unwrap();
    h.storage
        .task_cancel(&TaskActionParams {
            task: TaskRef::Id(detail.tasks[0].task.id),
            now: None,
        })
        .await
        .unwrap();
    for key in ["x", "y", "z"] {
        assert_eq!(
            status_of(h, &detail, key).await,
            TaskStatus::Cancelled,
            "{key}"
        );
    }
    // A blocked task can be cancelled directly; its dependents follow.
    let detail = h
        .storage
        .workflow_insert(&workflow(
            "blocked",
            WorkflowKind::Dag,
            WorkflowPolicy::CancelDependents,
            &[("p", &[]), ("q", &["p"]), ("r", &["q"])],
        ))
        .await
        .unwrap();
    h.storage
        .task_cancel(&TaskActionParams {
            task: TaskRef::Id(detail.tasks[1].task.id),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(status_of(h, &detail, "p").await, TaskStatus::Pending);
    assert_eq!(status_of(h, &detail, "r").await, TaskStatus::Cancelled);
}

pub async fn with_run_anyway_dependents_run_once_every_parent_finished(h: &Harness) {
    let detail = h
        .storage
        .workflow_insert(&workflow(
            "anyway",
            WorkflowKind::Dag,
            WorkflowPolicy::RunAnyway,
            &[("a", &[]), ("b", &[]), ("c", &["a", "b"])],
        ))
        .await
        .unwrap();
    let claimed = h.claim("w", 10, None).await;
    kill(h, &claimed[0]).await;
    assert_eq!(status_of(h, &detail, "c").await, TaskStatus::Blocked);
    complete(h, &claimed[1], "{}").await;
    assert_eq!(status_of(h, &detail, "c").await, TaskStatus::Pending);
}

pub async fn cycles_and_unknown_references_are_refused_and_insert_nothing(h: &Harness) {
    let dag = |tasks: &[(&str, &[&str])]| {
        workflow(
            "bad",
            WorkflowKind::Dag,
            WorkflowPolicy::CancelDependents,
            tasks,
        )
    };
    let cases: Vec<(WorkflowInsertParams, &str)> = vec![
        (
            dag(&[("a", &["c"]), ("b", &["a"]), ("c", &["b"]), ("d", &[])]),
            "cycle",
        ),
        (dag(&[("a", &[]), ("b", &["nope"])]), "not in the workflow"),
        (dag(&[("a", &["a"])]), "itself"),
        (dag(&[("a", &[]), ("a", &[])]), "used twice"),
        (dag(&[]), "1 to"),
        (
            workflow(
                "bad",
                WorkflowKind::Saga,
                WorkflowPolicy::CancelDependents,
                &[("a", &[]), ("b", &[])],
            ),
            "step",
        ),
    ];
    for (params, expected) in cases {
        match h.storage.workflow_insert(&params).await {
            Err(StorageError::Invalid(invalid)) => {
                assert!(invalid.reason.contains(expected), "{expected}: {invalid}");
            }
            other => panic!("{expected}: expected a refusal, got {other:?}"),
        }
    }
    // A task_no that exists refuses the whole workflow.
    h.storage.task_insert(&numbered("bad-b", 1)).await.unwrap();
    let err = h
        .storage
        .workflow_insert(&dag(&[("a", &[]), ("b", &["a"])]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    assert_eq!(h.storage.stats().await.unwrap().total(), 1);
    assert!(h
        .storage
        .workflow_list(&WorkflowListParams {
            before_id: None,
            limit: 10
        })
        .await
        .unwrap()
        .is_empty());
}

/// Claim the one claimable task, which must be `expected` (a key, or `<key>~` for its
/// compensation), and finish it.
pub(super) async fn step(h: &Harness, expected: &str, succeed: bool) {
    let claimed = h.claim("w", 10, None).await;
    assert_eq!(
        claimed.len(),
        1,
        "expected only {expected}: {:?}",
        keys(&claimed)
    );
    let task = &claimed[0];
    let key = task
        .task_no
        .as_str()
        .split(':')
        .next()
        .and_then(|n| n.split_once('-'))
        .map_or("", |(_, k)| k);
    let shown = match task.kind {
        TaskKind::Execute => key.to_owned(),
        TaskKind::Compensate => format!("{key}~"),
    };
    assert_eq!(shown, expected);
    if succeed {
        complete(h, task, "{}").await;
    } else {
        kill(h, task).await;
    }
}

pub async fn a_saga_compensates_the_steps_before_a_dead_step_in_reverse_order(h: &Harness) {
    let saga = |prefix: &str| {
        workflow(
            prefix,
            WorkflowKind::Saga,
            WorkflowPolicy::CancelDependents,
            &[
                ("s1", &[]),
                ("s2", &["s1"]),
                ("s3", &["s2"]),
                ("s4", &["s3"]),
            ],
        )
    };
    let detail = h.storage.workflow_insert(&saga("order")).await.unwrap();
    step(h, "s1", true).await;
    step(h, "s2", true).await;
    step(h, "s3", false).await;
    assert_eq!(status_of(h, &detail, "s4").await, TaskStatus::Cancelled);
    assert_eq!(state(h, &detail).await, WorkflowState::Compensating);
    // One compensation at a time, the dead step first, then backwards.
    step(h, "s3~", true).await;
    step(h, "s2~", true).await;
    assert_eq!(state(h, &detail).await, WorkflowState::Compensating);
    step(h, "s1~", true).await;
    let done = h
        .storage
        .workflow_get(detail.workflow.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.workflow.state, WorkflowState::Compensated);
    assert!(done.workflow.finished_at.is_some());
    for t in &done.tasks[..3] {
        assert_eq!(
            t.task.compensation,
            Some(CompensationState::Succeeded),
            "{}",
            t.key
        );
    }
    assert!(h.claim("w", 10, None).await.is_empty());

    // All steps succeed: completed.
    let ok = h.storage.workflow_insert(&saga("fine")).await.unwrap();
    for s in ["s1", "s2", "s3"] {
        step(h, s, true).await;
        assert_eq!(state(h, &ok).await, WorkflowState::Running);
    }
    step(h, "s4", true).await;
    assert_eq!(state(h, &ok).await, WorkflowState::Completed);

    // A compensation that dies: compensation_failed, and the chain stops there.
    let bad = h.storage.workflow_insert(&saga("bad")).await.unwrap();
    step(h, "s1", true).await;
    step(h, "s2", false).await;
    step(h, "s2~", false).await;
    assert_eq!(state(h, &bad).await, WorkflowState::CompensationFailed);
    assert!(h.claim("w", 10, None).await.is_empty());
    // The operator retries the dead compensation: the chain goes on to the end.
    let dead = h
        .storage
        .task_list(&TaskListParams {
            status: Some(TaskStatus::Dead),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.kind == TaskKind::Compensate)
        .unwrap();
    h.storage
        .task_retry(&TaskActionParams {
            task: TaskRef::Id(dead.id),
            now: None,
        })
        .await
        .unwrap();
    step(h, "s2~", true).await;
    assert_eq!(state(h, &bad).await, WorkflowState::Compensating);
    step(h, "s1~", true).await;
    assert_eq!(state(h, &bad).await, WorkflowState::Compensated);
}

/// A bulk cancel is a cancel: it must move a workflow's dependents exactly as
/// [`Storage::task_cancel`](crate::Storage::task_cancel) does, or they wait `blocked`
/// forever behind a parent that will never succeed.
pub async fn bulk_cancel_of_a_workflow_task_cancels_its_dependents(h: &Harness) {
    let detail = h
        .storage
        .workflow_insert(&workflow(
            "bulk",
            WorkflowKind::Dag,
            WorkflowPolicy::CancelDependents,
            &[("x", &[]), ("y", &["x"]), ("z", &["y"]), ("w", &[])],
        ))
        .await
        .unwrap();
    let x = detail.tasks[0].task.id;
    let outcome = h
        .storage
        .task_bulk(&crate::TaskBulkParams {
            filter: crate::TaskFilter {
                ids: Some(vec![x]),
                ..Default::default()
            },
            action: crate::BulkAction::Cancel,
            limit: 10,
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(outcome.changed, 1, "only x matches the filter");
    for key in ["x", "y", "z"] {
        assert_eq!(
            status_of(h, &detail, key).await,
            TaskStatus::Cancelled,
            "{key}"
        );
    }
    assert_eq!(status_of(h, &detail, "w").await, TaskStatus::Pending);
    // With run-anyway, a bulk-cancelled parent lets its child run.
    let detail = h
        .storage
        .workflow_insert(&workflow(
            "bulk-anyway",
            WorkflowKind::Dag,
            WorkflowPolicy::RunAnyway,
            &[("p", &[]), ("q", &["p"])],
        ))
        .await
        .unwrap();
    h.storage
        .task_bulk(&crate::TaskBulkParams {
            filter: crate::TaskFilter {
                ids: Some(vec![detail.tasks[0].task.id]),
                ..Default::default()
            },
            action: crate::BulkAction::Cancel,
            limit: 10,
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(status_of(h, &detail, "p").await, TaskStatus::Cancelled);
    assert_eq!(status_of(h, &detail, "q").await, TaskStatus::Pending);
}

/// A task names its workflow; a task enqueued alone, a compensation task and an unknown
/// id name none.
pub async fn a_task_names_its_workflow(h: &Harness) {
    let flow = workflow(
        "owner",
        WorkflowKind::Dag,
        WorkflowPolicy::CancelDependents,
        &[("a", &[]), ("b", &["a"])],
    );
    let detail = h.storage.workflow_insert(&flow).await.unwrap();
    for task in &detail.tasks {
        assert_eq!(
            h.storage.task_workflow(task.task.id).await.unwrap(),
            Some(detail.workflow.id),
            "{}",
            task.key
        );
    }
    let alone = h
        .storage
        .task_insert(&numbered("owner-alone", 9))
        .await
        .unwrap()
        .task;
    assert_eq!(h.storage.task_workflow(alone.id).await.unwrap(), None);
    assert_eq!(
        h.storage
            .task_workflow(tenax_core::TaskId(i64::MAX))
            .await
            .unwrap(),
        None
    );
    // The compensation of a dead workflow task is a task of its own.
    let claimed = h.claim("w", 10, None).await;
    let a = claimed
        .iter()
        .find(|t| t.id == detail.tasks[0].task.id)
        .unwrap();
    kill(h, a).await;
    let compensations = h
        .storage
        .task_list(&TaskListParams {
            limit: 100,
            ..TaskListParams::default()
        })
        .await
        .unwrap()
        .into_iter()
        .filter(|t| t.kind == TaskKind::Compensate && t.parent_id == Some(a.id))
        .collect::<Vec<_>>();
    assert_eq!(compensations.len(), 1);
    assert_eq!(
        h.storage.task_workflow(compensations[0].id).await.unwrap(),
        None
    );
}
