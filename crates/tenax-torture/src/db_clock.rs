//! A database server's clock under libfaketime, moved while the server runs.
//!
//! The server is started with libfaketime preloaded and an offset file that it reads
//! at every clock call (`FAKETIME_NO_CACHE`); [`DbClock::set`] rewrites that file, so
//! the server's wall clock steps at once, as after an NTP step or a failover to a host
//! whose clock is wrong. Its monotonic clock is left alone.
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use anyhow::Context;

use crate::fleet::libfaketime;

/// The offset file of a server's clock.
#[derive(Debug)]
pub struct DbClock {
    dir: tempfile::TempDir,
    library: PathBuf,
}

impl DbClock {
    /// A clock at offset `+0`; fails when libfaketime is not installed.
    pub fn new() -> anyhow::Result<Self> {
        let library =
            libfaketime().context("libfaketime is not installed (apt-get install faketime)")?;
        let dir = tempfile::Builder::new().prefix("tenax-clock-").tempdir()?;
        // The server may run as another user (PostgreSQL under root runs as `postgres`).
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        let clock = Self { dir, library };
        clock.set("+0")?;
        Ok(clock)
    }

    /// Moves the clock to `offset` from real time (a libfaketime offset: `+1h`,
    /// `-10m`, `+0`). Written whole, then renamed: the server never reads half of it.
    pub fn set(&self, offset: &str) -> anyhow::Result<()> {
        let next = self.dir.path().join("offset.next");
        std::fs::write(&next, offset)?;
        std::fs::set_permissions(&next, std::fs::Permissions::from_mode(0o644))?;
        std::fs::rename(&next, self.file())?;
        Ok(())
    }

    /// The environment a server process needs to run on this clock.
    pub fn env(&self) -> Vec<(&'static str, OsString)> {
        vec![
            ("LD_PRELOAD", self.library.clone().into_os_string()),
            ("FAKETIME_TIMESTAMP_FILE", self.file().into_os_string()),
            ("FAKETIME_NO_CACHE", "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
        ]
    }

    fn file(&self) -> PathBuf {
        self.dir.path().join("offset")
    }
}
