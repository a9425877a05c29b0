//! The HTTP API through the router, without a port (`tower::ServiceExt::oneshot`):
//! authentication and roles on every route, bad input refused with nothing changed,
//! back-pressure, long-polls, an exhausted pool, queue and rate limits and event rules,
//! the OpenAPI document, and the dashboard's shell and fragments. The
//! database-touching cases run on SQLite, and on PostgreSQL and MariaDB when their
//! test URLs are set.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    unreachable_pub
)]

mod auth;
mod batch;
mod bounded;
mod dashboard;
mod events;
mod hostile;
mod inputs;
mod limits;
mod malformed;
mod nul;
mod openapi;
mod ops;
mod support;
mod wait;
mod workflows;

/// One `#[tokio::test]` per backend for a case taking `&Harness`.
#[macro_export]
macro_rules! on_every_backend {
    ($($case:ident),* $(,)?) => {
        $(
            mod $case {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    let h = tenax_storage::testing::sqlite_file().await.unwrap();
                    super::$case(&h).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    if let Some(h) = tenax_storage::testing::postgres_from_env().await {
                        super::$case(&h).await;
                    }
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn mysql() {
                    if let Some(h) = tenax_storage::testing::mysql_from_env().await {
                        super::$case(&h).await;
                    }
                }
            }
        )*
    };
}
