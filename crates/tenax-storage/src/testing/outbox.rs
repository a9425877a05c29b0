//! Conformance cases for the outbox: the rows a task's final outcome writes in its own
//! transaction, and claiming, settling, listing and pruning them.
use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tenax_core::{CompensationState, TaskId, TaskRecord};

use super::{Harness, TaskOpts};
use crate::{
    BulkAction, FailNext, Lease, OutboxClaimParams, OutboxKind, OutboxListParams, OutboxOutcome,
    OutboxPruneParams, OutboxRecord, OutboxSendersParams, OutboxSettleParams, OutboxStat,
    OutboxStatsParams, OutboxStatus, Storage, StorageError, TaskActionParams, TaskBulkParams,
    TaskCompleteParams, TaskFailParams, TaskFilter, TaskRef,
};

const CALLBACK: &str = "https://hooks.example/tenax?k=1";

fn lease(task: &TaskRecord) -> Lease {
    Lease {
        id: task.id,
        epoch: task.lease_epoch,
    }
}

async fn list(storage: &dyn Storage, task: Option<TaskId>) -> Vec<OutboxRecord> {
    storage
        .outbox_list(&OutboxListParams {
            kind: None,
            status: None,
            task_id: task,
            limit: 1000,
        })
        .await
        .expect("outbox list")
}

fn claim(kind: OutboxKind, limit: u32, now: Option<DateTime<Utc>>) -> OutboxClaimParams {
    OutboxClaimParams {
        kind,
        limit,
        lease: Duration::from_secs(60),
        now,
    }
}

async fn finish_with(h: &Harness, task: &TaskRecord, next: Option<FailNext>) {
    let claimed = h.claim("w1", 10, None).await;
    let running = claimed
        .iter()
        .find(|t| t.id == task.id)
        .expect("the task is claimed");
    let done = match next {
        None => h
            .storage
            .task_complete_if_leased(&TaskCompleteParams {
                lease: lease(running),
                result: Some("{\"ok\":true}".into()),
                compensation: CompensationState::None,
                now: None,
            })
            .await
            .expect("complete"),
        Some(next) => h
            .storage
            .task_fail_if_leased(&TaskFailParams {
                lease: lease(running),
                error: "boom".into(),
                next,
                now: None,
            })
            .await
            .expect("fail"),
    };
    assert!(done, "the lease is held");
}

/// Record a sender of every kind, as a worker with callbacks and alerts does before
/// its first claim: the cases that test the rows themselves start with it.
async fn senders_run(h: &Harness) {
    record(
        h,
        &[OutboxKind::Callback, OutboxKind::Death, OutboxKind::Alert],
        None,
    )
    .await;
}

async fn record(h: &Harness, kinds: &[OutboxKind], now: Option<DateTime<Utc>>) {
    h.storage
        .outbox_senders_seen(&OutboxSendersParams {
            kinds: kinds.to_vec(),
            now,
        })
        .await
        .expect("record the senders");
}

/// A grace long enough that a prune tests the retention alone.
const NO_SENDER_GRACE: Duration = Duration::from_secs(1000 * 86_400);

fn body(record: &OutboxRecord) -> serde_json::Value {
    serde_json::from_str(&record.body).expect("the body is JSON")
}

pub async fn a_final_outcome_writes_its_outbox_rows_in_the_same_transaction(h: &Harness) {
    senders_run(h).await;
    // Succeeded with a callback URL: one callback row with the summary.
    let ok = h
        .task(TaskOpts {
            callback_url: Some(CALLBACK.into()),
            ..Default::default()
        })
        .await;
    assert!(
        list(&*h.storage, Some(ok.id)).await.is_empty(),
        "nothing before the outcome"
    );
    finish_with(h, &ok, None).await;
    let rows = list(&*h.storage, Some(ok.id)).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].kind, OutboxKind::Callback);
    assert_eq!(rows[0].url.as_deref(), Some(CALLBACK));
    assert_eq!(rows[0].status, OutboxStatus::Pending);
    assert_eq!(rows[0].attempts, 0);
    let summary = body(&rows[0]);
    assert_eq!(summary["task_id"], ok.id.0);
    assert_eq!(summary["task_no"], ok.task_no.as_str());
    assert_eq!(summary["status"], "succeeded");
    assert_eq!(summary["result"], "{\"ok\":true}");
    assert!(summary["finished_at"]
        .as_str()
        .is_some_and(|t| t.ends_with('Z')));

    // Succeeded without a URL: nothing. A retry on the way: nothing.
    let plain = h.task(TaskOpts::default()).await;
    finish_with(h, &plain, None).await;
    assert!(list(&*h.storage, Some(plain.id)).await.is_empty());
    let retried = h
        .task(TaskOpts {
            callback_url: Some(CALLBACK.into()),
            ..Default::default()
        })
        .await;
    finish_with(
        h,
        &retried,
        Some(FailNext::Retry(Duration::from_secs(3600))),
    )
    .await;
    assert!(
        list(&*h.storage, Some(retried.id)).await.is_empty(),
        "not final yet"
    );

    // Dead with a URL: a callback row and a death row, each with its own delivery id.
    let dead = h
        .task(TaskOpts {
            callback_url: Some(CALLBACK.into()),
            ..Default::default()
        })
        .await;
    finish_with(h, &dead, Some(FailNext::Dead)).await;
    let rows = list(&*h.storage, Some(dead.id)).await;
    let kinds: Vec<OutboxKind> = rows.iter().map(|r| r.kind).collect();
    assert_eq!(
        kinds,
        vec![OutboxKind::Callback, OutboxKind::Death],
        "{rows:?}"
    );
    assert_ne!(rows[0].delivery_id, rows[1].delivery_id);
    assert_eq!(rows[1].url, None);
    assert_eq!(body(&rows[1])["error"], "boom");
    assert_eq!(body(&rows[1])["status"], "dead");

    // Dead without a URL: the death row only.
    let dead_plain = h.task(TaskOpts::default()).await;
    finish_with(h, &dead_plain, Some(FailNext::Dead)).await;
    let rows = list(&*h.storage, Some(dead_plain.id)).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].kind, OutboxKind::Death);

    // Cancelled one by one and in bulk: a callback row each.
    let one = h
        .task(TaskOpts {
            callback_url: Some(CALLBACK.into()),
            run_at: crate::RunAt::In(Duration::from_secs(3600)),
            ..Default::default()
        })
        .await;
    h.storage
        .task_cancel(&TaskActionParams {
            task: TaskRef::Id(one.id),
            now: None,
        })
        .await
        .expect("cancel");
    let rows = list(&*h.storage, Some(one.id)).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(body(&rows[0])["status"], "cancelled");
    let mut ids = Vec::new();
    for _ in 0..3 {
        let t = h
            .task(TaskOpts {
                callback_url: Some(CALLBACK.into()),
                run_at: crate::RunAt::In(Duration::from_secs(3600)),
                ..Default::default()
            })
            .await;
        ids.push(t.id);
    }
    let outcome = h
        .storage
        .task_bulk(&TaskBulkParams {
            filter: TaskFilter {
                ids: Some(ids.clone()),
                ..Default::default()
            },
            action: BulkAction::Cancel,
            limit: 100,
            now: None,
        })
        .await
        .expect("bulk cancel");
    assert_eq!(outcome.changed, 3, "{outcome:?}");
    for id in ids {
        let rows = list(&*h.storage, Some(id)).await;
        assert_eq!(rows.len(), 1, "task {id}: {rows:?}");
    }
    // A second cancel (refused or not) does not change the status: nothing more.
    let before = list(&*h.storage, None).await.len();
    let _refused = h
        .storage
        .task_cancel(&TaskActionParams {
            task: TaskRef::Id(one.id),
            now: None,
        })
        .await;
    assert_eq!(list(&*h.storage, None).await.len(), before);
}

pub async fn outbox_claims_are_settled_only_under_their_own_attempt(h: &Harness) {
    senders_run(h).await;
    let task = h
        .task(TaskOpts {
            callback_url: Some(CALLBACK.into()),
            ..Default::default()
        })
        .await;
    finish_with(h, &task, None).await;
    let first = h
        .storage
        .outbox_claim(&claim(OutboxKind::Callback, 10, None))
        .await
        .expect("claim");
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].attempts, 1);
    let delivery_id = first[0].delivery_id.clone();
    // Claimed rows are hidden for the lease; deaths are another kind.
    assert!(h
        .storage
        .outbox_claim(&claim(OutboxKind::Callback, 10, None))
        .await
        .expect("claim")
        .is_empty());
    assert!(h
        .storage
        .outbox_claim(&claim(OutboxKind::Death, 10, None))
        .await
        .expect("claim")
        .is_empty());

    // A retry in an hour, well within the maximum age.
    let retry = OutboxOutcome::Retry {
        delay: Duration::from_secs(3600),
        max_age: Duration::from_secs(86_400),
        error: "503 Service Unavailable".into(),
    };
    let settled = h
        .storage
        .outbox_settle(&OutboxSettleParams {
            claims: vec![first[0].claim()],
            outcome: retry.clone(),
            now: None,
        })
        .await
        .expect("settle");
    assert_eq!(settled, 1);
    let row = &list(&*h.storage, Some(task.id)).await[0];
    assert_eq!(row.status, OutboxStatus::Pending);
    assert_eq!(row.last_error.as_deref(), Some("503 Service Unavailable"));
    assert!(row.next_attempt_at >= first[0].created_at + chrono::Duration::minutes(59));
    let now = h.storage.now().await.expect("now");
    assert!(
        h.storage
            .outbox_claim(&claim(OutboxKind::Callback, 10, None))
            .await
            .expect("claim")
            .is_empty(),
        "not due before its retry time"
    );

    // Due an hour later: the second claim, same delivery id.
    let later = now + chrono::Duration::minutes(61);
    let second = h
        .storage
        .outbox_claim(&claim(OutboxKind::Callback, 10, Some(later)))
        .await
        .expect("claim");
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].attempts, 2);
    assert_eq!(second[0].delivery_id, delivery_id);
    // The first claim is stale: settling it changes nothing.
    let stale = h
        .storage
        .outbox_settle(&OutboxSettleParams {
            claims: vec![first[0].claim()],
            outcome: OutboxOutcome::Delivered,
            now: Some(later),
        })
        .await
        .expect("settle");
    assert_eq!(stale, 0);
    let settled = h
        .storage
        .outbox_settle(&OutboxSettleParams {
            claims: vec![second[0].claim()],
            outcome: OutboxOutcome::Delivered,
            now: Some(later),
        })
        .await
        .expect("settle");
    assert_eq!(settled, 1);
    let row = &list(&*h.storage, Some(task.id)).await[0];
    assert_eq!(row.status, OutboxStatus::Delivered);
    assert!(row.settled_at.is_some());
    // Settling a settled row again changes nothing.
    assert_eq!(
        h.storage
            .outbox_settle(&OutboxSettleParams {
                claims: vec![second[0].claim()],
                outcome: retry,
                now: Some(later),
            })
            .await
            .expect("settle"),
        0
    );
    assert!(h
        .storage
        .outbox_claim(&claim(
            OutboxKind::Callback,
            10,
            Some(later + chrono::Duration::days(1))
        ))
        .await
        .expect("claim")
        .is_empty());

    // Pruning keeps rows settled recently, deletes older ones.
    let kept = h
        .storage
        .outbox_prune(&OutboxPruneParams {
            older_than: Duration::from_secs(86_400),
            sender_grace: NO_SENDER_GRACE,
            now: Some(later),
        })
        .await
        .expect("prune");
    assert_eq!(kept, 0);
    let pruned = h
        .storage
        .outbox_prune(&OutboxPruneParams {
            older_than: Duration::from_secs(86_400),
            sender_grace: NO_SENDER_GRACE,
            now: Some(later + chrono::Duration::days(2)),
        })
        .await
        .expect("prune");
    assert_eq!(pruned, 1);
    assert!(list(&*h.storage, Some(task.id)).await.is_empty());
    // A pending row nobody took within the retention goes too; a younger one stays.
    let unsent = h.task(TaskOpts::default()).await;
    finish_with(h, &unsent, Some(FailNext::Dead)).await;
    let created = list(&*h.storage, Some(unsent.id)).await[0].created_at;
    let kept = h
        .storage
        .outbox_prune(&OutboxPruneParams {
            older_than: Duration::from_secs(86_400),
            sender_grace: NO_SENDER_GRACE,
            now: Some(created + chrono::Duration::hours(23)),
        })
        .await
        .expect("prune");
    assert_eq!(kept, 0);
    assert_eq!(list(&*h.storage, Some(unsent.id)).await.len(), 1);
    let pruned = h
        .storage
        .outbox_prune(&OutboxPruneParams {
            older_than: Duration::from_secs(86_400),
            sender_grace: NO_SENDER_GRACE,
            now: Some(created + chrono::Duration::hours(25)),
        })
        .await
        .expect("prune");
    assert!(pruned >= 1, "{pruned}");
    assert!(list(&*h.storage, Some(unsent.id)).await.is_empty());

    // Invalid bounds are refused.
    for limit in [0, crate::OUTBOX_BATCH_MAX + 1] {
        let err = h
            .storage
            .outbox_claim(&claim(OutboxKind::Callback, limit, None))
            .await
            .expect_err("limit out of range");
        assert!(matches!(err, StorageError::Invalid(_)), "{err:?}");
    }
}

pub async fn an_outbox_retry_past_its_maximum_age_expires(h: &Harness) {
    senders_run(h).await;
    let task = h.task(TaskOpts::default()).await;
    finish_with(h, &task, Some(FailNext::Dead)).await;
    let claimed = h
        .storage
        .outbox_claim(&claim(OutboxKind::Death, 10, None))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1);
    let settled = h
        .storage
        .outbox_settle(&OutboxSettleParams {
            claims: vec![claimed[0].claim()],
            outcome: OutboxOutcome::Retry {
                delay: Duration::from_secs(120),
                max_age: Duration::from_secs(60),
                error: "connection refused".into(),
            },
            now: None,
        })
        .await
        .expect("settle");
    assert_eq!(settled, 1);
    let row = &list(&*h.storage, Some(task.id)).await[0];
    assert_eq!(row.status, OutboxStatus::Expired, "{row:?}");
    assert!(row.settled_at.is_some());
    assert_eq!(row.last_error.as_deref(), Some("connection refused"));
}

pub async fn concurrent_outbox_claimers_take_each_row_once(h: &Harness) {
    senders_run(h).await;
    const N: usize = 60;
    let mut ids = HashSet::new();
    for _ in 0..N {
        let task = h
            .task(TaskOpts {
                max_attempts: 1,
                ..Default::default()
            })
            .await;
        ids.insert(task.id);
    }
    // Kill them all.
    loop {
        let claimed = h.claim("w1", 50, None).await;
        if claimed.is_empty() {
            break;
        }
        for task in &claimed {
            assert!(h
                .storage
                .task_fail_if_leased(&TaskFailParams {
                    lease: lease(task),
                    error: "boom".into(),
                    next: FailNext::Dead,
                    now: None,
                })
                .await
                .expect("fail"));
        }
    }
    let other = h.reopen().await;
    let mut claimers = Vec::new();
    for storage in [h.storage.clone(), other.clone(), h.storage.clone(), other] {
        claimers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let rows = storage
                    .outbox_claim(&claim(OutboxKind::Death, 7, None))
                    .await
                    .expect("claim");
                if rows.is_empty() {
                    return mine;
                }
                mine.extend(rows);
            }
        }));
    }
    let mut seen = HashSet::new();
    for claimer in claimers {
        for row in claimer.await.expect("claimer") {
            assert!(seen.insert(row.id), "row {} claimed twice", row.id);
            assert_eq!(row.attempts, 1);
            assert_eq!(row.status, OutboxStatus::Pending);
        }
    }
    let tasks: HashSet<TaskId> = list(&*h.storage, None)
        .await
        .into_iter()
        .filter(|r| r.kind == OutboxKind::Death)
        .map(|r| r.task_id)
        .collect();
    assert!(ids.is_subset(&tasks));
    assert_eq!(seen.len(), tasks.len());
}

pub async fn outbox_stats_count_pending_rows_per_kind_with_the_oldest_age(h: &Harness) {
    senders_run(h).await;
    let stats = |now: Option<DateTime<Utc>>| async move {
        h.storage
            .outbox_stats(&OutboxStatsParams { now })
            .await
            .expect("outbox stats")
    };
    assert!(stats(None).await.is_empty(), "nothing pending yet");
    for _ in 0..3 {
        let task = h
            .task(TaskOpts {
                callback_url: Some(CALLBACK.into()),
                ..Default::default()
            })
            .await;
        finish_with(h, &task, None).await;
    }
    let dead = h.task(TaskOpts::default()).await;
    finish_with(h, &dead, Some(FailNext::Dead)).await;
    let rows = list(&*h.storage, None).await;
    let oldest = rows.iter().map(|r| r.created_at).min().expect("rows");
    let later = oldest + chrono::Duration::seconds(90);
    let now = stats(Some(later)).await;
    let summary: Vec<(OutboxKind, u64)> = now.iter().map(|s| (s.kind, s.pending)).collect();
    assert_eq!(
        summary,
        [(OutboxKind::Callback, 3), (OutboxKind::Death, 1)],
        "{now:?}"
    );
    let callback: &OutboxStat = &now[0];
    assert!(
        callback.oldest_age >= Duration::from_secs(89)
            && callback.oldest_age <= Duration::from_secs(91),
        "age from the given clock: {:?}",
        callback.oldest_age
    );
    // Delivered rows are no longer pending; a claimed row still is.
    let claimed = h
        .storage
        .outbox_claim(&claim(OutboxKind::Callback, 2, None))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 2);
    let settled = h
        .storage
        .outbox_settle(&OutboxSettleParams {
            claims: vec![claimed[0].claim()],
            outcome: OutboxOutcome::Delivered,
            now: None,
        })
        .await
        .expect("settle");
    assert_eq!(settled, 1);
    let now = stats(None).await;
    assert_eq!(now[0].kind, OutboxKind::Callback);
    assert_eq!(now[0].pending, 2, "{now:?}");
}

pub async fn a_death_writes_its_row_only_while_a_death_sender_is_recorded(h: &Harness) {
    let stats = || async {
        h.storage
            .outbox_stats(&OutboxStatsParams::default())
            .await
            .expect("outbox stats")
    };
    // No sender recorded: a death writes no death row (nothing would send it); the
    // callback the task asked for is stored, but not counted as waiting.
    let unheard = h
        .task(TaskOpts {
            callback_url: Some(CALLBACK.into()),
            ..Default::default()
        })
        .await;
    finish_with(h, &unheard, Some(FailNext::Dead)).await;
    let rows = list(&*h.storage, Some(unheard.id)).await;
    let kinds: Vec<OutboxKind> = rows.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, [OutboxKind::Callback], "{rows:?}");
    assert!(stats().await.is_empty(), "{:?}", stats().await);

    // A death sender recorded: the next death is written, and counted.
    record(h, &[OutboxKind::Death, OutboxKind::Alert], None).await;
    let heard = h.task(TaskOpts::default()).await;
    finish_with(h, &heard, Some(FailNext::Dead)).await;
    let rows = list(&*h.storage, Some(heard.id)).await;
    let kinds: Vec<OutboxKind> = rows.iter().map(|r| r.kind).collect();
    assert_eq!(kinds, [OutboxKind::Death], "{rows:?}");
    let counted: Vec<(OutboxKind, u64)> =
        stats().await.iter().map(|s| (s.kind, s.pending)).collect();
    assert_eq!(
        counted,
        [(OutboxKind::Death, 1)],
        "the unsent callback is not counted"
    );
    // Recording again changes nothing but the time.
    record(h, &[OutboxKind::Death], None).await;
    assert_eq!(list(&*h.storage, None).await.len(), 2);
}

pub async fn the_pruner_forgets_a_silent_sender_and_expires_what_nothing_can_send(h: &Harness) {
    let grace = Duration::from_secs(3600);
    senders_run(h).await;
    let task = h
        .task(TaskOpts {
            callback_url: Some(CALLBACK.into()),
            ..Default::default()
        })
        .await;
    finish_with(h, &task, Some(FailNext::Dead)).await;
    let created = list(&*h.storage, Some(task.id)).await[0].created_at;
    let prune = |at: DateTime<Utc>| async move {
        h.storage
            .outbox_prune(&OutboxPruneParams {
                older_than: Duration::from_secs(7 * 86_400),
                sender_grace: grace,
                now: Some(at),
            })
            .await
            .expect("prune")
    };
    // Within the grace: nothing changes.
    assert_eq!(prune(created + chrono::Duration::minutes(30)).await, 0);
    // The callback sender keeps recording itself; the death sender falls silent.
    record(
        h,
        &[OutboxKind::Callback],
        Some(created + chrono::Duration::minutes(61)),
    )
    .await;
    let at = created + chrono::Duration::minutes(90);
    assert_eq!(prune(at).await, 1, "the death row is expired");
    let rows = list(&*h.storage, Some(task.id)).await;
    let death = rows
        .iter()
        .find(|r| r.kind == OutboxKind::Death)
        .expect("death row");
    assert_eq!(death.status, OutboxStatus::Expired, "{death:?}");
    assert!(death.settled_at.is_some());
    assert!(
        death
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("no sender")),
        "{death:?}"
    );
    let callback = rows
        .iter()
        .find(|r| r.kind == OutboxKind::Callback)
        .expect("callback row");
    assert_eq!(
        callback.status,
        OutboxStatus::Pending,
        "a recorded sender's row stays"
    );
    let counted: Vec<OutboxKind> = h
        .storage
        .outbox_stats(&OutboxStatsParams { now: Some(at) })
        .await
        .expect("stats")
        .iter()
        .map(|s| s.kind)
        .collect();
    assert_eq!(counted, [OutboxKind::Callback]);
    // The forgotten sender's kind is no longer written.
    let later = h.task(TaskOpts::default()).await;
    finish_with(h, &later, Some(FailNext::Dead)).await;
    assert!(list(&*h.storage, Some(later.id)).await.is_empty());
}
