//! Transactional completion on MariaDB/MySQL (see `crate::transactional`).
use super::outcomes::{complete_in, lock_leased};
use super::{clock, map_err, MySqlStorage};
use crate::Result;

crate::transactional::transactional_api!(sqlx::MySql, MySqlStorage, "MariaDB/MySQL");

/// Begin, then lock the task's row under the lease's guard (`SELECT ... FOR UPDATE`
/// filtered by status and epoch: MariaDB reports changed rows, not matched ones, so a
/// no-op guarded `UPDATE` could not tell a held lease from a lost one). The lock is
/// held until commit.
async fn hold(
    storage: &MySqlStorage,
    lease: Lease,
) -> Result<Option<Transaction<'static, sqlx::MySql>>> {
    let mut tx = storage.begin().await?;
    if lock_leased(&mut tx, lease).await?.is_some() {
        return Ok(Some(tx));
    }
    tx.rollback().await.map_err(map_err)?;
    Ok(None)
}

crate::transactional::finish_at_clock!(sqlx::MySql);
