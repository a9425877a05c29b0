//! Clocks under libfaketime, moved while their process runs: a database server's (its
//! leases and run times step) and a worker's (the fleet's skewed workers).
//!
//! The process is started with libfaketime preloaded and an offset file that it reads
//! at every clock call (`FAKETIME_NO_CACHE`); rewriting that file steps its wall clock
//! at once, as after an NTP step or a failover to a host whose clock is wrong. Its
//! monotonic clock is left alone.
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::fleet::libfaketime;

/// The environment a process needs to run on the clock whose offset is in `file`.
pub fn faketime_env(file: &Path) -> anyhow::Result<Vec<(&'static str, OsString)>> {
    let library =
        libfaketime().context("libfaketime is not installed (apt-get install faketime)")?;
    Ok(vec![
        ("LD_PRELOAD", library.into_os_string()),
        ("FAKETIME_TIMESTAMP_FILE", file.as_os_str().to_owned()),
        ("FAKETIME_NO_CACHE", "1".into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
    ])
}

/// Writes `offset` (a libfaketime offset: `+1h`, `-10m`, `+0`) to `file`, readable by
/// every user: whole, then renamed, so that the process never reads half of it.
pub fn write_offset(file: &Path, offset: &str) -> std::io::Result<()> {
    let mut next = file.as_os_str().to_owned();
    next.push(".next");
    std::fs::write(&next, offset)?;
    std::fs::set_permissions(&next, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&next, file)
}

/// The offset file of a database server's clock.
#[derive(Debug)]
pub struct DbClock {
    dir: tempfile::TempDir,
}

impl DbClock {
    /// A clock at offset `+0`; fails when libfaketime is not installed.
    pub fn new() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("tenax-clock-").tempdir()?;
        // The server may run as another user (PostgreSQL under root runs as `postgres`).
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        let clock = Self { dir };
        clock.env()?;
        clock.set("+0")?;
        Ok(clock)
    }

    /// Moves the clock to `offset` from real time (see [`write_offset`]).
    pub fn set(&self, offset: &str) -> anyhow::Result<()> {
        Ok(write_offset(&self.file(), offset)?)
    }

    /// The environment a server process needs to run on this clock.
    pub fn env(&self) -> anyhow::Result<Vec<(&'static str, OsString)>> {
        faketime_env(&self.file())
    }

    fn file(&self) -> PathBuf {
        self.dir.path().join("offset")
    }
}
