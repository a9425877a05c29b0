//! Periodic schedules on MariaDB/MySQL: due rows are locked `FOR UPDATE SKIP LOCKED`
//! (MariaDB 10.6+, MySQL 8), so concurrent schedulers fire different schedules, and a
//! lock conflict runs the whole transaction again ([`retrying`]).
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, Row, Transaction};
use tenax_core::schedule::plan_fire;
use tenax_core::TaskId;

use super::rows::{opt_text, text};
use super::ER_DUP_ENTRY;
use super::{clock, map_err, mysql_error_number, retrying, storable, DbTime, MySqlStorage};
use crate::common::duration_ms;
use crate::error::{Result, StorageError};
use crate::params::*;
use crate::schedules::{
    missing, tick_no, upsert_change, validate_def, ScheduleColumns, ScheduleRow, SCHEDULE_COLUMNS,
};

fn schedule_from_row(row: &MySqlRow) -> Result<ScheduleRecord> {
    let get_i32 = |c: &str| row.try_get::<i32, _>(c).map(i64::from).map_err(map_err);
    let get_time = |c: &str| row.try_get::<DateTime<Utc>, _>(c).map_err(map_err);
    let get_opt_time = |c: &str| row.try_get::<Option<DateTime<Utc>>, _>(c).map_err(map_err);
    ScheduleRow {
        name: text(row, "name")?,
        kind: text(row, "kind")?,
        cron: opt_text(row, "cron")?,
        timezone: opt_text(row, "timezone")?,
        interval_s: row.try_get("interval_s").map_err(map_err)?,
        command_type: text(row, "command_type")?,
        payload: text(row, "payload")?,
        payload_version: get_i32("payload_version")?,
        queue: text(row, "queue")?,
        priority: row
            .try_get::<i8, _>("priority")
            .map(i64::from)
            .map_err(map_err)?,
        max_attempts: get_i32("max_attempts")?,
        timeout_ms: row.try_get("timeout_ms").map_err(map_err)?,
        missed: text(row, "missed")?,
        catch_up: get_i32("catch_up")?,
        paused: row.try_get("paused").map_err(map_err)?,
        next_fire_at: get_opt_time("next_fire_at")?,
        last_tick: get_opt_time("last_tick")?,
        created_at: get_time("created_at")?,
        updated_at: get_time("updated_at")?,
    }
    .decode()
}

async fn fetch(
    tx: &mut Transaction<'static, MySql>,
    name: &str,
    lock: bool,
) -> Result<Option<ScheduleRecord>> {
    let lock = if lock { " FOR UPDATE" } else { "" };
    let row = sqlx::query(&format!(
        "SELECT {SCHEDULE_COLUMNS} FROM tenax_schedules WHERE name = ?{lock}"
    ))
    .bind(name)
    .fetch_optional(&mut **tx)
    .await
    .map_err(map_err)?;
    row.as_ref().map(schedule_from_row).transpose()
}

fn utc(t: DbTime) -> DateTime<Utc> {
    t.and_utc()
}

fn db(t: Option<DateTime<Utc>>) -> Option<DbTime> {
    t.map(storable)
}

impl MySqlStorage {
    pub(super) async fn schedule_upsert_tx(
        &self,
        params: &ScheduleUpsertParams,
    ) -> Result<(ScheduleRecord, ScheduleUpserted)> {
        validate_def(&params.def)?;
        retrying(|| self.upsert_once(params)).await
    }

    async fn upsert_once(
        &self,
        params: &ScheduleUpsertParams,
    ) -> Result<(ScheduleRecord, ScheduleUpserted)> {
        let def = &params.def;
        let c = ScheduleColumns::of(def);
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let next = db(def.cadence.next_after(utc(now)));
        let inserted = sqlx::query(
            "INSERT INTO tenax_schedules (name, kind, cron, timezone, interval_s, command_type,
                 payload, payload_version, queue, priority, max_attempts, timeout_ms, missed,
                 catch_up, paused, next_fire_at, created_at, updated_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, FALSE, ?, ?, ?)",
        )
        .bind(&def.name)
        .bind(c.kind)
        .bind(&c.cron)
        .bind(&c.timezone)
        .bind(c.interval_s)
        .bind(&def.command_type)
        .bind(&def.payload)
        .bind(i64::from(def.payload_version))
        .bind(&def.queue)
        .bind(i64::from(def.priority.get()))
        .bind(i64::from(def.max_attempts))
        .bind(duration_ms(def.timeout))
        .bind(c.missed)
        .bind(c.catch_up)
        .bind(next)
        .bind(now)
        .bind(now)
        .execute(&mut *tx)
        .await;
        match inserted {
            Ok(_) => {
                let record = fetch(&mut tx, &def.name, false)
                    .await?
                    .ok_or_else(|| missing(&def.name))?;
                tx.commit().await.map_err(map_err)?;
                return Ok((record, ScheduleUpserted::Created));
            }
            // The name exists: InnoDB rolls back the statement only.
            Err(err) if mysql_error_number(&err) == Some(ER_DUP_ENTRY) => {}
            Err(err) => return Err(map_err(err)),
        }
        let stored = fetch(&mut tx, &def.name, true)
            .await?
            .ok_or_else(|| missing(&def.name))?;
        let (change, restart) = upsert_change(&stored.def, def);
        if change == ScheduleUpserted::Unchanged {
            tx.commit().await.map_err(map_err)?;
            return Ok((stored, change));
        }
        let next_fire_at = if restart {
            next
        } else {
            db(stored.next_fire_at)
        };
        sqlx::query(
            "UPDATE tenax_schedules SET kind = ?, cron = ?, timezone = ?, interval_s = ?,
                 command_type = ?, payload = ?, payload_version = ?, queue = ?, priority = ?,
                 max_attempts = ?, timeout_ms = ?, missed = ?, catch_up = ?, next_fire_at = ?,
                 updated_at = ?
             WHERE name = ?",
        )
        .bind(c.kind)
        .bind(&c.cron)
        .bind(&c.timezone)
        .bind(c.interval_s)
        .bind(&def.command_type)
        .bind(&def.payload)
        .bind(i64::from(def.payload_version))
        .bind(&def.queue)
        .bind(i64::from(def.priority.get()))
        .bind(i64::from(def.max_attempts))
        .bind(duration_ms(def.timeout))
        .bind(c.missed)
        .bind(c.catch_up)
        .bind(next_fire_at)
        .bind(now)
        .bind(&def.name)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let record = fetch(&mut tx, &def.name, false)
            .await?
            .ok_or_else(|| missing(&def.name))?;
        tx.commit().await.map_err(map_err)?;
        Ok((record, change))
    }

    pub(super) async fn schedule_list_all(&self) -> Result<Vec<ScheduleRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {SCHEDULE_COLUMNS} FROM tenax_schedules ORDER BY name"
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(schedule_from_row).collect()
    }

    pub(super) async fn schedule_pause_tx(
        &self,
        params: &SchedulePauseParams,
    ) -> Result<ScheduleRecord> {
        retrying(|| self.pause_once(params)).await
    }

    async fn pause_once(&self, params: &SchedulePauseParams) -> Result<ScheduleRecord> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let stored = fetch(&mut tx, &params.name, true)
            .await?
            .ok_or_else(|| missing(&params.name))?;
        if stored.paused == params.paused {
            tx.commit().await.map_err(map_err)?;
            return Ok(stored);
        }
        let next = if params.paused {
            stored.next_fire_at
        } else {
            stored.def.cadence.next_after(utc(now))
        };
        sqlx::query(
            "UPDATE tenax_schedules SET paused = ?, next_fire_at = ?, updated_at = ?
             WHERE name = ? AND paused = ?",
        )
        .bind(params.paused)
        .bind(db(next))
        .bind(now)
        .bind(&params.name)
        .bind(stored.paused)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let record = fetch(&mut tx, &params.name, false)
            .await?
            .ok_or_else(|| missing(&params.name))?;
        tx.commit().await.map_err(map_err)?;
        Ok(record)
    }

    pub(super) async fn schedule_delete(&self, name: &str) -> Result<()> {
        let deleted = retrying(|| async {
            sqlx::query("DELETE FROM tenax_schedules WHERE name = ?")
                .bind(name)
                .execute(&self.pool)
                .await
                .map_err(map_err)
        })
        .await?;
        if deleted.rows_affected() == 0 {
            return Err(missing(name));
        }
        Ok(())
    }

    pub(super) async fn schedule_fire_tx(
        &self,
        params: &ScheduleFireParams,
    ) -> Result<Vec<FiredTick>> {
        if params.limit == 0 {
            return Ok(Vec::new());
        }
        let fired = retrying(|| self.fire_once(params)).await?;
        if fired.iter().any(|f| f.task.is_some()) {
            self.wake();
        }
        Ok(fired)
    }

    async fn fire_once(&self, params: &ScheduleFireParams) -> Result<Vec<FiredTick>> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        // `paused` leads the index: the due schedules are one range of it.
        let rows = sqlx::query(&format!(
            "SELECT {SCHEDULE_COLUMNS} FROM tenax_schedules
             WHERE paused = FALSE AND next_fire_at <= ?
             ORDER BY next_fire_at
             LIMIT ?
             FOR UPDATE SKIP LOCKED"
        ))
        .bind(now)
        .bind(i64::from(params.limit))
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        let mut fired = Vec::new();
        for row in &rows {
            let schedule = schedule_from_row(row)?;
            fire_one(&mut tx, &schedule, now, params.grace, &mut fired).await?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(fired)
    }
}

/// Fire one locked, due schedule's ticks and advance it, in the caller's transaction.
async fn fire_one(
    tx: &mut Transaction<'static, MySql>,
    schedule: &ScheduleRecord,
    now: DbTime,
    grace: std::time::Duration,
    fired: &mut Vec<FiredTick>,
) -> Result<()> {
    let def = &schedule.def;
    let Some(next_fire_at) = schedule.next_fire_at else {
        return Ok(());
    };
    let plan = plan_fire(&def.cadence, next_fire_at, utc(now), def.missed, grace);
    for tick in &plan.ticks {
        let inserted = sqlx::query(
            "INSERT INTO tenax_tasks (task_no, kind, command_type, payload, payload_version, queue,
                 priority, status, max_attempts, run_at, timeout_ms, created_at, updated_at)
             VALUES (?, 'execute', ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?)",
        )
        .bind(tick_no(&def.name, *tick)?.as_str())
        .bind(&def.command_type)
        .bind(&def.payload)
        .bind(i64::from(def.payload_version))
        .bind(&def.queue)
        .bind(i64::from(def.priority.get()))
        .bind(i64::from(def.max_attempts))
        .bind(storable(*tick))
        .bind(duration_ms(def.timeout))
        .bind(now)
        .bind(now)
        .execute(&mut **tx)
        .await;
        let task = match inserted {
            Ok(done) => Some(TaskId(
                i64::try_from(done.last_insert_id())
                    .map_err(|_| StorageError::Corrupt("id out of range".into()))?,
            )),
            // The tick's task exists (fired before the schedule was re-created).
            Err(err) if mysql_error_number(&err) == Some(ER_DUP_ENTRY) => None,
            Err(err) => return Err(map_err(err)),
        };
        fired.push(FiredTick {
            schedule: def.name.clone(),
            tick: *tick,
            task,
        });
    }
    let advanced = sqlx::query(
        "UPDATE tenax_schedules
         SET next_fire_at = ?, last_tick = COALESCE(?, last_tick), updated_at = ?
         WHERE name = ? AND next_fire_at = ? AND paused = FALSE",
    )
    .bind(db(plan.next))
    .bind(db(plan.ticks.last().copied()))
    .bind(now)
    .bind(&def.name)
    .bind(storable(next_fire_at))
    .execute(&mut **tx)
    .await
    .map_err(map_err)?;
    if advanced.rows_affected() != 1 {
        // Cannot happen under the row lock; refuse rather than fire twice.
        return Err(StorageError::Transient(
            format!("schedule {:?} changed while it fired", def.name).into(),
        ));
    }
    Ok(())
}
