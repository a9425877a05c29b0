//! Transactional completion on PostgreSQL (see `crate::transactional`).
use super::outcomes::complete_in;
use super::PgStorage;
use crate::Result;

crate::transactional::transactional_api!(sqlx::Postgres, PgStorage, "PostgreSQL");
crate::transactional::hold_by_write!(sqlx::Postgres, PgStorage);

async fn finish(
    tx: &mut Transaction<'static, sqlx::Postgres>,
    params: &TaskCompleteParams,
) -> Result<Option<bool>> {
    complete_in(tx, params).await
}
