//! Rate limits per command type on SQLite (the claim side is in `crate::rates`). SQLite
//! has one writer at a time (`BEGIN IMMEDIATE`), so taking tokens needs no row locks.
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use tenax_core::TaskRecord;

use super::{clock_now, map_err, SqliteStorage};
use crate::common::json_list;
use crate::error::{Result, StorageError};
use crate::params::{RateLimit, RateLimitSetParams, TaskClaimParams};
use crate::rates::{take_from, validate, Bucket, RatedBackend};

const COLUMNS: &str = "command_type, per_second, burst, tokens, refilled_ms";

fn bucket_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<Bucket> {
    Ok(Bucket {
        command_type: row.try_get("command_type").map_err(map_err)?,
        per_second: row.try_get("per_second").map_err(map_err)?,
        burst: row.try_get("burst").map_err(map_err)?,
        tokens: row.try_get("tokens").map_err(map_err)?,
        refilled_ms: row.try_get("refilled_ms").map_err(map_err)?,
    })
}

#[async_trait]
impl RatedBackend for SqliteStorage {
    async fn rated_types(&self, types: &[String]) -> Result<Vec<String>> {
        sqlx::query_scalar(
            "SELECT command_type FROM tenax_rate_limits
             WHERE command_type IN (SELECT value FROM json_each(?1))
             ORDER BY command_type",
        )
        .bind(json_list(types))
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }

    async fn clock_ms(&self, now: Option<DateTime<Utc>>) -> Result<i64> {
        clock_now(self.pool(), now).await
    }

    async fn take_tokens(
        &self,
        types: &[String],
        want: u32,
        now_ms: i64,
    ) -> Result<Vec<(String, u32)>> {
        let mut tx = self.begin().await?;
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM tenax_rate_limits
             WHERE command_type IN (SELECT value FROM json_each(?1))
             ORDER BY command_type"
        ))
        .bind(json_list(types))
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        let buckets = rows
            .iter()
            .map(bucket_from_row)
            .collect::<Result<Vec<_>>>()?;
        let taken = take_from(&buckets, want, now_ms);
        for (command_type, _, tokens, at) in &taken {
            sqlx::query(
                "UPDATE tenax_rate_limits SET tokens = ?2, refilled_ms = ?3
                 WHERE command_type = ?1",
            )
            .bind(command_type)
            .bind(tokens)
            .bind(at)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(taken.into_iter().map(|(t, n, _, _)| (t, n)).collect())
    }

    async fn give_back(&self, back: &[(String, u32)]) -> Result<()> {
        let mut tx = self.begin().await?;
        for (command_type, n) in back {
            sqlx::query(
                "UPDATE tenax_rate_limits SET tokens = min(CAST(burst AS REAL), tokens + ?2)
                 WHERE command_type = ?1",
            )
            .bind(command_type)
            .bind(f64::from(*n))
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)
    }

    async fn claim_unrated(&self, params: &TaskClaimParams) -> Result<Vec<TaskRecord>> {
        self.claim_plain(params).await
    }
}

impl SqliteStorage {
    pub(super) async fn rate_limit_set_impl(
        &self,
        params: &RateLimitSetParams,
    ) -> Result<RateLimit> {
        validate(params)?;
        let now_ms = self.clock_ms(params.now).await?;
        let row = sqlx::query(&format!(
            "INSERT INTO tenax_rate_limits (command_type, per_second, burst, tokens, refilled_ms)
             VALUES (?1, ?2, ?3, ?3, ?4)
             ON CONFLICT (command_type) DO UPDATE
             SET per_second = excluded.per_second, burst = excluded.burst,
                 tokens = min(tenax_rate_limits.tokens, CAST(excluded.burst AS REAL))
             RETURNING {COLUMNS}"
        ))
        .bind(&params.command_type)
        .bind(params.per_second)
        .bind(i64::from(params.burst))
        .bind(now_ms)
        .fetch_one(self.pool())
        .await
        .map_err(map_err)?;
        bucket_from_row(&row)?.record()
    }

    pub(super) async fn rate_limit_list_impl(&self) -> Result<Vec<RateLimit>> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM tenax_rate_limits ORDER BY command_type"
        ))
        .fetch_all(self.pool())
        .await
        .map_err(map_err)?;
        rows.iter()
            .map(|row| bucket_from_row(row)?.record())
            .collect()
    }

    pub(super) async fn rate_limit_remove_impl(&self, command_type: &str) -> Result<()> {
        let removed = sqlx::query("DELETE FROM tenax_rate_limits WHERE command_type = ?1")
            .bind(command_type)
            .execute(self.pool())
            .await
            .map_err(map_err)?
            .rows_affected();
        if removed == 0 {
            return Err(StorageError::NotFound(format!("rate limit {command_type}")));
        }
        Ok(())
    }
}
