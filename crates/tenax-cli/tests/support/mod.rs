//! What the CLI's process tests share.
// Each test file compiles this module on its own and uses a part of it.
#![allow(dead_code)]

use std::ops::{Deref, DerefMut};
use std::process::{Child, Command};

/// A `tenax` process started by a test, killed and reaped when dropped.
///
/// A test that fails between starting a process and stopping it unwinds through this
/// drop, so it leaves nothing running: a leftover worker would go on polling a database
/// folder that no longer exists, and would hold the test run's output open.
pub(crate) struct Spawned(Child);

/// `Command::spawn` returning a [`Spawned`].
pub(crate) trait SpawnGuarded {
    /// Starts the process; `what` names it in the panic if it cannot start.
    fn spawn_guarded(&mut self, what: &str) -> Spawned;
}

impl SpawnGuarded for Command {
    fn spawn_guarded(&mut self, what: &str) -> Spawned {
        match self.spawn() {
            Ok(child) => Spawned(child),
            Err(error) => panic!("cannot start {what}: {error}"),
        }
    }
}

impl Deref for Spawned {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for Spawned {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        // Both are no-ops on a process the test already stopped and reaped.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A database of its own on `backend` (`sqlite`, `postgres` or `mysql`), named from
/// `prefix`, and a folder for the test's files (the SQLite database, a ledger); `None`
/// when the backend's URL is not set (a failure under `TENAX_REQUIRE_ALL_BACKENDS=1`).
pub(crate) async fn fresh(backend: &str, prefix: &str) -> Option<(tempfile::TempDir, String)> {
    use tenax_storage::testing::{unique_name, url_from_env};
    let dir = tempfile::tempdir().unwrap();
    let url = match backend {
        "sqlite" => format!("sqlite://{}", dir.path().join("tenax.db").display()),
        "postgres" => {
            let url = url_from_env("TENAX_TEST_POSTGRES_URL")?;
            let separator = if url.contains('?') { '&' } else { '?' };
            format!("{url}{separator}schema={}", unique_name(prefix))
        }
        _ => {
            let url = url_from_env("TENAX_TEST_MYSQL_URL")?;
            let name = unique_name(prefix);
            tenax_storage::mysql::testing_database(&url, &name)
                .await
                .expect("create database");
            tenax_storage::testing::with_database(&url, &name)
        }
    };
    Some((dir, url))
}
