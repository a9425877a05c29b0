//! The worker processes of a run: started, killed, paused, stopped and replaced.
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
    /// Clock offsets (libfaketime `FAKETIME` values such as `+1h`), one per worker in
    /// turn; none when empty. Monotonic time is left alone.
    pub skews: Vec<String>,
}

/// Where libfaketime is, if installed (`TENAX_LIBFAKETIME`, else Debian's path).
pub fn libfaketime() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TENAX_LIBFAKETIME") {
        return Some(PathBuf::from(path)).filter(|p| p.is_file());
    }
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.is_file())
}

/// The live workers.
#[derive(Debug)]
pub struct Fleet {
    spec: WorkerSpec,
    children: Vec<Child>,
    spawned: usize,
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

impl Fleet {
    /// Start `n` workers.
    pub fn start(spec: WorkerSpec, n: usize) -> anyhow::Result<Self> {
        let mut fleet = Self {
            spec,
            children: Vec::new(),
            spawned: 0,
            exits: Vec::new(),
            ledger_failures: 0,
        };
        for _ in 0..n {
            fleet.spawn()?;
        }
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
        if !s.skews.is_empty() {
            let lib =
                libfaketime().ok_or_else(|| anyhow::anyhow!("libfaketime is not installed"))?;
            command
                .env("LD_PRELOAD", lib)
                .env("FAKETIME", &s.skews[self.spawned % s.skews.len()])
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .env("FAKETIME_NO_CACHE", "1");
        }
        std::fs::create_dir_all(&s.log_dir)?;
        let log = std::fs::File::create(s.log_dir.join(format!("worker-{}.log", self.spawned)))?;
        self.spawned += 1;
        let child = command
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        self.children.push(child);
        Ok(())
    }

    /// Pids of the live workers.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// Replace every worker that ended by itself (a poison pill, a crash), logging each
    /// exit as a fault. Returns how many were replaced.
    pub async fn supervise(&mut self, ledger: &Ledger) -> anyhow::Result<usize> {
        let mut replaced = 0;
        let mut i = 0;
        while i < self.children.len() {
            if let Some(status) = self.children[i].try_wait()? {
                let mut done = self.children.swap_remove(i);
                let pid = done.id();
                // Already reaped by `try_wait`; this returns the same status at once.
                done.wait()?;
                if status.code() == Some(70) {
                    self.ledger_failures += 1;
                }
                ledger
                    .fault("exit", Some(pid), &format!("{status}"))
                    .await?;
                self.exits.push((pid, status.to_string()));
                self.spawn()?;
                replaced += 1;
            } else {
                i += 1;
            }
        }
        Ok(replaced)
    }

    /// SIGKILL worker `index % len` and start a replacement; the kill is logged.
    pub async fn kill9(&mut self, index: usize, ledger: &Ledger) -> anyhow::Result<u32> {
        let i = index % self.children.len().max(1);
        let mut child = self.children.swap_remove(i);
        let pid = child.id();
        let killed = child.kill();
        child.wait()?;
        killed?;
        ledger.fault("kill", Some(pid), "SIGKILL").await?;
        self.spawn()?;
        Ok(pid)
    }

    /// SIGSTOP worker `index % len` for `pause`, then SIGCONT; logged with its span.
    pub async fn pause(
        &mut self,
        index: usize,
        pause: Duration,
        ledger: &Ledger,
    ) -> anyhow::Result<u32> {
        let i = index % self.children.len().max(1);
        let pid = self.children[i].id();
        let fault = ledger.fault("pause", Some(pid), "SIGSTOP").await?;
        signal(pid, "STOP")?;
        tokio::time::sleep(pause).await;
        signal(pid, "CONT")?;
        ledger.fault_end(fault).await?;
        Ok(pid)
    }

    /// SIGTERM worker `index % len`, wait for it to exit (within grace + `slack`), and
    /// start a replacement. Returns the pid and whether it exited cleanly in time.
    pub async fn terminate(
        &mut self,
        index: usize,
        slack: Duration,
        ledger: &Ledger,
    ) -> anyhow::Result<(u32, bool)> {
        let i = index % self.children.len().max(1);
        let pid = self.children[i].id();
        let fault = ledger.fault("term", Some(pid), "SIGTERM").await?;
        let mut child = self.children.swap_remove(i);
        if let Err(e) = signal(pid, "TERM") {
            let _ = child.kill();
            child.wait()?;
            return Err(e);
        }
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
        ledger.fault_end(fault).await?;
        self.spawn()?;
        Ok((pid, clean))
    }

    /// Stop every worker with SIGTERM (SIGKILL after a deadline); logged as `term`.
    pub async fn stop(&mut self, ledger: &Ledger) -> anyhow::Result<()> {
        for child in &self.children {
            let _ = signal(child.id(), "TERM");
        }
        let deadline = Instant::now() + Duration::from_millis(self.spec.grace_ms + 5000);
        for mut child in self.children.drain(..) {
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
        for child in &mut self.children {
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
