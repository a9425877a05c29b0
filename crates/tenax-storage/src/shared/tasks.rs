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
