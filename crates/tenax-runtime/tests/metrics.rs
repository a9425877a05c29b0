//! Metrics match what ran: a worker runs known tasks (successes, retries, deaths and
//! their compensations) and the Prometheus exposition then shows exactly those counts
//! and histogram bucket totals. Its own test binary, because a metrics recorder is
//! global to the process.
#![allow(
    unreachable_pub,
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::collections::BTreeSet;

use tenax_core::{CompensationState, TaskStatus};
use tenax_runtime::metrics::{self as m, MetricKind, METRICS};

#[allow(dead_code)]
#[path = "it/support.rs"]
mod support;

use support::{fast, wait_for, Env, Step};

/// The value of the one series of `name` whose labels include every `labels` pair.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let found: Vec<f64> = text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = match series.split_once('{') {
                Some((metric, rest)) => (metric, rest),
                None => (series, ""),
            };
            (metric == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse().unwrap())
        })
        .collect();
    assert!(found.len() <= 1, "{name} {labels:?} matches {found:?}");
    found.first().copied()
}

fn get(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    value(text, name, labels).unwrap_or_else(|| panic!("no series {name} {labels:?} in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_exactly_what_ran() {
    let recorder = m::prometheus_builder().unwrap().build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).unwrap();
    m::describe();

    let env = Env::new().await;
    let storage = m::instrument(env.storage());
    let config = fast();
    let worker = env.start(storage.clone(), env.registry(), config.clone());
    // 3 slow successes (300 ms each: past the 0.25 s bucket), 1 success at the third
    // attempt (2 retries), 1 retried until dead (3 attempts: 2 retries, then dead), 1
    // permanent error (dead at once). Both dead tasks are compensated.
    let mut tasks = Vec::new();
    for _ in 0..3 {
        tasks.push(env.enqueue(vec![Step::SleepMs(300)], 5).await);
    }
    tasks.push(
        env.enqueue(vec![Step::Retry, Step::Retry, Step::Ok], 5)
            .await,
    );
    let dying = vec![
        env.enqueue(vec![Step::Retry], 3).await,
        env.enqueue(vec![Step::Permanent], 5).await,
    ];
    for task in &tasks {
        env.wait_task(task, "succeeded", |t| t.status == TaskStatus::Succeeded)
            .await;
    }
    for task in &dying {
        env.wait_task(task, "dead and compensated", |t| {
            t.compensation == Some(CompensationState::Succeeded)
        })
        .await;
    }
    // The heartbeat ticks every lease_ttl / 3.
    wait_for("a heartbeat", || {
        let text = handle.render();
        async move { value(&text, m::names::HEARTBEAT_TIMESTAMP, &[]) }
    })
    .await;
    let text = handle.render();
    assert_eq!(
        get(&text, m::names::WORKER_SLOTS, &[("state", "busy")]),
        0.0
    );
    assert_eq!(
        get(&text, m::names::WORKER_SLOTS, &[("state", "free")]),
        f64::from(config.concurrency)
    );
    worker.shutdown().await;
    // The sampler's reading of the database, once.
    m::sample_once(storage.as_ref(), &mut BTreeSet::new())
        .await
        .unwrap();
    // Operator calls are timed too: a bulk cancel that matches only finished tasks, an
    // audit entry, a listing, and a refused listing.
    let bulk = storage
        .task_bulk(&tenax_storage::TaskBulkParams {
            filter: tenax_storage::TaskFilter {
                ids: Some(tasks.iter().map(|t| t.id).collect()),
                ..Default::default()
            },
            action: tenax_storage::BulkAction::Cancel,
            limit: 10,
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(bulk, tenax_storage::TaskBulkOutcome::default());
    storage
        .audit_append(&tenax_storage::AuditAppendParams {
            actor: "test".into(),
            action: "tasks.bulk_cancel".into(),
            target: "succeeded ones".into(),
            details: serde_json::Value::Null,
            now: None,
        })
        .await
        .unwrap();
    let listing = tenax_storage::AuditListParams {
        limit: 10,
        ..Default::default()
    };
    assert_eq!(storage.audit_list(&listing).await.unwrap().len(), 1);
    let refused = tenax_storage::AuditListParams {
        limit: 0,
        ..listing
    };
    assert!(storage.audit_list(&refused).await.is_err());
    let text = handle.render();

    let exec = [("command_type", "SCRIPTED"), ("kind", "execute")];
    let attempts = |outcome| {
        let mut labels = exec.to_vec();
        labels.push(("outcome", outcome));
        get(&text, m::names::ATTEMPTS, &labels)
    };
    assert_eq!(attempts("succeeded"), 4.0);
    assert_eq!(attempts("retried"), 4.0, "2 + 2 retries");
    assert_eq!(attempts("dead"), 2.0);
    assert_eq!(
        value(&text, m::names::ATTEMPTS, &[("outcome", "dropped")]),
        None
    );
    let compensate = [
        ("command_type", "SCRIPTED"),
        ("kind", "compensate"),
        ("outcome", "succeeded"),
    ];
    assert_eq!(get(&text, m::names::ATTEMPTS, &compensate), 2.0);
    assert_eq!(get(&text, m::names::RETRIES, &exec), 4.0);
    assert_eq!(get(&text, m::names::DEATHS, &exec), 2.0);
    assert_eq!(
        get(
            &text,
            m::names::COMPENSATIONS,
            &[("command_type", "SCRIPTED"), ("outcome", "succeeded")]
        ),
        2.0
    );

    // 12 attempts ran: 4 + 4 + 2 executions and 2 compensations; only the 3 slow ones
    // took more than 0.25 s.
    let exec_bucket = |le| {
        get(
            &text,
            &format!("{}_bucket", m::names::EXECUTION),
            &[("command_type", "SCRIPTED"), ("le", le)],
        )
    };
    assert_eq!(exec_bucket("+Inf"), 12.0);
    assert_eq!(exec_bucket("0.25"), 9.0);
    assert_eq!(exec_bucket("10"), 12.0);
    let exec_count = format!("{}_count", m::names::EXECUTION);
    assert_eq!(
        get(&text, &exec_count, &[("command_type", "SCRIPTED")]),
        12.0
    );
    let exec_sum = get(
        &text,
        &format!("{}_sum", m::names::EXECUTION),
        &[("command_type", "SCRIPTED")],
    );
    assert!(
        (0.9..5.0).contains(&exec_sum),
        "3 × 0.3 s and fast ones: {exec_sum}"
    );
    // Every claim is counted with its queue wait; the claimed tasks add up to 12.
    let wait_count = format!("{}_count", m::names::QUEUE_WAIT);
    assert_eq!(
        get(&text, &wait_count, &[("command_type", "SCRIPTED")]),
        12.0
    );
    let batch_sum = format!("{}_sum", m::names::CLAIM_BATCH);
    assert_eq!(get(&text, &batch_sum, &[]), 12.0);
    // Every outcome write went through the timed storage.
    let calls = |method, outcome| {
        get(
            &text,
            &format!("{}_count", m::names::STORAGE_CALL),
            &[("method", method), ("outcome", outcome)],
        )
    };
    // The 6 successes are written in completion batches (one call may hold several),
    // none alone.
    let batches = calls("task_complete_many_if_leased", "ok");
    assert!((1.0..=6.0).contains(&batches), "{batches} batches");
    assert_eq!(
        value(
            &text,
            &format!("{}_count", m::names::STORAGE_CALL),
            &[("method", "task_complete_if_leased")]
        ),
        None
    );
    assert_eq!(calls("task_fail_if_leased", "ok"), 6.0);
    assert!(calls("task_claim_batch", "ok") >= 1.0);
    assert_eq!(calls("queue_stats", "ok"), 1.0);
    assert_eq!(calls("task_bulk", "ok"), 1.0);
    assert_eq!(calls("audit_append", "ok"), 1.0);
    assert_eq!(calls("audit_list", "ok"), 1.0);
    assert_eq!(calls("audit_list", "error"), 1.0);
    // After shutdown, the worker's slots are gone.
    assert_eq!(
        get(&text, m::names::WORKER_SLOTS, &[("state", "busy")]),
        0.0
    );
    assert_eq!(
        get(&text, m::names::WORKER_SLOTS, &[("state", "free")]),
        0.0
    );

    // The sampled counts are the database's.
    let tasks_in = |status| {
        get(
            &text,
            m::names::TASKS,
            &[("queue", "default"), ("status", status)],
        )
    };
    assert_eq!(tasks_in("succeeded"), 6.0, "4 tasks and 2 compensations");
    assert_eq!(tasks_in("dead"), 2.0);
    assert_eq!(tasks_in("pending"), 0.0);
    assert_eq!(tasks_in("running"), 0.0);
    assert_eq!(
        get(&text, m::names::QUEUE_BACKLOG, &[("queue", "default")]),
        0.0
    );
    assert_eq!(
        get(
            &text,
            m::names::QUEUE_OLDEST_DUE_AGE,
            &[("queue", "default")]
        ),
        0.0
    );

    // What is registered is what the catalogue (and so the reference table) lists.
    let registered: Vec<(String, String)> = text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .map(|rest| {
            let (name, kind) = rest.split_once(' ').unwrap();
            (name.to_owned(), kind.to_owned())
        })
        .collect();
    for (name, kind) in &registered {
        let def = METRICS
            .iter()
            .find(|d| d.name == name)
            .unwrap_or_else(|| panic!("{name} is registered but not in the catalogue"));
        assert_eq!(def.kind.as_str(), kind, "{name}");
    }
    // Delivery metrics are recorded by the callback and alert senders, which a worker
    // alone does not run (crates/tenax-cli/tests/delivery.rs checks them).
    for def in METRICS.iter().filter(|d| d.source != "delivery") {
        assert!(
            registered.iter().any(|(name, _)| name == def.name),
            "{} is in the catalogue but was not registered by this run",
            def.name
        );
        if def.kind == MetricKind::Histogram {
            assert!(
                text.contains(&format!("{}_bucket{{", def.name)),
                "{} is exposed as a histogram with buckets",
                def.name
            );
        }
    }
    assert!(
        text.contains(&format!("# HELP {} ", m::names::EXECUTION)),
        "metrics are described"
    );
}

#[test]
fn every_metric_is_named_once_and_follows_the_conventions() {
    let mut names = BTreeSet::new();
    for def in METRICS {
        assert!(names.insert(def.name), "{} listed twice", def.name);
        assert!(def.name.starts_with("tenax_"), "{}", def.name);
        if def.kind == MetricKind::Counter {
            assert!(def.name.ends_with("_total"), "{}", def.name);
        }
        if def.unit == "seconds" {
            assert!(def.name.ends_with("_seconds"), "{}", def.name);
        }
    }
}
