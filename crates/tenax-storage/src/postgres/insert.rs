//! Inserting tasks: one `INSERT ... SELECT FROM UNNEST(...)` per chunk of rows, shared
//! by `task_insert`, `task_insert_many` and the functions that insert inside a caller's
//! transaction.
use std::collections::HashMap;

use chrono::{DateTime, SubsecRound, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Postgres, Row};
use tenax_core::{TaskId, TaskKind, TaskRecord, TaskStatus};

use super::rows::{task_from_row, TASK_COLUMNS};
use super::{map_err, WAKE_CHANNEL};
use crate::common::{duration_ms, resolve_many};
use crate::error::Result;
use crate::params::{RunAt, TaskInsertOutcome, TaskInsertParams};
use crate::StorageError;

/// Rows per statement (each column is one array parameter, so this only bounds the
/// size of one statement's arrays).
pub(super) const CHUNK: usize = 5_000;

/// The workflow a bulk insert's tasks belong to.
pub(super) type WorkflowRows<'a> = crate::flow_sql::WorkflowRows<'a, i32>;

/// What an insert statement does with a task number that exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Existing {
    /// `ON CONFLICT (task_no) DO NOTHING`: the row is skipped, and the task that has
    /// the number is read back and compared.
    Skip,
    /// A plain `INSERT`, which fails whole with a unique violation
    /// ([`number_taken`]): only where that failure rolls back the statement alone (a
    /// connection outside any transaction), so that the caller can repeat it with
    /// [`Existing::Skip`]. The speculative insertion of `ON CONFLICT` costs an index
    /// probe per row, about a sixth of a 1,000-row statement's time, paid for numbers
    /// that are almost always new. A number that exists costs the rows written before
    /// the failure, and an `ERROR` line in the server's log.
    Fail,
}

impl Existing {
    /// The statement's conflict clause: a constant.
    fn clause(self) -> &'static str {
        match self {
            Existing::Skip => "ON CONFLICT (task_no) DO NOTHING",
            Existing::Fail => "",
        }
    }
}

/// Whether an insert with [`Existing::Fail`] failed because a task number exists (or
/// was repeated in the call).
pub(super) fn number_taken(error: &crate::StorageError) -> bool {
    let crate::StorageError::Database(source) = error else {
        return false;
    };
    match source.downcast_ref::<sqlx::Error>() {
        Some(sqlx::Error::Database(db)) => {
            db.code().as_deref() == Some("23505") && db.constraint() == Some("tenax_tasks_task_no")
        }
        _ => false,
    }
}

/// Insert `tasks` (already validated) on `conn` and send
/// one `NOTIFY` per queue that got a new task (it is delivered at the commit), with one
/// statement per [`CHUNK`] of tasks: inside the caller's transaction, or, on a
/// connection outside one, each statement its own transaction. With `workflow`,
/// the tasks belong to it: each gets its key, and one with parents waits `blocked`.
/// `existing` says what a number that exists does (see [`Existing`]).
pub(super) async fn insert_many(
    conn: &mut PgConnection,
    tasks: &[TaskInsertParams],
    now: Option<DateTime<Utc>>,
    workflow: Option<&WorkflowRows<'_>>,
    existing: Existing,
) -> Result<Vec<TaskInsertOutcome>> {
    // A plain INSERT fails whole only as one statement outside a transaction.
    debug_assert!(existing == Existing::Skip || tasks.len() <= CHUNK);
    let on_conflict = existing.clause();
    // The record each item created, by position: `None` where it created none.
    let mut created: Vec<Option<TaskRecord>> = Vec::with_capacity(tasks.len());
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
        let mut created_by = Vec::with_capacity(chunk.len());
        for task in chunk {
            let (at, delay) = match task.run_at {
                RunAt::Now => (None, 0),
                RunAt::In(delay) => (None, duration_ms(delay)),
                RunAt::At(at) => (Some(stored_instant(at)), 0),
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
            created_by.push(task.created_by.as_deref());
        }
        // Ids follow the order given (ORDER BY the ordinality). The statement also
        // sends one `NOTIFY` per queue that got a task, delivered at the commit: due
        // or delayed, since a delayed task may be due before the timer other workers
        // have armed, and they re-arm on the hint. It answers only what the database
        // decides: each new row's id, and the time the rows were created at (the
        // statement's `now()`, from which `run_at` follows); the rest of each record
        // is what was sent. Every byte answered crosses the connection and is decoded
        // per row.
        //
        // It decides the `events` flag itself, so the `tenax_events_flag` trigger does
        // not fire (migration 0014): a PL/pgSQL call per row was a third of the
        // statement's time. The rule test is the trigger's (`queue IN ('', q) AND
        // command_type IN ('', c)`), split by which side of a rule is the wildcard so
        // that each part is a hashed lookup built once per statement. The trigger's
        // per-row form also kept PostgreSQL from ever choosing the statement's generic
        // plan, so that every single-task insert paid for planning it.
        let sql = format!(
            "WITH ins AS (
                 INSERT INTO tenax_tasks (task_no, kind, command_type, payload, queue, priority,
                     status, max_attempts, run_at, timeout_ms, created_at, updated_at,
                     payload_version, concurrency_key, concurrency_limit, workflow_id,
                     workflow_key, waiting_parents, callback_url, created_by, events)
                 SELECT t.task_no, 'execute', t.command_type, t.payload, t.queue, t.priority,
                        CASE WHEN COALESCE(w.waiting, 0) > 0 THEN 'blocked' ELSE 'pending' END,
                        t.max_attempts,
                        COALESCE(t.run_at, COALESCE($1::timestamptz, now())
                                 + t.delay_ms * interval '1 millisecond'),
                        t.timeout_ms, COALESCE($1::timestamptz, now()),
                        COALESCE($1::timestamptz, now()),
                        t.payload_version, t.concurrency_key, t.concurrency_limit,
                        $14::bigint, w.key, COALESCE(w.waiting, 0), t.callback_url,
                        t.created_by,
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
                             $11::int4[], $12::text[], $13::int4[], $17::text[], $19::text[])
                      WITH ORDINALITY AS t(task_no, command_type, payload, queue, priority,
                                           max_attempts, run_at, delay_ms, timeout_ms,
                                           payload_version, concurrency_key,
                                           concurrency_limit, callback_url, created_by, n)
                 LEFT JOIN UNNEST($15::text[], $16::int4[]) WITH ORDINALITY AS w(key, waiting, n)
                        ON w.n = t.n
                 ORDER BY t.n
                 {on_conflict}
                 RETURNING id, task_no, queue
             ), woke AS (
                 SELECT count(pg_notify($18, q.queue)) AS queues,
                        COALESCE($1::timestamptz, now()) AS at
                 FROM (SELECT DISTINCT queue FROM ins) q
             )
             SELECT ins.id, ins.task_no, woke.at FROM ins CROSS JOIN woke"
        );
        let rows = sqlx::query(&sql)
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
            .bind(&created_by)
            .fetch_all(&mut *conn)
            .await
            .map_err(map_err)?;
        let base = created.len();
        created.resize_with(base + chunk.len(), || None);
        place_created(&mut created[base..], chunk, &rows, waiting)?;
    }
    // ON CONFLICT waited for any concurrent insert of these numbers to commit; this
    // statement's snapshot sees them.
    let missing: Vec<&str> = tasks
        .iter()
        .zip(&created)
        .filter(|(_, record)| record.is_none())
        .map(|(t, _)| t.task_no.as_str())
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
    resolve_many(tasks, created, &existing)
}

/// Put the records of a chunk's inserted `rows` (`id`, `task_no`, `at`) at the
/// positions of the items that inserted them, in `created` (as long as `chunk`, all
/// `None`). The ids follow the order the items were given (the statement inserts
/// `ORDER BY` the ordinality), so rows in rising id order are matched by one walk of
/// the items, skipping those that inserted nothing (a number that exists, or a repeat
/// of an earlier item). Should the rows come in any other order (nothing makes the
/// final `SELECT` keep it), the walk could pair a row with a later repeat of its
/// number; each is placed by a lookup of its number instead: the first item of that
/// number inserted it.
fn place_created(
    created: &mut [Option<TaskRecord>],
    chunk: &[TaskInsertParams],
    rows: &[PgRow],
    waiting: &[i32],
) -> Result<()> {
    let Some(first_row) = rows.first() else {
        return Ok(());
    };
    // Every row carries the same creation time: the statement's.
    let at: DateTime<Utc> = first_row.try_get(2).map_err(map_err)?;
    let record = |i: usize, id: i64| -> TaskRecord {
        let blocked = waiting.get(i).is_some_and(|&parents| parents > 0);
        created_record(&chunk[i], id, at, blocked)
    };
    let mut next = 0;
    let mut last_id = i64::MIN;
    let mut in_order = true;
    for row in rows {
        let id: i64 = row.try_get(0).map_err(map_err)?;
        let task_no: &str = row.try_get(1).map_err(map_err)?;
        let found = chunk[next..]
            .iter()
            .position(|t| t.task_no.as_str() == task_no);
        match found.filter(|_| id > last_id) {
            Some(skip) => {
                last_id = id;
                let i = next + skip;
                created[i] = Some(record(i, id));
                next = i + 1;
            }
            None => {
                in_order = false;
                break;
            }
        }
    }
    if in_order {
        return Ok(());
    }
    created.iter_mut().for_each(|slot| *slot = None);
    let mut first: HashMap<&str, usize> = HashMap::with_capacity(chunk.len());
    for (i, task) in chunk.iter().enumerate() {
        first.entry(task.task_no.as_str()).or_insert(i);
    }
    for row in rows {
        let id: i64 = row.try_get(0).map_err(map_err)?;
        let task_no: &str = row.try_get(1).map_err(map_err)?;
        let i = *first.get(task_no).ok_or_else(|| {
            StorageError::Corrupt(format!("inserted task_no {task_no:?} was not sent"))
        })?;
        created[i] = Some(record(i, id));
    }
    Ok(())
}

/// An instant as it is sent and stored: whole microseconds, the rest cut off within its
/// second. (sqlx would cut it toward 2000-01-01, PostgreSQL's epoch, which rounds an
/// earlier instant up, so the answer could not follow from what was given.)
fn stored_instant(at: DateTime<Utc>) -> DateTime<Utc> {
    at.trunc_subsecs(6)
}

/// The record of a task just inserted from `sent`: its `id` and creation time `at`
/// as the database answered them, `run_at` from them as the statement computed it, `blocked` (waiting for
/// parents) or `pending`, the rest as sent, and every column of a new task's life
/// (attempts, lease, outcome) at its starting value.
fn created_record(
    sent: &TaskInsertParams,
    id: i64,
    at: DateTime<Utc>,
    blocked: bool,
) -> TaskRecord {
    let run_at = match sent.run_at {
        RunAt::Now => at,
        RunAt::In(delay) => at + chrono::Duration::milliseconds(duration_ms(delay)),
        RunAt::At(run_at) => stored_instant(run_at),
    };
    TaskRecord {
        id: TaskId(id),
        task_no: sent.task_no.clone(),
        kind: TaskKind::Execute,
        parent_id: None,
        command_type: sent.command_type.clone(),
        payload: sent.payload.clone(),
        payload_version: sent.payload_version,
        queue: sent.queue.clone(),
        priority: sent.priority,
        status: if blocked {
            TaskStatus::Blocked
        } else {
            TaskStatus::Pending
        },
        attempt: 0,
        max_attempts: sent.max_attempts,
        lease_epoch: 0,
        lease_owner: None,
        lease_expires_at: None,
        run_at,
        timeout_ms: u64::try_from(duration_ms(sent.timeout)).unwrap_or(0),
        last_error: None,
        result: None,
        compensation: None,
        created_at: at,
        updated_at: at,
        started_at: None,
        finished_at: None,
        concurrency_key: sent.concurrency_key.clone(),
        concurrency_limit: sent.concurrency_limit,
        created_by: sent.created_by.clone(),
    }
}

crate::shared::insert::enqueue_in_api!(
    Postgres,
    "The wake-up `NOTIFY` is part of the transaction, so workers hear of the task at the \
     commit. The transaction must reach Tenax's tables (same database and, with \
     `?schema=`, a `search_path` that names the schema).",
    |conn, tasks, now| insert_many(conn, tasks, now, None, Existing::Skip)
);

#[cfg(test)]
#[cfg(feature = "testing")]
mod tests {
    use super::*;

    /// Rows as the insert statement answers them (`id`, `task_no`, `at`), in the order
    /// given, from a real server.
    async fn rows(conn: &mut PgConnection, rows: &[(i64, &str)]) -> Vec<PgRow> {
        let (ids, numbers): (Vec<i64>, Vec<&str>) = rows.iter().copied().unzip();
        sqlx::query(
            "SELECT r.id, r.task_no, now() AS at
             FROM UNNEST($1::int8[], $2::text[]) WITH ORDINALITY AS r(id, task_no, n)
             ORDER BY r.n",
        )
        .bind(&ids)
        .bind(&numbers)
        .fetch_all(conn)
        .await
        .unwrap()
    }

    fn placed(created: &[Option<TaskRecord>]) -> Vec<Option<i64>> {
        created.iter().map(|r| r.as_ref().map(|r| r.id.0)).collect()
    }

    /// The items `a`, `b` and a repeat of `a`: the first `a` inserted its row, and the
    /// repeat inserted none, whatever order the rows come back in.
    #[tokio::test]
    async fn place_created_gives_each_row_to_the_first_item_of_its_number_in_any_order() {
        use sqlx::Connection;
        let Some(url) = crate::testing::url_from_env("TENAX_TEST_POSTGRES_URL") else {
            return;
        };
        let mut conn = PgConnection::connect(&url).await.unwrap();
        let item = |no: &str| crate::testing::bulk_insert::numbered(no, 0);
        let chunk = [item("a"), item("b"), item("a")];
        for answered in [[(10, "a"), (11, "b")], [(11, "b"), (10, "a")]] {
            let rows = rows(&mut conn, &answered).await;
            let mut created = vec![None, None, None];
            place_created(&mut created, &chunk, &rows, &[]).unwrap();
            assert_eq!(placed(&created), [Some(10), Some(11), None], "{answered:?}");
        }
        // A number that was not sent is a corrupt answer, not a silent drop.
        let rows = rows(&mut conn, &[(12, "zzz")]).await;
        let mut created = vec![None, None, None];
        let err = place_created(&mut created, &chunk, &rows, &[]).unwrap_err();
        assert!(matches!(err, StorageError::Corrupt(_)), "{err:?}");
    }
}
