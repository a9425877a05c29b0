//! The pruner's side tables on PostgreSQL (see the `prune` module for what goes and why
//! it cannot race a live task); what it writes as another backend does is in
//! `crate::shared::prune`. Each sweep is its own transaction; the workflow and key
//! sweeps lock their rows (`SKIP LOCKED`) before a second statement, whose READ
//! COMMITTED snapshot starts after the lock, checks again that no task needs them.
use super::{map_err, PgStorage};
use crate::error::Result;
use crate::prune::{SidePruneParams, SidePruned, LIVE_SQL};

// side_prune_untimed, prune_deps, prune_audit, delete_idle_workflows, delete_idle_keys.
crate::shared::prune::prune_statements!(
    crate::postgres::PgStorage, sqlx::Postgres,
    side_prune: side_prune_untimed, subquery_limit, keys
);

impl PgStorage {
    pub(super) async fn side_prune_impl(&self, params: &SidePruneParams) -> Result<SidePruned> {
        self.timed(self.side_prune_untimed(params)).await
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
        delete_idle_workflows(tx, &ids).await
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
        delete_idle_keys(tx, &names).await
    }
}
