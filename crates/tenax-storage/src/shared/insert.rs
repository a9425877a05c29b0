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
