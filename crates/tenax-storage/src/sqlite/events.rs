//! Task events on SQLite (see [`crate::events`]): every statement is written once, in
//! `crate::shared::events`, SQLite's lease, cursor and sequencing with PostgreSQL's
//! (one upsert, one fenced update, one `UPDATE ... FROM`). Every write runs in a
//! `BEGIN IMMEDIATE` transaction.

// The event_*_impl methods, lease_from_row, assign_positions.
crate::shared::events::events_statements!(crate::sqlite::SqliteStorage, sqlx::Sqlite, upsert);
