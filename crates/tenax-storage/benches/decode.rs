//! Reading and decoding a claim-sized batch of task rows into `TaskRecord`s on SQLite
//! (the claim's answer goes through the same row decoder): 100 rows read back from a
//! migrated database file. `cargo bench -p tenax-storage --features testing --bench decode`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tenax_storage::params::TaskListParams;
use tenax_storage::testing::{sqlite_file, TaskOpts};

fn decode(c: &mut Criterion) {
    const BATCH: u32 = 100;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let harness = runtime.block_on(async {
        let harness = sqlite_file().await.unwrap();
        for i in 0..BATCH {
            harness
                .task(TaskOpts {
                    payload: format!("{{\"order\":{i},\"note\":\"bench\"}}"),
                    ..TaskOpts::default()
                })
                .await;
        }
        harness
    });
    let params = TaskListParams {
        limit: BATCH,
        ..TaskListParams::default()
    };
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Elements(u64::from(BATCH)));
    group.bench_function("sqlite_read_and_decode_100_task_rows", |b| {
        b.iter(|| {
            let tasks = runtime
                .block_on(harness.storage.task_list(&params))
                .unwrap();
            assert_eq!(tasks.len(), BATCH as usize);
            tasks
        })
    });
    group.finish();
}

criterion_group!(benches, decode);
criterion_main!(benches);
