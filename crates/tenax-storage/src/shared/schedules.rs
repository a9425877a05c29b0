//! The statements of periodic schedules ([`crate::schedules`]) written once:
//! [`schedule_statements!`](crate::shared::schedules::schedule_statements) implements
//! the schedule methods of one backend's storage, with what the backend spells its own
//! way taken from its [`Dialect`] and its [`ScheduleSql`].
//!
//! Every write is one transaction, run again after a lost lock conflict
//! ([`retrying`](crate::dialect::retrying): only MariaDB loses them). Firing locks the
//! due schedules `FOR UPDATE SKIP LOCKED` where the database locks rows (on SQLite the
//! write lock taken by `BEGIN IMMEDIATE` holds them all), so concurrent schedulers fire
//! different schedules; each tick inserts its task under the tick's number (a number
//! that is taken inserts nothing), and `next_fire_at` moves with a write conditional on
//! the value read.
//!
//! The statements are equivalent to those each backend had by hand, not the same text:
//! placeholders are bound in order (a value used twice is bound twice) instead of
//! SQLite's and PostgreSQL's numbered reuse; a priority is bound as `i16` and read as
//! `i16` on every backend (SQLite's `INTEGER` and MariaDB's `TINYINT` hold it as well),
//! and SQLite's `paused` is read as a `bool`; a new schedule is inserted with `paused`
//! `FALSE` (SQLite stores it as 0); MariaDB's update of a schedule keeps its
//! `next_fire_at` with `CASE WHEN` as the others did, instead of binding the value it
//! read under the same lock; and the times computed from the clock are computed from it
//! at the precision its columns hold ([`ScheduleSql::stored`]), as each backend did.

use std::future::Future;

use chrono::{DateTime, Utc};

use crate::dialect::Dialect;
use crate::error::Result;

/// What [`ScheduleSql::insert_new`] inserted: the row, where the insert returns it
/// (SQLite, PostgreSQL), else the id it was given (MariaDB; 0 in a table without an
/// auto-increment column).
#[allow(
    dead_code,
    reason = "a build without one of the backends makes only one of the variants"
)]
pub(crate) enum Inserted<R> {
    /// The row the insert returned.
    Row(R),
    /// The id the insert gave it.
    Id(i64),
}

/// A query of the database `D` with its bound values.
pub(crate) type Query<'q, D> = sqlx::query::Query<'q, D, <D as sqlx::Database>::Arguments<'q>>;

/// What the schedule statements spell differently on each backend. SQLite's and
/// PostgreSQL's spellings are below; MariaDB's, which uses its error numbers, is in its
/// `schedules.rs`.
pub(crate) trait ScheduleSql: Dialect {
    /// `paused` is false, spelled as the index of due schedules is written, so that the
    /// scheduler's query reads that index (SQLite's and PostgreSQL's are partial
    /// indexes `WHERE paused = 0` and `WHERE NOT paused`; MariaDB's leads with `paused`).
    const NOT_PAUSED: &'static str;

    /// `t` at the precision the backend's time columns hold (SQLite: milliseconds;
    /// PostgreSQL and MariaDB: microseconds, MariaDB's within `DATETIME`'s range): the
    /// clock that a schedule's next fire time and its ticks are computed from.
    fn stored(t: DateTime<Utc>) -> DateTime<Utc>;

    /// Appended to an insert of one row whose unique key (`on_conflict`, an
    /// `ON CONFLICT (...) DO NOTHING`) may be taken, for [`ScheduleSql::insert_new`]:
    /// where inserts return their row, `on_conflict` and `RETURNING` the columns
    /// `returning`.
    fn if_new(on_conflict: &'static str, returning: &'static str) -> String {
        [on_conflict, " RETURNING ", returning].concat()
    }

    /// Run `insert`, an insert of one row ending with [`ScheduleSql::if_new`]: what it
    /// inserted, or `None` (and no error) when the row's unique key is taken.
    fn insert_new<'q>(
        conn: &mut Self::Connection,
        insert: Query<'q, Self>,
    ) -> impl Future<Output = Result<Option<Inserted<Self::Row>>>> + Send;
}

/// SQLite's spelling of the schedule statements: millisecond times, and inserts that
/// skip a taken key and return their row.
#[cfg(feature = "sqlite")]
impl ScheduleSql for sqlx::Sqlite {
    const NOT_PAUSED: &'static str = "paused = 0";

    fn stored(t: DateTime<Utc>) -> DateTime<Utc> {
        chrono::SubsecRound::trunc_subsecs(t, 3)
    }

    async fn insert_new<'q>(
        conn: &mut sqlx::SqliteConnection,
        insert: Query<'q, Self>,
    ) -> Result<Option<Inserted<sqlx::sqlite::SqliteRow>>> {
        let row = insert.fetch_optional(conn).await.map_err(Self::map_err)?;
        Ok(row.map(Inserted::Row))
    }
}

/// PostgreSQL's spelling of the schedule statements: inserts that skip a taken key and
/// return their row.
#[cfg(feature = "postgres")]
impl ScheduleSql for sqlx::Postgres {
    const NOT_PAUSED: &'static str = "NOT paused";

    /// The clock already comes from the database (`now()`, or the override it read
    /// back), in microseconds.
    fn stored(t: DateTime<Utc>) -> DateTime<Utc> {
        chrono::SubsecRound::trunc_subsecs(t, 6)
    }

    async fn insert_new<'q>(
        conn: &mut sqlx::PgConnection,
        insert: Query<'q, Self>,
    ) -> Result<Option<Inserted<sqlx::postgres::PgRow>>> {
        let row = insert.fetch_optional(conn).await.map_err(Self::map_err)?;
        Ok(row.map(Inserted::Row))
    }
}

/// Implement the schedule methods that the backend's `storage.rs` calls
/// (`schedule_upsert_tx`, `schedule_list_all`, `schedule_pause_tx`, `schedule_delete`,
/// `schedule_fire_tx`) on the storage `$storage` of the database `$db` (a
/// [`ScheduleSql`]), both given as full paths. `$timed`, where given, names the
/// storage's method that bounds each call by its client-side timeout (PostgreSQL's
/// `timed`).
macro_rules! schedule_statements {
    ($storage:ty, $db:ty $(, $timed:ident)?) => {
        mod shared {
            use sqlx::Row as _;
            use tenax_core::schedule::plan_fire;
            use tenax_core::{ScheduleDef, TaskId};

            use $crate::common::duration_ms;
            use $crate::dialect::{retrying, sql, Dialect as _};
            use $crate::error::{Result, StorageError};
            use $crate::params::{
                FiredTick, ScheduleFireParams, SchedulePauseParams, ScheduleRecord,
                ScheduleUpsertParams, ScheduleUpserted,
            };
            use $crate::schedules::{
                missing, tick_no, upsert_change, validate_def, ScheduleColumns, ScheduleRow,
                SCHEDULE_COLUMNS,
            };
            use $crate::shared::schedules::{Inserted, Query, ScheduleSql as _};

            type Db = $db;
            type DbRow = <$db as sqlx::Database>::Row;
            type DbConn = <$db as sqlx::Database>::Connection;
            type Count = <$db as $crate::dialect::Dialect>::Count;

            impl $storage {
                pub(crate) async fn schedule_upsert_tx(
                    &self,
                    params: &ScheduleUpsertParams,
                ) -> Result<(ScheduleRecord, ScheduleUpserted)> {
                    validate_def(&params.def)?;
                    let call = retrying::<Db, _, _, _>(|| self.schedule_upsert_once(params));
                    $(let call = self.$timed(call);)?
                    call.await
                }

                async fn schedule_upsert_once(
                    &self,
                    params: &ScheduleUpsertParams,
                ) -> Result<(ScheduleRecord, ScheduleUpserted)> {
                    let def = &params.def;
                    let c = ScheduleColumns::of(def);
                    let mut tx = self.begin().await?;
                    let now = Db::stored(Db::clock(&mut *tx, params.now).await?);
                    let next = def.cadence.next_after(now);
                    let sql = sql!(
                        Db,
                        "INSERT INTO tenax_schedules (name, kind, cron, timezone, interval_s,
                             command_type, payload, payload_version, queue, priority,
                             max_attempts, timeout_ms, missed, catch_up, paused, next_fire_at,
                             created_at, updated_at)
                         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, FALSE, ?, ?, ?){IF_NEW}",
                        IF_NEW = Db::if_new(" ON CONFLICT (name) DO NOTHING", SCHEDULE_COLUMNS)
                    );
                    let insert = bind_def(sqlx::query(sql).bind(&def.name), def, &c)
                        .bind(next.map(Db::bind_time))
                        .bind(Db::bind_time(now))
                        .bind(Db::bind_time(now));
                    if let Some(inserted) = Db::insert_new(&mut *tx, insert).await? {
                        let record = match inserted {
                            Inserted::Row(row) => schedule_from_row(&row)?,
                            Inserted::Id(_) => fetch(&mut *tx, &def.name, false)
                                .await?
                                .ok_or_else(|| missing(&def.name))?,
                        };
                        tx.commit().await.map_err(Db::map_err)?;
                        return Ok((record, ScheduleUpserted::Created));
                    }
                    let stored = fetch(&mut *tx, &def.name, true)
                        .await?
                        .ok_or_else(|| missing(&def.name))?;
                    let (change, restart) = upsert_change(&stored.def, def);
                    if change == ScheduleUpserted::Unchanged {
                        tx.commit().await.map_err(Db::map_err)?;
                        return Ok((stored, change));
                    }
                    let sql = sql!(
                        Db,
                        "UPDATE tenax_schedules SET kind = ?, cron = ?, timezone = ?,
                             interval_s = ?, command_type = ?, payload = ?, payload_version = ?,
                             queue = ?, priority = ?, max_attempts = ?, timeout_ms = ?,
                             missed = ?, catch_up = ?,
                             next_fire_at = CASE WHEN ? THEN ? ELSE next_fire_at END,
                             updated_at = ?
                         WHERE name = ?{RETURNING}",
                        RETURNING = returning()
                    );
                    let update = bind_def(sqlx::query(sql), def, &c)
                        .bind(restart)
                        .bind(next.map(Db::bind_time))
                        .bind(Db::bind_time(now))
                        .bind(&def.name);
                    let record = written(&mut *tx, update, &def.name).await?;
                    tx.commit().await.map_err(Db::map_err)?;
                    Ok((record, change))
                }

                pub(crate) async fn schedule_list_all(&self) -> Result<Vec<ScheduleRecord>> {
                    let call = async {
                        let sql = sql!(
                            Db,
                            "SELECT {SCHEDULE_COLUMNS} FROM tenax_schedules ORDER BY name"
                        );
                        let rows = sqlx::query(sql)
                            .fetch_all(self.pool())
                            .await
                            .map_err(Db::map_err)?;
                        rows.iter().map(schedule_from_row).collect()
                    };
                    $(let call = self.$timed(call);)?
                    call.await
                }

                pub(crate) async fn schedule_pause_tx(
                    &self,
                    params: &SchedulePauseParams,
                ) -> Result<ScheduleRecord> {
                    let call = retrying::<Db, _, _, _>(|| self.schedule_pause_once(params));
                    $(let call = self.$timed(call);)?
                    call.await
                }

                async fn schedule_pause_once(
                    &self,
                    params: &SchedulePauseParams,
                ) -> Result<ScheduleRecord> {
                    let mut tx = self.begin().await?;
                    let now = Db::stored(Db::clock(&mut *tx, params.now).await?);
                    let stored = fetch(&mut *tx, &params.name, true)
                        .await?
                        .ok_or_else(|| missing(&params.name))?;
                    if stored.paused == params.paused {
                        tx.commit().await.map_err(Db::map_err)?;
                        return Ok(stored);
                    }
                    let next = if params.paused {
                        stored.next_fire_at
                    } else {
                        stored.def.cadence.next_after(now)
                    };
                    let sql = sql!(
                        Db,
                        "UPDATE tenax_schedules SET paused = ?, next_fire_at = ?, updated_at = ?
                         WHERE name = ? AND paused = ?{RETURNING}",
                        RETURNING = returning()
                    );
                    let update = sqlx::query(sql)
                        .bind(params.paused)
                        .bind(next.map(Db::bind_time))
                        .bind(Db::bind_time(now))
                        .bind(&params.name)
                        .bind(stored.paused);
                    let record = written(&mut *tx, update, &params.name).await?;
                    tx.commit().await.map_err(Db::map_err)?;
                    Ok(record)
                }

                pub(crate) async fn schedule_delete(&self, name: &str) -> Result<()> {
                    let call = retrying::<Db, _, _, _>(|| async {
                        let sql = sql!(Db, "DELETE FROM tenax_schedules WHERE name = ?");
                        sqlx::query(sql)
                            .bind(name)
                            .execute(self.pool())
                            .await
                            .map_err(Db::map_err)
                    });
                    $(let call = self.$timed(call);)?
                    if call.await?.rows_affected() == 0 {
                        return Err(missing(name));
                    }
                    Ok(())
                }

                pub(crate) async fn schedule_fire_tx(
                    &self,
                    params: &ScheduleFireParams,
                ) -> Result<Vec<FiredTick>> {
                    if params.limit == 0 {
                        return Ok(Vec::new());
                    }
                    let call = retrying::<Db, _, _, _>(|| self.schedule_fire_once(params));
                    $(let call = self.$timed(call);)?
                    let fired = call.await?;
                    if fired.iter().any(|f| f.task.is_some()) {
                        self.wake();
                    }
                    Ok(fired)
                }

                async fn schedule_fire_once(
                    &self,
                    params: &ScheduleFireParams,
                ) -> Result<Vec<FiredTick>> {
                    let mut tx = self.begin().await?;
                    let now = Db::stored(Db::clock(&mut *tx, params.now).await?);
                    // The due schedules, locked, skipping those another scheduler holds
                    // (SQLite's write lock holds them all already).
                    let sql = sql!(
                        Db,
                        "SELECT {SCHEDULE_COLUMNS} FROM tenax_schedules
                         WHERE {NOT_PAUSED} AND next_fire_at <= ?
                         ORDER BY next_fire_at
                         LIMIT ?{SKIP_LOCKED}",
                        NOT_PAUSED = Db::NOT_PAUSED,
                        SKIP_LOCKED = if Db::FOR_UPDATE.is_empty() {
                            ""
                        } else {
                            " FOR UPDATE SKIP LOCKED"
                        }
                    );
                    let rows = sqlx::query(sql)
                        .bind(Db::bind_time(now))
                        .bind(i64::from(params.limit))
                        .fetch_all(&mut *tx)
                        .await
                        .map_err(Db::map_err)?;
                    let mut fired = Vec::new();
                    for row in &rows {
                        let schedule = schedule_from_row(row)?;
                        fire_one(&mut *tx, &schedule, now, params.grace, &mut fired).await?;
                    }
                    tx.commit().await.map_err(Db::map_err)?;
                    Ok(fired)
                }
            }

            /// Fire one locked, due schedule's ticks and advance it, in the caller's
            /// transaction; wakes its queue when a task was enqueued.
            async fn fire_one(
                conn: &mut DbConn,
                schedule: &ScheduleRecord,
                now: chrono::DateTime<chrono::Utc>,
                grace: std::time::Duration,
                fired: &mut Vec<FiredTick>,
            ) -> Result<()> {
                let def = &schedule.def;
                let Some(next_fire_at) = schedule.next_fire_at else {
                    return Ok(());
                };
                let plan = plan_fire(&def.cadence, next_fire_at, now, def.missed, grace);
                let mut enqueued = false;
                for tick in &plan.ticks {
                    let sql = sql!(
                        Db,
                        "INSERT INTO tenax_tasks (task_no, kind, command_type, payload,
                             payload_version, queue, priority, status, max_attempts, run_at,
                             timeout_ms, created_at, updated_at)
                         VALUES (?, 'execute', ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?){IF_NEW}",
                        IF_NEW = Db::if_new(" ON CONFLICT (task_no) DO NOTHING", "id")
                    );
                    let task_no = tick_no(&def.name, *tick)?;
                    let insert = sqlx::query(sql)
                        .bind(task_no.as_str())
                        .bind(&def.command_type)
                        .bind(&def.payload)
                        .bind(Db::bind_count(def.payload_version))
                        .bind(&def.queue)
                        .bind(i16::from(def.priority.get()))
                        .bind(Db::bind_count(def.max_attempts))
                        .bind(Db::bind_time(*tick))
                        .bind(duration_ms(def.timeout))
                        .bind(Db::bind_time(now))
                        .bind(Db::bind_time(now));
                    let task = match Db::insert_new(&mut *conn, insert).await? {
                        Some(Inserted::Row(row)) => Some(row.try_get("id").map_err(Db::map_err)?),
                        Some(Inserted::Id(id)) => Some(id),
                        // The tick's task exists (fired before the schedule was re-created).
                        None => None,
                    };
                    enqueued |= task.is_some();
                    fired.push(FiredTick {
                        schedule: def.name.clone(),
                        tick: *tick,
                        task: task.map(TaskId),
                    });
                }
                let sql = sql!(
                    Db,
                    "UPDATE tenax_schedules
                     SET next_fire_at = ?, last_tick = COALESCE(?, last_tick), updated_at = ?
                     WHERE name = ? AND next_fire_at = ? AND {NOT_PAUSED}",
                    NOT_PAUSED = Db::NOT_PAUSED
                );
                let advanced = sqlx::query(sql)
                    .bind(plan.next.map(Db::bind_time))
                    .bind(plan.ticks.last().copied().map(Db::bind_time))
                    .bind(Db::bind_time(now))
                    .bind(&def.name)
                    .bind(Db::bind_time(next_fire_at))
                    .execute(&mut *conn)
                    .await
                    .map_err(Db::map_err)?;
                if advanced.rows_affected() != 1 {
                    // Cannot happen under the row lock (SQLite: the write lock); refuse
                    // rather than fire twice.
                    return Err(StorageError::Transient(
                        format!("schedule {:?} changed while it fired", def.name).into(),
                    ));
                }
                if enqueued {
                    Db::wake(conn, &def.queue).await?;
                }
                Ok(())
            }

            /// `query` with the definition's columns from `kind` to `catch_up` bound, in
            /// the order of `tenax_schedules`.
            fn bind_def<'q>(
                query: Query<'q, Db>,
                def: &'q ScheduleDef,
                c: &'q ScheduleColumns,
            ) -> Query<'q, Db> {
                query
                    .bind(c.kind)
                    .bind(&c.cron)
                    .bind(&c.timezone)
                    .bind(c.interval_s)
                    .bind(&def.command_type)
                    .bind(&def.payload)
                    .bind(Db::bind_count(def.payload_version))
                    .bind(&def.queue)
                    .bind(i16::from(def.priority.get()))
                    .bind(Db::bind_count(def.max_attempts))
                    .bind(duration_ms(def.timeout))
                    .bind(c.missed)
                    .bind(c.catch_up)
            }

            /// ` RETURNING` the schedule's columns where `UPDATE ... RETURNING` exists.
            fn returning() -> String {
                if Db::UPDATE_RETURNING {
                    [" RETURNING ", SCHEDULE_COLUMNS].concat()
                } else {
                    String::new()
                }
            }

            /// Run `update`, which writes the schedule `name` and ends with
            /// `returning()`: the schedule as written. Without `UPDATE ... RETURNING`, it
            /// is read back in the same transaction, where it cannot have gone.
            async fn written(
                conn: &mut DbConn,
                update: Query<'_, Db>,
                name: &str,
            ) -> Result<ScheduleRecord> {
                if Db::UPDATE_RETURNING {
                    let row = update.fetch_one(&mut *conn).await.map_err(Db::map_err)?;
                    return schedule_from_row(&row);
                }
                update.execute(&mut *conn).await.map_err(Db::map_err)?;
                fetch(conn, name, false).await?.ok_or_else(|| missing(name))
            }

            /// The schedule `name`, locked until the transaction ends when `lock`.
            async fn fetch(
                conn: &mut DbConn,
                name: &str,
                lock: bool,
            ) -> Result<Option<ScheduleRecord>> {
                let sql = if lock {
                    sql!(
                        Db,
                        "SELECT {SCHEDULE_COLUMNS} FROM tenax_schedules WHERE name = ?{FOR_UPDATE}",
                        FOR_UPDATE = Db::FOR_UPDATE
                    )
                } else {
                    sql!(Db, "SELECT {SCHEDULE_COLUMNS} FROM tenax_schedules WHERE name = ?")
                };
                let row = sqlx::query(sql)
                    .bind(name)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(Db::map_err)?;
                row.as_ref().map(schedule_from_row).transpose()
            }

            fn schedule_from_row(row: &DbRow) -> Result<ScheduleRecord> {
                let count = |c: &str| {
                    row.try_get::<Count, _>(c).map(i64::from).map_err(Db::map_err)
                };
                ScheduleRow {
                    name: Db::text(row, "name")?,
                    kind: Db::text(row, "kind")?,
                    cron: Db::opt_text(row, "cron")?,
                    timezone: Db::opt_text(row, "timezone")?,
                    interval_s: row.try_get("interval_s").map_err(Db::map_err)?,
                    command_type: Db::text(row, "command_type")?,
                    payload: Db::text(row, "payload")?,
                    payload_version: count("payload_version")?,
                    queue: Db::text(row, "queue")?,
                    priority: row
                        .try_get::<i16, _>("priority")
                        .map(i64::from)
                        .map_err(Db::map_err)?,
                    max_attempts: count("max_attempts")?,
                    timeout_ms: row.try_get("timeout_ms").map_err(Db::map_err)?,
                    missed: Db::text(row, "missed")?,
                    catch_up: count("catch_up")?,
                    paused: row.try_get("paused").map_err(Db::map_err)?,
                    next_fire_at: Db::read_opt_time(row, "next_fire_at")?,
                    last_tick: Db::read_opt_time(row, "last_tick")?,
                    created_at: Db::read_time(row, "created_at")?,
                    updated_at: Db::read_time(row, "updated_at")?,
                }
                .decode()
            }
        }
    };
}
pub(crate) use schedule_statements;
