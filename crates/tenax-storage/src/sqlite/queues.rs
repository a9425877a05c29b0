//! Queue controls on SQLite: list, pause, resume and per-queue limits on running tasks
//! (the claim side is in `claim.rs`). The statements are written once, in
//! [`crate::shared::queues`].
crate::shared::queues::queues_statements!(sqlx::Sqlite, crate::sqlite::SqliteStorage);
