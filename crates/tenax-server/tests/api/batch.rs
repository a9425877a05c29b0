//! `POST /v1/tasks/batch`: up to `batch_max` tasks checked first and inserted together,
//! each with the outcome a single enqueue would have had; with `atomic`, all or nothing.
use std::collections::HashSet;

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};
use tenax::storage::{TaskListParams, TaskRef};
use tenax_server::{QueueLimit, ServerConfig};
use tenax_storage::testing::Harness;

use crate::on_every_backend;
use crate::support::*;

/// The task numbers stored, every one.
async fn stored_numbers(h: &Harness) -> HashSet<String> {
    h.storage
        .task_list(&TaskListParams {
            limit: 10_000,
            ..TaskListParams::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.task_no.to_string())
        .collect()
}

async fn batch(app: &axum::Router, token: &str, body: &Value) -> Answer {
    call(
        app,
        Method::POST,
        "/v1/tasks/batch",
        Some(token),
        Some(&body.to_string()),
    )
    .await
}

fn statuses(answer: &Answer) -> Vec<u64> {
    answer.body["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results: {} {}", answer.status, answer.body))
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect()
}

fn result(answer: &Answer, index: usize) -> &Value {
    let item = &answer.body["results"][index];
    assert_eq!(item["index"], index, "{item}");
    item
}

fn echo(no: &str, n: i64) -> Value {
    json!({"command_type": "echo", "task_no": no, "payload": {"n": n}})
}

async fn a_batch_of_batch_max_tasks_is_enqueued_and_one_more_is_refused(h: &Harness) {
    assert_eq!(ServerConfig::default().batch_max, 1000);
    let app = app(h.storage.clone(), config());
    let tasks: Vec<Value> = (0..1000).map(|i| echo(&format!("b-{i}"), i)).collect();
    let answer = batch(&app, ENQUEUER, &json!({ "tasks": tasks })).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(statuses(&answer), vec![201; 1000]);
    let mut ids = HashSet::new();
    for i in 0..1000 {
        let item = result(&answer, i);
        assert_eq!(item["task"]["task_no"], format!("b-{i}"), "{item}");
        assert_eq!(item["task"]["payload"], json!({"n": i}), "{item}");
        assert_eq!(item["task"]["created_by"], "shop", "{item}");
        assert!(item["error"].is_null(), "{item}");
        assert!(ids.insert(item["task"]["id"].as_i64().unwrap()), "{item}");
    }
    let expected: HashSet<String> = (0..1000).map(|i| format!("b-{i}")).collect();
    assert_eq!(stored_numbers(h).await, expected);

    let before = snapshot(&h.storage).await;
    let tasks: Vec<Value> = (0..1001).map(|i| echo(&format!("c-{i}"), i)).collect();
    for atomic in [false, true] {
        let answer = batch(&app, ENQUEUER, &json!({"tasks": tasks, "atomic": atomic})).await;
        assert_eq!(
            answer.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{}",
            answer.body
        );
        assert_eq!(answer.code(), "invalid_input");
        assert_eq!(answer.body["error"]["field"], "tasks");
        assert_eq!(
            answer.body["error"]["message"],
            "tasks: give 1 to 1000 tasks, got 1001"
        );
    }
    assert_eq!(snapshot(&h.storage).await, before);
}

async fn a_mixed_batch_enqueues_exactly_its_valid_tasks(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let body = json!({"tasks": [
        echo("m-0", 0),
        {"command_type": "echo", "task_no": "m-1", "priority": 12},
        {"command_type": "nope", "task_no": "m-2"},
        echo("m-3", 3),
        // Refused by the store's own checks, after the request's.
        {"command_type": "echo", "task_no": "m-4", "concurrency_key": " padded"},
        {"command_type": "echo", "payload": {"password": "hunter2", "n": 5}},
    ]});
    let answer = batch(&app, ENQUEUER, &body).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(statuses(&answer), [201, 422, 422, 201, 422, 201]);
    for (index, code, field) in [
        (1, "invalid_input", "tasks[1].priority"),
        (2, "unknown_command_type", "tasks[2].command_type"),
        (4, "invalid_input", "tasks[4]"),
    ] {
        let item = result(&answer, index);
        assert_eq!(item["error"]["code"], code, "{item}");
        assert_eq!(item["error"]["field"], field, "{item}");
        assert!(item["task"].is_null(), "{item}");
    }
    assert!(result(&answer, 4)["error"]["message"]
        .as_str()
        .unwrap()
        .contains("concurrency_key"));
    // A secret field is masked in the answer, as for a single enqueue.
    assert_eq!(result(&answer, 5)["task"]["payload"]["password"], "***");
    let generated = result(&answer, 5)["task"]["task_no"]
        .as_str()
        .unwrap()
        .to_owned();
    let expected: HashSet<String> = ["m-0".to_owned(), "m-3".to_owned(), generated].into();
    assert_eq!(stored_numbers(h).await, expected);
}

async fn an_atomic_batch_with_a_bad_task_enqueues_nothing_and_names_it(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let before = snapshot(&h.storage).await;
    let body = json!({"atomic": true, "tasks": [
        echo("a-0", 0),
        echo("a-1", 1),
        {"command_type": "echo", "task_no": "a-2", "priority": 12},
        echo("a-3", 3),
        {"command_type": "nope", "task_no": "a-4"},
    ]});
    let answer = batch(&app, ENQUEUER, &body).await;
    assert_eq!(
        answer.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        answer.body
    );
    assert_eq!(answer.code(), "batch_refused");
    assert_eq!(answer.body["error"]["field"], "tasks");
    assert_eq!(
        answer.body["error"]["message"],
        "2 of 5 tasks cannot be enqueued; nothing was enqueued"
    );
    assert_eq!(
        answer.body["error"]["items"],
        json!([
            {"index": 2, "status": 422, "code": "invalid_input", "field": "tasks[2].priority",
             "message": "priority: must be 0 to 9, got 12"},
            {"index": 4, "status": 422, "code": "unknown_command_type", "field": "tasks[4].command_type",
             "message": "command type \"nope\" is not accepted by this server (accepted: echo, slow)"},
        ])
    );
    assert_eq!(snapshot(&h.storage).await, before);

    // A task the database refuses (its number holds another payload) is found only
    // inside the transaction: it is rolled back, the new tasks with it.
    let existing = call(
        &app,
        Method::POST,
        "/v1/tasks",
        Some(ENQUEUER),
        Some(&echo("a-held", 1).to_string()),
    )
    .await;
    assert_eq!(existing.status, StatusCode::CREATED, "{}", existing.body);
    let before = snapshot(&h.storage).await;
    let body =
        json!({"atomic": true, "tasks": [echo("a-0", 0), echo("a-held", 2), echo("a-1", 1)]});
    let answer = batch(&app, ENQUEUER, &body).await;
    assert_eq!(
        answer.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        answer.body
    );
    assert_eq!(answer.code(), "batch_refused");
    let items = answer.body["error"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{}", answer.body);
    assert_eq!(items[0]["index"], 1);
    assert_eq!(items[0]["status"], 409);
    assert_eq!(items[0]["code"], "task_no_conflict");
    assert_eq!(items[0]["field"], "tasks[1]");
    assert_eq!(snapshot(&h.storage).await, before);

    // So is a repeat of a task enqueued under another name, even with its payload.
    let admins = call(
        &app,
        Method::POST,
        "/v1/tasks",
        Some(ADMIN),
        Some(&echo("a-admin", 1).to_string()),
    )
    .await;
    assert_eq!(admins.status, StatusCode::CREATED, "{}", admins.body);
    let before = snapshot(&h.storage).await;
    let body = json!({"atomic": true, "tasks": [echo("a-0", 0), echo("a-admin", 1)]});
    let answer = batch(&app, ENQUEUER, &body).await;
    assert_eq!(
        answer.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        answer.body
    );
    let items = answer.body["error"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{}", answer.body);
    assert_eq!(items[0]["index"], 1);
    assert_eq!(items[0]["code"], "task_no_conflict");
    assert_eq!(items[0]["field"], "tasks[1].task_no");
    assert_eq!(snapshot(&h.storage).await, before);

    // Valid, it is enqueued whole; sent again, it answers the same tasks and adds none.
    let body =
        json!({"atomic": true, "tasks": [echo("a-0", 0), echo("a-1", 1), echo("a-held", 1)]});
    let first = batch(&app, ENQUEUER, &body).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.body);
    assert_eq!(statuses(&first), [201, 201, 200]);
    assert_eq!(result(&first, 2)["task"]["id"], existing.body["id"]);
    let after_first = stored_numbers(h).await;
    let again = batch(&app, ENQUEUER, &body).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(statuses(&again), [200, 200, 200]);
    for i in 0..3 {
        assert_eq!(
            result(&again, i)["task"]["id"],
            result(&first, i)["task"]["id"]
        );
    }
    assert_eq!(stored_numbers(h).await, after_first);
}

async fn repeated_numbers_in_a_batch_and_of_existing_tasks_answer_as_single_enqueues(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let existing = call(
        &app,
        Method::POST,
        "/v1/tasks",
        Some(ENQUEUER),
        Some(&echo("d-old", 1).to_string()),
    )
    .await;
    assert_eq!(existing.status, StatusCode::CREATED, "{}", existing.body);
    let body = json!({"tasks": [
        echo("d-old", 1),   // the existing task
        echo("d-old", 2),   // its number with another payload
        echo("d-new", 1),   // new
        echo("d-new", 1),   // the task the item before made
        echo("d-new", 2),   // its number with another payload
    ]});
    let answer = batch(&app, ENQUEUER, &body).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(statuses(&answer), [200, 409, 201, 200, 409]);
    assert_eq!(result(&answer, 0)["task"]["id"], existing.body["id"]);
    assert_eq!(
        result(&answer, 3)["task"]["id"],
        result(&answer, 2)["task"]["id"]
    );
    for index in [1, 4] {
        let item = result(&answer, index);
        assert_eq!(item["error"]["code"], "task_no_conflict", "{item}");
        assert_eq!(item["error"]["field"], format!("tasks[{index}]"), "{item}");
        assert!(item["task"].is_null(), "{item}");
    }
    // The same outcomes as single enqueues of the same requests now.
    for (index, status) in [(0, StatusCode::OK), (1, StatusCode::CONFLICT)] {
        let single = call(
            &app,
            Method::POST,
            "/v1/tasks",
            Some(ENQUEUER),
            Some(&body["tasks"][index].to_string()),
        )
        .await;
        assert_eq!(single.status, status, "{}", single.body);
        if status == StatusCode::CONFLICT {
            assert_eq!(
                single.body["error"]["message"],
                result(&answer, index)["error"]["message"]
            );
        }
    }
    let expected: HashSet<String> = ["d-old".to_owned(), "d-new".to_owned()].into();
    assert_eq!(stored_numbers(h).await, expected);
    // With `atomic`, a repeat inside the batch is no failure; a conflict is.
    let body = json!({"atomic": true, "tasks": [echo("d-2", 1), echo("d-2", 1)]});
    let answer = batch(&app, ENQUEUER, &body).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(statuses(&answer), [201, 200]);
    let body = json!({"atomic": true, "tasks": [echo("d-3", 1), echo("d-3", 2)]});
    let answer = batch(&app, ENQUEUER, &body).await;
    assert_eq!(
        answer.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        answer.body
    );
    assert_eq!(answer.body["error"]["items"][0]["index"], 1);
    assert!(!stored_numbers(h).await.contains("d-3"));
}

async fn a_full_queue_refuses_the_tasks_over_its_maximum(h: &Harness) {
    let mut config = config();
    config.queues.insert(
        "limited".to_owned(),
        QueueLimit {
            max_pending: Some(3),
        },
    );
    let app = app(h.storage.clone(), config);
    let limited = |no: &str| json!({"command_type": "echo", "queue": "limited", "task_no": no});
    let first = call(
        &app,
        Method::POST,
        "/v1/tasks",
        Some(ENQUEUER),
        Some(&limited("q-0").to_string()),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    // Two more fit; then only repeats of a number pass.
    let before = snapshot(&h.storage).await;
    let tasks = json!([
        limited("q-1"),
        limited("q-2"),
        limited("q-3"),
        limited("q-0"),
        limited("q-2"),
        echo("q-other", 0),
    ]);
    let answer = batch(&app, ENQUEUER, &json!({"atomic": true, "tasks": tasks})).await;
    assert_eq!(
        answer.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        answer.body
    );
    let items = answer.body["error"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{}", answer.body);
    assert_eq!(items[0]["index"], 2);
    assert_eq!(items[0]["status"], 429);
    assert_eq!(items[0]["code"], "queue_full");
    assert_eq!(snapshot(&h.storage).await, before);

    let answer = batch(&app, ENQUEUER, &json!({ "tasks": tasks })).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(statuses(&answer), [201, 201, 429, 200, 200, 201]);
    assert_eq!(result(&answer, 2)["error"]["code"], "queue_full");
    let expected: HashSet<String> = ["q-0", "q-1", "q-2", "q-other"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(stored_numbers(h).await, expected);
}

/// Every task enqueued over HTTP is stored under the caller's token name, however it
/// came in: alone, in a batch, in an atomic batch; on a server without tokens, under
/// none. A repeat by another caller keeps the first name.
async fn every_enqueue_stores_the_callers_name(h: &Harness) {
    let stored_by = |no: String| {
        let storage = h.storage.clone();
        async move {
            let task = storage
                .task_get(&TaskRef::No(tenax::TaskNo::new(no.clone()).unwrap()))
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("{no} is not stored"));
            task.created_by
        }
    };
    let app = app(h.storage.clone(), config());
    for (token, name) in [(ENQUEUER, "shop"), (ADMIN, "ops-1")] {
        let single = call(
            &app,
            Method::POST,
            "/v1/tasks",
            Some(token),
            Some(&echo(&format!("{name}-single"), 0).to_string()),
        )
        .await;
        assert_eq!(single.status, StatusCode::CREATED, "{}", single.body);
        assert_eq!(single.body["created_by"], name, "{}", single.body);
        assert_eq!(
            stored_by(format!("{name}-single")).await.as_deref(),
            Some(name)
        );
        for atomic in [false, true] {
            let tasks: Vec<Value> = (0..3)
                .map(|i| echo(&format!("{name}-{atomic}-{i}"), i))
                .collect();
            let body = json!({"atomic": atomic, "tasks": tasks});
            let answer = batch(&app, token, &body).await;
            assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
            assert_eq!(statuses(&answer), [201, 201, 201]);
            for i in 0..3 {
                assert_eq!(result(&answer, i)["task"]["created_by"], name);
                assert_eq!(
                    stored_by(format!("{name}-{atomic}-{i}")).await.as_deref(),
                    Some(name),
                    "atomic {atomic}, task {i}"
                );
            }
        }
    }
    // An admin repeating the enqueue token's task gets it, still under the first name.
    let repeat = batch(
        &app,
        ADMIN,
        &json!({"atomic": true, "tasks": [echo("shop-true-0", 0)]}),
    )
    .await;
    assert_eq!(statuses(&repeat), [200], "{}", repeat.body);
    assert_eq!(
        stored_by("shop-true-0".into()).await.as_deref(),
        Some("shop")
    );

    let mut open = config();
    open.tokens.clear();
    let open = tenax_server::router(tenax_server::AppState::new(h.storage.clone(), open));
    let single = call(
        &open,
        Method::POST,
        "/v1/tasks",
        None,
        Some(&echo("open-single", 0).to_string()),
    )
    .await;
    assert_eq!(single.status, StatusCode::CREATED, "{}", single.body);
    let body = json!({"atomic": true, "tasks": [echo("open-batch", 0)]});
    let answer = call(
        &open,
        Method::POST,
        "/v1/tasks/batch",
        None,
        Some(&body.to_string()),
    )
    .await;
    assert_eq!(statuses(&answer), [201], "{}", answer.body);
    for no in ["open-single", "open-batch"] {
        assert_eq!(stored_by(no.into()).await, None, "{no}");
    }
}

on_every_backend!(
    a_batch_of_batch_max_tasks_is_enqueued_and_one_more_is_refused,
    a_mixed_batch_enqueues_exactly_its_valid_tasks,
    an_atomic_batch_with_a_bad_task_enqueues_nothing_and_names_it,
    repeated_numbers_in_a_batch_and_of_existing_tasks_answer_as_single_enqueues,
    a_full_queue_refuses_the_tasks_over_its_maximum,
    every_enqueue_stores_the_callers_name,
);

#[test]
fn batch_max_is_checked_against_its_limit() {
    for (batch_max, ok) in [(0, false), (1, true), (10_000, true), (10_001, false)] {
        let config = ServerConfig {
            batch_max,
            ..config()
        };
        assert_eq!(config.validate().is_ok(), ok, "{batch_max}");
    }
    assert_eq!(tenax_server::BATCH_MAX_LIMIT, 10_000);
}
