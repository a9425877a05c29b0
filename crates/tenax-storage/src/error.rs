//! Storage errors, normalised across backends.
use tenax_core::state::UnknownStatus;
use tenax_core::{InvalidInput, TaskStatus};

/// Why a storage call failed.
///
/// Backend error codes are mapped here, inside each backend; callers match on variants
/// (and [`StorageError::is_transient`]), never on SQLSTATE or SQLite codes. A lost lease
/// is not an error: the `*_if_leased` methods report it in their return value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The `task_no` exists with another command type or payload.
    #[error("task_no {task_no:?} already exists with a different {field}")]
    TaskNoConflict {
        /// The number at issue.
        task_no: String,
        /// `command type` or `payload`.
        field: &'static str,
    },
    /// No task matches.
    #[error("task {0} not found")]
    NotFound(String),
    /// The task is not in a status that allows the operation.
    #[error("task {task} is {status}: cannot {action}")]
    InvalidState {
        /// The task (id or number).
        task: String,
        /// Its current status.
        status: TaskStatus,
        /// What was attempted.
        action: &'static str,
    },
    /// Parameters the call cannot accept.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// The URL names no backend this build supports.
    #[error("unsupported database URL {0:?}: expected sqlite://PATH, postgres://... or mysql://... (with the matching feature)")]
    UnsupportedUrl(String),
    /// A transient failure worth retrying: busy or locked database, lost connection,
    /// pool timeout, deadlock or serialization failure.
    #[error("database temporarily unavailable: {0}")]
    Transient(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Any other database failure.
    #[error("database error: {0}")]
    Database(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A stored row does not decode (a bug or a foreign write).
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// Applying migrations failed.
    #[error("migration failed: {0}")]
    Migration(String),
}

impl StorageError {
    /// Whether the same call may succeed if repeated.
    pub fn is_transient(&self) -> bool {
        matches!(self, StorageError::Transient(_))
    }
}

impl From<UnknownStatus> for StorageError {
    fn from(value: UnknownStatus) -> Self {
        StorageError::Corrupt(value.to_string())
    }
}

/// Shorthand for storage results.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;
