//! The PostgreSQL backend: many worker nodes on one database.
//!
//! - Claims are one statement: a `SELECT ... FOR UPDATE SKIP LOCKED` over the partial
//!   claim index, feeding an `UPDATE ... RETURNING` and the attempt-history insert, so
//!   concurrent claimers never wait on each other's rows and never take the same task.
//! - Every write statement takes the clock override as `$1` and uses
//!   `COALESCE($1, now())`: `now()` is the transaction's start time, the same for every
//!   statement of one transaction.
//! - `NOTIFY tenax_wake` (payload: the queue name, never task data) is sent in the
//!   transaction that makes a task due; every node's listener turns it into a wake-up.
//!   It is a hint only: workers poll anyway, and a listener that loses its connection
//!   reconnects with jittered backoff and then wakes its workers once, since
//!   notifications sent meanwhile are lost.
//! - `NOTIFY tenax_finished` (payload: the task id) is sent when a task that a
//!   long-poll waits for finishes (`waits.rs`, migration 0018); the same listener
//!   passes it to [`Storage::finishes`](crate::Storage::finishes).
//! - Each call runs under a client-side timeout, and sessions carry `statement_timeout`
//!   and `idle_in_transaction_session_timeout`, so a silently dead connection surfaces
//!   as a transient error (sqlx cannot set TCP keepalive); the worker's self-fencing
//!   covers the rest.
//! - `?schema=NAME` in the URL keeps Tenax's tables (and migration history) in that
//!   schema, so several applications can share one database.
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use sqlx::{Postgres, Transaction};
use tenax_core::{AttemptRecord, InvalidInput, TaskId, TaskRecord, TaskStatus};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::{Result, StorageError};
use crate::outbox::{
    OutboxClaimParams, OutboxListParams, OutboxPruneParams, OutboxRecord, OutboxSettleParams,
};
use crate::params::*;
use crate::workflows::{
    ParentOutcome, WorkflowDetail, WorkflowId, WorkflowInsertParams, WorkflowListParams,
    WorkflowRecord,
};

mod actions;
mod alert_state;
mod audit;
mod bulk;
mod claim;
mod errors;
mod events;
mod insert;
mod keys;
mod listen;
mod outbox;
mod outcomes;
mod prune;
mod queue_stats;
mod queues;
mod rates;
mod rows;
mod runtime;
mod schedules;
mod schema;
mod storage;
mod transactional;
mod waits;
mod workflows;

pub use claim::claim_sql;
pub(crate) use errors::map_err;
pub use insert::{enqueue_in, enqueue_many_in};
use listen::listen;
use rows::{task_from_row, TASK_COLUMNS};
use schema::take_schema;
pub use transactional::{Transactional, TransactionalCommand};
pub use workflows::enqueue_workflow_in;

/// The migrations of this backend. A database that records migrations this binary
/// does not know (a newer node migrated it) is accepted: migrations are additive, so
/// nodes of the previous version keep running, restarting and rolling back during a
/// rolling deploy.
fn migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!("./migrations/postgres");
    migrator.set_ignore_missing(true);
    migrator
}

/// The notification channel of wake-ups.
pub const WAKE_CHANNEL: &str = "tenax_wake";
/// The `NOTIFY` channel of finished tasks that someone waits for (payload: the task
/// id), sent by the trigger of migration 0018.
pub const FINISH_CHANNEL: &str = "tenax_finished";

/// Options of the PostgreSQL backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgConfig {
    /// Pooled connections per process. Defaults to 10. The heartbeat (lease renewals
    /// and its question about cancel requests) has one more of its own, opened at the
    /// first beat, which nothing else takes: a pool held by handlers, claims and
    /// completions never delays a heartbeat. The claim statement has up to
    /// [`CLAIM_CONNECTIONS`] more, opened at the first claim (see `PgStorage::claims`).
    pub max_connections: u32,
    /// Longest wait for a pooled connection. Defaults to 10 seconds.
    pub acquire_timeout: Duration,
    /// Longest a storage call may take before it fails as transient (client side) and
    /// `statement_timeout` (server side). Defaults to 30 seconds.
    pub call_timeout: Duration,
    /// Listen for wake-ups from other processes. Defaults to `true`.
    pub listen: bool,
}

impl Default for PgConfig {
    fn default() -> Self {
        Self {
            max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(30),
            listen: true,
        }
    }
}

/// The most connections of the claim statement's own pool, per process.
pub const CLAIM_CONNECTIONS: u32 = 2;

/// Tenax on PostgreSQL.
#[derive(Debug)]
pub struct PgStorage {
    pool: PgPool,
    /// Lease renewals' own connection (see [`PgConfig::max_connections`]), which also
    /// asks the heartbeat's question about cancel requests.
    leases: PgPool,
    /// The claim statement's own connections, which keep one generic plan of it
    /// (`plan_cache_mode = force_generic_plan`). PostgreSQL keeps a prepared
    /// statement's generic plan only when its estimated cost is no more than that of a
    /// plan made for the values at hand; with the queue and type lists estimated at ten
    /// entries each, the claim's never was, so every claim was planned afresh: about
    /// 0.5 ms of a 1.15 ms single-task claim. On the main pool the other statements,
    /// whose optional filters want plans for their values, keep PostgreSQL's choice.
    claims: PgPool,
    schema: Option<String>,
    wake: watch::Sender<u64>,
    /// Finishes of waited tasks, heard by the listener.
    finished: tokio::sync::broadcast::Sender<crate::FinishHint>,
    call_timeout: Duration,
    listener: Option<JoinHandle<()>>,
    /// Queues the last claims found limited (see `claim.rs`): a claim naming one takes
    /// the limited path first, so a busy unlimited queue cannot starve it.
    limited_hint: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Whether the last fast claim saw a due task with a concurrency key.
    keyed_hint: std::sync::atomic::AtomicBool,
    /// Whether the last claim saw command types with a rate limit (and, until the first
    /// claim has looked, whether there may be some): claims then probe the buckets
    /// first (see `rates.rs`), so a full batch of unlimited tasks cannot starve them.
    rated_hint: std::sync::atomic::AtomicBool,
}

impl Drop for PgStorage {
    fn drop(&mut self) {
        if let Some(listener) = self.listener.take() {
            listener.abort();
        }
    }
}

impl PgStorage {
    /// Connect with defaults. Does not migrate: call [`Storage::migrate`](crate::Storage::migrate), or use
    /// [`crate::connect`].
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, &PgConfig::default()).await
    }

    /// Connect with explicit options.
    pub async fn connect_with(url: &str, config: &PgConfig) -> Result<Self> {
        let (url, schema) = take_schema(url)?;
        let timeout_ms = config.call_timeout.as_millis().to_string();
        let mut options = PgConnectOptions::from_str(&url)
            .map_err(|e| InvalidInput::new("database URL", e.to_string()))?
            .application_name("tenax")
            .options([
                ("statement_timeout", timeout_ms.as_str()),
                ("idle_in_transaction_session_timeout", timeout_ms.as_str()),
                ("lock_timeout", timeout_ms.as_str()),
            ]);
        if let Some(schema) = &schema {
            options = options.options([("search_path", schema.as_str())]);
        }
        let pool = crate::pool::options()
            .max_connections(config.max_connections.max(1))
            .acquire_timeout(config.acquire_timeout)
            .connect_with(options.clone())
            .await
            .map_err(map_err)?;
        let leases = crate::pool::options()
            .max_connections(1)
            .acquire_timeout(
                config
                    .acquire_timeout
                    .min(crate::pool::LEASE_ACQUIRE_TIMEOUT),
            )
            .connect_lazy_with(options.clone());
        let claims = crate::pool::options()
            .max_connections(CLAIM_CONNECTIONS)
            .acquire_timeout(config.acquire_timeout)
            .connect_lazy_with(options.options([("plan_cache_mode", "force_generic_plan")]));
        let (wake, _) = watch::channel(0);
        let mut storage = Self {
            pool,
            leases,
            claims,
            schema,
            wake,
            finished: tokio::sync::broadcast::channel(1024).0,
            call_timeout: config.call_timeout,
            listener: None,
            limited_hint: std::sync::Mutex::default(),
            keyed_hint: std::sync::atomic::AtomicBool::new(false),
            rated_hint: std::sync::atomic::AtomicBool::new(true),
        };
        if config.listen {
            storage.listener = Some(tokio::spawn(listen(
                storage.pool.clone(),
                storage.wake.clone(),
                storage.finished.clone(),
            )));
        }
        Ok(storage)
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Drop a schema and everything in it (for benchmarks and tests that made it).
    pub async fn drop_schema(&self, schema: &str) -> Result<()> {
        let (_, checked) = take_schema(&format!("postgres://x/y?schema={schema}"))?;
        let Some(schema) = checked else {
            return Ok(());
        };
        sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    /// Run a storage call under the client-side timeout.
    async fn timed<T>(&self, call: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(StorageError::Transient(
                format!("no answer from PostgreSQL within {:?}", self.call_timeout).into(),
            )),
        }
    }

    /// Insert tasks in one transaction, then wake this process's workers if any is new.
    /// Its caller, a `Storage` forwarder, runs it under [`PgStorage::timed`].
    async fn insert_committed(
        &self,
        tasks: &[TaskInsertParams],
        now: Option<DateTime<Utc>>,
    ) -> Result<Vec<TaskInsertOutcome>> {
        let outcomes = if tasks.len() <= insert::CHUNK {
            // One statement, its own transaction: no BEGIN and COMMIT round trips,
            // and `created_at` is the statement's start, not a BEGIN's. Many tasks
            // are sent first as a plain INSERT, which fails whole if a number
            // exists; then, only if one did, again skipping the numbers that exist.
            // (That failure is an ERROR line in the server's log and the rows
            // written before it are thrown away, so one task, whose ON CONFLICT
            // costs a single probe, always skips.)
            let mut conn = self.pool.acquire().await.map_err(map_err)?;
            let fresh = if tasks.len() > 1 {
                insert::Existing::Fail
            } else {
                insert::Existing::Skip
            };
            match insert::insert_many(&mut conn, tasks, now, None, fresh).await {
                Err(e) if insert::number_taken(&e) => {
                    let skip = insert::Existing::Skip;
                    insert::insert_many(&mut conn, tasks, now, None, skip).await?
                }
                other => other?,
            }
        } else {
            let mut tx = self.begin().await?;
            let skip = insert::Existing::Skip;
            let outcomes = insert::insert_many(&mut tx, tasks, now, None, skip).await?;
            tx.commit().await.map_err(map_err)?;
            outcomes
        };
        if outcomes.iter().any(TaskInsertOutcome::created) {
            self.wake();
        }
        Ok(outcomes)
    }

    /// Insert tasks in one transaction that commits only if `accept` takes the outcomes
    /// (else it is rolled back, with the `NOTIFY` it would have sent), then wake this
    /// process's workers if a committed task is new. Timed by its caller, as
    /// `insert_committed`.
    async fn insert_checked(
        &self,
        tasks: &[TaskInsertParams],
        now: Option<DateTime<Utc>>,
        accept: &InsertAccept<'_>,
    ) -> Result<TaskInsertManyChecked> {
        let mut tx = self.begin().await?;
        let skip = insert::Existing::Skip;
        let outcomes = insert::insert_many(&mut tx, tasks, now, None, skip).await?;
        let checked = crate::dialect::commit_if_accepted(tx, outcomes, accept).await?;
        if crate::dialect::woke_by(&checked) {
            self.wake();
        }
        Ok(checked)
    }

    async fn begin(&self) -> Result<Transaction<'static, Postgres>> {
        self.pool.begin().await.map_err(map_err)
    }

    /// Whether another process's new task wakes this one's workers at once.
    fn cross_process_wakeups(&self) -> bool {
        self.listener.is_some()
    }

    fn wake(&self) {
        self.wake.send_modify(|n| *n = n.wrapping_add(1));
    }
}

const NOW: &str = "COALESCE($1::timestamptz, now())";

/// The caller's override, else the transaction's `now()`, for a transaction whose
/// statements need the time as a value.
async fn clock(conn: &mut PgConnection, now: Option<DateTime<Utc>>) -> Result<DateTime<Utc>> {
    sqlx::query_scalar(&format!("SELECT {NOW}"))
        .bind(now)
        .fetch_one(conn)
        .await
        .map_err(map_err)
}

/// The time the transaction that wrote `task` takes: its statements write
/// `COALESCE($1, now())`, the caller's override or the transaction's start, and the
/// statement that wrote `task` stored it as its `updated_at`. The workflow and
/// compensation decisions take it from there, without another round trip.
fn written_at(task: &TaskRecord) -> DateTime<Utc> {
    task.updated_at
}

async fn notify(conn: &mut PgConnection, queue: &str) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(WAKE_CHANNEL)
        .bind(queue)
        .execute(conn)
        .await
        .map_err(map_err)?;
    Ok(())
}

crate::shared::tasks::task_reads!(Postgres);

#[cfg(test)]
mod tests {
    use super::take_schema;

    #[test]
    fn schema_is_taken_from_the_url_and_validated() {
        let (url, schema) = take_schema("postgres://h/db?schema=app_1&sslmode=disable").unwrap();
        assert_eq!(url, "postgres://h/db?sslmode=disable");
        assert_eq!(schema.as_deref(), Some("app_1"));
        assert_eq!(take_schema("postgres://h/db").unwrap().1, None);
        assert!(take_schema("postgres://h/db?schema=x;drop").is_err());
        assert!(take_schema("postgres://h/db?schema=Upper").is_err());
    }
}
