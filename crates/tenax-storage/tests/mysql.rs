//! MariaDB/MySQL-only checks: session settings, URL schemes, the time range, locking
//! (no call waits for a task it does not touch), lock-conflict retries, and claims under
//! contention. Run with `--features mysql,testing` when `TENAX_TEST_MYSQL_URL` is set,
//! like the conformance suite.
#![cfg(all(feature = "mysql", feature = "testing"))]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashSet;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{TimeZone, Utc};
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{ConnectOptions, Connection};
use tenax_core::{CompensationState, TaskStatus};
use tenax_storage::mysql::{testing_database, MySqlConfig, MySqlStorage};
use tenax_storage::testing::{claim_params, unique_name, url_from_env, Harness, TaskOpts};
use tenax_storage::{
    FailNext, Lease, LeaseExtendParams, RunAt, Storage, TaskActionParams, TaskCompleteParams,
    TaskFailParams, TaskListParams, TaskPruneParams, TaskReapParams, TaskRef,
};

/// The server URL under test, in the scheme sqlx parses.
fn server_url() -> Option<String> {
    Some(url_from_env("TENAX_TEST_MYSQL_URL")?.replacen("mariadb://", "mysql://", 1))
}

/// A fresh migrated database, and how to open a second, raw connection to it.
async fn fresh() -> Option<(Harness, MySqlConnectOptions)> {
    let url = server_url()?;
    let name = unique_name("tenax_t");
    let storage = testing_database(&url, &name).await.unwrap();
    let options = MySqlConnectOptions::from_str(&url).unwrap().database(&name);
    Some((
        Harness::new(
            storage,
            tenax_storage::mysql::url_with_database(&url, &name),
        ),
        options,
    ))
}

#[tokio::test]
async fn sessions_are_read_committed_utc_with_a_lock_wait_timeout() {
    let Some(url) = server_url() else {
        return;
    };
    // The mariadb:// scheme is accepted too.
    let url = url.replacen("mysql://", "mariadb://", 1);
    let storage = MySqlStorage::connect(&url).await.unwrap();
    let (isolation, time_zone, lock_wait): (String, String, u64) = sqlx::query_as(
        "SELECT CAST(@@SESSION.tx_isolation AS CHAR), CAST(@@SESSION.time_zone AS CHAR),
                CAST(@@SESSION.innodb_lock_wait_timeout AS UNSIGNED)",
    )
    .fetch_one(storage.pool())
    .await
    .unwrap();
    assert_eq!(isolation, "READ-COMMITTED");
    assert_eq!(time_zone, "+00:00");
    assert_eq!(lock_wait, 10);
    assert_eq!(storage.backend(), "mysql");
    assert!(storage.capabilities().cross_process_wakeups);
}

#[tokio::test]
async fn times_past_2038_and_out_of_range_are_stored() {
    let Some((h, _)) = fresh().await else {
        return;
    };
    // A TIMESTAMP parameter past 2038 would arrive as NULL.
    let at = Utc.with_ymd_and_hms(2100, 1, 2, 3, 4, 5).unwrap() + chrono::Duration::microseconds(6);
    let task = h
        .task(TaskOpts {
            run_at: RunAt::At(at),
            ..Default::default()
        })
        .await;
    assert_eq!(task.run_at, at);
    // The last instant the shared bounds accept (year 9999) is stored exactly.
    let last = Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).unwrap();
    let late = h
        .task(TaskOpts {
            run_at: RunAt::At(last),
            ..Default::default()
        })
        .await;
    assert_eq!(late.run_at, last);
    let fetched = h
        .storage
        .task_get(&TaskRef::Id(late.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(fetched, late);
}

#[tokio::test]
async fn a_claim_skips_locked_tasks_without_waiting() {
    let Some((h, options)) = fresh().await else {
        return;
    };
    let now = h.storage.now().await.unwrap();
    let mut ids = Vec::new();
    for secs in 1..=5 {
        let task = h
            .task(TaskOpts {
                run_at: RunAt::At(now - chrono::Duration::seconds(100 - secs)),
                ..Default::default()
            })
            .await;
        ids.push(task.id);
    }
    // Another transaction (a claimer mid-way) holds the most urgent task.
    let mut other = options.connect().await.unwrap();
    let mut tx = other.begin().await.unwrap();
    sqlx::query("SELECT id FROM tenax_tasks WHERE id = ? FOR UPDATE")
        .bind(ids[0].0)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let started = Instant::now();
    let claimed = h.claim("w1", 3, None).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the claim waited"
    );
    assert_eq!(
        claimed.iter().map(|t| t.id).collect::<Vec<_>>(),
        ids[1..4].to_vec()
    );
    tx.rollback().await.unwrap();
    let rest = h.claim("w2", 10, None).await;
    assert_eq!(
        rest.iter().map(|t| t.id).collect::<HashSet<_>>(),
        HashSet::from([ids[0], ids[4]])
    );
}

/// Every write reads `tenax_tasks` through the primary key, a unique key or SKIP LOCKED:
/// none waits for a task another transaction holds (as a claimer mid-way does).
#[tokio::test]
async fn writes_to_other_tasks_do_not_wait_for_a_held_task() {
    let Some((h, options)) = fresh().await else {
        return;
    };
    let held = h.task(TaskOpts::default()).await;
    for _ in 0..3 {
        h.task(TaskOpts::default()).await;
    }
    let spare = h.task(TaskOpts::default()).await;
    let mut other = options.connect().await.unwrap();
    let mut tx = other.begin().await.unwrap();
    sqlx::query("SELECT id FROM tenax_tasks WHERE id = ? FOR UPDATE")
        .bind(held.id.0)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let s = &h.storage;
    let lease = |t: &tenax_core::TaskRecord| Lease {
        id: t.id,
        epoch: t.lease_epoch,
    };
    let work = async {
        let now = s.now().await.unwrap();
        let claimed = h.claim("w1", 3, None).await;
        assert_eq!(claimed.len(), 3);
        assert!(claimed.iter().all(|t| t.id != held.id));
        let renewed = s
            .lease_extend(&LeaseExtendParams {
                leases: claimed.iter().map(lease).collect(),
                lease_ttl: Duration::from_secs(30),
                now: None,
            })
            .await
            .unwrap();
        assert_eq!(renewed.len(), 3);
        assert!(s
            .task_complete_if_leased(&TaskCompleteParams {
                lease: lease(&claimed[0]),
                result: None,
                compensation: CompensationState::Succeeded,
                now: None,
            })
            .await
            .unwrap());
        let fail = |l: Lease| TaskFailParams {
            lease: l,
            error: "boom".into(),
            next: FailNext::Dead,
            now: None,
        };
        assert!(s
            .task_fail_if_leased(&fail(lease(&claimed[1])))
            .await
            .unwrap());
        // claimed[2] is left to the reaper.
        let reaped = s
            .task_reap_expired(&TaskReapParams {
                limit: 10,
                now: Some(now + chrono::Duration::seconds(120)),
                expires_beyond: None,
            })
            .await
            .unwrap();
        assert_eq!(reaped.len(), 1);
        // The compensation of claimed[1] is the only due task left once the spare is
        // cancelled; it fails, and an operator retries it.
        s.task_cancel(&TaskActionParams {
            task: TaskRef::Id(spare.id),
            now: None,
        })
        .await
        .unwrap();
        let comp = s
            .task_list(&TaskListParams {
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_iter()
            .find(|t| t.parent_id == Some(claimed[1].id))
            .unwrap();
        let mut params = claim_params("w2", 1, None);
        params.commands = vec![(comp.command_type.clone(), comp.payload_version)];
        let running = s.task_claim_batch(&params).await.unwrap();
        assert_eq!(running.len(), 1);
        assert_eq!(running[0].id, comp.id);
        assert!(s
            .task_fail_if_leased(&fail(lease(&running[0])))
            .await
            .unwrap());
        s.task_retry(&TaskActionParams {
            task: TaskRef::Id(comp.id),
            now: None,
        })
        .await
        .unwrap();
        let pruned = s
            .task_prune(&TaskPruneParams {
                retention: Duration::ZERO,
                limit: 100,
                now: Some(now + chrono::Duration::seconds(3600)),
            })
            .await
            .unwrap();
        assert!(pruned >= 2, "{pruned}");
        s.stats().await.unwrap();
    };
    tokio::time::timeout(Duration::from_secs(5), work)
        .await
        .expect("a write waited for the held task");
    tx.rollback().await.unwrap();
}

/// A task running under a lease, and the dead task its compensation is for.
async fn running_compensation(h: &Harness) -> (tenax_core::TaskRecord, tenax_core::TaskRecord) {
    h.task(TaskOpts::default()).await;
    let parent = h.claim("w1", 1, None).await.remove(0);
    assert!(h
        .storage
        .task_fail_if_leased(&TaskFailParams {
            lease: Lease {
                id: parent.id,
                epoch: parent.lease_epoch,
            },
            error: "boom".into(),
            next: FailNext::Dead,
            now: None,
        })
        .await
        .unwrap());
    let comp = h.claim("w1", 1, None).await.remove(0);
    assert_eq!(comp.parent_id, Some(parent.id));
    (comp, parent)
}

/// A lock-wait timeout (1205) is retried inside the backend, not returned.
#[tokio::test]
async fn a_lock_wait_timeout_is_retried() {
    let Some(url) = server_url() else {
        return;
    };
    let name = unique_name("tenax_t");
    testing_database(&url, &name).await.unwrap();
    let storage = MySqlStorage::connect_with(
        &tenax_storage::mysql::url_with_database(&url, &name),
        &MySqlConfig {
            lock_wait_timeout: Duration::from_secs(1),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let h = Harness::new(
        Arc::new(storage),
        tenax_storage::mysql::url_with_database(&url, &name),
    );
    h.task(TaskOpts::default()).await;
    let task = h.claim("w1", 1, None).await.remove(0);
    let options = MySqlConnectOptions::from_str(&url).unwrap().database(&name);
    let mut other = options.connect().await.unwrap();
    let mut tx = other.begin().await.unwrap();
    sqlx::query("SELECT id FROM tenax_tasks WHERE id = ? FOR UPDATE")
        .bind(task.id.0)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let release = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        tx.rollback().await.unwrap();
    };
    let started = Instant::now();
    let params = TaskCompleteParams {
        lease: Lease {
            id: task.id,
            epoch: task.lease_epoch,
        },
        result: None,
        compensation: CompensationState::Succeeded,
        now: None,
    };
    let (done, ()) = tokio::join!(h.storage.task_complete_if_leased(&params), release);
    assert!(done.expect("the timeout is retried until the lock is released"));
    assert!(started.elapsed() >= Duration::from_secs(1), "no lock wait");
}

/// A deadlock (1213) victim's transaction is run again inside the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_victim_is_retried() {
    let Some((h, options)) = fresh().await else {
        return;
    };
    let (comp, parent) = running_compensation(&h).await;
    for _ in 0..30 {
        h.task(TaskOpts::default()).await;
    }
    // Another transaction writes many rows (so InnoDB picks the backend's smaller
    // transaction as the victim) and holds the parent. READ COMMITTED, as the backend's
    // sessions: it keeps no locks on the rows its UPDATE scans but does not change.
    let mut other = options.connect().await.unwrap();
    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut other)
        .await
        .unwrap();
    let mut tx = other.begin().await.unwrap();
    sqlx::query("UPDATE tenax_tasks SET updated_at = UTC_TIMESTAMP(6) WHERE status = 'pending'")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("UPDATE tenax_tasks SET updated_at = UTC_TIMESTAMP(6) WHERE id = ?")
        .bind(parent.id.0)
        .execute(&mut *tx)
        .await
        .unwrap();
    // Completing the compensation locks it, then waits for the parent...
    let storage = h.storage.clone();
    let complete = tokio::spawn(async move {
        storage
            .task_complete_if_leased(&TaskCompleteParams {
                lease: Lease {
                    id: comp.id,
                    epoch: comp.lease_epoch,
                },
                result: None,
                compensation: CompensationState::Succeeded,
                now: None,
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // ... while the other transaction asks for the compensation: a deadlock.
    sqlx::query("SELECT id FROM tenax_tasks WHERE id = ? FOR UPDATE")
        .bind(comp.id.0)
        .fetch_one(&mut *tx)
        .await
        .expect("the backend's transaction is the victim");
    tx.commit().await.unwrap();
    let done = complete
        .await
        .unwrap()
        .expect("the victim's transaction is run again");
    assert!(done);
    let parent = h
        .storage
        .task_get(&TaskRef::Id(parent.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parent.compensation, Some(CompensationState::Succeeded));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claimers_take_every_task_exactly_once() {
    let Some((h, _)) = fresh().await else {
        return;
    };
    const TASKS: usize = 300;
    for _ in 0..TASKS {
        h.task(TaskOpts {
            queue: "default".into(),
            ..Default::default()
        })
        .await;
    }
    let storage: Arc<dyn Storage> = h.storage.clone();
    let mut joins = Vec::new();
    for worker in 0..8 {
        let storage = storage.clone();
        joins.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            let mut idle = 0;
            while idle < 20 {
                let params = claim_params(&format!("w{worker}"), 7, None);
                let claimed = storage.task_claim_batch(&params).await.expect("claim");
                if claimed.is_empty() {
                    idle += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                idle = 0;
                for task in claimed {
                    let lease = Lease {
                        id: task.id,
                        epoch: task.lease_epoch,
                    };
                    let done = storage
                        .task_complete_if_leased(&TaskCompleteParams {
                            lease,
                            result: None,
                            compensation: CompensationState::Succeeded,
                            now: None,
                        })
                        .await
                        .expect("complete");
                    assert!(done, "a fresh lease completes");
                    mine.push(task.id);
                }
            }
            mine
        }));
    }
    let mut all = Vec::new();
    for join in joins {
        all.extend(join.await.unwrap());
    }
    let distinct: HashSet<_> = all.iter().copied().collect();
    assert_eq!(distinct.len(), all.len(), "a task was claimed twice");
    assert_eq!(all.len(), TASKS);
    let stats = storage.stats().await.unwrap();
    assert_eq!(stats.count(TaskStatus::Succeeded), TASKS as u64);
}
