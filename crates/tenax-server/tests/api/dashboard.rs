//! The dashboard through the router: the shell is open and holds no data, fragments
//! need a token of role read or admin, everything is escaped, action buttons follow
//! the role, and every response carries the Content-Security-Policy.
use std::time::Duration;

use axum::http::{header, Method, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::json;
use tenax::storage::{FailNext, Lease, TaskClaimParams, TaskCompleteParams, TaskFailParams};
use tenax::CompensationState;
use tenax_server::{Access, CSP, DASHBOARD_ROUTES};
use tenax_storage::testing::Harness;
use tower::ServiceExt;

use crate::on_every_backend;
use crate::support::*;

/// An answer whose body is text (HTML, script, style).
struct Page {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

async fn get(app: &Router, uri: &str, token: Option<&str>) -> Page {
    let response = app
        .clone()
        .oneshot(request(Method::GET, uri, token, None))
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Page {
        status,
        headers,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

async fn enqueue(app: &Router, body: serde_json::Value) -> i64 {
    let answer = call(
        app,
        Method::POST,
        "/v1/tasks",
        Some(ADMIN),
        Some(&body.to_string()),
    )
    .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    answer.body["id"].as_i64().unwrap()
}

/// Claim the one due task of `command_type` and finish it: succeed, or die.
async fn finish(h: &Harness, command_type: &str, succeed: bool) {
    let claimed = h
        .storage
        .task_claim_batch(&TaskClaimParams {
            worker: "dash-test".into(),
            queues: vec!["default".into()],
            commands: vec![(command_type.into(), 1)],
            limit: 1,
            lease_ttl: Duration::from_secs(60),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "one {command_type} task to claim");
    let lease = Lease {
        id: claimed[0].id,
        epoch: claimed[0].lease_epoch,
    };
    let done = if succeed {
        h.storage
            .task_complete_if_leased(&TaskCompleteParams {
                lease,
                result: Some(r#"{"ok":true}"#.into()),
                compensation: CompensationState::None,
                now: None,
            })
            .await
    } else {
        h.storage
            .task_fail_if_leased(&TaskFailParams {
                lease,
                error: "card declined <b>hard</b>".into(),
                next: FailNext::Dead,
                now: None,
            })
            .await
    };
    assert!(done.unwrap(), "the lease is held");
}

/// Run the compensation of the dead task of `command_type` (successfully).
async fn compensate(h: &Harness, command_type: &str) {
    let claimed = h
        .storage
        .task_claim_batch(&TaskClaimParams {
            worker: "dash-test".into(),
            queues: vec!["default".into()],
            commands: vec![(command_type.into(), 1)],
            limit: 1,
            lease_ttl: Duration::from_secs(60),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "the compensation to claim");
    assert_eq!(claimed[0].kind, tenax::TaskKind::Compensate);
    let done = h
        .storage
        .task_complete_if_leased(&TaskCompleteParams {
            lease: Lease {
                id: claimed[0].id,
                epoch: claimed[0].lease_epoch,
            },
            result: None,
            compensation: CompensationState::Succeeded,
            now: None,
        })
        .await
        .unwrap();
    assert!(done);
}

#[tokio::test]
async fn the_shell_is_open_and_holds_no_data() {
    let h = tenax_storage::testing::sqlite_file().await.unwrap();
    let app = app(h.storage.clone(), config());
    enqueue(
        &app,
        json!({"command_type": "echo", "task_no": "visible-only-with-a-token"}),
    )
    .await;
    let page = get(&app, "/", None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.headers[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert_eq!(page.headers[header::CONTENT_SECURITY_POLICY], CSP);
    assert!(page
        .body
        .contains(r#"<script src="/assets/app.js" defer></script>"#));
    assert!(!page.body.contains("visible-only-with-a-token"));
    // Nothing inline: one script tag, with a src, and no style attribute or element.
    assert_eq!(page.body.matches("<script").count(), 1);
    assert!(!page.body.contains("style=") && !page.body.contains("<style"));

    for (uri, kind) in [
        ("/assets/app.js", "text/javascript"),
        ("/assets/app.css", "text/css"),
    ] {
        let asset = get(&app, uri, None).await;
        assert_eq!(asset.status, StatusCode::OK, "{uri}");
        assert!(asset.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with(kind));
        assert_eq!(asset.headers[header::CONTENT_SECURITY_POLICY], CSP);
        assert!(asset.body.len() > 500, "{uri}");
    }
    // The script keeps the token for the tab only.
    let script = get(&app, "/assets/app.js", None).await.body;
    assert!(script.contains("sessionStorage") && !script.contains("localStorage"));
}

async fn fragments_need_a_token_that_may_read(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let id = enqueue(&app, json!({"command_type": "echo"})).await;
    let fragments: Vec<_> = DASHBOARD_ROUTES
        .iter()
        .filter(|r| r.access != Access::Open)
        .collect();
    assert!(fragments.len() >= 8);
    for route in fragments {
        assert_eq!(route.access, Access::Read, "{}", route.path);
        let uri = route.path.replace("{id}", &id.to_string());
        let uri = if uri.starts_with("/ui/workflows/") {
            "/ui/workflows".to_owned()
        } else {
            uri
        };
        let none = get(&app, &uri, None).await;
        assert_eq!(none.status, StatusCode::UNAUTHORIZED, "{uri}");
        assert!(!none.body.contains("echo"), "{uri}: {}", none.body);
        let wrong = get(&app, &uri, Some("not-a-token")).await;
        assert_eq!(wrong.status, StatusCode::UNAUTHORIZED, "{uri}");
        let enqueuer = get(&app, &uri, Some(ENQUEUER)).await;
        assert_eq!(enqueuer.status, StatusCode::FORBIDDEN, "{uri}");
        for token in [READER, ADMIN] {
            let page = get(&app, &uri, Some(token)).await;
            assert_eq!(page.status, StatusCode::OK, "{uri}: {}", page.body);
            assert_eq!(page.headers[header::CONTENT_SECURITY_POLICY], CSP, "{uri}");
            assert_eq!(page.headers[header::CACHE_CONTROL], "no-store", "{uri}");
            assert!(page.body.starts_with("<div class=\"fragment\""), "{uri}");
        }
    }
    // The JSON API carries the policy too.
    let api = call(&app, Method::GET, "/v1/stats", Some(READER), None).await;
    assert_eq!(api.headers[header::CONTENT_SECURITY_POLICY], CSP);
}

async fn everything_shown_is_escaped_and_secrets_hidden(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let id = enqueue(
        &app,
        json!({"command_type": "echo", "task_no": "x<i>y</i>",
               "payload": {"note": "<script>alert(1)</script>", "password": "hunter2",
                           "card": {"number": "4111111111111111"}}}),
    )
    .await;
    finish(h, "echo", false).await;
    for uri in [
        format!("/ui/tasks/{id}"),
        "/ui/tasks".to_owned(),
        "/ui/dead".to_owned(),
        "/ui/tasks?task_no=x%3Ci%3Ey%3C%2Fi%3E".to_owned(),
    ] {
        let page = get(&app, &uri, Some(READER)).await;
        assert_eq!(page.status, StatusCode::OK, "{uri}: {}", page.body);
        assert!(!page.body.contains("<script"), "{uri}: {}", page.body);
        assert!(
            !page.body.contains("<i>") && !page.body.contains("<b>"),
            "{uri}"
        );
        assert!(
            page.body.contains("x&lt;i&gt;y&lt;/i&gt;"),
            "{uri}: {}",
            page.body
        );
        assert!(
            !page.body.contains("hunter2") && !page.body.contains("4111"),
            "{uri}"
        );
    }
    let detail = get(&app, &format!("/ui/tasks/{id}"), Some(READER))
        .await
        .body;
    assert!(
        detail.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{detail}"
    );
    assert!(detail.contains("&quot;***&quot;"), "{detail}");
    assert!(
        detail.contains("card declined &lt;b&gt;hard&lt;/b&gt;"),
        "{detail}"
    );
}

async fn action_buttons_follow_the_role(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let id = enqueue(&app, json!({"command_type": "echo", "task_no": "will-die"})).await;
    finish(h, "echo", false).await;
    let retry = format!(r#"data-url="/v1/tasks/{id}/retry""#);
    // No retry while the compensation runs (the API would refuse it) ...
    let page = get(&app, "/ui/dead", Some(ADMIN)).await.body;
    assert!(
        page.contains("will-die") && !page.contains(&retry),
        "{page}"
    );
    // ... and one once it has finished.
    compensate(h, "echo").await;
    // A waiting task, so the queue is listed.
    enqueue(&app, json!({"command_type": "echo", "task_no": "waiting"})).await;
    for uri in [
        "/ui/dead".to_owned(),
        format!("/ui/tasks/{id}"),
        "/ui/queues".to_owned(),
    ] {
        let reader = get(&app, &uri, Some(READER)).await.body;
        assert!(!reader.contains("<button"), "{uri}: {reader}");
        assert!(reader.contains(r#"data-role="read""#), "{uri}");
        let admin = get(&app, &uri, Some(ADMIN)).await.body;
        assert!(admin.contains("<button"), "{uri}: {admin}");
        assert!(admin.contains(r#"data-role="admin""#), "{uri}");
        if uri != "/ui/queues" {
            assert!(admin.contains(&retry), "{uri}: {admin}");
        } else {
            assert!(
                admin.contains(r#"data-url="/v1/queues/default/pause""#),
                "{admin}"
            );
        }
    }
    // The API refuses the action to the reader whatever the page shows ...
    let url = format!("/v1/tasks/{id}/retry");
    let refused = call(&app, Method::POST, &url, Some(READER), None).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    // ... and does it for the admin: the task is pending again.
    let done = call(&app, Method::POST, &url, Some(ADMIN), None).await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert_eq!(done.body["status"], "pending");
    let page = get(&app, &format!("/ui/tasks/{id}"), Some(ADMIN))
        .await
        .body;
    assert!(!page.contains(&retry), "{page}");
    assert!(page.contains("status-pending"), "{page}");
}

async fn the_overview_charts_the_counts(h: &Harness) {
    let app = app(h.storage.clone(), config());
    for n in 0..3 {
        enqueue(&app, json!({"command_type": "echo", "payload": {"n": n}})).await;
        finish(h, "echo", true).await;
    }
    enqueue(&app, json!({"command_type": "slow"})).await;
    finish(h, "slow", false).await;
    for n in 0..4 {
        enqueue(
            &app,
            json!({"command_type": "echo", "queue": "billing", "payload": {"n": n}}),
        )
        .await;
    }
    let page = get(&app, "/ui/overview", Some(READER)).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    // Each SVG text element's content sits on a line of its own.
    let body = page.body.replace('\n', "");
    for chart in ["status", "throughput", "latency", "backlog"] {
        let start = body
            .find(&format!(r#"data-chart="{chart}""#))
            .unwrap_or_else(|| panic!("no {chart} chart: {body}"));
        let svg = &body[start..];
        assert!(svg.contains("<svg"), "{chart}");
    }
    assert!(
        body.contains("succeeded 3") && body.contains("dead 1"),
        "{body}"
    );
    // The four waiting in billing, and the dead task's compensation.
    assert!(
        body.contains("pending 5") && body.contains("billing 4"),
        "{body}"
    );
    assert!(body.contains("3 succeeded · 1 dead"), "{body}");
    // The numbers are in the SVG as text, above their bars.
    assert!(
        body.contains(">3</text>") && body.contains(">4</text>"),
        "{body}"
    );
    assert!(
        !body.contains("style="),
        "the policy would block inline styles"
    );
}

on_every_backend!(
    fragments_need_a_token_that_may_read,
    everything_shown_is_escaped_and_secrets_hidden,
    action_buttons_follow_the_role,
    the_overview_charts_the_counts,
);

#[tokio::test]
async fn without_tokens_the_loopback_server_shows_everything() {
    let h = tenax_storage::testing::sqlite_file().await.unwrap();
    let mut config = config();
    config.tokens.clear();
    let app = app(h.storage.clone(), config);
    let page = get(&app, "/ui/queues", None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains(r#"data-role="admin""#));
}
