//! The `http` kind: a task calls a target declared in the configuration.
//!
//! Payload: `{"target": "payments", "path": "/charges", "body": {...}, "headers": {...}}`
//! (only `target` is required). The request goes to the target's base URL followed by
//! `path`, which may not change its scheme or host (no `..`, `//`, `@`, `\`, scheme or
//! fragment), with the target's method, timeout and headers, the task's headers
//! (which cannot replace the target's), and `Idempotency-Key: <the task's key>`.
//!
//! 2xx: success, the result is `{"status": 200, "body": <JSON or text>}` (bounded).
//! 408, 429, 5xx, a timeout or a network error: retried (after `Retry-After` when the
//! receiver sends one). 3xx and other 4xx: permanent. An unknown target: permanent.
use std::collections::BTreeMap;
use std::sync::Arc;

use reqwest::header::{HeaderName, HeaderValue};
use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tenax_core::{Command, CommandError, RetryPolicy, TaskContext};

use crate::config::{ConfigError, HttpConfig, HttpTarget};
use crate::deliver;

/// The `http` kind's command type.
pub const TYPE: &str = "http";

/// Headers a task cannot set.
const RESERVED: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "idempotency-key",
];

/// A task of the `http` kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpPayload {
    /// The target's name in `[http.targets]`.
    pub target: String,
    /// Appended to the target's base URL (starting with `/`).
    #[serde(default)]
    pub path: Option<String>,
    /// The JSON body (none: an empty body).
    #[serde(default)]
    pub body: Option<Value>,
    /// Extra headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// The method a configuration names.
pub(crate) fn method(name: &str) -> Result<Method, String> {
    match name.to_ascii_uppercase().as_str() {
        "GET" => Ok(Method::GET),
        "POST" => Ok(Method::POST),
        "PUT" => Ok(Method::PUT),
        "PATCH" => Ok(Method::PATCH),
        "DELETE" => Ok(Method::DELETE),
        other => Err(format!(
            "{other:?} is not one of GET, POST, PUT, PATCH, DELETE"
        )),
    }
}

/// A header name and value, checked.
pub(crate) fn header_pair(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), String> {
    let header = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("{name:?} is not a header name"))?;
    let value =
        HeaderValue::from_str(value).map_err(|_| format!("the value of {name} is not valid"))?;
    Ok((header, value))
}

/// Check a path suffix: empty, or `/...` that cannot leave the base URL's host.
pub(crate) fn check_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Ok(());
    }
    if !path.starts_with('/') {
        return Err("a path starts with /".into());
    }
    if path.len() > 2048 {
        return Err("a path is at most 2048 bytes".into());
    }
    let bad = path.contains("//")
        || path.contains('@')
        || path.contains('\\')
        || path.contains('#')
        || path.contains("://")
        || path.chars().any(|c| c.is_control() || c.is_whitespace())
        || path.split(['/', '?']).any(|segment| {
            segment == ".." || segment == "." || segment.eq_ignore_ascii_case("%2e%2e")
        })
        || path.to_ascii_lowercase().contains("%2f")
        || path.to_ascii_lowercase().contains("%5c");
    if bad {
        return Err(format!(
            "path {:?} may not contain //, @, \\, #, a scheme, . or .. segments, or encoded slashes",
            path.chars().take(100).collect::<String>()
        ));
    }
    Ok(())
}

/// The URL a payload asks for under `target`, checked to stay on the target's origin.
pub fn resolve_url(target: &HttpTarget, path: Option<&str>) -> Result<String, String> {
    let path = path.unwrap_or("");
    check_path(path)?;
    let url = format!("{}{path}", target.base_url.trim_end_matches('/'));
    let want = tenax_core::outbound::url_origin(&target.base_url).map_err(|e| e.to_string())?;
    let got = tenax_core::outbound::url_origin(&url).map_err(|e| e.to_string())?;
    if want != got {
        return Err(format!("path {path:?} would leave the target's host"));
    }
    Ok(url)
}

/// The `http` command: register it with the targets it may call.
#[derive(Clone)]
pub struct HttpKind {
    config: Arc<HttpConfig>,
    client: reqwest::Client,
}

impl HttpKind {
    /// A handler for these targets (validated here).
    pub fn new(config: HttpConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        // Each request carries its target's timeout; this one only bounds a target
        // whose timeout was raised past an hour (refused by validate).
        let client = deliver::client(std::time::Duration::from_secs(3600)).map_err(|e| {
            crate::config::config_err("http", format!("cannot build an HTTP client: {e}"))
        })?;
        Ok(Self {
            config: Arc::new(config),
            client,
        })
    }

    fn target(&self, name: &str) -> Result<&HttpTarget, CommandError> {
        self.config.targets.get(name).ok_or_else(|| {
            CommandError::permanent(format!(
                "unknown http target {:?} (configured: {})",
                name.chars().take(100).collect::<String>(),
                self.config
                    .targets
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
    }

    async fn call(
        &self,
        target: &HttpTarget,
        method_name: &str,
        path: Option<&str>,
        payload: &HttpPayload,
        task: &TaskContext,
    ) -> Result<Value, CommandError> {
        let url = resolve_url(target, path).map_err(CommandError::permanent)?;
        let method = method(method_name).map_err(CommandError::permanent)?;
        let mut request = self
            .client
            .request(method, &url)
            .timeout(target.timeout)
            .header("Idempotency-Key", task.idempotency_key());
        for (name, value) in &payload.headers {
            if RESERVED.contains(&name.to_ascii_lowercase().as_str())
                || target.headers.keys().any(|h| h.eq_ignore_ascii_case(name))
            {
                return Err(CommandError::permanent(format!(
                    "header {name:?} cannot be set by a task"
                )));
            }
            let (name, value) = header_pair(name, value).map_err(CommandError::permanent)?;
            request = request.header(name, value);
        }
        for (name, value) in &target.headers {
            let (name, value) = header_pair(name, value).map_err(CommandError::permanent)?;
            request = request.header(name, value);
        }
        if let Some(body) = &payload.body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_string());
        }
        let mut response = match request.send().await {
            Ok(response) => response,
            Err(e) => {
                return Err(CommandError::retryable(format!(
                    "{url}: {}",
                    deliver::error_chain(&e)
                )))
            }
        };
        let status = response.status();
        let after = deliver::retry_after(response.headers());
        // The body, bounded: read at most max_response bytes.
        let max = self.config.max_response;
        let mut bytes = Vec::new();
        let mut truncated = false;
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    let room = max.saturating_sub(bytes.len());
                    if chunk.len() > room {
                        bytes.extend_from_slice(&chunk[..room]);
                        truncated = true;
                        break;
                    }
                    bytes.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(e) if status.is_success() => {
                    return Err(CommandError::retryable(format!(
                        "{url}: reading the response: {}",
                        deliver::error_chain(&e)
                    )))
                }
                Err(_) => break,
            }
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if status.is_success() {
            let body = if truncated {
                Value::String(text)
            } else {
                serde_json::from_slice(&bytes).unwrap_or(Value::String(text))
            };
            let mut result = serde_json::json!({"status": status.as_u16(), "body": body});
            if truncated {
                result["truncated"] = Value::Bool(true);
            }
            return Ok(result);
        }
        let snippet: String = text.chars().take(500).collect();
        let message = format!("{url}: HTTP {status}: {snippet}");
        let retryable = status == StatusCode::REQUEST_TIMEOUT
            || status == StatusCode::TOO_MANY_REQUESTS
            || status.is_server_error();
        match (retryable, after) {
            (true, Some(after)) => Err(CommandError::retry_after(after, message)),
            (true, None) => Err(CommandError::retryable(message)),
            (false, _) => Err(CommandError::permanent(message)),
        }
    }
}

impl Command for HttpKind {
    const TYPE: &'static str = TYPE;
    type Context = HttpPayload;
    type Output = Value;

    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::exponential(self.config.backoff_base, self.config.backoff_cap)
    }

    async fn execute(&self, ctx: HttpPayload, task: &TaskContext) -> Result<Value, CommandError> {
        let target = self.target(&ctx.target)?;
        self.call(target, &target.method, ctx.path.as_deref(), &ctx, task)
            .await
    }

    async fn compensate(&self, ctx: HttpPayload, task: &TaskContext) -> Result<(), CommandError> {
        let target = self.target(&ctx.target)?;
        let Some(compensate) = &target.compensate else {
            return Err(CommandError::NoCompensation);
        };
        self.call(
            target,
            &compensate.method,
            Some(&compensate.path),
            &ctx,
            task,
        )
        .await
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(base: &str) -> HttpTarget {
        HttpTarget {
            base_url: base.into(),
            method: "POST".into(),
            headers: BTreeMap::new(),
            timeout: std::time::Duration::from_secs(1),
            compensate: None,
        }
    }

    #[test]
    fn a_path_cannot_leave_the_target() {
        let t = target("https://api.example.com/v1/");
        assert_eq!(
            resolve_url(&t, Some("/charges?x=1")).as_deref(),
            Ok("https://api.example.com/v1/charges?x=1")
        );
        assert_eq!(
            resolve_url(&t, None).as_deref(),
            Ok("https://api.example.com/v1")
        );
        for bad in [
            "charges",
            "//evil.com/x",
            "/../admin",
            "/a/../../b",
            "/%2e%2e/x",
            "/a%2Fb",
            "@evil.com",
            "/x@evil.com",
            "/x\\y",
            "/http://evil.com",
            "/a b",
            "/a#b",
            "/./a",
        ] {
            assert!(resolve_url(&t, Some(bad)).is_err(), "{bad}");
        }
        let port = target("http://127.0.0.1:8080");
        assert!(resolve_url(&port, Some(":9999/x")).is_err());
    }
}
