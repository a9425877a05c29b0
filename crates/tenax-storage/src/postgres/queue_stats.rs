//! [`Storage::queue_stats`](crate::Storage::queue_stats) and
//! [`Storage::stats`](crate::Storage::stats) on PostgreSQL: the statements are written
//! once, in [`crate::shared::queue_stats`].
crate::shared::queue_stats::queue_stats_statements!(sqlx::Postgres, stats);
