//! The audit log of operator actions on PostgreSQL, under the client-side timeout: the
//! statements are written once, in [`crate::shared::audit`].
crate::shared::audit::audit_statements!(sqlx::Postgres, crate::postgres::PgStorage, timed = timed);
