//! Decoding PostgreSQL rows into domain records.
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnection, PgRow};
use sqlx::{Postgres, QueryBuilder, Row};
use tenax_core::{CompensationState, Priority, TaskId, TaskKind, TaskNo, TaskRecord};

use super::{clock, map_err, notify};
use crate::dialect::Dialect;
use crate::error::{Result, StorageError};

/// PostgreSQL's spelling of the shared statements: numbered placeholders, `timestamptz`
/// times, 32-bit counts, and a `NOTIFY` for a queue with a task due.
impl Dialect for Postgres {
    const NUMBERED: bool = true;
    const FOR_UPDATE: &'static str = " FOR UPDATE";
    const FOR_SHARE: &'static str = " FOR SHARE";

    type Time = DateTime<Utc>;
    fn bind_time(t: DateTime<Utc>) -> DateTime<Utc> {
        t
    }
    type Count = i32;
    fn bind_count(n: u32) -> i32 {
        i32::try_from(n).unwrap_or(i32::MAX)
    }

    fn map_err(err: sqlx::Error) -> StorageError {
        map_err(err)
    }
    crate::dialect::decoded_times!();
    crate::dialect::decoded_text!();
    fn task_from_row(row: &PgRow) -> Result<TaskRecord> {
        task_from_row(row)
    }
    fn push_ids(qb: &mut QueryBuilder<'_, Postgres>, ids: &[i64]) {
        qb.push("= ANY(").push_bind(ids.to_vec()).push(")");
    }
    async fn clock(conn: &mut PgConnection, now: Option<DateTime<Utc>>) -> Result<DateTime<Utc>> {
        clock(conn, now).await
    }
    async fn wake(conn: &mut PgConnection, queue: &str) -> Result<()> {
        notify(conn, queue).await
    }
}

pub(super) use crate::dialect::TASK_COLUMNS;

fn u32_of(value: i32, column: &str) -> Result<u32> {
    u32::try_from(value).map_err(|_| StorageError::Corrupt(format!("{column} = {value}")))
}

pub(super) fn task_from_row(row: &PgRow) -> Result<TaskRecord> {
    let kind: String = row.try_get("kind").map_err(map_err)?;
    let compensation: Option<String> = row.try_get("compensation").map_err(map_err)?;
    let priority: i16 = row.try_get("priority").map_err(map_err)?;
    let status: String = row.try_get("status").map_err(map_err)?;
    Ok(TaskRecord {
        id: TaskId(row.try_get("id").map_err(map_err)?),
        task_no: TaskNo::from_stored(row.try_get("task_no").map_err(map_err)?),
        kind: TaskKind::parse(&kind)
            .ok_or_else(|| StorageError::Corrupt(format!("kind = {kind:?}")))?,
        parent_id: row
            .try_get::<Option<i64>, _>("parent_id")
            .map_err(map_err)?
            .map(TaskId),
        command_type: row.try_get("command_type").map_err(map_err)?,
        payload: row.try_get("payload").map_err(map_err)?,
        payload_version: u32_of(
            row.try_get("payload_version").map_err(map_err)?,
            "payload_version",
        )?,
        queue: row.try_get("queue").map_err(map_err)?,
        priority: u8::try_from(priority)
            .ok()
            .and_then(|p| Priority::new(p).ok())
            .ok_or_else(|| StorageError::Corrupt(format!("priority = {priority}")))?,
        status: status.parse()?,
        attempt: u32_of(row.try_get("attempt").map_err(map_err)?, "attempt")?,
        max_attempts: u32_of(
            row.try_get("max_attempts").map_err(map_err)?,
            "max_attempts",
        )?,
        lease_epoch: row.try_get("lease_epoch").map_err(map_err)?,
        lease_owner: row.try_get("lease_owner").map_err(map_err)?,
        lease_expires_at: row.try_get("lease_expires_at").map_err(map_err)?,
        run_at: row.try_get("run_at").map_err(map_err)?,
        timeout_ms: u64::try_from(row.try_get::<i64, _>("timeout_ms").map_err(map_err)?)
            .unwrap_or(0),
        last_error: row.try_get("last_error").map_err(map_err)?,
        result: row.try_get("result").map_err(map_err)?,
        compensation: compensation
            .map(|c| {
                CompensationState::parse(&c)
                    .ok_or_else(|| StorageError::Corrupt(format!("compensation = {c:?}")))
            })
            .transpose()?,
        created_at: row.try_get("created_at").map_err(map_err)?,
        updated_at: row.try_get("updated_at").map_err(map_err)?,
        started_at: row.try_get("started_at").map_err(map_err)?,
        finished_at: row.try_get("finished_at").map_err(map_err)?,
        concurrency_key: row.try_get("concurrency_key").map_err(map_err)?,
        concurrency_limit: u32_of(
            row.try_get("concurrency_limit").map_err(map_err)?,
            "concurrency_limit",
        )?,
        created_by: row.try_get("created_by").map_err(map_err)?,
    })
}

crate::shared::tasks::attempt_reads!(Postgres);
