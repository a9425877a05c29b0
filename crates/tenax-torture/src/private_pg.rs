//! A private, throwaway PostgreSQL server: its own data directory, socket directory and
//! TCP port on 127.0.0.1 in a temporary directory — never a shared service — so that a
//! run may crash and restart it. Stopped and deleted on drop.
//!
//! Used by the torture runs and by the CLI's outage test.
//!
//! Server binaries: `TENAX_PG_BINDIR`, else the newest `/usr/lib/postgresql/<v>/bin`,
//! else `PATH`. PostgreSQL refuses to run as root, so under root every server tool runs
//! as the `postgres` OS user (`runuser -u postgres --`).
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};

const PG_USER: &str = "postgres";
const DATABASE: &str = "tenax";

/// A running private PostgreSQL server.
#[derive(Debug)]
pub struct PrivatePostgres {
    bindir: PathBuf,
    as_postgres: bool,
    port: u16,
    dir: tempfile::TempDir,
    running: bool,
    /// Set for the server process (a clock under libfaketime).
    env: Vec<(&'static str, std::ffi::OsString)>,
}

/// When an immediate-mode restart took the server down and brought it back.
#[derive(Debug, Clone, Copy)]
pub struct Restart {
    /// `pg_ctl stop -m immediate` returned: the server is gone.
    pub down_at: Instant,
    /// `pg_ctl start -w` returned: the server accepts connections again.
    pub up_at: Instant,
    /// `up_at` on the wall clock, to compare with database timestamps.
    pub up_wall: SystemTime,
}

impl Restart {
    /// How long the server was unreachable.
    pub fn outage(&self) -> Duration {
        self.up_at - self.down_at
    }
}

fn has_server_tools(dir: &Path) -> bool {
    ["initdb", "pg_ctl", "postgres"]
        .iter()
        .all(|tool| dir.join(tool).is_file())
}

/// Where the PostgreSQL server tools are, if anywhere.
pub fn find_bindir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("TENAX_PG_BINDIR") {
        let dir = PathBuf::from(dir);
        return has_server_tools(&dir).then_some(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let major = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            has_server_tools(&bin).then_some((major, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .find(|dir| has_server_tools(dir))
}

/// Whether this process runs as root.
pub fn running_as_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A port nobody listens on now.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A process output as text, for error messages.
pub fn describe(out: &Output) -> String {
    format!(
        "{}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    )
}

impl PrivatePostgres {
    /// Create and start a private server, with a database `tenax`.
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(false, Vec::new())
    }

    /// The same, on a clock the caller moves ([`DbClock`](crate::db_clock::DbClock)).
    pub fn start_with_clock(clock: &crate::db_clock::DbClock) -> anyhow::Result<Self> {
        Self::start_with(false, clock.env()?)
    }

    /// The same, serving TLS only: a self-signed certificate made with `openssl`, and
    /// plain TCP connections rejected.
    pub fn start_with_tls() -> anyhow::Result<Self> {
        Self::start_with(true, Vec::new())
    }

    fn start_with(tls: bool, env: Vec<(&'static str, std::ffi::OsString)>) -> anyhow::Result<Self> {
        let bindir = find_bindir().context("no PostgreSQL server binaries (initdb, pg_ctl)")?;
        let as_postgres = running_as_root();
        let dir = tempfile::Builder::new().prefix("tenax-pg-").tempdir()?;
        std::fs::create_dir(dir.path().join("sock"))?;
        if as_postgres {
            let chown = Command::new("chown")
                .arg("-R")
                .arg(format!("{PG_USER}:"))
                .arg(dir.path())
                .output()?;
            if !chown.status.success() {
                bail!("chown: {}", describe(&chown));
            }
        }
        let mut pg = Self {
            bindir,
            as_postgres,
            port: 0,
            dir,
            running: false,
            env,
        };
        let initdb = pg
            .tool("initdb")
            .arg("-D")
            .arg(pg.data_dir())
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C"])
            .arg("--no-sync")
            .output()?;
        if !initdb.status.success() {
            bail!("initdb: {}", describe(&initdb));
        }
        if tls {
            pg.make_tls_only()?;
        }
        let mut last = String::new();
        for _ in 0..5 {
            pg.port = free_port()?;
            match pg.pg_ctl_start() {
                Ok(()) => {
                    pg.running = true;
                    break;
                }
                Err(why) => last = why.to_string(),
            }
        }
        if !pg.running {
            bail!("cannot start PostgreSQL: {last}");
        }
        if pg.port == 5432 {
            bail!("picked the shared PostgreSQL port");
        }
        let createdb = Command::new(pg.bindir.join("createdb"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &pg.port.to_string(),
                "-U",
                "postgres",
            ])
            .arg(DATABASE)
            .output()?;
        if !createdb.status.success() {
            bail!("createdb: {}", describe(&createdb));
        }
        Ok(pg)
    }

    /// `postgres://postgres@127.0.0.1:PORT/tenax`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{DATABASE}", self.port)
    }

    /// The server's TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Crash the server (`pg_ctl stop -m immediate`: no checkpoint, every session cut),
    /// keep it down for `down_for`, start it again (crash recovery runs) and wait until
    /// it accepts connections.
    pub fn restart_immediate(&mut self, down_for: Duration) -> anyhow::Result<Restart> {
        let stop = self.pg_ctl_stop()?;
        if !stop.status.success() {
            bail!("pg_ctl stop: {}", describe(&stop));
        }
        self.running = false;
        let down_at = Instant::now();
        // The outage itself: an intended length, not a wait for a condition.
        std::thread::sleep(down_for);
        self.pg_ctl_start()?;
        self.running = true;
        Ok(Restart {
            down_at,
            up_at: Instant::now(),
            up_wall: SystemTime::now(),
        })
    }

    /// The server's log (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_file()).unwrap_or_default()
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    fn tool(&self, name: &str) -> Command {
        let mut command = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", PG_USER, "--"]).arg(self.bindir.join(name));
            c
        } else {
            Command::new(self.bindir.join(name))
        };
        command
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .env("LC_ALL", "C");
        command
    }

    /// A self-signed certificate, `ssl = on`, and a pg_hba.conf that accepts TCP
    /// connections only over TLS.
    fn make_tls_only(&self) -> anyhow::Result<()> {
        let data = self.data_dir();
        let openssl = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            ])
            .args(["-subj", "/CN=127.0.0.1"])
            .arg("-keyout")
            .arg(data.join("server.key"))
            .arg("-out")
            .arg(data.join("server.crt"))
            .stdin(Stdio::null())
            .output()
            .context("run openssl (needed for a TLS server)")?;
        if !openssl.status.success() {
            bail!("openssl: {}", describe(&openssl));
        }
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostnossl all all 0.0.0.0/0 reject\n",
        )?;
        let mut append = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))?;
        std::io::Write::write_all(&mut append, b"ssl = on\n")?;
        if self.as_postgres {
            let chown = Command::new("chown")
                .arg("-R")
                .arg(format!("{PG_USER}:"))
                .arg(&data)
                .output()?;
            if !chown.status.success() {
                bail!("chown: {}", describe(&chown));
            }
        }
        let chmod = Command::new("chmod")
            .arg("600")
            .arg(data.join("server.key"))
            .output()?;
        if !chmod.status.success() {
            bail!("chmod: {}", describe(&chmod));
        }
        Ok(())
    }

    fn pg_ctl_start(&self) -> anyhow::Result<()> {
        // fsync stays on: an immediate stop must be recovered from the WAL as written.
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c max_connections=200",
            self.port,
            self.dir.path().join("sock").display()
        );
        let out = self
            .tool("pg_ctl")
            .arg("-D")
            .arg(self.data_dir())
            .arg("-l")
            .arg(self.log_file())
            .args(["-w", "-t", "60", "-o", &options, "start"])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output()?;
        if out.status.success() {
            Ok(())
        } else {
            let log = std::fs::read_to_string(self.log_file()).unwrap_or_default();
            bail!("{}\nserver log:\n{log}", describe(&out))
        }
    }

    fn pg_ctl_stop(&self) -> anyhow::Result<Output> {
        Ok(self
            .tool("pg_ctl")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-m", "immediate", "-w", "-t", "60", "stop"])
            .output()?)
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        if self.running {
            let _ = self.pg_ctl_stop();
        }
    }
}
