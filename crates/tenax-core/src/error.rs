//! The error a command returns, and the retry decision it carries.
use std::time::Duration;

/// What went wrong in a command, and whether it is worth trying again.
///
/// The variant is the retry decision (as the brief puts it: a business error fails at
/// once, a system error is retried):
///
/// - [`CommandError::Retryable`]: a system error (timeout, 5xx, connection refused).
///   The task is retried with the command's backoff until its attempts run out.
/// - [`CommandError::Permanent`]: a business error (invalid account, insufficient
///   funds). The task is dead at once and its compensation runs.
/// - [`CommandError::RetryAfter`]: retry, but not before the given delay (for example
///   a downstream `Retry-After`). The delay replaces the backoff for this attempt and
///   is clamped to the policy's `max_retry_after`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// A transient failure: retry with backoff.
    #[error("{0}")]
    Retryable(String),
    /// A failure that will not go away: the task is dead at once.
    #[error("{0}")]
    Permanent(String),
    /// A transient failure with a known earliest retry time.
    #[error("{message} (retry after {after:?})")]
    RetryAfter {
        /// What went wrong.
        message: String,
        /// How long to wait before the next attempt.
        after: Duration,
    },
    /// Returned by the default [`Command::compensate`](crate::Command::compensate):
    /// the command defines no compensation. Not meant to be returned by user code.
    #[doc(hidden)]
    #[error("the command defines no compensation")]
    NoCompensation,
}

impl CommandError {
    /// A transient failure, retried with backoff.
    pub fn retryable(message: impl std::fmt::Display) -> Self {
        Self::Retryable(message.to_string())
    }

    /// A business failure: the task is dead at once.
    pub fn permanent(message: impl std::fmt::Display) -> Self {
        Self::Permanent(message.to_string())
    }

    /// A transient failure to retry no sooner than `after`.
    pub fn retry_after(after: Duration, message: impl std::fmt::Display) -> Self {
        Self::RetryAfter {
            message: message.to_string(),
            after,
        }
    }

    /// Whether another attempt may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Retryable(_) | Self::RetryAfter { .. })
    }
}

/// Turns any error into a [`CommandError`] at the call site:
///
/// ```
/// use tenax_core::{CommandError, ResultExt};
///
/// fn parse_amount(s: &str) -> Result<u64, CommandError> {
///     // A malformed amount will not parse on the next attempt either.
///     s.parse::<u64>().permanent()
/// }
/// assert!(matches!(parse_amount("x"), Err(CommandError::Permanent(_))));
/// assert_eq!(parse_amount("42"), Ok(42));
/// ```
pub trait ResultExt<T> {
    /// Map the error to [`CommandError::Retryable`].
    fn retryable(self) -> Result<T, CommandError>;
    /// Map the error to [`CommandError::Permanent`].
    fn permanent(self) -> Result<T, CommandError>;
}

impl<T, E: std::fmt::Display> ResultExt<T> for Result<T, E> {
    fn retryable(self) -> Result<T, CommandError> {
        self.map_err(CommandError::retryable)
    }

    fn permanent(self) -> Result<T, CommandError> {
        self.map_err(CommandError::permanent)
    }
}
