//! The NATS relay delivers every task event, in order per task, through a broker that
//! is killed (-9) and restarted in the middle of the run. The broker is a private
//! `nats-server` with its own port and store directory.
#![cfg(feature = "nats")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::{HashMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tenax_core::CompensationState;
use tenax_delivery::events::{EventsConfig, Sequencer};
use tenax_delivery::events_nats::{NatsConfig, NatsRelay};
use tenax_storage::testing::{claim_params, sqlite_file, TaskOpts};
use tenax_storage::{EventListParams, EventRuleParams, Lease, Storage, TaskCompleteParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[path = "support/leaky.rs"]
mod leaky;

const TASKS: usize = 3_334;
const NATS_SERVER: &str = "/usr/sbin/nats-server";

struct Broker {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Broker {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut broker = Self {
            port,
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        broker.spawn();
        broker
    }

    fn spawn(&mut self) {
        let child = Command::new(NATS_SERVER)
            .args(["-js", "-sd"])
            .arg(self.dir.path())
            .args(["-p", &self.port.to_string(), "-a", "127.0.0.1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        self.child = Some(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "nats-server did not listen"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn stream_len(js: &async_nats::jetstream::Context) -> u64 {
    match js.get_stream("TENAX_EVENTS").await {
        Ok(mut s) => s.info().await.map(|i| i.state.messages).unwrap_or(0),
        Err(_) => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_event_reaches_jetstream_across_a_broker_crash() {
    if !std::path::Path::new(NATS_SERVER).exists() {
        assert!(
            std::env::var_os("TENAX_REQUIRE_ALL_BACKENDS").is_none(),
            "{NATS_SERVER} is missing"
        );
        eprintln!("skipped: {NATS_SERVER} is missing");
        return;
    }
    let started = Instant::now();
    let mut broker = Broker::start();
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
        nats: Some(NatsConfig {
            url: broker.url(),
            stream: "TENAX_EVENTS".into(),
            subject_prefix: "tenax.events".into(),
            ack_timeout: Duration::from_secs(2),
        }),
        ..EventsConfig::default()
    };
    events.validate().unwrap();
    assert_eq!(events.relays(), vec!["relay:nats".to_owned()]);
    let stop = CancellationToken::new();
    let sequencer = tokio::spawn(
        Sequencer::new(storage.clone(), "node-a", events.clone(), events.relays())
            .run(stop.clone()),
    );
    let relay = tokio::spawn(
        NatsRelay::new(
            storage.clone(),
            "node-a",
            events.clone(),
            events.nats.clone().unwrap(),
        )
        .run(stop.clone()),
    );

    // The tasks run while the relay publishes: enqueued, started, succeeded each.
    let producer = {
        let storage = storage.clone();
        let h = h.clone();
        tokio::spawn(async move {
            for _ in 0..TASKS {
                h.task(TaskOpts::default()).await;
            }
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

    // Kill the broker once part of the events are in the stream, then bring it back
    // on the same port and store.
    let watcher = async_nats::jetstream::new(async_nats::connect(broker.url()).await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut before_kill = 0;
    while before_kill < 2_000 {
        assert!(Instant::now() < deadline, "the relay published too little");
        tokio::time::sleep(Duration::from_millis(20)).await;
        before_kill = stream_len(&watcher).await;
    }
    drop(watcher);
    broker.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    broker.spawn();
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

    // Read the stream back until every event id is there.
    let client = async_nats::connect(broker.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let deadline = Instant::now() + Duration::from_secs(60);
    while stream_len(&js).await < total as u64 {
        assert!(
            Instant::now() < deadline,
            "the stream holds {} of {total} events",
            stream_len(&js).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stream = js.get_stream("TENAX_EVENTS").await.unwrap();
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
        .await
        .unwrap();
    let in_stream = stream_len(&js).await;
    let mut messages = consumer.messages().await.unwrap();
    let mut seen: Vec<String> = Vec::new();
    while (seen.len() as u64) < in_stream {
        let message = tokio::time::timeout(Duration::from_secs(10), messages.next())
            .await
            .expect("the consumer stalled")
            .unwrap()
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
        let id = body["id"].as_str().unwrap().to_owned();
        let header = message
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|v| v.as_str().to_owned());
        assert_eq!(
            header.as_deref(),
            Some(id.as_str()),
            "Nats-Msg-Id is the event id"
        );
        assert!(message
            .subject
            .as_str()
            .starts_with("tenax.events.default."));
        seen.push(id);
    }
    stop.cancel();
    sequencer.await.unwrap();
    relay.await.unwrap();

    let distinct: HashSet<&String> = seen.iter().collect();
    let duplicates = seen.len() - distinct.len();
    let expected: HashSet<&String> = table.iter().map(|e| &e.event_id).collect();
    let missing = expected.difference(&distinct).count();
    let extra = distinct.difference(&expected).count();
    eprintln!(
        "events in the table: {total}; in the stream when the broker was killed: {before_kill}; messages in the stream: {}; distinct: {}; duplicates: {duplicates}; missing: {missing}; took {:?}",
        seen.len(),
        distinct.len(),
        started.elapsed()
    );
    assert_eq!(missing, 0, "events missing from the stream");
    assert_eq!(extra, 0, "unknown events in the stream");
    assert_eq!(distinct.len(), total);
    assert!(
        before_kill < total as u64,
        "the broker was killed before the end"
    );

    // In order per task: each task's events reach the stream in position order.
    let position: HashMap<&String, i64> = table
        .iter()
        .map(|e| (&e.event_id, e.seq.unwrap()))
        .collect();
    let task_of: HashMap<&String, _> = table.iter().map(|e| (&e.event_id, e.task_id)).collect();
    let mut last = HashMap::new();
    let mut first_seen = HashSet::new();
    for id in &seen {
        if !first_seen.insert(id) {
            continue;
        }
        let seq = position[id];
        let previous = last.insert(task_of[id], seq).unwrap_or(0);
        assert!(previous < seq, "task {:?} out of order", task_of[id]);
    }
}

/// Tasks whose handlers put their secret payload fields, in every shape, into their
/// results and errors, run by a worker configured with those fields: every event the
/// relay publishes carries the masked texts, and no secret value.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relayed_events_carry_no_secret_value_in_any_shape() {
    if !std::path::Path::new(NATS_SERVER).exists() {
        assert!(
            std::env::var_os("TENAX_REQUIRE_ALL_BACKENDS").is_none(),
            "{NATS_SERVER} is missing"
        );
        eprintln!("skipped: {NATS_SERVER} is missing");
        return;
    }
    let broker = Broker::start();
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
        nats: Some(NatsConfig {
            url: broker.url(),
            stream: "TENAX_EVENTS".into(),
            subject_prefix: "tenax.events".into(),
            ack_timeout: Duration::from_secs(2),
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
        NatsRelay::new(
            storage.clone(),
            "node-a",
            events.clone(),
            events.nats.clone().unwrap(),
        )
        .run(stop.clone()),
    );
    let tasks = leaky::run_leaky_tasks(storage.clone()).await;

    let js = async_nats::jetstream::new(async_nats::connect(broker.url()).await.unwrap());
    let mut bodies = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while leaky::ends(&bodies) < tasks {
        assert!(
            Instant::now() < deadline,
            "{} ends of {tasks} tasks were published",
            leaky::ends(&bodies)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        if stream_len(&js).await == 0 {
            continue;
        }
        let stream = js.get_stream("TENAX_EVENTS").await.unwrap();
        let consumer = stream
            .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
            .await
            .unwrap();
        let in_stream = stream_len(&js).await;
        let mut messages = consumer.messages().await.unwrap();
        bodies.clear();
        while (bodies.len() as u64) < in_stream {
            let message = tokio::time::timeout(Duration::from_secs(10), messages.next())
                .await
                .expect("the consumer stalled")
                .unwrap()
                .unwrap();
            bodies.push(String::from_utf8_lossy(&message.payload).into_owned());
        }
    }
    stop.cancel();
    sequencer.await.unwrap();
    relay.await.unwrap();
    leaky::assert_masked(&bodies, tasks);
}
