//! A Prometheus exposition behind a bearer token, served on an address of its own (the
//! worker's metrics address), for deployments where the scrape crosses a network.
use std::sync::Arc;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::auth::{bearer, Tokens};
use crate::openapi::Access;
use crate::TokenConfig;

/// Serve `render()` (the exposition text) at every path of `listener` to callers
/// presenting one of `tokens` whose role may read (`read` or `admin`): 401 without a
/// valid token, 403 for another role. Runs until `shutdown` is cancelled, with the
/// API's connection limits.
pub async fn serve_metrics<F>(
    listener: tokio::net::TcpListener,
    render: F,
    tokens: &[TokenConfig],
    shutdown: CancellationToken,
) -> std::io::Result<()>
where
    F: Fn() -> String + Clone + Send + Sync + 'static,
{
    crate::listen::serve_connections(listener, metrics_router(render, tokens), shutdown).await
}

fn metrics_router<F>(render: F, tokens: &[TokenConfig]) -> Router
where
    F: Fn() -> String + Clone + Send + Sync + 'static,
{
    let tokens = Arc::new(Tokens::new(tokens));
    Router::new().fallback(move |headers: HeaderMap| {
        let (render, tokens) = (render.clone(), tokens.clone());
        async move { exposition(&headers, &tokens, render) }
    })
}

fn exposition(headers: &HeaderMap, tokens: &Tokens, render: impl Fn() -> String) -> Response {
    let Some(token) = bearer(headers) else {
        return (
            StatusCode::UNAUTHORIZED,
            "missing bearer token: send `Authorization: Bearer <token>`\n",
        )
            .into_response();
    };
    match tokens.find(token) {
        None => (StatusCode::UNAUTHORIZED, "the bearer token is not valid\n").into_response(),
        Some(caller) if !caller.role.may(Access::Read) => (
            StatusCode::FORBIDDEN,
            format!(
                "token {:?} has role {}, which may not read metrics\n",
                caller.name,
                caller.role.as_str()
            ),
        )
            .into_response(),
        Some(_) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            render(),
        )
            .into_response(),
    }
}
