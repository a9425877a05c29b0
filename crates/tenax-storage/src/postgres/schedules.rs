//! Periodic schedules on PostgreSQL: due rows are locked `FOR UPDATE SKIP LOCKED`, so
//! concurrent schedulers fire different schedules and never wait on each other.
use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{Postgres, Row, Transaction};
use tenax_core::schedule::plan_fire;
use tenax_core::TaskId;

use super::{clock, map_err, notify, PgStorage};
use crate::common::duration_ms;
use crate::error::{Result, StorageError};
use crate::params::*;
use crate::schedules::{
    missing, tick_no, upsert_change, validate_def, ScheduleColumns, ScheduleRow, SCHEDULE_COLUMNS,
};

fn schedule_from_row(row: &PgRow) -> Result<ScheduleRecord> {
    let get_i32 = |c: &str| row.try_get::<i32, _>(c).map(i64::from).map_err(map_err);
    ScheduleRow {
        name: row.try_get("name").map_err(map_err)?,
        kind: row.try_get("kind").map_err(map_err)?,
        cron: row.try_get("cron").map_err(map_err)?,
        timezone: row.try_get("timezone").map_err(map_err)?,
        interval_s: row.try_get("interval_s").map_err(map_err)?,
        command_type: row.try_get("command_type").map_err(map_err)?,
        payload: row.try_get("payload").map_err(map_err)?,
        payload_version: get_i32("payload_version")?,
        queue: row.try_get("queue").map_err(map_err)?,
        priority: row
            .try_get::<i16, _>("priority")
            .map(i64::from)
            .map_err(map_err)?,
        max_attempts: get_i32("max_attempts")?,
        timeout_ms: row.try_get("timeout_ms").map_err(map_err)?,
        missed: row.try_get("missed").map_err(map_err)?,
        catch_up: get_i32("catch_up")?,
        paused: row.try_get("paused").map_err(map_err)?,
        next_fire_at: row.try_get("next_fire_at").map_err(map_err)?,
        last_tick: row.try_get("last_tick").map_err(map_err)?,
        created_at: row.try_get("created_at").map_err(map_err)?,
        updated_at: row.try_get("updated_at").map_err(map_err)?,
    }
    .decode()
}

async fn locked(
    tx: &mut Transaction<'static, Postgres>,
    name: &str,
) -> Result<Option<ScheduleRecord>> {
    let row = sqlx::query(&format!(
        "SELECT {SCHEDULE_COLUMNS} FROM tenax_schedules WHERE name = $1 FOR UPDATE"
    ))
    .bind(name)
    .fetch_optional(&mut **tx)
    .await
    .map_err(map_err)?;
    row.as_ref().map(schedule_from_row).transpose()
}

fn i32_of(value: u32) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

impl PgStorage {
    pub(super) async fn schedule_upsert_tx(
        &self,
        params: &ScheduleUpsertParams,
    ) -> Result<(ScheduleRecord, ScheduleUpserted)> {
        validate_def(&params.def)?;
        let def = &params.def;
        let c = ScheduleColumns::of(def);
        self.timed(async {
            let mut tx = self.begin().await?;
            let now = clock(&mut tx, params.now).await?;
            let next = def.cadence.next_after(now);
            let inserted = sqlx::query(&format!(
                "INSERT INTO tenax_schedules (name, kind, cron, timezone, interval_s, command_type,
                     payload, payload_version, queue, priority, max_attempts, timeout_ms, missed,
                     catch_up, paused, next_fire_at, created_at, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, FALSE, $15,
                         $16, $16)
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
            .bind(i32_of(def.payload_version))
            .bind(&def.queue)
            .bind(i16::from(def.priority.get()))
            .bind(i32_of(def.max_attempts))
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
            let stored = locked(&mut tx, &def.name)
                .await?
                .ok_or_else(|| missing(&def.name))?;
            let (change, restart) = upsert_change(&stored.def, def);
            if change == ScheduleUpserted::Unchanged {
                tx.commit().await.map_err(map_err)?;
                return Ok((stored, change));
            }
            let row = sqlx::query(&format!(
                "UPDATE tenax_schedules SET kind = $2, cron = $3, timezone = $4, interval_s = $5,
                     command_type = $6, payload = $7, payload_version = $8, queue = $9,
                     priority = $10, max_attempts = $11, timeout_ms = $12, missed = $13,
                     catch_up = $14,
                     next_fire_at = CASE WHEN $15 THEN $16 ELSE next_fire_at END,
                     updated_at = $17
                 WHERE name = $1
                 RETURNING {SCHEDULE_COLUMNS}"
            ))
            .bind(&def.name)
            .bind(c.kind)
            .bind(&c.cron)
            .bind(&c.timezone)
            .bind(c.interval_s)
            .bind(&def.command_type)
            .bind(&def.payload)
            .bind(i32_of(def.payload_version))
            .bind(&def.queue)
            .bind(i16::from(def.priority.get()))
            .bind(i32_of(def.max_attempts))
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
        })
        .await
    }

    pub(super) async fn schedule_list_all(&self) -> Result<Vec<ScheduleRecord>> {
        self.timed(async {
            let rows = sqlx::query(&format!(
                "SELECT {SCHEDULE_COLUMNS} FROM tenax_schedules ORDER BY name"
            ))
            .fetch_all(&self.pool)
            .await
            .map_err(map_err)?;
            rows.iter().map(schedule_from_row).collect()
        })
        .await
    }

    pub(super) async fn schedule_pause_tx(
        &self,
        params: &SchedulePauseParams,
    ) -> Result<ScheduleRecord> {
        self.timed(async {
            let mut tx = self.begin().await?;
            let now = clock(&mut tx, params.now).await?;
            let stored = locked(&mut tx, &params.name)
                .await?
                .ok_or_else(|| missing(&params.name))?;
            if stored.paused == params.paused {
                tx.commit().await.map_err(map_err)?;
                return Ok(stored);
            }
            let next = if params.paused {
                stored.next_fire_at
            } else {
                stored.def.cadence.next_after(now)
            };
            let row = sqlx::query(&format!(
                "UPDATE tenax_schedules SET paused = $2, next_fire_at = $3, updated_at = $4
                 WHERE name = $1 AND paused = $5
                 RETURNING {SCHEDULE_COLUMNS}"
            ))
            .bind(&params.name)
            .bind(params.paused)
            .bind(next)
            .bind(now)
            .bind(stored.paused)
            .fetch_one(&mut *tx)
            .await
            .map_err(map_err)?;
            let record = schedule_from_row(&row)?;
            tx.commit().await.map_err(map_err)?;
            Ok(record)
        })
        .await
    }

    pub(super) async fn schedule_delete(&self, name: &str) -> Result<()> {
        self.timed(async {
            let deleted = sqlx::query("DELETE FROM tenax_schedules WHERE name = $1")
                .bind(name)
                .execute(&self.pool)
                .await
                .map_err(map_err)?;
            if deleted.rows_affected() == 0 {
                return Err(missing(name));
            }
            Ok(())
        })
        .await
    }

    pub(super) async fn schedule_fire_tx(
        &self,
        params: &ScheduleFireParams,
    ) -> Result<Vec<FiredTick>> {
        if params.limit == 0 {
            return Ok(Vec::new());
        }
        let fired = self
            .timed(async {
                let mut tx = self.begin().await?;
                let now = clock(&mut tx, params.now).await?;
                let rows = sqlx::query(&format!(
                    "SELECT {SCHEDULE_COLUMNS} FROM tenax_schedules
                     WHERE NOT paused AND next_fire_at <= $1
                     ORDER BY next_fire_at
                     LIMIT $2
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
            })
            .await?;
        if fired.iter().any(|f| f.task.is_some()) {
            self.wake();
        }
        Ok(fired)
    }
}

/// Fire one locked, due schedule's ticks and advance it, in the caller's transaction.
async fn fire_one(
    tx: &mut Transaction<'static, Postgres>,
    schedule: &ScheduleRecord,
    now: DateTime<Utc>,
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
        let id: Option<i64> = sqlx::query_scalar(
            "INSERT INTO tenax_tasks (task_no, kind, command_type, payload, payload_version, queue,
                 priority, status, max_attempts, run_at, timeout_ms, created_at, updated_at)
             VALUES ($1, 'execute', $2, $3, $4, $5, $6, 'pending', $7, $8, $9, $10, $10)
             ON CONFLICT (task_no) DO NOTHING
             RETURNING id",
        )
        .bind(tick_no(&def.name, *tick)?.as_str())
        .bind(&def.command_type)
        .bind(&def.payload)
        .bind(i32_of(def.payload_version))
        .bind(&def.queue)
        .bind(i16::from(def.priority.get()))
        .bind(i32_of(def.max_attempts))
        .bind(tick)
        .bind(duration_ms(def.timeout))
        .bind(now)
        .fetch_optional(&mut **tx)
        .await
        .map_err(map_err)?;
        enqueued |= id.is_some();
        fired.push(FiredTick {
            schedule: def.name.clone(),
            tick: *tick,
            task: id.map(TaskId),
        });
    }
    let advanced = sqlx::query(
        "UPDATE tenax_schedules
         SET next_fire_at = $2, last_tick = COALESCE($3, last_tick), updated_at = $4
         WHERE name = $1 AND next_fire_at = $5 AND NOT paused",
    )
    .bind(&def.name)
    .bind(plan.next)
    .bind(plan.ticks.last())
    .bind(now)
    .bind(next_fire_at)
    .execute(&mut **tx)
    .await
    .map_err(map_err)?;
    if advanced.rows_affected() != 1 {
        // Cannot happen under the row lock; refuse rather than fire twice.
        return Err(StorageError::Transient(
            format!("schedule {:?} changed while it fired", def.name).into(),
        ));
    }
    if enqueued {
        notify(tx, &def.queue).await?;
    }
    Ok(())
}
