//! `tenax worker`: run the built-in demo commands until interrupted.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tenax::{Registry, RetryPolicy, Worker, WorkerConfig};
use tokio_util::sync::CancellationToken;

use tenax::Command;

use crate::bank::{BankBehaviour, BankOpenAccount, Echo, FlakyBank, Noop};
use crate::flow::FlowStep;
use crate::parse_duration;

#[derive(Debug, Clone, Args)]
pub(crate) struct WorkerArgs {
    /// Queues to claim from (repeat for several) [default: default].
    #[arg(long = "queue", env = "TENAX_WORKER_QUEUES", value_delimiter = ',')]
    queues: Vec<String>,
    /// Tasks run at once [default: 10].
    #[arg(long, env = "TENAX_WORKER_CONCURRENCY")]
    concurrency: Option<u32>,
    /// Lease length; heartbeat every third of it, fence margin a sixth [default: 30s].
    #[arg(long, env = "TENAX_WORKER_LEASE_TTL", value_parser = parse_duration)]
    lease_ttl: Option<Duration>,
    /// Wait between claims when idle [default: 1s].
    #[arg(long, env = "TENAX_WORKER_POLL_INTERVAL", value_parser = parse_duration)]
    poll_interval: Option<Duration>,
    /// On Ctrl-C or SIGTERM, time running tasks get to finish [default: 15s].
    #[arg(long, env = "TENAX_WORKER_SHUTDOWN_GRACE", value_parser = parse_duration)]
    shutdown_grace: Option<Duration>,
    /// Finished tasks are deleted after this [default: 7days].
    #[arg(long, env = "TENAX_WORKER_RETENTION", value_parser = parse_duration)]
    retention: Option<Duration>,
    /// Record every execution in this execution-ledger file (for tests).
    #[arg(long, value_name = "PATH")]
    ledger: Option<PathBuf>,
    /// Built-in commands to register (repeat for several): BANK_OPEN_ACCOUNT, NOOP,
    /// FLOW_STEP, echo.
    /// Defaults to all of them.
    #[arg(long = "command", value_name = "TYPE")]
    commands: Vec<String>,
    /// Serve Prometheus metrics on this address (for example 127.0.0.1:9464)
    /// [default: none].
    #[arg(long, env = "TENAX_WORKER_METRICS_ADDR", value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Time between two reads of the counts by queue and status from the database
    /// [default: 10s].
    #[arg(long, env = "TENAX_WORKER_METRICS_SAMPLE_INTERVAL", value_parser = parse_duration)]
    metrics_sample_interval: Option<Duration>,
    #[command(flatten)]
    pub(crate) bank: BankArgs,
}

/// How the simulated bank of the demo command behaves.
#[derive(Debug, Clone, Args)]
pub(crate) struct BankArgs {
    /// Share of bank calls that fail with a transient error (0-1).
    #[arg(long, default_value_t = 0.3)]
    pub(crate) bank_failure_rate: f64,
    /// Mean latency of a bank call.
    #[arg(long, value_parser = parse_duration, default_value = "20ms")]
    pub(crate) bank_latency: Duration,
    /// First retry delay of the demo command (doubles per attempt, full jitter).
    #[arg(long, value_parser = parse_duration, default_value = "100ms")]
    pub(crate) backoff_base: Duration,
    /// Longest retry delay of the demo command.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub(crate) backoff_cap: Duration,
}

/// The built-in command types `tenax worker` and `tenax serve` can run.
pub(crate) const KNOWN: [&str; 4] = [
    BankOpenAccount::TYPE,
    Noop::TYPE,
    FlowStep::TYPE,
    Echo::TYPE,
];

impl BankArgs {
    pub(crate) fn registry(&self) -> anyhow::Result<Registry> {
        if !(0.0..=1.0).contains(&self.bank_failure_rate) {
            anyhow::bail!("--bank-failure-rate must be between 0 and 1");
        }
        let bank = Arc::new(FlakyBank::new(BankBehaviour {
            failure_rate: self.bank_failure_rate,
            latency: self.bank_latency,
        }));
        let mut registry = Registry::new();
        registry.register(BankOpenAccount {
            bank,
            retry: RetryPolicy::exponential(self.backoff_base, self.backoff_cap),
        })?;
        Ok(registry)
    }

    /// The demo registry plus the other built-ins, limited to `only` when not empty.
    pub(crate) fn registry_of(&self, only: &[String]) -> anyhow::Result<Registry> {
        if let Some(unknown) = only.iter().find(|c| !KNOWN.contains(&c.as_str())) {
            anyhow::bail!(
                "unknown built-in command {unknown:?} (known: {})",
                KNOWN.join(", ")
            );
        }
        let wanted = |name: &str| only.is_empty() || only.iter().any(|c| c == name);
        let mut registry = if wanted(BankOpenAccount::TYPE) {
            self.registry()?
        } else {
            Registry::new()
        };
        if wanted(Noop::TYPE) {
            registry.register(Noop)?;
        }
        if wanted(FlowStep::TYPE) {
            registry.register(FlowStep)?;
        }
        if wanted(Echo::TYPE) {
            registry.register(Echo)?;
        }
        Ok(registry)
    }
}

impl WorkerArgs {
    /// The worker settings: these flags (or their environment variables), else the
    /// configuration file, else the defaults.
    pub(crate) fn config(&self, file: &crate::config::WorkerFile) -> anyhow::Result<WorkerConfig> {
        crate::config::worker_config(
            file,
            (!self.queues.is_empty()).then(|| self.queues.clone()),
            self.concurrency,
            self.lease_ttl,
            self.poll_interval,
            self.shutdown_grace,
            self.retention,
        )
    }
}

impl WorkerArgs {
    /// Where to serve metrics: the flag (or its environment variable), else the file.
    pub(crate) fn metrics_addr(
        &self,
        file: &crate::config::WorkerFile,
    ) -> anyhow::Result<Option<std::net::SocketAddr>> {
        Ok(self.metrics_addr.or(file.metrics_addr))
    }

    /// Time between two database samples.
    pub(crate) fn metrics_sample_interval(
        &self,
        file: &crate::config::WorkerFile,
    ) -> anyhow::Result<Duration> {
        let interval = self
            .metrics_sample_interval
            .or(file.metrics_sample_interval)
            .unwrap_or(tenax::metrics::SAMPLE_INTERVAL_DEFAULT);
        if interval < Duration::from_millis(100) {
            anyhow::bail!(
                "metrics_sample_interval must be at least 100ms (it was {interval:?}): each sample is a query"
            );
        }
        Ok(interval)
    }
}

/// Cancelled on Ctrl-C or SIGTERM.
pub(crate) fn shutdown_on_signal() -> CancellationToken {
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

/// The tokens a scrape of the metrics address needs (`worker.metrics_require_token`):
/// every `[[server.tokens]]`, of which at least one may read; `None` when the
/// metrics are open.
pub(crate) fn metrics_tokens(
    file: &crate::config::FileConfig,
) -> anyhow::Result<Option<Vec<tenax_server::TokenConfig>>> {
    if !file.worker.metrics_require_token.unwrap_or(false) {
        return Ok(None);
    }
    let readers = file
        .server
        .tokens
        .iter()
        .filter(|t| t.role.may(tenax_server::Access::Read))
        .count();
    if readers == 0 {
        anyhow::bail!(
            "worker.metrics_require_token: no [[server.tokens]] with role read or admin could scrape the metrics (see `tenax token new`)"
        );
    }
    Ok(Some(file.server.tokens.clone()))
}

pub(crate) async fn run(
    database_url: &str,
    file: &crate::config::FileConfig,
    args: WorkerArgs,
) -> anyhow::Result<()> {
    let kinds = crate::kinds::Kinds::from_file(file)?;
    let metrics_tokens = metrics_tokens(file)?;
    let storage = tenax::storage::connect(database_url).await?;
    run_on(
        storage,
        &file.worker,
        metrics_tokens,
        &kinds,
        args,
        shutdown_on_signal(),
    )
    .await
}

/// Run a worker on an open storage until `shutdown` is cancelled (`tenax serve` shares
/// its storage with the API, so an enqueue wakes the worker at once). A scrape of its
/// metrics needs one of `metrics_tokens`, if any.
pub(crate) async fn run_on(
    mut storage: Arc<dyn tenax::storage::Storage>,
    file: &crate::config::WorkerFile,
    metrics_tokens: Option<Vec<tenax_server::TokenConfig>>,
    kinds: &crate::kinds::Kinds,
    args: WorkerArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let config = WorkerConfig {
        secrets: kinds.secrets.clone(),
        ..args.config(file)?
    };
    let metrics_addr = args.metrics_addr(file)?;
    let sample_interval = args.metrics_sample_interval(file)?;
    let sampler = CancellationToken::new();
    if let Some(addr) = metrics_addr {
        crate::observe::serve_metrics(addr, metrics_tokens)?;
        tracing::info!(%addr, "serving Prometheus metrics");
        storage = tenax::metrics::instrument(storage);
        tokio::spawn(tenax::metrics::sampler_loop(
            storage.clone(),
            sample_interval,
            sampler.clone(),
        ));
    }
    let mut registry = args.bank.registry_of(&args.commands)?;
    kinds.register(&mut registry)?;
    kinds.apply_retry(&mut registry)?;
    let deliveries = kinds.deliveries()?;
    let mut worker =
        Worker::new(storage, registry, config)?.with_service(std::sync::Arc::new(deliveries));
    if let Some(path) = &args.ledger {
        worker = worker.with_hook(Arc::new(tenax_ledger::Ledger::open(path).await?));
    }
    // The senders run beside the worker and stop after its last outcome is committed;
    // what is left in the outbox waits for the next sender.
    let ran = worker.run(shutdown).await;
    sampler.cancel();
    ran?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::config::WorkerFile;
    use crate::{Cli, Commands};

    fn args(argv: &[&str]) -> super::WorkerArgs {
        match Cli::try_parse_from(argv).unwrap().command {
            Commands::Worker(args) => args,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn metrics_settings_come_from_the_flag_else_the_file() {
        let file = WorkerFile {
            metrics_addr: Some("127.0.0.1:9464".parse().unwrap()),
            ..WorkerFile::default()
        };
        let flagged = args(&["tenax", "worker", "--metrics-addr", "127.0.0.1:9000"]);
        assert_eq!(
            flagged.metrics_addr(&file).unwrap(),
            Some("127.0.0.1:9000".parse().unwrap())
        );
        let plain = args(&["tenax", "worker"]);
        assert_eq!(
            plain.metrics_addr(&file).unwrap(),
            Some("127.0.0.1:9464".parse().unwrap())
        );
        assert_eq!(plain.metrics_addr(&WorkerFile::default()).unwrap(), None);
        assert_eq!(
            plain.metrics_sample_interval(&file).unwrap(),
            tenax::metrics::SAMPLE_INTERVAL_DEFAULT
        );
        let too_fast = args(&["tenax", "worker", "--metrics-sample-interval", "10ms"]);
        let err = too_fast
            .metrics_sample_interval(&file)
            .unwrap_err()
            .to_string();
        assert!(err.contains("metrics_sample_interval"), "{err}");
        assert!(Cli::try_parse_from(["tenax", "worker", "--metrics-addr", "nowhere"]).is_err());
    }
}
