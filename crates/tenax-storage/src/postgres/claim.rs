//! The claim on PostgreSQL, with the queue controls.
//!
//! The fast path is one statement: per queue (a `LATERAL` over the queue list) an
//! ordered walk of `tenax_tasks_claim_key` with `FOR UPDATE SKIP LOCKED`, the few
//! candidates sorted and limited, feeding `UPDATE ... RETURNING` and the attempt-history
//! insert. It skips queues that are paused or limited (a primary-key probe of
//! `tenax_queues` per queue), and reports the worker's limited queues in the same answer.
//!
//! With `skip_rated` (the first claim of a worker, and every claim while no limited type
//! was seen) it also skips the command types that have a rate limit and names them in
//! the same answer, so a claim without rate limits costs no probe of the buckets (see
//! [`crate::rates`]).
//!
//! Only when some of them are limited and the batch is not yet full does a second
//! transaction run: it locks those queues' rows (`FOR UPDATE`, in name order, so two
//! claimers never deadlock), counts their running tasks in a statement that starts after
//! the lock (READ COMMITTED: it sees every claim committed by the previous holder), and
//! claims at most the room left in each. Claimers of one limited queue take turns, so
//! `max_running` holds exactly across nodes.
use std::sync::LazyLock;

use sqlx::{Postgres, Row};
use tenax_core::TaskRecord;

use super::rows::{task_from_row, TASK_COLUMNS};
use super::{map_err, PgStorage, NOW};
use crate::common::{duration_ms, room, sort_in_claim_order};
use crate::error::Result;
use crate::params::TaskClaimParams;
use crate::ATTEMPT_HISTORY_LEN;

/// The claim statement. `$2`/`$9` are the queues and each queue's cap. `restricted`
/// false is the fast path: queues that are paused or limited are skipped; true is the
/// limited path (under the queue locks), whose queues are taken as given. With
/// `skip_rated`, the command types of `$3` that have a rate limit are skipped and
/// named.
///
/// The two switches are written into the text, not bound, so that the one plan the
/// claim's connections keep of each statement (see `PgStorage::claims`) holds only the
/// branches it runs.
///
/// Public for `tenax bench scale --explain` alone (crate `tenax-bench`), which shows the
/// plan of this statement; workers claim through `Storage::task_claim_batch`. Not a stable
/// interface.
pub fn claim_sql(restricted: bool, skip_rated: bool) -> &'static str {
    static STATEMENTS: LazyLock<[String; 4]> = LazyLock::new(|| {
        [(false, false), (false, true), (true, false), (true, true)]
            .map(|(restricted, skip_rated)| claim_text(restricted, skip_rated))
    });
    &STATEMENTS[usize::from(restricted) * 2 + usize::from(skip_rated)]
}

/// The text of [`claim_sql`], its switches written as literals.
fn claim_text(restricted: bool, skip_rated: bool) -> String {
    let (restricted, skip_rated) = (literal(restricted), literal(skip_rated));
    format!(
        "WITH rated AS (
                     SELECT array_agg(command_type ORDER BY command_type) AS types
                     FROM tenax_rate_limits WHERE {skip_rated} AND command_type = ANY($3)
                 ), limited AS (
                     SELECT array_agg(name ORDER BY name) AS names FROM tenax_queues
                     WHERE NOT {restricted} AND name = ANY($2) AND NOT paused AND max_running IS NOT NULL
                 ), keyed AS (
                     SELECT NOT {restricted} AND EXISTS (
                         SELECT 1 FROM tenax_tasks
                         WHERE queue = ANY($2) AND status IN ('pending', 'retrying')
                           AND concurrency_key IS NOT NULL
                           AND tenax_claim_key(run_at, priority) <= {NOW} AND run_at <= {NOW}
                     ) AS due
                 ), due AS (
                     SELECT c.id FROM (
                         SELECT u.queue, u.cap FROM unnest($2::text[], $9::int8[]) AS u(queue, cap)
                         -- A primary-key probe per queue (the LIMIT keeps it one: the
                         -- generic plan would rather hash the whole table).
                         LEFT JOIN LATERAL (
                             SELECT x.paused OR x.max_running IS NOT NULL AS held
                             FROM tenax_queues x WHERE x.name = u.queue LIMIT 1
                         ) x ON TRUE
                         WHERE {restricted} OR x.held IS NOT TRUE
                     ) q
                     CROSS JOIN LATERAL (
                         SELECT id, command_type, tenax_claim_key(run_at, priority) AS claim_key
                         FROM tenax_tasks
                         WHERE queue = q.queue AND status IN ('pending', 'retrying')
                           AND concurrency_key IS NULL
                           AND tenax_claim_key(run_at, priority) <= {NOW}
                           AND run_at <= {NOW} AND command_type = ANY($3)
                           AND payload_version <= ($8::int4[])[array_position($3, command_type)]
                         ORDER BY tenax_claim_key(run_at, priority), id
                         LIMIT q.cap
                         FOR UPDATE SKIP LOCKED
                     ) c
                     -- Outside the ordered walk, which keeps its plan; a candidate of a
                     -- skipped type is locked until the statement ends, not claimed.
                     WHERE c.command_type <> ALL(COALESCE((SELECT types FROM rated), '{{}}'))
                     ORDER BY c.claim_key, c.id
                     LIMIT $4
                 ), claimed AS (
                     UPDATE tenax_tasks t
                     SET status = 'running', attempt = t.attempt + 1, lease_epoch = t.lease_epoch + 1,
                         lease_owner = $5,
                         lease_expires_at = {NOW} + $6::float8 * interval '1 millisecond',
                         started_at = COALESCE(t.started_at, {NOW}), updated_at = {NOW}
                     FROM due WHERE t.id = due.id
                     RETURNING t.*
                 ), history AS (
                     INSERT INTO tenax_attempts (task_id, epoch, attempt, worker, started_at, outcome)
                     SELECT id, lease_epoch, attempt, lease_owner, {NOW}, 'running' FROM claimed
                 ), trimmed AS (
                     DELETE FROM tenax_attempts a USING claimed c
                     WHERE a.task_id = c.id AND a.epoch <= c.lease_epoch - $7
                 )
                 SELECT {TASK_COLUMNS}, l.names AS limited_queues, k.due AS keyed_due,
                        r.types AS rated_types
                 FROM limited l CROSS JOIN keyed k CROSS JOIN rated r LEFT JOIN claimed ON true
                 ORDER BY tenax_claim_key(run_at, priority), id"
    )
}

/// A switch of [`claim_text`] as SQL.
fn literal(on: bool) -> &'static str {
    if on {
        "TRUE"
    } else {
        "FALSE"
    }
}

/// One claim statement's inputs.
pub(super) struct Claim<'a> {
    pub(super) params: &'a TaskClaimParams,
    pub(super) queues: Vec<String>,
    pub(super) caps: Vec<i64>,
    pub(super) limit: u32,
    pub(super) restricted: bool,
    /// Skip the command types with a rate limit, and name them.
    pub(super) skip_rated: bool,
}

impl<'a> Claim<'a> {
    /// The fast path: every queue of the claim, each capped at the batch.
    pub(super) fn fast(params: &'a TaskClaimParams) -> Self {
        Self {
            params,
            queues: params.queues.clone(),
            caps: vec![i64::from(params.limit); params.queues.len()],
            limit: params.limit,
            restricted: false,
            skip_rated: false,
        }
    }

    pub(super) fn bind<'q>(
        &'q self,
        query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
        let params = self.params;
        query
            .bind(params.now)
            .bind(&self.queues)
            .bind(
                params
                    .commands
                    .iter()
                    .map(|(t, _)| t.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(i64::from(self.limit))
            .bind(&params.worker)
            .bind(duration_ms(params.lease_ttl) as f64)
            .bind(ATTEMPT_HISTORY_LEN)
            .bind(
                params
                    .commands
                    .iter()
                    .map(|(_, v)| i32::try_from(*v).unwrap_or(i32::MAX))
                    .collect::<Vec<_>>(),
            )
            .bind(&self.caps)
    }

    /// The statement for this claim's switches.
    pub(super) fn sql(&self) -> &'static str {
        claim_sql(self.restricted, self.skip_rated)
    }
}

/// What a claim statement answers.
struct Answer {
    tasks: Vec<TaskRecord>,
    /// The limited queues among those of the claim.
    limited: Vec<String>,
    /// Whether a keyed task is due.
    keyed: bool,
    /// The rate-limited command types skipped (with `skip_rated`).
    rated: Vec<String>,
}

fn read_answer(rows: &[sqlx::postgres::PgRow]) -> Result<Answer> {
    let mut tasks = Vec::with_capacity(rows.len());
    let mut limited = Vec::new();
    let mut keyed = false;
    let mut rated = Vec::new();
    for row in rows {
        if rated.is_empty() {
            if let Some(types) = row
                .try_get::<Option<Vec<String>>, _>("rated_types")
                .map_err(map_err)?
            {
                rated = types;
            }
        }
        keyed |= row
            .try_get::<Option<bool>, _>("keyed_due")
            .map_err(map_err)?
            .unwrap_or(false);
        if limited.is_empty() {
            if let Some(names) = row
                .try_get::<Option<Vec<String>>, _>("limited_queues")
                .map_err(map_err)?
            {
                limited = names;
            }
        }
        if row
            .try_get::<Option<i64>, _>("id")
            .map_err(map_err)?
            .is_some()
        {
            tasks.push(task_from_row(row)?);
        }
    }
    Ok(Answer {
        tasks,
        limited,
        keyed,
        rated,
    })
}

impl PgStorage {
    pub(super) async fn claim(&self, params: &TaskClaimParams) -> Result<Vec<TaskRecord>> {
        Ok(self.claim_with(params, false).await?.0)
    }

    /// The claim that skips the rate-limited types and names them (see
    /// [`RatedBackend::claim_skipping_rated`](crate::rates::RatedBackend)); `None` while
    /// a hint says limited types, keyed tasks or limited queues go first.
    pub(super) async fn claim_naming_rated(
        &self,
        params: &TaskClaimParams,
    ) -> Result<Option<(Vec<TaskRecord>, Vec<String>)>> {
        use std::sync::atomic::Ordering;
        let limited_first = self.hint(|hint| params.queues.iter().any(|q| hint.contains(q)));
        if self.rated_hint.load(Ordering::Relaxed)
            || self.keyed_hint.load(Ordering::Relaxed)
            || limited_first
        {
            return Ok(None);
        }
        let (tasks, rated) = self.claim_with(params, true).await?;
        if !rated.is_empty() {
            self.rated_hint.store(true, Ordering::Relaxed);
        }
        Ok(Some((tasks, rated)))
    }

    /// The claim; with `skip_rated`, of the types without a rate limit only (the
    /// limited ones are named in the answer), and with no hinted claim before the
    /// statement, since only the statement tells which types to skip.
    async fn claim_with(
        &self,
        params: &TaskClaimParams,
        skip_rated: bool,
    ) -> Result<(Vec<TaskRecord>, Vec<String>)> {
        use std::sync::atomic::Ordering;
        let left = |tasks: &Vec<TaskRecord>| {
            params
                .limit
                .saturating_sub(u32::try_from(tasks.len()).unwrap_or(u32::MAX))
        };
        // Keyed tasks seen by the last claim go first (each key capped by its free
        // slots), so a full batch of unkeyed tasks cannot starve them.
        let keyed_first = !skip_rated && self.keyed_hint.load(Ordering::Relaxed);
        let mut tasks = if keyed_first {
            self.claim_keyed(params, params.limit).await?
        } else {
            Vec::new()
        };
        // Limited queues seen by earlier claims go first too (capped by their room), so
        // a full batch from unlimited queues cannot starve them; a stale hint costs one
        // short transaction.
        let hinted: Vec<String> = if skip_rated {
            Vec::new()
        } else {
            self.hint(|hint| {
                params
                    .queues
                    .iter()
                    .filter(|q| hint.contains(*q))
                    .cloned()
                    .collect()
            })
        };
        if !hinted.is_empty() && left(&tasks) > 0 {
            let more = self.claim_limited(params, &hinted, left(&tasks)).await?;
            tasks.extend(more);
        }
        if left(&tasks) == 0 {
            sort_in_claim_order(&mut tasks);
            return Ok((tasks, Vec::new()));
        }
        let mut fast = Claim::fast(params);
        fast.limit = left(&tasks);
        fast.skip_rated = skip_rated;
        let rows = fast
            .bind(sqlx::query(fast.sql()))
            .fetch_all(&self.claims)
            .await
            .map_err(map_err)?;
        let answer = read_answer(&rows)?;
        tasks.extend(answer.tasks);
        self.keyed_hint.store(answer.keyed, Ordering::Relaxed);
        self.hint(|hint| {
            for queue in &params.queues {
                hint.remove(queue);
            }
            hint.extend(answer.limited.iter().cloned());
        });
        // The claims after the statement skip the rate-limited types it named.
        let unrated;
        let params = if answer.rated.is_empty() {
            params
        } else {
            unrated = TaskClaimParams {
                commands: params
                    .commands
                    .iter()
                    .filter(|(t, _)| !answer.rated.contains(t))
                    .cloned()
                    .collect(),
                ..params.clone()
            };
            &unrated
        };
        let untried: Vec<String> = answer
            .limited
            .into_iter()
            .filter(|q| !hinted.contains(q))
            .collect();
        let offers = !params.commands.is_empty();
        if offers && !untried.is_empty() && left(&tasks) > 0 {
            let more = self.claim_limited(params, &untried, left(&tasks)).await?;
            tasks.extend(more);
        }
        if offers && answer.keyed && !keyed_first && left(&tasks) > 0 {
            let more = self.claim_keyed(params, left(&tasks)).await?;
            tasks.extend(more);
        }
        sort_in_claim_order(&mut tasks);
        Ok((tasks, answer.rated))
    }

    fn hint<T>(&self, f: impl FnOnce(&mut std::collections::BTreeSet<String>) -> T) -> T {
        // A poisoned hint is still a valid hint.
        let mut hint = self
            .limited_hint
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut hint)
    }

    /// Claim from limited queues under their row locks, at most the room left in each.
    async fn claim_limited(
        &self,
        params: &TaskClaimParams,
        queues: &[String],
        limit: u32,
    ) -> Result<Vec<TaskRecord>> {
        let mut tx = self.begin().await?;
        let locked: Vec<(String, i32)> = sqlx::query_as(
            "SELECT name, max_running FROM tenax_queues
             WHERE name = ANY($1) AND NOT paused AND max_running IS NOT NULL
             ORDER BY name
             FOR UPDATE",
        )
        .bind(queues)
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        let running: Vec<(String, i64)> = sqlx::query_as(
            "SELECT queue, count(*) FROM tenax_tasks
             WHERE status = 'running' AND queue = ANY($1)
             GROUP BY queue",
        )
        .bind(queues)
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        let mut claim = Claim {
            params,
            queues: Vec::new(),
            caps: Vec::new(),
            limit,
            restricted: true,
            skip_rated: false,
        };
        for (queue, max) in locked {
            let now_running = running
                .iter()
                .find(|(q, _)| *q == queue)
                .map_or(0, |(_, n)| *n);
            let room = room(u32::try_from(max).unwrap_or(0), now_running).min(limit);
            if room > 0 {
                claim.queues.push(queue);
                claim.caps.push(i64::from(room));
            }
        }
        if claim.queues.is_empty() {
            tx.rollback().await.map_err(map_err)?;
            return Ok(Vec::new());
        }
        let rows = claim
            .bind(sqlx::query(claim.sql()))
            .fetch_all(&mut *tx)
            .await
            .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(read_answer(&rows)?.tasks)
    }

    /// The query plan of the fast claim statement for these parameters, the one its
    /// connections keep (for the DBA, and for the tests that keep the claim on an
    /// ordered index scan and planned once). An `EXPLAIN` of the statement itself
    /// would plan it for the values given; the statement is prepared by name on one of
    /// the claim's connections instead, and its `EXECUTE` explained.
    #[doc(hidden)]
    pub async fn explain_claim(&self, params: &TaskClaimParams) -> Result<String> {
        static EXPLAINED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let name = format!(
            "tenax_explain_claim_{}",
            EXPLAINED.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let fast = Claim::fast(params);
        let mut conn = self.claims.acquire().await.map_err(map_err)?;
        sqlx::raw_sql(&format!("PREPARE {name} AS {}", fast.sql()))
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        // EXPLAIN takes no bound parameters: the values are written as literals.
        let text = |s: &str| format!("'{}'", s.replace('\'', "''"));
        let list = |items: Vec<String>, of: &str| format!("ARRAY[{}]::{of}[]", items.join(", "));
        let arguments = [
            params
                .now
                .map_or("NULL".to_owned(), |at| text(&at.to_rfc3339())),
            list(fast.queues.iter().map(|q| text(q)).collect(), "text"),
            list(
                params.commands.iter().map(|(t, _)| text(t)).collect(),
                "text",
            ),
            fast.limit.to_string(),
            text(&params.worker),
            (duration_ms(params.lease_ttl) as f64).to_string(),
            ATTEMPT_HISTORY_LEN.to_string(),
            list(
                params.commands.iter().map(|(_, v)| v.to_string()).collect(),
                "int4",
            ),
            list(fast.caps.iter().map(i64::to_string).collect(), "int8"),
        ];
        let lines = sqlx::raw_sql(&format!(
            "EXPLAIN (COSTS OFF) EXECUTE {name}({}::timestamptz, {})",
            arguments[0],
            arguments[1..].join(", ")
        ))
        .fetch_all(&mut *conn)
        .await;
        sqlx::raw_sql(&format!("DEALLOCATE {name}"))
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        let lines: Vec<String> = lines
            .map_err(map_err)?
            .iter()
            .map(|row| row.try_get::<String, _>(0))
            .collect::<std::result::Result<_, _>>()
            .map_err(map_err)?;
        Ok(lines.join("\n"))
    }
}
