//! The statements of the outbox of outbound deliveries ([`crate::outbox`]) written
//! once: [`outbox_statements!`](crate::shared::outbox::outbox_statements) implements
//! the outbox methods of one backend's storage, with what the backend spells its own
//! way taken from its [`Dialect`] and its [`OutboxSql`].
//!
//! Every backend shares the listing, the record of senders seen, the pruning and the
//! stats. SQLite and MariaDB also share the claim and the settle, each a transaction of
//! a lookup and a write by id; PostgreSQL writes each of those in one statement of its
//! own (a `FOR UPDATE SKIP LOCKED` CTE for the claim, `UNNEST` of the claims' arrays for
//! the settle, its clock inside the statement), kept in its `outbox.rs`.
//!
//! The statements are equivalent to those each backend had by hand, not the same text:
//! placeholders are bound in order (a value used twice is bound twice) instead of
//! numbered reuse, and PostgreSQL's listing tests `? IS NULL` without a cast; SQLite's
//! claim looks up the due ids, then updates them (it updated a subquery's rows in one
//! statement), under the same write lock, and MariaDB's claim reads the claimed rows
//! back unordered and sorts them by id, as SQLite's always did (it read them
//! `ORDER BY id`); SQLite's settle of a retry tests
//! `created_at < next - max_age` (MariaDB's test) instead of
//! `next > created_at + max_age`, with the values bound instead of written into the
//! text, and with `CASE WHEN` where MariaDB had `IF()`; the record of senders seen is
//! one upsert per kind in one transaction on every backend, the kinds sorted and
//! deduplicated (PostgreSQL upserted all of them in one statement, sorted alike;
//! SQLite and MariaDB in the order given); pruning binds times computed from the clock
//! (PostgreSQL computed them in its statements, from `now()` or the override, alike); the
//! stats read the clock first, then count on the same connection, outside a transaction
//! (MariaDB read both inside one, PostgreSQL counted against `now()` in one statement),
//! and count with [`Dialect::COUNT_STAR`].

use std::time::Duration;

use crate::dialect::Dialect;

/// What the outbox statements spell differently on each backend. SQLite's and
/// PostgreSQL's spellings are below; MariaDB's, which uses its own time arithmetic, is in
/// its `outbox.rs`.
pub(crate) trait OutboxSql: Dialect {
    /// How long ago the oldest row of a group was written, in whole milliseconds (an
    /// `i64` column), against the time bound at its one `?`.
    const OLDEST_AGE_MS: &'static str;
    /// Ends an insert of a sender into `tenax_outbox_senders` when the kind may be
    /// recorded already: its `seen_at` becomes the inserted one.
    const SEEN_AGAIN: &'static str;

    /// `t - d` as the time columns hold it, as the backend has always computed it
    /// (SQLite and PostgreSQL: `d` in whole milliseconds, at most [`crate::MAX_DELAY`]).
    fn earlier(t: Self::Time, d: Duration) -> Self::Time;
}

/// What the claim and the settle written here need besides: the backends that use them
/// (SQLite, MariaDB).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) trait OutboxClaimSql: OutboxSql {
    /// `t + d` as the time columns hold it, with `d` at most [`crate::MAX_DELAY`], as
    /// the backend has always computed it (SQLite: `d` in whole milliseconds).
    fn later(t: Self::Time, d: Duration) -> Self::Time;
}

/// SQLite's spelling of the outbox statements: times are milliseconds.
#[cfg(feature = "sqlite")]
impl OutboxSql for sqlx::Sqlite {
    const OLDEST_AGE_MS: &'static str = "? - MIN(created_at)";
    const SEEN_AGAIN: &'static str = "ON CONFLICT (kind) DO UPDATE SET seen_at = excluded.seen_at";

    fn earlier(t: i64, d: Duration) -> i64 {
        t.saturating_sub(crate::common::duration_ms(d))
    }
}

#[cfg(feature = "sqlite")]
impl OutboxClaimSql for sqlx::Sqlite {
    fn later(t: i64, d: Duration) -> i64 {
        t.saturating_add(crate::common::duration_ms(d))
    }
}

/// PostgreSQL's spelling of the outbox statements.
#[cfg(feature = "postgres")]
impl OutboxSql for sqlx::Postgres {
    const OLDEST_AGE_MS: &'static str = "(EXTRACT(EPOCH FROM (? - MIN(created_at))) * 1000)::int8";
    const SEEN_AGAIN: &'static str = "ON CONFLICT (kind) DO UPDATE SET seen_at = EXCLUDED.seen_at";

    fn earlier(t: chrono::DateTime<chrono::Utc>, d: Duration) -> chrono::DateTime<chrono::Utc> {
        let d = chrono::TimeDelta::milliseconds(crate::common::duration_ms(d));
        t.checked_sub_signed(d)
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC)
    }
}

/// Implement the outbox methods that the backend's `storage.rs` calls on the storage
/// `$storage` of the database `$db` (an [`OutboxSql`]), both given as full paths:
/// `outbox_list_impl`, `outbox_senders_seen_impl`, `outbox_prune_impl` and
/// `outbox_stats_impl`, and with `claim_and_settle` also `outbox_claim_impl` and
/// `outbox_settle_impl`. The expansion's module `shared` holds `record_from_row`, for
/// the backend's own statements.
macro_rules! outbox_statements {
    // The claim and the settle as a transaction of a lookup and a write by id.
    (@claim_and_settle $storage:ty, $db:ty) => {
        use sqlx::QueryBuilder;

        use $crate::outbox::{
            settle_parts, validate_claim, validate_settle, OutboxClaimParams,
            OutboxSettleParams,
        };
        use $crate::shared::outbox::OutboxClaimSql as _;

        impl $storage {
            pub(crate) async fn outbox_claim_impl(
                &self,
                params: &OutboxClaimParams,
            ) -> Result<Vec<OutboxRecord>> {
                validate_claim(params)?;
                let mut tx = self.begin().await?;
                let now = Db::bind_time(Db::clock(&mut *tx, params.now).await?);
                // The due rows, locked, skipping those another claimer holds (SQLite's
                // write lock holds them all already).
                let sql = sql!(
                    Db,
                    "SELECT id FROM tenax_outbox
                     WHERE status = 'pending' AND kind = ? AND next_attempt_at <= ?
                     ORDER BY next_attempt_at, id LIMIT ?{SKIP_LOCKED}",
                    SKIP_LOCKED = if Db::FOR_UPDATE.is_empty() {
                        ""
                    } else {
                        " FOR UPDATE SKIP LOCKED"
                    }
                );
                let ids: Vec<i64> = sqlx::query_scalar(sql)
                    .bind(params.kind.as_str())
                    .bind(now)
                    .bind(i64::from(params.limit))
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(Db::map_err)?;
                if ids.is_empty() {
                    tx.commit().await.map_err(Db::map_err)?;
                    return Ok(Vec::new());
                }
                let mut update = QueryBuilder::<Db>::new(
                    "UPDATE tenax_outbox SET attempts = attempts + 1, next_attempt_at = ",
                );
                update
                    .push_bind(Db::later(now, params.lease))
                    .push(" WHERE id ");
                Db::push_ids(&mut update, &ids);
                let rows = if Db::UPDATE_RETURNING {
                    update.push(" RETURNING ").push(COLUMNS);
                    update.build().fetch_all(&mut *tx).await.map_err(Db::map_err)?
                } else {
                    update.build().execute(&mut *tx).await.map_err(Db::map_err)?;
                    let mut select = QueryBuilder::<Db>::new(format!(
                        "SELECT {COLUMNS} FROM tenax_outbox WHERE id "
                    ));
                    Db::push_ids(&mut select, &ids);
                    select.build().fetch_all(&mut *tx).await.map_err(Db::map_err)?
                };
                let mut records = rows
                    .iter()
                    .map(record_from_row)
                    .collect::<Result<Vec<_>>>()?;
                tx.commit().await.map_err(Db::map_err)?;
                records.sort_by_key(|r| r.id);
                Ok(records)
            }

            pub(crate) async fn outbox_settle_impl(
                &self,
                params: &OutboxSettleParams,
            ) -> Result<u64> {
                if !validate_settle(params)? {
                    return Ok(0);
                }
                let (status, delay, max_age, error) = settle_parts(&params.outcome);
                let mut tx = self.begin().await?;
                let now = Db::bind_time(Db::clock(&mut *tx, params.now).await?);
                let next = Db::later(now, delay);
                let mut qb = QueryBuilder::<Db>::new("UPDATE tenax_outbox SET ");
                if status == OutboxStatus::Pending {
                    // A retry past the row's maximum age expires it instead: the age
                    // limit is the earliest creation time a retry keeps pending. Both
                    // assignments test `created_at` only (MariaDB assigns left to right,
                    // so a test on `status` would see the new value).
                    let oldest_kept = Db::earlier(next, max_age);
                    qb.push("settled_at = CASE WHEN created_at < ")
                        .push_bind(oldest_kept)
                        .push(" THEN ")
                        .push_bind(now)
                        .push(" END, status = CASE WHEN created_at < ")
                        .push_bind(oldest_kept)
                        .push(" THEN 'expired' ELSE 'pending' END");
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
                let done = qb.build().execute(&mut *tx).await.map_err(Db::map_err)?;
                tx.commit().await.map_err(Db::map_err)?;
                Ok(done.rows_affected())
            }
        }
    };

    ($storage:ty, $db:ty $(, $with:ident)?) => {
        mod shared {
            use sqlx::Row as _;
            use tenax_core::TaskId;

            use $crate::dialect::{sql, Dialect as _};
            use $crate::error::{Result, StorageError};
            use $crate::outbox::{
                stat_from, unsent_error, validate_list, OutboxKind, OutboxListParams,
                OutboxPruneParams, OutboxRecord, OutboxSendersParams, OutboxStat,
                OutboxStatsParams, OutboxStatus,
            };
            use $crate::shared::outbox::OutboxSql as _;

            type Db = $db;
            type DbRow = <$db as sqlx::Database>::Row;
            type Count = <$db as $crate::dialect::Dialect>::Count;

            const COLUMNS: &str = "id, delivery_id, kind, task_id, url, body, status, attempts, \
                 next_attempt_at, last_error, created_at, settled_at";

            impl $storage {
                pub(crate) async fn outbox_list_impl(
                    &self,
                    params: &OutboxListParams,
                ) -> Result<Vec<OutboxRecord>> {
                    validate_list(params)?;
                    let kind = params.kind.map(OutboxKind::as_str);
                    let status = params.status.map(OutboxStatus::as_str);
                    let task = params.task_id.map(|t| t.0);
                    let sql = sql!(
                        Db,
                        "SELECT {COLUMNS} FROM tenax_outbox
                         WHERE (? IS NULL OR kind = ?) AND (? IS NULL OR status = ?)
                           AND (? IS NULL OR task_id = ?)
                         ORDER BY id LIMIT ?"
                    );
                    let rows = sqlx::query(sql)
                        .bind(kind)
                        .bind(kind)
                        .bind(status)
                        .bind(status)
                        .bind(task)
                        .bind(task)
                        .bind(i64::from(params.limit))
                        .fetch_all(self.pool())
                        .await
                        .map_err(Db::map_err)?;
                    rows.iter().map(record_from_row).collect()
                }

                pub(crate) async fn outbox_senders_seen_impl(
                    &self,
                    params: &OutboxSendersParams,
                ) -> Result<()> {
                    // Each kind once, in one order: concurrent callers lock the rows in
                    // the same order.
                    let mut kinds: Vec<&str> = params.kinds.iter().map(|k| k.as_str()).collect();
                    kinds.sort_unstable();
                    kinds.dedup();
                    let mut tx = self.begin().await?;
                    let now = Db::bind_time(Db::clock(&mut *tx, params.now).await?);
                    for kind in kinds {
                        let sql = sql!(
                            Db,
                            "INSERT INTO tenax_outbox_senders (kind, seen_at) VALUES (?, ?)
                             {SEEN_AGAIN}",
                            SEEN_AGAIN = Db::SEEN_AGAIN
                        );
                        sqlx::query(sql)
                            .bind(kind)
                            .bind(now)
                            .execute(&mut *tx)
                            .await
                            .map_err(Db::map_err)?;
                    }
                    tx.commit().await.map_err(Db::map_err)
                }

                pub(crate) async fn outbox_prune_impl(
                    &self,
                    params: &OutboxPruneParams,
                ) -> Result<u64> {
                    let mut tx = self.begin().await?;
                    let now = Db::bind_time(Db::clock(&mut *tx, params.now).await?);
                    let silent = Db::earlier(now, params.sender_grace);
                    let sql = sql!(Db, "DELETE FROM tenax_outbox_senders WHERE seen_at < ?");
                    sqlx::query(sql)
                        .bind(silent)
                        .execute(&mut *tx)
                        .await
                        .map_err(Db::map_err)?;
                    let sql = sql!(
                        Db,
                        "UPDATE tenax_outbox SET status = 'expired', settled_at = ?, last_error = ?
                         WHERE status = 'pending' AND created_at < ?
                           AND kind NOT IN (SELECT kind FROM tenax_outbox_senders)"
                    );
                    let expired = sqlx::query(sql)
                        .bind(now)
                        .bind(unsent_error(params.sender_grace))
                        .bind(silent)
                        .execute(&mut *tx)
                        .await
                        .map_err(Db::map_err)?;
                    let before = Db::earlier(now, params.older_than);
                    let sql = sql!(
                        Db,
                        "DELETE FROM tenax_outbox
                         WHERE (status <> 'pending' AND settled_at < ?)
                            OR (status = 'pending' AND created_at < ?)"
                    );
                    let done = sqlx::query(sql)
                        .bind(before)
                        .bind(before)
                        .execute(&mut *tx)
                        .await
                        .map_err(Db::map_err)?;
                    tx.commit().await.map_err(Db::map_err)?;
                    Ok(expired.rows_affected() + done.rows_affected())
                }

                pub(crate) async fn outbox_stats_impl(
                    &self,
                    params: &OutboxStatsParams,
                ) -> Result<Vec<OutboxStat>> {
                    let mut conn = self.pool().acquire().await.map_err(Db::map_err)?;
                    let now = Db::bind_time(Db::clock(&mut *conn, params.now).await?);
                    let sql = sql!(
                        Db,
                        "SELECT kind, {COUNT_STAR} AS pending, {OLDEST_AGE_MS} AS oldest_ms
                         FROM tenax_outbox
                         WHERE status = 'pending'
                           AND kind IN (SELECT kind FROM tenax_outbox_senders)
                         GROUP BY kind ORDER BY kind",
                        COUNT_STAR = Db::COUNT_STAR,
                        OLDEST_AGE_MS = Db::OLDEST_AGE_MS
                    );
                    let rows = sqlx::query(sql)
                        .bind(now)
                        .fetch_all(&mut *conn)
                        .await
                        .map_err(Db::map_err)?;
                    rows.iter()
                        .map(|row| {
                            stat_from(
                                &Db::text(row, "kind")?,
                                row.try_get("pending").map_err(Db::map_err)?,
                                row.try_get("oldest_ms").map_err(Db::map_err)?,
                            )
                        })
                        .collect()
                }
            }

            /// An outbox row read with `COLUMNS`.
            pub(super) fn record_from_row(row: &DbRow) -> Result<OutboxRecord> {
                let attempts = i64::from(row.try_get::<Count, _>("attempts").map_err(Db::map_err)?);
                Ok(OutboxRecord {
                    id: row.try_get("id").map_err(Db::map_err)?,
                    delivery_id: Db::text(row, "delivery_id")?,
                    kind: OutboxKind::parse(&Db::text(row, "kind")?)?,
                    task_id: TaskId(row.try_get("task_id").map_err(Db::map_err)?),
                    url: Db::opt_text(row, "url")?,
                    body: Db::text(row, "body")?,
                    status: OutboxStatus::parse(&Db::text(row, "status")?)?,
                    attempts: u32::try_from(attempts).map_err(|_| {
                        StorageError::Corrupt(format!("outbox attempts = {attempts}"))
                    })?,
                    next_attempt_at: Db::read_time(row, "next_attempt_at")?,
                    last_error: Db::opt_text(row, "last_error")?,
                    created_at: Db::read_time(row, "created_at")?,
                    settled_at: Db::read_opt_time(row, "settled_at")?,
                })
            }

            $($crate::shared::outbox::outbox_statements!(@$with $storage, $db);)?
        }
    };
}
pub(crate) use outbox_statements;
