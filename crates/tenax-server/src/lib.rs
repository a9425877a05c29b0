//! The Tenax HTTP API: tasks enqueued, inspected and operated from any language.
//!
//! [`router`] builds an [`axum::Router`] over a [`Storage`](tenax::storage::Storage)
//! and a [`ServerConfig`]: JSON routes under `/v1`, the open probes `/healthz` and
//! `/readyz`, the web dashboard at `/`, and the OpenAPI 3 document at `/openapi.json`, generated from the code
//! ([`openapi`]). A Rust application can mount it next to its own routes, with the
//! command types its own handlers run; [`serve`] runs it on a listener until a
//! cancellation token fires. The `tenax serve` command runs it with workers in the same
//! process.
//!
//! Where each rule is enforced:
//!
//! - **Authentication and roles**: one route layer (the `auth` module) looks the matched route up
//!   in [`ROUTES`] and checks the bearer token's role before any handler runs: 401
//!   without a valid token, 403 for a role that may not. Tokens are configured as SHA-256
//!   hashes and compared in constant time; they are never logged.
//! - **Errors**: every error is `{"error": {"code": "...", "message": "..."}}`; the
//!   extractors map axum's rejections to that shape, and an outer layer rewrites any
//!   other non-JSON error (a body over the limit, a method not allowed, a panic).
//! - **Back-pressure**: `POST /v1/tasks` checks the queue's pending count (cached for
//!   a second) against its configured maximum, answering 429 with `Retry-After`; every
//!   database call is bounded by `db_timeout`, after which the request answers 503 with
//!   `Retry-After` instead of hanging on an exhausted pool.
//! - **Connections**: [`serve`] closes a connection whose request headers take longer
//!   than [`HEADER_TIMEOUT`], fails a request whose body stalls for
//!   [`BODY_STALL_TIMEOUT`], and keeps at most [`MAX_CONNECTIONS`] open, so slow
//!   clients (slowloris) cannot hold the server.
//! - **Dashboard**: `GET /` serves a page shell without data; its script fetches HTML
//!   fragments under `/ui/` with the user's token (role `read` or `admin`), and shows
//!   action buttons only to `admin`. Every response carries a strict
//!   Content-Security-Policy ([`CSP`]).
//! - **Secrets**: configured payload fields of a command type are replaced by `"***"`
//!   in every task the API returns.
#![forbid(unsafe_code)]

mod auth;
mod config;
mod dashboard;
mod error;
mod extract;
mod listen;
mod metrics;
mod model;
mod openapi;
mod pressure;
mod routes;
mod state;

pub use auth::{hash_token, Caller, Role};
pub use config::{ConfigError, QueueLimit, ServerConfig, TokenConfig, BATCH_MAX_LIMIT};
pub use dashboard::CSP;
pub use error::ApiError;
pub use listen::{BODY_STALL_TIMEOUT, HEADER_TIMEOUT, MAX_CONNECTIONS};
pub use metrics::serve_metrics;
pub use model::*;
pub use openapi::{openapi, Access, RouteSpec, DASHBOARD_ROUTES, ROUTES};
pub use routes::router;
pub use state::AppState;

/// Serve the API on `listener` until `shutdown` is cancelled, then finish the requests
/// in flight (long-polls return at once with the task as it stands).
///
/// Each connection must send its request headers within [`HEADER_TIMEOUT`], and a body
/// may not stall for longer than [`BODY_STALL_TIMEOUT`]; at most [`MAX_CONNECTIONS`] are
/// open at once (the rest wait to be accepted).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    listen::serve_connections(listener, router(state), shutdown).await
}
