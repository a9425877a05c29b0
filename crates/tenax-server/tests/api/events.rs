//! `GET /v1/events` over a real socket: a client that disconnects and resumes from its
//! last id misses nothing, filters narrow the stream, and resuming from a pruned
//! position is refused explicitly.
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use axum::http::{Method, StatusCode};
use serde_json::Value;
use tenax::storage::{EventPruneParams, EventRuleParams, Storage};
use tenax::{Command, CommandError, Registry, TaskContext, Worker, WorkerConfig};
use tenax_delivery::events::{EventsConfig, Sequencer};
use tenax_storage::testing::Harness;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::on_every_backend;
use crate::support::*;

struct Echo;

impl Command for Echo {
    const TYPE: &'static str = "echo";
    type Context = Value;
    type Output = Value;

    async fn execute(&self, ctx: Value, _task: &TaskContext) -> Result<Value, CommandError> {
        Ok(ctx)
    }
}

/// One received message.
#[derive(Debug, Clone)]
struct Message {
    id: Option<i64>,
    event: String,
    data: Value,
}

/// A Server-Sent Events client over a plain socket: HTTP/1.1, chunked body decoded as
/// it arrives, messages split on blank lines.
struct SseClient {
    stream: tokio::net::TcpStream,
    raw: Vec<u8>,
    text: String,
    status: u16,
}

impl SseClient {
    async fn connect(addr: std::net::SocketAddr, uri: &str, last_id: Option<i64>) -> Self {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut head = format!(
            "GET {uri} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\nAuthorization: Bearer {READER}\r\n"
        );
        if let Some(id) = last_id {
            head.push_str(&format!("Last-Event-ID: {id}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut client = Self {
            stream,
            raw: Vec::new(),
            text: String::new(),
            status: 0,
        };
        loop {
            if let Some(split) = client.raw.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&client.raw[..split]).to_string();
                client.status = head[9..12].parse().unwrap();
                client.raw.drain(..split + 4);
                if client.status == 200 {
                    assert!(
                        head.to_ascii_lowercase()
                            .contains("content-type: text/event-stream"),
                        "{head}"
                    );
                }
                return client;
            }
            client.read_more().await;
        }
    }

    async fn read_more(&mut self) {
        let mut buf = [0u8; 8192];
        let n = tokio::time::timeout(Duration::from_secs(30), self.stream.read(&mut buf))
            .await
            .expect("the server sends within 30 s (keep-alives included)")
            .unwrap();
        assert!(n > 0, "the stream ended");
        self.raw.extend_from_slice(&buf[..n]);
    }

    /// Move whole chunks of the body into `text`.
    fn decode(&mut self) {
        loop {
            let Some(end) = self.raw.windows(2).position(|w| w == b"\r\n") else {
                return;
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&self.raw[..end]).unwrap().trim(), 16)
                    .unwrap();
            if self.raw.len() < end + 2 + size + 2 {
                return;
            }
            self.text
                .push_str(std::str::from_utf8(&self.raw[end + 2..end + 2 + size]).unwrap());
            self.raw.drain(..end + 2 + size + 2);
        }
    }

    /// The next message (keep-alive comments skipped).
    async fn next(&mut self) -> Message {
        loop {
            self.decode();
            if let Some(end) = self.text.find("\n\n") {
                let block: String = self.text.drain(..end + 2).collect();
                let mut message = Message {
                    id: None,
                    event: "message".into(),
                    data: Value::Null,
                };
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        message.id = Some(v.trim().parse().unwrap());
                    } else if let Some(v) = line.strip_prefix("event:") {
                        v.trim().clone_into(&mut message.event);
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if data.is_empty() {
                    continue;
                }
                message.data = serde_json::from_str(&data).unwrap();
                return message;
            }
            self.read_more().await;
        }
    }
}

async fn events_on(storage: &dyn Storage) {
    storage
        .event_rule_set(&EventRuleParams {
            queue: None,
            command_type: None,
            enabled: true,
            now: None,
        })
        .await
        .unwrap();
}

fn sequencer(h: &Harness, stop: &CancellationToken) -> tokio::task::JoinHandle<()> {
    let config = EventsConfig {
        poll_interval: Duration::from_millis(20),
        ..EventsConfig::default()
    };
    let sequencer = Sequencer::new(h.storage.clone(), "test-node", config, Vec::new());
    tokio::spawn(sequencer.run(stop.clone()))
}

async fn a_client_that_resumes_from_its_last_id_misses_nothing(h: &Harness) {
    events_on(&*h.storage).await;
    let served = served(h.storage.clone(), config()).await;
    let stop = CancellationToken::new();
    let seq = sequencer(h, &stop);
    let mut registry = Registry::new();
    registry.register(Echo).unwrap();
    let worker = Worker::new(
        h.storage.clone(),
        registry,
        WorkerConfig {
            poll_interval: Duration::from_millis(20),
            ..WorkerConfig::default()
        },
    )
    .unwrap();
    let running = tokio::spawn(worker.run(stop.clone()));
    let tasks = 150usize;
    let expected = tasks * 3;
    // Tasks arrive while the client reads, disconnects and comes back.
    let storage = h.storage.clone();
    let enqueuer = tokio::spawn(async move {
        let client = tenax::Client::new(storage);
        for i in 0..tasks {
            client
                .enqueue_raw("echo", &serde_json::json!({ "i": i }))
                .await
                .unwrap();
            if i % 10 == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });

    let mut received: Vec<Message> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    // The next message, or a failure naming how far the stream got by the deadline.
    let within = |received: &Vec<Message>| {
        let left = deadline.saturating_duration_since(Instant::now());
        let got = received.len();
        move |next: Result<Message, tokio::time::error::Elapsed>| {
            next.unwrap_or_else(|_| panic!("only {got} of {expected} events after {left:?}"))
        }
    };
    let mut first = SseClient::connect(served.addr, "/v1/events?after=0", None).await;
    assert_eq!(first.status, 200);
    while received.len() < expected / 3 {
        let left = deadline.saturating_duration_since(Instant::now());
        let check = within(&received);
        received.push(check(tokio::time::timeout(left, first.next()).await));
    }
    let last = received.last().unwrap().id.unwrap();
    drop(first);
    let mut second = SseClient::connect(served.addr, "/v1/events", Some(last)).await;
    assert_eq!(second.status, 200);
    while received.len() < expected {
        let left = deadline.saturating_duration_since(Instant::now());
        let check = within(&received);
        received.push(check(tokio::time::timeout(left, second.next()).await));
    }
    enqueuer.await.unwrap();

    // Positions are consecutive across the two connections: nothing missed, nothing twice.
    let ids: Vec<i64> = received.iter().map(|m| m.id.unwrap()).collect();
    assert_eq!(ids, (1..=expected as i64).collect::<Vec<_>>());
    let event_ids: HashSet<&str> = received
        .iter()
        .map(|m| m.data["id"].as_str().unwrap())
        .collect();
    assert_eq!(event_ids.len(), expected);
    let mut per_task: HashMap<i64, Vec<String>> = HashMap::new();
    for m in &received {
        assert_eq!(m.data["schema"], "tenax.task_event.v1");
        assert_eq!(m.data["event"], m.event.as_str());
        assert_eq!(m.data["seq"], m.id.unwrap());
        per_task
            .entry(m.data["task"]["id"].as_i64().unwrap())
            .or_default()
            .push(m.event.clone());
    }
    assert_eq!(per_task.len(), tasks);
    // Every message, as an SSE reader parses it, is what the OpenAPI document says a
    // message of this stream is.
    let doc = serde_json::to_value(tenax_server::openapi()).unwrap();
    let mut schema = doc["paths"]["/v1/events"]["get"]["responses"]["200"]["content"]
        ["text/event-stream"]["schema"]
        .clone();
    schema["components"] = doc["components"].clone();
    let validator = jsonschema::validator_for(&schema).unwrap();
    for m in &received {
        let parsed = serde_json::json!({
            "id": m.id.unwrap().to_string(),
            "event": m.event,
            "data": m.data.to_string(),
        });
        let errors: Vec<String> = validator
            .iter_errors(&parsed)
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "{parsed} is not a documented message: {errors:?}"
        );
    }
    for (task, kinds) in per_task {
        assert_eq!(kinds, ["enqueued", "started", "succeeded"], "task {task}");
    }

    // Filters: only succeeded events of the queue, from the start.
    let mut filtered = SseClient::connect(
        served.addr,
        "/v1/events?after=0&status=succeeded&queue=default",
        None,
    )
    .await;
    for _ in 0..tasks {
        let m = filtered.next().await;
        assert_eq!(m.event, "succeeded");
        assert_eq!(m.data["task"]["status"], "succeeded");
    }
    stop.cancel();
    running.await.unwrap().unwrap();
    seq.await.unwrap();
}

async fn resuming_from_a_pruned_position_is_refused_explicitly(h: &Harness) {
    events_on(&*h.storage).await;
    let served = served(h.storage.clone(), config()).await;
    let stop = CancellationToken::new();
    let seq = sequencer(h, &stop);
    let client = tenax::Client::new(h.storage.clone());
    for i in 0..5 {
        client
            .enqueue_raw("echo", &serde_json::json!({ "i": i }))
            .await
            .unwrap();
    }
    let mut reader = SseClient::connect(served.addr, "/v1/events?after=0", None).await;
    for want in 1..=5 {
        assert_eq!(reader.next().await.id, Some(want));
    }
    // Prune the first five as a retention of zero would.
    let future = h.storage.now().await.unwrap() + chrono::Duration::hours(1);
    let pruned = h
        .storage
        .event_prune(&EventPruneParams {
            older_than: Duration::ZERO,
            relays: Vec::new(),
            now: Some(future),
        })
        .await
        .unwrap();
    assert_eq!(pruned, 5);
    // A reader behind the pruner is told, and its stream ends.
    let mut behind = SseClient::connect(served.addr, "/v1/events?after=5", None).await;
    assert_eq!(
        behind.status, 200,
        "position 5 itself is the pruned-through mark"
    );
    drop(behind);
    let answer = call_socket(
        served.addr,
        Method::GET,
        "/v1/events?after=2",
        Some(READER),
        None,
    )
    .await;
    assert_eq!(answer.status, StatusCode::GONE);
    assert_eq!(answer.code(), "events_pruned");
    let message = answer.body["error"]["message"].as_str().unwrap();
    assert!(message.contains("after=5"), "{message}");
    let by_header = SseClient::connect(served.addr, "/v1/events", Some(0)).await;
    assert_eq!(by_header.status, 410);
    drop(by_header);
    // Bad resume points and filters are refused.
    for uri in [
        "/v1/events?after=-1",
        "/v1/events?status=finished",
        "/v1/events?event=exploded",
        "/v1/events?queue=bad%20queue",
    ] {
        let answer = call_socket(served.addr, Method::GET, uri, Some(READER), None).await;
        assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY, "{uri}");
    }
    behind = SseClient::connect(served.addr, "/v1/events?after=5", None).await;
    client
        .enqueue_raw("echo", &serde_json::json!({ "i": 5 }))
        .await
        .unwrap();
    assert_eq!(behind.next().await.id, Some(6));
    stop.cancel();
    seq.await.unwrap();
}

on_every_backend!(
    a_client_that_resumes_from_its_last_id_misses_nothing,
    resuming_from_a_pruned_position_is_refused_explicitly,
);
