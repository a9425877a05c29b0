//! Operator actions over HTTP: the audit trail of a retry, bulk actions by filter, and
//! the time-range filters of the task list.
use std::time::Duration;

use axum::http::{Method, StatusCode};
use serde_json::json;
use tenax::storage::{FailNext, Lease, TaskClaimParams, TaskCompleteParams, TaskFailParams};
use tenax::CompensationState;
use tenax_storage::testing::Harness;

use crate::on_every_backend;
use crate::support::*;

/// `n` dead tasks of type `slow` (one attempt each), by id.
async fn dead_tasks(h: &Harness, app: &axum::Router, n: usize) -> Vec<i64> {
    let mut ids = Vec::new();
    for _ in 0..n {
        let created = call(
            app,
            Method::POST,
            "/v1/tasks",
            Some(ENQUEUER),
            Some(r#"{"command_type":"slow","max_attempts":1}"#),
        )
        .await;
        assert_eq!(created.status, StatusCode::CREATED, "{:?}", created.body);
        ids.push(created.body["id"].as_i64().unwrap());
    }
    let claimed = h
        .storage
        .task_claim_batch(&TaskClaimParams {
            worker: "test".to_owned(),
            queues: vec!["default".to_owned()],
            commands: vec![("slow".to_owned(), 1)],
            limit: n as u32,
            lease_ttl: Duration::from_secs(30),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), n);
    for task in claimed {
        let failed = h
            .storage
            .task_fail_if_leased(&TaskFailParams {
                lease: Lease {
                    id: task.id,
                    epoch: task.lease_epoch,
                },
                error: "boom".to_owned(),
                next: FailNext::Dead,
                now: None,
            })
            .await
            .unwrap();
        assert!(failed);
    }
    // Their compensations run (none defined), so the dead tasks may be retried.
    let compensations = h
        .storage
        .task_claim_batch(&TaskClaimParams {
            worker: "test".to_owned(),
            queues: vec!["default".to_owned()],
            commands: vec![("slow".to_owned(), 1)],
            limit: n as u32,
            lease_ttl: Duration::from_secs(30),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(compensations.len(), n);
    for task in compensations {
        let done = h
            .storage
            .task_complete_if_leased(&TaskCompleteParams {
                lease: Lease {
                    id: task.id,
                    epoch: task.lease_epoch,
                },
                result: None,
                compensation: CompensationState::None,
                now: None,
            })
            .await
            .unwrap();
        assert!(done);
    }
    ids
}

async fn a_retry_is_recorded_in_the_audit_trail_with_the_token_name(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let id = dead_tasks(h, &app, 1).await[0];
    let retried = call(
        &app,
        Method::POST,
        &format!("/v1/tasks/{id}/retry"),
        Some(ADMIN_2),
        None,
    )
    .await;
    assert_eq!(retried.status, StatusCode::OK, "{:?}", retried.body);
    assert_eq!(retried.body["status"], "pending");
    let audit = call(
        &app,
        Method::GET,
        "/v1/audit?action=task.retry",
        Some(READER),
        None,
    )
    .await;
    assert_eq!(audit.status, StatusCode::OK, "{:?}", audit.body);
    let entries = audit.body["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["actor"], "ops-2");
    assert_eq!(entries[0]["action"], "task.retry");
    assert_eq!(entries[0]["target"], id.to_string());
    assert!(entries[0]["at"].is_string());
    // A refused retry (the task is no longer dead) records nothing.
    let again = call(
        &app,
        Method::POST,
        &format!("/v1/tasks/{id}/retry"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    let audit = call(&app, Method::GET, "/v1/audit", Some(READER), None).await;
    assert_eq!(audit.body["entries"].as_array().unwrap().len(), 1);
    // Filtered by actor.
    let none = call(
        &app,
        Method::GET,
        "/v1/audit?actor=ops-1",
        Some(READER),
        None,
    )
    .await;
    assert_eq!(none.body["entries"], json!([]));
    let bad = call(
        &app,
        Method::GET,
        "/v1/audit?cursor=nope",
        Some(READER),
        None,
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad.code(), "bad_cursor");
}

async fn bulk_actions_change_what_the_filter_matches_and_are_audited(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let dead = dead_tasks(h, &app, 3).await;
    let pending = call(
        &app,
        Method::POST,
        "/v1/tasks",
        Some(ENQUEUER),
        Some(r#"{"command_type":"echo"}"#),
    )
    .await;
    let pending_id = pending.body["id"].as_i64().unwrap();

    let before = snapshot(&h.storage).await;
    for (what, path, body) in [
        (
            "limit 0",
            "/v1/tasks/bulk/retry",
            json!({"filter": {"statuses": ["dead"]}, "limit": 0}),
        ),
        (
            "limit over the maximum",
            "/v1/tasks/bulk/cancel",
            json!({"limit": 100_001}),
        ),
        (
            "unknown status",
            "/v1/tasks/bulk/cancel",
            json!({"filter": {"statuses": ["gone"]}}),
        ),
        (
            "SQL in the queue",
            "/v1/tasks/bulk/cancel",
            json!({"filter": {"queue": "x' OR '1'='1"}}),
        ),
        (
            "no priority",
            "/v1/tasks/bulk/reprioritise",
            json!({"filter": {}}),
        ),
        (
            "priority out of range",
            "/v1/tasks/bulk/reprioritise",
            json!({"priority": 10}),
        ),
        (
            "too many ids",
            "/v1/tasks/bulk/cancel",
            json!({"filter": {"ids": vec![1; 10_001]}}),
        ),
        (
            "empty time range",
            "/v1/tasks/bulk/cancel",
            json!({"filter": {"created_after": "2030-01-01T00:00:00Z", "created_before": "2020-01-01T00:00:00Z"}}),
        ),
    ] {
        let answer = call(
            &app,
            Method::POST,
            path,
            Some(ADMIN),
            Some(&body.to_string()),
        )
        .await;
        assert_eq!(
            answer.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{what}: {:?}",
            answer.body
        );
        assert_eq!(answer.code(), "invalid_input", "{what}");
    }
    assert_eq!(
        snapshot(&h.storage).await,
        before,
        "a refused bulk action changed the database"
    );

    let retried = call(
        &app,
        Method::POST,
        "/v1/tasks/bulk/retry",
        Some(ADMIN),
        Some(
            &json!({"filter": {"statuses": ["dead"], "command_type": "slow"}, "limit": 2})
                .to_string(),
        ),
    )
    .await;
    assert_eq!(retried.status, StatusCode::OK, "{:?}", retried.body);
    assert_eq!(retried.body["changed"], 2);
    let still_dead = call(
        &app,
        Method::GET,
        "/v1/tasks?status=dead",
        Some(READER),
        None,
    )
    .await;
    assert_eq!(still_dead.body["tasks"].as_array().unwrap().len(), 1);

    let raised = call(
        &app,
        Method::POST,
        "/v1/tasks/bulk/reprioritise",
        Some(ADMIN),
        Some(&json!({"filter": {"ids": [pending_id]}, "priority": 9}).to_string()),
    )
    .await;
    assert_eq!(raised.body["changed"], 1, "{:?}", raised.body);
    let task = call(
        &app,
        Method::GET,
        &format!("/v1/tasks/{pending_id}"),
        Some(READER),
        None,
    )
    .await;
    assert_eq!(task.body["priority"], 9);

    let cancelled = call(
        &app,
        Method::POST,
        "/v1/tasks/bulk/cancel",
        Some(ADMIN),
        Some(&json!({"filter": {"statuses": ["pending"]}}).to_string()),
    )
    .await;
    assert_eq!(cancelled.body["changed"], 3, "{:?}", cancelled.body);
    let task = call(
        &app,
        Method::GET,
        &format!("/v1/tasks/{}", dead[0]),
        Some(READER),
        None,
    )
    .await;
    assert!(["cancelled", "dead"].contains(&task.body["status"].as_str().unwrap()));

    let audit = call(&app, Method::GET, "/v1/audit?limit=10", Some(READER), None).await;
    let actions: Vec<&str> = audit.body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "tasks.bulk_cancel",
            "tasks.bulk_reprioritise",
            "tasks.bulk_retry"
        ]
    );
    assert_eq!(audit.body["entries"][2]["details"]["changed"], 2);
    assert_eq!(audit.body["entries"][2]["actor"], "ops-1");
}

async fn the_task_list_filters_by_creation_time_and_pages_with_a_cursor(h: &Harness) {
    let app = app(h.storage.clone(), config());
    for n in 0..5 {
        let body = json!({"command_type": "echo", "task_no": format!("page-{n}")}).to_string();
        call(&app, Method::POST, "/v1/tasks", Some(ENQUEUER), Some(&body)).await;
    }
    let future = call(
        &app,
        Method::GET,
        "/v1/tasks?created_after=2999-01-01T00:00:00Z",
        Some(READER),
        None,
    )
    .await;
    assert_eq!(future.body["tasks"], json!([]));
    let past = call(
        &app,
        Method::GET,
        "/v1/tasks?created_before=2999-01-01T00:00:00Z&created_after=2000-01-01T00:00:00Z",
        Some(READER),
        None,
    )
    .await;
    assert_eq!(past.body["tasks"].as_array().unwrap().len(), 5);
    let mut seen = Vec::new();
    let mut uri = "/v1/tasks?limit=2".to_owned();
    loop {
        let page = call(&app, Method::GET, &uri, Some(READER), None).await;
        assert_eq!(page.status, StatusCode::OK, "{:?}", page.body);
        for task in page.body["tasks"].as_array().unwrap() {
            seen.push(task["task_no"].as_str().unwrap().to_owned());
        }
        match page.body["next_cursor"].as_str() {
            Some(cursor) => uri = format!("/v1/tasks?limit=2&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(seen, ["page-4", "page-3", "page-2", "page-1", "page-0"]);
}

on_every_backend!(
    a_retry_is_recorded_in_the_audit_trail_with_the_token_name,
    bulk_actions_change_what_the_filter_matches_and_are_audited,
    the_task_list_filters_by_creation_time_and_pages_with_a_cursor,
);
