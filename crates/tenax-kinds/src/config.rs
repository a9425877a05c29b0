//! The configuration of the built-in kinds, as written in `tenax.toml`:
//! `[http.targets.<name>]` and `[exec]`; and what every table of Tenax's outbound
//! configuration shares: [`ConfigError`], and durations written as text (`250ms`,
//! `30s`, `5m`, `1day`).
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A configuration value that cannot work, with the key at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct ConfigError {
    /// The key, as written in `tenax.toml`.
    pub key: String,
    /// What is wrong and what to do.
    pub reason: String,
}

impl ConfigError {
    /// The error of `key`, for `reason`.
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

pub(crate) fn config_err(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::new(key, reason)
}

fn parse_duration<'de, D: Deserializer<'de>>(text: &str) -> Result<Duration, D::Error> {
    humantime::parse_duration(text).map_err(|e| {
        serde::de::Error::custom(format!(
            "{text:?} is not a duration ({e}; examples: 250ms, 30s, 5m)"
        ))
    })
}

/// A duration written as text (`250ms`, `30s`, `5m`, `1day`), for
/// `#[serde(deserialize_with = "...")]`.
pub fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    parse_duration::<D>(&text)
}

/// An optional duration written as text, for `#[serde(default, deserialize_with = "...")]`.
pub fn duration_opt<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    duration_map(deserializer)
}

fn duration_map<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    Option::<String>::deserialize(deserializer)?
        .map(|t| parse_duration::<D>(&t))
        .transpose()
}

/// `[http]`: the endpoints tasks of the `http` kind may call, by name.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// `[http.targets.<name>]`.
    #[serde(default)]
    pub targets: BTreeMap<String, HttpTarget>,
    /// Largest response body kept as the task's result, in bytes (the rest is cut).
    /// Default 64 KiB.
    #[serde(default = "HttpConfig::max_response_default")]
    pub max_response: usize,
    /// First retry delay of a failed call, doubling per attempt (full jitter). A
    /// `Retry-After` from the target replaces it. Default 1s.
    #[serde(default = "one_second", deserialize_with = "duration")]
    pub backoff_base: Duration,
    /// Longest retry delay. Default 10m.
    #[serde(default = "ten_minutes", deserialize_with = "duration")]
    pub backoff_cap: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            targets: BTreeMap::new(),
            max_response: Self::max_response_default(),
            backoff_base: one_second(),
            backoff_cap: ten_minutes(),
        }
    }
}

impl HttpConfig {
    fn max_response_default() -> usize {
        64 * 1024
    }

    /// Check every target.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_response == 0 || self.max_response > 16 * 1024 * 1024 {
            return Err(config_err("http.max_response", "use 1 byte to 16 MiB"));
        }
        if self.backoff_base.is_zero() || self.backoff_cap < self.backoff_base {
            return Err(config_err(
                "http.backoff_cap",
                "backoff_base must be above zero and backoff_cap at least backoff_base",
            ));
        }
        for (name, target) in &self.targets {
            let key = format!("http.targets.{name}");
            tenax_core::validate_command_type(name)
                .map_err(|e| config_err(&key, format!("invalid target name: {e}")))?;
            tenax_core::outbound::url_origin(&target.base_url)
                .map_err(|e| config_err(format!("{key}.base_url"), e.to_string()))?;
            if target.base_url.contains(['?', '#']) {
                return Err(config_err(
                    format!("{key}.base_url"),
                    "no query or fragment in a base URL",
                ));
            }
            crate::http::method(&target.method)
                .map_err(|e| config_err(format!("{key}.method"), e))?;
            for (header, value) in &target.headers {
                crate::http::header_pair(header, value)
                    .map_err(|e| config_err(format!("{key}.headers.{header}"), e))?;
            }
            if target.timeout.is_zero() || target.timeout > Duration::from_secs(3600) {
                return Err(config_err(format!("{key}.timeout"), "use 1ms to 1h"));
            }
            if let Some(c) = &target.compensate {
                crate::http::check_path(&c.path)
                    .map_err(|e| config_err(format!("{key}.compensate.path"), e))?;
                crate::http::method(&c.method)
                    .map_err(|e| config_err(format!("{key}.compensate.method"), e))?;
            }
        }
        Ok(())
    }
}

/// One named endpoint of the `http` kind.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpTarget {
    /// Scheme, host, port and path prefix (`https://payments.internal/api`). A task's
    /// `path` is appended to it and can never change its scheme or host.
    pub base_url: String,
    /// Method. Default `POST`.
    #[serde(default = "post")]
    pub method: String,
    /// Headers sent on every request (for example an `Authorization`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Longest a request may take. Default 30s.
    #[serde(default = "thirty_seconds", deserialize_with = "duration")]
    pub timeout: Duration,
    /// The request that undoes a dead task's call, sent with the same body and
    /// `Idempotency-Key`. Without it a dead `http` task has no compensation.
    pub compensate: Option<HttpCompensate>,
}

/// `[http.targets.<name>.compensate]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpCompensate {
    /// Path appended to the target's base URL.
    pub path: String,
    /// Method. Default `POST`.
    #[serde(default = "post")]
    pub method: String,
}

fn post() -> String {
    "POST".to_owned()
}

fn thirty_seconds() -> Duration {
    Duration::from_secs(30)
}

/// `[exec]`: the programs tasks of the `exec` kind may run. Without `allow` the kind
/// is not registered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecConfig {
    /// Program names tasks use, each with the absolute path it runs.
    #[serde(default)]
    pub allow: BTreeMap<String, PathBuf>,
    /// Exit codes that mean the task cannot succeed (it dies at once); any other
    /// non-zero code is retried.
    #[serde(default)]
    pub permanent_exit_codes: Vec<i32>,
    /// Longest a run may take; then it is killed and the attempt retried. Default 60s.
    #[serde(default, deserialize_with = "duration_map")]
    pub timeout: Option<Duration>,
    /// Most bytes of standard output and of standard error kept each, up to 1 MiB.
    /// Default 64 KiB.
    pub max_output: Option<usize>,
    /// Names of the worker's environment variables every run receives (`PATH`,
    /// `LANG`, ...). Every other variable is withheld. Default: none.
    #[serde(default)]
    pub env: Vec<String>,
    /// The working directory of every run. Default: the temporary directory.
    pub working_dir: Option<PathBuf>,
    /// First retry delay of a failed run, doubling per attempt (full jitter).
    /// Default 1s.
    #[serde(default, deserialize_with = "duration_map")]
    pub backoff_base: Option<Duration>,
    /// Longest retry delay. Default 10m.
    #[serde(default, deserialize_with = "duration_map")]
    pub backoff_cap: Option<Duration>,
}

impl ExecConfig {
    /// Default for [`timeout`](Self::timeout).
    pub const TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
    /// Default for [`max_output`](Self::max_output).
    pub const MAX_OUTPUT_DEFAULT: usize = 64 * 1024;
    /// Largest [`max_output`](Self::max_output) allowed: 1 MiB.
    pub const MAX_OUTPUT_LIMIT: usize = 1024 * 1024;

    /// Check the allow-list and bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, path) in &self.allow {
            tenax_core::validate_command_type(name)
                .map_err(|e| config_err("exec.allow", format!("{name:?}: {e}")))?;
            if !path.is_absolute() {
                return Err(config_err(
                    format!("exec.allow.{name}"),
                    format!("{} is not an absolute path", path.display()),
                ));
            }
            // The exact path that runs: no `..` or `.` that would make the entry
            // say one file and run another.
            if path.components().any(|c| {
                matches!(
                    c,
                    std::path::Component::ParentDir | std::path::Component::CurDir
                )
            }) || path.to_string_lossy().contains("/./")
            {
                return Err(config_err(
                    format!("exec.allow.{name}"),
                    format!("{} holds `..` or `.`: give the plain path", path.display()),
                ));
            }
        }
        let timeout = self.timeout.unwrap_or(Self::TIMEOUT_DEFAULT);
        if timeout.is_zero() || timeout > Duration::from_secs(24 * 3600) {
            return Err(config_err("exec.timeout", "use 1ms to 24h"));
        }
        let base = self.backoff_base.unwrap_or(Duration::from_secs(1));
        if base.is_zero() || self.backoff_cap.is_some_and(|cap| cap < base) {
            return Err(config_err(
                "exec.backoff_cap",
                "backoff_base must be above zero and backoff_cap at least backoff_base",
            ));
        }
        let max = self.max_output.unwrap_or(Self::MAX_OUTPUT_DEFAULT);
        if max == 0 || max > Self::MAX_OUTPUT_LIMIT {
            return Err(config_err(
                "exec.max_output",
                "use 1 byte to 1 MiB (1048576)",
            ));
        }
        for name in &self.env {
            let mut chars = name.chars();
            let valid = chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
                && name.len() <= 128;
            if !valid {
                return Err(config_err(
                    "exec.env",
                    format!(
                        "{:?} is not a variable name (letters, digits and _, not first a digit)",
                        name.chars().take(130).collect::<String>()
                    ),
                ));
            }
        }
        Ok(())
    }
}

fn one_second() -> Duration {
    Duration::from_secs(1)
}
fn ten_minutes() -> Duration {
    Duration::from_secs(600)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_allow_list_paths_with_dot_segments_are_refused() {
        let with = |path: &str| ExecConfig {
            allow: [("sh".to_owned(), PathBuf::from(path))]
                .into_iter()
                .collect(),
            permanent_exit_codes: Vec::new(),
            timeout: None,
            max_output: None,
            env: Vec::new(),
            working_dir: None,
            backoff_base: None,
            backoff_cap: None,
        };
        assert!(with("/bin/sh").validate().is_ok());
        for bad in [
            "/bin/../bin/sh",
            "/usr/bin/../../bin/sh",
            "/bin/./sh",
            "bin/sh",
            "sh",
        ] {
            let err = with(bad).validate().unwrap_err().to_string();
            assert!(err.contains("exec.allow.sh"), "{bad}: {err}");
        }
    }
}
