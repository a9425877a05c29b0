//! Queue controls on PostgreSQL: list, pause, resume and limits (the claim side is in
//! `claim.rs`). The statements are written once, in [`crate::shared::queues`].
crate::shared::queues::queues_statements!(sqlx::Postgres, crate::postgres::PgStorage);
