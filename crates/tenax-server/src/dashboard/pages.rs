//! The page shell and the fragments. `maud` escapes every value it interpolates; the
//! only markup inserted unescaped is the SVG that `plotters` drew (which escapes its
//! own text).
use chrono::{DateTime, Utc};
use maud::{html, Markup, PreEscaped};
use tenax::storage::{AuditRecord, EventRule, QueueInfo, RateLimit, WorkflowRecord};
use tenax::TaskStatus;

use super::charts::{self, BarChart, Layout, Series};
use super::graph;
use super::{Overview, TaskQuery, Viewer};
use crate::model::{AttemptView, ScheduleView, TaskView};

/// The page shell: no data, and nothing inline (the policy forbids inline script and
/// style).
pub(super) const SHELL: &str = r##"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Tenax</title>
<link rel="stylesheet" href="/assets/app.css">
<script src="/assets/app.js" defer></script>
</head>
<body>
<header>
<h1>Tenax</h1>
<nav id="nav" hidden>
<a href="#overview">Overview</a>
<a href="#queues">Queues</a>
<a href="#tasks">Tasks</a>
<a href="#dead">Dead tasks</a>
<a href="#schedules">Schedules</a>
<a href="#workflows">Workflows</a>
<a href="#audit">Audit</a>
</nav>
<span id="who"></span>
<button type="button" id="signout" hidden>Sign out</button>
</header>
<main>
<form id="login" hidden>
<p>Enter an API token (from <code>tenax token new</code>). It is kept only in this browser tab and sent with every request.</p>
<label>Token <input type="password" id="token" name="token" autocomplete="off" required></label>
<button type="submit">Open the dashboard</button>
<p id="login-error" class="error" role="alert"></p>
</form>
<p id="message" role="status"></p>
<section id="view" aria-live="polite"></section>
</main>
<footer>Refreshes every 5 seconds. <span id="updated"></span></footer>
</body>
</html>
"##;

fn time(t: &DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

fn maybe_time(t: Option<&DateTime<Utc>>) -> String {
    t.map_or_else(|| "—".to_owned(), time)
}

fn duration_ms(ms: i64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 120_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        format!("{:.1} min", ms as f64 / 60_000.0)
    }
}

fn json(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// The root of every fragment: its name, and who is looking (the script shows it).
fn frame(viewer: &Viewer, name: &str, body: Markup) -> Markup {
    html! {
        div.fragment data-view=(name) data-actor=(viewer.name) data-role=(viewer.role) {
            (body)
        }
    }
}

/// A button that posts to a JSON API route (only rendered for a role that may).
fn action(label: &str, url: &str, confirm: Option<&str>) -> Markup {
    html! {
        button.action type="button" data-url=(url) data-confirm=[confirm] { (label) }
    }
}

fn chart(name: &str, title: &str, caption: &str, drawn: Result<String, String>) -> Markup {
    html! {
        figure.chart data-chart=(name) {
            figcaption { strong { (title) } " " span.caption { (caption) } }
            @match drawn {
                Ok(svg) => (PreEscaped(svg)),
                Err(e) => p.error { "The chart could not be drawn: " (e) },
            }
        }
    }
}

fn status_badge(status: &str) -> Markup {
    html! { span class={ "status status-" (status) } { (status) } }
}

pub(super) fn overview(viewer: &Viewer, data: &Overview) -> Markup {
    let statuses: Vec<String> = data.by_status.iter().map(|(s, _)| s.to_string()).collect();
    let status_chart = BarChart {
        categories: &statuses,
        label_every: 1,
        y_desc: "tasks",
        series: &[Series {
            name: "tasks".into(),
            values: data.by_status.iter().map(|(_, n)| *n as f64).collect(),
        }],
        layout: Layout::Grouped,
        value_labels: true,
        format: charts::count,
        size: (560, 280),
    }
    .svg();
    let status_caption = data
        .by_status
        .iter()
        .map(|(s, n)| format!("{s} {n}"))
        .collect::<Vec<_>>()
        .join(" · ");

    let minutes: Vec<String> = (0..60).map(|m| format!("-{}m", 60 - m)).collect();
    let succeeded: u64 = data.per_minute.iter().map(|(s, _)| s).sum();
    let dead: u64 = data.per_minute.iter().map(|(_, d)| d).sum();
    let throughput_chart = BarChart {
        categories: &minutes,
        label_every: 10,
        y_desc: "finished per minute",
        series: &[
            Series {
                name: "succeeded".into(),
                values: data.per_minute.iter().map(|(s, _)| *s as f64).collect(),
            },
            Series {
                name: "dead".into(),
                values: data.per_minute.iter().map(|(_, d)| *d as f64).collect(),
            },
        ],
        layout: Layout::Stacked,
        value_labels: false,
        format: charts::count,
        size: (560, 280),
    }
    .svg();

    let types: Vec<String> = data
        .latency
        .iter()
        .map(|l| l.command_type.clone())
        .collect();
    let latency_chart = BarChart {
        categories: &types,
        label_every: 1,
        y_desc: "run time",
        series: &[
            Series {
                name: "p50".into(),
                values: data.latency.iter().map(|l| l.p50).collect(),
            },
            Series {
                name: "p95".into(),
                values: data.latency.iter().map(|l| l.p95).collect(),
            },
            Series {
                name: "p99".into(),
                values: data.latency.iter().map(|l| l.p99).collect(),
            },
        ],
        layout: Layout::Grouped,
        value_labels: true,
        format: charts::millis,
        size: (560, 280),
    }
    .svg();

    let queues: Vec<String> = data.backlog.iter().map(|(q, _)| q.clone()).collect();
    let backlog_chart = BarChart {
        categories: &queues,
        label_every: 1,
        y_desc: "due tasks",
        series: &[Series {
            name: "backlog".into(),
            values: data.backlog.iter().map(|(_, n)| *n as f64).collect(),
        }],
        layout: Layout::Grouped,
        value_labels: true,
        format: charts::count,
        size: (560, 280),
    }
    .svg();
    let backlog_caption = data
        .backlog
        .iter()
        .map(|(q, n)| format!("{q} {n}"))
        .collect::<Vec<_>>()
        .join(" · ");

    frame(
        viewer,
        "overview",
        html! {
            h2 { "Overview" }
            p.summary {
                (data.total) " tasks. "
                @if let Some(age) = data.oldest_due_age_ms {
                    "The oldest due task has waited " (duration_ms(i64::try_from(age).unwrap_or(i64::MAX))) ". "
                }
                "As of " (time(&data.now)) "."
            }
            div.charts {
                (chart("status", "Tasks by status", &status_caption, status_chart))
                (chart("throughput", "Throughput, last hour",
                    &format!("{succeeded} succeeded · {dead} dead"), throughput_chart))
                (chart("latency", "Run time by command type, last hour",
                    "p50 · p95 · p99 of succeeded tasks, first start to finish", latency_chart))
                (chart("backlog", "Backlog by queue", &backlog_caption, backlog_chart))
            }
            @if data.truncated {
                p.note { "More tasks finished in the last hour than the charts read (2000); throughput and run times show the latest of them." }
            }
            table.latency {
                thead { tr { th { "command type" } th { "succeeded" } th { "p50" } th { "p95" } th { "p99" } } }
                tbody {
                    @for l in &data.latency {
                        tr {
                            td { (l.command_type) }
                            td.num { (l.samples) }
                            td.num { (charts::millis(l.p50)) }
                            td.num { (charts::millis(l.p95)) }
                            td.num { (charts::millis(l.p99)) }
                        }
                    }
                    @if data.latency.is_empty() {
                        tr { td colspan="5" { "No task succeeded in the last hour." } }
                    }
                }
            }
        },
    )
}

pub(super) fn queues(
    viewer: &Viewer,
    queues: &[QueueInfo],
    rate_limits: &[RateLimit],
    event_rules: &[EventRule],
) -> Markup {
    frame(
        viewer,
        "queues",
        html! {
            h2 { "Queues" }
            table {
                thead { tr { th { "queue" } th { "state" } th { "waiting" } th { "running" } th { "max running" } th { "changed" }
                    @if viewer.admin { th { "actions" } } } }
                tbody {
                    @for q in queues {
                        tr data-queue=(q.name) {
                            td { a href={ "#tasks?queue=" (encode(&q.name)) } { (q.name) } }
                            td { @if q.paused { span.status.status-paused { "paused" } } @else { "active" } }
                            td.num { (q.waiting) }
                            td.num { (q.running) }
                            td.num { @if let Some(m) = q.max_running { (m) } @else { "—" } }
                            td { (maybe_time(q.updated_at.as_ref())) }
                            @if viewer.admin {
                                td {
                                    @if q.paused {
                                        (action("Resume", &format!("/v1/queues/{}/resume", encode(&q.name)), None))
                                    } @else {
                                        (action("Pause", &format!("/v1/queues/{}/pause", encode(&q.name)), None))
                                    }
                                }
                            }
                        }
                    }
                    @if queues.is_empty() { tr { td colspan="7" { "No queue has tasks yet." } } }
                }
            }
            h2 { "Rate limits" }
            p { "How fast tasks of a command type start, across all nodes: a bucket of " em { "burst" } " tasks refilled at the rate." }
            table.rate-limits {
                thead { tr { th { "command type" } th { "per second" } th { "burst" } } }
                tbody {
                    @for l in rate_limits {
                        tr data-rate-limit=(l.command_type) {
                            td { a href={ "#tasks?type=" (encode(&l.command_type)) } { (l.command_type) } }
                            td.num { (l.per_second) }
                            td.num { (l.burst) }
                        }
                    }
                    @if rate_limits.is_empty() { tr { td colspan="3" { "No rate limit: every command type starts as fast as workers claim." } } }
                }
            }
            h2 { "Event rules" }
            p { "Tasks inserted in these queues and of these command types write task events (" code { "GET /v1/events" } ")." }
            table.event-rules {
                thead { tr { th { "queue" } th { "command type" } th { "since" } } }
                tbody {
                    @for r in event_rules {
                        tr.event-rule {
                            td { (r.queue.as_deref().unwrap_or("(any)")) }
                            td { (r.command_type.as_deref().unwrap_or("(any)")) }
                            td { (time(&r.created_at)) }
                        }
                    }
                    @if event_rules.is_empty() { tr { td colspan="3" { "No event rule: no task writes events." } } }
                }
            }
        },
    )
}

/// Buttons for a task, by its status.
fn task_actions(viewer: &Viewer, task: &TaskView) -> Markup {
    html! {
        @if viewer.admin {
            // A dead task is retried once its compensation has finished.
            @if task.status == "dead" && task.compensation.as_deref() != Some("pending") {
                (action("Retry", &format!("/v1/tasks/{}/retry", task.id), None))
            }
            @if matches!(task.status.as_str(), "pending" | "retrying" | "blocked" | "running") {
                (action("Cancel", &format!("/v1/tasks/{}/cancel", task.id),
                    Some(&format!("Cancel task {}?", task.task_no))))
            }
        }
    }
}

fn task_table(viewer: &Viewer, tasks: &[TaskView], with_error: bool) -> Markup {
    html! {
        table.tasks {
            thead { tr {
                th { "id" } th { "task_no" } th { "type" } th { "queue" } th { "status" }
                th { "attempts" } th { "created" }
                @if with_error { th { "last error" } }
                @if viewer.admin { th { "actions" } }
            } }
            tbody {
                @for t in tasks {
                    tr data-task=(t.id) data-status=(t.status) {
                        td { a href={ "#task/" (t.id) } { (t.id) } }
                        td.no { a href={ "#task/" (t.id) } { (t.task_no) } }
                        td { (t.command_type) }
                        td { (t.queue) }
                        td { (status_badge(&t.status)) }
                        td.num { (t.attempt) "/" (t.max_attempts) }
                        td { (time(&t.created_at)) }
                        @if with_error { td.error { (t.last_error.as_deref().unwrap_or("")) } }
                        @if viewer.admin { td { (task_actions(viewer, t)) } }
                    }
                }
                @if tasks.is_empty() { tr { td colspan="9" { "No task." } } }
            }
        }
    }
}

pub(super) fn tasks(
    viewer: &Viewer,
    query: &TaskQuery,
    tasks: &[TaskView],
    older: Option<i64>,
) -> Markup {
    let selected = query.status.as_deref().unwrap_or("");
    let next = older.map(|before| {
        let mut link = String::from("#tasks?");
        for (key, value) in [
            ("status", &query.status),
            ("type", &query.command_type),
            ("queue", &query.queue),
        ] {
            if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
                link.push_str(key);
                link.push('=');
                link.push_str(&encode(v));
                link.push('&');
            }
        }
        link.push_str(&format!("before={before}"));
        link
    });
    frame(
        viewer,
        "tasks",
        html! {
            h2 { "Tasks" }
            form #filters.filters {
                label { "Status "
                    select name="status" {
                        option value="" selected[selected.is_empty()] { "any" }
                        @for s in TaskStatus::ALL {
                            option value=(s.as_str()) selected[selected == s.as_str()] { (s.as_str()) }
                        }
                    }
                }
                label { "Type " input name="type" value=(query.command_type.as_deref().unwrap_or("")); }
                label { "Queue " input name="queue" value=(query.queue.as_deref().unwrap_or("")); }
                label { "task_no " input name="task_no" value=(query.task_no.as_deref().unwrap_or("")) placeholder="exact number"; }
                button type="submit" { "Filter" }
            }
            (task_table(viewer, tasks, true))
            @if let Some(next) = next { p { a.older href=(next) { "Older tasks" } } }
        },
    )
}

/// Percent-encode a query value (the script decodes it back).
fn encode(value: &str) -> String {
    let mut out = String::new();
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(super) fn task(
    viewer: &Viewer,
    t: &TaskView,
    attempts: &[AttemptView],
    compensation: Option<&TaskView>,
    workflow: Option<i64>,
) -> Markup {
    frame(
        viewer,
        "task",
        html! {
            h2 { "Task " (t.id) " " (status_badge(&t.status)) }
            div.actions { (task_actions(viewer, t)) }
            dl.fields {
                dt { "task_no" } dd.no { (t.task_no) }
                dt { "command type" } dd { (t.command_type) " (payload version " (t.payload_version) ")" }
                dt { "kind" } dd { (t.kind)
                    @if let Some(parent) = t.parent_id { ", compensates " a href={ "#task/" (parent) } { "task " (parent) } } }
                dt { "workflow" } dd {
                    @if let Some(w) = workflow { a href={ "#workflow/" (w) } { "workflow " (w) } } @else { "—" } }
                dt { "queue" } dd { a href={ "#tasks?queue=" (encode(&t.queue)) } { (t.queue) } }
                dt { "priority" } dd { (t.priority) }
                dt { "attempts" } dd { (t.attempt) " of " (t.max_attempts) }
                dt { "run at" } dd { (time(&t.run_at)) }
                dt { "timeout" } dd { (duration_ms(i64::try_from(t.timeout_ms).unwrap_or(i64::MAX))) }
                @if let Some(key) = &t.concurrency_key { dt { "concurrency key" } dd { (key) } }
                dt { "created" } dd { (time(&t.created_at)) }
                dt { "started" } dd { (maybe_time(t.started_at.as_ref())) }
                dt { "finished" } dd { (maybe_time(t.finished_at.as_ref())) }
                dt { "compensation" } dd {
                    @if let Some(state) = &t.compensation { (state) } @else { "—" }
                    @if let Some(c) = compensation {
                        " — " a href={ "#task/" (c.id) } { "compensation task " (c.id) } " " (status_badge(&c.status))
                    }
                }
            }
            @if let Some(error) = &t.last_error {
                h3 { "Last error" }
                pre.error { (error) }
            }
            h3 { "Payload" }
            pre.payload { (json(&t.payload)) }
            h3 { "Result" }
            @if let Some(result) = &t.result { pre.result { (json(result)) } } @else { p { "—" } }
            h3 { "Attempts" }
            table.attempts {
                thead { tr { th { "#" } th { "worker" } th { "started" } th { "duration" } th { "outcome" } th { "error" } } }
                tbody {
                    @for a in attempts {
                        tr {
                            td.num { (a.attempt) }
                            td { (a.worker) }
                            td { (time(&a.started_at)) }
                            td.num { @if let Some(f) = a.finished_at { (duration_ms((f - a.started_at).num_milliseconds())) } @else { "—" } }
                            td { (status_badge(&a.outcome)) }
                            td.error { (a.error.as_deref().unwrap_or("")) }
                        }
                    }
                    @if attempts.is_empty() { tr { td colspan="6" { "Not run yet." } } }
                }
            }
        },
    )
}

pub(super) fn dead(viewer: &Viewer, dead: &[TaskView], retrying: &[TaskView]) -> Markup {
    frame(
        viewer,
        "dead",
        html! {
            h2 { "Dead tasks" }
            p { "Tasks whose attempts ran out or that failed permanently, newest first. A retry gives a task a fresh attempt budget." }
            (task_table(viewer, dead, true))
            h2 { "Failing tasks" }
            p { "Tasks whose last attempt failed and that wait for their next one." }
            (task_table(viewer, retrying, true))
        },
    )
}

pub(super) fn schedules(viewer: &Viewer, schedules: &[ScheduleView]) -> Markup {
    frame(
        viewer,
        "schedules",
        html! {
            h2 { "Periodic schedules" }
            table {
                thead { tr { th { "name" } th { "cadence" } th { "command type" } th { "queue" }
                    th { "next fire" } th { "last tick" } th { "state" }
                    @if viewer.admin { th { "actions" } } } }
                tbody {
                    @for s in schedules {
                        tr data-schedule=(s.name) {
                            td { (s.name) }
                            td { (s.cadence) }
                            td { (s.command_type) }
                            td { (s.queue) }
                            td { @if s.paused { "— (paused)" } @else { (maybe_time(s.next_fire_at.as_ref())) } }
                            td { (maybe_time(s.last_tick.as_ref())) }
                            td { @if s.paused { span.status.status-paused { "paused" } } @else { "active" } }
                            @if viewer.admin {
                                td {
                                    @if s.paused {
                                        (action("Resume", &format!("/v1/schedules/{}/resume", encode(&s.name)), None))
                                    } @else {
                                        (action("Pause", &format!("/v1/schedules/{}/pause", encode(&s.name)), None))
                                    }
                                }
                            }
                        }
                    }
                    @if schedules.is_empty() { tr { td colspan="8" { "No schedule." } } }
                }
            }
        },
    )
}

pub(super) fn audit(viewer: &Viewer, entries: &[AuditRecord]) -> Markup {
    frame(
        viewer,
        "audit",
        html! {
            h2 { "Audit trail" }
            table {
                thead { tr { th { "when" } th { "who" } th { "action" } th { "target" } th { "details" } } }
                tbody {
                    @for e in entries {
                        tr {
                            td { (time(&e.at)) }
                            td { (e.actor) }
                            td { (e.action) }
                            td { (e.target) }
                            td { code { (e.details.to_string()) } }
                        }
                    }
                    @if entries.is_empty() { tr { td colspan="5" { "No operator action yet." } } }
                }
            }
        },
    )
}

pub(super) fn workflows(viewer: &Viewer, list: &[WorkflowRecord]) -> Markup {
    frame(
        viewer,
        "workflows",
        html! {
            h2 { "Workflows" }
            table {
                thead { tr { th { "id" } th { "name" } th { "kind" } th { "state" } th { "tasks" } th { "created" } th { "finished" } } }
                tbody {
                    @for w in list {
                        tr {
                            td { a href={ "#workflow/" (w.id) } { (w.id) } }
                            td { a href={ "#workflow/" (w.id) } { (w.name) } }
                            td { (w.kind.as_str()) }
                            td { (status_badge(w.state.as_str())) }
                            td { @for (s, n) in &w.by_status { (s.as_str()) " " (n) " " } }
                            td { (time(&w.created_at)) }
                            td { (maybe_time(w.finished_at.as_ref())) }
                        }
                    }
                    @if list.is_empty() { tr { td colspan="7" { "No workflow." } } }
                }
            }
        },
    )
}

pub(super) fn workflow(
    viewer: &Viewer,
    w: &WorkflowRecord,
    tasks: &[(String, Vec<String>, TaskView)],
) -> Markup {
    let nodes: Vec<graph::Node<'_>> = tasks
        .iter()
        .map(|(key, parents, t)| graph::Node {
            id: t.id,
            key,
            status: &t.status,
            parents,
        })
        .collect();
    frame(
        viewer,
        "workflow",
        html! {
            h2 { "Workflow " (w.id) ": " (w.name) " " (status_badge(w.state.as_str())) }
            p { (w.kind.as_str()) ", " (w.policy.as_str()) ", created " (time(&w.created_at)) }
            @if tasks.len() <= graph::MAX_DRAWN {
                figure.graph { (graph::draw(&nodes)) }
            } @else {
                p.muted { (tasks.len()) " tasks: too many to draw, listed below." }
            }
            table {
                thead { tr { th { "key" } th { "after" } th { "task" } th { "type" } th { "status" } th { "compensation" } } }
                tbody {
                    @for (key, parents, t) in tasks {
                        tr {
                            td { (key) }
                            td { (parents.join(", ")) }
                            td { a href={ "#task/" (t.id) } { (t.task_no) } }
                            td { (t.command_type) }
                            td { (status_badge(&t.status)) }
                            td { (t.compensation.as_deref().unwrap_or("—")) }
                        }
                    }
                }
            }
        },
    )
}
