//! The outbox of outbound deliveries on PostgreSQL (see [`crate::outbox`]).
use sqlx::postgres::PgRow;
use sqlx::Row;
use tenax_core::TaskId;

use super::{map_err, PgStorage, NOW};
use crate::common::duration_ms;
use crate::error::{Result, StorageError};
use crate::outbox::{
    settle_parts, stat_from, unsent_error, validate_claim, validate_list, validate_settle,
    OutboxClaimParams, OutboxKind, OutboxListParams, OutboxPruneParams, OutboxRecord,
    OutboxSendersParams, OutboxSettleParams, OutboxStat, OutboxStatsParams, OutboxStatus,
};

const COLUMNS: &str = "id, delivery_id, kind, task_id, url, body, status, attempts, \
     next_attempt_at, last_error, created_at, settled_at";

fn record_from_row(row: &PgRow) -> Result<OutboxRecord> {
    let attempts: i32 = row.try_get("attempts").map_err(map_err)?;
    Ok(OutboxRecord {
        id: row.try_get("id").map_err(map_err)?,
        delivery_id: row.try_get("delivery_id").map_err(map_err)?,
        kind: OutboxKind::parse(row.try_get("kind").map_err(map_err)?)?,
        task_id: TaskId(row.try_get("task_id").map_err(map_err)?),
        url: row.try_get("url").map_err(map_err)?,
        body: row.try_get("body").map_err(map_err)?,
        status: OutboxStatus::parse(row.try_get("status").map_err(map_err)?)?,
        attempts: u32::try_from(attempts)
            .map_err(|_| StorageError::Corrupt(format!("outbox attempts = {attempts}")))?,
        next_attempt_at: row.try_get("next_attempt_at").map_err(map_err)?,
        last_error: row.try_get("last_error").map_err(map_err)?,
        created_at: row.try_get("created_at").map_err(map_err)?,
        settled_at: row.try_get("settled_at").map_err(map_err)?,
    })
}

impl PgStorage {
    pub(super) async fn outbox_claim_impl(
        &self,
        params: &OutboxClaimParams,
    ) -> Result<Vec<OutboxRecord>> {
        validate_claim(params)?;
        let rows = sqlx::query(&format!(
            "WITH due AS (
                 SELECT id FROM tenax_outbox
                 WHERE status = 'pending' AND kind = $2 AND next_attempt_at <= {NOW}
                 ORDER BY next_attempt_at, id LIMIT $3
                 FOR UPDATE SKIP LOCKED)
             UPDATE tenax_outbox o
             SET attempts = o.attempts + 1,
                 next_attempt_at = {NOW} + $4::float8 * interval '1 millisecond'
             FROM due WHERE o.id = due.id
             RETURNING o.id, o.delivery_id, o.kind, o.task_id, o.url, o.body, o.status,
                       o.attempts, o.next_attempt_at, o.last_error, o.created_at, o.settled_at"
        ))
        .bind(params.now)
        .bind(params.kind.as_str())
        .bind(i64::from(params.limit))
        .bind(duration_ms(params.lease) as f64)
        .fetch_all(self.pool())
        .await
        .map_err(map_err)?;
        let mut records = rows
            .iter()
            .map(record_from_row)
            .collect::<Result<Vec<_>>>()?;
        records.sort_by_key(|r| r.id);
        Ok(records)
    }

    pub(super) async fn outbox_settle_impl(&self, params: &OutboxSettleParams) -> Result<u64> {
        if !validate_settle(params)? {
            return Ok(0);
        }
        let (status, delay, max_age, error) = settle_parts(&params.outcome);
        let ids: Vec<i64> = params.claims.iter().map(|c| c.id).collect();
        let attempts: Vec<i32> = params
            .claims
            .iter()
            .map(|c| i32::try_from(c.attempts).unwrap_or(i32::MAX))
            .collect();
        // $2: the new status, or NULL for a retry, which stays pending unless the next
        // attempt would come after the row's maximum age.
        let done = sqlx::query(&format!(
            "WITH c AS (SELECT * FROM UNNEST($6::int8[], $7::int4[]) AS c(id, attempts)),
                  s AS (SELECT o.id,
                               COALESCE($2::text,
                                        CASE WHEN {NOW} + $3::float8 * interval '1 millisecond'
                                                  > o.created_at + $4::float8 * interval '1 millisecond'
                                             THEN 'expired' ELSE 'pending' END) AS status
                        FROM tenax_outbox o JOIN c ON c.id = o.id AND c.attempts = o.attempts
                        WHERE o.status = 'pending')
             UPDATE tenax_outbox o
             SET status = s.status,
                 settled_at = CASE WHEN s.status = 'pending' THEN NULL ELSE {NOW} END,
                 next_attempt_at = {NOW} + $3::float8 * interval '1 millisecond',
                 last_error = COALESCE($5, o.last_error)
             FROM s WHERE o.id = s.id AND o.status = 'pending'"
        ))
        .bind(params.now)
        .bind((status != OutboxStatus::Pending).then(|| status.as_str()))
        .bind(duration_ms(delay) as f64)
        .bind(duration_ms(max_age) as f64)
        .bind(error)
        .bind(&ids)
        .bind(&attempts)
        .execute(self.pool())
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected())
    }

    pub(super) async fn outbox_list_impl(
        &self,
        params: &OutboxListParams,
    ) -> Result<Vec<OutboxRecord>> {
        validate_list(params)?;
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM tenax_outbox
             WHERE ($1::text IS NULL OR kind = $1) AND ($2::text IS NULL OR status = $2)
               AND ($3::int8 IS NULL OR task_id = $3)
             ORDER BY id LIMIT $4"
        ))
        .bind(params.kind.map(OutboxKind::as_str))
        .bind(params.status.map(OutboxStatus::as_str))
        .bind(params.task_id.map(|t| t.0))
        .bind(i64::from(params.limit))
        .fetch_all(self.pool())
        .await
        .map_err(map_err)?;
        rows.iter().map(record_from_row).collect()
    }

    pub(super) async fn outbox_senders_seen_impl(
        &self,
        params: &OutboxSendersParams,
    ) -> Result<()> {
        // One row per kind: `ON CONFLICT` cannot change a row twice in one statement.
        let mut kinds: Vec<&str> = params.kinds.iter().map(|k| k.as_str()).collect();
        kinds.sort_unstable();
        kinds.dedup();
        sqlx::query(&format!(
            "INSERT INTO tenax_outbox_senders (kind, seen_at)
             SELECT kind, {NOW} FROM unnest($2::text[]) AS kind
             ON CONFLICT (kind) DO UPDATE SET seen_at = EXCLUDED.seen_at"
        ))
        .bind(params.now)
        .bind(&kinds)
        .execute(self.pool())
        .await
        .map_err(map_err)?;
        Ok(())
    }

    pub(super) async fn outbox_prune_impl(&self, params: &OutboxPruneParams) -> Result<u64> {
        let mut tx = self.begin().await?;
        sqlx::query(&format!(
            "DELETE FROM tenax_outbox_senders
             WHERE seen_at < {NOW} - $2::float8 * interval '1 millisecond'"
        ))
        .bind(params.now)
        .bind(duration_ms(params.sender_grace) as f64)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let expired = sqlx::query(&format!(
            "UPDATE tenax_outbox SET status = 'expired', settled_at = {NOW}, last_error = $3
             WHERE status = 'pending'
               AND created_at < {NOW} - $2::float8 * interval '1 millisecond'
               AND kind NOT IN (SELECT kind FROM tenax_outbox_senders)"
        ))
        .bind(params.now)
        .bind(duration_ms(params.sender_grace) as f64)
        .bind(unsent_error(params.sender_grace))
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let done = sqlx::query(&format!(
            "DELETE FROM tenax_outbox
             WHERE (status <> 'pending'
                    AND settled_at < {NOW} - $2::float8 * interval '1 millisecond')
                OR (status = 'pending'
                    AND created_at < {NOW} - $2::float8 * interval '1 millisecond')"
        ))
        .bind(params.now)
        .bind(duration_ms(params.older_than) as f64)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(expired.rows_affected() + done.rows_affected())
    }

    pub(super) async fn outbox_stats_impl(
        &self,
        params: &OutboxStatsParams,
    ) -> Result<Vec<OutboxStat>> {
        let rows = sqlx::query(&format!(
            "SELECT kind, count(*) AS pending,
                    (EXTRACT(EPOCH FROM ({NOW} - min(created_at))) * 1000)::int8 AS oldest_ms
             FROM tenax_outbox
             WHERE status = 'pending' AND kind IN (SELECT kind FROM tenax_outbox_senders)
             GROUP BY kind ORDER BY kind"
        ))
        .bind(params.now)
        .fetch_all(self.pool())
        .await
        .map_err(map_err)?;
        rows.iter()
            .map(|row| {
                stat_from(
                    row.try_get("kind").map_err(map_err)?,
                    row.try_get("pending").map_err(map_err)?,
                    row.try_get("oldest_ms").map_err(map_err)?,
                )
            })
            .collect()
    }
}
