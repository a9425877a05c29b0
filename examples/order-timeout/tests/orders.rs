//! The order-timeout example, tested with tenax-testkit's clock: no test waits 30
//! minutes.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use example_order_timeout::{
    OrderBook, OrderState, OrderTimeout, OrderTimeoutCancel, Orders, Paid, PayError, PAYMENT_WINDOW,
};
use serde_json::json;
use tenax::{Command, Registry, TaskStatus};
use tenax_testkit::TestStore;

fn setup(store: &TestStore) -> (Orders, Registry) {
    let book = Arc::new(OrderBook::default());
    let mut registry = Registry::new();
    registry
        .register(OrderTimeoutCancel { book: book.clone() })
        .unwrap();
    (Orders::new(store.client().clone(), book), registry)
}

#[tokio::test]
async fn an_unpaid_order_is_cancelled_after_30_minutes() {
    let store = TestStore::new().await;
    let (orders, registry) = setup(&store);
    orders.place(42).await.unwrap();
    store
        .assert_enqueued("ORDER_TIMEOUT_CANCEL", json!({"order": 42}))
        .await;
    store.advance(PAYMENT_WINDOW - Duration::from_secs(1));
    assert!(store.drain(&registry).await.is_empty(), "not due yet");
    assert_eq!(orders.book.state(42), Some(OrderState::Placed));
    store.advance(Duration::from_secs(1));
    let ran = store.drain(&registry).await;
    assert_eq!(ran.len(), 1);
    assert_eq!(ran[0].status, TaskStatus::Succeeded);
    assert_eq!(orders.book.state(42), Some(OrderState::Cancelled));
    // A payment after that is refused, not silently accepted.
    assert!(matches!(orders.pay(42).await, Err(PayError::Cancelled(42))));
}

#[tokio::test]
async fn paying_cancels_the_timeout_task() {
    let store = TestStore::new().await;
    let (orders, registry) = setup(&store);
    orders.place(7).await.unwrap();
    store.advance(Duration::from_secs(10 * 60));
    assert_eq!(orders.pay(7).await.unwrap(), Paid::TimeoutCancelled);
    assert_eq!(store.count(TaskStatus::Cancelled).await, 1);
    store.advance(PAYMENT_WINDOW);
    assert!(
        store.drain(&registry).await.is_empty(),
        "cancelled: never runs"
    );
    assert_eq!(orders.book.state(7), Some(OrderState::Paid));
    assert!(matches!(orders.pay(7).await, Err(PayError::AlreadyPaid(7))));
}

#[tokio::test]
async fn a_cancel_that_loses_the_race_is_harmless() {
    let store = TestStore::new().await;
    let (orders, registry) = setup(&store);
    orders.place(9).await.unwrap();
    store.advance(PAYMENT_WINDOW);
    // The task is already running when the payment comes in: the cancel becomes a
    // request, and the payment stands.
    let claimed = store
        .storage()
        .task_claim_batch(&tenax::storage::TaskClaimParams {
            worker: "w".into(),
            queues: vec!["default".into()],
            commands: vec![("ORDER_TIMEOUT_CANCEL".into(), 1)],
            limit: 1,
            lease_ttl: Duration::from_secs(30),
            now: Some(store.now().await),
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(orders.pay(9).await.unwrap(), Paid::TimeoutRunning);
    // The handler runs to its check: the order is paid, it does nothing.
    let ctx = tenax::TaskContext::new(
        claimed[0].id,
        claimed[0].task_no.clone(),
        claimed[0].kind,
        1,
        claimed[0].max_attempts,
        claimed[0].lease_epoch,
        claimed[0].task_no.to_string(),
        None,
        Default::default(),
    );
    let outcome = OrderTimeoutCancel {
        book: orders.book.clone(),
    }
    .execute(OrderTimeout { order: 9 }, &ctx)
    .await
    .unwrap();
    assert_eq!(outcome, "order 9 already paid: nothing to do");
    assert_eq!(orders.book.state(9), Some(OrderState::Paid));
    drop(registry);
}

#[tokio::test]
async fn a_payment_whose_cancel_never_happened_still_wins() {
    let store = TestStore::new().await;
    let (orders, registry) = setup(&store);
    orders.place(5).await.unwrap();
    // Paid, but the process stopped before it cancelled the task.
    orders
        .book
        .transition(5, OrderState::Placed, OrderState::Paid)
        .unwrap();
    store.advance(PAYMENT_WINDOW);
    let ran = store.drain(&registry).await;
    assert_eq!(ran[0].status, TaskStatus::Succeeded);
    assert_eq!(
        ran[0].result.as_deref(),
        Some("\"order 5 already paid: nothing to do\"")
    );
    assert_eq!(orders.book.state(5), Some(OrderState::Paid));
}
