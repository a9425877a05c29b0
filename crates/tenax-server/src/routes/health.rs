//! Probes and the OpenAPI document (open without a token).
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;

use crate::error::ApiError;
use crate::model::Health;
use crate::state::AppState;

/// The process is alive.
#[utoipa::path(get, path = "/healthz", tag = "probes",
    responses((status = 200, description = "Alive", body = Health)))]
pub(crate) async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".to_owned(),
    })
}

/// The database answers (503 with `Retry-After` when it does not, within 2 s or
/// `db_timeout` if shorter).
#[utoipa::path(get, path = "/readyz", tag = "probes",
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "Database unreachable", body = crate::model::ErrorBody),
    ))]
pub(crate) async fn readyz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    let limit = state.config().db_timeout.min(Duration::from_secs(2));
    match tokio::time::timeout(limit, state.storage().now()).await {
        Ok(Ok(_)) => Ok(Json(Health {
            status: "ok".to_owned(),
        })),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness: database unreachable");
            Err(not_ready())
        }
        Err(_) => {
            tracing::warn!("readiness: database did not answer in time");
            Err(not_ready())
        }
    }
}

fn not_ready() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "database_unreachable",
        "the database does not answer",
    )
    .retry_after(5)
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "probes",
    responses((status = 200, description = "The OpenAPI 3 document")))]
pub(crate) async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(crate::openapi::openapi())
}
