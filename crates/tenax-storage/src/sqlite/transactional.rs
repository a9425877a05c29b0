//! Transactional completion on SQLite (see `crate::transactional`).
use super::outcomes::complete_in;
use super::{clock, SqliteStorage};
use crate::Result;

crate::transactional::transactional_api!(sqlx::Sqlite, SqliteStorage, "SQLite");
crate::transactional::hold_by_write!(sqlx::Sqlite, SqliteStorage);

crate::transactional::finish_at_clock!(sqlx::Sqlite);
