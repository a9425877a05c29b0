//! The example's command on a real SQLite database, with a real worker.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use example_notify_batch::{Notification, RecordingGateway, SendNotifications};
use tenax::storage::TaskRef;
use tenax::{Batched, Client, Registry, TaskNo, TaskRecord, TaskStatus, Worker, WorkerConfig};

async fn task(client: &Client, no: &str) -> TaskRecord {
    client
        .get(&TaskRef::No(TaskNo::new(no).unwrap()))
        .await
        .unwrap()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_go_out_in_calls_of_at_most_200_per_channel() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("notify.db").display());
    let client = Client::connect(&url).await.unwrap();
    let notice = |channel: &str, to: String| Notification {
        channel: channel.into(),
        to,
        text: "hello".into(),
    };
    let mut batch = Vec::new();
    for i in 0..450 {
        batch.push(
            client
                .enqueue::<Batched<SendNotifications>>(notice("email", format!("u{i}@example.com")))
                .task_no(format!("email-{i}")),
        );
    }
    for i in 0..50 {
        batch.push(
            client
                .enqueue::<Batched<SendNotifications>>(notice("sms", format!("+4470000{i}")))
                .task_no(format!("sms-{i}")),
        );
    }
    batch.push(
        client
            .enqueue::<Batched<SendNotifications>>(notice("email", "nobody".into()))
            .task_no("refused"),
    );
    batch.push(
        client
            .enqueue::<Batched<SendNotifications>>(notice("email", "full@example.com".into()))
            .task_no("full"),
    );
    client.enqueue_many(batch).await.unwrap();

    let gateway = Arc::new(RecordingGateway::default());
    let mut registry = Registry::new();
    registry
        .register_batch(SendNotifications {
            gateway: gateway.clone(),
        })
        .unwrap();
    let config = WorkerConfig {
        poll_interval: Duration::from_millis(50),
        ..WorkerConfig::default()
    };
    let worker = Worker::new(client.storage().clone(), registry, config).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let full = task(&client, "full").await;
        let refused = task(&client, "refused").await;
        let stats = client.stats().await.unwrap();
        if full.status == TaskStatus::Succeeded
            && refused.status == TaskStatus::Dead
            && stats.count(TaskStatus::Succeeded) >= 501
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{stats:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    running.await.unwrap().unwrap();

    let calls = gateway.calls();
    assert!(calls.iter().all(|(_, size)| *size <= 200), "{calls:?}");
    let sent = |channel: &str| -> usize {
        calls
            .iter()
            .filter(|(c, _)| c == channel)
            .map(|(_, n)| n)
            .sum()
    };
    // Every email once, the full inbox twice; every sms once.
    assert_eq!(sent("email"), 452 + 1, "{calls:?}");
    assert_eq!(sent("sms"), 50, "{calls:?}");
    // 502 notifications due together: far fewer calls than notifications.
    assert!(calls.len() <= 8, "{calls:?}");
    let full = task(&client, "full").await;
    assert_eq!(full.attempt, 2);
    let refused = task(&client, "refused").await;
    assert_eq!(refused.attempt, 1);
    assert_eq!(refused.last_error.as_deref(), Some("no such recipient"));
    let delivered = task(&client, "email-7").await;
    assert_eq!(delivered.status, TaskStatus::Succeeded);
    assert!(delivered.result.unwrap().parse::<u64>().is_ok());
}
