//! Business-key concurrency on PostgreSQL: the claim of tasks with a concurrency key.
//!
//! The fast claim statement leaves keyed tasks out and reports whether any is due; only
//! then does this transaction run. It locks the claim's controlled queues' rows (name
//! order), walks the keyed tasks' partial index per queue (`FOR UPDATE SKIP LOCKED`,
//! stepping over keys already full, so they block nobody), then locks the candidates'
//! keys' rows of `tenax_concurrency_keys` (upserted, then `FOR UPDATE` in name order: two
//! claimers never deadlock), counts each key's running tasks in a statement that starts
//! after the lock (READ COMMITTED: it sees every claim committed by the previous holder)
//! and claims at most the free slots of each key. Claimers of one key take turns, so the
//! limit holds exactly across nodes.
use std::collections::BTreeMap;

use sqlx::Row;
use tenax_core::TaskRecord;

use super::rows::{task_from_row, TASK_COLUMNS};
use super::{map_err, PgStorage, NOW};
use crate::common::{duration_ms, pick_keyed, room, KeyedCandidate};
use crate::error::Result;
use crate::params::TaskClaimParams;
use crate::ATTEMPT_HISTORY_LEN;

/// Rounds of upsert and lock before a keyed claim gives up until the next poll.
const KEY_LOCK_TRIES: usize = 4;

impl PgStorage {
    /// Claim at most `limit` keyed tasks, each only while its key has a free slot.
    pub(super) async fn claim_keyed(
        &self,
        params: &TaskClaimParams,
        limit: u32,
    ) -> Result<Vec<TaskRecord>> {
        let mut tx = self.begin().await?;
        let controls: Vec<(String, bool, Option<i32>)> = sqlx::query_as(
            "SELECT name, paused, max_running FROM tenax_queues
             WHERE name = ANY($1) AND (paused OR max_running IS NOT NULL)
             ORDER BY name
             FOR UPDATE",
        )
        .bind(&params.queues)
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        let limited: Vec<&str> = controls
            .iter()
            .filter(|(_, paused, max)| !paused && max.is_some())
            .map(|(name, _, _)| name.as_str())
            .collect();
        let running_queues: Vec<(String, i64)> = if limited.is_empty() {
            Vec::new()
        } else {
            sqlx::query_as(
                "SELECT queue, count(*) FROM tenax_tasks
                 WHERE status = 'running' AND queue = ANY($1)
                 GROUP BY queue",
            )
            .bind(&limited)
            .fetch_all(&mut *tx)
            .await
            .map_err(map_err)?
        };
        let mut queues = Vec::new();
        let mut caps = Vec::new();
        for queue in &params.queues {
            let cap = match controls.iter().find(|(name, _, _)| name == queue) {
                Some((_, true, _)) => 0,
                Some((_, false, Some(max))) => {
                    let now_running = running_queues
                        .iter()
                        .find(|(q, _)| q == queue)
                        .map_or(0, |(_, n)| *n);
                    room(u32::try_from(*max).unwrap_or(0), now_running).min(limit)
                }
                _ => limit,
            };
            if cap > 0 {
                queues.push(queue.clone());
                caps.push(i64::from(cap));
            }
        }
        if queues.is_empty() {
            tx.rollback().await.map_err(map_err)?;
            return Ok(Vec::new());
        }
        let rows = sqlx::query(&format!(
            "SELECT c.id, c.concurrency_key, c.concurrency_limit
             FROM unnest($2::text[], $3::int8[]) AS q(queue, cap)
             CROSS JOIN LATERAL (
                 SELECT id, concurrency_key, concurrency_limit,
                        tenax_claim_key(run_at, priority) AS claim_key
                 FROM tenax_tasks t
                 WHERE queue = q.queue AND status IN ('pending', 'retrying')
                   AND concurrency_key IS NOT NULL
                   AND tenax_claim_key(run_at, priority) <= {NOW}
                   AND run_at <= {NOW} AND command_type = ANY($4)
                   AND payload_version <= ($5::int4[])[array_position($4, command_type)]
                   AND concurrency_limit > (SELECT count(*) FROM tenax_tasks r
                                            WHERE r.status = 'running'
                                              AND r.concurrency_key = t.concurrency_key)
                 ORDER BY tenax_claim_key(run_at, priority), id
                 LIMIT q.cap
                 FOR UPDATE SKIP LOCKED
             ) c
             ORDER BY c.claim_key, c.id"
        ))
        .bind(params.now)
        .bind(&queues)
        .bind(&caps)
        .bind(
            params
                .commands
                .iter()
                .map(|(t, _)| t.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            params
                .commands
                .iter()
                .map(|(_, v)| i32::try_from(*v).unwrap_or(i32::MAX))
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        let mut candidates: Vec<KeyedCandidate> = Vec::with_capacity(rows.len());
        for row in &rows {
            candidates.push((
                row.try_get("id").map_err(map_err)?,
                row.try_get("concurrency_key").map_err(map_err)?,
                u32::try_from(
                    row.try_get::<i32, _>("concurrency_limit")
                        .map_err(map_err)?,
                )
                .unwrap_or(1),
            ));
        }
        let mut keys: Vec<&str> = candidates
            .iter()
            .filter_map(|(_, key, _)| key.as_deref())
            .collect();
        keys.sort_unstable();
        keys.dedup();
        if keys.is_empty() {
            tx.rollback().await.map_err(map_err)?;
            return Ok(Vec::new());
        }
        // The pruner may delete a key's row between the upsert and the lock (it removes
        // rows no live task needs, as read before this claim's candidates were
        // committed): the lock then finds no row. Write the missing rows again until
        // every key's row is held, so the count below is always made under the lock.
        let mut held = 0;
        for _ in 0..KEY_LOCK_TRIES {
            sqlx::query(
                "INSERT INTO tenax_concurrency_keys (name)
                 SELECT k FROM unnest($1::text[]) AS k ORDER BY k
                 ON CONFLICT DO NOTHING",
            )
            .bind(&keys)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
            held = sqlx::query(
                "SELECT name FROM tenax_concurrency_keys WHERE name = ANY($1)
                 ORDER BY name FOR UPDATE",
            )
            .bind(&keys)
            .fetch_all(&mut *tx)
            .await
            .map_err(map_err)?
            .len();
            if held == keys.len() {
                break;
            }
        }
        if held != keys.len() {
            // Claim nothing this time; the next poll tries again.
            tx.rollback().await.map_err(map_err)?;
            return Ok(Vec::new());
        }
        let running: BTreeMap<String, i64> = sqlx::query_as::<_, (String, i64)>(
            "SELECT concurrency_key, count(*) FROM tenax_tasks
             WHERE status = 'running' AND concurrency_key = ANY($1)
             GROUP BY concurrency_key",
        )
        .bind(&keys)
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?
        .into_iter()
        .collect();
        let ids = pick_keyed(
            &candidates,
            &running,
            usize::try_from(limit).unwrap_or(usize::MAX),
        );
        if ids.is_empty() {
            tx.rollback().await.map_err(map_err)?;
            return Ok(Vec::new());
        }
        let rows = sqlx::query(&format!(
            "WITH claimed AS (
                 UPDATE tenax_tasks t
                 SET status = 'running', attempt = t.attempt + 1, lease_epoch = t.lease_epoch + 1,
                     lease_owner = $3,
                     lease_expires_at = {NOW} + $4::float8 * interval '1 millisecond',
                     started_at = COALESCE(t.started_at, {NOW}), updated_at = {NOW}
                 WHERE t.id = ANY($2)
                 RETURNING t.*
             ), history AS (
                 INSERT INTO tenax_attempts (task_id, epoch, attempt, worker, started_at, outcome)
                 SELECT id, lease_epoch, attempt, lease_owner, {NOW}, 'running' FROM claimed
             ), trimmed AS (
                 DELETE FROM tenax_attempts a USING claimed c
                 WHERE a.task_id = c.id AND a.epoch <= c.lease_epoch - $5
             )
             SELECT {TASK_COLUMNS} FROM claimed
             ORDER BY tenax_claim_key(run_at, priority), id"
        ))
        .bind(params.now)
        .bind(&ids)
        .bind(&params.worker)
        .bind(duration_ms(params.lease_ttl) as f64)
        .bind(ATTEMPT_HISTORY_LEN)
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        rows.iter().map(task_from_row).collect()
    }
}
