//! Business-key concurrency on MariaDB/MySQL: the part of the claim that takes tasks
//! with a concurrency key.
//!
//! It runs inside the claim's transaction, after the queue locks, and only when a keyed
//! task waits (a probe of `tenax_tasks_keyed_claim`). It walks the keyed tasks per
//! (status, queue) with `FOR UPDATE SKIP LOCKED`, stepping over keys already full (so
//! they block nobody), then locks the candidates' keys' rows of `tenax_concurrency_keys`
//! (upserted in name order, so two claimers never deadlock), counts each key's running
//! tasks in a statement that starts after the lock (READ COMMITTED: it sees every claim
//! committed by the previous holder) and keeps at most the free slots of each key.
use std::collections::BTreeMap;

use sqlx::{MySql, QueryBuilder, Row, Transaction};

use super::{map_err, DbTime, CLAIMABLE};
use crate::common::{pick_keyed, KeyedCandidate};
use crate::error::Result;
use crate::params::TaskClaimParams;

/// Running tasks per key (all keys with a running task, or only `keys`).
async fn running(
    tx: &mut Transaction<'static, MySql>,
    keys: Option<&[&str]>,
) -> Result<BTreeMap<String, i64>> {
    let mut qb = QueryBuilder::new(
        "SELECT concurrency_key AS k, COUNT(*) AS n FROM tenax_tasks
         WHERE status = 'running' AND concurrency_key IS NOT NULL",
    );
    if let Some(keys) = keys {
        qb.push(" AND concurrency_key IN ");
        super::push_list(&mut qb, keys.iter().copied());
    }
    qb.push(" GROUP BY concurrency_key");
    let rows = qb.build().fetch_all(&mut **tx).await.map_err(map_err)?;
    rows.iter()
        .map(|row| {
            let key: Vec<u8> = row.try_get("k").map_err(map_err)?;
            Ok((
                String::from_utf8_lossy(&key).into_owned(),
                row.try_get::<i64, _>("n").map_err(map_err)?,
            ))
        })
        .collect()
}

/// The keyed tasks this claim takes, at most `caps` per queue and `limit` in all, with
/// their queues. Returns nothing (after one indexed probe) when no keyed task waits.
pub(super) async fn pick(
    tx: &mut Transaction<'static, MySql>,
    params: &TaskClaimParams,
    now: DbTime,
    caps: &BTreeMap<&str, i64>,
    limit: i64,
) -> Result<Vec<(i64, String)>> {
    let waiting: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM tenax_tasks
                        WHERE status IN ('pending', 'retrying') AND has_key = 1)",
    )
    .fetch_one(&mut **tx)
    .await
    .map_err(map_err)?;
    if !waiting || caps.is_empty() {
        return Ok(Vec::new());
    }
    let before = running(tx, None).await?;
    let mut qb = QueryBuilder::new("");
    for (n, ((queue, cap), status)) in caps
        .iter()
        .flat_map(|q| CLAIMABLE.iter().map(move |s| (q, s)))
        .enumerate()
    {
        if n > 0 {
            qb.push(" UNION ALL ");
        }
        // `status` is one of the CLAIMABLE constants, not input. The keyed index is
        // forced: on a small table the optimizer prefers the claim index and would walk
        // past every unkeyed task; this one holds keyed tasks only, in claim order.
        qb.push(format!(
            "(SELECT id, claim_key, queue, concurrency_key, concurrency_limit
              FROM tenax_tasks FORCE INDEX (tenax_tasks_keyed_claim)
              WHERE status = '{status}' AND has_key = 1 AND queue = "
        ));
        qb.push_bind(*queue);
        qb.push(" AND claim_key <= ");
        qb.push_bind(now);
        qb.push(" AND run_at <= ");
        qb.push_bind(now);
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
        // Keys already full (as last read) are stepped over, not waited behind.
        if !before.is_empty() {
            qb.push(" AND concurrency_limit > CASE concurrency_key");
            for (key, n) in &before {
                qb.push(" WHEN ");
                qb.push_bind(key.as_str());
                qb.push(" THEN ");
                qb.push_bind(*n);
            }
            qb.push(" ELSE 0 END");
        }
        qb.push(" ORDER BY claim_key, id LIMIT ");
        qb.push_bind(*cap);
        qb.push(" FOR UPDATE SKIP LOCKED)");
    }
    qb.push(" ORDER BY claim_key, id");
    let rows = qb.build().fetch_all(&mut **tx).await.map_err(map_err)?;
    let mut candidates: Vec<KeyedCandidate> = Vec::with_capacity(rows.len());
    let mut queue_of: BTreeMap<i64, String> = BTreeMap::new();
    for row in &rows {
        let id: i64 = row.try_get("id").map_err(map_err)?;
        let queue: Vec<u8> = row.try_get("queue").map_err(map_err)?;
        let key: Vec<u8> = row.try_get("concurrency_key").map_err(map_err)?;
        let max: i64 = row.try_get("concurrency_limit").map_err(map_err)?;
        queue_of.insert(id, String::from_utf8_lossy(&queue).into_owned());
        candidates.push((
            id,
            Some(String::from_utf8_lossy(&key).into_owned()),
            u32::try_from(max).unwrap_or(1),
        ));
    }
    // A queue's two branches (pending, retrying) may together pass its cap.
    let mut taken: BTreeMap<String, i64> = BTreeMap::new();
    candidates.retain(|(id, _, _)| {
        let queue = queue_of.get(id).cloned().unwrap_or_default();
        let cap = caps.get(queue.as_str()).copied().unwrap_or(0);
        let n = taken.entry(queue).or_insert(0);
        *n += 1;
        *n <= cap
    });
    let mut keys: Vec<&str> = candidates
        .iter()
        .filter_map(|(_, key, _)| key.as_deref())
        .collect();
    keys.sort_unstable();
    keys.dedup();
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    // ON DUPLICATE KEY UPDATE takes each existing row's exclusive lock, in VALUES order.
    let mut qb = QueryBuilder::new("INSERT INTO tenax_concurrency_keys (name) ");
    qb.push_values(&keys, |mut row, key| {
        row.push_bind(*key);
    });
    qb.push(" ON DUPLICATE KEY UPDATE name = VALUES(name)");
    qb.build().execute(&mut **tx).await.map_err(map_err)?;
    let now_running = running(tx, Some(&keys)).await?;
    let ids = pick_keyed(
        &candidates,
        &now_running,
        usize::try_from(limit).unwrap_or(usize::MAX),
    );
    Ok(ids
        .into_iter()
        .map(|id| (id, queue_of.remove(&id).unwrap_or_default()))
        .collect())
}
