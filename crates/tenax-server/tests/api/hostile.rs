//! No input reaches a 500 or a panic: every route gets hostile bodies, paths and
//! queries, and answers a 4xx (or a success) in the error shape.
use axum::http::{Method, StatusCode};
use serde_json::json;
use tenax_server::ROUTES;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_on_every_route_never_reaches_a_500() {
    let h = tenax_storage::testing::sqlite_file().await.unwrap();
    let app = app(h.storage.clone(), config());
    let long = "x".repeat(5000);
    let params = [
        "0".to_owned(),
        "-1".to_owned(),
        "9223372036854775807".to_owned(),
        "99999999999999999999".to_owned(),
        "%00".to_owned(),
        "%27%20OR%201%3D1--".to_owned(),
        "%F0%9F%92%A5".to_owned(),
        "%FF%FE".to_owned(),
        long.clone(),
    ];
    let bodies = [
        "".to_owned(),
        "null".to_owned(),
        "{}".to_owned(),
        "[]".to_owned(),
        "\"text\"".to_owned(),
        "{\"command_type\":null}".to_owned(),
        json!({"command_type": "echo", "payload": {"deep": [[[[[[[[[[[[1]]]]]]]]]]]]}, "priority": 1e300}).to_string(),
        json!({"command_type": "echo", "timeout_ms": i64::MAX, "max_attempts": i64::MIN, "concurrency_limit": 0, "concurrency_key": long}).to_string(),
        json!({"command_type": "echo", "run_at": "not a time", "task_no": ""}).to_string(),
        json!({"command_type": "echo", "run_at": "9999-12-31T23:59:59Z"}).to_string(),
        json!({"name": long, "command_type": "echo", "every_secs": u64::MAX}).to_string(),
        json!({"name": "n", "command_type": "echo", "cron": "* * * * * * * *", "catch_up": 0}).to_string(),
        json!({"tasks": "many"}).to_string(),
        json!({"filter": {"ids": [-1, 0, i64::MAX]}, "limit": u32::MAX, "priority": -3}).to_string(),
        "{\"a\":".repeat(200),
        "\u{0}\u{1}binary".to_owned(),
        json!({"max_running": 1e300}).to_string(),
        json!({"max_running": i64::MIN}).to_string(),
        json!({"per_second": 1e308, "burst": u64::MAX}).to_string(),
        json!({"per_second": 5e-324, "burst": i64::MIN}).to_string(),
        json!({"queue": long, "command_type": "\u{0}", "enabled": false}).to_string(),
    ];
    let queries = [
        "?limit=-1",
        "?limit=99999999999",
        "?cursor=%00",
        "?timeout_ms=-5",
        "?timeout_ms=18446744073709551616",
        "?status=",
        "?before_id=1",
    ];
    let mut requests = 0;
    for route in ROUTES {
        let method = Method::from_bytes(route.method.as_bytes()).unwrap();
        let uris: Vec<String> = if route.path.contains('{') {
            params
                .iter()
                .map(|p| {
                    route
                        .path
                        .replace("{id}", p)
                        .replace("{task_no}", p)
                        .replace("{name}", p)
                        .replace("{command_type}", p)
                })
                .collect()
        } else {
            vec![route.path.to_owned()]
        };
        for uri in &uris {
            let mut variants: Vec<String> = queries.iter().map(|q| format!("{uri}{q}")).collect();
            variants.push(uri.clone());
            if route.path == "/v1/events" {
                // The stream is endless unless told to end once caught up.
                for v in &mut variants {
                    v.push_str(if v.contains('?') {
                        "&follow=false"
                    } else {
                        "?follow=false"
                    });
                }
            }
            for uri in variants {
                let answer = call(&app, method.clone(), &uri, Some(ADMIN), None).await;
                assert!(
                    answer.status < StatusCode::INTERNAL_SERVER_ERROR,
                    "{} {uri}: {:?}",
                    route.method,
                    answer.body
                );
                if !answer.status.is_success() {
                    answer.code();
                }
                requests += 1;
            }
            if method == Method::POST || method == Method::PUT {
                for body in &bodies {
                    let answer = call(&app, method.clone(), uri, Some(ADMIN), Some(body)).await;
                    assert!(
                        answer.status < StatusCode::INTERNAL_SERVER_ERROR,
                        "{} {uri} {body:.80}: {:?}",
                        route.method,
                        answer.body
                    );
                    if !answer.status.is_success() {
                        answer.code();
                    }
                    requests += 1;
                }
            }
        }
    }
    assert!(requests > 500, "{requests}");
}
