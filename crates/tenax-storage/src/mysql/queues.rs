//! Queue controls on MariaDB/MySQL: list, pause, resume and limits (the claim side is in
//! `claim.rs`). The statements are written once, in [`crate::shared::queues`].
crate::shared::queues::queues_statements!(sqlx::MySql, crate::mysql::MySqlStorage);
