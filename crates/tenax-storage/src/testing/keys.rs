//! Conformance cases for business-key concurrency: at most `concurrency_limit` tasks
//! of one `concurrency_key` run at once, and a full key blocks nobody else.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tenax_core::{CompensationState, TaskId, TaskRecord};

use super::{claim_params, Harness, TaskOpts};
use crate::{Lease, QueueChange, QueueUpdateParams, StorageError, TaskCompleteParams, TaskRef};

async fn keyed(h: &Harness, key: Option<&str>, limit: u32) -> TaskRecord {
    h.task(TaskOpts {
        concurrency_key: key.map(str::to_owned),
        concurrency_limit: limit,
        ..Default::default()
    })
    .await
}

async fn claim(h: &Harness, limit: u32) -> Vec<TaskId> {
    h.storage
        .task_claim_batch(&claim_params("w1", limit, None))
        .await
        .unwrap()
        .iter()
        .map(|t| t.id)
        .collect()
}

async fn done(storage: &dyn crate::Storage, task: &TaskRecord) {
    let completed = storage
        .task_complete_if_leased(&TaskCompleteParams {
            lease: Lease {
                id: task.id,
                epoch: task.lease_epoch,
            },
            result: None,
            compensation: CompensationState::Succeeded,
            now: None,
        })
        .await
        .unwrap();
    assert!(completed);
}

pub async fn a_key_runs_at_most_its_limit_at_once(h: &Harness) {
    let a: Vec<TaskRecord> = vec![
        keyed(h, Some("order-1"), 1).await,
        keyed(h, Some("order-1"), 1).await,
    ];
    let b: Vec<TaskRecord> = vec![
        keyed(h, Some("order-2"), 2).await,
        keyed(h, Some("order-2"), 2).await,
        keyed(h, Some("order-2"), 2).await,
    ];
    let free = keyed(h, None, 1).await;
    let stored = h
        .storage
        .task_get(&TaskRef::Id(b[0].id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.concurrency_key.as_deref(), Some("order-2"));
    assert_eq!(stored.concurrency_limit, 2);
    let first = claim(h, 10).await;
    assert_eq!(first, vec![a[0].id, b[0].id, b[1].id, free.id]);
    assert!(claim(h, 10).await.is_empty(), "both keys are full");
    let running = h
        .storage
        .task_get(&TaskRef::Id(a[0].id))
        .await
        .unwrap()
        .unwrap();
    done(h.storage.as_ref(), &running).await;
    assert_eq!(claim(h, 10).await, vec![a[1].id], "a freed slot is taken");
}

pub async fn a_full_key_does_not_block_the_tasks_behind_it(h: &Harness) {
    let mut full = Vec::new();
    for _ in 0..5 {
        full.push(keyed(h, Some("busy"), 1).await);
    }
    let other = keyed(h, Some("other"), 1).await;
    let free = keyed(h, None, 1).await;
    // One task per claim: the walk itself must step over the full key. Keyed and
    // unkeyed tasks may be taken by different paths of the claim, so only the set of
    // claimed tasks is fixed, not their order.
    let mut claimed = Vec::new();
    for _ in 0..4 {
        claimed.extend(claim(h, 1).await);
    }
    claimed.sort_unstable();
    assert_eq!(claimed, vec![full[0].id, other.id, free.id]);
}

pub async fn a_keyed_task_in_a_limited_queue_honours_both_limits(h: &Harness) {
    let tasks = [
        keyed(h, Some("k1"), 5).await,
        keyed(h, Some("k1"), 5).await,
        keyed(h, Some("k2"), 1).await,
        keyed(h, Some("k2"), 1).await,
    ];
    h.storage
        .queue_update(&QueueUpdateParams {
            queue: "default".into(),
            change: QueueChange::MaxRunning(Some(2)),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(claim(h, 10).await, vec![tasks[0].id, tasks[1].id]);
    assert!(claim(h, 10).await.is_empty(), "the queue is full");
    h.storage
        .queue_update(&QueueUpdateParams {
            queue: "default".into(),
            change: QueueChange::MaxRunning(Some(10)),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(
        claim(h, 10).await,
        vec![tasks[2].id],
        "k2 takes one at a time"
    );
}

pub async fn invalid_concurrency_keys_are_refused_and_change_nothing(h: &Harness) {
    let long = "k".repeat(crate::CONCURRENCY_KEY_MAX_BYTES + 1);
    let cases: [(Option<&str>, u32); 5] = [
        (Some(""), 1),
        (Some(long.as_str()), 1),
        (Some(" padded"), 1),
        (Some("k"), 0),
        (Some("k"), crate::CONCURRENCY_LIMIT_MAX + 1),
    ];
    for (key, limit) in cases {
        let opts = TaskOpts {
            concurrency_key: key.map(str::to_owned),
            concurrency_limit: limit,
            ..Default::default()
        };
        let err = h.storage.task_insert(&opts.params()).await.unwrap_err();
        assert!(
            matches!(err, StorageError::Invalid(_)),
            "{key:?}/{limit}: {err:?}"
        );
    }
    let longest = "k".repeat(crate::CONCURRENCY_KEY_MAX_BYTES);
    keyed(h, Some(&longest), crate::CONCURRENCY_LIMIT_MAX).await;
    let total = h.storage.stats().await.unwrap().total();
    assert_eq!(total, 1, "only the valid task was stored");
}

pub async fn concurrent_claimers_never_exceed_a_key_limit(h: &Harness) {
    const KEYS: usize = 3;
    const PER_KEY: usize = 20;
    for n in 0..KEYS * PER_KEY {
        keyed(h, Some(&format!("key-{}", n % KEYS)), 1).await;
    }
    let running: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let finished: Arc<Mutex<usize>> = Arc::default();
    let peak: Arc<Mutex<usize>> = Arc::default();
    let mut joins = Vec::new();
    for claimer in 0..4 {
        let storage = h.reopen().await;
        let (running, finished, peak) = (running.clone(), finished.clone(), peak.clone());
        joins.push(tokio::spawn(async move {
            let params = claim_params(&format!("w{claimer}"), 2, None);
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
            while *finished.lock().unwrap() < KEYS * PER_KEY {
                assert!(tokio::time::Instant::now() < deadline, "claims stalled");
                let batch = storage.task_claim_batch(&params).await.unwrap();
                {
                    let mut running = running.lock().unwrap();
                    for task in &batch {
                        let key = task.concurrency_key.clone().unwrap();
                        let n = running.entry(key.clone()).or_insert(0);
                        *n += 1;
                        assert!(*n <= 1, "{n} tasks of key {key} ran at once");
                    }
                    let total: usize = running.values().sum();
                    let mut peak = peak.lock().unwrap();
                    *peak = (*peak).max(total);
                }
                tokio::task::yield_now().await;
                for task in &batch {
                    if let Some(n) = running
                        .lock()
                        .unwrap()
                        .get_mut(task.concurrency_key.as_deref().unwrap())
                    {
                        *n -= 1;
                    }
                    done(storage.as_ref(), task).await;
                    *finished.lock().unwrap() += 1;
                }
            }
        }));
    }
    for join in joins {
        join.await.unwrap();
    }
    assert_eq!(*finished.lock().unwrap(), KEYS * PER_KEY);
    assert!(
        *peak.lock().unwrap() >= 2,
        "the keys never ran side by side"
    );
}
