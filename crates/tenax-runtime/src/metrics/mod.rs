//! Metrics through the [`metrics`] facade: the worker, the storage wrapper
//! ([`instrument`]) and the database sampler ([`sampler_loop`]) record into whatever
//! recorder the process installed (none: recording costs next to nothing). With the
//! `prometheus` feature, [`prometheus_builder`] gives an exporter configured with
//! Tenax's histogram buckets.
//!
//! [`METRICS`] lists every metric with its type, unit and labels; the reference table
//! `docs/reference/metrics.md` is generated from it, and a test checks that what a
//! running worker registers matches it.
//!
//! Counts by status, backlogs and ages come from the database ([`sampler_loop`]), so
//! they hold across any number of nodes; the other metrics are per process.
use std::time::Duration;

use tenax_core::{TaskKind, TaskRecord};

mod sampler;
mod storage;

pub use sampler::{sample_once, sampler_loop, SAMPLE_INTERVAL_DEFAULT};
pub use storage::{instrument, InstrumentedStorage};

#[cfg(feature = "prometheus")]
mod prometheus;
#[cfg(feature = "prometheus")]
pub use prometheus::prometheus_builder;

/// A metric's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up.
    Counter,
    /// A value that is set.
    Gauge,
    /// Observations in buckets.
    Histogram,
}

impl MetricKind {
    /// The Prometheus type name.
    pub const fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        }
    }
}

/// One metric Tenax records.
#[derive(Debug, Clone, Copy)]
pub struct MetricDef {
    /// The exposed name.
    pub name: &'static str,
    /// Its type.
    pub kind: MetricKind,
    /// Its unit (`seconds`, `tasks`, ...).
    pub unit: &'static str,
    /// Its labels.
    pub labels: &'static [&'static str],
    /// Who records it: `sampler`, `worker` or `storage`.
    pub source: &'static str,
    /// What it means.
    pub help: &'static str,
}

/// Metric names.
pub mod names {
    /// Tasks by queue and status (sampled from the database).
    pub const TASKS: &str = "tenax_tasks";
    /// Due, unclaimed tasks per queue (sampled).
    pub const QUEUE_BACKLOG: &str = "tenax_queue_backlog";
    /// Age of each queue's oldest due task (sampled).
    pub const QUEUE_OLDEST_DUE_AGE: &str = "tenax_queue_oldest_due_age_seconds";
    /// Unix time of the last successful sample.
    pub const SAMPLE_TIMESTAMP: &str = "tenax_sampler_last_success_timestamp_seconds";
    /// Attempts ended, by outcome.
    pub const ATTEMPTS: &str = "tenax_attempts_total";
    /// Retries scheduled.
    pub const RETRIES: &str = "tenax_task_retries_total";
    /// Tasks dead.
    pub const DEATHS: &str = "tenax_task_deaths_total";
    /// Compensations finished, by outcome.
    pub const COMPENSATIONS: &str = "tenax_compensations_total";
    /// Queue wait (due to claim).
    pub const QUEUE_WAIT: &str = "tenax_task_queue_wait_seconds";
    /// Handler execution time.
    pub const EXECUTION: &str = "tenax_task_execution_seconds";
    /// Executor slots busy or free.
    pub const WORKER_SLOTS: &str = "tenax_worker_slots";
    /// Unix time of the last heartbeat tick.
    pub const HEARTBEAT_TIMESTAMP: &str = "tenax_worker_heartbeat_timestamp_seconds";
    /// Tasks per claim.
    pub const CLAIM_BATCH: &str = "tenax_claim_batch_size";
    /// Leases that expired and were reaped.
    pub const REAPED: &str = "tenax_leases_expired_total";
    /// Storage call latency.
    pub const STORAGE_CALL: &str = "tenax_storage_call_duration_seconds";
    /// Outbound delivery attempts (callbacks, death alerts), by outcome.
    pub const DELIVERIES: &str = "tenax_deliveries_total";
    /// Outbox rows waiting for delivery, by kind (sampled).
    pub const OUTBOX_PENDING: &str = "tenax_outbox_pending";
    /// Age of the oldest undelivered outbox row, by kind (sampled).
    pub const OUTBOX_OLDEST_AGE: &str = "tenax_outbox_oldest_pending_age_seconds";
}

/// Every metric Tenax records, in the order of the reference table.
pub const METRICS: &[MetricDef] = &[
    MetricDef {
        name: names::TASKS,
        kind: MetricKind::Gauge,
        unit: "tasks",
        labels: &["queue", "status"],
        source: "sampler",
        help: "Tasks by queue and status, counted in the database (every status of every queue seen, 0 included).",
    },
    MetricDef {
        name: names::QUEUE_BACKLOG,
        kind: MetricKind::Gauge,
        unit: "tasks",
        labels: &["queue"],
        source: "sampler",
        help: "Tasks due and not claimed: pending or retrying with their run time reached.",
    },
    MetricDef {
        name: names::QUEUE_OLDEST_DUE_AGE,
        kind: MetricKind::Gauge,
        unit: "seconds",
        labels: &["queue"],
        source: "sampler",
        help: "How long the queue's longest-waiting due task has been due (0 when none is).",
    },
    MetricDef {
        name: names::SAMPLE_TIMESTAMP,
        kind: MetricKind::Gauge,
        unit: "seconds",
        labels: &[],
        source: "sampler",
        help: "Unix time of the last successful database sample.",
    },
    MetricDef {
        name: names::ATTEMPTS,
        kind: MetricKind::Counter,
        unit: "attempts",
        labels: &["command_type", "kind", "outcome"],
        source: "worker",
        help: "Attempts ended and written, by outcome: succeeded, retried, dead, handed_back (shutdown), cancelled (a cancel request was honoured), dropped (lease lost: nothing written) or unwritten (the write failed).",
    },
    MetricDef {
        name: names::RETRIES,
        kind: MetricKind::Counter,
        unit: "retries",
        labels: &["command_type", "kind"],
        source: "worker",
        help: "Failed attempts that scheduled a retry.",
    },
    MetricDef {
        name: names::DEATHS,
        kind: MetricKind::Counter,
        unit: "tasks",
        labels: &["command_type", "kind"],
        source: "worker",
        help: "Tasks that died (permanent error or attempts spent); for kind=execute a compensation was scheduled.",
    },
    MetricDef {
        name: names::COMPENSATIONS,
        kind: MetricKind::Counter,
        unit: "compensations",
        labels: &["command_type", "outcome"],
        source: "worker",
        help: "Compensations finished: succeeded, none (the command has no compensation) or dead.",
    },
    MetricDef {
        name: names::QUEUE_WAIT,
        kind: MetricKind::Histogram,
        unit: "seconds",
        labels: &["command_type"],
        source: "worker",
        help: "From when the task became due (enqueue, its scheduled time, or its retry time) to its claim, on the database clock.",
    },
    MetricDef {
        name: names::EXECUTION,
        kind: MetricKind::Histogram,
        unit: "seconds",
        labels: &["command_type"],
        source: "worker",
        help: "Handler run time of one attempt, whatever its outcome.",
    },
    MetricDef {
        name: names::WORKER_SLOTS,
        kind: MetricKind::Gauge,
        unit: "slots",
        labels: &["state"],
        source: "worker",
        help: "Executor slots of this process's workers: state=busy or free.",
    },
    MetricDef {
        name: names::HEARTBEAT_TIMESTAMP,
        kind: MetricKind::Gauge,
        unit: "seconds",
        labels: &[],
        source: "worker",
        help: "Unix time of this process's last heartbeat tick (every heartbeat interval, leases held or not).",
    },
    MetricDef {
        name: names::CLAIM_BATCH,
        kind: MetricKind::Histogram,
        unit: "tasks",
        labels: &[],
        source: "worker",
        help: "Tasks returned by each successful claim, 0 for an idle poll.",
    },
    MetricDef {
        name: names::REAPED,
        kind: MetricKind::Counter,
        unit: "tasks",
        labels: &["status"],
        source: "worker",
        help: "Running tasks whose lease expired, reaped by this process to status=retrying or dead.",
    },
    MetricDef {
        name: names::STORAGE_CALL,
        kind: MetricKind::Histogram,
        unit: "seconds",
        labels: &["method", "outcome"],
        source: "storage",
        help: "Latency of each Storage call through the instrumented wrapper; outcome=ok or error.",
    },
    MetricDef {
        name: names::DELIVERIES,
        kind: MetricKind::Counter,
        unit: "messages",
        labels: &["kind", "outcome"],
        source: "delivery",
        help: "Outbox rows settled by this process's senders: kind=callback, death or alert, outcome=delivered, retried or expired (a death alert counts each death it carries).",
    },
    MetricDef {
        name: names::OUTBOX_PENDING,
        kind: MetricKind::Gauge,
        unit: "messages",
        labels: &["kind"],
        source: "sampler",
        help: "Outbox rows not yet acknowledged, by kind (callback, death, alert; 0 included), counted in the database for the kinds some running sender takes: a receiver or webhook that is down makes it grow.",
    },
    MetricDef {
        name: names::OUTBOX_OLDEST_AGE,
        kind: MetricKind::Gauge,
        unit: "seconds",
        labels: &["kind"],
        source: "sampler",
        help: "How long the oldest unacknowledged outbox row of each kind has waited since its task finished (0 when none waits).",
    },
];

/// Histogram buckets for durations, in seconds: 1 ms to 10 min.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 600.0,
];

/// Histogram buckets for claim batch sizes.
pub const BATCH_BUCKETS: &[f64] = &[0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 500.0];

/// Describe every metric to the installed recorder (help text and unit). Call once
/// after installing a recorder; harmless without one.
pub fn describe() {
    for m in METRICS {
        let help = format!("{} [{}]", m.help, m.unit);
        match m.kind {
            MetricKind::Counter => ::metrics::describe_counter!(m.name, help),
            MetricKind::Gauge => ::metrics::describe_gauge!(m.name, help),
            MetricKind::Histogram => ::metrics::describe_histogram!(m.name, help),
        }
    }
}

// Recording helpers used by the worker: small call sites, names in one place.

/// A claim returned `tasks`.
pub(crate) fn claimed(tasks: &[TaskRecord], lease_ttl: Duration) {
    ::metrics::histogram!(names::CLAIM_BATCH).record(tasks.len() as f64);
    for task in tasks {
        // The claim's database time: the lease it was granted ends at claim + TTL.
        let Some(expires) = task.lease_expires_at else {
            continue;
        };
        let Ok(ttl) = chrono::Duration::from_std(lease_ttl) else {
            continue;
        };
        let waited = (expires - ttl - task.run_at).to_std().unwrap_or_default();
        ::metrics::histogram!(names::QUEUE_WAIT, "command_type" => task.command_type.clone())
            .record(waited.as_secs_f64());
    }
}

/// A worker started with `slots` executor slots. Counters that may stay at zero for a
/// long time are registered at zero, so rates and alerts have a series to work on.
pub(crate) fn worker_started(slots: u32) {
    ::metrics::gauge!(names::WORKER_SLOTS, "state" => "free").increment(f64::from(slots));
    ::metrics::gauge!(names::WORKER_SLOTS, "state" => "busy").increment(0.0);
    for status in [
        tenax_core::TaskStatus::Retrying,
        tenax_core::TaskStatus::Dead,
    ] {
        ::metrics::counter!(names::REAPED, "status" => status.as_str()).increment(0);
    }
}

/// A worker stopped: its slots are gone.
pub(crate) fn worker_stopped(slots: u32) {
    ::metrics::gauge!(names::WORKER_SLOTS, "state" => "free").decrement(f64::from(slots));
}

/// An executor took (`true`) or gave back (`false`) a slot.
pub(crate) fn slot_taken(taken: bool) {
    let (busy, free) = if taken { (1.0, -1.0) } else { (-1.0, 1.0) };
    ::metrics::gauge!(names::WORKER_SLOTS, "state" => "busy").increment(busy);
    ::metrics::gauge!(names::WORKER_SLOTS, "state" => "free").increment(free);
}

/// A heartbeat tick.
pub(crate) fn heartbeat() {
    let now = chrono::Utc::now().timestamp_millis() as f64 / 1000.0;
    ::metrics::gauge!(names::HEARTBEAT_TIMESTAMP).set(now);
}

/// A handler ran for `took`.
pub(crate) fn executed(task: &TaskRecord, took: Duration) {
    ::metrics::histogram!(names::EXECUTION, "command_type" => task.command_type.clone())
        .record(took.as_secs_f64());
}

/// How an attempt's outcome was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Succeeded { compensation_none: bool },
    Retried,
    Dead,
    HandedBack,
    Cancelled,
    Dropped,
    Unwritten,
}

/// An attempt ended and its outcome was written (or dropped, or could not be).
pub(crate) fn attempt_ended(task: &TaskRecord, outcome: Outcome) {
    let command_type = task.command_type.clone();
    let kind = task.kind.as_str();
    let label = match outcome {
        Outcome::Succeeded { .. } => "succeeded",
        Outcome::Retried => "retried",
        Outcome::Dead => "dead",
        Outcome::HandedBack => "handed_back",
        Outcome::Cancelled => "cancelled",
        Outcome::Dropped => "dropped",
        Outcome::Unwritten => "unwritten",
    };
    ::metrics::counter!(names::ATTEMPTS, "command_type" => command_type.clone(), "kind" => kind, "outcome" => label)
        .increment(1);
    match outcome {
        Outcome::Retried => {
            ::metrics::counter!(names::RETRIES, "command_type" => command_type.clone(), "kind" => kind)
                .increment(1);
        }
        Outcome::Dead => {
            ::metrics::counter!(names::DEATHS, "command_type" => command_type.clone(), "kind" => kind)
                .increment(1);
        }
        _ => {}
    }
    if task.kind == TaskKind::Compensate {
        let finished = match outcome {
            Outcome::Succeeded {
                compensation_none: true,
            } => Some("none"),
            Outcome::Succeeded { .. } => Some("succeeded"),
            Outcome::Dead => Some("dead"),
            _ => None,
        };
        if let Some(finished) = finished {
            ::metrics::counter!(names::COMPENSATIONS, "command_type" => command_type, "outcome" => finished)
                .increment(1);
        }
    }
}

/// The reaper moved an expired lease's task to `status`.
pub(crate) fn reaped(status: tenax_core::TaskStatus) {
    ::metrics::counter!(names::REAPED, "status" => status.as_str()).increment(1);
}

/// The reference table of every metric (Markdown), as in `docs/reference/metrics.md`.
pub fn reference_markdown() -> String {
    use std::fmt::Write;
    let mut out = String::from(
        "| name | type | unit | labels | source | meaning |\n|---|---|---|---|---|---|\n",
    );
    for m in METRICS {
        let labels = if m.labels.is_empty() {
            "—".to_owned()
        } else {
            m.labels
                .iter()
                .map(|l| format!("`{l}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} | {} |",
            m.name,
            m.kind.as_str(),
            m.unit,
            labels,
            m.source,
            m.help
        );
    }
    out
}
