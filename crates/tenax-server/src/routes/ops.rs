//! Bulk actions by filter, and the audit trail of operator actions.
use axum::extract::State;
use axum::{Extension, Json};
use tenax::storage::{AuditListParams, BulkAction, TaskBulkParams, TaskFilter};
use tenax::{Priority, QueueName, TaskId, TaskStatus};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiQuery};
use crate::model::*;
use crate::routes::admin::record;
use crate::state::AppState;

/// Default and largest number of tasks one bulk action changes.
const BULK_DEFAULT: u32 = 1000;
const BULK_MAX: u32 = 100_000;
/// Most ids in a bulk filter.
const IDS_MAX: usize = 10_000;
/// Default and largest audit page.
const AUDIT_PAGE_DEFAULT: u32 = 100;
const AUDIT_PAGE_MAX: u32 = 1000;

fn filter_of(body: &BulkFilter) -> Result<TaskFilter, ApiError> {
    let statuses = body
        .statuses
        .iter()
        .map(|s| {
            s.parse::<TaskStatus>().map_err(|_| {
                ApiError::invalid(format!(
                    "filter.statuses: unknown status {:?}",
                    s.chars().take(40).collect::<String>()
                ))
                .field("filter.statuses")
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(t) = &body.command_type {
        tenax_core::validate_command_type(t).map_err(|e| ApiError::from(e).within("filter"))?;
    }
    if let Some(q) = &body.queue {
        QueueName::new(q.clone()).map_err(|e| ApiError::from(e).within("filter"))?;
    }
    if let Some(ids) = &body.ids {
        if ids.len() > IDS_MAX {
            return Err(ApiError::invalid(format!(
                "filter.ids: at most {IDS_MAX} ids, got {}",
                ids.len()
            ))
            .field("filter.ids"));
        }
    }
    if let (Some(after), Some(before)) = (body.created_after, body.created_before) {
        if after >= before {
            return Err(ApiError::invalid(
                "filter.created_after must be before filter.created_before",
            )
            .field("filter.created_after"));
        }
    }
    Ok(TaskFilter {
        statuses,
        command_type: body.command_type.clone(),
        queue: body.queue.clone(),
        ids: body
            .ids
            .as_ref()
            .map(|ids| ids.iter().map(|i| TaskId(*i)).collect()),
        created_after: body.created_after,
        created_before: body.created_before,
    })
}

async fn bulk(
    state: &AppState,
    caller: &Caller,
    req: BulkRequest,
    action: BulkAction,
    name: &str,
) -> Result<Json<BulkResponse>, ApiError> {
    let filter = filter_of(&req.filter)?;
    let limit = req.limit.unwrap_or(BULK_DEFAULT);
    if limit == 0 || limit > BULK_MAX {
        return Err(
            ApiError::invalid(format!("limit: must be 1 to {BULK_MAX}, got {limit}"))
                .field("limit"),
        );
    }
    let params = TaskBulkParams {
        filter,
        action,
        limit,
        now: None,
    };
    let outcome = state.db(state.storage().task_bulk(&params)).await?;
    let details = serde_json::json!({
        "filter": serde_json::to_value(&req.filter).unwrap_or_default(),
        "limit": limit,
        "priority": req.priority,
        "changed": outcome.changed,
        "cancel_requested": outcome.cancel_requested,
    });
    record(state, caller, name, "tasks", details).await;
    Ok(Json(BulkResponse {
        changed: outcome.changed,
        cancel_requested: outcome.cancel_requested,
    }))
}

/// Cancel every task matching the filter (running ones are asked to stop).
#[utoipa::path(post, path = "/v1/tasks/bulk/cancel", tag = "operations", request_body = BulkRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "How many changed", body = BulkResponse),
        (status = 422, description = "Invalid filter or limit (nothing changed)", body = ErrorBody),
    ))]
pub(crate) async fn bulk_cancel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiJson(req): ApiJson<BulkRequest>,
) -> Result<Json<BulkResponse>, ApiError> {
    bulk(
        &state,
        &caller,
        req,
        BulkAction::Cancel,
        "tasks.bulk_cancel",
    )
    .await
}

/// Retry every dead task matching the filter.
#[utoipa::path(post, path = "/v1/tasks/bulk/retry", tag = "operations", request_body = BulkRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "How many changed", body = BulkResponse),
        (status = 422, description = "Invalid filter or limit (nothing changed)", body = ErrorBody),
    ))]
pub(crate) async fn bulk_retry(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiJson(req): ApiJson<BulkRequest>,
) -> Result<Json<BulkResponse>, ApiError> {
    bulk(&state, &caller, req, BulkAction::Retry, "tasks.bulk_retry").await
}

/// Give every waiting task matching the filter a new priority (`priority` required).
#[utoipa::path(post, path = "/v1/tasks/bulk/reprioritise", tag = "operations", request_body = BulkRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "How many changed", body = BulkResponse),
        (status = 422, description = "Invalid filter, limit or priority (nothing changed)", body = ErrorBody),
    ))]
pub(crate) async fn bulk_reprioritise(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiJson(req): ApiJson<BulkRequest>,
) -> Result<Json<BulkResponse>, ApiError> {
    let priority = match req.priority {
        Some(p) if (0..=9).contains(&p) => Priority::new(u8::try_from(p).unwrap_or(0))?,
        Some(p) => {
            return Err(
                ApiError::invalid(format!("priority: must be 0 to 9, got {p}")).field("priority"),
            )
        }
        None => {
            return Err(ApiError::invalid("priority: required to reprioritise").field("priority"))
        }
    };
    bulk(
        &state,
        &caller,
        req,
        BulkAction::Reprioritise(priority),
        "tasks.bulk_reprioritise",
    )
    .await
}

/// Operator actions, newest first.
#[utoipa::path(get, path = "/v1/audit", tag = "operations", params(AuditQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "A page of the audit trail", body = AuditPage),
        (status = 400, description = "Bad cursor", body = ErrorBody),
        (status = 422, description = "Invalid filter", body = ErrorBody),
    ))]
pub(crate) async fn audit(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<AuditQuery>,
) -> Result<Json<AuditPage>, ApiError> {
    let limit = query.limit.unwrap_or(AUDIT_PAGE_DEFAULT);
    if limit == 0 || limit > AUDIT_PAGE_MAX {
        return Err(ApiError::invalid(format!(
            "limit: must be 1 to {AUDIT_PAGE_MAX}, got {limit}"
        ))
        .field("limit"));
    }
    let before_id = query
        .cursor
        .as_deref()
        .map(crate::routes::tasks::decode_cursor)
        .transpose()?
        .map(|id| id.0);
    for (field, value) in [("actor", &query.actor), ("action", &query.action)] {
        if value
            .as_deref()
            .is_some_and(|v| v.len() > 200 || v.chars().any(char::is_control))
        {
            return Err(ApiError::invalid(format!(
                "{field}: at most 200 bytes, without control characters"
            ))
            .field(field));
        }
    }
    let params = AuditListParams {
        before_id,
        limit,
        actor: query.actor.clone(),
        action: query.action.clone(),
    };
    let records = state.db(state.storage().audit_list(&params)).await?;
    let next_cursor = (records.len() == limit as usize)
        .then(|| {
            records
                .last()
                .map(|r| crate::routes::tasks::encode_cursor(r.id))
        })
        .flatten();
    Ok(Json(AuditPage {
        entries: records
            .into_iter()
            .map(|r| AuditView {
                id: r.id,
                at: r.at,
                actor: r.actor,
                action: r.action,
                target: r.target,
                details: r.details,
            })
            .collect(),
        next_cursor,
    }))
}
