//! Inserting tasks: one `INSERT ... SELECT FROM UNNEST(...)` per chunk of rows, shared
//! by `task_insert`, `task_insert_many` and the functions that insert inside a caller's
//! transaction.
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Postgres, Row, Transaction};
use tenax_core::{TaskId, TaskKind, TaskRecord};

use super::rows::{task_from_row, TASK_COLUMNS};
use super::{map_err, WAKE_CHANNEL};
use crate::common::{duration_ms, resolve_many, validate_insert, validate_many};
use crate::error::Result;
use crate::params::{
    RunAt, TaskInsertManyParams, TaskInsertOutcome, TaskInsertParams, TaskInserted,
};

/// Rows per statement (each column is one array parameter, so this only bounds the
/// size of one statement's arrays).
pub(super) const CHUNK: usize = 5_000;

/// The workflow a bulk insert's tasks belong to: per task (in order) its key and its
/// number of parents.
pub(super) struct WorkflowRows<'a> {
    pub(super) id: i64,
    pub(super) keys: Vec<&'a str>,
    pub(super) waiting: Vec<i32>,
}

/// Insert `tasks` (already validated, `payloads` their parsed payloads) on `conn` and send
/// one `NOTIFY` per queue that got a new task (it is delivered at the commit), with one
/// statement per [`CHUNK`] of tasks: inside the caller's transaction, or, on a
/// connection outside one, each statement its own transaction. With `workflow`,
/// the tasks belong to it: each gets its key, and one with parents waits `blocked`.
pub(super) async fn insert_many(
    conn: &mut PgConnection,
    tasks: &[TaskInsertParams],
    payloads: &[Value],
    now: Option<DateTime<Utc>>,
    workflow: Option<&WorkflowRows<'_>>,
) -> Result<Vec<TaskInsertOutcome>> {
    let mut created: HashMap<String, TaskRecord> = HashMap::new();
    for (c, chunk) in tasks.chunks(CHUNK).enumerate() {
        let range = c * CHUNK..c * CHUNK + chunk.len();
        let (workflow_id, keys, waiting): (Option<i64>, &[&str], &[i32]) = match workflow {
            Some(w) => (Some(w.id), &w.keys[range.clone()], &w.waiting[range]),
            None => (None, &[], &[]),
        };
        let mut task_no = Vec::with_capacity(chunk.len());
        let mut command_type = Vec::with_capacity(chunk.len());
        let mut payload = Vec::with_capacity(chunk.len());
        let mut queue = Vec::with_capacity(chunk.len());
        let mut priority = Vec::with_capacity(chunk.len());
        let mut max_attempts = Vec::with_capacity(chunk.len());
        let mut run_at = Vec::with_capacity(chunk.len());
        let mut delay_ms = Vec::with_capacity(chunk.len());
        let mut timeout_ms = Vec::with_capacity(chunk.len());
        let mut payload_version = Vec::with_capacity(chunk.len());
        let mut key = Vec::with_capacity(chunk.len());
        let mut key_limit = Vec::with_capacity(chunk.len());
        let mut callback_url = Vec::with_capacity(chunk.len());
        for task in chunk {
            let (at, delay) = match task.run_at {
                RunAt::Now => (None, 0),
                RunAt::In(delay) => (None, duration_ms(delay)),
                RunAt::At(at) => (Some(at), 0),
            };
            task_no.push(task.task_no.as_str());
            command_type.push(task.command_type.as_str());
            payload.push(task.payload.as_str());
            queue.push(task.queue.as_str());
            priority.push(i16::from(task.priority.get()));
            max_attempts.push(i32::try_from(task.max_attempts).unwrap_or(i32::MAX));
            run_at.push(at);
            delay_ms.push(delay as f64);
            timeout_ms.push(duration_ms(task.timeout));
            payload_version.push(i32::try_from(task.payload_version).unwrap_or(i32::MAX));
            key.push(task.concurrency_key.as_deref());
            key_limit.push(i32::try_from(task.concurrency_limit).unwrap_or(i32::MAX));
            callback_url.push(task.callback_url.as_deref());
        }
        // Ids follow the order given (ORDER BY the ordinality). The statement also
        // sends one `NOTIFY` per queue that got a task, delivered at the commit: due
        // or delayed, since a delayed task may be due before the timer other workers
        // have armed, and they re-arm on the hint. It answers only the columns the
        // database decides; the rest of each record is what was sent.
        //
        // It decides the `events` flag itself, so the `tenax_events_flag` trigger does
        // not fire (migration 0014): a PL/pgSQL call per row was a third of the
        // statement's time. The rule test is the trigger's (`queue IN ('', q) AND
        // command_type IN ('', c)`), split by which side of a rule is the wildcard so
        // that each part is a hashed lookup built once per statement. The trigger's
        // per-row form also kept PostgreSQL from ever choosing the statement's generic
        // plan, so that every single-task insert paid for planning it.
        let rows = sqlx::query(
            "WITH ins AS (
                 INSERT INTO tenax_tasks (task_no, kind, command_type, payload, queue, priority,
                     status, max_attempts, run_at, timeout_ms, created_at, updated_at,
                     payload_version, concurrency_key, concurrency_limit, workflow_id,
                     workflow_key, waiting_parents, callback_url, events)
                 SELECT t.task_no, 'execute', t.command_type, t.payload, t.queue, t.priority,
                        CASE WHEN COALESCE(w.waiting, 0) > 0 THEN 'blocked' ELSE 'pending' END,
                        t.max_attempts,
                        COALESCE(t.run_at, COALESCE($1::timestamptz, now())
                                 + t.delay_ms * interval '1 millisecond'),
                        t.timeout_ms, COALESCE($1::timestamptz, now()),
                        COALESCE($1::timestamptz, now()),
                        t.payload_version, t.concurrency_key, t.concurrency_limit,
                        $14::bigint, w.key, COALESCE(w.waiting, 0), t.callback_url,
                        (t.queue, t.command_type) IN (SELECT queue, command_type
                                                      FROM tenax_event_rules)
                        OR t.queue IN (SELECT queue FROM tenax_event_rules
                                       WHERE command_type = '')
                        OR t.command_type IN (SELECT command_type FROM tenax_event_rules
                                              WHERE queue = '')
                        OR EXISTS (SELECT 1 FROM tenax_event_rules
                                   WHERE queue = '' AND command_type = '')
                 FROM UNNEST($2::text[], $3::text[], $4::text[], $5::text[], $6::int2[],
                             $7::int4[], $8::timestamptz[], $9::float8[], $10::int8[],
                             $11::int4[], $12::text[], $13::int4[], $17::text[])
                      WITH ORDINALITY AS t(task_no, command_type, payload, queue, priority,
                                           max_attempts, run_at, delay_ms, timeout_ms,
                                           payload_version, concurrency_key,
                                           concurrency_limit, callback_url, n)
                 LEFT JOIN UNNEST($15::text[], $16::int4[]) WITH ORDINALITY AS w(key, waiting, n)
                        ON w.n = t.n
                 ORDER BY t.n
                 ON CONFLICT (task_no) DO NOTHING
                 RETURNING id, task_no, queue, status, run_at, created_at, updated_at
             ), woke AS (
                 SELECT count(pg_notify($18, q.queue)) AS queues
                 FROM (SELECT DISTINCT queue FROM ins) q
             )
             SELECT ins.id, ins.task_no, ins.status, ins.run_at, ins.created_at, ins.updated_at
             FROM ins CROSS JOIN woke",
        )
        .bind(now)
        .bind(&task_no)
        .bind(&command_type)
        .bind(&payload)
        .bind(&queue)
        .bind(&priority)
        .bind(&max_attempts)
        .bind(&run_at)
        .bind(&delay_ms)
        .bind(&timeout_ms)
        .bind(&payload_version)
        .bind(&key)
        .bind(&key_limit)
        .bind(workflow_id)
        .bind(keys)
        .bind(waiting)
        .bind(&callback_url)
        .bind(WAKE_CHANNEL)
        .fetch_all(&mut *conn)
        .await
        .map_err(map_err)?;
        // A number repeated in the call was inserted from its first occurrence.
        let mut first: HashMap<&str, &TaskInsertParams> = HashMap::with_capacity(chunk.len());
        for task in chunk {
            first.entry(task.task_no.as_str()).or_insert(task);
        }
        for row in &rows {
            let task_no: String = row.try_get("task_no").map_err(map_err)?;
            let sent = first.get(task_no.as_str()).ok_or_else(|| {
                crate::StorageError::Corrupt(format!("inserted task_no {task_no:?} was not sent"))
            })?;
            let task = created_record(sent, row)?;
            created.insert(task_no, task);
        }
    }
    // ON CONFLICT waited for any concurrent insert of these numbers to commit; this
    // statement's snapshot sees them.
    let missing: Vec<&str> = tasks
        .iter()
        .map(|t| t.task_no.as_str())
        .filter(|no| !created.contains_key(*no))
        .collect();
    let mut existing = HashMap::new();
    for chunk in missing.chunks(CHUNK) {
        let rows = sqlx::query(&format!(
            "SELECT {TASK_COLUMNS} FROM tenax_tasks WHERE task_no = ANY($1)"
        ))
        .bind(chunk)
        .fetch_all(&mut *conn)
        .await
        .map_err(map_err)?;
        for row in &rows {
            let task = task_from_row(row)?;
            existing.insert(task.task_no.to_string(), task);
        }
    }
    resolve_many(tasks, payloads, created, &existing)
}

/// The record of a task just inserted from `sent`: the columns the database decided
/// (`id`, `status`, `run_at` and the times) from `row`, the rest as sent, and every
/// column of a new task's life (attempts, lease, outcome) at its starting value.
fn created_record(sent: &TaskInsertParams, row: &PgRow) -> Result<TaskRecord> {
    let status: String = row.try_get("status").map_err(map_err)?;
    Ok(TaskRecord {
        id: TaskId(row.try_get("id").map_err(map_err)?),
        task_no: sent.task_no.clone(),
        kind: TaskKind::Execute,
        parent_id: None,
        command_type: sent.command_type.clone(),
        payload: sent.payload.clone(),
        payload_version: sent.payload_version,
        queue: sent.queue.clone(),
        priority: sent.priority,
        status: status.parse()?,
        attempt: 0,
        max_attempts: sent.max_attempts,
        lease_epoch: 0,
        lease_owner: None,
        lease_expires_at: None,
        run_at: row.try_get("run_at").map_err(map_err)?,
        timeout_ms: u64::try_from(duration_ms(sent.timeout)).unwrap_or(0),
        last_error: None,
        result: None,
        compensation: None,
        created_at: row.try_get("created_at").map_err(map_err)?,
        updated_at: row.try_get("updated_at").map_err(map_err)?,
        started_at: None,
        finished_at: None,
        concurrency_key: sent.concurrency_key.clone(),
        concurrency_limit: sent.concurrency_limit,
    })
}

/// Insert a task inside the caller's open transaction: the task exists if and only if
/// that transaction commits. Same rules as
/// [`Storage::task_insert`](crate::Storage::task_insert) (a conflicting `task_no` is
/// [`StorageError::TaskNoConflict`](crate::StorageError::TaskNoConflict)). The wake-up
/// `NOTIFY` is part of the transaction, so workers hear of the task at the commit. The
/// transaction must reach Tenax's tables (same database and, with `?schema=`, a
/// `search_path` that names the schema).
pub async fn enqueue_in(
    tx: &mut Transaction<'_, Postgres>,
    params: &TaskInsertParams,
) -> Result<TaskInserted> {
    let payload = validate_insert(params)?;
    let mut outcomes = insert_many(
        tx,
        std::slice::from_ref(params),
        std::slice::from_ref(&payload),
        params.now,
        None,
    )
    .await?;
    outcomes
        .pop()
        .ok_or_else(|| crate::StorageError::NotFound(params.task_no.to_string()))?
        .into_inserted()
}

/// Insert many tasks inside the caller's open transaction, as
/// [`Storage::task_insert_many`](crate::Storage::task_insert_many) does in its own.
pub async fn enqueue_many_in(
    tx: &mut Transaction<'_, Postgres>,
    params: &TaskInsertManyParams,
) -> Result<Vec<TaskInsertOutcome>> {
    let payloads = validate_many(&params.tasks)?;
    insert_many(tx, &params.tasks, &payloads, params.now, None).await
}
