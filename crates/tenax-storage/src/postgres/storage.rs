//! The [`Storage`](crate::Storage) trait on PostgreSQL: each method forwards to the file of
//! this folder that holds its statements (`claim.rs`, `outcomes.rs`, `actions.rs`, ...),
//! or, for a workflow, to the logic written once in `crate::flow`.
#[allow(clippy::wildcard_imports)]
use super::*;

crate::shared::storage::storage_impl!(PgStorage, sqlx::Postgres, "postgres", {
    async fn migrate(&self) -> Result<()> {
        if let Some(schema) = &self.schema {
            // The name was validated in take_schema: [a-z0-9_] only.
            sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
                .execute(&self.pool)
                .await
                .map_err(map_err)?;
        }
        // sqlx takes an advisory lock: N nodes starting together migrate once.
        migrator()
            .run(&self.pool)
            .await
            .map_err(|e| StorageError::Migration(e.to_string()))
    }

    async fn now(&self) -> Result<DateTime<Utc>> {
        self.timed(async {
            sqlx::query_scalar("SELECT now()")
                .fetch_one(&self.pool)
                .await
                .map_err(map_err)
        })
        .await
    }

    fn finishes(&self) -> Option<crate::FinishReceiver> {
        self.listener.as_ref().map(|_| self.finished.subscribe())
    }

    async fn task_wait_begin(&self, id: TaskId) -> Result<Option<String>> {
        if self.listener.is_none() {
            return Ok(None);
        }
        self.timed(waits::begin(&self.pool, id)).await.map(Some)
    }

    async fn task_wait_end(&self, waiter: &str) -> Result<()> {
        self.timed(waits::end(&self.pool, waiter)).await
    }

    async fn task_list(&self, params: &TaskListParams) -> Result<Vec<TaskRecord>> {
        self.timed(async {
            let columns = crate::common::list_columns(TASK_COLUMNS, params.value_max_bytes);
            let rows = sqlx::query(&format!(
                "SELECT {columns} FROM tenax_tasks
                 WHERE ($1::text IS NULL OR status = $1)
                   AND ($2::text IS NULL OR command_type = $2)
                   AND ($3::text IS NULL OR queue = $3)
                   AND ($4::bigint IS NULL OR id < $4)
                   AND ($6::timestamptz IS NULL OR started_at < $6)
                   AND ($7::timestamptz IS NULL OR created_at >= $7)
                   AND ($8::timestamptz IS NULL OR created_at < $8)
                 ORDER BY id DESC
                 LIMIT $5"
            ))
            .bind(params.status.map(TaskStatus::as_str))
            .bind(params.command_type.as_deref())
            .bind(params.queue.as_deref())
            .bind(params.before_id.map(|id| id.0))
            .bind(i64::from(params.limit))
            .bind(params.started_before)
            .bind(params.created_after)
            .bind(params.created_before)
            .fetch_all(&self.pool)
            .await
            .map_err(map_err)?;
            rows.iter().map(task_from_row).collect()
        })
        .await
    }

    async fn lease_extend(&self, params: &LeaseExtendParams) -> Result<Vec<Lease>> {
        if params.leases.is_empty() {
            return Ok(Vec::new());
        }
        self.timed(runtime::lease_extend(&self.leases, params))
            .await
    }

    async fn task_list_finished(&self, params: &TaskListFinishedParams) -> Result<Vec<TaskRecord>> {
        self.timed(async {
            // The status list repeats the finished-task index's condition.
            // Only times and statuses are charted: payloads and results stay in the database.
            let columns = crate::common::list_columns(TASK_COLUMNS, Some(0));
            let rows = sqlx::query(&format!(
                "SELECT {columns} FROM tenax_tasks
                 WHERE status IN ('succeeded', 'dead', 'cancelled') AND status <> 'cancelled'
                   AND finished_at >= $1
                 ORDER BY finished_at DESC
                 LIMIT $2"
            ))
            .bind(params.since)
            .bind(i64::from(params.limit))
            .fetch_all(&self.pool)
            .await
            .map_err(map_err)?;
            rows.iter().map(task_from_row).collect()
        })
        .await
    }

    async fn task_cancel_requested(&self, params: &CancelRequestedParams) -> Result<Vec<Lease>> {
        self.timed(runtime::cancel_requested(&self.leases, params))
            .await
    }
});
