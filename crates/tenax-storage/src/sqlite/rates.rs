//! Rate limits per command type on SQLite (the claim side is in `crate::rates`). SQLite
//! has one writer at a time (`BEGIN IMMEDIATE`), so taking tokens needs no row locks:
//! the statements are written once, in [`crate::shared::rates`].
crate::shared::rates::rates_statements!(
    sqlx::Sqlite,
    crate::sqlite::SqliteStorage,
    claim_unrated = claim_plain,
);
