//! PostgreSQL's client-side call timeout (`PgConfig::call_timeout`): when the network
//! goes silent (a proxy that keeps the sockets open and forwards nothing, so neither
//! side sees an error and the server's own timeouts never start), every storage call
//! on a worker's path still answers within the timeout, as a transient error, and the
//! same storage works again once the network does.
//!
//! The shared PostgreSQL server is only reached through the proxy; nothing here stops,
//! restarts or reconfigures it.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;

use tenax::storage::postgres::{PgConfig, PgStorage};
use tenax::storage::{
    FailNext, Lease, LeaseExtendParams, Storage, StorageError, TaskCompleteParams, TaskFailParams,
    TaskInsertManyParams, TaskReapParams, TaskRef,
};
use tenax::CompensationState;
use tenax_storage::testing::{claim_params, unique_name, url_from_env, Harness, TaskOpts};
use tenax_torture::proxy::{FaultProxy, Mode};

/// The timeout under test: short, far below the pool's acquire timeout.
const CALL_TIMEOUT: Duration = Duration::from_millis(800);
/// Longest a call may take to give up: the timeout and a slack for a busy machine,
/// still well below `ACQUIRE_TIMEOUT`, so only the call timeout can end it in time.
const ANSWER_WITHIN: Duration = Duration::from_secs(4);
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// `call` returns within [`ANSWER_WITHIN`], with the call timeout's transient error.
async fn answers_in_time<T: std::fmt::Debug>(
    name: &str,
    call: impl Future<Output = tenax::storage::Result<T>>,
) {
    let started = Instant::now();
    let outcome = tokio::time::timeout(ANSWER_WITHIN * 2, call).await;
    let took = started.elapsed();
    let Ok(result) = outcome else {
        panic!("{name}: no answer after {took:?} with the network silent");
    };
    match result {
        Err(err @ StorageError::Transient(_)) => {
            assert!(
                err.to_string().contains("no answer from PostgreSQL"),
                "{name}: a transient error other than the call timeout's: {err}"
            );
        }
        other => panic!("{name}: expected the call timeout's transient error, got {other:?}"),
    }
    assert!(
        took < ANSWER_WITHIN,
        "{name}: answered after {took:?}, beyond the call timeout {CALL_TIMEOUT:?} and its slack"
    );
}

#[tokio::test]
async fn every_postgres_call_on_the_workers_path_answers_within_its_call_timeout() {
    let Some(url) = url_from_env("TENAX_TEST_POSTGRES_URL") else {
        return;
    };
    let options = PgConnectOptions::from_str(&url).expect("parse TENAX_TEST_POSTGRES_URL");
    let host = options.get_host().to_owned();
    let port = options.get_port();
    let upstream = tokio::net::lookup_host((host.as_str(), port))
        .await
        .expect("resolve the PostgreSQL host")
        .next()
        .expect("an address for the PostgreSQL host");
    let proxy = FaultProxy::start(upstream).await.expect("start the proxy");
    let server = format!("{host}:{port}");
    assert!(
        url.contains(&server),
        "TENAX_TEST_POSTGRES_URL must name its host and port ({server}) for the proxy to stand in"
    );
    let separator = if url.contains('?') { '&' } else { '?' };
    let schema = unique_name("tenax_t");
    let proxied = format!(
        "{}{separator}schema={schema}",
        url.replacen(&server, &proxy.addr().to_string(), 1)
    );
    let config = PgConfig {
        call_timeout: CALL_TIMEOUT,
        acquire_timeout: ACQUIRE_TIMEOUT,
        ..PgConfig::default()
    };
    let pg = PgStorage::connect_with(&proxied, &config)
        .await
        .expect("connect through the proxy");
    pg.migrate().await.expect("migrate");
    let pg = Arc::new(pg);
    let storage: Arc<dyn Storage> = pg.clone();
    let harness = Harness::new(storage.clone(), proxied.clone());
    for _ in 0..3 {
        harness.task(TaskOpts::default()).await;
    }
    let claimed = harness.claim("w1", 3, None).await;
    assert_eq!(claimed.len(), 3, "the three tasks are claimed");
    let lease = |i: usize| Lease {
        id: claimed[i].id,
        epoch: claimed[i].lease_epoch,
    };
    let done = |i: usize| TaskCompleteParams {
        lease: lease(i),
        result: None,
        compensation: CompensationState::Succeeded,
        now: None,
    };

    proxy.set_mode(Mode::Blackhole);
    answers_in_time(
        "task_claim_batch",
        storage.task_claim_batch(&claim_params("w1", 1, None)),
    )
    .await;
    answers_in_time(
        "task_complete_if_leased",
        storage.task_complete_if_leased(&done(0)),
    )
    .await;
    answers_in_time(
        "task_complete_many_if_leased",
        storage.task_complete_many_if_leased(&[done(1)]),
    )
    .await;
    answers_in_time(
        "task_fail_if_leased",
        storage.task_fail_if_leased(&TaskFailParams {
            lease: lease(2),
            error: "boom".to_owned(),
            next: FailNext::Retry(Duration::ZERO),
            now: None,
        }),
    )
    .await;
    answers_in_time(
        "task_reap_expired",
        storage.task_reap_expired(&TaskReapParams {
            limit: 10,
            now: None,
            expires_beyond: None,
        }),
    )
    .await;
    answers_in_time(
        "lease_extend",
        storage.lease_extend(&LeaseExtendParams {
            leases: vec![lease(0)],
            lease_ttl: Duration::from_secs(30),
            now: None,
        }),
    )
    .await;
    answers_in_time(
        "task_insert",
        storage.task_insert(&TaskOpts::default().params()),
    )
    .await;
    answers_in_time(
        "task_insert_many",
        storage.task_insert_many(&TaskInsertManyParams {
            tasks: vec![TaskOpts::default().params(), TaskOpts::default().params()],
            now: None,
        }),
    )
    .await;
    answers_in_time("task_get", storage.task_get(&TaskRef::Id(claimed[0].id))).await;

    // The network back: the connections the silence held are closed, and the same
    // storage completes what it could not before (its leases still hold).
    proxy.reset();
    proxy.set_mode(Mode::Pass);
    let deadline = Instant::now() + Duration::from_secs(30);
    let landed = loop {
        match storage.task_complete_if_leased(&done(0)).await {
            Ok(landed) => break landed,
            Err(err) if Instant::now() < deadline => {
                eprintln!("not yet back: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("the storage never came back: {err}"),
        }
    };
    assert!(landed, "the completion lands once the network is back");
    let task = storage
        .task_get(&TaskRef::Id(claimed[0].id))
        .await
        .expect("read the task")
        .expect("the task exists");
    assert_eq!(task.status, tenax::TaskStatus::Succeeded);
    pg.drop_schema(&schema).await.expect("drop the test schema");
}
