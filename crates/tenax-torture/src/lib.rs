//! The Tenax torture harness.
//!
//! Real `tenax-torture worker` processes (the library's ordinary [`tenax::Worker`]
//! running a `TORTURE` command) work through a seeded workload against a real store
//! (SQLite, or a private PostgreSQL or MariaDB server) while the harness injects faults: SIGKILL,
//! SIGSTOP past the lease then SIGCONT, SIGTERM hand-back, poison tasks that abort
//! their process, immediate-mode PostgreSQL restarts, MariaDB SIGKILL and restart, and connection faults through a TCP
//! proxy (resets, blackholes, latency, a dropped reply to a COMMIT). Every handler
//! start and end goes to an external PostgreSQL ledger with a live advisory-lock
//! exclusion check; every fault and enqueue goes there too. After quiescence the
//! checker counts violations: lost tasks, concurrent duplicates, unexplained
//! re-executions, illegal transitions, stale writes accepted, early starts, poison
//! tasks not dead after exactly their maximum attempts.
#![forbid(unsafe_code)]

pub mod broken;
pub mod check;
pub mod db_clock;
pub mod enqueuer;
pub mod fleet;
pub mod ledger;
pub mod private_mariadb;
pub mod private_pg;
pub mod proxy;
pub mod run;
pub mod tiers;
pub mod worker;

/// `found`, after a `SKIP` line naming `missing` when it is false. A missing tool is a
/// failure (a panic) under `TENAX_REQUIRE_ALL_BACKENDS=1`, which CI sets and whose
/// `.ci/test` installs every tool, so a scenario never passes by not running.
pub fn required(found: bool, missing: &str) -> bool {
    if !found {
        assert!(
            std::env::var("TENAX_REQUIRE_ALL_BACKENDS").as_deref() != Ok("1"),
            "{missing}, but TENAX_REQUIRE_ALL_BACKENDS=1"
        );
        eprintln!("SKIP: {missing}");
    }
    found
}
