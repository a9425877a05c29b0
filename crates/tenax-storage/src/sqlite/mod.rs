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
//! - Wake-ups reach other processes through a probe (`crate::wake`): a connection of
//!   its own reads `PRAGMA data_version`, which changes when another connection
//!   commits, every [`SqliteConfig::wake_poll_interval`].
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection, Row, Sqlite, Transaction};
use tenax_core::{AttemptRecord, InvalidInput, TaskId, TaskRecord, TaskStatus};

use crate::common::{duration_ms, json_list, offers_nothing, validate_insert};
use crate::error::{Result, StorageError};
use crate::flow;
use crate::outbox::{
    OutboxClaimParams, OutboxListParams, OutboxPruneParams, OutboxRecord, OutboxSettleParams,
};
use crate::params::*;
use crate::wake::{take_wake_poll, Probe, Wake, DEFAULT_WAKE_POLL_INTERVAL};
use crate::workflows::{
    ParentOutcome, WorkflowDetail, WorkflowId, WorkflowInsertParams, WorkflowListParams,
    WorkflowRecord,
};
use crate::{Capabilities, Storage, WakeReceiver};

mod actions;
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
mod outcomes;
mod prune;
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
    /// How often a connection of its own reads `PRAGMA data_version` to wake this
    /// process's workers when another process (or connection) has committed, once a
    /// worker listens. Defaults to [`DEFAULT_WAKE_POLL_INTERVAL`] (25 ms); `None` keeps
    /// wake-ups within the process, and other processes' tasks wait for the workers'
    /// poll. The URL parameter `wake_poll_ms` overrides it (`0` for `None`).
    pub wake_poll_interval: Option<Duration>,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        Self {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(10),
            max_connections: 8,
            wake_poll_interval: Some(DEFAULT_WAKE_POLL_INTERVAL),
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
    wake: Arc<Wake>,
}

/// The cross-process probe: `PRAGMA data_version` on a connection of its own changes
/// whenever another connection (of any process) has committed to the file.
struct DataVersion(SqliteConnectOptions);

#[async_trait]
impl Probe for DataVersion {
    type Conn = SqliteConnection;

    async fn connect(&self) -> Result<SqliteConnection> {
        self.0.connect().await.map_err(map_err)
    }

    async fn read(&self, conn: &mut SqliteConnection) -> Result<i64> {
        sqlx::query_scalar("PRAGMA data_version")
            .fetch_one(conn)
            .await
            .map_err(map_err)
    }

    async fn close(&self, conn: SqliteConnection) {
        if let Err(e) = conn.close().await {
            tracing::debug!(error = %e, "closing the wake-up probe's connection");
        }
    }
}

impl SqliteStorage {
    /// Open (creating if missing) the file a `sqlite://PATH` URL names, with defaults.
    /// Does not migrate: call [`Storage::migrate`], or use [`crate::connect`].
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, &SqliteConfig::default()).await
    }

    /// Open with explicit options.
    pub async fn connect_with(url: &str, config: &SqliteConfig) -> Result<Self> {
        let (url, wake_poll) = take_wake_poll(url)?;
        let url = url.as_str();
        let wake_poll_interval = wake_poll.unwrap_or(config.wake_poll_interval);
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
            .connect_with(options.clone())
            .await
            .map_err(map_err)?;
        let wake = Wake::probed(DataVersion(options), wake_poll_interval);
        Ok(Self { pool, writer, wake })
    }

    /// The connection pool, for callers that share the database (and for tests that
    /// check its settings).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn wake(&self) {
        self.wake.bump();
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
        Ok(self.insert_checked(tasks, now, &|_| true).await?.outcomes)
    }

    /// Insert tasks in one `BEGIN IMMEDIATE` transaction that commits only if `accept`
    /// takes the outcomes (else it is rolled back), then wake this process's workers if
    /// a committed task is new.
    async fn insert_checked(
        &self,
        tasks: &[TaskInsertParams],
        now: Option<DateTime<Utc>>,
        accept: &InsertAccept<'_>,
    ) -> Result<TaskInsertManyChecked> {
        let mut tx = self.begin().await?;
        let outcomes = insert::insert_many(&mut tx, tasks, now, None).await?;
        if !accept(&outcomes) {
            tx.rollback().await.map_err(map_err)?;
            return Ok(TaskInsertManyChecked {
                outcomes,
                committed: false,
            });
        }
        tx.commit().await.map_err(map_err)?;
        if outcomes.iter().any(TaskInsertOutcome::created) {
            self.wake();
        }
        Ok(TaskInsertManyChecked {
            outcomes,
            committed: true,
        })
    }
}

#[async_trait]
impl Storage for SqliteStorage {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            cross_process_wakeups: self.wake.cross_process(),
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
        let columns = crate::common::list_columns(TASK_COLUMNS, params.value_max_bytes);
        let rows = sqlx::query(&format!(
            "SELECT {columns} FROM tenax_tasks
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
        let params = &*crate::common::storable_completion(params);
        self.complete_impl(params).await
    }

    async fn task_fail_if_leased(&self, params: &TaskFailParams) -> Result<bool> {
        self.fail_impl(params).await
    }

    async fn task_reap_expired(&self, params: &TaskReapParams) -> Result<Vec<ReapedTask>> {
        self.reap_impl(params).await
    }

    async fn task_cancel(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        self.cancel_impl(params).await
    }

    async fn task_retry(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        self.retry_impl(params).await
    }

    async fn side_prune(&self, params: &crate::SidePruneParams) -> Result<crate::SidePruned> {
        self.side_prune_impl(params).await
    }

    async fn task_prune(&self, params: &TaskPruneParams) -> Result<u64> {
        self.prune_impl(params).await
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

    async fn task_insert_many_if(
        &self,
        params: &TaskInsertManyParams,
        accept: &InsertAccept<'_>,
    ) -> Result<TaskInsertManyChecked> {
        crate::common::validate_many(&params.tasks)?;
        self.insert_checked(&params.tasks, params.now, accept).await
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

    async fn outbox_senders_seen(&self, params: &crate::OutboxSendersParams) -> Result<()> {
        self.outbox_senders_seen_impl(params).await
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
        // Only times and statuses are charted: payloads and results stay in the database.
        let columns = crate::common::list_columns(TASK_COLUMNS, Some(0));
        let rows = sqlx::query(&format!(
            "SELECT {columns} FROM tenax_tasks
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
        let params = &*crate::common::storable_completions(params);
        self.complete_many_impl(params).await
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
