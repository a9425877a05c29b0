//! Enqueue one account opening into `sqlite://example.db` and run a worker until it is
//! done: `cargo run -p example-bank-account`.
use std::sync::Arc;
use std::time::Duration;

use example_bank_account::{OpenAccount, OpenBankAccount, RecordingBank};
use tenax::{Client, Registry, TaskStatus, Worker, WorkerConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::connect("sqlite://example.db").await?;
    let task = client
        .enqueue::<OpenBankAccount>(OpenAccount {
            customer: "ada".into(),
            id_card: "12345678901234567".into(),
        })
        .task_no("ACC-ADA")
        .await?
        .task;
    let mut registry = Registry::new();
    registry.register(OpenBankAccount {
        bank: Arc::new(RecordingBank::default()),
    })?;
    let worker = Worker::new(client.storage().clone(), registry, WorkerConfig::default())?;
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    loop {
        let current = client.get(&tenax::storage::TaskRef::Id(task.id)).await?;
        if let Some(current) = current.filter(|t| t.status == TaskStatus::Succeeded) {
            println!(
                "{}: {}",
                current.task_no,
                current.result.unwrap_or_default()
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    running.await??;
    Ok(())
}
