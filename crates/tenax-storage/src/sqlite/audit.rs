//! The audit log of operator actions on SQLite: the statements are written once, in
//! [`crate::shared::audit`].
crate::shared::audit::audit_statements!(sqlx::Sqlite, crate::sqlite::SqliteStorage);
