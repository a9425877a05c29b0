//! Runtime integration tests, on real SQLite files.
#![allow(
    unreachable_pub,
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used
)]

/// Shared fixtures: a scripted command, harnesses, waits with deadlines.
mod support;

/// What each handler outcome does to the task: success, retries, death, compensation.
mod outcomes;

/// Leases: expiry and the reaper, lost leases, self-fencing, shutdown.
mod leases;

/// Payload evolution: a task stored by one version of a command runs on the next.
mod versions;

/// The claim loop's buffer and slots freed when a handler returns: hand-back at stop,
/// the bound on uncommitted outcomes, cluster-wide limits across buffering workers.
mod prefetch;

/// Batch commands on every backend: per-task outcomes, batch sizes and keys, the
/// maximum wait, lost leases inside a batch.
mod batches;
/// Rate limits per command type, measured with real workers on PostgreSQL.
mod rates;
/// Periodic schedules: declared on a worker, fired by its scheduler or at an injected time.
mod schedules;
/// Secret payload fields masked out of every stored outcome.
mod secrets;
/// Soak: with a short retention, every table the pruner keeps bounded returns to its
/// floor after 10^5 tasks with workflows, concurrency keys and audit entries.
mod soak;
/// Time: delayed tasks start on time, running tasks can be cancelled.
mod timing;
/// Bulk enqueue and workflows from the client.
mod workflows;
