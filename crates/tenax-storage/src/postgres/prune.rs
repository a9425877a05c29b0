//! The pruner's side tables on PostgreSQL (see the `prune` module for what goes and why
//! it cannot race a live task). Each sweep is its own transaction; the workflow and key
//! sweeps lock their rows (`SKIP LOCKED`) before a second statement, whose READ
//! COMMITTED snapshot starts after the lock, checks again that no task needs them.
use super::{map_err, PgStorage, NOW};
use crate::common::duration_ms;
use crate::error::Result;
use crate::prune::{SidePruneParams, SidePruned, LIVE_SQL};

impl PgStorage {
    pub(super) async fn side_prune_impl(&self, params: &SidePruneParams) -> Result<SidePruned> {
        if params.limit == 0 {
            return Ok(SidePruned::default());
        }
        self.timed(async {
            let limit = i64::from(params.limit);
            Ok(SidePruned {
                deps: self.prune_deps(limit).await?,
                workflows: self.prune_workflows(limit).await?,
                keys: self.prune_keys(limit).await?,
                audit: self.prune_audit(params).await?,
            })
        })
        .await
    }

    /// Dependency rows of dependents that are gone: one statement, one snapshot.
    async fn prune_deps(&self, limit: i64) -> Result<u64> {
        let done = sqlx::query(
            "DELETE FROM tenax_task_deps WHERE child_id IN (
                 SELECT DISTINCT child_id FROM tenax_task_deps d
                 WHERE NOT EXISTS (SELECT 1 FROM tenax_tasks t WHERE t.id = d.child_id)
                 LIMIT $1)",
        )
        .bind(limit)
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected())
    }

    /// Workflows with no task left, locked, then checked again.
    async fn prune_workflows(&self, limit: i64) -> Result<u64> {
        let mut tx = self.begin().await?;
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM tenax_workflows w
             WHERE NOT EXISTS (SELECT 1 FROM tenax_tasks t WHERE t.workflow_id = w.id)
             ORDER BY id LIMIT $1
             FOR UPDATE SKIP LOCKED",
        )
        .bind(limit)
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        if ids.is_empty() {
            tx.rollback().await.map_err(map_err)?;
            return Ok(0);
        }
        let done = sqlx::query(
            "DELETE FROM tenax_workflows w WHERE id = ANY($1)
               AND NOT EXISTS (SELECT 1 FROM tenax_tasks t WHERE t.workflow_id = w.id)",
        )
        .bind(&ids)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(done.rows_affected())
    }

    /// Concurrency keys with no live task, locked (a claim holding one is skipped), then
    /// checked again after the lock.
    async fn prune_keys(&self, limit: i64) -> Result<u64> {
        let mut tx = self.begin().await?;
        let names: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT name FROM tenax_concurrency_keys k
             WHERE NOT EXISTS (SELECT 1 FROM tenax_tasks t
                               WHERE t.concurrency_key = k.name AND t.status IN {LIVE_SQL})
             ORDER BY name LIMIT $1
             FOR UPDATE SKIP LOCKED"
        ))
        .bind(limit)
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        if names.is_empty() {
            tx.rollback().await.map_err(map_err)?;
            return Ok(0);
        }
        let done = sqlx::query(&format!(
            "DELETE FROM tenax_concurrency_keys k WHERE name = ANY($1)
               AND NOT EXISTS (SELECT 1 FROM tenax_tasks t
                               WHERE t.concurrency_key = k.name AND t.status IN {LIVE_SQL})"
        ))
        .bind(&names)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(done.rows_affected())
    }

    /// Audit entries past the retention, among the oldest `limit`.
    async fn prune_audit(&self, params: &SidePruneParams) -> Result<u64> {
        let done = sqlx::query(&format!(
            "DELETE FROM tenax_audit WHERE id IN (
                 SELECT id FROM (SELECT id, at FROM tenax_audit ORDER BY id LIMIT $3) o
                 WHERE at < {NOW} - $2::float8 * interval '1 millisecond')"
        ))
        .bind(params.now)
        .bind(duration_ms(params.audit_retention) as f64)
        .bind(i64::from(params.limit))
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected())
    }
}
