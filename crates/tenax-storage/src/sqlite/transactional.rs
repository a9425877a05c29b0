//! Transactional completion on SQLite (see `crate::transactional`).
use super::outcomes::complete_in;
use super::{clock, SqliteStorage};
use crate::Result;

crate::transactional::transactional_api!(sqlx::Sqlite, SqliteStorage, "SQLite");
crate::transactional::hold_by_write!(sqlx::Sqlite, SqliteStorage);

async fn finish(
    tx: &mut Transaction<'static, sqlx::Sqlite>,
    params: &TaskCompleteParams,
) -> Result<Option<bool>> {
    let now = clock(tx, params.now).await?;
    complete_in(tx, params, now).await
}
