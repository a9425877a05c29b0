//! The SQLite backend: the embedded default.
//!
//! - WAL journal with `synchronous=FULL` by default, so an acknowledged enqueue survives
//!   power loss. [`Synchronous::Normal`] is faster and may lose the last commits on
//!   power loss (never on a process crash); it is only used when chosen explicitly.
//! - Every write is one `BEGIN IMMEDIATE` transaction: SQLite takes the write lock at
//!   the start, so a transaction never has to upgrade a read snapshot (which fails with
//!   `SQLITE_BUSY_SNAPSHOT` and is not retried by the busy handler). A storage runs its
//!   write transactions on one connection of their own, so its writers queue in memory
//!   and in order; writers of other processes queue on the `busy_timeout`.
//! - Times are INTEGER milliseconds since the Unix epoch, UTC, taken from SQLite's clock
//!   (`unixepoch('subsec')`) inside the transaction that uses them.
//! - Wake-ups are in-process only: another process's enqueue is seen at the next poll.
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqliteSynchronous};
use sqlx::{Row, Sqlite, Transaction};
use tenax_core::{
    AttemptOutcome, AttemptRecord, InvalidInput, TaskId, TaskKind, TaskRecord, TaskStatus,
};
use tokio::sync::watch;

use crate::common::{
    compensated_epoch, duration_ms, json_list, offers_nothing, refusal, split_ref,
    stale_compensation, truncate_error, validate_insert,
};
use crate::error::{Result, StorageError};
use crate::flow::{self, FailPlan};
use crate::outbox::{
    OutboxClaimParams, OutboxListParams, OutboxPruneParams, OutboxRecord, OutboxSettleParams,
};
use crate::params::*;
use crate::workflows::{
    ParentOutcome, WorkflowDetail, WorkflowId, WorkflowInsertParams, WorkflowListParams,
    WorkflowRecord,
};
use crate::{Capabilities, Storage, WakeReceiver};

mod alert_state;
mod audit;
#[cfg(feature = "bench")]
pub mod bench;
mod bulk;
mod claim;
mod events;
mod insert;
mod keys;
mod outbox;
mod queue_stats;
mod queues;
mod rates;
mod rows;
mod runtime;
mod schedules;
mod transactional;
mod workflows;

pub use insert::{enqueue_in, enqueue_many_in};
use rows::{ms, task_from_row, TASK_COLUMNS};
pub use transactional::{Transactional, TransactionalCommand};
pub use workflows::enqueue_workflow_in;

const NOW_MS: &str = "SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)";
/// `tenax_core::PRIORITY_AGING_STEP` in ms, as written in the index
/// `tenax_tasks_claim_key` (the claim must name the same expression to use it).
const STEP_MS: i64 = 60_000;
const _: () = assert!(STEP_MS as u128 == tenax_core::PRIORITY_AGING_STEP.as_millis());

/// The migrations of this backend. A database that records migrations this binary
/// does not know (a newer node migrated it) is accepted: migrations are additive, so
/// nodes of the previous version keep running, restarting and rolling back during a
/// rolling deploy.
fn migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!("./migrations/sqlite");
    migrator.set_ignore_missing(true);
    migrator
}

/// SQLite's `synchronous` setting for the WAL journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Every commit is fsynced: an acknowledged write survives power loss. The default.
    #[default]
    Full,
    /// Commits are fsynced at checkpoints: faster, and the last commits may be lost on
    /// power loss (not on a process crash).
    Normal,
}

/// Options of the SQLite backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteConfig {
    /// Durability of commits. Defaults to [`Synchronous::Full`].
    pub synchronous: Synchronous,
    /// How long a writer waits for the write lock held by another process (or by a
    /// connection of [`SqliteStorage::pool`]). Defaults to 10 seconds. This storage's
    /// own write transactions queue for its writer connection first, for at most this
    /// long plus 5 seconds.
    pub busy_timeout: Duration,
    /// Pooled connections for reads and for callers of [`SqliteStorage::pool`].
    /// Defaults to 8. Write transactions take one more connection of their own.
    pub max_connections: u32,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        Self {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(10),
            max_connections: 8,
        }
    }
}

/// Tenax on a SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteStorage {
    pool: SqlitePool,
    /// One connection for this process's write transactions: its writers queue for it
    /// in memory, in order, instead of on SQLite's busy handler, which polls the lock
    /// with sleeps of 1 ms and more and leaves it idle between them.
    writer: SqlitePool,
    wake: watch::Sender<u64>,
}

impl SqliteStorage {
    /// Open (creating if missing) the file a `sqlite://PATH` URL names, with defaults.
    /// Does not migrate: call [`Storage::migrate`], or use [`crate::connect`].
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, &SqliteConfig::default()).await
    }

    /// Open with explicit options.
    pub async fn connect_with(url: &str, config: &SqliteConfig) -> Result<Self> {
        if url.contains(":memory:") || url.contains("mode=memory") {
            return Err(InvalidInput::new(
                "database URL",
                "an in-memory SQLite database is private to one connection; use a file",
            )
            .into());
        }
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| InvalidInput::new("database URL", e.to_string()))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match config.synchronous {
                Synchronous::Full => SqliteSynchronous::Full,
                Synchronous::Normal => SqliteSynchronous::Normal,
            })
            .busy_timeout(config.busy_timeout)
            .foreign_keys(true);
        let pool = crate::pool::options()
            .max_connections(config.max_connections.max(1))
            .acquire_timeout(config.busy_timeout + Duration::from_secs(5))
            .connect_with(options.clone())
            .await
            .map_err(map_err)?;
        let writer = crate::pool::options()
            .max_connections(1)
            .acquire_timeout(config.busy_timeout + Duration::from_secs(5))
            .connect_with(options)
            .await
            .map_err(map_err)?;
        let (wake, _) = watch::channel(0);
        Ok(Self { pool, writer, wake })
    }

    /// The connection pool, for callers that share the database (and for tests that
    /// check its settings).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn wake(&self) {
        self.wake.send_modify(|n| *n = n.wrapping_add(1));
    }

    async fn begin(&self) -> Result<Transaction<'static, Sqlite>> {
        self.writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map_err)
    }
}

/// The database clock, or the caller's override, in milliseconds.
async fn clock(tx: &mut Transaction<'static, Sqlite>, now: Option<DateTime<Utc>>) -> Result<i64> {
    match now {
        Some(now) => Ok(now.timestamp_millis()),
        None => sqlx::query_scalar(NOW_MS)
            .fetch_one(&mut **tx)
            .await
            .map_err(map_err),
    }
}

/// The database clock, or the caller's override, in milliseconds, outside a transaction.
async fn clock_now(pool: &SqlitePool, now: Option<DateTime<Utc>>) -> Result<i64> {
    match now {
        Some(now) => Ok(now.timestamp_millis()),
        None => sqlx::query_scalar(NOW_MS)
            .fetch_one(pool)
            .await
            .map_err(map_err),
    }
}

/// Map a sqlx error to the normalised kinds.
pub(crate) fn map_err(err: sqlx::Error) -> StorageError {
    match &err {
        sqlx::Error::Database(db) => {
            // Primary result codes: SQLITE_BUSY (5, incl. BUSY_SNAPSHOT 517),
            // SQLITE_LOCKED (6).
            let code = db
                .code()
                .and_then(|c| c.parse::<i64>().ok())
                .map(|c| c & 0xff);
            if matches!(code, Some(5 | 6)) {
                StorageError::Transient(Box::new(err))
            } else {
                StorageError::Database(Box::new(err))
            }
        }
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => {
            StorageError::Transient(Box::new(err))
        }
        _ => StorageError::Database(Box::new(err)),
    }
}

/// Complete one leased task inside `tx` at `now`, as
/// [`Storage::task_complete_if_leased`] does: `None` (and nothing written) when the
/// lease was lost, else whether tasks that depend on it became due.
async fn complete_in(
    tx: &mut Transaction<'static, Sqlite>,
    params: &TaskCompleteParams,
    now: i64,
) -> Result<Option<bool>> {
    let row = sqlx::query(&format!(
        "UPDATE tenax_tasks
         SET status = 'succeeded', result = ?1, finished_at = ?2, updated_at = ?2,
             lease_owner = NULL, lease_expires_at = NULL
         WHERE id = ?3 AND status = 'running' AND lease_epoch = ?4
         RETURNING {TASK_COLUMNS}"
    ))
    .bind(params.result.as_deref())
    .bind(now)
    .bind(params.lease.id.0)
    .bind(params.lease.epoch)
    .fetch_optional(&mut **tx)
    .await
    .map_err(map_err)?;
    let Some(row) = row else {
        return Ok(None);
    };
    let task = task_from_row(&row)?;
    close_attempt(tx, params.lease, AttemptOutcome::Succeeded, None, now).await?;
    let woke = flow::completed(&mut **tx, &task, params.compensation, ms(now)?).await?;
    Ok(Some(woke))
}

/// Complete, inside `tx`, the plain tasks among `items` (neither a workflow's task nor
/// a compensation) whose lease still holds, each at `at(item)`, and close their
/// attempts: two statements for the whole batch. Returns the leases that landed; the
/// other items are left untouched.
async fn complete_plain_in(
    tx: &mut Transaction<'static, Sqlite>,
    items: &[&TaskCompleteParams],
    at: impl Fn(&TaskCompleteParams) -> i64,
) -> Result<std::collections::HashSet<(i64, i64)>> {
    if items.is_empty() {
        return Ok(std::collections::HashSet::new());
    }
    // [[id, epoch, result, at], ...]: the result is JSON text, carried as a string.
    let batch = json_list(
        &items
            .iter()
            .map(|p| (p.lease.id.0, p.lease.epoch, p.result.as_deref(), at(p)))
            .collect::<Vec<_>>(),
    );
    let rows: Vec<(i64, i64, i64)> = sqlx::query_as(
        "UPDATE tenax_tasks
         SET status = 'succeeded', result = b.result, finished_at = b.at, updated_at = b.at,
             lease_owner = NULL, lease_expires_at = NULL
         FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS epoch,
                      json_extract(value, '$[2]') AS result, json_extract(value, '$[3]') AS at
               FROM json_each(?1)) AS b
         WHERE tenax_tasks.id = b.id AND tenax_tasks.lease_epoch = b.epoch
           AND tenax_tasks.status = 'running' AND tenax_tasks.kind = 'execute'
           AND tenax_tasks.workflow_id IS NULL
         RETURNING id, lease_epoch, finished_at",
    )
    .bind(&batch)
    .fetch_all(&mut **tx)
    .await
    .map_err(map_err)?;
    if !rows.is_empty() {
        sqlx::query(
            "UPDATE tenax_attempts
             SET finished_at = json_extract(d.value, '$[2]'), outcome = 'succeeded', error = NULL
             FROM json_each(?1) AS d
             WHERE tenax_attempts.task_id = json_extract(d.value, '$[0]')
               AND tenax_attempts.epoch = json_extract(d.value, '$[1]')
               AND tenax_attempts.outcome = 'running'",
        )
        .bind(json_list(&rows))
        .execute(&mut **tx)
        .await
        .map_err(map_err)?;
    }
    Ok(rows.into_iter().map(|(id, epoch, _)| (id, epoch)).collect())
}

async fn close_attempt(
    tx: &mut Transaction<'static, Sqlite>,
    lease: Lease,
    outcome: AttemptOutcome,
    error: Option<&str>,
    now: i64,
) -> Result<()> {
    sqlx::query(
        "UPDATE tenax_attempts SET finished_at = ?, outcome = ?, error = ?
         WHERE task_id = ? AND epoch = ? AND outcome = 'running'",
    )
    .bind(now)
    .bind(outcome.as_str())
    .bind(error)
    .bind(lease.id.0)
    .bind(lease.epoch)
    .execute(&mut **tx)
    .await
    .map_err(map_err)?;
    Ok(())
}

async fn fetch_ref(
    executor: impl sqlx::SqliteExecutor<'_>,
    task: &TaskRef,
) -> Result<Option<TaskRecord>> {
    let row = match task {
        TaskRef::Id(id) => {
            sqlx::query(&format!(
                "SELECT {TASK_COLUMNS} FROM tenax_tasks WHERE id = ?"
            ))
            .bind(id.0)
            .fetch_optional(executor)
            .await
        }
        TaskRef::No(no) => {
            sqlx::query(&format!(
                "SELECT {TASK_COLUMNS} FROM tenax_tasks WHERE task_no = ?"
            ))
            .bind(no.as_str())
            .fetch_optional(executor)
            .await
        }
    }
    .map_err(map_err)?;
    row.as_ref().map(task_from_row).transpose()
}

impl SqliteStorage {
    /// Insert tasks in one `BEGIN IMMEDIATE` transaction, then wake this process's
    /// workers if any task is new.
    async fn insert_committed(
        &self,
        tasks: &[TaskInsertParams],
        now: Option<DateTime<Utc>>,
    ) -> Result<Vec<TaskInsertOutcome>> {
        let mut tx = self.begin().await?;
        let outcomes = insert::insert_many(&mut tx, tasks, now, None).await?;
        tx.commit().await.map_err(map_err)?;
        if outcomes.iter().any(TaskInsertOutcome::created) {
            self.wake();
        }
        Ok(outcomes)
    }
}

#[async_trait]
impl Storage for SqliteStorage {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            cross_process_wakeups: false,
        }
    }

    async fn migrate(&self) -> Result<()> {
        // Two processes starting on a fresh file may race; the loser sees the winner's
        // migrations on its next try.
        let mut last = None;
        for _ in 0..5 {
            match migrator().run(&self.pool).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    last = Some(e);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        Err(StorageError::Migration(
            last.map(|e| e.to_string()).unwrap_or_default(),
        ))
    }

    async fn now(&self) -> Result<DateTime<Utc>> {
        let now: i64 = sqlx::query_scalar(NOW_MS)
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)?;
        ms(now)
    }

    fn wakeups(&self) -> WakeReceiver {
        self.wake.subscribe()
    }

    async fn task_insert(&self, params: &TaskInsertParams) -> Result<TaskInserted> {
        validate_insert(params)?;
        let mut outcomes = self
            .insert_committed(std::slice::from_ref(params), params.now)
            .await?;
        outcomes
            .pop()
            .ok_or_else(|| StorageError::NotFound(params.task_no.to_string()))?
            .into_inserted()
    }

    async fn task_get(&self, task: &TaskRef) -> Result<Option<TaskRecord>> {
        fetch_ref(&self.pool, task).await
    }

    async fn task_list(&self, params: &TaskListParams) -> Result<Vec<TaskRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {TASK_COLUMNS} FROM tenax_tasks
             WHERE (?1 IS NULL OR status = ?1)
               AND (?2 IS NULL OR command_type = ?2)
               AND (?3 IS NULL OR queue = ?3)
               AND (?4 IS NULL OR id < ?4)
               AND (?6 IS NULL OR started_at < ?6)
               AND (?7 IS NULL OR created_at >= ?7)
               AND (?8 IS NULL OR created_at < ?8)
             ORDER BY id DESC
             LIMIT ?5"
        ))
        .bind(params.status.map(TaskStatus::as_str))
        .bind(params.command_type.as_deref())
        .bind(params.queue.as_deref())
        .bind(params.before_id.map(|id| id.0))
        .bind(i64::from(params.limit))
        .bind(params.started_before.map(|t| t.timestamp_millis()))
        .bind(params.created_after.map(|t| t.timestamp_millis()))
        .bind(params.created_before.map(|t| t.timestamp_millis()))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(task_from_row).collect()
    }

    async fn task_attempts(&self, id: TaskId) -> Result<Vec<AttemptRecord>> {
        let rows = sqlx::query(
            "SELECT task_id, epoch, attempt, worker, started_at, finished_at, outcome, error
             FROM tenax_attempts WHERE task_id = ? ORDER BY epoch",
        )
        .bind(id.0)
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(rows::attempt_from_row).collect()
    }

    async fn task_claim_batch(&self, params: &TaskClaimParams) -> Result<Vec<TaskRecord>> {
        if offers_nothing(params) {
            return Ok(Vec::new());
        }
        crate::rates::claim(self, params).await
    }

    async fn lease_extend(&self, params: &LeaseExtendParams) -> Result<Vec<Lease>> {
        if params.leases.is_empty() {
            return Ok(Vec::new());
        }
        let pairs = json_list(
            &params
                .leases
                .iter()
                .map(|l| [l.id.0, l.epoch])
                .collect::<Vec<_>>(),
        );
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let renewed: Vec<(i64, i64)> = sqlx::query_as(
            "UPDATE tenax_tasks SET lease_expires_at = ?1 + ?2, updated_at = ?1
             WHERE status = 'running'
               AND (id, lease_epoch) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
                                         FROM json_each(?3))
             RETURNING id, lease_epoch",
        )
        .bind(now)
        .bind(duration_ms(params.lease_ttl))
        .bind(pairs)
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(renewed
            .into_iter()
            .map(|(id, epoch)| Lease {
                id: TaskId(id),
                epoch,
            })
            .collect())
    }

    async fn task_complete_if_leased(&self, params: &TaskCompleteParams) -> Result<bool> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let Some(woke) = complete_in(&mut tx, params, now).await? else {
            tx.rollback().await.map_err(map_err)?;
            return Ok(false);
        };
        tx.commit().await.map_err(map_err)?;
        if woke {
            self.wake();
        }
        Ok(true)
    }

    async fn task_fail_if_leased(&self, params: &TaskFailParams) -> Result<bool> {
        let error = truncate_error(&params.error);
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let plan = FailPlan::of(params.next);
        // The rule of `FailPlan::status`, in SQL: asked to die, else cancelled when asked
        // or requested, else dead out of attempts (counted after a hand-back's refund),
        // else retrying.
        let status = "CASE WHEN ?1 THEN 'dead'
                           WHEN ?8 OR cancel_requested_at IS NOT NULL THEN 'cancelled'
                           WHEN attempt - ?7 >= max_attempts THEN 'dead'
                           ELSE 'retrying' END";
        let row = sqlx::query(&format!(
            "UPDATE tenax_tasks
             SET status = {status},
                 attempt = attempt - ?7,
                 run_at = ?2, last_error = ?3, updated_at = ?4,
                 lease_owner = NULL, lease_expires_at = NULL,
                 finished_at = CASE WHEN {status} != 'retrying' THEN ?4 END,
                 compensation = CASE WHEN {status} = 'dead' AND kind = 'execute'
                                     THEN 'pending' ELSE compensation END
             WHERE id = ?5 AND status = 'running' AND lease_epoch = ?6
             RETURNING {TASK_COLUMNS}"
        ))
        .bind(plan.die)
        .bind(now.saturating_add(duration_ms(plan.delay)))
        .bind(&error)
        .bind(now)
        .bind(params.lease.id.0)
        .bind(params.lease.epoch)
        .bind(i64::from(plan.refund))
        .bind(plan.cancel)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        let Some(row) = row else {
            tx.rollback().await.map_err(map_err)?;
            return Ok(false);
        };
        let task = task_from_row(&row)?;
        let dead = task.status == TaskStatus::Dead;
        let outcome = if dead {
            AttemptOutcome::Dead
        } else {
            AttemptOutcome::Failed
        };
        close_attempt(&mut tx, params.lease, outcome, Some(&error), now).await?;
        flow::ended(&mut *tx, &task, ms(now)?).await?;
        tx.commit().await.map_err(map_err)?;
        self.wake();
        Ok(true)
    }

    async fn task_reap_expired(&self, params: &TaskReapParams) -> Result<Vec<ReapedTask>> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        // The expiry is checked again in the UPDATE's own WHERE: the reaper never acts
        // on a row it read earlier, so a completion that commits first always wins.
        let rows = sqlx::query(&format!(
            "UPDATE tenax_tasks
             SET status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled'
                               WHEN attempt >= max_attempts THEN 'dead' ELSE 'retrying' END,
                 run_at = ?1,
                 last_error = 'lease expired: worker ' || COALESCE(lease_owner, '?') || ' stopped renewing it',
                 finished_at = CASE WHEN cancel_requested_at IS NOT NULL OR attempt >= max_attempts
                                    THEN ?1 END,
                 compensation = CASE WHEN cancel_requested_at IS NULL AND attempt >= max_attempts
                                          AND kind = 'execute'
                                     THEN 'pending' ELSE compensation END,
                 lease_owner = NULL, lease_expires_at = NULL, updated_at = ?1
             WHERE id IN (SELECT id FROM tenax_tasks
                          WHERE status = 'running' AND lease_expires_at < ?1
                          ORDER BY lease_expires_at LIMIT ?2)
               AND status = 'running' AND lease_expires_at < ?1
             RETURNING {TASK_COLUMNS}"
        ))
        .bind(now)
        .bind(i64::from(params.limit))
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        let tasks = rows.iter().map(task_from_row).collect::<Result<Vec<_>>>()?;
        for task in &tasks {
            let lease = Lease {
                id: task.id,
                epoch: task.lease_epoch,
            };
            close_attempt(
                &mut tx,
                lease,
                AttemptOutcome::LeaseExpired,
                task.last_error.as_deref(),
                now,
            )
            .await?;
            flow::ended(&mut *tx, task, ms(now)?).await?;
        }
        tx.commit().await.map_err(map_err)?;
        if !tasks.is_empty() {
            self.wake();
        }
        Ok(tasks
            .into_iter()
            .map(|t| ReapedTask {
                id: t.id,
                status: t.status,
            })
            .collect())
    }

    async fn task_cancel(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let (by_id, by_no) = split_ref(&params.task);
        let row = sqlx::query(&format!(
            "UPDATE tenax_tasks SET status = 'cancelled', finished_at = ?1, updated_at = ?1
             WHERE (id = ?2 OR task_no = ?3) AND status IN ('pending', 'retrying', 'blocked')
               AND kind = 'execute'
             RETURNING {TASK_COLUMNS}"
        ))
        .bind(now)
        .bind(by_id)
        .bind(by_no)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        match row {
            Some(row) => {
                let task = task_from_row(&row)?;
                let woke = flow::after_finish(&mut *tx, &task, ms(now)?).await?;
                tx.commit().await.map_err(map_err)?;
                if woke {
                    self.wake();
                }
                Ok(task)
            }
            None => {
                let current = fetch_ref(&mut *tx, &params.task).await?;
                if let Some(task) = current
                    .as_ref()
                    .filter(|t| t.kind == TaskKind::Execute && t.status == TaskStatus::Running)
                {
                    if runtime::request_cancel(&mut tx, task.id, now).await? {
                        tx.commit().await.map_err(map_err)?;
                        return Ok(task.clone());
                    }
                }
                tx.rollback().await.map_err(map_err)?;
                if let Some(task) = current.as_ref().filter(|t| t.kind == TaskKind::Compensate) {
                    // The compensated task would wait for it forever.
                    return Err(StorageError::InvalidState {
                        task: params.task.to_string(),
                        status: task.status,
                        action: "cancel a compensation",
                    });
                }
                Err(refusal(&params.task, current, "cancel it"))
            }
        }
    }

    async fn task_retry(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let (by_id, by_no) = split_ref(&params.task);
        // A dead task whose compensation still runs is not retried: undoing and redoing
        // at the same time would race.
        let row = sqlx::query(&format!(
            "UPDATE tenax_tasks
             SET status = 'pending', attempt = 0, run_at = ?1, finished_at = NULL,
                 compensation = NULL, result = NULL, updated_at = ?1
             WHERE (id = ?2 OR task_no = ?3) AND status = 'dead'
               AND (compensation IS NULL OR compensation != 'pending')
             RETURNING {TASK_COLUMNS}"
        ))
        .bind(now)
        .bind(by_id)
        .bind(by_no)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        match row {
            Some(row) => {
                let task = task_from_row(&row)?;
                if let (TaskKind::Compensate, Some(parent)) = (task.kind, task.parent_id) {
                    // The compensation runs again: its parent waits for it again, but only
                    // if the parent is still the dead task it compensates (not retried
                    // since, which would make this compensation undo a newer run).
                    let reopened = sqlx::query(
                        "UPDATE tenax_tasks SET compensation = 'pending', updated_at = ?
                         WHERE id = ? AND status = 'dead' AND compensation = 'failed'
                           AND lease_epoch = ?",
                    )
                    .bind(now)
                    .bind(parent.0)
                    .bind(compensated_epoch(&task))
                    .execute(&mut *tx)
                    .await
                    .map_err(map_err)?;
                    if reopened.rows_affected() != 1 {
                        tx.rollback().await.map_err(map_err)?;
                        return Err(stale_compensation(&params.task));
                    }
                }
                tx.commit().await.map_err(map_err)?;
                self.wake();
                Ok(task)
            }
            None => {
                let current = fetch_ref(&mut *tx, &params.task).await?;
                tx.rollback().await.map_err(map_err)?;
                if let Some(task) = &current {
                    if task.status == TaskStatus::Dead {
                        return Err(StorageError::InvalidState {
                            task: params.task.to_string(),
                            status: task.status,
                            action: "retry it while its compensation runs",
                        });
                    }
                }
                Err(refusal(&params.task, current, "retry it"))
            }
        }
    }

    async fn task_prune(&self, params: &TaskPruneParams) -> Result<u64> {
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

    async fn stats(&self) -> Result<Stats> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        let by_type_rows = sqlx::query(
            "SELECT command_type, status, COUNT(*) AS n FROM tenax_tasks
             GROUP BY command_type, status ORDER BY command_type, status",
        )
        .fetch_all(&mut *conn)
        .await
        .map_err(map_err)?;
        let mut stats = Stats::default();
        for row in &by_type_rows {
            let command_type: String = row.try_get("command_type").map_err(map_err)?;
            let status: String = row.try_get("status").map_err(map_err)?;
            let status: TaskStatus = status.parse()?;
            let n: i64 = row.try_get("n").map_err(map_err)?;
            let n = u64::try_from(n).unwrap_or(0);
            stats.by_type.push((command_type, status, n));
            match stats.by_status.iter_mut().find(|(s, _)| *s == status) {
                Some((_, total)) => *total += n,
                None => stats.by_status.push((status, n)),
            }
        }
        stats.by_status.sort();
        let oldest: Option<i64> = sqlx::query_scalar(
            "SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) - MIN(run_at) FROM tenax_tasks
             WHERE status IN ('pending', 'retrying')
               AND run_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER)",
        )
        .fetch_one(&mut *conn)
        .await
        .map_err(map_err)?;
        stats.oldest_due_age =
            oldest.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
        Ok(stats)
    }

    async fn task_next_run_at(&self, params: &TaskNextRunParams) -> Result<Option<NextRun>> {
        runtime::next_run_at(&self.pool, params).await
    }

    async fn queue_backlog(&self, params: &QueueBacklogParams) -> Result<Vec<QueueBacklog>> {
        runtime::queue_backlog(&self.pool, params).await
    }

    async fn task_cancel_requested(&self, params: &CancelRequestedParams) -> Result<Vec<Lease>> {
        runtime::cancel_requested(&self.pool, params).await
    }

    async fn schedule_upsert(
        &self,
        params: &ScheduleUpsertParams,
    ) -> Result<(ScheduleRecord, ScheduleUpserted)> {
        self.schedule_upsert_tx(params).await
    }

    async fn schedule_list(&self) -> Result<Vec<ScheduleRecord>> {
        self.schedule_list_all().await
    }

    async fn schedule_set_paused(&self, params: &SchedulePauseParams) -> Result<ScheduleRecord> {
        self.schedule_pause_tx(params).await
    }

    async fn schedule_remove(&self, name: &str) -> Result<()> {
        self.schedule_delete(name).await
    }

    async fn schedule_fire_due(&self, params: &ScheduleFireParams) -> Result<Vec<FiredTick>> {
        self.schedule_fire_tx(params).await
    }

    async fn queue_list(&self) -> Result<Vec<QueueInfo>> {
        self.queue_list_impl().await
    }

    async fn queue_update(&self, params: &QueueUpdateParams) -> Result<QueueInfo> {
        self.queue_update_impl(params).await
    }

    async fn queue_stats(&self, params: &QueueStatsParams) -> Result<Vec<QueueStats>> {
        queue_stats::queue_stats(&self.pool, params.now).await
    }

    async fn rate_limit_set(&self, params: &RateLimitSetParams) -> Result<RateLimit> {
        self.rate_limit_set_impl(params).await
    }

    async fn rate_limit_list(&self) -> Result<Vec<RateLimit>> {
        self.rate_limit_list_impl().await
    }

    async fn rate_limit_remove(&self, command_type: &str) -> Result<()> {
        self.rate_limit_remove_impl(command_type).await
    }

    async fn task_bulk(&self, params: &TaskBulkParams) -> Result<TaskBulkOutcome> {
        self.task_bulk_impl(params).await
    }

    async fn audit_append(&self, params: &AuditAppendParams) -> Result<AuditRecord> {
        self.audit_append_impl(params).await
    }

    async fn audit_list(&self, params: &AuditListParams) -> Result<Vec<AuditRecord>> {
        self.audit_list_impl(params).await
    }
    async fn task_insert_many(
        &self,
        params: &TaskInsertManyParams,
    ) -> Result<Vec<TaskInsertOutcome>> {
        crate::common::validate_many(&params.tasks)?;
        self.insert_committed(&params.tasks, params.now).await
    }

    async fn workflow_insert(&self, params: &WorkflowInsertParams) -> Result<WorkflowDetail> {
        let mut tx = self.begin().await?;
        let detail = flow::insert(&mut *tx, params).await?;
        tx.commit().await.map_err(map_err)?;
        self.wake();
        Ok(detail)
    }

    async fn workflow_get(&self, id: WorkflowId) -> Result<Option<WorkflowDetail>> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        flow::get(&mut *conn, id).await
    }

    async fn workflow_list(&self, params: &WorkflowListParams) -> Result<Vec<WorkflowRecord>> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        flow::list(&mut *conn, params).await
    }

    async fn task_parent_results(&self, id: TaskId) -> Result<Vec<ParentOutcome>> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        workflows::parent_results(&mut conn, id).await
    }

    async fn outbox_claim(&self, params: &OutboxClaimParams) -> Result<Vec<OutboxRecord>> {
        self.outbox_claim_impl(params).await
    }

    async fn outbox_settle(&self, params: &OutboxSettleParams) -> Result<u64> {
        self.outbox_settle_impl(params).await
    }

    async fn outbox_list(&self, params: &OutboxListParams) -> Result<Vec<OutboxRecord>> {
        self.outbox_list_impl(params).await
    }

    async fn alert_transition(&self, params: &crate::AlertTransitionParams) -> Result<bool> {
        self.alert_transition_impl(params).await
    }

    async fn outbox_prune(&self, params: &OutboxPruneParams) -> Result<u64> {
        self.outbox_prune_impl(params).await
    }
    async fn task_workflow(&self, id: TaskId) -> Result<Option<WorkflowId>> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        workflows::task_workflow(&mut conn, id).await
    }

    async fn task_list_finished(&self, params: &TaskListFinishedParams) -> Result<Vec<TaskRecord>> {
        // The status list repeats the finished-task index's condition, so SQLite uses it.
        let rows = sqlx::query(&format!(
            "SELECT {TASK_COLUMNS} FROM tenax_tasks
             WHERE status IN ('succeeded', 'dead', 'cancelled') AND status <> 'cancelled'
               AND finished_at >= ?
             ORDER BY finished_at DESC
             LIMIT ?"
        ))
        .bind(params.since.timestamp_millis())
        .bind(i64::from(params.limit))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(task_from_row).collect()
    }
    async fn task_complete_many_if_leased(
        &self,
        params: &[TaskCompleteParams],
    ) -> Result<Vec<BatchCompletion>> {
        crate::common::check_complete_many(params)?;
        if params.is_empty() {
            return Ok(Vec::new());
        }
        let repeated = crate::common::repeated_leases(params);
        // One `BEGIN IMMEDIATE` (one fsync) for the batch. The plain tasks take two
        // statements for the whole batch; a workflow task or a compensation, and a
        // lease that no longer holds, take the one-task path after them, in the same
        // transaction: the single writer holds no row another writer waits for.
        let mut tx = self.begin().await?;
        let db_now = clock(&mut tx, None).await?;
        let at = |item: &TaskCompleteParams| item.now.map_or(db_now, |at| at.timestamp_millis());
        let first: Vec<&TaskCompleteParams> = params
            .iter()
            .zip(&repeated)
            .filter(|(_, repeated)| !**repeated)
            .map(|(item, _)| item)
            .collect();
        let plain = complete_plain_in(&mut tx, &first, at).await?;
        let mut landed = Vec::with_capacity(params.len());
        let mut woke = false;
        for (item, repeated) in params.iter().zip(repeated) {
            if repeated {
                landed.push(BatchCompletion::Lost);
            } else if plain.contains(&(item.lease.id.0, item.lease.epoch)) {
                landed.push(BatchCompletion::Landed);
            } else if let Some(w) = complete_in(&mut tx, item, at(item)).await? {
                woke |= w;
                landed.push(BatchCompletion::Landed);
            } else {
                landed.push(BatchCompletion::Lost);
            }
        }
        tx.commit().await.map_err(map_err)?;
        if woke {
            self.wake();
        }
        Ok(landed)
    }

    async fn outbox_stats(
        &self,
        params: &crate::OutboxStatsParams,
    ) -> Result<Vec<crate::OutboxStat>> {
        self.outbox_stats_impl(params).await
    }

    async fn task_due_count(&self, params: &crate::TaskDueCountParams) -> Result<crate::DueCount> {
        runtime::due_count(&self.pool, params).await
    }

    async fn event_rule_set(&self, params: &crate::EventRuleParams) -> Result<bool> {
        self.event_rule_set_impl(params).await
    }

    async fn event_rule_list(&self) -> Result<Vec<crate::EventRule>> {
        self.event_rule_list_impl().await
    }

    async fn event_lease(
        &self,
        params: &crate::EventLeaseParams,
    ) -> Result<Option<crate::EventLease>> {
        self.event_lease_impl(params).await
    }

    async fn event_sequence(&self, params: &crate::EventSequenceParams) -> Result<Option<u64>> {
        self.event_sequence_impl(params).await
    }

    async fn event_cursor_advance(&self, params: &crate::EventCursorParams) -> Result<bool> {
        self.event_cursor_advance_impl(params).await
    }

    async fn event_list(&self, params: &crate::EventListParams) -> Result<crate::EventPage> {
        self.event_list_impl(params).await
    }

    async fn event_prune(&self, params: &crate::EventPruneParams) -> Result<u64> {
        self.event_prune_impl(params).await
    }
}
