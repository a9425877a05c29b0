//! Transactional completion on SQLite (see `crate::transactional`).
use super::outcomes::complete_in;
use super::{clock, map_err, SqliteStorage};
use crate::Result;

crate::transactional::transactional_api!(sqlx::Sqlite, SqliteStorage, "SQLite");

/// `BEGIN IMMEDIATE` (the writer lock, held until commit), then the guarded write.
async fn hold(
    storage: &SqliteStorage,
    lease: Lease,
) -> Result<Option<Transaction<'static, sqlx::Sqlite>>> {
    let mut tx = storage.begin().await?;
    let held = sqlx::query(
        "UPDATE tenax_tasks SET updated_at = updated_at
         WHERE id = ? AND status = 'running' AND lease_epoch = ?",
    )
    .bind(lease.id.0)
    .bind(lease.epoch)
    .execute(&mut *tx)
    .await
    .map_err(map_err)?;
    if held.rows_affected() == 1 {
        return Ok(Some(tx));
    }
    tx.rollback().await.map_err(map_err)?;
    Ok(None)
}

async fn finish(
    tx: &mut Transaction<'static, sqlx::Sqlite>,
    params: &TaskCompleteParams,
) -> Result<Option<bool>> {
    let now = clock(tx, params.now).await?;
    complete_in(tx, params, now).await
}

fn wake(storage: &SqliteStorage) {
    storage.wake();
}
