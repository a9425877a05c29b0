//! The outbox of outbound deliveries: completion callbacks, death alerts and queue
//! threshold alerts.
//!
//! A row is written by a database trigger on `tenax_tasks`, in the transaction that
//! moves a task to `succeeded`, `dead` or `cancelled`: a `callback` row when the task
//! carries a `callback_url`, a `death` row whenever it dies. Its body (the task summary
//! as JSON) and its delivery id are fixed then, so every redelivery sends the same
//! bytes under the same id. A sender claims due rows ([`Storage::outbox_claim`]), which
//! counts the attempt and hides them for a lease; it then settles them
//! ([`Storage::outbox_settle`]) under that claim: delivered, retried later, or expired.
//! A sender that crashes leaves its rows to be claimed again when the lease ends:
//! delivery is at least once, and receivers deduplicate on the delivery id.
//!
//! Senders say that they run ([`Storage::outbox_senders_seen`], every
//! [`OUTBOX_SENDER_REFRESH`], and before their worker claims anything). A `death` row
//! is written only while a `death` sender is recorded, so a deployment without alerts
//! stores none. The pruner forgets a sender silent for [`OUTBOX_SENDER_GRACE`] and
//! expires the pending rows, older than that, that no recorded sender takes, and
//! [`Storage::outbox_stats`] counts only rows of recorded kinds: a row that nothing
//! will send is never reported as a delivery waiting.
//!
//! [`Storage::outbox_senders_seen`]: crate::Storage::outbox_senders_seen
//! [`Storage::outbox_stats`]: crate::Storage::outbox_stats
//!
//! [`Storage::outbox_claim`]: crate::Storage::outbox_claim
//! [`Storage::outbox_settle`]: crate::Storage::outbox_settle
use std::time::Duration;

use chrono::{DateTime, Utc};
use tenax_core::{InvalidInput, TaskId};

use crate::error::{Result, StorageError};

/// Most rows one claim or one listing returns.
pub const OUTBOX_BATCH_MAX: u32 = 1_000;
/// Longest delivery error kept per row, in bytes.
pub const OUTBOX_ERROR_MAX_BYTES: usize = 2_048;
/// Longest callback URL, in bytes.
pub const CALLBACK_URL_MAX_BYTES: usize = 2_048;
/// How often a running sender records that it runs.
pub const OUTBOX_SENDER_REFRESH: Duration = Duration::from_secs(60);
/// How long a sender may stay silent (a restart, a deploy, an outage of every node that
/// sends) before the pruner forgets it: its kind's rows are then no longer written
/// (deaths) or counted, and those pending for longer are expired. A day, the default
/// maximum age of a callback and of an alert: a running sender would have expired
/// them by then too.
pub const OUTBOX_SENDER_GRACE: Duration = Duration::from_secs(24 * 3600);

/// What an outbox row delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutboxKind {
    /// A task's final outcome, POSTed to its `callback_url`.
    Callback,
    /// A task died: material for the death alert.
    Death,
    /// A queue threshold alert started or stopped firing: a message for the alert
    /// webhook, written by [`Storage::alert_transition`](crate::Storage::alert_transition)
    /// with the change it reports. It names no task (`task_id` 0).
    Alert,
}

impl OutboxKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            OutboxKind::Callback => "callback",
            OutboxKind::Death => "death",
            OutboxKind::Alert => "alert",
        }
    }

    /// The kind a stored name names.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "callback" => Ok(OutboxKind::Callback),
            "death" => Ok(OutboxKind::Death),
            "alert" => Ok(OutboxKind::Alert),
            other => Err(StorageError::Corrupt(format!("outbox kind {other:?}"))),
        }
    }
}

/// Where an outbox row stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutboxStatus {
    /// Waiting for (another) delivery attempt.
    Pending,
    /// Acknowledged by the receiver.
    Delivered,
    /// Given up: its maximum age passed, or the receiver refused it for good.
    Expired,
}

impl OutboxStatus {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            OutboxStatus::Pending => "pending",
            OutboxStatus::Delivered => "delivered",
            OutboxStatus::Expired => "expired",
        }
    }

    /// The status a stored name names.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "pending" => Ok(OutboxStatus::Pending),
            "delivered" => Ok(OutboxStatus::Delivered),
            "expired" => Ok(OutboxStatus::Expired),
            other => Err(StorageError::Corrupt(format!("outbox status {other:?}"))),
        }
    }
}

/// One outbox row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRecord {
    /// Row id (the order rows were written in).
    pub id: i64,
    /// The id receivers deduplicate on; the same on every attempt.
    pub delivery_id: String,
    /// What it delivers.
    pub kind: OutboxKind,
    /// The task it is about.
    pub task_id: TaskId,
    /// Where a callback goes (`None` for a death).
    pub url: Option<String>,
    /// The task summary, JSON text.
    pub body: String,
    /// Where it stands.
    pub status: OutboxStatus,
    /// Claims so far (the current claim's number while claimed).
    pub attempts: u32,
    /// When it may be claimed next (while claimed: when its claim lapses).
    pub next_attempt_at: DateTime<Utc>,
    /// The last delivery error.
    pub last_error: Option<String>,
    /// When the task's outcome wrote it.
    pub created_at: DateTime<Utc>,
    /// When it was delivered or expired.
    pub settled_at: Option<DateTime<Utc>>,
}

impl OutboxRecord {
    /// The claim this record was returned under, for [`OutboxSettleParams`].
    pub fn claim(&self) -> OutboxClaim {
        OutboxClaim {
            id: self.id,
            attempts: self.attempts,
        }
    }
}

/// A claim on an outbox row: the row and its attempt count when claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OutboxClaim {
    /// The row.
    pub id: i64,
    /// Its `attempts` after the claim.
    pub attempts: u32,
}

/// [`Storage::outbox_claim`](crate::Storage::outbox_claim).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxClaimParams {
    /// Only rows of this kind.
    pub kind: OutboxKind,
    /// At most this many (1..=[`OUTBOX_BATCH_MAX`]), oldest first.
    pub limit: u32,
    /// How long claimed rows stay hidden from other claims (longer than a delivery
    /// attempt takes).
    pub lease: Duration,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// How a delivery attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutboxOutcome {
    /// The receiver acknowledged it.
    Delivered,
    /// Try again after `delay` from now; but when that is later than the row's creation
    /// plus `max_age`, the row expires instead.
    Retry {
        /// Wait before the next attempt.
        delay: Duration,
        /// Oldest a row may be when attempted.
        max_age: Duration,
        /// What went wrong.
        error: String,
    },
    /// Give up now.
    Expire {
        /// Why.
        error: String,
    },
}

/// [`Storage::outbox_settle`](crate::Storage::outbox_settle).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxSettleParams {
    /// The claims the outcome ends (at most [`OUTBOX_BATCH_MAX`]).
    pub claims: Vec<OutboxClaim>,
    /// The outcome, the same for all of them.
    pub outcome: OutboxOutcome,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// [`Storage::outbox_list`](crate::Storage::outbox_list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxListParams {
    /// Only this kind.
    pub kind: Option<OutboxKind>,
    /// Only this status.
    pub status: Option<OutboxStatus>,
    /// Only rows about this task.
    pub task_id: Option<TaskId>,
    /// At most this many (1..=[`OUTBOX_BATCH_MAX`]), oldest first.
    pub limit: u32,
}

/// [`Storage::outbox_prune`](crate::Storage::outbox_prune).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxPruneParams {
    /// Delete delivered and expired rows settled longer ago than this, and pending rows
    /// written longer ago than this.
    pub older_than: Duration,
    /// Forget senders silent for longer than this, then expire the pending rows,
    /// written longer ago than this, of kinds no recorded sender takes
    /// ([`OUTBOX_SENDER_GRACE`]).
    pub sender_grace: Duration,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// [`Storage::outbox_senders_seen`](crate::Storage::outbox_senders_seen).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxSendersParams {
    /// The kinds the caller sends.
    pub kinds: Vec<OutboxKind>,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// The error a pending row is expired with when no sender of its kind runs.
pub(crate) fn unsent_error(grace: Duration) -> String {
    format!(
        "no sender of this kind has run for {}s: nothing could deliver it",
        grace.as_secs()
    )
}

/// [`Storage::outbox_stats`](crate::Storage::outbox_stats).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OutboxStatsParams {
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// The pending rows of one outbox kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxStat {
    /// The kind.
    pub kind: OutboxKind,
    /// Rows waiting for (another) delivery attempt, claimed or not, of a kind some
    /// sender takes.
    pub pending: u64,
    /// How long the oldest of them has waited since it was written.
    pub oldest_age: Duration,
}

/// A stat from one grouped row: the kind's name, its count, and the age of its oldest
/// row in milliseconds (negative ages, from a clock override, count as zero).
pub(crate) fn stat_from(kind: &str, pending: i64, oldest_age_ms: i64) -> Result<OutboxStat> {
    Ok(OutboxStat {
        kind: OutboxKind::parse(kind)?,
        pending: u64::try_from(pending)
            .map_err(|_| StorageError::Corrupt(format!("outbox count {pending}")))?,
        oldest_age: Duration::from_millis(u64::try_from(oldest_age_ms).unwrap_or(0)),
    })
}

fn check_limit(limit: u32) -> Result<()> {
    if limit == 0 || limit > OUTBOX_BATCH_MAX {
        return Err(InvalidInput::new(
            "limit",
            format!("{limit} must be between 1 and {OUTBOX_BATCH_MAX}"),
        )
        .into());
    }
    Ok(())
}

pub(crate) fn validate_claim(params: &OutboxClaimParams) -> Result<()> {
    check_limit(params.limit)?;
    if params.lease.is_zero() || params.lease > crate::MAX_DELAY {
        return Err(InvalidInput::new("lease", "must be above zero and at most MAX_DELAY").into());
    }
    Ok(())
}

pub(crate) fn validate_list(params: &OutboxListParams) -> Result<()> {
    check_limit(params.limit)
}

/// Check a settle; returns `false` when there is nothing to settle.
pub(crate) fn validate_settle(params: &OutboxSettleParams) -> Result<bool> {
    if params.claims.len() > OUTBOX_BATCH_MAX as usize {
        return Err(
            InvalidInput::new("claims", format!("at most {OUTBOX_BATCH_MAX} per settle")).into(),
        );
    }
    Ok(!params.claims.is_empty())
}

/// The settle's new status name (for a retry, the one it keeps unless it expires),
/// the delay and maximum age of a retry, and its error text, truncated.
pub(crate) fn settle_parts(
    outcome: &OutboxOutcome,
) -> (OutboxStatus, Duration, Duration, Option<String>) {
    match outcome {
        OutboxOutcome::Delivered => (
            OutboxStatus::Delivered,
            Duration::ZERO,
            Duration::ZERO,
            None,
        ),
        OutboxOutcome::Retry {
            delay,
            max_age,
            error,
        } => (
            OutboxStatus::Pending,
            (*delay).min(crate::MAX_DELAY),
            (*max_age).min(crate::MAX_DELAY),
            Some(truncate(error)),
        ),
        OutboxOutcome::Expire { error } => (
            OutboxStatus::Expired,
            Duration::ZERO,
            Duration::ZERO,
            Some(truncate(error)),
        ),
    }
}

fn truncate(text: &str) -> String {
    let text = crate::common::storable(text);
    if text.len() <= OUTBOX_ERROR_MAX_BYTES {
        return text.into_owned();
    }
    let mut end = OUTBOX_ERROR_MAX_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// Check a task's callback URL: an absolute `http` or `https` URL of bounded length.
/// Which hosts are allowed is the server's configuration, not the store's.
pub(crate) fn validate_callback_url(url: Option<&str>) -> Result<()> {
    let Some(url) = url else {
        return Ok(());
    };
    if url.len() > CALLBACK_URL_MAX_BYTES {
        return Err(InvalidInput::new(
            "callback_url",
            format!("at most {CALLBACK_URL_MAX_BYTES} bytes"),
        )
        .into());
    }
    if !(url.starts_with("http://") || url.starts_with("https://"))
        || url.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(InvalidInput::new("callback_url", "must be an http:// or https:// URL").into());
    }
    Ok(())
}
