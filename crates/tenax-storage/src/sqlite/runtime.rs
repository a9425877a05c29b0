//! Runtime support on SQLite: the next run time a worker arms its timer for, the due
//! backlog of queues, and cancel requests for running tasks.
use sqlx::SqlitePool;

use super::{clock_now, map_err, rows::ms};
use crate::common::{duration_ms, json_list};
use crate::error::Result;
use crate::params::{CancelRequestedParams, Lease, NextRun, TaskNextRunParams};
use crate::shared::runtime::leases;

crate::shared::runtime::runtime_statements!(clocked sqlx::Sqlite, request_cancel);

pub(super) async fn next_run_at(
    pool: &SqlitePool,
    params: &TaskNextRunParams,
) -> Result<Option<NextRun>> {
    let now = clock_now(pool, params.now).await?;
    // Served by the claim index (queue, priority, run_at): one range per queue and
    // priority, each read from its first future entry.
    let next: Option<i64> = sqlx::query_scalar(
        "SELECT MIN(run_at) FROM tenax_tasks
         WHERE status IN ('pending', 'retrying') AND run_at > ?1 - ?4
           AND queue IN (SELECT value FROM json_each(?2))
           AND EXISTS (SELECT 1 FROM json_each(?3) AS offer
                       WHERE json_extract(offer.value, '$[0]') = command_type
                         AND json_extract(offer.value, '$[1]') >= payload_version)",
    )
    .bind(now)
    .bind(json_list(&params.queues))
    .bind(json_list(&params.commands))
    .bind(duration_ms(params.since))
    .fetch_one(pool)
    .await
    .map_err(map_err)?;
    Ok(match next {
        Some(run_at) => Some(NextRun {
            run_at: ms(run_at)?,
            now: ms(now)?,
        }),
        None => None,
    })
}

pub(super) async fn cancel_requested(
    pool: &SqlitePool,
    params: &CancelRequestedParams,
) -> Result<Vec<Lease>> {
    if params.leases.is_empty() {
        return Ok(Vec::new());
    }
    let pairs = json_list(
        &params
            .leases
            .iter()
            .map(|l| [l.id.0, l.epoch])
            .collect::<Vec<_>>(),
    );
    let rows: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT id, lease_epoch FROM tenax_tasks
         WHERE status = 'running' AND cancel_requested_at IS NOT NULL
           AND (id, lease_epoch) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
                                     FROM json_each(?1))",
    )
    .bind(pairs)
    .fetch_all(pool)
    .await
    .map_err(map_err)?;
    Ok(leases(rows))
}

pub(super) async fn due_count(
    pool: &SqlitePool,
    params: &crate::due::TaskDueCountParams,
) -> Result<crate::due::DueCount> {
    let now = clock_now(pool, params.now).await?;
    let (due, oldest): (i64, Option<i64>) = sqlx::query_as(
        "SELECT COUNT(*), MIN(run_at) FROM (
             SELECT run_at FROM tenax_tasks
             WHERE status IN ('pending', 'retrying') AND run_at <= ?1
               AND queue IN (SELECT value FROM json_each(?2))
               AND command_type = ?3 AND payload_version <= ?4
             ORDER BY run_at
             LIMIT ?5)",
    )
    .bind(now)
    .bind(json_list(&params.queues))
    .bind(&params.command_type)
    .bind(i64::from(params.version))
    .bind(i64::from(params.limit))
    .fetch_one(pool)
    .await
    .map_err(map_err)?;
    Ok(crate::due::DueCount {
        due: u32::try_from(due).unwrap_or(u32::MAX),
        oldest_due_at: oldest.map(ms).transpose()?,
        now: ms(now)?,
    })
}
