//! Rate limits per command type on MariaDB/MySQL (the claim side is in `crate::rates`).
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use tenax_core::TaskRecord;

use super::rows::text;
use super::{map_err, retrying, MySqlStorage};
use crate::error::{Result, StorageError};
use crate::params::{RateLimit, RateLimitSetParams, TaskClaimParams};
use crate::rates::{take_from, validate, Bucket, RatedBackend};
use crate::Storage;

const COLUMNS: &str =
    "command_type, per_second, CAST(burst AS SIGNED) AS burst, tokens, refilled_ms";

fn bucket_from_row(row: &sqlx::mysql::MySqlRow) -> Result<Bucket> {
    Ok(Bucket {
        command_type: text(row, "command_type")?,
        per_second: row.try_get("per_second").map_err(map_err)?,
        burst: row.try_get("burst").map_err(map_err)?,
        tokens: row.try_get("tokens").map_err(map_err)?,
        refilled_ms: row.try_get("refilled_ms").map_err(map_err)?,
    })
}

/// `?, ?, ?` for an `IN` list of `n` items (never empty: callers check).
fn marks(n: usize) -> String {
    vec!["?"; n.max(1)].join(", ")
}

impl MySqlStorage {
    async fn take_once(
        &self,
        types: &[String],
        want: u32,
        now_ms: i64,
    ) -> Result<Vec<(String, u32)>> {
        let mut tx = self.begin().await?;
        let sql = format!(
            "SELECT {COLUMNS} FROM tenax_rate_limits WHERE command_type IN ({})
             ORDER BY command_type FOR UPDATE",
            marks(types.len())
        );
        let mut query = sqlx::query(&sql);
        for t in types {
            query = query.bind(t);
        }
        let rows = query.fetch_all(&mut *tx).await.map_err(map_err)?;
        let buckets = rows
            .iter()
            .map(bucket_from_row)
            .collect::<Result<Vec<_>>>()?;
        let taken = take_from(&buckets, want, now_ms);
        for (command_type, _, tokens, at) in &taken {
            sqlx::query(
                "UPDATE tenax_rate_limits SET tokens = ?, refilled_ms = ? WHERE command_type = ?",
            )
            .bind(tokens)
            .bind(at)
            .bind(command_type)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(taken.into_iter().map(|(t, n, _, _)| (t, n)).collect())
    }

    async fn give_back_once(&self, back: &[(String, u32)]) -> Result<()> {
        let mut tx = self.begin().await?;
        for (command_type, n) in back {
            sqlx::query(
                "UPDATE tenax_rate_limits SET tokens = LEAST(CAST(burst AS DOUBLE), tokens + ?)
                 WHERE command_type = ?",
            )
            .bind(f64::from(*n))
            .bind(command_type)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)
    }
}

#[async_trait]
impl RatedBackend for MySqlStorage {
    async fn rated_types(&self, types: &[String]) -> Result<Vec<String>> {
        if types.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT command_type FROM tenax_rate_limits WHERE command_type IN ({})
             ORDER BY command_type",
            marks(types.len())
        );
        let mut query = sqlx::query(&sql);
        for t in types {
            query = query.bind(t);
        }
        let rows = query.fetch_all(self.pool()).await.map_err(map_err)?;
        rows.iter().map(|row| text(row, "command_type")).collect()
    }

    async fn clock_ms(&self, now: Option<DateTime<Utc>>) -> Result<i64> {
        match now {
            Some(now) => Ok(now.timestamp_millis()),
            None => Ok(self.now().await?.timestamp_millis()),
        }
    }

    async fn take_tokens(
        &self,
        types: &[String],
        want: u32,
        now_ms: i64,
    ) -> Result<Vec<(String, u32)>> {
        retrying(|| self.take_once(types, want, now_ms)).await
    }

    async fn give_back(&self, back: &[(String, u32)]) -> Result<()> {
        retrying(|| self.give_back_once(back)).await
    }

    async fn claim_unrated(&self, params: &TaskClaimParams) -> Result<Vec<TaskRecord>> {
        retrying(|| self.claim_once(params)).await
    }
}

impl MySqlStorage {
    pub(super) async fn rate_limit_set_impl(
        &self,
        params: &RateLimitSetParams,
    ) -> Result<RateLimit> {
        validate(params)?;
        let now_ms = self.clock_ms(params.now).await?;
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO tenax_rate_limits (command_type, per_second, burst, tokens, refilled_ms)
             VALUES (?, ?, ?, ?, ?)
             ON DUPLICATE KEY UPDATE
                 tokens = LEAST(tokens, VALUES(burst)),
                 per_second = VALUES(per_second), burst = VALUES(burst)",
        )
        .bind(&params.command_type)
        .bind(params.per_second)
        .bind(i64::from(params.burst))
        .bind(f64::from(params.burst))
        .bind(now_ms)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let row = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM tenax_rate_limits WHERE command_type = ?"
        ))
        .bind(&params.command_type)
        .fetch_one(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
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
        let removed = sqlx::query("DELETE FROM tenax_rate_limits WHERE command_type = ?")
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
