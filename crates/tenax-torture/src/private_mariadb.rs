//! A private, throwaway MariaDB server: `mariadb-install-db` into a temporary data
//! directory, then `mariadbd` on its own port and socket — never a shared service — so
//! that a run may SIGKILL it and start it again. Killed and deleted on drop.
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::private_pg::{describe, free_port, running_as_root};

/// A running private MariaDB server with a database `tenax`.
#[derive(Debug)]
pub struct PrivateMariadb {
    port: u16,
    dir: tempfile::TempDir,
    server: Option<Child>,
    binlog: bool,
    /// Set for the server process (a clock under libfaketime).
    env: Vec<(&'static str, std::ffi::OsString)>,
}

/// Whether the MariaDB server tools are installed.
pub fn available() -> bool {
    ["mariadbd", "mariadb-install-db", "mariadb"]
        .iter()
        .all(|tool| {
            Command::new("sh")
                .args([
                    "-c",
                    &format!("command -v {tool} || test -x /usr/sbin/{tool}"),
                ])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

fn server_binary() -> PathBuf {
    let sbin = PathBuf::from("/usr/sbin/mariadbd");
    if sbin.is_file() {
        sbin
    } else {
        PathBuf::from("mariadbd")
    }
}

impl PrivateMariadb {
    /// Create and start a private server.
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(false, Vec::new())
    }

    /// The same, on a clock the caller moves ([`DbClock`](crate::db_clock::DbClock)).
    pub fn start_with_clock(clock: &crate::db_clock::DbClock) -> anyhow::Result<Self> {
        Self::start_with(false, clock.env()?)
    }

    /// Create and start a private server with binary logging on (as a replicated
    /// production server has it), which changes who may create triggers.
    pub fn start_with_binlog() -> anyhow::Result<Self> {
        Self::start_with(true, Vec::new())
    }

    fn start_with(
        binlog: bool,
        env: Vec<(&'static str, std::ffi::OsString)>,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("tenax-mariadb-")
            .tempdir()?;
        let user = if running_as_root() {
            "root".to_owned()
        } else {
            std::env::var("USER").unwrap_or_else(|_| "nobody".into())
        };
        // A temporary directory of its own: a starting server deletes every `#sql*`
        // file in its tmpdir, so servers sharing /tmp delete each other's temporary
        // tables (and a bootstrap fails with "Unknown table").
        std::fs::create_dir(dir.path().join("tmp"))?;
        let install = Command::new("mariadb-install-db")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.path().join("data").display()))
            .arg(format!("--tmpdir={}", dir.path().join("tmp").display()))
            .arg(format!("--user={user}"))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .stdin(Stdio::null())
            .output()
            .context("run mariadb-install-db")?;
        if !install.status.success() {
            bail!("mariadb-install-db: {}", describe(&install));
        }
        let mut db = Self {
            port: free_port()?,
            dir,
            server: None,
            binlog,
            env,
        };
        // A free port can be taken by another server before this one binds it: then
        // it exits, and starts again on another.
        let mut tries = 0;
        loop {
            match db.launch() {
                Ok(()) => return Ok(db),
                Err(e)
                    if tries < 2
                        && db
                            .server
                            .as_mut()
                            .is_some_and(|s| s.try_wait().is_ok_and(|w| w.is_some())) =>
                {
                    tries += 1;
                    tracing::warn!(port = db.port, error = %e, "private MariaDB did not start; another port");
                    db.port = free_port()?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn launch(&mut self) -> anyhow::Result<()> {
        let d = self.dir.path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("server.log"))?;
        let mut command = Command::new(server_binary());
        command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", d.join("data").display()))
            .arg(format!("--socket={}", d.join("sock").display()))
            .arg(format!("--tmpdir={}", d.join("tmp").display()))
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .arg(if self.binlog {
                format!("--log-bin={}", d.join("binlog").display())
            } else {
                "--skip-log-bin".to_owned()
            })
            .args([
                "--innodb-buffer-pool-size=32M",
                "--innodb-flush-log-at-trx-commit=1",
            ]);
        if running_as_root() {
            command.arg("--user=root");
        }
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        self.server = Some(
            command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .context("start mariadbd")?,
        );
        // Ready when it answers on its own socket (another server may hold the TCP port
        // if this one lost the race for it: then this one exits, and is told so); the
        // same call creates the database (idempotent).
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(server) = self.server.as_mut() {
                if let Some(status) = server.try_wait()? {
                    let log = std::fs::read_to_string(d.join("server.log")).unwrap_or_default();
                    bail!("mariadbd on port {} exited ({status}):\n{log}", self.port);
                }
            }
            let out = Command::new("mariadb")
                .arg(format!("--socket={}", d.join("sock").display()))
                .args(["-u", "root"])
                .args(["-e", "CREATE DATABASE IF NOT EXISTS tenax"])
                .stdin(Stdio::null())
                .output()?;
            if out.status.success() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(d.join("server.log")).unwrap_or_default();
                bail!("MariaDB did not come up: {}\n{log}", describe(&out));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The server's TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mysql://root@127.0.0.1:PORT/tenax`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/tenax", self.port)
    }

    /// SIGKILL the server (InnoDB crash recovery on the next start), keep it down for
    /// `down_for`, start it again and wait until it answers.
    pub fn kill_restart(&mut self, down_for: Duration) -> anyhow::Result<()> {
        if let Some(mut server) = self.server.take() {
            let killed = server.kill();
            server.wait()?;
            killed?;
        }
        // The outage itself: an intended length, not a wait for a condition.
        std::thread::sleep(down_for);
        self.launch()
    }
}

impl Drop for PrivateMariadb {
    fn drop(&mut self) {
        if let Some(mut server) = self.server.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
    }
}
