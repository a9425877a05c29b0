//! The statements of [`crate::events`] (event rules, the pipeline's leases, the
//! sequencer, the relays' cursors, the listing and the prune) that differ between the
//! backends only in spelling, written once:
//! [`events_statements!`](crate::shared::events::events_statements) implements the
//! storage's `event_*_impl` methods for one backend, with what it spells its own way
//! taken from its [`Dialect`] and from [`EventsDialect`].
//!
//! A macro rather than generic functions, for the reason `crate::flow_sql` gives: each
//! expansion is checked against one backend's concrete types.
//!
//! Two plans differ and stay apart. SQLite and PostgreSQL take a lease with one
//! `INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING`, give positions with one
//! `UPDATE ... FROM` over the numbered unsequenced rows, and advance a cursor with one
//! fenced `UPDATE`: the `upsert` arm writes those once for both. MariaDB has no upsert
//! with a condition and no `RETURNING`: it locks the lease row (or its gap) first, and
//! gives positions to the rows it locked with a `CASE`, by hand in its `events.rs`.
//!
//! The shared statements are equivalent to those each backend had by hand, not the
//! same text:
//! - every write reads its time once, with [`Dialect::clock`], in its transaction, and
//!   binds it; PostgreSQL's statements computed `COALESCE($1, now())` (and `now()` plus
//!   or minus a number of milliseconds) in the statement instead, which is the same
//!   time, and its rule, lease and cursor writes, one statement each on the pool, now
//!   run in a transaction with that read;
//! - a lease's expiry is now + the TTL and a prune's cutoff now - `older_than`, both with
//!   the duration clamped to [`MAX_DELAY`](crate::MAX_DELAY) as SQLite and PostgreSQL
//!   did (MariaDB did not clamp the cutoff's duration; it clamps the times to its
//!   `DATETIME` range as before, in [`Dialect::bind_time`]);
//! - PostgreSQL's listing matches statuses and kinds with `IN (...)` lists, as the other
//!   backends did, instead of `= ANY` of arrays, and reads the head and the events in
//!   one (read committed) transaction; its prune reads each named relay's cursor by
//!   name, as the others did, instead of one `= ANY` read;
//! - SQLite's prune now locks nothing more (its `FOR UPDATE` is empty), PostgreSQL's and
//!   MariaDB's lock the sequencer's row as before;
//! - a lease row without a holder or an expiry is reported as
//!   [`StorageError::Corrupt`](crate::error::StorageError::Corrupt) on every backend
//!   (SQLite and PostgreSQL reported a decoding error).
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use crate::dialect::Dialect;

/// What the event statements spell differently, besides [`Dialect`].
pub(crate) trait EventsDialect: Dialect {
    /// The start of an `INSERT` of an event rule that skips a rule already there,
    /// writing no row (MariaDB: `INSERT IGNORE`).
    const INSERT_RULE: &'static str = "INSERT INTO";
    /// What ends that `INSERT` (SQLite, PostgreSQL: `ON CONFLICT ... DO NOTHING`).
    const RULE_TAKEN: &'static str = " ON CONFLICT (queue, command_type) DO NOTHING";
}

#[cfg(feature = "sqlite")]
impl EventsDialect for sqlx::Sqlite {}

#[cfg(feature = "postgres")]
impl EventsDialect for sqlx::Postgres {}

#[cfg(feature = "mysql")]
impl EventsDialect for sqlx::MySql {
    const INSERT_RULE: &'static str = "INSERT IGNORE INTO";
    const RULE_TAKEN: &'static str = "";
}

/// `now + d`, `d` clamped to [`MAX_DELAY`](crate::MAX_DELAY), saturating at the end of
/// time.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn later(now: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    TimeDelta::from_std(d.min(crate::MAX_DELAY))
        .ok()
        .and_then(|d| now.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// `now - d`, `d` clamped to [`MAX_DELAY`](crate::MAX_DELAY), saturating at the start
/// of time.
pub(crate) fn earlier(now: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    TimeDelta::from_std(d.min(crate::MAX_DELAY))
        .ok()
        .and_then(|d| now.checked_sub_signed(d))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// Implement the event methods of the storage `$storage` on the database `$db` (an
/// [`EventsDialect`]), both given as full paths: `event_rule_set_impl`,
/// `event_rule_list_impl`, `event_sequence_impl`, `event_list_impl`,
/// `event_prune_impl`, and `lease_from_row` for the module. `event_sequence_impl` gives
/// the positions with the module's `assign_positions(tx, last, now, limit)`.
///
/// With `upsert` (SQLite, PostgreSQL) also `event_lease_impl`,
/// `event_cursor_advance_impl` and `assign_positions`, in one statement each; without
/// it the module writes them itself.
macro_rules! events_statements {
    ($storage:ty, $db:ty) => {
        $crate::shared::events::events_statements!(@common $storage, $db);
    };
    ($storage:ty, $db:ty, upsert) => {
        $crate::shared::events::events_statements!(@common $storage, $db);
        $crate::shared::events::events_statements!(@upsert $storage, $db);
    };
    (@common $storage:ty, $db:ty) => {
        use shared_events::lease_from_row;

        mod shared_events {
            use sqlx::{QueryBuilder, Row as _};
            use tenax_core::TaskId;

            use $crate::dialect::{sql, Dialect as _};
            use $crate::error::{Result, StorageError};
            use $crate::events::{
                page, prune_bound, rule_from_stored, validate_list, validate_prune,
                validate_rule, validate_sequence, EventKind, EventLease, EventListParams,
                EventPage, EventPruneParams, EventRecord, EventRule, EventRuleParams,
                EventSequenceParams, SEQUENCER_LEASE,
            };
            use $crate::shared::events::{earlier, EventsDialect as _};

            type Db = $db;
            type DbRow = <$db as sqlx::Database>::Row;

            const COLUMNS: &str =
                "id, event_id, seq, event, task_id, queue, command_type, status, task, occurred_at";

            /// Most positions one listing looks through, so a narrow filter over a long
            /// stream answers in bounded time (the reader continues from
            /// `scanned_through`).
            const SCAN_WINDOW: i64 = 100_000;

            fn record_from_row(row: &DbRow) -> Result<EventRecord> {
                Ok(EventRecord {
                    id: row.try_get("id").map_err(Db::map_err)?,
                    event_id: Db::text(row, "event_id")?,
                    seq: row.try_get("seq").map_err(Db::map_err)?,
                    event: EventKind::parse(&Db::text(row, "event")?)?,
                    task_id: TaskId(row.try_get("task_id").map_err(Db::map_err)?),
                    queue: Db::text(row, "queue")?,
                    command_type: Db::text(row, "command_type")?,
                    status: Db::text(row, "status")?,
                    task: Db::text(row, "task")?,
                    occurred_at: Db::read_time(row, "occurred_at")?,
                })
            }

            /// A lease read with `name, holder, epoch, expires_at, last_seq`.
            pub(super) fn lease_from_row(row: &DbRow) -> Result<EventLease> {
                Ok(EventLease {
                    name: Db::text(row, "name")?,
                    holder: Db::opt_text(row, "holder")?.ok_or_else(|| {
                        StorageError::Corrupt("event lease without holder".into())
                    })?,
                    epoch: row.try_get("epoch").map_err(Db::map_err)?,
                    expires_at: Db::read_opt_time(row, "expires_at")?.ok_or_else(|| {
                        StorageError::Corrupt("event lease without expiry".into())
                    })?,
                    last_seq: row.try_get("last_seq").map_err(Db::map_err)?,
                })
            }

            impl $storage {
                pub(crate) async fn event_rule_set_impl(
                    &self,
                    params: &EventRuleParams,
                ) -> Result<bool> {
                    let (queue, command_type) = validate_rule(params)?;
                    let mut tx = self.begin().await?;
                    let now = Db::clock(&mut *tx, params.now).await?;
                    let done = if params.enabled {
                        let sql = sql!(
                            Db,
                            "{INSERT} tenax_event_rules (queue, command_type, created_at)
                             VALUES (?, ?, ?){TAKEN}",
                            INSERT = Db::INSERT_RULE,
                            TAKEN = Db::RULE_TAKEN
                        );
                        sqlx::query(sql)
                            .bind(&queue)
                            .bind(&command_type)
                            .bind(Db::bind_time(now))
                            .execute(&mut *tx)
                            .await
                    } else {
                        let sql = sql!(
                            Db,
                            "DELETE FROM tenax_event_rules WHERE queue = ? AND command_type = ?"
                        );
                        sqlx::query(sql)
                            .bind(&queue)
                            .bind(&command_type)
                            .execute(&mut *tx)
                            .await
                    }
                    .map_err(Db::map_err)?;
                    tx.commit().await.map_err(Db::map_err)?;
                    Ok(done.rows_affected() == 1)
                }

                pub(crate) async fn event_rule_list_impl(&self) -> Result<Vec<EventRule>> {
                    let rows = sqlx::query(
                        "SELECT queue, command_type, created_at FROM tenax_event_rules
                         ORDER BY queue, command_type",
                    )
                    .fetch_all(self.pool())
                    .await
                    .map_err(Db::map_err)?;
                    rows.iter()
                        .map(|row| {
                            Ok(rule_from_stored(
                                Db::text(row, "queue")?,
                                Db::text(row, "command_type")?,
                                Db::read_time(row, "created_at")?,
                            ))
                        })
                        .collect()
                }

                /// Under the sequencer's lease (its row locked where rows are), the
                /// next positions, by the module's `assign_positions`.
                pub(crate) async fn event_sequence_impl(
                    &self,
                    params: &EventSequenceParams,
                ) -> Result<Option<u64>> {
                    validate_sequence(params)?;
                    let mut tx = self.begin().await?;
                    let now = Db::clock(&mut *tx, params.now).await?;
                    let sql = sql!(
                        Db,
                        "SELECT last_seq FROM tenax_event_leases
                         WHERE name = ? AND holder = ? AND epoch = ? AND expires_at > ?{LOCK}",
                        LOCK = Db::FOR_UPDATE
                    );
                    let last: Option<i64> = sqlx::query_scalar(sql)
                        .bind(SEQUENCER_LEASE)
                        .bind(&params.lease.holder)
                        .bind(params.lease.epoch)
                        .bind(Db::bind_time(now))
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(Db::map_err)?;
                    let Some(last) = last else {
                        return Ok(None);
                    };
                    let count = super::assign_positions(&mut tx, last, now, params.limit).await?;
                    if count > 0 {
                        let sql = sql!(
                            Db,
                            "UPDATE tenax_event_leases SET last_seq = last_seq + ? WHERE name = ?"
                        );
                        sqlx::query(sql)
                            .bind(count as i64)
                            .bind(SEQUENCER_LEASE)
                            .execute(&mut *tx)
                            .await
                            .map_err(Db::map_err)?;
                    }
                    tx.commit().await.map_err(Db::map_err)?;
                    Ok(Some(count))
                }

                pub(crate) async fn event_list_impl(
                    &self,
                    params: &EventListParams,
                ) -> Result<EventPage> {
                    validate_list(params)?;
                    // One read transaction, so the head and the events agree (where a
                    // transaction is one snapshot).
                    let mut tx = self.pool().begin().await.map_err(Db::map_err)?;
                    let (head, pruned_through) = stream_state(&mut tx, false).await?;
                    let upper = head.min(params.after.saturating_add(SCAN_WINDOW));
                    let mut qb = QueryBuilder::<Db>::new(format!(
                        "SELECT {COLUMNS} FROM tenax_events WHERE seq > "
                    ));
                    qb.push_bind(params.after);
                    qb.push(" AND seq <= ").push_bind(upper);
                    if let Some(queue) = &params.queue {
                        qb.push(" AND queue = ").push_bind(queue.clone());
                    }
                    if let Some(command_type) = &params.command_type {
                        qb.push(" AND command_type = ")
                            .push_bind(command_type.clone());
                    }
                    if !params.statuses.is_empty() {
                        qb.push(" AND status IN ");
                        push_texts(&mut qb, params.statuses.iter().map(|s| s.as_str()));
                    }
                    if !params.events.is_empty() {
                        qb.push(" AND event IN ");
                        push_texts(&mut qb, params.events.iter().map(|k| k.as_str()));
                    }
                    qb.push(" ORDER BY seq LIMIT ")
                        .push_bind(i64::from(params.limit));
                    let rows = qb.build().fetch_all(&mut *tx).await.map_err(Db::map_err)?;
                    tx.commit().await.map_err(Db::map_err)?;
                    let events = rows
                        .iter()
                        .map(record_from_row)
                        .collect::<Result<Vec<_>>>()?;
                    Ok(page(params, events, head, pruned_through, upper))
                }

                pub(crate) async fn event_prune_impl(
                    &self,
                    params: &EventPruneParams,
                ) -> Result<u64> {
                    validate_prune(params)?;
                    let mut tx = self.begin().await?;
                    let now = Db::clock(&mut *tx, params.now).await?;
                    let (head, pruned) = stream_state(&mut tx, true).await?;
                    let mut relays = params.relays.clone();
                    relays.sort();
                    relays.dedup();
                    let mut delivered = Vec::new();
                    for relay in &relays {
                        let sql = sql!(Db, "SELECT last_seq FROM tenax_event_leases WHERE name = ?");
                        let seq: Option<i64> = sqlx::query_scalar(sql)
                            .bind(relay)
                            .fetch_optional(&mut *tx)
                            .await
                            .map_err(Db::map_err)?;
                        delivered.extend(seq);
                    }
                    let bound = prune_bound(head, &relays, &delivered);
                    let sql = sql!(
                        Db,
                        "SELECT MAX(seq) FROM tenax_events
                         WHERE seq > ? AND seq <= ? AND sequenced_at < ?"
                    );
                    let through: Option<i64> = sqlx::query_scalar(sql)
                        .bind(pruned)
                        .bind(bound)
                        .bind(Db::bind_time(earlier(now, params.older_than)))
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(Db::map_err)?;
                    let Some(through) = through else {
                        return Ok(0);
                    };
                    let sql = sql!(Db, "DELETE FROM tenax_events WHERE seq > ? AND seq <= ?");
                    let done = sqlx::query(sql)
                        .bind(pruned)
                        .bind(through)
                        .execute(&mut *tx)
                        .await
                        .map_err(Db::map_err)?;
                    let sql = sql!(
                        Db,
                        "UPDATE tenax_event_leases SET pruned_through = ? WHERE name = ?"
                    );
                    sqlx::query(sql)
                        .bind(through)
                        .bind(SEQUENCER_LEASE)
                        .execute(&mut *tx)
                        .await
                        .map_err(Db::map_err)?;
                    tx.commit().await.map_err(Db::map_err)?;
                    Ok(done.rows_affected())
                }
            }

            /// The sequencer's last position and how far the stream is pruned (both 0
            /// without its row); its row locked when `lock`. The prune needs the row
            /// (the migration writes it), the listing does not.
            async fn stream_state(
                tx: &mut sqlx::Transaction<'static, Db>,
                lock: bool,
            ) -> Result<(i64, i64)> {
                let row = if lock {
                    let sql = sql!(
                        Db,
                        "SELECT last_seq, pruned_through FROM tenax_event_leases
                         WHERE name = ?{LOCK}",
                        LOCK = Db::FOR_UPDATE
                    );
                    Some(
                        sqlx::query(sql)
                            .bind(SEQUENCER_LEASE)
                            .fetch_one(&mut **tx)
                            .await
                            .map_err(Db::map_err)?,
                    )
                } else {
                    let sql = sql!(
                        Db,
                        "SELECT last_seq, pruned_through FROM tenax_event_leases WHERE name = ?"
                    );
                    sqlx::query(sql)
                        .bind(SEQUENCER_LEASE)
                        .fetch_optional(&mut **tx)
                        .await
                        .map_err(Db::map_err)?
                };
                match row {
                    Some(row) => Ok((
                        row.try_get("last_seq").map_err(Db::map_err)?,
                        row.try_get("pruned_through").map_err(Db::map_err)?,
                    )),
                    None => Ok((0, 0)),
                }
            }

            /// Append `(?, ?, ...)` binding `items` (at least one).
            fn push_texts(qb: &mut QueryBuilder<'_, Db>, items: impl Iterator<Item = &'static str>) {
                qb.push("(");
                let mut list = qb.separated(", ");
                for item in items {
                    list.push_bind(item);
                }
                qb.push(")");
            }
        }
    };
    (@upsert $storage:ty, $db:ty) => {
        use shared_upserts::assign_positions;

        mod shared_upserts {
            use chrono::{DateTime, Utc};

            use $crate::dialect::{sql, Dialect as _};
            use $crate::error::Result;
            use $crate::events::{
                validate_cursor, validate_lease, EventCursorParams, EventLease,
                EventLeaseParams,
            };
            use $crate::shared::events::later;

            type Db = $db;

            impl $storage {
                pub(crate) async fn event_lease_impl(
                    &self,
                    params: &EventLeaseParams,
                ) -> Result<Option<EventLease>> {
                    validate_lease(params)?;
                    let mut tx = self.begin().await?;
                    let now = Db::clock(&mut *tx, params.now).await?;
                    let sql = sql!(
                        Db,
                        "INSERT INTO tenax_event_leases AS l (name, holder, epoch, expires_at)
                         VALUES (?, ?, 1, ?)
                         ON CONFLICT (name) DO UPDATE SET
                             epoch = CASE WHEN l.holder = excluded.holder AND l.expires_at > ?
                                          THEN l.epoch ELSE l.epoch + 1 END,
                             holder = excluded.holder,
                             expires_at = excluded.expires_at
                         WHERE l.holder IS NULL OR l.holder = excluded.holder
                            OR l.expires_at <= ?
                         RETURNING name, holder, epoch, expires_at, last_seq"
                    );
                    let row = sqlx::query(sql)
                        .bind(&params.name)
                        .bind(&params.holder)
                        .bind(Db::bind_time(later(now, params.ttl)))
                        .bind(Db::bind_time(now))
                        .bind(Db::bind_time(now))
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(Db::map_err)?;
                    let lease = row.as_ref().map(super::lease_from_row).transpose()?;
                    tx.commit().await.map_err(Db::map_err)?;
                    Ok(lease)
                }

                /// One fenced write: it changes the row only while the lease is held.
                pub(crate) async fn event_cursor_advance_impl(
                    &self,
                    params: &EventCursorParams,
                ) -> Result<bool> {
                    validate_cursor(params)?;
                    let mut tx = self.begin().await?;
                    let now = Db::clock(&mut *tx, params.now).await?;
                    let sql = sql!(
                        Db,
                        "UPDATE tenax_event_leases
                         SET last_seq = CASE WHEN last_seq < ? THEN ? ELSE last_seq END
                         WHERE name = ? AND holder = ? AND epoch = ? AND expires_at > ?"
                    );
                    let done = sqlx::query(sql)
                        .bind(params.last_seq)
                        .bind(params.last_seq)
                        .bind(&params.lease.name)
                        .bind(&params.lease.holder)
                        .bind(params.lease.epoch)
                        .bind(Db::bind_time(now))
                        .execute(&mut *tx)
                        .await
                        .map_err(Db::map_err)?;
                    tx.commit().await.map_err(Db::map_err)?;
                    Ok(done.rows_affected() == 1)
                }
            }

            /// Give up to `limit` unsequenced events, in row order, the positions after
            /// `last`, in one statement; returns how many.
            pub(super) async fn assign_positions(
                tx: &mut sqlx::Transaction<'static, Db>,
                last: i64,
                now: DateTime<Utc>,
                limit: u32,
            ) -> Result<u64> {
                let sql = sql!(
                    Db,
                    "UPDATE tenax_events SET seq = ? + next.n, sequenced_at = ?
                     FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM tenax_events
                           WHERE seq IS NULL ORDER BY id LIMIT ?) AS next
                     WHERE tenax_events.id = next.id"
                );
                let done = sqlx::query(sql)
                    .bind(last)
                    .bind(Db::bind_time(now))
                    .bind(i64::from(limit))
                    .execute(&mut **tx)
                    .await
                    .map_err(Db::map_err)?;
                Ok(done.rows_affected())
            }
        }
    };
}
pub(crate) use events_statements;
