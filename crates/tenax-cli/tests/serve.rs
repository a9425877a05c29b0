//! `tenax serve` as a real process on 127.0.0.1:0 (SQLite in a temporary folder): the
//! Python and curl examples enqueue an `echo` task, wait for it and print its result,
//! and the Python batch example enqueues thousands;
//! tokens are checked over the socket; SIGTERM stops the API and the worker.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ENQUEUE_TOKEN: &str = "tnx_test_enqueue_token";
const ADMIN_TOKEN: &str = "tnx_test_admin_token";
const READ_TOKEN: &str = "tnx_test_read_token";

fn sha256_hex(token: &str) -> String {
    // The CLI prints the configuration lines of a token; use it as a user would.
    let out = Command::new(env!("CARGO_BIN_EXE_tenax"))
        .args(["token", "new", "--name", "probe", "--role", "read"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("[[server.tokens]]") && text.contains("sha256 = \""),
        "{text}"
    );
    tenax_server::hash_token(token)
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(dir: &Path) -> Server {
    let config = dir.join("tenax.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ncommand_types = [\"echo\"]\n\
             [[server.tokens]]\nname = \"examples\"\nrole = \"enqueue\"\nsha256 = \"{}\"\n\
             [[server.tokens]]\nname = \"dashboard\"\nrole = \"read\"\nsha256 = \"{}\"\n\
             [[server.tokens]]\nname = \"ops\"\nrole = \"admin\"\nsha256 = \"{}\"\n\
             [server.secrets]\necho = [\"password\"]\n",
            sha256_hex(ENQUEUE_TOKEN),
            tenax_server::hash_token(READ_TOKEN),
            tenax_server::hash_token(ADMIN_TOKEN)
        ),
    )
    .unwrap();
    start_with(dir, &config)
}

/// `tenax serve` with the configuration file `config`, on SQLite in `dir`.
fn start_with(dir: &Path, config: &Path) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tenax"))
        .arg("--config")
        .arg(config)
        .arg("--database-url")
        .arg(format!("sqlite://{}", dir.join("tenax.db").display()))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--poll-interval",
            "50ms",
        ])
        // Everything down to debug, to check that no token or secret is logged.
        .env("TENAX_LOG", "debug")
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
        .expect("tenax serve printed no address");
    let addr = line
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    Server { child, addr }
}

/// One HTTP/1.1 request over a plain socket: the status and the body.
/// Run `tenax` with `args`; it must succeed.
fn tenax_ok(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_tenax"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tenax {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn http(addr: &str, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

fn run_example(program: &str, script: &str, addr: &str, message: &str) -> String {
    let out = Command::new(program)
        .arg(repo().join("examples/http-client").join(script))
        .arg(message)
        .env("TENAX_URL", format!("http://{addr}"))
        .env("TENAX_TOKEN", ENQUEUE_TOKEN)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} (needed by this test): {e}"));
    assert!(
        out.status.success(),
        "{script} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_python_and_curl_examples_get_their_echo_results_from_a_real_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path());
    let addr = server.addr.clone();

    let (status, body) = http(&addr, "GET", "/healthz", None, "");
    assert_eq!(status, 200, "{body}");
    let (status, body) = http(&addr, "GET", "/readyz", None, "");
    assert_eq!(status, 200, "{body}");
    let (status, body) = http(&addr, "GET", "/v1/tasks", None, "");
    assert_eq!(status, 401, "{body}");
    assert!(body.contains(r#""code":"unauthorized""#), "{body}");
    let (status, body) = http(&addr, "GET", "/v1/tasks", Some(ENQUEUE_TOKEN), "");
    assert_eq!(status, 403, "{body}");

    let python = run_example("python3", "enqueue_and_wait.py", &addr, "hello from python");
    assert_eq!(python.trim(), r#"{"message": "hello from python"}"#);
    let curl = run_example("sh", "enqueue_and_wait.sh", &addr, "hello from curl");
    assert_eq!(curl.trim(), r#"{"message":"hello from curl"}"#);

    // The batch example: 2,500 tasks in three batches, then the same numbers again.
    let batch = |extra: &[&str]| {
        let out = Command::new("python3")
            .arg(repo().join("examples/http-client/enqueue_batch.py"))
            .args(["--tasks", "2500", "--type", "echo", "--prefix", "example"])
            .args(extra)
            .env("TENAX_URL", format!("http://{addr}"))
            .env("TENAX_TOKEN", ENQUEUE_TOKEN)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "enqueue_batch.py failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let first = batch(&[]);
    assert!(
        first.contains("(2500 new, 0 existing, 0 refused; batches of 1000)"),
        "{first}"
    );
    let again = batch(&["--atomic"]);
    assert!(
        again.contains("(0 new, 2500 existing, 0 refused; batches of 1000)"),
        "{again}"
    );

    // A secret field is stored but never answered.
    let (status, body) = http(
        &addr,
        "POST",
        "/v1/tasks",
        Some(ENQUEUE_TOKEN),
        r#"{"command_type":"echo","payload":{"password":"hunter2"}}"#,
    );
    assert_eq!(status, 201, "{body}");
    assert!(
        !body.contains("hunter2") && body.contains(r#""password":"***""#),
        "{body}"
    );
    let (status, body) = http(&addr, "GET", "/v1/tasks?type=echo", Some(READ_TOKEN), "");
    assert_eq!(status, 200);
    assert!(!body.contains("hunter2"), "{body}");

    // SIGTERM stops the API and the worker, and the process exits cleanly.
    let stopped = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "tenax serve did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    let log = std::fs::read_to_string(dir.path().join("serve.log")).unwrap();
    assert!(log.contains("serving the HTTP API"), "{log}");
    for secret in [ENQUEUE_TOKEN, READ_TOKEN, "hunter2"] {
        assert!(!log.contains(secret), "{secret} is in the server's log");
    }
}

#[test]
fn serving_without_tokens_on_a_public_address_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tenax"))
        .arg("--database-url")
        .arg(format!(
            "sqlite://{}",
            dir.path().join("tenax.db").display()
        ))
        .args(["serve", "--listen", "0.0.0.0:0"])
        .env("TENAX_LOG", "warn")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("server.tokens") && err.contains("loopback"),
        "{err}"
    );
}

#[test]
fn config_check_names_the_bad_server_key() {
    let dir = tempfile::tempdir().unwrap();
    let check = |text: &str| {
        let path = dir.path().join("tenax.toml");
        std::fs::write(&path, text).unwrap();
        Command::new(env!("CARGO_BIN_EXE_tenax"))
            .arg("--config")
            .arg(&path)
            .args(["config", "check"])
            .output()
            .unwrap()
    };
    let ok =
        check("[server]\ncommand_types = [\"echo\"]\n[server.queues.default]\nmax_pending = 10\n");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(
        out.contains("server.queues.default.max_pending = Some(10)"),
        "{out}"
    );
    assert!(out.contains("warning: no [[server.tokens]]"), "{out}");
    for (text, expected) in [
        ("[server]\nbody_limit = 10\n", "server.body_limit"),
        ("[server]\nwait_max = \"soon\"\n", "soon"),
        ("[server]\nlisten = \"0.0.0.0:8080\"\n", "server.tokens"),
        (
            "[[server.tokens]]\nname = \"a\"\nrole = \"admin\"\nsha256 = \"tnx_plain_token\"\n",
            "server.tokens[0].sha256",
        ),
        ("[server]\ncomand_types = []\n", "comand_types"),
    ] {
        let bad = check(text);
        assert!(!bad.status.success(), "{text} was accepted");
        let err = String::from_utf8_lossy(&bad.stderr);
        assert!(err.contains(expected), "{text}: {err}");
    }
}

/// One command type enqueued by every way in (the library's `enqueue_raw`, the HTTP
/// API, `tenax enqueue`, a schedule created over HTTP and one added by `tenax schedules
/// add`) gets the same stored defaults, those of the one table,
/// `CommandDefaults::STANDARD`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_way_in_stores_the_same_task_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let url = format!("sqlite://{}", dir.path().join("tenax.db").display());
    let client = tenax::Client::connect(&url).await.unwrap();
    let library = client
        .enqueue_raw("echo", &serde_json::json!({}))
        .await
        .unwrap()
        .task
        .id;
    let (status, body) = http(
        &server.addr,
        "POST",
        "/v1/tasks",
        Some(ENQUEUE_TOKEN),
        r#"{"command_type": "echo"}"#,
    );
    assert_eq!(status, 201, "{body}");
    let api: serde_json::Value = serde_json::from_str(&body).unwrap();
    tenax_ok(&["--database-url", &url, "enqueue", "echo"]);
    let (status, body) = http(
        &server.addr,
        "POST",
        "/v1/schedules",
        Some(ADMIN_TOKEN),
        r#"{"name": "defaults", "command_type": "echo", "every_secs": 1}"#,
    );
    assert_eq!(status, 201, "{body}");
    tenax_ok(&[
        "--database-url",
        &url,
        "schedules",
        "add",
        "by-cli",
        "echo",
        "--every",
        "1s",
    ]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let tasks = loop {
        let tasks = client
            .list(&tenax::storage::TaskListParams {
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap();
        let fired = |name: &str| {
            tasks
                .iter()
                .any(|t| t.task_no.as_str().starts_with(&format!("sched:{name}:")))
        };
        if fired("defaults") && fired("by-cli") {
            break tasks;
        }
        assert!(Instant::now() < deadline, "the schedule fired no tick");
        std::thread::sleep(Duration::from_millis(50));
    };
    let d = tenax::CommandDefaults::STANDARD;
    let want = (
        d.queue.to_owned(),
        d.priority,
        d.max_attempts,
        u64::try_from(d.timeout.as_millis()).unwrap(),
    );
    let ways = [
        ("the library", tasks.iter().find(|t| t.id == library)),
        (
            "the HTTP API",
            tasks.iter().find(|t| Some(t.id.0) == api["id"].as_i64()),
        ),
        (
            "the CLI",
            tasks.iter().find(|t| {
                t.id != library
                    && Some(t.id.0) != api["id"].as_i64()
                    && !t.task_no.as_str().starts_with("sched:")
            }),
        ),
        (
            "a schedule",
            tasks
                .iter()
                .find(|t| t.task_no.as_str().starts_with("sched:defaults:")),
        ),
        (
            "a schedule added by the CLI",
            tasks
                .iter()
                .find(|t| t.task_no.as_str().starts_with("sched:by-cli:")),
        ),
    ];
    for (way, task) in ways {
        let task = task.unwrap_or_else(|| panic!("no task enqueued by {way}: {tasks:?}"));
        let got = (
            task.queue.clone(),
            task.priority.get(),
            task.max_attempts,
            task.timeout_ms,
        );
        assert_eq!(got, want, "the defaults of a task enqueued by {way}");
    }
}

/// The configuration of a server whose only tokens are `tokens` (name, token; role
/// read).
fn with_read_tokens(tokens: &[(&str, &str)]) -> String {
    let mut text = "[server]\ncommand_types = [\"echo\"]\n".to_owned();
    for (name, token) in tokens {
        text.push_str(&format!(
            "[[server.tokens]]\nname = \"{name}\"\nrole = \"read\"\nsha256 = \"{}\"\n",
            tenax_server::hash_token(token)
        ));
    }
    text
}

fn hang_up(server: &Server) {
    let status = Command::new("kill")
        .args(["-HUP", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A token rotation as an operator runs it, each step a SIGHUP after an edit of the
/// file: add the new token, move the client to it, remove the old one. A client
/// reading without pause all along is never refused; at the end only the new token is
/// accepted. A file that cannot be read, or that would remove every token, changes
/// nothing.
#[test]
fn tokens_rotate_on_sighup_with_no_request_refused() {
    const OLD: &str = "tnx_rotation_old_token";
    const NEW: &str = "tnx_rotation_new_token";
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tenax.toml");
    let write = |text: &str| std::fs::write(&config, text).unwrap();
    write(&with_read_tokens(&[("old", OLD)]));
    let server = start_with(dir.path(), &config);
    let addr = server.addr.clone();
    let status = |token: &str| http(&addr, "GET", "/v1/tasks", Some(token), "").0;
    assert_eq!(status(OLD), 200);
    assert_eq!(status(NEW), 401);

    let current = std::sync::Arc::new(std::sync::Mutex::new(OLD));
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = {
        let (addr, current, sent, done) =
            (addr.clone(), current.clone(), sent.clone(), done.clone());
        std::thread::spawn(move || {
            let mut refused = Vec::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let token = *current.lock().unwrap();
                let (status, body) = http(&addr, "GET", "/v1/tasks", Some(token), "");
                if status != 200 {
                    refused.push(format!("{token}: {status} {body}"));
                }
                sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            refused
        })
    };
    // Each step lets the client send a few more requests before the next.
    let a_few_more = || {
        let from = sent.load(std::sync::atomic::Ordering::SeqCst);
        wait_until("the client to go on", || {
            sent.load(std::sync::atomic::Ordering::SeqCst) >= from + 5
        });
    };
    a_few_more();
    // 1. Add the new token.
    write(&with_read_tokens(&[("old", OLD), ("new", NEW)]));
    hang_up(&server);
    wait_until("the new token to be accepted", || status(NEW) == 200);
    a_few_more();
    // 2. Move the client.
    *current.lock().unwrap() = NEW;
    a_few_more();
    // 3. Remove the old token.
    write(&with_read_tokens(&[("new", NEW)]));
    hang_up(&server);
    wait_until("the old token to be refused", || status(OLD) == 401);
    a_few_more();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let refused = client.join().unwrap();
    assert!(
        refused.is_empty(),
        "refused during the rotation: {refused:?}"
    );
    eprintln!(
        "rotation: {} requests, none refused",
        sent.load(std::sync::atomic::Ordering::SeqCst)
    );

    // A file that does not parse, then one without tokens: each is refused, logged, and
    // the tokens in force stay.
    let log = dir.path().join("serve.log");
    let refusals = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("tokens not reloaded")
            .count()
    };
    write("[server\n");
    hang_up(&server);
    wait_until("the broken file to be refused", || refusals() == 1);
    write(&with_read_tokens(&[]));
    hang_up(&server);
    wait_until("the file without tokens to be refused", || refusals() == 2);
    assert_eq!(status(NEW), 200);
    assert_eq!(status(OLD), 401);
    assert_eq!(
        http(&addr, "GET", "/v1/tasks", None, "").0,
        401,
        "authentication stays on"
    );
}
