//! Rules every backend applies the same way: input validation and small conversions.
use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use tenax_core::{InvalidInput, TaskRecord};

use crate::error::{Result, StorageError};
use crate::params::{TaskInsertParams, TaskRef};

/// The largest payload accepted, in bytes.
pub const PAYLOAD_MAX_BYTES: usize = 1024 * 1024;

/// Check an insert before it reaches the database: the checks
/// [`Storage::task_insert`](crate::Storage::task_insert) and
/// [`Storage::task_insert_many`](crate::Storage::task_insert_many) run first, so that a
/// caller can sort out the tasks a bulk insert would refuse before making it.
pub fn validate_insert(params: &TaskInsertParams) -> Result<()> {
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
    check_json(&params.payload)
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
    validate_created_by(params.created_by.as_deref())?;
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
    Ok(())
}

/// Whether `text` is one JSON value that [`serde_json::Value`] accepts, checked
/// without building it: the same parser and the same refusals (a lone surrogate
/// escape, a number out of `f64`'s range, nesting deeper than 128), but nothing is
/// allocated but the parser's buffer for escaped strings. Building the `Value` of
/// each payload was the largest single cost of a bulk insert on the client.
/// (`serde::de::IgnoredAny` is not enough: it skips strings and numbers without
/// decoding them, so it lets through what `Value` refuses, such as a lone surrogate
/// escape, which PostgreSQL's JSON parser refuses too.)
pub(crate) fn check_json(text: &str) -> serde_json::Result<()> {
    serde_json::from_str::<JsonChecked>(text).map(|_| ())
}

/// A JSON value checked and dropped; see [`check_json`].
struct JsonChecked;

impl<'de> serde::Deserialize<'de> for JsonChecked {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        deserializer.deserialize_any(JsonChecked)
    }
}

impl<'de> serde::de::Visitor<'de> for JsonChecked {
    type Value = JsonChecked;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> std::result::Result<Self, E> {
        Ok(JsonChecked)
    }
    fn visit_bool<E>(self, _: bool) -> std::result::Result<Self, E> {
        Ok(JsonChecked)
    }
    fn visit_i64<E>(self, _: i64) -> std::result::Result<Self, E> {
        Ok(JsonChecked)
    }
    fn visit_u64<E>(self, _: u64) -> std::result::Result<Self, E> {
        Ok(JsonChecked)
    }
    fn visit_f64<E>(self, _: f64) -> std::result::Result<Self, E> {
        Ok(JsonChecked)
    }
    fn visit_str<E>(self, _: &str) -> std::result::Result<Self, E> {
        Ok(JsonChecked)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<Self, A::Error> {
        while seq.next_element::<JsonChecked>()?.is_some() {}
        Ok(JsonChecked)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Self, A::Error> {
        while map.next_entry::<JsonChecked, JsonChecked>()?.is_some() {}
        Ok(JsonChecked)
    }
}

/// The longest delay or duration stored: longer ones (a retry policy capped at
/// `Duration::MAX`, say) are clamped to it, so no backend overflows its time type.
pub const MAX_DELAY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Whether a stored payload is the same JSON value as a new one (key order and
/// white space do not matter). Text that is not JSON is the same as nothing.
pub(crate) fn same_payload(stored: &str, new: &str) -> bool {
    if stored == new {
        return true;
    }
    match (
        serde_json::from_str::<Value>(stored),
        serde_json::from_str::<Value>(new),
    ) {
        (Ok(stored), Ok(new)) => stored == new,
        _ => false,
    }
}

/// The answer to an insert whose `task_no` exists: the existing task, or a conflict.
///
/// The payload version is not compared: a node of the next version that re-enqueues a
/// task a node of the previous version enqueued (same type, same payload) means the
/// same task, and the stored task keeps its version, which every newer worker upcasts.
pub(crate) fn existing_or_conflict(
    existing: TaskRecord,
    params: &TaskInsertParams,
) -> Result<crate::TaskInserted> {
    if existing.command_type != params.command_type {
        return Err(StorageError::TaskNoConflict {
            task_no: params.task_no.to_string(),
            field: "command type",
        });
    }
    if !same_payload(&existing.payload, &params.payload) {
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

/// What stands in for a NUL character in text written from outside: U+FFFD, the
/// replacement character. PostgreSQL's text cannot hold a NUL, so without this an
/// outcome holding one (a response body, say) could not be written there at all; it
/// is replaced on every backend, so each stores and answers the same text.
pub const NUL_REPLACEMENT: char = '\u{FFFD}';

/// Text from outside (an error, a result, a response body or header within them) made
/// storable on every backend: each NUL character becomes [`NUL_REPLACEMENT`]. (A JSON
/// result's escaped `\u0000` is six plain characters and stays as it is.) Applied by
/// every backend's outcome writes before they write.
pub(crate) fn storable(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        std::borrow::Cow::Owned(text.replace('\0', "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// An error as stored: [`storable`], then cut at a character boundary to
/// [`crate::ERROR_MAX_BYTES`] (an ellipsis marks the cut).
pub(crate) fn truncate_error(error: &str) -> String {
    let error = storable(error);
    if error.len() <= crate::ERROR_MAX_BYTES {
        return error.into_owned();
    }
    let mut end = crate::ERROR_MAX_BYTES;
    while !error.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &error[..end])
}

/// A completion with its result [`storable`] (borrowed as it is when it already was).
pub(crate) fn storable_completion(
    params: &crate::TaskCompleteParams,
) -> std::borrow::Cow<'_, crate::TaskCompleteParams> {
    match params.result.as_deref().map(storable) {
        Some(std::borrow::Cow::Owned(result)) => {
            std::borrow::Cow::Owned(crate::TaskCompleteParams {
                result: Some(result),
                ..params.clone()
            })
        }
        _ => std::borrow::Cow::Borrowed(params),
    }
}

/// A batch of completions with every result [`storable`].
pub(crate) fn storable_completions(
    params: &[crate::TaskCompleteParams],
) -> std::borrow::Cow<'_, [crate::TaskCompleteParams]> {
    if !params
        .iter()
        .any(|p| p.result.as_deref().is_some_and(|r| r.contains('\0')))
    {
        return std::borrow::Cow::Borrowed(params);
    }
    std::borrow::Cow::Owned(
        params
            .iter()
            .map(|p| storable_completion(p).into_owned())
            .collect(),
    )
}

#[cfg(feature = "sqlite")]
pub(crate) fn json_list<T: serde::Serialize>(items: &[T]) -> String {
    serde_json::to_string(items).unwrap_or_else(|_| "[]".to_owned())
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
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
#[cfg(any(feature = "sqlite", feature = "mysql"))]
#[derive(Debug, Default)]
pub(crate) struct QueueControls {
    /// Queues that are paused.
    pub(crate) paused: Vec<String>,
    /// Queues (not paused) with a limit, and the limit.
    pub(crate) limited: Vec<(String, u32)>,
}

#[cfg(any(feature = "sqlite", feature = "mysql"))]
impl QueueControls {
    /// Nothing restricts the claim: the fast path applies.
    #[cfg(feature = "sqlite")]
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

/// The columns of a task list: a backend's task columns, with `payload` and `result`
/// replaced by the empty string where longer than `max` bytes (see
/// [`TaskListParams::value_max_bytes`](crate::TaskListParams::value_max_bytes)).
/// `octet_length` is SQLite's (3.43+), PostgreSQL's and MariaDB's alike, and reads a
/// value's stored size without its content. The bound is a number, never text.
pub(crate) fn list_columns(columns: &str, max: Option<u32>) -> String {
    let Some(max) = max else {
        return columns.to_owned();
    };
    columns
        .split(',')
        .map(str::trim)
        .map(|column| match column {
            "payload" | "result" => format!(
                "CASE WHEN octet_length({column}) > {max} THEN '' ELSE {column} END AS {column}"
            ),
            other => other.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Longest [`TaskInsertParams::created_by`] in bytes: a token's name is no longer.
pub const CREATED_BY_MAX_BYTES: usize = 100;

fn validate_created_by(name: Option<&str>) -> Result<()> {
    match name {
        Some(name) if name.is_empty() || name.len() > CREATED_BY_MAX_BYTES => {
            Err(InvalidInput::new(
                "created_by",
                format!("must be 1 to {CREATED_BY_MAX_BYTES} bytes"),
            )
            .into())
        }
        _ => Ok(()),
    }
}

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

/// Check every task of a bulk insert before any reaches the database. A refusal names
/// the item (`tasks[3].payload`).
pub(crate) fn validate_many(tasks: &[TaskInsertParams]) -> Result<()> {
    for (i, task) in tasks.iter().enumerate() {
        validate_insert(task).map_err(|err| match err {
            StorageError::Invalid(invalid) => InvalidInput::new(
                invalid.field,
                format!("(task {i}, task_no {}) {}", task.task_no, invalid.reason),
            )
            .into(),
            other => other,
        })?;
    }
    Ok(())
}

/// The records a bulk insert created, by the position of the item that created each:
/// the first item of each number found in `created` (a map by `task_no`, drained).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn by_position(
    tasks: &[TaskInsertParams],
    mut created: std::collections::HashMap<String, TaskRecord>,
) -> Vec<Option<TaskRecord>> {
    tasks
        .iter()
        .map(|task| created.remove(task.task_no.as_str()))
        .collect()
}

/// The per-item answer of a bulk insert. `created[i]` holds the row item `i` inserted
/// (`None` where it inserted none) and `existing` the rows that held a number before,
/// by `task_no`. An item that created its row is `Created`; any other is compared with
/// the row of its number: one this call created from an earlier item (as a repeat in
/// a later call would be), or one that existed.
pub(crate) fn resolve_many(
    tasks: &[TaskInsertParams],
    created: Vec<Option<TaskRecord>>,
    existing: &std::collections::HashMap<String, TaskRecord>,
) -> Result<Vec<crate::TaskInsertOutcome>> {
    use crate::TaskInsertOutcome;
    if created.len() != tasks.len() {
        return Err(StorageError::Corrupt(format!(
            "{} insert outcomes for {} tasks",
            created.len(),
            tasks.len()
        )));
    }
    // The first item of each number, for the items that created nothing (most calls
    // have none): a number this call created was created by its first item.
    let first: std::collections::HashMap<&str, usize> = if created.iter().any(Option::is_none) {
        let mut first = std::collections::HashMap::with_capacity(tasks.len());
        for (i, task) in tasks.iter().enumerate() {
            first.entry(task.task_no.as_str()).or_insert(i);
        }
        first
    } else {
        std::collections::HashMap::new()
    };
    let mut out: Vec<TaskInsertOutcome> = Vec::with_capacity(tasks.len());
    for (task, record) in tasks.iter().zip(created) {
        if let Some(record) = record {
            out.push(TaskInsertOutcome::Created(record));
            continue;
        }
        let no = task.task_no.as_str();
        let created_earlier = first
            .get(no)
            .and_then(|&j| out.get(j))
            .filter(|earlier| matches!(earlier, TaskInsertOutcome::Created(_)))
            .map(TaskInsertOutcome::task);
        let stored = created_earlier
            .or_else(|| existing.get(no))
            .cloned()
            .ok_or_else(|| StorageError::NotFound(task.task_no.to_string()))?;
        let outcome = match existing_or_conflict(stored.clone(), task) {
            Ok(_) => TaskInsertOutcome::Existing(stored),
            Err(StorageError::TaskNoConflict { field, .. }) => TaskInsertOutcome::Conflict {
                existing: stored,
                field,
            },
            Err(other) => return Err(other),
        };
        out.push(outcome);
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

#[cfg(test)]
mod json_tests {
    use super::*;

    /// What `check_json` says of `text` is what parsing it into a `Value` says.
    fn agrees(text: &str) -> bool {
        check_json(text).is_ok() == serde_json::from_str::<Value>(text).is_ok()
    }

    #[test]
    fn the_payload_check_accepts_exactly_what_a_json_value_accepts() {
        let deep_ok = format!("{}{}", "[".repeat(127), "]".repeat(127));
        let too_deep = format!("{}{}", "[".repeat(129), "]".repeat(129));
        let cases = [
            r#"{"order": 1, "note": "bench"}"#,
            "null",
            "true",
            "-0",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775809",
            "1e308",
            "1e400",
            "-1e400",
            "1e-400",
            "0.1e",
            "01",
            r#""\ud83d\ude00""#,
            r#""\ud83d""#,
            r#""\ude00""#,
            r#""\ud83d\u0041""#,
            r#"{"\ud800": 1}"#,
            r#"{"\u00e9": "\n\t\/"}"#,
            r#""\x""#,
            "\"tab\tinside\"",
            r#"{"a": 1, "a": 2}"#,
            r#"{"a": 1,}"#,
            "[1, 2,]",
            "{1: 2}",
            "",
            " ",
            "[] []",
            "[]  \n",
            "nul",
            &deep_ok,
            &too_deep,
        ];
        for text in cases {
            assert!(agrees(text), "the check and Value disagree on {text:?}");
        }
        assert!(check_json(r#""\ud83d""#).is_err());
        assert!(check_json("1e400").is_err());
        assert!(check_json(&too_deep).is_err());
        assert!(check_json(&deep_ok).is_ok());
    }

    /// Every one-byte change (a replacement by a byte that matters to JSON, or a
    /// deletion) of a few documents: the check agrees with `Value` on each.
    #[test]
    fn the_payload_check_agrees_with_a_json_value_on_every_one_byte_change() {
        let seeds = [
            r#"{"a":[1,-2.5e3,true,null,"x\u00e9\ud83d\ude00"],"b":{"c":"\\"}}"#,
            r#"[18446744073709551615,1e308,"\ud800\udc00",{}]"#,
        ];
        let bytes = b"\"\\u0d8e9-+.,:[]{} xtn";
        let mut tried = 0;
        for seed in seeds {
            for at in 0..seed.len() {
                let mut deleted = seed.as_bytes().to_vec();
                deleted.remove(at);
                let mut variants = vec![deleted];
                for &b in bytes {
                    let mut changed = seed.as_bytes().to_vec();
                    changed[at] = b;
                    variants.push(changed);
                }
                for variant in variants {
                    if let Ok(text) = std::str::from_utf8(&variant) {
                        tried += 1;
                        assert!(agrees(text), "the check and Value disagree on {text:?}");
                    }
                }
            }
        }
        assert!(tried > 1_000, "only {tried} variants were tried");
    }
}

/// The `expires_beyond` bound of a reap ([`crate::TaskReapParams`]) as the statement
/// applies it: its distance from `now`, counted from `statement_now` (the database
/// clock read in the statement's transaction) when that is later than `now`. A lease
/// granted after the caller read `now` expires at most a TTL after `statement_now`, so
/// it is never beyond the bound; a lease granted before a step back expires the step
/// later than that, and still is.
pub(crate) fn reap_beyond(
    now: Option<chrono::DateTime<chrono::Utc>>,
    expires_beyond: Option<chrono::DateTime<chrono::Utc>>,
    statement_now: chrono::DateTime<chrono::Utc>,
) -> Option<chrono::DateTime<chrono::Utc>> {
    let beyond = expires_beyond?;
    match now {
        Some(now) if statement_now > now => Some(beyond + (statement_now - now)),
        _ => Some(beyond),
    }
}
