//! Decoding MariaDB/MySQL rows into domain records.
//!
//! Text columns are read as bytes and checked as UTF-8 here: the tables use the
//! `utf8mb4_bin` collation (names compare byte for byte, as in SQLite), and the server
//! flags `_bin` columns as BINARY, which sqlx refuses to decode as `String`.
use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row};
use tenax_core::{CompensationState, Priority, TaskId, TaskKind, TaskNo, TaskRecord};

use super::errors::is_lock_conflict;
use super::{map_err, push_list, storable, DbTime};
use crate::dialect::Dialect;
use crate::error::{Result, StorageError};

/// MariaDB's spelling of the shared statements: `DATETIME(6)` times ([`storable`]), text
/// read as checked bytes, no `UPDATE ... RETURNING`, and `ON DUPLICATE KEY` for a taken
/// key.
impl Dialect for MySql {
    const FOR_UPDATE: &'static str = " FOR UPDATE";
    const FOR_SHARE: &'static str = " LOCK IN SHARE MODE";
    /// `id = id` changes nothing: the row with that number stays as it is.
    const ON_TASK_NO_TAKEN: &'static str = "ON DUPLICATE KEY UPDATE id = id";
    const COUNT_STAR: &'static str = "CAST(COUNT(*) AS SIGNED)";
    const UPDATE_RETURNING: bool = false;

    type Time = DbTime;
    fn bind_time(t: DateTime<Utc>) -> DbTime {
        storable(t)
    }
    type Count = i64;
    fn bind_count(n: u32) -> i64 {
        i64::from(n)
    }

    fn map_err(err: sqlx::Error) -> StorageError {
        map_err(err)
    }
    crate::dialect::decoded_times!();
    fn text(row: &MySqlRow, column: &str) -> Result<String> {
        text(row, column)
    }
    fn opt_text(row: &MySqlRow, column: &str) -> Result<Option<String>> {
        opt_text(row, column)
    }
    fn task_from_row(row: &MySqlRow) -> Result<TaskRecord> {
        task_from_row(row)
    }
    fn push_ids(qb: &mut QueryBuilder<'_, MySql>, ids: &[i64]) {
        qb.push("IN ");
        push_list(qb, ids.iter().copied());
    }
    async fn clock(
        conn: &mut MySqlConnection,
        now: Option<DateTime<Utc>>,
    ) -> Result<DateTime<Utc>> {
        match now {
            Some(now) => Ok(now),
            None => sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
                .fetch_one(conn)
                .await
                .map_err(map_err),
        }
    }
    fn is_lock_conflict(err: &StorageError) -> bool {
        is_lock_conflict(err)
    }
}

pub(super) use crate::dialect::TASK_COLUMNS;

fn utf8(bytes: Vec<u8>, column: &str) -> Result<String> {
    String::from_utf8(bytes).map_err(|_| StorageError::Corrupt(format!("{column} is not UTF-8")))
}

pub(super) fn text(row: &MySqlRow, column: &str) -> Result<String> {
    utf8(row.try_get::<Vec<u8>, _>(column).map_err(map_err)?, column)
}

pub(super) fn opt_text(row: &MySqlRow, column: &str) -> Result<Option<String>> {
    row.try_get::<Option<Vec<u8>>, _>(column)
        .map_err(map_err)?
        .map(|bytes| utf8(bytes, column))
        .transpose()
}

fn u32_of(value: i64, column: &str) -> Result<u32> {
    u32::try_from(value).map_err(|_| StorageError::Corrupt(format!("{column} = {value}")))
}

pub(super) fn task_from_row(row: &MySqlRow) -> Result<TaskRecord> {
    let get_i64 = |c: &str| row.try_get::<i64, _>(c).map_err(map_err);
    let get_opt_i64 = |c: &str| row.try_get::<Option<i64>, _>(c).map_err(map_err);
    let get_time = |c: &str| row.try_get::<DateTime<Utc>, _>(c).map_err(map_err);
    let get_opt_time = |c: &str| row.try_get::<Option<DateTime<Utc>>, _>(c).map_err(map_err);

    let kind = text(row, "kind")?;
    let compensation = opt_text(row, "compensation")?;
    let priority = get_i64("priority")?;
    Ok(TaskRecord {
        id: TaskId(get_i64("id")?),
        task_no: TaskNo::from_stored(text(row, "task_no")?),
        kind: TaskKind::parse(&kind)
            .ok_or_else(|| StorageError::Corrupt(format!("kind = {kind:?}")))?,
        parent_id: get_opt_i64("parent_id")?.map(TaskId),
        command_type: text(row, "command_type")?,
        payload: text(row, "payload")?,
        payload_version: u32_of(get_i64("payload_version")?, "payload_version")?,
        queue: text(row, "queue")?,
        priority: u8::try_from(priority)
            .ok()
            .and_then(|p| Priority::new(p).ok())
            .ok_or_else(|| StorageError::Corrupt(format!("priority = {priority}")))?,
        status: text(row, "status")?.parse()?,
        attempt: u32_of(get_i64("attempt")?, "attempt")?,
        max_attempts: u32_of(get_i64("max_attempts")?, "max_attempts")?,
        lease_epoch: get_i64("lease_epoch")?,
        lease_owner: opt_text(row, "lease_owner")?,
        lease_expires_at: get_opt_time("lease_expires_at")?,
        run_at: get_time("run_at")?,
        timeout_ms: u64::try_from(get_i64("timeout_ms")?).unwrap_or(0),
        last_error: opt_text(row, "last_error")?,
        result: opt_text(row, "result")?,
        compensation: compensation
            .map(|c| {
                CompensationState::parse(&c)
                    .ok_or_else(|| StorageError::Corrupt(format!("compensation = {c:?}")))
            })
            .transpose()?,
        created_at: get_time("created_at")?,
        updated_at: get_time("updated_at")?,
        started_at: get_opt_time("started_at")?,
        finished_at: get_opt_time("finished_at")?,
        concurrency_key: opt_text(row, "concurrency_key")?,
        concurrency_limit: u32_of(get_i64("concurrency_limit")?, "concurrency_limit")?,
        created_by: opt_text(row, "created_by")?,
    })
}

crate::shared::tasks::attempt_reads!(MySql);
