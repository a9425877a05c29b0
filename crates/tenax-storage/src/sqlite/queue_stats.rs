//! [`Storage::queue_stats`](crate::Storage::queue_stats) on SQLite: the statement is
//! written once, in [`crate::shared::queue_stats`].
crate::shared::queue_stats::queue_stats_statements!(sqlx::Sqlite, stats);
