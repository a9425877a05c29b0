//! No-Rust commands and outbound delivery through a real `tenax serve` (SQLite in a
//! temporary folder) and real HTTP receivers written here: the `http` kind (retries
//! with `Retry-After`, a permanent 400, URLs outside the configuration refused), the
//! `exec` kind (success, permanent exit code, timeout), signed completion callbacks
//! that survive a receiver outage, and death alerts for a burst of 500 deaths.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use tenax::storage::{OutboxKind, OutboxListParams, OutboxStatus};

const SECRET: &str = "a-test-secret-of-32-bytes-length";

// ---------------------------------------------------------------------------------
// A receiver: records every request and answers from a script (then 200).

#[derive(Debug, Clone)]
struct Seen {
    at: Instant,
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

/// An answer: status, extra headers, body.
type Answer = (u16, Vec<(&'static str, &'static str)>, &'static str);

#[derive(Default)]
struct Script {
    seen: Vec<Seen>,
    /// Answers to give, in order, before the default.
    answers: VecDeque<Answer>,
    /// The answer after the script: (status, body).
    default: Option<(u16, &'static str)>,
}

type Shared = Arc<Mutex<Script>>;

async fn record(
    State(script): State<Shared>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut script = script.lock().unwrap();
    script.seen.push(Seen {
        at: Instant::now(),
        path: uri.path().to_owned(),
        headers,
        body,
    });
    let (status, extra, text) = script.answers.pop_front().unwrap_or_else(|| {
        let (status, body) = script.default.unwrap_or((200, r#"{"ok":true}"#));
        (status, Vec::new(), body)
    });
    let mut response = (StatusCode::from_u16(status).unwrap(), text.to_owned()).into_response();
    for (name, value) in extra {
        response.headers_mut().insert(name, value.parse().unwrap());
    }
    response
}

struct Receiver {
    addr: SocketAddr,
    script: Shared,
    stop: tokio_util::sync::CancellationToken,
}

impl Receiver {
    async fn start_on(addr: SocketAddr, script: Shared) -> Self {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let app = Router::new().fallback(record).with_state(script.clone());
        let until = stop.clone();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { until.cancelled().await })
                .await
                .unwrap();
        });
        Self { addr, script, stop }
    }

    async fn start(script: Script) -> Self {
        Self::start_on("127.0.0.1:0".parse().unwrap(), Arc::new(Mutex::new(script))).await
    }

    fn seen(&self) -> Vec<Seen> {
        self.script.lock().unwrap().seen.clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

// ---------------------------------------------------------------------------------
// A real `tenax serve`.

struct Server {
    child: Child,
    addr: String,
    db: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(dir: &Path, config: &str) -> Server {
    let path = dir.join("tenax.toml");
    std::fs::write(&path, config).unwrap();
    let db = format!("sqlite://{}", dir.join("tenax.db").display());
    let mut child = Command::new(env!("CARGO_BIN_EXE_tenax"))
        .arg("--config")
        .arg(&path)
        .arg("--database-url")
        .arg(&db)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--poll-interval",
            "50ms",
        ])
        .env("TENAX_LOG", "info")
        .env_remove("TENAX_CALLBACKS_SECRET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(
            std::fs::File::create(dir.join("serve.log")).unwrap(),
        ))
        .spawn()
        .expect("start tenax serve");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            let _ = tx.send(line);
        }
        for _ in lines {}
    });
    let line = rx
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| {
            panic!(
                "tenax serve printed no address: {}",
                std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
            )
        });
    let addr = line
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    Server { child, addr, db }
}

fn client() -> reqwest::Client {
    tenax_kinds::client(Duration::from_secs(30)).unwrap()
}

async fn api(server: &Server, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let url = format!("http://{}{path}", server.addr);
    let request = match method {
        "POST" => client()
            .post(url)
            .header("content-type", "application/json")
            .body(body.unwrap_or(json!({})).to_string()),
        _ => client().get(url),
    };
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn enqueue(server: &Server, body: Value) -> Value {
    let (status, answer) = api(server, "POST", "/v1/tasks", Some(body.clone())).await;
    assert_eq!(status, 201, "{body} -> {answer}");
    answer
}

async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Wait until task `id` is finished; returns it.
async fn finished(server: &Server, id: i64) -> Value {
    wait_for(
        &format!("task {id} to finish"),
        Duration::from_secs(60),
        || async {
            let (_, task) = api(server, "GET", &format!("/v1/tasks/{id}"), None).await;
            matches!(
                task["status"].as_str(),
                Some("succeeded" | "dead" | "cancelled")
            )
            .then_some(task)
        },
    )
    .await
}

// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_tasks_retry_transient_answers_honour_retry_after_and_stay_on_their_targets() {
    let target = Receiver::start(Script {
        answers: VecDeque::from([
            (503, vec![("retry-after", "2")], "busy"),
            (503, vec![], "still busy"),
            (200, vec![], r#"{"charged":5}"#),
        ]),
        ..Script::default()
    })
    .await;
    let refusing = Receiver::start(Script {
        default: Some((400, r#"{"error":"invalid amount"}"#)),
        ..Script::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(
        dir.path(),
        &format!(
            "[http]\nbackoff_base = \"100ms\"\nbackoff_cap = \"300ms\"\n\
             [http.targets.payments]\nbase_url = \"http://{}/api\"\ntimeout = \"5s\"\n\
             headers = {{ Authorization = \"Bearer target-token\" }}\n\
             [http.targets.strict]\nbase_url = \"http://{}\"\n",
            target.addr, refusing.addr
        ),
    );

    // 503 with Retry-After: 2, then 503, then 200.
    let task = enqueue(
        &server,
        json!({"command_type": "http", "task_no": "charge-1", "max_attempts": 5,
               "payload": {"target": "payments", "path": "/charges", "body": {"amount": 5}}}),
    )
    .await;
    let task = finished(&server, task["id"].as_i64().unwrap()).await;
    assert_eq!(task["status"], "succeeded", "{task}");
    assert_eq!(task["attempt"], 3, "{task}");
    assert_eq!(task["result"]["status"], 200, "{task}");
    assert_eq!(task["result"]["body"]["charged"], 5, "{task}");
    let seen = target.seen();
    assert_eq!(seen.len(), 3);
    for s in &seen {
        assert_eq!(s.path, "/api/charges");
        assert_eq!(s.headers["idempotency-key"], "charge-1");
        assert_eq!(s.headers["authorization"], "Bearer target-token");
        assert_eq!(
            serde_json::from_slice::<Value>(&s.body).unwrap(),
            json!({"amount": 5})
        );
    }
    let first_wait = seen[1].at - seen[0].at;
    let second_wait = seen[2].at - seen[1].at;
    println!("waits: after Retry-After 2 -> {first_wait:?}, after backoff -> {second_wait:?}");
    assert!(
        first_wait >= Duration::from_secs(2),
        "Retry-After honoured: {first_wait:?}"
    );
    assert!(
        second_wait < Duration::from_secs(2),
        "backoff only: {second_wait:?}"
    );

    // A 400 is permanent: one attempt, dead.
    let task = enqueue(
        &server,
        json!({"command_type": "http", "max_attempts": 5,
               "payload": {"target": "strict", "path": "/orders", "body": {"amount": -1}}}),
    )
    .await;
    let task = finished(&server, task["id"].as_i64().unwrap()).await;
    assert_eq!(task["status"], "dead", "{task}");
    assert_eq!(task["attempt"], 1, "{task}");
    assert!(
        task["last_error"].as_str().unwrap().contains("400"),
        "{task}"
    );
    assert_eq!(refusing.seen().len(), 1);

    // A target that is not configured is refused at enqueue.
    let (status, answer) = api(
        &server,
        "POST",
        "/v1/tasks",
        Some(json!({"command_type": "http", "payload": {"target": "http://evil.example/"}})),
    )
    .await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["error"]["code"], "unknown_http_target", "{answer}");
    // A path that tries to leave the target's host or base path is refused at
    // enqueue, and nothing is sent.
    for path in [
        "//evil.example/x",
        "@evil.example/x",
        "/../../admin",
        "/.%2e/x",
        "/%2E./x",
        "/.%2e",
    ] {
        let (status, answer) = api(
            &server,
            "POST",
            "/v1/tasks",
            Some(json!({"command_type": "http", "max_attempts": 5,
                        "payload": {"target": "payments", "path": path}})),
        )
        .await;
        assert_eq!(status, 422, "{path}: {answer}");
        assert_eq!(answer["error"]["code"], "http_path_refused", "{answer}");
        assert_eq!(answer["error"]["field"], "payload.path", "{answer}");
    }
    assert_eq!(refusing.seen().len(), 1, "no request for a refused path");
    assert_eq!(target.seen().len(), 3, "no request for a refused path");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_tasks_succeed_fail_permanently_and_time_out() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(
        dir.path(),
        "[exec]\npermanent_exit_codes = [3]\ntimeout = \"1s\"\nbackoff_base = \"50ms\"\n\
         backoff_cap = \"100ms\"\n\
         [exec.allow]\necho = \"/bin/echo\"\nsh = \"/bin/sh\"\nsleep = \"/bin/sleep\"\n",
    );
    std::env::set_var("TENAX_EXEC_PROBE", "must-not-leak");

    let ok = enqueue(
        &server,
        json!({"command_type": "exec", "payload": {"program": "echo", "args": ["hello", "$HOME; rm -rf /"]}}),
    )
    .await;
    let ok = finished(&server, ok["id"].as_i64().unwrap()).await;
    assert_eq!(ok["status"], "succeeded", "{ok}");
    assert_eq!(ok["result"]["exit_code"], 0);
    assert_eq!(
        ok["result"]["stdout"], "hello $HOME; rm -rf /\n",
        "no shell: {ok}"
    );

    let env = enqueue(
        &server,
        json!({"command_type": "exec", "payload": {"program": "sh", "args": ["-c", "env | wc -l"]}}),
    )
    .await;
    let env = finished(&server, env["id"].as_i64().unwrap()).await;
    assert_eq!(env["status"], "succeeded", "{env}");
    // A clean environment: only what sh itself sets (PWD, SHLVL, _), never ours.
    let count: u32 = env["result"]["stdout"]
        .as_str()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(count <= 3, "{env}");

    let permanent = enqueue(
        &server,
        json!({"command_type": "exec", "max_attempts": 5,
               "payload": {"program": "sh", "args": ["-c", "echo no such account >&2; exit 3"]}}),
    )
    .await;
    let permanent = finished(&server, permanent["id"].as_i64().unwrap()).await;
    assert_eq!(permanent["status"], "dead", "{permanent}");
    assert_eq!(permanent["attempt"], 1, "{permanent}");
    assert!(
        permanent["last_error"]
            .as_str()
            .unwrap()
            .contains("no such account"),
        "{permanent}"
    );

    let retried = enqueue(
        &server,
        json!({"command_type": "exec", "max_attempts": 2,
               "payload": {"program": "sh", "args": ["-c", "exit 4"]}}),
    )
    .await;
    let retried = finished(&server, retried["id"].as_i64().unwrap()).await;
    assert_eq!(retried["status"], "dead", "{retried}");
    assert_eq!(
        retried["attempt"], 2,
        "another exit code is retried: {retried}"
    );

    let started = Instant::now();
    let slow = enqueue(
        &server,
        json!({"command_type": "exec", "max_attempts": 1,
               "payload": {"program": "sleep", "args": ["30"]}}),
    )
    .await;
    let slow = finished(&server, slow["id"].as_i64().unwrap()).await;
    assert_eq!(slow["status"], "dead", "{slow}");
    assert!(
        slow["last_error"].as_str().unwrap().contains("timed out"),
        "{slow}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "killed at its timeout"
    );

    let (status, answer) = api(
        &server,
        "POST",
        "/v1/tasks",
        Some(json!({"command_type": "exec", "payload": {"program": "rm", "args": ["-rf", "/"]}})),
    )
    .await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["error"]["code"], "unknown_exec_program", "{answer}");
    assert_eq!(answer["error"]["field"], "payload.program", "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("allow-list"),
        "{answer}"
    );
}

fn verify(seen: &Seen) -> Value {
    let timestamp = seen.headers["tenax-timestamp"].to_str().unwrap();
    let signature = seen.headers["tenax-signature"].to_str().unwrap();
    // What a receiver in any language does: HMAC-SHA256 over "<timestamp>.<body>".
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(&seen.body);
    let expected = format!("v1={}", hex::encode(mac.finalize().into_bytes()));
    assert_eq!(signature, expected, "the signature verifies");
    let age = chrono::Utc::now().timestamp() - timestamp.parse::<i64>().unwrap();
    assert!((0..300).contains(&age), "fresh timestamp");
    serde_json::from_slice(&seen.body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_callbacks_are_delivered_once_across_a_receiver_outage() {
    // The receiver's address, not listening yet: the receiver is down.
    let addr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap()
    };
    let metrics_addr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(
        dir.path(),
        &format!(
            "[worker]\nmetrics_addr = \"{metrics_addr}\"\nmetrics_sample_interval = \"100ms\"\n\
             [server]\ncommand_types = [\"echo\"]\n\
             [callbacks]\nallow_hosts = [\"127.0.0.1:{}\"]\nsecret = \"{SECRET}\"\n\
             backoff_base = \"100ms\"\nbackoff_cap = \"400ms\"\npoll_interval = \"50ms\"\n",
            addr.port()
        ),
    );
    let callback_url = format!("http://{addr}/hooks/tenax");

    // A callback URL outside the allow-list is refused at enqueue.
    for url in [
        "http://127.0.0.1:1/x",
        "http://evil.example/x",
        "file:///etc/passwd",
    ] {
        let (status, answer) = api(
            &server,
            "POST",
            "/v1/tasks",
            Some(json!({"command_type": "echo", "callback_url": url})),
        )
        .await;
        assert_eq!(status, 422, "{url}: {answer}");
        assert_eq!(answer["error"]["code"], "callback_url_refused", "{answer}");
    }

    let task = enqueue(
        &server,
        json!({"command_type": "echo", "payload": {"n": 7}, "callback_url": callback_url}),
    )
    .await;
    let id = task["id"].as_i64().unwrap();
    let task = finished(&server, id).await;
    assert_eq!(task["status"], "succeeded");

    // While the receiver is down, attempts fail and are retried.
    let storage = tenax::storage::connect(&server.db).await.unwrap();
    let list = || async {
        storage
            .outbox_list(&OutboxListParams {
                kind: Some(OutboxKind::Callback),
                status: None,
                task_id: None,
                limit: 10,
            })
            .await
            .unwrap()
    };
    let failed = wait_for("two failed attempts", Duration::from_secs(30), || async {
        let rows = list().await;
        rows.first()
            .filter(|r| r.attempts >= 2 && r.last_error.is_some())
            .cloned()
    })
    .await;
    assert_eq!(failed.status, OutboxStatus::Pending);
    // The sampler shows the undelivered callback, and how long it has waited.
    let gauge = |name: &'static str| async move {
        let scrape = client()
            .get(format!("http://{metrics_addr}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        scrape
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")) && l.contains("kind=\"callback\""))
            .and_then(|l| l.rsplit(' ').next())
            .map(|v| v.parse::<f64>().unwrap())
    };
    wait_for(
        "the pending gauge at 1",
        Duration::from_secs(30),
        || async { (gauge("tenax_outbox_pending").await == Some(1.0)).then_some(()) },
    )
    .await;
    wait_for(
        "the oldest age to grow",
        Duration::from_secs(30),
        || async {
            gauge("tenax_outbox_oldest_pending_age_seconds")
                .await
                .filter(|age| *age > 0.0)
        },
    )
    .await;
    println!(
        "while down: {} attempts, last error {:?}",
        failed.attempts, failed.last_error
    );

    // The receiver comes back, answers 500 once (redelivery), then 200.
    let receiver = Receiver::start_on(
        addr,
        Arc::new(Mutex::new(Script {
            answers: VecDeque::from([(500, vec![], "oops")]),
            ..Script::default()
        })),
    )
    .await;
    let delivered = wait_for(
        "the callback to be delivered",
        Duration::from_secs(30),
        || async {
            let rows = list().await;
            rows.first()
                .filter(|r| r.status == OutboxStatus::Delivered)
                .cloned()
        },
    )
    .await;
    let seen = receiver.seen();
    assert_eq!(
        seen.len(),
        2,
        "one failed redelivery, then one acknowledged: {seen:?}"
    );
    let ids: Vec<&str> = seen
        .iter()
        .map(|s| s.headers["tenax-delivery-id"].to_str().unwrap())
        .collect();
    assert_eq!(ids[0], ids[1], "the same delivery id on redelivery");
    assert_eq!(ids[0], delivered.delivery_id);
    for s in &seen {
        assert_eq!(s.path, "/hooks/tenax");
        let summary = verify(s);
        assert_eq!(summary["task_id"], id);
        assert_eq!(summary["status"], "succeeded");
        assert_eq!(summary["command_type"], "echo");
    }
    assert_eq!(seen[0].body, seen[1].body, "the same body on redelivery");

    // The senders count what they settled.
    let scrape = client()
        .get(format!("http://{metrics_addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let counted = |outcome: &str| -> f64 {
        scrape
            .lines()
            .find(|l| {
                l.starts_with("tenax_deliveries_total{")
                    && l.contains("kind=\"callback\"")
                    && l.contains(&format!("outcome=\"{outcome}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .map_or(0.0, |v| v.parse().unwrap())
    };
    assert_eq!(counted("delivered"), 1.0, "{scrape}");
    assert!(
        counted("retried") >= 3.0,
        "two while down, one 500: {scrape}"
    );

    wait_for(
        "the pending gauge back at 0",
        Duration::from_secs(30),
        || async { (gauge("tenax_outbox_pending").await == Some(0.0)).then_some(()) },
    )
    .await;

    // Acknowledged once: nothing more arrives.
    let settled_at = Instant::now();
    while settled_at.elapsed() < Duration::from_millis(1500) {
        assert_eq!(
            receiver.seen().len(),
            2,
            "no delivery after the acknowledgement"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `tenax enqueue --callback-url` is the HTTP API's `callback_url`: the worker of a
/// server sharing the database delivers the signed outcome; a URL that is not `http`
/// or `https` is refused at enqueue, naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_url_given_on_the_command_line_is_delivered() {
    let receiver = Receiver::start(Script::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[server]\ncommand_types = [\"echo\"]\n\
         [callbacks]\nallow_hosts = [\"127.0.0.1:{}\"]\nsecret = \"{SECRET}\"\npoll_interval = \"50ms\"\n",
        receiver.addr.port()
    );
    let server = start_server(dir.path(), &config);
    let enqueue = |url: &str| {
        Command::new(env!("CARGO_BIN_EXE_tenax"))
            .args([
                "--database-url",
                &server.db,
                "enqueue",
                "echo",
                r#"{"n": 3}"#,
            ])
            .args(["--callback-url", url])
            .env("TENAX_LOG", "warn")
            .output()
            .unwrap()
    };
    let refused = enqueue("ftp://127.0.0.1/x");
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("callback_url"), "{stderr}");
    let done = enqueue(&format!("http://{}/hooks/cli", receiver.addr));
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let seen = wait_for("the callback", Duration::from_secs(30), || async {
        receiver.seen().into_iter().next()
    })
    .await;
    assert_eq!(seen.path, "/hooks/cli");
    let summary = verify(&seen);
    assert_eq!(summary["status"], "succeeded");
    assert_eq!(summary["command_type"], "echo");
    // The refused enqueue stored nothing: one task, one callback.
    let storage = tenax::storage::connect(&server.db).await.unwrap();
    assert_eq!(storage.stats().await.unwrap().total(), 1);
    assert_eq!(receiver.seen().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_500_deaths_is_alerted_with_each_death_in_exactly_one_message() {
    let webhook = Receiver::start(Script::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(
        dir.path(),
        &format!(
            "[worker]\nconcurrency = 20\n\
             [exec]\npermanent_exit_codes = [1]\n[exec.allow]\nfalse = \"/bin/false\"\n\
             [alerts]\nwebhook_url = \"http://{}/slack\"\ndeath_window = \"1s\"\n\
             poll_interval = \"50ms\"\n",
            webhook.addr
        ),
    );
    let started = Instant::now();
    for batch in 0..5 {
        let tasks: Vec<Value> = (0..100)
            .map(|i| {
                json!({"command_type": "exec", "task_no": format!("doomed-{batch}-{i}"),
                       "max_attempts": 1, "payload": {"program": "false"}})
            })
            .collect();
        let (status, answer) = api(
            &server,
            "POST",
            "/v1/tasks/batch",
            Some(json!({"tasks": tasks})),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
    }
    let storage = tenax::storage::connect(&server.db).await.unwrap();
    wait_for("500 deaths alerted", Duration::from_secs(120), || async {
        let alerted: usize = webhook
            .seen()
            .iter()
            .map(|s| {
                serde_json::from_slice::<Value>(&s.body).unwrap()["tenax"]["count"]
                    .as_u64()
                    .unwrap() as usize
            })
            .sum();
        (alerted >= 500).then_some(())
    })
    .await;
    // Nothing is left to send once the sender settled what the webhook acknowledged
    // (it settles after the answer, so wait for it), and no message is sent twice.
    wait_for("every death settled", Duration::from_secs(30), || async {
        let pending = storage
            .outbox_list(&OutboxListParams {
                kind: Some(OutboxKind::Death),
                status: Some(OutboxStatus::Pending),
                task_id: None,
                limit: 1000,
            })
            .await
            .unwrap();
        pending.is_empty().then_some(())
    })
    .await;
    let messages: Vec<Value> = webhook
        .seen()
        .iter()
        .map(|s| {
            assert_eq!(s.path, "/slack");
            serde_json::from_slice(&s.body).unwrap()
        })
        .collect();
    let mut times: BTreeMap<i64, usize> = BTreeMap::new();
    for message in &messages {
        let text = message["text"].as_str().unwrap();
        assert!(text.contains("died"), "{text}");
        for id in message["tenax"]["task_ids"].as_array().unwrap() {
            *times.entry(id.as_i64().unwrap()).or_default() += 1;
        }
    }
    assert_eq!(times.len(), 500, "every death alerted");
    assert!(
        times.values().all(|&n| n == 1),
        "each death in exactly one message"
    );
    println!(
        "500 deaths in {} messages, all alerted {:?} after the first enqueue; first message:\n{}",
        messages.len(),
        started.elapsed(),
        messages[0]["text"]
    );
    assert!(
        messages.len() <= 20,
        "a storm is summarised: {} messages",
        messages.len()
    );
    let longest = messages
        .iter()
        .map(|m| m["text"].as_str().unwrap().lines().count())
        .max();
    assert!(
        longest.unwrap() <= 12,
        "each message lists a few deaths and counts the rest"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_backlog_alert_fires_and_resolves_once_across_a_webhook_outage() {
    // The webhook is down for the first two attempts: the firing message waits in the
    // outbox and is sent again, under the same delivery id, until acknowledged.
    let webhook = Receiver::start(Script {
        answers: VecDeque::from([(503, Vec::new(), "down"), (502, Vec::new(), "down")]),
        ..Script::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    // `nobody` is accepted but no worker runs it: its tasks make a backlog.
    let server = start_server(
        dir.path(),
        &format!(
            "[server]\ncommand_types = [\"echo\", \"nobody\"]\n\
             [alerts]\nwebhook_url = \"http://{}/slack\"\ncheck_interval = \"100ms\"\n\
             poll_interval = \"50ms\"\nbackoff_base = \"100ms\"\nbackoff_cap = \"200ms\"\n\
             [alerts.queues.default]\nmax_backlog = 5\n",
            webhook.addr
        ),
    );
    // The acknowledged backlog messages (the two refused attempts come first).
    let backlog_messages = || -> Vec<Value> {
        webhook
            .seen()
            .iter()
            .skip(2)
            .map(|s| serde_json::from_slice::<Value>(&s.body).unwrap())
            .filter(|m| m["tenax"]["kind"] == "backlog")
            .collect()
    };
    let mut ids = Vec::new();
    for _ in 0..6 {
        let task = enqueue(&server, json!({"command_type": "nobody"})).await;
        ids.push(task["id"].as_i64().unwrap());
    }
    let fired = wait_for("the backlog alert", Duration::from_secs(30), || async {
        backlog_messages().first().cloned()
    })
    .await;
    assert_eq!(fired["tenax"]["firing"], true, "{fired}");
    let attempts = webhook.seen();
    let delivery = |s: &Seen| s.headers["tenax-delivery-id"].to_str().unwrap().to_owned();
    assert_eq!(
        attempts.len(),
        3,
        "two refused attempts, then the acknowledged one"
    );
    assert!(
        attempts
            .iter()
            .all(|s| s.body == attempts[0].body && delivery(s) == delivery(&attempts[0])),
        "every attempt sends the same message under the same delivery id"
    );
    assert!(
        fired["text"].as_str().unwrap().contains("backlog is 6"),
        "{fired}"
    );
    for id in &ids {
        let (status, answer) = api(&server, "POST", &format!("/v1/tasks/{id}/cancel"), None).await;
        assert_eq!(status, 200, "{answer}");
    }
    let resolved = wait_for("the resolution", Duration::from_secs(30), || async {
        backlog_messages().get(1).cloned()
    })
    .await;
    assert_eq!(resolved["tenax"]["firing"], false, "{resolved}");
    assert!(
        resolved["text"].as_str().unwrap().starts_with("Resolved"),
        "{resolved}"
    );
    // Checks go on every 100ms; no state change, no message.
    let quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_millis(1000) {
        assert_eq!(backlog_messages().len(), 2, "one message per transition");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
