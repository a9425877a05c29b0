//! What callbacks and alerts share: the retry delay, one signed POST with its outcome,
//! and the record that a sender runs. The HTTP client is [`tenax_kinds::outbound`]'s.
use std::time::{Duration, Instant};

use rand::Rng;
use reqwest::header::{HeaderValue, CONTENT_TYPE};
use reqwest::StatusCode;

use tenax_kinds::outbound::{error_chain, retry_after};
use tenax_storage::{OutboxKind, OutboxSendersParams, Storage, OUTBOX_SENDER_REFRESH};

use crate::sign;

/// The delay before attempt `attempts + 1`: `base * 2^(attempts-1)`, capped, with
/// equal jitter (between half of it and all of it).
pub(crate) fn backoff(attempts: u32, base: Duration, cap: Duration) -> Duration {
    let exp = attempts.saturating_sub(1).min(30);
    let ceiling = base.saturating_mul(1u32 << exp).min(cap);
    let half = ceiling / 2;
    let jitter = rand::rng().random_range(0..=half.as_millis().min(u128::from(u64::MAX)) as u64);
    half + Duration::from_millis(jitter)
}

/// Count settled outbox rows in `tenax_deliveries_total` (listed in the catalogue
/// `tenax_runtime::metrics::METRICS`).
pub(crate) fn count(
    kind: tenax_storage::OutboxKind,
    outcome: &tenax_storage::OutboxOutcome,
    rows: u64,
) {
    let outcome = match outcome {
        tenax_storage::OutboxOutcome::Delivered => "delivered",
        tenax_storage::OutboxOutcome::Retry { .. } => "retried",
        tenax_storage::OutboxOutcome::Expire { .. } => "expired",
    };
    metrics::counter!("tenax_deliveries_total", "kind" => kind.as_str(), "outcome" => outcome)
        .increment(rows);
}

/// How one POST ended.
pub(crate) enum Posted {
    /// 2xx.
    Acknowledged,
    /// Anything else: the error, and the receiver's `Retry-After` if it sent one.
    Failed(String, Option<Duration>),
}

/// POST `body` to `url`, signed when a secret is given, under `delivery_id`.
pub(crate) async fn post(
    client: &reqwest::Client,
    url: &str,
    body: &str,
    delivery_id: &str,
    secret: Option<&[u8]>,
) -> Posted {
    let timestamp = chrono::Utc::now().timestamp();
    let mut request = client
        .post(url)
        .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
        .header(sign::DELIVERY_ID_HEADER, delivery_id)
        .header(sign::TIMESTAMP_HEADER, timestamp.to_string());
    if let Some(secret) = secret {
        request = request.header(
            sign::SIGNATURE_HEADER,
            sign::signature(secret, timestamp, body.as_bytes()),
        );
    }
    match request.body(body.to_owned()).send().await {
        Ok(response) if response.status().is_success() => Posted::Acknowledged,
        Ok(response) => {
            let status = response.status();
            let after = if status == StatusCode::TOO_MANY_REQUESTS
                || status == StatusCode::SERVICE_UNAVAILABLE
            {
                retry_after(response.headers())
            } else {
                None
            };
            Posted::Failed(format!("HTTP {status}"), after)
        }
        Err(e) => Posted::Failed(error_chain(&e), None),
    }
}

/// A sender's record that it runs ([`Storage::outbox_senders_seen`]), renewed every
/// [`OUTBOX_SENDER_REFRESH`]: a `death` row is written only while a death sender is
/// recorded, and only recorded kinds count as deliveries waiting.
pub(crate) struct Presence {
    kinds: Vec<OutboxKind>,
    recorded: Option<Instant>,
}

impl Presence {
    pub(crate) fn new(kinds: Vec<OutboxKind>) -> Self {
        Self {
            kinds,
            recorded: None,
        }
    }

    /// Record the kinds if the last record is older than the refresh interval; a
    /// failure is logged and tried again on the next call.
    pub(crate) async fn renew(&mut self, storage: &dyn Storage) {
        if self
            .recorded
            .is_some_and(|at| at.elapsed() < OUTBOX_SENDER_REFRESH)
        {
            return;
        }
        if let Err(e) = record_senders(storage, &self.kinds).await {
            tracing::warn!(error = %e, kinds = ?self.kinds, "recording this sender failed; retrying");
            return;
        }
        self.recorded = Some(Instant::now());
    }
}

/// Record once that a sender of `kinds` runs.
pub(crate) async fn record_senders(
    storage: &dyn Storage,
    kinds: &[OutboxKind],
) -> Result<(), tenax_storage::StorageError> {
    storage
        .outbox_senders_seen(&OutboxSendersParams {
            kinds: kinds.to_vec(),
            now: None,
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_cap() {
        let base = Duration::from_secs(1);
        let cap = Duration::from_secs(60);
        for _ in 0..100 {
            let first = backoff(1, base, cap);
            assert!(
                first >= Duration::from_millis(500) && first <= base,
                "{first:?}"
            );
            let fourth = backoff(4, base, cap);
            assert!(fourth >= Duration::from_secs(4) && fourth <= Duration::from_secs(8));
            let late = backoff(40, base, cap);
            assert!(late >= Duration::from_secs(30) && late <= cap, "{late:?}");
        }
    }
}
