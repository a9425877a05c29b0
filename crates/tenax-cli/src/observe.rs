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

fn env_filter(default: &str) -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_env("TENAX_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default))
}

/// Log to standard error at `default` level (or `TENAX_LOG`, an `EnvFilter`), in
/// `format`. Inside a task, the worker's `task` span adds `task.id`, `task.no`,
/// `command.type`, `task.kind`, `attempt` and `epoch` to every line. With the `otel`
/// feature and `OTEL_EXPORTER_OTLP_ENDPOINT` set, spans are also exported over OTLP.
pub(crate) fn init_tracing(default: &str, format: LogFormat) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    // Colours only on a terminal: a file or a log collector gets plain text.
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .boxed(),
    };
    // One global filter in front of every layer. (Per-layer filters inside a `Vec` of
    // layers lost events after their callsite's first hit.)
    let subscriber = tracing_subscriber::registry()
        .with(env_filter(default))
        .with(fmt);
    #[cfg(feature = "otel")]
    let subscriber = subscriber.with(match otel::layer() {
        Ok(layer) => layer,
        Err(e) => {
            eprintln!("warning: OpenTelemetry export is off: {e:#}");
            None
        }
    });
    // A second initialisation (in tests) keeps the first subscriber.
    let _ = subscriber.try_init();
}

/// Flush what is still buffered for export (a no-op without the `otel` feature).
pub(crate) fn shutdown() {
    #[cfg(feature = "otel")]
    otel::shutdown();
}

/// OpenTelemetry export of spans over OTLP/HTTP (feature `otel`), configured by the
/// standard `OTEL_*` variables; on only when `OTEL_EXPORTER_OTLP_ENDPOINT` or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set.
#[cfg(feature = "otel")]
mod otel {
    use std::sync::OnceLock;

    use anyhow::Context;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::registry::LookupSpan;

    static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

    pub(super) fn layer<S>() -> anyhow::Result<Option<impl tracing_subscriber::Layer<S>>>
    where
        S: tracing::Subscriber + for<'span> LookupSpan<'span>,
    {
        let configured = [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ]
        .iter()
        .any(|var| std::env::var_os(var).is_some_and(|v| !v.is_empty()));
        if !configured {
            return Ok(None);
        }
        // The blocking HTTP client must be built outside the async runtime.
        let exporter = std::thread::spawn(|| {
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .build()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("building the OTLP exporter panicked"))?
        .context("cannot build the OTLP span exporter")?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name("tenax")
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("tenax");
        let _ = PROVIDER.set(provider);
        Ok(Some(tracing_opentelemetry::layer().with_tracer(tracer)))
    }

    pub(super) fn shutdown() {
        if let Some(provider) = PROVIDER.get() {
            if let Err(e) = provider.shutdown() {
                eprintln!("warning: flushing OpenTelemetry spans failed: {e}");
            }
        }
    }
}

/// A metrics listener running until it fails.
type Serving = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

/// Install the Prometheus recorder for this process and serve it on `addr` (the
/// exposition is at any path, `/metrics` by convention), to anyone, or with `tokens`
/// only to a bearer of one whose role may read. Every Tenax metric is described,
/// histograms use Tenax's buckets.
pub(crate) fn serve_metrics(
    addr: SocketAddr,
    tokens: Option<Vec<tenax_server::TokenConfig>>,
) -> anyhow::Result<PrometheusHandle> {
    let builder = tenax::metrics::prometheus_builder()?;
    let cannot_serve = || format!("cannot serve metrics on {addr}");
    // The recorder, and the listener that serves what it renders.
    let (recorder, served): (_, Serving) = match tokens {
        None => {
            let (recorder, exporter) = builder
                .with_http_listener(addr)
                .build()
                .with_context(cannot_serve)?;
            (
                recorder,
                Box::pin(async move { exporter.await.map_err(|e| format!("{e:?}")) }),
            )
        }
        Some(tokens) => {
            let listener = std::net::TcpListener::bind(addr)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .and_then(tokio::net::TcpListener::from_std)
                .with_context(cannot_serve)?;
            let recorder = builder.build_recorder();
            let render = recorder.handle();
            let served = async move {
                tenax_server::serve_metrics(
                    listener,
                    move || render.render(),
                    &tokens,
                    tokio_util::sync::CancellationToken::new(),
                )
                .await
                .map_err(|e| e.to_string())
            };
            (recorder, Box::pin(served))
        }
    };
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)
        .map_err(|e| anyhow::anyhow!("a metrics recorder is already installed: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = served.await {
            error!(error = %e, "the metrics listener stopped");
        }
    });
    tenax::metrics::describe();
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
