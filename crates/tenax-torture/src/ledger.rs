//! The external ledger: a PostgreSQL database apart from the store under test, written
//! by the torture worker at every handler entry and exit, and by the harness for every
//! fault it injects and every enqueue it makes.
//!
//! Live mutual exclusion: at handler entry the worker takes
//! `pg_try_advisory_lock(run, hashtext(task_no))` on its own ledger session and holds it
//! until the handler stops. A second live execution of the task anywhere fails to get it
//! and records a `violation`. A process killed with SIGKILL loses its socket, so
//! PostgreSQL ends its session and drops its locks at once: the check is exact under
//! kill -9. Inside one process (one session, where advisory locks are re-entrant) a set
//! of running task numbers does the same.
use std::collections::HashSet;
use std::sync::Arc;

use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Row};
use tenax::{ExecutionHook, ExecutionOutcome, HookFuture, TaskContext};
use tokio::sync::Mutex;

/// The ledger's tables, one set shared by every run (rows carry the run id).
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS torture_exec (
         id BIGSERIAL PRIMARY KEY, run TEXT NOT NULL, task_no TEXT NOT NULL, kind TEXT NOT NULL,
         attempt INT NOT NULL, epoch BIGINT NOT NULL, pid INT NOT NULL,
         t_start TIMESTAMPTZ NOT NULL, t_end TIMESTAMPTZ, outcome TEXT, effect_new BOOLEAN)",
    "CREATE INDEX IF NOT EXISTS torture_exec_run ON torture_exec (run, task_no)",
    "CREATE TABLE IF NOT EXISTS torture_violation (
         run TEXT NOT NULL, task_no TEXT NOT NULL, epoch BIGINT NOT NULL, pid INT NOT NULL,
         at TIMESTAMPTZ NOT NULL, what TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS torture_effect (
         run TEXT NOT NULL, task_no TEXT NOT NULL, epoch BIGINT NOT NULL, pid INT NOT NULL,
         at TIMESTAMPTZ NOT NULL, PRIMARY KEY (run, task_no))",
    "CREATE TABLE IF NOT EXISTS torture_fault (
         id BIGSERIAL PRIMARY KEY, run TEXT NOT NULL, at TIMESTAMPTZ NOT NULL, until TIMESTAMPTZ,
         kind TEXT NOT NULL, pid INT, detail TEXT)",
    "CREATE TABLE IF NOT EXISTS torture_enqueue (
         run TEXT NOT NULL, task_no TEXT NOT NULL, mode TEXT NOT NULL, state TEXT NOT NULL,
         PRIMARY KEY (run, task_no))",
    "ALTER TABLE torture_enqueue ADD COLUMN IF NOT EXISTS run_at_us BIGINT",
    "ALTER TABLE torture_enqueue ADD COLUMN IF NOT EXISTS first_at TIMESTAMPTZ",
];

/// One execution as the ledger saw it.
#[derive(Debug, Clone, Serialize)]
pub struct Exec {
    /// The task's number.
    pub task_no: String,
    /// `execute` or `compensate`.
    pub kind: String,
    /// Attempt number given to the handler.
    pub attempt: i32,
    /// Lease epoch of the claim.
    pub epoch: i64,
    /// Process that ran it.
    pub pid: i32,
    /// Start, µs since the Unix epoch (ledger clock).
    pub start_us: i64,
    /// End, µs since the Unix epoch, when the handler's end was recorded.
    pub end_us: Option<i64>,
    /// `succeeded`, `failed`, `fenced`, or `None` when its process died inside it.
    pub outcome: Option<String>,
}

/// One task of the run as its enqueuer logged it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Enqueued {
    /// The task's number.
    pub task_no: String,
    /// Its behaviour (`ok`, `flaky`, `poison`, ...).
    pub mode: String,
    /// `invoke`, `ok` (acknowledged) or `info` (answer lost).
    pub state: String,
    /// The run time the store gave it at enqueue (the database's clock), µs.
    pub run_at_us: Option<i64>,
    /// When its first enqueue call was about to be sent (ledger clock), µs.
    pub first_at_us: Option<i64>,
}

/// One injected fault.
#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    /// When it began, µs since the Unix epoch (ledger clock).
    pub at_us: i64,
    /// When it ended (pauses, outages), µs.
    pub until_us: Option<i64>,
    /// `kill`, `exit`, `pause`, `term`, `pg_restart`, `mariadb_restart`, `proxy_*`, `stale_injection`.
    pub kind: String,
    /// The process it hit, when it hit one.
    pub pid: Option<i32>,
    /// Free text.
    pub detail: Option<String>,
}

/// A ledger connection for one run.
#[derive(Debug, Clone)]
pub struct Ledger {
    pool: PgPool,
    run: String,
}

impl Ledger {
    /// Connect to the ledger database and create its tables.
    pub async fn open(url: &str, run: &str) -> anyhow::Result<Self> {
        let pool = PgPoolOptions::new().max_connections(4).connect(url).await?;
        // Concurrent CREATE IF NOT EXISTS can still collide on the catalogue: serialise.
        let mut tx = pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(7340021)")
            .execute(&mut *tx)
            .await?;
        for statement in SCHEMA {
            sqlx::query(statement).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(Self {
            pool,
            run: run.to_owned(),
        })
    }

    /// The run id rows are tagged with.
    pub fn run(&self) -> &str {
        &self.run
    }

    /// Record a fault that began now (and, for pauses and outages, `until` later).
    pub async fn fault(&self, kind: &str, pid: Option<u32>, detail: &str) -> anyhow::Result<i64> {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO torture_fault (run, at, kind, pid, detail)
             VALUES ($1, clock_timestamp(), $2, $3, $4) RETURNING id",
        )
        .bind(&self.run)
        .bind(kind)
        .bind(pid.and_then(|p| i32::try_from(p).ok()))
        .bind(detail)
        .fetch_one(&self.pool)
        .await?;
        Ok(id)
    }

    /// Record a fault that began at `at_us` (µs since the Unix epoch, this host's clock).
    pub async fn fault_at(
        &self,
        kind: &str,
        pid: Option<u32>,
        detail: &str,
        at_us: i64,
    ) -> anyhow::Result<()> {
        sqlx::query(
            "INSERT INTO torture_fault (run, at, kind, pid, detail)
             VALUES ($1, to_timestamp($2::float8 / 1e6), $3, $4, $5)",
        )
        .bind(&self.run)
        .bind(at_us)
        .bind(kind)
        .bind(pid.and_then(|p| i32::try_from(p).ok()))
        .bind(detail)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Mark the end of a fault with a duration (a pause, an outage).
    pub async fn fault_end(&self, id: i64) -> anyhow::Result<()> {
        sqlx::query("UPDATE torture_fault SET until = clock_timestamp() WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Log an enqueue: `invoke` before the call, then `ok` (with the run time the store
    /// gave the task, µs) or `info` (unknown outcome).
    pub async fn enqueue_log(
        &self,
        task_no: &str,
        mode: &str,
        state: &str,
        run_at_us: Option<i64>,
    ) -> anyhow::Result<()> {
        sqlx::query(
            "INSERT INTO torture_enqueue (run, task_no, mode, state, run_at_us, first_at)
             VALUES ($1, $2, $3, $4, $5, clock_timestamp())
             ON CONFLICT (run, task_no) DO UPDATE SET state = EXCLUDED.state,
                 run_at_us = COALESCE(EXCLUDED.run_at_us, torture_enqueue.run_at_us)",
        )
        .bind(&self.run)
        .bind(task_no)
        .bind(mode)
        .bind(state)
        .bind(run_at_us)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Every enqueue of the run.
    pub async fn enqueues(&self) -> anyhow::Result<Vec<Enqueued>> {
        Ok(sqlx::query_as(
            "SELECT task_no, mode, state, run_at_us,
                    (extract(epoch FROM first_at) * 1e6)::BIGINT AS first_at_us
             FROM torture_enqueue WHERE run = $1 ORDER BY task_no",
        )
        .bind(&self.run)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Every execution of the run, by task then start.
    pub async fn executions(&self) -> anyhow::Result<Vec<Exec>> {
        let rows = sqlx::query(
            "SELECT task_no, kind, attempt, epoch, pid,
                    (extract(epoch FROM t_start) * 1e6)::BIGINT AS start_us,
                    (extract(epoch FROM t_end) * 1e6)::BIGINT AS end_us, outcome
             FROM torture_exec WHERE run = $1 ORDER BY task_no, t_start, id",
        )
        .bind(&self.run)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Exec {
                    task_no: r.try_get("task_no")?,
                    kind: r.try_get("kind")?,
                    attempt: r.try_get("attempt")?,
                    epoch: r.try_get("epoch")?,
                    pid: r.try_get("pid")?,
                    start_us: r.try_get("start_us")?,
                    end_us: r.try_get("end_us")?,
                    outcome: r.try_get("outcome")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Into::into)
    }

    /// Every fault of the run, oldest first.
    pub async fn faults(&self) -> anyhow::Result<Vec<Fault>> {
        let rows = sqlx::query(
            "SELECT (extract(epoch FROM at) * 1e6)::BIGINT AS at_us,
                    (extract(epoch FROM until) * 1e6)::BIGINT AS until_us, kind, pid, detail
             FROM torture_fault WHERE run = $1 ORDER BY at, id",
        )
        .bind(&self.run)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Fault {
                    at_us: r.try_get("at_us")?,
                    until_us: r.try_get("until_us")?,
                    kind: r.try_get("kind")?,
                    pid: r.try_get("pid")?,
                    detail: r.try_get("detail")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Into::into)
    }

    /// Live-exclusion violations: `(task_no, epoch, pid, at_us, what)`.
    pub async fn violations(&self) -> anyhow::Result<Vec<(String, i64, i32, i64, String)>> {
        Ok(sqlx::query_as(
            "SELECT task_no, epoch, pid, (extract(epoch FROM at) * 1e6)::BIGINT, what
             FROM torture_violation WHERE run = $1 ORDER BY at",
        )
        .bind(&self.run)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Side effects written (one per task at most, by construction) and dedup hits.
    pub async fn effect_counts(&self) -> anyhow::Result<(i64, i64)> {
        let effects: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM torture_effect WHERE run = $1")
            .bind(&self.run)
            .fetch_one(&self.pool)
            .await?;
        let hits: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM torture_exec WHERE run = $1 AND effect_new = false",
        )
        .bind(&self.run)
        .fetch_one(&self.pool)
        .await?;
        Ok((effects, hits))
    }

    /// The ledger database's clock, µs since the Unix epoch.
    pub async fn now_us(&self) -> anyhow::Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::BIGINT")
                .fetch_one(&self.pool)
                .await?,
        )
    }
}

/// The worker side of the ledger: an [`ExecutionHook`] holding one session per process
/// for the advisory locks, and the idempotent side effect of the torture command.
#[derive(Debug, Clone)]
pub struct WorkerLedger {
    session: Arc<Mutex<PgConnection>>,
    running: Arc<std::sync::Mutex<HashSet<String>>>,
    run: String,
    pid: i32,
}

impl WorkerLedger {
    /// Open the session this process holds its locks on.
    pub async fn connect(url: &str, run: &str) -> anyhow::Result<Self> {
        let options: PgConnectOptions = url.parse()?;
        let session = options.connect().await?;
        Ok(Self {
            session: Arc::new(Mutex::new(session)),
            running: Arc::default(),
            run: run.to_owned(),
            pid: i32::try_from(std::process::id()).unwrap_or(i32::MAX),
        })
    }

    fn lock_key(task: &TaskContext) -> String {
        format!("{}/{}", task.task_no(), task.kind().as_str())
    }

    async fn start(&self, task: &TaskContext) -> anyhow::Result<()> {
        let key = Self::lock_key(task);
        let fresh_here = self
            .running
            .lock()
            .map(|mut set| set.insert(key.clone()))
            .unwrap_or(false);
        let mut session = self.session.lock().await;
        let locked: bool =
            sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtext($1), hashtext($2))")
                .bind(&self.run)
                .bind(&key)
                .fetch_one(&mut *session)
                .await?;
        if !locked || !fresh_here {
            let what = if fresh_here {
                "advisory lock held by another live session"
            } else {
                "already running in this process"
            };
            sqlx::query(
                "INSERT INTO torture_violation (run, task_no, epoch, pid, at, what)
                 VALUES ($1, $2, $3, $4, clock_timestamp(), $5)",
            )
            .bind(&self.run)
            .bind(task.task_no().as_str())
            .bind(task.lease_epoch())
            .bind(self.pid)
            .bind(what)
            .execute(&mut *session)
            .await?;
        }
        sqlx::query(
            "INSERT INTO torture_exec (run, task_no, kind, attempt, epoch, pid, t_start)
             VALUES ($1, $2, $3, $4, $5, $6, clock_timestamp())",
        )
        .bind(&self.run)
        .bind(task.task_no().as_str())
        .bind(task.kind().as_str())
        .bind(i32::try_from(task.attempt()).unwrap_or(i32::MAX))
        .bind(task.lease_epoch())
        .bind(self.pid)
        .execute(&mut *session)
        .await?;
        Ok(())
    }

    async fn end(&self, task: &TaskContext, outcome: ExecutionOutcome) -> anyhow::Result<()> {
        let key = Self::lock_key(task);
        let mut session = self.session.lock().await;
        sqlx::query(
            "UPDATE torture_exec SET t_end = clock_timestamp(), outcome = $1
             WHERE run = $2 AND task_no = $3 AND kind = $4 AND epoch = $5 AND pid = $6
               AND t_end IS NULL",
        )
        .bind(outcome.as_str())
        .bind(&self.run)
        .bind(task.task_no().as_str())
        .bind(task.kind().as_str())
        .bind(task.lease_epoch())
        .bind(self.pid)
        .execute(&mut *session)
        .await?;
        // Unlock only what this execution holds: the in-process set says whether it is
        // the one that took the lock (unlocking a lock not held just returns false).
        let removed = self
            .running
            .lock()
            .map(|mut set| set.remove(&key))
            .unwrap_or(false);
        if removed {
            sqlx::query("SELECT pg_advisory_unlock(hashtext($1), hashtext($2))")
                .bind(&self.run)
                .bind(&key)
                .execute(&mut *session)
                .await?;
        }
        Ok(())
    }

    /// The idempotent side effect: one row per task, whatever the re-executions.
    /// Returns whether this execution wrote it (false is a dedup hit).
    pub async fn effect(&self, task: &TaskContext) -> anyhow::Result<bool> {
        let mut session = self.session.lock().await;
        let written = sqlx::query(
            "INSERT INTO torture_effect (run, task_no, epoch, pid, at)
             VALUES ($1, $2, $3, $4, clock_timestamp()) ON CONFLICT DO NOTHING",
        )
        .bind(&self.run)
        .bind(task.task_no().as_str())
        .bind(task.lease_epoch())
        .bind(self.pid)
        .execute(&mut *session)
        .await?
        .rows_affected()
            == 1;
        sqlx::query(
            "UPDATE torture_exec SET effect_new = $1
             WHERE run = $2 AND task_no = $3 AND kind = 'execute' AND epoch = $4 AND pid = $5",
        )
        .bind(written)
        .bind(&self.run)
        .bind(task.task_no().as_str())
        .bind(task.lease_epoch())
        .bind(self.pid)
        .execute(&mut *session)
        .await?;
        Ok(written)
    }
}

impl ExecutionHook for WorkerLedger {
    fn before<'a>(&'a self, task: &'a TaskContext) -> HookFuture<'a> {
        Box::pin(async move {
            if let Err(e) = self.start(task).await {
                // A start the oracle cannot see would make every check blind: stop.
                eprintln!(
                    "torture ledger: cannot record the start of {}: {e}",
                    task.task_no()
                );
                std::process::exit(70);
            }
        })
    }

    fn after<'a>(&'a self, task: &'a TaskContext, outcome: ExecutionOutcome) -> HookFuture<'a> {
        Box::pin(async move {
            if let Err(e) = self.end(task, outcome).await {
                eprintln!(
                    "torture ledger: cannot record the end of {}: {e}",
                    task.task_no()
                );
                std::process::exit(70);
            }
        })
    }
}
