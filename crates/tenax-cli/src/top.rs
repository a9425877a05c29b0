//! `tenax top` and the extended `tenax stats`: a view of the database that any node can
//! take, whatever the backend — counts by status and queue, backlogs, the oldest due
//! task, throughput and latency percentiles of recently finished tasks, and the
//! longest-running tasks.
//!
//! Everything here is read from the database, so it shows the whole fleet, not one
//! process. Latencies are end to end (enqueue to finish, waits and retries included),
//! from the newest finished tasks (at most [`RECENT`]).
use std::fmt::Write;
use std::io::Write as _;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Args;
use comfy_table::Table;
use tenax::storage::{QueueStats, QueueStatsParams, Stats, TaskListParams};
use tenax::{Client, TaskRecord, TaskStatus};

use crate::parse_duration;

/// Finished tasks read for throughput and percentiles.
pub(crate) const RECENT: u32 = 1000;
/// Running tasks read to find the slowest.
const RUNNING: u32 = 500;
/// The window of the throughput figure.
const WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug, Args)]
pub(crate) struct TopArgs {
    /// Print one frame and exit (no screen clearing).
    #[arg(long)]
    once: bool,
    /// Time between frames.
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    interval: Duration,
    /// Slowest running tasks shown.
    #[arg(long, default_value_t = 10)]
    slowest: usize,
}

/// P50, P95 and P99 of some durations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Percentiles {
    pub(crate) count: usize,
    pub(crate) p50: Duration,
    pub(crate) p95: Duration,
    pub(crate) p99: Duration,
}

/// Nearest-rank percentiles; `None` for no sample.
pub(crate) fn percentiles(mut samples: Vec<Duration>) -> Option<Percentiles> {
    if samples.is_empty() {
        return None;
    }
    samples.sort();
    let rank = |p: f64| {
        let index = ((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[index]
    };
    Some(Percentiles {
        count: samples.len(),
        p50: rank(0.50),
        p95: rank(0.95),
        p99: rank(0.99),
    })
}

/// What one frame shows.
pub(crate) struct Snapshot {
    now: DateTime<Utc>,
    stats: Stats,
    queues: Vec<QueueStats>,
    /// Tasks finished within [`WINDOW`] before `now`, among the recent ones read.
    finished_in_window: usize,
    /// Whether the recent tasks read all finished within the window (then the count is
    /// a lower bound).
    window_saturated: bool,
    /// Per command type, end-to-end latency of recently succeeded tasks.
    latencies: Vec<(String, Percentiles)>,
    /// Running tasks, longest-running first.
    running: Vec<TaskRecord>,
}

fn age(now: DateTime<Utc>, since: DateTime<Utc>) -> Duration {
    (now - since).to_std().unwrap_or_default()
}

fn secs(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

impl Snapshot {
    pub(crate) async fn take(client: &Client) -> anyhow::Result<Self> {
        let storage = client.storage();
        let now = storage.now().await?;
        let stats = storage.stats().await?;
        let queues = storage
            .queue_stats(&QueueStatsParams { now: Some(now) })
            .await?;
        let list = |status| TaskListParams {
            status: Some(status),
            limit: RECENT,
            ..TaskListParams::default()
        };
        let succeeded = storage.task_list(&list(TaskStatus::Succeeded)).await?;
        let dead = storage.task_list(&list(TaskStatus::Dead)).await?;
        let finished: Vec<DateTime<Utc>> = succeeded
            .iter()
            .chain(&dead)
            .filter_map(|t| t.finished_at)
            .collect();
        let finished_in_window = finished.iter().filter(|f| age(now, **f) <= WINDOW).count();
        let window_saturated = [&succeeded, &dead].iter().any(|l| {
            l.len() == RECENT as usize
                && l.iter()
                    .filter_map(|t| t.finished_at)
                    .all(|f| age(now, f) <= WINDOW)
        });
        let mut by_type: Vec<(String, Vec<Duration>)> = Vec::new();
        for task in &succeeded {
            let Some(finished) = task.finished_at else {
                continue;
            };
            let took = age(finished, task.created_at);
            match by_type.iter_mut().find(|(t, _)| *t == task.command_type) {
                Some((_, samples)) => samples.push(took),
                None => by_type.push((task.command_type.clone(), vec![took])),
            }
        }
        by_type.sort_by(|a, b| a.0.cmp(&b.0));
        let latencies = by_type
            .into_iter()
            .filter_map(|(t, samples)| percentiles(samples).map(|p| (t, p)))
            .collect();
        let mut running = storage
            .task_list(&TaskListParams {
                status: Some(TaskStatus::Running),
                limit: RUNNING,
                ..TaskListParams::default()
            })
            .await?;
        running.sort_by_key(|t| t.started_at.unwrap_or(now));
        Ok(Self {
            now,
            stats,
            queues,
            finished_in_window,
            window_saturated,
            latencies,
            running,
        })
    }

    /// Counts by status, then per queue with the backlog and the oldest due age.
    pub(crate) fn counts(&self) -> String {
        let mut by_status = Table::new();
        by_status.set_header(["status", "tasks"]);
        for status in TaskStatus::ALL {
            by_status.add_row([status.to_string(), self.stats.count(status).to_string()]);
        }
        let mut queues = Table::new();
        queues.set_header([
            "queue",
            "pending",
            "retrying",
            "running",
            "blocked",
            "backlog (due)",
            "oldest due",
        ]);
        for q in &self.queues {
            queues.add_row([
                q.queue.clone(),
                q.count(TaskStatus::Pending).to_string(),
                q.count(TaskStatus::Retrying).to_string(),
                q.count(TaskStatus::Running).to_string(),
                q.count(TaskStatus::Blocked).to_string(),
                q.backlog.to_string(),
                q.oldest_due_age.map_or_else(|| "—".to_owned(), secs),
            ]);
        }
        format!("{by_status}\n{queues}\n")
    }

    /// Per command type, P50/P95/P99 of recent end-to-end latencies.
    pub(crate) fn latency_table(&self) -> String {
        if self.latencies.is_empty() {
            return "no succeeded task to measure latency from\n".to_owned();
        }
        let mut table = Table::new();
        table.set_header(["command type", "tasks", "p50", "p95", "p99"]);
        for (command_type, p) in &self.latencies {
            table.add_row([
                command_type.clone(),
                p.count.to_string(),
                secs(p.p50),
                secs(p.p95),
                secs(p.p99),
            ]);
        }
        format!("latency, enqueue to finish, newest {RECENT} succeeded tasks:\n{table}\n")
    }

    fn throughput(&self) -> String {
        let per_s = self.finished_in_window as f64 / WINDOW.as_secs_f64();
        let bound = if self.window_saturated {
            "at least "
        } else {
            ""
        };
        format!(
            "throughput: {bound}{} tasks finished in the last {} s ({bound}{per_s:.1}/s)\n",
            self.finished_in_window,
            WINDOW.as_secs()
        )
    }

    fn slowest(&self, n: usize) -> String {
        if self.running.is_empty() {
            return "no running task\n".to_owned();
        }
        let mut table = Table::new();
        table.set_header([
            "id",
            "task_no",
            "command type",
            "attempt",
            "running for",
            "owner",
        ]);
        for task in self.running.iter().take(n) {
            table.add_row([
                task.id.to_string(),
                task.task_no.to_string(),
                task.command_type.clone(),
                format!("{}/{}", task.attempt, task.max_attempts),
                task.started_at
                    .map_or_else(|| "—".to_owned(), |s| secs(age(self.now, s))),
                task.lease_owner.clone().unwrap_or_default(),
            ]);
        }
        format!("slowest running tasks (since first start):\n{table}\n")
    }

    /// One frame of `tenax top`.
    pub(crate) fn frame(&self, slowest: usize) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "tenax top — {} (database clock)\n",
            self.now.format("%Y-%m-%d %H:%M:%S UTC")
        );
        out.push_str(&self.throughput());
        out.push('\n');
        out.push_str(&self.counts());
        out.push_str(&self.latency_table());
        out.push_str(&self.slowest(slowest));
        out
    }
}

/// `tenax stats`.
pub(crate) async fn stats(client: &Client) -> anyhow::Result<()> {
    let snapshot = Snapshot::take(client).await?;
    print!("{}", snapshot.counts());
    let mut by_type = Table::new();
    by_type.set_header(["command type", "status", "tasks"]);
    for (command_type, status, n) in &snapshot.stats.by_type {
        by_type.add_row([command_type.clone(), status.to_string(), n.to_string()]);
    }
    println!("{by_type}");
    match snapshot.stats.oldest_due_age {
        Some(age) => println!("oldest due task has waited {:.1} s", age.as_secs_f64()),
        None => println!("no task is waiting to be claimed"),
    }
    print!("{}", snapshot.throughput());
    print!("{}", snapshot.latency_table());
    Ok(())
}

/// `tenax top`.
pub(crate) async fn run(client: &Client, args: TopArgs) -> anyhow::Result<()> {
    if args.once {
        print!("{}", Snapshot::take(client).await?.frame(args.slowest));
        return Ok(());
    }
    let stop = crate::worker::shutdown_on_signal();
    loop {
        let frame = Snapshot::take(client).await?.frame(args.slowest);
        // Clear the screen and home the cursor, then draw the frame.
        let mut stdout = std::io::stdout().lock();
        write!(stdout, "\x1b[2J\x1b[H{frame}")?;
        stdout.flush()?;
        drop(stdout);
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tokio::time::sleep(args.interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        assert_eq!(percentiles(Vec::new()), None);
        let ms = |n| Duration::from_millis(n);
        let p = percentiles((1..=100).rev().map(ms).collect()).unwrap();
        assert_eq!(
            (p.count, p.p50, p.p95, p.p99),
            (100, ms(50), ms(95), ms(99))
        );
        let one = percentiles(vec![ms(7)]).unwrap();
        assert_eq!((one.p50, one.p99), (ms(7), ms(7)));
    }
}
