//! The order saga end to end on a test store: a declined payment compensates the
//! payment step and releases the inventory lock, in that order; a good card completes.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use example_order_saga::{place_order, registry, Order, Services, DECLINED_CARD};
use tenax::{CompensationState, TaskKind, TaskStatus, WorkflowState};
use tenax_testkit::TestStore;

fn order(id: u64, card: &str) -> Order {
    Order {
        id,
        sku: "book".into(),
        quantity: 3,
        card: card.into(),
    }
}

#[tokio::test]
async fn a_declined_payment_releases_the_inventory_lock() {
    let store = TestStore::new().await;
    let services = Services::default();
    services.warehouse.stock("book", 10);
    let registry = registry(&services).unwrap();
    let saga = place_order(store.client(), &order(7, DECLINED_CARD))
        .await
        .unwrap();
    let ran = store.drain(&registry).await;

    let detail = store
        .client()
        .workflow(saga.workflow.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(detail.workflow.state, WorkflowState::Compensated);
    let status = |key: &str| {
        detail
            .tasks
            .iter()
            .find(|t| t.key == key)
            .map(|t| (t.task.status, t.task.compensation))
            .unwrap()
    };
    assert_eq!(
        status("lock-inventory"),
        (TaskStatus::Succeeded, Some(CompensationState::Succeeded))
    );
    assert_eq!(
        status("check-payment"),
        (TaskStatus::Dead, Some(CompensationState::Succeeded))
    );
    assert_eq!(status("dispatch-logistics").0, TaskStatus::Cancelled);
    // The lock is released and the stock is back; nothing was dispatched.
    assert!(!services.warehouse.is_locked(7));
    assert_eq!(services.warehouse.available("book"), 10);
    assert!(!services.logistics.is_dispatched(7));
    // Compensations ran one after another, the payment's before the inventory's.
    let compensations: Vec<String> = ran
        .iter()
        .filter(|t| t.kind == TaskKind::Compensate)
        .map(|t| t.command_type.clone())
        .collect();
    assert_eq!(
        compensations,
        ["ORDER_CHECK_PAYMENT", "ORDER_LOCK_INVENTORY"]
    );
}

#[tokio::test]
async fn a_good_card_completes_the_saga() {
    let store = TestStore::new().await;
    let services = Services::default();
    services.warehouse.stock("book", 10);
    let registry = registry(&services).unwrap();
    let saga = place_order(store.client(), &order(8, "4242-4242-4242-4242"))
        .await
        .unwrap();
    store.drain(&registry).await;
    let detail = store
        .client()
        .workflow(saga.workflow.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(detail.workflow.state, WorkflowState::Completed);
    assert!(services.warehouse.is_locked(8));
    assert_eq!(services.warehouse.available("book"), 7);
    assert!(services.payments.is_authorised(8));
    assert!(services.logistics.is_dispatched(8));
    // Placing the same order again is refused: its step numbers exist.
    assert!(
        place_order(store.client(), &order(8, "4242-4242-4242-4242"))
            .await
            .is_err()
    );
}
