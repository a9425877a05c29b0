//! Logs and metrics of the `tenax` process: the log format (`--log-format text|json`)
//! and the Prometheus exporter that `tenax worker --metrics-addr` serves.
//!
//! The exporter is a recorder plus a handle that renders the exposition text; here it
//! is served by the exporter's own HTTP listener on its own port. A process that serves
//! HTTP itself renders the same handle on a route of its own instead.
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;
use tracing::error;

/// How log lines are written on standard error.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LogFormat {
    /// Human-readable lines: `LEVEL span{fields}: message fields`.
    #[default]
    Text,
    /// One JSON object per line, with the current span's fields (`span`) and every
    /// enclosing span (`spans`).
    Json,
}

impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

/// Log to standard error at `default` level (or `TENAX_LOG`, an `EnvFilter`), in
/// `format`. Inside a task, the worker's `task` span adds `task.id`, `task.no`,
/// `command.type`, `task.kind`, `attempt` and `epoch` to every line.
pub(crate) fn init_tracing(default: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TENAX_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only on a terminal: a file or a log collector gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    // A second initialisation (in tests) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
}

/// Install the Prometheus recorder for this process and serve it on `addr` (the
/// exposition is at any path, `/metrics` by convention). Every Tenax metric is
/// described, histograms use Tenax's buckets.
pub(crate) fn serve_metrics(addr: SocketAddr) -> anyhow::Result<PrometheusHandle> {
    let (recorder, exporter) = tenax::metrics::prometheus_builder()?
        .with_http_listener(addr)
        .build()
        .with_context(|| format!("cannot serve metrics on {addr}"))?;
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)
        .map_err(|e| anyhow::anyhow!("a metrics recorder is already installed: {e}"))?;
    tenax::metrics::describe();
    tokio::spawn(async move {
        if let Err(e) = exporter.await {
            error!(error = ?e, "the metrics listener stopped");
        }
    });
    // Keeps the recorder's histogram storage bounded between scrapes.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}
