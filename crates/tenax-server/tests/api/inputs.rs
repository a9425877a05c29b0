//! Bad input: each a 4xx JSON error and nothing changed; back-pressure; an exhausted
//! pool; secrets never returned.
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use serde_json::json;
use tenax_server::QueueLimit;
use tenax_storage::testing::Harness;

use crate::on_every_backend;
use crate::support::*;

/// What, method, URI, body, expected status and code.
type Case = (
    &'static str,
    Method,
    String,
    Option<String>,
    StatusCode,
    &'static str,
);

async fn bad_input_is_refused_and_changes_nothing(h: &Harness) {
    let app = app(h.storage.clone(), config());
    // Something to refer to.
    let seeded = call(
        &app,
        Method::POST,
        "/v1/tasks",
        Some(ADMIN),
        Some(r#"{"command_type":"echo","task_no":"seed-1","payload":{"a":1}}"#),
    )
    .await;
    assert_eq!(seeded.status, StatusCode::CREATED);
    let before = snapshot(&h.storage).await;

    let big = format!(
        r#"{{"command_type":"echo","payload":{{"blob":"{}"}}}}"#,
        "x".repeat(1024 * 1024 + 10)
    );
    let cases: Vec<Case> = vec![
        ("malformed JSON", Method::POST, "/v1/tasks".into(), Some(r#"{"command_type": "echo", "#.into()), StatusCode::BAD_REQUEST, "invalid_json"),
        ("not an object", Method::POST, "/v1/tasks".into(), Some("[1,2]".into()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        ("missing type", Method::POST, "/v1/tasks".into(), Some(r#"{"payload":{}}"#.into()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        ("unknown field", Method::POST, "/v1/tasks".into(), Some(r#"{"command_type":"echo","priorty":3}"#.into()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        ("unknown command type", Method::POST, "/v1/tasks".into(), Some(r#"{"command_type":"DROP_TABLES"}"#.into()), StatusCode::UNPROCESSABLE_ENTITY, "unknown_command_type"),
        ("payload over the limit", Method::POST, "/v1/tasks".into(), Some(big), StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
        ("priority above 9", Method::POST, "/v1/tasks".into(), Some(r#"{"command_type":"echo","priority":10}"#.into()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        ("negative priority", Method::POST, "/v1/tasks".into(), Some(r#"{"command_type":"echo","priority":-1}"#.into()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        ("negative delay", Method::POST, "/v1/tasks".into(), Some(r#"{"command_type":"echo","delay_ms":-5}"#.into()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        ("absurd delay", Method::POST, "/v1/tasks".into(), Some(r#"{"command_type":"echo","delay_ms":9000000000000000}"#.into()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        ("delay not a number", Method::POST, "/v1/tasks".into(), Some(r#"{"command_type":"echo","delay_ms":"soon"}"#.into()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        ("bad queue name", Method::POST, "/v1/tasks".into(), Some(r#"{"command_type":"echo","queue":"a b"}"#.into()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        ("same task_no, other payload", Method::POST, "/v1/tasks".into(), Some(r#"{"command_type":"echo","task_no":"seed-1","payload":{"a":2}}"#.into()), StatusCode::CONFLICT, "task_no_conflict"),
        ("empty batch", Method::POST, "/v1/tasks/batch".into(), Some(r#"{"tasks":[]}"#.into()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        ("batch over the maximum", Method::POST, "/v1/tasks/batch".into(), Some(json!({"tasks": vec![json!({"command_type":"echo"}); 1001]}).to_string()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        ("invalid cron", Method::POST, "/v1/schedules".into(), Some(r#"{"name":"bad","command_type":"echo","cron":"61 * * * *"}"#.into()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        ("unknown time zone", Method::POST, "/v1/schedules".into(), Some(r#"{"name":"bad","command_type":"echo","cron":"0 * * * *","timezone":"Mars/Olympus"}"#.into()), StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        ("schedule of an unknown type", Method::POST, "/v1/schedules".into(), Some(r#"{"name":"bad","command_type":"nope","every_secs":60}"#.into()), StatusCode::UNPROCESSABLE_ENTITY, "unknown_command_type"),
        ("unknown id", Method::GET, "/v1/tasks/987654321".into(), None, StatusCode::NOT_FOUND, "task_not_found"),
        ("id not a number", Method::GET, "/v1/tasks/abc".into(), None, StatusCode::BAD_REQUEST, "invalid_path"),
        ("cancel an unknown id", Method::POST, "/v1/tasks/987654321/cancel".into(), None, StatusCode::NOT_FOUND, "not_found"),
        ("retry a task that is not dead", Method::POST, format!("/v1/tasks/{}/retry", seeded.body["id"]), None, StatusCode::CONFLICT, "invalid_state"),
        ("unknown task_no", Method::GET, "/v1/tasks/by-no/nope".into(), None, StatusCode::NOT_FOUND, "task_not_found"),
        ("pause an unknown schedule", Method::POST, "/v1/schedules/nope/pause".into(), None, StatusCode::NOT_FOUND, "not_found"),
        ("bad cursor", Method::GET, "/v1/tasks?cursor=zzzz".into(), None, StatusCode::BAD_REQUEST, "bad_cursor"),
        ("forged cursor", Method::GET, format!("/v1/tasks?cursor={}", hex_of("v1:-5")), None, StatusCode::BAD_REQUEST, "bad_cursor"),
        ("unknown status", Method::GET, "/v1/tasks?status=finished".into(), None, StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        ("SQL in the queue filter", Method::GET, "/v1/tasks?queue=x%27%20OR%20%271%27%3D%271".into(), None, StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        ("SQL in the type filter", Method::GET, "/v1/tasks?type=echo%27%3B%20DROP%20TABLE%20tenax_tasks%3B--".into(), None, StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        ("page size zero", Method::GET, "/v1/tasks?limit=0".into(), None, StatusCode::UNPROCESSABLE_ENTITY, "invalid_input"),
        ("unknown query parameter", Method::GET, "/v1/tasks?colour=red".into(), None, StatusCode::BAD_REQUEST, "invalid_query"),
        ("bad time range", Method::GET, "/v1/tasks?created_after=yesterday".into(), None, StatusCode::BAD_REQUEST, "invalid_query"),
        ("unknown route", Method::GET, "/v1/nothing".into(), None, StatusCode::NOT_FOUND, "not_found"),
        ("wrong method", Method::PUT, "/v1/tasks".into(), None, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
    ];
    for (what, method, uri, body, status, code) in cases {
        let answer = call(&app, method, &uri, Some(ADMIN), body.as_deref()).await;
        assert_eq!(answer.status, status, "{what}: {:?}", answer.body);
        assert_eq!(answer.code(), code, "{what}");
    }
    // A SQL-looking string that is a valid name matches nothing and changes nothing.
    let answer = call(
        &app,
        Method::GET,
        "/v1/tasks?type=x%27OR%271%27%3D%271",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body["tasks"], json!([]));
    // A body announced over the limit is refused before it is read.
    let announced = Request::builder()
        .method(Method::POST)
        .uri("/v1/tasks")
        .header(header::AUTHORIZATION, format!("Bearer {ADMIN}"))
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CONTENT_LENGTH, "104857600")
        .body(Body::from("{}"))
        .unwrap();
    let answer = send(&app, announced).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(answer.code(), "payload_too_large");
    // Without a JSON content type.
    let plain = Request::builder()
        .method(Method::POST)
        .uri("/v1/tasks")
        .header(header::AUTHORIZATION, format!("Bearer {ADMIN}"))
        .body(Body::from(r#"{"command_type":"echo"}"#))
        .unwrap();
    let answer = send(&app, plain).await;
    assert_eq!(answer.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(answer.code(), "unsupported_media_type");

    assert_eq!(
        snapshot(&h.storage).await,
        before,
        "a refused request changed the database"
    );
}

fn hex_of(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

async fn enqueue_is_idempotent_by_task_no(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let body = r#"{"command_type":"echo","task_no":"order-7","payload":{"x":1}}"#;
    let first = call(&app, Method::POST, "/v1/tasks", Some(ENQUEUER), Some(body)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let again = call(&app, Method::POST, "/v1/tasks", Some(ENQUEUER), Some(body)).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(first.body["id"], again.body["id"]);
    let other = call(
        &app,
        Method::POST,
        "/v1/tasks",
        Some(ENQUEUER),
        Some(r#"{"command_type":"slow","task_no":"order-7","payload":{"x":1}}"#),
    )
    .await;
    assert_eq!(other.status, StatusCode::CONFLICT);
    assert_eq!(other.code(), "task_no_conflict");
    let by_no = call(
        &app,
        Method::GET,
        "/v1/tasks/by-no/order-7",
        Some(READER),
        None,
    )
    .await;
    assert_eq!(by_no.body["id"], first.body["id"]);
    // A batch: each item has the outcome a single enqueue would have.
    let batch = json!({"tasks": [
        {"command_type": "echo", "task_no": "order-7", "payload": {"x": 1}},
        {"command_type": "echo", "task_no": "order-8"},
        {"command_type": "nope"},
        {"command_type": "echo", "priority": 12},
    ]});
    let answer = call(
        &app,
        Method::POST,
        "/v1/tasks/batch",
        Some(ENQUEUER),
        Some(&batch.to_string()),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.body);
    let statuses: Vec<u64> = answer.body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [200, 201, 422, 422]);
    assert_eq!(
        answer.body["results"][2]["error"]["code"],
        "unknown_command_type"
    );
}

async fn a_full_queue_answers_429_with_retry_after(h: &Harness) {
    let mut config = config();
    config.queues.insert(
        "limited".to_owned(),
        QueueLimit {
            max_pending: Some(2),
        },
    );
    let app = app(h.storage.clone(), config);
    for n in 0..2 {
        let body = json!({"command_type": "echo", "queue": "limited", "task_no": format!("l-{n}")})
            .to_string();
        let answer = call(&app, Method::POST, "/v1/tasks", Some(ENQUEUER), Some(&body)).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{:?}", answer.body);
    }
    let before = snapshot(&h.storage).await;
    let over = call(
        &app,
        Method::POST,
        "/v1/tasks",
        Some(ENQUEUER),
        Some(r#"{"command_type":"echo","queue":"limited"}"#),
    )
    .await;
    assert_eq!(
        over.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{:?}",
        over.body
    );
    assert_eq!(over.code(), "queue_full");
    assert_eq!(over.headers[header::RETRY_AFTER], "1");
    assert_eq!(snapshot(&h.storage).await, before);
    // A repeat of a stored task is still answered with it.
    let repeat = call(
        &app,
        Method::POST,
        "/v1/tasks",
        Some(ENQUEUER),
        Some(r#"{"command_type":"echo","queue":"limited","task_no":"l-0"}"#),
    )
    .await;
    assert_eq!(repeat.status, StatusCode::OK, "{:?}", repeat.body);
    // Other queues are not limited.
    let other = call(
        &app,
        Method::POST,
        "/v1/tasks",
        Some(ENQUEUER),
        Some(r#"{"command_type":"echo"}"#),
    )
    .await;
    assert_eq!(other.status, StatusCode::CREATED);
    // Once a task leaves the queue (cancelled) and the cached count expires, it accepts again.
    let cancel = call(
        &app,
        Method::POST,
        &format!("/v1/tasks/{}/cancel", repeat.body["id"]),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(cancel.status, StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = call(
            &app,
            Method::POST,
            "/v1/tasks",
            Some(ENQUEUER),
            Some(r#"{"command_type":"echo","queue":"limited"}"#),
        )
        .await;
        if answer.status == StatusCode::CREATED {
            break;
        }
        assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(Instant::now() < deadline, "the queue never accepted again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn secret_fields_are_never_returned(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let body = r#"{"command_type":"echo","task_no":"s-1","payload":{"user":"ada","password":"hunter2","card":{"number":"4111","exp":"12/30"}}}"#;
    let created = call(&app, Method::POST, "/v1/tasks", Some(ENQUEUER), Some(body)).await;
    let id = created.body["id"].as_i64().unwrap();
    let listed = call(&app, Method::GET, "/v1/tasks?type=echo", Some(READER), None).await;
    let got = call(
        &app,
        Method::GET,
        &format!("/v1/tasks/{id}"),
        Some(READER),
        None,
    )
    .await;
    for payload in [
        &created.body["payload"],
        &listed.body["tasks"][0]["payload"],
        &got.body["payload"],
    ] {
        assert_eq!(payload["password"], "***");
        assert_eq!(payload["card"]["number"], "***");
        assert_eq!(payload["card"]["exp"], "12/30");
        assert_eq!(payload["user"], "ada");
    }
    for answer in [&created, &listed, &got] {
        assert!(!answer.body.to_string().contains("hunter2"));
    }
    // Stored as given.
    let stored = h
        .storage
        .task_get(&tenax::storage::TaskRef::Id(tenax::TaskId(id)))
        .await
        .unwrap()
        .unwrap();
    assert!(stored.payload.contains("hunter2"));
}

on_every_backend!(
    bad_input_is_refused_and_changes_nothing,
    enqueue_is_idempotent_by_task_no,
    a_full_queue_answers_429_with_retry_after,
    secret_fields_are_never_returned,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_pool_answers_503_within_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("tenax.db").display());
    let storage = tenax::storage::sqlite::SqliteStorage::connect_with(
        &url,
        &tenax::storage::sqlite::SqliteConfig {
            max_connections: 1,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    tenax::storage::Storage::migrate(&storage).await.unwrap();
    // Hold the only connection.
    let held = storage.pool().acquire().await.unwrap();
    let mut config = config();
    config.db_timeout = Duration::from_millis(300);
    let app = app(std::sync::Arc::new(storage), config);
    let started = Instant::now();
    let answer = call(&app, Method::GET, "/v1/tasks", Some(READER), None).await;
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        answer.body
    );
    assert_eq!(answer.code(), "unavailable");
    assert!(answer.headers.contains_key(header::RETRY_AFTER));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );
    let ready = call(&app, Method::GET, "/readyz", None, None).await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(ready.code(), "database_unreachable");
    assert!(ready.headers.contains_key(header::RETRY_AFTER));
    drop(held);
    let ready = call(&app, Method::GET, "/readyz", None, None).await;
    assert_eq!(ready.status, StatusCode::OK);
}
