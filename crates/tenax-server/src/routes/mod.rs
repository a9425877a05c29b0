//! The router: routes, the auth route layer, and the layers every request crosses.
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::error::ApiError;
use crate::state::AppState;

pub(crate) mod admin;
pub(crate) mod batch;
pub(crate) mod events;
pub(crate) mod health;
pub(crate) mod ops;
pub(crate) mod secrets;
pub(crate) mod tasks;
pub(crate) mod wait;
pub(crate) mod workflows;

/// The API as an axum router: mount it, or serve it with [`serve`](crate::serve).
pub fn router(state: AppState) -> Router {
    let body_limit = state.config().body_limit;
    let mut routes = Router::new();
    // Two entries of one path (each under its method) merge into one method router.
    for spec in crate::openapi::ROUTES
        .iter()
        .chain(crate::openapi::DASHBOARD_ROUTES)
    {
        routes = routes.route(spec.path, (spec.handler)());
    }
    routes
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
        .layer(middleware::from_fn(crate::dashboard::security_headers))
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
