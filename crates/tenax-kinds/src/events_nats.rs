//! The NATS JetStream relay of task events.
//!
//! One node at a time holds the relay's database lease (`relay:nats`); it reads the
//! sequenced events after its cursor, publishes them one at a time in position order
//! with a JetStream publish acknowledgement, and moves its cursor (fenced on the
//! lease's epoch) after each acknowledged batch. Each message carries the event's id
//! as `Nats-Msg-Id`, so JetStream drops the copy a relay republishes after a crash
//! or a lost acknowledgement. A broker outage delays events and loses none: the
//! cursor stays where the last acknowledgement left it, and the pruner keeps every
//! event the relay has not delivered.
use std::time::Duration;

/// The `[events.nats]` settings.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsConfig {
    /// The server, e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    /// The JetStream stream the relay publishes into (created when missing, holding
    /// `<subject_prefix>.>`). Defaults to `TENAX_EVENTS`.
    #[serde(default = "NatsConfig::stream_default")]
    pub stream: String,
    /// Events go to `<subject_prefix>.<queue>.<event>`. Defaults to `tenax.events`.
    #[serde(default = "NatsConfig::subject_prefix_default")]
    pub subject_prefix: String,
    /// Longest wait for one publish acknowledgement. Defaults to 5 s.
    #[serde(
        default = "NatsConfig::ack_timeout_default",
        deserialize_with = "crate::config::duration"
    )]
    pub ack_timeout: Duration,
}

impl NatsConfig {
    /// The relay's lease name, also its name in the pruner's list.
    pub const LEASE: &'static str = "relay:nats";

    fn stream_default() -> String {
        "TENAX_EVENTS".to_owned()
    }
    fn subject_prefix_default() -> String {
        "tenax.events".to_owned()
    }
    fn ack_timeout_default() -> Duration {
        Duration::from_secs(5)
    }

    /// Check the settings.
    pub fn validate(&self) -> Result<(), crate::ConfigError> {
        let bad = |key: &str, why: &str| {
            Err(crate::config::config_err(format!("events.nats.{key}"), why))
        };
        if !(self.url.starts_with("nats://") || self.url.starts_with("tls://"))
            || self.url.len() <= "nats://".len()
        {
            return bad("url", "must be a nats:// or tls:// address");
        }
        let stream_ok = !self.stream.is_empty()
            && self.stream.len() <= 64
            && self
                .stream
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !stream_ok {
            return bad("stream", "must be 1 to 64 of A-Z a-z 0-9 _ -");
        }
        let prefix_ok = !self.subject_prefix.is_empty()
            && self.subject_prefix.split('.').all(|t| {
                !t.is_empty()
                    && t.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            });
        if !prefix_ok {
            return bad(
                "subject_prefix",
                "must be dot-separated tokens of A-Z a-z 0-9 _ - (no wildcards)",
            );
        }
        if self.ack_timeout.is_zero() || self.ack_timeout > Duration::from_secs(60) {
            return bad("ack_timeout", "must be above zero and at most 60s");
        }
        Ok(())
    }

    /// The subject of an event of `queue`: characters a subject token cannot hold
    /// become `_`.
    pub fn subject(&self, queue: &str, event: &str) -> String {
        let token = |s: &str| -> String {
            let t: String = s
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            if t.is_empty() {
                "_".to_owned()
            } else {
                t
            }
        };
        format!("{}.{}.{}", self.subject_prefix, token(queue), token(event))
    }
}

#[cfg(feature = "nats")]
pub use relay::NatsRelay;

#[cfg(feature = "nats")]
mod relay {
    use std::sync::Arc;
    use std::time::Duration;

    use async_nats::jetstream;
    use tenax_storage::{
        EventCursorParams, EventLease, EventLeaseParams, EventListParams, Storage,
    };
    use tokio::time::Instant;
    use tokio_util::sync::CancellationToken;

    use super::NatsConfig;
    use crate::events::EventsConfig;

    /// Publishes sequenced events to JetStream while it holds the `relay:nats` lease.
    pub struct NatsRelay {
        storage: Arc<dyn Storage>,
        holder: String,
        events: EventsConfig,
        nats: NatsConfig,
    }

    enum Step {
        /// Published this many events.
        Sent(usize),
        /// The lease is gone.
        LostLease,
    }

    impl NatsRelay {
        /// A relay for this node (`holder` names it in the lease).
        pub fn new(
            storage: Arc<dyn Storage>,
            holder: impl Into<String>,
            events: EventsConfig,
            nats: NatsConfig,
        ) -> Self {
            Self {
                storage,
                holder: holder.into(),
                events,
                nats,
            }
        }

        /// Run until `shutdown`. Broker and storage errors are logged and retried
        /// after a pause; the cursor only moves past acknowledged events.
        pub async fn run(self, shutdown: CancellationToken) {
            let mut js: Option<jetstream::Context> = None;
            let mut lease: Option<EventLease> = None;
            let mut renewed_at = Instant::now();
            loop {
                if lease.is_none() || renewed_at.elapsed() >= self.events.lease_ttl / 3 {
                    let asked = Instant::now();
                    match self
                        .storage
                        .event_lease(&EventLeaseParams {
                            name: NatsConfig::LEASE.to_owned(),
                            holder: self.holder.clone(),
                            ttl: self.events.lease_ttl,
                            now: None,
                        })
                        .await
                    {
                        Ok(Some(held)) => {
                            if lease.as_ref().map(|l| l.epoch) != Some(held.epoch) {
                                tracing::info!(epoch = held.epoch, "holding the NATS relay lease");
                            }
                            lease = Some(held);
                            renewed_at = asked;
                        }
                        Ok(None) => lease = None,
                        Err(e) => {
                            tracing::warn!(error = %e, "taking the NATS relay lease failed");
                            lease = None;
                        }
                    }
                }
                let mut busy = false;
                let mut failed = false;
                let mut lost = false;
                if let Some(held) = lease.as_mut() {
                    if js.is_none() {
                        match self.connect().await {
                            Ok(context) => js = Some(context),
                            Err(e) => {
                                tracing::warn!(error = %e, "connecting to NATS failed; retrying");
                                failed = true;
                            }
                        }
                    }
                    if let Some(context) = &js {
                        match self.step(context, held, renewed_at).await {
                            Ok(Step::Sent(n)) => busy = n >= self.events.batch as usize,
                            Ok(Step::LostLease) => {
                                tracing::info!("the NATS relay lease was lost");
                                lost = true;
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "relaying events to NATS failed; retrying");
                                failed = true;
                            }
                        }
                    }
                }
                if lost {
                    lease = None;
                }
                let pause = if busy {
                    Duration::ZERO
                } else if failed {
                    Duration::from_secs(1)
                } else if lease.is_some() {
                    self.events.poll_interval
                } else {
                    self.events.lease_ttl / 3
                };
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }

        async fn connect(&self) -> Result<jetstream::Context, String> {
            let client = async_nats::ConnectOptions::new()
                .retry_on_initial_connect()
                .connection_timeout(Duration::from_secs(5))
                .connect(self.nats.url.as_str())
                .await
                .map_err(|e| e.to_string())?;
            let mut context = jetstream::new(client);
            context.set_timeout(self.nats.ack_timeout);
            context
                .get_or_create_stream(jetstream::stream::Config {
                    name: self.nats.stream.clone(),
                    subjects: vec![format!("{}.>", self.nats.subject_prefix)],
                    ..Default::default()
                })
                .await
                .map_err(|e| format!("creating stream {}: {e}", self.nats.stream))?;
            Ok(context)
        }

        /// Publish the next page after the cursor, one event at a time, and move the
        /// cursor (and `lease.last_seq`) past the acknowledged ones.
        async fn step(
            &self,
            js: &jetstream::Context,
            lease: &mut EventLease,
            renewed_at: Instant,
        ) -> Result<Step, String> {
            let page = self
                .storage
                .event_list(&EventListParams {
                    after: lease.last_seq,
                    limit: self.events.batch,
                    ..Default::default()
                })
                .await
                .map_err(|e| e.to_string())?;
            if page.pruned_through > lease.last_seq {
                tracing::error!(
                    cursor = lease.last_seq,
                    pruned_through = page.pruned_through,
                    "events were pruned before the NATS relay delivered them"
                );
            }
            let mut last = lease.last_seq;
            let mut sent = 0usize;
            let mut failure = None;
            for event in &page.events {
                // Stop publishing before the lease could lapse under us.
                if renewed_at.elapsed() >= self.events.lease_ttl * 2 / 3 {
                    break;
                }
                let Some(seq) = event.seq else { break };
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(async_nats::header::NATS_MESSAGE_ID, event.event_id.as_str());
                let body = match serde_json::to_vec(&event.envelope(&self.events.secrets)) {
                    Ok(body) => body,
                    Err(e) => {
                        failure = Some(format!("encoding event {}: {e}", event.event_id));
                        break;
                    }
                };
                let subject = self.nats.subject(&event.queue, event.event.as_str());
                let acked = match js.publish_with_headers(subject, headers, body.into()).await {
                    Ok(ack) => ack.await.map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                if let Err(e) = acked {
                    failure = Some(e);
                    break;
                }
                last = seq;
                sent += 1;
            }
            if last > lease.last_seq {
                let held = self
                    .storage
                    .event_cursor_advance(&EventCursorParams {
                        lease: lease.clone(),
                        last_seq: last,
                        now: None,
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                if !held {
                    return Ok(Step::LostLease);
                }
                lease.last_seq = last;
                metrics::counter!("tenax_events_relayed_total", "relay" => "nats")
                    .increment(sent as u64);
            }
            match failure {
                Some(e) => Err(e),
                None => Ok(Step::Sent(sent)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::NatsConfig;
    use crate::events::EventsConfig;

    fn parse(text: &str) -> Result<EventsConfig, String> {
        let config: EventsConfig = serde_json::from_str(text).map_err(|e| e.to_string())?;
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    #[test]
    fn the_nats_table_takes_defaults_and_refuses_bad_values() {
        let config = parse(r#"{"nats": {"url": "nats://127.0.0.1:4222"}}"#).unwrap();
        let nats = config.nats.clone().unwrap();
        assert_eq!(nats.stream, "TENAX_EVENTS");
        assert_eq!(nats.subject_prefix, "tenax.events");
        assert_eq!(config.relays(), vec![NatsConfig::LEASE.to_owned()]);
        assert!(EventsConfig::default().relays().is_empty());
        assert_eq!(
            nats.subject("billing.eu *>", "succeeded"),
            "tenax.events.billing_eu___.succeeded"
        );
        for (bad, key) in [
            (r#"{"url": "http://x"}"#, "events.nats.url"),
            (
                r#"{"url": "nats://x", "stream": "a.b"}"#,
                "events.nats.stream",
            ),
            (
                r#"{"url": "nats://x", "subject_prefix": "a.>"}"#,
                "events.nats.subject_prefix",
            ),
            (
                r#"{"url": "nats://x", "subject_prefix": "a..b"}"#,
                "events.nats.subject_prefix",
            ),
            (
                r#"{"url": "nats://x", "ack_timeout": "0s"}"#,
                "events.nats.ack_timeout",
            ),
        ] {
            let err = parse(&format!(r#"{{"nats": {bad}}}"#)).unwrap_err();
            assert!(err.contains(key), "{bad}: {err}");
        }
        assert!(parse(r#"{"nats": {"url": "nats://x", "extra": 1}}"#).is_err());
    }
}
