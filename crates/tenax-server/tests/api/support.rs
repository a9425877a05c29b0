//! Requests through the router and the fixtures the cases share.
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::Value;
use tenax::storage::{AuditListParams, Storage, TaskListParams};
use tenax_server::{hash_token, AppState, Role, ServerConfig, TokenConfig};
use tower::ServiceExt;

pub const ADMIN: &str = "admin-token-one";
pub const ADMIN_2: &str = "admin-token-two";
pub const ENQUEUER: &str = "enqueue-token";
pub const READER: &str = "read-token";

pub fn token(name: &str, role: Role, secret: &str) -> TokenConfig {
    TokenConfig {
        name: name.to_owned(),
        role,
        sha256: hash_token(secret),
    }
}

/// A configuration with two admin tokens, one enqueue and one read token.
pub fn config() -> ServerConfig {
    let mut config = ServerConfig {
        command_types: ["echo", "slow"].into_iter().map(String::from).collect(),
        tokens: vec![
            token("ops-1", Role::Admin, ADMIN),
            token("ops-2", Role::Admin, ADMIN_2),
            token("shop", Role::Enqueue, ENQUEUER),
            token("dashboard", Role::Read, READER),
        ],
        ..ServerConfig::default()
    };
    config.secrets = tenax_core::Secrets::new([("echo", ["password", "card.number"])]).unwrap();
    config.validate().unwrap();
    config
}

pub fn app(storage: Arc<dyn Storage>, config: ServerConfig) -> Router {
    tenax_server::router(AppState::new(storage, config))
}

/// The same API served by `tenax_server::serve` on 127.0.0.1:0; stopped on drop.
pub struct Served {
    pub addr: std::net::SocketAddr,
    stop: tokio_util::sync::CancellationToken,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub async fn served(storage: Arc<dyn Storage>, config: ServerConfig) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let state = AppState::with_shutdown(storage, config, stop.clone());
    tokio::spawn(tenax_server::serve(listener, state, stop.clone()));
    Served { addr, stop }
}

/// One HTTP/1.1 request over a real socket (`Connection: close`).
pub async fn call_socket(
    addr: std::net::SocketAddr,
    method: Method,
    uri: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Answer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut head = format!("{method} {uri} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    let body = body.unwrap_or("");
    if !body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut payload = raw[split + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next().unwrap()[9..12].parse().unwrap();
    let mut headers = axum::http::HeaderMap::new();
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            headers.append(
                axum::http::HeaderName::from_bytes(name.trim().as_bytes()).unwrap(),
                value.trim().parse().unwrap(),
            );
        }
    }
    if headers
        .get(header::TRANSFER_ENCODING)
        .is_some_and(|v| v == "chunked")
    {
        let mut decoded = Vec::new();
        let mut rest = &payload[..];
        loop {
            let end = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size = usize::from_str_radix(std::str::from_utf8(&rest[..end]).unwrap().trim(), 16)
                .unwrap();
            if size == 0 {
                break;
            }
            decoded.extend_from_slice(&rest[end + 2..end + 2 + size]);
            rest = &rest[end + 2 + size + 2..];
        }
        payload = decoded;
    }
    let body = if payload.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&payload).unwrap_or_else(|e| {
            panic!(
                "{status}: body is not JSON ({e}): {}",
                String::from_utf8_lossy(&payload)
            )
        })
    };
    Answer {
        status: StatusCode::from_u16(status).unwrap(),
        headers,
        body,
    }
}

/// An answer: status, headers we look at, and the JSON body (`Null` when empty).
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: Value,
}

impl Answer {
    /// The error code of an error answer, checking the error shape.
    pub fn code(&self) -> &str {
        let code = self.body["error"]["code"].as_str();
        assert!(
            code.is_some() && self.body["error"]["message"].is_string(),
            "not an error body: {} {}",
            self.status,
            self.body
        );
        code.unwrap()
    }
}

pub async fn send(app: &Router, request: Request<Body>) -> Answer {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!(
                "{status}: body is not JSON ({e}): {}",
                String::from_utf8_lossy(&bytes)
            )
        })
    };
    Answer {
        status,
        headers,
        body,
    }
}

pub fn request(
    method: Method,
    uri: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Request<Body> {
    let mut builder = Request::builder().method(method).uri(uri);
    if let Some(token) = token {
        builder = builder.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    match body {
        Some(body) => builder
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap(),
        None => builder.body(Body::empty()).unwrap(),
    }
}

pub async fn call(
    app: &Router,
    method: Method,
    uri: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Answer {
    send(app, request(method, uri, token, body)).await
}

/// Everything the API can change (tasks, schedules, queues, rate limits, event rules and
/// the audit trail), to compare before and after a refused request.
pub async fn snapshot(storage: &Arc<dyn Storage>) -> String {
    let tasks = storage
        .task_list(&TaskListParams {
            limit: 10_000,
            ..TaskListParams::default()
        })
        .await
        .unwrap();
    let schedules = storage.schedule_list().await.unwrap();
    let queues = storage.queue_list().await.unwrap();
    let rate_limits = storage.rate_limit_list().await.unwrap();
    let event_rules = storage.event_rule_list().await.unwrap();
    let audit = storage
        .audit_list(&AuditListParams {
            limit: 1000,
            ..AuditListParams::default()
        })
        .await
        .unwrap();
    format!("{tasks:?}\n{schedules:?}\n{queues:?}\n{rate_limits:?}\n{event_rules:?}\n{audit:?}")
}
