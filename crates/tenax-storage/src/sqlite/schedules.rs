//! Periodic schedules on SQLite: every write holds the database's write lock from its
//! start (`BEGIN IMMEDIATE`), so two schedulers fire one after the other and the second
//! finds the ticks already fired.
use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, Sqlite, Transaction};
use tenax_core::schedule::plan_fire;
use tenax_core::TaskId;

use super::rows::ms;
use super::{clock, map_err, SqliteStorage};
use crate::common::duration_ms;
use crate::error::{Result, StorageError};
use crate::params::*;
use crate::schedules::{
    missing, tick_no, upsert_change, validate_def, ScheduleColumns, ScheduleRow, SCHEDULE_COLUMNS,
};

fn schedule_from_row(row: &SqliteRow) -> Result<ScheduleRecord> {
    let get_i64 = |c: &str| row.try_get::<i64, _>(c).map_err(map_err);
    let get_str = |c: &str| row.try_get::<String, _>(c).map_err(map_err);
    let get_opt_i64 = |c: &str| row.try_get::<Option<i64>, _>(c).map_err(map_err);
    let get_opt_str = |c: &str| row.try_get::<Option<String>, _>(c).map_err(map_err);
    ScheduleRow {
        name: get_str("name")?,
        kind: get_str("kind")?,
        cron: get_opt_str("cron")?,
        timezone: get_opt_str("timezone")?,
        interval_s: get_opt_i64("interval_s")?,
        command_type: get_str("command_type")?,
        payload: get_str("payload")?,
        payload_version: get_i64("payload_version")?,
        queue: get_str("queue")?,
        priority: get_i64("priority")?,
        max_attempts: get_i64("max_attempts")?,
        timeout_ms: get_i64("timeout_ms")?,
        missed: get_str("missed")?,
        catch_up: get_i64("catch_up")?,
        paused: get_i64("paused")? != 0,
        next_fire_at: get_opt_i64("next_fire_at")?.map(ms).transpose()?,
        last_tick: get_opt_i64("last_tick")?.map(ms).transpose()?,
        created_at: ms(get_i64("created_at")?)?,
        updated_at: ms(get_i64("updated_at")?)?,
    }
    .decode()
}

async fn fetch(
    tx: &mut Transaction<'static, Sqlite>,
    name: &str,
) -> Result<Option<ScheduleRecord>> {
    let row = sqlx::query(&format!(
        "SELECT {SCHEDULE_COLUMNS} FROM tenax_schedules WHERE name = ?"
    ))
    .bind(name)
    .fetch_optional(&mut **tx)
    .await
    .map_err(map_err)?;
    row.as_ref().map(schedule_from_row).transpose()
}

fn millis(t: Option<DateTime<Utc>>) -> Option<i64> {
    t.map(|t| t.timestamp_millis())
}

fn now_of(now: i64) -> Result<DateTime<Utc>> {
    ms(now)
}

impl SqliteStorage {
    pub(super) async fn schedule_upsert_tx(
        &self,
        params: &ScheduleUpsertParams,
    ) -> Result<(ScheduleRecord, ScheduleUpserted)> {
        validate_def(&params.def)?;
        let def = &params.def;
        let c = ScheduleColumns::of(def);
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let next = millis(def.cadence.next_after(now_of(now)?));
        let inserted = sqlx::query(&format!(
            "INSERT INTO tenax_schedules (name, kind, cron, timezone, interval_s, command_type,
                 payload, payload_version, queue, priority, max_attempts, timeout_ms, missed,
                 catch_up, paused, next_fire_at, created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, 0, ?15, ?16, ?16)
             ON CONFLICT (name) DO NOTHING
             RETURNING {SCHEDULE_COLUMNS}"
        ))
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
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        if let Some(row) = inserted {
            let record = schedule_from_row(&row)?;
            tx.commit().await.map_err(map_err)?;
            return Ok((record, ScheduleUpserted::Created));
        }
        let stored = fetch(&mut tx, &def.name)
            .await?
            .ok_or_else(|| missing(&def.name))?;
        let (change, restart) = upsert_change(&stored.def, def);
        if change == ScheduleUpserted::Unchanged {
            tx.commit().await.map_err(map_err)?;
            return Ok((stored, change));
        }
        let row = sqlx::query(&format!(
            "UPDATE tenax_schedules SET kind = ?2, cron = ?3, timezone = ?4, interval_s = ?5,
                 command_type = ?6, payload = ?7, payload_version = ?8, queue = ?9,
                 priority = ?10, max_attempts = ?11, timeout_ms = ?12, missed = ?13,
                 catch_up = ?14,
                 next_fire_at = CASE WHEN ?15 THEN ?16 ELSE next_fire_at END,
                 updated_at = ?17
             WHERE name = ?1
             RETURNING {SCHEDULE_COLUMNS}"
        ))
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
        .bind(restart)
        .bind(next)
        .bind(now)
        .fetch_one(&mut *tx)
        .await
        .map_err(map_err)?;
        let record = schedule_from_row(&row)?;
        tx.commit().await.map_err(map_err)?;
        Ok((record, change))
    }

    pub(super) async fn schedule_list_all(&self) -> Result<Vec<ScheduleRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {SCHEDULE_COLUMNS} FROM tenax_schedules ORDER BY name"
        ))
        .fetch_all(self.pool())
        .await
        .map_err(map_err)?;
        rows.iter().map(schedule_from_row).collect()
    }

    pub(super) async fn schedule_pause_tx(
        &self,
        params: &SchedulePauseParams,
    ) -> Result<ScheduleRecord> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let stored = fetch(&mut tx, &params.name)
            .await?
            .ok_or_else(|| missing(&params.name))?;
        if stored.paused == params.paused {
            tx.commit().await.map_err(map_err)?;
            return Ok(stored);
        }
        let next = if params.paused {
            stored.next_fire_at
        } else {
            stored.def.cadence.next_after(now_of(now)?)
        };
        let row = sqlx::query(&format!(
            "UPDATE tenax_schedules SET paused = ?2, next_fire_at = ?3, updated_at = ?4
             WHERE name = ?1 AND paused = ?5
             RETURNING {SCHEDULE_COLUMNS}"
        ))
        .bind(&params.name)
        .bind(params.paused)
        .bind(millis(next))
        .bind(now)
        .bind(stored.paused)
        .fetch_one(&mut *tx)
        .await
        .map_err(map_err)?;
        let record = schedule_from_row(&row)?;
        tx.commit().await.map_err(map_err)?;
        Ok(record)
    }

    pub(super) async fn schedule_delete(&self, name: &str) -> Result<()> {
        let deleted = sqlx::query("DELETE FROM tenax_schedules WHERE name = ?")
            .bind(name)
            .execute(self.pool())
            .await
            .map_err(map_err)?;
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
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let rows = sqlx::query(&format!(
            "SELECT {SCHEDULE_COLUMNS} FROM tenax_schedules
             WHERE paused = 0 AND next_fire_at <= ?
             ORDER BY next_fire_at
             LIMIT ?"
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
        if fired.iter().any(|f| f.task.is_some()) {
            self.wake();
        }
        Ok(fired)
    }
}

/// Fire one due schedule's ticks and advance it, in the caller's transaction.
async fn fire_one(
    tx: &mut Transaction<'static, Sqlite>,
    schedule: &ScheduleRecord,
    now: i64,
    grace: std::time::Duration,
    fired: &mut Vec<FiredTick>,
) -> Result<()> {
    let def = &schedule.def;
    let Some(next_fire_at) = schedule.next_fire_at else {
        return Ok(());
    };
    let plan = plan_fire(&def.cadence, next_fire_at, now_of(now)?, def.missed, grace);
    for tick in &plan.ticks {
        let id: Option<i64> = sqlx::query_scalar(
            "INSERT INTO tenax_tasks (task_no, kind, command_type, payload, payload_version, queue,
                 priority, status, max_attempts, run_at, timeout_ms, created_at, updated_at)
             VALUES (?, 'execute', ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?)
             ON CONFLICT (task_no) DO NOTHING
             RETURNING id",
        )
        .bind(tick_no(&def.name, *tick)?.as_str())
        .bind(&def.command_type)
        .bind(&def.payload)
        .bind(i64::from(def.payload_version))
        .bind(&def.queue)
        .bind(i64::from(def.priority.get()))
        .bind(i64::from(def.max_attempts))
        .bind(tick.timestamp_millis())
        .bind(duration_ms(def.timeout))
        .bind(now)
        .bind(now)
        .fetch_optional(&mut **tx)
        .await
        .map_err(map_err)?;
        fired.push(FiredTick {
            schedule: def.name.clone(),
            tick: *tick,
            task: id.map(TaskId),
        });
    }
    let advanced = sqlx::query(
        "UPDATE tenax_schedules
         SET next_fire_at = ?2, last_tick = COALESCE(?3, last_tick), updated_at = ?4
         WHERE name = ?1 AND next_fire_at = ?5 AND paused = 0",
    )
    .bind(&def.name)
    .bind(millis(plan.next))
    .bind(millis(plan.ticks.last().copied()))
    .bind(now)
    .bind(next_fire_at.timestamp_millis())
    .execute(&mut **tx)
    .await
    .map_err(map_err)?;
    if advanced.rows_affected() != 1 {
        // Cannot happen under the write lock; refuse rather than fire twice.
        return Err(StorageError::Transient(
            format!("schedule {:?} changed while it fired", def.name).into(),
        ));
    }
    Ok(())
}
