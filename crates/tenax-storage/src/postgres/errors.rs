//! PostgreSQL's error codes, and what each means to Tenax: retry (transient), refuse
//! the input, or report a database failure.
use crate::error::StorageError;

/// Map a sqlx error to the normalised kinds.
pub(crate) fn map_err(err: sqlx::Error) -> StorageError {
    match &err {
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            // 40001 serialization failure, 40P01 deadlock, 55P03 lock not available,
            // 57014 statement timeout, 57P0x shutdown / cannot connect now, 08xxx
            // connection exceptions, 53xxx insufficient resources.
            // 25006 read-only transaction (a failover in progress).
            let transient = matches!(
                code.as_str(),
                "40001" | "40P01" | "55P03" | "57014" | "25006"
            ) || code.starts_with("57P")
                || code.starts_with("08")
                || code.starts_with("53");
            if transient {
                StorageError::Transient(Box::new(err))
            } else if matches!(code.as_str(), "22021" | "22P05") {
                // A NUL character in text (22021), or `\u0000` in JSON (22P05):
                // PostgreSQL stores neither, so the value is invalid input, not a
                // database failure.
                StorageError::Invalid(tenax_core::InvalidInput::new(
                    "text",
                    "must not contain a NUL character (\\u0000)",
                ))
            } else {
                StorageError::Database(Box::new(err))
            }
        }
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => StorageError::Transient(Box::new(err)),
        _ => StorageError::Database(Box::new(err)),
    }
}
