//! Rate limits per command type on PostgreSQL (the claim side is in `crate::rates`).
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use tenax_core::TaskRecord;

use super::{map_err, PgStorage};
use crate::error::{Result, StorageError};
use crate::params::{RateLimit, RateLimitSetParams, TaskClaimParams};
use crate::rates::{take_from, validate, Bucket, RatedBackend};

const COLUMNS: &str = "command_type, per_second, burst::int8 AS burst, tokens, refilled_ms";

fn bucket_from_row(row: &sqlx::postgres::PgRow) -> Result<Bucket> {
    Ok(Bucket {
        command_type: row.try_get("command_type").map_err(map_err)?,
        per_second: row.try_get("per_second").map_err(map_err)?,
        burst: row.try_get("burst").map_err(map_err)?,
        tokens: row.try_get("tokens").map_err(map_err)?,
        refilled_ms: row.try_get("refilled_ms").map_err(map_err)?,
    })
}

#[async_trait]
impl RatedBackend for PgStorage {
    async fn rated_types(&self, types: &[String]) -> Result<Vec<String>> {
        let rated: Vec<String> = sqlx::query_scalar(
            "SELECT command_type FROM tenax_rate_limits WHERE command_type = ANY($1)
             ORDER BY command_type",
        )
        .bind(types)
        .fetch_all(self.pool())
        .await
        .map_err(map_err)?;
        // No limited type among these any more: the next claims skip the probe.
        self.rated_hint
            .store(!rated.is_empty(), std::sync::atomic::Ordering::Relaxed);
        Ok(rated)
    }

    async fn clock_ms(&self, now: Option<DateTime<Utc>>) -> Result<i64> {
        match now {
            Some(now) => Ok(now.timestamp_millis()),
            None => {
                sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8")
                    .fetch_one(self.pool())
                    .await
                    .map_err(map_err)
            }
        }
    }

    async fn take_tokens(
        &self,
        types: &[String],
        want: u32,
        now_ms: i64,
    ) -> Result<Vec<(String, u32)>> {
        let mut tx = self.begin().await?;
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM tenax_rate_limits WHERE command_type = ANY($1)
             ORDER BY command_type FOR UPDATE"
        ))
        .bind(types)
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
                "UPDATE tenax_rate_limits SET tokens = $2, refilled_ms = $3
                 WHERE command_type = $1",
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
        let (types, counts): (Vec<String>, Vec<f64>) =
            back.iter().map(|(t, n)| (t.clone(), f64::from(*n))).unzip();
        sqlx::query(
            "UPDATE tenax_rate_limits r SET tokens = least(r.burst::float8, r.tokens + b.n)
             FROM unnest($1::text[], $2::float8[]) AS b(command_type, n)
             WHERE r.command_type = b.command_type",
        )
        .bind(&types)
        .bind(&counts)
        .execute(self.pool())
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn claim_unrated(&self, params: &TaskClaimParams) -> Result<Vec<TaskRecord>> {
        self.claim(params).await
    }

    async fn claim_skipping_rated(
        &self,
        params: &TaskClaimParams,
    ) -> Result<Option<(Vec<TaskRecord>, Vec<String>)>> {
        self.claim_naming_rated(params).await
    }
}

impl PgStorage {
    pub(super) async fn rate_limit_set_impl(
        &self,
        params: &RateLimitSetParams,
    ) -> Result<RateLimit> {
        validate(params)?;
        // This node's claims take the new limit's turn first from the next claim on.
        self.rated_hint
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let now_ms = self.clock_ms(params.now).await?;
        let row = sqlx::query(&format!(
            "INSERT INTO tenax_rate_limits (command_type, per_second, burst, tokens, refilled_ms)
             VALUES ($1, $2, $3, $3, $4)
             ON CONFLICT (command_type) DO UPDATE
             SET per_second = EXCLUDED.per_second, burst = EXCLUDED.burst,
                 tokens = least(tenax_rate_limits.tokens, EXCLUDED.burst::float8)
             RETURNING {COLUMNS}"
        ))
        .bind(&params.command_type)
        .bind(params.per_second)
        .bind(i32::try_from(params.burst).unwrap_or(i32::MAX))
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
        let removed = sqlx::query("DELETE FROM tenax_rate_limits WHERE command_type = $1")
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
