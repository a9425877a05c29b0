//! Task events: an outbox of state transitions, sequenced for streams and relays.
//!
//! A task inserted while an event rule covers its queue or command type carries the
//! `events` flag, and then each of its transitions (inserted, claimed, retried,
//! succeeded, dead, cancelled, compensation finished) writes one row to `tenax_events`
//! from a database trigger, in the transaction of the transition. A task without the
//! flag writes nothing: the flag is decided at insert, so rule changes apply to tasks
//! inserted afterwards.
//!
//! Event ids come from an auto-increment, which is allocated at insert but becomes
//! visible at commit, so a reader that resumed "after id N" could miss an event that
//! committed late under a lower id. The sequencer closes that gap: one node at a time,
//! holding the `sequencer` lease ([`Storage::event_lease`]), it gives every committed
//! event a position `seq` ([`Storage::event_sequence`]), consecutive and in commit order.
//! Streams and relays read by position ([`Storage::event_list`]); each relay keeps the
//! last position it delivered in its own lease row ([`Storage::event_cursor_advance`]),
//! written only under its lease epoch. The events of one task keep their order: each
//! transition locks the task row, so its events commit in the order they were written.
//!
//! [`Storage::event_lease`]: crate::Storage::event_lease
//! [`Storage::event_sequence`]: crate::Storage::event_sequence
//! [`Storage::event_list`]: crate::Storage::event_list
//! [`Storage::event_cursor_advance`]: crate::Storage::event_cursor_advance
use std::time::Duration;

use chrono::{DateTime, Utc};
use tenax_core::{InvalidInput, QueueName, Secrets, TaskId, TaskStatus};

use crate::error::{Result, StorageError};

/// Most events one listing or one sequencing step takes.
pub const EVENT_BATCH_MAX: u32 = 10_000;
/// The lease name of the sequencer.
pub const SEQUENCER_LEASE: &str = "sequencer";

/// What happened to the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    /// It waits to be claimed: inserted (possibly `blocked` behind its parents),
    /// unblocked, returned by an operator's retry, or handed back by its worker.
    Enqueued,
    /// A worker claimed it (status `running`).
    Started,
    /// An attempt failed and it will be tried again (status `retrying`).
    Retried,
    /// It succeeded.
    Succeeded,
    /// It failed for good.
    Dead,
    /// It was cancelled.
    Cancelled,
    /// Its compensation finished (`compensation` is `succeeded` or `failed`).
    Compensated,
}

impl EventKind {
    /// Every kind.
    pub const ALL: [EventKind; 7] = [
        EventKind::Enqueued,
        EventKind::Started,
        EventKind::Retried,
        EventKind::Succeeded,
        EventKind::Dead,
        EventKind::Cancelled,
        EventKind::Compensated,
    ];

    /// The stored and published name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Enqueued => "enqueued",
            EventKind::Started => "started",
            EventKind::Retried => "retried",
            EventKind::Succeeded => "succeeded",
            EventKind::Dead => "dead",
            EventKind::Cancelled => "cancelled",
            EventKind::Compensated => "compensated",
        }
    }

    /// The kind a name names, or `None`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }

    pub(crate) fn parse(name: &str) -> Result<Self> {
        Self::from_name(name).ok_or_else(|| StorageError::Corrupt(format!("event kind {name:?}")))
    }
}

/// One stored event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    /// Row id (allocation order, not commit order).
    pub id: i64,
    /// The unique id consumers deduplicate on.
    pub event_id: String,
    /// The stream position; `None` until sequenced.
    pub seq: Option<i64>,
    /// What happened.
    pub event: EventKind,
    /// The task.
    pub task_id: TaskId,
    /// Its queue.
    pub queue: String,
    /// Its command type.
    pub command_type: String,
    /// Its status after the transition.
    pub status: String,
    /// The task as the transition left it, JSON text (`id`, `task_no`, `kind`,
    /// `command_type`, `queue`, `priority`, `status`, `attempt`, `max_attempts`,
    /// `parent_id`, `compensation`, `error`, `result`).
    pub task: String,
    /// When the transition happened (the task's `updated_at`).
    pub occurred_at: DateTime<Utc>,
}

/// Largest `task.result` an event carries, in bytes: a longer one is left out (`null`,
/// with `task.result_omitted: true`) and read whole with the task. It keeps a stream
/// page and a relayed message bounded whatever a handler returns.
pub const EVENT_RESULT_MAX_BYTES: usize = 16 * 1024;

/// The schema name and version every published event carries in `schema`. A change
/// that removes or redefines a field makes a new version; new fields may be added
/// within a version.
pub const EVENT_SCHEMA: &str = "tenax.task_event.v1";

impl EventRecord {
    /// The published form (schema [`EVENT_SCHEMA`]):
    ///
    /// ```json
    /// {"schema": "tenax.task_event.v1", "id": "7d1c…", "seq": 42, "event": "succeeded",
    ///  "occurred_at": "2026-12-01T06:10:00.123Z",
    ///  "task": {"id": 17, "task_no": "…", "kind": "execute", "command_type": "…",
    ///           "queue": "default", "priority": 5, "status": "succeeded", "attempt": 1,
    ///           "max_attempts": 5, "parent_id": null, "compensation": null,
    ///           "error": null, "result": "{\"ok\":true}"}}
    /// ```
    ///
    /// `id` is unique per event and the same on every redelivery; `seq` is its stream
    /// position; `task.result` (the handler's JSON result, as text) is set on
    /// `succeeded` only.
    ///
    /// A result longer than [`EVENT_RESULT_MAX_BYTES`] is left out: `null`, with
    /// `"result_omitted": true` beside it (the field is absent otherwise). The result's
    /// secret fields (`secrets`) are masked. Literal copies of secret
    /// values in the result and the error were masked before they were stored, by the
    /// worker that wrote them ([`tenax_core::secrets`]).
    pub fn envelope(&self, secrets: &Secrets) -> serde_json::Value {
        let mut task = serde_json::from_str::<serde_json::Value>(&self.task)
            .unwrap_or_else(|_| serde_json::Value::String(self.task.clone()));
        if let Some(result) = task.get_mut("result") {
            if result
                .as_str()
                .is_some_and(|r| r.len() > EVENT_RESULT_MAX_BYTES)
            {
                *result = serde_json::Value::Null;
                task["result_omitted"] = serde_json::Value::Bool(true);
            }
        }
        if secrets.covers(&self.command_type) {
            let masker = secrets.masker(&self.command_type, "{}");
            if let Some(serde_json::Value::String(result)) = task.get_mut("result") {
                *result = masker.json_text(result).into_owned();
            }
        }
        serde_json::json!({
            "schema": EVENT_SCHEMA,
            "id": self.event_id,
            "seq": self.seq,
            "event": self.event.as_str(),
            "occurred_at": self.occurred_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "task": task,
        })
    }
}

/// An event rule: tasks of this queue and command type write events (`None` = any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRule {
    /// Only this queue, or any.
    pub queue: Option<String>,
    /// Only this command type, or any.
    pub command_type: Option<String>,
    /// When the rule was added.
    pub created_at: DateTime<Utc>,
}

/// [`Storage::event_rule_set`](crate::Storage::event_rule_set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRuleParams {
    /// Only this queue, or any.
    pub queue: Option<String>,
    /// Only this command type, or any.
    pub command_type: Option<String>,
    /// Add the rule (`true`) or remove it.
    pub enabled: bool,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// A held lease on a single-holder role: the sequencer or one relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventLease {
    /// The role (`sequencer`, or a relay's name).
    pub name: String,
    /// Who holds it.
    pub holder: String,
    /// Bumped whenever the holder changes or a lease lapsed; writes are fenced on it.
    pub epoch: i64,
    /// Until when it is held unless renewed.
    pub expires_at: DateTime<Utc>,
    /// The sequencer's last position given, or the relay's last position delivered.
    pub last_seq: i64,
}

/// [`Storage::event_lease`](crate::Storage::event_lease).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventLeaseParams {
    /// The role: 1 to 64 of `a-z 0-9 _ - . :`.
    pub name: String,
    /// Who asks (a node id); at most 255 bytes.
    pub holder: String,
    /// How long the lease lasts from now.
    pub ttl: Duration,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// [`Storage::event_sequence`](crate::Storage::event_sequence).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventSequenceParams {
    /// The `sequencer` lease this call acts under.
    pub lease: EventLease,
    /// At most this many events (1..=[`EVENT_BATCH_MAX`]), oldest row first.
    pub limit: u32,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// [`Storage::event_cursor_advance`](crate::Storage::event_cursor_advance).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventCursorParams {
    /// The relay's lease.
    pub lease: EventLease,
    /// The last position it delivered (never moves backwards).
    pub last_seq: i64,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// [`Storage::event_list`](crate::Storage::event_list).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EventListParams {
    /// Only positions after this one.
    pub after: i64,
    /// At most this many (1..=[`EVENT_BATCH_MAX`]), by position.
    pub limit: u32,
    /// Only this queue.
    pub queue: Option<String>,
    /// Only this command type.
    pub command_type: Option<String>,
    /// Only these statuses after the transition (empty = any).
    pub statuses: Vec<TaskStatus>,
    /// Only these kinds (empty = any).
    pub events: Vec<EventKind>,
}

/// The answer of [`Storage::event_list`](crate::Storage::event_list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventPage {
    /// The sequenced events after the position asked, matching the filters.
    pub events: Vec<EventRecord>,
    /// The last position given so far (the stream's head).
    pub head: i64,
    /// Every position up to this one was pruned: a reader resuming from an earlier
    /// position has missed events.
    pub pruned_through: i64,
    /// The last position this page covers: a reader continues after it (with filters
    /// it may be beyond the last event returned).
    pub scanned_through: i64,
}

/// [`Storage::event_prune`](crate::Storage::event_prune).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventPruneParams {
    /// Delete sequenced events sequenced longer ago than this...
    pub older_than: Duration,
    /// ...and delivered by each of these relays (their lease rows' positions; a relay
    /// that never delivered anything holds everything back).
    pub relays: Vec<String>,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

fn check_limit(limit: u32) -> Result<()> {
    if limit == 0 || limit > EVENT_BATCH_MAX {
        return Err(InvalidInput::new(
            "limit",
            format!("{limit} must be between 1 and {EVENT_BATCH_MAX}"),
        )
        .into());
    }
    Ok(())
}

/// A rule's stored queue and command type ('' = any).
pub(crate) fn validate_rule(params: &EventRuleParams) -> Result<(String, String)> {
    let queue = match &params.queue {
        Some(q) => QueueName::new(q.clone())?.as_str().to_owned(),
        None => String::new(),
    };
    let command_type = match &params.command_type {
        Some(t) => {
            tenax_core::validate_command_type(t)?;
            t.clone()
        }
        None => String::new(),
    };
    Ok((queue, command_type))
}

pub(crate) fn rule_from_stored(
    queue: String,
    command_type: String,
    created_at: DateTime<Utc>,
) -> EventRule {
    EventRule {
        queue: (!queue.is_empty()).then_some(queue),
        command_type: (!command_type.is_empty()).then_some(command_type),
        created_at,
    }
}

pub(crate) fn validate_lease_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-' | b'.' | b':')
        });
    if !ok {
        return Err(InvalidInput::new("lease name", "1 to 64 of a-z, 0-9, _, -, . and :").into());
    }
    Ok(())
}

pub(crate) fn validate_lease(params: &EventLeaseParams) -> Result<()> {
    validate_lease_name(&params.name)?;
    if params.holder.is_empty() || params.holder.len() > 255 {
        return Err(InvalidInput::new("holder", "1 to 255 bytes").into());
    }
    if params.ttl.is_zero() || params.ttl > crate::MAX_DELAY {
        return Err(InvalidInput::new("ttl", "must be above zero and at most MAX_DELAY").into());
    }
    Ok(())
}

pub(crate) fn validate_sequence(params: &EventSequenceParams) -> Result<()> {
    check_limit(params.limit)?;
    if params.lease.name != SEQUENCER_LEASE {
        return Err(InvalidInput::new("lease", "sequencing needs the sequencer lease").into());
    }
    Ok(())
}

pub(crate) fn validate_cursor(params: &EventCursorParams) -> Result<()> {
    validate_lease_name(&params.lease.name)?;
    if params.lease.name == SEQUENCER_LEASE {
        return Err(InvalidInput::new("lease", "the sequencer has no delivery cursor").into());
    }
    if params.last_seq < 0 {
        return Err(InvalidInput::new("last_seq", "must not be negative").into());
    }
    Ok(())
}

pub(crate) fn validate_list(params: &EventListParams) -> Result<()> {
    check_limit(params.limit)?;
    if params.after < 0 {
        return Err(InvalidInput::new("after", "must not be negative").into());
    }
    if params.statuses.len() > 16 || params.events.len() > 16 {
        return Err(InvalidInput::new("filter", "at most 16 statuses and 16 kinds").into());
    }
    Ok(())
}

pub(crate) fn validate_prune(params: &EventPruneParams) -> Result<()> {
    if params.older_than > crate::MAX_DELAY * 100 {
        return Err(InvalidInput::new("older_than", "too long").into());
    }
    for relay in &params.relays {
        validate_lease_name(relay)?;
    }
    Ok(())
}

/// A listing's page: where it continues is the last event's position when the page is
/// full, else the end of the range it looked through.
pub(crate) fn page(
    params: &EventListParams,
    events: Vec<EventRecord>,
    head: i64,
    pruned_through: i64,
    upper: i64,
) -> EventPage {
    let scanned_through = if events.len() as u64 >= u64::from(params.limit) {
        events.last().and_then(|e| e.seq).unwrap_or(upper)
    } else {
        upper.max(params.after)
    };
    EventPage {
        events,
        head,
        pruned_through,
        scanned_through,
    }
}

/// The last position a prune may reach: what the sequencer gave and every named relay
/// delivered (a relay without a row delivered nothing).
pub(crate) fn prune_bound(head: i64, relays: &[String], delivered: &[i64]) -> i64 {
    let mut names: Vec<&String> = relays.iter().collect();
    names.sort();
    names.dedup();
    if delivered.len() < names.len() {
        return 0;
    }
    delivered.iter().copied().fold(head, i64::min)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(command_type: &str, result: &str) -> EventRecord {
        EventRecord {
            id: 1,
            event_id: "e1".into(),
            seq: Some(1),
            event: EventKind::Succeeded,
            task_id: TaskId(7),
            queue: "default".into(),
            command_type: command_type.into(),
            status: "succeeded".into(),
            task: serde_json::json!({"id": 7, "result": result, "error": null}).to_string(),
            occurred_at: DateTime::<Utc>::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_large_result_is_left_out_of_the_envelope_and_said_so() {
        let none = Secrets::default();
        let small = record("t", r#"{"ok":true}"#).envelope(&none);
        assert_eq!(small["task"]["result"], r#"{"ok":true}"#);
        assert!(small["task"].get("result_omitted").is_none());
        let big = format!(r#"{{"blob":"{}"}}"#, "x".repeat(EVENT_RESULT_MAX_BYTES));
        let large = record("t", &big).envelope(&none);
        assert!(large["task"]["result"].is_null());
        assert_eq!(large["task"]["result_omitted"], true);
        assert!(large.to_string().len() < 1024);
    }

    #[test]
    fn the_results_secret_fields_are_masked_in_the_envelope() {
        let secrets = Secrets::new([("pay", ["card.number"])]).unwrap();
        let result = r#"{"card":{"number":"4111111111111111"}}"#;
        let shown = record("pay", result).envelope(&secrets).to_string();
        assert!(!shown.contains("4111111111111111"), "{shown}");
        let other = record("other", result).envelope(&secrets).to_string();
        assert!(other.contains("4111111111111111"), "{other}");
    }
}
