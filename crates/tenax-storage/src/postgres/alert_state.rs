//! Threshold alert state on PostgreSQL (see [`crate::alert_state`]).
use super::{map_err, PgStorage, NOW};
use crate::alert_state::{validate_transition, AlertTransitionParams};
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
        let done = sqlx::query(&sql)
            .bind(params.now)
            .bind(&params.queue)
            .bind(&params.alert)
            .execute(self.pool())
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }
}
