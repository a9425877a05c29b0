//! Rate limits per command type on MariaDB/MySQL (the claim side is in `crate::rates`):
//! the statements are written once, in [`crate::shared::rates`]; the writes run again
//! after a lock conflict.
crate::shared::rates::rates_statements!(
    sqlx::MySql,
    crate::mysql::MySqlStorage,
    claim_unrated = claim_once,
);
