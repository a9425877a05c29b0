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
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use reqwest::{Method, StatusCode, Url};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tenax_core::{Command, CommandError, RetryPolicy, TaskContext};

use crate::config::{ConfigError, HttpConfig, HttpTarget};
use crate::outbound;

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

/// Check a path suffix: empty, or `/...` that can only add segments under the base
/// URL's path. The same check as the HTTP API's at enqueue
/// ([`tenax_core::outbound::check_task_path`]).
pub(crate) fn check_path(path: &str) -> Result<(), String> {
    tenax_core::outbound::check_task_path(path).map_err(|e| e.to_string())
}

/// The URL a payload asks for under `target`: the path checked, then the URL as the
/// URL library resolves it checked to stay under the target's base URL.
pub fn resolve_url(target: &HttpTarget, path: Option<&str>) -> Result<Url, String> {
    let path = path.unwrap_or("");
    check_path(path)?;
    let url = format!("{}{path}", target.base_url.trim_end_matches('/'));
    let url = Url::parse(&url).map_err(|e| format!("path {path:?} makes no URL: {e}"))?;
    stays_under(&target.base_url, &url)?;
    Ok(url)
}

/// Whether `url`, as parsed, is on the origin of `base_url` and at or under its path
/// (`/api` covers `/api` and `/api/...`, not `/apix`). The last check before a request
/// is sent.
pub fn stays_under(base_url: &str, url: &Url) -> Result<(), String> {
    let base = Url::parse(base_url).map_err(|e| format!("base URL {base_url:?}: {e}"))?;
    let leave = || {
        Err(format!(
            "{:?} is not under the target's base URL {base_url:?}",
            url.as_str().chars().take(200).collect::<String>()
        ))
    };
    if url.origin() != base.origin()
        || url.scheme() != base.scheme()
        || !url.username().is_empty()
        || url.password().is_some()
        || url.fragment().is_some()
    {
        return leave();
    }
    let prefix = base.path().trim_end_matches('/');
    let path = url.path();
    let under = match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    };
    if !under {
        return leave();
    }
    Ok(())
}

/// The headers of a request: `Content-Type: application/json` when there is a body,
/// then the task's headers (which replace that default; a name given twice, in any
/// case, is refused), then the target's, then the idempotency key. Each name is sent
/// once.
fn request_headers(
    target: &HttpTarget,
    payload: &HttpPayload,
    key: &str,
) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::new();
    if payload.body.is_some() {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    let mut given = HashSet::new();
    for (name, value) in &payload.headers {
        let lower = name.to_ascii_lowercase();
        if RESERVED.contains(&lower.as_str())
            || target.headers.keys().any(|h| h.eq_ignore_ascii_case(name))
        {
            return Err(format!("header {name:?} cannot be set by a task"));
        }
        if !given.insert(lower) {
            return Err(format!("header {name:?} is given twice"));
        }
        let (name, value) = header_pair(name, value)?;
        headers.insert(name, value);
    }
    for (name, value) in &target.headers {
        let (name, value) = header_pair(name, value)?;
        headers.insert(name, value);
    }
    let key =
        HeaderValue::from_str(key).map_err(|_| "the idempotency key is not a header value")?;
    headers.insert(HeaderName::from_static("idempotency-key"), key);
    Ok(headers)
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
        let client = outbound::client(std::time::Duration::from_secs(3600)).map_err(|e| {
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
        let headers = request_headers(target, payload, task.idempotency_key())
            .map_err(CommandError::permanent)?;
        let mut request = self
            .client
            .request(method, url.clone())
            .timeout(target.timeout)
            .headers(headers);
        if let Some(body) = &payload.body {
            request = request.body(body.to_string());
        }
        let request = request.build().map_err(|e| {
            CommandError::permanent(format!("{url}: {}", outbound::error_chain(&e)))
        })?;
        // The last check before sending: the URL the request carries is under the
        // target's base URL.
        stays_under(&target.base_url, request.url()).map_err(CommandError::permanent)?;
        let mut response = match self.client.execute(request).await {
            Ok(response) => response,
            Err(e) => {
                return Err(CommandError::retryable(format!(
                    "{url}: {}",
                    outbound::error_chain(&e)
                )))
            }
        };
        let status = response.status();
        let after = outbound::retry_after(response.headers());
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
                        outbound::error_chain(&e)
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

    fn resolved(t: &HttpTarget, path: Option<&str>) -> Result<String, String> {
        resolve_url(t, path).map(String::from)
    }

    #[test]
    fn a_path_cannot_leave_the_target() {
        let t = target("https://api.example.com/v1/");
        assert_eq!(
            resolved(&t, Some("/charges?x=1")).as_deref(),
            Ok("https://api.example.com/v1/charges?x=1")
        );
        assert_eq!(
            resolved(&t, None).as_deref(),
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

    /// Every spelling of dot and slash, as the URL library would resolve them: each
    /// string is refused, and none that is accepted resolves outside the base path.
    #[test]
    fn mixed_and_encoded_dot_segments_cannot_leave_the_base_path() {
        let t = target("http://127.0.0.1:9/api");
        // As reported: the URL library alone resolves each outside the base path.
        for bad in ["/.%2e/x", "/%2E./x", "/.%2e", "/.%2e/.%2e/.%2e/etc/passwd"] {
            assert!(resolve_url(&t, Some(bad)).is_err(), "{bad}");
            let naive = Url::parse(&format!("http://127.0.0.1:9/api{bad}")).unwrap();
            assert!(stays_under(&t.base_url, &naive).is_err(), "{bad}: {naive}");
        }
        for bad in ["/x/.%2e", "/x/%2e.", "/x/.%2E/y", "/x/%2E%2e"] {
            assert!(resolve_url(&t, Some(bad)).is_err(), "{bad}");
        }
        let dots = [".", "%2e", "%2E", "%252e", "%252E"];
        let slashes = ["/", "%2f", "%2F", "%252f", "\\", "%5c", "%5C", "%255c"];
        let mut tried = 0;
        for a in dots {
            for b in dots {
                for s in slashes {
                    for path in [
                        format!("/{a}{b}{s}x"),
                        format!("/x{s}{a}{b}{s}{a}{b}{s}etc{s}passwd"),
                        format!("/x/{a}{b}"),
                        format!("/{a}{s}x"),
                    ] {
                        tried += 1;
                        assert!(resolve_url(&t, Some(&path)).is_err(), "{path}");
                    }
                }
            }
        }
        assert_eq!(tried, 5 * 5 * 8 * 4);
    }

    #[test]
    fn the_base_path_is_a_whole_segment_prefix() {
        let base = "http://h.example/api";
        let under = |u: &str| stays_under(base, &Url::parse(u).unwrap()).is_ok();
        assert!(under("http://h.example/api"));
        assert!(under("http://h.example/api/"));
        assert!(under("http://h.example/api/x/y?z"));
        assert!(!under("http://h.example/apix"));
        assert!(!under("http://h.example/"));
        assert!(!under("http://h.example/x"));
        assert!(!under("https://h.example/api/x"));
        assert!(!under("http://h.example:81/api/x"));
        assert!(!under("http://evil.example/api/x"));
        assert!(!under("http://u@h.example/api/x"));
        let root = "http://h.example";
        assert!(stays_under(root, &Url::parse("http://h.example/any/thing").unwrap()).is_ok());
    }

    fn payload(headers: &[(&str, &str)], body: bool) -> HttpPayload {
        HttpPayload {
            target: "t".into(),
            path: None,
            body: body.then(|| serde_json::json!({"a": 1})),
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn a_task_content_type_replaces_the_default_and_names_are_sent_once() {
        let t = target("http://h.example/api");
        for name in ["Content-Type", "content-type", "CONTENT-TYPE"] {
            let headers = request_headers(&t, &payload(&[(name, "text/csv")], true), "k").unwrap();
            let types: Vec<_> = headers.get_all(CONTENT_TYPE).iter().collect();
            assert_eq!(types, ["text/csv"], "{name}");
        }
        let headers = request_headers(&t, &payload(&[], true), "k").unwrap();
        assert_eq!(headers[CONTENT_TYPE], "application/json");
        let twice = payload(&[("X-A", "1"), ("x-a", "2")], false);
        assert!(request_headers(&t, &twice, "k").is_err());
        assert!(request_headers(&t, &payload(&[("Idempotency-Key", "x")], false), "k").is_err());
    }
}
