//! The public insert-inside-your-transaction API of every backend.

/// `enqueue_in` and `enqueue_many_in` for the backend `$db`, over its
/// `insert(conn, tasks, now)` (the backend's bulk insert with no workflow). `$wake` is
/// the doc sentence that says how workers hear of the task.
macro_rules! enqueue_in_api {
    ($db:ty, $wake:literal, |$conn:ident, $tasks:ident, $now:ident| $insert:expr) => {
        #[doc = concat!(
            "Insert a task inside the caller's open transaction: the task exists if and only \
             if that transaction commits. Same rules as \
             [`Storage::task_insert`](crate::Storage::task_insert) (a conflicting `task_no` \
             is [`StorageError::TaskNoConflict`](crate::StorageError::TaskNoConflict)). ",
            $wake
        )]
        pub async fn enqueue_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            params: &$crate::params::TaskInsertParams,
        ) -> $crate::error::Result<$crate::params::TaskInserted> {
            $crate::common::validate_insert(params)?;
            let $conn = &mut **tx;
            let $tasks = std::slice::from_ref(params);
            let $now = params.now;
            let mut outcomes = $insert.await?;
            outcomes
                .pop()
                .ok_or_else(|| $crate::StorageError::NotFound(params.task_no.to_string()))?
                .into_inserted()
        }

        /// Insert many tasks inside the caller's open transaction, as
        /// [`Storage::task_insert_many`](crate::Storage::task_insert_many) does in its own.
        pub async fn enqueue_many_in(
            tx: &mut sqlx::Transaction<'_, $db>,
            params: &$crate::params::TaskInsertManyParams,
        ) -> $crate::error::Result<Vec<$crate::params::TaskInsertOutcome>> {
            $crate::common::validate_many(&params.tasks)?;
            let $conn = &mut **tx;
            let $tasks = &params.tasks[..];
            let $now = params.now;
            $insert.await
        }
    };
}
pub(crate) use enqueue_in_api;

/// `insert_committed` and `insert_checked` of the storage `$storage`, for a backend
/// whose inserts always run in a transaction of their own (SQLite's `BEGIN IMMEDIATE`,
/// MariaDB's): the backend's bulk insert with no workflow (`insert::insert_many(tx,
/// tasks, now, None)`), committed if `accept` takes the outcomes, then this process's
/// workers woken if a committed task is new. PostgreSQL writes its own: one task or one
/// chunk is a single statement there, with no transaction around it.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
macro_rules! insert_transactions {
    ($storage:ty) => {
        impl $storage {
            /// Insert tasks in one transaction, then wake this process's workers if any
            /// is new.
            async fn insert_committed(
                &self,
                tasks: &[$crate::params::TaskInsertParams],
                now: Option<chrono::DateTime<chrono::Utc>>,
            ) -> $crate::error::Result<Vec<$crate::params::TaskInsertOutcome>> {
                Ok(self.insert_checked(tasks, now, &|_| true).await?.outcomes)
            }

            /// Insert tasks in one transaction that commits only if `accept` takes the
            /// outcomes (else it is rolled back), then wake this process's workers if a
            /// committed task is new.
            async fn insert_checked(
                &self,
                tasks: &[$crate::params::TaskInsertParams],
                now: Option<chrono::DateTime<chrono::Utc>>,
                accept: &$crate::params::InsertAccept<'_>,
            ) -> $crate::error::Result<$crate::params::TaskInsertManyChecked> {
                let mut tx = self.begin().await?;
                let outcomes = insert::insert_many(&mut tx, tasks, now, None).await?;
                let checked = $crate::dialect::commit_if_accepted(tx, outcomes, accept).await?;
                if $crate::dialect::woke_by(&checked) {
                    self.wake();
                }
                Ok(checked)
            }
        }
    };
}
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) use insert_transactions;
