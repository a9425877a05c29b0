//! Periodic schedules on PostgreSQL: due rows are locked `FOR UPDATE SKIP LOCKED`, so
//! concurrent schedulers fire different schedules and never wait on each other. The
//! statements are [`crate::shared::schedules`]'s, each call bounded by the client-side
//! timeout.
crate::shared::schedules::schedule_statements!(crate::postgres::PgStorage, sqlx::Postgres, timed);
