//! Decoding SQLite rows into domain records.
use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection};
use tenax_core::{CompensationState, Priority, TaskId, TaskKind, TaskNo, TaskRecord};

use super::{map_err, NOW_MS};
use crate::dialect::Dialect;
use crate::error::{Result, StorageError};

/// SQLite's spelling of the shared statements: times are milliseconds, and its single
/// writer holds every row already (no locking clause).
impl Dialect for Sqlite {
    const FOR_UPDATE: &'static str = "";
    const FOR_SHARE: &'static str = "";

    type Time = i64;
    fn bind_time(t: DateTime<Utc>) -> i64 {
        t.timestamp_millis()
    }
    type Count = i64;
    fn bind_count(n: u32) -> i64 {
        i64::from(n)
    }

    fn map_err(err: sqlx::Error) -> StorageError {
        map_err(err)
    }
    fn read_time(row: &SqliteRow, column: &str) -> Result<DateTime<Utc>> {
        ms(row.try_get(column).map_err(map_err)?)
    }
    fn read_opt_time(row: &SqliteRow, column: &str) -> Result<Option<DateTime<Utc>>> {
        opt_ms(row.try_get(column).map_err(map_err)?)
    }
    crate::dialect::decoded_text!();
    fn task_from_row(row: &SqliteRow) -> Result<TaskRecord> {
        task_from_row(row)
    }
    fn push_ids(qb: &mut QueryBuilder<'_, Sqlite>, ids: &[i64]) {
        qb.push("IN (");
        let mut list = qb.separated(", ");
        for id in ids {
            list.push_bind(*id);
        }
        qb.push(")");
    }
    async fn clock(
        conn: &mut SqliteConnection,
        now: Option<DateTime<Utc>>,
    ) -> Result<DateTime<Utc>> {
        match now {
            Some(now) => Ok(now),
            None => ms(sqlx::query_scalar(NOW_MS)
                .fetch_one(conn)
                .await
                .map_err(map_err)?),
        }
    }
}

pub(super) use crate::dialect::TASK_COLUMNS;

pub(super) fn ms(value: i64) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_millis(value)
        .ok_or_else(|| StorageError::Corrupt(format!("time {value} ms is out of range")))
}

fn opt_ms(value: Option<i64>) -> Result<Option<DateTime<Utc>>> {
    value.map(ms).transpose()
}

fn u32_of(value: i64, column: &str) -> Result<u32> {
    u32::try_from(value).map_err(|_| StorageError::Corrupt(format!("{column} = {value}")))
}

pub(super) fn task_from_row(row: &SqliteRow) -> Result<TaskRecord> {
    let get_i64 = |c: &str| row.try_get::<i64, _>(c).map_err(map_err);
    let get_str = |c: &str| row.try_get::<String, _>(c).map_err(map_err);
    let get_opt_i64 = |c: &str| row.try_get::<Option<i64>, _>(c).map_err(map_err);
    let get_opt_str = |c: &str| row.try_get::<Option<String>, _>(c).map_err(map_err);

    let kind = get_str("kind")?;
    let compensation = get_opt_str("compensation")?;
    let priority = get_i64("priority")?;
    Ok(TaskRecord {
        id: TaskId(get_i64("id")?),
        task_no: TaskNo::from_stored(get_str("task_no")?),
        kind: TaskKind::parse(&kind)
            .ok_or_else(|| StorageError::Corrupt(format!("kind = {kind:?}")))?,
        parent_id: get_opt_i64("parent_id")?.map(TaskId),
        command_type: get_str("command_type")?,
        payload: get_str("payload")?,
        payload_version: u32_of(get_i64("payload_version")?, "payload_version")?,
        queue: get_str("queue")?,
        priority: u8::try_from(priority)
            .ok()
            .and_then(|p| Priority::new(p).ok())
            .ok_or_else(|| StorageError::Corrupt(format!("priority = {priority}")))?,
        status: get_str("status")?.parse()?,
        attempt: u32_of(get_i64("attempt")?, "attempt")?,
        max_attempts: u32_of(get_i64("max_attempts")?, "max_attempts")?,
        lease_epoch: get_i64("lease_epoch")?,
        lease_owner: get_opt_str("lease_owner")?,
        lease_expires_at: opt_ms(get_opt_i64("lease_expires_at")?)?,
        run_at: ms(get_i64("run_at")?)?,
        timeout_ms: u64::try_from(get_i64("timeout_ms")?).unwrap_or(0),
        last_error: get_opt_str("last_error")?,
        result: get_opt_str("result")?,
        compensation: compensation
            .map(|c| {
                CompensationState::parse(&c)
                    .ok_or_else(|| StorageError::Corrupt(format!("compensation = {c:?}")))
            })
            .transpose()?,
        created_at: ms(get_i64("created_at")?)?,
        updated_at: ms(get_i64("updated_at")?)?,
        started_at: opt_ms(get_opt_i64("started_at")?)?,
        finished_at: opt_ms(get_opt_i64("finished_at")?)?,
        concurrency_key: row.try_get("concurrency_key").map_err(map_err)?,
        concurrency_limit: u32_of(get_i64("concurrency_limit")?, "concurrency_limit")?,
        created_by: get_opt_str("created_by")?,
    })
}

crate::shared::tasks::attempt_reads!(Sqlite);
