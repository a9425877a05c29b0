//! The [`Storage`](crate::Storage) trait on MariaDB/MySQL: each method forwards to the file of
//! this folder that holds its statements (`claim.rs`, `outcomes.rs`, `actions.rs`, ...),
//! or, for a workflow, to the logic written once in `crate::flow`.
#[allow(clippy::wildcard_imports)]
use super::*;

crate::shared::storage::storage_impl!(MySqlStorage, sqlx::MySql, "mysql", {
    async fn migrate(&self) -> Result<()> {
        self.check_trigger_privilege().await?;
        // sqlx's MySQL migrator holds GET_LOCK while it migrates: nodes starting
        // together migrate once, the others wait and find the work done.
        migrator()
            .run(&self.pool)
            .await
            .map_err(|e| StorageError::Migration(e.to_string()))
    }

    async fn now(&self) -> Result<DateTime<Utc>> {
        sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)
    }

    async fn task_list(&self, params: &TaskListParams) -> Result<Vec<TaskRecord>> {
        let columns = crate::common::list_columns(TASK_COLUMNS, params.value_max_bytes);
        let mut qb = QueryBuilder::new(format!("SELECT {columns} FROM tenax_tasks WHERE TRUE"));
        if let Some(status) = params.status {
            qb.push(" AND status = ").push_bind(status.as_str());
        }
        if let Some(command_type) = &params.command_type {
            qb.push(" AND command_type = ")
                .push_bind(command_type.as_str());
        }
        if let Some(queue) = &params.queue {
            qb.push(" AND queue = ").push_bind(queue.as_str());
        }
        if let Some(before) = params.before_id {
            qb.push(" AND id < ").push_bind(before.0);
        }
        if let Some(started_before) = params.started_before {
            qb.push(" AND started_at < ")
                .push_bind(storable(started_before));
        }
        if let Some(created_after) = params.created_after {
            qb.push(" AND created_at >= ")
                .push_bind(storable(created_after));
        }
        if let Some(created_before) = params.created_before {
            qb.push(" AND created_at < ")
                .push_bind(storable(created_before));
        }
        qb.push(" ORDER BY id DESC LIMIT ")
            .push_bind(i64::from(params.limit));
        let rows = qb.build().fetch_all(&self.pool).await.map_err(map_err)?;
        rows.iter().map(task_from_row).collect()
    }

    async fn lease_extend(&self, params: &LeaseExtendParams) -> Result<Vec<Lease>> {
        if params.leases.is_empty() {
            return Ok(Vec::new());
        }
        retrying(|| self.lease_extend_once(params)).await
    }

    async fn task_cancel_requested(&self, params: &CancelRequestedParams) -> Result<Vec<Lease>> {
        runtime::cancel_requested(&self.leases, params).await
    }

    async fn task_list_finished(&self, params: &TaskListFinishedParams) -> Result<Vec<TaskRecord>> {
        // A range of the (status, finished_at) index per status.
        // Only times and statuses are charted: payloads and results stay in the database.
        let columns = crate::common::list_columns(TASK_COLUMNS, Some(0));
        let rows = sqlx::query(&format!(
            "SELECT {columns} FROM tenax_tasks
             WHERE status IN ('succeeded', 'dead') AND finished_at >= ?
             ORDER BY finished_at DESC
             LIMIT ?"
        ))
        .bind(storable(params.since))
        .bind(i64::from(params.limit))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(task_from_row).collect()
    }
});

/// The single attempts the shared forwarders call (and run again after a lost lock
/// conflict), under the names the other backends give them.
impl MySqlStorage {
    async fn complete_impl(&self, params: &TaskCompleteParams) -> Result<bool> {
        self.complete_once(params).await
    }

    async fn fail_impl(&self, params: &TaskFailParams) -> Result<bool> {
        self.fail_once(params, &truncate_error(&params.error)).await
    }

    async fn reap_impl(&self, params: &TaskReapParams) -> Result<Vec<ReapedTask>> {
        if params.limit == 0 {
            return Ok(Vec::new());
        }
        self.reap_once(params).await
    }

    async fn prune_impl(&self, params: &TaskPruneParams) -> Result<u64> {
        if params.limit == 0 {
            return Ok(0);
        }
        self.prune_once(params).await
    }
}
