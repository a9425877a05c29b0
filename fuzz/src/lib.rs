//! What the HTTP fuzz targets share: the API router over a SQLite file, and the check
//! every answer must pass (no 5xx, a JSON body, the error shape on every error).
use std::sync::{Arc, OnceLock};

pub mod cron_oracle;

use axum::body::Body;
use axum::http::{header, Method, Request};
use axum::Router;
use http_body_util::BodyExt;
use tower::ServiceExt;

/// The admin token of the fuzzed server.
pub const ADMIN: &str = "fuzz-admin-token";

/// A router over one SQLite database, built once per fuzzing process.
pub struct Api {
    runtime: tokio::runtime::Runtime,
    router: Router,
    _dir: tempfile::TempDir,
}

impl Api {
    /// The process's API (built on first use).
    pub fn get() -> &'static Api {
        static API: OnceLock<Api> = OnceLock::new();
        API.get_or_init(Api::build)
    }

    #[allow(clippy::expect_used)]
    fn build() -> Api {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let dir = tempfile::tempdir().expect("a temporary folder");
        let url = format!("sqlite://{}", dir.path().join("fuzz.db").display());
        let router = runtime.block_on(async {
            let storage: Arc<dyn tenax::storage::Storage> =
                tenax::storage::connect(&url).await.expect("open SQLite");
            let mut config = tenax_server::ServerConfig {
                command_types: ["echo", "http"].into_iter().map(String::from).collect(),
                tokens: vec![tenax_server::TokenConfig {
                    name: "fuzz".to_owned(),
                    role: tenax_server::Role::Admin,
                    sha256: tenax_server::hash_token(ADMIN),
                }],
                callback_allow_hosts: vec!["hooks.example.com".to_owned()],
                http_targets: ["billing".to_owned()].into_iter().collect(),
                ..tenax_server::ServerConfig::default()
            };
            config.secrets =
                tenax::Secrets::new([("echo", ["password"])]).expect("a valid secret path");
            config.validate().expect("a valid configuration");
            let router = tenax_server::router(tenax_server::AppState::new(storage, config));
            // Something for ids, numbers and names to find.
            let seed = Request::post("/v1/tasks")
                .header(header::AUTHORIZATION, format!("Bearer {ADMIN}"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(
                    r#"{"command_type":"echo","task_no":"seed-1","payload":{"password":"p"}}"#,
                ))
                .expect("a request");
            let _ = router.clone().oneshot(seed).await;
            let schedule = Request::post("/v1/schedules")
                .header(header::AUTHORIZATION, format!("Bearer {ADMIN}"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(
                    r#"{"name":"nightly","command_type":"echo","cron":"0 2 * * *"}"#,
                ))
                .expect("a request");
            let _ = router.clone().oneshot(schedule).await;
            router
        });
        Api {
            runtime,
            router,
            _dir: dir,
        }
    }

    /// Send one request with the admin token and check the answer; panics (a finding)
    /// when the answer is a 5xx, is not JSON, or is an error without the error shape.
    pub fn check(&self, method: Method, uri: &str, content_type: Option<&str>, body: Vec<u8>) {
        let Ok(mut request) = Request::builder()
            .method(method.clone())
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {ADMIN}"))
            .body(Body::from(body))
        else {
            return; // not a request a client could send
        };
        if let Some(ct) = content_type {
            if let Ok(value) = ct.parse() {
                request.headers_mut().insert(header::CONTENT_TYPE, value);
            }
        }
        let router = self.router.clone();
        let (status, bytes) = self.runtime.block_on(async move {
            let response = match router.oneshot(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            let status = response.status();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            (status, bytes)
        });
        let text = String::from_utf8_lossy(&bytes);
        assert!(!status.is_server_error(), "{method} {uri}: {status} {text}");
        if bytes.is_empty() {
            return;
        }
        if uri.starts_with("/ui/") || uri == "/" || uri.starts_with("/assets/") {
            return; // HTML fragments and assets
        }
        let value: serde_json::Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{method} {uri}: {status}, body is not JSON ({e}): {text}"));
        if !status.is_success() {
            assert!(
                value["error"]["code"].is_string() && value["error"]["message"].is_string(),
                "{method} {uri}: {status} without the error shape: {text}"
            );
        }
        assert!(!text.contains("panicked at"), "{method} {uri}: {text}");
    }
}
