//! Reading one task by id or number.

/// `fetch_ref(executor, task)` and `fetch_ref_for_update(executor, task)` for the
/// backend `$db`: the task a [`TaskRef`](crate::params::TaskRef) names, if it exists,
/// the second locked until the transaction ends (`FOR UPDATE`; on SQLite the writer
/// lock holds every row already). PostgreSQL's lookup was one statement for both kinds
/// of reference (`($1 IS NOT NULL AND id = $1) OR ($2 IS NOT NULL AND task_no = $2)`);
/// it is now one statement for each, as on the other backends.
macro_rules! task_reads {
    ($db:ty) => {
        /// The task `task` names, if it exists.
        async fn fetch_ref(
            executor: impl sqlx::Executor<'_, Database = $db>,
            task: &$crate::params::TaskRef,
        ) -> $crate::error::Result<Option<tenax_core::TaskRecord>> {
            use $crate::dialect::{sql, TASK_COLUMNS};
            let by_id = sql!($db, "SELECT {TASK_COLUMNS} FROM tenax_tasks WHERE id = ?");
            let by_no = sql!(
                $db,
                "SELECT {TASK_COLUMNS} FROM tenax_tasks WHERE task_no = ?"
            );
            fetch_one_ref(executor, task, by_id, by_no).await
        }

        /// The task `task` names, if it exists, locked until the transaction ends.
        #[allow(dead_code)]
        async fn fetch_ref_for_update(
            executor: impl sqlx::Executor<'_, Database = $db>,
            task: &$crate::params::TaskRef,
        ) -> $crate::error::Result<Option<tenax_core::TaskRecord>> {
            use $crate::dialect::{sql, Dialect as _, TASK_COLUMNS};
            let by_id = sql!(
                $db,
                "SELECT {TASK_COLUMNS} FROM tenax_tasks WHERE id = ?{}",
                <$db>::FOR_UPDATE
            );
            let by_no = sql!(
                $db,
                "SELECT {TASK_COLUMNS} FROM tenax_tasks WHERE task_no = ?{}",
                <$db>::FOR_UPDATE
            );
            fetch_one_ref(executor, task, by_id, by_no).await
        }

        async fn fetch_one_ref(
            executor: impl sqlx::Executor<'_, Database = $db>,
            task: &$crate::params::TaskRef,
            by_id: &'static str,
            by_no: &'static str,
        ) -> $crate::error::Result<Option<tenax_core::TaskRecord>> {
            use $crate::dialect::Dialect as _;
            use $crate::params::TaskRef;
            let row = match task {
                TaskRef::Id(id) => sqlx::query(by_id).bind(id.0).fetch_optional(executor).await,
                TaskRef::No(no) => {
                    sqlx::query(by_no)
                        .bind(no.as_str())
                        .fetch_optional(executor)
                        .await
                }
            }
            .map_err(<$db>::map_err)?;
            row.as_ref().map(<$db>::task_from_row).transpose()
        }
    };
}
pub(crate) use task_reads;

/// `attempt_from_row(row)` for the backend `$db`: one entry of a task's attempt history,
/// read with the backend's [`Dialect`](crate::dialect::Dialect) (its `attempt` column
/// holds a [`Dialect::Count`](crate::dialect::Dialect::Count)).
macro_rules! attempt_reads {
    ($db:ty) => {
        /// One entry of a task's attempt history.
        pub(super) fn attempt_from_row(
            row: &<$db as sqlx::Database>::Row,
        ) -> $crate::error::Result<tenax_core::AttemptRecord> {
            use sqlx::Row as _;
            use $crate::dialect::Dialect as _;
            use $crate::error::StorageError;
            let outcome = <$db>::text(row, "outcome")?;
            let attempt: <$db as $crate::dialect::Dialect>::Count =
                row.try_get("attempt").map_err(<$db>::map_err)?;
            Ok(tenax_core::AttemptRecord {
                task_id: tenax_core::TaskId(row.try_get("task_id").map_err(<$db>::map_err)?),
                epoch: row.try_get("epoch").map_err(<$db>::map_err)?,
                attempt: u32::try_from(attempt)
                    .map_err(|_| StorageError::Corrupt(format!("attempt = {attempt}")))?,
                worker: <$db>::text(row, "worker")?,
                started_at: <$db>::read_time(row, "started_at")?,
                finished_at: <$db>::read_opt_time(row, "finished_at")?,
                outcome: tenax_core::AttemptOutcome::parse(&outcome)
                    .ok_or_else(|| StorageError::Corrupt(format!("outcome = {outcome:?}")))?,
                error: <$db>::opt_text(row, "error")?,
            })
        }
    };
}
pub(crate) use attempt_reads;
