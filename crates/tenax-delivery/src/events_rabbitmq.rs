//! The RabbitMQ (AMQP 0-9-1) relay of task events.
//!
//! One node at a time holds the relay's database lease (`relay:rabbitmq`); it reads
//! the sequenced events after its cursor and publishes a page of them, in position
//! order, on one channel in publisher-confirm mode: persistent, `mandatory`, with the
//! event's id as `message_id`. The cursor moves (fenced on the lease's epoch) only
//! once the broker positively confirmed every message of the page. A negative
//! confirm, a returned (unroutable) message, a confirm that does not come in time or
//! a lost connection leave the cursor where it was: the relay drops the connection,
//! backs off, reconnects and publishes again from the cursor. A broker outage thus
//! delays events and loses none; a consumer can see a message twice after such a
//! retry and deduplicates on `message_id`.
use std::time::Duration;

/// The `[events.rabbitmq]` settings.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RabbitMqConfig {
    /// The broker, e.g. `amqp://guest:guest@127.0.0.1:5672/%2f` (or `amqps://`).
    pub url: String,
    /// The durable topic exchange the relay declares and publishes to. Defaults to
    /// `tenax.events`.
    #[serde(default = "RabbitMqConfig::exchange_default")]
    pub exchange: String,
    /// Events are routed with `<routing_key_prefix>.<queue>.<event>`. Defaults to
    /// `tenax.events`.
    #[serde(default = "RabbitMqConfig::routing_key_prefix_default")]
    pub routing_key_prefix: String,
    /// A durable quorum queue the relay declares and binds with
    /// `<routing_key_prefix>.#`, so events are kept before any consumer exists.
    /// None by default.
    #[serde(default)]
    pub queue: Option<String>,
    /// Longest wait for the broker's confirms of one published page. Defaults to 5 s.
    #[serde(
        default = "RabbitMqConfig::confirm_timeout_default",
        deserialize_with = "crate::config::duration"
    )]
    pub confirm_timeout: Duration,
}

/// Longest AMQP short string (exchange and queue names, routing keys).
const SHORT_STRING_MAX: usize = 255;

impl RabbitMqConfig {
    /// The relay's lease name, also its name in the pruner's list.
    pub const LEASE: &'static str = "relay:rabbitmq";
    /// Default of [`RabbitMqConfig::exchange`].
    pub const EXCHANGE_DEFAULT: &'static str = "tenax.events";
    /// Default of [`RabbitMqConfig::routing_key_prefix`].
    pub const ROUTING_KEY_PREFIX_DEFAULT: &'static str = "tenax.events";
    /// Default of [`RabbitMqConfig::confirm_timeout`].
    pub const CONFIRM_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

    fn exchange_default() -> String {
        Self::EXCHANGE_DEFAULT.to_owned()
    }
    fn routing_key_prefix_default() -> String {
        Self::ROUTING_KEY_PREFIX_DEFAULT.to_owned()
    }
    fn confirm_timeout_default() -> Duration {
        Self::CONFIRM_TIMEOUT_DEFAULT
    }

    /// A configuration for `url` with every other setting at its default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            exchange: Self::exchange_default(),
            routing_key_prefix: Self::routing_key_prefix_default(),
            queue: None,
            confirm_timeout: Self::CONFIRM_TIMEOUT_DEFAULT,
        }
    }

    /// Check the settings.
    pub fn validate(&self) -> Result<(), crate::ConfigError> {
        let bad = |key: &str, why: &str| {
            Err(crate::config::config_err(
                format!("events.rabbitmq.{key}"),
                why,
            ))
        };
        let host_part = self
            .url
            .strip_prefix("amqp://")
            .or_else(|| self.url.strip_prefix("amqps://"));
        match host_part {
            Some(rest) if !rest.is_empty() && !rest.starts_with('/') => {}
            _ => return bad("url", "must be an amqp:// or amqps:// address with a host"),
        }
        if self.url.chars().any(char::is_whitespace) {
            return bad("url", "must not contain spaces");
        }
        // Names the broker accepts: A-Z a-z 0-9 - _ . : and at most 255 bytes;
        // `amq.` is reserved for the broker's own.
        let name_ok = |name: &str| {
            !name.is_empty()
                && name.len() <= 127
                && !name.starts_with("amq.")
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
        };
        if !name_ok(&self.exchange) {
            return bad(
                "exchange",
                "must be 1 to 127 of A-Z a-z 0-9 - _ . : and not start with `amq.`",
            );
        }
        let prefix_ok = !self.routing_key_prefix.is_empty()
            && self.routing_key_prefix.len() <= 127
            && self.routing_key_prefix.split('.').all(|t| {
                !t.is_empty()
                    && t.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            });
        if !prefix_ok {
            return bad(
                "routing_key_prefix",
                "must be at most 127 characters of dot-separated words of A-Z a-z 0-9 _ - (no wildcards)",
            );
        }
        if let Some(queue) = &self.queue {
            if !name_ok(queue) {
                return bad(
                    "queue",
                    "must be 1 to 127 of A-Z a-z 0-9 - _ . : and not start with `amq.`",
                );
            }
        }
        if self.confirm_timeout.is_zero() || self.confirm_timeout > Duration::from_secs(60) {
            return bad("confirm_timeout", "must be above zero and at most 60s");
        }
        Ok(())
    }

    /// The routing key of an event of `queue`: characters a routing-key word cannot
    /// hold become `_`, and the key is cut to the 255 bytes AMQP allows.
    pub fn routing_key(&self, queue: &str, event: &str) -> String {
        let word = |s: &str| -> String {
            let w: String = s
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            if w.is_empty() {
                "_".to_owned()
            } else {
                w
            }
        };
        let event = word(event);
        let mut queue = word(queue);
        // Keep the prefix and the event word whole: cut the queue's word instead.
        let room = SHORT_STRING_MAX
            .saturating_sub(self.routing_key_prefix.len() + event.len() + 2)
            .max(1);
        queue.truncate(room);
        let mut key = format!("{}.{}.{}", self.routing_key_prefix, queue, event);
        // Only ASCII remains, so cutting at any byte keeps the string valid.
        key.truncate(SHORT_STRING_MAX);
        key
    }

    /// The binding key of the optional queue: every event under the prefix.
    pub fn binding_key(&self) -> String {
        format!("{}.#", self.routing_key_prefix)
    }

    /// The url without its user information, for logs.
    pub fn redacted_url(&self) -> String {
        let (scheme, rest) = match self.url.split_once("://") {
            Some(parts) => parts,
            None => return "<invalid>".to_owned(),
        };
        let rest = match rest.rsplit_once('@') {
            Some((_, host)) => host,
            None => rest,
        };
        format!("{scheme}://{rest}")
    }
}

/// The RabbitMQ relay: [`crate::relay::Relay`] over [`RabbitMq`].
#[cfg(feature = "rabbitmq")]
pub type RabbitMqRelay = crate::relay::Relay<RabbitMq>;

#[cfg(feature = "rabbitmq")]
pub use broker::RabbitMq;

#[cfg(feature = "rabbitmq")]
mod broker {
    use std::time::Duration;

    use lapin::options::{
        BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
        QueueDeclareOptions,
    };
    use lapin::types::{AMQPValue, FieldTable};
    use lapin::{
        BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
    };
    use tenax_core::Secrets;
    use tenax_storage::EventRecord;
    use tokio::time::Instant;

    use super::RabbitMqConfig;
    use crate::relay::{Broker, Published};

    /// Longest wait for a connection and its topology.
    const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

    /// RabbitMQ's part of the relay: a durable topic exchange (and optionally a bound
    /// quorum queue), a channel in publisher-confirm mode, a page published whole and
    /// counted only once every message of it is positively confirmed.
    pub struct RabbitMq {
        config: RabbitMqConfig,
    }

    impl From<RabbitMqConfig> for RabbitMq {
        fn from(config: RabbitMqConfig) -> Self {
            Self { config }
        }
    }

    /// A connection and its confirm-mode channel.
    pub struct Link {
        connection: Connection,
        channel: Channel,
    }

    impl Broker for RabbitMq {
        const NAME: &'static str = "rabbitmq";
        const LEASE: &'static str = RabbitMqConfig::LEASE;
        type Link = Link;

        async fn connect(&self) -> Result<Link, String> {
            tokio::time::timeout(CONNECT_TIMEOUT, self.connect_inner())
                .await
                .unwrap_or_else(|_| Err(format!("no connection within {CONNECT_TIMEOUT:?}")))
        }

        fn usable(&self, link: &Link) -> bool {
            link.connection.status().connected() && link.channel.status().connected()
        }

        async fn close(&self, link: Link) {
            let _ = tokio::time::timeout(
                Duration::from_secs(1),
                link.connection.close(200, "tenax relay reconnects".into()),
            )
            .await;
        }

        async fn publish(
            &self,
            link: &Link,
            events: &[EventRecord],
            secrets: &Secrets,
            until: Instant,
        ) -> Published {
            match self.publish_page(link, events, secrets, until).await {
                Ok((last, sent)) => Published {
                    last,
                    sent,
                    failure: None,
                },
                // The page counts whole or not at all: it is published again.
                Err(e) => Published {
                    failure: Some(e),
                    ..Published::default()
                },
            }
        }
    }

    impl RabbitMq {
        async fn connect_inner(&self) -> Result<Link, String> {
            let rabbit = &self.config;
            let connection = Connection::connect(
                &rabbit.url,
                ConnectionProperties::default().with_connection_name("tenax events relay".into()),
            )
            .await
            .map_err(|e| format!("connecting to {}: {e}", rabbit.redacted_url()))?;
            let channel = connection
                .create_channel()
                .await
                .map_err(|e| format!("opening a channel: {e}"))?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(|e| format!("turning on publisher confirms: {e}"))?;
            channel
                .exchange_declare(
                    rabbit.exchange.as_str().into(),
                    ExchangeKind::Topic,
                    ExchangeDeclareOptions {
                        durable: true,
                        ..ExchangeDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(|e| format!("declaring exchange {}: {e}", rabbit.exchange))?;
            if let Some(queue) = &rabbit.queue {
                let mut arguments = FieldTable::default();
                arguments.insert(
                    "x-queue-type".into(),
                    AMQPValue::LongString("quorum".into()),
                );
                channel
                    .queue_declare(
                        queue.as_str().into(),
                        QueueDeclareOptions {
                            durable: true,
                            ..QueueDeclareOptions::default()
                        },
                        arguments,
                    )
                    .await
                    .map_err(|e| format!("declaring queue {queue}: {e}"))?;
                channel
                    .queue_bind(
                        queue.as_str().into(),
                        rabbit.exchange.as_str().into(),
                        rabbit.binding_key().into(),
                        QueueBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .map_err(|e| format!("binding queue {queue}: {e}"))?;
            }
            Ok(Link {
                connection,
                channel,
            })
        }

        /// Publish the page (in position order, on one channel, so the broker keeps
        /// that order), then wait for every confirm: the position of the last event
        /// and how many were published, once all are confirmed.
        async fn publish_page(
            &self,
            link: &Link,
            events: &[EventRecord],
            secrets: &Secrets,
            until: Instant,
        ) -> Result<(Option<i64>, usize), String> {
            let rabbit = &self.config;
            let mut last = None;
            let mut pending = Vec::with_capacity(events.len());
            for event in events {
                if Instant::now() >= until {
                    break;
                }
                let Some(seq) = event.seq else { break };
                let body = serde_json::to_vec(&event.envelope(secrets))
                    .map_err(|e| format!("encoding event {}: {e}", event.event_id))?;
                let mut properties = BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_content_type("application/json".into())
                    .with_message_id(event.event_id.as_str().into())
                    .with_type(event.event.as_str().into())
                    .with_app_id("tenax".into());
                if let Ok(secs) = u64::try_from(event.occurred_at.timestamp()) {
                    properties = properties.with_timestamp(secs);
                }
                let routing_key = rabbit.routing_key(&event.queue, event.event.as_str());
                // A blocked connection (a broker out of memory or disk) must not hold
                // the relay forever.
                let publish = link.channel.basic_publish(
                    rabbit.exchange.as_str().into(),
                    routing_key.into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &body,
                    properties,
                );
                let confirm = tokio::time::timeout(rabbit.confirm_timeout, publish)
                    .await
                    .map_err(|_| {
                        format!(
                            "publishing event {} took longer than {:?}",
                            event.event_id, rabbit.confirm_timeout
                        )
                    })?
                    .map_err(|e| format!("publishing event {}: {e}", event.event_id))?;
                pending.push((seq, event.event_id.as_str(), confirm));
            }
            let sent = pending.len();
            let deadline = Instant::now() + rabbit.confirm_timeout;
            for (seq, id, confirm) in pending {
                let confirmation = tokio::time::timeout_at(deadline, confirm)
                    .await
                    .map_err(|_| {
                        format!(
                            "no confirm for event {id} within {:?}",
                            rabbit.confirm_timeout
                        )
                    })?
                    .map_err(|e| format!("confirm of event {id}: {e}"))?;
                match confirmation {
                    Confirmation::Ack(None) => last = Some(seq),
                    Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
                        return Err(format!(
                            "event {id} was returned unroutable ({} {})",
                            returned.reply_code, returned.reply_text
                        ));
                    }
                    Confirmation::Nack(None) => {
                        return Err(format!("the broker refused event {id} (nack)"));
                    }
                    Confirmation::NotRequested => {
                        return Err("the channel is not in confirm mode".to_owned());
                    }
                }
            }
            Ok((last, sent))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::RabbitMqConfig;
    use crate::events::EventsConfig;

    fn parse(text: &str) -> Result<EventsConfig, String> {
        let config: EventsConfig = serde_json::from_str(text).map_err(|e| e.to_string())?;
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    #[test]
    fn the_rabbitmq_table_takes_defaults() {
        let config = parse(r#"{"rabbitmq": {"url": "amqp://127.0.0.1:5672/%2f"}}"#).unwrap();
        let rabbit = config.rabbitmq.clone().unwrap();
        assert_eq!(rabbit, RabbitMqConfig::new("amqp://127.0.0.1:5672/%2f"));
        assert_eq!(rabbit.exchange, "tenax.events");
        assert_eq!(rabbit.routing_key_prefix, "tenax.events");
        assert_eq!(rabbit.queue, None);
        assert_eq!(rabbit.confirm_timeout, Duration::from_secs(5));
        assert_eq!(config.relays(), vec![RabbitMqConfig::LEASE.to_owned()]);
        assert_eq!(rabbit.binding_key(), "tenax.events.#");
        assert_eq!(
            rabbit.routing_key("billing.eu *#", "succeeded"),
            "tenax.events.billing_eu___.succeeded"
        );
        let long = rabbit.routing_key(&"q".repeat(400), "succeeded");
        assert_eq!(long.len(), 255);
        assert!(long.ends_with(".succeeded"), "{long}");

        let both = parse(
            r#"{"nats": {"url": "nats://x"}, "rabbitmq": {"url": "amqps://u:secret@mq.example.com/vh",
                "exchange": "ex", "routing_key_prefix": "a.b", "queue": "tenax-events",
                "confirm_timeout": "60s"}}"#,
        )
        .unwrap();
        assert_eq!(
            both.relays(),
            vec!["relay:nats".to_owned(), "relay:rabbitmq".to_owned()]
        );
        let rabbit = both.rabbitmq.unwrap();
        assert_eq!(rabbit.queue.as_deref(), Some("tenax-events"));
        assert_eq!(rabbit.redacted_url(), "amqps://mq.example.com/vh");
        assert_eq!(rabbit.routing_key("q", "dead"), "a.b.q.dead");
    }

    #[test]
    fn the_rabbitmq_table_refuses_each_bad_value() {
        for (bad, key) in [
            (r#"{"url": "http://x"}"#, "events.rabbitmq.url"),
            (r#"{"url": "amqp://"}"#, "events.rabbitmq.url"),
            (r#"{"url": "amqp:///vhost"}"#, "events.rabbitmq.url"),
            (r#"{"url": "amqp://a b"}"#, "events.rabbitmq.url"),
            (
                r#"{"url": "amqp://x", "exchange": ""}"#,
                "events.rabbitmq.exchange",
            ),
            (
                r#"{"url": "amqp://x", "exchange": "amq.topic"}"#,
                "events.rabbitmq.exchange",
            ),
            (
                r#"{"url": "amqp://x", "exchange": "a b"}"#,
                "events.rabbitmq.exchange",
            ),
            (
                r#"{"url": "amqp://x", "routing_key_prefix": "a.#"}"#,
                "events.rabbitmq.routing_key_prefix",
            ),
            (
                r#"{"url": "amqp://x", "routing_key_prefix": "a..b"}"#,
                "events.rabbitmq.routing_key_prefix",
            ),
            (
                r#"{"url": "amqp://x", "routing_key_prefix": ""}"#,
                "events.rabbitmq.routing_key_prefix",
            ),
            (
                r#"{"url": "amqp://x", "queue": ""}"#,
                "events.rabbitmq.queue",
            ),
            (
                r#"{"url": "amqp://x", "queue": "amq.q"}"#,
                "events.rabbitmq.queue",
            ),
            (
                r#"{"url": "amqp://x", "confirm_timeout": "0s"}"#,
                "events.rabbitmq.confirm_timeout",
            ),
            (
                r#"{"url": "amqp://x", "confirm_timeout": "61s"}"#,
                "events.rabbitmq.confirm_timeout",
            ),
        ] {
            let err = parse(&format!(r#"{{"rabbitmq": {bad}}}"#)).unwrap_err();
            assert!(err.contains(key), "{bad}: {err}");
        }
        let long = format!(r#"{{"url": "amqp://x", "queue": "{}"}}"#, "q".repeat(128));
        let err = parse(&format!(r#"{{"rabbitmq": {long}}}"#)).unwrap_err();
        assert!(err.contains("events.rabbitmq.queue"), "{err}");
        for unknown in [
            r#"{"rabbitmq": {"url": "amqp://x", "extra": 1}}"#,
            r#"{"rabbitmq": {"exchange": "x"}}"#,
            r#"{"rabbitmq": {"url": "amqp://x", "confirm_timeout": "soon"}}"#,
        ] {
            assert!(parse(unknown).is_err(), "{unknown}");
        }
    }
}
