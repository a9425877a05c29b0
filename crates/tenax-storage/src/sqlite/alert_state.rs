//! Threshold alert state on SQLite (see [`crate::alert_state`]).
use super::{clock, map_err, SqliteStorage};
use crate::alert_state::{alert_delivery_id, validate_transition, AlertTransitionParams};
use crate::error::Result;

impl SqliteStorage {
    pub(super) async fn alert_transition_impl(
        &self,
        params: &AlertTransitionParams,
    ) -> Result<bool> {
        validate_transition(params)?;
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let done = if params.firing {
            sqlx::query(
                "INSERT INTO tenax_alert_state (queue, alert, firing, since) VALUES (?1, ?2, 1, ?3)
                 ON CONFLICT (queue, alert) DO UPDATE SET firing = 1, since = excluded.since
                 WHERE tenax_alert_state.firing = 0",
            )
        } else {
            sqlx::query(
                "UPDATE tenax_alert_state SET firing = 0, since = ?3
                 WHERE queue = ?1 AND alert = ?2 AND firing = 1",
            )
        }
        .bind(&params.queue)
        .bind(&params.alert)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let changed = done.rows_affected() == 1;
        if let (true, Some(message)) = (changed, &params.message) {
            sqlx::query(
                "INSERT INTO tenax_outbox (delivery_id, kind, task_id, url, body, next_attempt_at, created_at)
                 VALUES (?1, 'alert', 0, NULL, ?2, ?3, ?3)",
            )
            .bind(alert_delivery_id())
            .bind(message)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(changed)
    }
}
