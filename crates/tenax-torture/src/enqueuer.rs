//! `tenax-torture enqueue`: an enqueuing client in its own process, so that the harness
//! can SIGKILL it in the middle of a request.
//!
//! It reads one [`Spec`] per line on standard input and, for each, prints
//! `send <task_no>` just before the call and `ack <task_no> <run_at µs>` once the store
//! has acknowledged it. A task number whose `send` has no `ack` when the process dies
//! is an enqueue with a lost answer: the harness resolves it by looking the number up
//! in the store, and sends it again only if it is not there (enqueue is idempotent by
//! task number, so even a commit that lands after the look-up makes no second task).
use std::io::Write;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tenax::Client;
use tokio::io::AsyncBufReadExt;

use crate::worker::TORTURE;

/// Arguments of `tenax-torture enqueue`.
#[derive(Debug, clap::Args)]
pub struct EnqueueArgs {
    /// The store.
    #[arg(long)]
    pub database_url: String,
    /// Pace, tasks per second (0: as fast as the store answers).
    #[arg(long, default_value_t = 0)]
    pub per_sec: u32,
}

/// One task to enqueue.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Spec {
    /// Its task number.
    pub task_no: String,
    /// Its payload (a [`Behaviour`](crate::worker::Behaviour)).
    pub payload: serde_json::Value,
    /// Its attempt budget.
    pub max_attempts: u32,
    /// Its delay, if delayed.
    pub delay_ms: Option<u64>,
}

fn say(line: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// Enqueue every spec read from standard input, in order.
pub async fn run(args: EnqueueArgs) -> anyhow::Result<()> {
    let storage = tenax::storage::connect(&args.database_url).await?;
    let client = Client::new(storage);
    let pace = (args.per_sec > 0).then(|| Duration::from_secs(1) / args.per_sec);
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        let spec: Spec = serde_json::from_str(&line)?;
        say(&format!("send {}", spec.task_no))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let inserted = loop {
            let mut enqueue = client
                .enqueue_raw(TORTURE, &spec.payload)
                .task_no(spec.task_no.clone())
                .max_attempts(spec.max_attempts);
            if let Some(ms) = spec.delay_ms {
                enqueue = enqueue.run_in(Duration::from_millis(ms));
            }
            match enqueue.await {
                Ok(inserted) => break inserted,
                // Same number again until acknowledged: idempotent by task number.
                Err(e) if Instant::now() < deadline => {
                    tracing::warn!(task_no = %spec.task_no, error = %e, "enqueue failed; again");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e.into()),
            }
        };
        // The run time it was given, for the early-start check; unknown ("-") for a
        // repeat of a task already claimed, whose retries may have moved it since.
        let run_at = if inserted.task.attempt == 0 {
            inserted.task.run_at.timestamp_micros().to_string()
        } else {
            "-".to_owned()
        };
        say(&format!("ack {} {run_at}", spec.task_no))?;
        if let Some(pace) = pace {
            tokio::time::sleep(pace).await;
        }
    }
    Ok(())
}

/// What [`drive`] did: kills, and how each lost answer was resolved.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct EnqueueFaults {
    /// SIGKILLs of the enqueuer process, each right after it announced a request.
    pub kills: usize,
    /// Enqueuer processes that ended by themselves before finishing (restarted).
    pub exits: usize,
    /// Requests whose answer was lost and whose task the store held (not sent again).
    pub lost_answers_present: usize,
    /// Requests whose answer was lost and whose task the store did not hold (sent again).
    pub lost_answers_absent: usize,
}

/// The harness side: enqueue `specs` through enqueuer processes (`program enqueue`),
/// SIGKILLing the process `kills` times, each within 3 ms after it announced a request
/// (before, during or after its commit), logging every enqueue in the ledger, and
/// resolving each lost answer by reading the store.
#[allow(clippy::too_many_arguments)]
pub async fn drive(
    program: &std::path::Path,
    database_url: &str,
    storage: &std::sync::Arc<dyn tenax::storage::Storage>,
    ledger: &crate::ledger::Ledger,
    specs: Vec<(Spec, &'static str)>,
    per_sec: u32,
    kills: usize,
    seed: u64,
    log_dir: &std::path::Path,
) -> anyhow::Result<EnqueueFaults> {
    use rand::{Rng, SeedableRng};
    use tokio::io::AsyncWriteExt;

    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x656e_7175_6575_6572);
    let kill_at: std::collections::BTreeSet<usize> =
        rand::seq::index::sample(&mut rng, specs.len(), kills.min(specs.len()))
            .into_iter()
            .collect();
    let mut faults = EnqueueFaults::default();
    let mut next = 0;
    let mut spawned = 0;
    let mut idle_restarts = 0;
    std::fs::create_dir_all(log_dir)?;
    while next < specs.len() {
        let log = std::fs::File::create(log_dir.join(format!("enqueuer-{spawned}.log")))?;
        spawned += 1;
        let mut child = tokio::process::Command::new(program)
            .arg("enqueue")
            .args(["--database-url", database_url])
            .args(["--per-sec", &per_sec.to_string()])
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?;
        let pid = child.id().unwrap_or(0);
        let mut input = String::new();
        for (spec, _) in &specs[next..] {
            input.push_str(&serde_json::to_string(spec)?);
            input.push('\n');
        }
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| anyhow::anyhow!("enqueuer stdin"))?;
        // A killed enqueuer stops reading: the write then fails, which is expected.
        let writer = tokio::spawn(async move {
            let _ = stdin.write_all(input.as_bytes()).await;
        });
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("enqueuer stdout"))?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let mut in_flight: Option<usize> = None;
        let mut killed = false;
        let progress_before = next;
        while let Some(line) = lines.next_line().await? {
            let mut words = line.split(' ');
            let (verb, task_no) = (words.next(), words.next().unwrap_or_default());
            // Requests are sent one at a time: `send` and `ack` both name the next task.
            let index = next;
            let Some((spec, mode)) = specs.get(index) else {
                anyhow::bail!("enqueuer said {line:?} past the last task");
            };
            anyhow::ensure!(
                spec.task_no == task_no,
                "enqueuer said {line:?}, expected task {}",
                spec.task_no
            );
            match verb {
                Some("send") => {
                    ledger.enqueue_log(task_no, mode, "invoke", None).await?;
                    in_flight = Some(index);
                    if kill_at.contains(&index) && faults.kills < kills {
                        tokio::time::sleep(Duration::from_micros(rng.random_range(0..3000))).await;
                        child.start_kill()?;
                        child.wait().await?;
                        ledger
                            .fault("enqueuer_kill", Some(pid), &format!("during {task_no}"))
                            .await?;
                        faults.kills += 1;
                        killed = true;
                        break;
                    }
                }
                Some("ack") => {
                    let run_at = words.next().and_then(|w| w.parse::<i64>().ok());
                    ledger.enqueue_log(task_no, mode, "ok", run_at).await?;
                    in_flight = None;
                    next = index + 1;
                }
                _ => anyhow::bail!("enqueuer said {line:?}"),
            }
        }
        writer.abort();
        if !killed {
            let status = child.wait().await?;
            if status.success() && next == specs.len() {
                break;
            }
            faults.exits += 1;
            idle_restarts = if next == progress_before {
                idle_restarts + 1
            } else {
                0
            };
            anyhow::ensure!(
                idle_restarts < 20,
                "the enqueuer keeps exiting without progress ({status}); see {}",
                log_dir.display()
            );
        }
        if let Some(index) = in_flight {
            // The answer is lost: the store says whether the task is there.
            let (spec, mode) = &specs[index];
            let deadline = Instant::now() + Duration::from_secs(60);
            let found = loop {
                let task_ref =
                    tenax::storage::TaskRef::No(tenax::TaskNo::from_stored(spec.task_no.clone()));
                match storage.task_get(&task_ref).await {
                    Ok(found) => break found,
                    Err(e) if Instant::now() < deadline => {
                        tracing::warn!(error = %e, "look-up after a lost answer failed; again");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            match found {
                Some(task) => {
                    // Its run time as given, unless a claim may have moved it since.
                    let run_at = (task.attempt == 0).then(|| task.run_at.timestamp_micros());
                    ledger
                        .enqueue_log(&spec.task_no, mode, "ok", run_at)
                        .await?;
                    faults.lost_answers_present += 1;
                    next = index + 1;
                }
                None => {
                    faults.lost_answers_absent += 1;
                    next = index;
                }
            }
        }
    }
    Ok(faults)
}
