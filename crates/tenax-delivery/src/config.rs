//! The configuration of outbound delivery, as written in `tenax.toml`: `[callbacks]`
//! and `[alerts]` (`[events]` is [`crate::events::EventsConfig`]). Durations are written
//! as text (`250ms`, `30s`, `5m`, `1day`).
use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
pub(crate) use tenax_kinds::config::{duration, duration_opt};
pub use tenax_kinds::ConfigError;

pub(crate) fn config_err(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::new(key, reason)
}

/// `[callbacks]`: completion callbacks to the `callback_url` a task carries.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallbacksConfig {
    /// Hosts a `callback_url` may name: `hooks.example.com`, `hooks.example.com:8443`
    /// or `*.example.com`. Empty: tasks cannot carry callbacks.
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// The HMAC-SHA256 key deliveries are signed with (at least 16 bytes). The
    /// environment variable `TENAX_CALLBACKS_SECRET` overrides it.
    pub secret: Option<String>,
    /// Longest one delivery attempt may take. Default 10s.
    #[serde(default = "ten_seconds", deserialize_with = "duration")]
    pub timeout: Duration,
    /// How long a callback is retried before it expires. Default 1 day.
    #[serde(default = "one_day", deserialize_with = "duration")]
    pub max_age: Duration,
    /// First retry delay, doubling per attempt (with jitter). Default 1s.
    #[serde(default = "one_second", deserialize_with = "duration")]
    pub backoff_base: Duration,
    /// Longest retry delay. Default 10m.
    #[serde(default = "ten_minutes", deserialize_with = "duration")]
    pub backoff_cap: Duration,
    /// Time between two looks for due deliveries when idle. Default 1s.
    #[serde(default = "one_second", deserialize_with = "duration")]
    pub poll_interval: Duration,
}

impl Default for CallbacksConfig {
    fn default() -> Self {
        Self {
            allow_hosts: Vec::new(),
            secret: None,
            timeout: ten_seconds(),
            max_age: one_day(),
            backoff_base: one_second(),
            backoff_cap: ten_minutes(),
            poll_interval: one_second(),
        }
    }
}

impl CallbacksConfig {
    /// Whether callbacks are on (some host is allowed).
    pub fn enabled(&self) -> bool {
        !self.allow_hosts.is_empty()
    }

    /// Check the settings: with hosts allowed, a secret is required.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !self.enabled() {
            return Ok(());
        }
        match &self.secret {
            Some(secret) if secret.len() >= 16 => {}
            _ => {
                return Err(config_err(
                    "callbacks.secret",
                    "callbacks are signed: set a secret of at least 16 bytes (or TENAX_CALLBACKS_SECRET)",
                ))
            }
        }
        check_delivery_timing(
            "callbacks",
            self.timeout,
            self.backoff_base,
            self.backoff_cap,
            self.poll_interval,
        )
    }
}

pub(crate) fn check_delivery_timing(
    table: &str,
    timeout: Duration,
    base: Duration,
    cap: Duration,
    poll: Duration,
) -> Result<(), ConfigError> {
    if timeout.is_zero() || timeout > Duration::from_secs(300) {
        return Err(config_err(format!("{table}.timeout"), "use 1ms to 5m"));
    }
    if base.is_zero() || cap < base {
        return Err(config_err(
            format!("{table}.backoff_cap"),
            "backoff_base must be above zero and backoff_cap at least backoff_base",
        ));
    }
    if poll < Duration::from_millis(10) || poll > Duration::from_secs(3600) {
        return Err(config_err(
            format!("{table}.poll_interval"),
            "use 10ms to 1h",
        ));
    }
    Ok(())
}

/// `[alerts]`: a webhook (Slack-style incoming-webhook JSON) told when tasks die and
/// when a queue's backlog or oldest due age passes its threshold.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertsConfig {
    /// Where alerts are POSTed. Without it, no alert is sent.
    pub webhook_url: Option<String>,
    /// How long deaths gather before a message is sent, so that a storm of deaths is
    /// summarised in a few messages. Default 5s.
    #[serde(default = "five_seconds", deserialize_with = "duration")]
    pub death_window: Duration,
    /// Deaths named one by one in a message; the rest are counted by command type.
    /// Default 10.
    #[serde(default = "ten")]
    pub death_listed: usize,
    /// Longest one delivery attempt may take. Default 10s.
    #[serde(default = "ten_seconds", deserialize_with = "duration")]
    pub timeout: Duration,
    /// How long an alert is retried before it is dropped. Default 1 day.
    #[serde(default = "one_day", deserialize_with = "duration")]
    pub max_age: Duration,
    /// First retry delay, doubling per attempt (with jitter). Default 1s.
    #[serde(default = "one_second", deserialize_with = "duration")]
    pub backoff_base: Duration,
    /// Longest retry delay. Default 5m.
    #[serde(default = "five_minutes", deserialize_with = "duration")]
    pub backoff_cap: Duration,
    /// Time between two looks for deaths when idle. Default 1s.
    #[serde(default = "one_second", deserialize_with = "duration")]
    pub poll_interval: Duration,
    /// `[alerts.queues.<name>]`: backlog and oldest-age thresholds per queue.
    #[serde(default)]
    pub queues: BTreeMap<String, crate::alerts::QueueThresholds>,
    /// Time between two checks of the thresholds. Default 30s.
    #[serde(default = "thirty_seconds", deserialize_with = "duration")]
    pub check_interval: Duration,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        Self {
            webhook_url: None,
            death_window: five_seconds(),
            death_listed: ten(),
            timeout: ten_seconds(),
            max_age: one_day(),
            backoff_base: one_second(),
            backoff_cap: five_minutes(),
            poll_interval: one_second(),
            queues: BTreeMap::new(),
            check_interval: thirty_seconds(),
        }
    }
}

impl AlertsConfig {
    /// Check the settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(url) = &self.webhook_url {
            tenax_core::outbound::url_origin(url)
                .map_err(|e| config_err("alerts.webhook_url", e.to_string()))?;
        }
        if self.death_window > Duration::from_secs(3600) {
            return Err(config_err("alerts.death_window", "use 0 to 1h"));
        }
        for queue in self.queues.keys() {
            tenax_core::QueueName::new(queue.clone())
                .map_err(|e| config_err(format!("alerts.queues.{queue}"), e.to_string()))?;
        }
        if self.check_interval < Duration::from_millis(10) {
            return Err(config_err("alerts.check_interval", "at least 10ms"));
        }
        if self.death_listed == 0 || self.death_listed > 100 {
            return Err(config_err("alerts.death_listed", "use 1 to 100"));
        }
        check_delivery_timing(
            "alerts",
            self.timeout,
            self.backoff_base,
            self.backoff_cap,
            self.poll_interval,
        )
    }
}

fn ten() -> usize {
    10
}
fn one_second() -> Duration {
    Duration::from_secs(1)
}
fn five_seconds() -> Duration {
    Duration::from_secs(5)
}
fn ten_seconds() -> Duration {
    Duration::from_secs(10)
}
fn thirty_seconds() -> Duration {
    Duration::from_secs(30)
}
fn five_minutes() -> Duration {
    Duration::from_secs(300)
}
fn ten_minutes() -> Duration {
    Duration::from_secs(600)
}
fn one_day() -> Duration {
    Duration::from_secs(24 * 3600)
}
