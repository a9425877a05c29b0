//! Conformance cases for task events: the rows a covered task's transitions write in
//! their own transactions, the sequencer's lease and positions, relay cursors, listing
//! with filters, and pruning.
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tenax_core::{CompensationState, TaskRecord, TaskStatus};

use super::{Harness, TaskOpts};
use crate::{
    EventCursorParams, EventKind, EventLease, EventLeaseParams, EventListParams, EventPage,
    EventPruneParams, EventRecord, EventRuleParams, EventSequenceParams, FailNext, Lease, Storage,
    StorageError, TaskActionParams, TaskCompleteParams, TaskFailParams, TaskRef, SEQUENCER_LEASE,
};

fn lease_of(task: &TaskRecord) -> Lease {
    Lease {
        id: task.id,
        epoch: task.lease_epoch,
    }
}

async fn rule(storage: &dyn Storage, queue: Option<&str>, command_type: Option<&str>, on: bool) {
    storage
        .event_rule_set(&EventRuleParams {
            queue: queue.map(str::to_owned),
            command_type: command_type.map(str::to_owned),
            enabled: on,
            now: None,
        })
        .await
        .expect("event rule");
}

async fn take_lease(
    storage: &dyn Storage,
    name: &str,
    holder: &str,
    now: Option<DateTime<Utc>>,
) -> Option<EventLease> {
    storage
        .event_lease(&EventLeaseParams {
            name: name.into(),
            holder: holder.into(),
            ttl: Duration::from_secs(30),
            now,
        })
        .await
        .expect("event lease")
}

/// Sequence everything committed so far under a sequencer lease of holder `seq-test`.
async fn sequence_all(storage: &dyn Storage) {
    let lease = take_lease(storage, SEQUENCER_LEASE, "seq-test", None)
        .await
        .expect("the sequencer lease is free");
    loop {
        let n = storage
            .event_sequence(&EventSequenceParams {
                lease: lease.clone(),
                limit: 500,
                now: None,
            })
            .await
            .expect("sequence")
            .expect("the lease is held");
        if n == 0 {
            break;
        }
    }
}

async fn page(storage: &dyn Storage, params: EventListParams) -> EventPage {
    storage.event_list(&params).await.expect("event list")
}

/// Every sequenced event after `after`, following `scanned_through`.
async fn all_after(storage: &dyn Storage, after: i64, filter: EventListParams) -> Vec<EventRecord> {
    let mut out = Vec::new();
    let mut after = after;
    loop {
        let p = page(
            storage,
            EventListParams {
                after,
                limit: 1000,
                ..filter.clone()
            },
        )
        .await;
        out.extend(p.events);
        if p.scanned_through >= p.head {
            return out;
        }
        assert!(p.scanned_through > after, "a listing always moves on");
        after = p.scanned_through;
    }
}

fn kinds_of(events: &[EventRecord], task: &TaskRecord) -> Vec<EventKind> {
    events
        .iter()
        .filter(|e| e.task_id == task.id)
        .map(|e| e.event)
        .collect()
}

async fn claim_one(h: &Harness, queue: &str, now: Option<DateTime<Utc>>) -> TaskRecord {
    let mut params = super::claim_params("w1", 1, now);
    params.queues = vec![queue.to_owned()];
    let mut claimed = h.storage.task_claim_batch(&params).await.expect("claim");
    assert_eq!(claimed.len(), 1, "one task due in {queue}");
    claimed.remove(0)
}

async fn complete(h: &Harness, task: &TaskRecord, compensation: CompensationState) {
    assert!(h
        .storage
        .task_complete_if_leased(&TaskCompleteParams {
            lease: lease_of(task),
            result: Some("{\"ok\":true}".into()),
            compensation,
            now: None,
        })
        .await
        .expect("complete"));
}

async fn fail(h: &Harness, task: &TaskRecord, next: FailNext) {
    assert!(h
        .storage
        .task_fail_if_leased(&TaskFailParams {
            lease: lease_of(task),
            error: "boom".into(),
            next,
            now: None,
        })
        .await
        .expect("fail"));
}

pub async fn task_events_are_written_for_covered_tasks_in_the_transition_transaction(h: &Harness) {
    let s = &*h.storage;
    // No rule: a whole life writes nothing.
    let quiet = h
        .task(TaskOpts {
            queue: "ev".into(),
            ..Default::default()
        })
        .await;
    let t = claim_one(h, "ev", None).await;
    complete(h, &t, CompensationState::None).await;
    sequence_all(s).await;
    assert!(kinds_of(&all_after(s, 0, EventListParams::default()).await, &quiet).is_empty());

    // A rule for the queue: every transition of a task inserted afterwards.
    rule(s, Some("ev"), None, true).await;
    let covered = h
        .task(TaskOpts {
            queue: "ev".into(),
            ..Default::default()
        })
        .await;
    let other_queue = h
        .task(TaskOpts {
            queue: "elsewhere".into(),
            run_at: crate::RunAt::In(Duration::from_secs(3600)),
            ..Default::default()
        })
        .await;
    let t = claim_one(h, "ev", None).await;
    fail(h, &t, FailNext::Retry(Duration::ZERO)).await;
    let now = s.now().await.unwrap();
    let t = claim_one(h, "ev", Some(now + chrono::Duration::seconds(1))).await;
    complete(h, &t, CompensationState::None).await;

    // Cancelled, and dead then compensated.
    let cancelled = h
        .task(TaskOpts {
            queue: "ev".into(),
            run_at: crate::RunAt::In(Duration::from_secs(3600)),
            ..Default::default()
        })
        .await;
    s.task_cancel(&TaskActionParams {
        task: TaskRef::Id(cancelled.id),
        now: None,
    })
    .await
    .expect("cancel");
    let dies = h
        .task(TaskOpts {
            queue: "ev".into(),
            ..Default::default()
        })
        .await;
    let t = claim_one(h, "ev", None).await;
    assert_eq!(t.id, dies.id);
    fail(h, &t, FailNext::Dead).await;
    // The compensation runs in the same queue, so it is covered too.
    let c = claim_one(h, "ev", None).await;
    assert_ne!(c.id, dies.id);
    complete(h, &c, CompensationState::Succeeded).await;

    sequence_all(s).await;
    let events = all_after(s, 0, EventListParams::default()).await;
    use EventKind::*;
    assert_eq!(
        kinds_of(&events, &covered),
        vec![Enqueued, Started, Retried, Started, Succeeded]
    );
    assert!(kinds_of(&events, &other_queue).is_empty(), "another queue");
    assert_eq!(kinds_of(&events, &cancelled), vec![Enqueued, Cancelled]);
    assert_eq!(
        kinds_of(&events, &dies),
        vec![Enqueued, Started, Dead, Compensated]
    );
    assert_eq!(kinds_of(&events, &c), vec![Enqueued, Started, Succeeded]);

    // Positions are consecutive from 1, ids unique, the task snapshot as documented.
    let seqs: Vec<i64> = events.iter().map(|e| e.seq.expect("sequenced")).collect();
    assert_eq!(seqs, (1..=events.len() as i64).collect::<Vec<_>>());
    let ids: HashSet<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
    assert_eq!(ids.len(), events.len(), "event ids are unique");
    let done = events
        .iter()
        .find(|e| e.task_id == covered.id && e.event == Succeeded)
        .unwrap();
    let task: serde_json::Value = serde_json::from_str(&done.task).expect("JSON");
    assert_eq!(task["id"], covered.id.0);
    assert_eq!(task["task_no"], covered.task_no.as_str());
    assert_eq!(task["status"], "succeeded");
    assert_eq!(task["attempt"], 2);
    assert_eq!(task["result"], "{\"ok\":true}");
    assert_eq!(done.status, "succeeded");
    assert_eq!(done.queue, "ev");
    let retried = events
        .iter()
        .find(|e| e.task_id == covered.id && e.event == Retried)
        .unwrap();
    let task: serde_json::Value = serde_json::from_str(&retried.task).expect("JSON");
    assert_eq!(task["error"], "boom");
    assert_eq!(task["result"], serde_json::Value::Null);
    let compensated = events
        .iter()
        .find(|e| e.task_id == dies.id && e.event == Compensated)
        .unwrap();
    let task: serde_json::Value = serde_json::from_str(&compensated.task).expect("JSON");
    assert_eq!(task["compensation"], "succeeded");

    // A rule on the command type covers any queue; removing rules stops new tasks only.
    rule(s, Some("ev"), None, false).await;
    rule(s, None, Some("TypedEvents"), true).await;
    let typed = h
        .task(TaskOpts {
            queue: "elsewhere".into(),
            command_type: "TypedEvents".into(),
            ..Default::default()
        })
        .await;
    let untyped = h
        .task(TaskOpts {
            queue: "ev".into(),
            run_at: crate::RunAt::In(Duration::from_secs(3600)),
            ..Default::default()
        })
        .await;
    rule(s, None, Some("TypedEvents"), false).await;
    s.task_cancel(&TaskActionParams {
        task: TaskRef::Id(typed.id),
        now: None,
    })
    .await
    .expect("cancel");
    sequence_all(s).await;
    let events = all_after(s, 0, EventListParams::default()).await;
    assert_eq!(kinds_of(&events, &typed), vec![Enqueued, Cancelled]);
    assert!(kinds_of(&events, &untyped).is_empty());
    assert!(s.event_rule_list().await.unwrap().is_empty());
}

pub async fn event_listing_filters_and_resumes_by_position(h: &Harness) {
    let s = &*h.storage;
    rule(s, None, None, true).await;
    let rules = s.event_rule_list().await.unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        (rules[0].queue.clone(), rules[0].command_type.clone()),
        (None, None)
    );
    for i in 0..6 {
        h.task(TaskOpts {
            queue: if i % 2 == 0 { "a" } else { "b" }.into(),
            ..Default::default()
        })
        .await;
    }
    let t = claim_one(h, "a", None).await;
    complete(h, &t, CompensationState::None).await;
    // Unsequenced events are not listed yet.
    assert!(page(
        s,
        EventListParams {
            limit: 100,
            ..Default::default()
        }
    )
    .await
    .events
    .is_empty());
    sequence_all(s).await;
    let all = all_after(s, 0, EventListParams::default()).await;
    assert_eq!(all.len(), 8);
    let only_a = all_after(
        s,
        0,
        EventListParams {
            queue: Some("a".into()),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(only_a.len(), 5);
    assert!(only_a.iter().all(|e| e.queue == "a"));
    let finished = all_after(
        s,
        0,
        EventListParams {
            statuses: vec![TaskStatus::Succeeded],
            ..Default::default()
        },
    )
    .await;
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0].task_id, t.id);
    let started = all_after(
        s,
        0,
        EventListParams {
            events: vec![EventKind::Started],
            command_type: Some(TaskOpts::TYPE.into()),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(started.len(), 1);
    let none = all_after(
        s,
        0,
        EventListParams {
            command_type: Some("Other".into()),
            ..Default::default()
        },
    )
    .await;
    assert!(none.is_empty());
    // Small pages resume exactly after the last position seen.
    let mut seen = Vec::new();
    let mut after = 0;
    loop {
        let p = page(
            s,
            EventListParams {
                after,
                limit: 3,
                ..Default::default()
            },
        )
        .await;
        assert_eq!(p.head, 8);
        if p.events.is_empty() {
            break;
        }
        seen.extend(p.events.iter().map(|e| e.seq.unwrap()));
        after = p.scanned_through;
    }
    assert_eq!(seen, (1..=8).collect::<Vec<_>>());
}

pub async fn the_event_leases_have_one_holder_and_fence_a_stale_one(h: &Harness) {
    let s = &*h.storage;
    let a = take_lease(s, SEQUENCER_LEASE, "node-a", None)
        .await
        .expect("free");
    assert!(take_lease(s, SEQUENCER_LEASE, "node-b", None)
        .await
        .is_none());
    let renewed = take_lease(s, SEQUENCER_LEASE, "node-a", None)
        .await
        .expect("renew");
    assert_eq!(renewed.epoch, a.epoch, "a renewal keeps the epoch");
    // After the lease lapses, another node takes it under a new epoch.
    let later = a.expires_at + chrono::Duration::seconds(1);
    let b = take_lease(s, SEQUENCER_LEASE, "node-b", Some(later))
        .await
        .expect("lapsed");
    assert!(b.epoch > a.epoch);
    rule(s, None, None, true).await;
    h.task(TaskOpts::default()).await;
    let stale = s
        .event_sequence(&EventSequenceParams {
            lease: a.clone(),
            limit: 10,
            now: Some(later),
        })
        .await
        .unwrap();
    assert_eq!(stale, None, "the stale holder sequences nothing");
    assert_eq!(
        page(
            s,
            EventListParams {
                limit: 10,
                ..Default::default()
            }
        )
        .await
        .head,
        0
    );
    let fresh = s
        .event_sequence(&EventSequenceParams {
            lease: b.clone(),
            limit: 10,
            now: Some(later),
        })
        .await
        .unwrap();
    assert_eq!(fresh, Some(1));

    // A relay's cursor moves only under its lease and never backwards.
    let r1 = take_lease(s, "relay:nats", "node-a", None).await.unwrap();
    assert_eq!(r1.last_seq, 0);
    let advance = |lease: &EventLease, to: i64, now: Option<DateTime<Utc>>| EventCursorParams {
        lease: lease.clone(),
        last_seq: to,
        now,
    };
    assert!(s
        .event_cursor_advance(&advance(&r1, 5, None))
        .await
        .unwrap());
    assert!(s
        .event_cursor_advance(&advance(&r1, 3, None))
        .await
        .unwrap());
    let relapsed = r1.expires_at + chrono::Duration::seconds(1);
    let r2 = take_lease(s, "relay:nats", "node-b", Some(relapsed))
        .await
        .unwrap();
    assert_eq!(
        r2.last_seq, 5,
        "the new holder resumes where the old one was"
    );
    assert!(!s
        .event_cursor_advance(&advance(&r1, 9, Some(relapsed)))
        .await
        .unwrap());
    assert!(s
        .event_cursor_advance(&advance(&r2, 6, Some(relapsed)))
        .await
        .unwrap());

    // Concurrent takers of a free lease: exactly one gets it.
    let mut joins = Vec::new();
    for i in 0..8 {
        let storage = Arc::clone(&h.storage);
        joins.push(tokio::spawn(async move {
            take_lease(&*storage, "relay:race", &format!("node-{i}"), None)
                .await
                .is_some()
        }));
    }
    let mut winners = 0;
    for j in joins {
        winners += usize::from(j.await.unwrap());
    }
    assert_eq!(winners, 1);
}

pub async fn concurrent_transitions_are_sequenced_gapless_and_in_order_per_task(h: &Harness) {
    rule(&*h.storage, None, None, true).await;
    let tasks = 60;
    for _ in 0..tasks {
        h.task(TaskOpts::default()).await;
    }
    // Two workers finish the tasks while the sequencer runs alongside.
    let mut workers = Vec::new();
    for w in 0..2 {
        let storage = Arc::clone(&h.storage);
        workers.push(tokio::spawn(async move {
            loop {
                let claimed = storage
                    .task_claim_batch(&super::claim_params(&format!("w{w}"), 3, None))
                    .await
                    .expect("claim");
                if claimed.is_empty() {
                    return;
                }
                for t in claimed {
                    storage
                        .task_complete_if_leased(&TaskCompleteParams {
                            lease: lease_of(&t),
                            result: None,
                            compensation: CompensationState::None,
                            now: None,
                        })
                        .await
                        .expect("complete");
                }
            }
        }));
    }
    let storage = Arc::clone(&h.storage);
    let sequencer = tokio::spawn(async move {
        let lease = take_lease(&*storage, SEQUENCER_LEASE, "seq", None)
            .await
            .unwrap();
        for _ in 0..50 {
            storage
                .event_sequence(&EventSequenceParams {
                    lease: lease.clone(),
                    limit: 7,
                    now: None,
                })
                .await
                .expect("sequence")
                .expect("held");
            tokio::task::yield_now().await;
        }
    });
    for w in workers {
        w.await.unwrap();
    }
    sequencer.await.unwrap();
    let lease = take_lease(&*h.storage, SEQUENCER_LEASE, "seq", None)
        .await
        .unwrap();
    while h
        .storage
        .event_sequence(&EventSequenceParams {
            lease: lease.clone(),
            limit: 100,
            now: None,
        })
        .await
        .unwrap()
        .unwrap()
        > 0
    {}
    let events = all_after(&*h.storage, 0, EventListParams::default()).await;
    assert_eq!(events.len(), tasks * 3);
    let seqs: Vec<i64> = events.iter().map(|e| e.seq.unwrap()).collect();
    assert_eq!(seqs, (1..=(tasks as i64) * 3).collect::<Vec<_>>());
    let mut per_task: HashMap<i64, Vec<EventKind>> = HashMap::new();
    for e in &events {
        per_task.entry(e.task_id.0).or_default().push(e.event);
    }
    assert_eq!(per_task.len(), tasks);
    for (task, kinds) in per_task {
        assert_eq!(
            kinds,
            vec![
                EventKind::Enqueued,
                EventKind::Started,
                EventKind::Succeeded
            ],
            "task {task}"
        );
    }
}

pub async fn pruning_removes_a_delivered_prefix_and_records_it(h: &Harness) {
    let s = &*h.storage;
    rule(s, None, None, true).await;
    for _ in 0..10 {
        h.task(TaskOpts::default()).await;
    }
    sequence_all(s).await;
    let relay = take_lease(s, "relay:test", "node-a", None).await.unwrap();
    let future = Some(s.now().await.unwrap() + chrono::Duration::hours(2));
    let prune = |relays: Vec<String>, older: u64| EventPruneParams {
        older_than: Duration::from_secs(older),
        relays,
        now: future,
    };
    // Nothing old enough; then a relay that never delivered, or has no row, holds all.
    assert_eq!(
        s.event_prune(&prune(vec!["relay:test".into()], 86_400))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        s.event_prune(&prune(vec!["relay:test".into()], 60))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        s.event_prune(&prune(vec!["relay:none".into()], 60))
            .await
            .unwrap(),
        0
    );
    assert!(s
        .event_cursor_advance(&EventCursorParams {
            lease: relay,
            last_seq: 4,
            now: None,
        })
        .await
        .unwrap());
    assert_eq!(
        s.event_prune(&prune(vec!["relay:test".into()], 60))
            .await
            .unwrap(),
        4
    );
    let p = page(
        s,
        EventListParams {
            limit: 100,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(p.pruned_through, 4);
    assert_eq!(p.events.first().and_then(|e| e.seq), Some(5));
    // Without relays, the age alone decides.
    assert_eq!(s.event_prune(&prune(Vec::new(), 60)).await.unwrap(), 6);
    let p = page(
        s,
        EventListParams {
            limit: 100,
            ..Default::default()
        },
    )
    .await;
    assert_eq!((p.pruned_through, p.head), (10, 10));
    assert!(p.events.is_empty());
    // New events continue after the pruned positions.
    h.task(TaskOpts::default()).await;
    sequence_all(s).await;
    let p = page(
        s,
        EventListParams {
            after: 10,
            limit: 100,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        p.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![Some(11)]
    );
}

pub async fn invalid_event_inputs_are_refused_and_change_nothing(h: &Harness) {
    let s = &*h.storage;
    let invalid = |r: crate::Result<()>| matches!(r, Err(StorageError::Invalid(_)));
    assert!(invalid(
        s.event_rule_set(&EventRuleParams {
            queue: Some("bad queue".into()),
            command_type: None,
            enabled: true,
            now: None,
        })
        .await
        .map(|_| ())
    ));
    assert!(invalid(
        s.event_rule_set(&EventRuleParams {
            queue: None,
            command_type: Some(String::new()),
            enabled: true,
            now: None,
        })
        .await
        .map(|_| ())
    ));
    assert!(s.event_rule_list().await.unwrap().is_empty());
    for name in ["", "Upper", "with space", &"x".repeat(65)] {
        assert!(invalid(
            s.event_lease(&EventLeaseParams {
                name: name.into(),
                holder: "h".into(),
                ttl: Duration::from_secs(1),
                now: None,
            })
            .await
            .map(|_| ())
        ));
    }
    assert!(invalid(
        s.event_lease(&EventLeaseParams {
            name: "relay:x".into(),
            holder: "h".into(),
            ttl: Duration::ZERO,
            now: None,
        })
        .await
        .map(|_| ())
    ));
    let relay = take_lease(s, "relay:x", "h", None).await.unwrap();
    assert!(invalid(
        s.event_sequence(&EventSequenceParams {
            lease: relay.clone(),
            limit: 10,
            now: None,
        })
        .await
        .map(|_| ())
    ));
    assert!(invalid(
        s.event_cursor_advance(&EventCursorParams {
            lease: relay,
            last_seq: -1,
            now: None,
        })
        .await
        .map(|_| ())
    ));
    for limit in [0, crate::EVENT_BATCH_MAX + 1] {
        assert!(invalid(
            s.event_list(&EventListParams {
                limit,
                ..Default::default()
            })
            .await
            .map(|_| ())
        ));
    }
    assert!(invalid(
        s.event_list(&EventListParams {
            after: -1,
            limit: 1,
            ..Default::default()
        })
        .await
        .map(|_| ())
    ));
}
