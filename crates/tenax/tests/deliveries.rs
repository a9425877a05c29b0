//! A Rust application that runs `Worker::run` gets callbacks, death alerts and a bounded
//! outbox by configuring them: the same senders `tenax worker` runs, through
//! `Worker::with_service`, against a real webhook over HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tenax::kinds::{AlertsConfig, CallbacksConfig};
use tenax::storage::{OutboxKind, OutboxListParams, Storage};
use tenax::{
    Client, Command, CommandError, Deliveries, Registry, TaskContext, Worker, WorkerConfig,
};
use tokio_util::sync::CancellationToken;

struct Greet;

impl Command for Greet {
    const TYPE: &'static str = "GREET";
    type Context = String;
    type Output = String;

    async fn execute(&self, name: String, _: &TaskContext) -> Result<String, CommandError> {
        Ok(format!("hello {name}"))
    }
}

struct Doomed;

impl Command for Doomed {
    const TYPE: &'static str = "DOOMED";
    type Context = ();
    type Output = ();

    async fn execute(&self, (): (), _: &TaskContext) -> Result<(), CommandError> {
        Err(CommandError::permanent("the card was declined"))
    }
}

/// A webhook that keeps every (path, body) it is sent and answers 200.
#[derive(Clone, Default)]
struct Webhook(Arc<Mutex<Vec<(String, Value)>>>);

impl Webhook {
    async fn start(&self) -> std::net::SocketAddr {
        let seen = self.0.clone();
        let app = axum::Router::new().fallback(move |uri: axum::http::Uri, body: String| {
            let seen = seen.clone();
            async move {
                let body = serde_json::from_str(&body).unwrap_or(Value::String(body));
                seen.lock().unwrap().push((uri.path().to_owned(), body));
                "ok"
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }

    fn on(&self, path: &str) -> Vec<Value> {
        let seen = self.0.lock().unwrap();
        seen.iter()
            .filter(|(p, _)| p == path)
            .map(|(_, b)| b.clone())
            .collect()
    }
}

async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn registry() -> Registry {
    let mut registry = Registry::new();
    registry.register(Greet).unwrap();
    registry.register(Doomed).unwrap();
    registry
}

async fn outbox(storage: &Arc<dyn Storage>, kind: OutboxKind) -> usize {
    storage
        .outbox_list(&OutboxListParams {
            kind: Some(kind),
            status: None,
            task_id: None,
            limit: 100,
        })
        .await
        .unwrap()
        .len()
}

#[tokio::test]
async fn a_library_worker_with_deliveries_sends_callbacks_and_death_alerts() {
    let webhook = Webhook::default();
    let addr = webhook.start().await;
    let dir = tempfile::tempdir().unwrap();
    let client = Client::connect(&format!("sqlite://{}", dir.path().join("t.db").display()))
        .await
        .unwrap();
    let deliveries = Deliveries::new()
        .with_callbacks(CallbacksConfig {
            allow_hosts: vec![addr.to_string()],
            secret: Some("sixteen bytes or more".into()),
            poll_interval: Duration::from_millis(50),
            ..CallbacksConfig::default()
        })
        .unwrap()
        .with_alerts(AlertsConfig {
            webhook_url: Some(format!("http://{addr}/alerts")),
            death_window: Duration::from_millis(100),
            poll_interval: Duration::from_millis(50),
            ..AlertsConfig::default()
        })
        .unwrap();
    let worker = Worker::new(
        client.storage().clone(),
        registry(),
        WorkerConfig::default(),
    )
    .unwrap()
    .with_service(Arc::new(deliveries));
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));

    let greeted = client
        .enqueue::<Greet>("ada".into())
        .callback_url(format!("http://{addr}/done"))
        .await
        .unwrap()
        .task;
    let doomed = client
        .enqueue::<Doomed>(())
        .max_attempts(1)
        .await
        .unwrap()
        .task;

    let callback = wait_for(
        "the completion callback",
        Duration::from_secs(30),
        || async { webhook.on("/done").into_iter().next() },
    )
    .await;
    assert_eq!(callback["task_id"], greeted.id.0, "{callback}");
    assert_eq!(callback["status"], "succeeded", "{callback}");
    // The result as stored: JSON text.
    assert_eq!(callback["result"], "\"hello ada\"", "{callback}");
    let alert = wait_for("the death alert", Duration::from_secs(30), || async {
        webhook.on("/alerts").into_iter().next()
    })
    .await;
    assert_eq!(alert["tenax"]["task_ids"][0], doomed.id.0, "{alert}");
    assert!(
        alert["text"].as_str().unwrap_or_default().contains("died"),
        "{alert}"
    );

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("the worker and its senders stop")
        .unwrap()
        .unwrap();
    assert_eq!(webhook.on("/done").len(), 1, "one callback, sent once");
    assert_eq!(webhook.on("/alerts").len(), 1, "one death, alerted once");
}

#[tokio::test]
async fn a_library_worker_without_senders_still_prunes_the_outbox() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::connect(&format!("sqlite://{}", dir.path().join("t.db").display()))
        .await
        .unwrap();
    let storage = client.storage().clone();
    let config = WorkerConfig {
        retention: Duration::from_secs(5),
        pruner_interval: Duration::from_millis(200),
        ..WorkerConfig::default()
    };
    let worker = Worker::new(storage.clone(), registry(), config).unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));

    // A callback nobody here sends: its row waits, and is pruned after the retention.
    let greeted = client
        .enqueue::<Greet>("ada".into())
        .callback_url("http://127.0.0.1:9/nobody")
        .await
        .unwrap()
        .task;
    wait_for("the task's success", Duration::from_secs(30), || async {
        let task = client
            .get(&tenax::storage::TaskRef::Id(greeted.id))
            .await
            .unwrap()?;
        (task.status == tenax::TaskStatus::Succeeded).then_some(())
    })
    .await;
    assert_eq!(
        outbox(&storage, OutboxKind::Callback).await,
        1,
        "the callback's row"
    );
    wait_for("the unsent row pruned", Duration::from_secs(30), || async {
        (outbox(&storage, OutboxKind::Callback).await == 0).then_some(())
    })
    .await;

    shutdown.cancel();
    running.await.unwrap().unwrap();
}

/// Delivery has a crate of its own (`tenax::delivery`); the paths under `tenax::kinds`
/// that named its types before still name the same ones.
#[test]
fn delivery_types_keep_their_paths_under_kinds() {
    let _: tenax::kinds::CallbacksConfig = tenax::delivery::CallbacksConfig::default();
    let _: tenax::kinds::config::AlertsConfig = tenax::delivery::config::AlertsConfig::default();
    let _: tenax::kinds::config::HttpConfig = tenax::kinds::HttpConfig::default();
    let _: tenax::kinds::events::EventsConfig = tenax::delivery::events::EventsConfig::default();
    let _: tenax::kinds::ConfigError = tenax::delivery::ConfigError::new("alerts", "a reason");
    let _: tenax::kinds::Deliveries = tenax::Deliveries::new();
    let signed = tenax::kinds::sign::signature(b"a secret", 0, b"{}");
    assert_eq!(
        signed,
        tenax::delivery::sign::signature(b"a secret", 0, b"{}")
    );
}
