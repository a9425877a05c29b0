//! The claim on MariaDB/MySQL, with the queue controls it honours (the business keys'
//! part is in `keys.rs`).
//!
//! MySQL refuses `LIMIT` inside `IN (subquery)`, and MariaDB has no `UPDATE ...
//! RETURNING`: the claim locks the ids first (`FOR UPDATE SKIP LOCKED`), then writes
//! them by primary key and reads them back, in one transaction.
//!
//! The claim reads the controls of its queues (a primary-key read of `tenax_queues`).
//! When a queue is limited, it locks that queue's row (`FOR UPDATE`, queues in name
//! order so two claimers never deadlock) and counts the queue's running tasks after the
//! lock is held (READ COMMITTED: the count sees every claim committed by the previous
//! holder), so claimers of one limited queue take turns and `max_running` holds exactly
//! across nodes.
use std::collections::{BTreeMap, BTreeSet};

use sqlx::{MySql, QueryBuilder, Row, Transaction};
use tenax_core::{AttemptOutcome, TaskRecord};

use super::rows::text;
use super::{clock, fetch_ids, keys, map_err, plus, push_list, DbTime, MySqlStorage, CLAIMABLE};
use crate::common::{room, sort_in_claim_order, QueueControls};
use crate::error::Result;
use crate::params::TaskClaimParams;
use crate::ATTEMPT_HISTORY_LEN;

/// One attempt at the claim; `retrying` runs it again after a lock conflict.
impl MySqlStorage {
    pub(super) async fn claim_once(&self, params: &TaskClaimParams) -> Result<Vec<TaskRecord>> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        // MySQL refuses LIMIT inside IN (subquery), and MariaDB has no UPDATE ...
        // RETURNING: lock the ids first, then write and read them back.
        //
        // One branch per (status, queue), each walking the claim index in the claim's
        // order and stopping after `limit` rows, then the best `limit` of them. The
        // plain form (`status IN (..) AND queue IN (..) ORDER BY .. LIMIT n`) has to
        // filesort, and InnoDB locks every row it feeds the sort: one claimer would
        // hold every due task of its queues until it commits, and concurrent claimers
        // would SKIP them all and find nothing. The branches lock at most `limit` rows
        // each; the few not kept stay locked only until this transaction commits.
        let queues: BTreeSet<&str> = params.queues.iter().map(String::as_str).collect();
        let limit = i64::from(params.limit);
        // Queue controls: paused queues are left out, limited ones capped at their room
        // (below); with none, every queue is capped at the batch.
        let controls = controls(&mut tx, &queues.iter().copied().collect::<Vec<_>>()).await?;
        let mut caps: BTreeMap<&str, i64> = queues.iter().map(|q| (*q, limit)).collect();
        for queue in &controls.paused {
            caps.remove(queue.as_str());
        }
        if !controls.limited.is_empty() {
            for (queue, room) in lock_room(&mut tx, &controls.limited).await? {
                if let (Some(cap), Some(room)) = (caps.get_mut(queue.as_str()), room) {
                    *cap = (*cap).min(i64::from(room));
                }
            }
        }
        caps.retain(|_, cap| *cap > 0);
        if caps.is_empty() {
            tx.rollback().await.map_err(map_err)?;
            return Ok(Vec::new());
        }
        // Tasks with a concurrency key first, each key capped by its free slots (see
        // keys.rs); what they take comes off the queues' caps and the batch.
        let keyed = keys::pick(&mut tx, params, now, &caps, limit).await?;
        for (_, queue) in &keyed {
            if let Some(cap) = caps.get_mut(queue.as_str()) {
                *cap -= 1;
            }
        }
        caps.retain(|_, cap| *cap > 0);
        let limit = limit - i64::try_from(keyed.len()).unwrap_or(limit);
        let mut ids: Vec<i64> = keyed.iter().map(|(id, _)| *id).collect();
        if caps.is_empty() || limit <= 0 {
            return self.claim_ids(tx, params, now, ids).await;
        }
        let mut qb = QueryBuilder::new("");
        for (n, ((queue, cap), status)) in caps
            .iter()
            .flat_map(|q| CLAIMABLE.iter().map(move |s| (q, s)))
            .enumerate()
        {
            if n > 0 {
                qb.push(" UNION ALL ");
            }
            // `status` is one of the CLAIMABLE constants, not input.
            qb.push(format!(
                "(SELECT id, claim_key, queue FROM tenax_tasks
                  WHERE status = '{status}' AND concurrency_key IS NULL AND queue = "
            ));
            qb.push_bind(*queue);
            // A due task's key is at most now: the walk of tenax_tasks_claim_key stops there.
            qb.push(" AND claim_key <= ");
            qb.push_bind(now);
            qb.push(" AND run_at <= ");
            qb.push_bind(now);
            // The types and versions the worker knows: (command_type = ? AND
            // payload_version <= ?) OR ... . The index still leads on (status, queue), so
            // this is a filter on the rows the ordered walk reads: no sort, and no more
            // rows locked than before.
            qb.push(" AND (");
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
            qb.push(" ORDER BY claim_key, id LIMIT ");
            qb.push_bind(*cap);
            qb.push(" FOR UPDATE SKIP LOCKED)");
        }
        qb.push(" ORDER BY claim_key, id LIMIT ");
        qb.push_bind(limit);
        // A queue's two branches (pending, retrying) may together pass its cap: keep the
        // first `cap` of each queue in claim order.
        let mut taken: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
        for row in qb.build().fetch_all(&mut *tx).await.map_err(map_err)? {
            let queue: Vec<u8> = row.try_get("queue").map_err(map_err)?;
            let cap = std::str::from_utf8(&queue)
                .ok()
                .and_then(|q| caps.get(q))
                .copied()
                .unwrap_or(0);
            let n = taken.entry(queue).or_insert(0);
            if *n < cap {
                *n += 1;
                ids.push(row.try_get::<i64, _>("id").map_err(map_err)?);
            }
        }
        self.claim_ids(tx, params, now, ids).await
    }

    /// Claim the locked tasks `ids`, write their attempt history, and commit.
    async fn claim_ids(
        &self,
        mut tx: Transaction<'static, MySql>,
        params: &TaskClaimParams,
        now: DbTime,
        ids: Vec<i64>,
    ) -> Result<Vec<TaskRecord>> {
        if ids.is_empty() {
            tx.rollback().await.map_err(map_err)?;
            return Ok(Vec::new());
        }
        let mut qb = QueryBuilder::new(
            "UPDATE tenax_tasks
             SET status = 'running', attempt = attempt + 1, lease_epoch = lease_epoch + 1,
                 lease_owner = ",
        );
        qb.push_bind(params.worker.as_str());
        qb.push(", lease_expires_at = ");
        qb.push_bind(plus(now, params.lease_ttl));
        qb.push(", started_at = COALESCE(started_at, ");
        qb.push_bind(now);
        qb.push("), updated_at = ");
        qb.push_bind(now);
        qb.push(" WHERE id IN ");
        push_list(&mut qb, ids.iter().copied());
        qb.build().execute(&mut *tx).await.map_err(map_err)?;

        let mut tasks = fetch_ids(&mut tx, &ids).await?;

        // The attempt history is written from the rows just read, not with INSERT ...
        // SELECT or a DELETE joined to tenax_tasks: those read tenax_tasks with locks,
        // and on a small table the optimizer scans it and waits for tasks other
        // claimers hold, which SKIP LOCKED was meant to avoid.
        let mut qb = QueryBuilder::new(
            "INSERT INTO tenax_attempts (task_id, epoch, attempt, worker, started_at, outcome) ",
        );
        qb.push_values(&tasks, |mut row, task| {
            row.push_bind(task.id.0)
                .push_bind(task.lease_epoch)
                .push_bind(i64::from(task.attempt))
                .push_bind(params.worker.as_str())
                .push_bind(now)
                .push_bind(AttemptOutcome::Running.as_str());
        });
        qb.build().execute(&mut *tx).await.map_err(map_err)?;

        // Keep the last ATTEMPT_HISTORY_LEN attempts of each claimed task.
        let old: Vec<(i64, i64)> = tasks
            .iter()
            .filter(|t| t.lease_epoch > ATTEMPT_HISTORY_LEN)
            .map(|t| (t.id.0, t.lease_epoch - ATTEMPT_HISTORY_LEN))
            .collect();
        if !old.is_empty() {
            let mut qb = QueryBuilder::new("DELETE FROM tenax_attempts WHERE ");
            for (n, (id, last_dropped)) in old.into_iter().enumerate() {
                if n > 0 {
                    qb.push(" OR ");
                }
                qb.push("(task_id = ");
                qb.push_bind(id);
                qb.push(" AND epoch <= ");
                qb.push_bind(last_dropped);
                qb.push(")");
            }
            qb.build().execute(&mut *tx).await.map_err(map_err)?;
        }

        tx.commit().await.map_err(map_err)?;
        sort_in_claim_order(&mut tasks);
        Ok(tasks)
    }
}

/// The controls of the queues a claim names (only queues that are paused or limited).
async fn controls(tx: &mut Transaction<'static, MySql>, queues: &[&str]) -> Result<QueueControls> {
    let mut qb = QueryBuilder::new(
        "SELECT name, paused, max_running FROM tenax_queues
         WHERE (paused OR max_running IS NOT NULL) AND name IN ",
    );
    push_list(&mut qb, queues.iter().copied());
    let rows = qb.build().fetch_all(&mut **tx).await.map_err(map_err)?;
    let mut controls = QueueControls::default();
    for row in &rows {
        let name = text(row, "name")?;
        let paused: bool = row.try_get("paused").map_err(map_err)?;
        let max_running: Option<i32> = row.try_get("max_running").map_err(map_err)?;
        if paused {
            controls.paused.push(name);
        } else if let Some(max) = max_running {
            controls
                .limited
                .push((name, u32::try_from(max).unwrap_or(0)));
        }
    }
    Ok(controls)
}

/// Lock the rows of limited queues and return each one's room (`max_running − running`)
/// as it stands under the lock. A queue resumed, paused or unlimited meanwhile is
/// re-read here too.
async fn lock_room(
    tx: &mut Transaction<'static, MySql>,
    limited: &[(String, u32)],
) -> Result<BTreeMap<String, Option<u32>>> {
    let mut qb =
        QueryBuilder::new("SELECT name, paused, max_running FROM tenax_queues WHERE name IN ");
    push_list(&mut qb, limited.iter().map(|(q, _)| q.as_str()));
    qb.push(" ORDER BY name FOR UPDATE");
    let rows = qb.build().fetch_all(&mut **tx).await.map_err(map_err)?;
    let mut rooms = BTreeMap::new();
    for row in &rows {
        let name = text(row, "name")?;
        let paused: bool = row.try_get("paused").map_err(map_err)?;
        let max_running: Option<i32> = row.try_get("max_running").map_err(map_err)?;
        let room = match (paused, max_running) {
            (true, _) => Some(0),
            (false, None) => None,
            (false, Some(max)) => {
                // The claim index leads with (status, queue): an index range count.
                let running: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM tenax_tasks WHERE status = 'running' AND queue = ?",
                )
                .bind(name.as_str())
                .fetch_one(&mut **tx)
                .await
                .map_err(map_err)?;
                Some(room(u32::try_from(max).unwrap_or(0), running))
            }
        };
        rooms.insert(name, room);
    }
    Ok(rooms)
}
