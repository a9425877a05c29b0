//! MariaDB's errors: the server's error numbers, their mapping to [`StorageError`],
//! and a transaction run again when it lost a lock conflict.
use std::future::Future;

use sqlx::mysql::MySqlDatabaseError;

use crate::error::{Result, StorageError};
/// `ER_DUP_ENTRY`: a unique key already holds the value.
pub(super) const ER_DUP_ENTRY: u16 = 1062;
/// `ER_LOCK_WAIT_TIMEOUT`: a row lock was not granted within `innodb_lock_wait_timeout`.
pub(super) const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
/// `ER_LOCK_DEADLOCK`: InnoDB chose this transaction as a deadlock victim.
pub(super) const ER_LOCK_DEADLOCK: u16 = 1213;
/// `ER_AUTOINC_READ_FAILED`: an insert could not take its auto-increment value. InnoDB
/// reports a deadlock on the table's AUTO-INC lock this way; the event triggers'
/// `INSERT ... SELECT` into `tenax_events` take that lock while the sequencer's
/// locking read holds rows of the same table. Like a deadlock, the transaction was
/// rolled back and can simply run again.
pub(super) const ER_AUTOINC_READ_FAILED: u16 = 1467;
/// Server-side connection failures: too many connections (1040), server shutdown
/// (1053), connection killed (MariaDB 1927).
pub(super) const CONNECTION_ERRORS: [u16; 3] = [1040, 1053, 1927];
/// Errors of a server that is failing over or interrupting statements: read-only
/// (1290, 1836), query interrupted (1317), statement time exceeded (1969).
pub(super) const FAILOVER_ERRORS: [u16; 4] = [1290, 1317, 1836, 1969];

/// Map a sqlx error to the normalised kinds.
pub(crate) fn map_err(err: sqlx::Error) -> StorageError {
    let number = mysql_error_number(&err);
    match &err {
        sqlx::Error::Database(_) => match number {
            Some(ER_LOCK_DEADLOCK | ER_LOCK_WAIT_TIMEOUT | ER_AUTOINC_READ_FAILED) => {
                StorageError::Transient(Box::new(err))
            }
            Some(n) if CONNECTION_ERRORS.contains(&n) || FAILOVER_ERRORS.contains(&n) => {
                StorageError::Transient(Box::new(err))
            }
            _ => StorageError::Database(Box::new(err)),
        },
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => StorageError::Transient(Box::new(err)),
        _ => StorageError::Database(Box::new(err)),
    }
}

/// The server's error number, when the error is one the server sent.
pub(super) fn mysql_error_number(err: &sqlx::Error) -> Option<u16> {
    err.as_database_error()
        .and_then(|db| db.try_downcast_ref::<MySqlDatabaseError>())
        .map(MySqlDatabaseError::number)
}

/// Whether a mapped error is a deadlock or a lock-wait timeout: the transaction lost a
/// lock conflict and can simply run again.
pub(super) fn is_lock_conflict(err: &StorageError) -> bool {
    let StorageError::Transient(source) = err else {
        return false;
    };
    source
        .downcast_ref::<sqlx::Error>()
        .and_then(mysql_error_number)
        .is_some_and(|n| {
            matches!(
                n,
                ER_LOCK_DEADLOCK | ER_LOCK_WAIT_TIMEOUT | ER_AUTOINC_READ_FAILED
            )
        })
}

/// Run a whole transaction, again when it lost a lock conflict: [`crate::dialect::retrying`]
/// for MariaDB.
pub(super) async fn retrying<T, F, Fut>(transaction: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    crate::dialect::retrying::<sqlx::MySql, T, F, Fut>(transaction).await
}
