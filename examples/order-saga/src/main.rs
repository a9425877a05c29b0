//! Place two orders, one paid with a card that is declined, and watch the saga release
//! that order's inventory lock: `cargo run -p example-order-saga`.
use std::time::Duration;

use example_order_saga::{place_order, registry, Order, Services, DECLINED_CARD};
use tenax::{Client, Worker, WorkerConfig, WorkflowState};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("tenax-order-saga-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let client = Client::connect(&format!("sqlite://{}", dir.join("orders.db").display())).await?;
    let services = Services::default();
    services.warehouse.stock("book", 10);
    let worker = Worker::new(
        client.storage().clone(),
        registry(&services)?,
        WorkerConfig::default(),
    )?;
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));

    let good = Order {
        id: 1,
        sku: "book".into(),
        quantity: 2,
        card: "4242-4242-4242-4242".into(),
    };
    let declined = Order {
        id: 2,
        sku: "book".into(),
        quantity: 3,
        card: DECLINED_CARD.into(),
    };
    let sagas = [
        place_order(&client, &good).await?.workflow.id,
        place_order(&client, &declined).await?.workflow.id,
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for id in sagas {
        loop {
            let saga = client.workflow(id).await?.ok_or("the saga vanished")?;
            if saga.workflow.state.is_finished() {
                println!(
                    "saga {} ({}): {}",
                    id, saga.workflow.name, saga.workflow.state
                );
                for step in &saga.tasks {
                    println!(
                        "  {:<20} {:<10} compensation {:?}",
                        step.key, step.task.status, step.task.compensation
                    );
                }
                break;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!("saga {id} did not finish within 60 s").into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let state = client.workflow(sagas[1]).await?.map(|s| s.workflow.state);
    println!(
        "order 2: {:?}, inventory locked: {}, book available: {}",
        state,
        services.warehouse.is_locked(2),
        services.warehouse.available("book")
    );
    if state != Some(WorkflowState::Compensated) {
        return Err("order 2's saga was not compensated".into());
    }
    stop.cancel();
    running.await??;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
