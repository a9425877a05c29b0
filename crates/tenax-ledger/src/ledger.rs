use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::Row;
use tenax_core::{ExecutionHook, ExecutionOutcome, HookFuture, TaskContext};

/// A ledger that cannot be opened or written.
#[derive(Debug, thiserror::Error)]
#[error("execution ledger: {0}")]
pub struct LedgerError(#[from] sqlx::Error);

/// One recorded execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    /// Ledger row id.
    pub id: i64,
    /// The task's number.
    pub task_no: String,
    /// Attempt number.
    pub attempt: u32,
    /// Lease epoch.
    pub epoch: i64,
    /// `execute` or `compensate`.
    pub kind: String,
    /// Process that ran it.
    pub pid: u32,
    /// Start, µs since the Unix epoch.
    pub start_us: i64,
    /// End, µs since the Unix epoch: recorded end, else the kill of its process.
    pub end_us: Option<i64>,
    /// `succeeded`, `failed`, `fenced`, `killed`, or `None` while open.
    pub outcome: Option<String>,
    /// The task's business concurrency key, if it has one.
    pub key: Option<String>,
}

/// What [`Ledger::check`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerReport {
    /// Executions recorded.
    pub executions: usize,
    /// Distinct tasks executed.
    pub tasks: usize,
    /// Pairs of executions of one task whose intervals overlap.
    pub overlaps: Vec<(Execution, Execution)>,
    /// Starts that found another live execution of the same task.
    pub live_violations: usize,
    /// Executions neither ended nor killed.
    pub open: Vec<Execution>,
    /// Per concurrency key, the most executions of the key that overlapped at one instant.
    pub key_peaks: BTreeMap<String, usize>,
    /// Starts of a keyed task that found another live execution of the same key.
    pub live_key_overlaps: usize,
}

impl LedgerReport {
    /// No overlap and no live violation.
    pub fn is_clean(&self) -> bool {
        self.overlaps.is_empty() && self.live_violations == 0
    }

    /// The most executions of one key that ran at once (0 without keyed executions).
    pub fn key_peak(&self) -> usize {
        self.key_peaks.values().copied().max().unwrap_or(0)
    }
}

/// The execution ledger. See the [crate docs](crate).
#[derive(Debug, Clone)]
pub struct Ledger {
    pool: SqlitePool,
}

fn now_us() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
}

impl Ledger {
    /// Open (creating) the ledger file at `path`.
    pub async fn open(path: &Path) -> Result<Self, LedgerError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // Durable against a killed process (what the tests do), not against power
            // loss; without per-commit fsyncs the ledger keeps up with a fleet.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(30));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        for statement in [
            "CREATE TABLE IF NOT EXISTS exec (
                 id INTEGER PRIMARY KEY AUTOINCREMENT, task_no TEXT NOT NULL, attempt INTEGER NOT NULL,
                 epoch INTEGER NOT NULL, kind TEXT NOT NULL, pid INTEGER NOT NULL,
                 start_us INTEGER NOT NULL, end_us INTEGER, outcome TEXT)",
            "CREATE INDEX IF NOT EXISTS exec_task ON exec (task_no)",
            "CREATE TABLE IF NOT EXISTS kill (pid INTEGER PRIMARY KEY, at_us INTEGER NOT NULL)",
            "CREATE TABLE IF NOT EXISTS violation (exec_id INTEGER NOT NULL, other_id INTEGER NOT NULL)",
            "CREATE TABLE IF NOT EXISTS key_overlap (exec_id INTEGER NOT NULL, other_id INTEGER NOT NULL)",
        ] {
            sqlx::query(statement).execute(&pool).await?;
        }
        // Ledgers written before keys were recorded have no key column.
        let columns: Vec<String> = sqlx::query_scalar("SELECT name FROM pragma_table_info('exec')")
            .fetch_all(&pool)
            .await?;
        if !columns.iter().any(|c| c == "concurrency_key") {
            sqlx::query("ALTER TABLE exec ADD COLUMN concurrency_key TEXT")
                .execute(&pool)
                .await?;
        }
        sqlx::query("CREATE INDEX IF NOT EXISTS exec_key ON exec (concurrency_key, end_us)")
            .execute(&pool)
            .await?;
        Ok(Self { pool })
    }

    /// Record a start; returns the execution's ledger id. Records a violation when
    /// another execution of the same task is open in a process not known killed.
    pub async fn record_start(&self, task: &TaskContext) -> Result<i64, LedgerError> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO exec (task_no, attempt, epoch, kind, pid, start_us, concurrency_key)
             VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(task.task_no().as_str())
        .bind(i64::from(task.attempt()))
        .bind(task.lease_epoch())
        .bind(task.kind().as_str())
        .bind(i64::from(std::process::id()))
        .bind(now_us())
        .bind(task.concurrency_key())
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO violation (exec_id, other_id)
             SELECT ?1, id FROM exec
             WHERE task_no = ?2 AND id != ?1 AND end_us IS NULL AND pid NOT IN (SELECT pid FROM kill)",
        )
        .bind(id)
        .bind(task.task_no().as_str())
        .execute(&mut *tx)
        .await?;
        if let Some(key) = task.concurrency_key() {
            sqlx::query(
                "INSERT INTO key_overlap (exec_id, other_id)
                 SELECT ?1, id FROM exec
                 WHERE concurrency_key = ?2 AND id != ?1 AND end_us IS NULL
                   AND pid NOT IN (SELECT pid FROM kill)",
            )
            .bind(id)
            .bind(key)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(id)
    }

    /// Record the end of the open execution of `task` under its epoch in this process.
    pub async fn record_end(
        &self,
        task: &TaskContext,
        outcome: ExecutionOutcome,
    ) -> Result<(), LedgerError> {
        sqlx::query(
            "UPDATE exec SET end_us = ?, outcome = ?
             WHERE task_no = ? AND epoch = ? AND pid = ? AND end_us IS NULL",
        )
        .bind(now_us())
        .bind(outcome.as_str())
        .bind(task.task_no().as_str())
        .bind(task.lease_epoch())
        .bind(i64::from(std::process::id()))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Record that process `pid` was killed now: its open executions end here.
    pub async fn record_kill(&self, pid: u32) -> Result<(), LedgerError> {
        sqlx::query("INSERT OR REPLACE INTO kill (pid, at_us) VALUES (?, ?)")
            .bind(i64::from(pid))
            .bind(now_us())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Every execution, oldest first; a killed process's open executions end at the kill.
    pub async fn executions(&self) -> Result<Vec<Execution>, LedgerError> {
        let rows = sqlx::query(
            "SELECT e.id, e.task_no, e.attempt, e.epoch, e.kind, e.pid, e.start_us,
                    COALESCE(e.end_us, k.at_us) AS end_us,
                    COALESCE(e.outcome, CASE WHEN k.at_us IS NOT NULL THEN 'killed' END) AS outcome,
                    e.concurrency_key
             FROM exec e LEFT JOIN kill k ON k.pid = e.pid ORDER BY e.start_us, e.id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(Execution {
                    id: row.try_get("id")?,
                    task_no: row.try_get("task_no")?,
                    attempt: u32::try_from(row.try_get::<i64, _>("attempt")?).unwrap_or(0),
                    epoch: row.try_get("epoch")?,
                    kind: row.try_get("kind")?,
                    pid: u32::try_from(row.try_get::<i64, _>("pid")?).unwrap_or(0),
                    start_us: row.try_get("start_us")?,
                    end_us: row.try_get("end_us")?,
                    outcome: row.try_get("outcome")?,
                    key: row.try_get("concurrency_key")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(LedgerError::from)
    }

    /// Check every task's executions for overlap.
    pub async fn check(&self) -> Result<LedgerReport, LedgerError> {
        let executions = self.executions().await?;
        let live_violations: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM violation")
            .fetch_one(&self.pool)
            .await?;
        let mut by_task: BTreeMap<&str, Vec<&Execution>> = BTreeMap::new();
        for e in &executions {
            by_task.entry(&e.task_no).or_default().push(e);
        }
        let live_key_overlaps: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM key_overlap")
            .fetch_one(&self.pool)
            .await?;
        let mut report = LedgerReport {
            executions: executions.len(),
            tasks: by_task.len(),
            live_violations: usize::try_from(live_violations).unwrap_or(usize::MAX),
            live_key_overlaps: usize::try_from(live_key_overlaps).unwrap_or(usize::MAX),
            key_peaks: key_peaks(&executions),
            ..Default::default()
        };
        for runs in by_task.values() {
            for (i, a) in runs.iter().enumerate() {
                for b in &runs[i + 1..] {
                    let a_end = a.end_us.unwrap_or(i64::MAX);
                    let b_end = b.end_us.unwrap_or(i64::MAX);
                    if a.start_us < b_end && b.start_us < a_end {
                        report.overlaps.push(((*a).clone(), (*b).clone()));
                    }
                }
            }
        }
        report.open = executions
            .into_iter()
            .filter(|e| e.end_us.is_none())
            .collect();
        Ok(report)
    }
}

/// Per key, the most executions that were running at one instant (a sweep over the
/// starts and ends; an execution still open counts until the end of time).
fn key_peaks(executions: &[Execution]) -> BTreeMap<String, usize> {
    let mut events: BTreeMap<&str, Vec<(i64, i32)>> = BTreeMap::new();
    for e in executions {
        if let Some(key) = &e.key {
            let list = events.entry(key).or_default();
            list.push((e.start_us, 1));
            list.push((e.end_us.unwrap_or(i64::MAX), -1));
        }
    }
    events
        .into_iter()
        .map(|(key, mut list)| {
            // At one instant an end sorts before a start: touching intervals do not overlap.
            list.sort_unstable();
            let (mut now, mut peak) = (0i32, 0i32);
            for (_, delta) in list {
                now += delta;
                peak = peak.max(now);
            }
            (key.to_owned(), usize::try_from(peak).unwrap_or(0))
        })
        .collect()
}

impl ExecutionHook for Ledger {
    fn before<'a>(&'a self, task: &'a TaskContext) -> HookFuture<'a> {
        Box::pin(async move {
            if let Err(e) = self.record_start(task).await {
                eprintln!("ledger: cannot record start of {}: {e}", task.task_no());
            }
        })
    }

    fn after<'a>(&'a self, task: &'a TaskContext, outcome: ExecutionOutcome) -> HookFuture<'a> {
        Box::pin(async move {
            if let Err(e) = self.record_end(task, outcome).await {
                eprintln!("ledger: cannot record end of {}: {e}", task.task_no());
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenax_core::{TaskId, TaskKind, TaskNo};
    use tokio_util::sync::CancellationToken;

    fn ctx(no: &str, epoch: i64) -> TaskContext {
        TaskContext::new(
            TaskId(1),
            TaskNo::new(no).unwrap(),
            TaskKind::Execute,
            1,
            5,
            epoch,
            no.to_owned(),
            None,
            CancellationToken::new(),
        )
    }

    #[tokio::test]
    async fn overlapping_executions_are_detected_and_kills_close_intervals() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&dir.path().join("ledger.db")).await.unwrap();
        // Sequential executions of one task: clean.
        ledger.record_start(&ctx("A", 1)).await.unwrap();
        ledger
            .record_end(&ctx("A", 1), ExecutionOutcome::Failed)
            .await
            .unwrap();
        ledger.record_start(&ctx("A", 2)).await.unwrap();
        ledger
            .record_end(&ctx("A", 2), ExecutionOutcome::Succeeded)
            .await
            .unwrap();
        assert!(ledger.check().await.unwrap().is_clean());
        // A second start while the first is open: both checks see it.
        ledger.record_start(&ctx("B", 1)).await.unwrap();
        ledger.record_start(&ctx("B", 2)).await.unwrap();
        let report = ledger.check().await.unwrap();
        assert_eq!(report.live_violations, 1);
        assert_eq!(report.overlaps.len(), 1);
        assert_eq!(report.open.len(), 2);
        // A killed process's execution ends at the kill.
        ledger.record_kill(std::process::id()).await.unwrap();
        let report = ledger.check().await.unwrap();
        assert!(report.open.is_empty());
        assert_eq!(report.tasks, 2);
    }

    #[tokio::test]
    async fn overlapping_executions_of_one_key_are_detected() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&dir.path().join("ledger.db")).await.unwrap();
        let keyed = |no: &str| ctx(no, 1).with_concurrency_key(Some("k".into()));
        // One after the other, and another key alongside: clean, peak 1.
        ledger.record_start(&keyed("A")).await.unwrap();
        ledger.record_start(&ctx("X", 1)).await.unwrap();
        ledger
            .record_end(&keyed("A"), ExecutionOutcome::Succeeded)
            .await
            .unwrap();
        ledger.record_start(&keyed("B")).await.unwrap();
        let report = ledger.check().await.unwrap();
        assert_eq!((report.key_peak(), report.live_key_overlaps), (1, 0));
        // A second task of the key while B runs: both checks see it.
        ledger.record_start(&keyed("C")).await.unwrap();
        let report = ledger.check().await.unwrap();
        assert_eq!(report.key_peaks.get("k"), Some(&2));
        assert_eq!(report.live_key_overlaps, 1);
    }
}
