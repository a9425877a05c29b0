//! Runtime support on MariaDB/MySQL: lease renewal (the heartbeat's statement), the next
//! run time a worker arms its timer for, the due backlog of queues, and cancel requests
//! for running tasks.
use sqlx::{MySql, MySqlPool, QueryBuilder, Row, Transaction};
use tenax_core::{TaskId, TaskStatus};

use super::{clock, datetime_range, map_err, plus, push_list, storable, DbTime, MySqlStorage};
use crate::error::Result;
use crate::params::{CancelRequestedParams, Lease, LeaseExtendParams, NextRun, TaskNextRunParams};

crate::shared::runtime::runtime_statements!(clocked sqlx::MySql, request_cancel);

/// Whether a cancel was requested for a task (locked by the caller's transaction).
pub(super) async fn cancel_is_requested(
    tx: &mut Transaction<'static, MySql>,
    id: TaskId,
) -> Result<bool> {
    let requested: Option<bool> =
        sqlx::query_scalar("SELECT cancel_requested_at IS NOT NULL FROM tenax_tasks WHERE id = ?")
            .bind(id.0)
            .fetch_optional(&mut **tx)
            .await
            .map_err(map_err)?;
    Ok(requested.unwrap_or(false))
}

pub(super) async fn next_run_at(
    pool: &MySqlPool,
    params: &TaskNextRunParams,
) -> Result<Option<NextRun>> {
    // Served by the claim index, which leads on (status, queue).
    let now: DbTime = match params.now {
        Some(now) => storable(now),
        None => sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
            .fetch_one(pool)
            .await
            .map_err(map_err)?,
    };
    let mut qb = QueryBuilder::<MySql>::new(
        "SELECT MIN(run_at) FROM tenax_tasks
         WHERE status IN ('pending', 'retrying') AND run_at > ",
    );
    let since = chrono::TimeDelta::from_std(params.since.min(crate::MAX_DELAY))
        .unwrap_or(chrono::TimeDelta::zero());
    qb.push_bind(now.checked_sub_signed(since).unwrap_or(datetime_range().0));
    qb.push(" AND queue IN (");
    let mut queues = qb.separated(", ");
    for queue in &params.queues {
        queues.push_bind(queue.as_str());
    }
    qb.push(") AND (");
    for (i, (command_type, version)) in params.commands.iter().enumerate() {
        if i > 0 {
            qb.push(" OR ");
        }
        qb.push("(command_type = ");
        qb.push_bind(command_type.as_str());
        qb.push(" AND payload_version <= ");
        qb.push_bind(i64::from(*version));
        qb.push(")");
    }
    qb.push(")");
    let next: Option<DbTime> = qb
        .build_query_scalar()
        .fetch_one(pool)
        .await
        .map_err(map_err)?;
    Ok(next.map(|t| NextRun {
        run_at: t.and_utc(),
        now: now.and_utc(),
    }))
}

pub(super) async fn cancel_requested(
    pool: &MySqlPool,
    params: &CancelRequestedParams,
) -> Result<Vec<Lease>> {
    if params.leases.is_empty() {
        return Ok(Vec::new());
    }
    let mut qb = QueryBuilder::<MySql>::new(
        "SELECT id, lease_epoch FROM tenax_tasks
         WHERE status = 'running' AND cancel_requested_at IS NOT NULL AND id IN (",
    );
    let mut ids = qb.separated(", ");
    for lease in &params.leases {
        ids.push_bind(lease.id.0);
    }
    qb.push(")");
    let rows: Vec<(i64, i64)> = qb.build_query_as().fetch_all(pool).await.map_err(map_err)?;
    let mut requested = crate::shared::runtime::leases(rows);
    requested.retain(|lease| params.leases.contains(lease));
    Ok(requested)
}

pub(super) async fn due_count(
    pool: &MySqlPool,
    params: &crate::due::TaskDueCountParams,
) -> Result<crate::due::DueCount> {
    let now: DbTime = match params.now {
        Some(now) => storable(now),
        None => sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
            .fetch_one(pool)
            .await
            .map_err(map_err)?,
    };
    if params.queues.is_empty() {
        return Ok(crate::due::DueCount {
            due: 0,
            oldest_due_at: None,
            now: now.and_utc(),
        });
    }
    let mut qb = QueryBuilder::<MySql>::new(
        "SELECT COUNT(*), MIN(d.run_at) FROM (
             SELECT run_at FROM tenax_tasks
             WHERE status IN ('pending', 'retrying') AND run_at <= ",
    );
    qb.push_bind(now);
    qb.push(" AND queue IN (");
    let mut queues = qb.separated(", ");
    for queue in &params.queues {
        queues.push_bind(queue.as_str());
    }
    qb.push(") AND command_type = ");
    qb.push_bind(params.command_type.as_str());
    qb.push(" AND payload_version <= ");
    qb.push_bind(i64::from(params.version));
    qb.push(" ORDER BY run_at LIMIT ");
    qb.push_bind(i64::from(params.limit));
    qb.push(") d");
    let (due, oldest): (i64, Option<DbTime>) =
        qb.build_query_as().fetch_one(pool).await.map_err(map_err)?;
    Ok(crate::due::DueCount {
        due: u32::try_from(due).unwrap_or(u32::MAX),
        oldest_due_at: oldest.map(|t| t.and_utc()),
        now: now.and_utc(),
    })
}

impl MySqlStorage {
    /// Renew the leases still held (running under the same epoch), in one transaction
    /// on the heartbeats' own connection; answers the renewed ones.
    pub(super) async fn lease_extend_once(&self, params: &LeaseExtendParams) -> Result<Vec<Lease>> {
        let mut tx = self.leases.begin().await.map_err(map_err)?;
        let now = clock(&mut tx, params.now).await?;
        // By id only, so the lock is taken through the primary key: a status condition
        // could lead the optimizer to scan (and wait for) other running tasks.
        let mut qb =
            QueryBuilder::new("SELECT id, status, lease_epoch FROM tenax_tasks WHERE id IN ");
        push_list(&mut qb, params.leases.iter().map(|l| l.id.0));
        qb.push(" ORDER BY id FOR UPDATE");
        let rows = qb.build().fetch_all(&mut *tx).await.map_err(map_err)?;
        let mut held = Vec::new();
        for row in &rows {
            let id: i64 = row.try_get("id").map_err(map_err)?;
            let status: Vec<u8> = row.try_get("status").map_err(map_err)?;
            let epoch: i64 = row.try_get("lease_epoch").map_err(map_err)?;
            let lease = Lease {
                id: TaskId(id),
                epoch,
            };
            if status == TaskStatus::Running.as_str().as_bytes() && params.leases.contains(&lease) {
                held.push(lease);
            }
        }
        if held.is_empty() {
            tx.rollback().await.map_err(map_err)?;
            return Ok(Vec::new());
        }
        let mut qb = QueryBuilder::new("UPDATE tenax_tasks SET lease_expires_at = ");
        qb.push_bind(plus(now, params.lease_ttl));
        qb.push(", updated_at = ");
        qb.push_bind(now);
        qb.push(" WHERE status = 'running' AND id IN ");
        push_list(&mut qb, held.iter().map(|l| l.id.0));
        qb.build().execute(&mut *tx).await.map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(held)
    }
}
