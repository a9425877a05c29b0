//! The worker processes of a run: started, killed, paused, stopped and replaced.
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::db_clock::{faketime_env, write_offset};
use crate::ledger::Ledger;

/// How to start one torture worker process.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// The `tenax-torture` binary.
    pub program: PathBuf,
    /// Store URL the worker uses (maybe through the proxy).
    pub database_url: String,
    /// Ledger URL.
    pub ledger_url: String,
    /// Run id.
    pub run: String,
    /// Lease length.
    pub lease_ms: u64,
    /// Concurrency.
    pub concurrency: u32,
    /// Pruner retention, if on.
    pub retention_ms: Option<u64>,
    /// Shutdown grace.
    pub grace_ms: u64,
    /// Each worker's standard error goes to `<log_dir>/worker-<n>.log`.
    pub log_dir: PathBuf,
    /// Clock offsets (libfaketime values such as `+1h`), one per worker in turn; none
    /// when empty. Each worker reads its offset from its own file
    /// (`FAKETIME_TIMESTAMP_FILE`, re-read at every clock call), so that
    /// [`Fleet::jump_clock`] can move its clock while it runs. Monotonic time is left
    /// alone.
    pub skews: Vec<String>,
}

/// Where libfaketime is, if installed (`TENAX_LIBFAKETIME`, else Debian's path).
///
/// The thread-safe build (`libfaketimeMT`, which Debian's package ships beside the
/// plain one) is the one used: with the offset re-read at every clock call, the plain
/// build sometimes answers the real time to one thread while another re-reads the file. A threaded
/// server (MariaDB) then flickers back to the real clock for a statement, a second
/// after a step: a claim grants a lease already expired by the stepped clock, and the
/// reaper rightly takes it. No real clock does that, so the harness must not.
pub fn libfaketime() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TENAX_LIBFAKETIME") {
        return Some(PathBuf::from(path)).filter(|p| p.is_file());
    }
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.is_file())
}

/// An exit the watcher saw: pid, when (µs since the Unix epoch, this host's clock, which
/// the ledger server on the same host shares), and the status.
type Exit = (u32, i64, std::process::ExitStatus);

/// The live workers. A watcher thread reaps any worker that ends by itself within 10 ms
/// and notes when, so that its executions end at its death, not at the next look.
#[derive(Debug)]
pub struct Fleet {
    spec: WorkerSpec,
    children: Arc<Mutex<Vec<Child>>>,
    exited: Arc<Mutex<Vec<Exit>>>,
    stop_watch: Arc<AtomicBool>,
    spawned: usize,
    /// Each worker's spawn number (its log and clock file), by pid.
    numbers: Mutex<std::collections::HashMap<u32, usize>>,
    /// Processes that ended by themselves: `(pid, status)`.
    pub exits: Vec<(u32, String)>,
    /// Exits with the ledger's "cannot record" code: the oracle was blind.
    pub ledger_failures: usize,
}

/// Run `kill -<signal> <pid>` (no unsafe code, no libc).
pub fn signal(pid: u32, signal: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "kill -{signal} {pid} failed");
    Ok(())
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Fleet {
    /// Start `n` workers.
    pub fn start(spec: WorkerSpec, n: usize) -> anyhow::Result<Self> {
        let mut fleet = Self {
            spec,
            children: Arc::default(),
            exited: Arc::default(),
            stop_watch: Arc::default(),
            spawned: 0,
            numbers: Mutex::default(),
            exits: Vec::new(),
            ledger_failures: 0,
        };
        for _ in 0..n {
            fleet.spawn()?;
        }
        let (children, exited, stop) = (
            fleet.children.clone(),
            fleet.exited.clone(),
            fleet.stop_watch.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                {
                    let mut live = lock(&children);
                    let mut i = 0;
                    while i < live.len() {
                        match live[i].try_wait() {
                            Ok(Some(status)) => {
                                let mut done = live.swap_remove(i);
                                // Already reaped by `try_wait`: returns at once.
                                let _ = done.wait();
                                lock(&exited).push((done.id(), now_us(), status));
                            }
                            _ => i += 1,
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Ok(fleet)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let s = &self.spec;
        let mut command = Command::new(&s.program);
        command
            .arg("worker")
            .args(["--database-url", &s.database_url])
            .args(["--ledger-url", &s.ledger_url])
            .args(["--run", &s.run])
            .args(["--lease-ms", &s.lease_ms.to_string()])
            .args(["--concurrency", &s.concurrency.to_string()])
            .args(["--grace-ms", &s.grace_ms.to_string()]);
        if let Some(ms) = s.retention_ms {
            command.args(["--retention-ms", &ms.to_string()]);
        }
        std::fs::create_dir_all(&s.log_dir)?;
        if !s.skews.is_empty() {
            let clock = s.log_dir.join(format!("clock-{}", self.spawned));
            write_offset(&clock, &s.skews[self.spawned % s.skews.len()])?;
            command.envs(faketime_env(&clock)?);
        }
        let log = std::fs::File::create(s.log_dir.join(format!("worker-{}.log", self.spawned)))?;
        self.spawned += 1;
        let child = command
            // The reaper's passes too: a finding can then tell who took a lease, and when.
            // TENAX_TORTURE_WORKER_LOG replaces the filter (`debug` for every claim and
            // renewal).
            .env(
                "RUST_LOG",
                std::env::var("TENAX_TORTURE_WORKER_LOG")
                    .unwrap_or_else(|_| "warn,tenax_runtime::maintenance=info".to_owned()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        lock(&self.numbers).insert(child.id(), self.spawned - 1);
        lock(&self.children).push(child);
        Ok(())
    }

    /// Pids of the live workers.
    pub fn pids(&self) -> Vec<u32> {
        lock(&self.children).iter().map(Child::id).collect()
    }

    /// Take worker `index % len` out of the watched set (the harness ends it itself).
    fn take(&self, index: usize) -> Option<Child> {
        let mut live = lock(&self.children);
        if live.is_empty() {
            return None;
        }
        let i = index % live.len();
        Some(live.swap_remove(i))
    }

    /// Log every worker that ended by itself (a poison pill, a crash) as a fault at the
    /// time it died, and replace it. Returns how many were replaced.
    pub async fn supervise(&mut self, ledger: &Ledger) -> anyhow::Result<usize> {
        let exited: Vec<Exit> = std::mem::take(&mut *lock(&self.exited));
        for (pid, at_us, status) in &exited {
            if status.code() == Some(70) {
                self.ledger_failures += 1;
            }
            ledger
                .fault_at("exit", Some(*pid), &format!("{status}"), *at_us)
                .await?;
            self.exits.push((*pid, status.to_string()));
            self.spawn()?;
        }
        Ok(exited.len())
    }

    /// SIGKILL worker `index % len` and start a replacement; the kill is logged.
    pub async fn kill9(&mut self, index: usize, ledger: &Ledger) -> anyhow::Result<Option<u32>> {
        let Some(mut child) = self.take(index) else {
            return Ok(None);
        };
        let pid = child.id();
        let killed = child.kill();
        child.wait()?;
        killed?;
        ledger.fault("kill", Some(pid), "SIGKILL").await?;
        self.spawn()?;
        Ok(Some(pid))
    }

    /// Move the clock of worker `index % len` at once to `offset` (a libfaketime offset
    /// such as `-1h`); logged as a fault of that worker. `None` without live workers.
    pub async fn jump_clock(
        &mut self,
        index: usize,
        offset: &str,
        ledger: &Ledger,
    ) -> anyhow::Result<Option<u32>> {
        let (pid, nth) = {
            let live = lock(&self.children);
            if live.is_empty() {
                return Ok(None);
            }
            let pid = live[index % live.len()].id();
            (pid, lock(&self.numbers).get(&pid).copied())
        };
        let Some(nth) = nth else {
            return Ok(None);
        };
        write_offset(&self.spec.log_dir.join(format!("clock-{nth}")), offset)?;
        ledger
            .fault("clock_jump", Some(pid), &format!("clock now {offset}"))
            .await?;
        Ok(Some(pid))
    }

    /// SIGSTOP worker `index % len` for `pause`, then SIGCONT; logged with its span.
    pub async fn pause(
        &mut self,
        index: usize,
        pause: Duration,
        ledger: &Ledger,
    ) -> anyhow::Result<Option<u32>> {
        let pid = {
            let live = lock(&self.children);
            if live.is_empty() {
                return Ok(None);
            }
            live[index % live.len()].id()
        };
        let fault = ledger.fault("pause", Some(pid), "SIGSTOP").await?;
        signal(pid, "STOP")?;
        tokio::time::sleep(pause).await;
        // It may have died meanwhile (a poison pill in its queue before the stop).
        let _ = signal(pid, "CONT");
        ledger.fault_end(fault).await?;
        Ok(Some(pid))
    }

    /// SIGTERM worker `index % len`, wait for it to exit (within grace + `slack`), and
    /// start a replacement. Returns the pid and whether it exited cleanly in time.
    pub async fn terminate(
        &mut self,
        index: usize,
        slack: Duration,
        ledger: &Ledger,
    ) -> anyhow::Result<Option<(u32, bool)>> {
        let Some(mut child) = self.take(index) else {
            return Ok(None);
        };
        let pid = child.id();
        // A hand-back can only be asked of a worker that listens for SIGTERM; one that
        // has not started listening yet dies by the signal's default action, which
        // would test nothing of Tenax. Wait (bounded) until the kernel shows the handler.
        let listening_by = Instant::now() + Duration::from_secs(10);
        while !catches_sigterm(pid) && Instant::now() < listening_by {
            if child.try_wait()?.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let Err(e) = signal(pid, "TERM") {
            let _ = child.kill();
            child.wait()?;
            return Err(e);
        }
        let fault = ledger.fault("term", Some(pid), "SIGTERM").await;
        let deadline = Instant::now() + Duration::from_millis(self.spec.grace_ms) + slack;
        let clean = loop {
            if let Some(status) = child.try_wait()? {
                break status.success();
            }
            if Instant::now() > deadline {
                child.kill()?;
                child.wait()?;
                break false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        ledger.fault_end(fault?).await?;
        self.spawn()?;
        Ok(Some((pid, clean)))
    }

    /// Stop every worker with SIGTERM (SIGKILL after a deadline).
    pub async fn stop(&mut self, ledger: &Ledger) -> anyhow::Result<()> {
        self.stop_watch.store(true, Ordering::SeqCst);
        let children: Vec<Child> = std::mem::take(&mut *lock(&self.children));
        for child in &children {
            let _ = signal(child.id(), "TERM");
        }
        let deadline = Instant::now() + Duration::from_millis(self.spec.grace_ms + 5000);
        for mut child in children {
            loop {
                if child.try_wait()?.is_some() {
                    break;
                }
                if Instant::now() > deadline {
                    child.kill()?;
                    child.wait()?;
                    ledger
                        .fault("kill", Some(child.id()), "stop deadline")
                        .await?;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        Ok(())
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop_watch.store(true, Ordering::SeqCst);
        for child in lock(&self.children).iter_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Resident memory (KiB) and open descriptors of a process, from `/proc`.
pub fn rss_and_fds(pid: u32) -> Option<(u64, usize)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    Some((rss, fds))
}

/// Whether process `pid` has a handler for SIGTERM (bit 15 of `SigCgt` in
/// `/proc/<pid>/status`).
fn catches_sigterm(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("SigCgt:"))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        })
        .is_some_and(|mask| mask & (1 << (15 - 1)) != 0)
}
