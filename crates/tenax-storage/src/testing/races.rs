//! Conformance cases under concurrency and at random: the state machine under random
//! operations, racing claims, cancels and migrations, and wake-ups across processes.
use std::collections::HashMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tenax_core::state::is_legal;
use tenax_core::{CompensationState, TaskId, TaskStatus};

use super::conformance::{fail, lease, reap, status_of};
use super::{claim_params, Harness, TaskOpts};
use crate::{
    FailNext, Lease, LeaseExtendParams, StorageError, TaskActionParams, TaskCompleteParams,
    TaskListParams, TaskRef,
};

/// Random sequences of every operation, including stale writes and clock jumps; after
/// each step every task's status change must be a legal transition, and no two tasks
/// may share a `task_no`.
pub async fn random_operations_follow_the_state_machine(h: &Harness) {
    let seed: u64 = std::env::var("TENAX_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    eprintln!(
        "random_operations_follow_the_state_machine: seed {seed} (replay with TENAX_SEED={seed})"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let mut now = h.storage.now().await.unwrap();
    let mut leases: Vec<Lease> = Vec::new();
    let mut seen: HashMap<TaskId, TaskStatus> = HashMap::new();
    for step in 0..300 {
        let op = rng.random_range(0..9);
        match op {
            0 => {
                let n = rng.random_range(0..6);
                let _ = h
                    .storage
                    .task_insert(
                        &TaskOpts {
                            task_no: Some(format!("T{n}")),
                            max_attempts: rng.random_range(1..4),
                            now: Some(now),
                            ..Default::default()
                        }
                        .params(),
                    )
                    .await;
            }
            1 => leases.extend(
                h.claim("w", rng.random_range(1..3), Some(now))
                    .await
                    .iter()
                    .map(lease),
            ),
            2 | 3 if !leases.is_empty() => {
                // Possibly stale: leases are never forgotten.
                let l = leases[rng.random_range(0..leases.len())];
                if op == 2 {
                    let _ = h
                        .storage
                        .task_complete_if_leased(&TaskCompleteParams {
                            lease: l,
                            result: None,
                            compensation: CompensationState::Succeeded,
                            now: Some(now),
                        })
                        .await
                        .unwrap();
                } else {
                    let next = if rng.random_bool(0.5) {
                        FailNext::Dead
                    } else {
                        FailNext::Retry(Duration::from_secs(rng.random_range(0..5)))
                    };
                    fail(h, l, next, Some(now)).await;
                }
            }
            4 => {
                reap(h, Some(now)).await;
            }
            5 => now += chrono::Duration::seconds(rng.random_range(0..40)),
            6 | 7 => {
                let id = TaskId(rng.random_range(1..12));
                let params = TaskActionParams {
                    task: TaskRef::Id(id),
                    now: Some(now),
                };
                let result = if op == 6 {
                    h.storage.task_cancel(&params).await
                } else {
                    h.storage.task_retry(&params).await
                };
                if let Err(e) = result {
                    assert!(
                        matches!(
                            e,
                            StorageError::NotFound(_) | StorageError::InvalidState { .. }
                        ),
                        "seed {seed}: {e}"
                    );
                }
            }
            _ => {
                let renewed = h
                    .storage
                    .lease_extend(&LeaseExtendParams {
                        leases: leases.clone(),
                        lease_ttl: Duration::from_secs(30),
                        now: Some(now),
                    })
                    .await
                    .unwrap();
                for id in renewed {
                    assert_eq!(seen.get(&id.id), Some(&TaskStatus::Running), "seed {seed}");
                }
            }
        }
        let tasks = h
            .storage
            .task_list(&TaskListParams {
                limit: 1000,
                ..Default::default()
            })
            .await
            .unwrap();
        let mut numbers: Vec<_> = tasks.iter().map(|t| t.task_no.clone()).collect();
        numbers.sort();
        numbers.dedup();
        assert_eq!(numbers.len(), tasks.len(), "seed {seed}: duplicate task_no");
        for task in &tasks {
            if let Some(before) = seen.insert(task.id, task.status) {
                assert!(
                    before == task.status || is_legal(before, task.status),
                    "seed {seed} step {step} op {op}: task {} moved {before} -> {} (replay with TENAX_SEED={seed})",
                    task.id,
                    task.status
                );
            }
            if task.status == TaskStatus::Running {
                assert!(
                    task.attempt <= task.max_attempts,
                    "seed {seed}: attempts over budget"
                );
            }
        }
    }
}

pub async fn migrations_apply_once_however_many_nodes_start_together(h: &Harness) {
    let task = h.task(TaskOpts::default()).await;
    // Four nodes start at once on the migrated database, and migrate again.
    let mut joins = Vec::new();
    for _ in 0..4 {
        let url = h.url.clone();
        joins.push(tokio::spawn(async move {
            let storage = crate::connect(&url).await?;
            storage.migrate().await?;
            Ok::<_, StorageError>(storage)
        }));
    }
    for join in joins {
        let storage = join.await.unwrap().expect("every node migrates");
        let seen = storage.task_get(&TaskRef::Id(task.id)).await.unwrap();
        assert_eq!(
            seen.map(|t| t.id),
            Some(task.id),
            "migrating again keeps the data"
        );
    }
    h.storage
        .migrate()
        .await
        .expect("migrating twice is a no-op");
}

pub async fn cancel_racing_a_claim_exactly_one_wins(h: &Harness) {
    let other = h.reopen().await;
    for round in 0..20 {
        let task = h.task(TaskOpts::default()).await;
        let claimer = h.storage.clone();
        let claim =
            tokio::spawn(
                async move { claimer.task_claim_batch(&claim_params("w1", 1, None)).await },
            );
        let cancel = other
            .task_cancel(&TaskActionParams {
                task: TaskRef::Id(task.id),
                now: None,
            })
            .await;
        let claimed = claim.await.unwrap().unwrap();
        let won_claim = claimed.iter().any(|t| t.id == task.id);
        // Either the cancel came first (cancelled, never claimed) or the claim did (the
        // cancel becomes a request the running attempt obeys): never both, never lost.
        let cancel = cancel.unwrap();
        if won_claim {
            assert_eq!(cancel.status, TaskStatus::Running, "round {round}");
            let held = lease(&claimed[0]);
            assert_eq!(super::runtime::requested(h, &[held]).await, vec![held]);
            assert!(fail(h, held, FailNext::Retry(Duration::ZERO), None).await);
        } else {
            assert_eq!(cancel.status, TaskStatus::Cancelled, "round {round}");
        }
        assert_eq!(status_of(h, task.id).await, TaskStatus::Cancelled);
    }
}

pub async fn concurrent_claimers_take_each_task_once(h: &Harness) {
    let mut expected = Vec::new();
    for _ in 0..200 {
        expected.push(h.task(TaskOpts::default()).await.id);
    }
    let mut joins = Vec::new();
    for claimer in 0..4 {
        let storage = h.reopen().await;
        joins.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let batch = storage
                    .task_claim_batch(&claim_params(&format!("w{claimer}"), 7, None))
                    .await
                    .unwrap();
                if batch.is_empty() {
                    return mine;
                }
                mine.extend(batch.iter().map(|t| t.id));
            }
        }));
    }
    let mut claimed = Vec::new();
    for join in joins {
        claimed.extend(join.await.unwrap());
    }
    claimed.sort();
    expected.sort();
    assert_eq!(claimed, expected, "every task claimed exactly once");
}

pub async fn wakeups_reach_other_processes(h: &Harness) {
    let other = h.reopen().await;
    // Every backend carries wake-ups across processes by default (PostgreSQL's LISTEN,
    // the probe of SQLite and MariaDB): a backend that stops doing so fails here.
    assert!(
        other.capabilities().cross_process_wakeups,
        "{} has no cross-process wake-ups",
        other.backend()
    );
    let mut wakeups = other.wakeups();
    // The listener (or probe) starts in the background: keep enqueueing until a
    // wake-up arrives.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        h.task(TaskOpts::default()).await;
        if tokio::time::timeout(Duration::from_millis(200), wakeups.changed())
            .await
            .is_ok()
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no wake-up reached the other process"
        );
    }
}
