//! Deliberately broken writes, for the checker's self-test only: the harness writes
//! them itself, behind the store's back, so no build of Tenax ever contains them.
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::ConnectOptions;

/// Mark task `id` succeeded as a completion under `stale_epoch` would if the lease-epoch
/// guard were missing from the completion's `WHERE` clause: the task is finished and the
/// stale attempt closed as succeeded, while the current attempt stays open. Returns
/// whether the task was still running (and so was written).
pub async fn stale_completion(sqlite_url: &str, id: i64, stale_epoch: i64) -> anyhow::Result<bool> {
    let options: SqliteConnectOptions = sqlite_url.parse()?;
    let mut conn = options
        .busy_timeout(std::time::Duration::from_secs(10))
        .connect()
        .await?;
    let mut tx = sqlx::Connection::begin(&mut conn).await?;
    let now = chrono::Utc::now().timestamp_millis();
    let written = sqlx::query(
        "UPDATE tenax_tasks SET status = 'succeeded', result = '\"stale\"', finished_at = ?1,
                updated_at = ?1, lease_owner = NULL, lease_expires_at = NULL
         WHERE id = ?2 AND status = 'running'",
    )
    .bind(now)
    .bind(id)
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
    if written {
        sqlx::query(
            "UPDATE tenax_attempts SET outcome = 'succeeded', finished_at = ?1
             WHERE task_id = ?2 AND epoch = ?3",
        )
        .bind(now)
        .bind(id)
        .bind(stale_epoch)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(written)
}
