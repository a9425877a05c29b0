//! Request bodies: arbitrary bytes POSTed to every JSON route of the API (in-process,
//! a SQLite database behind it). The first byte picks the route and content type.
#![no_main]
use axum::http::Method;
use libfuzzer_sys::fuzz_target;
use tenax_fuzz::Api;

const ROUTES: &[&str] = &[
    "/v1/tasks",
    "/v1/tasks/batch",
    "/v1/tasks/bulk/cancel",
    "/v1/tasks/bulk/retry",
    "/v1/tasks/bulk/reprioritise",
    "/v1/schedules",
    "/v1/workflows",
    "/v1/tasks/1/cancel",
    "/v1/tasks/1/retry",
    "/v1/queues/default/pause",
    "/v1/queues/default/resume",
    "/v1/schedules/nightly/pause",
];

const CONTENT_TYPES: &[Option<&str>] = &[
    Some("application/json"),
    Some("application/json; charset=utf-8"),
    Some("text/plain"),
    None,
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let route = ROUTES[usize::from(pick) % ROUTES.len()];
    let content_type = CONTENT_TYPES[usize::from(pick / 32) % CONTENT_TYPES.len()];
    Api::get().check(Method::POST, route, content_type, body.to_vec());
});
