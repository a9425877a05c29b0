//! A private, throwaway PostgreSQL server for tests: its own data directory, socket
//! directory and TCP port on 127.0.0.1 inside a temporary directory — never the shared
//! service on 5432 — stopped and deleted on drop.
//!
//! The server binaries are found in `TENAX_PG_BINDIR` when set, else in the Debian
//! layout (`/usr/lib/postgresql/<version>/bin`, the highest version present), else on
//! `PATH`. When none is found the caller gets `None` after a `SKIP` line, unless
//! `TENAX_REQUIRE_ALL_BACKENDS=1`, which turns the skip into a failure. PostgreSQL
//! refuses to run as root, so under root every server tool runs as the `postgres` OS
//! user (`runuser -u postgres --`), which then owns the temporary directory.
#![allow(dead_code)]

use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// The OS user the server runs as when the tests run as root.
const PG_USER: &str = "postgres";
/// The database `url()` names.
const DATABASE: &str = "tenax";

/// A running private PostgreSQL server.
pub(crate) struct PrivatePostgres {
    bindir: PathBuf,
    as_postgres: bool,
    port: u16,
    dir: tempfile::TempDir,
    running: bool,
}

/// When an immediate-mode restart took the server down and brought it back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Restart {
    /// `pg_ctl stop -m immediate` returned: the server is gone.
    pub(crate) down_at: Instant,
    /// `pg_ctl start -w` returned: the server accepts connections again.
    pub(crate) up_at: Instant,
    /// `up_at` on the wall clock, to compare with database timestamps.
    pub(crate) up_wall: SystemTime,
}

impl Restart {
    /// How long the server was unreachable.
    pub(crate) fn outage(&self) -> Duration {
        self.up_at - self.down_at
    }
}

/// Skip (print `SKIP`, return `None`) or, under `TENAX_REQUIRE_ALL_BACKENDS=1`, fail.
fn skip<T>(why: &str) -> Option<T> {
    assert!(
        std::env::var("TENAX_REQUIRE_ALL_BACKENDS").as_deref() != Ok("1"),
        "{why}, but TENAX_REQUIRE_ALL_BACKENDS=1: every backend must be tested"
    );
    eprintln!("SKIP: {why}");
    None
}

fn has_server_tools(dir: &Path) -> bool {
    ["initdb", "pg_ctl", "postgres"]
        .iter()
        .all(|tool| dir.join(tool).is_file())
}

/// Where `initdb` and `pg_ctl` live, if anywhere.
fn find_bindir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("TENAX_PG_BINDIR") {
        let dir = PathBuf::from(dir);
        return has_server_tools(&dir).then_some(dir);
    }
    // Debian and Ubuntu: /usr/lib/postgresql/<major>/bin, the newest major first.
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

/// Whether this process runs as root (the owner of `/proc/self` is the effective uid).
fn running_as_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn os_user_exists(name: &str) -> bool {
    Command::new("id")
        .args(["-u", name])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A port nobody listens on now (the kernel's pick among the ephemeral ports).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local address").port()
}

impl PrivatePostgres {
    /// Create, start and prepare a private server, or `None` (after `SKIP`) when the
    /// PostgreSQL server binaries are not installed.
    pub(crate) fn start() -> Option<Self> {
        Self::start_with(false)
    }

    /// The same, serving TLS only (a self-signed certificate made with `openssl`; plain
    /// connections are rejected), or `None` when `openssl` is missing too.
    #[allow(dead_code)]
    pub(crate) fn start_with_tls() -> Option<Self> {
        Self::start_with(true)
    }

    fn start_with(tls: bool) -> Option<Self> {
        let Some(bindir) = find_bindir() else {
            return skip("no PostgreSQL server binaries (initdb, pg_ctl) found");
        };
        let as_postgres = running_as_root();
        if as_postgres && !os_user_exists(PG_USER) {
            return skip("running as root and there is no `postgres` OS user to run PostgreSQL as");
        }
        let dir = tempfile::Builder::new()
            .prefix("tenax-pg-")
            .tempdir()
            .expect("create a temporary directory");
        std::fs::create_dir(dir.path().join("sock")).expect("create the socket directory");
        if as_postgres {
            let chown = Command::new("chown")
                .arg("-R")
                .arg(format!("{PG_USER}:"))
                .arg(dir.path())
                .output()
                .expect("run chown");
            assert!(chown.status.success(), "chown: {}", describe(&chown));
        }
        let mut pg = Self {
            bindir,
            as_postgres,
            port: 0,
            dir,
            running: false,
        };
        let initdb = pg
            .tool("initdb")
            .arg("-D")
            .arg(pg.data_dir())
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C"])
            .arg("--no-sync")
            .output()
            .expect("run initdb");
        assert!(initdb.status.success(), "initdb: {}", describe(&initdb));
        if tls {
            pg.make_tls_only();
        }
        // Another process may take the port between our pick and the server's bind:
        // pick again a few times.
        let mut last = String::new();
        for _ in 0..5 {
            pg.port = free_port();
            assert_ne!(pg.port, 5432, "never the shared PostgreSQL port");
            match pg.pg_ctl_start() {
                Ok(()) => {
                    pg.running = true;
                    break;
                }
                Err(why) => last = why,
            }
        }
        assert!(pg.running, "cannot start PostgreSQL: {last}");
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
            .output()
            .expect("run createdb");
        assert!(
            createdb.status.success(),
            "createdb: {}",
            describe(&createdb)
        );
        Some(pg)
    }

    /// `postgres://postgres@127.0.0.1:PORT/tenax`.
    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{DATABASE}", self.port)
    }

    /// The server's TCP port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Kill the server the way a crash would (`pg_ctl stop -m immediate`: no checkpoint,
    /// every session cut), keep it down for `down_for`, then start it again on the same
    /// port (crash recovery runs) and wait until it accepts connections.
    pub(crate) fn restart_immediate(&mut self, down_for: Duration) -> Restart {
        let stop = self.pg_ctl_stop();
        assert!(stop.status.success(), "pg_ctl stop: {}", describe(&stop));
        self.running = false;
        let down_at = Instant::now();
        // The outage itself: a fixed, intended length, not a wait for some condition.
        std::thread::sleep(down_for);
        if let Err(why) = self.pg_ctl_start() {
            panic!("cannot restart PostgreSQL: {why}");
        }
        self.running = true;
        Restart {
            down_at,
            up_at: Instant::now(),
            up_wall: SystemTime::now(),
        }
    }

    /// The server's log (for failure messages).
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.log_file()).unwrap_or_default()
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// A server tool, run as the `postgres` user when we are root.
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
    fn make_tls_only(&self) {
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
            .expect("run openssl (needed for the TLS test)");
        assert!(openssl.status.success(), "openssl: {}", describe(&openssl));
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostnossl all all 0.0.0.0/0 reject\n",
        )
        .expect("write pg_hba.conf");
        let mut append = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .expect("open postgresql.conf");
        std::io::Write::write_all(&mut append, b"ssl = on\n").expect("enable ssl");
        if self.as_postgres {
            let chown = Command::new("chown")
                .arg("-R")
                .arg(format!("{PG_USER}:"))
                .arg(&data)
                .output()
                .expect("run chown");
            assert!(chown.status.success(), "chown: {}", describe(&chown));
        }
        let chmod = Command::new("chmod")
            .arg("600")
            .arg(data.join("server.key"))
            .output()
            .expect("run chmod");
        assert!(chmod.status.success(), "chmod: {}", describe(&chmod));
    }

    fn pg_ctl_start(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off",
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
            .output()
            .map_err(|e| format!("run pg_ctl: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("{}\nserver log:\n{}", describe(&out), self.log()))
        }
    }

    fn pg_ctl_stop(&self) -> Output {
        self.tool("pg_ctl")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-m", "immediate", "-w", "-t", "60", "stop"])
            .output()
            .expect("run pg_ctl stop")
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        if self.running {
            let _ = self.pg_ctl_stop();
        }
        // The temporary directory (data, socket, log) goes with `self.dir`.
    }
}

fn describe(out: &Output) -> String {
    format!(
        "{}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    )
}
