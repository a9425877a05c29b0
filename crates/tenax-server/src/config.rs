//! The server's settings and their validation.
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use crate::auth::Role;

/// One bearer token the server accepts: a name (the actor recorded in the audit
/// trail), a role, and the SHA-256 of the token (64 hex digits). Several tokens may
/// share a role, so a token can be rotated: add the new one, move clients, remove the
/// old one.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// Who uses it (`deploy-bot`, `billing-service`).
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// Hex of the SHA-256 of the token ([`hash_token`](crate::hash_token)).
    pub sha256: String,
}

/// Per-queue limits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueLimit {
    /// Enqueues into the queue answer 429 while it has this many tasks waiting
    /// (`pending` or `retrying`).
    pub max_pending: Option<u64>,
}

/// The largest `batch_max` accepted: a batch is inserted in one transaction, and its
/// answer holds every task.
pub const BATCH_MAX_LIMIT: usize = 10_000;

/// Everything [`router`](crate::router) needs besides the storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Where [`serve`](crate::serve) listens (the CLI binds it). Default `127.0.0.1:8080`.
    pub listen: SocketAddr,
    /// Largest request body in bytes (checked against `Content-Length` before reading,
    /// and while reading). Default 1 MiB.
    pub body_limit: usize,
    /// Command types `POST /v1/tasks` and schedules accept; any other is refused (422).
    pub command_types: BTreeSet<String>,
    /// Accepted bearer tokens. Empty means no authentication, which
    /// [`validate`](ServerConfig::validate) allows only on a loopback address.
    pub tokens: Vec<TokenConfig>,
    /// Limits per queue name.
    pub queues: BTreeMap<String, QueueLimit>,
    /// Secret payload fields per command type, masked in every answer, the dashboard
    /// and the event stream (see [`tenax_core::secrets`]).
    pub secrets: tenax_core::Secrets,
    /// Longest a `wait` long-poll may hold a request. Default 60 s.
    pub wait_max: Duration,
    /// Longest a request waits for the database (a pooled connection, then the call)
    /// before answering 503 with `Retry-After`. Default 5 s.
    pub db_timeout: Duration,
    /// Most tasks in one `POST /v1/tasks/batch` (and in one `POST /v1/workflows`),
    /// 1 to [`BATCH_MAX_LIMIT`]. Default 1,000.
    pub batch_max: usize,
    /// Hosts a task's `callback_url` may name (`hooks.example.com`,
    /// `hooks.example.com:8443`, `*.example.com`). Empty: a task with a `callback_url`
    /// is refused (422).
    pub callback_allow_hosts: Vec<String>,
    /// The targets of the `http` kind this deployment declares. When not empty, an
    /// `http` task naming another target is refused at enqueue (422).
    pub http_targets: BTreeSet<String>,
    /// The program names of the `exec` kind's allow-list. When not empty, an `exec` task
    /// naming another program is refused at enqueue (422).
    pub exec_programs: BTreeSet<String>,
    /// The attempt budget of a task of this command type enqueued without one (the
    /// `max_attempts` of `[retry."TYPE"]`); other types get
    /// [`CommandDefaults::STANDARD`](tenax_core::CommandDefaults::STANDARD)'s.
    pub max_attempts: BTreeMap<String, u32>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            body_limit: 1024 * 1024,
            command_types: BTreeSet::new(),
            tokens: Vec::new(),
            queues: BTreeMap::new(),
            secrets: tenax_core::Secrets::default(),
            wait_max: Duration::from_secs(60),
            db_timeout: Duration::from_secs(5),
            batch_max: 1000,
            callback_allow_hosts: Vec::new(),
            http_targets: BTreeSet::new(),
            exec_programs: BTreeSet::new(),
            max_attempts: BTreeMap::new(),
        }
    }
}

impl ServerConfig {
    /// The attempt budget of a task of `command_type` enqueued without one.
    pub fn max_attempts_of(&self, command_type: &str) -> u32 {
        self.max_attempts
            .get(command_type)
            .copied()
            .unwrap_or(tenax_core::CommandDefaults::STANDARD.max_attempts)
    }
}

/// Why a [`ServerConfig`] cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("server.{key}: {reason}")]
pub struct ConfigError {
    /// The key at fault, as written in `tenax.toml` under `[server]`.
    pub key: String,
    /// What is wrong and what to do.
    pub reason: String,
}

fn err(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.into(),
        reason: reason.into(),
    }
}

impl ServerConfig {
    /// Check every setting. Returns the warnings to log (serving without tokens on a
    /// loopback address), or the first error.
    pub fn validate(&self) -> Result<Vec<String>, ConfigError> {
        let mut warnings = Vec::new();
        if self.body_limit < 1024 || self.body_limit > 64 * 1024 * 1024 {
            return Err(err(
                "body_limit",
                format!(
                    "{} bytes: use 1 KiB to 64 MiB (default 1 MiB)",
                    self.body_limit
                ),
            ));
        }
        if self.command_types.is_empty() {
            return Err(err(
                "command_types",
                "no command type is accepted: list at least one (for example [\"echo\"])",
            ));
        }
        for t in &self.command_types {
            tenax_core::validate_command_type(t)
                .map_err(|e| err("command_types", format!("{t:?}: {e}")))?;
        }
        validate_tokens(&self.tokens)?;
        if self.tokens.is_empty() {
            if !self.listen.ip().is_loopback() {
                return Err(err(
                    "tokens",
                    format!(
                        "no token is configured and {} is not a loopback address: add [[server.tokens]] (see `tenax token new`) or listen on 127.0.0.1",
                        self.listen
                    ),
                ));
            }
            warnings.push(format!(
                "no [[server.tokens]] configured: every request on {} is accepted without authentication (loopback only)",
                self.listen
            ));
        }
        for (queue, limit) in &self.queues {
            tenax::QueueName::new(queue.clone())
                .map_err(|e| err(format!("queues.{queue}"), e.to_string()))?;
            if limit.max_pending == Some(0) {
                return Err(err(
                    format!("queues.{queue}.max_pending"),
                    "must be at least 1 (leave it out for no limit)",
                ));
            }
        }
        if self.wait_max.is_zero() || self.wait_max > Duration::from_secs(600) {
            return Err(err("wait_max", "use 1ms to 10m (default 60s)"));
        }
        if self.db_timeout < Duration::from_millis(10) || self.db_timeout > Duration::from_secs(120)
        {
            return Err(err("db_timeout", "use 10ms to 2m (default 5s)"));
        }
        if self.batch_max == 0 || self.batch_max > BATCH_MAX_LIMIT {
            return Err(err(
                "batch_max",
                format!("use 1 to {BATCH_MAX_LIMIT} (default 1000)"),
            ));
        }
        Ok(warnings)
    }
}

/// Check `[[server.tokens]]`: names of 1 to 100 characters, each unique, and hashes of
/// 64 hex digits, each unique.
pub(crate) fn validate_tokens(tokens: &[TokenConfig]) -> Result<(), ConfigError> {
    let mut names = BTreeSet::new();
    let mut hashes = BTreeSet::new();
    for (i, token) in tokens.iter().enumerate() {
        let key = format!("tokens[{i}]");
        if token.name.trim().is_empty() || token.name.len() > 100 {
            return Err(err(key, "name must be 1 to 100 characters"));
        }
        let hash = token.sha256.to_ascii_lowercase();
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(err(
                format!("{key}.sha256"),
                format!(
                    "token {:?}: expected 64 hex digits (the SHA-256 that `tenax token new` prints), never the token itself",
                    token.name
                ),
            ));
        }
        if !names.insert(token.name.clone()) {
            return Err(err(
                key,
                format!(
                    "two tokens are named {:?}: names identify actors in the audit trail",
                    token.name
                ),
            ));
        }
        if !hashes.insert(hash) {
            return Err(err(
                key,
                format!("token {:?} repeats the hash of another token", token.name),
            ));
        }
    }
    Ok(())
}
