//! Task events on PostgreSQL (see [`crate::events`]): every statement is written once,
//! in `crate::shared::events`, PostgreSQL's lease, cursor and sequencing with SQLite's
//! (one upsert, one fenced update, one `UPDATE ... FROM`). The sequencer's row is
//! locked (`FOR UPDATE`) by the sequencing and the prune.

// The event_*_impl methods, lease_from_row, assign_positions.
crate::shared::events::events_statements!(crate::postgres::PgStorage, sqlx::Postgres, upsert);
