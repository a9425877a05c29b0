//! An execution ledger for tests that must prove "at most one live execution".
//!
//! [`Ledger`] is an [`ExecutionHook`](tenax_core::ExecutionHook) that records every
//! handler start and end (task, attempt, lease epoch, process, times) in a SQLite file
//! of its own, shared by every worker process of a test, and detects two executions of
//! one task that overlap in time. A test that kills a worker records the kill with
//! [`Ledger::record_kill`], so that execution's interval ends at the kill.
//!
//! Two checks: a live one at each start (another execution of the task is still open
//! in a process that was not killed), and an offline one, [`Ledger::check`], over all
//! intervals.
#![forbid(unsafe_code)]

mod ledger;

pub use ledger::{Execution, Ledger, LedgerError, LedgerReport};
