//! The web dashboard in a real browser: `tenax serve` on a seeded SQLite database,
//! headless Chromium driven through chromedriver (the distribution's packages; CI
//! installs them). The overview's charts must show the seeded numbers, a retry clicked
//! on a dead task must make it pending, a payload holding `<script>` must show as text,
//! a read-only token must see no action, and every page is saved as a screenshot under
//! `<target>/dashboard-screenshots/`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use tenax::storage::{
    FailNext, Lease, QueueChange, QueueUpdateParams, RunAt, ScheduleUpsertParams, Storage,
    TaskClaimParams, TaskCompleteParams, TaskFailParams, TaskInsertParams, WorkflowInsertParams,
    WorkflowKind, WorkflowPolicy, WorkflowTaskParams,
};
use tenax::{CompensationState, Priority, Schedule, TaskNo};

const ADMIN_TOKEN: &str = "tnx_dashboard_admin_token";
const READ_TOKEN: &str = "tnx_dashboard_read_token";
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// How long any one thing may take to show up in the browser.
const DEADLINE: Duration = Duration::from_secs(30);

/// Where the screenshots go: `<target>/dashboard-screenshots`.
fn screenshots() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .join("dashboard-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A child process killed on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn insert(no: &str, command_type: &str, queue: &str, payload: Value) -> TaskInsertParams {
    TaskInsertParams {
        task_no: TaskNo::new(no).unwrap(),
        command_type: command_type.into(),
        payload: payload.to_string(),
        payload_version: 1,
        queue: queue.into(),
        priority: Priority::DEFAULT,
        max_attempts: 3,
        timeout: Duration::from_secs(60),
        run_at: RunAt::Now,
        now: None,
        concurrency_key: None,
        concurrency_limit: 1,
        callback_url: None,
        created_by: None,
    }
}

/// Claim the one due task of `command_type` in `default` and finish it as told.
async fn run_one(storage: &dyn Storage, command_type: &str, outcome: Result<(), FailNext>) {
    let claimed = storage
        .task_claim_batch(&TaskClaimParams {
            worker: "seed-worker".into(),
            queues: vec!["default".into()],
            commands: vec![(command_type.into(), 1)],
            limit: 1,
            lease_ttl: Duration::from_secs(60),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "a {command_type} task to claim");
    let lease = Lease {
        id: claimed[0].id,
        epoch: claimed[0].lease_epoch,
    };
    let done = match outcome {
        Ok(()) => storage
            .task_complete_if_leased(&TaskCompleteParams {
                lease,
                result: Some(r#"{"account":"ACC-7"}"#.into()),
                compensation: CompensationState::None,
                now: None,
            })
            .await
            .unwrap(),
        Err(next) => storage
            .task_fail_if_leased(&TaskFailParams {
                lease,
                error: "partner bank answered 503".into(),
                next,
                now: None,
            })
            .await
            .unwrap(),
    };
    assert!(done);
}

/// Run the compensation of the task of `command_type` that just died.
async fn compensate_one(storage: &dyn Storage, command_type: &str) {
    let claimed = storage
        .task_claim_batch(&TaskClaimParams {
            worker: "seed-worker".into(),
            queues: vec!["default".into()],
            commands: vec![(command_type.into(), 1)],
            limit: 1,
            lease_ttl: Duration::from_secs(60),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "a compensation to claim");
    assert_eq!(claimed[0].kind, tenax::TaskKind::Compensate);
    let done = storage
        .task_complete_if_leased(&TaskCompleteParams {
            lease: Lease {
                id: claimed[0].id,
                epoch: claimed[0].lease_epoch,
            },
            result: None,
            compensation: CompensationState::Succeeded,
            now: None,
        })
        .await
        .unwrap();
    assert!(done);
}

/// The ids of the seeded dead tasks: the plain one and the one whose payload holds a
/// script.
struct Seeded {
    dead_plain: i64,
    dead_script: i64,
    workflow: i64,
}

/// 3 succeeded, 2 dead (one with `<script>` in its payload) whose compensations
/// succeeded (so 5 succeeded in all), 1 retrying, 4 pending in the paused queue
/// `billing`, an hourly schedule, and a workflow of 4 tasks in `flows` (1 pending, 3
/// blocked).
async fn seed(url: &str) -> Seeded {
    let storage = tenax::storage::connect(url).await.unwrap();
    let storage = storage.as_ref();
    for n in 0..3 {
        let no = format!("ok-{n}");
        storage
            .task_insert(&insert(&no, "echo", "default", json!({"n": n})))
            .await
            .unwrap();
        run_one(storage, "echo", Ok(())).await;
    }
    let dead_plain = storage
        .task_insert(&insert("dead-plain", "echo", "default", json!({"n": 9})))
        .await
        .unwrap()
        .task
        .id
        .0;
    run_one(storage, "echo", Err(FailNext::Dead)).await;
    compensate_one(storage, "echo").await;
    let dead_script = storage
        .task_insert(&insert(
            "dead-script",
            "BANK_OPEN_ACCOUNT",
            "default",
            json!({"customer": "<script>alert(1)</script>", "id_card": "1234X"}),
        ))
        .await
        .unwrap()
        .task
        .id
        .0;
    run_one(storage, "BANK_OPEN_ACCOUNT", Err(FailNext::Dead)).await;
    compensate_one(storage, "BANK_OPEN_ACCOUNT").await;
    storage
        .task_insert(&insert("flaky", "NOOP", "default", json!({})))
        .await
        .unwrap();
    run_one(
        storage,
        "NOOP",
        Err(FailNext::Retry(Duration::from_secs(3600))),
    )
    .await;
    for n in 0..4 {
        storage
            .task_insert(&insert(
                &format!("bill-{n}"),
                "echo",
                "billing",
                json!({"n": n}),
            ))
            .await
            .unwrap();
    }
    storage
        .queue_update(&QueueUpdateParams {
            queue: "billing".into(),
            change: QueueChange::Pause,
            now: None,
        })
        .await
        .unwrap();
    let def = Schedule::every("hourly-report", Duration::from_secs(3600))
        .command_raw("echo", &json!({"report": "hourly"}))
        .build()
        .unwrap();
    storage
        .schedule_upsert(&ScheduleUpsertParams { def, now: None })
        .await
        .unwrap();
    // A workflow: `load` first, then `bill` and `mail` after it, `report` after both.
    let step = |key: &str, after: &[&str]| WorkflowTaskParams {
        key: key.into(),
        task: insert(&format!("flow-{key}"), "flow_step", "flows", json!({})),
        after: after.iter().map(|a| (*a).to_owned()).collect(),
    };
    let workflow = storage
        .workflow_insert(&WorkflowInsertParams {
            name: "month end".into(),
            kind: WorkflowKind::Dag,
            policy: WorkflowPolicy::CancelDependents,
            tasks: vec![
                step("load", &[]),
                step("bill", &["load"]),
                step("mail", &["load"]),
                step("report", &["bill", "mail"]),
            ],
            now: None,
        })
        .await
        .unwrap()
        .workflow
        .id;
    Seeded {
        dead_plain,
        dead_script,
        workflow,
    }
}

fn start_server(dir: &Path, db_url: &str) -> (Process, String) {
    let config = dir.join("tenax.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ncommand_types = [\"echo\", \"NOOP\", \"BANK_OPEN_ACCOUNT\"]\n\
             [[server.tokens]]\nname = \"ops\"\nrole = \"admin\"\nsha256 = \"{}\"\n\
             [[server.tokens]]\nname = \"viewer\"\nrole = \"read\"\nsha256 = \"{}\"\n\
             [server.secrets]\nBANK_OPEN_ACCOUNT = [\"id_card\"]\n",
            tenax_server::hash_token(ADMIN_TOKEN),
            tenax_server::hash_token(READ_TOKEN)
        ),
    )
    .unwrap();
    // No workers: nothing moves but what the test does.
    let mut child = Command::new(env!("CARGO_BIN_EXE_tenax"))
        .arg("--config")
        .arg(&config)
        .args([
            "--database-url",
            db_url,
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--no-workers",
        ])
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
    (Process(child), addr)
}

/// One HTTP/1.1 request: status, head and body.
fn http(addr: &str, method: &str, path: &str, token: Option<&str>) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{auth}Content-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer[9..12].parse().unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (status, head.to_owned(), body.to_owned())
}

fn task_status(addr: &str, id: i64) -> String {
    let (status, _, body) = http(addr, "GET", &format!("/v1/tasks/{id}"), Some(ADMIN_TOKEN));
    assert_eq!(status, 200, "{body}");
    let task: Value = serde_json::from_str(&body).unwrap();
    task["status"].as_str().unwrap().to_owned()
}

fn start_chromedriver() -> (Process, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let process = Process(child);
    let deadline = Instant::now() + DEADLINE;
    loop {
        // It listens once it can take a session.
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "chromedriver did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    (process, port)
}

async fn browser(port: u16, profile: &Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": CHROMIUM,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1400,1100",
                format!("--user-data-dir={}", profile.display()),
            ]
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a Chromium session through chromedriver")
}

/// Evaluate a script in the page until it returns something truthy (or fail at the
/// deadline with `what`).
async fn wait_until(client: &Client, what: &str, script: &str) -> Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let value = client.execute(script, vec![]).await.unwrap();
        let truthy = match &value {
            Value::Null | Value::Bool(false) => false,
            Value::Array(a) => !a.is_empty(),
            Value::String(s) => !s.is_empty(),
            _ => true,
        };
        if truthy {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not seen in {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "{name}: not a PNG");
    std::fs::write(screenshots().join(format!("{name}.png")), png).unwrap();
}

async fn sign_in(client: &Client, addr: &str, token: &str) {
    client
        .goto(&format!("http://{addr}/#overview"))
        .await
        .unwrap();
    wait_until(
        client,
        "the token form",
        "return !document.getElementById('login').hidden",
    )
    .await;
    client
        .find(Locator::Id("token"))
        .await
        .unwrap()
        .send_keys(token)
        .await
        .unwrap();
    client
        .find(Locator::Css("#login button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_until(
        client,
        "the overview",
        "return document.querySelector('.fragment[data-view=overview]') !== null",
    )
    .await;
}

async fn show(client: &Client, hash: &str, view: &str) {
    client
        .execute(&format!("location.hash = {hash:?}"), vec![])
        .await
        .unwrap();
    wait_until(
        client,
        view,
        &format!("return document.querySelector('.fragment[data-view={view}]') !== null"),
    )
    .await;
}

/// The texts of a chart's SVG.
async fn chart_texts(client: &Client, chart: &str) -> Vec<String> {
    let texts = wait_until(
        client,
        chart,
        &format!(
            "return Array.from(document.querySelectorAll('figure[data-chart={chart}] svg text')).map(t => t.textContent.trim())"
        ),
    )
    .await;
    serde_json::from_value(texts).unwrap()
}

fn browser_installed() -> bool {
    if Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists() {
        return true;
    }
    assert!(
        std::env::var("TENAX_REQUIRE_ALL_BACKENDS").as_deref() != Ok("1"),
        "{CHROMIUM} and {CHROMEDRIVER} are required (Debian packages chromium and chromium-driver)"
    );
    eprintln!("SKIP: {CHROMIUM} or {CHROMEDRIVER} missing");
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_in_a_real_browser() {
    if !browser_installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db_url = format!("sqlite://{}", dir.path().join("tenax.db").display());
    let seeded = seed(&db_url).await;
    let (_server, addr) = start_server(dir.path(), &db_url);
    let (_driver, port) = start_chromedriver();
    let profile = tempfile::tempdir().unwrap();
    let client = browser(port, profile.path()).await;

    // The shell: no data, no token, a strict policy.
    let (status, head, body) = http(&addr, "GET", "/", None);
    assert_eq!(status, 200);
    assert!(
        head.to_ascii_lowercase().contains(&format!(
            "content-security-policy: {}",
            tenax_server::CSP.to_ascii_lowercase()
        )),
        "{head}"
    );
    assert!(!body.contains("dead-script") && !body.contains("billing"));

    // The overview as an operator: the charts show the seeded numbers.
    sign_in(&client, &addr, ADMIN_TOKEN).await;
    let status_texts = chart_texts(&client, "status").await;
    for label in [
        "pending",
        "retrying",
        "succeeded",
        "dead",
        "blocked",
        "5",
        "3",
        "2",
        "1",
    ] {
        assert!(
            status_texts.iter().any(|t| t == label),
            "status chart lacks {label:?}: {status_texts:?}"
        );
    }
    let backlog = chart_texts(&client, "backlog").await;
    assert!(
        backlog.iter().any(|t| t == "billing") && backlog.iter().any(|t| t == "4"),
        "{backlog:?}"
    );
    let throughput = chart_texts(&client, "throughput").await;
    assert!(
        throughput.iter().any(|t| t == "succeeded"),
        "{throughput:?}"
    );
    let latency = chart_texts(&client, "latency").await;
    assert!(latency.iter().any(|t| t == "echo"), "{latency:?}");
    let captions: String = client
        .execute(
            "return Array.from(document.querySelectorAll('figcaption')).map(f => f.textContent).join(' | ')",
            vec![],
        )
        .await
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned();
    assert!(captions.contains("succeeded 5"), "{captions}");
    assert!(captions.contains("dead 2"), "{captions}");
    assert!(captions.contains("retrying 1"), "{captions}");
    assert!(captions.contains("pending 5"), "{captions}");
    assert!(captions.contains("5 succeeded · 2 dead"), "{captions}");
    assert!(captions.contains("billing 4"), "{captions}");
    // Each chart is laid out with a real size (the policy blocked nothing it needs).
    let sizes = client
        .execute(
            "return Array.from(document.querySelectorAll('figure.chart svg')).map(s => s.getBoundingClientRect().height)",
            vec![],
        )
        .await
        .unwrap();
    let sizes: Vec<f64> = serde_json::from_value(sizes).unwrap();
    assert!(
        sizes.len() == 4 && sizes.iter().all(|h| *h > 100.0),
        "{sizes:?}"
    );
    screenshot(&client, "overview").await;

    // Queues and schedules.
    show(&client, "#queues", "queues").await;
    wait_until(
        &client,
        "the paused queue",
        "return document.querySelector('tr[data-queue=billing] .status-paused') !== null",
    )
    .await;
    screenshot(&client, "queues").await;
    show(&client, "#schedules", "schedules").await;
    let schedule_row: String = wait_until(
        &client,
        "the schedule",
        "const r = document.querySelector('tr[data-schedule=hourly-report]'); return r ? r.textContent : ''",
    )
    .await
    .as_str()
    .unwrap()
    .to_owned();
    assert!(
        schedule_row.contains("UTC"),
        "next fire time: {schedule_row}"
    );
    screenshot(&client, "schedules").await;

    // A workflow is drawn as a graph: a box per task in its status, an arrow per
    // dependency, each dependent right of what it waits for.
    show(
        &client,
        &format!("#workflow/{}", seeded.workflow),
        "workflow",
    )
    .await;
    let boxes = wait_until(
        &client,
        "the workflow graph",
        "const g = Array.from(document.querySelectorAll('svg.workflow-graph g.node')); \
         return g.length === 4 ? g.map(n => [n.dataset.key, n.getAttribute('class'), \
         n.querySelector('rect').getBoundingClientRect().x]) : null",
    )
    .await;
    let boxes: Vec<(String, String, f64)> = serde_json::from_value(boxes).unwrap();
    let x = |key: &str| boxes.iter().find(|b| b.0 == key).unwrap().2;
    assert!(x("load") < x("bill") && x("bill") == x("mail") && x("mail") < x("report"));
    assert!(boxes[0].1.contains("status-pending"), "{boxes:?}");
    assert!(boxes[3].1.contains("status-blocked"), "{boxes:?}");
    let arrows = client
        .execute(
            "return document.querySelectorAll('svg.workflow-graph path.edge').length",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(arrows, json!(4));
    screenshot(&client, "workflow").await;

    // The payload holding a script shows as text; the secret field is hidden.
    show(&client, &format!("#task/{}", seeded.dead_script), "task").await;
    let payload: String = client
        .find(Locator::Css("pre.payload"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(payload.contains("<script>alert(1)</script>"), "{payload}");
    assert!(
        payload.contains("\"***\"") && !payload.contains("1234X"),
        "{payload}"
    );
    let scripts = client
        .execute("return document.scripts.length", vec![])
        .await
        .unwrap();
    assert_eq!(scripts, json!(1), "only the dashboard's own script");
    assert!(client.get_alert_text().await.is_err(), "an alert fired");
    let fields = client
        .find(Locator::Css("dl.fields"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        fields.contains("succeeded") && fields.contains("compensation task"),
        "the compensation and its task: {fields}"
    );
    screenshot(&client, "task-detail").await;

    // Dead tasks: retry one from the page; the API then shows it pending.
    show(&client, "#dead", "dead").await;
    let button = format!(
        "tr[data-task='{}'] button.action[data-url='/v1/tasks/{}/retry']",
        seeded.dead_plain, seeded.dead_plain
    );
    wait_until(
        &client,
        "the retry button",
        &format!("return document.querySelector({button:?}) !== null"),
    )
    .await;
    screenshot(&client, "dead-tasks").await;
    assert_eq!(task_status(&addr, seeded.dead_plain), "dead");
    client
        .find(Locator::Css(&button))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let deadline = Instant::now() + DEADLINE;
    while task_status(&addr, seeded.dead_plain) != "pending" {
        assert!(
            Instant::now() < deadline,
            "the retried task never became pending"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_until(
        &client,
        "the retried task leaving the dead list",
        &format!(
            "return document.querySelector(\"tr[data-task='{}'][data-status=dead]\") === null",
            seeded.dead_plain
        ),
    )
    .await;
    let (_, _, audit) = http(&addr, "GET", "/v1/audit", Some(ADMIN_TOKEN));
    assert!(
        audit.contains("\"task.retry\"") && audit.contains("\"ops\""),
        "{audit}"
    );
    show(&client, "#audit", "audit").await;
    screenshot(&client, "audit").await;

    // A read-only token: the same pages, no action anywhere.
    client
        .find(Locator::Id("signout"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_until(
        &client,
        "signed out",
        "return sessionStorage.length === 0 && !document.getElementById('login').hidden",
    )
    .await;
    sign_in(&client, &addr, READ_TOKEN).await;
    let who = client
        .find(Locator::Id("who"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(who.contains("viewer") && who.contains("read"), "{who}");
    for (hash, view) in [
        ("#dead", "dead"),
        ("#queues", "queues"),
        ("#schedules", "schedules"),
        (&format!("#task/{}", seeded.dead_script) as &str, "task"),
    ] {
        show(&client, hash, view).await;
        let buttons = client
            .execute(
                "return document.querySelectorAll('#view button').length",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(
            buttons,
            json!(0),
            "{hash}: a read-only token sees an action"
        );
        if view == "dead" {
            screenshot(&client, "dead-tasks-read-only").await;
        }
    }
    // ... and could not use one anyway.
    let (status, _, _) = http(
        &addr,
        "POST",
        &format!("/v1/tasks/{}/retry", seeded.dead_script),
        Some(READ_TOKEN),
    );
    assert_eq!(status, 403);
    client.close().await.unwrap();
    for name in [
        "overview",
        "queues",
        "schedules",
        "task-detail",
        "dead-tasks",
        "audit",
        "dead-tasks-read-only",
        "workflow",
    ] {
        assert!(
            screenshots().join(format!("{name}.png")).exists(),
            "{name}.png"
        );
    }
}
