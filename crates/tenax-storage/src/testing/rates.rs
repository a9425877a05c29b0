//! Conformance cases for rate limits per command type. Time is injected (the `now`
//! overrides) so the bucket's refill is exact; the tasks are inserted on the database
//! clock and the claims run an hour later, when all of them are due.
use std::sync::{Arc, Mutex};

use chrono::{DateTime, TimeDelta, Utc};
use tenax_core::{TaskRecord, TaskStatus};

use super::{claim_params, Harness, TaskOpts};
use crate::{RateLimit, RateLimitSetParams, StorageError, TaskClaimParams, TaskRef};

const LIMITED: &str = "LIMITED_COMMAND";

async fn set(
    h: &Harness,
    command_type: &str,
    per_second: f64,
    burst: u32,
    now: DateTime<Utc>,
) -> RateLimit {
    h.storage
        .rate_limit_set(&RateLimitSetParams {
            command_type: command_type.into(),
            per_second,
            burst,
            now: Some(now),
        })
        .await
        .unwrap()
}

async fn tasks_of(h: &Harness, command_type: &str, n: usize) -> Vec<TaskRecord> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        tasks.push(
            h.task(TaskOpts {
                command_type: command_type.into(),
                ..Default::default()
            })
            .await,
        );
    }
    tasks
}

fn of_types(worker: &str, limit: u32, types: &[&str], now: DateTime<Utc>) -> TaskClaimParams {
    TaskClaimParams {
        commands: types.iter().map(|t| ((*t).to_owned(), 1)).collect(),
        ..claim_params(worker, limit, Some(now))
    }
}

async fn claim_at(h: &Harness, limit: u32, types: &[&str], now: DateTime<Utc>) -> Vec<TaskRecord> {
    h.storage
        .task_claim_batch(&of_types("w1", limit, types, now))
        .await
        .unwrap()
}

/// An hour after the database's now: every task inserted so far is due.
async fn later(h: &Harness) -> DateTime<Utc> {
    h.storage.now().await.unwrap() + TimeDelta::hours(1)
}

pub async fn a_rate_limit_starts_a_burst_then_refills_by_elapsed_time(h: &Harness) {
    tasks_of(h, LIMITED, 20).await;
    let t0 = later(h).await;
    let ms = TimeDelta::milliseconds;
    let limit = set(h, LIMITED, 2.0, 3, t0).await;
    assert_eq!((limit.per_second, limit.burst, limit.tokens), (2.0, 3, 3.0));
    // A full bucket: the burst, however large the batch.
    assert_eq!(claim_at(h, 10, &[LIMITED], t0).await.len(), 3);
    assert!(claim_at(h, 10, &[LIMITED], t0).await.is_empty());
    // Half a token after 250 ms, one after 500 ms.
    assert!(claim_at(h, 10, &[LIMITED], t0 + ms(250)).await.is_empty());
    assert_eq!(claim_at(h, 10, &[LIMITED], t0 + ms(500)).await.len(), 1);
    // A batch smaller than the tokens takes only the batch; the rest stays.
    assert_eq!(claim_at(h, 1, &[LIMITED], t0 + ms(1500)).await.len(), 1);
    assert_eq!(claim_at(h, 10, &[LIMITED], t0 + ms(1500)).await.len(), 1);
    // A long quiet spell refills only up to the burst.
    assert_eq!(
        claim_at(h, 10, &[LIMITED], t0 + TimeDelta::hours(1))
            .await
            .len(),
        3
    );
    let listed = h.storage.rate_limit_list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].command_type, LIMITED);
    assert_eq!(listed[0].tokens, 0.0);
    // Lowering the burst caps the tokens; removing the limit frees the type.
    set(h, LIMITED, 2.0, 1, t0 + TimeDelta::hours(3)).await;
    assert_eq!(
        claim_at(h, 10, &[LIMITED], t0 + TimeDelta::hours(3))
            .await
            .len(),
        1
    );
    h.storage.rate_limit_remove(LIMITED).await.unwrap();
    assert_eq!(
        claim_at(h, 20, &[LIMITED], t0 + TimeDelta::hours(3))
            .await
            .len(),
        20 - 10
    );
}

pub async fn a_rate_limited_task_is_not_claimed_and_spends_no_attempt(h: &Harness) {
    let tasks = tasks_of(h, LIMITED, 3).await;
    let t0 = later(h).await;
    set(h, LIMITED, 1.0, 1, t0).await;
    let claimed = claim_at(h, 10, &[LIMITED], t0).await;
    assert_eq!(claimed.len(), 1);
    for _ in 0..5 {
        assert!(claim_at(h, 10, &[LIMITED], t0).await.is_empty());
    }
    for task in tasks.iter().filter(|t| t.id != claimed[0].id) {
        let now = h
            .storage
            .task_get(&TaskRef::Id(task.id))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (now.status, now.attempt, now.lease_epoch),
            (TaskStatus::Pending, 0, task.lease_epoch)
        );
    }
}

pub async fn a_rate_limited_type_does_not_block_other_types(h: &Harness) {
    // The limited tasks are older, so they come first in claim order.
    tasks_of(h, LIMITED, 5).await;
    let others = tasks_of(h, TaskOpts::TYPE, 5).await;
    let t0 = later(h).await;
    set(h, LIMITED, 1.0, 1, t0).await;
    let claimed = claim_at(h, 4, &[LIMITED, TaskOpts::TYPE], t0).await;
    let limited = claimed.iter().filter(|t| t.command_type == LIMITED).count();
    assert_eq!((claimed.len(), limited), (4, 1), "{claimed:?}");
    // Out of tokens, the limited type yields the whole batch to the others.
    let claimed = claim_at(h, 10, &[LIMITED, TaskOpts::TYPE], t0).await;
    assert_eq!(claimed.len(), others.len() - 3);
    assert!(claimed.iter().all(|t| t.command_type == TaskOpts::TYPE));
}

/// A node whose claims have seen no rate limit learns of one set by another node from
/// its very next claim: it never takes more than the tokens, and the limited type goes
/// first again from the claim after.
pub async fn a_rate_limit_set_by_another_node_holds_from_the_next_claim(h: &Harness) {
    let other = h.reopen().await;
    let t0 = later(h).await;
    // The first claims see no limit.
    assert!(claim_at(h, 10, &[LIMITED, TaskOpts::TYPE], t0)
        .await
        .is_empty());
    assert!(claim_at(h, 10, &[LIMITED, TaskOpts::TYPE], t0)
        .await
        .is_empty());
    tasks_of(h, LIMITED, 6).await;
    let t0 = later(h).await;
    other
        .rate_limit_set(&RateLimitSetParams {
            command_type: LIMITED.into(),
            per_second: 1.0,
            burst: 2,
            now: Some(t0),
        })
        .await
        .unwrap();
    let claimed = claim_at(h, 10, &[LIMITED, TaskOpts::TYPE], t0).await;
    assert_eq!(claimed.len(), 2, "{claimed:?}");
    assert!(claim_at(h, 10, &[LIMITED, TaskOpts::TYPE], t0)
        .await
        .is_empty());
    // Enough unlimited tasks to fill a batch: the limited type, seen by the last
    // claims, takes its refilled token first (skipped by the statement, it would get
    // none of this batch).
    tasks_of(h, TaskOpts::TYPE, 5).await;
    let t1 = later(h).await.max(t0 + TimeDelta::seconds(1));
    let claimed = claim_at(h, 3, &[LIMITED, TaskOpts::TYPE], t1).await;
    let limited = claimed.iter().filter(|t| t.command_type == LIMITED).count();
    assert_eq!((claimed.len(), limited), (3, 1), "{claimed:?}");
}

/// Four claimers (separate connections, as separate nodes) race over one bucket at the
/// same injected instant: together they get exactly the burst, then exactly each refill.
pub async fn concurrent_claimers_never_exceed_a_rate_limit(h: &Harness) {
    const BURST: u32 = 5;
    tasks_of(h, LIMITED, 40).await;
    let t0 = later(h).await;
    set(h, LIMITED, 3.0, BURST, t0).await;
    // The burst, then five refills of 3 (each round is another chance for a race).
    let rounds = std::iter::once((t0, BURST as usize))
        .chain((1..=5).map(|s| (t0 + TimeDelta::seconds(s), 3)));
    for (at, expected) in rounds {
        let claimed: Arc<Mutex<usize>> = Arc::default();
        let mut joins = Vec::new();
        for claimer in 0..4 {
            let storage = h.reopen().await;
            let claimed = claimed.clone();
            joins.push(tokio::spawn(async move {
                let params = of_types(&format!("w{claimer}"), 2, &[LIMITED], at);
                for _ in 0..10 {
                    let batch = storage.task_claim_batch(&params).await.unwrap();
                    *claimed.lock().unwrap() += batch.len();
                    tokio::task::yield_now().await;
                }
            }));
        }
        for join in joins {
            join.await.unwrap();
        }
        assert_eq!(*claimed.lock().unwrap(), expected, "claims at {at}");
    }
}

pub async fn invalid_rate_limits_are_refused_and_change_nothing(h: &Harness) {
    let t0 = later(h).await;
    let before = set(h, LIMITED, 5.0, 10, t0).await;
    let bad = [
        (LIMITED, 0.0, 10),
        (LIMITED, -1.0, 10),
        (LIMITED, f64::NAN, 10),
        (LIMITED, f64::INFINITY, 10),
        (LIMITED, 1e6 + 1.0, 10),
        (LIMITED, 5.0, 0),
        (LIMITED, 5.0, 1_000_001),
        ("", 5.0, 10),
        ("bad type", 5.0, 10),
    ];
    for (command_type, per_second, burst) in bad {
        let err = h
            .storage
            .rate_limit_set(&RateLimitSetParams {
                command_type: command_type.into(),
                per_second,
                burst,
                now: Some(t0),
            })
            .await
            .unwrap_err();
        assert!(
            matches!(err, StorageError::Invalid(_)),
            "{command_type:?} {per_second} {burst}: {err:?}"
        );
    }
    assert_eq!(h.storage.rate_limit_list().await.unwrap(), vec![before]);
    // The bounds themselves are accepted.
    set(h, "EDGE", 1e6, 1_000_000, t0).await;
    set(h, "EDGE", 0.001, 1, t0).await;
    let err = h.storage.rate_limit_remove("MISSING").await.unwrap_err();
    assert!(matches!(err, StorageError::NotFound(_)), "{err:?}");
    assert_eq!(h.storage.rate_limit_list().await.unwrap().len(), 2);
}
