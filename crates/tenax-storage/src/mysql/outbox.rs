//! The outbox of outbound deliveries on MariaDB/MySQL (see [`crate::outbox`]).
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, QueryBuilder, Row};
use tenax_core::TaskId;

use super::rows::{opt_text, text};
use super::{clock, map_err, minus, plus, push_list, MySqlStorage};
use crate::error::{Result, StorageError};
use crate::outbox::{
    settle_parts, stat_from, unsent_error, validate_claim, validate_list, validate_settle,
    OutboxClaimParams, OutboxKind, OutboxListParams, OutboxPruneParams, OutboxRecord,
    OutboxSendersParams, OutboxSettleParams, OutboxStat, OutboxStatsParams, OutboxStatus,
};

const COLUMNS: &str = "id, delivery_id, kind, task_id, url, body, status, attempts, \
     next_attempt_at, last_error, created_at, settled_at";

fn record_from_row(row: &MySqlRow) -> Result<OutboxRecord> {
    let attempts: i32 = row.try_get("attempts").map_err(map_err)?;
    Ok(OutboxRecord {
        id: row.try_get("id").map_err(map_err)?,
        delivery_id: text(row, "delivery_id")?,
        kind: OutboxKind::parse(&text(row, "kind")?)?,
        task_id: TaskId(row.try_get("task_id").map_err(map_err)?),
        url: opt_text(row, "url")?,
        body: text(row, "body")?,
        status: OutboxStatus::parse(&text(row, "status")?)?,
        attempts: u32::try_from(attempts)
            .map_err(|_| StorageError::Corrupt(format!("outbox attempts = {attempts}")))?,
        next_attempt_at: row
            .try_get::<DateTime<Utc>, _>("next_attempt_at")
            .map_err(map_err)?,
        last_error: opt_text(row, "last_error")?,
        created_at: row
            .try_get::<DateTime<Utc>, _>("created_at")
            .map_err(map_err)?,
        settled_at: row
            .try_get::<Option<DateTime<Utc>>, _>("settled_at")
            .map_err(map_err)?,
    })
}

impl MySqlStorage {
    pub(super) async fn outbox_claim_impl(
        &self,
        params: &OutboxClaimParams,
    ) -> Result<Vec<OutboxRecord>> {
        validate_claim(params)?;
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM tenax_outbox
             WHERE status = 'pending' AND kind = ? AND next_attempt_at <= ?
             ORDER BY next_attempt_at, id LIMIT ?
             FOR UPDATE SKIP LOCKED",
        )
        .bind(params.kind.as_str())
        .bind(now)
        .bind(i64::from(params.limit))
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        if ids.is_empty() {
            tx.commit().await.map_err(map_err)?;
            return Ok(Vec::new());
        }
        let mut update = QueryBuilder::<MySql>::new(
            "UPDATE tenax_outbox SET attempts = attempts + 1, next_attempt_at = ",
        );
        update
            .push_bind(plus(now, params.lease))
            .push(" WHERE id IN ");
        push_list(&mut update, ids.iter().copied());
        update.build().execute(&mut *tx).await.map_err(map_err)?;
        let mut select =
            QueryBuilder::<MySql>::new(format!("SELECT {COLUMNS} FROM tenax_outbox WHERE id IN "));
        push_list(&mut select, ids.iter().copied());
        select.push(" ORDER BY id");
        let rows = select.build().fetch_all(&mut *tx).await.map_err(map_err)?;
        let records = rows
            .iter()
            .map(record_from_row)
            .collect::<Result<Vec<_>>>()?;
        tx.commit().await.map_err(map_err)?;
        Ok(records)
    }

    pub(super) async fn outbox_settle_impl(&self, params: &OutboxSettleParams) -> Result<u64> {
        if !validate_settle(params)? {
            return Ok(0);
        }
        let (status, delay, max_age, error) = settle_parts(&params.outcome);
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let next = plus(now, delay);
        // The age limit, as the earliest creation time a retry keeps pending.
        let oldest_kept = minus(next, max_age);
        let mut qb = QueryBuilder::<MySql>::new("UPDATE tenax_outbox SET ");
        if status == OutboxStatus::Pending {
            // Both assignments test `created_at` only (MySQL assigns left to right, so
            // a test on `status` would see the new value).
            qb.push("settled_at = IF(created_at < ")
                .push_bind(oldest_kept)
                .push(", ")
                .push_bind(now)
                .push(", NULL), status = IF(created_at < ")
                .push_bind(oldest_kept)
                .push(", 'expired', 'pending')");
        } else {
            qb.push("settled_at = ")
                .push_bind(now)
                .push(", status = ")
                .push_bind(status.as_str());
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
        let kind = params.kind.map(OutboxKind::as_str);
        let status = params.status.map(OutboxStatus::as_str);
        let task = params.task_id.map(|t| t.0);
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM tenax_outbox
             WHERE (? IS NULL OR kind = ?) AND (? IS NULL OR status = ?)
               AND (? IS NULL OR task_id = ?)
             ORDER BY id LIMIT ?"
        ))
        .bind(kind)
        .bind(kind)
        .bind(status)
        .bind(status)
        .bind(task)
        .bind(task)
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
                "INSERT INTO tenax_outbox_senders (kind, seen_at) VALUES (?, ?)
                 ON DUPLICATE KEY UPDATE seen_at = VALUES(seen_at)",
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
        let silent = minus(now, params.sender_grace);
        sqlx::query("DELETE FROM tenax_outbox_senders WHERE seen_at < ?")
            .bind(silent)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        let expired = sqlx::query(
            "UPDATE tenax_outbox SET status = 'expired', settled_at = ?, last_error = ?
             WHERE status = 'pending' AND created_at < ?
               AND kind NOT IN (SELECT kind FROM tenax_outbox_senders)",
        )
        .bind(now)
        .bind(unsent_error(params.sender_grace))
        .bind(silent)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let done = sqlx::query(
            "DELETE FROM tenax_outbox
             WHERE (status <> 'pending' AND settled_at < ?)
                OR (status = 'pending' AND created_at < ?)",
        )
        .bind(minus(now, params.older_than))
        .bind(minus(now, params.older_than))
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
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let rows = sqlx::query(
            "SELECT kind, COUNT(*) AS pending,
                    CAST(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), ?) DIV 1000 AS SIGNED) AS oldest_ms
             FROM tenax_outbox
             WHERE status = 'pending' AND kind IN (SELECT kind FROM tenax_outbox_senders)
             GROUP BY kind ORDER BY kind",
        )
        .bind(now)
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        rows.iter()
            .map(|row| {
                stat_from(
                    &text(row, "kind")?,
                    row.try_get("pending").map_err(map_err)?,
                    row.try_get("oldest_ms").map_err(map_err)?,
                )
            })
            .collect()
    }
}
