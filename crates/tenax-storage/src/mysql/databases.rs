//! Chores on the server rather than on tasks: the check before migrating that
//! triggers may be created, and whole databases for the demo, benchmarks and tests.
use sqlx::{Executor, Row};
use tenax_core::InvalidInput;

#[cfg(feature = "testing")]
use super::MySqlConfig;
use super::{map_err, migrator, options_from_url, MySqlStorage};
use crate::error::{Result, StorageError};
#[cfg(feature = "testing")]
use crate::Storage;

/// What a user must do to apply a migration that creates a trigger with binary logging
/// on (the error of `check_trigger_privilege`, after the pending migrations' numbers).
const TRIGGER_PRIVILEGE_HINT: &str = " create triggers (the outbox of callbacks and alerts, \
    task events), and with binary logging on that needs the SUPER privilege or \
    log_bin_trust_function_creators = 1: run `SET GLOBAL log_bin_trust_function_creators = 1` \
    (and set it in the server's configuration) or migrate once as a user with SUPER";

impl MySqlStorage {
    /// Some migrations create triggers (0010: the outbox of callbacks and alerts). With
    /// binary logging on, that needs the SUPER privilege or
    /// `log_bin_trust_function_creators = 1`; refuse before migrating (DDL commits as it
    /// goes, so a failure inside a migration would leave it half applied) with what to
    /// set.
    pub(super) async fn check_trigger_privilege(&self) -> Result<()> {
        let row = sqlx::query(
            "SELECT CAST(@@log_bin AS SIGNED) AS log_bin,
                    CAST(@@log_bin_trust_function_creators AS SIGNED) AS trust",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(map_err)?;
        let log_bin: i64 = row.try_get("log_bin").map_err(map_err)?;
        let trust: i64 = row.try_get("trust").map_err(map_err)?;
        if log_bin == 0 || trust == 1 {
            return Ok(());
        }
        // Nothing to do when every migration that creates a trigger is applied.
        let applied: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success = TRUE")
                .fetch_all(&self.pool)
                .await
                .unwrap_or_default();
        let pending: Vec<i64> = migrator()
            .iter()
            .filter(|m| {
                let sql = m.sql.to_ascii_uppercase();
                sql.contains("CREATE TRIGGER") || sql.contains("CREATE OR REPLACE TRIGGER")
            })
            .map(|m| m.version)
            .filter(|v| !applied.contains(v))
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        let grants = sqlx::query("SHOW GRANTS")
            .fetch_all(&self.pool)
            .await
            .map_err(map_err)?;
        let privileged = grants.iter().any(|row| {
            row.try_get::<Vec<u8>, _>(0)
                .map(|g| String::from_utf8_lossy(&g).to_ascii_uppercase())
                .is_ok_and(|g| {
                    g.contains("ON *.*") && (g.contains("ALL PRIVILEGES") || g.contains("SUPER"))
                })
        });
        if privileged {
            return Ok(());
        }
        Err(StorageError::Migration(
            format!("migrations {pending:?}") + TRIGGER_PRIVILEGE_HINT,
        ))
    }
}

/// Drop database `name` on the server `server_url` names, if it exists, and create it
/// empty (for the demo and benchmarks, which want a database of their own).
pub async fn recreate_database(server_url: &str, name: &str) -> Result<()> {
    use sqlx::{ConnectOptions, Connection};

    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(InvalidInput::new("database name", "only letters, digits and _").into());
    }
    let mut conn = options_from_url(server_url)?
        .connect()
        .await
        .map_err(map_err)?;
    for statement in [
        format!("DROP DATABASE IF EXISTS `{name}`"),
        format!("CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"),
    ] {
        conn.execute(statement.as_str()).await.map_err(map_err)?;
    }
    conn.close().await.map_err(map_err)?;
    Ok(())
}

/// The same server URL with another database: `scheme://user@host:port/NAME?query`.
pub fn url_with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_end = base.find("://").map_or(0, |i| i + 3);
    let server = match base[authority_end..].find('/') {
        Some(slash) => &base[..authority_end + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{server}/{name}?{query}"),
        None => format!("{server}/{name}"),
    }
}

/// A fresh database `name` on the server `server_url` names, migrated. The URL's own
/// database is only used to connect for the `CREATE DATABASE`.
#[cfg(feature = "testing")]
pub async fn testing_database(server_url: &str, name: &str) -> Result<std::sync::Arc<dyn Storage>> {
    use sqlx::{ConnectOptions, Connection};

    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(InvalidInput::new("database name", "only letters, digits and _").into());
    }
    let options = options_from_url(server_url)?;
    let mut conn = options.connect().await.map_err(map_err)?;
    conn.execute(
        format!("CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin").as_str(),
    )
    .await
    .map_err(map_err)?;
    conn.close().await.map_err(map_err)?;
    let storage =
        MySqlStorage::connect_options(options.database(name), &MySqlConfig::default()).await?;
    storage.migrate().await?;
    Ok(std::sync::Arc::new(storage))
}
