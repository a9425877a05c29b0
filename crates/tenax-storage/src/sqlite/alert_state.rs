//! Threshold alert state on SQLite (see [`crate::alert_state`]): the statements are
//! written once, in [`crate::shared::alert_state`].
crate::shared::alert_state::alert_state_statements!(sqlx::Sqlite, crate::sqlite::SqliteStorage);
