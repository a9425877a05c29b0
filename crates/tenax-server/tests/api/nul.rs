//! A NUL character, which PostgreSQL cannot store in text, in every free-text input:
//! refused with a 4xx on every backend or stored and answered as given, never a 500.
//! (Found by the security battery: `GET /v1/audit?actor=%00` answered 500 on
//! PostgreSQL.)
use axum::http::{Method, StatusCode};
use serde_json::json;
use tenax_storage::testing::Harness;

use crate::on_every_backend;
use crate::support::*;

async fn a_nul_character_never_reaches_a_500(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let nul = "a\u{0}b";
    let bodies = [
        json!({"command_type": "echo", "payload": {"text": nul}}),
        json!({"command_type": "echo", "payload": {nul: 1}}),
        json!({"command_type": "echo", "task_no": nul}),
        json!({"command_type": "echo", "concurrency_key": nul}),
        json!({"command_type": "echo", "queue": nul}),
    ];
    for body in bodies {
        let answer = call(
            &app,
            Method::POST,
            "/v1/tasks",
            Some(ADMIN),
            Some(&body.to_string()),
        )
        .await;
        assert!(
            answer.status.is_success() || answer.status.is_client_error(),
            "{body}: {} {:?}",
            answer.status,
            answer.body
        );
        if !answer.status.is_success() {
            answer.code();
        }
    }
    let schedule =
        json!({"name": "n", "command_type": "echo", "every_secs": 60, "payload": {"x": nul}});
    let answer = call(
        &app,
        Method::POST,
        "/v1/schedules",
        Some(ADMIN),
        Some(&schedule.to_string()),
    )
    .await;
    assert!(!answer.status.is_server_error(), "{:?}", answer.body);
    for uri in [
        "/v1/audit?actor=%00",
        "/v1/audit?action=a%00b",
        "/v1/tasks?type=a%00b",
        "/v1/tasks?queue=a%00b",
        "/v1/tasks/by-no/a%00b",
        "/v1/workflows/a%00b",
    ] {
        let answer = call(&app, Method::GET, uri, Some(ADMIN), None).await;
        assert!(
            answer.status.is_client_error(),
            "{uri}: {} {:?}",
            answer.status,
            answer.body
        );
        answer.code();
    }
    let answer = call(&app, Method::GET, "/v1/audit?actor=%00", Some(ADMIN), None).await;
    assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY);
}

on_every_backend!(a_nul_character_never_reaches_a_500);
