//! The rate-limit statements (see [`crate::rates`]) written once:
//! [`rates_statements!`](crate::shared::rates::rates_statements) implements
//! [`RatedBackend`](crate::rates::RatedBackend) and the storage's `rate_limit_set_impl`,
//! `rate_limit_list_impl` and `rate_limit_remove_impl` for one backend, with what the
//! backend spells its own way taken from its [`Dialect`] and [`RateDialect`].
//!
//! The statements are equivalent to those each backend had by hand, not the same text:
//! - the limited types among a claim's are an `IN (?, ...)` list on every backend
//!   (SQLite had `json_each`, PostgreSQL `= ANY($1)`), in the probe and in the locking
//!   read of `take_tokens`;
//! - unused tokens go back in one `UPDATE ... CASE command_type WHEN ...` per call, in a
//!   transaction (SQLite and MariaDB had one `UPDATE` per type in it; PostgreSQL one
//!   `UPDATE ... FROM unnest(...)` outside one); the bucket is capped at `burst` without a
//!   cast to a float (the tokens column is one already);
//! - the upsert of `rate_limit_set` binds the new values again in its update part
//!   instead of reading `excluded` / `VALUES()`, and binds `burst` through
//!   [`Dialect::bind_count`] (PostgreSQL's 32-bit column takes a clamped value, as
//!   before); MariaDB, without `RETURNING`, still reads the bucket back in the same
//!   transaction;
//! - `burst` is read as the backend's [`Dialect::Count`] instead of being cast to a
//!   64-bit integer in SQL;
//! - the clock of PostgreSQL's `clock_ms` is [`Dialect::clock`] (`now()` of a statement
//!   outside a transaction) instead of `clock_timestamp()`, and its milliseconds are
//!   truncated rather than rounded;
//! - the probe and `take_tokens` answer an empty list of types without a round trip.
//!
//! Kept per backend, through the macro's arguments: the claim without limits that each
//! backend has (`claim_unrated`), and on PostgreSQL the claim that skips and names the
//! limited types (`claim_skipping_rated`) and the hint that remembers whether limited
//! types were seen (`rated_hint`). MariaDB's writes run again after a lock conflict
//! ([`crate::dialect::retrying`]); the other backends run them once.
use crate::dialect::Dialect;

/// The columns a bucket is read with, in the terms of the macro's `bucket_from_row`.
pub(crate) const BUCKET_COLUMNS: &str = "command_type, per_second, burst, tokens, refilled_ms";

/// What the rate-limit statements spell their own way.
pub(crate) trait RateDialect: Dialect {
    /// The smaller of two numbers (SQLite's scalar `min`).
    const LEAST: &'static str = "LEAST";
    /// What turns the insert of a bucket whose command type exists into an update of
    /// it; the assignments follow.
    const ON_BUCKET_TAKEN: &'static str = "ON CONFLICT (command_type) DO UPDATE SET";
}

#[cfg(feature = "sqlite")]
impl RateDialect for sqlx::Sqlite {
    const LEAST: &'static str = "min";
}

#[cfg(feature = "postgres")]
impl RateDialect for sqlx::Postgres {}

#[cfg(feature = "mysql")]
impl RateDialect for sqlx::MySql {
    const ON_BUCKET_TAKEN: &'static str = "ON DUPLICATE KEY UPDATE";
}

/// ` RETURNING` the bucket's columns where the backend has it, else nothing.
pub(crate) fn returning_bucket<D: Dialect>() -> String {
    if D::UPDATE_RETURNING {
        format!(" RETURNING {BUCKET_COLUMNS}")
    } else {
        String::new()
    }
}

/// Implement the rate-limit statements for the storage `$storage` of the database `$db`
/// (a [`RateDialect`]), both given as full paths. `claim_unrated` names the storage's
/// method that claims without rate limits; PostgreSQL also names its claim that skips
/// and names the limited types (`claim_skipping_rated`) and the `AtomicBool` field that
/// remembers whether the last probe found limited types (`rated_hint`), which a new
/// limit sets.
macro_rules! rates_statements {
    ($db:ty, $storage:ty, claim_unrated = $claim:ident
     $(, claim_skipping_rated = $skip:ident, rated_hint = $hint:ident)? $(,)?) => {
        mod shared {
            use async_trait::async_trait;
            use chrono::{DateTime, Utc};
            use sqlx::{QueryBuilder, Row as _};
            use tenax_core::TaskRecord;

            use $crate::dialect::{retrying, sql, Dialect as _};
            use $crate::error::{Result, StorageError};
            use $crate::params::{RateLimit, RateLimitSetParams, TaskClaimParams};
            use $crate::rates::{take_from, validate, Bucket, RatedBackend};
            use $crate::shared::rates::{returning_bucket, RateDialect, BUCKET_COLUMNS};

            type Db = $db;
            type DbRow = <$db as sqlx::Database>::Row;

            /// A bucket read with [`BUCKET_COLUMNS`].
            fn bucket_from_row(row: &DbRow) -> Result<Bucket> {
                let burst: <Db as $crate::dialect::Dialect>::Count =
                    row.try_get("burst").map_err(Db::map_err)?;
                Ok(Bucket {
                    command_type: Db::text(row, "command_type")?,
                    per_second: row.try_get("per_second").map_err(Db::map_err)?,
                    burst: i64::from(burst),
                    tokens: row.try_get("tokens").map_err(Db::map_err)?,
                    refilled_ms: row.try_get("refilled_ms").map_err(Db::map_err)?,
                })
            }

            /// `SELECT {columns} FROM tenax_rate_limits WHERE command_type IN (...)`
            /// binding `types` (never empty), in type order.
            fn select_types(columns: &str, types: &[String]) -> QueryBuilder<'static, Db> {
                let mut qb = QueryBuilder::new("SELECT ");
                qb.push(columns)
                    .push(" FROM tenax_rate_limits WHERE command_type IN (");
                let mut list = qb.separated(", ");
                for command_type in types {
                    list.push_bind(command_type.clone());
                }
                qb.push(") ORDER BY command_type");
                qb
            }

            /// In one transaction: lock the buckets of `types` in type order, refill
            /// each to `now_ms` and take at most `want` tokens in all.
            async fn take_once(
                storage: &$storage,
                types: &[String],
                want: u32,
                now_ms: i64,
            ) -> Result<Vec<(String, u32)>> {
                if types.is_empty() {
                    return Ok(Vec::new());
                }
                let mut tx = storage.begin().await?;
                let mut select = select_types(BUCKET_COLUMNS, types);
                select.push(Db::FOR_UPDATE);
                let rows = select
                    .build()
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(Db::map_err)?;
                let buckets = rows
                    .iter()
                    .map(bucket_from_row)
                    .collect::<Result<Vec<_>>>()?;
                let taken = take_from(&buckets, want, now_ms);
                let update = sql!(
                    Db,
                    "UPDATE tenax_rate_limits SET tokens = ?, refilled_ms = ?
                     WHERE command_type = ?"
                );
                for (command_type, _, tokens, at) in &taken {
                    sqlx::query(update)
                        .bind(tokens)
                        .bind(at)
                        .bind(command_type)
                        .execute(&mut *tx)
                        .await
                        .map_err(Db::map_err)?;
                }
                tx.commit().await.map_err(Db::map_err)?;
                Ok(taken.into_iter().map(|(t, n, _, _)| (t, n)).collect())
            }

            /// In one transaction and one statement: return the unused tokens, each
            /// bucket at most `burst`.
            async fn give_back_once(storage: &$storage, back: &[(String, u32)]) -> Result<()> {
                if back.is_empty() {
                    return Ok(());
                }
                let mut qb = QueryBuilder::<Db>::new("UPDATE tenax_rate_limits SET tokens = ");
                qb.push(<Db as RateDialect>::LEAST)
                    .push("(burst, tokens + CASE command_type");
                for (command_type, n) in back {
                    qb.push(" WHEN ")
                        .push_bind(command_type.clone())
                        .push(" THEN ")
                        .push_bind(f64::from(*n));
                }
                qb.push(" END) WHERE command_type IN (");
                let mut list = qb.separated(", ");
                for (command_type, _) in back {
                    list.push_bind(command_type.clone());
                }
                qb.push(")");
                let mut tx = storage.begin().await?;
                qb.build().execute(&mut *tx).await.map_err(Db::map_err)?;
                tx.commit().await.map_err(Db::map_err)
            }

            #[async_trait]
            impl RatedBackend for $storage {
                async fn rated_types(&self, types: &[String]) -> Result<Vec<String>> {
                    let rated = if types.is_empty() {
                        Vec::new()
                    } else {
                        let rows = select_types("command_type", types)
                            .build()
                            .fetch_all(self.pool())
                            .await
                            .map_err(Db::map_err)?;
                        rows.iter()
                            .map(|row| Db::text(row, "command_type"))
                            .collect::<Result<Vec<_>>>()?
                    };
                    // No limited type among these any more: the next claims skip the probe.
                    $(self
                        .$hint
                        .store(!rated.is_empty(), std::sync::atomic::Ordering::Relaxed);)?
                    Ok(rated)
                }

                async fn clock_ms(&self, now: Option<DateTime<Utc>>) -> Result<i64> {
                    if let Some(now) = now {
                        return Ok(now.timestamp_millis());
                    }
                    let mut conn = self.pool().acquire().await.map_err(Db::map_err)?;
                    Ok(Db::clock(&mut *conn, None).await?.timestamp_millis())
                }

                async fn take_tokens(
                    &self,
                    types: &[String],
                    want: u32,
                    now_ms: i64,
                ) -> Result<Vec<(String, u32)>> {
                    retrying::<Db, _, _, _>(|| take_once(self, types, want, now_ms)).await
                }

                async fn give_back(&self, back: &[(String, u32)]) -> Result<()> {
                    retrying::<Db, _, _, _>(|| give_back_once(self, back)).await
                }

                async fn claim_unrated(&self, params: &TaskClaimParams) -> Result<Vec<TaskRecord>> {
                    retrying::<Db, _, _, _>(|| self.$claim(params)).await
                }

                $(async fn claim_skipping_rated(
                    &self,
                    params: &TaskClaimParams,
                ) -> Result<Option<(Vec<TaskRecord>, Vec<String>)>> {
                    self.$skip(params).await
                })?
            }

            impl $storage {
                pub(in super::super) async fn rate_limit_set_impl(
                    &self,
                    params: &RateLimitSetParams,
                ) -> Result<RateLimit> {
                    validate(params)?;
                    // This node's claims take the new limit's turn first from the next claim on.
                    $(self.$hint.store(true, std::sync::atomic::Ordering::Relaxed);)?
                    let now_ms = self.clock_ms(params.now).await?;
                    let sql = sql!(
                        Db,
                        "INSERT INTO tenax_rate_limits
                             (command_type, per_second, burst, tokens, refilled_ms)
                         VALUES (?, ?, ?, ?, ?)
                         {ON_BUCKET_TAKEN} tokens = {LEAST}(tenax_rate_limits.tokens, ?),
                             per_second = ?, burst = ?{RETURNING}",
                        ON_BUCKET_TAKEN = <Db as RateDialect>::ON_BUCKET_TAKEN,
                        LEAST = <Db as RateDialect>::LEAST,
                        RETURNING = returning_bucket::<Db>(),
                    );
                    let burst = Db::bind_count(params.burst);
                    let full = f64::from(params.burst);
                    let upsert = sqlx::query(sql)
                        .bind(&params.command_type)
                        .bind(params.per_second)
                        .bind(burst)
                        .bind(full)
                        .bind(now_ms)
                        .bind(full)
                        .bind(params.per_second)
                        .bind(burst);
                    let row = if Db::UPDATE_RETURNING {
                        upsert.fetch_one(self.pool()).await.map_err(Db::map_err)?
                    } else {
                        let mut tx = self.begin().await?;
                        upsert.execute(&mut *tx).await.map_err(Db::map_err)?;
                        let sql = sql!(
                            Db,
                            "SELECT {BUCKET_COLUMNS} FROM tenax_rate_limits WHERE command_type = ?"
                        );
                        let row = sqlx::query(sql)
                            .bind(&params.command_type)
                            .fetch_one(&mut *tx)
                            .await
                            .map_err(Db::map_err)?;
                        tx.commit().await.map_err(Db::map_err)?;
                        row
                    };
                    bucket_from_row(&row)?.record()
                }

                pub(in super::super) async fn rate_limit_list_impl(&self) -> Result<Vec<RateLimit>> {
                    let sql = sql!(
                        Db,
                        "SELECT {BUCKET_COLUMNS} FROM tenax_rate_limits ORDER BY command_type"
                    );
                    let rows = sqlx::query(sql)
                        .fetch_all(self.pool())
                        .await
                        .map_err(Db::map_err)?;
                    rows.iter()
                        .map(|row| bucket_from_row(row)?.record())
                        .collect()
                }

                pub(in super::super) async fn rate_limit_remove_impl(
                    &self,
                    command_type: &str,
                ) -> Result<()> {
                    let sql = sql!(Db, "DELETE FROM tenax_rate_limits WHERE command_type = ?");
                    let removed = sqlx::query(sql)
                        .bind(command_type)
                        .execute(self.pool())
                        .await
                        .map_err(Db::map_err)?
                        .rows_affected();
                    if removed == 0 {
                        return Err(StorageError::NotFound(format!("rate limit {command_type}")));
                    }
                    Ok(())
                }
            }
        }
    };
}
pub(crate) use rates_statements;
