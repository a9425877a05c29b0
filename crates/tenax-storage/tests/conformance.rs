//! The storage conformance suite, once per backend. PostgreSQL and MariaDB run when
//! `TENAX_TEST_POSTGRES_URL` / `TENAX_TEST_MYSQL_URL` are set (CI sets both and
//! `TENAX_REQUIRE_ALL_BACKENDS=1`).
#[cfg(feature = "sqlite")]
tenax_storage::conformance_tests!(sqlite, tenax_storage::testing::sqlite_file);
#[cfg(feature = "postgres")]
tenax_storage::conformance_tests!(postgres, tenax_storage::testing::postgres_from_env);
#[cfg(feature = "mysql")]
tenax_storage::conformance_tests!(mysql, tenax_storage::testing::mysql_from_env);
