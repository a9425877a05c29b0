//! The scenarios of the fast tier (CI) and of the long tier, one code path scaled.
use std::io::Write;
use std::path::Path;

use crate::run::{Backend, Plan, Report};

/// The fast tier's scale: `TENAX_TORTURE_SCALE` (a factor on every count, default 1).
pub fn scale_from_env() -> f64 {
    std::env::var("TENAX_TORTURE_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|s: &f64| *s > 0.0)
        .unwrap_or(1.0)
}

fn scaled(n: usize, scale: f64) -> usize {
    ((n as f64 * scale).round() as usize).max(1)
}

/// Every scenario name.
pub const SCENARIOS: &[&str] = &[
    "kill9-sqlite",
    "kill9-postgres",
    "pg-restart",
    "mariadb",
    "skew-postgres",
    "skew-mariadb",
    "db-clock-postgres",
    "db-clock-mariadb",
    "proxy",
    "proxy-mariadb",
    "enqueuer-kill",
    "pause-term",
    "soak",
    "selftest-stale",
];

/// The plan of scenario `name` at `scale` (1.0 is the fast tier).
pub fn plan(name: &str, seed: u64, scale: f64) -> anyhow::Result<Plan> {
    let plan = match name {
        // R1: SIGKILL every U(50 ms, 1 s); 1% poison pills abort their worker.
        "kill9-sqlite" | "kill9-postgres" => {
            let backend = if name.ends_with("sqlite") {
                Backend::Sqlite
            } else {
                Backend::Postgres
            };
            let mut p = Plan::new(name, backend, seed);
            p.kills = scaled(200, scale);
            p.tasks = scaled(1000, scale);
            p.enqueue_per_sec = 10;
            p.poison_permille = 10;
            p
        }
        // R2: PostgreSQL crashed and recovered under load.
        "pg-restart" => {
            let mut p = Plan::new(name, Backend::Postgres, seed);
            p.db_restarts = scaled(5, scale);
            p.tasks = scaled(400, scale);
            p.enqueue_per_sec = 20;
            p
        }
        // R1/R2 on MariaDB: workers SIGKILLed, and the server SIGKILLed and restarted.
        "mariadb" => {
            let mut p = Plan::new(name, Backend::Mariadb, seed);
            p.kills = scaled(50, scale);
            p.db_restarts = scaled(3, scale);
            p.tasks = scaled(400, scale);
            p.enqueue_per_sec = 10;
            p.poison_permille = 10;
            p
        }
        // R5: worker clocks an hour ahead, an hour behind and ten minutes ahead of the
        // database's (libfaketime), jumping between those while they run; a third of
        // the tasks delayed, plus kills.
        "skew-postgres" | "skew-mariadb" => {
            let backend = if name.ends_with("postgres") {
                Backend::Postgres
            } else {
                Backend::Mariadb
            };
            let mut p = Plan::new(name, backend, seed);
            p.skews = vec!["+1h".into(), "-1h".into(), "+10m".into()];
            p.clock_jumps = scaled(12, scale);
            p.kills = scaled(20, scale);
            p.tasks = scaled(300, scale);
            p.delayed_permille = 330;
            p.enqueue_per_sec = 20;
            p
        }
        // The database server's own clock steps an hour forward, an hour back and ten
        // minutes forward (then on in turn) while four workers run delayed, leased and
        // retried tasks and are killed: nothing may start twice at once or early by
        // the database's clock, and no step may explain a re-run.
        "db-clock-postgres" | "db-clock-mariadb" => {
            let backend = if name.ends_with("postgres") {
                Backend::Postgres
            } else {
                Backend::Mariadb
            };
            let mut p = Plan::new(name, backend, seed);
            p.workers = 4;
            p.db_offsets = vec!["+1h".into(), "+0".into(), "+10m".into()];
            p.db_clock_steps = scaled(3, scale);
            p.kills = scaled(15, scale);
            p.tasks = scaled(300, scale);
            p.task_ms = 400;
            p.flaky_permille = 100;
            p.delayed_permille = 330;
            p.enqueue_per_sec = 20;
            p
        }
        // R3: resets, blackholes longer than the lease, latency, lost COMMIT replies.
        "proxy" => {
            let mut p = Plan::new(name, Backend::Postgres, seed);
            p.proxy_faults = scaled(100, scale);
            p.tasks = scaled(800, scale);
            p.enqueue_per_sec = 10;
            p
        }
        // R3 on MariaDB: the same connection faults, the lost reply to a COMMIT being
        // a MySQL COM_QUERY.
        "proxy-mariadb" => {
            let mut p = Plan::new(name, Backend::Mariadb, seed);
            p.proxy_faults = scaled(40, scale);
            p.tasks = scaled(400, scale);
            p.enqueue_per_sec = 10;
            p
        }
        // R1 for the client: the enqueuing process SIGKILLed within 3 ms after it sent
        // a request; each lost answer resolved by looking its task number up.
        "enqueuer-kill" => {
            let mut p = Plan::new(name, Backend::Postgres, seed);
            p.enqueuer_kills = scaled(25, scale);
            p.kills = scaled(5, scale);
            p.tasks = scaled(400, scale);
            p.enqueue_per_sec = 20;
            p
        }
        // R6 and R7: SIGSTOP past the lease then SIGCONT; SIGTERM hand-back.
        "pause-term" => {
            let mut p = Plan::new(name, Backend::Sqlite, seed);
            p.pauses = scaled(6, scale);
            p.terms = scaled(10, scale);
            p.tasks = scaled(300, scale);
            p.task_ms = 1500;
            p.enqueue_per_sec = 20;
            p
        }
        // R11: one worker, no-op tasks, pruning on, RSS / descriptors / rows sampled.
        "soak" => {
            let mut p = Plan::new(name, Backend::Sqlite, seed);
            p.workers = 1;
            p.concurrency = 8;
            p.tasks = scaled(10_000, scale);
            p.task_ms = 0;
            p.flaky_permille = 0;
            p.permanent_permille = 0;
            p.delayed_permille = 0;
            p.enqueue_per_sec = 0;
            p.retention_ms = Some(1000);
            p.sample = true;
            p
        }
        // The checker's self-test: one stale completion written behind the guard.
        "selftest-stale" => {
            let mut p = Plan::new(name, Backend::Sqlite, seed);
            p.kills = scaled(20, scale).max(20);
            p.tasks = 300;
            p.flaky_permille = 400;
            p.task_ms = 400;
            p.enqueue_per_sec = 30;
            p.inject_stale_completion = true;
            p
        }
        other => anyhow::bail!(
            "unknown scenario {other:?} (known: {})",
            SCENARIOS.join(", ")
        ),
    };
    Ok(plan)
}

/// The long tier, in parts that each fit well inside an hour.
pub fn long_part(part: u32, seed: u64, scale: f64) -> anyhow::Result<Vec<Plan>> {
    let s = scale;
    Ok(match part {
        1 => vec![plan("kill9-sqlite", seed, 5.0 * s)?],
        2 => vec![plan("kill9-postgres", seed, 5.0 * s)?],
        3 => vec![plan("pg-restart", seed, 10.0 * s)?],
        4 => vec![plan("proxy", seed, 5.0 * s)?],
        5 => vec![plan("pause-term", seed, 20.0 * s)?],
        6 => vec![plan("soak", seed, 10.0 * s)?],
        7 => {
            // 1,000 worker kills and 20 server kills on MariaDB.
            let mut p = plan("mariadb", seed, 20.0 * s)?;
            p.db_restarts = scaled(20, s);
            vec![p]
        }
        8 => vec![
            plan("skew-postgres", seed, 20.0 * s)?,
            plan("skew-mariadb", seed, 20.0 * s)?,
        ],
        9 => vec![plan("enqueuer-kill", seed, 10.0 * s)?],
        10 => vec![plan("proxy-mariadb", seed, 12.5 * s)?],
        11 => vec![
            plan("db-clock-postgres", seed, 10.0 * s)?,
            plan("db-clock-mariadb", seed, 10.0 * s)?,
        ],
        other => anyhow::bail!("the long tier has parts 1 to 11, not {other}"),
    })
}

/// Append one row per report to the results table of `docs/RELIABILITY.md`.
pub fn append_results(doc: &Path, part: u32, scale: f64, reports: &[Report]) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new().append(true).open(doc)?;
    for r in reports {
        let f = &r.findings;
        let i = &r.injected;
        writeln!(
            file,
            "| {} | {} ×{} | {:?} | {} | {:.0} | {} | kills {}, exits {}, pauses {}, terms {}, db restarts {}, proxy {} (lost COMMIT replies {}), clock jumps {}, database clock steps {}, enqueuer kills {} ({} lost answers) | {} | {} | {} | {} | {} | {} |",
            chrono::Utc::now().format("%Y-%m-%d"),
            part,
            scale,
            r.plan.backend,
            r.plan.seed,
            r.wall_s,
            f.enqueued_ok,
            i.kills,
            i.exits,
            i.pauses,
            i.terms,
            i.db_restarts,
            i.proxy_resets + i.proxy_blackholes + i.proxy_latency + i.commit_replies_dropped as usize,
            i.commit_replies_dropped,
            i.clock_jumps,
            i.db_clock_steps,
            i.enqueuer.kills,
            i.enqueuer.lost_answers_present + i.enqueuer.lost_answers_absent,
            f.lost,
            f.concurrent_duplicates,
            f.unexplained_re_executions,
            f.illegal_transitions,
            f.stale_writes_accepted + r.stale_probes_accepted,
            if r.is_clean() { "green" } else { "RED" },
        )?;
    }
    Ok(())
}
