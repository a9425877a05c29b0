//! `GET /v1/events`: task events as Server-Sent Events, filtered and resumable.
//!
//! Each message is one event: `id:` its stream position, `event:` its kind, `data:` the
//! JSON of schema `tenax.task_event.v1` ([`EventRecord::envelope`]). A client resumes
//! with the `Last-Event-ID` header (browsers send it on reconnect) or `?after=`; without
//! either it starts at the stream's head (only new events). Resuming from a position
//! whose successors were pruned is refused with 410 `events_pruned`, and a stream whose
//! reader falls behind the pruner ends with an `event: pruned` message: a reader is told
//! it missed events, never left to skip them silently.
//!
//! `/v1/events/rules`: which tasks write events (the rules, as `tenax events on|off|status`).
use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::stream::{self, Stream};
use serde::Deserialize;
use tenax::storage::{EventKind, EventListParams, EventRecord, EventRuleParams, Storage};
use tenax::{QueueName, TaskStatus};
use tenax_core::Secrets;
use utoipa::{IntoParams, ToSchema};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiQuery};
use crate::model::{EventRuleRequest, EventRuleView, EventRulesView};
use crate::routes::admin::record;
use crate::state::AppState;

/// Events read from the database per look.
const PAGE: u32 = 500;
/// Time between looks when the stream is idle.
const POLL: Duration = Duration::from_millis(200);

/// Filters and the resume point of `GET /v1/events`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventsQuery {
    /// Only events of tasks of this queue.
    queue: Option<String>,
    /// Only events of tasks of this command type.
    #[serde(rename = "type")]
    command_type: Option<String>,
    /// Only events that left the task in one of these statuses (comma-separated).
    status: Option<String>,
    /// Only these kinds of event (comma-separated: enqueued, started, retried,
    /// succeeded, dead, cancelled, compensated).
    event: Option<String>,
    /// Resume after this position (the `Last-Event-ID` header wins when both are given);
    /// `0` replays every event still kept.
    after: Option<i64>,
    /// `false`: end the stream once it has caught up with the head, instead of waiting
    /// for new events (for batch readers). Defaults to `true`.
    follow: Option<bool>,
}

fn list_of<T>(
    field: &str,
    text: Option<&str>,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Vec<T>, ApiError> {
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    let items: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if items.len() > 16 {
        return Err(ApiError::invalid(format!("{field}: at most 16 values")).field(field));
    }
    items
        .into_iter()
        .map(|item| {
            parse(item).ok_or_else(|| {
                ApiError::invalid(format!(
                    "{field}: unknown value {:?}",
                    item.chars().take(40).collect::<String>()
                ))
                .field(field)
            })
        })
        .collect()
}

fn resume_point(headers: &HeaderMap, query: &EventsQuery) -> Result<Option<i64>, ApiError> {
    if let Some(value) = headers.get("last-event-id") {
        let text = value.to_str().map_err(|_| {
            ApiError::invalid("Last-Event-ID: not a position").field("Last-Event-ID")
        })?;
        return match text.trim().parse::<i64>() {
            Ok(n) if n >= 0 => Ok(Some(n)),
            _ => Err(ApiError::invalid(
                "Last-Event-ID: must be the non-negative position of an event",
            )
            .field("Last-Event-ID")),
        };
    }
    match query.after {
        Some(n) if n < 0 => Err(ApiError::invalid("after: must not be negative").field("after")),
        other => Ok(other),
    }
}

fn message(record: &EventRecord, secrets: &Secrets) -> Event {
    Event::default()
        .id(record.seq.unwrap_or_default().to_string())
        .event(record.event.as_str())
        .data(record.envelope(secrets).to_string())
}

/// One message of the `GET /v1/events` stream, as an SSE reader parses it: this is the
/// stream's per-event schema in the OpenAPI document (what `itemSchema` says in 3.2).
#[derive(ToSchema)]
#[allow(dead_code)] // documents the wire format: messages are written by `message`
pub(crate) struct EventMessage {
    /// The event's position in the stream: resume after it with `Last-Event-ID` or
    /// `?after=`. The final `pruned` message has none of its own.
    #[schema(example = "128")]
    id: Option<String>,
    /// The event's kind (`enqueued`, `started`, `succeeded`, ...), or `pruned` for the
    /// message that ends a stream whose reader fell behind the retention.
    #[schema(example = "succeeded")]
    event: String,
    /// JSON text: a `tenax.task_event.v1` envelope, or for `pruned`
    /// `{"after": .., "pruned_through": ..}`.
    #[schema(content_media_type = "application/json")]
    data: String,
}

struct Cursor {
    storage: std::sync::Arc<dyn Storage>,
    params: EventListParams,
    ready: VecDeque<Event>,
    secrets: Secrets,
    shutdown: tokio_util::sync::CancellationToken,
    done: bool,
    follow: bool,
}

/// Stream task events as Server-Sent Events.
#[utoipa::path(
    get,
    path = "/v1/events",
    tag = "events",
    params(EventsQuery, ("Last-Event-ID" = Option<i64>, Header, description = "Resume after this position.")),
    responses(
        (status = 200, description = "An endless `text/event-stream`: one message per event (`id`: position, `event`: kind, `data`: JSON of schema `tenax.task_event.v1`), comments as keep-alives; a final `event: pruned` message when the reader fell behind the retention.", content_type = "text/event-stream", body = EventMessage),
        (status = 410, description = "Events after the resume point were pruned (`events_pruned`): the message names the first position kept.", body = crate::model::ErrorBody),
        (status = 422, description = "An invalid filter or resume point.", body = crate::model::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn stream(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Response, ApiError> {
    if let Some(q) = &query.queue {
        QueueName::new(q.clone())?;
    }
    if let Some(t) = &query.command_type {
        tenax_core::validate_command_type(t)?;
    }
    let statuses = list_of("status", query.status.as_deref(), |s| {
        s.parse::<TaskStatus>().ok()
    })?;
    let events = list_of("event", query.event.as_deref(), EventKind::from_name)?;
    let resume = resume_point(&headers, &query)?;
    let storage = state.storage().clone();
    let head = state
        .db(storage.event_list(&EventListParams {
            after: 0,
            limit: 1,
            ..Default::default()
        }))
        .await?;
    let after = match resume {
        None => head.head,
        Some(after) if after < head.pruned_through => {
            return Err(ApiError::new(
                StatusCode::GONE,
                "events_pruned",
                format!(
                    "the events after position {after} up to {} were pruned; resume with after={} \
                     (and reconcile from GET /v1/tasks) to continue from the oldest event kept",
                    head.pruned_through, head.pruned_through
                ),
            ));
        }
        Some(after) => after,
    };
    let cursor = Cursor {
        storage,
        params: EventListParams {
            after,
            limit: PAGE,
            queue: query.queue.clone(),
            command_type: query.command_type.clone(),
            statuses,
            events,
        },
        ready: VecDeque::new(),
        secrets: state.config().secrets.clone(),
        shutdown: state.inner.shutdown.clone(),
        done: false,
        follow: query.follow.unwrap_or(true),
    };
    Ok(Sse::new(events_of(cursor))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

fn events_of(cursor: Cursor) -> impl Stream<Item = Result<Event, Infallible>> {
    stream::unfold(cursor, |mut c| async move {
        loop {
            if let Some(event) = c.ready.pop_front() {
                return Some((Ok(event), c));
            }
            if c.done || c.shutdown.is_cancelled() {
                return None;
            }
            match c.storage.event_list(&c.params).await {
                Ok(page) => {
                    if page.pruned_through > c.params.after {
                        // The pruner overtook this reader: say so and end the stream.
                        c.ready.push_back(
                            Event::default().event("pruned").data(
                                serde_json::json!({
                                    "after": c.params.after,
                                    "pruned_through": page.pruned_through,
                                })
                                .to_string(),
                            ),
                        );
                        c.done = true;
                        continue;
                    }
                    let moved = page.scanned_through > c.params.after;
                    let secrets = &c.secrets;
                    c.ready
                        .extend(page.events.iter().map(|e| message(e, secrets)));
                    c.params.after = c.params.after.max(page.scanned_through);
                    if moved {
                        continue;
                    }
                    if !c.follow {
                        c.done = true;
                        continue;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "reading events for a stream failed"),
            }
            tokio::select! {
                () = c.shutdown.cancelled() => return None,
                () = tokio::time::sleep(POLL) => {}
            }
        }
    })
}

/// The rules and where the stream stands.
async fn rules_view(state: &AppState) -> Result<EventRulesView, ApiError> {
    let rules = state.db(state.storage().event_rule_list()).await?;
    let page = state
        .db(state.storage().event_list(&EventListParams {
            after: 0,
            limit: 1,
            ..Default::default()
        }))
        .await?;
    Ok(EventRulesView {
        rules: rules.iter().map(EventRuleView::from).collect(),
        head: page.head,
        pruned_through: page.pruned_through,
    })
}

/// Which tasks write events, and the stream's head and pruned position.
#[utoipa::path(get, path = "/v1/events/rules", tag = "events",
    security(("bearer" = [])),
    responses((status = 200, description = "The rules and the stream's positions", body = EventRulesView)))]
pub(crate) async fn rules(State(state): State<AppState>) -> Result<Json<EventRulesView>, ApiError> {
    Ok(Json(rules_view(&state).await?))
}

/// Turn an event rule on (tasks inserted from now on in this queue and of this command
/// type write events; without either, every task) or off. Tasks already inserted keep
/// what was decided at their insert.
#[utoipa::path(post, path = "/v1/events/rules", tag = "events",
    request_body = EventRuleRequest,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "The rule was added", body = EventRulesView),
        (status = 200, description = "The rule was removed, or was already on", body = EventRulesView),
        (status = 404, description = "Turned off a rule that does not exist", body = crate::model::ErrorBody),
        (status = 422, description = "Invalid queue or command type", body = crate::model::ErrorBody),
    ))]
pub(crate) async fn set_rule(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiJson(req): ApiJson<EventRuleRequest>,
) -> Result<(StatusCode, Json<EventRulesView>), ApiError> {
    let queue = req
        .queue
        .map(|q| {
            QueueName::new(q)
                .map(|q| q.to_string())
                .map_err(|e| ApiError::from(e).field("queue"))
        })
        .transpose()?;
    if let Some(t) = &req.command_type {
        tenax_core::validate_command_type(t)
            .map_err(|e| ApiError::invalid(e.to_string()).field("command_type"))?;
    }
    let params = EventRuleParams {
        queue: queue.clone(),
        command_type: req.command_type.clone(),
        enabled: req.enabled,
        now: None,
    };
    let changed = state.db(state.storage().event_rule_set(&params)).await?;
    let details = serde_json::json!({"queue": queue, "command_type": req.command_type});
    let status = match (req.enabled, changed) {
        (true, true) => {
            record(&state, &caller, "events.rule_on", "event_rules", details).await;
            StatusCode::CREATED
        }
        (true, false) => StatusCode::OK,
        (false, true) => {
            record(&state, &caller, "events.rule_off", "event_rules", details).await;
            StatusCode::OK
        }
        (false, false) => {
            let shown =
                |v: Option<&str>| v.map_or_else(|| "(any)".to_owned(), |v| format!("{v:?}"));
            return Err(ApiError::not_found(format!(
                "no event rule for queue {} and type {}",
                shown(queue.as_deref()),
                shown(req.command_type.as_deref())
            )));
        }
    };
    Ok((status, Json(rules_view(&state).await?)))
}
