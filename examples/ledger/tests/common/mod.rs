//! A fresh database per test, on each backend.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use example_ledger::Backend;
use tenax::sqlx;

/// A fresh database for `backend`: a SQLite file, a PostgreSQL schema, or a MariaDB
/// database. `None` when the backend's URL is unset (a failure under
/// `TENAX_REQUIRE_ALL_BACKENDS=1`). Keep the guard alive while the database is used.
pub(crate) async fn fresh(backend: &str) -> Option<(String, Option<tempfile::TempDir>)> {
    let name = tenax_storage::testing::unique_name("tenax_txn");
    match backend {
        "sqlite" => {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("sqlite://{}", dir.path().join("tenax.db").display());
            Some((url, Some(dir)))
        }
        "postgres" => {
            let url = tenax_storage::testing::url_from_env("TENAX_TEST_POSTGRES_URL")?;
            let separator = if url.contains('?') { '&' } else { '?' };
            Some((format!("{url}{separator}schema={name}"), None))
        }
        "mysql" => {
            let url = tenax_storage::testing::url_from_env("TENAX_TEST_MYSQL_URL")?;
            tenax_storage::mysql::testing_database(&url, &name)
                .await
                .unwrap();
            Some((tenax_storage::testing::with_database(&url, &name), None))
        }
        other => panic!("unknown backend {other}"),
    }
}

/// One number from the database `backend` holds.
pub(crate) async fn count(backend: &Backend, sql: &str) -> i64 {
    match backend {
        Backend::Sqlite(s) => sqlx::query_scalar(sql).fetch_one(s.pool()).await.unwrap(),
        Backend::Postgres(s) => sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(s.pool())
            .await
            .unwrap(),
        Backend::MySql(s) => sqlx::query_scalar(sql).fetch_one(s.pool()).await.unwrap(),
    }
}
