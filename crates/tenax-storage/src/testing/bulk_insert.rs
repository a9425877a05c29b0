//! Conformance cases for bulk enqueue: many tasks in one call, idempotent per
//! `task_no`, answered per item.
use std::collections::HashSet;
use std::time::Duration;

use tenax_core::{Priority, TaskNo, TaskStatus};

use super::{Harness, TaskOpts};
use crate::{RunAt, StorageError, TaskInsertManyParams, TaskInsertOutcome, TaskInsertParams};

/// A task of the factory's type numbered `no` with payload `{"i": i}`.
pub fn numbered(no: &str, i: usize) -> TaskInsertParams {
    TaskInsertParams {
        task_no: TaskNo::new(no).unwrap(),
        command_type: TaskOpts::TYPE.to_owned(),
        payload: format!(r#"{{"i":{i}}}"#),
        payload_version: 1,
        queue: "default".to_owned(),
        priority: Priority::DEFAULT,
        max_attempts: 3,
        timeout: Duration::from_secs(60),
        run_at: RunAt::Now,
        now: None,
        concurrency_key: None,
        concurrency_limit: 1,
        callback_url: None,
        created_by: None,
    }
}

fn many(tasks: Vec<TaskInsertParams>) -> TaskInsertManyParams {
    TaskInsertManyParams { tasks, now: None }
}

pub async fn a_bulk_insert_of_ten_thousand_reports_new_existing_and_conflicts(h: &Harness) {
    // 1,000 numbers exist before: 990 with the payload the bulk call repeats, 10 with
    // another payload (conflicts).
    let before: Vec<TaskInsertParams> = (0..10_000)
        .step_by(10)
        .map(|i| {
            let mut task = numbered(&format!("bulk-{i}"), i);
            if i % 1000 == 0 {
                task.payload = format!(r#"{{"i":{i},"old":true}}"#);
            }
            task
        })
        .collect();
    let first = h.storage.task_insert_many(&many(before)).await.unwrap();
    assert_eq!(first.len(), 1000);
    assert!(first.iter().all(TaskInsertOutcome::created));

    let mut tasks: Vec<TaskInsertParams> = (0..10_000)
        .map(|i| numbered(&format!("bulk-{i}"), i))
        .collect();
    // The same new number twice in one call is one task.
    tasks.push(numbered("bulk-1", 1));
    let out = h.storage.task_insert_many(&many(tasks)).await.unwrap();
    assert_eq!(out.len(), 10_001);
    for (i, outcome) in out.iter().take(10_000).enumerate() {
        assert_eq!(outcome.task().task_no.as_str(), format!("bulk-{i}"));
        match outcome {
            TaskInsertOutcome::Created(task) => {
                assert_ne!(i % 10, 0, "bulk-{i} existed before");
                assert_eq!(task.status, TaskStatus::Pending);
                assert_eq!(task.payload, format!(r#"{{"i":{i}}}"#));
            }
            TaskInsertOutcome::Existing(task) => {
                assert!(i % 10 == 0 && i % 1000 != 0, "bulk-{i} reported existing");
                assert_eq!(task.id, first[i / 10].task().id);
            }
            TaskInsertOutcome::Conflict { existing, field } => {
                assert_eq!(i % 1000, 0, "bulk-{i} reported conflicting");
                assert_eq!(*field, "payload");
                assert_eq!(existing.payload, format!(r#"{{"i":{i},"old":true}}"#));
            }
        }
    }
    let count = |pred: fn(&TaskInsertOutcome) -> bool| out.iter().filter(|o| pred(o)).count();
    assert_eq!(count(|o| matches!(o, TaskInsertOutcome::Created(_))), 9_000);
    assert_eq!(count(|o| matches!(o, TaskInsertOutcome::Existing(_))), 991);
    assert_eq!(
        count(|o| matches!(o, TaskInsertOutcome::Conflict { .. })),
        10
    );
    match &out[10_000] {
        TaskInsertOutcome::Existing(task) => assert_eq!(task.id, out[1].task().id),
        other => panic!("the repeated number is {other:?}"),
    }
    let ids: HashSet<_> = out.iter().map(|o| o.task().id).collect();
    assert_eq!(ids.len(), 10_000);
    let stats = h.storage.stats().await.unwrap();
    assert_eq!(stats.total(), 10_000);
    assert_eq!(stats.count(TaskStatus::Pending), 10_000);
    // A single insert of a number the bulk call made is that task.
    let again = h.storage.task_insert(&numbered("bulk-5", 5)).await.unwrap();
    assert!(!again.created);
    assert_eq!(again.task.id, out[5].task().id);
}

pub async fn an_invalid_task_in_a_bulk_insert_inserts_nothing(h: &Harness) {
    let mut tasks: Vec<TaskInsertParams> =
        (0..100).map(|i| numbered(&format!("ok-{i}"), i)).collect();
    tasks[57].payload = "not json".to_owned();
    let err = h.storage.task_insert_many(&many(tasks)).await.unwrap_err();
    match err {
        StorageError::Invalid(invalid) => {
            assert_eq!(invalid.field, "payload");
            assert!(invalid.reason.contains("task 57"), "{}", invalid.reason);
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert_eq!(h.storage.stats().await.unwrap().total(), 0);
    assert!(h
        .storage
        .task_insert_many(&many(Vec::new()))
        .await
        .unwrap()
        .is_empty());
}

/// `task_insert_many_if` commits only what its decision accepts: refused, nothing is
/// written (not even the new tasks), and the outcomes still say what each item would
/// have done; accepted, it is `task_insert_many`.
pub async fn an_all_or_nothing_bulk_insert_commits_only_what_its_decision_accepts(h: &Harness) {
    let held = h.storage.task_insert(&numbered("held", 0)).await.unwrap();
    let mut tasks: Vec<TaskInsertParams> =
        (0..600).map(|i| numbered(&format!("aon-{i}"), i)).collect();
    let mut clash = numbered("held", 0);
    clash.payload = r#"{"i":99}"#.to_owned();
    tasks.push(clash);
    tasks.push(numbered("held", 0));
    let no_conflict = |outcomes: &[TaskInsertOutcome]| {
        !outcomes
            .iter()
            .any(|o| matches!(o, TaskInsertOutcome::Conflict { .. }))
    };
    let refused = h
        .storage
        .task_insert_many_if(&many(tasks.clone()), &no_conflict)
        .await
        .unwrap();
    assert!(!refused.committed);
    assert_eq!(refused.outcomes.len(), 602);
    assert!(refused.outcomes[..600]
        .iter()
        .all(TaskInsertOutcome::created));
    match &refused.outcomes[600] {
        TaskInsertOutcome::Conflict { existing, field } => {
            assert_eq!(existing.id, held.task.id);
            assert_eq!(*field, "payload");
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(
        refused.outcomes[601],
        TaskInsertOutcome::Existing(held.task.clone())
    );
    assert_eq!(h.storage.stats().await.unwrap().total(), 1);
    for no in ["aon-0", "aon-599"] {
        let task = TaskNo::new(no).unwrap();
        assert!(h
            .storage
            .task_get(&crate::TaskRef::No(task))
            .await
            .unwrap()
            .is_none());
    }

    tasks.remove(600);
    let accepted = h
        .storage
        .task_insert_many_if(&many(tasks), &no_conflict)
        .await
        .unwrap();
    assert!(accepted.committed);
    assert!(accepted.outcomes[..600]
        .iter()
        .all(TaskInsertOutcome::created));
    assert_eq!(
        accepted.outcomes[600],
        TaskInsertOutcome::Existing(held.task)
    );
    for outcome in &accepted.outcomes {
        let stored = h
            .storage
            .task_get(&crate::TaskRef::Id(outcome.task().id))
            .await
            .unwrap();
        assert_eq!(stored.as_ref(), Some(outcome.task()));
    }
    assert_eq!(h.storage.stats().await.unwrap().total(), 601);

    // An invalid task refuses the call before anything is asked or written.
    let asked = std::sync::atomic::AtomicBool::new(false);
    let mut bad = numbered("aon-bad", 0);
    bad.max_attempts = 0;
    let err = h
        .storage
        .task_insert_many_if(&many(vec![numbered("aon-new", 0), bad]), &|_| {
            asked.store(true, std::sync::atomic::Ordering::SeqCst);
            true
        })
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::Invalid(_)), "{err:?}");
    assert!(!asked.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(h.storage.stats().await.unwrap().total(), 601);
}

pub async fn concurrent_bulk_inserts_of_the_same_numbers_make_each_task_once(h: &Harness) {
    let other = h.reopen().await;
    let tasks = |offset: usize| -> Vec<TaskInsertParams> {
        // Two overlapping ranges, each in its own order.
        (0..2_000)
            .map(|i| (i + offset) % 3_000)
            .map(|i| numbered(&format!("race-{i}"), i))
            .collect()
    };
    let (first, second) = (many(tasks(0)), many(tasks(1_000)));
    let (a, b) = tokio::join!(
        h.storage.task_insert_many(&first),
        other.task_insert_many(&second)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let created: Vec<_> = a
        .iter()
        .chain(&b)
        .filter(|o| o.created())
        .map(|o| o.task().task_no.to_string())
        .collect();
    let unique: HashSet<_> = created.iter().collect();
    assert_eq!(created.len(), unique.len(), "a number was created twice");
    assert_eq!(unique.len(), 3_000);
    assert!(a.iter().chain(&b).all(|o| matches!(
        o,
        TaskInsertOutcome::Created(_) | TaskInsertOutcome::Existing(_)
    )));
    assert_eq!(h.storage.stats().await.unwrap().total(), 3_000);
}

/// Every record an insert answers (one task or many, created or already there) is the
/// record the database then reads back, field for field.
pub async fn the_record_an_insert_answers_is_the_stored_record(h: &Harness) {
    let at = chrono::Utc::now() + chrono::Duration::hours(2);
    let mut odd = numbered("odd-0", 0);
    odd.priority = Priority::new(7).unwrap();
    odd.payload_version = 2;
    odd.max_attempts = 9;
    odd.timeout = Duration::from_millis(90_500);
    odd.run_at = RunAt::In(Duration::from_secs(5));
    odd.concurrency_key = Some("account-1".to_owned());
    odd.concurrency_limit = 3;
    odd.callback_url = Some("https://example.com/hook".to_owned());
    odd.created_by = Some("shop".to_owned());
    let mut later = numbered("odd-1", 1);
    later.run_at = RunAt::At(at);
    later.queue = "emails".to_owned();
    // Before 2000 with a sub-microsecond part: PostgreSQL counts microseconds from
    // 2000, so a cut toward that epoch rounds this one up.
    let mut early = numbered("odd-3", 3);
    early.run_at = RunAt::At(
        chrono::DateTime::parse_from_rfc3339("1999-12-31T23:59:59.000000500Z")
            .unwrap()
            .with_timezone(&chrono::Utc),
    );

    let single = h.storage.task_insert(&odd).await.unwrap();
    assert!(single.created);
    let mut answered = vec![single.task];
    let tasks = vec![
        later,
        early,
        numbered("odd-2", 2),
        numbered("odd-2", 2),
        odd.clone(),
    ];
    let outcomes = h.storage.task_insert_many(&many(tasks)).await.unwrap();
    let created: Vec<bool> = outcomes.iter().map(TaskInsertOutcome::created).collect();
    assert_eq!(created, [true, true, true, false, false]);
    answered.extend(outcomes.iter().map(|o| o.task().clone()));
    for record in answered {
        let stored = h
            .storage
            .task_get(&crate::TaskRef::Id(record.id))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record, stored, "answered and stored records differ");
    }
}
