//! Enqueue 1,000 notifications into `sqlite://notify.db` and run a worker until every
//! one is settled: `cargo run -p example-notify-batch`.
use std::sync::Arc;
use std::time::Duration;

use example_notify_batch::{Notification, RecordingGateway, SendNotifications};
use tenax::storage::TaskInsertOutcome;
use tenax::{Batched, Client, Registry, TaskStatus, Worker, WorkerConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::connect("sqlite://notify.db").await?;
    let batch = (0..1000).map(|i| {
        let channel = if i % 4 == 0 { "sms" } else { "email" };
        client
            .enqueue::<Batched<SendNotifications>>(Notification {
                channel: channel.into(),
                to: format!("user{i}@example.com"),
                text: "Your statement is ready".into(),
            })
            .task_no(format!("statement-ready-{i}"))
    });
    let inserted = client.enqueue_many(batch).await?;
    let ids: Vec<_> = inserted
        .iter()
        .filter_map(|o| match o {
            TaskInsertOutcome::Created(t) | TaskInsertOutcome::Existing(t) => Some(t.id),
            _ => None,
        })
        .collect();
    let gateway = Arc::new(RecordingGateway::default());
    let mut registry = Registry::new();
    registry.register_batch(SendNotifications {
        gateway: gateway.clone(),
    })?;
    let worker = Worker::new(client.storage().clone(), registry, WorkerConfig::default())?;
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    loop {
        let stats = client.stats().await?;
        let settled = stats.count(TaskStatus::Succeeded) + stats.count(TaskStatus::Dead);
        if settled >= ids.len() as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    running.await??;
    for (channel, size) in gateway.calls() {
        println!("one {channel} call with {size} notifications");
    }
    Ok(())
}
