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
