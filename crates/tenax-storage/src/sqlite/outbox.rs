//! The outbox of outbound deliveries on SQLite (see [`crate::outbox`]).
use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Row, Sqlite};
use tenax_core::TaskId;

use super::rows::ms;
use super::{clock, map_err, SqliteStorage};
use crate::common::duration_ms;
use crate::error::{Result, StorageError};
use crate::outbox::{
    settle_parts, stat_from, unsent_error, validate_claim, validate_list, validate_settle,
    OutboxClaimParams, OutboxKind, OutboxListParams, OutboxPruneParams, OutboxRecord,
    OutboxSendersParams, OutboxSettleParams, OutboxStat, OutboxStatsParams, OutboxStatus,
};

const COLUMNS: &str = "id, delivery_id, kind, task_id, url, body, status, attempts, \
     next_attempt_at, last_error, created_at, settled_at";

fn record_from_row(row: &SqliteRow) -> Result<OutboxRecord> {
    let attempts: i64 = row.try_get("attempts").map_err(map_err)?;
    Ok(OutboxRecord {
        id: row.try_get("id").map_err(map_err)?,
        delivery_id: row.try_get("delivery_id").map_err(map_err)?,
        kind: OutboxKind::parse(&row.try_get::<String, _>("kind").map_err(map_err)?)?,
        task_id: TaskId(row.try_get("task_id").map_err(map_err)?),
        url: row.try_get("url").map_err(map_err)?,
        body: row.try_get("body").map_err(map_err)?,
        status: OutboxStatus::parse(&row.try_get::<String, _>("status").map_err(map_err)?)?,
        attempts: u32::try_from(attempts)
            .map_err(|_| StorageError::Corrupt(format!("outbox attempts = {attempts}")))?,
        next_attempt_at: ms(row.try_get("next_attempt_at").map_err(map_err)?)?,
        last_error: row.try_get("last_error").map_err(map_err)?,
        created_at: ms(row.try_get("created_at").map_err(map_err)?)?,
        settled_at: row
            .try_get::<Option<i64>, _>("settled_at")
            .map_err(map_err)?
            .map(ms)
            .transpose()?,
    })
}

impl SqliteStorage {
    pub(super) async fn outbox_claim_impl(
        &self,
        params: &OutboxClaimParams,
    ) -> Result<Vec<OutboxRecord>> {
        validate_claim(params)?;
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let rows = sqlx::query(&format!(
            "UPDATE tenax_outbox SET attempts = attempts + 1, next_attempt_at = ?1
             WHERE id IN (SELECT id FROM tenax_outbox
                          WHERE status = 'pending' AND kind = ?2 AND next_attempt_at <= ?3
                          ORDER BY next_attempt_at, id LIMIT ?4)
             RETURNING {COLUMNS}"
        ))
        .bind(now.saturating_add(duration_ms(params.lease)))
        .bind(params.kind.as_str())
        .bind(now)
        .bind(i64::from(params.limit))
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        let mut records = rows
            .iter()
            .map(record_from_row)
            .collect::<Result<Vec<_>>>()?;
        tx.commit().await.map_err(map_err)?;
        records.sort_by_key(|r| r.id);
        Ok(records)
    }

    pub(super) async fn outbox_settle_impl(&self, params: &OutboxSettleParams) -> Result<u64> {
        if !validate_settle(params)? {
            return Ok(0);
        }
        let (status, delay, max_age, error) = settle_parts(&params.outcome);
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let next = now.saturating_add(duration_ms(delay));
        let mut qb = QueryBuilder::<Sqlite>::new("UPDATE tenax_outbox SET ");
        if status == OutboxStatus::Pending {
            // A retry past the row's maximum age expires it instead.
            let expired = format!("{next} > created_at + {}", duration_ms(max_age));
            qb.push(format!(
                "status = CASE WHEN {expired} THEN 'expired' ELSE 'pending' END, \
                 settled_at = CASE WHEN {expired} THEN {now} END"
            ));
        } else {
            qb.push("status = ")
                .push_bind(status.as_str())
                .push(", settled_at = ")
                .push_bind(now);
        }
        qb.push(", next_attempt_at = ")
            .push_bind(next)
            .push(", last_error = COALESCE(")
            .push_bind(error)
            .push(", last_error) WHERE status = 'pending' AND (");
        for (i, claim) in params.claims.iter().enumerate() {
            if i > 0 {
                qb.push(" OR ");
            }
            qb.push("(id = ")
                .push_bind(claim.id)
                .push(" AND attempts = ")
                .push_bind(i64::from(claim.attempts))
                .push(")");
        }
        qb.push(")");
        let done = qb.build().execute(&mut *tx).await.map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(done.rows_affected())
    }

    pub(super) async fn outbox_list_impl(
        &self,
        params: &OutboxListParams,
    ) -> Result<Vec<OutboxRecord>> {
        validate_list(params)?;
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM tenax_outbox
             WHERE (?1 IS NULL OR kind = ?1) AND (?2 IS NULL OR status = ?2)
               AND (?3 IS NULL OR task_id = ?3)
             ORDER BY id LIMIT ?4"
        ))
        .bind(params.kind.map(OutboxKind::as_str))
        .bind(params.status.map(OutboxStatus::as_str))
        .bind(params.task_id.map(|t| t.0))
        .bind(i64::from(params.limit))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(record_from_row).collect()
    }

    pub(super) async fn outbox_senders_seen_impl(
        &self,
        params: &OutboxSendersParams,
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        for kind in &params.kinds {
            sqlx::query(
                "INSERT INTO tenax_outbox_senders (kind, seen_at) VALUES (?1, ?2)
                 ON CONFLICT (kind) DO UPDATE SET seen_at = excluded.seen_at",
            )
            .bind(kind.as_str())
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)
    }

    pub(super) async fn outbox_prune_impl(&self, params: &OutboxPruneParams) -> Result<u64> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let silent = now.saturating_sub(duration_ms(params.sender_grace));
        sqlx::query("DELETE FROM tenax_outbox_senders WHERE seen_at < ?1")
            .bind(silent)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        let expired = sqlx::query(
            "UPDATE tenax_outbox SET status = 'expired', settled_at = ?1, last_error = ?3
             WHERE status = 'pending' AND created_at < ?2
               AND kind NOT IN (SELECT kind FROM tenax_outbox_senders)",
        )
        .bind(now)
        .bind(silent)
        .bind(unsent_error(params.sender_grace))
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let done = sqlx::query(
            "DELETE FROM tenax_outbox
             WHERE (status <> 'pending' AND settled_at < ?1)
                OR (status = 'pending' AND created_at < ?1)",
        )
        .bind(now.saturating_sub(duration_ms(params.older_than)))
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
        let now = super::clock_now(&self.pool, params.now).await?;
        let rows = sqlx::query(
            "SELECT kind, count(*) AS pending, ?1 - min(created_at) AS oldest_ms
             FROM tenax_outbox
             WHERE status = 'pending' AND kind IN (SELECT kind FROM tenax_outbox_senders)
             GROUP BY kind ORDER BY kind",
        )
        .bind(now)
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter()
            .map(|row| {
                stat_from(
                    &row.try_get::<String, _>("kind").map_err(map_err)?,
                    row.try_get("pending").map_err(map_err)?,
                    row.try_get("oldest_ms").map_err(map_err)?,
                )
            })
            .collect()
    }
}
