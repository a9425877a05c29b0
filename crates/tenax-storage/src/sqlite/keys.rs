//! Business-key concurrency on SQLite: the claim's reads of tasks with a concurrency key
//! (the claim itself, which takes a keyed task only while its key has a free slot, is in
//! `claim.rs`).
use std::collections::BTreeMap;

use sqlx::{Row, Sqlite, Transaction};

use super::{map_err, STEP_MS};
use crate::common::json_list;
use crate::error::Result;
use crate::params::TaskClaimParams;

/// Whether the claim's queues hold a due task with a concurrency key (a walk of the
/// keyed tasks' partial index, empty when keys are not used).
pub(super) async fn keyed_due(
    tx: &mut Transaction<'static, Sqlite>,
    params: &TaskClaimParams,
    now: i64,
) -> Result<bool> {
    sqlx::query_scalar(&format!(
        "SELECT EXISTS (SELECT 1 FROM tenax_tasks
             WHERE status IN ('pending', 'retrying') AND concurrency_key IS NOT NULL
               AND queue IN (SELECT value FROM json_each(?2))
               AND run_at - priority * {STEP_MS} <= ?1 AND run_at <= ?1)"
    ))
    .bind(now)
    .bind(json_list(&params.queues))
    .fetch_one(&mut **tx)
    .await
    .map_err(map_err)
}

/// Running tasks per concurrency key, for the given keys.
pub(super) async fn running_keys(
    tx: &mut Transaction<'static, Sqlite>,
    keys: &[&str],
) -> Result<BTreeMap<String, i64>> {
    let rows = sqlx::query(
        "SELECT concurrency_key AS k, COUNT(*) AS n FROM tenax_tasks
         WHERE status = 'running' AND concurrency_key IN (SELECT value FROM json_each(?1))
         GROUP BY concurrency_key",
    )
    .bind(json_list(keys))
    .fetch_all(&mut **tx)
    .await
    .map_err(map_err)?;
    rows.iter()
        .map(|row| {
            Ok((
                row.try_get::<String, _>("k").map_err(map_err)?,
                row.try_get::<i64, _>("n").map_err(map_err)?,
            ))
        })
        .collect()
}
