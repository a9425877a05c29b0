//! The security battery against a real `tenax serve` over its socket: SQL injection in
//! every filter and path parameter on SQLite, PostgreSQL and MariaDB (no 5xx, no slow
//! answer, nothing changed, literal results); oversized, lying, chunked, compressed,
//! deeply nested and malformed bodies and wrong content types; slow clients
//! (slowloris) that must not starve a normal one; every way of presenting a bad token,
//! two `Authorization` headers included; path traversal in file-facing inputs and in
//! `http` task paths (dot segments in every encoding, which must not leave the
//! target's base path, at enqueue nor before sending); secrets never in answers, logs,
//! alerts or metrics; `exec` arguments never reaching a shell; and source rules (no
//! SQL text built from input, no `==` on tokens).
//!
//! Each case appends its counts to `security-counts.txt` in the test's temporary
//! target folder, which CI prints.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tenax::storage::{Storage, TaskListParams};

const ADMIN: &str = "tnx_security_admin_token";
const ENQUEUER: &str = "tnx_security_enqueue_token";
const READER: &str = "tnx_security_read_token";
/// A secret payload field's value: must never come back out.
const SECRET: &str = "s3cret-hunter2-value";
/// No answer to a hostile filter may take longer (a `SLEEP(5)` that ran would).
const SLOW: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------
// Counts for CI.

fn report(line: &str) {
    eprintln!("security: {line}");
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("security-counts.txt");
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(file, "security: {line}");
    }
}

// ---------------------------------------------------------------------------------
// A real `tenax serve`.

struct Server {
    child: Child,
    addr: String,
    log: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

fn config(extra: &str) -> String {
    format!(
        "[server]\ncommand_types = [\"echo\", \"exec\"]\nwait_max = \"1s\"\n\
         [[server.tokens]]\nname = \"ops\"\nrole = \"admin\"\nsha256 = \"{}\"\n\
         [[server.tokens]]\nname = \"shop\"\nrole = \"enqueue\"\nsha256 = \"{}\"\n\
         [[server.tokens]]\nname = \"viewer\"\nrole = \"read\"\nsha256 = \"{}\"\n\
         [server.secrets]\necho = [\"password\", \"card.number\"]\nexec = [\"password\"]\n{extra}",
        tenax_server::hash_token(ADMIN),
        tenax_server::hash_token(ENQUEUER),
        tenax_server::hash_token(READER),
    )
}

fn start(dir: &Path, db_url: &str, config: &str, args: &[&str], env: &[(&str, &str)]) -> Server {
    let path = dir.join("tenax.toml");
    std::fs::write(&path, config).unwrap();
    let log = dir.join("serve.log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_tenax"));
    command
        .arg("--config")
        .arg(&path)
        .args(["--database-url", db_url, "serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .env("TENAX_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()));
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("start tenax serve");
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
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
    let addr = line
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    Server { child, addr, log }
}

// ---------------------------------------------------------------------------------
// HTTP over a plain socket, byte for byte what the test writes.

struct Answer {
    status: u16,
    head: String,
    body: String,
    took: Duration,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| {
            panic!(
                "{}: body is not JSON ({e}): {:.300}",
                self.status, self.body
            )
        })
    }

    /// The error code, checking the error shape.
    fn code(&self) -> String {
        let body = self.json();
        let code = body["error"]["code"].as_str();
        assert!(
            code.is_some() && body["error"]["message"].is_string(),
            "not an error body: {} {:.300}",
            self.status,
            self.body
        );
        code.unwrap().to_owned()
    }

    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    }
}

fn decode_chunked(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(end) = rest.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = std::str::from_utf8(&rest[..end])
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
            .unwrap_or(0);
        if size == 0 || rest.len() < end + 2 + size {
            return out;
        }
        out.extend_from_slice(&rest[end + 2..end + 2 + size]);
        rest = &rest[(end + 4 + size).min(rest.len())..];
    }
}

/// Send `raw` as is and read the whole answer (the request says `Connection: close`).
fn send_raw(addr: &str, raw: &[u8]) -> Answer {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    // The server may answer (413) and close before it has read all of a big body.
    let _ = stream.write_all(raw);
    let mut bytes = Vec::new();
    let _ = stream.read_to_end(&mut bytes);
    parse(&bytes, started.elapsed())
}

fn parse(bytes: &[u8], took: Duration) -> Answer {
    let split = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no answer head: {:?}", String::from_utf8_lossy(bytes)));
    let head = String::from_utf8_lossy(&bytes[..split]).to_string();
    let status = head[9..12].parse().unwrap();
    let mut body = bytes[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = decode_chunked(&body);
    }
    Answer {
        status,
        head,
        body: String::from_utf8_lossy(&body).to_string(),
        took,
    }
}

fn request(
    addr: &str,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let mut raw = format!("{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        raw.push_str(&format!("{name}: {value}\r\n"));
    }
    raw.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut raw = raw.into_bytes();
    raw.extend_from_slice(body);
    send_raw(addr, &raw)
}

fn call(addr: &str, method: &str, target: &str, token: Option<&str>, body: Option<&str>) -> Answer {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = Vec::new();
    if let Some(auth) = &auth {
        headers.push(("Authorization", auth.as_str()));
    }
    if body.is_some() {
        headers.push(("Content-Type", "application/json"));
    }
    request(
        addr,
        method,
        target,
        &headers,
        body.unwrap_or("").as_bytes(),
    )
}

/// Percent-encode everything but unreserved characters.
fn enc(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Everything the API can change, to compare before and after.
async fn snapshot(storage: &Arc<dyn Storage>) -> String {
    let (tasks, schedules, queues, audit) = parts(storage).await;
    format!("{tasks}\n{schedules}\n{queues:?}\n{audit}")
}

/// Tasks, schedules, queues (name and debug form) and the audit trail's length.
async fn parts(storage: &Arc<dyn Storage>) -> (String, String, Vec<(String, String)>, usize) {
    let tasks = storage
        .task_list(&TaskListParams {
            limit: 10_000,
            ..TaskListParams::default()
        })
        .await
        .unwrap();
    let schedules = storage.schedule_list().await.unwrap();
    let queues = storage
        .queue_list()
        .await
        .unwrap()
        .into_iter()
        .map(|q| (q.name.clone(), format!("{q:?}")))
        .collect();
    let audit = storage
        .audit_list(&tenax::storage::AuditListParams {
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    (
        format!("{tasks:?}"),
        format!("{schedules:?}"),
        queues,
        audit.len(),
    )
}

// ---------------------------------------------------------------------------------
// S3: SQL injection in every filter and path parameter, on every backend.

/// About sixty strings that attack SQL text built from input, for every dialect.
fn injections() -> Vec<String> {
    let mut list: Vec<String> = [
        "' OR 1=1--",
        "' OR '1'='1",
        "\" OR \"1\"=\"1",
        "') OR ('1'='1",
        "'; DROP TABLE tenax_tasks;--",
        "'; DROP TABLE tasks;--",
        "'; DELETE FROM tenax_tasks;--",
        "'; UPDATE tenax_tasks SET status='dead';--",
        "'; TRUNCATE tenax_tasks;--",
        "1) UNION SELECT NULL--",
        "1' UNION SELECT task_no, payload FROM tenax_tasks--",
        "' UNION ALL SELECT NULL,NULL,NULL--",
        "1 OR 1=1",
        "1; SELECT 1",
        "-1 OR 2>1",
        "0x27",
        "'||pg_sleep(5)--",
        "';SELECT pg_sleep(5)--",
        "1;SELECT pg_sleep(5)",
        "' AND SLEEP(5)-- ",
        "' OR SLEEP(5)#",
        "1 AND SLEEP(5)",
        "'; WAITFOR DELAY '0:0:5'--",
        "' AND randomblob(500000000)--",
        "' OR (SELECT COUNT(*) FROM sqlite_master)>0--",
        "'/**/OR/**/1=1--",
        "admin'--",
        "admin'#",
        "' OR 'x' LIKE 'x",
        "%' OR '%'='",
        "%",
        "_",
        "%%",
        "\\",
        "\\'",
        "\\\\'; DROP TABLE tenax_tasks;--",
        "\\0",
        "\0",
        "a\0b' OR 1=1--",
        "\u{2019} OR 1=1--",
        "\u{02bc} OR \u{02bc}1\u{02bc}=\u{02bc}1",
        "\u{ff07} OR 1=1--",
        "\u{201c}; DROP TABLE tenax_tasks;--",
        "$1",
        "?",
        "?1 OR 1=1",
        ":name",
        "@@version",
        "' AND extractvalue(1,concat(0x7e,version()))--",
        "'; COPY tenax_tasks TO '/tmp/x';--",
        "'; ATTACH DATABASE '/tmp/x.db' AS x;--",
        "' OR json_extract(payload,'$.password') IS NOT NULL--",
        "1e309",
        "-9223372036854775809",
        "18446744073709551616",
        "NULL",
        "true",
        "[]",
        "{}",
        "'\n OR 1=1--",
        "'\r\nX-Injected: 1",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    list.push(format!("'{}", "A".repeat(100 * 1024)));
    list
}

/// `(method, target template with {} for the attack, mutates)`.
fn attacked_targets() -> Vec<(&'static str, &'static str, bool)> {
    vec![
        ("GET", "/v1/tasks?status={}", false),
        ("GET", "/v1/tasks?type={}", false),
        ("GET", "/v1/tasks?queue={}", false),
        ("GET", "/v1/tasks?created_after={}", false),
        ("GET", "/v1/tasks?created_before={}", false),
        ("GET", "/v1/tasks?limit={}", false),
        ("GET", "/v1/tasks?cursor={}", false),
        ("GET", "/v1/audit?actor={}", false),
        ("GET", "/v1/audit?action={}", false),
        ("GET", "/v1/audit?cursor={}", false),
        ("GET", "/v1/workflows?cursor={}", false),
        ("GET", "/ui/tasks?task_no={}", false),
        ("GET", "/ui/tasks?queue={}&type={}", false),
        ("GET", "/v1/tasks/{}", false),
        ("GET", "/v1/tasks/by-no/{}", false),
        ("GET", "/v1/tasks/{}/attempts", false),
        ("GET", "/v1/tasks/{}/wait?timeout_ms=0", false),
        ("GET", "/v1/workflows/{}", false),
        ("GET", "/ui/tasks/{}", false),
        ("POST", "/v1/tasks/{}/cancel", true),
        ("POST", "/v1/tasks/{}/retry", true),
        ("POST", "/v1/schedules/{}/pause", true),
        ("POST", "/v1/schedules/{}/resume", true),
        ("DELETE", "/v1/schedules/{}", true),
        ("POST", "/v1/queues/{}/pause", true),
        ("POST", "/v1/queues/{}/resume", true),
    ]
}

async fn sql_injection_changes_nothing(backend: &str, storage: Arc<dyn Storage>, url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), url, &config(""), &["--no-workers"], &[]);
    let addr = server.addr.clone();
    // The data an attack would reach for, with a quote in a task number to check that
    // strings are matched literally.
    for body in [
        json!({"command_type": "echo", "task_no": "o'brien-1", "queue": "q1", "payload": {"password": SECRET}}),
        json!({"command_type": "echo", "task_no": "canary-2", "payload": {"n": 2}}),
        json!({"command_type": "exec", "task_no": "canary-3", "queue": "q2", "payload": {"program": "echo"}}),
    ] {
        let answer = call(
            &addr,
            "POST",
            "/v1/tasks",
            Some(ADMIN),
            Some(&body.to_string()),
        );
        assert_eq!(answer.status, 201, "{}", answer.body);
    }
    let schedule = json!({"name": "nightly", "command_type": "echo", "cron": "0 2 * * *"});
    let answer = call(
        &addr,
        "POST",
        "/v1/schedules",
        Some(ADMIN),
        Some(&schedule.to_string()),
    );
    assert_eq!(answer.status, 201, "{}", answer.body);
    let (tasks, schedules, queues, audit) = parts(&storage).await;

    let mut requests = 0u32;
    let mut accepted = std::collections::BTreeSet::new();
    let mut actions = 0;
    let mut server_errors = 0u32;
    let mut slowest = Duration::ZERO;
    for attack in injections() {
        let encoded = enc(&attack);
        for (method, template, mutates) in attacked_targets() {
            let target = template.replace("{}", &encoded);
            let answer = call(&addr, method, &target, Some(ADMIN), None);
            requests += 1;
            slowest = slowest.max(answer.took);
            let what = format!("{backend}: {method} {:.120}", target);
            if answer.status >= 500 {
                server_errors += 1;
            }
            assert!(
                answer.status < 500,
                "{what}: {} {:.300}",
                answer.status,
                answer.body
            );
            assert!(answer.took < SLOW, "{what}: took {:?}", answer.took);
            if mutates && (200..300).contains(&answer.status) {
                // Only a queue is made by naming it, and a queue name may hold any
                // printable character: then it must be taken literally.
                assert!(
                    template.starts_with("/v1/queues/"),
                    "{what}: accepted: {}",
                    answer.body
                );
                assert_eq!(answer.json()["name"], attack.as_str(), "{what}");
                accepted.insert(attack.clone());
                actions += 1;
            }
            let json_route = target.starts_with("/v1/");
            if json_route && answer.status >= 400 && answer.status != 414 && answer.status != 431 {
                answer.code();
            }
            // Literal semantics: a filter that was accepted matched nothing (no task,
            // queue, actor or action has these names).
            if json_route && answer.status == 200 && method == "GET" {
                let body = answer.json();
                for list in ["tasks", "entries", "workflows"] {
                    if let Some(items) = body[list].as_array() {
                        let filtered = !template.contains("cursor=");
                        assert!(
                            !filtered || items.is_empty(),
                            "{what}: matched {} rows",
                            items.len()
                        );
                    }
                }
            }
            assert!(
                !answer.body.contains(SECRET),
                "{what}: the secret came back"
            );
        }
    }
    // Nothing changed, and the tables are all still there: the same tasks and
    // schedules, the same queues, plus the queues named literally by accepted pauses
    // (each recorded in the audit trail).
    let (tasks_after, schedules_after, queues_after, audit_after) = parts(&storage).await;
    assert_eq!(tasks_after, tasks, "{backend}: an attack changed the tasks");
    assert_eq!(
        schedules_after, schedules,
        "{backend}: an attack changed the schedules"
    );
    for queue in &queues {
        assert!(
            queues_after.contains(queue),
            "{backend}: queue {queue:?} changed"
        );
    }
    for (name, _) in &queues_after {
        assert!(
            queues.iter().any(|(n, _)| n == name) || accepted.contains(name),
            "{backend}: queue {name:?} appeared"
        );
    }
    assert_eq!(audit_after, audit + actions, "{backend}: audit entries");
    // The quote in a task number is just a character.
    let found = call(
        &addr,
        "GET",
        &format!("/v1/tasks/by-no/{}", enc("o'brien-1")),
        Some(ADMIN),
        None,
    );
    assert_eq!(found.status, 200, "{}", found.body);
    assert_eq!(found.json()["task_no"], "o'brien-1");
    assert_eq!(found.json()["payload"]["password"], "***");
    let q1 = call(&addr, "GET", "/v1/tasks?queue=q1", Some(ADMIN), None);
    assert_eq!(q1.json()["tasks"].as_array().unwrap().len(), 1);
    assert!(!server.log().contains(SECRET), "the secret is in the log");
    assert!(!server.log().contains(ADMIN), "the token is in the log");
    assert!(
        !server.log().contains("pw-DSN-secret-7"),
        "the database password is in the log"
    );
    report(&format!(
        "sql injection on {backend}: {} strings x {} parameters = {requests} requests, \
         {server_errors} 5xx, slowest {} ms, data unchanged ({} queue names taken literally)",
        injections().len(),
        attacked_targets().len(),
        slowest.as_millis(),
        accepted.len()
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn battery_sql_injection_sqlite() {
    let h = tenax_storage::testing::sqlite_file().await.unwrap();
    sql_injection_changes_nothing("sqlite", h.storage.clone(), &h.url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn battery_sql_injection_postgres() {
    let Some(h) = tenax_storage::testing::postgres_from_env().await else {
        return;
    };
    // A password in the URL (the test server trusts local connections, so any works):
    // it must not reach the log.
    let url = h
        .url
        .replacen("://postgres@", "://postgres:pw-DSN-secret-7@", 1);
    sql_injection_changes_nothing("postgres", h.storage.clone(), &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn battery_sql_injection_mysql() {
    let Some(h) = tenax_storage::testing::mysql_from_env().await else {
        return;
    };
    sql_injection_changes_nothing("mysql", h.storage.clone(), &h.url).await;
}

// ---------------------------------------------------------------------------------
// S4, S5: hostile bodies and content types.

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn battery_hostile_bodies_are_refused_and_change_nothing() {
    let h = tenax_storage::testing::sqlite_file().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &h.url, &config(""), &["--no-workers"], &[]);
    let addr = server.addr.clone();
    let seeded = call(
        &addr,
        "POST",
        "/v1/tasks",
        Some(ADMIN),
        Some(r#"{"command_type":"echo","task_no":"seed-1"}"#),
    );
    assert_eq!(seeded.status, 201);
    let before = snapshot(&h.storage).await;
    let auth = format!("Bearer {ADMIN}");
    let mut requests = 0;

    // Over the 1 MiB limit, announced honestly: refused before it is read.
    let big = vec![b'x'; 1024 * 1024 + 1];
    let answer = request(
        &addr,
        "POST",
        "/v1/tasks",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
        ],
        &big,
    );
    assert_eq!(answer.status, 413, "{}", answer.body);
    assert_eq!(answer.code(), "payload_too_large");
    requests += 1;
    // A lying Content-Length (100 MiB announced, a few bytes sent): refused at once,
    // without waiting for bytes that never come.
    let raw = format!(
        "POST /v1/tasks HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: {auth}\r\n\
         Content-Type: application/json\r\nContent-Length: 104857600\r\n\r\n{{}}"
    );
    let answer = send_raw(&addr, raw.as_bytes());
    assert_eq!(answer.status, 413, "{}", answer.body);
    assert!(answer.took < Duration::from_secs(2), "{:?}", answer.took);
    requests += 1;
    // A Content-Length smaller than the body: the rest is a second, malformed request
    // on the connection, never part of the first.
    let raw = format!(
        "POST /v1/tasks HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: {auth}\r\n\
         Content-Type: application/json\r\nContent-Length: 5\r\n\r\n{{\"command_type\":\"echo\"}}"
    );
    let answer = send_raw(&addr, raw.as_bytes());
    assert_eq!(answer.status, 400, "{}", answer.body);
    assert_eq!(answer.code(), "invalid_json");
    requests += 1;
    // Chunked, without a length, over the limit: cut off while read.
    let mut raw = format!(
        "POST /v1/tasks HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: {auth}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    let chunk = vec![b' '; 64 * 1024];
    for _ in 0..20 {
        raw.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        raw.extend_from_slice(&chunk);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    let answer = send_raw(&addr, &raw);
    assert_eq!(answer.status, 413, "{}", answer.body);
    requests += 1;
    // Compressed: never inflated (a 1 KiB gzip of zeros could inflate to gigabytes); it
    // is not JSON, so it is refused.
    let gzip_header = [0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0, 0x03, 0x01, 0x02];
    let answer = request(
        &addr,
        "POST",
        "/v1/tasks",
        &[
            ("Authorization", &auth),
            ("Content-Type", "application/json"),
            ("Content-Encoding", "gzip"),
        ],
        &gzip_header,
    );
    assert!(
        (400..500).contains(&answer.status),
        "{} {}",
        answer.status,
        answer.body
    );
    answer.code();
    requests += 1;

    // Malformed JSON and values: each a 4xx in the error shape.
    let deep = format!(
        "{{\"command_type\":\"echo\",\"payload\":{}{}}}",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let many_keys = {
        let keys: Vec<String> = (0..60_000).map(|i| format!("\"k{i}\":1")).collect();
        format!(
            "{{\"command_type\":\"echo\",\"payload\":{{{}}}}}",
            keys.join(",")
        )
    };
    let long_no = format!(
        "{{\"command_type\":\"echo\",\"task_no\":\"{}\"}}",
        "n".repeat(256)
    );
    let bom = format!("\u{feff}{}", r#"{"command_type":"echo"}"#);
    let cases: Vec<(&str, Vec<u8>, &[u16])> = vec![
        ("truncated", br#"{"command_type":"ec"#.to_vec(), &[400]),
        (
            "invalid UTF-8",
            b"{\"command_type\":\"ech\xff\xfe\"}".to_vec(),
            &[400],
        ),
        ("a byte-order mark", bom.into_bytes(), &[400]),
        (
            "duplicate keys",
            br#"{"command_type":"echo","command_type":"echo"}"#.to_vec(),
            &[400, 422],
        ),
        ("wrong type", br#"{"command_type":7}"#.to_vec(), &[422]),
        (
            "priority -1",
            br#"{"command_type":"echo","priority":-1}"#.to_vec(),
            &[422],
        ),
        (
            "priority 10",
            br#"{"command_type":"echo","priority":10}"#.to_vec(),
            &[422],
        ),
        (
            "1e400",
            br#"{"command_type":"echo","priority":1e400}"#.to_vec(),
            &[400, 422],
        ),
        (
            "delay u64::MAX",
            br#"{"command_type":"echo","delay_ms":18446744073709551615}"#.to_vec(),
            &[422],
        ),
        (
            "delay i64::MIN",
            br#"{"command_type":"echo","delay_ms":-9223372036854775808}"#.to_vec(),
            &[422],
        ),
        (
            "delay a float",
            br#"{"command_type":"echo","delay_ms":1.5}"#.to_vec(),
            &[422],
        ),
        (
            "delay NaN",
            br#"{"command_type":"echo","delay_ms":NaN}"#.to_vec(),
            &[400],
        ),
        (
            "run_at past 9999",
            br#"{"command_type":"echo","run_at":"+10000-01-01T00:00:00Z"}"#.to_vec(),
            &[422],
        ),
        (
            "empty task_no",
            br#"{"command_type":"echo","task_no":""}"#.to_vec(),
            &[422],
        ),
        ("task_no over 255 bytes", long_no.into_bytes(), &[422]),
        ("nesting 10^4 deep", deep.into_bytes(), &[400]),
        ("60 000 keys", many_keys.into_bytes(), &[201, 413, 422]),
        (
            "a cron with L",
            br#"{"name":"x","command_type":"echo","cron":"0 0 L * *"}"#.to_vec(),
            &[201, 422],
        ),
        (
            "a cron that never fires",
            br#"{"name":"x","command_type":"echo","cron":"0 0 30 2 *"}"#.to_vec(),
            &[422],
        ),
        (
            "a cron step of 0",
            br#"{"name":"x","command_type":"echo","cron":"*/0 * * * *"}"#.to_vec(),
            &[422],
        ),
    ];
    for (what, body, expected) in &cases {
        let target = if what.contains("cron") {
            "/v1/schedules"
        } else {
            "/v1/tasks"
        };
        let answer = request(
            &addr,
            "POST",
            target,
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            body,
        );
        requests += 1;
        assert!(
            expected.contains(&answer.status),
            "{what}: {} {:.300}",
            answer.status,
            answer.body
        );
        if answer.status >= 400 {
            answer.code();
        } else {
            // Accepted: undo, so that "nothing changed" holds for what must be refused.
            let value = answer.json();
            if let Some(id) = value["id"].as_i64() {
                let cancel = call(
                    &addr,
                    "POST",
                    &format!("/v1/tasks/{id}/cancel"),
                    Some(ADMIN),
                    None,
                );
                assert_eq!(cancel.status, 200, "{}", cancel.body);
            }
            if value["name"].is_string() {
                let gone = call(&addr, "DELETE", "/v1/schedules/x", Some(ADMIN), None);
                assert!(gone.status < 300, "{}", gone.body);
            }
        }
    }
    // Wrong content types: 415, nothing read as JSON.
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        Some("application/xml"),
        Some("application/jsonp"),
    ] {
        let mut headers = vec![("Authorization", auth.as_str())];
        if let Some(ct) = content_type {
            headers.push(("Content-Type", ct));
        }
        let answer = request(
            &addr,
            "POST",
            "/v1/tasks",
            &headers,
            br#"{"command_type":"echo"}"#,
        );
        requests += 1;
        assert_eq!(answer.status, 415, "{content_type:?}: {}", answer.body);
        assert_eq!(answer.code(), "unsupported_media_type");
    }
    let after = snapshot(&h.storage).await;
    // Accepted-then-cancelled tasks are the only change allowed: compare the rest.
    let before_tasks = before.lines().next().unwrap().matches("TaskRecord").count();
    let after_tasks = after.lines().next().unwrap().matches("TaskRecord").count();
    let accepted = cases
        .iter()
        .filter(|(w, _, e)| e.contains(&201) && !w.contains("cron"))
        .count();
    assert!(
        after_tasks <= before_tasks + accepted,
        "{before_tasks} -> {after_tasks}"
    );

    // 100 concurrent uploads of 1 MiB + 1 byte: all refused, and the server's memory
    // does not grow with them.
    let rss_before = rss_kib(server.pid());
    let threads: Vec<_> = (0..100)
        .map(|_| {
            let addr = addr.clone();
            let auth = auth.clone();
            std::thread::spawn(move || {
                let big = vec![b'x'; 1024 * 1024 + 1];
                let mut raw = format!(
                    "POST /v1/tasks HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: {auth}\r\n\
                     Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
                    big.len()
                )
                .into_bytes();
                raw.extend_from_slice(&big);
                raw.extend_from_slice(b"\r\n0\r\n\r\n");
                send_raw(&addr, &raw).status
            })
        })
        .collect();
    let statuses: Vec<u16> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    requests += statuses.len();
    assert!(statuses.iter().all(|s| *s == 413), "{statuses:?}");
    let rss_after = rss_kib(server.pid());
    let rise_mib = rss_after.saturating_sub(rss_before) / 1024;
    assert!(rise_mib < 64, "RSS rose by {rise_mib} MiB");
    assert!(!server.log().contains("panicked at"), "{}", server.log());
    report(&format!(
        "hostile bodies: {requests} requests, 0 5xx, RSS rise under 100 concurrent oversized uploads {rise_mib} MiB"
    ));
}

// ---------------------------------------------------------------------------------
// S16: slow clients.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn battery_slow_clients_do_not_starve_a_normal_one() {
    let h = tenax_storage::testing::sqlite_file().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &h.url, &config(""), &["--no-workers"], &[]);
    let addr = server.addr.clone();
    // 1000 connections that send part of a request head and then nothing.
    let mut slow = Vec::new();
    for i in 0..1000 {
        let mut stream = TcpStream::connect(&addr).unwrap();
        write!(
            stream,
            "GET /v1/tasks HTTP/1.1\r\nHost: {addr}\r\nX-Slow-{i}: "
        )
        .unwrap();
        slow.push(stream);
    }
    // One whose head is complete but whose body stalls.
    let mut stalled = TcpStream::connect(&addr).unwrap();
    write!(
        stalled,
        "POST /v1/tasks HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {ADMIN}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"command_type\""
    )
    .unwrap();
    let opened = Instant::now();
    // A normal client keeps being served quickly.
    let mut latencies = Vec::new();
    for _ in 0..100 {
        let answer = call(&addr, "GET", "/v1/tasks?limit=5", Some(READER), None);
        assert_eq!(answer.status, 200, "{}", answer.body);
        latencies.push(answer.took);
    }
    latencies.sort();
    let p99 = latencies[98];
    assert!(
        p99 < Duration::from_millis(200),
        "p99 {p99:?} with 1000 slow clients"
    );
    // The slow heads are cut off after the header deadline, the stalled body after the
    // stall deadline (both 10 s), with some slack for a loaded machine.
    let limit = tenax_server::HEADER_TIMEOUT + Duration::from_secs(10);
    let mut closed = 0;
    for stream in slow
        .iter_mut()
        .step_by(50)
        .chain(std::iter::once(&mut stalled))
    {
        let left = limit
            .saturating_sub(opened.elapsed())
            .max(Duration::from_millis(1));
        stream.set_read_timeout(Some(left)).unwrap();
        let mut buf = Vec::new();
        match stream.read_to_end(&mut buf) {
            Ok(_) => closed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => closed += 1,
            Err(e) => panic!(
                "a slow connection was still open after {:?}: {e}",
                opened.elapsed()
            ),
        }
        if !buf.is_empty() {
            // The stalled body gets an error answer, never a 5xx.
            let answer = parse(&buf, Duration::ZERO);
            assert!(
                (400..500).contains(&answer.status),
                "{} {}",
                answer.status,
                answer.body
            );
        }
    }
    let cut = opened.elapsed();
    assert!(
        cut >= tenax_server::HEADER_TIMEOUT - Duration::from_secs(1),
        "closed too early: {cut:?}"
    );
    report(&format!(
        "slow clients: 1000 slowloris connections + 1 stalled body; normal client p99 {} ms over 100 requests; \
         {closed} sampled slow connections closed after {} s",
        p99.as_millis(),
        cut.as_secs()
    ));
}

// ---------------------------------------------------------------------------------
// S1: every way of presenting a bad token, on every route, over the socket.

/// A way of presenting a token: what, extra headers, query string.
type Presented = (&'static str, Vec<(String, String)>, String);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn battery_every_bad_token_is_refused_the_same_way_on_every_route() {
    let h = tenax_storage::testing::sqlite_file().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &h.url, &config(""), &["--no-workers"], &[]);
    let addr = server.addr.clone();
    let seeded = call(
        &addr,
        "POST",
        "/v1/tasks",
        Some(ADMIN),
        Some(r#"{"command_type":"echo"}"#),
    );
    let id = seeded.json()["id"].as_i64().unwrap();
    let presented: Vec<Presented> = vec![
        ("missing", vec![], String::new()),
        (
            "empty",
            vec![("Authorization".into(), "Bearer ".into())],
            String::new(),
        ),
        (
            "wrong",
            vec![("Authorization".into(), "Bearer tnx_not_a_token".into())],
            String::new(),
        ),
        (
            "another scheme",
            vec![("Authorization".into(), format!("Basic {ADMIN}"))],
            String::new(),
        ),
        (
            "no scheme",
            vec![("Authorization".into(), ADMIN.into())],
            String::new(),
        ),
        (
            "token scheme",
            vec![("Authorization".into(), format!("Token {ADMIN}"))],
            String::new(),
        ),
        (
            "a prefix of the token",
            vec![(
                "Authorization".into(),
                format!("Bearer {}", &ADMIN[..ADMIN.len() - 1]),
            )],
            String::new(),
        ),
        (
            "the token's hash",
            vec![(
                "Authorization".into(),
                format!("Bearer {}", tenax_server::hash_token(ADMIN)),
            )],
            String::new(),
        ),
        (
            "in the query",
            vec![],
            format!("access_token={ADMIN}&token={ADMIN}"),
        ),
        (
            "in a cookie",
            vec![(
                "Cookie".into(),
                format!("token={ADMIN}; tenax_token={ADMIN}"),
            )],
            String::new(),
        ),
        (
            "in another header",
            vec![
                ("X-Api-Key".into(), ADMIN.into()),
                ("X-Tenax-Token".into(), ADMIN.into()),
            ],
            String::new(),
        ),
    ];
    let routes: Vec<_> = tenax_server::ROUTES
        .iter()
        .chain(tenax_server::DASHBOARD_ROUTES)
        .filter(|r| r.access != tenax_server::Access::Open)
        .collect();
    let mut requests = 0;
    let mut bodies = std::collections::BTreeSet::new();
    for route in &routes {
        let path = route
            .path
            .replace("{id}", &id.to_string())
            .replace("{task_no}", "x")
            .replace("{name}", "x");
        for (what, headers, query) in &presented {
            let target = if query.is_empty() {
                path.clone()
            } else {
                format!("{path}?{query}")
            };
            let mut all: Vec<(&str, &str)> = headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            all.push(("Content-Type", "application/json"));
            let answer = request(&addr, route.method, &target, &all, b"{}");
            requests += 1;
            assert_eq!(
                answer.status, 401,
                "{} {} with a token {what}: {}",
                route.method, route.path, answer.body
            );
            assert_eq!(answer.code(), "unauthorized");
            assert_eq!(answer.header("WWW-Authenticate").as_deref(), Some("Bearer"));
            let message = answer.json()["error"]["message"]
                .as_str()
                .unwrap()
                .to_owned();
            assert!(!message.contains(ADMIN), "{message}");
            bodies.insert(message);
        }
    }
    // Two messages at most: "missing" and "not valid"; nothing about which token or why.
    assert!(bodies.len() <= 2, "{bodies:?}");
    // Two Authorization headers, the valid one first or second: refused, not read.
    let admin = format!("Bearer {ADMIN}");
    let pairs = [
        [admin.as_str(), "Bearer tnx_not_a_token"],
        ["Bearer tnx_not_a_token", admin.as_str()],
        [admin.as_str(), admin.as_str()],
    ];
    for route in &routes {
        let path = route
            .path
            .replace("{id}", &id.to_string())
            .replace("{task_no}", "x")
            .replace("{name}", "x");
        for [first, second] in &pairs {
            let headers = [
                ("Authorization", *first),
                ("Authorization", *second),
                ("Content-Type", "application/json"),
            ];
            let answer = request(&addr, route.method, &path, &headers, b"{}");
            requests += 1;
            assert_eq!(
                answer.status, 400,
                "{} {} with two Authorization headers: {}",
                route.method, route.path, answer.body
            );
            assert_eq!(answer.code(), "bad_request");
        }
    }
    // A read-only token may not cancel or retry; an enqueuer may not read lists.
    for (token, method, path) in [
        (READER, "POST", format!("/v1/tasks/{id}/cancel")),
        (READER, "POST", format!("/v1/tasks/{id}/retry")),
        (READER, "POST", "/v1/tasks".to_owned()),
        (ENQUEUER, "POST", format!("/v1/tasks/{id}/cancel")),
        (ENQUEUER, "GET", "/v1/tasks".to_owned()),
        (ENQUEUER, "GET", "/ui/tasks".to_owned()),
    ] {
        let answer = call(&addr, method, &path, Some(token), Some("{}"));
        requests += 1;
        assert_eq!(answer.status, 403, "{method} {path}: {}", answer.body);
        assert_eq!(answer.code(), "forbidden");
    }
    // No route answers an unauthenticated GET with data; the open ones hold none.
    for open in [
        "/healthz",
        "/readyz",
        "/openapi.json",
        "/",
        "/assets/app.js",
    ] {
        let answer = call(&addr, "GET", open, None, None);
        requests += 1;
        assert_eq!(answer.status, 200, "{open}");
        assert!(!answer.body.contains("seed"), "{open}");
    }
    // The dashboard's headers on every answer, an error included.
    for path in ["/", "/ui/tasks", "/v1/tasks", "/nothing"] {
        let answer = call(&addr, "GET", path, Some(ADMIN), None);
        requests += 1;
        let csp = answer.header("Content-Security-Policy").unwrap_or_default();
        assert!(
            csp.contains("default-src 'self'") || csp.contains("default-src 'none'"),
            "{path}: {csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert_eq!(
            answer.header("X-Content-Type-Options").as_deref(),
            Some("nosniff"),
            "{path}"
        );
        assert!(
            answer.header("Set-Cookie").is_none(),
            "{path}: no cookie is ever set"
        );
    }
    let log = server.log();
    assert!(!log.contains(ADMIN), "the token is in the log");
    assert!(
        !log.contains(&ADMIN[..ADMIN.len() - 1]),
        "a prefix of the token is in the log"
    );
    report(&format!(
        "auth: {} routes x ({} ways of presenting a bad token + {} pairs of Authorization headers) + roles + open routes = {requests} requests, 0 accepted",
        routes.len(),
        presented.len(),
        pairs.len()
    ));
}

// ---------------------------------------------------------------------------------
// Path traversal in file-facing inputs.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn battery_path_traversal_reaches_no_file() {
    let h = tenax_storage::testing::sqlite_file().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        &h.url,
        &config("[exec]\n[exec.allow]\necho = \"/bin/echo\"\n"),
        &["--poll-interval", "50ms"],
        &[],
    );
    let addr = server.addr.clone();
    let mut requests = 0;
    // The dashboard serves compiled-in assets only: no path reaches the file system.
    for target in [
        "/assets/../../../../etc/passwd",
        "/assets/..%2F..%2F..%2F..%2Fetc%2Fpasswd",
        "/assets/%2e%2e/%2e%2e/etc/passwd",
        "/assets/app.js/../../../etc/passwd",
        "/..%2F..%2Fetc%2Fpasswd",
        "/ui/../../etc/passwd",
        "/v1/tasks/by-no/..%2F..%2F..%2Fetc%2Fpasswd",
        "/%2e%2e/%2e%2e/etc/shadow",
        "//etc/passwd",
    ] {
        let answer = call(&addr, "GET", target, Some(ADMIN), None);
        requests += 1;
        assert!(
            (400..500).contains(&answer.status),
            "{target}: {}",
            answer.status
        );
        assert!(!answer.body.contains("root:"), "{target}: {}", answer.body);
    }
    // `exec` runs allow-listed names only: a path, a traversal, or a name not listed
    // is refused at enqueue naming the field; written past the API, it dies with the
    // allow-list named; and nothing ran.
    let marker = dir.path().join("ran");
    let mut ids = Vec::new();
    for program in [
        "/bin/sh",
        "../../bin/sh",
        "echo/../sh",
        "./echo",
        "sh",
        "/bin/echo",
    ] {
        let payload =
            json!({"program": program, "args": ["-c", format!("touch {}", marker.display())]});
        let body = json!({"command_type": "exec", "max_attempts": 1, "payload": payload});
        let answer = call(
            &addr,
            "POST",
            "/v1/tasks",
            Some(ADMIN),
            Some(&body.to_string()),
        );
        requests += 1;
        assert_eq!(answer.status, 422, "{}", answer.body);
        assert_eq!(answer.code(), "unknown_exec_program", "{program}");
        assert_eq!(answer.json()["error"]["field"], "payload.program");
        let task = h
            .task(tenax_storage::testing::TaskOpts {
                command_type: "exec".into(),
                payload: payload.to_string(),
                max_attempts: 1,
                ..Default::default()
            })
            .await;
        ids.push((program, task.id.0));
    }
    // Arguments that are not strings, or hold a NUL no program can receive, and fields
    // an exec payload does not have (decoded strictly at run time) are refused at
    // enqueue too.
    for (payload, field) in [
        (json!({"program": "echo", "args": "-c id"}), "payload.args"),
        (
            json!({"program": "echo", "args": ["ok", 1]}),
            "payload.args[1]",
        ),
        (
            json!({"program": "echo", "args": ["a\u{0}b"]}),
            "payload.args[0]",
        ),
        (
            json!({"program": "echo", "card": {"number": "4111"}}),
            "payload.card",
        ),
        (json!(["echo"]), "payload"),
    ] {
        let args = &payload;
        let body = json!({"command_type": "exec", "payload": payload});
        let answer = call(
            &addr,
            "POST",
            "/v1/tasks",
            Some(ADMIN),
            Some(&body.to_string()),
        );
        requests += 1;
        assert_eq!(answer.status, 422, "{args}: {}", answer.body);
        assert_eq!(answer.json()["error"]["field"], field, "{args}");
    }
    // Queue and schedule names that would be path segments of the API's own URLs.
    for name in [".", "..", "a/b", "../x"] {
        let body = json!({"command_type": "echo", "queue": name});
        let answer = call(
            &addr,
            "POST",
            "/v1/tasks",
            Some(ADMIN),
            Some(&body.to_string()),
        );
        requests += 1;
        assert_eq!(answer.status, 422, "queue {name:?}: {}", answer.body);
        assert_eq!(answer.json()["error"]["field"], "queue", "{name:?}");
        let body = json!({"name": name, "command_type": "echo", "every_secs": 60});
        let answer = call(
            &addr,
            "POST",
            "/v1/schedules",
            Some(ADMIN),
            Some(&body.to_string()),
        );
        requests += 1;
        assert_eq!(answer.status, 422, "schedule {name:?}: {}", answer.body);
    }
    // Arguments arrive as they are: no shell expands them.
    let literal = [
        "; touch /tmp/x",
        "$(id)",
        "`id`",
        "&& id",
        "| id",
        "$HOME",
        "*",
        "\"'",
        "\n id",
    ];
    let body = json!({"command_type": "exec", "max_attempts": 1, "payload": {"program": "echo", "args": literal}});
    let answer = call(
        &addr,
        "POST",
        "/v1/tasks",
        Some(ADMIN),
        Some(&body.to_string()),
    );
    let echo_id = answer.json()["id"].as_i64().unwrap();
    requests += 1;
    let finished = |id: i64| -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let task = call(&addr, "GET", &format!("/v1/tasks/{id}"), Some(ADMIN), None).json();
            if matches!(
                task["status"].as_str(),
                Some("succeeded" | "dead" | "cancelled")
            ) {
                return task;
            }
            assert!(
                Instant::now() < deadline,
                "task {id} did not finish: {task}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    for (program, id) in ids {
        let task = finished(id);
        requests += 1;
        assert_eq!(task["status"], "dead", "{program}: {task}");
        assert!(
            task["last_error"].as_str().unwrap().contains("allow-list"),
            "{program}: {task}"
        );
    }
    let echoed = finished(echo_id);
    assert_eq!(echoed["status"], "succeeded", "{echoed}");
    assert_eq!(
        echoed["result"]["stdout"],
        format!("{}\n", literal.join(" ")),
        "{echoed}"
    );
    assert!(!marker.exists(), "a refused program ran");
    // An allow-list entry that is not an absolute, plain path is refused at start.
    for bad in [
        "sh = \"sh\"",
        "sh = \"../bin/sh\"",
        "sh = \"/bin/../bin/sh\"",
    ] {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, format!("[exec]\n[exec.allow]\n{bad}\n")).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_tenax"))
            .arg("--config")
            .arg(&path)
            .args(["config", "check"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("exec"), "{bad}: {err}");
    }
    report(&format!(
        "path traversal and exec: {requests} requests, 0 files reached, 0 programs outside the allow-list run"
    ));
}

// ---------------------------------------------------------------------------------
// S15: secrets in answers, logs, alerts and metrics.

/// A receiver for alerts and callbacks that keeps every body it gets.
fn receiver() -> (String, Arc<Mutex<Vec<String>>>) {
    listener(None)
}

/// An HTTP server that keeps every request it gets; with `echo`, it answers that status
/// with the request's body (a target quoting what it refuses), else 200 and no body.
fn listener(echo: Option<u16>) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&seen);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let keep = Arc::clone(&keep);
            std::thread::spawn(move || {
                stream.set_read_timeout(Some(Duration::from_secs(5))).ok();
                let mut data = Vec::new();
                let mut buf = [0u8; 65536];
                loop {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => data.extend_from_slice(&buf[..n]),
                    }
                    let text = String::from_utf8_lossy(&data).to_string();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let length = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if body.len() >= length {
                            let answer = match echo {
                                Some(code) => format!(
                                    "HTTP/1.1 {code} Refused\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                                    body.len()
                                ),
                                None => "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned(),
                            };
                            keep.lock().unwrap().push(text.clone());
                            let _ = stream.write_all(answer.as_bytes());
                            break;
                        }
                    }
                }
            });
        }
    });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn battery_secret_fields_never_leave_the_database() {
    let h = tenax_storage::testing::sqlite_file().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (hook, seen) = receiver();
    let metrics = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().to_string()
    };
    let server = start(
        dir.path(),
        &h.url,
        &config(&format!(
            "[exec]\n[exec.allow]\nsh = \"/bin/sh\"\n\
             [secrets]\nexec = [\"args[]\"]\n\
             [alerts]\nwebhook_url = \"http://{hook}/alerts\"\ndeath_window = \"100ms\"\npoll_interval = \"100ms\"\n"
        )),
        &["--poll-interval", "50ms", "--metrics-addr", &metrics],
        &[],
    );
    let addr = server.addr.clone();
    let mut requests = 0;
    // One that succeeds and echoes its payload (a secret field at the top and one
    // nested), and one that dies printing its secret argument.
    let ok = call(&addr, "POST", "/v1/tasks", Some(ENQUEUER), Some(&json!({"command_type": "echo", "payload": {"password": SECRET, "card": {"number": SECRET}}}).to_string()));
    assert_eq!(ok.status, 201, "{}", ok.body);
    assert!(!ok.body.contains(SECRET), "{}", ok.body);
    let dies = call(&addr, "POST", "/v1/tasks", Some(ENQUEUER), Some(&json!({"command_type": "exec", "max_attempts": 1, "payload": {"program": "sh", "args": ["-c", "echo \"$1\"; exit 3", "sh", SECRET]}}).to_string()));
    assert_eq!(dies.status, 201, "{}", dies.body);
    assert!(!dies.body.contains(SECRET), "{}", dies.body);
    requests += 2;
    let ok_id = ok.json()["id"].as_i64().unwrap();
    let dies_id = dies.json()["id"].as_i64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let a = call(
            &addr,
            "GET",
            &format!("/v1/tasks/{ok_id}"),
            Some(ADMIN),
            None,
        )
        .json();
        let b = call(
            &addr,
            "GET",
            &format!("/v1/tasks/{dies_id}"),
            Some(ADMIN),
            None,
        )
        .json();
        requests += 2;
        if a["status"] == "succeeded" && b["status"] == "dead" && !seen.lock().unwrap().is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "{a} {b}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Every read path: JSON, dashboard fragments, attempts, lists, the long-poll.
    let mut answered = String::new();
    for target in [
        format!("/v1/tasks/{ok_id}"),
        format!("/v1/tasks/{dies_id}"),
        format!("/v1/tasks/{ok_id}/attempts"),
        format!("/v1/tasks/{dies_id}/attempts"),
        format!("/v1/tasks/{ok_id}/wait?timeout_ms=1"),
        "/v1/tasks".to_owned(),
        "/v1/tasks?status=dead".to_owned(),
        format!("/ui/tasks/{ok_id}"),
        format!("/ui/tasks/{dies_id}"),
        "/ui/tasks".to_owned(),
        "/ui/dead".to_owned(),
        "/ui/overview".to_owned(),
        "/v1/stats".to_owned(),
    ] {
        let answer = call(&addr, "GET", &target, Some(ADMIN), None);
        requests += 1;
        assert_eq!(answer.status, 200, "{target}: {}", answer.body);
        answered.push_str(&answer.body);
    }
    let scraped = {
        let answer = request(&metrics, "GET", "/metrics", &[], b"");
        requests += 1;
        assert_eq!(answer.status, 200);
        answer.body
    };
    let alerts = seen.lock().unwrap().join("\n");
    let log = server.log();
    let mut leaks = 0;
    for (place, text) in [
        ("answers", &answered),
        ("alerts", &alerts),
        ("metrics", &scraped),
        ("log", &log),
    ] {
        for secret in [SECRET, ADMIN, ENQUEUER] {
            if text.contains(secret) {
                leaks += 1;
                eprintln!("{secret:?} is in the {place}");
            }
        }
        for tell in ["panicked at", "SELECT ", "tenax_tasks", ".rs:"] {
            if place == "answers" && text.contains(tell) {
                leaks += 1;
                eprintln!("{tell:?} is in the answers");
            }
        }
    }
    assert!(alerts.contains("task"), "an alert was received: {alerts}");
    assert!(scraped.contains("tenax_"), "metrics were scraped");
    assert_eq!(leaks, 0, "secrets or internals leaked (see above)");
    report(&format!(
        "secrets: {requests} requests; answers, {} alert(s), metrics and the debug log checked; leaks 0",
        seen.lock().unwrap().len()
    ));
}

/// Each way out of a real `tenax serve` (with its worker, callbacks, alerts and event
/// stream), for tasks whose secret fields come in every shape (nested, in an array, a
/// key holding dots, a parent given as a string, a value that is an object) and whose
/// handlers leak them: `echo` returns its payload, an `http` target refuses the body
/// quoting it back (422), an `exec` program prints its secret argument and fails, the
/// bank refuses an id card quoting it. No secret value may leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn battery_secret_values_in_every_shape_leave_by_no_way_out() {
    use tenax::storage::EventRuleParams;
    use tenax_storage::testing::secrets::{leaked, shapes, CARD};
    let h = tenax_storage::testing::sqlite_file().await.unwrap();
    h.storage
        .event_rule_set(&EventRuleParams {
            queue: None,
            command_type: None,
            enabled: true,
            now: None,
        })
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (hook, seen) = receiver();
    let (shop, _) = listener(Some(422));
    let text = format!(
        "[server]\ncommand_types = [\"echo\", \"http\", \"exec\", \"BANK_OPEN_ACCOUNT\"]\nwait_max = \"1s\"\n\
         [[server.tokens]]\nname = \"ops\"\nrole = \"admin\"\nsha256 = \"{}\"\n\
         [secrets]\necho = [\"card.number\", \"cards[].number\"]\n\
         http = [\"body.card.number\", \"body.cards[].number\"]\n\
         exec = [\"args[]\"]\nBANK_OPEN_ACCOUNT = [\"id_card\"]\n\
         [http.targets.shop]\nbase_url = \"http://{shop}/api\"\n\
         [exec]\n[exec.allow]\nsh = \"/bin/sh\"\n\
         [callbacks]\nallow_hosts = [\"{hook}\"]\nsecret = \"a-test-secret-of-32-bytes-length\"\n\
         [alerts]\nwebhook_url = \"http://{hook}/alerts\"\ndeath_window = \"100ms\"\npoll_interval = \"100ms\"\n\
         [events]\npoll_interval = \"50ms\"\n",
        tenax_server::hash_token(ADMIN),
    );
    let path = dir.path().join("tenax.toml");
    std::fs::write(&path, &text).unwrap();
    let server = start(dir.path(), &h.url, &text, &["--poll-interval", "50ms"], &[]);
    let addr = server.addr.clone();
    let callback = format!("http://{hook}/callbacks");
    let mut ids = Vec::new();
    let mut enqueue = |body: Value| {
        let answer = call(
            &addr,
            "POST",
            "/v1/tasks",
            Some(ADMIN),
            Some(&body.to_string()),
        );
        assert_eq!(answer.status, 201, "{}", answer.body);
        assert_eq!(
            leaked(&answer.body),
            None,
            "the enqueue answer: {}",
            answer.body
        );
        ids.push(answer.json()["id"].as_i64().unwrap());
    };
    for shape in shapes() {
        enqueue(json!({"command_type": "echo", "payload": shape, "callback_url": callback}));
        enqueue(
            json!({"command_type": "http", "max_attempts": 1, "callback_url": callback,
                       "payload": {"target": "shop", "path": "/charge", "body": shape}}),
        );
    }
    enqueue(
        json!({"command_type": "exec", "max_attempts": 1, "callback_url": callback,
                   "payload": {"program": "sh", "args": ["-c", "echo \"charging $1\"; echo \"card $1 refused\" >&2; exit 3", "sh", CARD]}}),
    );
    enqueue(
        json!({"command_type": "BANK_OPEN_ACCOUNT", "max_attempts": 10, "callback_url": callback,
                   "payload": {"customer": "Ada", "id_card": format!("{CARD}X")}}),
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let ended = ids.iter().all(|id| {
            let status = call(&addr, "GET", &format!("/v1/tasks/{id}"), Some(ADMIN), None).json()
                ["status"]
                .clone();
            status == "succeeded" || status == "dead"
        });
        let deliveries = seen.lock().unwrap().len();
        // One callback per task, and at least one death alert.
        if ended && deliveries > ids.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "tasks or deliveries missing: {deliveries}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The database does hold the secrets: each way out must have masked them.
    let stored = h
        .storage
        .task_list(&TaskListParams {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(stored.iter().all(|t| leaked(&t.payload).is_some()));

    let mut ways: Vec<(&str, String)> = Vec::new();
    let get = |target: &str| {
        let answer = call(&addr, "GET", target, Some(ADMIN), None);
        assert_eq!(answer.status, 200, "{target}: {}", answer.body);
        answer.body
    };
    let mut api = String::new();
    for id in &ids {
        for target in [
            format!("/v1/tasks/{id}"),
            format!("/v1/tasks/{id}/attempts"),
            format!("/v1/tasks/{id}/wait?timeout_ms=1"),
        ] {
            api.push_str(&get(&target));
        }
    }
    api.push_str(&get("/v1/tasks?limit=100"));
    api.push_str(&get("/v1/tasks?status=dead"));
    ways.push(("the JSON API", api));
    ways.push(("the event stream", get("/v1/events?after=0&follow=false")));
    let mut dashboard = get("/ui/tasks");
    dashboard.push_str(&get("/ui/dead"));
    for id in &ids {
        dashboard.push_str(&get(&format!("/ui/tasks/{id}")));
    }
    ways.push(("the dashboard", dashboard));
    let mut cli = String::new();
    let mut tenax = |args: &[String]| {
        let out = Command::new(env!("CARGO_BIN_EXE_tenax"))
            .arg("--config")
            .arg(&path)
            .args(["--database-url", &h.url])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        cli.push_str(&String::from_utf8_lossy(&out.stdout));
        cli.push_str(&String::from_utf8_lossy(&out.stderr));
    };
    tenax(&[
        "tasks".into(),
        "list".into(),
        "--limit".into(),
        "100".into(),
    ]);
    for id in &ids {
        tenax(&["tasks".into(), "show".into(), id.to_string()]);
    }
    ways.push(("the CLI", cli));
    let deliveries = seen.lock().unwrap().clone();
    let (alerts, callbacks): (Vec<String>, Vec<String>) = deliveries
        .into_iter()
        .partition(|d| d.starts_with("POST /alerts"));
    ways.push(("callbacks", callbacks.join("\n")));
    ways.push(("alerts", alerts.join("\n")));
    ways.push(("the log", server.log()));

    let mut leaks = Vec::new();
    for (way, text) in &ways {
        assert!(!text.is_empty(), "nothing came out of {way}");
        if let Some(secret) = leaked(text) {
            let line = text
                .lines()
                .find(|l| l.contains(secret))
                .unwrap_or_default();
            leaks.push(format!("{way}: {line}"));
        }
    }
    for (way, text) in &ways[..6] {
        assert!(text.contains("***"), "{way} shows nothing masked: {text}");
    }
    assert!(
        leaks.is_empty(),
        "secret values left:\n{}",
        leaks.join("\n")
    );
    report(&format!(
        "secret shapes: {} tasks, {} ways out checked (API, events, dashboard, CLI, callbacks, alerts, log); leaks 0",
        ids.len(),
        ways.len()
    ));
}

// ---------------------------------------------------------------------------------
// `http` task paths that would leave their target's base path, and its headers.

/// Paths that climb out of a base path: as reported (each reached a path outside
/// `/api` with the target's credentials), then every spelling of a dot and a slash
/// (plain, percent-encoded in either case, double-encoded, backslashes) in segments
/// that climb or split.
fn climbing_paths() -> Vec<String> {
    let mut paths: Vec<String> = [
        "/.%2e/x",
        "/%2E./x",
        "/.%2e",
        "/.%2e/.%2e/.%2e/etc/passwd",
        "/x/.%2e",
        "/x/%2e.",
        "/..;/x",
        "/%c0%ae%c0%ae/x",
        "/x/%2e%2e%00",
    ]
    .map(String::from)
    .to_vec();
    let dots = [".", "%2e", "%2E", "%252e", "%252E"];
    let slashes = ["/", "%2f", "%2F", "%252f", "\\", "%5c", "%5C", "%255c"];
    for a in dots {
        for b in dots {
            for s in slashes {
                paths.push(format!("/{a}{b}{s}x"));
                paths.push(format!("/x{s}{a}{b}{s}{a}{b}{s}etc{s}passwd"));
            }
        }
    }
    paths
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn battery_http_paths_stay_under_the_target_base_path() {
    let h = tenax_storage::testing::sqlite_file().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (target, seen) = receiver();
    let config = config(&format!(
        "[http]\n[http.targets.pay]\nbase_url = \"http://{target}/api\"\ntimeout = \"5s\"\n\
         headers = {{ Authorization = \"Bearer target-credential\" }}\n"
    ))
    .replace(
        "command_types = [\"echo\", \"exec\"]",
        "command_types = [\"echo\", \"exec\", \"http\"]",
    );
    let server = start(
        dir.path(),
        &h.url,
        &config,
        &["--poll-interval", "50ms"],
        &[],
    );
    let addr = server.addr.clone();
    let paths = climbing_paths();
    let mut requests = 0;
    // At the door: each is refused, naming the field.
    for path in &paths {
        let body = json!({"command_type": "http", "max_attempts": 1,
                          "payload": {"target": "pay", "path": path}});
        let answer = call(
            &addr,
            "POST",
            "/v1/tasks",
            Some(ADMIN),
            Some(&body.to_string()),
        );
        requests += 1;
        assert_eq!(answer.status, 422, "{path}: {}", answer.body);
        assert_eq!(answer.code(), "http_path_refused", "{path}");
        assert_eq!(answer.json()["error"]["field"], "payload.path", "{path}");
    }
    // A schedule is checked the same way: its tasks could only die.
    for (payload, code, field) in [
        (
            json!({"target": "elsewhere"}),
            "unknown_http_target",
            "payload.target",
        ),
        (
            json!({"target": "pay", "path": "/.%2e/x"}),
            "http_path_refused",
            "payload.path",
        ),
    ] {
        let body =
            json!({"name": "climb", "command_type": "http", "every_secs": 60, "payload": payload});
        let answer = call(
            &addr,
            "POST",
            "/v1/schedules",
            Some(ADMIN),
            Some(&body.to_string()),
        );
        requests += 1;
        assert_eq!(answer.status, 422, "{payload}: {}", answer.body);
        assert_eq!(answer.code(), code, "{payload}");
        assert_eq!(answer.json()["error"]["field"], field, "{payload}");
    }
    // Past the door (written straight to the database): the worker refuses each before
    // sending, and the task dies.
    let mut ids = Vec::new();
    for path in &paths {
        let payload = json!({"target": "pay", "path": path, "body": {"n": 1}}).to_string();
        let task = h
            .task(tenax_storage::testing::TaskOpts {
                command_type: "http".into(),
                payload,
                max_attempts: 1,
                ..Default::default()
            })
            .await;
        ids.push((path, task.id.0));
    }
    // A task's Content-Type replaces the default; a plain path still goes through.
    let body = json!({"command_type": "http", "max_attempts": 1,
                      "payload": {"target": "pay", "path": "/charges", "body": {"n": 1},
                                  "headers": {"content-TYPE": "application/vnd.shop+json"}}});
    let answer = call(
        &addr,
        "POST",
        "/v1/tasks",
        Some(ADMIN),
        Some(&body.to_string()),
    );
    requests += 1;
    assert_eq!(answer.status, 201, "{}", answer.body);
    let plain = answer.json()["id"].as_i64().unwrap();
    let finished = |id: i64| -> Value {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let task = call(&addr, "GET", &format!("/v1/tasks/{id}"), Some(ADMIN), None).json();
            if matches!(task["status"].as_str(), Some("succeeded" | "dead")) {
                return task;
            }
            assert!(
                Instant::now() < deadline,
                "task {id} did not finish: {task}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    for (path, id) in &ids {
        let task = finished(*id);
        requests += 1;
        assert_eq!(task["status"], "dead", "{path}: {task}");
        assert_eq!(task["attempt"], 1, "{path}: {task}");
    }
    let task = finished(plain);
    assert_eq!(task["status"], "succeeded", "{task}");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "only the plain path was sent: {seen:#?}");
    let head = seen[0].split("\r\n\r\n").next().unwrap().to_owned();
    assert!(head.starts_with("POST /api/charges HTTP/1.1\r\n"), "{head}");
    let types: Vec<&str> = head
        .lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("content-type:"))
        .collect();
    assert_eq!(types.len(), 1, "one Content-Type: {head}");
    assert!(types[0].ends_with("application/vnd.shop+json"), "{head}");
    report(&format!(
        "http paths: {} climbing paths refused at enqueue and again before sending ({requests} requests), 0 sent outside the base path",
        paths.len()
    ));
}

// ---------------------------------------------------------------------------------
// Source rules.

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// SQL text is never built from input: every `format!` whose text holds SQL
/// interpolates only constants (UPPER_CASE) or the few values listed here, each checked
/// where it is built.
const TILL: &str = "tnx_security_second_enqueue_token";

/// A `kB` line of the server's `/proc/<pid>/status` (`VmRSS`, `VmHWM`).
fn memory_kib(pid: u32, line: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(line)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {line} in {status}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn battery_an_enqueue_token_cannot_probe_others_tasks() {
    let h = tenax_storage::testing::sqlite_file().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "[[server.tokens]]\nname = \"till\"\nrole = \"enqueue\"\nsha256 = \"{}\"\n",
        tenax_server::hash_token(TILL)
    );
    let server = start(dir.path(), &h.url, &config(&extra), &["--no-workers"], &[]);
    let addr = server.addr.clone();
    let mut probes = 0;
    // Tasks of the admin, of the other enqueuer and of the library, then one of its own.
    let enqueue = |token: &str, no: &str| {
        let answer = call(
            &addr,
            "POST",
            "/v1/tasks",
            Some(token),
            Some(
                &json!({"command_type": "echo", "task_no": no, "payload": {"password": SECRET}})
                    .to_string(),
            ),
        );
        assert_eq!(answer.status, 201, "{}", answer.body);
        answer.json()["id"].as_i64().unwrap()
    };
    let others = [
        enqueue(ADMIN, "probe-admin"),
        enqueue(ENQUEUER, "probe-shop"),
    ];
    let library = h
        .task(tenax_storage::testing::TaskOpts {
            task_no: Some("probe-library".into()),
            command_type: "echo".into(),
            ..Default::default()
        })
        .await
        .id
        .0;
    let own = enqueue(TILL, "probe-till");
    let unused = own + 1000;
    let answer_of = |target: &str| {
        let answer = call(&addr, "GET", target, Some(TILL), None);
        (answer.status, answer.body)
    };
    for (id, no) in [
        (others[0], "probe-admin"),
        (others[1], "probe-shop"),
        (library, "probe-library"),
    ] {
        for (target, missing) in [
            (format!("/v1/tasks/{id}"), format!("/v1/tasks/{unused}")),
            (
                format!("/v1/tasks/{id}/attempts"),
                format!("/v1/tasks/{unused}/attempts"),
            ),
            (
                format!("/v1/tasks/{id}/wait?timeout_ms=10"),
                format!("/v1/tasks/{unused}/wait?timeout_ms=10"),
            ),
            (
                format!("/v1/tasks/by-no/{no}"),
                "/v1/tasks/by-no/probe-unused".to_owned(),
            ),
        ] {
            probes += 1;
            let (status, body) = answer_of(&target);
            let (missing_status, missing_body) = answer_of(&missing);
            assert_eq!((status, missing_status), (404, 404), "{target}: {body}");
            // Word for word a missing task's answer: no way to tell them apart.
            let neutral = |text: &str| {
                text.replace(&unused.to_string(), "ID")
                    .replace(&id.to_string(), "ID")
                    .replace(no, "NO")
                    .replace("probe-unused", "NO")
            };
            assert_eq!(neutral(&body), neutral(&missing_body), "{target}");
            assert!(!body.contains(SECRET), "{target}: {body}");
        }
        // Its number, repeated with the payload guessed right or wrong: one answer.
        for payload in [json!({"password": SECRET}), json!({"password": "guess"})] {
            probes += 1;
            let answer = call(
                &addr,
                "POST",
                "/v1/tasks",
                Some(TILL),
                Some(
                    &json!({"command_type": "echo", "task_no": no, "payload": payload}).to_string(),
                ),
            );
            assert_eq!(answer.status, 409, "{no}: {}", answer.body);
            assert!(!answer.body.contains(SECRET), "{no}: {}", answer.body);
            assert_eq!(
                answer.json()["error"]["message"],
                format!("task_no {no:?} already exists")
            );
        }
    }
    let mine = call(&addr, "GET", &format!("/v1/tasks/{own}"), Some(TILL), None);
    assert_eq!(mine.status, 200, "{}", mine.body);
    report(&format!(
        "{probes} probes of others' tasks by an enqueue token, all answered as missing"
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn battery_huge_lists_stay_bounded_in_bytes_and_memory() {
    let h = tenax_storage::testing::sqlite_file().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &h.url, &config(""), &["--no-workers"], &[]);
    let addr = server.addr.clone();
    // 40 tasks of a 1 MiB payload, the most a task may carry, stored directly.
    let blob = "x".repeat(1024 * 1024 - 64);
    for n in 0..40 {
        h.task(tenax_storage::testing::TaskOpts {
            command_type: "echo".into(),
            payload: json!({"n": n, "blob": blob}).to_string(),
            ..Default::default()
        })
        .await;
    }
    let warm = call(&addr, "GET", "/v1/tasks?limit=1", Some(READER), None);
    assert_eq!(warm.status, 200, "{}", warm.body);
    let before = memory_kib(server.pid(), "VmHWM");
    // Eight readers at once, each asking for the largest page three times.
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                (0..3)
                    .map(|_| call(&addr, "GET", "/v1/tasks?limit=500", Some(READER), None))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let answers: Vec<Answer> = readers
        .into_iter()
        .flat_map(|reader| reader.join().unwrap())
        .collect();
    let grown = memory_kib(server.pid(), "VmHWM").saturating_sub(before);
    // Whole pages would be 40 MiB each, 320 MiB at once, and more while encoded. What
    // is left is the readers' buffers and SQLite's page caches.
    assert!(
        grown < 64 * 1024,
        "peak resident memory grew by {} MiB",
        grown / 1024
    );
    for answer in &answers {
        assert_eq!(answer.status, 200, "{:.300}", answer.body);
        assert!(answer.body.len() < 64 * 1024, "{} bytes", answer.body.len());
        let page = answer.json();
        let tasks = page["tasks"].as_array().unwrap();
        assert_eq!(tasks.len(), 40);
        assert!(tasks
            .iter()
            .all(|t| t["payload_omitted"] == true && t["payload"].is_null()));
    }
    let answers = answers.len();
    report(&format!(
        "{answers} lists of 40 tasks of 1 MiB, 8 at once: each under 64 KiB, peak memory +{} MiB",
        grown / 1024
    ));
}

#[test]
fn battery_sql_text_is_never_formatted_from_input() {
    // (file suffix, placeholder): why it is safe.
    let allowed = [
        ("mysql/keys.rs", "status"),           // one of the CLAIMABLE constants
        ("mysql/claim.rs", "status"),          // one of the CLAIMABLE constants
        ("mysql/actions.rs", "status"),        // one of the FINISHED constants
        ("mysql/mod.rs", "lock_wait_secs"),    // an integer from the configuration
        ("mysql/databases.rs", "name"),        // database name checked to [A-Za-z0-9_]
        ("mysql/mod.rs", "lock"),              // Lock::clause(), a constant
        ("mysql/storage.rs", "columns"),       // list_columns: constants and an integer
        ("mysql/rates.rs", ""),                // marks(n): "?, ?, ..."
        ("mysql/schedules.rs", "lock"),        // Lock::clause(), a constant
        ("mysql/workflows.rs", "lock"),        // "" or " LOCK IN SHARE MODE", constants
        ("postgres/workflows.rs", "lock"),     // "" or " FOR SHARE", constants
        ("postgres/bulk.rs", "update"),        // constant UPDATE text
        ("postgres/insert.rs", "on_conflict"), // Existing::clause(), a constant
        ("postgres/mod.rs", "schema"),         // schema name checked to [a-z0-9_]
        ("postgres/storage.rs", "schema"),     // schema name checked to [a-z0-9_]
        ("postgres/storage.rs", "columns"),    // list_columns: constants and an integer
        ("sqlite/storage.rs", "columns"),      // list_columns: constants and an integer
        ("postgres/outcomes.rs", "status"),    // a CASE constant
        ("sqlite/outcomes.rs", "status"),      // a CASE constant
        ("tenax-bench/src/raw/sqlite.rs", "status"), // `tenax bench` fillers, constants
        ("tenax-bench/src/raw/sqlite.rs", "finished_at"),
        ("postgres/claim.rs", "restricted"), // literal(): TRUE or FALSE
        ("postgres/claim.rs", "skip_rated"), // literal(): TRUE or FALSE
        ("tenax-bench/src/raw/mysql.rs", "status"), // `tenax bench` fillers, constants
        ("tenax-bench/src/raw/mysql.rs", "attempt"),
        ("tenax-bench/src/raw/mysql.rs", "finished_at"),
        ("tenax-bench/src/raw/mysql.rs", "result"),
    ];
    // The backends, and the raw-SQL baselines of `tenax bench` (a crate of their own).
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for root in ["tenax-storage/src", "tenax-bench/src"] {
        sources(&crates.join(root), &mut files);
    }
    let keyword = |s: &str| {
        [
            "SELECT ", "INSERT ", "UPDATE ", "DELETE ", " WHERE ", "CREATE ", "DROP ", "SET ",
        ]
        .iter()
        .any(|k| s.contains(k))
    };
    let mut checked = 0;
    let mut bad = Vec::new();
    for file in files {
        let shown = file.strip_prefix(&crates).unwrap().display().to_string();
        if shown.starts_with("tenax-storage/src/testing") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("format!(") {
            rest = &rest[at + 8..];
            let Some(open) = rest.find('"') else { break };
            if rest[..open].trim_start_matches(['r', '#']).trim() != "" {
                continue;
            }
            let literal_start = open + 1;
            let mut end = literal_start;
            let bytes = rest.as_bytes();
            while end < bytes.len() && !(bytes[end] == b'"' && bytes[end - 1] != b'\\') {
                end += 1;
            }
            let literal = rest[literal_start..end.min(rest.len())]
                .replace("{{", "")
                .replace("}}", "");
            if !keyword(&literal) {
                continue;
            }
            checked += 1;
            let mut scan = literal.as_str();
            while let Some(open) = scan.find('{') {
                let Some(close) = scan[open..].find('}') else {
                    break;
                };
                let name = scan[open + 1..open + close].split(':').next().unwrap_or("");
                let constant = !name.is_empty()
                    && name
                        .chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
                if !constant
                    && !allowed
                        .iter()
                        .any(|(f, n)| shown.ends_with(f) && *n == name)
                {
                    bad.push(format!("{shown}: {{{name}}}"));
                }
                scan = &scan[open + close + 1..];
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} SQL format! calls found: is the scan still right?"
    );
    assert!(bad.is_empty(), "SQL text built from a value: {bad:?}");
    report(&format!(
        "source: {checked} SQL texts built with format!, 0 from input"
    ));
}

/// Tokens are compared in constant time: no `==` on a token, a hash or a presented
/// value in the auth module.
#[test]
fn battery_tokens_are_never_compared_with_eq() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tenax-server/src/auth.rs");
    let text = std::fs::read_to_string(path).unwrap();
    assert!(
        text.contains("ct_eq"),
        "the constant-time comparison is gone"
    );
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        if code.contains("==") || code.contains("!=") || code.contains(".eq(") {
            let lower = code.to_ascii_lowercase();
            assert!(
                !["token", "hash", "presented", "sha", "digest"]
                    .iter()
                    .any(|w| lower.contains(w)),
                "auth.rs:{}: {line}",
                n + 1
            );
        }
    }
}
