//! Payload evolution across a deploy: one command type, "GREET", whose context changes
//! shape between version 1 ({name}) and version 2 ({first, last}).
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tenax_core::{Command, CommandError, Registry, TaskContext, TaskRecord, TaskStatus};

use crate::support::{fast, Env, Step};

/// What the application shipped as version 1.
mod v1 {
    use super::*;

    #[derive(Serialize, Deserialize)]
    pub struct Name {
        pub name: String,
    }

    pub struct Greet;

    impl Command for Greet {
        const TYPE: &'static str = "GREET";
        // VERSION is the default, 1.
        type Context = Name;
        type Output = String;

        async fn execute(&self, ctx: Name, _: &TaskContext) -> Result<String, CommandError> {
            Ok(format!("hello {}", ctx.name))
        }
    }
}

/// The next release: the same type name, a new context shape, and an upcast from 1.
mod v2 {
    use super::*;

    #[derive(Debug, Serialize, Deserialize)]
    pub struct Name {
        pub first: String,
        pub last: String,
    }

    pub struct Greet;

    impl Command for Greet {
        const TYPE: &'static str = "GREET";
        const VERSION: u32 = 2;
        type Context = Name;
        type Output = Name;

        async fn execute(&self, ctx: Name, _: &TaskContext) -> Result<Name, CommandError> {
            Ok(ctx)
        }

        fn upcast(version: u32, payload: Value) -> Result<Value, CommandError> {
            let name = match (version, payload.get("name").and_then(Value::as_str)) {
                (1, Some(name)) => name,
                _ => {
                    return Err(CommandError::permanent(format!(
                        "cannot upcast a version {version} payload: {payload}"
                    )))
                }
            };
            let (first, last) = name.split_once(' ').unwrap_or((name, ""));
            Ok(json!({ "first": first, "last": last }))
        }
    }
}

fn result_of(task: &TaskRecord) -> Value {
    serde_json::from_str(task.result.as_deref().expect("a result")).unwrap()
}

fn registry_of<C: Command>(command: C) -> Registry {
    let mut registry = Registry::new();
    registry.register(command).unwrap();
    registry
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_stored_by_v1_runs_on_v2_with_the_upcast_context() {
    let env = Env::new().await;
    // Enqueued before the deploy, by v1.
    let task = env
        .client
        .enqueue::<v1::Greet>(v1::Name {
            name: "Ada Lovelace".into(),
        })
        .await
        .unwrap()
        .task;
    assert_eq!(task.payload_version, 1);
    // After the deploy only v2 workers run.
    let worker = env.start(env.storage(), registry_of(v2::Greet), fast());
    let done = env
        .wait_task(&task, "the v1 task finishes on v2", |t| {
            t.status.is_finished()
        })
        .await;
    assert_eq!(
        done.status,
        TaskStatus::Succeeded,
        "last error: {:?}",
        done.last_error
    );
    assert_eq!(
        result_of(&done),
        json!({ "first": "Ada", "last": "Lovelace" })
    );
    assert_eq!(done.attempt, 1);
    // The upcast happens on decode; the stored payload keeps its shape and version.
    assert_eq!(done.payload_version, 1);
    assert_eq!(
        serde_json::from_str::<Value>(&done.payload).unwrap(),
        json!({ "name": "Ada Lovelace" })
    );
    worker.shutdown().await;
    env.assert_no_overlap().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_stored_by_v2_waits_for_a_v2_worker() {
    let env = Env::new().await;
    // A node of v2 is already enqueueing while a v1 worker still runs.
    let mut old_registry = env.registry();
    old_registry.register(v1::Greet).unwrap();
    let old = env.start(env.storage(), old_registry, fast());
    let newer = env
        .client
        .enqueue::<v2::Greet>(v2::Name {
            first: "Grace".into(),
            last: "Hopper".into(),
        })
        .await
        .unwrap()
        .task;
    assert_eq!(newer.payload_version, 2);
    // The v1 worker is alive and claiming, this very type included (at version 1),
    // and those tasks were enqueued after the v2 one ...
    let same_type = env
        .client
        .enqueue::<v1::Greet>(v1::Name {
            name: "Alan Turing".into(),
        })
        .await
        .unwrap()
        .task;
    let other = env.enqueue(vec![Step::Ok], 5).await;
    for task in [&same_type, &other] {
        env.wait_task(task, "the v1 worker runs what it knows", |t| {
            t.status == TaskStatus::Succeeded
        })
        .await;
    }
    assert_eq!(
        result_of(&env.get(&same_type).await),
        json!("hello Alan Turing")
    );
    // ... while the v2 task waits untouched, visible in the stats, instead of dying on
    // decode in the v1 worker.
    let waiting = env.get(&newer).await;
    assert_eq!(waiting.status, TaskStatus::Pending);
    assert_eq!((waiting.attempt, waiting.lease_epoch), (0, 0));
    let stats = env.client.stats().await.unwrap();
    assert!(
        stats
            .by_type
            .contains(&("GREET".to_owned(), TaskStatus::Pending, 1)),
        "{stats:?}"
    );
    // A v2 worker starts and runs it.
    let new = env.start(env.storage(), registry_of(v2::Greet), fast());
    let done = env
        .wait_task(&newer, "a v2 worker runs the v2 task", |t| {
            t.status.is_finished()
        })
        .await;
    assert_eq!(
        done.status,
        TaskStatus::Succeeded,
        "last error: {:?}",
        done.last_error
    );
    assert_eq!(done.attempt, 1, "no worker tried it before");
    assert_eq!(
        result_of(&done),
        json!({ "first": "Grace", "last": "Hopper" })
    );
    old.shutdown().await;
    new.shutdown().await;
    env.assert_no_overlap().await;
}
