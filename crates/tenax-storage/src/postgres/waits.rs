//! Long-polls woken by the finish on PostgreSQL: a waiter's row in `tenax_waits` makes
//! the statement that finishes its task send `NOTIFY tenax_finished` (migration 0018),
//! which the storage's listener turns into a [`crate::FinishHint`].
use sqlx::PgPool;
use tenax_core::TaskId;

use super::map_err;
use crate::error::Result;

/// How long a waiter's row may stay: longer than any wait (`server.wait_max` is at
/// most 10 minutes), so only a crashed waiter's row is this old.
const STALE: &str = "1 hour";

/// Record a waiter of task `id`, deleting rows left by crashed waiters; returns its key.
///
/// The row is inserted under a share lock of the task's row: a finish in flight (its
/// trigger may have looked for waiters before this row existed) holds that row until
/// it commits, so the insert, and the caller's next read, come after it. A finish
/// that comes later finds the row.
pub(super) async fn begin(pool: &PgPool, id: TaskId) -> Result<String> {
    let waiter = uuid::Uuid::now_v7().to_string();
    sqlx::query(&format!(
        "WITH stale AS (DELETE FROM tenax_waits WHERE since < now() - interval '{STALE}')
         INSERT INTO tenax_waits (waiter, task_id, since)
         SELECT $1, id, now() FROM tenax_tasks WHERE id = $2 FOR SHARE"
    ))
    .bind(&waiter)
    .bind(id.0)
    .execute(pool)
    .await
    .map_err(map_err)?;
    Ok(waiter)
}

/// Forget a waiter.
pub(super) async fn end(pool: &PgPool, waiter: &str) -> Result<()> {
    sqlx::query("DELETE FROM tenax_waits WHERE waiter = $1")
        .bind(waiter)
        .execute(pool)
        .await
        .map_err(map_err)?;
    Ok(())
}
