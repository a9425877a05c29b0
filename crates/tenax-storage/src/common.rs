//! Rules every backend applies the same way: input validation and small conversions.
use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use tenax_core::{InvalidInput, TaskRecord};

use crate::error::{Result, StorageError};
use crate::params::{TaskInsertParams, TaskRef};

/// The largest payload accepted, in bytes.
pub const PAYLOAD_MAX_BYTES: usize = 1024 * 1024;

/// Check an insert before it reaches the database; returns the parsed payload.
pub(crate) fn validate_insert(params: &TaskInsertParams) -> Result<Value> {
    if params.payload.len() > PAYLOAD_MAX_BYTES {
        return Err(InvalidInput::new(
            "payload",
            format!(
                "is {} bytes, at most {PAYLOAD_MAX_BYTES} allowed",
                params.payload.len()
            ),
        )
        .into());
    }
    let payload: Value = serde_json::from_str(&params.payload)
        .map_err(|e| InvalidInput::new("payload", format!("is not JSON: {e}")))?;
    tenax_core::QueueName::new(params.queue.clone())?;
    tenax_core::validate_command_type(&params.command_type)?;
    crate::outbox::validate_callback_url(params.callback_url.as_deref())?;
    if params.max_attempts == 0 {
        return Err(InvalidInput::new("max_attempts", "must be at least 1").into());
    }
    if params.payload_version == 0 {
        return Err(InvalidInput::new("payload_version", "must be at least 1").into());
    }
    if params.timeout.is_zero() {
        return Err(InvalidInput::new("timeout", "must be positive").into());
    }
    validate_concurrency(params.concurrency_key.as_deref(), params.concurrency_limit)?;
    match params.run_at {
        crate::RunAt::In(delay) if delay > MAX_DELAY => {
            return Err(InvalidInput::new("run_in", "must be at most 100 years").into());
        }
        crate::RunAt::At(at) if !(1970..=9999).contains(&chrono::Datelike::year(&at)) => {
            return Err(InvalidInput::new(
                "run_at",
                format!("{at} is outside the years 1970 to 9999"),
            )
            .into());
        }
        _ => {}
    }
    Ok(payload)
}

/// The longest delay or duration stored: longer ones (a retry policy capped at
/// `Duration::MAX`, say) are clamped to it, so no backend overflows its time type.
pub const MAX_DELAY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Whether a stored payload is the same JSON value as a new one (key order and
/// white space do not matter).
pub(crate) fn same_payload(stored: &str, new: &Value) -> bool {
    serde_json::from_str::<Value>(stored)
        .map(|stored| &stored == new)
        .unwrap_or(false)
}

/// The answer to an insert whose `task_no` exists: the existing task, or a conflict.
///
/// The payload version is not compared: a node of the next version that re-enqueues a
/// task a node of the previous version enqueued (same type, same payload) means the
/// same task, and the stored task keeps its version, which every newer worker upcasts.
pub(crate) fn existing_or_conflict(
    existing: TaskRecord,
    params: &TaskInsertParams,
    payload: &Value,
) -> Result<crate::TaskInserted> {
    if existing.command_type != params.command_type {
        return Err(StorageError::TaskNoConflict {
            task_no: params.task_no.to_string(),
            field: "command type",
        });
    }
    if !same_payload(&existing.payload, payload) {
        return Err(StorageError::TaskNoConflict {
            task_no: params.task_no.to_string(),
            field: "payload",
        });
    }
    Ok(crate::TaskInserted {
        task: existing,
        created: false,
    })
}

/// Milliseconds of a duration, clamped to [`MAX_DELAY`].
pub(crate) fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.min(MAX_DELAY).as_millis()).unwrap_or(i64::MAX)
}

/// Errors are stored up to [`crate::ERROR_MAX_BYTES`], cut at a character boundary.
pub(crate) fn truncate_error(error: &str) -> String {
    if error.len() <= crate::ERROR_MAX_BYTES {
        return error.to_owned();
    }
    let mut end = crate::ERROR_MAX_BYTES;
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &error[..end])
}

pub(crate) fn json_list<T: serde::Serialize>(items: &[T]) -> String {
    serde_json::to_string(items).unwrap_or_else(|_| "[]".to_owned())
}

pub(crate) fn split_ref(task: &TaskRef) -> (Option<i64>, Option<&str>) {
    match task {
        TaskRef::Id(id) => (Some(id.0), None),
        TaskRef::No(no) => (None, Some(no.as_str())),
    }
}

/// Why a cancel or retry matched no row: the task is missing or in the wrong status.
pub(crate) fn refusal(
    task: &TaskRef,
    current: Option<TaskRecord>,
    action: &'static str,
) -> StorageError {
    match current {
        None => StorageError::NotFound(task.to_string()),
        Some(current) => StorageError::InvalidState {
            task: task.to_string(),
            status: current.status,
            action,
        },
    }
}

/// Whether a claim offers no command at all (nothing can be claimed).
pub(crate) fn offers_nothing(params: &crate::TaskClaimParams) -> bool {
    params.limit == 0 || params.queues.is_empty() || params.commands.is_empty()
}

/// The compensation task number derived from a dead task: its number, id and the
/// epoch it died under (`ACC-1:compensate:17:3`). The id keeps it unique even after the
/// task is pruned and its number enqueued again; the epoch, across manual retries.
pub(crate) fn compensation_task_no(dead: &TaskRecord) -> String {
    format!(
        "{}{}{}:{}",
        dead.task_no,
        tenax_core::TaskNo::COMPENSATION_INFIX,
        dead.id,
        dead.lease_epoch
    )
}

/// The epoch a compensation task's parent died under, from the compensation's number.
pub(crate) fn compensated_epoch(compensation: &TaskRecord) -> Option<i64> {
    compensation
        .task_no
        .as_str()
        .rsplit(':')
        .next()?
        .parse()
        .ok()
}

/// The refusal to retry a compensation whose task has moved on since it died.
pub(crate) fn stale_compensation(task: &TaskRef) -> StorageError {
    StorageError::InvalidState {
        task: task.to_string(),
        status: tenax_core::TaskStatus::Dead,
        action: "retry a compensation whose task was retried since it died",
    }
}

/// A task's place in the claim order: `run_at − priority × PRIORITY_AGING_STEP`, the key
/// every backend indexes (`migrations/*/0003_claim_controls.sql`).
pub(crate) fn claim_key(task: &TaskRecord) -> chrono::DateTime<chrono::Utc> {
    let step = i64::try_from(tenax_core::PRIORITY_AGING_STEP.as_millis()).unwrap_or(i64::MAX);
    task.run_at - chrono::Duration::milliseconds(step * i64::from(task.priority.get()))
}

/// Sort claimed tasks in the claim order: by [`claim_key`], then id.
pub(crate) fn sort_in_claim_order(tasks: &mut [TaskRecord]) {
    tasks.sort_by(|a, b| claim_key(a).cmp(&claim_key(b)).then(a.id.cmp(&b.id)));
}

/// Check a queue change before it reaches the database.
pub(crate) fn validate_queue_update(params: &crate::params::QueueUpdateParams) -> Result<()> {
    tenax_core::QueueName::new(params.queue.clone())?;
    if let crate::params::QueueChange::MaxRunning(Some(0)) = params.change {
        return Err(InvalidInput::new(
            "max_running",
            "must be at least 1 (pause the queue to stop it, or remove the limit)",
        )
        .into());
    }
    if let crate::params::QueueChange::MaxRunning(Some(n)) = params.change {
        if i32::try_from(n).is_err() {
            return Err(InvalidInput::new("max_running", format!("{n} is too large")).into());
        }
    }
    Ok(())
}

/// The claim controls of the queues a claim names, as read from `tenax_queues`.
#[derive(Debug, Default)]
pub(crate) struct QueueControls {
    /// Queues that are paused.
    pub(crate) paused: Vec<String>,
    /// Queues (not paused) with a limit, and the limit.
    pub(crate) limited: Vec<(String, u32)>,
}

impl QueueControls {
    /// Nothing restricts the claim: the fast path applies.
    pub(crate) fn is_empty(&self) -> bool {
        self.paused.is_empty() && self.limited.is_empty()
    }
}

/// Per-queue room left under a limit: `max_running − running`, never negative.
pub(crate) fn room(max_running: u32, running: i64) -> u32 {
    u32::try_from((i64::from(max_running) - running).max(0)).unwrap_or(0)
}

/// The longest concurrency key, in bytes.
pub const CONCURRENCY_KEY_MAX_BYTES: usize = 160;
/// The highest concurrency limit of a key.
pub const CONCURRENCY_LIMIT_MAX: u32 = 1000;

fn validate_concurrency(key: Option<&str>, limit: u32) -> Result<()> {
    if let Some(key) = key {
        if key.is_empty() || key.len() > CONCURRENCY_KEY_MAX_BYTES {
            return Err(InvalidInput::new(
                "concurrency_key",
                format!("must be 1 to {CONCURRENCY_KEY_MAX_BYTES} bytes"),
            )
            .into());
        }
        if key.chars().any(char::is_control) || key.trim() != key {
            return Err(InvalidInput::new(
                "concurrency_key",
                "must have no control characters and no leading or trailing spaces",
            )
            .into());
        }
    }
    if !(1..=CONCURRENCY_LIMIT_MAX).contains(&limit) {
        return Err(InvalidInput::new(
            "concurrency_limit",
            format!("must be 1 to {CONCURRENCY_LIMIT_MAX}"),
        )
        .into());
    }
    Ok(())
}

/// A candidate of a claim: task id, its concurrency key (if any) and the key's limit.
pub(crate) type KeyedCandidate = (i64, Option<String>, u32);

/// The candidates a claim may take, given in claim order, at most `limit`: a task
/// without a key is always kept; a keyed task while the running tasks of its key, plus
/// those kept before it in this batch, are below its limit. `running` holds the running
/// count of each key, read under the key's lock (or SQLite's single writer).
pub(crate) fn pick_keyed(
    candidates: &[KeyedCandidate],
    running: &BTreeMap<String, i64>,
    limit: usize,
) -> Vec<i64> {
    let mut taken: BTreeMap<&str, i64> = BTreeMap::new();
    let mut ids = Vec::new();
    for (id, key, max) in candidates {
        if ids.len() >= limit {
            break;
        }
        let Some(key) = key else {
            ids.push(*id);
            continue;
        };
        let now = running.get(key).copied().unwrap_or(0);
        let n = taken.entry(key.as_str()).or_insert(0);
        if now + *n < i64::from(*max) {
            *n += 1;
            ids.push(*id);
        }
    }
    ids
}

/// Check every task of a bulk insert before any reaches the database; returns the
/// parsed payloads in order. A refusal names the item (`tasks[3].payload`).
pub(crate) fn validate_many(tasks: &[TaskInsertParams]) -> Result<Vec<Value>> {
    tasks
        .iter()
        .enumerate()
        .map(|(i, task)| {
            validate_insert(task).map_err(|err| match err {
                StorageError::Invalid(invalid) => InvalidInput::new(
                    invalid.field,
                    format!("(task {i}, task_no {}) {}", task.task_no, invalid.reason),
                )
                .into(),
                other => other,
            })
        })
        .collect()
}

/// The per-item answer of a bulk insert. `created` holds the rows this call inserted
/// and `existing` the rows that held a number before, both by `task_no`. The first
/// item of a number the call inserted is `Created`; a later item of the same number
/// (in the same call) is compared with it, as a repeat in a later call would be.
pub(crate) fn resolve_many(
    tasks: &[TaskInsertParams],
    payloads: &[Value],
    mut created: std::collections::HashMap<String, TaskRecord>,
    existing: &std::collections::HashMap<String, TaskRecord>,
) -> Result<Vec<crate::TaskInsertOutcome>> {
    use crate::TaskInsertOutcome;
    // Where in `out` the record of a number this call created is, for a repeat of it.
    let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut out: Vec<TaskInsertOutcome> = Vec::with_capacity(tasks.len());
    for (task, payload) in tasks.iter().zip(payloads) {
        let no = task.task_no.as_str();
        if let Some(record) = created.remove(no) {
            seen.insert(no, out.len());
            out.push(TaskInsertOutcome::Created(record));
            continue;
        }
        let stored = seen
            .get(no)
            .map(|&i| out[i].task())
            .or_else(|| existing.get(no))
            .cloned()
            .ok_or_else(|| StorageError::NotFound(task.task_no.to_string()))?;
        out.push(match existing_or_conflict(stored.clone(), task, payload) {
            Ok(_) => TaskInsertOutcome::Existing(stored),
            Err(StorageError::TaskNoConflict { field, .. }) => TaskInsertOutcome::Conflict {
                existing: stored,
                field,
            },
            Err(other) => return Err(other),
        });
    }
    Ok(out)
}

/// Refuse a completion batch longer than [`crate::COMPLETE_MANY_MAX`].
pub(crate) fn check_complete_many(params: &[crate::TaskCompleteParams]) -> Result<()> {
    if params.len() > crate::COMPLETE_MANY_MAX {
        return Err(InvalidInput::new(
            "completions",
            format!(
                "at most {} per call, got {}",
                crate::COMPLETE_MANY_MAX,
                params.len()
            ),
        )
        .into());
    }
    Ok(())
}

/// Which items of a completion batch name a lease already named earlier in it: those
/// can never land, and are answered `false` without being written.
pub(crate) fn repeated_leases(params: &[crate::TaskCompleteParams]) -> Vec<bool> {
    let mut seen = std::collections::HashSet::with_capacity(params.len());
    params.iter().map(|p| !seen.insert(p.lease)).collect()
}

#[cfg(test)]
mod keyed_tests {
    use super::*;

    #[test]
    fn a_batch_takes_at_most_the_free_slots_of_each_key() {
        let c = |id: i64, key: &str, max: u32| (id, Some(key.to_owned()), max);
        let candidates = vec![
            c(1, "a", 1),
            c(2, "a", 1),
            (3, None, 1),
            c(4, "b", 2),
            c(5, "b", 2),
            c(6, "c", 2),
        ];
        let running = BTreeMap::from([("b".to_owned(), 1), ("c".to_owned(), 2)]);
        assert_eq!(pick_keyed(&candidates, &running, 10), vec![1, 3, 4]);
        assert_eq!(pick_keyed(&candidates, &BTreeMap::new(), 3), vec![1, 3, 4]);
        assert_eq!(
            pick_keyed(&candidates, &BTreeMap::new(), 10),
            vec![1, 3, 4, 5, 6]
        );
    }
}
