//! A test kit for applications that use Tenax.
//!
//! - [`TestStore`]: a fresh SQLite store per test (a file in a temporary folder, gone
//!   when the store is dropped), with a [`Client`] to enqueue through.
//! - [`TestStore::assert_enqueued`]: assert that a task of a command type waits, with a
//!   payload that contains the given JSON.
//! - [`TestStore::drain`]: run every due task synchronously with your registry, and get
//!   the tasks back in their final state.
//! - [`TestStore::advance`]: move the store's clock forward, so delayed tasks and
//!   scheduled retries become due without waiting.
//! - [`Ledger`]: the execution ledger, re-exported from `tenax-ledger`.
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use tenax::{Command, CommandError, Registry, TaskContext, TaskStatus};
//! use tenax_testkit::TestStore;
//!
//! #[derive(Serialize, Deserialize)]
//! struct Reminder { order: u64 }
//!
//! struct CancelUnpaidOrder;
//!
//! impl Command for CancelUnpaidOrder {
//!     const TYPE: &'static str = "ORDER_TIMEOUT_CANCEL";
//!     type Context = Reminder;
//!     type Output = String;
//!     async fn execute(&self, ctx: Reminder, _: &TaskContext) -> Result<String, CommandError> {
//!         Ok(format!("order {} cancelled", ctx.order))
//!     }
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let store = TestStore::new().await;
//! store
//!     .client()
//!     .enqueue::<CancelUnpaidOrder>(Reminder { order: 42 })
//!     .run_in(std::time::Duration::from_secs(30 * 60))
//!     .await
//!     .unwrap();
//! store.assert_enqueued("ORDER_TIMEOUT_CANCEL", serde_json::json!({"order": 42})).await;
//!
//! let mut registry = Registry::new();
//! registry.register(CancelUnpaidOrder).unwrap();
//! assert!(store.drain(&registry).await.is_empty(), "not due for 30 minutes");
//! store.advance(std::time::Duration::from_secs(30 * 60));
//! let ran = store.drain(&registry).await;
//! assert_eq!(ran[0].status, TaskStatus::Succeeded);
//! assert_eq!(ran[0].result.as_deref(), Some("\"order 42 cancelled\""));
//! # });
//! ```
#![forbid(unsafe_code)]
#![allow(clippy::expect_used, clippy::unwrap_used)] // a test kit reports failures by panicking

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use tenax::storage::{Storage, TaskListParams, TaskRef};
use tenax::{Client, Registry, TaskRecord, TaskStatus, Worker, WorkerConfig};
pub use tenax_ledger::{Ledger, LedgerReport};

/// A fresh, migrated SQLite store for one test.
pub struct TestStore {
    client: Client,
    offset: Mutex<Duration>,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for TestStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestStore")
            .field("offset", &self.offset())
            .finish()
    }
}

/// Whether `actual` contains `expected`: every key of an expected object is in the
/// actual object with a matching value (recursively); other values must be equal.
pub fn json_contains(actual: &Value, expected: &Value) -> bool {
    match (actual, expected) {
        (Value::Object(actual), Value::Object(expected)) => expected
            .iter()
            .all(|(key, value)| actual.get(key).is_some_and(|a| json_contains(a, value))),
        _ => actual == expected,
    }
}

impl TestStore {
    /// A new store in a temporary folder.
    pub async fn new() -> Self {
        let dir = tempfile::tempdir().expect("a temporary folder for the test store");
        let url = format!("sqlite://{}", dir.path().join("tenax.db").display());
        let client = Client::connect(&url).await.expect("open the test store");
        Self {
            client,
            offset: Mutex::new(Duration::ZERO),
            _dir: dir,
        }
    }

    /// The client, to enqueue and inspect as the application does.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The storage, to build workers on.
    pub fn storage(&self) -> Arc<dyn Storage> {
        self.client.storage().clone()
    }

    fn offset(&self) -> Duration {
        *self.offset.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Move the store's clock forward: later [`drain`](Self::drain)s see tasks due up
    /// to the database's now plus every advance so far.
    pub fn advance(&self, by: Duration) {
        *self.offset.lock().unwrap_or_else(|e| e.into_inner()) += by;
    }

    /// The store's clock: the database's now plus the advances.
    pub async fn now(&self) -> DateTime<Utc> {
        let now = self
            .client
            .storage()
            .now()
            .await
            .expect("read the database clock");
        now + chrono::Duration::from_std(self.offset()).expect("offset in range")
    }

    /// Every task, newest first.
    pub async fn tasks(&self) -> Vec<TaskRecord> {
        self.client
            .list(&TaskListParams {
                limit: u32::MAX,
                ..Default::default()
            })
            .await
            .expect("list tasks")
    }

    /// The tasks of `command_type` that wait to run (`pending` or `retrying`).
    pub async fn enqueued(&self, command_type: &str) -> Vec<TaskRecord> {
        self.tasks()
            .await
            .into_iter()
            .filter(|t| t.command_type == command_type && t.status.is_claimable())
            .collect()
    }

    /// Assert that a task of `command_type` waits with a payload containing `payload`
    /// (see [`json_contains`]); returns it. Panics listing what does wait otherwise.
    pub async fn assert_enqueued(&self, command_type: &str, payload: Value) -> TaskRecord {
        let waiting = self.enqueued(command_type).await;
        let found = waiting.iter().find(|t| {
            serde_json::from_str::<Value>(&t.payload).is_ok_and(|p| json_contains(&p, &payload))
        });
        match found {
            Some(task) => task.clone(),
            None => panic!(
                "no {command_type} task with a payload containing {payload} is enqueued; waiting {command_type} payloads: {:?}",
                waiting.iter().map(|t| t.payload.as_str()).collect::<Vec<_>>()
            ),
        }
    }

    /// Assert that no task of `command_type` waits.
    pub async fn assert_not_enqueued(&self, command_type: &str) {
        let waiting = self.enqueued(command_type).await;
        assert!(
            waiting.is_empty(),
            "{} {command_type} task(s) are enqueued: {:?}",
            waiting.len(),
            waiting
                .iter()
                .map(|t| t.payload.as_str())
                .collect::<Vec<_>>()
        );
    }

    /// Run every task due at the store's clock with `registry`, synchronously, until
    /// none is due (retries that fall due meanwhile run too, and compensations of
    /// tasks that die); returns the tasks that ran, in their final state.
    pub async fn drain(&self, registry: &Registry) -> Vec<TaskRecord> {
        let config = WorkerConfig {
            reaper: false,
            pruner: false,
            ..WorkerConfig::default()
        };
        let worker = Worker::new(self.storage(), registry.clone(), config)
            .expect("a worker for the registry");
        let at = if self.offset().is_zero() {
            None
        } else {
            Some(self.now().await)
        };
        let ids = worker.drain(at).await.expect("drain the store");
        let mut ran = Vec::with_capacity(ids.len());
        let mut seen = std::collections::HashSet::new();
        for id in ids {
            if seen.insert(id) {
                let task = self
                    .client
                    .get(&TaskRef::Id(id))
                    .await
                    .expect("read a task");
                ran.extend(task);
            }
        }
        ran
    }

    /// Run the tasks due now and return the one with `task_no`, in its final state.
    pub async fn run(&self, registry: &Registry, task_no: &str) -> TaskRecord {
        self.drain(registry).await;
        let no = tenax::TaskNo::new(task_no).expect("a valid task_no");
        self.client
            .get(&TaskRef::No(no))
            .await
            .expect("read the task")
            .unwrap_or_else(|| panic!("no task {task_no}"))
    }

    /// Count of tasks in `status`.
    pub async fn count(&self, status: TaskStatus) -> u64 {
        self.client.stats().await.expect("stats").count(status)
    }
}

#[cfg(test)]
mod tests {
    use super::json_contains;
    use serde_json::json;

    #[test]
    fn payloads_match_by_containment() {
        let actual = json!({"order": 42, "customer": {"id": 7, "tier": "gold"}, "items": [1, 2]});
        assert!(json_contains(&actual, &json!({"order": 42})));
        assert!(json_contains(
            &actual,
            &json!({"customer": {"tier": "gold"}})
        ));
        assert!(json_contains(&actual, &json!({})));
        assert!(!json_contains(&actual, &json!({"order": 43})));
        assert!(!json_contains(&actual, &json!({"missing": 1})));
        assert!(
            !json_contains(&actual, &json!({"items": [1]})),
            "arrays compare whole"
        );
    }
}
