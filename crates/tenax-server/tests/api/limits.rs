//! Claim controls over HTTP: queue limits, rate limits per command type and event
//! rules. Each write needs an admin token, changes what the library and the CLI read,
//! is recorded in the audit trail under the token's name, and refuses bad input with
//! nothing changed.
use axum::http::{Method, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tenax::storage::AuditListParams;
use tenax_storage::testing::Harness;
use tower::ServiceExt;

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

async fn rate_limits_are_set_listed_and_removed_by_an_admin_and_audited(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let client = tenax::Client::new(h.storage.clone());
    let empty = call(&app, Method::GET, "/v1/rate-limits", Some(READER), None).await;
    assert_eq!(empty.status, StatusCode::OK, "{:?}", empty.body);
    assert_eq!(empty.body, json!([]));
    let stored = || {
        let client = client.clone();
        async move {
            client
                .rate_limits()
                .await
                .unwrap()
                .into_iter()
                .map(|l| (l.command_type, l.per_second, l.burst))
                .collect::<Vec<_>>()
        }
    };

    // Without a burst: the rate rounded up, at least 1.
    let set = call(
        &app,
        Method::PUT,
        "/v1/rate-limits/echo",
        Some(ADMIN_2),
        Some(r#"{"per_second":2.5}"#),
    )
    .await;
    assert_eq!(set.status, StatusCode::OK, "{:?}", set.body);
    assert_eq!(
        set.body,
        json!({"command_type": "echo", "per_second": 2.5, "burst": 3})
    );
    let slow = call(
        &app,
        Method::PUT,
        "/v1/rate-limits/slow",
        Some(ADMIN),
        Some(r#"{"per_second":0.5}"#),
    )
    .await;
    assert_eq!(slow.body["burst"], 1, "{:?}", slow.body);
    // A type this server does not accept may be limited: workers elsewhere run it.
    let mailer = call(
        &app,
        Method::PUT,
        "/v1/rate-limits/mailer",
        Some(ADMIN),
        Some(r#"{"per_second":1000000,"burst":1000000}"#),
    )
    .await;
    assert_eq!(mailer.status, StatusCode::OK, "{:?}", mailer.body);
    // Setting it again changes rate and burst.
    let changed = call(
        &app,
        Method::PUT,
        "/v1/rate-limits/echo",
        Some(ADMIN),
        Some(r#"{"per_second":20,"burst":40}"#),
    )
    .await;
    assert_eq!(changed.status, StatusCode::OK, "{:?}", changed.body);
    assert_eq!(
        stored().await,
        [
            ("echo".to_owned(), 20.0, 40),
            ("mailer".to_owned(), 1_000_000.0, 1_000_000),
            ("slow".to_owned(), 0.5, 1),
        ]
    );
    let listed = call(&app, Method::GET, "/v1/rate-limits", Some(READER), None).await;
    assert_eq!(
        listed.body,
        json!([
            {"command_type": "echo", "per_second": 20.0, "burst": 40},
            {"command_type": "mailer", "per_second": 1_000_000.0, "burst": 1_000_000},
            {"command_type": "slow", "per_second": 0.5, "burst": 1},
        ])
    );
    let forbidden = call(&app, Method::GET, "/v1/rate-limits", Some(ENQUEUER), None).await;
    assert_eq!(
        forbidden.status,
        StatusCode::FORBIDDEN,
        "{:?}",
        forbidden.body
    );
    let anonymous = call(&app, Method::GET, "/v1/rate-limits", None, None).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);

    only_admin_may(
        h,
        &app,
        Method::PUT,
        "/v1/rate-limits/echo",
        Some(r#"{"per_second":1}"#),
    )
    .await;
    only_admin_may(
        h,
        &app,
        Method::PUT,
        "/v1/rate-limits/fresh",
        Some(r#"{"per_second":1}"#),
    )
    .await;
    only_admin_may(h, &app, Method::DELETE, "/v1/rate-limits/echo", None).await;
    let uri = "/v1/rate-limits/echo".to_owned();
    let long_type = format!("/v1/rate-limits/{}", "t".repeat(101));
    refused(
        h,
        &app,
        &[
            (
                "rate zero",
                Method::PUT,
                uri.clone(),
                Some(json!({"per_second": 0})),
                "per_second",
            ),
            (
                "negative rate",
                Method::PUT,
                uri.clone(),
                Some(json!({"per_second": -1.5})),
                "per_second",
            ),
            (
                "rate over the maximum",
                Method::PUT,
                uri.clone(),
                Some(json!({"per_second": 1_000_000.5})),
                "per_second",
            ),
            (
                "rate as a string",
                Method::PUT,
                uri.clone(),
                Some(json!({"per_second": "fast"})),
                "per_second",
            ),
            (
                "no rate",
                Method::PUT,
                uri.clone(),
                Some(json!({"burst": 5})),
                "per_second",
            ),
            (
                "burst zero",
                Method::PUT,
                uri.clone(),
                Some(json!({"per_second": 1, "burst": 0})),
                "burst",
            ),
            (
                "burst over the maximum",
                Method::PUT,
                uri.clone(),
                Some(json!({"per_second": 1, "burst": 1_000_001})),
                "burst",
            ),
            (
                "negative burst",
                Method::PUT,
                uri.clone(),
                Some(json!({"per_second": 1, "burst": -1})),
                "burst",
            ),
            (
                "fractional burst",
                Method::PUT,
                uri.clone(),
                Some(json!({"per_second": 1, "burst": 1.5})),
                "burst",
            ),
            (
                "unknown field",
                Method::PUT,
                uri.clone(),
                Some(json!({"per_second": 1, "tokens": 9})),
                "tokens",
            ),
            (
                "type with a space",
                Method::PUT,
                "/v1/rate-limits/a%20b".into(),
                Some(json!({"per_second": 1})),
                "command_type",
            ),
            (
                "type too long",
                Method::PUT,
                long_type.clone(),
                Some(json!({"per_second": 1})),
                "command_type",
            ),
            (
                "type with a space, removed",
                Method::DELETE,
                "/v1/rate-limits/a%20b".into(),
                None,
                "command_type",
            ),
            (
                "type too long, removed",
                Method::DELETE,
                long_type,
                None,
                "command_type",
            ),
        ],
    )
    .await;

    let removed = call(
        &app,
        Method::DELETE,
        "/v1/rate-limits/echo",
        Some(ADMIN_2),
        None,
    )
    .await;
    assert_eq!(removed.status, StatusCode::NO_CONTENT, "{:?}", removed.body);
    assert_eq!(
        stored().await,
        [
            ("mailer".to_owned(), 1_000_000.0, 1_000_000),
            ("slow".to_owned(), 0.5, 1),
        ]
    );
    // Removing what is not there: 404, and nothing recorded.
    let before = snapshot(&h.storage).await;
    let again = call(
        &app,
        Method::DELETE,
        "/v1/rate-limits/echo",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(again.status, StatusCode::NOT_FOUND, "{:?}", again.body);
    assert_eq!(again.code(), "not_found");
    assert_eq!(snapshot(&h.storage).await, before);

    let set = |actor: &str, target: &str, per_second: f64, burst: u32| {
        (
            actor.to_owned(),
            "rate_limit.set".to_owned(),
            target.to_owned(),
            json!({"per_second": per_second, "burst": burst}),
        )
    };
    assert_eq!(
        audit(h).await,
        [
            set("ops-2", "echo", 2.5, 3),
            set("ops-1", "slow", 0.5, 1),
            set("ops-1", "mailer", 1_000_000.0, 1_000_000),
            set("ops-1", "echo", 20.0, 40),
            (
                "ops-2".to_owned(),
                "rate_limit.remove".to_owned(),
                "echo".to_owned(),
                json!({})
            ),
        ]
    );
}

async fn event_rules_are_turned_on_and_off_by_an_admin_and_audited(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let stored = || async {
        h.storage
            .event_rule_list()
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.queue, r.command_type))
            .collect::<Vec<_>>()
    };
    let status = call(&app, Method::GET, "/v1/events/rules", Some(READER), None).await;
    assert_eq!(status.status, StatusCode::OK, "{:?}", status.body);
    assert_eq!(
        status.body,
        json!({"rules": [], "head": 0, "pruned_through": 0})
    );
    let forbidden = call(&app, Method::GET, "/v1/events/rules", Some(ENQUEUER), None).await;
    assert_eq!(
        forbidden.status,
        StatusCode::FORBIDDEN,
        "{:?}",
        forbidden.body
    );
    let anonymous = call(&app, Method::GET, "/v1/events/rules", None, None).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);

    let post = |secret: &'static str, body: Value| {
        let app = app.clone();
        async move {
            call(
                &app,
                Method::POST,
                "/v1/events/rules",
                Some(secret),
                Some(&body.to_string()),
            )
            .await
        }
    };
    let on = post(ADMIN_2, json!({"queue": "billing", "enabled": true})).await;
    assert_eq!(on.status, StatusCode::CREATED, "{:?}", on.body);
    let rules = on.body["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 1, "{:?}", on.body);
    assert_eq!(rules[0]["queue"], "billing");
    assert_eq!(rules[0]["command_type"], Value::Null);
    assert!(rules[0]["created_at"].is_string(), "{:?}", on.body);
    assert_eq!(on.body["head"], 0);
    // Already on: unchanged, 200, not recorded.
    let again = post(ADMIN, json!({"queue": "billing", "enabled": true})).await;
    assert_eq!(again.status, StatusCode::OK, "{:?}", again.body);
    assert_eq!(again.body["rules"], on.body["rules"]);
    let typed = post(
        ADMIN,
        json!({"command_type": "echo", "queue": null, "enabled": true}),
    )
    .await;
    assert_eq!(typed.status, StatusCode::CREATED, "{:?}", typed.body);
    assert_eq!(
        stored().await,
        [
            (None, Some("echo".to_owned())),
            (Some("billing".to_owned()), None),
        ]
    );
    let status = call(&app, Method::GET, "/v1/events/rules", Some(READER), None).await;
    assert_eq!(status.body["rules"], typed.body["rules"]);

    only_admin_may(
        h,
        &app,
        Method::POST,
        "/v1/events/rules",
        Some(r#"{"queue":"billing","enabled":false}"#),
    )
    .await;
    only_admin_may(
        h,
        &app,
        Method::POST,
        "/v1/events/rules",
        Some(r#"{"enabled":true}"#),
    )
    .await;
    let uri = "/v1/events/rules".to_owned();
    refused(
        h,
        &app,
        &[
            (
                "bad queue name",
                Method::POST,
                uri.clone(),
                Some(json!({"queue": "a b", "enabled": true})),
                "queue",
            ),
            (
                "empty queue name",
                Method::POST,
                uri.clone(),
                Some(json!({"queue": "", "enabled": true})),
                "queue",
            ),
            (
                "bad command type",
                Method::POST,
                uri.clone(),
                Some(json!({"command_type": "a\tb", "enabled": true})),
                "command_type",
            ),
            (
                "empty command type",
                Method::POST,
                uri.clone(),
                Some(json!({"command_type": "", "enabled": false})),
                "command_type",
            ),
            (
                "enabled missing",
                Method::POST,
                uri.clone(),
                Some(json!({"queue": "billing"})),
                "enabled",
            ),
            (
                "enabled as a string",
                Method::POST,
                uri.clone(),
                Some(json!({"queue": "billing", "enabled": "no"})),
                "enabled",
            ),
            (
                "unknown field",
                Method::POST,
                uri.clone(),
                Some(json!({"type": "echo", "enabled": true})),
                "type",
            ),
        ],
    )
    .await;

    let off = post(ADMIN, json!({"queue": "billing", "enabled": false})).await;
    assert_eq!(off.status, StatusCode::OK, "{:?}", off.body);
    assert_eq!(stored().await, [(None, Some("echo".to_owned()))]);
    assert_eq!(
        off.body["rules"].as_array().unwrap().len(),
        1,
        "{:?}",
        off.body
    );
    // Off for a rule that does not exist (the catch-all was never on): 404, nothing changed.
    let before = snapshot(&h.storage).await;
    for body in [
        json!({"queue": "billing", "enabled": false}),
        json!({"enabled": false}),
        json!({"queue": "billing", "command_type": "echo", "enabled": false}),
    ] {
        let missing = post(ADMIN, body.clone()).await;
        assert_eq!(
            missing.status,
            StatusCode::NOT_FOUND,
            "{body}: {:?}",
            missing.body
        );
        assert_eq!(missing.code(), "not_found");
    }
    assert_eq!(snapshot(&h.storage).await, before);

    let entry = |actor: &str, action: &str, queue: Value, command_type: Value| {
        (
            actor.to_owned(),
            action.to_owned(),
            "event_rules".to_owned(),
            json!({"queue": queue, "command_type": command_type}),
        )
    };
    assert_eq!(
        audit(h).await,
        [
            entry("ops-2", "events.rule_on", json!("billing"), Value::Null),
            entry("ops-1", "events.rule_on", Value::Null, json!("echo")),
            entry("ops-1", "events.rule_off", json!("billing"), Value::Null),
        ]
    );
}

async fn the_queues_page_shows_queue_and_rate_limits_and_event_rules(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let page = |app: Router| async move {
        let response = app
            .oneshot(request(Method::GET, "/ui/queues", Some(READER), None))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    };
    let empty = page(app.clone()).await;
    assert!(empty.contains("No rate limit"), "{empty}");
    assert!(empty.contains("No event rule"), "{empty}");
    for (method, uri, body) in [
        (
            Method::PUT,
            "/v1/queues/billing/limit",
            r#"{"max_running":7}"#,
        ),
        (
            Method::PUT,
            "/v1/rate-limits/slow",
            r#"{"per_second":0.25,"burst":4}"#,
        ),
        (
            Method::POST,
            "/v1/events/rules",
            r#"{"queue":"billing","enabled":true}"#,
        ),
    ] {
        let answer = call(&app, method, uri, Some(ADMIN), Some(body)).await;
        assert!(answer.status.is_success(), "{uri}: {:?}", answer.body);
    }
    let shown = page(app).await;
    let row = |marker: &str| {
        let start = shown
            .find(marker)
            .unwrap_or_else(|| panic!("{marker} is not shown: {shown}"));
        let end = shown[start..].find("</tr>").unwrap() + start;
        shown[start..end].to_owned()
    };
    let queue = row(r#"data-queue="billing""#);
    assert!(queue.contains(r#"<td class="num">7</td>"#), "{queue}");
    let rate = row(r#"data-rate-limit="slow""#);
    assert!(rate.contains(r#"<td class="num">0.25</td>"#), "{rate}");
    assert!(rate.contains(r#"<td class="num">4</td>"#), "{rate}");
    let rule = row(r#"class="event-rule""#);
    assert!(
        rule.contains("<td>billing</td>") && rule.contains("(any)"),
        "{rule}"
    );
    assert!(
        !shown.contains("No rate limit") && !shown.contains("No event rule"),
        "{shown}"
    );
}

on_every_backend!(
    queue_limits_are_set_and_removed_by_an_admin_and_audited,
    rate_limits_are_set_listed_and_removed_by_an_admin_and_audited,
    event_rules_are_turned_on_and_off_by_an_admin_and_audited,
    the_queues_page_shows_queue_and_rate_limits_and_event_rules,
);
