//! Threshold alert state on MariaDB/MySQL (see [`crate::alert_state`]).
use super::{clock, map_err, MySqlStorage};
use crate::alert_state::{alert_delivery_id, validate_transition, AlertTransitionParams};
use crate::error::Result;

impl MySqlStorage {
    pub(super) async fn alert_transition_impl(
        &self,
        params: &AlertTransitionParams,
    ) -> Result<bool> {
        validate_transition(params)?;
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let changed = if params.firing {
            // Lock the row (or the gap) first, so concurrent callers take turns.
            let firing: Option<i8> = sqlx::query_scalar(
                "SELECT firing FROM tenax_alert_state WHERE queue = ? AND alert = ? FOR UPDATE",
            )
            .bind(&params.queue)
            .bind(&params.alert)
            .fetch_optional(&mut *tx)
            .await
            .map_err(map_err)?;
            match firing {
                Some(1) => false,
                Some(_) => {
                    sqlx::query(
                        "UPDATE tenax_alert_state SET firing = 1, since = ?
                         WHERE queue = ? AND alert = ? AND firing = 0",
                    )
                    .bind(now)
                    .bind(&params.queue)
                    .bind(&params.alert)
                    .execute(&mut *tx)
                    .await
                    .map_err(map_err)?
                    .rows_affected()
                        == 1
                }
                None => {
                    sqlx::query(
                        "INSERT IGNORE INTO tenax_alert_state (queue, alert, firing, since)
                         VALUES (?, ?, 1, ?)",
                    )
                    .bind(&params.queue)
                    .bind(&params.alert)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(map_err)?
                    .rows_affected()
                        == 1
                }
            }
        } else {
            sqlx::query(
                "UPDATE tenax_alert_state SET firing = 0, since = ?
                 WHERE queue = ? AND alert = ? AND firing = 1",
            )
            .bind(now)
            .bind(&params.queue)
            .bind(&params.alert)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?
            .rows_affected()
                == 1
        };
        if let (true, Some(message)) = (changed, &params.message) {
            sqlx::query(
                "INSERT INTO tenax_outbox (delivery_id, kind, task_id, url, body, next_attempt_at, created_at)
                 VALUES (?, 'alert', 0, NULL, ?, ?, ?)",
            )
            .bind(alert_delivery_id())
            .bind(message)
            .bind(now)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(changed)
    }
}
