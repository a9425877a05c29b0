//! Malformed JSON and values (reliability S5): each answer is an error with its code,
//! the exact request field at fault (or none, when the body as a whole is not JSON) and
//! a message, and nothing is written.
use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use serde_json::json;
use tenax::storage::TaskListParams;
use tenax_storage::testing::Harness;

use crate::on_every_backend;
use crate::support::*;

/// What, method, URI, body bytes, expected status, code and field.
struct Case {
    what: &'static str,
    method: Method,
    uri: &'static str,
    body: Option<Vec<u8>>,
    status: StatusCode,
    code: &'static str,
    field: Option<&'static str>,
}

fn post(
    what: &'static str,
    uri: &'static str,
    body: impl Into<Vec<u8>>,
    status: StatusCode,
    code: &'static str,
    field: Option<&'static str>,
) -> Case {
    Case {
        what,
        method: Method::POST,
        uri,
        body: Some(body.into()),
        status,
        code,
        field,
    }
}

fn get(
    what: &'static str,
    uri: &'static str,
    status: StatusCode,
    code: &'static str,
    field: Option<&'static str>,
) -> Case {
    Case {
        what,
        method: Method::GET,
        uri,
        body: None,
        status,
        code,
        field,
    }
}

async fn task_count(h: &Harness) -> usize {
    h.storage
        .task_list(&TaskListParams {
            limit: 10_000,
            ..TaskListParams::default()
        })
        .await
        .expect("list tasks")
        .len()
}

async fn malformed_json_and_values_name_their_field_and_write_nothing(h: &Harness) {
    const BAD: StatusCode = StatusCode::BAD_REQUEST;
    const INVALID: StatusCode = StatusCode::UNPROCESSABLE_ENTITY;
    let app = app(h.storage.clone(), config());
    let seeded = call(
        &app,
        Method::POST,
        "/v1/tasks",
        Some(ADMIN),
        Some(r#"{"command_type":"echo","task_no":"s5-seed"}"#),
    )
    .await;
    assert_eq!(seeded.status, StatusCode::CREATED, "{:?}", seeded.body);
    let before = snapshot(&h.storage).await;
    let count = task_count(h).await;

    let long_no = json!({"command_type": "echo", "task_no": "n".repeat(256)}).to_string();
    let mut bom = "\u{feff}".as_bytes().to_vec();
    bom.extend_from_slice(br#"{"command_type":"echo","task_no":"s5-bom"}"#);
    let cases = vec![
        // Truncated: inside a value the decoder says where; between fields it cannot.
        post("truncated in the payload", "/v1/tasks", &br#"{"command_type":"echo","task_no":"s5-a","payload":{"a":"#[..], BAD, "invalid_json", Some("payload.a")),
        post("truncated in a string", "/v1/tasks", &br#"{"command_type":"ec"#[..], BAD, "invalid_json", Some("command_type")),
        post("truncated between fields", "/v1/tasks", &br#"{"command_type":"echo","#[..], BAD, "invalid_json", None),
        post("invalid UTF-8", "/v1/tasks", &b"{\"command_type\":\"echo\",\"task_no\":\"s5-\xff\xfe\"}"[..], BAD, "invalid_json", Some("task_no")),
        post("a byte-order mark", "/v1/tasks", bom, BAD, "invalid_json", None),
        post("trailing bytes", "/v1/tasks", &br#"{"command_type":"echo"} {}"#[..], BAD, "invalid_json", None),
        post("duplicate field", "/v1/tasks", &br#"{"command_type":"echo","priority":1,"priority":2}"#[..], INVALID, "invalid_input", Some("priority")),
        post("duplicate key in the payload", "/v1/tasks", &br#"{"command_type":"echo","payload":{"to":"a","to":"b"}}"#[..], INVALID, "invalid_input", Some("payload.to")),
        post("duplicate key deep in the payload", "/v1/tasks", &br#"{"command_type":"echo","payload":{"x":[{"k":1,"k":1}]}}"#[..], INVALID, "invalid_input", Some("payload.x[0].k")),
        post("wrong type of command_type", "/v1/tasks", &br#"{"command_type":7}"#[..], INVALID, "invalid_input", Some("command_type")),
        post("wrong type of priority", "/v1/tasks", &br#"{"command_type":"echo","priority":"high"}"#[..], INVALID, "invalid_input", Some("priority")),
        post("wrong type of tasks", "/v1/tasks/batch", &br#"{"tasks":"many"}"#[..], INVALID, "invalid_input", Some("tasks")),
        post("wrong type in a batch item", "/v1/tasks/batch", &br#"{"tasks":[{"command_type":"echo"},{"command_type":"echo","payload_version":"one"}]}"#[..], INVALID, "invalid_input", Some("tasks[1].payload_version")),
        post("missing command_type", "/v1/tasks", &br#"{"payload":{}}"#[..], INVALID, "invalid_input", Some("command_type")),
        post("unknown field", "/v1/tasks", &br#"{"command_type":"echo","priorty":3}"#[..], INVALID, "invalid_input", Some("priorty")),
        post("priority -1", "/v1/tasks", &br#"{"command_type":"echo","priority":-1}"#[..], INVALID, "invalid_input", Some("priority")),
        post("priority 10", "/v1/tasks", &br#"{"command_type":"echo","priority":10}"#[..], INVALID, "invalid_input", Some("priority")),
        post("1e400", "/v1/tasks", &br#"{"command_type":"echo","priority":1e400}"#[..], BAD, "invalid_json", Some("priority")),
        post("1e400 in the payload", "/v1/tasks", &br#"{"command_type":"echo","payload":{"n":1e400}}"#[..], BAD, "invalid_json", Some("payload.n")),
        post("empty task_no", "/v1/tasks", &br#"{"command_type":"echo","task_no":""}"#[..], INVALID, "invalid_input", Some("task_no")),
        post("task_no of 256 bytes", "/v1/tasks", long_no, INVALID, "invalid_input", Some("task_no")),
        post("empty task_no in a workflow", "/v1/workflows", json!({"name": "s5", "tasks": [{"key": "a", "task": {"command_type": "echo", "task_no": ""}}]}).to_string(), INVALID, "invalid_input", Some("tasks[0].task.task_no")),
        post("priority 10 in a schedule", "/v1/schedules", &br#"{"name":"s5","command_type":"echo","every_secs":60,"priority":10}"#[..], INVALID, "invalid_input", Some("priority")),
        post("unknown time zone", "/v1/schedules", &br#"{"name":"s5","command_type":"echo","cron":"0 * * * *","timezone":"Mars/Olympus"}"#[..], INVALID, "invalid_input", Some("timezone")),
        post("bulk priority 10", "/v1/tasks/bulk/reprioritise", &br#"{"filter":{"statuses":["pending"]},"priority":10}"#[..], INVALID, "invalid_input", Some("priority")),
        post("bulk unknown status", "/v1/tasks/bulk/cancel", &br#"{"filter":{"statuses":["finished"]}}"#[..], INVALID, "invalid_input", Some("filter.statuses")),
        // Query-string filters and path parameters.
        get("unknown status filter", "/v1/tasks?status=finished", INVALID, "invalid_input", Some("status")),
        get("limit not a number", "/v1/tasks?limit=ten", BAD, "invalid_query", Some("limit")),
        get("limit zero", "/v1/tasks?limit=0", INVALID, "invalid_input", Some("limit")),
        get("bad type filter", "/v1/tasks?type=a%20b", INVALID, "invalid_input", Some("type")),
        get("bad queue filter", "/v1/tasks?queue=a%20b", INVALID, "invalid_input", Some("queue")),
        get("forged cursor", "/v1/tasks?cursor=zz", BAD, "bad_cursor", Some("cursor")),
        get("unknown query parameter", "/v1/tasks?colour=red", BAD, "invalid_query", Some("colour")),
        get("id not a number", "/v1/tasks/abc", BAD, "invalid_path", Some("id")),
        get("task_no with a space in the path", "/v1/tasks/by-no/a%20b", INVALID, "invalid_input", Some("task_no")),
    ];
    for case in &cases {
        let mut request = Request::builder()
            .method(case.method.clone())
            .uri(case.uri)
            .header(header::AUTHORIZATION, format!("Bearer {ADMIN}"));
        if case.body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let body = case.body.clone().map_or_else(Body::empty, Body::from);
        let answer = send(&app, request.body(body).expect("a request")).await;
        let what = case.what;
        assert_eq!(answer.status, case.status, "{what}: {}", answer.body);
        assert_eq!(answer.code(), case.code, "{what}: {}", answer.body);
        assert_eq!(
            answer.body["error"]["field"].as_str(),
            case.field,
            "{what}: {}",
            answer.body
        );
        if case.field.is_none() {
            assert!(
                answer.body["error"].get("field").is_none(),
                "{what}: an unknown field is left out, not null: {}",
                answer.body
            );
        }
        let message = answer.body["error"]["message"].as_str().unwrap_or("");
        assert!(!message.trim().is_empty(), "{what}: empty message");
        assert_eq!(task_count(h).await, count, "{what}: a task was written");
    }

    // In a batch, each refused item names its field under `tasks[i]`.
    let batch = json!({"tasks": [
        {"command_type": "echo", "priority": 10},
        {"command_type": "nope"},
        {"command_type": "echo", "task_no": ""},
    ]});
    let answer = call(
        &app,
        Method::POST,
        "/v1/tasks/batch",
        Some(ADMIN),
        Some(&batch.to_string()),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let fields: Vec<(u64, &str, &str)> = answer.body["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| {
            (
                r["status"].as_u64().unwrap_or(0),
                r["error"]["code"].as_str().unwrap_or(""),
                r["error"]["field"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        fields,
        [
            (422, "invalid_input", "tasks[0].priority"),
            (422, "unknown_command_type", "tasks[1].command_type"),
            (422, "invalid_input", "tasks[2].task_no"),
        ]
    );

    assert_eq!(task_count(h).await, count, "a refused request wrote a task");
    assert_eq!(
        snapshot(&h.storage).await,
        before,
        "a refused request changed the database"
    );
    // The same body without its faults is accepted: the refusals were about the faults.
    let fine = call(
        &app,
        Method::POST,
        "/v1/tasks",
        Some(ADMIN),
        Some(r#"{"command_type":"echo","task_no":"s5-fine","priority":9,"payload":{"to":"a"}}"#),
    )
    .await;
    assert_eq!(fine.status, StatusCode::CREATED, "{}", fine.body);
    assert_eq!(task_count(h).await, count + 1);
}

on_every_backend!(malformed_json_and_values_name_their_field_and_write_nothing);
