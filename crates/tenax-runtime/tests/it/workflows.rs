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
