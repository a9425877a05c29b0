//! The pruner's side tables: what [`Storage::side_prune`](crate::Storage::side_prune)
//! removes once the tasks that used them are pruned, written once for every backend.
//!
//! Each table is swept in its own transaction, at most `limit` rows at a time, oldest
//! first, so a pass never holds many locks nor runs long:
//!
//! - **dependency rows** (`tenax_task_deps`) whose dependent (`child_id`) is gone. A
//!   dependent still present keeps all its rows, even to a pruned parent: a blocked
//!   task waits only on parents that have not finished, which are never pruned, and the
//!   rows to finished parents are how it reads their results. A row whose parent is gone
//!   but whose dependent is live is removed later, with the dependent. Task ids are
//!   never reused and a task and its rows are written in one transaction, so a row read
//!   without its dependent (in one statement's snapshot) is an orphan for good.
//! - **workflows** (`tenax_workflows`) with no task left. The row is locked (`SKIP
//!   LOCKED`: a saga's transaction changing it is left for the next pass) and the
//!   absence of tasks checked again after the lock.
//! - **concurrency keys** (`tenax_concurrency_keys`, PostgreSQL and MariaDB/MySQL; SQLite
//!   has no such table) with no live task (pending, retrying, running or blocked) of
//!   that key. The row is locked first (`SKIP LOCKED`: a claim holding it is left
//!   alone) and the absence of live tasks checked again after the lock, in a statement
//!   that sees every task committed before. A claim that takes a key's row after the
//!   delete commits writes the row anew and locks it (the claim checks that it holds a
//!   lock on a row that exists), so a removed row never lets two claimers past one
//!   key's limit.
//! - **audit entries** (`tenax_audit`) older than the audit retention: among the oldest
//!   `limit` entries (by id, which follows the database clock), those written before
//!   now - `audit_retention`.
use std::time::Duration;

use chrono::{DateTime, Utc};

/// [`Storage::side_prune`](crate::Storage::side_prune).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidePruneParams {
    /// Delete audit entries written longer ago than this.
    pub audit_retention: Duration,
    /// At most this many rows per table per call.
    pub limit: u32,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// What one [`Storage::side_prune`](crate::Storage::side_prune) call deleted, per table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SidePruned {
    /// Rows of `tenax_concurrency_keys`.
    pub keys: u64,
    /// Rows of `tenax_task_deps`.
    pub deps: u64,
    /// Rows of `tenax_workflows`.
    pub workflows: u64,
    /// Rows of `tenax_audit`.
    pub audit: u64,
}

impl SidePruned {
    /// Rows deleted in all.
    pub fn total(&self) -> u64 {
        self.keys + self.deps + self.workflows + self.audit
    }

    /// Whether a table met the batch limit, so another call may find more.
    ///
    /// The dependency rows are counted per row but swept per dependent (all its rows at
    /// once), so they may pass the limit.
    pub fn more(&self, limit: u32) -> bool {
        let limit = u64::from(limit);
        limit > 0
            && (self.keys >= limit
                || self.deps >= limit
                || self.workflows >= limit
                || self.audit >= limit)
    }
}

/// Statuses of a task that still needs its concurrency key's row, as an SQL list.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) const LIVE_SQL: &str = "('pending', 'retrying', 'running', 'blocked')";
