//! Place two orders with a 2-second payment window, pay one, and watch the other be
//! cancelled by its timeout task: `cargo run -p example-order-timeout`.
use std::sync::Arc;
use std::time::Duration;

use example_order_timeout::{OrderBook, OrderState, OrderTimeoutCancel, Orders};
use tenax::{Client, Registry, Worker, WorkerConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("tenax-order-timeout-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let client = Client::connect(&format!("sqlite://{}", dir.join("orders.db").display())).await?;
    let book = Arc::new(OrderBook::default());
    let orders = Orders {
        window: Duration::from_secs(2),
        ..Orders::new(client.clone(), book.clone())
    };
    let mut registry = Registry::new();
    registry.register(OrderTimeoutCancel { book: book.clone() })?;
    let worker = Worker::new(client.storage().clone(), registry, WorkerConfig::default())?;
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));

    orders.place(1).await?;
    orders.place(2).await?;
    println!("order 2 paid: {:?}", orders.pay(2).await?);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while book.state(1) != Some(OrderState::Cancelled) {
        if tokio::time::Instant::now() > deadline {
            return Err("order 1 was not cancelled within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("order 1: {:?}; order 2: {:?}", book.state(1), book.state(2));
    stop.cancel();
    running.await??;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
