//! The pruner's sweeps of the side tables (see `crate::prune` for what goes and why it
//! cannot race a live task) that differ between the backends only in spelling, written
//! once: [`prune_statements!`](crate::shared::prune::prune_statements) implements
//! `side_prune` for one backend, each sweep its own transaction run through
//! [`retrying`](crate::dialect::retrying) (again after a lock conflict on MariaDB, once
//! elsewhere), and with its flags the sweeps that backend writes the same way as
//! another:
//!
//! - `subquery_limit` (SQLite, PostgreSQL): the dependency and audit sweeps are one
//!   `DELETE ... WHERE x IN (SELECT ... LIMIT ?)` each, one statement and one snapshot.
//!   MariaDB takes no `LIMIT` in such a subquery: it reads the rows first and deletes
//!   them by list, in its `prune.rs`.
//! - `keys` (PostgreSQL, MariaDB, which have concurrency keys): the deletes that follow
//!   the locking of idle workflows and keys, check again, after the lock, that no task
//!   needs them, and end the sweep's transaction. How each locks them first stays in its `prune.rs` (PostgreSQL
//!   locks the candidates it selects, `SKIP LOCKED`; MariaDB selects them with a plain,
//!   lock-free read first and then locks them by list). SQLite's single writer sweeps
//!   workflows in one statement, and has no keys.
//!
//! The shared statements are equivalent to those each backend had by hand, not the
//! same text: PostgreSQL's dependency and audit sweeps run in a transaction (each is
//! still one statement) and its audit cutoff is the clock read with
//! [`Dialect::clock`](crate::dialect::Dialect::clock) minus the retention, bound,
//! instead of computed in the statement; its deletes of workflows and keys name them with
//! `IN (...)` lists instead of `= ANY` of an array (keys) and through
//! [`Dialect::push_ids`](crate::dialect::Dialect::push_ids) (workflows), and refer to
//! the deleted table by its name instead of an alias; SQLite's sweeps now run in the
//! order deps, workflows, audit each through `retrying` (which runs them once).

/// Implement `side_prune` as the method `side_prune` for the storage `$storage` on the
/// database `$db`, both given as full paths, from the methods `prune_deps`,
/// `prune_workflows`, `prune_keys` and `prune_audit`; the flags (see the module) write
/// some of those, and `delete_idle_workflows`, `delete_idle_keys` for the module.
macro_rules! prune_statements {
    ($storage:ty, $db:ty, side_prune: $side:ident $(, $flag:ident)* $(,)?) => {
        mod shared_prune {
            use $crate::error::Result;
            use $crate::prune::{SidePruneParams, SidePruned};

            type Db = $db;

            impl $storage {
                /// Each table swept in its own transaction, at most `limit` rows.
                pub(crate) async fn $side(&self, params: &SidePruneParams) -> Result<SidePruned> {
                    use $crate::dialect::retrying;

                    if params.limit == 0 {
                        return Ok(SidePruned::default());
                    }
                    let limit = i64::from(params.limit);
                    Ok(SidePruned {
                        deps: retrying::<Db, _, _, _>(|| self.prune_deps(limit)).await?,
                        workflows: retrying::<Db, _, _, _>(|| self.prune_workflows(limit)).await?,
                        keys: retrying::<Db, _, _, _>(|| self.prune_keys(limit)).await?,
                        audit: retrying::<Db, _, _, _>(|| self.prune_audit(params)).await?,
                    })
                }
            }
        }
        $($crate::shared::prune::prune_statements!(@$flag $storage, $db);)*
    };
    (@subquery_limit $storage:ty, $db:ty) => {
        mod shared_prune_sweeps {
            use $crate::dialect::{sql, Dialect as _};
            use $crate::error::Result;
            use $crate::prune::SidePruneParams;
            use $crate::shared::events::earlier;

            type Db = $db;

            impl $storage {
                /// Dependency rows of dependents that are gone: one statement, one
                /// snapshot.
                pub(super) async fn prune_deps(&self, limit: i64) -> Result<u64> {
                    let mut tx = self.begin().await?;
                    let sql = sql!(
                        Db,
                        "DELETE FROM tenax_task_deps WHERE child_id IN (
                             SELECT DISTINCT child_id FROM tenax_task_deps d
                             WHERE NOT EXISTS (SELECT 1 FROM tenax_tasks t WHERE t.id = d.child_id)
                             LIMIT ?)"
                    );
                    let done = sqlx::query(sql)
                        .bind(limit)
                        .execute(&mut *tx)
                        .await
                        .map_err(Db::map_err)?;
                    tx.commit().await.map_err(Db::map_err)?;
                    Ok(done.rows_affected())
                }

                /// Audit entries past the retention, among the oldest `limit`.
                pub(super) async fn prune_audit(&self, params: &SidePruneParams) -> Result<u64> {
                    let mut tx = self.begin().await?;
                    let now = Db::clock(&mut *tx, params.now).await?;
                    let sql = sql!(
                        Db,
                        "DELETE FROM tenax_audit WHERE id IN (
                             SELECT id FROM (SELECT id, at FROM tenax_audit ORDER BY id LIMIT ?) o
                             WHERE at < ?)"
                    );
                    let done = sqlx::query(sql)
                        .bind(i64::from(params.limit))
                        .bind(Db::bind_time(earlier(now, params.audit_retention)))
                        .execute(&mut *tx)
                        .await
                        .map_err(Db::map_err)?;
                    tx.commit().await.map_err(Db::map_err)?;
                    Ok(done.rows_affected())
                }
            }
        }
    };
    (@keys $storage:ty, $db:ty) => {
        use shared_prune_idle::{delete_idle_keys, delete_idle_workflows};

        mod shared_prune_idle {
            use sqlx::{QueryBuilder, Transaction};

            use $crate::dialect::Dialect as _;
            use $crate::error::Result;
            use $crate::prune::LIVE_SQL;

            type Db = $db;

            /// Delete the workflows `ids` (locked by `tx`) that still have no task, and
            /// commit; with none, roll back.
            pub(super) async fn delete_idle_workflows(
                mut tx: Transaction<'static, Db>,
                ids: &[i64],
            ) -> Result<u64> {
                if ids.is_empty() {
                    tx.rollback().await.map_err(Db::map_err)?;
                    return Ok(0);
                }
                let mut qb = QueryBuilder::<Db>::new("DELETE FROM tenax_workflows WHERE id ");
                Db::push_ids(&mut qb, ids);
                qb.push(
                    " AND NOT EXISTS (SELECT 1 FROM tenax_tasks t
                                      WHERE t.workflow_id = tenax_workflows.id)",
                );
                let done = qb.build().execute(&mut *tx).await.map_err(Db::map_err)?;
                tx.commit().await.map_err(Db::map_err)?;
                Ok(done.rows_affected())
            }

            /// Delete the concurrency keys `names` (locked by `tx`) that still have no
            /// live task, and commit; with none, roll back.
            pub(super) async fn delete_idle_keys(
                mut tx: Transaction<'static, Db>,
                names: &[String],
            ) -> Result<u64> {
                if names.is_empty() {
                    tx.rollback().await.map_err(Db::map_err)?;
                    return Ok(0);
                }
                let mut qb =
                    QueryBuilder::<Db>::new("DELETE FROM tenax_concurrency_keys WHERE name IN (");
                let mut list = qb.separated(", ");
                for name in names {
                    list.push_bind(name.as_str());
                }
                qb.push(format!(
                    ") AND NOT EXISTS (SELECT 1 FROM tenax_tasks t
                                       WHERE t.status IN {LIVE_SQL}
                                         AND t.concurrency_key = tenax_concurrency_keys.name)"
                ));
                let done = qb.build().execute(&mut *tx).await.map_err(Db::map_err)?;
                tx.commit().await.map_err(Db::map_err)?;
                Ok(done.rows_affected())
            }
        }
    };
}
pub(crate) use prune_statements;
