//! Transactional completion on PostgreSQL (see `crate::transactional`).
use super::outcomes::complete_in;
use super::{map_err, PgStorage};
use crate::Result;

crate::transactional::transactional_api!(sqlx::Postgres, PgStorage, "PostgreSQL");

/// Begin, then the guarded write, whose row lock is held until commit.
async fn hold(
    storage: &PgStorage,
    lease: Lease,
) -> Result<Option<Transaction<'static, sqlx::Postgres>>> {
    let mut tx = storage.begin().await?;
    let held = sqlx::query(
        "UPDATE tenax_tasks SET updated_at = updated_at
         WHERE id = $1 AND status = 'running' AND lease_epoch = $2",
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
    tx: &mut Transaction<'static, sqlx::Postgres>,
    params: &TaskCompleteParams,
) -> Result<Option<bool>> {
    complete_in(tx, params).await
}

fn wake(storage: &PgStorage) {
    storage.wake();
}
