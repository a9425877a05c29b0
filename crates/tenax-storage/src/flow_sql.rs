//! The statements of [`crate::flow`] that differ between the backends only in spelling,
//! written once: [`workflow_statements!`](crate::flow_sql::workflow_statements)
//! implements [`WorkflowTx`](crate::flow::WorkflowTx) and
//! [`WorkflowReads`](crate::flow::WorkflowReads) for one backend's connection, with
//! what the backend spells its own way taken from its [`Dialect`](crate::dialect::Dialect).
//!
//! A macro rather than generic functions: each expansion is checked against one
//! backend's concrete types, so none of the statements needs sqlx's bounds for "any
//! database" (every bound and decoded type, every executor). The statements are
//! equivalent to those each backend had by hand, not the same text: PostgreSQL's
//! `workflow_rows` binds `before_id` twice (`? IS NULL OR id < ?`) instead of reusing
//! `$1`; PostgreSQL's times are bound as they are instead of through
//! `COALESCE($1::timestamptz, now())` (the time passed down is already the override or
//! the transaction's clock); PostgreSQL's `task` selects by `id = $1` instead of its
//! id-or-number lookup; SQLite's `lock_workflow_of` finds the workflow by a subquery
//! instead of a join; and a compensation's priority is bound as `i16` on SQLite and
//! MariaDB too.

/// Implement the shared workflow statements for the connection `$conn` of the database
/// `$db` (a [`Dialect`](crate::dialect::Dialect)), both given as full paths, with the
/// helpers the backend's storage calls (`task_workflow`, `parent_results`) and its
/// public `enqueue_workflow_in`. The backend implements
/// [`WorkflowOwnTx`](crate::flow::WorkflowOwnTx) itself.
macro_rules! workflow_statements {
    ($conn:ty, $db:ty) => {
        pub use shared::enqueue_workflow_in;
        pub(super) use shared::{parent_results, task_workflow};

        mod shared {
            use chrono::{DateTime, Utc};
            use sqlx::{Row as _, Transaction};
            use tenax_core::{CompensationState, TaskId, TaskNo, TaskRecord};

            use $crate::dialect::{returning_task, sql, Dialect as _, TASK_COLUMNS};
            use $crate::error::{Result, StorageError};
            use $crate::flow::{WorkflowOf, WorkflowReads, WorkflowTx};
            use $crate::workflows::{
                ParentOutcome, StatusCount, WorkflowDetail, WorkflowId, WorkflowInsertParams,
                WorkflowListParams, WorkflowRow, WorkflowState,
            };

            type Db = $db;
            type DbRow = <$db as sqlx::Database>::Row;
            type DbQuery<'q> =
                sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>>;

            const WORKFLOW_COLUMNS: &str = "id, name, kind, policy, state, created_at, finished_at";

            /// The shared statements of [`crate::flow`] on this backend.
            impl WorkflowTx for $conn {
                async fn workflow_of(&mut self, task: TaskId) -> Result<Option<WorkflowOf>> {
                    let sql = sql!(
                        Db,
                        "SELECT w.id, w.kind, w.policy, w.state FROM tenax_tasks t
                         JOIN tenax_workflows w ON w.id = t.workflow_id WHERE t.id = ?"
                    );
                    fetch_workflow_of(self, sql, task).await
                }

                async fn task(&mut self, id: TaskId) -> Result<Option<TaskRecord>> {
                    let sql = sql!(Db, "SELECT {TASK_COLUMNS} FROM tenax_tasks WHERE id = ?");
                    task_by_id(self, sql, id).await
                }

                async fn has_children(&mut self, task: TaskId) -> Result<bool> {
                    let sql = sql!(
                        Db,
                        "SELECT child_id FROM tenax_task_deps WHERE parent_id = ? LIMIT 1"
                    );
                    let child: Option<i64> = sqlx::query_scalar(sql)
                        .bind(task.0)
                        .fetch_optional(&mut *self)
                        .await
                        .map_err(Db::map_err)?;
                    Ok(child.is_some())
                }

                async fn previous_step(&mut self, step: TaskId) -> Result<Option<TaskId>> {
                    let sql = sql!(Db, "SELECT parent_id FROM tenax_task_deps WHERE child_id = ?");
                    let previous: Option<i64> = sqlx::query_scalar(sql)
                        .bind(step.0)
                        .fetch_optional(&mut *self)
                        .await
                        .map_err(Db::map_err)?;
                    Ok(previous.map(TaskId))
                }

                async fn set_workflow_state(
                    &mut self,
                    workflow: WorkflowId,
                    from: WorkflowState,
                    to: WorkflowState,
                    finished_at: Option<DateTime<Utc>>,
                    now: DateTime<Utc>,
                ) -> Result<()> {
                    let sql = sql!(
                        Db,
                        "UPDATE tenax_workflows SET state = ?, updated_at = ?, finished_at = ?
                         WHERE id = ? AND state = ?"
                    );
                    sqlx::query(sql)
                        .bind(to.as_str())
                        .bind(Db::bind_time(now))
                        .bind(finished_at.map(Db::bind_time))
                        .bind(workflow)
                        .bind(from.as_str())
                        .execute(&mut *self)
                        .await
                        .map_err(Db::map_err)?;
                    Ok(())
                }

                async fn mark_compensation_pending(
                    &mut self,
                    step: TaskId,
                    now: DateTime<Utc>,
                ) -> Result<Option<TaskRecord>> {
                    let sql = sql!(
                        Db,
                        "UPDATE tenax_tasks SET compensation = 'pending', updated_at = ?
                         WHERE id = ? AND status = 'succeeded' AND compensation IS NULL{}",
                        returning_task::<Db>()
                    );
                    let query = sqlx::query(sql).bind(Db::bind_time(now)).bind(step.0);
                    written_task(self, query, step).await
                }

                /// Also wakes the compensation's queue.
                async fn insert_compensation(
                    &mut self,
                    dead: &TaskRecord,
                    task_no: &str,
                    now: DateTime<Utc>,
                ) -> Result<()> {
                    let sql = sql!(
                        Db,
                        "INSERT INTO tenax_tasks (task_no, kind, parent_id, command_type, payload,
                             payload_version, queue, priority, status, max_attempts, run_at,
                             timeout_ms, last_error, created_at, updated_at, created_by)
                         VALUES (?, 'compensate', ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?)
                         {}",
                        Db::ON_TASK_NO_TAKEN
                    );
                    let now = Db::bind_time(now);
                    sqlx::query(sql)
                        .bind(task_no)
                        .bind(dead.id.0)
                        .bind(&dead.command_type)
                        .bind(&dead.payload)
                        .bind(Db::bind_count(dead.payload_version))
                        .bind(&dead.queue)
                        .bind(i16::from(dead.priority.get()))
                        .bind(Db::bind_count(dead.max_attempts))
                        .bind(now)
                        .bind(i64::try_from(dead.timeout_ms).unwrap_or(i64::MAX))
                        .bind(&dead.last_error)
                        .bind(now)
                        .bind(now)
                        .bind(&dead.created_by)
                        .execute(&mut *self)
                        .await
                        .map_err(Db::map_err)?;
                    Db::wake(self, &dead.queue).await
                }

                async fn lock_task(&mut self, id: TaskId) -> Result<Option<TaskRecord>> {
                    let sql = sql!(
                        Db,
                        "SELECT {TASK_COLUMNS} FROM tenax_tasks WHERE id = ?{}",
                        Db::FOR_UPDATE
                    );
                    task_by_id(self, sql, id).await
                }

                async fn lock_workflow_tasks(
                    &mut self,
                    id: WorkflowId,
                ) -> Result<Vec<(String, TaskRecord)>> {
                    let sql = sql!(
                        Db,
                        "SELECT {TASK_COLUMNS}, workflow_key FROM tenax_tasks
                         WHERE workflow_id = ? ORDER BY id{}",
                        Db::FOR_SHARE
                    );
                    tasks_of(self, sql, id).await
                }

                async fn lock_workflow_of(&mut self, task: TaskId) -> Result<Option<WorkflowOf>> {
                    let sql = sql!(
                        Db,
                        "SELECT id, kind, policy, state FROM tenax_workflows
                         WHERE id = (SELECT workflow_id FROM tenax_tasks WHERE id = ?){}",
                        Db::FOR_UPDATE
                    );
                    fetch_workflow_of(self, sql, task).await
                }

                /// Also wakes the task's queue when it is due.
                async fn rerun(
                    &mut self,
                    task: TaskId,
                    waiting: u32,
                    now: DateTime<Utc>,
                ) -> Result<Option<TaskRecord>> {
                    // MariaDB assigns left to right, each seeing the ones before: `last_error`
                    // reads the old status, so it comes first (the others see the old row
                    // in every assignment).
                    let sql = sql!(
                        Db,
                        "UPDATE tenax_tasks
                         SET last_error = CASE WHEN status = 'cancelled' THEN NULL
                                               ELSE last_error END,
                             status = CASE WHEN ? = 0 THEN 'pending' ELSE 'blocked' END,
                             waiting_parents = ?, attempt = 0, run_at = ?, finished_at = NULL,
                             compensation = NULL, result = NULL, updated_at = ?
                         WHERE id = ? AND status IN ('succeeded', 'dead', 'cancelled')
                           AND (compensation IS NULL OR compensation <> 'pending'){}",
                        returning_task::<Db>()
                    );
                    let now = Db::bind_time(now);
                    let query = sqlx::query(sql)
                        .bind(Db::bind_count(waiting))
                        .bind(Db::bind_count(waiting))
                        .bind(now)
                        .bind(now)
                        .bind(task.0);
                    let written = written_task(self, query, task).await?;
                    if let Some(written) = &written {
                        if waiting == 0 {
                            Db::wake(self, &written.queue).await?;
                        }
                    }
                    Ok(written)
                }

                async fn reopen_compensation(
                    &mut self,
                    task: TaskId,
                    epoch: Option<i64>,
                    now: DateTime<Utc>,
                ) -> Result<bool> {
                    let sql = sql!(
                        Db,
                        "UPDATE tenax_tasks SET compensation = 'pending', updated_at = ?
                         WHERE id = ? AND status = 'dead' AND compensation = 'failed'
                           AND lease_epoch = ?"
                    );
                    let reopened = sqlx::query(sql)
                        .bind(Db::bind_time(now))
                        .bind(task.0)
                        .bind(epoch)
                        .execute(&mut *self)
                        .await
                        .map_err(Db::map_err)?;
                    Ok(reopened.rows_affected() == 1)
                }

                async fn record_compensation(
                    &mut self,
                    task: TaskId,
                    state: CompensationState,
                    now: DateTime<Utc>,
                ) -> Result<()> {
                    let sql = sql!(
                        Db,
                        "UPDATE tenax_tasks SET compensation = ?, updated_at = ?
                         WHERE id = ? AND compensation = 'pending'"
                    );
                    sqlx::query(sql)
                        .bind(state.as_str())
                        .bind(Db::bind_time(now))
                        .bind(task.0)
                        .execute(&mut *self)
                        .await
                        .map_err(Db::map_err)?;
                    Ok(())
                }
            }

            /// The reads of [`crate::flow`] on this backend.
            impl WorkflowReads for $conn {
                async fn workflow_rows(
                    &mut self,
                    params: &WorkflowListParams,
                ) -> Result<Vec<WorkflowRow>> {
                    let sql = sql!(
                        Db,
                        "SELECT {WORKFLOW_COLUMNS} FROM tenax_workflows
                         WHERE (? IS NULL OR id < ?) ORDER BY id DESC LIMIT ?"
                    );
                    let rows = sqlx::query(sql)
                        .bind(params.before_id)
                        .bind(params.before_id)
                        .bind(i64::from(params.limit))
                        .fetch_all(&mut *self)
                        .await
                        .map_err(Db::map_err)?;
                    rows.iter().map(decode_workflow_row).collect()
                }

                async fn workflow_row(&mut self, id: WorkflowId) -> Result<Option<WorkflowRow>> {
                    let sql = sql!(
                        Db,
                        "SELECT {WORKFLOW_COLUMNS} FROM tenax_workflows WHERE id = ?"
                    );
                    let row = sqlx::query(sql)
                        .bind(id)
                        .fetch_optional(&mut *self)
                        .await
                        .map_err(Db::map_err)?;
                    row.as_ref().map(decode_workflow_row).transpose()
                }

                async fn workflow_tasks(
                    &mut self,
                    id: WorkflowId,
                ) -> Result<Vec<(String, TaskRecord)>> {
                    let sql = sql!(
                        Db,
                        "SELECT {TASK_COLUMNS}, workflow_key FROM tenax_tasks
                         WHERE workflow_id = ? ORDER BY id"
                    );
                    tasks_of(self, sql, id).await
                }

                async fn workflow_dependencies(
                    &mut self,
                    id: WorkflowId,
                ) -> Result<Vec<(i64, i64)>> {
                    let sql = sql!(
                        Db,
                        "SELECT d.child_id, d.parent_id FROM tenax_task_deps d
                         JOIN tenax_tasks t ON t.id = d.child_id WHERE t.workflow_id = ?"
                    );
                    sqlx::query_as(sql)
                        .bind(id)
                        .fetch_all(&mut *self)
                        .await
                        .map_err(Db::map_err)
                }

                async fn status_counts(
                    &mut self,
                    ids: &[WorkflowId],
                ) -> Result<Vec<(WorkflowId, StatusCount)>> {
                    let mut qb = sqlx::QueryBuilder::<Db>::new(format!(
                        "SELECT workflow_id, status, {COUNT_STAR} AS n, MAX(finished_at) AS last
                         FROM tenax_tasks WHERE workflow_id ",
                        COUNT_STAR = Db::COUNT_STAR
                    ));
                    Db::push_ids(&mut qb, ids);
                    qb.push(" GROUP BY workflow_id, status");
                    let rows = qb.build().fetch_all(&mut *self).await.map_err(Db::map_err)?;
                    rows.iter()
                        .map(|row| {
                            let n: i64 = row.try_get("n").map_err(Db::map_err)?;
                            Ok((
                                row.try_get("workflow_id").map_err(Db::map_err)?,
                                (
                                    Db::text(row, "status")?.parse()?,
                                    u64::try_from(n).unwrap_or(0),
                                    Db::read_opt_time(row, "last")?,
                                ),
                            ))
                        })
                        .collect()
                }
            }

            fn decode_workflow_row(row: &DbRow) -> Result<WorkflowRow> {
                Ok(WorkflowRow {
                    id: row.try_get("id").map_err(Db::map_err)?,
                    name: Db::text(row, "name")?,
                    kind: Db::text(row, "kind")?,
                    policy: Db::text(row, "policy")?,
                    state: Db::text(row, "state")?,
                    created_at: Db::read_time(row, "created_at")?,
                    finished_at: Db::read_opt_time(row, "finished_at")?,
                })
            }

            /// The workflow read by `sql` (`id, kind, policy, state`) for the task `task`.
            async fn fetch_workflow_of(
                conn: &mut $conn,
                sql: &str,
                task: TaskId,
            ) -> Result<Option<WorkflowOf>> {
                let row = sqlx::query(sql)
                    .bind(task.0)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(Db::map_err)?;
                let Some(row) = row else { return Ok(None) };
                WorkflowOf::parse(
                    row.try_get("id").map_err(Db::map_err)?,
                    &Db::text(&row, "kind")?,
                    &Db::text(&row, "policy")?,
                    &Db::text(&row, "state")?,
                )
                .map(Some)
            }

            /// The task `id`, read by `sql`.
            async fn task_by_id(
                conn: &mut $conn,
                sql: &str,
                id: TaskId,
            ) -> Result<Option<TaskRecord>> {
                let row = sqlx::query(sql)
                    .bind(id.0)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(Db::map_err)?;
                row.as_ref().map(Db::task_from_row).transpose()
            }

            /// A workflow's tasks with their keys, in id order, read by `sql`.
            async fn tasks_of(
                conn: &mut $conn,
                sql: &str,
                id: WorkflowId,
            ) -> Result<Vec<(String, TaskRecord)>> {
                let rows = sqlx::query(sql)
                    .bind(id)
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(Db::map_err)?;
                rows.iter()
                    .map(|r| {
                        let key = Db::opt_text(r, "workflow_key")?.unwrap_or_default();
                        Ok((key, Db::task_from_row(r)?))
                    })
                    .collect()
            }

            /// Run `update`, which writes the task `id` and ends with `returning_task()`: the
            /// task as written, `None` when the update matched nothing. Without
            /// `UPDATE ... RETURNING`, the row is read back in the same transaction, where
            /// it cannot have gone: missing, it is `NotFound`.
            async fn written_task(
                conn: &mut $conn,
                update: DbQuery<'_>,
                id: TaskId,
            ) -> Result<Option<TaskRecord>> {
                if Db::UPDATE_RETURNING {
                    debug_assert!(
                        sqlx::Execute::sql(&update).ends_with(&returning_task::<Db>()),
                        "an update read by `written_task` ends with `returning_task()`: {}",
                        sqlx::Execute::sql(&update)
                    );
                    let row = update.fetch_optional(&mut *conn).await.map_err(Db::map_err)?;
                    return row.as_ref().map(Db::task_from_row).transpose();
                }
                let written = update.execute(&mut *conn).await.map_err(Db::map_err)?;
                if written.rows_affected() != 1 {
                    return Ok(None);
                }
                let sql = sql!(Db, "SELECT {TASK_COLUMNS} FROM tenax_tasks WHERE id = ?");
                task_by_id(conn, sql, id)
                    .await?
                    .ok_or_else(|| StorageError::NotFound(id.to_string()))
                    .map(Some)
            }

            /// The workflow of a task, if it has one.
            pub(crate) async fn task_workflow(
                conn: &mut $conn,
                id: TaskId,
            ) -> Result<Option<WorkflowId>> {
                let sql = sql!(Db, "SELECT workflow_id FROM tenax_tasks WHERE id = ?");
                let row = sqlx::query(sql)
                    .bind(id.0)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(Db::map_err)?;
                match row {
                    Some(row) => row
                        .try_get::<Option<i64>, _>("workflow_id")
                        .map_err(Db::map_err),
                    None => Ok(None),
                }
            }

            /// The outcomes of the parents of the task `id`, in id order.
            pub(crate) async fn parent_results(
                conn: &mut $conn,
                id: TaskId,
            ) -> Result<Vec<ParentOutcome>> {
                let sql = sql!(
                    Db,
                    "SELECT p.workflow_key, p.task_no, p.status, p.result FROM tenax_task_deps d
                     JOIN tenax_tasks p ON p.id = d.parent_id WHERE d.child_id = ? ORDER BY p.id"
                );
                let rows = sqlx::query(sql)
                    .bind(id.0)
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(Db::map_err)?;
                rows.iter()
                    .map(|r| {
                        Ok(ParentOutcome {
                            key: Db::opt_text(r, "workflow_key")?.unwrap_or_default(),
                            task_no: TaskNo::from_stored(Db::text(r, "task_no")?),
                            status: Db::text(r, "status")?.parse()?,
                            result: Db::opt_text(r, "result")?,
                        })
                    })
                    .collect()
            }

            /// Insert a workflow inside the caller's open transaction: its tasks exist if and
            /// only if that transaction commits. Same checks as
            /// [`Storage::workflow_insert`](crate::Storage::workflow_insert).
            pub async fn enqueue_workflow_in(
                tx: &mut Transaction<'_, Db>,
                params: &WorkflowInsertParams,
            ) -> Result<WorkflowDetail> {
                $crate::flow::insert(&mut **tx, params).await
            }
        }
    };
}
pub(crate) use workflow_statements;

/// [`WorkflowOwnTx::insert_workflow`](crate::flow::WorkflowOwnTx::insert_workflow) of the
/// backend `$db`, inside its `impl WorkflowOwnTx`, for a backend with
/// `INSERT ... RETURNING` (SQLite, PostgreSQL; MySQL has none, so MariaDB writes its
/// own): the clock read on the transaction, then the insert, which answers the id and
/// the time as stored. PostgreSQL wrote `COALESCE($1, now())` in the insert instead of
/// reading the clock first: the same time, one round trip fewer.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
macro_rules! insert_workflow_returning {
    ($db:ty) => {
        async fn insert_workflow(
            &mut self,
            params: &$crate::workflows::WorkflowInsertParams,
            at: Option<chrono::DateTime<chrono::Utc>>,
        ) -> $crate::error::Result<($crate::workflows::WorkflowId, chrono::DateTime<chrono::Utc>)>
        {
            use sqlx::Row as _;
            use $crate::dialect::{sql, Dialect as _};
            let now = <$db>::bind_time(<$db>::clock(&mut *self, at).await?);
            let sql = sql!(
                $db,
                "INSERT INTO tenax_workflows (name, kind, policy, state, created_at, updated_at)
                 VALUES (?, ?, ?, 'running', ?, ?) RETURNING id, created_at"
            );
            let row = sqlx::query(sql)
                .bind(&params.name)
                .bind(params.kind.as_str())
                .bind(params.policy.as_str())
                .bind(now)
                .bind(now)
                .fetch_one(&mut *self)
                .await
                .map_err(<$db>::map_err)?;
            let id: i64 = row.try_get("id").map_err(<$db>::map_err)?;
            Ok((id, <$db>::read_time(&row, "created_at")?))
        }
    };
}
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use insert_workflow_returning;

/// [`WorkflowOwnTx::insert_workflow_tasks`](crate::flow::WorkflowOwnTx::insert_workflow_tasks)
/// of the backend `$db`, inside its `impl WorkflowOwnTx`: the backend's bulk insert
/// (`$insert`, over `$conn`, `$tasks`, `$now` and the workflow's `$rows`) with each
/// task's key and number of parents.
macro_rules! insert_workflow_tasks {
    ($db:ty, |$conn:ident, $tasks:ident, $now:ident, $rows:ident| $insert:expr) => {
        async fn insert_workflow_tasks(
            &mut self,
            workflow: $crate::workflows::WorkflowId,
            tasks: &[$crate::params::TaskInsertParams],
            keys: &[&str],
            waiting: &[usize],
            now: chrono::DateTime<chrono::Utc>,
        ) -> $crate::error::Result<Vec<$crate::params::TaskInsertOutcome>> {
            use $crate::dialect::Dialect as _;
            let rows = $crate::flow_sql::WorkflowRows {
                id: workflow,
                keys: keys.to_vec(),
                waiting: waiting
                    .iter()
                    .map(|n| <$db>::bind_count(u32::try_from(*n).unwrap_or(u32::MAX)))
                    .collect(),
            };
            let ($conn, $tasks, $now, $rows) = (self, tasks, Some(now), Some(&rows));
            $insert.await
        }
    };
}
pub(crate) use insert_workflow_tasks;

/// [`WorkflowOwnTx::insert_dependencies`](crate::flow::WorkflowOwnTx::insert_dependencies)
/// of the backend `$db`, inside its `impl WorkflowOwnTx`, as multi-row `VALUES` of
/// `$chunk` rows (PostgreSQL sends arrays instead).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
macro_rules! insert_dependencies_by_values {
    ($db:ty, $chunk:expr) => {
        async fn insert_dependencies(&mut self, deps: &[(i64, i64)]) -> $crate::error::Result<()> {
            use $crate::dialect::Dialect as _;
            for chunk in deps.chunks($chunk) {
                let mut qb = sqlx::QueryBuilder::<$db>::new(
                    "INSERT INTO tenax_task_deps (child_id, parent_id) ",
                );
                qb.push_values(chunk, |mut row, (child, parent)| {
                    row.push_bind(*child).push_bind(*parent);
                });
                qb.build()
                    .execute(&mut *self)
                    .await
                    .map_err(<$db>::map_err)?;
            }
            Ok(())
        }
    };
}
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) use insert_dependencies_by_values;

/// The workflow a bulk insert's tasks belong to: per task (in order) its key and its
/// number of parents, as the backend binds a count (`C`).
pub(crate) struct WorkflowRows<'a, C> {
    pub(crate) id: i64,
    pub(crate) keys: Vec<&'a str>,
    pub(crate) waiting: Vec<C>,
}
