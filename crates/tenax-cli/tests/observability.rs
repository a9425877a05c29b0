//! Observability end to end: a real `tenax worker` serving metrics, scraped by a
//! private Prometheus whose answers to every query of the Grafana dashboard must hold
//! data; the alerting rules checked and unit-tested by `promtool`; and log lines
//! written by a handler carrying the task's fields, in text and JSON.
//!
//! Prometheus and promtool come from Debian's `prometheus` package (`.ci/test` installs
//! it). Without them these tests skip loudly, unless `TENAX_REQUIRE_ALL_BACKENDS=1`,
//! which makes a missing tool a failure.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tenax::Client;

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// Whether `tool` runs; when it does not, skip loudly (or fail where every tool is
/// required).
fn have(tool: &str) -> bool {
    let found = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var("TENAX_REQUIRE_ALL_BACKENDS").as_deref() != Ok("1"),
            "{tool} is not installed but TENAX_REQUIRE_ALL_BACKENDS=1 (apt-get install prometheus)"
        );
        eprintln!("SKIP: {tool} is not installed (apt-get install prometheus)");
    }
    found
}

/// A port free right now on the loopback.
fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A plain HTTP/1.1 GET; the body on status 200, else `None`.
fn http_get(addr: SocketAddr, path_and_query: &str) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(
        stream,
        "GET {path_and_query} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Some(dechunk(body));
    }
    Some(body.to_owned())
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Poll `check` every 250 ms until it returns `Some`, or panic after `limit`.
fn wait_for<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Kills the process when dropped, so a failing test leaves nothing running.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn worker(url: &str, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tenax"));
    command
        .args(["--database-url", url, "worker"])
        .args(["--concurrency", "8", "--poll-interval", "50ms"])
        .args([
            "--bank-latency",
            "5ms",
            "--backoff-base",
            "50ms",
            "--backoff-cap",
            "200ms",
        ])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    command
}

async fn enqueue_accounts(client: &Client, prefix: &str, n: usize, refused_every: usize) {
    for i in 0..n {
        let check = if refused_every > 0 && i % refused_every == 0 {
            'X' // refused by the bank: dead at once, then compensated
        } else {
            '7'
        };
        client
            .enqueue_raw(
                "BANK_OPEN_ACCOUNT",
                &json!({ "customer": format!("{prefix}-{i}"), "id_card": format!("1234567890123456{check}") }),
            )
            .task_no(format!("{prefix}-{i}"))
            .max_attempts(3)
            .await
            .unwrap();
    }
}

fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("tenax.db").display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    if !have("prometheus") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let client = Client::connect(&url).await.unwrap();
    enqueue_accounts(&client, "ACC", 40, 5).await;

    let metrics_addr = free_addr();
    let _worker = Running(
        worker(
            &url,
            &[
                "--metrics-addr",
                &metrics_addr.to_string(),
                "--metrics-sample-interval",
                "200ms",
                "--bank-failure-rate",
                "0.3",
            ],
        )
        .env("TENAX_LOG", "warn")
        .stderr(Stdio::null())
        .spawn()
        .expect("start tenax worker"),
    );
    wait_for("the worker's metrics", Duration::from_secs(30), || {
        http_get(metrics_addr, "/metrics").filter(|text| text.contains("tenax_attempts_total"))
    });

    let prometheus_addr = free_addr();
    let rules = repo_file("deploy/prometheus/tenax-rules.yml");
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: tenax\n    static_configs:\n      - targets: ['{metrics_addr}']\n",
            rules.display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let _prometheus = Running(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={prometheus_addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus"),
    );

    // More work while Prometheus scrapes, so rates move.
    enqueue_accounts(&client, "MORE", 40, 4).await;

    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_file("deploy/grafana/tenax.json")).unwrap(),
    )
    .unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            // Grafana's variable, as Grafana would fill it for a 1 s scrape interval.
            queries.push((
                panel["title"].as_str().unwrap().to_owned(),
                expr.replace("$__rate_interval", "1m"),
            ));
        }
    }
    assert!(queries.len() >= 14, "{queries:?}");
    let answer = |expr: &str| -> Option<Vec<Value>> {
        let body = http_get(
            prometheus_addr,
            &format!("/api/v1/query?query={}", encode(expr)),
        )?;
        let reply: Value = serde_json::from_str(&body).ok()?;
        assert_eq!(reply["status"], "success", "{expr}: {reply}");
        reply["data"]["result"].as_array().cloned()
    };
    for (title, expr) in &queries {
        let result = wait_for(
            &format!("data for {title:?}: {expr}"),
            Duration::from_secs(90),
            || answer(expr).filter(|r| !r.is_empty()),
        );
        eprintln!("{title}: {expr} -> {} series", result.len());
    }

    // Real numbers, not only series: the worker finished tasks, some died.
    let finished = wait_for("succeeded attempts", Duration::from_secs(60), || {
        answer("sum(tenax_attempts_total{outcome=\"succeeded\"})")
            .and_then(|r| r.first()?["value"][1].as_str()?.parse::<f64>().ok())
            .filter(|n| *n >= 1.0)
    });
    assert!(finished >= 1.0);
    let deaths = wait_for("deaths", Duration::from_secs(60), || {
        answer("sum(tenax_task_deaths_total{kind=\"execute\"})")
            .and_then(|r| r.first()?["value"][1].as_str()?.parse::<f64>().ok())
            .filter(|n| *n >= 1.0)
    });
    assert!(deaths >= 1.0);

    // The alerting rules load and evaluate against the real series.
    let groups = wait_for("the rules evaluated", Duration::from_secs(60), || {
        let body = http_get(prometheus_addr, "/api/v1/rules")?;
        let reply: Value = serde_json::from_str(&body).ok()?;
        let groups = reply["data"]["groups"].as_array()?.clone();
        let rules: Vec<&Value> = groups
            .iter()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .collect();
        (!rules.is_empty()
            && rules
                .iter()
                .all(|r| r["lastEvaluation"] != "0001-01-01T00:00:00Z"))
        .then(|| rules.into_iter().cloned().collect::<Vec<_>>())
    });
    assert_eq!(groups.len(), 7, "{groups:#?}");
    for rule in &groups {
        assert_eq!(rule["health"], "ok", "{rule:#}");
    }
}

#[test]
fn promtool_checks_and_unit_tests_the_alerting_rules() {
    if !have("promtool") {
        return;
    }
    let dir = repo_file("deploy/prometheus");
    for args in [
        ["check", "rules", "tenax-rules.yml"],
        ["test", "rules", "tenax-rules.test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Run one task through a worker logging in `format`; return the line the handler
/// wrote.
async fn handler_line(format: &str, task_no: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let client = Client::connect(&url).await.unwrap();
    client
        .enqueue_raw(
            "BANK_OPEN_ACCOUNT",
            &json!({ "customer": "ada", "id_card": "12345678901234567" }),
        )
        .task_no(task_no)
        .await
        .unwrap();
    let mut child = Running(
        worker(&url, &["--log-format", format, "--bank-failure-rate", "0"])
            .env("TENAX_LOG", "info")
            .env_remove("TENAX_LOG_FORMAT")
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tenax worker"),
    );
    let stderr = child.0.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("opening the account at the partner bank") => return line,
            Ok(line) => seen.push(line),
            Err(_) => panic!(
                "no handler line within 30 s; stderr was:\n{}",
                seen.join("\n")
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_lines_written_by_a_handler_carry_the_task_fields() {
    let line = handler_line("json", "ACC-LOG-1").await;
    let entry: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(entry["level"], "INFO", "{entry:#}");
    assert_eq!(entry["fields"]["customer"], "ada", "{entry:#}");
    let span = &entry["span"];
    assert_eq!(span["name"], "task", "{entry:#}");
    assert_eq!(span["task.no"], "ACC-LOG-1", "{entry:#}");
    assert_eq!(span["command.type"], "BANK_OPEN_ACCOUNT", "{entry:#}");
    assert_eq!(span["attempt"], 1, "{entry:#}");
    assert_eq!(span["task.kind"], "execute", "{entry:#}");
    assert!(
        span["task.id"]
            .as_str()
            .is_some_and(|id| id.parse::<i64>().is_ok()),
        "{entry:#}"
    );

    let line = handler_line("text", "ACC-LOG-2").await;
    for field in [
        "task.no=ACC-LOG-2",
        "command.type=BANK_OPEN_ACCOUNT",
        "attempt=1",
        "task.id=",
        "customer=ada",
    ] {
        assert!(line.contains(field), "{field} missing from: {line}");
    }
}

/// With the `otel` feature, a worker given an OTLP endpoint exports a span per attempt
/// carrying the task's fields: a stub collector on the loopback receives them.
#[cfg(feature = "otel")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_are_exported_over_otlp_when_an_endpoint_is_set() {
    let collector = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", collector.local_addr().unwrap());
    let (tx, rx) = mpsc::channel::<(String, Vec<u8>)>();
    std::thread::spawn(move || {
        for stream in collector.incoming() {
            let Ok(mut stream) = stream else { return };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            let mut length = 0usize;
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header).is_err() || header.trim().is_empty() {
                    break;
                }
                if let Some((name, value)) = header.split_once(':') {
                    if name.eq_ignore_ascii_case("content-length") {
                        length = value.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut body = vec![0u8; length];
            let _ = reader.read_exact(&mut body);
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
            );
            if tx.send((request_line, body)).is_err() {
                return;
            }
        }
    });

    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let client = Client::connect(&url).await.unwrap();
    client
        .enqueue_raw(
            "BANK_OPEN_ACCOUNT",
            &json!({ "customer": "ada", "id_card": "12345678901234567" }),
        )
        .task_no("ACC-OTEL-1")
        .await
        .unwrap();
    let _worker = Running(
        worker(&url, &["--bank-failure-rate", "0"])
            .env("TENAX_LOG", "info")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .stderr(Stdio::null())
            .spawn()
            .expect("start tenax worker"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (request, body) = rx.recv_timeout(left).expect("no span export within 30 s");
        assert!(request.starts_with("POST /v1/traces "), "{request}");
        let contains = |needle: &str| body.windows(needle.len()).any(|w| w == needle.as_bytes());
        if contains("ACC-OTEL-1") {
            for field in [
                "task.no",
                "command.type",
                "BANK_OPEN_ACCOUNT",
                "attempt",
                "task.id",
                "tenax",
            ] {
                assert!(contains(field), "{field} missing from the exported span");
            }
            return;
        }
    }
}

/// The status line and body of a GET with an optional bearer token.
fn get_with_token(addr: SocketAddr, path: &str, token: Option<&str>) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{auth}\r\n"
    )
    .ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response.get(9..12)?.parse().ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Some((status, body))
}

/// With `worker.metrics_require_token`, a scrape needs a token of `[[server.tokens]]`
/// whose role may read: 401 without one or with a wrong one, 403 for an enqueue
/// token, the exposition for a read or admin token. A file that requires a token but
/// has none that may read is refused at start.
#[test]
fn metrics_behind_a_token_answer_only_a_reader() {
    const READ: &str = "tnx_metrics_read_token";
    const ENQUEUE: &str = "tnx_metrics_enqueue_token";
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let config = dir.path().join("tenax.toml");
    let token = |name: &str, role: &str, token: &str| {
        format!(
            "[[server.tokens]]\nname = \"{name}\"\nrole = \"{role}\"\nsha256 = \"{}\"\n",
            tenax_server::hash_token(token)
        )
    };
    std::fs::write(
        &config,
        format!(
            "[worker]\nmetrics_require_token = true\n{}{}",
            token("prometheus", "read", READ),
            token("shop", "enqueue", ENQUEUE)
        ),
    )
    .unwrap();
    let metrics_addr = free_addr();
    let mut command = worker(&url, &["--metrics-addr", &metrics_addr.to_string()]);
    let _worker = Running(
        command
            .arg("--config")
            .arg(&config)
            .env("TENAX_LOG", "warn")
            .stderr(Stdio::null())
            .spawn()
            .expect("start tenax worker"),
    );
    let exposition = wait_for("the worker's metrics", Duration::from_secs(30), || {
        get_with_token(metrics_addr, "/metrics", Some(READ))
            .filter(|(status, body)| *status == 200 && body.contains("tenax_"))
            .map(|(_, body)| body)
    });
    assert!(exposition.contains("# TYPE"), "{exposition}");
    let status = |token| get_with_token(metrics_addr, "/metrics", token).unwrap().0;
    assert_eq!(status(None), 401);
    assert_eq!(status(Some("tnx_not_a_token")), 401);
    assert_eq!(status(Some(ENQUEUE)), 403);

    // Required, and no token that may read: refused before it starts.
    std::fs::write(
        &config,
        format!(
            "[worker]\nmetrics_require_token = true\n{}",
            token("shop", "enqueue", ENQUEUE)
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tenax"))
        .arg("--config")
        .arg(&config)
        .args(["config", "check"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("worker.metrics_require_token"), "{stderr}");
}

/// A deployment without `[alerts]`: a task dies, the worker's sampler reports the
/// outbox, and `TenaxDeliveriesStuck` must stay quiet. The gauge the real worker
/// reported after the death is replayed to promtool for 30 minutes, growing by a
/// minute each minute if any row was waiting (as an unsent row's age does), so the
/// rule is judged on what Tenax itself exports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_death_without_alerts_configured_keeps_deliveries_stuck_quiet_for_30_minutes() {
    if !have("promtool") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let url = sqlite_url(dir.path());
    let client = Client::connect(&url).await.unwrap();
    // Refused by the bank: dead at its first attempt.
    enqueue_accounts(&client, "DOOMED", 1, 1).await;
    let metrics_addr = free_addr();
    let _worker = Running(
        worker(
            &url,
            &[
                "--metrics-addr",
                &metrics_addr.to_string(),
                "--metrics-sample-interval",
                "100ms",
            ],
        )
        .env("TENAX_LOG", "warn")
        .stderr(Stdio::null())
        .spawn()
        .expect("start tenax worker"),
    );
    let task = tenax::storage::TaskRef::No(tenax::TaskNo::new("DOOMED-0").unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let record = client.get(&task).await.unwrap();
        if record.is_some_and(|r| r.status == tenax::TaskStatus::Dead) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the task did not die within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A sample taken after the death: its timestamp moves past the moment seen.
    let sample_time = |text: &str| gauge(text, "tenax_sampler_last_success_timestamp_seconds", "");
    let died_by = wait_for("a sample", Duration::from_secs(30), || {
        http_get(metrics_addr, "/metrics").and_then(|t| sample_time(&t))
    });
    let text = wait_for("a sample after the death", Duration::from_secs(30), || {
        http_get(metrics_addr, "/metrics")
            .filter(|t| sample_time(t).is_some_and(|s| s > died_by + 0.15))
    });
    let pending = gauge(&text, "tenax_outbox_pending", "{kind=\"death\"}").expect("pending gauge");
    let age = gauge(
        &text,
        "tenax_outbox_oldest_pending_age_seconds",
        "{kind=\"death\"}",
    )
    .expect("age gauge");
    eprintln!("after the death: pending {pending}, oldest age {age} s");
    let growth = if pending > 0.0 { 60 } else { 0 };
    let test = dir.path().join("no-alerts.test.yml");
    std::fs::write(
        &test,
        format!(
            "rule_files:\n  - {}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n      \
             - series: 'tenax_outbox_oldest_pending_age_seconds{{kind=\"death\"}}'\n        values: '{}+{growth}x30'\n    \
             alert_rule_test:\n      - eval_time: 30m\n        alertname: TenaxDeliveriesStuck\n        exp_alerts: []\n",
            repo_file("deploy/prometheus/tenax-rules.yml").display(),
            age.round()
        ),
    )
    .unwrap();
    let out = Command::new("promtool")
        .args(["test", "rules"])
        .arg(&test)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "TenaxDeliveriesStuck fired without alerts configured (pending {pending}, age {age}):\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The value of a gauge line `name{labels} value` in a Prometheus text page.
fn gauge(text: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = format!("{name}{labels} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}
