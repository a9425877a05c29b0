//! The example's own tests, written with tenax-testkit.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use example_bank_account::{OpenAccount, OpenBankAccount, RecordingBank};
use serde_json::json;
use tenax::{CompensationState, Registry, TaskStatus};
use tenax_testkit::TestStore;

fn registry(bank: &Arc<RecordingBank>) -> Registry {
    let mut registry = Registry::new();
    registry
        .register(OpenBankAccount { bank: bank.clone() })
        .unwrap();
    registry
}

async fn enqueue(store: &TestStore, task_no: &str, id_card: &str) {
    store
        .client()
        .enqueue::<OpenBankAccount>(OpenAccount {
            customer: "ada".into(),
            id_card: id_card.into(),
        })
        .task_no(task_no)
        .await
        .unwrap();
}

#[tokio::test]
async fn an_account_is_opened_with_the_task_no_as_request_id() {
    let store = TestStore::new().await;
    let bank = Arc::new(RecordingBank::default());
    enqueue(&store, "ACC-1", "12345678901234567").await;
    store
        .assert_enqueued("BANK_OPEN_ACCOUNT", json!({"customer": "ada"}))
        .await;
    let task = store.run(&registry(&bank), "ACC-1").await;
    assert_eq!(task.status, TaskStatus::Succeeded);
    assert_eq!(*bank.opened.lock().unwrap(), vec!["ACC-1".to_owned()]);
    store.assert_not_enqueued("BANK_OPEN_ACCOUNT").await;
}

#[tokio::test]
async fn a_refused_id_card_is_dead_at_once_and_the_account_cancelled() {
    let store = TestStore::new().await;
    let bank = Arc::new(RecordingBank::default());
    enqueue(&store, "ACC-2", "1234567890123456X").await;
    let task = store.run(&registry(&bank), "ACC-2").await;
    assert_eq!(task.status, TaskStatus::Dead);
    assert_eq!(task.attempt, 1);
    assert_eq!(task.compensation, Some(CompensationState::Succeeded));
    assert_eq!(
        *bank.cancelled.lock().unwrap(),
        vec!["ACC-2:compensate".to_owned()]
    );
}

#[tokio::test]
async fn a_bank_timeout_is_retried_after_the_backoff() {
    let store = TestStore::new().await;
    let bank = Arc::new(RecordingBank::default());
    *bank.timeouts.lock().unwrap() = 1;
    enqueue(&store, "ACC-3", "12345678901234567").await;
    let registry = registry(&bank);
    let first = store.run(&registry, "ACC-3").await;
    assert_eq!(
        first.status,
        TaskStatus::Retrying,
        "the retry waits for its backoff"
    );
    // The default backoff after a first failure is at most 5 s: move the clock past it.
    store.advance(Duration::from_secs(5));
    let done = store.run(&registry, "ACC-3").await;
    assert_eq!(done.status, TaskStatus::Succeeded);
    assert_eq!(done.attempt, 2);
}
