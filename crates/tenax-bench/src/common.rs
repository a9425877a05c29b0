//! What the `tenax bench` subcommands share: the run's own database, worker processes,
//! the counts and database-clock window of a run, progress bars, quantiles, the
//! median of several runs, and the `NOOP` command the drains run.
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use tenax::storage::TaskRef;
use tenax::{Client, Command, CommandError, TaskContext, TaskStatus};
use tenax_storage::mysql::MySqlStorage;
use tenax_storage::postgres::PgStorage;
use tenax_storage::sqlite::SqliteStorage;

use crate::raw::Window;

/// The schema a PostgreSQL bench run owns (one per process, so runs side by side do
/// not meet).
fn schema() -> String {
    format!("tenax_bench_{}", std::process::id())
}

/// Parse `250ms`, `30s`, `5m`, `1h` (as the rest of the `tenax` command line does).
pub(crate) fn parse_duration(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value).map_err(|e| format!("{e} (examples: 250ms, 30s, 5m)"))
}

/// `NOOP`: does nothing and succeeds, as the command of that name which `tenax worker`
/// runs; the in-process workers of a drain register this one.
pub(crate) struct Noop;

impl Command for Noop {
    const TYPE: &'static str = "NOOP";
    type Context = serde_json::Value;
    type Output = ();

    async fn execute(
        &self,
        _ctx: serde_json::Value,
        _task: &TaskContext,
    ) -> Result<(), CommandError> {
        Ok(())
    }
}

/// The value below which `p` of the sorted samples lie (nearest rank).
pub(crate) fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Median, min and max of several runs' figures.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub(crate) struct Spread {
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

impl Spread {
    pub(crate) fn of(values: &[f64]) -> Self {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let median = if sorted.is_empty() {
            f64::NAN
        } else if sorted.len() % 2 == 1 {
            sorted[sorted.len() / 2]
        } else {
            (sorted[sorted.len() / 2 - 1] + sorted[sorted.len() / 2]) / 2.0
        };
        Self {
            median,
            min: sorted.first().copied().unwrap_or(f64::NAN),
            max: sorted.last().copied().unwrap_or(f64::NAN),
        }
    }

    /// `median (min–max)` with no decimals.
    pub(crate) fn show(&self) -> String {
        format!("{:.0} ({:.0}–{:.0})", self.median, self.min, self.max)
    }

    /// `median (min–max)` with two decimals (ratios).
    pub(crate) fn show_ratio(&self) -> String {
        format!("{:.2} ({:.2}–{:.2})", self.median, self.min, self.max)
    }
}

/// A database of its own for the run: a fresh schema on PostgreSQL, a fresh file on
/// SQLite. Other URLs are used as given.
pub(crate) async fn bench_url(
    database_url: &str,
) -> anyhow::Result<(String, Option<tempfile::TempDir>)> {
    if database_url.starts_with("postgres") && !database_url.contains("schema=") {
        PgStorage::connect(database_url)
            .await?
            .drop_schema(&schema())
            .await
            .context("dropping the previous bench schema")?;
        let separator = if database_url.contains('?') { '&' } else { '?' };
        return Ok((
            format!("{database_url}{separator}schema={}", schema()),
            None,
        ));
    }
    if database_url.starts_with("sqlite") {
        // A file of its own, with the URL's parameters (`wake_poll_ms`, say).
        let dir = tempfile::tempdir()?;
        let query = database_url
            .split_once('?')
            .map_or(String::new(), |(_, query)| format!("?{query}"));
        let url = format!("sqlite://{}{query}", dir.path().join("bench.db").display());
        return Ok((url, Some(dir)));
    }
    Ok((database_url.to_owned(), None))
}

/// Drop the run's own schema (PostgreSQL; a SQLite file goes with its directory).
pub(crate) async fn drop_bench_schema(database_url: &str, keep: bool) -> anyhow::Result<()> {
    if !keep && database_url.starts_with("postgres") && !database_url.contains("schema=") {
        PgStorage::connect(database_url)
            .await?
            .drop_schema(&schema())
            .await
            .context("dropping the bench schema")?;
    }
    Ok(())
}

/// The run's database seen through its backend's raw-SQL baselines (`raw/`).
pub(crate) enum BenchDb {
    Postgres(PgStorage),
    Sqlite(SqliteStorage),
    MySql(MySqlStorage),
}

impl BenchDb {
    /// Connect to the run's database (after a client has migrated it).
    pub(crate) async fn connect(url: &str) -> anyhow::Result<Self> {
        if url.starts_with("postgres") {
            Ok(Self::Postgres(PgStorage::connect(url).await?))
        } else if url.starts_with("sqlite") {
            Ok(Self::Sqlite(SqliteStorage::connect(url).await?))
        } else if url.starts_with("mysql") || url.starts_with("mariadb") {
            Ok(Self::MySql(MySqlStorage::connect(url).await?))
        } else {
            anyhow::bail!("this bench supports PostgreSQL, SQLite and MariaDB/MySQL URLs")
        }
    }

    pub(crate) async fn window(&self, since_id: i64) -> anyhow::Result<Window> {
        Ok(match self {
            Self::Postgres(s) => crate::raw::postgres::window(s, since_id).await?,
            Self::Sqlite(s) => crate::raw::sqlite::window(s, since_id).await?,
            Self::MySql(s) => crate::raw::mysql::window(s, since_id).await?,
        })
    }

    pub(crate) async fn max_id(&self) -> anyhow::Result<i64> {
        Ok(match self {
            Self::Postgres(s) => crate::raw::postgres::max_id(s).await?,
            Self::Sqlite(s) => crate::raw::sqlite::max_id(s).await?,
            Self::MySql(s) => crate::raw::mysql::max_id(s).await?,
        })
    }

    pub(crate) async fn reset(&self) -> anyhow::Result<()> {
        match self {
            Self::Postgres(s) => crate::raw::postgres::reset(s).await?,
            Self::Sqlite(s) => crate::raw::sqlite::reset(s).await?,
            Self::MySql(s) => crate::raw::mysql::reset(s).await?,
        }
        Ok(())
    }

    /// Raw multi-row inserts of `tasks` NOOP tasks (pending, or already succeeded).
    pub(crate) async fn raw_insert(
        &self,
        tasks: u64,
        batch: u64,
        prefix: &str,
        finished: bool,
    ) -> anyhow::Result<()> {
        match self {
            Self::Postgres(s) => {
                crate::raw::postgres::raw_insert(s, tasks, batch, prefix, finished).await?;
                crate::raw::postgres::analyze(s).await?;
            }
            Self::Sqlite(s) => {
                crate::raw::sqlite::raw_insert(s, tasks, batch, prefix, finished).await?
            }
            Self::MySql(s) => {
                crate::raw::mysql::raw_insert(s, tasks, batch, prefix, finished).await?;
                crate::raw::mysql::analyze(s).await?;
            }
        }
        Ok(())
    }

    /// The raw claim+complete drain of every due task; returns the tasks finished.
    pub(crate) async fn raw_drain(&self, clients: u32, batch: u32) -> anyhow::Result<u64> {
        Ok(match self {
            Self::Postgres(s) => crate::raw::postgres::raw_drain(s, clients, batch).await?,
            Self::Sqlite(s) => crate::raw::sqlite::raw_drain(s, batch).await?,
            Self::MySql(s) => crate::raw::mysql::raw_drain(s, clients, batch).await?,
        })
    }
}

impl BenchDb {
    /// The raw insert+claim+complete life cycle for `duration` (PostgreSQL only: the
    /// SQLite baseline is the drain's); returns jobs per second.
    pub(crate) async fn raw_lifecycle(
        &self,
        clients: u32,
        batch: u32,
        duration: Duration,
    ) -> anyhow::Result<Option<f64>> {
        match self {
            Self::Postgres(s) => {
                let done = crate::raw::postgres::raw_lifecycle(s, clients, batch, duration).await?;
                let window = self.window(0).await?;
                if window.succeeded != done || window.other != 0 {
                    anyhow::bail!(
                        "the life-cycle baseline finished {done} tasks, the table holds {} \
                         succeeded and {} other",
                        window.succeeded,
                        window.other
                    );
                }
                let created: f64 = duration.as_secs_f64();
                Ok(Some(done as f64 / created))
            }
            Self::Sqlite(_) | Self::MySql(_) => Ok(None),
        }
    }

    /// The database's floor of enqueue-to-start latency, `samples` inserts each
    /// claimed at once, in milliseconds (PostgreSQL; `None` elsewhere).
    pub(crate) async fn raw_latency(&self, samples: usize) -> anyhow::Result<Option<Vec<f64>>> {
        Ok(match self {
            Self::Postgres(s) => Some(crate::raw::postgres::raw_latency(s, samples).await?),
            Self::Sqlite(_) | Self::MySql(_) => None,
        })
    }

    /// The plan of Tenax's own claim of `limit` tasks, run and rolled back (PostgreSQL;
    /// `None` elsewhere).
    pub(crate) async fn explain_claim(&self, limit: u32) -> anyhow::Result<Option<String>> {
        Ok(match self {
            Self::Postgres(s) => Some(crate::raw::postgres::explain_claim(s, limit).await?),
            Self::Sqlite(_) | Self::MySql(_) => None,
        })
    }

    /// The raw multi-row insert of `tasks` in batches of `batch`; returns rows per second.
    pub(crate) async fn raw_insert_rate(
        &self,
        tasks: u64,
        batch: u64,
        prefix: &str,
    ) -> anyhow::Result<f64> {
        let started = Instant::now();
        match self {
            Self::Postgres(s) => {
                crate::raw::postgres::raw_insert(s, tasks, batch, prefix, false).await?
            }
            Self::Sqlite(s) => {
                crate::raw::sqlite::raw_insert(s, tasks, batch, prefix, false).await?
            }
            Self::MySql(s) => crate::raw::mysql::raw_insert(s, tasks, batch, prefix, false).await?,
        }
        Ok(tasks as f64 / started.elapsed().as_secs_f64().max(1e-6))
    }

    /// The client-sent multi-row insert of `tasks` in batches of `batch` (every row's
    /// values sent as parameters); returns rows per second. PostgreSQL only: `None`
    /// elsewhere.
    pub(crate) async fn sent_insert_rate(
        &self,
        tasks: u64,
        batch: u64,
        prefix: &str,
    ) -> anyhow::Result<Option<f64>> {
        let started = Instant::now();
        match self {
            Self::Postgres(s) => {
                crate::raw::postgres::raw_insert_sent(s, tasks, batch, prefix).await?
            }
            Self::Sqlite(_) | Self::MySql(_) => return Ok(None),
        }
        Ok(Some(
            tasks as f64 / started.elapsed().as_secs_f64().max(1e-6),
        ))
    }
}

/// A `tenax worker` child process running only `NOOP`, killed when dropped.
pub(crate) fn spawn_worker(
    url: &str,
    concurrency: u32,
    poll_interval: Duration,
) -> anyhow::Result<tokio::process::Child> {
    let exe = std::env::current_exe().context("cannot find the tenax binary")?;
    tokio::process::Command::new(exe)
        .args(["--database-url", url, "worker", "--command", "NOOP"])
        .args(["--concurrency", &concurrency.to_string()])
        .args([
            "--poll-interval",
            &humantime::format_duration(poll_interval).to_string(),
        ])
        .env("TENAX_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start the worker process")
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub(crate) fn progress_bar(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    let template =
        format!("{what:>10} [{{elapsed_precise}}] {{bar:40}} {{pos}}/{{len}} {{per_sec}}");
    bar.set_style(
        ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// Wait until `expected` tasks with ids above `since_id` have succeeded, showing
/// progress; fails past `within`.
pub(crate) async fn wait_succeeded(
    db: &BenchDb,
    since_id: i64,
    expected: u64,
    within: Duration,
    what: &str,
) -> anyhow::Result<Window> {
    let bar = progress_bar(expected, what);
    let deadline = Instant::now() + within;
    loop {
        let polled = Instant::now();
        let window = db.window(since_id).await?;
        let took = polled.elapsed();
        bar.set_position(window.succeeded);
        if window.succeeded >= expected {
            bar.finish_and_clear();
            return Ok(window);
        }
        if Instant::now() > deadline {
            bar.abandon();
            anyhow::bail!(
                "only {} of {expected} tasks succeeded within {within:?}",
                window.succeeded
            );
        }
        // The count reads every task of the run: over 10^5 or 10^6 rows it takes a large
        // share of a core, taken from the workers being measured. Polling at most a tenth
        // of the time keeps it out of the figure, which comes from the tasks' own
        // timestamps and so does not depend on how soon the end is seen.
        tokio::time::sleep(POLL_MIN.max(took * 10)).await;
    }
}

/// The shortest wait between two progress counts of a drain.
const POLL_MIN: Duration = Duration::from_millis(50);

pub(crate) async fn wait_finished(
    client: &Client,
    ids: &[tenax::TaskId],
    within: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    for id in ids {
        loop {
            let task = client.get(&TaskRef::Id(*id)).await?;
            if task.is_some_and(|t| t.status == TaskStatus::Succeeded) {
                break;
            }
            if Instant::now() > deadline {
                anyhow::bail!("task {id} did not finish within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{quantile, Spread};

    #[test]
    fn quantiles_use_the_nearest_rank() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&samples, 0.5), 50.0);
        assert_eq!(quantile(&samples, 0.99), 99.0);
        assert_eq!(quantile(&samples, 1.0), 100.0);
        assert_eq!(quantile(&[7.0], 0.5), 7.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn spread_takes_the_median_of_runs() {
        let s = Spread::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(Spread::of(&[1.0, 4.0]).median, 2.5);
    }
}
