//! The pruner's side tables on SQLite (see the `prune` module for what goes and why it
//! cannot race a live task). SQLite has no concurrency-key rows; each sweep is one
//! statement in a `BEGIN IMMEDIATE` transaction, so it sees and changes one state.
use super::{clock, map_err, SqliteStorage};
use crate::common::duration_ms;
use crate::error::Result;
use crate::prune::{SidePruneParams, SidePruned};

impl SqliteStorage {
    pub(super) async fn side_prune_impl(&self, params: &SidePruneParams) -> Result<SidePruned> {
        if params.limit == 0 {
            return Ok(SidePruned::default());
        }
        let limit = i64::from(params.limit);
        let deps = self
            .sweep(
                "DELETE FROM tenax_task_deps WHERE child_id IN (
                     SELECT DISTINCT child_id FROM tenax_task_deps d
                     WHERE NOT EXISTS (SELECT 1 FROM tenax_tasks t WHERE t.id = d.child_id)
                     LIMIT ?1)",
                limit,
                None,
            )
            .await?;
        let workflows = self
            .sweep(
                "DELETE FROM tenax_workflows WHERE id IN (
                     SELECT id FROM tenax_workflows w
                     WHERE NOT EXISTS (SELECT 1 FROM tenax_tasks t WHERE t.workflow_id = w.id)
                     ORDER BY id LIMIT ?1)",
                limit,
                None,
            )
            .await?;
        let audit = self
            .sweep(
                "DELETE FROM tenax_audit WHERE id IN (
                     SELECT id FROM (SELECT id, at FROM tenax_audit ORDER BY id LIMIT ?1)
                     WHERE at < ?2)",
                limit,
                Some(params),
            )
            .await?;
        Ok(SidePruned {
            keys: 0,
            deps,
            workflows,
            audit,
        })
    }

    /// Run one sweep statement in its own transaction; `?2` is the audit cutoff when
    /// `audit` is given.
    async fn sweep(&self, sql: &str, limit: i64, audit: Option<&SidePruneParams>) -> Result<u64> {
        let mut tx = self.begin().await?;
        let mut query = sqlx::query(sql).bind(limit);
        if let Some(params) = audit {
            let now = clock(&mut tx, params.now).await?;
            query = query.bind(now.saturating_sub(duration_ms(params.audit_retention)));
        }
        let done = query.execute(&mut *tx).await.map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(done.rows_affected())
    }
}
