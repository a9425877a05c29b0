//! Threshold alert state on PostgreSQL (see [`crate::alert_state`]).
use super::{map_err, PgStorage, NOW};
use crate::alert_state::{alert_delivery_id, validate_transition, AlertTransitionParams};
use crate::error::Result;

impl PgStorage {
    pub(super) async fn alert_transition_impl(
        &self,
        params: &AlertTransitionParams,
    ) -> Result<bool> {
        validate_transition(params)?;
        let sql = if params.firing {
            format!(
                "INSERT INTO tenax_alert_state (queue, alert, firing, since)
                 VALUES ($2, $3, TRUE, {NOW})
                 ON CONFLICT (queue, alert) DO UPDATE SET firing = TRUE, since = excluded.since
                 WHERE NOT tenax_alert_state.firing"
            )
        } else {
            format!(
                "UPDATE tenax_alert_state SET firing = FALSE, since = {NOW}
                 WHERE queue = $2 AND alert = $3 AND firing"
            )
        };
        let mut tx = self.begin().await?;
        let done = sqlx::query(&sql)
            .bind(params.now)
            .bind(&params.queue)
            .bind(&params.alert)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        let changed = done.rows_affected() == 1;
        if let (true, Some(message)) = (changed, &params.message) {
            sqlx::query(&format!(
                "INSERT INTO tenax_outbox (delivery_id, kind, task_id, url, body, next_attempt_at, created_at)
                 VALUES ($2, 'alert', 0, NULL, $3, {NOW}, {NOW})"
            ))
            .bind(params.now)
            .bind(alert_delivery_id())
            .bind(message)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(changed)
    }
}
