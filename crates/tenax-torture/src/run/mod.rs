//! One torture run: a store, a fleet of worker processes, an enqueuer, a seeded fault
//! schedule, quiescence, then the checker and a JSON report.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tenax::storage::Storage;
use tenax::{Client, TaskStatus};

use crate::check::{check, Findings};
use crate::db_clock::DbClock;
use crate::enqueuer::{EnqueueFaults, Spec};
use crate::fleet::{rss_and_fds, Fleet, WorkerSpec};
use crate::ledger::Ledger;
use crate::private_mariadb::PrivateMariadb;
use crate::private_pg::PrivatePostgres;
use crate::proxy::FaultProxy;
use crate::worker::{Behaviour, TORTURE};

mod faults;

use faults::faults;

/// The store under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// A SQLite file in a temporary directory.
    Sqlite,
    /// A private PostgreSQL server.
    Postgres,
    /// A private MariaDB server.
    Mariadb,
}

/// What a run does. Every count may be zero.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// Scenario name (report file name).
    pub name: String,
    /// Store under test.
    pub backend: Backend,
    /// Seed of every random choice of the harness.
    pub seed: u64,
    /// Worker processes.
    pub workers: usize,
    /// Tasks run at once per worker.
    pub concurrency: u32,
    /// Lease length.
    pub lease_ms: u64,
    /// Tasks enqueued.
    pub tasks: usize,
    /// Enqueue pace (tasks per second; 0: all at once).
    pub enqueue_per_sec: u32,
    /// Handler time of ordinary tasks: U(0, this) ms.
    pub task_ms: u64,
    /// Per mille of flaky (fail twice), permanent and poison tasks.
    pub flaky_permille: u32,
    /// Per mille of permanently failing tasks.
    pub permanent_permille: u32,
    /// Per mille of poison tasks (they abort their worker).
    pub poison_permille: u32,
    /// Per mille of tasks delayed U(0.2, 2) s.
    pub delayed_permille: u32,
    /// SIGKILLs of random workers.
    pub kills: usize,
    /// Immediate-mode restarts of the database (PostgreSQL).
    pub db_restarts: usize,
    /// Connection faults through the proxy (reset, blackhole, latency, lost COMMIT reply).
    pub proxy_faults: usize,
    /// SIGSTOP of a worker past its lease, then SIGCONT.
    pub pauses: usize,
    /// SIGTERM of a worker (hand-back), then a replacement.
    pub terms: usize,
    /// SIGKILLs of the enqueuing client process within 3 ms after it sent a request
    /// (0: the harness enqueues in-process).
    pub enqueuer_kills: usize,
    /// Jumps of the workers' clocks during the run (with `skews`): a worker's offset
    /// changes at once to another value of `skews`.
    pub clock_jumps: usize,
    /// Steps of the database server's clock (a private server under libfaketime): the
    /// clock moves at once to the next offset of `db_offsets`, in turn.
    pub db_clock_steps: usize,
    /// The offsets from real time the database's clock steps to, in turn, e.g. `+1h`,
    /// `+0`, `+10m`: an hour forward, an hour back, ten minutes forward. After the last
    /// fault the clock steps to the largest of them, so that every task given a run
    /// time by a clock ahead is due before the run settles.
    pub db_offsets: Vec<String>,
    /// Pruner retention (soak), or no pruning.
    pub retention_ms: Option<u64>,
    /// Sample the first worker's RSS and descriptors, and the task count, every second.
    pub sample: bool,
    /// Write one stale completion behind the lease guard's back (checker self-test).
    pub inject_stale_completion: bool,
    /// Worker clock offsets under libfaketime (one per worker in turn), e.g. `+1h`.
    pub skews: Vec<String>,
    /// Where the report goes (default: [`report_dir`]).
    #[serde(skip)]
    pub report_dir: Option<PathBuf>,
}

impl Plan {
    /// A plan with the usual workload and no faults.
    pub fn new(name: &str, backend: Backend, seed: u64) -> Self {
        Self {
            name: name.to_owned(),
            backend,
            seed,
            workers: 3,
            concurrency: 4,
            lease_ms: 1000,
            tasks: 300,
            enqueue_per_sec: 0,
            task_ms: 200,
            flaky_permille: 50,
            permanent_permille: 30,
            poison_permille: 0,
            delayed_permille: 10,
            kills: 0,
            db_restarts: 0,
            proxy_faults: 0,
            pauses: 0,
            terms: 0,
            enqueuer_kills: 0,
            clock_jumps: 0,
            db_clock_steps: 0,
            db_offsets: Vec::new(),
            retention_ms: None,
            sample: false,
            inject_stale_completion: false,
            skews: Vec::new(),
            report_dir: None,
        }
    }
}

/// Faults injected, by kind.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Injected {
    /// SIGKILLs.
    pub kills: usize,
    /// Workers that died by themselves (poison pills).
    pub exits: usize,
    /// SIGSTOP/SIGCONT pauses.
    pub pauses: usize,
    /// SIGTERMs.
    pub terms: usize,
    /// SIGTERMed workers that did not exit cleanly within grace + 2 s.
    pub terms_unclean: usize,
    /// Database restarts.
    pub db_restarts: usize,
    /// Proxy resets.
    pub proxy_resets: usize,
    /// Proxy blackholes.
    pub proxy_blackholes: usize,
    /// Proxy latency spells.
    pub proxy_latency: usize,
    /// COMMIT replies dropped (ambiguous commits).
    pub commit_replies_dropped: u64,
    /// Stale completions tried through the store's API (all must be rejected).
    pub stale_probes: usize,
    /// Stale completions written behind the guard (self-test only).
    pub stale_injections: usize,
    /// Kills of the enqueuing client and how its lost answers were resolved.
    pub enqueuer: EnqueueFaults,
    /// Worker clock jumps.
    pub clock_jumps: usize,
    /// Steps of the database server's clock (the last one back to its largest offset
    /// included).
    pub db_clock_steps: usize,
}

/// One resource sample of the soak.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since the start.
    pub t_s: f64,
    /// Worker resident memory, KiB.
    pub rss_kib: u64,
    /// Worker open descriptors.
    pub fds: usize,
    /// Rows in the tasks table.
    pub tasks_rows: u64,
    /// Tasks finished so far (ledger effects).
    pub done: i64,
}

/// The JSON report of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The plan.
    pub plan: Plan,
    /// The ledger run id.
    pub run: String,
    /// The command that replays this run.
    pub replay: String,
    /// Wall time of the run, s.
    pub wall_s: f64,
    /// Faults injected.
    pub injected: Injected,
    /// Stale completions through the API that took effect (must be 0).
    pub stale_probes_accepted: usize,
    /// Worker exits with the ledger's "cannot record" code (the oracle went blind).
    pub ledger_failures: usize,
    /// What the checker found.
    pub findings: Findings,
    /// Soak samples.
    pub samples: Vec<Sample>,
}

impl Report {
    /// Zero violations, the oracle never blind, every stale probe rejected.
    pub fn is_clean(&self) -> bool {
        self.findings.is_clean()
            && self.stale_probes_accepted == 0
            && self.ledger_failures == 0
            && self.injected.terms_unclean == 0
    }

    /// One line of figures.
    pub fn summary(&self) -> String {
        let f = &self.findings;
        let i = &self.injected;
        format!(
            "{} [{:?}, seed {}] {:.1}s: tasks {} (+{} unknown), executions {}, re-executions {}; \
             faults: kills {}, exits {}, pauses {}, terms {} ({} unclean), db restarts {}, proxy resets {}, \
             blackholes {}, latency {}, lost COMMIT replies {}, clock jumps {}, database clock steps {}, enqueuer kills {} \
             (lost answers: {} present, {} absent and sent again), stale probes {}; \
             lost {}, concurrent duplicates {}, unexplained re-executions {}, illegal transitions {}, \
             stale writes accepted {}, early starts {}, poison dead after max {}/{}, paused overlaps {}, \
             paused executions fenced {}/{}, ledger failures {}",
            self.plan.name,
            self.plan.backend,
            self.plan.seed,
            self.wall_s,
            f.enqueued_ok,
            f.enqueued_unknown,
            f.executions,
            f.re_executions,
            i.kills,
            i.exits,
            i.pauses,
            i.terms,
            i.terms_unclean,
            i.db_restarts,
            i.proxy_resets,
            i.proxy_blackholes,
            i.proxy_latency,
            i.commit_replies_dropped,
            i.clock_jumps,
            i.db_clock_steps,
            i.enqueuer.kills,
            i.enqueuer.lost_answers_present,
            i.enqueuer.lost_answers_absent,
            i.stale_probes,
            f.lost,
            f.concurrent_duplicates,
            f.unexplained_re_executions,
            f.illegal_transitions,
            f.stale_writes_accepted + self.stale_probes_accepted,
            f.early_starts,
            f.poison_dead_after_max,
            f.poison_tasks,
            f.paused_overlaps,
            f.paused_executions_fenced,
            f.paused_executions,
            self.ledger_failures,
        )
    }
}

/// Where the ledger lives: `TENAX_TORTURE_LEDGER_URL`, else `TENAX_TEST_POSTGRES_URL`.
pub fn ledger_url() -> Option<String> {
    std::env::var("TENAX_TORTURE_LEDGER_URL")
        .or_else(|_| std::env::var("TENAX_TEST_POSTGRES_URL"))
        .ok()
}

/// `TENAX_TORTURE_REPORT_DIR`, else `$CARGO_TARGET_DIR/torture`, else `target/torture`.
pub fn report_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TENAX_TORTURE_REPORT_DIR") {
        return dir.into();
    }
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"))
        .join("torture")
}

/// A seed: `TENAX_SEED` when set, else fresh.
pub fn seed_from_env() -> u64 {
    std::env::var("TENAX_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random)
}

fn behaviour(plan: &Plan, rng: &mut StdRng) -> Behaviour {
    let roll = rng.random_range(0..1000);
    let ms = rng.random_range(0..=plan.task_ms);
    let mut edge = plan.poison_permille;
    if roll < edge {
        return Behaviour::Poison;
    }
    edge += plan.permanent_permille;
    if roll < edge {
        return Behaviour::Permanent;
    }
    edge += plan.flaky_permille;
    if roll < edge {
        return Behaviour::Flaky { fails: 2, ms };
    }
    Behaviour::Ok { ms }
}

struct Store {
    direct_url: String,
    _dir: Option<tempfile::TempDir>,
    pg: Option<PrivatePostgres>,
    mariadb: Option<PrivateMariadb>,
    /// The server's clock, when it may be stepped.
    clock: Option<DbClock>,
}

/// The store of `plan`: a private server on a clock of its own when its clock steps.
fn open_store(plan: &Plan) -> anyhow::Result<Store> {
    if plan.db_clock_steps > 0 {
        let clock = DbClock::new()?;
        let (pg, mariadb) = match plan.backend {
            Backend::Postgres => (Some(PrivatePostgres::start_with_clock(&clock)?), None),
            Backend::Mariadb => (None, Some(PrivateMariadb::start_with_clock(&clock)?)),
            Backend::Sqlite => anyhow::bail!("database clock steps need a database server"),
        };
        let direct_url = match (&pg, &mariadb) {
            (Some(pg), _) => pg.url(),
            (_, Some(db)) => db.url(),
            _ => unreachable!("one server was started above"),
        };
        return Ok(Store {
            direct_url,
            _dir: None,
            pg,
            mariadb,
            clock: Some(clock),
        });
    }
    Ok(match plan.backend {
        Backend::Sqlite => {
            let dir = tempfile::Builder::new()
                .prefix("tenax-torture-")
                .tempdir()?;
            Store {
                direct_url: format!("sqlite://{}", dir.path().join("tenax.db").display()),
                _dir: Some(dir),
                pg: None,
                mariadb: None,
                clock: None,
            }
        }
        Backend::Postgres => {
            let pg = PrivatePostgres::start()?;
            Store {
                direct_url: pg.url(),
                _dir: None,
                pg: Some(pg),
                mariadb: None,
                clock: None,
            }
        }
        Backend::Mariadb => {
            let db = PrivateMariadb::start()?;
            Store {
                direct_url: db.url(),
                _dir: None,
                pg: None,
                mariadb: Some(db),
                clock: None,
            }
        }
    })
}

/// Run a plan with the worker binary `program`; the ledger at `ledger_url`.
pub async fn run(plan: Plan, program: PathBuf, ledger_url: &str) -> anyhow::Result<Report> {
    let started = Instant::now();
    let nanos = chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0);
    let reports = plan.report_dir.clone().unwrap_or_else(report_dir);
    let run_id = format!("{}-{}-{}", plan.name, plan.seed, nanos);
    println!(
        "torture: {} on {:?}, seed {} (replay: TENAX_SEED={} or --seed {})",
        plan.name, plan.backend, plan.seed, plan.seed, plan.seed
    );
    let ledger = Ledger::open(ledger_url, &run_id).await?;
    let mut store = open_store(&plan)?;
    let storage = tenax::storage::connect(&store.direct_url).await?;
    let client = Client::new(storage.clone());
    let proxy = if plan.proxy_faults > 0 {
        let port = match (&store.pg, &store.mariadb) {
            (Some(pg), _) => pg.port(),
            (_, Some(db)) => db.port(),
            _ => anyhow::bail!("proxy faults need a database server"),
        };
        Some(FaultProxy::start(([127, 0, 0, 1], port).into()).await?)
    } else {
        None
    };
    let worker_url = match (&proxy, plan.backend) {
        (Some(p), Backend::Mariadb) => format!("mysql://root@{}/tenax", p.addr()),
        (Some(p), _) => format!("postgres://postgres@{}/tenax", p.addr()),
        (None, _) => store.direct_url.clone(),
    };
    let mut fleet = Fleet::start(
        WorkerSpec {
            program: program.clone(),
            database_url: worker_url,
            ledger_url: ledger_url.to_owned(),
            run: run_id.clone(),
            lease_ms: plan.lease_ms,
            concurrency: plan.concurrency,
            retention_ms: plan.retention_ms,
            grace_ms: 300,
            log_dir: reports.join("logs").join(&run_id),
            skews: plan.skews.clone(),
        },
        plan.workers,
    )?;

    let mut rng = StdRng::seed_from_u64(plan.seed);
    let behaviours: Vec<(Behaviour, Option<Duration>)> = (0..plan.tasks)
        .map(|_| {
            let b = behaviour(&plan, &mut rng);
            let delayed = rng.random_range(0..1000) < plan.delayed_permille;
            (
                b,
                delayed.then(|| Duration::from_millis(rng.random_range(200..2000))),
            )
        })
        .collect();
    let enqueuer = if plan.enqueuer_kills > 0 {
        let specs: Vec<(Spec, &'static str)> = behaviours
            .iter()
            .enumerate()
            .map(|(n, (behaviour, delay))| {
                let spec = Spec {
                    task_no: format!("{run_id}-{n:06}"),
                    payload: serde_json::to_value(behaviour)?,
                    max_attempts: if *behaviour == Behaviour::Poison {
                        3
                    } else {
                        5
                    },
                    delay_ms: delay.map(|d| d.as_millis() as u64),
                };
                Ok((spec, behaviour.name()))
            })
            .collect::<anyhow::Result<_>>()?;
        let (program, url, storage, ledger) = (
            program.clone(),
            store.direct_url.clone(),
            storage.clone(),
            ledger.clone(),
        );
        let (per_sec, kills, seed) = (plan.enqueue_per_sec, plan.enqueuer_kills, plan.seed);
        let log_dir = reports.join("logs").join(&run_id);
        tokio::spawn(async move {
            crate::enqueuer::drive(
                &program, &url, &storage, &ledger, specs, per_sec, kills, seed, &log_dir,
            )
            .await
        })
    } else {
        let (client, ledger, run_id) = (client.clone(), ledger.clone(), run_id.clone());
        let per_sec = plan.enqueue_per_sec;
        tokio::spawn(async move {
            enqueue_all(client, ledger, run_id, behaviours, per_sec).await?;
            Ok(EnqueueFaults::default())
        })
    };

    let mut injected = Injected::default();
    let mut stale_accepted = 0;
    let mut samples = Vec::new();
    faults(
        &plan,
        &mut rng,
        &mut fleet,
        &ledger,
        &storage,
        &mut store,
        proxy.as_ref(),
        &mut injected,
        &mut stale_accepted,
    )
    .await?;

    // Quiescence: every enqueue answered, nothing left to run. The enqueuer may still be
    // pacing its tasks when the faults end: the settling time counts from its end.
    let settle_for = Duration::from_secs(120 + plan.tasks as u64 / 50);
    let enqueue_for = match plan.enqueue_per_sec {
        0 => Duration::ZERO,
        per_sec => Duration::from_secs(plan.tasks as u64 / u64::from(per_sec)),
    };
    // A stalled enqueuer is bounded too: three times its paced length.
    let mut settle_deadline = Instant::now() + enqueue_for * 3 + settle_for;
    let mut enqueuer = Some(enqueuer);
    let mut last_sample = Instant::now() - Duration::from_secs(1);
    loop {
        if plan.sample && last_sample.elapsed() >= Duration::from_secs(1) {
            last_sample = Instant::now();
            if let Some(sample) = sample(&fleet, &storage, &ledger, started).await {
                samples.push(sample);
            }
        }
        injected.exits += fleet.supervise(&ledger).await?;
        if enqueuer.as_ref().is_some_and(|e| e.is_finished()) {
            if let Some(e) = enqueuer.take() {
                injected.enqueuer = e.await??;
                settle_deadline = settle_deadline.min(Instant::now() + settle_for);
            }
        }
        if enqueuer.is_none() && settled(&storage).await {
            break;
        }
        if Instant::now() > settle_deadline {
            println!("torture: not settled by the deadline; checking anyway");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fleet.stop(&ledger).await?;
    injected.exits = fleet.exits.len();
    if let Some(p) = &proxy {
        injected.commit_replies_dropped = p.commits_cut();
    }
    let findings = check(&ledger, &storage).await?;
    let report = Report {
        replay: format!(
            "cargo run -p tenax-torture -- run --scenario {} --backend {} --seed {}",
            plan.name,
            match plan.backend {
                Backend::Sqlite => "sqlite",
                Backend::Postgres => "postgres",
                Backend::Mariadb => "mariadb",
            },
            plan.seed
        ),
        plan,
        run: run_id,
        wall_s: started.elapsed().as_secs_f64(),
        injected,
        stale_probes_accepted: stale_accepted,
        ledger_failures: fleet.ledger_failures,
        findings,
        samples,
    };
    std::fs::create_dir_all(&reports)?;
    let path = reports.join(format!("{}-{}.json", report.plan.name, report.plan.seed));
    std::fs::write(&path, serde_json::to_vec_pretty(&report)?)?;
    println!("torture: {}", report.summary());
    println!("torture: report {}", path.display());
    Ok(report)
}

async fn settled(storage: &Arc<dyn Storage>) -> bool {
    match storage.stats().await {
        Ok(stats) => stats.by_status.iter().all(|(status, n)| {
            *n == 0
                || matches!(
                    status,
                    TaskStatus::Succeeded | TaskStatus::Dead | TaskStatus::Cancelled
                )
        }),
        Err(_) => false,
    }
}

async fn sample(
    fleet: &Fleet,
    storage: &Arc<dyn Storage>,
    ledger: &Ledger,
    started: Instant,
) -> Option<Sample> {
    let pid = *fleet.pids().first()?;
    let (rss_kib, fds) = rss_and_fds(pid)?;
    let stats = storage.stats().await.ok()?;
    let (done, _) = ledger.effect_counts().await.ok()?;
    Some(Sample {
        t_s: started.elapsed().as_secs_f64(),
        rss_kib,
        fds,
        tasks_rows: stats.by_status.iter().map(|(_, n)| n).sum(),
        done,
    })
}

async fn enqueue_all(
    client: Client,
    ledger: Ledger,
    run: String,
    behaviours: Vec<(Behaviour, Option<Duration>)>,
    per_sec: u32,
) -> anyhow::Result<()> {
    let pace = (per_sec > 0).then(|| Duration::from_secs(1) / per_sec);
    for (n, (behaviour, delay)) in behaviours.into_iter().enumerate() {
        let task_no = format!("{run}-{n:06}");
        ledger
            .enqueue_log(&task_no, behaviour.name(), "invoke", None)
            .await?;
        let payload = serde_json::to_value(behaviour)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        // An error leaves the outcome unknown ("info"); the same task number is sent
        // again until it is acknowledged: enqueue is idempotent by task number.
        let state = loop {
            let mut enqueue = client
                .enqueue_raw(TORTURE, &payload)
                .task_no(task_no.clone())
                .max_attempts(if behaviour == Behaviour::Poison { 3 } else { 5 });
            if let Some(d) = delay {
                enqueue = enqueue.run_in(d);
            }
            match enqueue.await {
                // The run time it was given, unless a claim may have moved it since (a
                // repeat after an unknown answer).
                Ok(inserted) => {
                    let run_at = (inserted.task.attempt == 0)
                        .then(|| inserted.task.run_at.timestamp_micros());
                    break ("ok", run_at);
                }
                Err(_) if Instant::now() < deadline => {
                    ledger
                        .enqueue_log(&task_no, behaviour.name(), "info", None)
                        .await?;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(_) => break ("info", None),
            }
        };
        let (state, run_at) = state;
        ledger
            .enqueue_log(&task_no, behaviour.name(), state, run_at)
            .await?;
        if let Some(pace) = pace {
            tokio::time::sleep(pace).await;
        }
    }
    Ok(())
}
