//! The outbox of outbound deliveries on SQLite (see [`crate::outbox`]): the statements
//! are [`crate::shared::outbox`]'s, the claim and the settle included (the write lock
//! taken by `BEGIN IMMEDIATE` holds the rows they look up).
crate::shared::outbox::outbox_statements!(
    crate::sqlite::SqliteStorage,
    sqlx::Sqlite,
    claim_and_settle
);
