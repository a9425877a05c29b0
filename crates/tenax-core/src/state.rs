//! The task life cycle: statuses and the table of legal transitions.
//!
//! ```text
//!             claim                complete
//!  pending ─────────▶ running ──────────────▶ succeeded
//!     │  ▲              │  ▲ claim
//!     │  │ manual retry │  │
//!     │  │              ▼  │ fail (retryable) / lease expired
//!     │  │            retrying
//!     │  │              │
//!     │  └──── dead ◀───┘ (from running: permanent error, attempts used up)
//!     ▼
//!  cancelled ◀── (pending, retrying, blocked; running after a cancel request,
//!                  written by its worker when the handler stops)
//!  blocked ──▶ pending (parents done; reserved for workflows)
//! ```
//!
//! Every storage backend writes transitions only along [`TRANSITIONS`]; the storage
//! conformance suite checks that random operation sequences never leave the table.
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where a task is in its life cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Waiting for its run time.
    Pending,
    /// Claimed by a worker that holds its lease.
    Running,
    /// Failed; the next attempt is scheduled with backoff.
    Retrying,
    /// Finished successfully (terminal).
    Succeeded,
    /// Finished without success: permanent error or attempts used up (terminal until a
    /// manual retry). Its compensation runs.
    Dead,
    /// Cancelled before it ran, or stopped while running after a cancel request
    /// (terminal).
    Cancelled,
    /// Waiting for parent tasks (workflows).
    Blocked,
}

impl TaskStatus {
    /// Every status, in display order.
    pub const ALL: [TaskStatus; 7] = [
        TaskStatus::Pending,
        TaskStatus::Running,
        TaskStatus::Retrying,
        TaskStatus::Succeeded,
        TaskStatus::Dead,
        TaskStatus::Cancelled,
        TaskStatus::Blocked,
    ];

    /// The name stored in the database and shown to users.
    pub const fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Pending => "pending",
            TaskStatus::Running => "running",
            TaskStatus::Retrying => "retrying",
            TaskStatus::Succeeded => "succeeded",
            TaskStatus::Dead => "dead",
            TaskStatus::Cancelled => "cancelled",
            TaskStatus::Blocked => "blocked",
        }
    }

    /// Whether the task has finished (`succeeded`, `dead` or `cancelled`).
    pub const fn is_finished(self) -> bool {
        matches!(
            self,
            TaskStatus::Succeeded | TaskStatus::Dead | TaskStatus::Cancelled
        )
    }

    /// Whether a worker may claim the task once its run time has come.
    pub const fn is_claimable(self) -> bool {
        matches!(self, TaskStatus::Pending | TaskStatus::Retrying)
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown status name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown task status {0:?} (expected one of pending, running, retrying, succeeded, dead, cancelled, blocked)")]
pub struct UnknownStatus(pub String);

impl FromStr for TaskStatus {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

/// A named step of the life cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transition {
    /// A worker claims a due task (increments attempt and lease epoch).
    Claim,
    /// The handler succeeded.
    Complete,
    /// The handler failed and attempts remain.
    FailRetry,
    /// The handler failed permanently, or its last attempt failed.
    FailDead,
    /// The reaper found the lease expired and attempts remain.
    ReapRetry,
    /// The reaper found the lease expired on the last attempt.
    ReapDead,
    /// An operator or the caller cancelled the task before it ran.
    Cancel,
    /// A running task whose cancel was requested stopped without succeeding (written
    /// by its worker under the lease epoch, or by the reaper once its lease expired).
    CancelRunning,
    /// An operator retried a dead task (fresh attempt budget, history kept).
    ManualRetry,
    /// All parents finished (workflows).
    Unblock,
    /// An operator retried a dead saga step whose undone steps run again first: it
    /// waits for them.
    RetryBehind,
    /// A retry redrives the workflow: a task its parent's death cancelled waits again.
    Restore,
    /// A retry redrives a saga: a step whose work was undone runs again, first.
    Redo,
    /// The same, behind an earlier undone step that runs again before it.
    RedoBehind,
}

/// Every legal transition: `(from, transition, to)`.
pub const TRANSITIONS: &[(TaskStatus, Transition, TaskStatus)] = {
    use TaskStatus::*;
    use Transition::*;
    &[
        (Pending, Claim, Running),
        (Retrying, Claim, Running),
        (Running, Complete, Succeeded),
        (Running, FailRetry, Retrying),
        (Running, FailDead, Dead),
        (Running, ReapRetry, Retrying),
        (Running, ReapDead, Dead),
        (Pending, Cancel, Cancelled),
        (Retrying, Cancel, Cancelled),
        (Blocked, Cancel, Cancelled),
        (Running, CancelRunning, Cancelled),
        (Dead, ManualRetry, Pending),
        (Blocked, Unblock, Pending),
        (Dead, RetryBehind, Blocked),
        (Cancelled, Restore, Blocked),
        (Succeeded, Redo, Pending),
        (Succeeded, RedoBehind, Blocked),
    ]
};

/// The status a transition leads to from `from`, or `None` if it is illegal there.
pub fn apply(from: TaskStatus, transition: Transition) -> Option<TaskStatus> {
    TRANSITIONS
        .iter()
        .find(|(f, t, _)| *f == from && *t == transition)
        .map(|(_, _, to)| *to)
}

/// Whether some transition leads from `from` to `to`.
pub fn is_legal(from: TaskStatus, to: TaskStatus) -> bool {
    TRANSITIONS.iter().any(|(f, _, t)| *f == from && *t == to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for status in TaskStatus::ALL {
            assert_eq!(status.as_str().parse::<TaskStatus>(), Ok(status));
        }
        assert!("finished".parse::<TaskStatus>().is_err());
    }

    #[test]
    fn finished_states_are_left_only_by_an_operators_retry() {
        use Transition::*;
        for (from, transition, _) in TRANSITIONS {
            if from.is_finished() {
                assert!(
                    matches!(
                        transition,
                        ManualRetry | RetryBehind | Restore | Redo | RedoBehind
                    ),
                    "{from} left by {transition:?}"
                );
            }
        }
        // Only the retried task itself leaves `dead`; the redrive moves the others.
        assert_eq!(
            apply(TaskStatus::Cancelled, Restore),
            Some(TaskStatus::Blocked)
        );
        assert_eq!(apply(TaskStatus::Cancelled, ManualRetry), None);
        assert_eq!(apply(TaskStatus::Succeeded, ManualRetry), None);
    }

    #[test]
    fn running_is_left_only_by_a_worker_outcome_or_the_reaper() {
        // A cancel does not move a running task; its worker does, once the handler
        // has stopped.
        assert_eq!(apply(TaskStatus::Running, Transition::Cancel), None);
        assert_eq!(
            apply(TaskStatus::Running, Transition::CancelRunning),
            Some(TaskStatus::Cancelled)
        );
        assert_eq!(apply(TaskStatus::Running, Transition::Claim), None);
        assert_eq!(
            apply(TaskStatus::Running, Transition::Complete),
            Some(TaskStatus::Succeeded)
        );
    }

    #[test]
    fn each_transition_is_deterministic() {
        for (i, (from, transition, _)) in TRANSITIONS.iter().enumerate() {
            for (other_from, other_transition, _) in &TRANSITIONS[i + 1..] {
                assert!((from, transition) != (other_from, other_transition));
            }
        }
    }
}
