//! The route table (the one source for the router, for authorisation and for the
//! OpenAPI test) and the OpenAPI 3 document generated from the handlers.
use axum::routing::{delete, get, post, put, MethodRouter};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::dashboard;
use crate::state::AppState;

use crate::model::*;
use crate::routes::{admin, batch, events, health, ops, tasks, wait, workflows};

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, without a token (probes and the OpenAPI document).
    Open,
    /// Any valid token: the task reads that enqueuers need (get, attempts, wait). An
    /// enqueue token reads only the tasks enqueued under its own name (another's is
    /// answered 404, as a missing one).
    TaskRead,
    /// Tokens with role `read` or `admin`.
    Read,
    /// Tokens with role `enqueue` or `admin`.
    Enqueue,
    /// Tokens with role `admin`: operator actions.
    Admin,
}

/// One route: its method and path, who may call it, and its handler.
#[derive(Clone, Copy)]
pub struct RouteSpec {
    /// HTTP method.
    pub method: &'static str,
    /// Path template, as in the OpenAPI document (`/v1/tasks/{id}`).
    pub path: &'static str,
    /// Who may call it.
    pub access: Access,
    /// The handler, under the method (`get(..)`, `post(..)`, ...).
    pub(crate) handler: fn() -> MethodRouter<AppState>,
}

impl std::fmt::Debug for RouteSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} ({:?})", self.method, self.path, self.access)
    }
}

const fn route(
    method: &'static str,
    path: &'static str,
    access: Access,
    handler: fn() -> MethodRouter<AppState>,
) -> RouteSpec {
    RouteSpec {
        method,
        path,
        access,
        handler,
    }
}

/// Every route of the JSON API: the router is built from it, the auth layer reads who
/// may call each, and the OpenAPI test checks the document against it. A request on a
/// path missing from it (and from [`DASHBOARD_ROUTES`]) needs `admin`.
pub const ROUTES: &[RouteSpec] = &[
    route("GET", "/healthz", Access::Open, || get(health::healthz)),
    route("GET", "/readyz", Access::Open, || get(health::readyz)),
    route("GET", "/openapi.json", Access::Open, || {
        get(health::openapi_json)
    }),
    route("POST", "/v1/tasks", Access::Enqueue, || {
        post(tasks::enqueue)
    }),
    route("POST", "/v1/tasks/batch", Access::Enqueue, || {
        post(batch::enqueue_batch)
    }),
    route("GET", "/v1/tasks", Access::Read, || get(tasks::list)),
    route("GET", "/v1/tasks/{id}", Access::TaskRead, || {
        get(tasks::get_by_id)
    }),
    route("GET", "/v1/tasks/by-no/{task_no}", Access::TaskRead, || {
        get(tasks::get_by_no)
    }),
    route("GET", "/v1/tasks/{id}/attempts", Access::TaskRead, || {
        get(tasks::attempts)
    }),
    route("GET", "/v1/tasks/{id}/wait", Access::TaskRead, || {
        get(wait::wait)
    }),
    route("POST", "/v1/tasks/{id}/cancel", Access::Admin, || {
        post(tasks::cancel)
    }),
    route("POST", "/v1/tasks/{id}/retry", Access::Admin, || {
        post(tasks::retry)
    }),
    route("POST", "/v1/tasks/bulk/cancel", Access::Admin, || {
        post(ops::bulk_cancel)
    }),
    route("POST", "/v1/tasks/bulk/retry", Access::Admin, || {
        post(ops::bulk_retry)
    }),
    route("POST", "/v1/tasks/bulk/reprioritise", Access::Admin, || {
        post(ops::bulk_reprioritise)
    }),
    route("GET", "/v1/audit", Access::Read, || get(ops::audit)),
    route("GET", "/v1/stats", Access::Read, || get(admin::stats)),
    route("GET", "/v1/schedules", Access::Read, || {
        get(admin::list_schedules)
    }),
    route("POST", "/v1/schedules", Access::Admin, || {
        post(admin::create_schedule)
    }),
    route("POST", "/v1/schedules/{name}/pause", Access::Admin, || {
        post(admin::pause_schedule)
    }),
    route("POST", "/v1/schedules/{name}/resume", Access::Admin, || {
        post(admin::resume_schedule)
    }),
    route("DELETE", "/v1/schedules/{name}", Access::Admin, || {
        delete(admin::delete_schedule)
    }),
    route("GET", "/v1/queues", Access::Read, || {
        get(admin::list_queues)
    }),
    route("POST", "/v1/queues/{name}/pause", Access::Admin, || {
        post(admin::pause_queue)
    }),
    route("POST", "/v1/queues/{name}/resume", Access::Admin, || {
        post(admin::resume_queue)
    }),
    route("PUT", "/v1/queues/{name}/limit", Access::Admin, || {
        put(admin::limit_queue)
    }),
    route("DELETE", "/v1/queues/{name}/limit", Access::Admin, || {
        delete(admin::unlimit_queue)
    }),
    route("GET", "/v1/rate-limits", Access::Read, || {
        get(admin::list_rate_limits)
    }),
    route(
        "PUT",
        "/v1/rate-limits/{command_type}",
        Access::Admin,
        || put(admin::set_rate_limit),
    ),
    route(
        "DELETE",
        "/v1/rate-limits/{command_type}",
        Access::Admin,
        || delete(admin::remove_rate_limit),
    ),
    route("POST", "/v1/workflows", Access::Enqueue, || {
        post(workflows::create)
    }),
    route("GET", "/v1/workflows", Access::Read, || {
        get(workflows::list)
    }),
    route("GET", "/v1/workflows/{id}", Access::TaskRead, || {
        get(workflows::get)
    }),
    route("GET", "/v1/events", Access::Read, || get(events::stream)),
    route("GET", "/v1/events/rules", Access::Read, || {
        get(events::rules)
    }),
    route("POST", "/v1/events/rules", Access::Admin, || {
        post(events::set_rule)
    }),
];

/// The dashboard's routes: the page shell and its assets (open: they hold no data), and
/// the HTML fragments the shell fetches with a token. They are not part of the JSON API
/// and not in the OpenAPI document; the router and the auth layer read this table as
/// they read [`ROUTES`].
pub const DASHBOARD_ROUTES: &[RouteSpec] = &[
    route("GET", "/", Access::Open, || get(dashboard::shell)),
    route("GET", "/assets/app.js", Access::Open, || {
        get(dashboard::app_js)
    }),
    route("GET", "/assets/app.css", Access::Open, || {
        get(dashboard::app_css)
    }),
    route("GET", "/ui/overview", Access::Read, || {
        get(dashboard::overview)
    }),
    route("GET", "/ui/queues", Access::Read, || get(dashboard::queues)),
    route("GET", "/ui/tasks", Access::Read, || get(dashboard::tasks)),
    route("GET", "/ui/tasks/{id}", Access::Read, || {
        get(dashboard::task)
    }),
    route("GET", "/ui/dead", Access::Read, || get(dashboard::dead)),
    route("GET", "/ui/schedules", Access::Read, || {
        get(dashboard::schedules)
    }),
    route("GET", "/ui/workflows", Access::Read, || {
        get(dashboard::workflows)
    }),
    route("GET", "/ui/workflows/{id}", Access::Read, || {
        get(dashboard::workflow)
    }),
    route("GET", "/ui/audit", Access::Read, || get(dashboard::audit)),
];

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A token from `tenax token new`; the server stores only its SHA-256.",
                    ))
                    .build(),
            ),
        );
    }
}

/// The error answers any operation can give besides its own: 401 and 403 from the auth
/// layer, 400 for a malformed path, query or body, 422 for an invalid value, 413 and 415
/// for a body over the limit or not JSON, and 503 when the database does not answer in
/// time. Documented here once, so that every status the server sends is in the document.
struct CommonErrors;

impl CommonErrors {
    fn error(description: &str) -> utoipa::openapi::RefOr<utoipa::openapi::Response> {
        utoipa::openapi::ResponseBuilder::new()
            .description(description)
            .content(
                "application/json",
                utoipa::openapi::ContentBuilder::new()
                    .schema(Some(utoipa::openapi::Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .build()
            .into()
    }
}

impl Modify for CommonErrors {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (path, item) in openapi.paths.paths.iter_mut() {
            for (method, operation) in [
                ("GET", &mut item.get),
                ("POST", &mut item.post),
                ("PUT", &mut item.put),
                ("DELETE", &mut item.delete),
            ] {
                let Some(operation) = operation.as_mut() else {
                    continue;
                };
                let access = ROUTES
                    .iter()
                    .find(|r| r.method == method && r.path == path.as_str())
                    .map_or(Access::Admin, |r| r.access);
                if access == Access::Open {
                    continue;
                }
                let has_input = operation.request_body.is_some()
                    || operation.parameters.as_ref().is_some_and(|p| !p.is_empty());
                let mut add = vec![
                    ("400", "Malformed path, query or body"),
                    ("401", "Missing or invalid bearer token"),
                    ("503", "Database unavailable (Retry-After)"),
                ];
                if access != Access::TaskRead {
                    add.push(("403", "The token's role may not use this operation"));
                }
                if has_input {
                    add.push(("422", "Invalid value"));
                }
                if method == "POST" || method == "PUT" {
                    add.push(("413", "Body over the limit"));
                }
                if operation.request_body.is_some() {
                    add.push(("415", "Body not sent as `application/json`"));
                }
                for (status, description) in add {
                    operation
                        .responses
                        .responses
                        .entry(status.to_owned())
                        .or_insert_with(|| Self::error(description));
                }
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tenax HTTP API",
        description = "Enqueue, inspect and operate durable tasks. Errors are always `{\"error\": {\"code\", \"field\", \"message\"}}`, `field` (the request field at fault) only when known."
    ),
    paths(
        health::healthz,
        health::readyz,
        health::openapi_json,
        tasks::enqueue,
        batch::enqueue_batch,
        tasks::list,
        tasks::get_by_id,
        tasks::get_by_no,
        tasks::attempts,
        wait::wait,
        tasks::cancel,
        tasks::retry,
        ops::bulk_cancel,
        ops::bulk_retry,
        ops::bulk_reprioritise,
        ops::audit,
        admin::stats,
        admin::list_schedules,
        admin::create_schedule,
        admin::pause_schedule,
        admin::resume_schedule,
        admin::delete_schedule,
        admin::list_queues,
        admin::pause_queue,
        admin::resume_queue,
        admin::limit_queue,
        admin::unlimit_queue,
        admin::list_rate_limits,
        admin::set_rate_limit,
        admin::remove_rate_limit,
        workflows::create,
        workflows::list,
        workflows::get,
        events::stream,
        events::rules,
        events::set_rule,
    ),
    components(schemas(
        ErrorBody, ErrorDetail, TaskView, EnqueueRequest, BatchRequest, BatchItem, BatchResponse,
        BatchRefusedBody, BatchRefused, BatchItemError, TaskPage, WaitResponse, AttemptView, StatsView, StatusCount, TypeCount, QueueCounts,
        ScheduleView, ScheduleRequest, QueueView, Health, BulkFilter, BulkRequest, BulkResponse,
        AuditView, AuditPage, WorkflowRequest, WorkflowTaskRequest, WorkflowView,
        WorkflowTaskView, WorkflowDetailView, WorkflowPage, QueueLimitRequest, RateLimitView,
        RateLimitRequest, EventRuleView, EventRulesView, EventRuleRequest, events::EventMessage
    )),
    modifiers(&BearerAuth, &CommonErrors),
    tags(
        (name = "probes", description = "Liveness and readiness, open without a token."),
        (name = "tasks", description = "Enqueue, inspect, wait for, cancel and retry tasks."),
        (name = "operations", description = "Bulk actions, the audit trail, stats, schedules, queues and their limits, rate limits per command type."),
        (name = "workflows", description = "Enqueue a DAG of tasks or a saga, and follow it."),
        (name = "events", description = "Task events as a resumable Server-Sent Events stream, and the rules that decide which tasks write them."),
    )
)]
struct ApiDoc;

/// The OpenAPI 3 document of the API, as served at `/openapi.json`.
pub fn openapi() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}
