//! The audit log of operator actions on MariaDB/MySQL: the statements are written once,
//! in [`crate::shared::audit`].
crate::shared::audit::audit_statements!(sqlx::MySql, crate::mysql::MySqlStorage);
