//! The claim on SQLite, with the queue controls it honours (the business keys' part is
//! in `keys.rs`). SQLite has one writer at a time (every write is `BEGIN IMMEDIATE`), so
//! counting a queue's or a key's running tasks inside the claim's transaction is exact
//! without row locks.
//!
//! The fast path, when no queue of the claim is paused or limited and no task with a
//! concurrency key is due, is one `UPDATE ... RETURNING` over the claim index; otherwise
//! [`pick`] chooses the ids first.
use std::collections::BTreeMap;

use sqlx::{Row, Sqlite, Transaction};
use tenax_core::TaskRecord;

use super::rows::{task_from_row, TASK_COLUMNS};
use super::{clock, keys, map_err, SqliteStorage, STEP_MS};
use crate::common::{
    duration_ms, json_list, pick_keyed, room, sort_in_claim_order, KeyedCandidate, QueueControls,
};
use crate::error::Result;
use crate::params::TaskClaimParams;
use crate::ATTEMPT_HISTORY_LEN;

impl SqliteStorage {
    /// The claim without rate limits, in one `BEGIN IMMEDIATE` transaction.
    pub(super) async fn claim_plain(&self, params: &TaskClaimParams) -> Result<Vec<TaskRecord>> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        const CLAIM: &str = "UPDATE tenax_tasks
             SET status = 'running', attempt = attempt + 1, lease_epoch = lease_epoch + 1,
                 lease_owner = ?1, lease_expires_at = ?2 + ?3,
                 started_at = COALESCE(started_at, ?2), updated_at = ?2
             WHERE id IN ";
        let controls = controls(&mut tx, &params.queues).await?;
        // Tasks with a concurrency key take the restricted path (their keys are
        // counted); without any due, the claim is the one statement below.
        let fast = controls.is_empty() && !keys::keyed_due(&mut tx, params, now).await?;
        let rows = if fast {
            // The fast path: no queue of the claim is paused or limited. ?5 is a JSON
            // list of [type, highest payload version the worker decodes]. The order is
            // the aging key of tenax_tasks_claim_key, written as in the index so the
            // planner walks it; a due task's key is at most now, which bounds the walk.
            sqlx::query(&format!(
                "{CLAIM} (
                     SELECT id FROM tenax_tasks
                     WHERE status IN ('pending', 'retrying') AND run_at <= ?2
                       AND run_at - priority * {STEP_MS} <= ?2
                       AND queue IN (SELECT value FROM json_each(?4))
                       AND EXISTS (SELECT 1 FROM json_each(?5) AS offer
                                   WHERE json_extract(offer.value, '$[0]') = command_type
                                     AND json_extract(offer.value, '$[1]') >= payload_version)
                     ORDER BY run_at - priority * {STEP_MS}, id
                     LIMIT ?6)
                 RETURNING {TASK_COLUMNS}"
            ))
            .bind(&params.worker)
            .bind(now)
            .bind(duration_ms(params.lease_ttl))
            .bind(json_list(&params.queues))
            .bind(json_list(&params.commands))
            .bind(i64::from(params.limit))
            .fetch_all(&mut *tx)
            .await
            .map_err(map_err)?
        } else {
            let ids = pick(&mut tx, params, now, &controls).await?;
            sqlx::query(&format!(
                "{CLAIM} (SELECT value FROM json_each(?4)) RETURNING {TASK_COLUMNS}"
            ))
            .bind(&params.worker)
            .bind(now)
            .bind(duration_ms(params.lease_ttl))
            .bind(json_list(&ids))
            .fetch_all(&mut *tx)
            .await
            .map_err(map_err)?
        };
        let mut tasks = rows.iter().map(task_from_row).collect::<Result<Vec<_>>>()?;
        if tasks.is_empty() {
            tx.rollback().await.map_err(map_err)?;
            return Ok(tasks);
        }
        let ids = json_list(&tasks.iter().map(|t| t.id.0).collect::<Vec<_>>());
        sqlx::query(
            "INSERT INTO tenax_attempts (task_id, epoch, attempt, worker, started_at, outcome)
             SELECT id, lease_epoch, attempt, lease_owner, ?1, 'running' FROM tenax_tasks
             WHERE id IN (SELECT value FROM json_each(?2))",
        )
        .bind(now)
        .bind(&ids)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        // Only a task past its first ATTEMPT_HISTORY_LEN epochs has attempts to drop.
        let long: Vec<i64> = tasks
            .iter()
            .filter(|t| t.lease_epoch > ATTEMPT_HISTORY_LEN)
            .map(|t| t.id.0)
            .collect();
        if !long.is_empty() {
            sqlx::query(
                "DELETE FROM tenax_attempts
                 WHERE task_id IN (SELECT value FROM json_each(?1))
                   AND epoch <= (SELECT t.lease_epoch FROM tenax_tasks t
                                 WHERE t.id = tenax_attempts.task_id) - ?2",
            )
            .bind(json_list(&long))
            .bind(ATTEMPT_HISTORY_LEN)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
        sort_in_claim_order(&mut tasks);
        Ok(tasks)
    }
}

/// The controls of the queues a claim names (only queues that are paused or limited).
async fn controls(
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

/// The ids a restricted claim takes: the best candidates (claim order) of the unlimited
/// queues and of each limited queue up to its room, the best `limit` of all of them.
/// Paused queues contribute nothing. A keyed task is taken only while its key has a
/// free slot; keys already full are left out of the walk, so the tasks behind them
/// are not blocked.
async fn pick(
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
        keys::running_keys(tx, &keys).await?
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
