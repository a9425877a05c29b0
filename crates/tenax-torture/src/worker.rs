//! `tenax-torture worker`: a real Tenax worker process running the `TORTURE` command,
//! every execution recorded in the external ledger.
//!
//! The harness runs this rather than `tenax worker` because the torture command needs
//! behaviours the built-in demo commands do not have (abort the process, fail a given
//! number of times, write an idempotent effect into the ledger). Everything else —
//! storage, claims, leases, heartbeats, fencing, reaper, shutdown — is the library's
//! ordinary [`Worker`].
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenax::{Command, CommandError, Registry, RetryPolicy, TaskContext, Worker, WorkerConfig};
use tokio_util::sync::CancellationToken;

use crate::ledger::WorkerLedger;

/// The command type every torture task has.
pub const TORTURE: &str = "TORTURE";

/// What a torture task does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum Behaviour {
    /// Write the effect, wait `ms`, succeed.
    Ok {
        /// Handler time.
        ms: u64,
    },
    /// Fail retryably on the first `fails` attempts, then behave as `Ok`.
    Flaky {
        /// Failing attempts.
        fails: u32,
        /// Handler time.
        ms: u64,
    },
    /// Fail permanently: dead at once, then compensated.
    Permanent,
    /// Abort the worker process (a poison pill).
    Poison,
}

impl Behaviour {
    /// A short name for logs and reports.
    pub fn name(&self) -> &'static str {
        match self {
            Behaviour::Ok { .. } => "ok",
            Behaviour::Flaky { .. } => "flaky",
            Behaviour::Permanent => "permanent",
            Behaviour::Poison => "poison",
        }
    }
}

struct Torture {
    ledger: WorkerLedger,
}

impl Command for Torture {
    const TYPE: &'static str = TORTURE;
    type Context = Behaviour;
    type Output = ();

    async fn execute(&self, behaviour: Behaviour, task: &TaskContext) -> Result<(), CommandError> {
        let ms = match behaviour {
            Behaviour::Poison => {
                eprintln!("torture: poison task {}: aborting", task.task_no());
                std::process::abort();
            }
            Behaviour::Permanent => return Err(CommandError::permanent("permanent failure")),
            Behaviour::Flaky { fails, .. } if task.attempt() <= fails => {
                return Err(CommandError::retryable("flaky failure"));
            }
            Behaviour::Flaky { ms, .. } | Behaviour::Ok { ms } => ms,
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
            _ = task.cancellation().cancelled() => {
                return Err(CommandError::retryable("cancelled"));
            }
        }
        self.ledger
            .effect(task)
            .await
            .map_err(|e| CommandError::retryable(format!("ledger effect: {e}")))?;
        Ok(())
    }

    async fn compensate(&self, _: Behaviour, _: &TaskContext) -> Result<(), CommandError> {
        Ok(())
    }

    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::exponential(Duration::from_millis(50), Duration::from_millis(400))
    }
}

/// How a torture worker runs.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// The store under test.
    #[arg(long)]
    pub database_url: String,
    /// The ledger database (PostgreSQL).
    #[arg(long)]
    pub ledger_url: String,
    /// The run id the ledger rows carry.
    #[arg(long)]
    pub run: String,
    /// Lease length (heartbeat and fence margin a quarter of it).
    #[arg(long, default_value_t = 1000)]
    pub lease_ms: u64,
    /// Tasks run at once.
    #[arg(long, default_value_t = 4)]
    pub concurrency: u32,
    /// Delete finished tasks this long after they finish (pruner every second); off
    /// when absent.
    #[arg(long)]
    pub retention_ms: Option<u64>,
    /// On SIGTERM, time running tasks get before they are handed back.
    #[arg(long, default_value_t = 300)]
    pub grace_ms: u64,
}

/// Run a torture worker until SIGTERM or Ctrl-C.
pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    // Under libfaketime this shows the skew the process runs with.
    eprintln!(
        "torture worker {}: wall clock {}",
        std::process::id(),
        chrono::Utc::now().to_rfc3339()
    );
    // Listen for SIGTERM first: a worker stopped while it starts exits cleanly too.
    let shutdown = shutdown_on_signal();
    // A worker started while the database is down or its connection is being cut
    // waits for it, as a supervisor restarting it would: faults hit running workers.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let storage = loop {
        let connected = tokio::select! {
            connected = tenax::storage::connect(&args.database_url) => connected,
            _ = shutdown.cancelled() => return Ok(()),
        };
        match connected {
            Ok(storage) => break storage,
            Err(e) if std::time::Instant::now() < deadline => {
                tracing::warn!("cannot open the store yet: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    let ledger = tokio::select! {
        ledger = WorkerLedger::connect(&args.ledger_url, &args.run) => ledger?,
        _ = shutdown.cancelled() => return Ok(()),
    };
    let mut registry = Registry::new();
    registry.register(Torture {
        ledger: ledger.clone(),
    })?;
    let mut config = WorkerConfig::fast(Duration::from_millis(args.lease_ms));
    config.concurrency = args.concurrency;
    config.claim_batch = args.concurrency;
    config.shutdown_grace = Duration::from_millis(args.grace_ms);
    config.scheduler = false;
    match args.retention_ms {
        Some(ms) => {
            config.pruner = true;
            config.retention = Duration::from_millis(ms);
            config.pruner_interval = Duration::from_secs(1);
        }
        None => config.pruner = false,
    }
    let worker = Worker::new(storage, registry, config)?.with_hook(Arc::new(ledger));
    worker.run(shutdown).await?;
    Ok(())
}

fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let terminate = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate => {}
        }
        cancel.cancel();
    });
    token
}
