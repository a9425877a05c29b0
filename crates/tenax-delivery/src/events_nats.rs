//! The NATS JetStream relay of task events: its settings and its [`crate::relay::Broker`].
//!
//! One node at a time holds the relay's database lease (`relay:nats`); it reads the
//! sequenced events after its cursor, publishes them one at a time in position order
//! with a JetStream publish acknowledgement, and moves its cursor (fenced on the
//! lease's epoch) past the acknowledged ones ([`crate::relay`]). Each message carries the event's id
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

/// The NATS JetStream relay: [`crate::relay::Relay`] over [`Nats`].
#[cfg(feature = "nats")]
pub type NatsRelay = crate::relay::Relay<Nats>;

#[cfg(feature = "nats")]
pub use broker::Nats;

#[cfg(feature = "nats")]
mod broker {
    use std::time::Duration;

    use async_nats::jetstream;
    use tenax_core::Secrets;
    use tenax_storage::EventRecord;
    use tokio::time::Instant;

    use super::NatsConfig;
    use crate::relay::{Broker, Published};

    /// NATS JetStream's part of the relay: a stream holding `<subject_prefix>.>`, and
    /// each event published with its id as `Nats-Msg-Id` and awaited for its
    /// acknowledgement before the next.
    pub struct Nats {
        config: NatsConfig,
    }

    impl From<NatsConfig> for Nats {
        fn from(config: NatsConfig) -> Self {
            Self { config }
        }
    }

    impl Broker for Nats {
        const NAME: &'static str = "nats";
        const LEASE: &'static str = NatsConfig::LEASE;
        type Link = jetstream::Context;

        async fn connect(&self) -> Result<jetstream::Context, String> {
            let nats = &self.config;
            // No retry on the first connect: it would go on in a task of its own after
            // a failed page drops this client, one more for every reconnect of the
            // relay. The relay backs off and connects again instead.
            let client = async_nats::ConnectOptions::new()
                .connection_timeout(Duration::from_secs(5))
                .connect(nats.url.as_str())
                .await
                .map_err(|e| e.to_string())?;
            let mut context = jetstream::new(client);
            context.set_timeout(nats.ack_timeout);
            context
                .get_or_create_stream(jetstream::stream::Config {
                    name: nats.stream.clone(),
                    subjects: vec![format!("{}.>", nats.subject_prefix)],
                    ..Default::default()
                })
                .await
                .map_err(|e| format!("creating stream {}: {e}", nats.stream))?;
            Ok(context)
        }

        async fn publish(
            &self,
            js: &jetstream::Context,
            events: &[EventRecord],
            secrets: &Secrets,
            until: Instant,
        ) -> Published {
            let mut published = Published::default();
            for event in events {
                if Instant::now() >= until {
                    break;
                }
                let Some(seq) = event.seq else { break };
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(async_nats::header::NATS_MESSAGE_ID, event.event_id.as_str());
                let body = match serde_json::to_vec(&event.envelope(secrets)) {
                    Ok(body) => body,
                    Err(e) => {
                        published.failure = Some(format!("encoding event {}: {e}", event.event_id));
                        break;
                    }
                };
                let subject = self.config.subject(&event.queue, event.event.as_str());
                let acked = match js.publish_with_headers(subject, headers, body.into()).await {
                    Ok(ack) => ack.await.map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                if let Err(e) = acked {
                    published.failure = Some(e);
                    break;
                }
                published.last = Some(seq);
                published.sent += 1;
            }
            published
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
