//! Operator actions on one task, on PostgreSQL: cancel (a waiting task at once, a
//! running one by request) and retry (a dead task, or a dead compensation), written
//! once in `crate::shared::actions`; and prune. Each within the call timeout.
use tenax_core::TaskRecord;

use super::{fetch_ref, map_err, runtime, PgStorage, NOW};
use crate::common::duration_ms;
use crate::error::Result;
use crate::params::{TaskActionParams, TaskPruneParams};

// cancel_untimed, retry_untimed: the task read plainly, the write's condition deciding.
crate::shared::actions::action_statements!(
    crate::postgres::PgStorage, sqlx::Postgres, read(tx, task) = fetch_ref(&mut **tx, task),
    retry: retry_untimed, cancel: cancel_untimed,
    request_cancel(tx, id, now) = runtime::request_cancel(tx, Some(now), id)
);

impl PgStorage {
    pub(super) async fn cancel_impl(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        self.timed(self.cancel_untimed(params)).await
    }

    pub(super) async fn retry_impl(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        self.timed(self.retry_untimed(params)).await
    }

    pub(super) async fn prune_impl(&self, params: &TaskPruneParams) -> Result<u64> {
        self.timed(async {
            let deleted: i64 = sqlx::query_scalar(&format!(
                "WITH gone AS (
                     DELETE FROM tenax_tasks
                     WHERE id IN (SELECT id FROM tenax_tasks
                                  WHERE status IN ('succeeded', 'dead', 'cancelled')
                                    AND finished_at < {NOW} - $2::float8 * interval '1 millisecond'
                                    AND (compensation IS NULL OR compensation != 'pending')
                                  ORDER BY finished_at LIMIT $3
                                  FOR UPDATE SKIP LOCKED)
                     RETURNING id
                 ), history AS (
                     DELETE FROM tenax_attempts WHERE task_id IN (SELECT id FROM gone)
                 )
                 SELECT COUNT(*) FROM gone"
            ))
            .bind(params.now)
            .bind(duration_ms(params.retention) as f64)
            .bind(i64::from(params.limit))
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)?;
            Ok(u64::try_from(deleted).unwrap_or(0))
        })
        .await
    }
}
