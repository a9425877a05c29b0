//! The worker's in-process hot paths, without a database: backoff computation and the
//! dispatch of a claimed batch to its handlers (look-up, payload decoding, execution).
//! `cargo bench -p tenax-core --bench hot_paths`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use tenax_core::{
    Command, CommandError, Registry, RetryPolicy, TaskContext, TaskId, TaskKind, TaskNo,
};
use tokio_util::sync::CancellationToken;

#[derive(Serialize, Deserialize)]
struct Order {
    order: u64,
    #[allow(dead_code)]
    note: String,
}

struct Ship;

impl Command for Ship {
    const TYPE: &'static str = "SHIP";
    type Context = Order;
    type Output = u64;

    async fn execute(&self, ctx: Order, _task: &TaskContext) -> Result<u64, CommandError> {
        Ok(ctx.order)
    }
}

fn backoff(c: &mut Criterion) {
    let policy = RetryPolicy::exponential(Duration::from_millis(100), Duration::from_secs(60));
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut group = c.benchmark_group("backoff");
    group.throughput(Throughput::Elements(20));
    group.bench_function("exponential_full_jitter_attempts_1_to_20", |b| {
        b.iter(|| {
            let mut total = Duration::ZERO;
            for attempt in 1..=20 {
                total += policy.delay(std::hint::black_box(attempt), &mut rng);
            }
            total
        })
    });
    group.finish();
}

fn dispatch(c: &mut Criterion) {
    const BATCH: u64 = 100;
    let mut registry = Registry::new();
    registry.register(Ship).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let claimed: Vec<(String, String, TaskContext)> = (0..BATCH)
        .map(|i| {
            let context = TaskContext::new(
                TaskId(i as i64),
                TaskNo::new(format!("bench-{i}")).unwrap(),
                TaskKind::Execute,
                1,
                3,
                1,
                format!("bench-{i}:1"),
                None,
                CancellationToken::new(),
            );
            (
                "SHIP".to_owned(),
                format!("{{\"order\":{i},\"note\":\"bench\"}}"),
                context,
            )
        })
        .collect();
    let mut group = c.benchmark_group("dispatch");
    group.throughput(Throughput::Elements(BATCH));
    group.bench_function("claimed_batch_of_100_to_handlers", |b| {
        b.iter_batched(
            || claimed.clone(),
            |batch| {
                runtime.block_on(async {
                    let runs = batch.into_iter().map(|(kind, payload, context)| {
                        let handler = registry.get(&kind).unwrap();
                        handler.execute(payload, 1, context)
                    });
                    futures::future::join_all(runs).await
                })
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, backoff, dispatch);
criterion_main!(benches);
