//! The RabbitMQ relay delivers every task event, in order per task, through a broker
//! that is restarted cleanly early in the run, then has its Erlang VM killed (-9) and
//! restarted in the middle of it. The broker is
//! a private RabbitMQ node (its own node name, ports, data, logs and an empty plugin
//! list); a consumer on the relay's durable quorum queue collects what arrives.
#![cfg(feature = "rabbitmq")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use tenax_core::CompensationState;
use tenax_delivery::events::{EventsConfig, Sequencer};
use tenax_delivery::events_rabbitmq::{RabbitMqConfig, RabbitMqRelay};
use tenax_storage::testing::{claim_params, sqlite_file, TaskOpts};
use tenax_storage::{EventListParams, EventRuleParams, Lease, Storage, TaskCompleteParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[path = "support/leaky.rs"]
mod leaky;

const TASKS: usize = 3_334;
/// The Debian package's server script (the one in /usr/sbin switches to the
/// `rabbitmq` user and drops the environment that makes the node private).
const RABBITMQ_SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";
const QUEUE: &str = "tenax-events-test";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One line of /proc/<pid>/stat: (pid, command name, state, parent, process group).
fn proc_stat(pid: i32) -> Option<(String, char, i32, i32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_owned();
    let mut rest = text[close + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    let pgrp = rest.next()?.parse().ok()?;
    Some((comm, state, ppid, pgrp))
}

fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A process is gone once it no longer exists or is only a zombie awaiting its reaper.
fn running(pid: i32) -> bool {
    proc_stat(pid).is_some_and(|(_, state, _, _)| state != 'Z' && state != 'X')
}

fn sigkill(pid: i32) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// A private RabbitMQ node: the server script runs in a process group of its own;
/// the Erlang VM (`beam.smp`) is its child, and the VM's helpers
/// (`erl_child_setup`, `inet_gethost`) start sessions of their own, so they are
/// found through the parent links instead of the group.
struct Node {
    name: String,
    port: u16,
    dist_port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// Every process the node started, as last seen (killed on drop).
    family: Vec<i32>,
}

impl Node {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut node = Self {
            name: format!(
                "tenax-relay-test-{}-{:08x}@localhost",
                std::process::id(),
                rand::random::<u32>()
            ),
            port: free_port(),
            dist_port: free_port(),
            dir,
            child: None,
            family: Vec::new(),
        };
        std::fs::write(node.path("enabled_plugins"), "[].\n").unwrap();
        std::fs::write(node.path("rabbitmq-env.conf"), "").unwrap();
        std::fs::write(
            node.path("rabbitmq.conf"),
            format!("listeners.tcp.1 = 127.0.0.1:{}\n", node.port),
        )
        .unwrap();
        node.spawn();
        node
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn spawn(&mut self) {
        use std::os::unix::process::CommandExt;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("console.log"))
            .unwrap();
        let child = Command::new(RABBITMQ_SERVER)
            .current_dir(self.dir.path())
            .env("RABBITMQ_NODENAME", &self.name)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", self.path("mnesia"))
            .env("RABBITMQ_LOG_BASE", self.path("log"))
            .env("RABBITMQ_PID_FILE", self.path("node.pid"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                self.path("enabled_plugins"),
            )
            .env("RABBITMQ_PLUGINS_EXPAND_DIR", self.path("plugins-expand"))
            .env("RABBITMQ_CONF_ENV_FILE", self.path("rabbitmq-env.conf"))
            .env("RABBITMQ_CONFIG_FILE", self.path("rabbitmq.conf"))
            .env(
                "RABBITMQ_ADVANCED_CONFIG_FILE",
                self.path("advanced.config"),
            )
            .env("RABBITMQ_FEATURE_FLAGS_FILE", self.path("feature_flags"))
            // Distribution on the loopback only; the shared epmd is fine.
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env(
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                "-kernel inet_dist_use_interface {127,0,0,1}",
            )
            .env_remove("ERL_FLAGS")
            .env_remove("RABBITMQ_ALLOW_INPUT")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("start rabbitmq-server");
        self.child = Some(child);
    }

    fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// Wait until an AMQP connection succeeds.
    async fn wait_ready(&mut self) -> Duration {
        let started = Instant::now();
        let deadline = started + Duration::from_secs(120);
        loop {
            let attempt = tokio::time::timeout(
                Duration::from_secs(5),
                Connection::connect(&self.url(), ConnectionProperties::default()),
            )
            .await;
            if let Ok(Ok(connection)) = attempt {
                let _ = connection.close(200, "ready".into()).await;
                self.family = self.descendants();
                return started.elapsed();
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!(
                    "rabbitmq-server exited with {status} before it was ready:\n{}",
                    self.console_tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the RabbitMQ node was not ready within 120 s:\n{}",
                self.console_tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn console_tail(&self) -> String {
        let text = std::fs::read_to_string(self.path("console.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    fn leader(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    /// Every running process below the server script.
    fn descendants(&self) -> Vec<i32> {
        let Some(root) = self.leader() else {
            return Vec::new();
        };
        let parents: Vec<(i32, i32)> = all_pids()
            .into_iter()
            .filter_map(|pid| proc_stat(pid).map(|(_, _, ppid, _)| (pid, ppid)))
            .collect();
        let mut family = vec![root];
        let mut i = 0;
        while i < family.len() {
            let parent = family[i];
            family.extend(
                parents
                    .iter()
                    .filter(|(_, ppid)| *ppid == parent)
                    .map(|(pid, _)| *pid),
            );
            i += 1;
        }
        family
    }

    /// The Erlang VM's process id.
    fn beam(&self) -> Option<i32> {
        self.descendants()
            .into_iter()
            .find(|pid| proc_stat(*pid).is_some_and(|(comm, ..)| comm == "beam.smp"))
    }

    /// Freeze the Erlang VM (SIGSTOP): the broker stops reading, confirming and
    /// delivering, while clients can still write into their sockets.
    fn freeze(&self) {
        let beam = self.beam().expect("no Erlang VM below rabbitmq-server");
        if let Some(pid) = rustix::process::Pid::from_raw(beam) {
            rustix::process::kill_process(pid, rustix::process::Signal::STOP)
                .expect("SIGSTOP the Erlang VM");
        }
    }

    /// Let a frozen Erlang VM go on (SIGCONT).
    fn thaw(&self) {
        if let Some(pid) = self.beam().and_then(rustix::process::Pid::from_raw) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::CONT);
        }
    }

    /// The most bytes waiting unread in one of the node's established AMQP
    /// connections (the receive queue of /proc/net/tcp).
    fn unread(&self) -> u64 {
        let text = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        let port = format!(":{:04X}", self.port);
        text.lines()
            .skip(1)
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() < 5 || !f[1].ends_with(&port) || f[3] != "01" {
                    return None;
                }
                let (_, rx) = f[4].split_once(':')?;
                u64::from_str_radix(rx, 16).ok()
            })
            .max()
            .unwrap_or(0)
    }

    /// Stop the node gracefully (SIGTERM to the Erlang VM, which shuts RabbitMQ down
    /// cleanly and closes its files) and wait until none of its processes runs.
    fn stop(&mut self) {
        let mut family = self.descendants();
        family.extend(self.family.iter().copied());
        if let Some(pid) = self.beam().and_then(rustix::process::Pid::from_raw) {
            rustix::process::kill_process(pid, rustix::process::Signal::TERM)
                .expect("SIGTERM the Erlang VM");
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while family.iter().any(|pid| running(*pid)) {
            assert!(
                std::time::Instant::now() < deadline,
                "the RabbitMQ node did not stop within 60 s of SIGTERM:\n{}",
                self.console_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
        self.family.clear();
    }

    /// SIGKILL the Erlang VM itself, then whatever is left of the node (its process
    /// group and every process it started), and wait until none of them runs.
    fn kill(&mut self) {
        let Some(leader) = self.leader() else { return };
        let mut family = self.descendants();
        family.extend(self.family.iter().copied());
        if let Some(beam) = self.beam() {
            sigkill(beam);
        }
        if let Some(group) = rustix::process::Pid::from_raw(leader) {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
        for pid in &family {
            sigkill(*pid);
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while family.iter().any(|pid| running(*pid)) {
            if std::time::Instant::now() >= deadline {
                let left: Vec<_> = family.iter().filter(|p| running(**p)).collect();
                panic!("processes of the RabbitMQ node still run: {left:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.family.clear();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("RabbitMQ console:\n{}", self.console_tail());
            let log = self.path("log").join(format!("{}.log", self.name));
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!(
                "RabbitMQ log:\n{}",
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
        }
        let Some(leader) = self.leader() else { return };
        let mut family = self.descendants();
        family.extend(self.family.iter().copied());
        if let Some(group) = rustix::process::Pid::from_raw(leader) {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
        for pid in family {
            sigkill(pid);
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }
}

/// What the consumer received, in arrival order (event ids), and whether it is
/// connected.
#[derive(Default)]
struct Received {
    ids: Vec<String>,
    bad: Vec<String>,
    /// Every body, as received.
    bodies: Vec<String>,
}

/// Consume the quorum queue until `stop`, acknowledging each message after it is
/// recorded, and reconnecting whenever the connection is lost.
async fn consume(url: String, received: Arc<Mutex<Received>>, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let attempt = async {
            let connection = tokio::time::timeout(
                Duration::from_secs(5),
                Connection::connect(&url, ConnectionProperties::default()),
            )
            .await
            .map_err(|_| "connect timed out".to_owned())?
            .map_err(|e| e.to_string())?;
            let channel = connection
                .create_channel()
                .await
                .map_err(|e| e.to_string())?;
            channel
                .basic_qos(500, BasicQosOptions::default())
                .await
                .map_err(|e| e.to_string())?;
            let consumer = channel
                .basic_consume(
                    QUEUE.into(),
                    "tenax-test".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>((connection, consumer))
        };
        // Every call to a node that may be frozen or dead is bounded.
        let attempt = tokio::time::timeout(Duration::from_secs(10), attempt)
            .await
            .unwrap_or_else(|_| Err("setting up the consumer timed out".to_owned()));
        let (connection, mut consumer) = match attempt {
            Ok(pair) => pair,
            Err(_) => {
                // The node is down or the relay has not declared the queue yet.
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(200)) => continue,
                }
            }
        };
        loop {
            let next = tokio::select! {
                () = stop.cancelled() => {
                    let _ = connection.close(200, "done".into()).await;
                    return;
                }
                next = consumer.next() => next,
            };
            let Some(Ok(delivery)) = next else { break };
            let body: serde_json::Value = match serde_json::from_slice(&delivery.data) {
                Ok(body) => body,
                Err(e) => {
                    received.lock().unwrap().bad.push(format!("not JSON: {e}"));
                    continue;
                }
            };
            let id = body["id"].as_str().unwrap_or_default().to_owned();
            {
                let mut r = received.lock().unwrap();
                r.bodies
                    .push(String::from_utf8_lossy(&delivery.data).into_owned());
                let props = &delivery.properties;
                let message_id = props.message_id().as_ref().map(|m| m.as_str().to_owned());
                if message_id.as_deref() != Some(id.as_str())
                    || props.delivery_mode() != &Some(2)
                    || props.content_type().as_ref().map(|c| c.as_str()) != Some("application/json")
                    || props.kind().as_ref().map(|k| k.as_str()) != body["event"].as_str()
                    || !delivery
                        .routing_key
                        .as_str()
                        .starts_with("tenax.events.default.")
                {
                    r.bad.push(format!(
                        "{id}: message_id {message_id:?}, properties {props:?}, routing key {}",
                        delivery.routing_key
                    ));
                }
                r.ids.push(id);
            }
            let acked = tokio::time::timeout(
                Duration::from_secs(5),
                delivery.ack(BasicAckOptions::default()),
            )
            .await;
            if !matches!(acked, Ok(Ok(_))) {
                break;
            }
        }
        // The connection was lost (the node was killed): reconnect.
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_event_reaches_rabbitmq_across_a_broker_crash() {
    if !Path::new(RABBITMQ_SERVER).exists() {
        assert!(
            std::env::var_os("TENAX_REQUIRE_ALL_BACKENDS").is_none(),
            "{RABBITMQ_SERVER} is missing"
        );
        eprintln!("skipped: {RABBITMQ_SERVER} is missing");
        return;
    }
    // The relay's own account of its reconnects (RUST_LOG=tenax_delivery=debug for more).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "tenax_delivery=info".into()),
        )
        .with_test_writer()
        .try_init();
    let started = Instant::now();
    let mut node = Node::start();
    let first_boot = node.wait_ready().await;
    let h = Arc::new(sqlite_file().await.expect("sqlite"));
    let storage: Arc<dyn Storage> = h.storage.clone();
    storage
        .event_rule_set(&EventRuleParams {
            queue: None,
            command_type: None,
            enabled: true,
            now: None,
        })
        .await
        .unwrap();
    let events = EventsConfig {
        poll_interval: Duration::from_millis(20),
        lease_ttl: Duration::from_secs(3),
        batch: 200,
        rabbitmq: Some(RabbitMqConfig {
            queue: Some(QUEUE.to_owned()),
            confirm_timeout: Duration::from_secs(2),
            ..RabbitMqConfig::new(node.url())
        }),
        ..EventsConfig::default()
    };
    events.validate().unwrap();
    assert_eq!(events.relays(), vec!["relay:rabbitmq".to_owned()]);
    // The tasks are enqueued first, so the relay starts with a backlog and still has
    // unconfirmed messages in flight when the node is killed; they then run while the
    // relay publishes: started, succeeded each.
    for _ in 0..TASKS {
        h.task(TaskOpts::default()).await;
    }
    let stop = CancellationToken::new();
    let sequencer = tokio::spawn(
        Sequencer::new(storage.clone(), "node-a", events.clone(), events.relays())
            .run(stop.clone()),
    );
    let relay = tokio::spawn(
        RabbitMqRelay::new(
            storage.clone(),
            "node-a",
            events.clone(),
            events.rabbitmq.clone().unwrap(),
        )
        .run(stop.clone()),
    );
    let received = Arc::new(Mutex::new(Received::default()));
    let stop_consumer = CancellationToken::new();
    let consumer = tokio::spawn(consume(node.url(), received.clone(), stop_consumer.clone()));

    let producer = {
        let storage = storage.clone();
        tokio::spawn(async move {
            let mut done = 0;
            while done < TASKS {
                let claimed = storage
                    .task_claim_batch(&claim_params("w", 200, None))
                    .await
                    .unwrap();
                for t in claimed {
                    assert!(storage
                        .task_complete_if_leased(&TaskCompleteParams {
                            lease: Lease {
                                id: t.id,
                                epoch: t.lease_epoch,
                            },
                            result: Some("{\"ok\":true}".into()),
                            compensation: CompensationState::None,
                            now: None,
                        })
                        .await
                        .unwrap());
                    done += 1;
                }
            }
        })
    };

    // Restart the node gracefully once the first messages arrived: publishes wait
    // through a clean broker restart too. The clean stop also matters to the crash
    // below: on a single RabbitMQ 3.10 node, a quorum queue declared seconds before the
    // VM is killed came back without a leader ("leader not known" in the node's log,
    // its Ra registration file repaired at boot) and never confirmed a publish again;
    // a queue that went through a clean stop recovers from the crash. (A real
    // deployment declares its queue long before a crash.)
    let deadline = Instant::now() + Duration::from_secs(120);
    while received.lock().unwrap().ids.len() < 200 {
        assert!(
            Instant::now() < deadline,
            "no messages reached the consumer"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    node.stop();
    node.spawn();
    let restart = node.wait_ready().await;
    eprintln!("node stopped and started again in {restart:?}");

    // Kill the node's Erlang VM once about 2,000 messages reached the consumer (a
    // quorum queue delivers a message only once it is committed, which is when the
    // broker confirms it to the publisher), then restart it on the same port and
    // data directory. To kill it while the relay has messages in flight that were
    // never confirmed, the VM is first frozen until a page of publishes waits unread
    // in the relay's connection.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut before_kill = 0;
    while before_kill < 2_000 {
        assert!(
            Instant::now() < deadline,
            "the consumer received only {before_kill} messages"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        before_kill = received.lock().unwrap().ids.len();
    }
    // A freeze that lands while the relay waits for the confirms of a page the broker
    // already read finds nothing unread: thaw, let a page through, and freeze again.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        node.freeze();
        let frozen_at = Instant::now();
        while node.unread() < 32 * 1024 && frozen_at.elapsed() < Duration::from_millis(1500) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if node.unread() >= 32 * 1024 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the relay never had a page unread in a frozen node"
        );
        node.thaw();
        let count = received.lock().unwrap().ids.len();
        let until = Instant::now() + Duration::from_secs(5);
        while received.lock().unwrap().ids.len() == count && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let unconfirmed = node.unread();
    node.kill();
    let killed_at = Instant::now();
    node.spawn();
    let second_boot = node.wait_ready().await;
    eprintln!(
        "node booted in {first_boot:?}, killed after {before_kill} messages received with {unconfirmed} bytes of publishes unread, back after {:?}",
        killed_at.elapsed()
    );
    producer.await.unwrap();

    // Every event the table holds, by position.
    let mut table = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let page = storage
            .event_list(&EventListParams {
                after: table.last().map_or(0, |e: &tenax_storage::EventRecord| {
                    e.seq.unwrap_or_default()
                }),
                limit: 1000,
                ..Default::default()
            })
            .await
            .unwrap();
        let empty = page.events.is_empty();
        table.extend(page.events);
        if empty && table.len() >= 3 * TASKS {
            break;
        }
        assert!(Instant::now() < deadline, "events were not sequenced");
        if empty {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let total = table.len();
    assert!(total >= 10_000, "{total} events");
    let expected: HashSet<&String> = table.iter().map(|e| &e.event_id).collect();

    // Wait until the consumer holds every event id.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let have = {
            let r = received.lock().unwrap();
            let distinct: HashSet<&String> = r.ids.iter().collect();
            expected.iter().filter(|id| distinct.contains(*id)).count()
        };
        if have == total {
            break;
        }
        if Instant::now() >= deadline {
            eprintln!("the consumer has {have} of {total} events at the deadline");
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_consumer.cancel();
    tokio::time::timeout(Duration::from_secs(10), consumer)
        .await
        .expect("the consumer did not stop")
        .unwrap();
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), sequencer)
        .await
        .expect("the sequencer did not stop")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), relay)
        .await
        .expect("the relay did not stop")
        .unwrap();

    let r = received.lock().unwrap();
    let seen = &r.ids;
    let distinct: HashSet<&String> = seen.iter().collect();
    let duplicates = seen.len() - distinct.len();
    let missing = expected.difference(&distinct).count();
    let extra = distinct.difference(&expected).count();
    eprintln!(
        "sent (events in the table): {total}; received: {}; distinct: {}; duplicates: {duplicates}; missing: {missing}; received before the kill: {before_kill}; second boot {second_boot:?}; took {:.1} s",
        seen.len(),
        distinct.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        r.bad.is_empty(),
        "bad messages: {:?}",
        &r.bad[..r.bad.len().min(5)]
    );
    assert_eq!(missing, 0, "events missing from the queue");
    assert_eq!(extra, 0, "unknown events in the queue");
    assert_eq!(distinct.len(), total);
    assert!(before_kill < total, "the node was killed before the end");

    // In order per task: each task's events arrive in position order (first
    // occurrences; a redelivered copy may come later).
    let position: HashMap<&String, i64> = table
        .iter()
        .map(|e| (&e.event_id, e.seq.unwrap()))
        .collect();
    let task_of: HashMap<&String, _> = table.iter().map(|e| (&e.event_id, e.task_id)).collect();
    let mut last = HashMap::new();
    let mut first_seen = HashSet::new();
    for id in seen {
        if !first_seen.insert(id) {
            continue;
        }
        let seq = position[id];
        let previous = last.insert(task_of[id], seq).unwrap_or(0);
        assert!(previous < seq, "task {:?} out of order", task_of[id]);
    }
    drop(r);
    node.kill();
}

/// Tasks whose handlers put their secret payload fields, in every shape, into their
/// results and errors, run by a worker configured with those fields: every message the
/// relay publishes carries the masked texts, and no secret value.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relayed_events_carry_no_secret_value_in_any_shape() {
    if !Path::new(RABBITMQ_SERVER).exists() {
        assert!(
            std::env::var_os("TENAX_REQUIRE_ALL_BACKENDS").is_none(),
            "{RABBITMQ_SERVER} is missing"
        );
        eprintln!("skipped: {RABBITMQ_SERVER} is missing");
        return;
    }
    let mut node = Node::start();
    node.wait_ready().await;
    let h = sqlite_file().await.expect("sqlite");
    let storage: Arc<dyn Storage> = h.storage.clone();
    storage
        .event_rule_set(&EventRuleParams {
            queue: None,
            command_type: None,
            enabled: true,
            now: None,
        })
        .await
        .unwrap();
    let events = EventsConfig {
        poll_interval: Duration::from_millis(20),
        rabbitmq: Some(RabbitMqConfig {
            queue: Some(QUEUE.to_owned()),
            ..RabbitMqConfig::new(node.url())
        }),
        secrets: tenax_storage::testing::secrets::secrets(),
        ..EventsConfig::default()
    };
    let stop = CancellationToken::new();
    let sequencer = tokio::spawn(
        Sequencer::new(storage.clone(), "node-a", events.clone(), events.relays())
            .run(stop.clone()),
    );
    let relay = tokio::spawn(
        RabbitMqRelay::new(
            storage.clone(),
            "node-a",
            events.clone(),
            events.rabbitmq.clone().unwrap(),
        )
        .run(stop.clone()),
    );
    let received = Arc::new(Mutex::new(Received::default()));
    let stop_consumer = CancellationToken::new();
    let consumer = tokio::spawn(consume(node.url(), received.clone(), stop_consumer.clone()));
    let tasks = leaky::run_leaky_tasks(storage.clone()).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ends = leaky::ends(&received.lock().unwrap().bodies);
        if ends >= tasks {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{ends} ends of {tasks} tasks were received"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_consumer.cancel();
    consumer.await.unwrap();
    stop.cancel();
    sequencer.await.unwrap();
    relay.await.unwrap();
    let bodies = received.lock().unwrap().bodies.clone();
    leaky::assert_masked(&bodies, tasks);
}
