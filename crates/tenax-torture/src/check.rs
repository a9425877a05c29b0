//! The checker: after quiescence, reads the ledger (executions, live-lock violations,
//! faults, enqueue log) and the store (tasks and their attempt history) and counts
//! violations of the invariants.
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Serialize;
use tenax::storage::{Storage, TaskListParams, TaskRef};
use tenax::{AttemptOutcome, TaskNo, TaskRecord, TaskStatus};

use crate::ledger::{Enqueued, Exec, Fault, Ledger};

/// What the checker found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Findings {
    /// Enqueues acknowledged.
    pub enqueued_ok: usize,
    /// Enqueues whose answer was lost (resolved by looking the task number up).
    pub enqueued_unknown: usize,
    /// Of those, how many turned out to exist.
    pub unknown_resolved_present: usize,
    /// Handler executions recorded.
    pub executions: usize,
    /// Executions beyond the first of their task.
    pub re_executions: usize,
    /// Side effects written, and re-executions that found theirs already written.
    pub effects: i64,
    /// Re-executions that found the effect already there.
    pub dedup_hits: i64,
    /// I1: acknowledged tasks missing or not terminal.
    pub lost: usize,
    /// I2: two live executions of one task (live lock failures, interval overlaps).
    pub concurrent_duplicates: usize,
    /// Overlaps whose older execution belonged to a paused (SIGSTOP) process: the
    /// honest limit of fencing; its writes must all have been rejected.
    pub paused_overlaps: usize,
    /// Executions that spanned a whole SIGSTOP of their process, and how many of them
    /// fenced themselves on resume (R6: the handler of a paused worker self-fences).
    pub paused_executions: usize,
    /// Of those, the ones that ended `fenced`.
    pub paused_executions_fenced: usize,
    /// I5: re-executions with no kill, exit, pause, outage, connection fault, failure
    /// or fencing of the previous execution to explain them.
    pub unexplained_re_executions: usize,
    /// I3/I4: histories that are no path of the state machine.
    pub illegal_transitions: usize,
    /// I3: writes under a stale lease epoch that took effect.
    pub stale_writes_accepted: usize,
    /// I6: executions that started before their task's run time (DB clock).
    pub early_starts: usize,
    /// Poison tasks, and how many ended dead after exactly their maximum attempts.
    pub poison_tasks: usize,
    /// Poison tasks dead after exactly `max_attempts` claims.
    pub poison_dead_after_max: usize,
    /// Poison tasks that ended otherwise.
    pub poison_wrong: usize,
    /// The first offenders, with what was wrong.
    pub offenders: Vec<String>,
}

impl Findings {
    /// Zero violations of every kind.
    pub fn is_clean(&self) -> bool {
        self.lost == 0
            && self.concurrent_duplicates == 0
            && self.unexplained_re_executions == 0
            && self.illegal_transitions == 0
            && self.stale_writes_accepted == 0
            && self.early_starts == 0
            && self.poison_wrong == 0
    }

    fn offend(&mut self, what: String) {
        if self.offenders.len() < 20 {
            self.offenders.push(what);
        }
    }
}

/// Every task of the store, by task number.
pub async fn all_tasks(storage: &Arc<dyn Storage>) -> anyhow::Result<HashMap<String, TaskRecord>> {
    let mut out = HashMap::new();
    let mut before = None;
    loop {
        let page = storage
            .task_list(&TaskListParams {
                before_id: before,
                limit: 500,
                ..Default::default()
            })
            .await?;
        let Some(last) = page.last() else { break };
        before = Some(last.id);
        for task in page {
            out.insert(task.task_no.as_str().to_owned(), task);
        }
    }
    Ok(out)
}

/// When process `pid` stopped executing for good (killed or exited), µs.
fn death_of(pid: i32, faults: &[Fault]) -> Option<i64> {
    faults
        .iter()
        .find(|f| f.pid == Some(pid) && matches!(f.kind.as_str(), "kill" | "exit"))
        .map(|f| f.at_us)
}

/// Whether `pid` was paused at some time in `[from, to]`.
fn paused_between(pid: i32, from: i64, to: i64, faults: &[Fault]) -> bool {
    faults.iter().any(|f| {
        f.kind == "pause"
            && f.pid == Some(pid)
            && f.at_us <= to
            && f.until_us.unwrap_or(i64::MAX) >= from
    })
}

/// The longest a worker's pool keeps sleeping between connection attempts after the
/// database is back, µs: the cap of sqlx's reconnect sleep, a fifth of the pool's
/// acquire timeout (the backends' default, which the workers run with).
fn reconnect_grace_us() -> i64 {
    let acquire = tenax::storage::postgres::PgConfig::default()
        .acquire_timeout
        .max(tenax::storage::mysql::MySqlConfig::default().acquire_timeout);
    i64::try_from((acquire / 5).as_micros()).unwrap_or(i64::MAX)
}

/// Whether a fault that may make a worker lose a lease hit in `[from, to]`.
///
/// Database restarts and proxy faults hit every worker. So does a pause: a process
/// stopped inside a write transaction keeps its locks (SQLite's single writer lock, or
/// PostgreSQL and MariaDB row locks) for the whole pause, so other workers' writes wait,
/// their leases can expire meanwhile, and their finished work is then re-run.
///
/// A database restart reaches past its end: a connection asked for while the server
/// was down is retried by the pool with a doubling sleep, up to a fifth of the pool's
/// acquire timeout (sqlx), so a worker may wait that long after the server is back for
/// the connection that writes an outcome or renews a lease. Its effect is counted until
/// [`reconnect_grace_us`] after the restart ended.
fn explaining_fault(prev: &Exec, from: i64, to: i64, faults: &[Fault]) -> bool {
    faults.iter().any(|f| {
        let hits_prev = f.pid == Some(prev.pid);
        let global = f.pid.is_none() || f.kind == "pause";
        let grace = if f.kind == "db_restart" {
            reconnect_grace_us()
        } else {
            0
        };
        let during = f.at_us <= to && f.until_us.unwrap_or(f.at_us).saturating_add(grace) >= from;
        // A step of a worker's or of the database's clock, or a killed enqueuer, must
        // never make a worker lose a lease.
        let explains = !matches!(
            f.kind.as_str(),
            "stale_injection" | "clock_jump" | "db_clock_step" | "enqueuer_kill"
        );
        during && (hits_prev || global) && explains
    })
}

/// Parses a libfaketime offset (`+1h`, `-10m`, `+30s`, `+0`) into µs.
pub fn offset_us(offset: &str) -> Option<i64> {
    let offset = offset.trim();
    let (sign, rest) = match offset.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, offset.strip_prefix('+').unwrap_or(offset)),
    };
    let (digits, unit) = rest.split_at(
        rest.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len()),
    );
    let n: i64 = digits.parse().ok()?;
    let secs = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return None,
    };
    Some(sign * n * secs * 1_000_000)
}

/// The database clock's offset from real time through a run, from its steps
/// (`db_clock_step` faults, the new offset in their detail). A step is logged before
/// the offset file is written and ended after, so each offset is taken to hold from
/// its step's start until the next step's end: over any window, the offsets that may
/// have held are all counted.
#[derive(Debug, Clone, Default)]
pub struct DbOffsets {
    /// `(from_us, until_us, offset_us)`, in order; the first starts at `i64::MIN`.
    spans: Vec<(i64, i64, i64)>,
}

impl DbOffsets {
    /// The timeline of the steps among `faults` (offset 0 before the first).
    pub fn from_faults(faults: &[Fault]) -> Self {
        let steps: Vec<(i64, i64, i64)> = faults
            .iter()
            .filter(|f| f.kind == "db_clock_step")
            .filter_map(|f| {
                let offset = offset_us(f.detail.as_deref()?)?;
                Some((f.at_us, f.until_us.unwrap_or(f.at_us), offset))
            })
            .collect();
        let mut spans = Vec::with_capacity(steps.len() + 1);
        let mut from = i64::MIN;
        let mut offset = 0;
        for &(at, until, next) in &steps {
            spans.push((from, until, offset));
            from = at;
            offset = next;
        }
        spans.push((from, i64::MAX, offset));
        Self { spans }
    }

    /// The largest offset that may have held at some instant of `[from, to]`.
    pub fn max_within(&self, from: i64, to: i64) -> i64 {
        self.spans
            .iter()
            .filter(|(a, b, _)| *a <= to && *b >= from)
            .map(|(_, _, o)| *o)
            .max()
            .unwrap_or(0)
    }
}

/// Whether an execution started before its task's run time, by the database's clock.
///
/// The run time was given by the database's clock; the start is read on the ledger's
/// (real time). A claim happens between the enqueue and the start, so at the claim the
/// database's clock read at most the start plus the largest offset that held since the
/// enqueue: a start earlier than the run time by more than that (and 5 ms for the round
/// trips) was claimed early. A step forward of the database's clock between the enqueue
/// and the start explains a start that is early in real time; nothing else does.
fn started_early(e: &Exec, enqueued: &Enqueued, run_at: i64, offsets: &DbOffsets) -> Option<i64> {
    let from = enqueued.first_at_us.unwrap_or(i64::MIN);
    let db_start = e.start_us + offsets.max_within(from, e.start_us);
    (db_start + 5_000 < run_at).then_some(run_at - db_start)
}

/// Check a finished run.
pub async fn check(ledger: &Ledger, storage: &Arc<dyn Storage>) -> anyhow::Result<Findings> {
    let mut f = Findings::default();
    let enqueues = ledger.enqueues().await?;
    let execs = ledger.executions().await?;
    let faults = ledger.faults().await?;
    let offsets = DbOffsets::from_faults(&faults);
    let violations = ledger.violations().await?;
    let tasks = all_tasks(storage).await?;
    let (effects, hits) = ledger.effect_counts().await?;
    f.effects = effects;
    f.dedup_hits = hits;
    f.executions = execs.len();

    let mut by_task: BTreeMap<(&str, &str), Vec<&Exec>> = BTreeMap::new();
    for e in &execs {
        by_task.entry((&e.task_no, &e.kind)).or_default().push(e);
    }
    let end_of = |e: &Exec| {
        e.end_us
            .or_else(|| death_of(e.pid, &faults))
            .unwrap_or(i64::MAX)
    };

    // I1: every acknowledged task is there and terminal; unknown answers resolved by
    // task number. A pruned task (pruning on) must have finished in the ledger.
    for enqueued in &enqueues {
        let Enqueued {
            task_no,
            mode,
            state,
            run_at_us,
            ..
        } = enqueued;
        // I6: no execution before the run time the store gave the task at enqueue, by
        // the database's clock (see `started_early`).
        if let (Some(run_at), Some(runs)) = (run_at_us, by_task.get(&(task_no.as_str(), "execute")))
        {
            for e in runs.iter() {
                if let Some(early) = started_early(e, enqueued, *run_at, &offsets) {
                    f.early_starts += 1;
                    f.offend(format!(
                        "early: {task_no} epoch {} started {early} µs before its run time",
                        e.epoch
                    ));
                }
            }
        }
        let present = tasks.get(task_no.as_str());
        match state.as_str() {
            "ok" => f.enqueued_ok += 1,
            "info" => {
                f.enqueued_unknown += 1;
                match storage
                    .task_get(&TaskRef::No(TaskNo::from_stored(task_no.clone())))
                    .await?
                {
                    Some(_) => f.unknown_resolved_present += 1,
                    None => continue,
                }
            }
            _ => continue,
        }
        let pruned_done = present.is_none()
            && by_task
                .get(&(task_no.as_str(), "execute"))
                .is_some_and(|runs| {
                    runs.iter()
                        .any(|e| matches!(e.outcome.as_deref(), Some("succeeded" | "failed")))
                });
        let ok = present.is_some_and(|t| t.status.is_finished()) || pruned_done;
        if !ok {
            f.lost += 1;
            f.offend(format!(
                "lost: {task_no} ({mode}) is {:?}",
                present.map(|t| t.status)
            ));
        }
        if mode == "poison" {
            f.poison_tasks += 1;
            match present {
                Some(t) if t.status == TaskStatus::Dead && t.attempt == t.max_attempts => {
                    f.poison_dead_after_max += 1
                }
                other => {
                    f.poison_wrong += 1;
                    f.offend(format!(
                        "poison: {task_no} ended {:?} after {:?} of {:?} attempts",
                        other.map(|t| t.status),
                        other.map(|t| t.attempt),
                        other.map(|t| t.max_attempts)
                    ));
                }
            }
        }
    }

    // I2: live lock violations, unless the holder was another, paused process. Within
    // one process the worker itself keeps a new attempt waiting until an older one of
    // the same task has returned, so a same-process overlap always counts.
    for (task_no, epoch, pid, at, what) in &violations {
        let paused_holder = by_task
            .iter()
            .filter(|((no, _), _)| *no == task_no)
            .flat_map(|(_, runs)| runs.iter())
            .any(|e| {
                e.pid != *pid && e.epoch < *epoch && paused_between(e.pid, e.start_us, *at, &faults)
            });
        if paused_holder {
            f.paused_overlaps += 1;
        } else {
            f.concurrent_duplicates += 1;
            f.offend(format!(
                "concurrent: {task_no} epoch {epoch} in pid {pid}: {what}"
            ));
        }
    }
    // I2 offline, and I5.
    for ((task_no, kind), runs) in &by_task {
        for (i, a) in runs.iter().enumerate() {
            for b in &runs[i + 1..] {
                if a.start_us < end_of(b) && b.start_us < end_of(a) {
                    let (older, newer) = if a.epoch <= b.epoch { (a, b) } else { (b, a) };
                    if older.pid != newer.pid
                        && paused_between(older.pid, older.start_us, newer.start_us, &faults)
                    {
                        // Counted with the live check when it fired; intervals only
                        // confirm it.
                        continue;
                    }
                    if a.epoch == b.epoch {
                        f.concurrent_duplicates += 1;
                        f.offend(format!(
                            "concurrent: {task_no}/{kind} epoch {} twice",
                            a.epoch
                        ));
                    } else if !violations.iter().any(|v| v.0 == **task_no) {
                        // The live check missed an overlap the intervals show.
                        f.concurrent_duplicates += 1;
                        f.offend(format!(
                            "overlap: {task_no}/{kind} epochs {} and {}",
                            a.epoch, b.epoch
                        ));
                    }
                }
            }
        }
        for pair in runs.windows(2) {
            let (prev, next) = (pair[0], pair[1]);
            f.re_executions += 1;
            let explained = matches!(prev.outcome.as_deref(), Some("failed" | "fenced"))
                || death_of(prev.pid, &faults).is_some_and(|d| d <= next.start_us)
                || explaining_fault(prev, prev.start_us, next.start_us, &faults);
            if !explained {
                f.unexplained_re_executions += 1;
                f.offend(format!(
                    "unexplained: {task_no}/{kind} epoch {} ({:?}, pid {}) re-run as epoch {}",
                    prev.epoch, prev.outcome, prev.pid, next.epoch
                ));
            }
        }
    }

    // R6: an execution that spanned a whole pause of its process.
    for e in &execs {
        let spanned = faults.iter().any(|p| {
            p.kind == "pause"
                && p.pid == Some(e.pid)
                && e.start_us < p.at_us
                && e.end_us
                    .is_some_and(|end| p.until_us.is_some_and(|u| end > u))
        });
        if spanned {
            f.paused_executions += 1;
            if e.outcome.as_deref() == Some("fenced") {
                f.paused_executions_fenced += 1;
            }
        }
    }

    // I3/I4 from the store's own history.
    for task in tasks.values() {
        history_check(storage, task, &by_task, &mut f).await?;
    }
    Ok(f)
}

async fn history_check(
    storage: &Arc<dyn Storage>,
    task: &TaskRecord,
    by_task: &BTreeMap<(&str, &str), Vec<&Exec>>,
    f: &mut Findings,
) -> anyhow::Result<()> {
    let no = task.task_no.as_str();
    let kind = task.kind.as_str();
    let runs = by_task.get(&(no, kind)).map(Vec::as_slice).unwrap_or(&[]);
    if runs.len() < 2 && !task.status.is_finished() && task.attempt <= 1 {
        return Ok(());
    }
    let attempts = storage.task_attempts(task.id).await?;
    let mut bad = Vec::new();
    for pair in attempts.windows(2) {
        if pair[1].epoch <= pair[0].epoch {
            bad.push(format!(
                "epochs not increasing: {} then {}",
                pair[0].epoch, pair[1].epoch
            ));
        }
        if matches!(
            pair[0].outcome,
            AttemptOutcome::Succeeded | AttemptOutcome::Dead
        ) {
            bad.push(format!(
                "attempt of epoch {} ended {:?} but was not the last",
                pair[0].epoch, pair[0].outcome
            ));
        }
    }
    let last = attempts.last();
    let mut stale = false;
    if task.status.is_finished() {
        if let Some(a) = attempts
            .iter()
            .find(|a| a.outcome == AttemptOutcome::Running)
        {
            bad.push(format!(
                "task {:?} while attempt of epoch {} still running",
                task.status, a.epoch
            ));
            stale = true;
        }
        match (task.status, last.map(|a| a.outcome)) {
            (TaskStatus::Succeeded, Some(AttemptOutcome::Succeeded))
            | (TaskStatus::Dead, Some(AttemptOutcome::Dead | AttemptOutcome::LeaseExpired))
            | (TaskStatus::Dead, None)
            | (TaskStatus::Cancelled, _) => {}
            (status, outcome) => {
                bad.push(format!("task {status:?} but last attempt {outcome:?}"));
                stale = true;
            }
        }
        if task.lease_epoch != last.map_or(0, |a| a.epoch) && task.attempt > 0 {
            bad.push(format!(
                "task epoch {} but last attempt epoch {:?}",
                task.lease_epoch,
                last.map(|a| a.epoch)
            ));
        }
    }
    // Every execution the ledger saw ran under a claim the store recorded, and a
    // handler that finished under an epoch not the last one cannot have won.
    for e in runs {
        if !attempts.iter().any(|a| a.epoch == e.epoch) && attempts.len() < 20 {
            bad.push(format!(
                "execution under epoch {} has no attempt record",
                e.epoch
            ));
        }
    }
    if !bad.is_empty() {
        f.illegal_transitions += 1;
        if stale {
            f.stale_writes_accepted += 1;
        }
        f.offend(format!("history of {no}/{kind}: {}", bad.join("; ")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(pid: i32, start_us: i64) -> Exec {
        Exec {
            task_no: "t".into(),
            kind: "execute".into(),
            attempt: 1,
            epoch: 1,
            pid,
            start_us,
            end_us: Some(start_us + 160_000),
            outcome: Some("succeeded".into()),
        }
    }

    fn restart(at_us: i64, until_us: i64) -> Fault {
        Fault {
            at_us,
            until_us: Some(until_us),
            kind: "db_restart".into(),
            pid: None,
            detail: None,
        }
    }

    /// Seen on MariaDB: an execution claimed 90 ms after the server came back, whose
    /// outcome then waited 0.9 s behind a connection the pool was still retrying (its
    /// last sleep 1.28 s), so its lease expired and the task ran again.
    #[test]
    fn a_restart_explains_a_rerun_of_work_started_while_the_pool_reconnects() {
        let faults = [restart(0, 1_540_000)];
        let prev = exec(7, 1_630_000);
        assert!(explaining_fault(&prev, prev.start_us, 2_700_000, &faults));
    }

    #[test]
    fn a_restart_does_not_explain_a_rerun_of_work_started_after_the_pool_is_back() {
        let faults = [restart(0, 1_540_000)];
        let prev = exec(7, 1_540_000 + reconnect_grace_us() + 1);
        assert!(!explaining_fault(
            &prev,
            prev.start_us,
            prev.start_us + 1_100_000,
            &faults
        ));
    }

    fn step(at_us: i64, offset: &str) -> Fault {
        Fault {
            at_us,
            until_us: Some(at_us + 1_000),
            kind: "db_clock_step".into(),
            pid: None,
            detail: Some(offset.into()),
        }
    }

    fn enqueued(first_at_us: i64) -> Enqueued {
        Enqueued {
            task_no: "t".into(),
            mode: "ok".into(),
            state: "ok".into(),
            run_at_us: None,
            first_at_us: Some(first_at_us),
        }
    }

    #[test]
    fn offsets_parse_as_libfaketime_writes_them() {
        assert_eq!(offset_us("+1h"), Some(3_600_000_000));
        assert_eq!(offset_us("-10m"), Some(-600_000_000));
        assert_eq!(offset_us("+0"), Some(0));
        assert_eq!(offset_us("30s"), Some(30_000_000));
        assert_eq!(offset_us("+1y"), None);
    }

    /// A task delayed 2 s, enqueued at 0; the database's clock steps an hour forward at
    /// 1 s and the task starts at once, 1 s early in real time: the step explains it.
    #[test]
    fn a_forward_step_of_the_database_clock_since_the_enqueue_explains_an_early_start() {
        let offsets = DbOffsets::from_faults(&[step(1_000_000, "+1h")]);
        let e = exec(7, 1_100_000);
        assert_eq!(started_early(&e, &enqueued(0), 2_000_000, &offsets), None);
    }

    /// The same start with no step is 0.9 s early; so is one whose only forward step
    /// held before the task was enqueued and ended with a step back.
    #[test]
    fn an_early_start_with_no_forward_step_since_the_enqueue_is_counted() {
        let none = DbOffsets::default();
        let e = exec(7, 1_100_000);
        assert_eq!(
            started_early(&e, &enqueued(0), 2_000_000, &none),
            Some(900_000)
        );
        let before = DbOffsets::from_faults(&[step(-5_000_000, "+1h"), step(-3_000_000, "+0")]);
        assert_eq!(
            started_early(&e, &enqueued(0), 2_000_000, &before),
            Some(900_000)
        );
    }

    /// A task enqueued while the clock is an hour ahead gets a run time an hour ahead of
    /// real time; started while the clock still is, it is on time.
    #[test]
    fn a_run_time_given_by_a_clock_ahead_is_met_by_a_start_under_the_same_clock() {
        let offsets = DbOffsets::from_faults(&[step(0, "+1h")]);
        let e = exec(7, 2_000_000);
        assert_eq!(
            started_early(
                &e,
                &enqueued(1_000_000),
                3_600_000_000 + 1_500_000,
                &offsets
            ),
            None
        );
    }

    #[test]
    fn a_step_of_the_database_clock_explains_no_rerun() {
        let faults = [step(1_000_000, "+1h")];
        let prev = exec(7, 900_000);
        assert!(!explaining_fault(&prev, prev.start_us, 2_000_000, &faults));
    }

    #[test]
    fn a_kill_of_another_process_explains_nothing() {
        let faults = [Fault {
            at_us: 1_000_000,
            until_us: None,
            kind: "kill".into(),
            pid: Some(8),
            detail: None,
        }];
        let prev = exec(7, 900_000);
        assert!(!explaining_fault(&prev, prev.start_us, 2_000_000, &faults));
    }
}
