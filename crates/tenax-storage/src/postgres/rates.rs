//! Rate limits per command type on PostgreSQL (the claim side is in `crate::rates`): the
//! statements are written once, in [`crate::shared::rates`]. PostgreSQL's claim statement
//! also skips and names the limited types (`claim_naming_rated`), and `rated_hint`
//! remembers whether the last probe found any, so that claims without limited types
//! skip the probe.
crate::shared::rates::rates_statements!(
    sqlx::Postgres,
    crate::postgres::PgStorage,
    claim_unrated = claim,
    claim_skipping_rated = claim_naming_rated,
    rated_hint = rated_hint,
);
