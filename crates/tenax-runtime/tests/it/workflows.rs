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
