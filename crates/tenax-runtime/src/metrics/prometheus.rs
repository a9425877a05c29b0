//! The Prometheus exporter's configuration (feature `prometheus`).
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};

use super::{MetricKind, BATCH_BUCKETS, METRICS, SECONDS_BUCKETS};

/// A Prometheus exporter builder with Tenax's histogram buckets (so histograms are
/// exposed as histograms, from which any percentile follows). Add a listener
/// (`with_http_listener`) or build a recorder and render its handle wherever the
/// process serves HTTP.
pub fn prometheus_builder() -> Result<PrometheusBuilder, BuildError> {
    let mut builder = PrometheusBuilder::new();
    for m in METRICS.iter().filter(|m| m.kind == MetricKind::Histogram) {
        let buckets = if m.unit == "seconds" {
            SECONDS_BUCKETS
        } else {
            BATCH_BUCKETS
        };
        builder = builder.set_buckets_for_metric(Matcher::Full(m.name.to_owned()), buckets)?;
    }
    Ok(builder)
}
