//! Conformance cases for the queue controls: pause, resume, per-queue limits.
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use tenax_core::{CompensationState, TaskId, TaskRecord};

use super::{claim_params, Harness, TaskOpts};
use crate::{
    Lease, QueueChange, QueueInfo, QueueUpdateParams, StorageError, TaskClaimParams,
    TaskCompleteParams,
};

async fn update(h: &Harness, queue: &str, change: QueueChange) -> QueueInfo {
    h.storage
        .queue_update(&QueueUpdateParams {
            queue: queue.into(),
            change,
            now: None,
        })
        .await
        .unwrap()
}

fn of_queues(worker: &str, limit: u32, queues: &[&str]) -> TaskClaimParams {
    TaskClaimParams {
        queues: queues.iter().map(|q| (*q).to_owned()).collect(),
        ..claim_params(worker, limit, None)
    }
}

async fn claim_from(h: &Harness, limit: u32, queues: &[&str]) -> Vec<TaskRecord> {
    h.storage
        .task_claim_batch(&of_queues("w1", limit, queues))
        .await
        .unwrap()
}

async fn in_queue(h: &Harness, queue: &str, n: usize) -> Vec<TaskId> {
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(
            h.task(TaskOpts {
                queue: queue.into(),
                ..Default::default()
            })
            .await
            .id,
        );
    }
    ids
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

fn listed<'a>(queues: &'a [QueueInfo], name: &str) -> &'a QueueInfo {
    queues
        .iter()
        .find(|q| q.name == name)
        .unwrap_or_else(|| panic!("queue {name} is not listed: {queues:?}"))
}

pub async fn a_paused_queue_is_never_claimed_from(h: &Harness) {
    let held = in_queue(h, "default", 2).await;
    let other = in_queue(h, "other", 1).await;
    let info = update(h, "default", QueueChange::Pause).await;
    assert!(info.paused);
    assert_eq!((info.waiting, info.running, info.max_running), (2, 0, None));
    // A queue with no tasks yet can be paused too.
    assert!(update(h, "empty", QueueChange::Pause).await.paused);

    let got = claim_from(h, 10, &["default", "other"]).await;
    assert_eq!(got.iter().map(|t| t.id).collect::<Vec<_>>(), other);
    assert!(claim_from(h, 10, &["default"]).await.is_empty());

    let queues = h.storage.queue_list().await.unwrap();
    let names: Vec<_> = queues.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(names, vec!["default", "empty", "other"]);
    assert!(listed(&queues, "default").paused);
    assert_eq!(listed(&queues, "default").waiting, 2);
    assert!(!listed(&queues, "other").paused);
    assert_eq!(listed(&queues, "other").running, 1);
    assert!(listed(&queues, "other").updated_at.is_none());

    assert!(!update(h, "default", QueueChange::Resume).await.paused);
    let mut got: Vec<_> = claim_from(h, 10, &["default"])
        .await
        .iter()
        .map(|t| t.id)
        .collect();
    got.sort();
    assert_eq!(got, held);
}

pub async fn invalid_queue_changes_are_refused_and_change_nothing(h: &Harness) {
    update(h, "default", QueueChange::MaxRunning(Some(3))).await;
    for (queue, change) in [
        ("default", QueueChange::MaxRunning(Some(0))),
        ("", QueueChange::Pause),
        ("has space", QueueChange::Pause),
    ] {
        let err = h
            .storage
            .queue_update(&QueueUpdateParams {
                queue: queue.into(),
                change,
                now: None,
            })
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::Invalid(_)), "{err:?}");
    }
    let queues = h.storage.queue_list().await.unwrap();
    assert_eq!(queues.len(), 1, "{queues:?}");
    assert_eq!(queues[0].max_running, Some(3));
    assert!(!queues[0].paused);
}

pub async fn a_queue_limit_caps_its_running_tasks_without_blocking_others(h: &Harness) {
    in_queue(h, "default", 5).await;
    let other = in_queue(h, "other", 3).await;
    let info = update(h, "default", QueueChange::MaxRunning(Some(2))).await;
    assert_eq!(info.max_running, Some(2));
    // Pausing and resuming keeps the limit.
    update(h, "default", QueueChange::Pause).await;
    assert_eq!(
        update(h, "default", QueueChange::Resume).await.max_running,
        Some(2)
    );

    let first = claim_from(h, 10, &["default"]).await;
    assert_eq!(first.len(), 2);
    assert!(claim_from(h, 10, &["default"]).await.is_empty());
    // The full queue does not hold up another queue of the same claim.
    let mixed = claim_from(h, 10, &["default", "other"]).await;
    let mut ids: Vec<_> = mixed.iter().map(|t| t.id).collect();
    ids.sort();
    assert_eq!(ids, other);

    done(h.storage.as_ref(), &first[0]).await;
    assert_eq!(claim_from(h, 10, &["default"]).await.len(), 1);
    // Lowering the limit below what runs stops claims; nothing is interrupted.
    update(h, "default", QueueChange::MaxRunning(Some(1))).await;
    assert!(claim_from(h, 10, &["default"]).await.is_empty());
    let info = update(h, "default", QueueChange::MaxRunning(None)).await;
    assert_eq!((info.max_running, info.running, info.waiting), (None, 2, 2));
    assert_eq!(claim_from(h, 10, &["default"]).await.len(), 2);
}

/// Four claimers (separate connections, as separate nodes) race over one limited queue;
/// a task leaves the tracked set before its completion is written and joins it after
/// its claim committed, so the set is always a subset of what the database runs.
pub async fn concurrent_claimers_never_exceed_a_queue_limit(h: &Harness) {
    const LIMIT: usize = 3;
    const TASKS: usize = 60;
    in_queue(h, "default", TASKS).await;
    update(h, "default", QueueChange::MaxRunning(Some(LIMIT as u32))).await;
    let running: Arc<Mutex<HashSet<TaskId>>> = Arc::default();
    let finished: Arc<Mutex<usize>> = Arc::default();
    let peak: Arc<Mutex<usize>> = Arc::default();
    let mut joins = Vec::new();
    for claimer in 0..4 {
        let storage = h.reopen().await;
        let (running, finished, peak) = (running.clone(), finished.clone(), peak.clone());
        joins.push(tokio::spawn(async move {
            let params = of_queues(&format!("w{claimer}"), 2, &["default"]);
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
            while *finished.lock().unwrap() < TASKS {
                assert!(tokio::time::Instant::now() < deadline, "claims stalled");
                let batch = storage.task_claim_batch(&params).await.unwrap();
                {
                    let mut running = running.lock().unwrap();
                    running.extend(batch.iter().map(|t| t.id));
                    let mut peak = peak.lock().unwrap();
                    *peak = (*peak).max(running.len());
                    assert!(
                        running.len() <= LIMIT,
                        "{} tasks of a queue limited to {LIMIT} ran at once",
                        running.len()
                    );
                }
                tokio::task::yield_now().await;
                for task in &batch {
                    running.lock().unwrap().remove(&task.id);
                    done(storage.as_ref(), task).await;
                    *finished.lock().unwrap() += 1;
                }
            }
        }));
    }
    for join in joins {
        join.await.unwrap();
    }
    assert_eq!(*finished.lock().unwrap(), TASKS);
    assert!(*peak.lock().unwrap() >= 2, "the claimers never overlapped");
}
