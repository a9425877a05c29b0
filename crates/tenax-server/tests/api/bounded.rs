//! List answers bounded by bytes as well as rows: a large payload or result is left
//! out with a marker, a page stops at its byte budget, and the cursor reaches every
//! task.
use std::collections::BTreeSet;

use axum::http::{Method, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tenax::storage::{Lease, TaskCompleteParams};
use tenax_core::CompensationState;
use tenax_server::{LIST_PAGE_MAX_BYTES, LIST_VALUE_MAX_BYTES};
use tenax_storage::testing::{Harness, TaskOpts};
use tower::ServiceExt;

use crate::on_every_backend;
use crate::support::*;

/// A JSON object of about `bytes` bytes, told apart by `n`.
fn payload(n: usize, bytes: usize) -> String {
    format!(r#"{{"n":{n},"blob":"{}"}}"#, "x".repeat(bytes))
}

/// The raw body of a GET as the reader token, with its status.
async fn raw_get(app: &axum::Router, uri: &str) -> (StatusCode, Vec<u8>) {
    let response = app
        .clone()
        .oneshot(request(Method::GET, uri, Some(READER), None))
        .await
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, bytes.to_vec())
}

async fn a_list_answer_is_bounded_by_bytes_and_its_cursor_reaches_every_task(h: &Harness) {
    let max = LIST_VALUE_MAX_BYTES as usize;
    // Tasks of 1 MiB payloads, some of them succeeded with a result as large, and
    // enough tasks just under the bound on each value to pass the page's budget.
    let mut large = Vec::new();
    for n in 0..12 {
        let task = h
            .task(TaskOpts {
                payload: payload(n, 1024 * 1024 - 100),
                ..Default::default()
            })
            .await;
        large.push(task.id.0);
    }
    for task in h.claim("w1", 4, None).await {
        let done = h
            .storage
            .task_complete_if_leased(&TaskCompleteParams {
                lease: Lease {
                    id: task.id,
                    epoch: task.lease_epoch,
                },
                result: Some(payload(1000, 1024 * 1024 - 100)),
                compensation: CompensationState::Succeeded,
                now: None,
            })
            .await
            .unwrap();
        assert!(done);
    }
    let mut all: BTreeSet<i64> = large.iter().copied().collect();
    let per_task = max - 200;
    let medium = LIST_PAGE_MAX_BYTES / per_task + 30;
    for n in 0..medium {
        let task = h
            .task(TaskOpts {
                payload: payload(100 + n, per_task),
                ..Default::default()
            })
            .await;
        all.insert(task.id.0);
    }
    assert!(all.len() < 500, "one page by rows: {}", all.len());

    let app = app(h.storage.clone(), config());
    let mut uri = "/v1/tasks?limit=500".to_owned();
    let mut seen = BTreeSet::new();
    let mut pages = 0;
    loop {
        let (status, body) = raw_get(&app, &uri).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        // The envelope around the tasks is a few bytes.
        assert!(
            body.len() <= LIST_PAGE_MAX_BYTES + 1024,
            "{uri}: {} bytes",
            body.len()
        );
        pages += 1;
        let page: Value = serde_json::from_slice(&body).unwrap();
        for task in page["tasks"].as_array().unwrap() {
            let id = task["id"].as_i64().unwrap();
            assert!(seen.insert(id), "task {id} twice");
            let omitted = task["payload_omitted"] == true;
            assert_eq!(omitted, large.contains(&id), "{id}");
            if omitted {
                assert!(task["payload"].is_null(), "{id}");
            } else {
                assert_eq!(task.get("payload_omitted"), None, "{id}");
                assert!(task["payload"]["blob"].is_string(), "{id}");
            }
            if task["status"] == "succeeded" {
                assert_eq!(task["result_omitted"], true, "{id}");
                assert!(task["result"].is_null(), "{id}");
            }
        }
        match page["next_cursor"].as_str() {
            Some(cursor) => uri = format!("/v1/tasks?limit=500&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(seen, all, "the pages together hold every task once");
    assert!(pages >= 2, "the budget cut the first page: {pages} page(s)");
    // Each large task is whole when read alone.
    for (n, id) in large.iter().enumerate() {
        let answer = call(
            &app,
            Method::GET,
            &format!("/v1/tasks/{id}"),
            Some(READER),
            None,
        )
        .await;
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.body.get("payload_omitted"), None);
        let expected: Value = serde_json::from_str(&payload(n, 1024 * 1024 - 100)).unwrap();
        assert_eq!(answer.body["payload"], expected, "task {id}");
        if answer.body["status"] == "succeeded" {
            assert_eq!(answer.body["result"]["n"], 1000, "task {id}");
        }
    }
}

/// A workflow's tasks are a list too: each large value is left out of it.
async fn a_workflows_tasks_leave_large_values_out(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let big = payload(1, 512 * 1024);
    let body = format!(
        r#"{{"name":"flow","tasks":[{{"key":"a","task":{{"command_type":"echo","payload":{big}}}}},
            {{"key":"b","task":{{"command_type":"echo","payload":{{"n":2}}}}}}]}}"#
    );
    let created = call(
        &app,
        Method::POST,
        "/v1/workflows",
        Some(ADMIN),
        Some(&body),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{:?}", created.body);
    let id = created.body["workflow"]["id"].as_i64().unwrap();
    let (status, raw) = raw_get(&app, &format!("/v1/workflows/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        raw.len() < 4 * LIST_VALUE_MAX_BYTES as usize,
        "{} bytes",
        raw.len()
    );
    let detail: Value = serde_json::from_slice(&raw).unwrap();
    let tasks = detail["tasks"].as_array().unwrap();
    assert_eq!(tasks[0]["task"]["payload_omitted"], true);
    assert!(tasks[0]["task"]["payload"].is_null());
    assert_eq!(tasks[1]["task"]["payload"]["n"], 2);
    assert_eq!(tasks[1]["task"].get("payload_omitted"), None);
    let task = tasks[0]["task"]["id"].as_i64().unwrap();
    let whole = call(
        &app,
        Method::GET,
        &format!("/v1/tasks/{task}"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(
        whole.body["payload"],
        serde_json::from_str::<Value>(&big).unwrap()
    );
}

on_every_backend!(
    a_list_answer_is_bounded_by_bytes_and_its_cursor_reaches_every_task,
    a_workflows_tasks_leave_large_values_out
);
