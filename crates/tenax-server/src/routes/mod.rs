//! The router: routes, the auth route layer, and the layers every request crosses.
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::dashboard;
use crate::error::ApiError;
use crate::state::AppState;

pub(crate) mod admin;
pub(crate) mod events;
pub(crate) mod health;
pub(crate) mod ops;
pub(crate) mod secrets;
pub(crate) mod tasks;
pub(crate) mod workflows;

/// The API as an axum router: mount it, or serve it with [`serve`](crate::serve).
pub fn router(state: AppState) -> Router {
    let body_limit = state.config().body_limit;
    Router::new()
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/openapi.json", get(health::openapi_json))
        .route("/v1/tasks", post(tasks::enqueue).get(tasks::list))
        .route("/v1/tasks/batch", post(tasks::enqueue_batch))
        .route("/v1/tasks/{id}", get(tasks::get_by_id))
        .route("/v1/tasks/by-no/{task_no}", get(tasks::get_by_no))
        .route("/v1/tasks/{id}/attempts", get(tasks::attempts))
        .route("/v1/tasks/{id}/wait", get(tasks::wait))
        .route("/v1/tasks/{id}/cancel", post(tasks::cancel))
        .route("/v1/tasks/{id}/retry", post(tasks::retry))
        .route("/v1/tasks/bulk/cancel", post(ops::bulk_cancel))
        .route("/v1/tasks/bulk/retry", post(ops::bulk_retry))
        .route("/v1/tasks/bulk/reprioritise", post(ops::bulk_reprioritise))
        .route("/v1/audit", get(ops::audit))
        .route("/v1/stats", get(admin::stats))
        .route(
            "/v1/schedules",
            get(admin::list_schedules).post(admin::create_schedule),
        )
        .route(
            "/v1/schedules/{name}",
            axum::routing::delete(admin::delete_schedule),
        )
        .route("/v1/schedules/{name}/pause", post(admin::pause_schedule))
        .route("/v1/schedules/{name}/resume", post(admin::resume_schedule))
        .route("/v1/queues", get(admin::list_queues))
        .route("/v1/queues/{name}/pause", post(admin::pause_queue))
        .route("/v1/queues/{name}/resume", post(admin::resume_queue))
        .route(
            "/v1/queues/{name}/limit",
            put(admin::limit_queue).delete(admin::unlimit_queue),
        )
        .route("/v1/rate-limits", get(admin::list_rate_limits))
        .route(
            "/v1/rate-limits/{command_type}",
            put(admin::set_rate_limit).delete(admin::remove_rate_limit),
        )
        .route(
            "/v1/workflows",
            post(workflows::create).get(workflows::list),
        )
        .route("/v1/workflows/{id}", get(workflows::get))
        .route("/v1/events", get(events::stream))
        .route(
            "/v1/events/rules",
            get(events::rules).post(events::set_rule),
        )
        .route("/", get(dashboard::shell))
        .route("/assets/app.js", get(dashboard::app_js))
        .route("/assets/app.css", get(dashboard::app_css))
        .route("/ui/overview", get(dashboard::overview))
        .route("/ui/queues", get(dashboard::queues))
        .route("/ui/tasks", get(dashboard::tasks))
        .route("/ui/tasks/{id}", get(dashboard::task))
        .route("/ui/dead", get(dashboard::dead))
        .route("/ui/schedules", get(dashboard::schedules))
        .route("/ui/workflows", get(dashboard::workflows))
        .route("/ui/workflows/{id}", get(dashboard::workflow))
        .route("/ui/audit", get(dashboard::audit))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            crate::auth::require_token,
        ))
        .fallback(|| async { ApiError::for_status(StatusCode::NOT_FOUND) })
        .method_not_allowed_fallback(|| async {
            ApiError::for_status(StatusCode::METHOD_NOT_ALLOWED)
        })
        .with_state(state)
        // A body over the limit: refused from its Content-Length before it is read,
        // and cut off while reading when it has none.
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(RequestBodyLimitLayer::new(body_limit))
        .layer(RequestBodyTimeoutLayer::new(crate::BODY_STALL_TIMEOUT))
        .layer(CatchPanicLayer::custom(
            |_panic: Box<dyn std::any::Any + Send>| {
                tracing::error!("a request handler panicked");
                ApiError::for_status(StatusCode::INTERNAL_SERVER_ERROR).into_response()
            },
        ))
        // The span records the path, never the query string: a client that puts its
        // token in the query (refused) must not have it written to the log.
        .layer(
            TraceLayer::new_for_http().make_span_with(|request: &Request| {
                tracing::debug_span!(
                    "request",
                    method = %request.method(),
                    path = %request.uri().path(),
                )
            }),
        )
        .layer(middleware::from_fn(json_errors))
        .layer(middleware::from_fn(dashboard::security_headers))
}

/// Rewrite any error answer that is not JSON (from a lower layer) into the API's error
/// shape, keeping its status.
async fn json_errors(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if (status.is_client_error() || status.is_server_error()) && !is_json {
        let mut rewritten = ApiError::for_status(status).into_response();
        for name in [header::RETRY_AFTER, header::WWW_AUTHENTICATE, header::ALLOW] {
            if let Some(value) = response.headers().get(&name) {
                rewritten.headers_mut().insert(name, value.clone());
            }
        }
        return rewritten;
    }
    response
}
