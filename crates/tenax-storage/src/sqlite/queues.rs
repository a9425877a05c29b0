//! Queue controls on SQLite: pause, resume and per-queue limits on running tasks, and the
//! part of the claim that honours them. SQLite has one writer at a time (every write is
//! `BEGIN IMMEDIATE`), so counting a queue's running tasks inside the claim's
//! transaction is exact without row locks.
use std::collections::BTreeMap;

use sqlx::{Row, Sqlite, Transaction};

use super::rows::ms;
use super::{clock, map_err, SqliteStorage, STEP_MS};
use crate::common::{
    json_list, pick_keyed, room, validate_queue_update, KeyedCandidate, QueueControls,
};
use crate::error::{Result, StorageError};
use crate::params::{QueueChange, QueueInfo, QueueUpdateParams, TaskClaimParams};

/// The controls of the queues a claim names (only queues that are paused or limited).
pub(super) async fn controls(
    tx: &mut Transaction<'static, Sqlite>,
    queues: &[String],
) -> Result<QueueControls> {
    let rows = sqlx::query(
        "SELECT name, paused, max_running FROM tenax_queues
         WHERE name IN (SELECT value FROM json_each(?1))
           AND (paused = 1 OR max_running IS NOT NULL)
         ORDER BY name",
    )
    .bind(json_list(queues))
    .fetch_all(&mut **tx)
    .await
    .map_err(map_err)?;
    let mut controls = QueueControls::default();
    for row in &rows {
        let name: String = row.try_get("name").map_err(map_err)?;
        let paused: bool = row.try_get("paused").map_err(map_err)?;
        let max_running: Option<i64> = row.try_get("max_running").map_err(map_err)?;
        if paused {
            controls.paused.push(name);
        } else if let Some(max) = max_running {
            controls
                .limited
                .push((name, u32::try_from(max).unwrap_or(u32::MAX)));
        }
    }
    Ok(controls)
}

/// Running tasks per queue, for the given queues.
async fn running(
    tx: &mut Transaction<'static, Sqlite>,
    queues: &[&str],
) -> Result<BTreeMap<String, i64>> {
    let rows = sqlx::query(
        "SELECT queue, COUNT(*) AS n FROM tenax_tasks
         WHERE status = 'running' AND queue IN (SELECT value FROM json_each(?1))
         GROUP BY queue",
    )
    .bind(json_list(queues))
    .fetch_all(&mut **tx)
    .await
    .map_err(map_err)?;
    rows.iter()
        .map(|row| {
            Ok((
                row.try_get::<String, _>("queue").map_err(map_err)?,
                row.try_get::<i64, _>("n").map_err(map_err)?,
            ))
        })
        .collect()
}

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
async fn running_keys(
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

/// The ids a restricted claim takes: the best candidates (claim order) of the unlimited
/// queues and of each limited queue up to its room, the best `limit` of all of them.
/// Paused queues contribute nothing. A keyed task is taken only while its key has a
/// free slot; keys already full are left out of the walk, so the tasks behind them
/// are not blocked.
pub(super) async fn pick(
    tx: &mut Transaction<'static, Sqlite>,
    params: &TaskClaimParams,
    now: i64,
    controls: &QueueControls,
) -> Result<Vec<i64>> {
    let limited: Vec<&str> = controls.limited.iter().map(|(q, _)| q.as_str()).collect();
    let free: Vec<&str> = params
        .queues
        .iter()
        .map(String::as_str)
        .filter(|q| !limited.contains(q) && !controls.paused.iter().any(|p| p == q))
        .collect();
    let running = running(tx, &limited).await?;
    let mut groups: Vec<(Vec<&str>, u32)> = Vec::new();
    if !free.is_empty() {
        groups.push((free, params.limit));
    }
    for (queue, max) in &controls.limited {
        let room = room(*max, running.get(queue).copied().unwrap_or(0));
        if room > 0 {
            groups.push((vec![queue.as_str()], room.min(params.limit)));
        }
    }
    let mut candidates: Vec<(i64, i64, Option<String>, u32)> = Vec::new();
    for (queues, cap) in groups {
        let rows = sqlx::query(&format!(
            "SELECT id, run_at - priority * {STEP_MS} AS claim_key, concurrency_key,
                    concurrency_limit
             FROM tenax_tasks t
             WHERE status IN ('pending', 'retrying') AND run_at <= ?1
               AND (concurrency_key IS NULL
                    OR concurrency_limit > (SELECT COUNT(*) FROM tenax_tasks r
                                            WHERE r.status = 'running'
                                              AND r.concurrency_key = t.concurrency_key))
               AND run_at - priority * {STEP_MS} <= ?1
               AND queue IN (SELECT value FROM json_each(?2))
               AND EXISTS (SELECT 1 FROM json_each(?3) AS offer
                           WHERE json_extract(offer.value, '$[0]') = command_type
                             AND json_extract(offer.value, '$[1]') >= payload_version)
             ORDER BY run_at - priority * {STEP_MS}, id
             LIMIT ?4"
        ))
        .bind(now)
        .bind(json_list(&queues))
        .bind(json_list(&params.commands))
        .bind(i64::from(cap))
        .fetch_all(&mut **tx)
        .await
        .map_err(map_err)?;
        for row in &rows {
            candidates.push((
                row.try_get("claim_key").map_err(map_err)?,
                row.try_get("id").map_err(map_err)?,
                row.try_get("concurrency_key").map_err(map_err)?,
                u32::try_from(
                    row.try_get::<i64, _>("concurrency_limit")
                        .map_err(map_err)?,
                )
                .unwrap_or(1),
            ));
        }
    }
    candidates.sort_unstable();
    let keys: Vec<&str> = candidates
        .iter()
        .filter_map(|(_, _, key, _)| key.as_deref())
        .collect();
    let running = if keys.is_empty() {
        BTreeMap::new()
    } else {
        running_keys(tx, &keys).await?
    };
    let candidates: Vec<KeyedCandidate> = candidates
        .into_iter()
        .map(|(_, id, key, max)| (id, key, max))
        .collect();
    Ok(pick_keyed(
        &candidates,
        &running,
        usize::try_from(params.limit).unwrap_or(usize::MAX),
    ))
}

impl SqliteStorage {
    pub(super) async fn queue_list_impl(&self) -> Result<Vec<QueueInfo>> {
        let rows = sqlx::query(
            "WITH counts AS (
                 SELECT queue,
                        SUM(status IN ('pending', 'retrying')) AS waiting,
                        SUM(status = 'running') AS running
                 FROM tenax_tasks WHERE status IN ('pending', 'retrying', 'running')
                 GROUP BY queue
             ), names AS (
                 SELECT queue AS name FROM counts UNION SELECT name FROM tenax_queues
             )
             SELECT n.name, COALESCE(q.paused, 0) AS paused, q.max_running, q.updated_at,
                    COALESCE(c.waiting, 0) AS waiting, COALESCE(c.running, 0) AS running
             FROM names n
             LEFT JOIN tenax_queues q ON q.name = n.name
             LEFT JOIN counts c ON c.queue = n.name
             ORDER BY n.name",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(queue_from_row).collect()
    }

    pub(super) async fn queue_update_impl(&self, params: &QueueUpdateParams) -> Result<QueueInfo> {
        validate_queue_update(params)?;
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        sqlx::query(
            "INSERT INTO tenax_queues (name, paused, max_running, updated_at) VALUES (?1, 0, NULL, ?2)
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(&params.queue)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        // ?3 is the new `paused` (NULL keeps it), ?4 whether to set `max_running` to ?5.
        let (paused, set_max, max) = match params.change {
            QueueChange::Pause => (Some(true), false, None),
            QueueChange::Resume => (Some(false), false, None),
            QueueChange::MaxRunning(max) => (None, true, max),
        };
        sqlx::query(
            "UPDATE tenax_queues
             SET paused = COALESCE(?3, paused),
                 max_running = CASE WHEN ?4 THEN ?5 ELSE max_running END,
                 updated_at = ?2
             WHERE name = ?1",
        )
        .bind(&params.queue)
        .bind(now)
        .bind(paused)
        .bind(set_max)
        .bind(max.map(i64::from))
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let row = sqlx::query(
            "SELECT q.name, q.paused, q.max_running, q.updated_at,
                    (SELECT COUNT(*) FROM tenax_tasks
                     WHERE queue = q.name AND status IN ('pending', 'retrying')) AS waiting,
                    (SELECT COUNT(*) FROM tenax_tasks
                     WHERE queue = q.name AND status = 'running') AS running
             FROM tenax_queues q WHERE q.name = ?1",
        )
        .bind(&params.queue)
        .fetch_one(&mut *tx)
        .await
        .map_err(map_err)?;
        let info = queue_from_row(&row)?;
        tx.commit().await.map_err(map_err)?;
        self.wake();
        Ok(info)
    }
}

fn queue_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<QueueInfo> {
    let count = |column: &str| -> Result<u64> {
        let n: i64 = row.try_get(column).map_err(map_err)?;
        Ok(u64::try_from(n).unwrap_or(0))
    };
    let max_running: Option<i64> = row.try_get("max_running").map_err(map_err)?;
    let updated_at: Option<i64> = row.try_get("updated_at").map_err(map_err)?;
    Ok(QueueInfo {
        name: row.try_get("name").map_err(map_err)?,
        paused: row.try_get("paused").map_err(map_err)?,
        max_running: max_running
            .map(|n| {
                u32::try_from(n).map_err(|_| StorageError::Corrupt(format!("max_running = {n}")))
            })
            .transpose()?,
        waiting: count("waiting")?,
        running: count("running")?,
        updated_at: updated_at.map(ms).transpose()?,
    })
}
