//! Conformance cases for inserting and reading tasks: what an insert stores, task
//! numbers as idempotency keys, refused input, time bounds, and lists that leave large
//! values out.
use std::time::Duration;

use chrono::{DateTime, Utc};
use tenax_core::{CompensationState, TaskId, TaskKind, TaskNo, TaskStatus};

use super::compensation::compensation_of;
use super::conformance::{count, fail, lease};
use super::{Harness, TaskOpts};
use crate::{FailNext, RunAt, StorageError, TaskCompleteParams, TaskListParams, TaskRef};

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
