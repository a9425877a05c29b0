//! Threshold alert state on PostgreSQL (see [`crate::alert_state`]): the statements are
//! written once, in [`crate::shared::alert_state`].
crate::shared::alert_state::alert_state_statements!(sqlx::Postgres, crate::postgres::PgStorage);
