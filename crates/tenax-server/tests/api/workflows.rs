//! Workflows over HTTP: a DAG and a saga enqueued in one request, listed and shown with
//! their tasks; a refused workflow leaves nothing behind.
use axum::http::{Method, StatusCode};
use serde_json::{json, Value};
use tenax::storage::TaskListParams;
use tenax_storage::testing::Harness;

use crate::on_every_backend;
use crate::support::*;

async fn task_count(h: &Harness) -> usize {
    h.storage
        .task_list(&TaskListParams {
            limit: 1000,
            ..TaskListParams::default()
        })
        .await
        .unwrap()
        .len()
}

fn task<'a>(detail: &'a Value, key: &str) -> &'a Value {
    detail["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["key"] == key)
        .unwrap_or_else(|| panic!("no task {key} in {detail}"))
}

async fn a_dag_is_enqueued_in_one_request_and_shown_with_its_parents(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let body = json!({"name": "order 7", "tasks": [
        {"key": "lock", "task": {"command_type": "echo", "payload": {"step": "lock"}}},
        {"key": "pay", "task": {"command_type": "echo", "payload": {"step": "pay"}}},
        {"key": "ship", "after": ["lock", "pay"], "task": {"command_type": "echo"}}
    ]});
    let created = call(
        &app,
        Method::POST,
        "/v1/workflows",
        Some(ENQUEUER),
        Some(&body.to_string()),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    assert_eq!(created.body["workflow"]["kind"], "dag");
    assert_eq!(created.body["workflow"]["state"], "running");
    assert_eq!(created.body["workflow"]["tasks"], 3);
    assert_eq!(task(&created.body, "ship")["task"]["status"], "blocked");
    assert_eq!(task(&created.body, "lock")["task"]["status"], "pending");

    let id = created.body["workflow"]["id"].as_i64().unwrap();
    let shown = call(
        &app,
        Method::GET,
        &format!("/v1/workflows/{id}"),
        Some(ENQUEUER),
        None,
    )
    .await;
    assert_eq!(shown.status, StatusCode::OK, "{}", shown.body);
    assert_eq!(task(&shown.body, "ship")["parents"], json!(["lock", "pay"]));
    assert_eq!(task(&shown.body, "lock")["parents"], json!([]));

    let listed = call(
        &app,
        Method::GET,
        "/v1/workflows?limit=1",
        Some(READER),
        None,
    )
    .await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    assert_eq!(listed.body["workflows"][0]["id"], id);
    assert_eq!(listed.body["workflows"][0]["name"], "order 7");

    let missing = call(
        &app,
        Method::GET,
        "/v1/workflows/999999",
        Some(READER),
        None,
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.code(), "workflow_not_found");
    let bad_cursor = call(
        &app,
        Method::GET,
        "/v1/workflows?cursor=zz",
        Some(READER),
        None,
    )
    .await;
    assert_eq!(bad_cursor.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad_cursor.code(), "bad_cursor");
}

async fn a_saga_chains_its_steps_in_the_order_given(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let body = json!({"name": "saga", "kind": "saga", "tasks": [
        {"key": "reserve", "task": {"command_type": "echo"}},
        {"key": "charge", "task": {"command_type": "echo"}},
        {"key": "ship", "task": {"command_type": "echo"}}
    ]});
    let created = call(
        &app,
        Method::POST,
        "/v1/workflows",
        Some(ADMIN),
        Some(&body.to_string()),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    assert_eq!(created.body["workflow"]["kind"], "saga");
    assert_eq!(task(&created.body, "charge")["parents"], json!(["reserve"]));
    assert_eq!(task(&created.body, "ship")["parents"], json!(["charge"]));
}

async fn a_refused_workflow_enqueues_nothing(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let before = task_count(h).await;
    let refusals = [
        // A cycle.
        json!({"name": "loop", "tasks": [
            {"key": "a", "after": ["b"], "task": {"command_type": "echo"}},
            {"key": "b", "after": ["a"], "task": {"command_type": "echo"}}
        ]}),
        // An unknown parent.
        json!({"name": "orphan", "tasks": [
            {"key": "a", "after": ["nobody"], "task": {"command_type": "echo"}}
        ]}),
        // A command type the server does not accept, in the second task.
        json!({"name": "unknown", "tasks": [
            {"key": "a", "task": {"command_type": "echo"}},
            {"key": "b", "task": {"command_type": "no_such_type"}}
        ]}),
        // A saga step that names its own parents.
        json!({"name": "saga", "kind": "saga", "tasks": [
            {"key": "a", "task": {"command_type": "echo"}},
            {"key": "b", "after": ["a"], "task": {"command_type": "echo"}}
        ]}),
        // Unknown kind and policy, and no tasks.
        json!({"name": "k", "kind": "graph", "tasks": [{"key": "a", "task": {"command_type": "echo"}}]}),
        json!({"name": "p", "policy": "maybe", "tasks": [{"key": "a", "task": {"command_type": "echo"}}]}),
        json!({"name": "empty", "tasks": []}),
    ];
    for body in refusals {
        let answer = call(
            &app,
            Method::POST,
            "/v1/workflows",
            Some(ADMIN),
            Some(&body.to_string()),
        )
        .await;
        assert!(
            answer.status.is_client_error(),
            "{body}: {} {}",
            answer.status,
            answer.body
        );
        answer.code();
    }
    let unknown = call(
        &app,
        Method::POST,
        "/v1/workflows",
        Some(ADMIN),
        Some(
            &json!({"name": "unknown", "tasks": [
                {"key": "a", "task": {"command_type": "echo"}},
                {"key": "b", "task": {"command_type": "no_such_type"}}
            ]})
            .to_string(),
        ),
    )
    .await;
    assert_eq!(unknown.code(), "unknown_command_type");
    assert!(
        unknown.body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("tasks[1]: "),
        "{}",
        unknown.body
    );
    assert_eq!(task_count(h).await, before, "a refusal inserted tasks");
}

on_every_backend!(
    a_dag_is_enqueued_in_one_request_and_shown_with_its_parents,
    a_saga_chains_its_steps_in_the_order_given,
    a_refused_workflow_enqueues_nothing,
);
