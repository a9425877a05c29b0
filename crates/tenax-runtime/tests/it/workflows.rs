use serde_json::json;
use tenax_runtime::{Client, Workflow};
use tenax_storage::{TaskInsertOutcome, WorkflowListParams};

async fn client() -> (tempfile::TempDir, Client) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("tenax.db").display());
    (dir, Client::connect(&url).await.unwrap())
}

#[tokio::test]
async fn enqueue_many_answers_per_item_and_refuses_an_invalid_builder_whole() {
    let (_dir, client) = client().await;
    let first = client
        .enqueue_many((0..100).map(|i| {
            client
                .enqueue_raw("NOOP", &json!({ "i": i }))
                .task_no(format!("n-{i}"))
        }))
        .await
        .unwrap();
    assert!(first.iter().all(TaskInsertOutcome::created));
    let again = client
        .enqueue_many((95..105).map(|i| {
            client
                .enqueue_raw("NOOP", &json!({ "i": i }))
                .task_no(format!("n-{i}"))
        }))
        .await
        .unwrap();
    assert_eq!(again.iter().filter(|o| o.created()).count(), 5);
    assert_eq!(again[0].task().id, first[95].task().id);
    // A builder error (an invalid number) refuses the call; nothing more is inserted.
    let err = client
        .enqueue_many([
            client.enqueue_raw("NOOP", &json!({})).task_no("fine"),
            client.enqueue_raw("NOOP", &json!({})).task_no("not fine"),
        ])
        .await;
    assert!(err.is_err());
    assert_eq!(client.stats().await.unwrap().total(), 105);
}

#[tokio::test]
async fn a_workflow_with_an_unknown_parent_is_refused_and_inserts_nothing() {
    let (_dir, client) = client().await;
    let flow = Workflow::new("broken")
        .task("a", client.enqueue_raw("NOOP", &json!({})))
        .task("b", client.enqueue_raw("NOOP", &json!({})))
        .after(["a", "missing"]);
    let err = client.enqueue_workflow(flow).await.unwrap_err();
    assert!(err.to_string().contains("\"missing\""), "{err}");
    assert_eq!(client.stats().await.unwrap().total(), 0);
    let listed = client
        .workflows(&WorkflowListParams {
            before_id: None,
            limit: 10,
        })
        .await
        .unwrap();
    assert!(listed.is_empty());
}

/// A builder given no number gets a fresh UUIDv7 when it is sent, alone or in bulk;
/// one given a number keeps it, even a number given after other settings.
#[tokio::test]
async fn an_enqueue_without_a_number_gets_a_fresh_uuid_and_one_with_a_number_keeps_it() {
    let (_dir, client) = client().await;
    let single = client.enqueue_raw("NOOP", &json!({})).await.unwrap();
    let many = client
        .enqueue_many((0..3).map(|i| client.enqueue_raw("NOOP", &json!({ "i": i }))))
        .await
        .unwrap();
    let mut numbers = vec![single.task.task_no.to_string()];
    numbers.extend(many.iter().map(|o| o.task().task_no.to_string()));
    for no in &numbers {
        let uuid = uuid::Uuid::parse_str(no).unwrap_or_else(|e| panic!("{no:?}: {e}"));
        assert_eq!(uuid.get_version_num(), 7, "{no}");
    }
    let unique: std::collections::HashSet<_> = numbers.iter().collect();
    assert_eq!(unique.len(), numbers.len(), "{numbers:?}");
    let named = client
        .enqueue_raw("NOOP", &json!({}))
        .task_no("given-1")
        .priority(3)
        .await
        .unwrap();
    assert_eq!(named.task.task_no.as_str(), "given-1");
    let params = client
        .enqueue_raw("NOOP", &json!({}))
        .task_no("given-2")
        .into_params()
        .unwrap();
    assert_eq!(params.task_no.as_str(), "given-2");
}

/// `created_by` is stored with the task, alone and in bulk; a repeat of the number keeps
/// the name stored first; a name the store refuses stores nothing.
#[tokio::test]
async fn created_by_is_stored_with_the_task_and_a_repeat_keeps_the_first_name() {
    use tenax_core::TaskNo;
    use tenax_storage::{StorageError, TaskRef};
    let (_dir, client) = client().await;
    let stored_by = |no: &str| {
        let task = TaskRef::No(TaskNo::new(no).unwrap());
        let client = client.clone();
        async move { client.get(&task).await.unwrap().unwrap().created_by }
    };
    let first = client
        .enqueue_raw("NOOP", &json!({}))
        .task_no("c-1")
        .created_by("shop")
        .await
        .unwrap();
    assert!(first.created);
    assert_eq!(first.task.created_by.as_deref(), Some("shop"));
    assert_eq!(stored_by("c-1").await.as_deref(), Some("shop"));
    let again = client
        .enqueue_raw("NOOP", &json!({}))
        .task_no("c-1")
        .created_by("till")
        .await
        .unwrap();
    assert!(!again.created);
    assert_eq!(again.task.created_by.as_deref(), Some("shop"));
    let nameless = client
        .enqueue_raw("NOOP", &json!({}))
        .task_no("c-2")
        .await
        .unwrap();
    assert_eq!(nameless.task.created_by, None);
    assert_eq!(stored_by("c-2").await, None);

    let many = client
        .enqueue_many((0..3).map(|i| {
            client
                .enqueue_raw("NOOP", &json!({ "i": i }))
                .task_no(format!("c-many-{i}"))
                .created_by(format!("caller-{i}"))
        }))
        .await
        .unwrap();
    for (i, outcome) in many.iter().enumerate() {
        assert!(outcome.created());
        let name = format!("caller-{i}");
        assert_eq!(outcome.task().created_by.as_deref(), Some(name.as_str()));
        let stored = stored_by(&format!("c-many-{i}")).await;
        assert_eq!(stored.as_deref(), Some(name.as_str()));
    }

    for refused in [
        String::new(),
        "x".repeat(tenax_storage::CREATED_BY_MAX_BYTES + 1),
    ] {
        let err = client
            .enqueue_raw("NOOP", &json!({}))
            .created_by(refused)
            .await
            .unwrap_err();
        assert!(
            matches!(err, tenax_runtime::Error::Storage(StorageError::Invalid(_))),
            "{err}"
        );
    }
    assert_eq!(client.stats().await.unwrap().total(), 5);
}

/// `Enqueue::params` shows the insert before it is made, with the number it will use:
/// the one given, or one drawn at the first look and kept.
#[tokio::test]
async fn params_shows_the_insert_with_the_number_it_will_use() {
    let (_dir, client) = client().await;
    let mut task = client
        .enqueue_raw("NOOP", &json!({"n": 1}))
        .queue("mail")
        .created_by("shop");
    let params = task.params().unwrap();
    assert_eq!(params.queue, "mail");
    assert_eq!(params.created_by.as_deref(), Some("shop"));
    let drawn = params.task_no.clone();
    assert_eq!(
        uuid::Uuid::parse_str(drawn.as_str())
            .unwrap()
            .get_version_num(),
        7
    );
    assert_eq!(task.params().unwrap().task_no, drawn, "drawn once");
    let inserted = task.await.unwrap();
    assert_eq!(inserted.task.task_no, drawn);
    assert_eq!(inserted.task.queue, "mail");

    let mut given = client.enqueue_raw("NOOP", &json!({})).task_no("p-1");
    assert_eq!(given.params().unwrap().task_no.as_str(), "p-1");
    // A number given after a look replaces the drawn one.
    let mut later = client.enqueue_raw("NOOP", &json!({}));
    let drawn = later.params().unwrap().task_no.clone();
    let mut later = later.task_no("p-2");
    assert_ne!(drawn.as_str(), "p-2");
    assert_eq!(later.params().unwrap().task_no.as_str(), "p-2");
    assert_eq!(later.await.unwrap().task.task_no.as_str(), "p-2");
    // A refusal is shown, and is what awaiting the builder returns.
    let mut bad = client.enqueue_raw("NOOP", &json!({})).priority(10);
    assert!(bad.params().is_err());
    assert!(bad.await.is_err());
    assert_eq!(client.stats().await.unwrap().total(), 2);
}

/// `enqueue_many_if` asks `accept` with the outcomes before the commit: refused, nothing
/// is stored (a `Created` outcome names a task not kept); accepted, every task is. An
/// invalid builder refuses the call before `accept` is asked.
#[tokio::test]
async fn enqueue_many_if_stores_every_task_when_accepted_and_none_when_refused() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tenax_core::TaskNo;
    use tenax_storage::TaskRef;
    let (_dir, client) = client().await;
    let batch = |numbers: &[(&str, i64)]| {
        numbers
            .iter()
            .map(|(no, n)| {
                client
                    .enqueue_raw("NOOP", &json!({ "n": n }))
                    .task_no(*no)
                    .created_by("shop")
            })
            .collect::<Vec<_>>()
    };
    let is_stored = |no: &str| {
        let task = TaskRef::No(TaskNo::new(no).unwrap());
        let client = client.clone();
        async move { client.get(&task).await.unwrap().is_some() }
    };
    let asked = AtomicUsize::new(0);
    let refused = client
        .enqueue_many_if(batch(&[("m-0", 0), ("m-1", 1), ("m-2", 2)]), |outcomes| {
            asked.fetch_add(outcomes.len(), Ordering::SeqCst);
            false
        })
        .await
        .unwrap();
    assert_eq!(
        asked.load(Ordering::SeqCst),
        3,
        "asked once, with every outcome"
    );
    assert!(!refused.committed);
    assert!(refused.outcomes.iter().all(TaskInsertOutcome::created));
    assert_eq!(client.stats().await.unwrap().total(), 0);
    for no in ["m-0", "m-1", "m-2"] {
        assert!(!is_stored(no).await, "{no}");
    }

    let accepted = client
        .enqueue_many_if(batch(&[("m-0", 0), ("m-1", 1), ("m-2", 2)]), |outcomes| {
            outcomes.iter().all(TaskInsertOutcome::created)
        })
        .await
        .unwrap();
    assert!(accepted.committed);
    for (outcome, no) in accepted.outcomes.iter().zip(["m-0", "m-1", "m-2"]) {
        assert!(outcome.created());
        assert_eq!(outcome.task().task_no.as_str(), no);
        assert_eq!(outcome.task().created_by.as_deref(), Some("shop"));
        assert!(is_stored(no).await, "{no}");
    }

    // One conflict refuses the batch whole: its new task is not kept either.
    let no_conflict = |outcomes: &[TaskInsertOutcome]| {
        !outcomes
            .iter()
            .any(|o| matches!(o, TaskInsertOutcome::Conflict { .. }))
    };
    let mixed = client
        .enqueue_many_if(batch(&[("m-0", 0), ("m-3", 3), ("m-1", 9)]), no_conflict)
        .await
        .unwrap();
    assert!(!mixed.committed);
    assert!(matches!(mixed.outcomes[0], TaskInsertOutcome::Existing(_)));
    assert!(mixed.outcomes[1].created());
    assert!(matches!(
        mixed.outcomes[2],
        TaskInsertOutcome::Conflict { .. }
    ));
    assert!(!is_stored("m-3").await);
    assert_eq!(client.stats().await.unwrap().total(), 3);

    let invalid = client
        .enqueue_many_if(
            [
                client.enqueue_raw("NOOP", &json!({})).task_no("m-4"),
                client.enqueue_raw("NOOP", &json!({})).task_no("not fine"),
            ],
            |_| {
                asked.fetch_add(1, Ordering::SeqCst);
                true
            },
        )
        .await;
    assert!(invalid.is_err());
    assert_eq!(asked.load(Ordering::SeqCst), 3, "accept is not asked");
    assert_eq!(client.stats().await.unwrap().total(), 3);
}

/// What the CLI and the HTTP API do to many tasks at once, and to event rules, a Rust
/// application does through the client; bad input changes nothing.
#[tokio::test]
async fn the_client_runs_bulk_actions_lists_the_audit_and_sets_event_rules() {
    use tenax_core::{Priority, TaskStatus};
    use tenax_storage::{AuditAppendParams, AuditListParams, BulkAction, TaskFilter};
    let (_dir, client) = client().await;
    for i in 0..5 {
        let queue = if i < 3 { "mail" } else { "other" };
        client
            .enqueue_raw("NOOP", &json!({ "i": i }))
            .queue(queue)
            .await
            .unwrap();
    }
    let mail = TaskFilter {
        queue: Some("mail".into()),
        ..TaskFilter::default()
    };
    // A limit out of range is refused and changes nothing.
    assert!(client
        .bulk(mail.clone(), BulkAction::Cancel, 0)
        .await
        .is_err());
    let urgent = BulkAction::Reprioritise(Priority::new(9).unwrap());
    assert_eq!(
        client.bulk(mail.clone(), urgent, 10).await.unwrap().changed,
        3
    );
    assert_eq!(
        client
            .bulk(mail, BulkAction::Cancel, 2)
            .await
            .unwrap()
            .changed,
        2
    );
    let tasks = client
        .list(&tenax_storage::TaskListParams {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    let cancelled = tasks.iter().filter(|t| t.status == TaskStatus::Cancelled);
    assert_eq!(cancelled.count(), 2);
    assert_eq!(tasks.iter().filter(|t| t.priority.get() == 9).count(), 3);

    client
        .storage()
        .audit_append(&AuditAppendParams {
            actor: "app".into(),
            action: "tasks.bulk_cancel".into(),
            target: "queue=mail".into(),
            details: json!({}),
            now: None,
        })
        .await
        .unwrap();
    let entries = client
        .audit(&AuditListParams {
            before_id: None,
            limit: 10,
            actor: Some("app".into()),
            action: None,
        })
        .await
        .unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].target, "queue=mail");

    assert!(client.event_rules().await.unwrap().is_empty());
    assert!(client.events_on(Some("mail"), None).await.unwrap());
    assert!(
        !client.events_on(Some("mail"), None).await.unwrap(),
        "already on"
    );
    assert!(client.events_on(Some("bad queue"), None).await.is_err());
    let rules = client.event_rules().await.unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].queue.as_deref(), Some("mail"));
    assert!(client.events_off(Some("mail"), None).await.unwrap());
    assert!(
        !client.events_off(Some("mail"), None).await.unwrap(),
        "none left"
    );
    assert!(client.event_rules().await.unwrap().is_empty());
}
