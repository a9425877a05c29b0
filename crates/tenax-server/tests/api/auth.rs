//! Every route × no token, a wrong token, and each role; token rotation.
use axum::http::{header, Method, StatusCode};
use serde_json::json;
use tenax_server::{Access, Role, ROUTES};
use tenax_storage::testing::Harness;

use crate::on_every_backend;
use crate::support::*;

/// A request body each POST route accepts.
fn body_for(method: &str, path: &str) -> Option<String> {
    if method != "POST" {
        return None;
    }
    Some(
        match path {
            "/v1/tasks" => json!({"command_type": "echo", "payload": {"n": 1}}),
            "/v1/tasks/batch" => json!({"tasks": [{"command_type": "echo"}]}),
            "/v1/workflows" => json!({"name": "flow", "tasks": [
                {"key": "a", "task": {"command_type": "echo"}},
                {"key": "b", "after": ["a"], "task": {"command_type": "echo"}}
            ]}),
            "/v1/schedules" => {
                json!({"name": "every-minute", "command_type": "echo", "every_secs": 60})
            }
            _ => json!({}),
        }
        .to_string(),
    )
}

/// The route's path with its parameters filled in with things that exist.
fn concrete(path: &str, id: i64) -> String {
    path.replace("{id}", &id.to_string())
        .replace("{task_no}", "seed-1")
        .replace("/schedules/{name}", "/schedules/nightly")
        .replace("/queues/{name}", "/queues/default")
        .replace("/wait", "/wait?timeout_ms=20")
        .replace("/v1/events", "/v1/events?follow=false")
}

fn method(m: &str) -> Method {
    Method::from_bytes(m.as_bytes()).unwrap()
}

/// The router without a port, or the same API on a real socket.
enum Api {
    Router(axum::Router),
    Socket(Served),
}

async fn ask(
    api: &Api,
    method: Method,
    uri: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Answer {
    match api {
        Api::Router(router) => call(router, method, uri, token, body).await,
        Api::Socket(served) => call_socket(served.addr, method, uri, token, body).await,
    }
}

async fn every_route_checks_token_and_role(h: &Harness) {
    matrix(&Api::Router(app(h.storage.clone(), config()))).await;
}

async fn every_route_checks_token_and_role_over_a_socket(h: &Harness) {
    matrix(&Api::Socket(served(h.storage.clone(), config()).await)).await;
}

async fn matrix(app: &Api) {
    let seeded = ask(
        app,
        Method::POST,
        "/v1/tasks",
        Some(ADMIN),
        Some(r#"{"command_type":"echo","task_no":"seed-1"}"#),
    )
    .await;
    assert_eq!(seeded.status, StatusCode::CREATED, "{:?}", seeded.body);
    let id = seeded.body["id"].as_i64().unwrap();
    let roles = [
        (Role::Admin, ADMIN),
        (Role::Enqueue, ENQUEUER),
        (Role::Read, READER),
    ];
    for route in ROUTES {
        // Re-create the schedule each time: an allowed DELETE removes it.
        let schedule = r#"{"name":"nightly","command_type":"echo","cron":"0 30 2 * * *"}"#;
        ask(
            app,
            Method::POST,
            "/v1/schedules",
            Some(ADMIN),
            Some(schedule),
        )
        .await;
        let uri = concrete(route.path, id);
        let body = body_for(route.method, route.path);
        let what = format!("{} {}", route.method, route.path);

        let anonymous = ask(app, method(route.method), &uri, None, body.as_deref()).await;
        let wrong = ask(
            app,
            method(route.method),
            &uri,
            Some("not-a-token"),
            body.as_deref(),
        )
        .await;
        if route.access == Access::Open {
            assert!(
                anonymous.status.is_success(),
                "{what} is open: {:?}",
                anonymous.status
            );
            continue;
        }
        for answer in [&anonymous, &wrong] {
            assert_eq!(
                answer.status,
                StatusCode::UNAUTHORIZED,
                "{what}: {:?}",
                answer.body
            );
            assert_eq!(answer.code(), "unauthorized", "{what}");
            assert_eq!(answer.headers[header::WWW_AUTHENTICATE], "Bearer", "{what}");
        }
        for (role, secret) in roles {
            let answer = ask(
                app,
                method(route.method),
                &uri,
                Some(secret),
                body.as_deref(),
            )
            .await;
            if role.may(route.access) {
                assert!(
                    answer.status != StatusCode::UNAUTHORIZED
                        && answer.status != StatusCode::FORBIDDEN,
                    "{what} as {role:?}: {} {:?}",
                    answer.status,
                    answer.body
                );
                assert!(
                    !answer.status.is_server_error(),
                    "{what} as {role:?}: {:?}",
                    answer.body
                );
            } else {
                assert_eq!(
                    answer.status,
                    StatusCode::FORBIDDEN,
                    "{what} as {role:?}: {:?}",
                    answer.body
                );
                assert_eq!(answer.code(), "forbidden");
            }
        }
    }
    // The expected split, spelled out for the main routes.
    let expect = [
        ("POST", "/v1/tasks", [true, true, false]),
        ("GET", "/v1/tasks", [true, false, true]),
        ("GET", "/v1/tasks/{id}/wait", [true, true, true]),
        ("POST", "/v1/tasks/{id}/cancel", [true, false, false]),
        ("GET", "/v1/stats", [true, false, true]),
        ("DELETE", "/v1/schedules/{name}", [true, false, false]),
    ];
    for (m, path, allowed) in expect {
        let route = ROUTES
            .iter()
            .find(|r| r.method == m && r.path == path)
            .unwrap();
        for ((role, _), allowed) in roles.iter().zip(allowed) {
            assert_eq!(role.may(route.access), allowed, "{m} {path} as {role:?}");
        }
    }
}

async fn both_admin_tokens_work_and_a_removed_one_is_refused(h: &Harness) {
    let app_both = app(h.storage.clone(), config());
    for secret in [ADMIN, ADMIN_2] {
        let answer = call(&app_both, Method::GET, "/v1/queues", Some(secret), None).await;
        assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.body);
    }
    let mut rotated = config();
    rotated.tokens.retain(|t| t.name != "ops-1");
    let app_rotated = app(h.storage.clone(), rotated);
    let old = call(&app_rotated, Method::GET, "/v1/queues", Some(ADMIN), None).await;
    assert_eq!(old.status, StatusCode::UNAUTHORIZED);
    let new = call(&app_rotated, Method::GET, "/v1/queues", Some(ADMIN_2), None).await;
    assert_eq!(new.status, StatusCode::OK);
}

on_every_backend!(
    every_route_checks_token_and_role,
    every_route_checks_token_and_role_over_a_socket,
    both_admin_tokens_work_and_a_removed_one_is_refused
);

#[tokio::test]
async fn without_tokens_only_loopback_is_allowed() {
    let mut config = config();
    config.tokens.clear();
    let warnings = config.validate().unwrap();
    assert!(
        warnings[0].contains("without authentication"),
        "{warnings:?}"
    );
    config.listen = "0.0.0.0:8080".parse().unwrap();
    let err = config.validate().unwrap_err().to_string();
    assert!(
        err.contains("server.tokens") && err.contains("loopback"),
        "{err}"
    );
}

#[tokio::test]
async fn a_token_configured_in_clear_is_refused() {
    let mut config = config();
    config.tokens[0].sha256 = "my-secret-token".to_owned();
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("sha256") && err.contains("64 hex"), "{err}");
}
