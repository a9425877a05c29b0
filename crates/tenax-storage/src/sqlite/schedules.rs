//! Periodic schedules on SQLite: every write holds the database's write lock from its
//! start (`BEGIN IMMEDIATE`), so two schedulers fire one after the other and the second
//! finds the ticks already fired. The statements are
//! [`crate::shared::schedules`]'s.
crate::shared::schedules::schedule_statements!(crate::sqlite::SqliteStorage, sqlx::Sqlite);
