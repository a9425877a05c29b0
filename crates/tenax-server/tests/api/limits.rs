//! Claim controls over HTTP: queue limits. Each write needs an admin token, changes
//! what the library and the CLI read, is recorded in the audit trail under the token's
//! name, and refuses bad input with nothing changed.
use axum::http::{Method, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use tenax::storage::AuditListParams;
use tenax_storage::testing::Harness;

use crate::on_every_backend;
use crate::support::*;

/// The audit trail, oldest first, as `(actor, action, target, details)`.
async fn audit(h: &Harness) -> Vec<(String, String, String, Value)> {
    let mut entries = h
        .storage
        .audit_list(&AuditListParams {
            limit: 1000,
            ..AuditListParams::default()
        })
        .await
        .unwrap();
    entries.reverse();
    entries
        .into_iter()
        .map(|e| (e.actor, e.action, e.target, e.details))
        .collect()
}

/// A write refused to every token that is not admin (403) and without one (401), with
/// nothing changed.
async fn only_admin_may(h: &Harness, app: &Router, method: Method, uri: &str, body: Option<&str>) {
    let before = snapshot(&h.storage).await;
    for secret in [READER, ENQUEUER] {
        let answer = call(app, method.clone(), uri, Some(secret), body).await;
        assert_eq!(
            answer.status,
            StatusCode::FORBIDDEN,
            "{method} {uri} as {secret}: {:?}",
            answer.body
        );
        assert_eq!(answer.code(), "forbidden");
    }
    for token in [None, Some("not-a-token")] {
        let answer = call(app, method.clone(), uri, token, body).await;
        assert_eq!(
            answer.status,
            StatusCode::UNAUTHORIZED,
            "{method} {uri} with {token:?}: {:?}",
            answer.body
        );
        assert_eq!(answer.code(), "unauthorized");
    }
    assert_eq!(
        snapshot(&h.storage).await,
        before,
        "a refused {method} {uri} changed the database"
    );
}

/// Each case refused with 422 `invalid_input` naming `field`, with nothing changed.
async fn refused(h: &Harness, app: &Router, cases: &[(&str, Method, String, Option<Value>, &str)]) {
    let before = snapshot(&h.storage).await;
    for (what, method, uri, body, field) in cases {
        let body = body.as_ref().map(Value::to_string);
        let answer = call(app, method.clone(), uri, Some(ADMIN), body.as_deref()).await;
        assert_eq!(
            answer.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{what}: {:?}",
            answer.body
        );
        assert_eq!(answer.code(), "invalid_input", "{what}");
        assert_eq!(
            answer.body["error"]["field"], *field,
            "{what}: {:?}",
            answer.body
        );
    }
    assert_eq!(
        snapshot(&h.storage).await,
        before,
        "a refused request changed the database"
    );
}

async fn queue_limits_are_set_and_removed_by_an_admin_and_audited(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let client = tenax::Client::new(h.storage.clone());
    let limited = call(
        &app,
        Method::PUT,
        "/v1/queues/billing/limit",
        Some(ADMIN_2),
        Some(r#"{"max_running":3}"#),
    )
    .await;
    assert_eq!(limited.status, StatusCode::OK, "{:?}", limited.body);
    assert_eq!(limited.body["name"], "billing");
    assert_eq!(limited.body["max_running"], 3);
    assert_eq!(limited.body["paused"], false);
    let stored = |name: &'static str| {
        let client = client.clone();
        async move {
            client
                .queues()
                .await
                .unwrap()
                .into_iter()
                .find(|q| q.name == name)
                .unwrap_or_else(|| panic!("queue {name} is not listed"))
        }
    };
    assert_eq!(stored("billing").await.max_running, Some(3));
    // A lower limit replaces it; the list answers it too.
    let lowered = call(
        &app,
        Method::PUT,
        "/v1/queues/billing/limit",
        Some(ADMIN),
        Some(r#"{"max_running":1}"#),
    )
    .await;
    assert_eq!(lowered.status, StatusCode::OK, "{:?}", lowered.body);
    assert_eq!(stored("billing").await.max_running, Some(1));
    let listed = call(&app, Method::GET, "/v1/queues", Some(READER), None).await;
    let billing = listed
        .body
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == "billing");
    assert_eq!(billing.unwrap()["max_running"], 1, "{:?}", listed.body);

    only_admin_may(
        h,
        &app,
        Method::PUT,
        "/v1/queues/billing/limit",
        Some(r#"{"max_running":9}"#),
    )
    .await;
    only_admin_may(h, &app, Method::DELETE, "/v1/queues/billing/limit", None).await;
    let put = |body: Value| Some(body);
    let uri = "/v1/queues/billing/limit".to_owned();
    refused(
        h,
        &app,
        &[
            (
                "zero",
                Method::PUT,
                uri.clone(),
                put(json!({"max_running": 0})),
                "max_running",
            ),
            (
                "negative",
                Method::PUT,
                uri.clone(),
                put(json!({"max_running": -1})),
                "max_running",
            ),
            (
                "over the stores' range",
                Method::PUT,
                uri.clone(),
                put(json!({"max_running": 2_147_483_648_i64})),
                "max_running",
            ),
            (
                "not an integer",
                Method::PUT,
                uri.clone(),
                put(json!({"max_running": 2.5})),
                "max_running",
            ),
            (
                "a string",
                Method::PUT,
                uri.clone(),
                put(json!({"max_running": "3"})),
                "max_running",
            ),
            (
                "null",
                Method::PUT,
                uri.clone(),
                put(json!({"max_running": null})),
                "max_running",
            ),
            (
                "missing",
                Method::PUT,
                uri.clone(),
                put(json!({})),
                "max_running",
            ),
            (
                "unknown field",
                Method::PUT,
                uri.clone(),
                put(json!({"max_running": 2, "max_pending": 5})),
                "max_pending",
            ),
            (
                "bad queue name",
                Method::PUT,
                "/v1/queues/a%20b/limit".into(),
                put(json!({"max_running": 2})),
                "name",
            ),
            (
                "bad queue name on removal",
                Method::DELETE,
                "/v1/queues/a%20b/limit".into(),
                None,
                "name",
            ),
        ],
    )
    .await;
    assert_eq!(stored("billing").await.max_running, Some(1));

    let removed = call(
        &app,
        Method::DELETE,
        "/v1/queues/billing/limit",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(removed.status, StatusCode::OK, "{:?}", removed.body);
    assert_eq!(removed.body["name"], "billing");
    assert_eq!(removed.body["max_running"], Value::Null);
    assert_eq!(stored("billing").await.max_running, None);

    assert_eq!(
        audit(h).await,
        [
            (
                "ops-2".to_owned(),
                "queue.limit".to_owned(),
                "billing".to_owned(),
                json!({"max_running": 3})
            ),
            (
                "ops-1".to_owned(),
                "queue.limit".to_owned(),
                "billing".to_owned(),
                json!({"max_running": 1})
            ),
            (
                "ops-1".to_owned(),
                "queue.unlimit".to_owned(),
                "billing".to_owned(),
                json!({})
            ),
        ]
    );
}

on_every_backend!(queue_limits_are_set_and_removed_by_an_admin_and_audited,);
