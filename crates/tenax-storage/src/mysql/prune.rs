//! The pruner's side tables on MariaDB/MySQL (see the `prune` module for what goes and
//! why it cannot race a live task); what it writes as another backend does is in
//! `crate::shared::prune`. Each sweep is its own transaction, run again after a lock
//! conflict. Candidates are read first with a plain (consistent, lock-free) read; the
//! workflow and key rows are then locked (`SKIP LOCKED`) and the delete checks again,
//! after the lock, that no task needs them. The candidate reads take no locks on
//! `tenax_tasks`, so they never skip a task another transaction holds. MariaDB takes no
//! `LIMIT` in an `IN` subquery: the dependency and audit rows are read, then deleted by
//! list.
use sqlx::{MySql, QueryBuilder, Row, Transaction};

use super::{clock, map_err, minus, push_list, MySqlStorage};
use crate::error::Result;
use crate::prune::{SidePruneParams, LIVE_SQL};

// side_prune_impl, delete_idle_workflows, delete_idle_keys.
crate::shared::prune::prune_statements!(
    crate::mysql::MySqlStorage, sqlx::MySql,
    side_prune: side_prune_impl, keys
);

impl MySqlStorage {
    /// Dependency rows of dependents that are gone.
    async fn prune_deps(&self, limit: i64) -> Result<u64> {
        let mut tx = self.begin().await?;
        let children = ids(
            &mut tx,
            "SELECT DISTINCT d.child_id AS id FROM tenax_task_deps d
             WHERE NOT EXISTS (SELECT 1 FROM tenax_tasks t WHERE t.id = d.child_id)
             LIMIT ?",
            limit,
        )
        .await?;
        if children.is_empty() {
            tx.rollback().await.map_err(map_err)?;
            return Ok(0);
        }
        let mut qb = QueryBuilder::new("DELETE FROM tenax_task_deps WHERE child_id IN ");
        push_list(&mut qb, children.iter().copied());
        let done = qb.build().execute(&mut *tx).await.map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(done.rows_affected())
    }

    /// Workflows with no task left, locked, then checked again.
    async fn prune_workflows(&self, limit: i64) -> Result<u64> {
        let mut tx = self.begin().await?;
        let candidates = ids(
            &mut tx,
            "SELECT w.id AS id FROM tenax_workflows w
             WHERE NOT EXISTS (SELECT 1 FROM tenax_tasks t WHERE t.workflow_id = w.id)
             ORDER BY w.id LIMIT ?",
            limit,
        )
        .await?;
        if candidates.is_empty() {
            tx.rollback().await.map_err(map_err)?;
            return Ok(0);
        }
        let mut qb = QueryBuilder::new("SELECT id FROM tenax_workflows WHERE id IN ");
        push_list(&mut qb, candidates.iter().copied());
        qb.push(" ORDER BY id FOR UPDATE SKIP LOCKED");
        let locked = qb
            .build()
            .fetch_all(&mut *tx)
            .await
            .map_err(map_err)?
            .iter()
            .map(|row| row.try_get::<i64, _>("id").map_err(map_err))
            .collect::<Result<Vec<_>>>()?;
        delete_idle_workflows(tx, &locked).await
    }

    /// Concurrency keys with no live task, locked (a claim holding one is skipped), then
    /// checked again after the lock.
    async fn prune_keys(&self, limit: i64) -> Result<u64> {
        let mut tx = self.begin().await?;
        let candidates = names(
            &mut tx,
            sqlx::query(&format!(
                "SELECT k.name AS name FROM tenax_concurrency_keys k
                 WHERE NOT EXISTS (SELECT 1 FROM tenax_tasks t
                                   WHERE t.status IN {LIVE_SQL} AND t.concurrency_key = k.name)
                 ORDER BY k.name LIMIT ?"
            ))
            .bind(limit),
        )
        .await?;
        if candidates.is_empty() {
            tx.rollback().await.map_err(map_err)?;
            return Ok(0);
        }
        let mut qb = QueryBuilder::new("SELECT name FROM tenax_concurrency_keys WHERE name IN ");
        push_list(&mut qb, candidates.iter().map(String::as_str));
        qb.push(" ORDER BY name FOR UPDATE SKIP LOCKED");
        let rows = qb.build().fetch_all(&mut *tx).await.map_err(map_err)?;
        let locked = rows
            .iter()
            .map(|row| {
                let name: Vec<u8> = row.try_get("name").map_err(map_err)?;
                Ok(String::from_utf8_lossy(&name).into_owned())
            })
            .collect::<Result<Vec<_>>>()?;
        delete_idle_keys(tx, &locked).await
    }

    /// Audit entries past the retention, among the oldest `limit`.
    async fn prune_audit(&self, params: &SidePruneParams) -> Result<u64> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let old: Vec<i64> = sqlx::query_scalar(
            "SELECT o.id FROM (SELECT id, at FROM tenax_audit ORDER BY id LIMIT ?) o
             WHERE o.at < ?",
        )
        .bind(i64::from(params.limit))
        .bind(minus(now, params.audit_retention))
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        if old.is_empty() {
            tx.rollback().await.map_err(map_err)?;
            return Ok(0);
        }
        let mut qb = QueryBuilder::new("DELETE FROM tenax_audit WHERE id IN ");
        push_list(&mut qb, old.iter().copied());
        let done = qb.build().execute(&mut *tx).await.map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(done.rows_affected())
    }
}

/// The `id` column of a query bound to `limit`.
async fn ids(tx: &mut Transaction<'static, MySql>, sql: &str, limit: i64) -> Result<Vec<i64>> {
    sqlx::query_scalar(sql)
        .bind(limit)
        .fetch_all(&mut **tx)
        .await
        .map_err(map_err)
}

/// The `name` column (a key, stored as binary-collated text) of a query.
async fn names(
    tx: &mut Transaction<'static, MySql>,
    query: sqlx::query::Query<'_, MySql, sqlx::mysql::MySqlArguments>,
) -> Result<Vec<String>> {
    query
        .fetch_all(&mut **tx)
        .await
        .map_err(map_err)?
        .iter()
        .map(|row| {
            let name: Vec<u8> = row.try_get("name").map_err(map_err)?;
            Ok(String::from_utf8_lossy(&name).into_owned())
        })
        .collect()
}
