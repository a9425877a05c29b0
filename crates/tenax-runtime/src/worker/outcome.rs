//! The outcome decision: what an ended attempt writes, from how it ended, its attempt
//! budget and its command's retry policy. Pure: no I/O, no clock but the jitter's
//! random draw.
use std::time::Duration;

use tenax_core::{CommandError, CompensationState, RetryPolicy, Secrets, TaskKind, TaskRecord};
use tenax_storage::FailNext;

/// How an attempt ended, before its outcome is written.
pub(super) enum Ended {
    Returned(Result<Option<String>, CommandError>),
    Panicked(String),
    TimedOut(Duration),
    /// Lease lost or unprovable: nothing may be written.
    Fenced(&'static str),
    /// Shutdown grace over.
    Stopped,
}

pub(super) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

/// What an ended attempt writes.
#[derive(Debug, PartialEq)]
pub(super) enum Decision {
    /// Succeeded, with its result; for a compensation, what to record on its task.
    Complete(Option<String>, CompensationState),
    /// Failed: the error to store, and what comes next.
    Fail(String, FailNext),
    /// Lease lost or unprovable: nothing may be written.
    Drop(&'static str),
    /// Succeeded, and already written by the handler's own transaction
    /// ([`TaskContext::completion_committed`]).
    Committed,
}

impl Decision {
    /// The decision with the task's secret values masked out of what it writes: the
    /// result's secret fields, and every literal copy of a secret value in the result
    /// or the error (a handler that quotes its input, a program that echoes it).
    pub(super) fn masked(self, secrets: &Secrets, task: &TaskRecord) -> Self {
        if !secrets.covers(&task.command_type) {
            return self;
        }
        let masker = secrets.masker(&task.command_type, &task.payload);
        match self {
            Decision::Complete(result, compensation) => Decision::Complete(
                result.map(|r| masker.json_text(&r).into_owned()),
                compensation,
            ),
            Decision::Fail(error, next) => Decision::Fail(masker.text(&error).into_owned(), next),
            other @ (Decision::Drop(_) | Decision::Committed) => other,
        }
    }
}

/// What else an ended attempt's decision depends on.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Ending {
    /// A cancel of the task was requested while it ran.
    pub(super) cancel_requested: bool,
    /// The due backlog of the task's queue (for a load-aware policy).
    pub(super) backlog: u64,
}

/// Decide what an ended attempt writes. A transient failure (retryable error, panic,
/// timeout) is retried after the policy's delay while attempts remain, else the task
/// is dead; a permanent error kills it at once. After a cancel request, what would be
/// retried ends the task `cancelled` instead.
pub(super) fn decide(
    task: &TaskRecord,
    ended: Ended,
    policy: &RetryPolicy,
    how: Ending,
) -> Decision {
    let transient = |message: String, delay: Duration| {
        if how.cancel_requested {
            Decision::Fail(format!("cancelled: {message}"), FailNext::Cancelled)
        } else if task.attempt < task.max_attempts {
            Decision::Fail(message, FailNext::Retry(delay))
        } else {
            let message = format!(
                "{message} (attempt {} of {}: no attempts left)",
                task.attempt, task.max_attempts
            );
            Decision::Fail(message, FailNext::Dead)
        }
    };
    let backoff = || policy.delay_under_load(task.attempt, how.backlog, &mut rand::rng());
    match ended {
        Ended::Returned(Ok(result)) => Decision::Complete(result, CompensationState::Succeeded),
        Ended::Returned(Err(CommandError::NoCompensation)) if task.kind == TaskKind::Compensate => {
            Decision::Complete(None, CompensationState::None)
        }
        Ended::Returned(Err(e @ CommandError::RetryAfter { after, .. })) => {
            transient(e.to_string(), policy.clamp_retry_after(after))
        }
        Ended::Returned(Err(e)) if e.is_retryable() => transient(e.to_string(), backoff()),
        Ended::Returned(Err(e)) => Decision::Fail(e.to_string(), FailNext::Dead),
        Ended::Panicked(message) => transient(format!("handler panicked: {message}"), backoff()),
        Ended::TimedOut(after) => transient(format!("timed out after {after:?}"), backoff()),
        // Handed back: retried at once, and the interrupted attempt is refunded.
        Ended::Stopped => Decision::Fail(
            "worker shut down before the attempt finished".into(),
            FailNext::HandBack,
        ),
        Ended::Fenced(why) => Decision::Drop(why),
    }
}

#[cfg(test)]
mod tests {
    use tenax_core::TaskId;

    use super::*;

    fn task(attempt: u32, max_attempts: u32, kind: TaskKind) -> TaskRecord {
        let now = chrono::Utc::now();
        TaskRecord {
            id: TaskId(1),
            task_no: tenax_core::TaskNo::from_stored("T".into()),
            kind,
            parent_id: None,
            command_type: "X".into(),
            payload: "{}".into(),
            payload_version: 1,
            queue: "default".into(),
            priority: tenax_core::Priority::DEFAULT,
            status: tenax_core::TaskStatus::Running,
            attempt,
            max_attempts,
            lease_epoch: attempt.into(),
            lease_owner: Some("w".into()),
            lease_expires_at: Some(now),
            run_at: now,
            timeout_ms: 1000,
            last_error: None,
            result: None,
            compensation: None,
            created_at: now,
            updated_at: now,
            started_at: Some(now),
            finished_at: None,
            concurrency_key: None,
            concurrency_limit: 1,
            created_by: None,
        }
    }

    #[test]
    fn transient_failures_retry_until_the_budget_is_spent() {
        let policy = RetryPolicy::default().with_jitter(tenax_core::Jitter::None);
        let panicked = || Ended::Panicked("boom".into());
        assert_eq!(
            decide(
                &task(2, 3, TaskKind::Execute),
                panicked(),
                &policy,
                Ending::default()
            ),
            Decision::Fail(
                "handler panicked: boom".into(),
                FailNext::Retry(Duration::from_secs(10))
            )
        );
        assert_eq!(
            decide(
                &task(3, 3, TaskKind::Execute),
                panicked(),
                &policy,
                Ending::default()
            ),
            Decision::Fail(
                "handler panicked: boom (attempt 3 of 3: no attempts left)".into(),
                FailNext::Dead
            )
        );
        let later = Ended::Returned(Err(CommandError::retry_after(
            Duration::from_secs(7),
            "busy",
        )));
        assert!(matches!(
            decide(&task(1, 3, TaskKind::Execute), later, &policy, Ending::default()),
            Decision::Fail(_, FailNext::Retry(d)) if d == Duration::from_secs(7)
        ));
    }

    #[test]
    fn a_load_aware_policy_stretches_retries_with_the_backlog() {
        let policy =
            RetryPolicy::fixed(Duration::from_secs(10)).with_load(tenax_core::LoadAware::new(100));
        let t = task(1, 5, TaskKind::Execute);
        let after = |backlog| {
            let how = Ending {
                cancel_requested: false,
                backlog,
            };
            match decide(&t, Ended::Panicked("boom".into()), &policy, how) {
                Decision::Fail(_, FailNext::Retry(delay)) => delay,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(after(0), Duration::from_secs(20));
        assert_eq!(after(100), Duration::from_secs(40));
        assert_eq!(after(10_000), Duration::from_secs(100));
    }

    #[test]
    fn permanent_errors_shutdown_and_lost_leases() {
        let policy = RetryPolicy::default();
        let t = task(1, 5, TaskKind::Execute);
        let permanent = Ended::Returned(Err(CommandError::permanent("invalid id card")));
        assert_eq!(
            decide(&t, permanent, &policy, Ending::default()),
            Decision::Fail("invalid id card".into(), FailNext::Dead)
        );
        assert!(matches!(
            decide(&t, Ended::Stopped, &policy, Ending::default()),
            Decision::Fail(_, FailNext::HandBack)
        ));
        assert_eq!(
            decide(&t, Ended::Fenced("lease lost"), &policy, Ending::default()),
            Decision::Drop("lease lost")
        );
        let cancelled = Ending {
            cancel_requested: true,
            backlog: 0,
        };
        let retryable = || Ended::Returned(Err(CommandError::retryable("stopping")));
        assert_eq!(
            decide(&t, retryable(), &policy, cancelled),
            Decision::Fail("cancelled: stopping".into(), FailNext::Cancelled)
        );
        assert!(matches!(
            decide(
                &t,
                Ended::TimedOut(Duration::from_secs(1)),
                &policy,
                cancelled
            ),
            Decision::Fail(_, FailNext::Cancelled)
        ));
        assert!(matches!(
            decide(&t, Ended::Returned(Ok(None)), &policy, cancelled),
            Decision::Complete(None, CompensationState::Succeeded)
        ));
        assert!(matches!(
            decide(
                &t,
                Ended::Returned(Err(CommandError::permanent("no"))),
                &policy,
                cancelled
            ),
            Decision::Fail(_, FailNext::Dead)
        ));
        let none = Ended::Returned(Err(CommandError::NoCompensation));
        assert_eq!(
            decide(
                &task(1, 5, TaskKind::Compensate),
                none,
                &policy,
                Ending::default()
            ),
            Decision::Complete(None, CompensationState::None)
        );
    }
}
