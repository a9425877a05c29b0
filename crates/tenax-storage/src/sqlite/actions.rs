//! Operator actions on one task, on SQLite: cancel (a waiting task at once, a running
//! one by request) and retry (a dead task, or a dead compensation), written once in
//! `crate::shared::actions`; and prune.
use super::{clock, fetch_ref, map_err, runtime, SqliteStorage};
use crate::common::{duration_ms, json_list};
use crate::error::Result;
use crate::params::TaskPruneParams;

// cancel_impl, retry_impl: the task read plainly, the write's condition deciding.
crate::shared::actions::action_statements!(
    crate::sqlite::SqliteStorage, sqlx::Sqlite,
    read(tx, task) = fetch_ref(&mut **tx, task), retry: retry_impl, cancel: cancel_impl,
    request_cancel(tx, id, now) = runtime::request_cancel(tx, id, now)
);

impl SqliteStorage {
    pub(super) async fn prune_impl(&self, params: &TaskPruneParams) -> Result<u64> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let ids: Vec<i64> = sqlx::query_scalar(
            "DELETE FROM tenax_tasks
             WHERE id IN (SELECT id FROM tenax_tasks
                          WHERE status IN ('succeeded', 'dead', 'cancelled')
                            AND finished_at < ?1
                            AND (compensation IS NULL OR compensation != 'pending')
                          ORDER BY finished_at LIMIT ?2)
             RETURNING id",
        )
        .bind(now.saturating_sub(duration_ms(params.retention)))
        .bind(i64::from(params.limit))
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        if !ids.is_empty() {
            sqlx::query(
                "DELETE FROM tenax_attempts WHERE task_id IN (SELECT value FROM json_each(?))",
            )
            .bind(json_list(&ids))
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(ids.len() as u64)
    }
}
