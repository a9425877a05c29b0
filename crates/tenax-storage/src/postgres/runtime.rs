//! Runtime support on PostgreSQL: lease renewal (the heartbeat's statement), the next
//! run time a worker arms its timer for, the due backlog of queues, and cancel requests
//! for running tasks.
use chrono::{DateTime, Utc};
use sqlx::{PgPool, Postgres, Transaction};
use tenax_core::TaskId;

use super::{map_err, NOW};
use crate::common::duration_ms;
use crate::error::Result;
use crate::params::{
    CancelRequestedParams, Lease, LeaseExtendParams, NextRun, QueueBacklog, QueueBacklogParams,
    TaskNextRunParams,
};
use crate::shared::runtime::leases;

crate::shared::runtime::runtime_statements!(sqlx::Postgres, cancel_request);

/// Record a cancel request on a running task (the first request's time is kept), at
/// the caller's override or the transaction's start.
pub(super) async fn request_cancel(
    tx: &mut Transaction<'static, Postgres>,
    now: Option<DateTime<Utc>>,
    id: TaskId,
) -> Result<bool> {
    cancel_request(tx, id, now).await
}

pub(super) async fn next_run_at(
    pool: &PgPool,
    params: &TaskNextRunParams,
) -> Result<Option<NextRun>> {
    let (types, versions): (Vec<&str>, Vec<i32>) = params
        .commands
        .iter()
        .map(|(t, v)| (t.as_str(), i32::try_from(*v).unwrap_or(i32::MAX)))
        .unzip();
    // One short ordered read of the claim index (queue, priority, run_at) per queue and
    // priority: its first future entry of a type the worker knows.
    let (next, now): (Option<DateTime<Utc>>, DateTime<Utc>) = sqlx::query_as(&format!(
        "SELECT MIN(n.run_at), {NOW}
         FROM unnest($2::text[]) AS q(queue)
         CROSS JOIN generate_series(0, 9) AS p(priority)
         CROSS JOIN LATERAL (
             SELECT run_at FROM tenax_tasks
             WHERE queue = q.queue AND priority = p.priority
               AND status IN ('pending', 'retrying')
               AND run_at > {NOW} - $5::float8 * interval '1 millisecond'
               AND command_type = ANY($3)
               AND payload_version <= ($4::int4[])[array_position($3, command_type)]
             ORDER BY run_at
             LIMIT 1
         ) n"
    ))
    .bind(params.now)
    .bind(&params.queues)
    .bind(&types)
    .bind(&versions)
    .bind(duration_ms(params.since) as f64)
    .fetch_one(pool)
    .await
    .map_err(map_err)?;
    Ok(next.map(|run_at| NextRun { run_at, now }))
}

pub(super) async fn queue_backlog(
    pool: &PgPool,
    params: &QueueBacklogParams,
) -> Result<Vec<QueueBacklog>> {
    let rows: Vec<(String, i64, Option<DateTime<Utc>>)> = sqlx::query_as(&format!(
        "SELECT q.queue, COUNT(t.id), MIN(t.run_at)
         FROM unnest($2::text[]) WITH ORDINALITY AS q(queue, ord)
         LEFT JOIN tenax_tasks t
           ON t.queue = q.queue AND t.status IN ('pending', 'retrying') AND t.run_at <= {NOW}
         GROUP BY q.queue, q.ord
         ORDER BY q.ord"
    ))
    .bind(params.now)
    .bind(&params.queues)
    .fetch_all(pool)
    .await
    .map_err(map_err)?;
    Ok(rows
        .into_iter()
        .map(|(queue, due, oldest_due_at)| QueueBacklog {
            queue,
            due: u64::try_from(due).unwrap_or(0),
            oldest_due_at,
        })
        .collect())
}

pub(super) async fn cancel_requested(
    pool: &PgPool,
    params: &CancelRequestedParams,
) -> Result<Vec<Lease>> {
    if params.leases.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<i64> = params.leases.iter().map(|l| l.id.0).collect();
    let epochs: Vec<i64> = params.leases.iter().map(|l| l.epoch).collect();
    let rows: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT t.id, t.lease_epoch
         FROM unnest($1::bigint[], $2::bigint[]) AS l(id, epoch)
         JOIN tenax_tasks t ON t.id = l.id AND t.lease_epoch = l.epoch
         WHERE t.status = 'running' AND t.cancel_requested_at IS NOT NULL",
    )
    .bind(&ids)
    .bind(&epochs)
    .fetch_all(pool)
    .await
    .map_err(map_err)?;
    Ok(leases(rows))
}

pub(super) async fn due_count(
    pool: &PgPool,
    params: &crate::due::TaskDueCountParams,
) -> Result<crate::due::DueCount> {
    let (due, oldest, now): (i64, Option<DateTime<Utc>>, DateTime<Utc>) = sqlx::query_as(&format!(
        "SELECT COUNT(*), MIN(d.run_at), {NOW} FROM (
                 SELECT run_at FROM tenax_tasks
                 WHERE status IN ('pending', 'retrying') AND run_at <= {NOW}
                   AND queue = ANY($2) AND command_type = $3 AND payload_version <= $4
                 ORDER BY run_at
                 LIMIT $5) d"
    ))
    .bind(params.now)
    .bind(&params.queues)
    .bind(&params.command_type)
    .bind(i32::try_from(params.version).unwrap_or(i32::MAX))
    .bind(i64::from(params.limit))
    .fetch_one(pool)
    .await
    .map_err(map_err)?;
    Ok(crate::due::DueCount {
        due: u32::try_from(due).unwrap_or(u32::MAX),
        oldest_due_at: oldest,
        now,
    })
}

/// Renew the leases still held (running under the same epoch) in one statement, on the
/// heartbeats' own pool; answers the renewed ones.
pub(super) async fn lease_extend(pool: &PgPool, params: &LeaseExtendParams) -> Result<Vec<Lease>> {
    let ids: Vec<i64> = params.leases.iter().map(|l| l.id.0).collect();
    let epochs: Vec<i64> = params.leases.iter().map(|l| l.epoch).collect();
    let renewed: Vec<(i64, i64)> = sqlx::query_as(&format!(
        "UPDATE tenax_tasks t
         SET lease_expires_at = {NOW} + $2::float8 * interval '1 millisecond', updated_at = {NOW}
         FROM unnest($3::bigint[], $4::bigint[]) AS l(id, epoch)
         WHERE t.id = l.id AND t.lease_epoch = l.epoch AND t.status = 'running'
         RETURNING t.id, t.lease_epoch"
    ))
    .bind(params.now)
    .bind(duration_ms(params.lease_ttl) as f64)
    .bind(&ids)
    .bind(&epochs)
    .fetch_all(pool)
    .await
    .map_err(map_err)?;
    Ok(leases(renewed))
}
