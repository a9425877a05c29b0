//! Every route × no token, a wrong token, and each role; token rotation.
use axum::http::{header, Method, StatusCode};
use serde_json::json;
use tenax_server::{Access, Role, ROUTES};
use tenax_storage::testing::Harness;

use crate::on_every_backend;
use crate::support::*;

/// A request body each POST and PUT route accepts.
fn body_for(method: &str, path: &str) -> Option<String> {
    if method != "POST" && method != "PUT" {
        return None;
    }
    Some(
        match path {
            "/v1/queues/{name}/limit" => json!({"max_running": 4}),
            "/v1/rate-limits/{command_type}" => json!({"per_second": 10.0}),
            "/v1/events/rules" => json!({"queue": "default", "enabled": true}),
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

/// What a route's parameters name: a task (by id and number) and a workflow.
#[derive(Clone, Copy)]
struct Seeded<'a> {
    task: i64,
    task_no: &'a str,
    workflow: i64,
}

/// The route's path with its parameters filled in with things that exist.
fn concrete(path: &str, seeded: Seeded<'_>) -> String {
    if path == "/v1/events" {
        // The stream is endless unless told to end once caught up.
        return "/v1/events?follow=false".to_owned();
    }
    path.replace(
        "/v1/workflows/{id}",
        &format!("/v1/workflows/{}", seeded.workflow),
    )
    .replace("{id}", &seeded.task.to_string())
    .replace("{task_no}", seeded.task_no)
    .replace("/schedules/{name}", "/schedules/nightly")
    .replace("/queues/{name}", "/queues/default")
    .replace("{command_type}", "echo")
    .replace("/wait", "/wait?timeout_ms=20")
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
    let flow = body_for("POST", "/v1/workflows");
    let admin_flow = ask(
        app,
        Method::POST,
        "/v1/workflows",
        Some(ADMIN),
        flow.as_deref(),
    )
    .await;
    assert_eq!(
        admin_flow.status,
        StatusCode::CREATED,
        "{:?}",
        admin_flow.body
    );
    // The enqueue token's own task and workflow, beside the admin's.
    let own = ask(
        app,
        Method::POST,
        "/v1/tasks",
        Some(ENQUEUER),
        Some(r#"{"command_type":"echo","task_no":"own-1"}"#),
    )
    .await;
    assert_eq!(own.status, StatusCode::CREATED, "{:?}", own.body);
    let own_flow = ask(
        app,
        Method::POST,
        "/v1/workflows",
        Some(ENQUEUER),
        flow.as_deref(),
    )
    .await;
    assert_eq!(own_flow.status, StatusCode::CREATED, "{:?}", own_flow.body);
    let others = Seeded {
        task: seeded.body["id"].as_i64().unwrap(),
        task_no: "seed-1",
        workflow: admin_flow.body["workflow"]["id"].as_i64().unwrap(),
    };
    let owned = Seeded {
        task: own.body["id"].as_i64().unwrap(),
        task_no: "own-1",
        workflow: own_flow.body["workflow"]["id"].as_i64().unwrap(),
    };
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
        let uri = concrete(route.path, others);
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
            if role == Role::Enqueue && route.access == Access::TaskRead {
                // Another's task or workflow is not found; its own is.
                assert_eq!(
                    answer.status,
                    StatusCode::NOT_FOUND,
                    "{what} of another as {role:?}: {:?}",
                    answer.body
                );
                let mine = ask(
                    app,
                    method(route.method),
                    &concrete(route.path, owned),
                    Some(secret),
                    body.as_deref(),
                )
                .await;
                assert!(
                    mine.status.is_success(),
                    "{what} of its own as {role:?}: {} {:?}",
                    mine.status,
                    mine.body
                );
            } else if role.may(route.access) {
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

const TILL: &str = "till-token";

/// Every read an enqueue token may make, of a task (by id and number) and of a
/// workflow, as the routes table lists them: each URI with the name it asks by.
fn task_reads(task: i64, task_no: &str, workflow: i64) -> Vec<(String, String)> {
    let seeded = Seeded {
        task,
        task_no,
        workflow,
    };
    let reads: Vec<(String, String)> = ROUTES
        .iter()
        .filter(|r| r.access == Access::TaskRead)
        .map(|r| {
            let name = if r.path.contains("{task_no}") {
                task_no.to_owned()
            } else if r.path.starts_with("/v1/workflows/") {
                workflow.to_string()
            } else {
                task.to_string()
            };
            (concrete(r.path, seeded), name)
        })
        .collect();
    assert_eq!(reads.len(), 5, "a new task read: check it here {reads:?}");
    reads
}

async fn an_enqueue_token_reads_only_the_tasks_enqueued_under_its_name(h: &Harness) {
    let mut config = config();
    config.tokens.push(token("till", Role::Enqueue, TILL));
    let app = app(h.storage.clone(), config);
    let post = |secret: &'static str, uri: &'static str, body: serde_json::Value| {
        let app = app.clone();
        async move {
            call(
                &app,
                Method::POST,
                uri,
                Some(secret),
                Some(&body.to_string()),
            )
            .await
        }
    };
    let flow = |no: &str| json!({"name": "flow", "tasks": [{"key": "a", "task": {"command_type": "echo", "task_no": no}}]});
    let shop = post(
        ENQUEUER,
        "/v1/tasks",
        json!({"command_type": "echo", "task_no": "shop-1", "payload": {"n": 1}}),
    )
    .await;
    let till = post(
        TILL,
        "/v1/tasks/batch",
        json!({"tasks": [{"command_type": "echo", "task_no": "till-1"}]}),
    )
    .await;
    let admin = post(
        ADMIN,
        "/v1/tasks",
        json!({"command_type": "echo", "task_no": "admin-1"}),
    )
    .await;
    let shop_flow = post(ENQUEUER, "/v1/workflows", flow("shop-flow-1")).await;
    let till_flow = post(TILL, "/v1/workflows", flow("till-flow-1")).await;
    let admin_flow = post(ADMIN, "/v1/workflows", flow("admin-flow-1")).await;
    for answer in [&shop, &admin, &shop_flow, &till_flow, &admin_flow] {
        assert_eq!(answer.status, StatusCode::CREATED, "{:?}", answer.body);
    }
    assert_eq!(till.body["results"][0]["status"], 201, "{:?}", till.body);
    let library = h
        .task(tenax_storage::testing::TaskOpts {
            task_no: Some("library-1".to_owned()),
            command_type: "echo".to_owned(),
            ..Default::default()
        })
        .await;
    // Each task holds the name it was enqueued under, on every way in.
    let id = |answer: &Answer| answer.body["id"].as_i64().unwrap();
    let workflow = |answer: &Answer| answer.body["workflow"]["id"].as_i64().unwrap();
    let first_task = |answer: &Answer| answer.body["tasks"][0]["task"]["id"].as_i64().unwrap();
    let till_id = till.body["results"][0]["task"]["id"].as_i64().unwrap();
    for (task, name) in [
        (id(&shop), Some("shop")),
        (till_id, Some("till")),
        (id(&admin), Some("ops-1")),
        (first_task(&shop_flow), Some("shop")),
        (first_task(&till_flow), Some("till")),
        (library.id.0, None),
    ] {
        let stored = h
            .storage
            .task_get(&tenax_storage::TaskRef::Id(tenax_core::TaskId(task)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored.created_by.as_deref(), name, "task {task}");
    }
    let get = |uri: String, secret: &'static str| {
        let app = app.clone();
        async move { call(&app, Method::GET, &uri, Some(secret), None).await }
    };
    for (uri, _) in task_reads(id(&shop), "shop-1", workflow(&shop_flow)) {
        let answer = get(uri.clone(), ENQUEUER).await;
        assert!(
            answer.status.is_success(),
            "{uri}: {} {:?}",
            answer.status,
            answer.body
        );
    }
    // An id and a number no task has, and an id no workflow has: another's task or
    // workflow is answered word for word as these are.
    let nothing = i64::from(i32::MAX);
    let missing = task_reads(nothing, "nobody-1", nothing);
    let others = [
        task_reads(till_id, "till-1", workflow(&till_flow)),
        task_reads(id(&admin), "admin-1", workflow(&admin_flow)),
        task_reads(library.id.0, "library-1", workflow(&admin_flow)),
        task_reads(first_task(&till_flow), "till-flow-1", workflow(&till_flow)),
    ];
    for reads in &others {
        for ((missing_uri, missing_name), (uri, name)) in missing.iter().zip(reads) {
            let not_found = get(missing_uri.clone(), ENQUEUER).await;
            assert_eq!(not_found.status, StatusCode::NOT_FOUND, "{missing_uri}");
            let expected = not_found
                .body
                .to_string()
                .replace(missing_name.as_str(), name);
            let answer = get(uri.clone(), ENQUEUER).await;
            assert_eq!(
                answer.status,
                StatusCode::NOT_FOUND,
                "{uri} as shop: {:?}",
                answer.body
            );
            assert_eq!(answer.body.to_string(), expected, "{uri} as shop");
            // Admin and read tokens read every one.
            for secret in [ADMIN, READER] {
                let answer = get(uri.clone(), secret).await;
                assert!(
                    answer.status.is_success(),
                    "{uri}: {} {:?}",
                    answer.status,
                    answer.body
                );
            }
        }
    }
    // Repeating another's number gets neither its task nor a hint of its payload: the
    // same conflict whether the payload matches or not, alone or in a batch.
    let repeat = |n: i64| json!({"command_type": "echo", "task_no": "shop-1", "payload": {"n": n}});
    let same = post(TILL, "/v1/tasks", repeat(1)).await;
    let other = post(TILL, "/v1/tasks", repeat(2)).await;
    assert_eq!(same.status, StatusCode::CONFLICT, "{:?}", same.body);
    assert_eq!(same.body, other.body);
    let batch = post(
        TILL,
        "/v1/tasks/batch",
        json!({"tasks": [repeat(1), repeat(2)]}),
    )
    .await;
    for item in [&batch.body["results"][0], &batch.body["results"][1]] {
        assert_eq!(item["status"], 409, "{item}");
        assert!(item["task"].is_null(), "{item}");
        assert_eq!(
            item["error"]["message"], same.body["error"]["message"],
            "{item}"
        );
    }
    // Its own repeat is its task, as before.
    let again = post(ENQUEUER, "/v1/tasks", repeat(1)).await;
    assert_eq!(again.status, StatusCode::OK, "{:?}", again.body);
    assert_eq!(id(&again), id(&shop));
}

on_every_backend!(
    an_enqueue_token_reads_only_the_tasks_enqueued_under_its_name,
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
