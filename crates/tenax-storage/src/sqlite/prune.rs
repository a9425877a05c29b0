//! The pruner's side tables on SQLite (see the `prune` module for what goes and why it
//! cannot race a live task): the dependency and audit sweeps are written once in
//! `crate::shared::prune`. SQLite has no concurrency-key rows; each sweep is one
//! statement in a `BEGIN IMMEDIATE` transaction, so it sees and changes one state.
use super::{map_err, SqliteStorage};
use crate::error::Result;

// side_prune_impl, prune_deps, prune_audit.
crate::shared::prune::prune_statements!(
    crate::sqlite::SqliteStorage, sqlx::Sqlite, side_prune: side_prune_impl, subquery_limit
);

impl SqliteStorage {
    /// SQLite has no concurrency-key rows.
    async fn prune_keys(&self, _limit: i64) -> Result<u64> {
        Ok(0)
    }

    /// Workflows with no task left: one statement under the single writer.
    async fn prune_workflows(&self, limit: i64) -> Result<u64> {
        let mut tx = self.begin().await?;
        let done = sqlx::query(
            "DELETE FROM tenax_workflows WHERE id IN (
                 SELECT id FROM tenax_workflows w
                 WHERE NOT EXISTS (SELECT 1 FROM tenax_tasks t WHERE t.workflow_id = w.id)
                 ORDER BY id LIMIT ?1)",
        )
        .bind(limit)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(done.rows_affected())
    }
}
